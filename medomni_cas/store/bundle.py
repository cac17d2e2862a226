"""Bundles: one self-verifying file holding the closure of some roots, and refs to them.

On-disk format, version 1. This is a stable format: a release must read every bundle any
earlier release wrote. All integers are big-endian and unsigned.

=============  ===========  ==============================================================
part           size         content
=============  ===========  ==============================================================
magic          15 bytes     ``b"MEDOMNI-BUNDLE\\x00"``
version        1 byte       ``1``
header length  4 bytes      ``H``
header         H bytes      msgpack map: ``roots`` (list of hex ids), ``refs`` (map of ref
                            name to hex id), ``created`` (epoch seconds, float), and
                            ``manifest`` (map of str to str: what the writer says the
                            bundle holds, such as Studio's ``holds: configs-only``; absent
                            when empty, and in bundles written before it: read as empty).
                            Readers ignore keys they do not know, so writers may add keys.
records        ...          one per object: id (32 bytes), length ``n`` (8 bytes), the
                            object's canonical bytes (``n`` bytes). Written in the order a
                            breadth-first walk from the roots meets them, parents first.
index          count * 40   one entry per record, sorted by id: id (32 bytes), offset of
                            the record from the start of the file (8 bytes)
trailer        56 bytes     index offset (8), count (8), BLAKE3-256 digest (32) of every
                            byte of the file before the digest, ``b"MOBUNDLE"`` (8)
=============  ===========  ==============================================================

The object count sits in the trailer, not the header, because a bundle is written as the
walk yields objects, with memory bounded by the number of ids rather than their bytes, and
the count is known only at the end. The digest covers the trailer's own offset and count,
so one flipped byte anywhere in a bundle is detected.

Importing reads the file three times and writes nothing until the whole of it is proven
good: the digest; then every record (its id, canonical form and links, and that the bundle
is closed over the store it goes into) and every ref (no conflict); then the objects are
written in batches, children before parents (a height at a time), and the refs last: the
update policies of every ref (`medomni_cas.store.policies`) first, then each ref's
compare-and-swap.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

import blake3
import msgspec

from medomni_cas.errors import ConflictError, InvalidId, InvalidName, InvalidObject, NotFound
from medomni_cas.store import _order, encoding, policies
from medomni_cas.store._crash import crash_point
from medomni_cas.store.ids import ID_SIZE, ObjectId, hash_bytes, parse_id
from medomni_cas.store.refs import check_ref_name

if TYPE_CHECKING:
    from medomni_cas.store.store import Progress, Store

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "BundleError",
    "BundleInfo",
    "BundleRefConflict",
    "ImportReport",
    "export_bundle",
    "import_bundle",
    "read_bundle_header",
]

MAGIC = b"MEDOMNI-BUNDLE\x00"
FORMAT_VERSION = 1
END = b"MOBUNDLE"
_PREFIX = len(MAGIC) + 1 + 4  # magic, version, header length
_RECORD_HEAD = ID_SIZE + 8
_INDEX_ENTRY = ID_SIZE + 8
_TRAILER = 8 + 8 + 32 + len(END)
_DIGEST_AT = _TRAILER - 8 - 8  # distance of the digest from the end of the file
_BUF = 1 << 20
# objects per backend write when importing, and a cap on the bytes of one batch
_BATCH = 1024
_BATCH_BYTES = 64 << 20


class BundleError(InvalidObject):
    """A bundle that cannot be read or imported; names the file and, where known, the offset."""

    def __init__(self, path: str, message: str, offset: int | None = None) -> None:
        where = path if offset is None else f"{path} at offset {offset}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.offset = offset


class BundleRefConflict(ConflictError):
    """A bundle's ref names a value that does not descend from the store's value of that ref.

    ``current`` is the store's value, ``incoming`` the bundle's (hex); ``expected`` is None.
    """

    def __init__(self, path: str, name: str, current: str, incoming: str) -> None:
        super().__init__(name, None, current)
        self.args = (
            f"{path}: ref {name!r} is {current} in this store but {incoming} in the bundle, "
            "which does not descend from it; nothing was imported "
            "(import without refs to take the objects only)",
        )
        self.path = path
        self.incoming = incoming


class BundleInfo(msgspec.Struct):
    """What a bundle holds: its path, object count, size in bytes, roots and refs (hex ids)."""

    path: str
    objects: int
    bytes: int
    roots: list[str]
    refs: dict[str, str]
    created: float = 0.0
    #: what the writer says the bundle holds (empty for bundles written before manifests)
    manifest: dict[str, str] = {}


class ImportReport(msgspec.Struct):
    """Objects in the bundle, how many the store did not have, and the refs created or moved."""

    objects: int
    new: int
    refs_updated: list[str]


class _Header(msgspec.Struct, omit_defaults=True):
    # Unknown keys are accepted (msgspec's default) so that later writers can add some;
    # an empty manifest is left out, so a bundle without one has the header it always had.
    roots: list[str]
    refs: dict[str, str]
    created: float = 0.0
    manifest: dict[str, str] = {}


_HEADER_ENC = msgspec.msgpack.Encoder(order="sorted")
_HEADER_DEC = msgspec.msgpack.Decoder(_Header)


class _Layout(NamedTuple):
    size: int
    records_start: int
    index_offset: int
    objects: int  # not "count": that is a tuple method
    digest: bytes
    roots: list[ObjectId]
    refs: dict[str, ObjectId]
    created: float
    manifest: dict[str, str]


# -- reading ---------------------------------------------------------------------------------


def _read_exact(f: BinaryIO, n: int, path: str, offset: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise BundleError(path, f"file ends after {len(data)} of {n} bytes", offset)
    return data


def _layout(f: BinaryIO, path: str, *, check_digest: bool) -> _Layout:
    """Magic, version and trailer; the whole-file digest if asked; then the header."""
    size = f.seek(0, os.SEEK_END)
    if size < _PREFIX + _TRAILER:
        raise BundleError(path, f"too short to be a bundle ({size} bytes): truncated?")
    f.seek(0)
    magic = f.read(len(MAGIC))
    if magic != MAGIC:
        raise BundleError(path, "not a medomni bundle (wrong magic bytes)", 0)
    version = f.read(1)[0]
    if version != FORMAT_VERSION:
        raise BundleError(
            path,
            f"bundle format version {version} is not supported (this release reads "
            f"version {FORMAT_VERSION})",
            len(MAGIC),
        )
    header_len = int.from_bytes(f.read(4), "big")
    f.seek(size - _TRAILER)
    trailer = f.read(_TRAILER)
    if trailer[-len(END) :] != END:
        raise BundleError(path, "no trailer at the end of the file: truncated or damaged")
    index_offset = int.from_bytes(trailer[0:8], "big")
    count = int.from_bytes(trailer[8:16], "big")
    digest = trailer[16:48]
    if check_digest:
        _check_digest(f, path, size, digest)
    records_start = _PREFIX + header_len
    if records_start > index_offset or index_offset + count * _INDEX_ENTRY != size - _TRAILER:
        raise BundleError(
            path,
            f"header length {header_len}, index offset {index_offset} and count {count} "
            f"do not fit a file of {size} bytes",
        )
    f.seek(_PREFIX)
    try:
        header = _HEADER_DEC.decode(f.read(header_len))
        roots = [ObjectId.from_hex(r) for r in header.roots]
        refs = {check_ref_name(n): ObjectId.from_hex(v) for n, v in header.refs.items()}
    except (msgspec.DecodeError, InvalidId, InvalidName) as e:
        raise BundleError(path, f"unreadable header: {e}", _PREFIX) from None
    return _Layout(
        size,
        records_start,
        index_offset,
        count,
        digest,
        roots,
        refs,
        header.created,
        header.manifest,
    )


def _check_digest(f: BinaryIO, path: str, size: int, digest: bytes) -> None:
    h = blake3.blake3()
    f.seek(0)
    left = size - _DIGEST_AT
    while left > 0:
        chunk = f.read(min(_BUF, left))
        if not chunk:
            raise BundleError(path, "file shrank while being read")
        h.update(chunk)
        left -= len(chunk)
    if h.digest() != digest:
        raise BundleError(
            path,
            "whole-file BLAKE3 digest does not match its trailer: the bundle is corrupt "
            "or truncated; nothing was imported",
        )


def _read_index(f: BinaryIO, path: str, lay: _Layout) -> dict[ObjectId, int]:
    f.seek(lay.index_offset)
    raw = _read_exact(f, lay.objects * _INDEX_ENTRY, path, lay.index_offset)
    index: dict[ObjectId, int] = {}
    previous = b""
    for i in range(0, len(raw), _INDEX_ENTRY):
        oid = ObjectId(raw[i : i + ID_SIZE])
        if oid <= previous:
            raise BundleError(
                path, "index is not sorted by id, or lists an id twice", lay.index_offset + i
            )
        previous = oid
        index[oid] = int.from_bytes(raw[i + ID_SIZE : i + _INDEX_ENTRY], "big")
    return index


def _records(f: BinaryIO, path: str, lay: _Layout) -> Iterator[tuple[int, ObjectId, bytes]]:
    """``(offset, id, bytes)`` of each record, in file order; bounds-checked, not verified."""
    f.seek(lay.records_start)
    pos = lay.records_start
    while pos < lay.index_offset:
        if lay.index_offset - pos < _RECORD_HEAD:
            raise BundleError(path, "record header runs into the index", pos)
        head = _read_exact(f, _RECORD_HEAD, path, pos)
        n = int.from_bytes(head[ID_SIZE:], "big")
        if n > lay.index_offset - pos - _RECORD_HEAD:
            raise BundleError(path, f"record of {n} bytes runs into the index", pos)
        data = _read_exact(f, n, path, pos + _RECORD_HEAD)
        yield pos, ObjectId(head[:ID_SIZE]), data
        pos += _RECORD_HEAD + n


def _verify_records(
    f: BinaryIO, path: str, lay: _Layout, index: Mapping[ObjectId, int]
) -> dict[ObjectId, ObjectId]:
    """Check every record against the index, its id and the canonical rules.

    Returns the links that point outside the bundle, each with one object linking it.
    """
    outside: dict[ObjectId, ObjectId] = {}
    seen = 0
    for pos, oid, data in _records(f, path, lay):
        if index.get(oid) != pos:
            raise BundleError(path, f"object {oid} is not in the index at this offset", pos)
        got = hash_bytes(data)
        if got != oid:
            raise BundleError(path, f"object {oid} is corrupt: its bytes hash to {got}", pos)
        try:
            encoding.validate_canonical(data)
            links = encoding.links(data)
        except InvalidObject as e:
            raise BundleError(path, f"object {oid}: {e}", pos) from None
        for link in links:
            if link not in index:
                outside.setdefault(link, oid)
        seen += 1
    if seen != lay.objects:
        raise BundleError(path, f"index lists {lay.objects} objects but {seen} records were found")
    return outside


def read_bundle_header(path: str | os.PathLike[str]) -> BundleInfo:
    """What a bundle holds, from its header and trailer only (the digest is not checked)."""
    name = os.fspath(path)
    with open(name, "rb") as f:
        lay = _layout(f, name, check_digest=False)
    return _info(name, lay)


def _info(path: str, lay: _Layout) -> BundleInfo:
    return BundleInfo(
        path=path,
        objects=lay.objects,
        bytes=lay.size,
        roots=[r.hex() for r in lay.roots],
        refs={n: v.hex() for n, v in lay.refs.items()},
        created=lay.created,
        manifest=lay.manifest,
    )


# -- importing -------------------------------------------------------------------------------


def import_bundle(
    store: Store,
    path: str | os.PathLike[str],
    *,
    refs: bool = True,
    progress: Progress | None = None,
) -> ImportReport:
    """Verify a whole bundle, then add its objects to ``store`` and create or move its refs.

    Nothing is written unless every object is sound, the bundle is closed over the store
    (every link is in the bundle or already stored) and, with ``refs``, every ref is absent,
    equal, or an ancestor of the bundle's value (a fast-forward). A problem raises
    `BundleError` (or `BundleRefConflict`) naming the file, and the object or ref at fault.
    ``progress`` gets the number of objects written.
    """
    name = os.fspath(path)
    if refs:
        store.refs.check_writable()  # refuse before writing objects, not after
    with open(name, "rb", buffering=_BUF) as f:
        lay = _layout(f, name, check_digest=True)
        index = _read_index(f, name, lay)
        outside = _verify_records(f, name, lay, index)
        absent = store.missing(list(outside))
        if absent:
            raise BundleError(
                name,
                f"bundle is not closed: object {absent[0]} (linked from {outside[absent[0]]}) "
                "is neither in the bundle nor in this store",
            )
        named = [(f"root {r}", r) for r in lay.roots]
        if refs:
            named += [(f"ref {n!r}", v) for n, v in lay.refs.items()]
        for what, oid in named:
            if oid not in index and not store.has(oid):
                raise BundleError(
                    name, f"{what} names {oid}, which is neither in the bundle nor in this store"
                )
        updates = _plan_refs(store, f, name, index, lay.refs) if refs else []
        new = _write_objects(store, f, name, lay, index, progress)
    _check_policies(store, name, updates)
    done: list[str] = []
    for ref, old, value in updates:
        if not store.refs.set_if_equals(ref, old, value, f"import {name}"):
            current = store.refs.get(ref)
            raise ConflictError(
                ref, None if old is None else old.hex(), None if current is None else current.hex()
            )
        done.append(ref)
    return ImportReport(objects=lay.objects, new=new, refs_updated=done)


def _plan_refs(
    store: Store,
    f: BinaryIO,
    path: str,
    index: Mapping[ObjectId, int],
    refs: Mapping[str, ObjectId],
) -> list[tuple[str, ObjectId | None, ObjectId]]:
    """``(name, expected current value, new value)`` for each ref to create or move."""
    plan: list[tuple[str, ObjectId | None, ObjectId]] = []
    for name, value in refs.items():
        current = store.refs.get(name)
        if current == value:
            continue
        if current is not None and not _reaches(store, f, path, index, value, current):
            raise BundleRefConflict(path, name, current.hex(), value.hex())
        plan.append((name, current, value))
    return plan


def _check_policies(
    store: Store, path: str, updates: list[tuple[str, ObjectId | None, ObjectId]]
) -> None:
    """Run the update policies of every ref to move before any moves (they read the new
    records, so the objects are in by now): a bundle's refs move all or none. Reaching
    the old value is never enough for them (a crafted record may link anything)."""
    for ref, old, value in updates:
        if policies.covered(ref):
            try:
                policies.check(store, ref, old, value)
            except policies.RefPolicyRefused as e:
                e.args = (f"{path}: {e.args[0]}; no ref was moved (the objects are stored)",)
                raise


def _reaches(
    store: Store,
    f: BinaryIO,
    path: str,
    index: Mapping[ObjectId, int],
    start: ObjectId,
    goal: ObjectId,
) -> bool:
    """Whether ``goal`` is in the closure of ``start``, reading the bundle, then the store."""
    seen = {start}
    frontier = [start]
    while frontier:
        if goal in seen:
            return True
        nxt: list[ObjectId] = []
        for oid in frontier:
            data = _read_record(f, path, index, oid) if oid in index else _stored(store, oid)
            if data is None:
                continue
            for link in encoding.links(data):
                if link not in seen:
                    seen.add(link)
                    nxt.append(link)
        frontier = nxt
    return goal in seen


def _read_record(f: BinaryIO, path: str, index: Mapping[ObjectId, int], oid: ObjectId) -> bytes:
    pos = index[oid]
    f.seek(pos)
    head = _read_exact(f, _RECORD_HEAD, path, pos)
    data = _read_exact(f, int.from_bytes(head[ID_SIZE:], "big"), path, pos + _RECORD_HEAD)
    if head[:ID_SIZE] != oid or hash_bytes(data) != oid:
        raise BundleError(path, f"object {oid} changed while the bundle was being imported", pos)
    return data


def _stored(store: Store, oid: ObjectId) -> bytes | None:
    try:
        return store.get_raw(oid)
    except NotFound:
        return None


def _write_objects(
    store: Store,
    f: BinaryIO,
    path: str,
    lay: _Layout,
    index: Mapping[ObjectId, int],
    progress: Progress | None,
) -> int:
    """Write every record, children before parents; return how many were new to the store.

    The file's order (parents first) is no order to write in: a batch written, then a kill
    or a full disk, would leave parents whose children are missing, which a later pull or
    push takes as complete. So the records go height by height (`_order.levels`), each
    height in batches of its own: every object is in a later batch than all it links.
    A stored copy that differs from the bundle's (corrupt) is replaced by the backend's
    put (see `Backend.put_many`).
    """
    backend = store.backend
    ids = list(index)  # sorted: the index is read in id order
    node = {oid: i for i, oid in enumerate(ids)}
    kids: list[list[int]] = [[] for _ in ids]
    for pos, oid, data in _records(f, path, lay):
        if oid not in node or hash_bytes(data) != oid:
            raise BundleError(
                path, f"object {oid} changed while the bundle was being imported", pos
            )
        kids[node[oid]] = [node[link] for link in encoding.links(data) if link in node]
    new = written = 0
    for level in _order.levels(kids):
        batch: list[tuple[bytes, bytes]] = []
        size = 0
        for i in sorted(level, key=lambda i: index[ids[i]]):  # file order within a height
            # every id in the index was verified (hash, canonical form) by an earlier
            # pass, and bytes that hash to a verified id are those very bytes
            batch.append((ids[i], _read_record(f, path, index, ids[i])))
            size += len(batch[-1][1])
            if len(batch) >= _BATCH or size >= _BATCH_BYTES:
                new += backend.put_many(batch)
                crash_point("write")
                written += len(batch)
                batch, size = [], 0
                if progress:
                    progress(written)
        if batch:
            new += backend.put_many(batch)
            crash_point("write")
            written += len(batch)
            if progress:
                progress(written)
    return new


# -- exporting -------------------------------------------------------------------------------


class _HashingWriter:
    """A file writer that hashes what it writes and knows its position."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.hash = blake3.blake3()
        self.pos = 0

    def write(self, *parts: bytes) -> None:
        for p in parts:
            self.f.write(p)
            self.hash.update(p)
            self.pos += len(p)


def export_bundle(
    store: Store,
    roots: Iterable[ObjectId | str],
    path: str | os.PathLike[str],
    *,
    refs: Mapping[str, ObjectId | str] | None = None,
    progress: Progress | None = None,
    manifest: Mapping[str, str] | None = None,
) -> BundleInfo:
    """Write the closure of ``roots`` (and of the refs' targets) with ``refs`` to ``path``.

    The file appears only when complete: it is written beside the target and renamed.
    ``progress`` gets the number of objects written; ``manifest`` goes into the header as
    it is (what the bundle holds, in the caller's words; `read_bundle_header` gives it).
    """
    root_ids = [parse_id(r) for r in roots]
    ref_ids = {check_ref_name(n): parse_id(v) for n, v in (refs or {}).items()}
    created = time.time()
    header = _HEADER_ENC.encode(
        _Header(
            roots=[r.hex() for r in root_ids],
            refs={n: v.hex() for n, v in sorted(ref_ids.items())},
            created=created,
            manifest=dict(manifest or {}),
        )
    )
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb", buffering=_BUF) as raw:
            w = _HashingWriter(raw)
            w.write(MAGIC, bytes([FORMAT_VERSION]), len(header).to_bytes(4, "big"), header)
            index: list[tuple[bytes, int]] = []
            for oid, data in store.walk([*root_ids, *ref_ids.values()], progress=progress):
                if data is None:  # walk raises NotFound first; this keeps the types honest
                    raise NotFound("object", oid.hex())
                index.append((bytes(oid), w.pos))
                w.write(oid, len(data).to_bytes(8, "big"), data)
            index_offset = w.pos
            index.sort()
            for part in range(0, len(index), _BATCH):
                w.write(b"".join(k + o.to_bytes(8, "big") for k, o in index[part : part + _BATCH]))
            w.write(index_offset.to_bytes(8, "big"), len(index).to_bytes(8, "big"))
            raw.write(w.hash.digest() + END)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return BundleInfo(
        path=str(target),
        objects=len(index),
        bytes=w.pos + 32 + len(END),
        roots=[r.hex() for r in root_ids],
        refs={n: v.hex() for n, v in ref_ids.items()},
        created=created,
        manifest=dict(manifest or {}),
    )


def _fsync_dir(path: Path) -> None:
    # Makes the rename durable; not possible on every platform (Windows), hence best effort.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
