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
