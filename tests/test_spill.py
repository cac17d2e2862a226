"""Walks whose memory is bounded: what they met and their levels spill to disk past a bound.

The bound is forced tiny (``MEDOMNI_SPILL_IDS``) so that the spilling path runs here, and
every answer is compared with the in-memory path's: the same problems, in the same order,
from fsck and verify; the same objects kept by gc, which a kill mid-sweep does not change.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.store import _mapped
from medomni_cas.store._crash import CRASH_ENV
from medomni_cas.store._spill import IdList, MarkSet, Run
from medomni_cas.store.backends import lmdb as lmdb_backend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.gc import gc
from medomni_cas.store.ids import hash_bytes
from medomni_cas.store.verify import fsck, verify_closure, walk_checked
from tests.test_gc import _backdate
from tests.test_verify import _tamper, build

ROOT = Path(__file__).resolve().parent.parent


def _ids(n: int, salt: str = "") -> list[bytes]:
    return [bytes(hash_bytes(f"{salt}{i}".encode())) for i in range(n)]


def test_markset_spills_and_answers_as_a_set(tmp_path: Path) -> None:
    ids = _ids(50)
    with MarkSet(bound=1_000_000) as mem, MarkSet(bound=7) as disk:
        for part in (ids[:5], ids[3:20] + ids[3:6], ids[10:50], ids[:50]):
            assert disk.unseen(part) == mem.unseen(part)
        assert disk.spilled and not mem.spilled
        assert len(disk) == len(mem) == 50
        probe = [*ids[::7], *_ids(5, "other")]
        assert disk.absent(probe) == mem.absent(probe) == _ids(5, "other")
        assert ids[3] in disk and _ids(1, "other")[0] not in disk
        where = disk._dir
        assert where is not None and where.exists()
    assert not where.exists(), "the spilled set is removed when closed"


def test_idlist_reads_back_in_walk_order() -> None:
    ids = _ids(300)
    with IdList(bound=16) as disk, IdList(bound=1_000_000) as mem:
        for i in range(0, 300, 37):
            disk.extend(ids[i : i + 37])
            mem.extend(ids[i : i + 37])
        assert disk.spilled and not mem.spilled and len(disk) == len(mem) == 300
        want = sorted(ids)  # LMDB's key order: neighbours share B-tree leaves
        assert [k for b in mem.batches(64) for k in b] == want
        assert [k for b in disk.batches(64) for k in b] == want
        assert [k for b in disk.batches(1000) for k in b] == want, "read again, same order"
        assert all(len(b) == 64 for b in list(disk.batches(64))[:-1])


def _damaged(tmp_path: Path) -> mc.Store:
    """An LMDB store with two refs, each problem fsck knows in it, and unreachable objects."""
    store = mc.open(f"lmdb://{tmp_path / 'store'}")
    root, blobs = build(store, "a", leaves=40)
    other, more = build(store, "b", leaves=25)
    store.refs.set("main", root)
    store.refs.set("other", other)
    for i in range(30):
        store.refs.set(f"runs/slots/{i:04d}", more[i % len(more)])
    store.refs.set("gone", store.put_blob(b"soon gone"))
    for i in range(40):
        store.put_blob(f"unreachable {i}".encode())
    store.backend.delete_many([store.refs["gone"], blobs[0], more[3]])
    _tamper(store, blobs[1], b"tampered")
    _tamper(store, more[4], blob_object(b"another blob")[1])
    return store


def test_fsck_and_verify_find_the_same_problems_when_they_spill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _damaged(tmp_path)
    roots = [store.refs["main"], store.refs["other"]]
    try:
        fsck_mem = fsck(store, jobs=1)
        closure_mem = verify_closure(store, roots, jobs=1)
        walk_mem = walk_checked(store, roots, canonical=False, jobs=1)
        monkeypatch.setenv("MEDOMNI_SPILL_IDS", "4")
        monkeypatch.setattr(lmdb_backend, "_LIST_CHUNK", 7)  # listings in many chunks
        walk_disk = walk_checked(store, roots, canonical=False, jobs=1)
        assert not fsck_mem.ok
        assert {p.kind for p in fsck_mem.problems} >= {"missing", "corrupt", "dangling-ref"}
        assert fsck(store, jobs=1) == fsck_mem
        assert verify_closure(store, roots, jobs=1) == closure_mem
        assert list(walk_disk.bad.items()) == list(walk_mem.bad.items())
        assert walk_disk.parent == walk_mem.parent  # the first linker of each missing one
        assert (walk_disk.objects, walk_disk.nbytes) == (walk_mem.objects, walk_mem.nbytes)
    finally:
        store.close()


def test_a_clean_store_spilled_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = mc.open(f"lmdb://{tmp_path / 'store'}")
    try:
        root, _ = build(store, "clean", leaves=60)
        store.refs.set("main", root)
        want = fsck(store, jobs=1)
        monkeypatch.setenv("MEDOMNI_SPILL_IDS", "3")
        assert want.ok and fsck(store, jobs=1) == want
    finally:
        store.close()


def _gc_store(path: Path) -> tuple[mc.Store, set[bytes], set[bytes]]:
    """Reachable objects (refs and a ref's history) and old garbage: (store, kept, garbage)."""
    store = mc.open(f"lmdb://{path}")
    root, _ = build(store, "keep", leaves=50)
    store.refs.set("main", root)
    old, _ = build(store, "old value", leaves=10)
    store.refs.set("moved", old)
    store.refs.set("moved", root)  # the old value stays reachable through the history
    kept = set(map(bytes, store.iter_ids()))
    garbage = set(
        map(
            bytes,
            store.put_raw_many((None, blob_object(b"garbage %d" % i)[1]) for i in range(2500)),
        )
    )
    _backdate(store, 3600)
    return store, kept, garbage


def test_gc_keeps_the_same_objects_when_its_mark_spills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mem, kept, garbage = _gc_store(tmp_path / "mem")
    monkeypatch.setenv("MEDOMNI_SPILL_IDS", "5")
    monkeypatch.setattr(lmdb_backend, "_LIST_CHUNK", 64)
    disk, kept_disk, _ = _gc_store(tmp_path / "disk")
    try:
        assert kept_disk == kept
        spilled = gc(disk, grace=0)
        monkeypatch.delenv("MEDOMNI_SPILL_IDS")
        in_memory = gc(mem, grace=0)
        assert spilled.reachable == in_memory.reachable == len(kept)
        assert spilled.swept == in_memory.swept == len(garbage)
        assert set(map(bytes, disk.iter_ids())) == set(map(bytes, mem.iter_ids())) == kept
        assert fsck(disk, jobs=1).ok
    finally:
        mem.close()
        disk.close()


def test_gc_killed_mid_sweep_with_a_spilled_mark_loses_nothing_reachable(tmp_path: Path) -> None:
    store, kept, garbage = _gc_store(tmp_path / "store")
    store.close()
    code = textwrap.dedent(
        f"""
        import medomni_cas as mc
        from medomni_cas.store.gc import gc
        with mc.open("lmdb://{tmp_path / "store"}") as store:
            gc(store, grace=0)
        """
    )
    scratch = tmp_path / "tmp"  # where the killed gc leaves its spilled mark
    scratch.mkdir()
    env = {**os.environ, "MEDOMNI_SPILL_IDS": "5", CRASH_ENV: "gc-sweep:2", "TMPDIR": str(scratch)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == -9, "gc was not killed at its second delete batch"
    assert any(scratch.iterdir()), "the mark did not spill: the test proved less than it says"
    left = [p for p in scratch.rglob("*") if not p.is_dir()]
    assert left == [], "a killed gc left its spilled files in TMPDIR"
    with mc.open(f"lmdb://{tmp_path / 'store'}") as store:
        left = set(map(bytes, store.iter_ids()))
        assert kept <= left, "a killed gc deleted something reachable"
        assert garbage & left and not garbage <= left, "killed mid-sweep: some garbage left"
        assert fsck(store, jobs=1).ok
        again = gc(store, grace=0)  # a second run finishes the sweep
        assert set(map(bytes, store.iter_ids())) == kept
        assert again.swept == len(garbage & left)


def test_lmdb_listings_in_chunks_list_everything_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with mc.open(f"lmdb://{tmp_path / 'store'}") as store:
        ids = [store.put_blob(b"x%d" % i) for i in range(40)]
        for i in range(23):
            store.refs.set(f"r/{i:03d}", ids[i])
        backend = store.backend
        whole = (
            list(backend.iter_keys()),
            list(backend.iter_stamps()),
            list(backend.ref_iter("r/")),
            list(backend.ref_log_names()),
            list(backend.iter_keys("a")),
        )
        assert len(whole[0]) == 40 and len(whole[2]) == len(whole[3]) == 23
        for chunk in (1, 2, 7, 40):
            monkeypatch.setattr(lmdb_backend, "_LIST_CHUNK", chunk)
            assert (
                list(backend.iter_keys()),
                list(backend.iter_stamps()),
                list(backend.ref_iter("r/")),
                list(backend.ref_log_names()),
                list(backend.iter_keys("a")),
            ) == whole


def test_mapped_pages_given_back_read_the_same(tmp_path: Path) -> None:
    with mc.open(f"lmdb://{tmp_path / 'store'}") as store:
        ids = [store.put_blob(os.urandom(1500)) for _ in range(300)]
        before = dict(store.get_raw_many(ids))
        if not Path("/proc/self/maps").exists():
            pytest.skip("no /proc/self/maps here: nothing is given back")
        assert _mapped.drop(tmp_path / "store" / "data.mdb") > 0, "the data file is not mapped"
        assert dict(store.get_raw_many(ids)) == before
        assert _mapped.drop(tmp_path / "nothing-mapped") == 0


def test_a_stale_mapping_kept_between_drops_is_never_advised(tmp_path: Path) -> None:
    """Where a file was mapped is kept between drops: a range since given to other memory
    (here private memory of the test's own) must be looked up again, not zeroed."""
    import ctypes
    import mmap

    if not Path("/proc/self/maps").exists():
        pytest.skip("no /proc/self/maps here: nothing is given back")
    with mc.open(f"lmdb://{tmp_path / 'store'}") as store:
        ids = [store.put_blob(os.urandom(1500)) for _ in range(300)]
        before = dict(store.get_raw_many(ids))
        data = os.path.realpath(tmp_path / "store" / "data.mdb")
        assert _mapped.drop(data) > 0
        mine = mmap.mmap(-1, 4 * mmap.PAGESIZE)  # private, anonymous: only this holds it
        mine.write(b"kept" * mmap.PAGESIZE)
        start = ctypes.addressof(ctypes.c_char.from_buffer(mine))
        _mapped._ranges[data] = [(start, start + len(mine))]
        assert _mapped.drop(data) > 0, "the file's own mapping is found again"
        assert mine[:8] == b"keptkept" and mine[-4:] == b"kept", "private memory was zeroed"
        assert _mapped._ranges[data] != [(start, start + len(mine))]
        assert dict(store.get_raw_many(ids)) == before
        mine.close()


def test_a_spilled_set_answers_by_lookup_and_by_scan_alike() -> None:
    """Past the bound, a set asked many times over (new ids and ids met before, a few ids
    spread over the key space, a sorted chunk of a listing) answers as the set in memory."""
    ids = _ids(3000)
    others = _ids(3000, "other")
    with MarkSet(bound=1 << 30) as mem, MarkSet(bound=100) as disk:
        for i in range(0, 3000, 250):
            part = ids[i : i + 250] + ids[:i:7]  # new ids and ids met before
            assert disk.unseen(part) == mem.unseen(part)
        assert disk.spilled and len(disk) == len(mem) == 3000
        spread = [ids[5], others[0], ids[2999], others[1]]
        assert disk.absent(spread) == mem.absent(spread) == [others[0], others[1]]
        listing = sorted(ids[:1500] + others[:1500])
        chunk = listing[700:1100]  # a narrow key range, as fsck and gc ask it
        assert disk.absent(chunk) == mem.absent(chunk)
        assert set(disk.absent(chunk)) == set(chunk) & set(others)
        assert all(k in disk for k in ids[::97]) and not any(k in disk for k in others[:50])


def test_a_level_settled_at_once_is_what_each_batch_would_have_found() -> None:
    """A spilled set given a level's links in one go (`defer`, then `settle`) puts in the
    next level the ids, and in the order, that asking batch by batch would have: each new
    id once, stably sorted by first byte; and it is the same set afterwards. Its runs are
    files read, never mapped (their pages are not the process's RSS)."""
    ids = _ids(4000)
    batches = [ids[i : i + 300] + ids[:i:11] + ids[i : i + 40] for i in range(0, 4000, 300)]
    with MarkSet(bound=1 << 30) as mem, MarkSet(bound=64) as disk, IdList() as want:
        for part in (ids[:500], ids[3000:3100]):  # met before the level
            mem.unseen(part)
            disk.unseen(part)
        assert disk.spilled and len(disk._runs) >= 2
        for part in batches:
            want.extend(mem.unseen(part))
        with IdList(bound=50) as pending, IdList(bound=70) as got:
            for part in batches:
                disk.defer(part, pending)
            disk.settle(pending, got)
            assert pending.spilled and got.spilled
            assert [k for b in got.batches(97) for k in b] == [
                k for b in want.batches(97) for k in b
            ]
        assert len(disk) == len(mem) == 4000
        probe = ids[::13] + _ids(30, "other")
        assert disk.absent(probe) == mem.absent(probe) == _ids(30, "other")
        assert disk._dir is not None
        maps = Path("/proc/self/maps")
        if maps.exists():
            assert str(disk._dir) not in maps.read_text()


def test_a_run_cut_short_on_disk_is_an_error_not_fewer_ids(tmp_path: Path) -> None:
    """A spill file that lost its tail (a full disk, another process) is never read as a
    shorter run: an id cut in two would otherwise be a wrong answer, not a missing one."""
    ids = sorted(_ids(600))
    with MarkSet(bound=100) as marks:
        marks.add(ids)
        assert marks.spilled
        run = marks._runs[0]
        byte = next(b for b in range(256) if run.starts[b + 1] > run.starts[b])
        os.ftruncate(run._fd, run.starts[byte] * run.width + 10)
        with pytest.raises(OSError, match="not whole 32-byte records"):
            run.ids(byte)
        with pytest.raises(OSError, match="not whole"):
            marks.absent([k for k in ids if k[0] == byte] * 40)


def test_a_run_finds_and_merges_ids_that_end_in_zero_bytes(tmp_path: Path) -> None:
    """A run's byte is searched by numpy as S32, which would drop an id's trailing zero
    bytes if it gave ids back: ids that differ only there are found, told apart and merged
    as themselves, with the newer run's record kept for an id in both, many asked or few."""
    ids = sorted(
        {bytes([5] * 30 + [0, 0]), bytes([5] * 30 + [0, 1]), bytes([5] * 31 + [0]), bytes(32)}
        | {bytes([5] * 29 + [i, 0, 0]) for i in range(40)}
    )
    older = Run.write(tmp_path, [k + b"old-" + bytes([i]) * 12 for i, k in enumerate(ids[::2])], 48)
    newer = Run.write(tmp_path, [k + b"new-" + bytes([i]) * 12 for i, k in enumerate(ids[:20])], 48)
    asked = [bytes([5] * 31 + [0]), bytes([5] * 30 + [0, 0]), bytes([5] * 30 + [0, 2])]
    fives = [k for k in ids if k[0] == 5]
    for run in (older, newer):
        every = run.found(5, fives)
        assert run.found(5, asked) == {k: v for k, v in every.items() if k in asked}
    # a byte far larger than what is asked: a binary search of reads per key
    many = sorted({*ids, *(bytes([5] * 28) + i.to_bytes(4, "big") for i in range(3000))})
    large = Run.write(tmp_path, [k + bytes(16) for k in many], 48)
    try:
        assert set(large.found(5, asked[:1])) == {asked[0]}
        assert large.present(5, asked[2:]) == set()
        assert large.present(5, [bytes([5] * 30 + [0, 0])]) == {bytes([5] * 30 + [0, 0])}
    finally:
        large.close()
    assert set(newer.found(5, asked)) == {k for k in asked if k in ids[:20]}
    merged = Run.merged(tmp_path, older, newer)
    try:
        got = merged.found(5, fives)
        assert set(got) == (set(ids[::2]) | set(ids[:20])) - {bytes(32)}
        assert all(got[k].startswith(b"new-") == (k in ids[:20]) for k in got)
        assert merged.found(0, [bytes(32)]) == {bytes(32): b"new-" + bytes(12)}  # in both
        assert merged.present(5, asked) == {k for k in asked if k in ids}
        assert merged.n == len(set(ids[::2]) | set(ids[:20]))
    finally:
        merged.close()
