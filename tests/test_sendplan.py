"""A push or pull plans before it writes: children in earlier batches than their parents,
with the plan in memory or spilled to disk (a tiny ``MEDOMNI_SPILL_IDS``), the same objects
written either way."""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Any

import pytest

import medomni_cas as mc
from medomni_cas.store import _sendplan, encoding, sync
from medomni_cas.store._sendplan import SendPlan
from medomni_cas.store._spill import IdList
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.ids import ObjectId, hash_bytes


def _ids(n: int, salt: str = "") -> list[bytes]:
    return [bytes(hash_bytes(f"{salt}{i}".encode())) for i in range(n)]


def _settled(plan: SendPlan) -> tuple[list[bytes], list[bytes]]:
    with IdList() as new, IdList() as deeper:
        plan.settle(new, deeper)
        return _all(new), _all(deeper)


def _all(ids: IdList) -> list[bytes]:
    return [k for batch in ids.batches(1000) for k in batch]


def _selected(plan: SendPlan, ids: list[bytes], depth: int) -> list[tuple[bytes, bytes]]:
    with IdList(ids) as level:
        return [item for part in plan.select(level, depth) for item in part]


def test_plan_spills_and_answers_the_same() -> None:
    ids = _ids(60)
    with SendPlan(bound=8, held_bytes=1 << 30) as mem, SendPlan(bound=8, held_bytes=50) as disk:
        mem.bound = 1 << 30  # the records' bound, not the pending levels': they spill too
        for plan in (mem, disk):
            plan.meet(ids[:10], 0, deepen=False)
            plan.meet(ids[3:8], 0, deepen=True)  # met twice in a level: once
            assert sorted(_settled(plan)[0]) == sorted(ids[:10])
            plan.hold([(k, b"bytes of %d" % i) for i, k in enumerate(ids[:6])], 0)
            plan.meet(ids[5:30], 1, deepen=True)
            plan.meet(ids[:3], 1, deepen=False)  # not moved: met without deepen
            new, moved = _settled(plan)
            assert sorted(new) == sorted(ids[10:30]) and sorted(moved) == sorted(ids[5:10])
            plan.hold([(k, b"") for k in ids[20:25]], 1)  # an empty object is an object
            plan.meet(ids[5:30], 1, deepen=True)  # met again at the same depth: nothing
            assert _settled(plan) == ([], [])
            with pytest.raises(ValueError, match="depth 3"):
                plan.meet(ids[:1], 2, deepen=False)
                plan.meet(ids[:1], 3, deepen=False)
            _settled(plan)
        assert disk.spilled and not mem.spilled
        assert disk._runs and disk._spool is not None
        probe = ids[:30]
        for depth in (0, 1, 2):
            assert _selected(disk, probe, depth) == _selected(mem, probe, depth)
        walk = operator.itemgetter(0)  # a level's walk order: stably by first byte
        at0 = [(k, b"bytes of %d" % i) for i, k in enumerate(ids[:5])]
        at1 = [(ids[5], b"bytes of 5")] + [(k, b"") for k in ids[20:25]]
        assert _selected(mem, probe, 0) == sorted(at0, key=lambda kv: walk(kv[0]))
        assert _selected(mem, probe, 1) == sorted(at1, key=lambda kv: walk(kv[0]))
        assert _selected(mem, probe, 2) == []
        with pytest.raises(KeyError, match="not met"):
            _selected(disk, _ids(1, "never met"), 0)
        where = disk._dir
        assert where is not None and where.exists()
    assert not where.exists(), "the spilled plan is removed when closed"


def _dag(store: mc.Store) -> ObjectId:
    """A DAG where a shared object is met higher up than some of its parents: the root
    links ``shared`` and ``a``; ``a`` links ``b``, which links ``shared`` too; and trees of
    many blobs, some shared between levels."""
    leaves = store.put_raw_many((None, blob_object(b"leaf %d" % i)[1]) for i in range(300))
    shared = store.put_tree({f"l{i}": leaves[i] for i in range(0, 50)})
    b = store.put_tree({"shared": shared, "leaf": leaves[260]})
    a = store.put_tree({"b": b, **{f"l{i}": leaves[i] for i in range(40, 300, 3)}})
    groups = store.put_tree(
        {f"g{i}": store.put_tree({f"l{j}": leaves[j] for j in range(i, 200, 7)}) for i in range(7)}
    )
    return store.put_tree({"shared": shared, "a": a, "groups": groups, "leaf": leaves[299]})


def _recorded(store: mc.Store, monkeypatch: pytest.MonkeyPatch) -> list[list[bytes]]:
    batches: list[list[bytes]] = []
    put_many = store.backend.put_many

    def recording(items: Any) -> int:
        items = list(items)
        batches.append([bytes(k) for k, _ in items])
        return put_many(items)

    monkeypatch.setattr(store.backend, "put_many", recording)
    return batches


def _children_first(src: mc.Store, batches: list[list[bytes]], had: set[bytes]) -> None:
    written = set(had)
    for batch in batches:
        for key in batch:
            links = {bytes(link) for link in encoding.links(src.get_raw(ObjectId(key)))}
            assert links <= written, f"{key.hex()} written before its children"
        written.update(batch)


@pytest.mark.parametrize("bound", ["", "4"])
def test_push_writes_children_first_in_memory_and_spilled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    if bound:
        monkeypatch.setenv("MEDOMNI_SPILL_IDS", bound)
    monkeypatch.setattr(sync, "WRITE_ITEMS", 16)  # many batches in a level
    local = mc.open(f"lmdb://{tmp_path}/local")
    root = _dag(local)
    local.refs.set("main", root)
    # the remote has a part already, linked from what it lacks (a walk goes through it)
    remote = mc.open(f"lmdb://{tmp_path}/remote")
    part = local.get(root)["groups"]
    remote.put_raw_many((oid, local.get_raw(oid)) for oid in local.closure(part))
    batches = _recorded(remote, monkeypatch)
    report = sync.push(local, remote)
    closure = set(map(bytes, local.closure(root)))
    had = set(map(bytes, local.closure(part)))
    assert report.objects == len(closure - had)
    assert sorted(k for b in batches for k in b) == sorted(closure - had)  # each once
    assert max(map(len, batches)) <= 16
    _children_first(local, batches, had)
    assert remote.refs["main"] == root
    assert remote.missing(list(local.closure(root))) == []


def test_a_level_of_large_objects_after_small_ones_is_read_a_few_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A level of 40 blobs of 300 KiB after a level of 400 small objects: the push reads
    the large ones at most 16 at a time (before, the read size learnt on the small level
    read all 40 at once; seen at 1.44M objects: 111 column blobs of 1 MB in one read, held
    twice over, 212 MiB)."""
    local = mc.open(f"lmdb://{tmp_path}/local")
    big = [local.put_blob(bytes([i]) * (300 << 10)) for i in range(40)]
    below = local.put_tree({f"b{i}": b for i, b in enumerate(big)})
    small = [local.put_blob(b"small %d" % i) for i in range(400)]
    root = local.put_tree({**{f"s{i}": b for i, b in enumerate(small)}, "big": below})
    local.refs.set("main", root)
    remote = mc.open(f"lmdb://{tmp_path}/remote")
    reads: list[int] = []
    get_list = type(local.backend).get_list

    def counted(self: Any, keys: Any) -> list[bytes | None]:
        got = get_list(self, keys)
        if self is local.backend:
            reads.append(sum(len(d) for d in got if d))
        return got

    monkeypatch.setattr(sync, "READ_BYTES", 1 << 20)
    monkeypatch.setattr(type(local.backend), "get_list", counted)
    report = sync.push(local, remote)
    pushed = list(reads)
    assert report.objects == len(set(map(bytes, local.closure(root))))
    assert remote.get_raw(big[7]) == local.get_raw(big[7])
    assert sum(pushed) >= 40 * (300 << 10)
    assert max(pushed) <= 16 * ((300 << 10) + 64), pushed


def _mapped_under(folder: Path) -> list[str]:
    maps = Path("/proc/self/maps")
    return [line for line in maps.read_text().splitlines() if str(folder) in line]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux: /proc/self/maps")
def test_a_spilled_plan_maps_none_of_its_files() -> None:
    """A spilled plan reads its files with ``pread``: nothing of them is in the process's
    map (seen at 1.44M objects: its temporary LMDB was 157 of push's 327 MiB of RSS, each
    write transaction's pages copied and mapped until it committed)."""
    ids = _ids(400)
    with SendPlan(bound=16, held_bytes=100) as plan:
        plan.meet(ids[:100], 0, deepen=False)
        _settled(plan)
        plan.hold([(k, b"x" * 30) for k in ids[:100]], 0)
        plan.meet(ids[50:400], 1, deepen=True)
        _settled(plan)
        # those linked again one level down moved there
        assert dict(_selected(plan, ids[:100], 0)) == dict.fromkeys(ids[:50], b"x" * 30)
        assert dict(_selected(plan, ids[:100], 1)) == dict.fromkeys(ids[50:100], b"x" * 30)
        assert plan.spilled and plan._dir is not None
        assert _mapped_under(plan._dir) == []


def test_select_reads_a_level_of_large_objects_a_part_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Objects of one first byte whose bytes together pass the part's bound are read and
    given a part at a time, not the byte's all at once."""
    monkeypatch.setattr(_sendplan, "_PART_BYTES", 1000)
    ids = [k for k in _ids(3000) if k[0] == 7][:8]  # all of one first byte
    assert len(ids) == 8
    reads: list[int] = []
    read = SendPlan._bytes

    def counted(self: SendPlan, picked: Any) -> list[bytes]:
        got = read(self, picked)
        reads.append(sum(map(len, got)))
        return got

    monkeypatch.setattr(SendPlan, "_bytes", counted)
    with SendPlan(bound=4, held_bytes=100) as plan:
        plan.meet(ids, 0, deepen=False)
        _settled(plan)
        plan.hold([(k, bytes([i]) * 400) for i, k in enumerate(ids)], 0)
        assert plan.spilled
        parts = [part for part in plan.select(IdList(ids), 0) if part]
    assert [k for part in parts for k, _ in part] == sorted(ids)
    assert all(data == bytes([ids.index(k)]) * 400 for part in parts for k, data in part)
    assert max(reads) <= 1000 + 400 and len(parts) == 3, (reads, list(map(len, parts)))


def test_a_spool_cut_short_on_disk_is_an_error_not_short_objects() -> None:
    """A spool that lost its tail gives no object cut short (which a destination might
    otherwise store under its id): selecting it is an error."""
    ids = _ids(40)
    with SendPlan(bound=8, held_bytes=50) as plan:
        plan.meet(ids, 0, deepen=False)
        _settled(plan)
        plan.hold([(k, b"%d" % i * 20) for i, k in enumerate(ids)], 0)
        assert plan._spool is not None and plan._dir is not None
        os.ftruncate(plan._spool.fileno(), plan._end - 5)
        with pytest.raises(OSError, match="spool gave"):
            _selected(plan, ids, 0)


def _spool_reads(monkeypatch: pytest.MonkeyPatch, plan: SendPlan) -> list[int]:
    """The sizes of the preads of ``plan``'s spool from now on, among all."""
    assert plan._spool is not None
    spool = plan._spool.fileno()
    preads: list[int] = []
    pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        if fd == spool:
            preads.append(n)
        return pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counted)
    return preads


@pytest.mark.parametrize(("gap", "reads"), [(4096, 1), (10, 50)])
def test_objects_a_small_gap_apart_in_the_spool_are_read_with_one_pread(
    monkeypatch: pytest.MonkeyPatch, gap: int, reads: int
) -> None:
    """A level whose neighbours in the spool moved deeper is read a span at a time, the
    gaps read and dropped, not a pread per object (at 1.44M objects a quarter of a level's
    gaps were under a page, and each pread read 3.9 objects); a gap past `_GAP` is not."""
    monkeypatch.setattr(_sendplan, "_GAP", gap)
    ids = sorted(k for k in _ids(40_000) if k[0] == 7)[:100]  # `select` reads a byte at a time
    assert len(ids) == 100
    datas = {k: b"%030d" % i for i, k in enumerate(ids)}
    with SendPlan(bound=8, held_bytes=50) as plan:
        plan.meet(ids, 0, deepen=False)
        _settled(plan)
        plan.hold(list(datas.items()), 0)
        plan.meet(ids[::2], 1, deepen=True)  # every other one moves a level down
        _settled(plan)
        preads = _spool_reads(monkeypatch, plan)
        kept = ids[1::2]
        assert dict(_selected(plan, ids, 0)) == {k: datas[k] for k in kept}
        assert len(preads) == reads, preads
        preads.clear()
        assert dict(_selected(plan, ids, 1)) == {k: datas[k] for k in ids[::2]}
        assert len(preads) == reads, preads


def _spooled_plan(datas: dict[bytes, bytes]) -> SendPlan:
    plan = SendPlan(bound=8, held_bytes=50)
    plan.meet(list(datas), 0, deepen=False)
    _settled(plan)
    plan.hold(list(datas.items()), 0)
    assert plan._spool is not None
    return plan


def test_a_span_of_neighbours_is_cut_at_the_read_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neighbours in the spool are read at most `_READ_SPAN` bytes a pread (one object past
    it alone), and each is given whole."""
    monkeypatch.setattr(_sendplan, "_READ_SPAN", 100)
    ids = sorted(k for k in _ids(40_000) if k[0] == 7)[:20]
    datas = {k: bytes([i]) * (30 if i != 5 else 250) for i, k in enumerate(ids)}
    with _spooled_plan(datas) as plan:
        preads = _spool_reads(monkeypatch, plan)
        assert dict(_selected(plan, ids, 0)) == datas
    # 0-2 and 3-4 (90 and 60 bytes), 5 alone (250), then three at a time (90)
    assert preads == [90, 60, 250, 90, 90, 90, 90, 60], preads


def test_a_spool_write_cut_short_writes_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gathered write that a signal cuts short is finished, not left with a hole that
    would be read back as an object's bytes."""
    pwritev = os.pwritev
    cut: list[int] = []

    def short(fd: int, buffers: list[bytes], offset: int) -> int:
        if not cut:  # the first call writes half of its first buffer only
            cut.append(len(buffers[0]) // 2)
            return os.pwrite(fd, buffers[0][: cut[0]], offset)
        return pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", short)
    monkeypatch.setattr(_sendplan, "_IOV", 7)  # several calls for the objects
    ids = _ids(40)
    datas = {k: b"%d" % i * 20 for i, k in enumerate(ids)}
    with _spooled_plan(datas) as plan:
        assert cut and dict(_selected(plan, ids, 0)) == datas
