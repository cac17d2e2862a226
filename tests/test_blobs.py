"""Blobs: the same bytes get the same id however they arrive; readers seek and stay small."""

from __future__ import annotations

import contextlib
import io
import os
import random
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import medomni_cas as mc
from medomni_cas.store import blobs, objects
from medomni_cas.store.encoding import encode, encode_blob_header
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.objects import CHUNK_SIZE, ChunkedBlob

MiB = 1 << 20
SIZES = [0, 1, CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 3 * CHUNK_SIZE + 5]


def data_of(size: int, seed: int = 0) -> bytes:
    return random.Random(seed * 7919 + size).randbytes(size)


class PieceStream(io.RawIOBase):
    """A non-seekable stream that hands out at most ``piece`` bytes per read."""

    def __init__(self, data: bytes, piece: int) -> None:
        super().__init__()
        self._data = memoryview(data)
        self._pos = 0
        self._piece = piece

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self._piece, len(self._data) - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


@contextlib.contextmanager
def pipe_of(data: bytes) -> Iterator[io.RawIOBase]:
    """The read end of an OS pipe fed by a thread: short reads, no seeking."""
    r, w = os.pipe()

    def feed() -> None:
        with os.fdopen(w, "wb") as f:
            f.write(data)

    t = threading.Thread(target=feed)
    t.start()
    try:
        with os.fdopen(r, "rb", buffering=0) as f:
            yield f
    finally:
        t.join()


def expected_id(data: bytes, chunk_size: int = CHUNK_SIZE) -> ObjectId:
    """The id the object model prescribes, computed without blobs.py."""

    def one(part: bytes) -> ObjectId:
        return hash_bytes(encode_blob_header(len(part)) + part)

    if len(data) <= chunk_size:
        return one(data)
    chunks = [one(data[i : i + chunk_size]) for i in range(0, len(data), chunk_size)]
    manifest = ChunkedBlob(size=len(data), chunk_size=chunk_size, chunks=chunks)
    return hash_bytes(encode(manifest))


@contextlib.contextmanager
def chunk_size(n: int) -> Iterator[None]:
    """Shrink CHUNK_SIZE for a test (both modules import it by value)."""
    saved = blobs.CHUNK_SIZE, objects.CHUNK_SIZE
    blobs.CHUNK_SIZE = objects.CHUNK_SIZE = n
    try:
        yield
    finally:
        blobs.CHUNK_SIZE, objects.CHUNK_SIZE = saved


# -- identity -----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_same_id_from_bytes_path_and_streams(store: mc.Store, tmp_path: Path, size: int) -> None:
    data = data_of(size)
    want = expected_id(data)
    path = tmp_path / "f.bin"
    path.write_bytes(data)

    assert store.put_blob(data) == want
    assert store.put_blob(bytearray(data)) == want
    assert store.put_blob(path) == want
    assert store.put_blob(str(path)) == want
    assert store.put_blob(PieceStream(data, 7777)) == want
    with pipe_of(data) as f:
        assert store.put_blob(f) == want
    assert store.read_blob(want) == data


def test_exactly_chunk_size_is_one_object(store: mc.Store) -> None:
    oid = store.put_blob(data_of(CHUNK_SIZE))
    assert store.kind(oid) == "blob"
    assert isinstance(store.get(oid), bytes)


def test_one_more_byte_is_chunked(store: mc.Store) -> None:
    data = data_of(CHUNK_SIZE + 1)
    oid = store.put_blob(data)
    assert store.kind(oid) == "chunked-blob"
    manifest = store.get(oid, ChunkedBlob)
    assert manifest.size == CHUNK_SIZE + 1
    assert manifest.chunk_size == CHUNK_SIZE
    assert [len(store.read_blob(c)) for c in manifest.chunks] == [CHUNK_SIZE, 1]
    assert store.read_blob(manifest.chunks[1]) == data[-1:]


def test_identical_chunks_are_stored_once(store: mc.Store) -> None:
    block = data_of(CHUNK_SIZE, seed=4)
    before = set(store.iter_ids())
    oid = store.put_blob(block * 4)
    added = set(store.iter_ids()) - before
    manifest = store.get(oid, ChunkedBlob)
    assert len(manifest.chunks) == 4 and len(set(manifest.chunks)) == 1
    assert added == {oid, manifest.chunks[0]}
    assert store.read_blob(oid) == block * 4


def test_storing_twice_adds_nothing(store: mc.Store) -> None:
    data = data_of(2 * CHUNK_SIZE + 3)
    oid = store.put_blob(data)
    keys = set(store.iter_ids())
    assert store.put_blob(PieceStream(data, 100_000)) == oid
    assert set(store.iter_ids()) == keys


# -- reading ------------------------------------------------------------------------------------
@pytest.fixture
def big(store: mc.Store) -> tuple[mc.Store, ObjectId, bytes]:
    data = data_of(3 * CHUNK_SIZE + 5, seed=9)
    return store, store.put_blob(data), data


def test_reader_read_tell_and_boundaries(big: tuple[mc.Store, ObjectId, bytes]) -> None:
    store, oid, data = big
    with store.open_blob(oid) as f:
        assert f.readable() and f.seekable() and not f.writable()
        assert f.size == len(data)
        assert f.read(10) == data[:10]
        assert f.tell() == 10
        # straddles the first chunk boundary
        f.seek(CHUNK_SIZE - 3)
        assert f.read(7) == data[CHUNK_SIZE - 3 : CHUNK_SIZE + 4]
        # one read across three chunks
        f.seek(CHUNK_SIZE - 1)
        assert f.read(2 * CHUNK_SIZE + 2) == data[CHUNK_SIZE - 1 : 3 * CHUNK_SIZE + 1]
        assert f.tell() == 3 * CHUNK_SIZE + 1
        assert f.read() == data[3 * CHUNK_SIZE + 1 :]
        assert f.read(1) == b""
        assert f.read() == b""


def test_reader_seek_whences(big: tuple[mc.Store, ObjectId, bytes]) -> None:
    store, oid, data = big
    with store.open_blob(oid) as f:
        assert f.seek(5, io.SEEK_END) == len(data) + 5
        assert f.read(4) == b""  # past the end
        assert f.seek(-6, io.SEEK_END) == len(data) - 6
        assert f.read() == data[-6:]
        assert f.seek(2 * CHUNK_SIZE) == 2 * CHUNK_SIZE
        assert f.seek(-2, io.SEEK_CUR) == 2 * CHUNK_SIZE - 2
        assert f.read(4) == data[2 * CHUNK_SIZE - 2 : 2 * CHUNK_SIZE + 2]
        assert f.seek(0, io.SEEK_CUR) == 2 * CHUNK_SIZE + 2
        with pytest.raises(ValueError, match="negative"):
            f.seek(-1)
        assert f.tell() == 2 * CHUNK_SIZE + 2  # a refused seek does not move


def test_reader_readinto(big: tuple[mc.Store, ObjectId, bytes]) -> None:
    store, oid, data = big
    with store.open_blob(oid) as f:
        buf = bytearray(CHUNK_SIZE + 10)
        f.seek(CHUNK_SIZE // 2)
        assert f.readinto(buf) == len(buf)
        assert bytes(buf) == data[CHUNK_SIZE // 2 : CHUNK_SIZE // 2 + len(buf)]
        f.seek(len(data) - 3)
        assert f.readinto(buf) == 3
        assert bytes(buf[:3]) == data[-3:]
        assert f.readinto(buf) == 0
        # io.BufferedReader on top works (readinto contract honoured)
        f.seek(0)
        buffered = io.BufferedReader(f, buffer_size=4096)
        assert buffered.read(5000) == data[:5000]


@pytest.mark.parametrize("size", [0, 1, 100])
def test_reader_small_blobs(store: mc.Store, size: int) -> None:
    data = data_of(size)
    oid = store.put_blob(data)
    with store.open_blob(oid) as f:
        assert f.read() == data
        assert f.read() == b""
        f.seek(size // 2)
        assert f.read(1000) == data[size // 2 :]
        f.seek(0, io.SEEK_END)
        assert f.read() == b""


def test_open_blob_refuses_a_tree(store: mc.Store) -> None:
    tree = store.put_tree({})
    with pytest.raises(mc.InvalidObject, match=f"{tree}.*tree"):
        store.open_blob(tree)


def test_reading_a_large_blob_keeps_memory_bounded() -> None:
    """64 MiB through open_blob in 1 MiB pieces: the reader holds about one chunk."""
    store = mc.open("memory://")
    chunks = 64
    expected = blake3.blake3()

    def source() -> Iterator[bytes]:
        rng = random.Random(64)
        for _ in range(chunks):
            part = rng.randbytes(CHUNK_SIZE)
            expected.update(part)
            yield part

    class GenStream(io.RawIOBase):
        def __init__(self) -> None:
            super().__init__()
            self._it = source()
            self._rest = b""

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
            if not self._rest:
                self._rest = next(self._it, b"")
            n = min(len(buffer), len(self._rest))
            buffer[:n] = self._rest[:n]
            self._rest = self._rest[n:]
            return n

    oid = store.put_blob(GenStream())
    got = blake3.blake3()
    tracemalloc.start()
    try:
        with store.open_blob(oid) as f:
            total = 0
            while piece := f.read(MiB):
                got.update(piece)
                total += len(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == chunks * CHUNK_SIZE
    assert got.digest() == expected.digest()
    assert peak < 8 * MiB, f"peak {peak / MiB:.1f} MiB"


# -- properties ---------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=3000),
    small=st.integers(min_value=1, max_value=700),
    piece=st.integers(min_value=1, max_value=900),
    ops=st.lists(
        st.tuples(
            st.sampled_from([io.SEEK_SET, io.SEEK_CUR, io.SEEK_END]),
            st.integers(-3100, 3100),
            st.integers(0, 1200),
        ),
        max_size=8,
    ),
)
def test_random_bytes_round_trip(
    data: bytes, small: int, piece: int, ops: list[tuple[int, int, int]]
) -> None:
    store = mc.open("memory://")
    with chunk_size(small):
        want = expected_id(data, small)
        assert store.put_blob(data) == want
        assert store.put_blob(PieceStream(data, piece)) == want
        assert store.read_blob(want) == data
        with store.open_blob(want) as f:
            for whence, offset, n in ops:
                base = {io.SEEK_SET: 0, io.SEEK_CUR: f.tell(), io.SEEK_END: len(data)}[whence]
                if base + offset < 0:
                    with pytest.raises(ValueError):
                        f.seek(offset, whence)
                    continue
                assert f.seek(offset, whence) == base + offset
                start = f.tell()
                assert f.read(n) == data[start : start + n]
                assert f.tell() == start + len(data[start : start + n])


def test_random_bytes_round_trip_at_real_chunk_size(store: mc.Store) -> None:
    # a few MiB at the real chunk size, with an odd tail
    data = data_of(2 * CHUNK_SIZE + 12345, seed=3)
    oid = store.put_blob(PieceStream(data, 65537))
    assert oid == expected_id(data)
    assert store.read_blob(oid) == data


# -- crafted manifests --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "chunk_size", "n"),
    [(100, 10, 2), (10, 10, 2), (0, 10, 1), (5, 0, 1), (-1, 10, 0), (-5, 10, 1)],
)
def test_a_manifest_whose_sizes_do_not_add_up_is_refused(
    store: mc.Store, size: int, chunk_size: int, n: int
) -> None:
    chunk = store.put_blob(b"x")
    with pytest.raises(mc.InvalidObject, match=f"size {size} does not fit {n} chunks"):
        ChunkedBlob(size=size, chunk_size=chunk_size, chunks=[chunk] * n)
    # crafted bytes: refused by every typed read, not only by the one that reads chunks
    body = {"size": size, "chunk_size": chunk_size, "chunks": [chunk] * n}
    bad = store.put_object("chunked-blob", 1, body)
    for read in (store.get, lambda oid: store.get(oid, ChunkedBlob), store.open_blob):
        with pytest.raises(mc.InvalidObject, match=f"{bad}.*size {size} does not fit"):
            read(bad)


@pytest.mark.parametrize(("size", "chunk_size", "n"), [(20, 10, 2), (11, 10, 2), (0, 10, 0)])
def test_a_manifest_whose_sizes_add_up_is_made(size: int, chunk_size: int, n: int) -> None:
    chunks = [ObjectId(bytes(32))] * n
    assert ChunkedBlob(size=size, chunk_size=chunk_size, chunks=chunks).size == size


def test_reader_refuses_a_manifest_whose_chunks_are_short() -> None:
    # in a subprocess: the failure this guards against is an infinite loop, which must not
    # hang the suite
    code = """
import medomni_cas as mc
s = mc.open("memory://")
a = s.put_blob(b"x" * 10)
m = s.put(mc.ChunkedBlob(size=40, chunk_size=20, chunks=[a, a]))
try:
    s.read_blob(m)
except mc.InvalidObject as e:
    print("refused:", e)
else:
    print("read without error")
"""
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=10
        ).stdout
    except subprocess.TimeoutExpired:
        out = "timed out"
    assert out.startswith("refused:"), out


def test_reader_refuses_a_manifest_whose_chunks_are_long() -> None:
    store = mc.open("memory://")
    long = store.put_blob(b"x" * 30)
    oid = store.put(ChunkedBlob(size=40, chunk_size=20, chunks=[long, long]))
    with pytest.raises(mc.InvalidObject), store.open_blob(oid) as f:
        f.read(100)
