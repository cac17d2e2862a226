"""Several processes on one LMDB store, writers killed mid-batch, and ids across processes.

The child processes run `tests._workers`; see its docstring for what each one does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from tests import _workers
from tests._workers import BLOBS, CHAIN, HEAD, SHARED_REF, Item, Snapshot

ROOT = Path(__file__).resolve().parent.parent
WRITERS = 4
RECORDS = 3000
BATCH = 100
APPENDS = 1  # shared-ref appends per batch and writer


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests._workers", *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _expect_ready(proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Wait for the worker's ``ready`` line (it has opened the store); kill it if it hangs."""
    assert proc.stdout is not None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        line = proc.stdout.readline()
    finally:
        timer.cancel()
    if line != "ready\n":
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"worker not ready (got {line!r}, exit {proc.returncode}):\n{err}")


def _fsck():
    """`medomni_cas.store.verify.fsck` if it exists yet (it is being written), else None."""
    if importlib.util.find_spec("medomni_cas.store.verify") is None:
        return None
    from medomni_cas.store import verify

    return getattr(verify, "fsck", None)


def check_store(store: Store) -> set[ObjectId]:
    """Every object re-hashes to its id and every ref's closure is complete; returns the ids.

    Also runs `fsck` when it exists.
    """
    ids = list(store.iter_ids())
    assert len(set(ids)) == len(ids)
    verified = 0
    for _oid, data in store.get_raw_many(ids):  # raises IntegrityError / NotFound
        assert data is not None
        verified += 1
    assert verified == len(ids)
    reachable: set[ObjectId] = set()
    for name, target in store.refs.items():
        closure = store.closure(target)  # raises NotFound on a hole
        assert target in closure, name
        reachable |= closure
    assert reachable <= set(ids)
    fsck = _fsck()
    if fsck is not None:
        report = fsck(store)
        assert report.ok, report.problems
        assert report.objects == len(ids)
    return set(ids)


# -- 1. several writers at once ------------------------------------------------------------------
def _run_writers(tmp_path: Path, map_size: int | None) -> tuple[Path, list[dict]]:
    path = tmp_path / "s"
    go = tmp_path / "go"
    extra = [] if map_size is None else ["--map-size", str(map_size)]

    def args(who: str) -> list[str]:
        return [
            "writer", "--path", str(path), "--who", who, "--go", str(go),
            "--records", str(RECORDS), "--batch", str(BATCH), "--appends", str(APPENDS),
            *extra,
        ]  # fmt: skip

    procs = [_worker(*args(f"w{i}")) for i in range(WRITERS)]
    try:
        for p in procs:  # every writer has its store open before any writes
            _expect_ready(p)
        go.touch()
        reports = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"writer failed (exit {p.returncode}):\n{err}"
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return path, reports


def _check_writers(store: Store, reports: list[dict]) -> None:
    n_batches = RECORDS // BATCH
    everything = check_store(store)

    # every object each writer reported is there and verifies
    for r in reports:
        assert len(r["items"]) == RECORDS
        assert len(r["appends"]) == n_batches * APPENDS
        for hexid in r["items"] + r["appends"]:
            store.get_raw(hexid)
        for hexid, sha in r["blobs"].items():
            assert hashlib.sha256(store.read_blob(hexid)).hexdigest() == sha
        assert len(r["blobs"]) == 6

    # each writer's own chain: the ref is at its last item and reaches exactly its items
    reachable: set[ObjectId] = set()
    for r in reports:
        tip = store.refs[f"procs/{r['who']}"]
        assert tip.hex() == r["items"][-1]
        chain = store.closure(tip)
        assert {o.hex() for o in chain} == set(r["items"])
        assert len(store.refs.history(f"procs/{r['who']}")) == n_batches
        tree = store.get(store.refs[f"trees/{r['who']}"], mc.Tree)
        assert sorted(tree) == ["chunked", "empty", "large", "one", "shared", "small"]
        assert {v.hex() for v in tree.values()} == set(r["blobs"])
        reachable |= chain | store.closure(store.refs[f"trees/{r['who']}"])

    # the shared ref: no lost update, in its history or in the chain of values
    total = WRITERS * n_batches * APPENDS
    history = store.refs.history(SHARED_REF)
    assert len(history) == total
    assert history[0].old is None
    for before, after in itertools.pairwise(history):
        assert after.old == before.new, "a shared-ref update did not start from the last value"
    assert history[-1].new_id == store.refs[SHARED_REF]
    appended = {h for r in reports for h in r["appends"]}
    assert {e.new_id.hex() for e in history} == appended
    whos: Counter[str] = Counter()
    cur = store.refs[SHARED_REF]
    seen = 0
    while cur is not None:
        item = store.get(cur, Item)
        whos[item.who] += 1
        seen += 1
        cur = item.prev
    assert seen == total
    assert whos == {f"append:{r['who']}": n_batches * APPENDS for r in reports}
    # the writers really overlapped: their appends interleave (run one after another, the
    # history would change writer WRITERS - 1 times)
    authors = [store.get(e.new_id, Item).who for e in history]
    switches = sum(a != b for a, b in itertools.pairwise(authors))
    assert switches > WRITERS, authors
    reachable |= store.closure(store.refs[SHARED_REF])

    # Nothing stored that no ref or ref history reaches, except the append items of lost
    # races (`refs.update` calls fn again after losing; fn stores its item each time).
    assert len(store.refs.as_dict()) == 2 * WRITERS + 1
    for name in store.refs:
        for entry in store.refs.history(name):
            assert entry.new_id is not None
            if entry.new_id not in reachable:
                reachable |= store.closure(entry.new_id)
    lost = everything - reachable
    assert reachable <= everything
    assert all(store.get(o, Item).who.startswith("append:") for o in lost)
    print(f"history switches writer {switches} times; {len(lost)} appends lost a race")
    # Items + appends + blobs + trees. Blobs: the empty blob once, per writer "one", "small",
    # "large" and "chunked" (manifest + 2 chunks), the shared one (manifest + 2 chunks) once.
    # Trees: one per blob added, the first ({"empty": ...}) the same in every writer.
    blobs = 1 + WRITERS * 6 + 3
    trees = 1 + WRITERS * 5
    assert len(reachable) == WRITERS * (RECORDS + n_batches * APPENDS) + blobs + trees


def test_four_writers_one_lmdb_store(tmp_path: Path) -> None:
    path, reports = _run_writers(tmp_path, None)
    with mc.open(f"lmdb://{path}") as store:
        _check_writers(store, reports)


def test_four_writers_while_the_map_grows(tmp_path: Path) -> None:
    from medomni_cas.store.backends.lmdb import LMDBBackend

    initial = 1 << 20
    path, reports = _run_writers(tmp_path, initial)
    # the map really had to grow, in the writers (each reports the size it ended with)
    assert max(r["map_size"] for r in reports) > initial
    assert sum(r["grown"] for r in reports) >= 1
    print("map growth per writer (size, doublings, adoptions):")
    for r in reports:
        print(f"  {r['who']}: {r['map_size']}, {r['grown']}, {r['adopted']}")
    with Store(LMDBBackend(path, map_size=initial)) as store:
        _check_writers(store, reports)


# -- 2. a writer killed mid-batch ------------------------------------------------------------------
ROUNDS = 15


def _check_commits(store: Store, checked: set[ObjectId]) -> int:
    """The snapshot chain from heads/main is whole, numbered n, n-1, ..., 0, and each commit
    holds exactly the records and blobs its content function makes; returns n (-1: none).
    Commits in ``checked`` (immutable, verified in an earlier round) are skipped."""
    head = store.refs.get(HEAD)
    if head is None:
        assert store.refs.get(BLOBS) is None
        return -1
    top = store.get(head, Snapshot).n
    expect = top
    cur: ObjectId | None = head
    while cur is not None and cur not in checked:
        snap = store.get(cur, Snapshot)
        assert snap.n == expect
        items, blobs = _workers.commit_content(snap.n)
        want = [_workers.item_id(i) for i in items]
        assert snap.items == [want[i] for i in range(CHAIN - 1, len(want), CHAIN)] + (
            [want[-1]] if len(want) % CHAIN else []
        )
        assert store.closure(snap.items) == set(want)
        tree = store.get(snap.tree, mc.Tree)
        assert set(tree) - {"prev"} == set(blobs)
        for name, data in blobs.items():
            assert store.read_blob(tree[name]) == data
        checked.add(cur)
        expect -= 1
        cur = snap.parent
    if cur is None:
        assert expect == -1
    else:
        assert store.get(cur, Snapshot).n == expect
    # heads/blobs moves first, so it is at the newest commit's tree or one newer
    blobs_tree = store.refs[BLOBS]
    newest = store.get(head, Snapshot).tree
    assert blobs_tree == newest or store.get(blobs_tree, mc.Tree)["prev"] == newest
    return top


@pytest.mark.slow
def test_writer_killed_mid_batch(tmp_path: Path) -> None:
    """SIGKILL a writer at a random moment, ROUNDS times, and check the store after each.

    The parent keeps its own handle on the store open across most kills, so the next writer
    meets the lock file of a writer that died (perhaps holding LMDB's write lock, or with a
    stale reader slot); every fifth round it reopens instead, which resets the lock file.
    """
    path = tmp_path / "s"
    url = f"lmdb://{path}"
    rng = random.Random(1234)
    tops = []
    printed = -1  # the newest commit a writer reported done before it was killed
    checked: set[ObjectId] = set()
    store: Store | None = None
    try:
        for round_ in range(ROUNDS):
            proc = _worker("crash", "--path", str(path))
            try:
                _expect_ready(proc)
                time.sleep(rng.uniform(0.02, 0.3))
                assert proc.poll() is None, proc.stderr and proc.stderr.read()
                os.kill(proc.pid, signal.SIGKILL)
                out, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            assert proc.returncode == -signal.SIGKILL, err
            done = [int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("commit ")]
            printed = max([printed, *done])
            if store is None or round_ % 5 == 4:
                if store is not None:
                    store.close()
                store = mc.open(url)
            check_store(store)
            tops.append(_check_commits(store, checked))
            # a commit whose ref update returned survives the kill
            assert tops[-1] >= printed, (tops, printed)
    finally:
        if store is not None:
            store.close()
    # the writer made progress across rounds (so kills landed in many places), lost none
    assert tops == sorted(tops)
    assert tops[-1] >= 5, tops
    with mc.open(url) as store:
        check_store(store)


# -- 3. the same ids in every process ------------------------------------------------------------
def test_ids_are_the_same_in_other_processes() -> None:
    here = _workers.fixed_ids()
    assert len(here) == len(set(here)) > 60
    for seed in ("0", "12345"):
        done = subprocess.run(
            [sys.executable, "-m", "tests._workers", "ids"],
            cwd=ROOT,
            env=_env(PYTHONHASHSEED=seed),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        there = json.loads(done.stdout.strip().splitlines()[-1])
        assert there == here, f"PYTHONHASHSEED={seed}: ids differ"


def test_the_fixed_objects_are_built_in_a_seed_dependent_order() -> None:
    """The fixed objects really are built in a seed-dependent order (else test 3 is weak)."""
    orders = set()
    for seed in ("0", "12345", "7"):
        done = subprocess.run(
            [sys.executable, "-c", "from tests._workers import STRINGS; print(list(set(STRINGS)))"],
            cwd=ROOT,
            env=_env(PYTHONHASHSEED=seed),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        orders.add(done.stdout)
    assert len(orders) > 1
