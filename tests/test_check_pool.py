"""Helper processes for closure checks: the same findings as one process, and a helper that
fails, dies or talks nonsense never changes them (its batches are checked here)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import medomni_cas as mc
from medomni_cas.audit.verify import verify_result
from medomni_cas.bench.records import Result
from medomni_cas.cli.main import main
from medomni_cas.store import encoding
from medomni_cas.store._fast import check as _check
from medomni_cas.store._fast import pool as _pool
from medomni_cas.store._fast.check import BatchChecker, Findings
from medomni_cas.store._fast.pool import CheckPool
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.verify import fsck, verify_closure
from tests.test_verify import _flip, _tamper, build


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[CheckPool]]:
    """Small levels and batches, so that a test's closure is shared; and a checker in this
    process that waits (up to 20 s) for the helpers to be ready before its first batch and
    then takes its time, so that helpers always get part of the work. Yields the `CheckPool`
    made by the checks under test."""
    monkeypatch.setattr(_pool, "MIN_LEVEL", 64)
    monkeypatch.setattr(_pool, "BATCH", 16)
    made: list[CheckPool] = []
    init, call = CheckPool.__init__, BatchChecker.__call__

    def recording(self: CheckPool, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    def slow(self: BatchChecker, keys: list[bytes], got: list, *, owners: bool = False) -> Findings:
        for pool in made:
            for h in pool._helpers:
                if not h.ready:
                    h.readable(timeout=20.0)
        time.sleep(0.002)
        return call(self, keys, got, owners=owners)

    monkeypatch.setattr(CheckPool, "__init__", recording)
    monkeypatch.setattr(_check.BatchChecker, "__call__", slow)
    yield made


def _lmdb(tmp_path: Path) -> mc.Store:
    return mc.Store(LMDBBackend(tmp_path / "lmdb", durable=False))


def _damaged(store: mc.Store) -> tuple[ObjectId, set[tuple[str, str]]]:
    """A result over 6 trees of 120 leaves each (about 900 objects), with a corrupt leaf, a
    malformed record (its bytes hash right, but do not decode), a missing subtree and a
    missing leaf; returns it and the (kind, id) of each problem."""
    roots, leaves = [], []
    for i in range(6):
        root, blobs = build(store, f"t{i}", leaves=120)
        roots.append(root)
        leaves += blobs
    junk = b"\x93\xa9test-junk\x01" + encoding.LINK_MARK + b"short"  # a cut-off link
    junk_id = hash_bytes(junk)
    store.backend.put(junk_id, junk)
    holder = store.put_object("test-helpers-holder", 1, {"see": [junk_id]})
    absent = hash_bytes(b"never stored")
    # a record whose child never came: written under the store, as a damaged store holds it
    # (`Store.put` refuses to link what is not stored)
    lost_bytes = encoding.encode_object("test-helpers-lost", 1, {"see": [absent]})
    lost = hash_bytes(lost_bytes)
    store.backend.put(lost, lost_bytes)
    result = store.put(
        Result(
            task_set=roots[0],
            set_build=roots[1],
            jobs=(*roots[2:], holder, lost),
            answer_keys=(),
            scorer="test",
            scorer_version="0",
            n_boot=0,
            seed=0,
            rows=(),
            table=store.put_blob(b"table"),
        )
    )
    _tamper(store, leaves[7], _flip(store.backend.get(leaves[7]), 3))
    gone = leaves[400]
    with store.backend.env.begin(write=True) as txn:  # type: ignore[attr-defined]
        txn.delete(gone, db=store.backend._objects)  # type: ignore[attr-defined]
    want = {("corrupt", leaves[7].hex()), ("malformed", junk_id.hex())}
    want |= {("missing", gone.hex()), ("missing", absent.hex())}
    return result, want


def test_verify_result_finds_the_same_with_helpers(tmp_path: Path, made: list[CheckPool]) -> None:
    store = _lmdb(tmp_path)
    result, want = _damaged(store)
    alone = verify_result(store, result, jobs=1)
    shared = verify_result(store, result, jobs=2)
    assert alone.processes == 1 and shared.processes == 2
    assert {(p.kind, p.id) for p in alone.problems} == want
    assert alone.problems == shared.problems  # named by the same (serial) naming walk
    assert (alone.objects, alone.bytes) == (shared.objects, shared.bytes)
    canonical = verify_result(store, result, jobs=2, canonical=True)
    assert canonical.processes == 2
    assert {(p.kind, p.id) for p in canonical.problems} == want


def test_fsck_and_verify_closure_find_the_same_with_helpers(
    tmp_path: Path, made: list[CheckPool]
) -> None:
    store = _lmdb(tmp_path)
    result, want = _damaged(store)
    store.refs.set("results/x", result)
    for i in range(300):  # unreachable objects: the listing is shared too
        store.put_blob(f"stray {i}".encode())
    for check in (lambda j: fsck(store, jobs=j), lambda j: verify_closure(store, [result], jobs=j)):
        alone, shared = check(1), check(2)
        assert made[-1].helped == 1
        assert {(p.kind, p.id) for p in alone.problems} >= want
        assert sorted(alone.problems, key=repr) == sorted(shared.problems, key=repr)
        assert alone.objects == shared.objects


def test_a_sound_store_is_checked_in_one_pass_shared_with_helpers(
    tmp_path: Path, made: list[CheckPool]
) -> None:
    """fsck's pass over a sound store (batches read with their keys, `CheckPool.listed`):
    helpers take some of them, read again in their own process, and find the same."""
    store = _lmdb(tmp_path)
    for i in range(6):
        root, _ = build(store, f"s{i}", leaves=120)
        store.refs.set(f"runs/{i}", root)
    for i in range(300):
        store.put_blob(f"stray {i}".encode())
    alone = fsck(store, jobs=1)
    shared = fsck(store, jobs=2)
    assert made[-1].helped == 1
    assert alone.ok and alone == shared
    assert alone.objects == len(list(store.backend.iter_keys()))


def _sound_keys(tmp_path: Path) -> tuple[mc.Store, list[bytes], int]:
    """A clean store; every id in it, and how many links its objects hold in all."""
    store = _lmdb(tmp_path)
    for i in range(4):
        build(store, f"k{i}", leaves=200)
    keys = sorted(store.backend.iter_keys())
    found = BatchChecker(False)(keys, store.backend.get_list(keys))
    return store, keys, len(found.links)


def _drain(pool: CheckPool, keys: list[bytes]) -> tuple[int, set[bytes]]:
    objects, links = 0, set()
    for f in pool.check(keys):
        objects += f.objects
        links.update(f.links)
    return objects, links


@pytest.mark.parametrize("listed", [False, True], ids=["ids", "listed"])
def test_a_helper_that_dies_leaves_no_batch_unchecked(
    tmp_path: Path, made: list[CheckPool], listed: bool
) -> None:
    """Batches of ids, or batches read already by a pass over the store (fsck's)."""
    store, keys, _ = _sound_keys(tmp_path)
    _, every_link = _drain(CheckPool(store.backend, False, 1), keys)
    with CheckPool(store.backend, False, 2) as pool:
        objects, links = 0, set()
        batches = pool.check(pool.listed(), count=len(keys)) if listed else pool.check(keys)
        for f in batches:
            objects += f.objects
            links.update(f.links)
            if pool.helped and pool._helpers:
                pool._helpers[0].proc.kill()  # with batches in hand
        assert pool.helped == 1 and pool._helpers == []  # dropped
    assert objects == len(keys)  # each batch once: none lost, none counted twice
    assert links == every_link


def test_a_helper_that_cannot_open_the_store_is_dropped(
    tmp_path: Path, made: list[CheckPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys, _ = _sound_keys(tmp_path)
    monkeypatch.setattr(LMDBBackend, "reader_url", lambda self: f"lmdb://{tmp_path}/none")
    with CheckPool(store.backend, False, 2) as pool:
        assert _drain(pool, keys)[0] == len(keys)
        assert pool.helped == 0 and pool._helpers == []
    assert not (tmp_path / "none").exists()  # a helper only reads: it made no store


@pytest.mark.parametrize(
    ("program", "why"),
    [
        ("import sys; sys.stdout.write('nonsense' * 1000)", "frame of"),  # gigabytes long
        (  # a frame, but not a Ready
            "import sys; sys.stdout.buffer.write(b'\\x05\\x00\\x00\\x00hello')",
            "Expected `array`",
        ),
        ("import sys; sys.stderr.write('it broke'); sys.exit(3)", "it broke"),
    ],
)
def test_a_helper_that_talks_nonsense_is_dropped(
    tmp_path: Path,
    made: list[CheckPool],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    program: str,
    why: str,
) -> None:
    store, keys, _ = _sound_keys(tmp_path)
    monkeypatch.setattr(_pool, "_COMMAND", ("-c", program))
    with CheckPool(store.backend, False, 2) as pool:
        assert _drain(pool, keys)[0] == len(keys)
        assert pool.helped == 0 and pool._helpers == []
    (record,) = [r for r in caplog.records if r.name == _pool.__name__]
    assert "dropped" in record.getMessage() and why in record.getMessage()


def test_no_helper_where_it_cannot_pay(tmp_path: Path) -> None:
    memory = mc.open("memory://")
    for i in range(3):
        build(memory, f"m{i}", leaves=100)
    keys = list(memory.backend.iter_keys())
    with CheckPool(memory.backend, False, 4) as pool:  # no reader_url: one process
        assert _drain(pool, keys)[0] == len(keys)
        assert pool._helpers == []
    store, keys, _ = _sound_keys(tmp_path)
    with CheckPool(store.backend, False, 1) as pool:
        assert _drain(pool, keys)[0] == len(keys)
        assert pool._helpers == []
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        CheckPool(store.backend, False, 0)
    assert 1 <= _pool.default_jobs() <= 4


def test_jobs_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"lmdb://{tmp_path}/cli"
    store = mc.open(url)
    store.refs.set("main", build(store, "cli")[0])
    store.close()
    assert main(["cas", "fsck", "--store", url, "--jobs", "2"]) == 0
    assert "ok:" in capsys.readouterr().out
    for bad in ("0", "-1", "two"):
        assert main(["cas", "fsck", "--store", url, "--jobs", bad]) == 2
        assert "argument -j/--jobs: must be a whole number of at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["lmdb", "memory"])
def test_a_level_of_large_objects_is_read_a_few_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A level of 60 objects of 300 KiB (18 MiB) with a bound of 1 MiB held: no part of a
    batch holds more than about twice the bound (before, the batch of 60 was read whole),
    and what is found is what a check holding everything finds (a corrupt one among them
    too); LMDB knows a large object before reading it, other backends guess from the reads
    before. Seen at 1.6M objects: a job's 111 column blobs of 1 MB read as one batch,
    106 MiB at once."""
    store = _lmdb(tmp_path) if where == "lmdb" else mc.open("memory://")
    try:
        big = [store.put_blob(bytes([i]) * (300 << 10)) for i in range(60)]
        root = store.put_tree({f"b{i}": b for i, b in enumerate(big)})
        store.refs.set("main", root)
        _tamper(store, big[7], b"\x00" * (300 << 10))
        want = fsck(store, jobs=1)
        parts: list[int] = []
        cls = type(store.backend)
        get_parts = cls.get_parts

        def counted(self: Any, keys: Any, held_bytes: int) -> Iterator[Any]:
            for part, got in get_parts(self, keys, held_bytes):
                parts.append(sum(len(v) for v in got if v))
                yield part, got

        passed: list[int] = []  # the parts of fsck's pass over the store
        iter_parts = cls.iter_parts

        def counted_pass(self: Any, held_bytes: int, size: int = 4096) -> Iterator[Any]:
            for part, got in iter_parts(self, held_bytes, size):
                passed.append(sum(len(v) for v in got if v))
                yield part, got

        monkeypatch.setattr(_pool, "HELD_BYTES", 1 << 20)
        monkeypatch.setattr(cls, "get_parts", counted)
        monkeypatch.setattr(cls, "iter_parts", counted_pass)
        assert fsck(store, jobs=1) == want
        assert [p.kind for p in want.problems] == ["corrupt"]
        assert max(parts) <= 2 << 20, parts
        assert max(passed) <= 2 << 20, passed
        assert sum(passed) >= 60 * (300 << 10)  # the pass read them all
        assert sum(parts) >= 2 * 60 * (300 << 10)  # then the walks of all refs, of each
    finally:
        store.close()


def test_findings_of_parts_merged_are_those_of_the_batch(tmp_path: Path) -> None:
    """What a helper sends for a batch checked in parts is what checking it whole gives."""
    store = _lmdb(tmp_path)
    try:
        root, blobs = build(store, "parts", leaves=40)
        _tamper(store, blobs[3], b"not it")
        keys = [bytes(root), *map(bytes, blobs), bytes(hash_bytes(b"absent"))]
        checker = BatchChecker(canonical=True)
        for owners in (False, True):
            whole = checker(keys, store.backend.get_list(keys), owners=owners)
            parts = [
                checker(keys[i : i + 7], store.backend.get_list(keys[i : i + 7]), owners=owners)
                for i in range(0, len(keys), 7)
            ]
            assert _pool.merged(parts) == whole
    finally:
        store.close()
