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


def test_corrupt_reachable_object_stops_gc_before_any_delete(aged: mc.Store) -> None:
    root, _ = build(aged, "corrupt")
    aged.refs.set("main", root)
    subtree = aged.get(root)["d0"]
    _tamper(aged, subtree, b"not the subtree any more")
    _garbage(aged, 5)
    _backdate(aged, 3600)
    before = set(aged.iter_ids())
    with pytest.raises(mc.IntegrityError, match=subtree.hex()):
        gc(aged, grace=0)
    assert set(aged.iter_ids()) == before  # its children might be reachable: nothing goes


def test_a_corrupt_object_nothing_reaches_is_swept(aged: mc.Store) -> None:
    """The pass reads every object, the unreachable too: a corrupt one that nothing reaches
    does not stop gc (its links do not matter), it is garbage."""
    root, _ = build(aged, "kept")
    aged.refs.set("main", root)
    orphan, _ = build(aged, "orphan", leaves=5)
    _tamper(aged, orphan, b"not the orphan any more")
    _backdate(aged, 3600)
    report = gc(aged, grace=0)
    assert orphan.hex() in report.swept_ids
    assert set(aged.iter_ids()) == aged.closure(root)


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


class _Unordered(LMDBBackend):
    """An LMDB store whose pass comes out of key order (as a folder's listing may): gc
    marks by the walk instead."""

    def iter_stamped_parts(
        self, held_bytes: int, size: int = 4096
    ) -> Iterator[tuple[list[bytes], list[bytes | None], list[float]]]:
        for keys, values, stamps in super().iter_stamped_parts(held_bytes, size):
            yield keys[::-1], values[::-1], stamps[::-1]


def _world(store: mc.Store) -> tuple[set[ObjectId], set[ObjectId]]:
    """Refs over trees, a history, old garbage and young objects: (the reachable, the
    garbage)."""
    kept: set[ObjectId] = set()
    for i in range(6):
        root, _ = build(store, f"kept {i}", leaves=40)
        store.refs.set(f"runs/{i}", root)
        kept |= store.closure(root)
    moved, _ = build(store, "moved away")
    store.refs.set("moving", moved)
    kept |= store.closure(moved)
    store.refs.set("moving", root)
    garbage = _garbage(store, 300)
    for i in range(3):
        garbage |= store.closure(build(store, f"garbage {i}")[0]) - kept
    _backdate(store, 3600)
    store.put_blob(b"young")
    return kept, garbage


@pytest.mark.parametrize("spill", [None, "7"])
def test_gc_by_its_pass_agrees_with_gc_by_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill: str | None
) -> None:
    """The same store marked by the pass (LMDB's listing, in key order) and by the walk
    (a listing out of order) keeps and sweeps the same objects; with a tiny spill bound,
    the pass's levels and the walk's marks spill to disk and change nothing."""
    if spill:
        monkeypatch.setenv("MEDOMNI_SPILL_IDS", spill)
    reports = []
    left = []
    for name, kind in (("pass", LMDBBackend), ("walk", _Unordered)):
        with mc.Store(kind(tmp_path / name, durable=False)) as store:
            kept, garbage = _world(store)
            reports.append(gc(store, grace=0))
            left.append(set(store.iter_ids()))
            assert kept <= left[-1] and not garbage & left[-1]
            assert fsck(store).ok
    by_pass, by_walk = reports
    assert by_pass.swept == by_walk.swept == len(garbage)
    assert by_pass.reachable == by_walk.reachable == len(kept)
    assert by_pass.kept_young == by_walk.kept_young == 1
    assert set(by_pass.swept_ids) == set(by_walk.swept_ids)
    assert left[0] == left[1]


def test_gc_reads_each_object_once_in_its_pass(tmp_path: Path) -> None:
    """A sound store is read by the pass alone: no object is read again by id."""
    with mc.Store(LMDBBackend(tmp_path / "s", durable=False)) as store:
        _world(store)
        reads: list[int] = []
        b = store.backend
        assert isinstance(b, LMDBBackend)
        for name in ("get_list", "get_parts", "get_many", "get"):
            method = getattr(b, name)

            def counted(*args: object, _m=method, **kw: object) -> object:  # type: ignore[no-untyped-def]
                reads.append(1)
                return _m(*args, **kw)

            setattr(b, name, counted)
        listed = b.iter_stamped_parts
        passes: list[int] = []

        def counted_pass(held_bytes: int, size: int = 4096):  # type: ignore[no-untyped-def]
            passes.append(1)
            return listed(held_bytes, size)

        b.iter_stamped_parts = counted_pass  # type: ignore[method-assign]
        report = gc(store, grace=0)
        assert report.swept > 0
        assert passes == [1] and reads == []


def test_an_object_put_after_the_pass_has_its_links_followed(tmp_path: Path) -> None:
    """The refs are read after the pass: a ref set meanwhile to an object the pass did not
    list has that object read, and what it links (old, and reached by nothing else) kept."""
    with mc.Store(LMDBBackend(tmp_path / "s", durable=False)) as store:
        root, _ = build(store, "kept")
        store.refs.set("main", root)
        old, _ = build(store, "old, then linked again")
        below = store.closure(old)
        garbage = _garbage(store, 20)
        _backdate(store, 3600)
        b = store.backend
        listed = b.iter_stamped_parts
        late: list[ObjectId] = []

        def then_write(held_bytes: int, size: int = 4096):  # type: ignore[no-untyped-def]
            yield from listed(held_bytes, size)
            late.append(store.put_tree({"again": old}))  # after the pass, before the roots
            store.refs.set("late", late[0])

        b.iter_stamped_parts = then_write  # type: ignore[method-assign]
        report = gc(store, grace=0)
        assert late and below | {late[0]} <= set(store.iter_ids())
        assert report.swept == len(garbage)
        assert report.reachable == len(store.closure(root) | below) + 1
