"""Pack files and their indexes: many small objects in one file, found by a sorted index.

A remote store pays per request, so `FsspecBackend` writes the small objects of one batch
as a pack (their bytes, concatenated) plus an index, two requests for any number of
objects, and reads them back with byte-range requests.

Pack file ``packs/<name>.pack``, where ``<name>`` is the lowercase hex BLAKE3 of the whole
file (so a pack is named by its content and writing it twice is harmless)::

    magic   8 bytes   b"MOPACK\\x00\\x01" (format version 1)
    values  ...       the objects' canonical bytes, back to back, in the writer's order

Index file ``packs/<name>.idx``, format version 1, integers little-endian and unsigned.
Columns rather than rows, so that each is parsed by one ``struct.unpack``::

    =========  ========  ===============================================================
    offset     size      content
    =========  ========  ===============================================================
    0          8         magic b"MOPACKIX"
    8          4         version, 1
    12         4         count n
    16         8         size of the pack file in bytes
    24         32        BLAKE3 of the pack file (its name)
    56         32 n      keys (object ids), sorted ascending, no repeats
    56+32n     8 n       offset of each key's bytes in the pack file
    56+40n     4 n       length of each key's bytes
    56+44n     8 n       write time of each key, ms since the epoch (gc's grace counts
                         from it; kept when gc rewrites a pack)
    56+52n     32        BLAKE3 of every byte before it
    =========  ========  ===============================================================

The index is written after its pack, and object stores write a file whole or not at all,
so an index's presence means its pack is complete. The checksum catches a truncated or
damaged index; a truncated pack shows as a short range read (`CorruptPack`); a damaged
value is caught where every read is: the store re-hashes it against its id.

An index holds nothing its pack does not (but the write times): a damaged one is made
again from the pack (`index_from_pack`), whose values are one msgpack object each (an
object's canonical bytes), so their bounds are found by reading their headers, and each
key is the hash of its value. The write times become one, the pack file's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import blake3

from medomni_cas.errors import IntegrityError

__all__ = [
    "IDX_MAGIC",
    "PACK_MAGIC",
    "CorruptPack",
    "PackIndex",
    "build_index",
    "build_pack",
    "index_from_pack",
    "parse_index",
]

PACK_MAGIC = b"MOPACK\x00\x01"
IDX_MAGIC = b"MOPACKIX"
IDX_VERSION = 1
_HEAD = struct.Struct("<8sII Q 32s")  # magic, version, count, pack size, pack digest
_DIGEST = 32
_PER_ENTRY = 32 + 8 + 4 + 8


class CorruptPack(IntegrityError):
    """A pack or pack index that is truncated, damaged or missing; names the file."""

    def __init__(self, path: str, message: str) -> None:
        Exception.__init__(self, f"{path}: {message}")
        self.expected = ""
        self.got = ""
        self.path = path


class PackIndex(NamedTuple):
    """One parsed index: the pack's name and size, and its entries (keys sorted)."""

    name: str
    pack_size: int
    keys: list[bytes]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    stamps: tuple[int, ...]  # ms since the epoch


def build_pack(values: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """The bytes of a pack holding ``values`` in order, and the offset of each."""
    offsets = []
    pos = len(PACK_MAGIC)
    for v in values:
        offsets.append(pos)
        pos += len(v)
    return b"".join([PACK_MAGIC, *values]), offsets


def build_index(pack: bytes, entries: Sequence[tuple[bytes, int, int, int]]) -> tuple[str, bytes]:
    """The name of ``pack`` and the bytes of its index; entries are ``(key, offset,
    length, stamp ms)`` with distinct keys, in any order."""
    digest = blake3.blake3(pack).digest()
    rows = sorted(entries)
    n = len(rows)
    parts = [
        _HEAD.pack(IDX_MAGIC, IDX_VERSION, n, len(pack), digest),
        b"".join(r[0] for r in rows),
        struct.pack(f"<{n}Q", *(r[1] for r in rows)),
        struct.pack(f"<{n}I", *(r[2] for r in rows)),
        struct.pack(f"<{n}Q", *(r[3] for r in rows)),
    ]
    body = b"".join(parts)
    return digest.hex(), body + blake3.blake3(body).digest()


def parse_index(data: bytes, path: str) -> PackIndex:
    """Parse and check an index read from ``path``; `CorruptPack` if it is not whole."""
    if len(data) < _HEAD.size + _DIGEST:
        raise CorruptPack(path, f"pack index of {len(data)} bytes is truncated")
    magic, version, n, pack_size, digest = _HEAD.unpack_from(data)
    if magic != IDX_MAGIC:
        raise CorruptPack(path, "not a pack index (wrong magic bytes)")
    if version != IDX_VERSION:
        raise CorruptPack(
            path, f"pack index version {version} is not supported (this release reads 1)"
        )
    if len(data) != _HEAD.size + n * _PER_ENTRY + _DIGEST:
        raise CorruptPack(
            path, f"pack index of {len(data)} bytes is truncated or damaged ({n} entries)"
        )
    if blake3.blake3(memoryview(data)[:-_DIGEST]).digest() != data[-_DIGEST:]:
        raise CorruptPack(path, "pack index is damaged (checksum mismatch)")
    pos = _HEAD.size
    keys = [data[i : i + 32] for i in range(pos, pos + 32 * n, 32)]
    pos += 32 * n
    offsets = struct.unpack_from(f"<{n}Q", data, pos)
    pos += 8 * n
    lengths = struct.unpack_from(f"<{n}I", data, pos)
    pos += 4 * n
    stamps = struct.unpack_from(f"<{n}Q", data, pos)
    name = digest.hex()
    for off, length in zip(offsets, lengths, strict=True):
        if off + length > pack_size:
            raise CorruptPack(path, f"entry at {off}+{length} lies outside a {pack_size}-byte pack")
    return PackIndex(name, pack_size, keys, offsets, lengths, stamps)


# -- making an index again from its pack ------------------------------------------------------
# msgpack's first byte -> (bytes of the header after it, bytes of a length field, whether the
# length counts bytes (1), items (2: a map's keys and values; 1: an array's) or is fixed)
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED |= {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin, str: length bytes
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext: length bytes, then a type byte
_ARRAY = {0xDC: 2, 0xDD: 4}
_MAP = {0xDE: 2, 0xDF: 4}


def _value_end(data: bytes, pos: int, path: str) -> int:
    """Where the msgpack object that starts at ``pos`` ends (no recursion: a count of the
    items still to skip)."""
    todo = 1
    end = len(data)
    start = pos
    while todo:
        todo -= 1
        if pos >= end:
            raise CorruptPack(path, f"the value at byte {start} runs past the end of the pack")
        b = data[pos]
        pos += 1
        if b <= 0x7F or b >= 0xE0:  # fixint
            continue
        if b <= 0x8F:  # fixmap
            todo += 2 * (b & 0x0F)
        elif b <= 0x9F:  # fixarray
            todo += b & 0x0F
        elif b <= 0xBF:  # fixstr
            pos += b & 0x1F
        elif b in _FIXED:
            pos += _FIXED[b]
        elif b in _SIZED:
            n = _SIZED[b]
            pos += n + int.from_bytes(data[pos : pos + n], "big")
        elif b in _EXT:
            n = _EXT[b]
            pos += n + 1 + int.from_bytes(data[pos : pos + n], "big")
        elif b in _ARRAY or b in _MAP:
            n = _ARRAY.get(b) or _MAP[b]
            count = int.from_bytes(data[pos : pos + n], "big")
            pos += n
            todo += count if b in _ARRAY else 2 * count
        else:
            raise CorruptPack(path, f"byte {pos - 1} (0x{b:02x}) starts no msgpack value")
    if pos > end:
        raise CorruptPack(path, f"the value at byte {start} runs past the end of the pack")
    return pos


def index_from_pack(pack: bytes, path: str, stamp_ms: int) -> tuple[PackIndex, bytes]:
    """The index of ``pack`` (read from ``path``) made again from its values, every write
    time ``stamp_ms``: the parsed index and its bytes. `CorruptPack` when the pack is not
    whole (its bytes do not hash to its name, the last part of ``path``) or not a pack."""
    name = path.rsplit("/", 1)[-1].partition(".")[0]
    if blake3.blake3(pack).hexdigest() != name:
        raise CorruptPack(path, "the pack's bytes do not hash to its name: it is damaged too")
    if not pack.startswith(PACK_MAGIC):
        raise CorruptPack(path, "not a pack (wrong magic bytes)")
    entries: dict[bytes, tuple[bytes, int, int, int]] = {}
    pos = len(PACK_MAGIC)
    while pos < len(pack):
        end = _value_end(pack, pos, path)
        key = blake3.blake3(memoryview(pack)[pos:end]).digest()
        entries.setdefault(key, (key, pos, end - pos, stamp_ms))
        pos = end
    _, data = build_index(pack, list(entries.values()))
    return parse_index(data, path), data
