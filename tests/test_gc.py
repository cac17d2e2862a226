"""gc: keeps what refs and recent ref history reach, and anything young; sweeps the rest."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.backends.memory import MemoryBackend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.gc import MAX_SWEPT_IDS, gc
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.verify import fsck
from tests.conftest import store_url
from tests.test_verify import _tamper, build


def _backdate(store: mc.Store, seconds: float) -> None:
    """Make every stored object look ``seconds`` older than it is."""
    b = store.backend
    if isinstance(b, MemoryBackend):
        for key, (stamp, data) in list(b._objects.items()):
            b._objects[key] = (stamp - seconds, data)
    elif isinstance(b, LMDBBackend):
        with b.env.begin(write=True) as txn:
            cur = txn.cursor(b._objects)
            for key, value in list(cur):
                ms = int.from_bytes(value[1:9], "little") - int(seconds * 1000)
                cur.put(key, value[:1] + ms.to_bytes(8, "little") + value[9:])
    elif hasattr(b, "_object_path"):  # directory backend: the file's mtime is its stamp
        for key in list(b.iter_keys()):
            path = b._object_path(key)
            st = path.stat()
            os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))
    else:
        pytest.skip(f"cannot age objects in {type(b).__name__}")


@pytest.fixture(params=["memory", "lmdb", "file"])
def aged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[mc.Store]:
    s = mc.open(store_url(request.param, tmp_path))
    yield s
    s.close()


def _garbage(store: mc.Store, n: int, tag: str = "garbage") -> set[ObjectId]:
    return {store.put_blob(f"{tag} {i}".encode()) for i in range(n)}


def test_keeps_reachable_and_sweeps_old_garbage(aged: mc.Store) -> None:
    root, _ = build(aged, "keep")
    aged.refs.set("main", root)
    reachable = aged.closure(root)
    garbage = _garbage(aged, 25)
    _backdate(aged, 3600)
    report = gc(aged, grace=0)
    assert report.reachable == len(reachable)
    assert report.swept == len(garbage) and report.kept_young == 0 and not report.dry_run
    assert set(report.swept_ids) == {g.hex() for g in garbage}
    assert set(aged.iter_ids()) == reachable
    assert fsck(aged).ok
    again = gc(aged, grace=0)
    assert again.swept == 0 and again.reachable == len(reachable)


def test_grace_period_protects_young_objects(aged: mc.Store) -> None:
    root, _ = build(aged, "keep")
    aged.refs.set("main", root)
    old = _garbage(aged, 10, "old")
    _backdate(aged, 7200)
    young = _garbage(aged, 10, "young")
    report = gc(aged, grace=3600)
    assert report.swept == len(old) and report.kept_young == len(young)
    assert set(report.swept_ids) == {g.hex() for g in old}
    assert young <= set(aged.iter_ids())
    # with the default grace of a day, objects an hour or two old are safe too
    _backdate(aged, 7200)
    assert gc(aged).kept_young == len(young)
    assert young <= set(aged.iter_ids())


def test_dry_run_deletes_nothing(aged: mc.Store) -> None:
    root, _ = build(aged, "keep")
    aged.refs.set("main", root)
    garbage = _garbage(aged, 12)
    _backdate(aged, 3600)
    before = set(aged.iter_ids())
    report = gc(aged, grace=0, dry_run=True)
    assert report.dry_run and report.swept == len(garbage)
    assert set(report.swept_ids) == {g.hex() for g in garbage}
    assert set(aged.iter_ids()) == before


def test_ref_history_keeps_old_values_within_retention(aged: mc.Store) -> None:
    first, _ = build(aged, "first")
    second, _ = build(aged, "second")
    deleted, _ = build(aged, "deleted")
    aged.refs.set("main", first)
    aged.refs.set("main", second)
    aged.refs.set("scratch", deleted)
    aged.refs.delete("scratch")
    everything = set(aged.iter_ids())
    _backdate(aged, 3600)
    report = gc(aged, grace=0)  # the history is seconds old: well within 30 days
    assert report.swept == 0
    assert set(aged.iter_ids()) == everything
    # a retention of zero keeps only what current refs reach
    report = gc(aged, grace=0, reflog_retention=0.0)
    assert set(aged.iter_ids()) == aged.closure(second)
    assert report.swept == len(everything - aged.closure(second))


def test_missing_reachable_object_does_not_stop_gc(aged: mc.Store) -> None:
    root, leaves = build(aged, "damaged")
    aged.refs.set("main", root)
    garbage = _garbage(aged, 5)
    _backdate(aged, 3600)
    aged.backend.delete_many([leaves[0]])
    report = gc(aged, grace=0)
    assert report.swept == len(garbage)
    assert set(aged.iter_ids()) == aged.closure(root, allow_missing=True)


def test_corrupt_reachable_object_stops_gc_before_any_delete() -> None:
    store = mc.open("memory://")
    root, _ = build(store, "corrupt")
    store.refs.set("main", root)
    subtree = store.get(root)["d0"]
    _tamper(store, subtree, b"not the subtree any more")
    _garbage(store, 5)
    _backdate(store, 3600)
    before = set(store.iter_ids())
    with pytest.raises(mc.IntegrityError, match=subtree.hex()):
        gc(store, grace=0)
    assert set(store.iter_ids()) == before  # its children might be reachable: nothing goes


def test_objects_written_during_gc_are_kept(aged: mc.Store) -> None:
    root, _ = build(aged, "keep")
    aged.refs.set("main", root)
    garbage = _garbage(aged, 30)
    _backdate(aged, 3600)
    written: list[ObjectId] = []

    def write_meanwhile(done: int) -> None:  # runs at every progress step: mark and sweep
        written.append(aged.put_blob(f"written during gc at {done} {len(written)}".encode()))

    report = gc(aged, grace=0, progress=write_meanwhile)
    assert len(written) >= 2
    assert not garbage & set(aged.iter_ids())
    assert set(written) <= set(aged.iter_ids())
    assert report.swept == len(garbage)


def test_concurrent_writer_thread_on_lmdb(tmp_path: Path) -> None:
    store = mc.open(store_url("lmdb", tmp_path))
    try:
        root, _ = build(store, "keep")
        store.refs.set("main", root)
        # many old unreachable objects, so that the sweep takes a while
        garbage = set(store.put_raw_many((None, blob_object(b"g%d" % i)[1]) for i in range(5000)))
        _backdate(store, 3600)
        written: list[ObjectId] = []
        stop = threading.Event()
        gc_started = threading.Event()
        during: list[ObjectId] = []

        def writer() -> None:
            i = 0
            while not stop.is_set():
                oid = store.put_blob(f"concurrent {i}".encode())
                written.append(oid)
                if gc_started.is_set():
                    during.append(oid)
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        try:
            while len(written) < 5:
                time.sleep(0.001)
            gc_started.set()
            report = gc(store, grace=0)
        finally:
            stop.set()
            t.join()
        assert during, "the writer made no object while gc ran; the test proved nothing"
        present = set(store.iter_ids())
        assert set(written) <= present
        assert not garbage & present
        assert report.swept == len(garbage)
        assert fsck(store).ok
    finally:
        store.close()


def test_swept_ids_are_capped() -> None:
    store = mc.open("memory://")
    garbage = _garbage(store, MAX_SWEPT_IDS + 50)
    _backdate(store, 3600)
    report = gc(store, grace=0)
    assert report.swept == len(garbage)
    assert len(report.swept_ids) == MAX_SWEPT_IDS
    assert {ObjectId.from_hex(h) for h in report.swept_ids} <= garbage


class _NoDeletes(MemoryBackend):
    supports_deletes = False


def test_refuses_backend_without_deletes() -> None:
    store = mc.Store(_NoDeletes())
    store.put_blob(b"x")
    with pytest.raises(mc.UnsupportedOperation, match="cannot delete"):
        gc(store, grace=0)


def test_refuses_negative_grace() -> None:
    store = mc.open("memory://")
    with pytest.raises(ValueError, match="grace"):
        gc(store, grace=-1)


def test_a_history_that_cannot_be_read_stops_gc_and_is_named(tmp_path: Path) -> None:
    """The histories are read many names at a time; one that does not decode is still named
    (read again alone), and gc deletes nothing: it cannot know what that history protects."""
    from medomni_cas.errors import InvalidObject

    store = mc.Store(LMDBBackend(tmp_path / "s", durable=False))
    with store:
        for i in range(5):
            store.refs.set(f"runs/{i}", store.put_blob(b"kept %d" % i))
        garbage = store.put_blob(b"garbage")
        b = store.backend
        assert isinstance(b, LMDBBackend)
        with b.env.begin(write=True) as txn:
            cur = txn.cursor(b._reflog)
            assert cur.set_range(b"runs/3\x00")
            cur.put(bytes(cur.key()), b"\xc1 not an entry")
        with pytest.raises(InvalidObject, match="history of ref 'runs/3' cannot be read"):
            gc(store, grace=0)
        assert store.backend.contains(garbage)
