"""Blobs: bytes, files or streams in, a seekable reader out, with bounded memory.

A blob of at most `CHUNK_SIZE` bytes is one ``blob`` object. A longer one is split into
`CHUNK_SIZE` chunks, each its own ``blob`` (so identical chunks are stored once), under a
`ChunkedBlob` manifest whose id is the blob's id. Which form a blob takes depends only on
its length, so the same bytes always get the same id however they arrive.
"""

from __future__ import annotations

import io
import os
from collections.abc import Buffer, Iterator
from typing import TYPE_CHECKING, BinaryIO

from medomni_cas.errors import InvalidObject
from medomni_cas.store.encoding import BLOB, blob_data, encode_blob_header, kind_of
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.objects import CHUNK_SIZE, CHUNKED, ChunkedBlob

if TYPE_CHECKING:
    from medomni_cas.store.store import Store

__all__ = ["BlobReader", "blob_object", "put_blob"]

# Chunks written per backend batch: bounds memory at _BATCH * CHUNK_SIZE (32 MiB). Larger
# batches let a backend flush many chunk files together (LMDB fsyncs a batch's files in
# parallel): 32 put a 512 MiB blob ~2x faster than 8 (benchmarks_perf/RESULTS.md).
_BATCH = 32


def blob_object(data: bytes | memoryview) -> tuple[ObjectId, bytes]:
    """The id and canonical bytes of one (unchunked) blob."""
    header = encode_blob_header(len(data))
    return hash_bytes(header, data), header + bytes(data)


def _split_chunks(
    source: bytes | bytearray | memoryview | BinaryIO,
) -> Iterator[bytes | memoryview]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        mv = memoryview(source)
        for i in range(0, len(mv), CHUNK_SIZE):
            yield mv[i : i + CHUNK_SIZE]
        return
    while True:
        buf = _read_full(source, CHUNK_SIZE)
        if not buf:
            return
        yield buf


def _read_full(f: BinaryIO, n: int) -> bytes:
    parts = []
    while n > 0:
        b = f.read(n)
        if not b:
            break
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def put_blob(
    store: Store, source: bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO
) -> ObjectId:
    """Store bytes, a file (by path) or a binary stream as a blob; return its id."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return put_blob(store, f)
    chunks = _split_chunks(source)
    first = next(chunks, b"")
    second = next(chunks, None)
    if second is None:
        oid, data = blob_object(first)
        store.backend.put_many([(oid, data)])
        return oid
    ids: list[ObjectId] = []
    batch: list[tuple[ObjectId, bytes]] = []
    size = 0
    for chunk in _prepend(first, second, chunks):
        size += len(chunk)
        batch.append(blob_object(chunk))
        if len(batch) >= _BATCH:
            ids.extend(k for k, _ in batch)
            store.backend.put_many(batch)
            batch = []
    if batch:
        ids.extend(k for k, _ in batch)
        store.backend.put_many(batch)
    return store.put(ChunkedBlob(size=size, chunk_size=CHUNK_SIZE, chunks=ids))


def _prepend(
    a: bytes | memoryview, b: bytes | memoryview, rest: Iterator[bytes | memoryview]
) -> Iterator[bytes | memoryview]:
    yield a
    yield b
    yield from rest


class BlobReader(io.RawIOBase):
    """A read-only, seekable file over a blob; holds at most one chunk in memory."""

    def __init__(self, store: Store, oid: ObjectId) -> None:
        super().__init__()
        self._store = store
        self.id = oid
        data = store.get_raw(oid)
        kind, _ = kind_of(data)
        if kind == BLOB:
            self._manifest = None
            self._cache: tuple[int, bytes] = (0, bytes(blob_data(data)))
            self.size = len(self._cache[1])
        elif kind == CHUNKED:
            # the manifest checks its own arithmetic when decoded (ChunkedBlob.__post_init__)
            m = self._manifest = store.get(oid, ChunkedBlob)
            self.size = m.size
            self._cache = (-1, b"")
        else:
            raise InvalidObject(f"object {oid} is a {kind}, not a blob")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        pos = base + offset
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def _chunk(self, index: int) -> bytes:
        if self._cache[0] != index:
            assert self._manifest is not None
            raw = self._store.get_raw(self._manifest.chunks[index])
            self._cache = (index, bytes(blob_data(raw)))
        return self._cache[1]

    def readinto(self, buffer: Buffer) -> int:
        out = memoryview(buffer).cast("B")
        written = 0
        while written < len(out) and self._pos < self.size:
            if self._manifest is None:
                index, offset = 0, self._pos
            else:
                index, offset = divmod(self._pos, self._manifest.chunk_size)
            chunk = self._chunk(index)
            if self._manifest is not None:
                # a chunk of the wrong length would loop forever or read past the end
                cs = self._manifest.chunk_size
                expected = min(cs, self.size - index * cs)
                if len(chunk) != expected:
                    raise InvalidObject(
                        f"blob {self.id}: chunk {index} has {len(chunk)} bytes, "
                        f"the manifest says {expected}"
                    )
            n = min(len(out) - written, len(chunk) - offset)
            out[written : written + n] = chunk[offset : offset + n]
            written += n
            self._pos += n
        return written

    def readall(self) -> bytes:
        parts = []
        while self._pos < self.size:
            part = self.read(min(self.size - self._pos, 1 << 24))
            if not part:
                break
            parts.append(part)
        return b"".join(parts)
