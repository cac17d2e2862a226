"""Chunked claims and slot tables (`medomni_cas.bench.slottables`, `harness.chunkclaims`):
two writers of one chunk, a harness killed with its batch written but not recorded, a dead
harness's chunk taken over, a store written with per-slot refs resumed, and the listing
that makes a resume check of slots never run cheap on S3, on every backend alike."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import RunReport, resume, run_set
from medomni_cas.bench.harness.checks import check_built
from medomni_cas.bench.harness.chunkclaims import JobClaims
from medomni_cas.bench.harness.claims import Lease
from medomni_cas.bench.records import RunRecord, slot_digests
from medomni_cas.bench.refnames import CHUNK_REFS, chunk_ref, slot_ref
from medomni_cas.bench.runners import Job, Runner, Trial, TrialSpec
from medomni_cas.bench.slottables import (
    CHUNK_SLOTS,
    SlotChunk,
    chunk_ids,
    chunk_table,
    latest_runs,
    latest_states,
    read_chunks,
    slot_runs,
)
from medomni_cas.errors import MedomniError
from medomni_cas.store._crash import CRASH_ENV
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.verify import fsck
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree
from tests.test_backends import BUCKET, s3_endpoint  # noqa: F401 - a fixture
from tests.test_bench_identity import SAMPLES

ROOT = Path(__file__).resolve().parent.parent
SET = "medomni-bench/chunks"
SLOTS = 20  # one n20 pair under one arm: a chunk of 16 and one of 4
ARM = "no-perception"


class InstantRunner(Runner):
    """Answers every trial at once, in this process (the harness and the store alone)."""

    name: ClassVar[str] = "instant"
    claims_each: ClassVar[bool] = True

    def run(self, job: Job) -> Iterator[Trial]:
        for spec in job.trials:
            if job.claim is not None and not job.claim(spec):
                continue
            answer = {
                t.name: (t.classes[0] if t.classes else 1.0) for t in spec.format_check.targets
            }
            now = datetime.now(UTC).isoformat(timespec="milliseconds")
            yield Trial(
                spec.slot,
                spec.attempt,
                "answered",
                now,
                now,
                0,
                answer=json.dumps(answer).encode(),
                logs={"stdout.txt": b"", "stderr.txt": spec.slot.hex().encode()},
                environment="local",
            )


class FailingFirst(InstantRunner):
    """The same, serving the config's model (so that answers count), but the first slot it
    runs ends in an infrastructure error and the second in a time-out (the agent's own
    outcome: final)."""

    name: ClassVar[str] = "failing-first"

    def run(self, job: Job) -> Iterator[Trial]:
        for n, trial in enumerate(super().run(job)):
            trial.served_model = job.agent.served_model
            if n < 2:
                trial.outcome, trial.answer = ("infra-error", "timeout")[n], None
            yield trial


class InstantBatch(InstantRunner):
    """The same, taking its whole list at once: every chunk is claimed before it runs."""

    name: ClassVar[str] = "instant-batch"
    claims_each: ClassVar[bool] = False


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = small_tree(
        tmp_path_factory.mktemp("chunks"),
        arms=[ARM],
        pairs=("synth-ehr_ckd-staging@n20",),
        name="chunks",
    )
    with mc.open(f"lmdb://{root / 'store'}") as s:
        build_set(s, SET, studio=root / "studio", bench=root / "bench")
    return root


@pytest.fixture
def store(built: Path, tmp_path: Path) -> Iterator[mc.Store]:
    shutil.copytree(built / "store", tmp_path / "store")
    with mc.open(f"lmdb://{tmp_path / 'store'}") as s:
        yield s


def _run(store: mc.Store, built: Path, tmp: Path, **kw: Any) -> RunReport:
    agent = find_agent(built / "bench", "baseline")
    kw.setdefault("runner", InstantRunner())
    return run_set(store, SET, agent, runs_dir=tmp / "runs", studio=built / "studio", **kw)


def _job_slots(store: mc.Store, built: Path) -> tuple[list[bytes], list[ObjectId]]:
    """The job's slots (in the arm's atom order) and its atoms."""
    agent_id = store.put(find_agent(built / "bench", "baseline"))
    view = show_set(store, SET)
    loaded = check_built(store, list(view.entries), [])
    atoms = [aid for e in view.entries for aid, _ in loaded[e.result]]
    return slot_digests(atoms, agent_id, ARM, 1), atoms


def _record(slot: bytes) -> RunRecord:
    """A run record of ``slot`` (the protocol's tests need its state, not a real run)."""
    return msgspec.structs.replace(SAMPLES["run"], run_id=f"{slot.hex()}-1", slot=slot.hex())


def _stored_runs(store: mc.Store) -> list[RunRecord]:
    return [store.get(o, RunRecord) for o in store.iter_ids() if store.kind(o) == "medomni.run"]


# -- the protocol ------------------------------------------------------------------------------
def test_a_job_is_recorded_as_chunk_tables_and_resumes_from_them(
    store: mc.Store, built: Path, tmp_path: Path
) -> None:
    report = _run(store, built, tmp_path)
    assert report.ran == SLOTS
    tables = store.refs.as_dict(CHUNK_REFS)
    assert len(tables) == 2 and not store.refs.as_dict("runs/slots/")  # no per-slot refs
    assert sorted(len(store.get(t, SlotChunk).runs) for t in tables.values()) == [4, CHUNK_SLOTS]
    assert not store.refs.as_dict("runs/claims/")
    assert len(slot_runs(store)) == SLOTS
    again = _run(store, built, tmp_path)
    assert again.ran == 0 and again.jobs[0].done == SLOTS
    # every table's history is whole, and every run it links is stored whole
    checked = fsck(store)
    assert checked.ok, checked.problems


def test_two_writers_of_one_chunk_record_each_slot_once(store: mc.Store, built: Path) -> None:
    """A harness whose chunk's table moved under it (another harness took the chunk over
    after its lease lapsed and recorded some slots) keeps only the runs of slots that did
    not move, and records them on top of the other's."""
    slots, _ = _job_slots(store, built)
    chunk = chunk_ids(slots)[0]
    a, b = (ObjectId(s) for s in slots[:2])
    with Lease(store, 30.0) as lease:
        claims = JobClaims(store, lease, slots, {ObjectId(s): None for s in slots})
        spec_a, spec_b = (TrialSpec(s, 1, s, None, None) for s in (a, b))  # type: ignore[arg-type]
        assert claims.claim(spec_a) and claims.claim(spec_b)
        mine = {s: store.put_blob(b"run of " + s) for s in (a, b)}  # stand-ins for runs
        theirs = store.put_blob(b"their run of a")
        # the other writer records slot a first
        store.refs.set(chunk_ref(chunk), store.put(chunk_table({a: theirs})), expected=None)
        for spec in (spec_a, spec_b):
            claims.add(spec, mine[spec.slot], _record(spec.slot))
        committed = claims.close()
    assert [c[0] for c in committed] == [b]  # a had moved: dropped
    table = store.get(store.refs[chunk_ref(chunk)], SlotChunk)
    assert table.entries() == {a: theirs, b: mine[b]}
    # the other writer's table held no state of its run: neither does the table made on it
    assert table.states == ()
    assert not store.refs.as_dict("runs/claims/")


def test_a_harness_killed_with_its_batch_written_loses_nothing_and_doubles_nothing(
    built: Path, tmp_path: Path
) -> None:
    """SIGKILLed after writing a batch's objects and before moving the chunk's table: the
    runs are not recorded (unreachable, gc's to remove); the next harness takes the dead
    one's chunk over and records every slot once."""
    url = f"lmdb://{tmp_path / 'store'}"
    shutil.copytree(built / "store", tmp_path / "store")
    script = (
        "import sys; from pathlib import Path; import medomni_cas as mc\n"
        "from tests.test_slot_chunks import _run\n"
        "with mc.open(sys.argv[1]) as s:\n"
        "    _run(s, Path(sys.argv[2]), Path(sys.argv[3]))\n"
    )
    env = {**os.environ, CRASH_ENV: "batch:1"}
    done = subprocess.run(
        [sys.executable, "-c", script, url, str(built), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
    )
    assert done.returncode == -9, done.stderr.decode()  # killed at the crash point
    with mc.open(url) as s:
        assert not slot_runs(s)  # nothing recorded
        # the first batch's runs, written: one, as a local store records each run as it ends
        assert len(_stored_runs(s)) == 1
        assert s.refs.as_dict("runs/claims/")  # its claim is left behind
        report = _run(s, built, tmp_path)  # its pid is gone: stale at once on this host
        assert report.ran == SLOTS
        recorded = [s.get(r, RunRecord) for r in slot_runs(s).values()]
        assert len({r.slot for r in recorded}) == SLOTS and all(r.attempt == 1 for r in recorded)
        assert not s.refs.as_dict("runs/claims/")


def test_a_dead_harnesss_chunk_is_taken_over(store: mc.Store, built: Path, tmp_path: Path) -> None:
    """A chunk claimed by a harness whose pid is gone (on this host) is taken over at once;
    a chunk held by a live harness is waited for and reported held."""
    slots, _ = _job_slots(store, built)
    first, second = dict.fromkeys(chunk_ids(slots))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = os.uname().nodename
    stale = store.put_blob(f"{host} {gone.pid} {time.time():.3f}\n".encode())
    store.refs.set(f"runs/claims/{first.hex()}", stale)
    report = _run(store, built, tmp_path)
    assert report.ran == SLOTS
    assert not store.refs.as_dict("runs/claims/")
    # a live holder (this process, a claim made before leases) keeps its chunk
    live = store.put_blob(f"{host} {os.getpid()} {time.time():.3f}\n".encode())
    store.refs.set(f"runs/claims/{second.hex()}", live)
    again = _run(store, built, tmp_path, rerun="all", runner=InstantBatch())
    job = again.jobs[0]
    assert again.ran == CHUNK_SLOTS and len(job.held) == SLOTS - CHUNK_SLOTS
    assert store.refs.as_dict("runs/claims/") == {f"runs/claims/{second.hex()}": live}


def test_a_store_with_per_slot_refs_still_resumes(
    store: mc.Store, built: Path, tmp_path: Path
) -> None:
    """A store written before chunks has one ref per slot: it resumes from them, and a new
    attempt is recorded in the chunk's table, linked from the per-slot ref's run."""
    _run(store, built, tmp_path)
    slots, atoms = _job_slots(store, built)
    runs = [r for r in latest_runs(store, slots) if r is not None]
    assert len(runs) == SLOTS
    # as a harness before chunks left it: per-slot refs, no tables
    for slot, rid in zip(slots, runs, strict=True):
        store.refs.set(slot_ref(slot), rid, expected=None)
    for name, tid in store.refs.items(CHUNK_REFS):
        store.refs.delete(name, expected=tid)
    assert latest_runs(store, slots) == runs
    plan = resume(store, atoms, store.put(find_agent(built / "bench", "baseline")), ARM, 1)
    assert plan.done == SLOTS and not plan.to_run
    assert _run(store, built, tmp_path).ran == 0
    again = _run(store, built, tmp_path, rerun="all")
    assert again.ran == SLOTS
    newer = latest_runs(store, slots)
    for old, new in zip(runs, newer, strict=True):
        assert new is not None
        rec = store.get(new, RunRecord)
        assert rec.attempt == 2 and rec.previous == old
    assert [store.refs[slot_ref(s)] for s in slots] == runs  # per-slot refs as they were


# -- states: resume reads the tables, not the runs -----------------------------------------------
def _states_of_records(store: mc.Store) -> dict[ObjectId, tuple[str, int, bool]]:
    out = {}
    for rid in slot_runs(store).values():
        r = store.get(rid, RunRecord)
        out[rid] = (r.outcome, r.attempt, r.agent_block.meets_arm)
    return out


def test_each_table_holds_its_runs_states_as_their_records_say(
    store: mc.Store, built: Path, tmp_path: Path
) -> None:
    _run(store, built, tmp_path, runner=FailingFirst())
    # the infrastructure error's slot runs again, by a runner that serves no model
    _run(store, built, tmp_path)
    records = _states_of_records(store)
    assert sorted(records.values()).count(("answered", 1, True)) == SLOTS - 2
    assert ("agent-failed", 2, True) in records.values()
    assert ("timeout", 1, True) in records.values()
    held = {}
    for _, tid in store.refs.items(CHUNK_REFS):
        held.update(store.get(tid, SlotChunk).run_states())
    assert held == records


def test_resume_reads_the_tables_and_no_run_record(
    store: mc.Store, built: Path, tmp_path: Path
) -> None:
    """With every run record gone from the store, resume answers as before: it read the
    states the tables hold (the failed slot to run again at attempt 2, the time-out done)."""
    _run(store, built, tmp_path, runner=FailingFirst())
    slots, atoms = _job_slots(store, built)
    agent = store.put(find_agent(built / "bench", "baseline"))
    before = resume(store, atoms, agent, ARM, 1)
    assert before.done == SLOTS - 1 and before.outcomes == {"answered": SLOTS - 2, "timeout": 1}
    assert [(i, attempt) for i, attempt, _ in before.to_run] == [(0, 2)]
    runs = [bytes(r) for r in latest_runs(store, slots) if r is not None]
    assert store.backend.delete_many(runs) == SLOTS
    after = resume(store, atoms, agent, ARM, 1)
    assert (after.to_run, after.done, after.outcomes) == (
        before.to_run,
        before.done,
        before.outcomes,
    )


def test_resume_reads_its_tables_with_the_collector_paused(
    store: mc.Store, built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables are read with Python's cyclic collector off (its share of resume's time
    grew with the slots: `medomni_cas._gcpause`), and it is on again after resume, also
    after one that raised."""
    _run(store, built, tmp_path)
    _, atoms = _job_slots(store, built)
    agent = store.put(find_agent(built / "bench", "baseline"))
    collecting: list[bool] = []
    get_many = store.backend.get_many

    def reading(keys: list[bytes]) -> Any:
        collecting.append(gc.isenabled())
        return get_many(keys)

    monkeypatch.setattr(store.backend, "get_many", reading)
    assert gc.isenabled()
    assert resume(store, atoms, agent, ARM, 1).done == SLOTS
    assert collecting and not any(collecting)
    assert gc.isenabled()
    for name, tid in store.refs.items(CHUNK_REFS):  # a table that is not one: resume raises
        store.refs.set(name, store.put_blob(b"not a table"), expected=tid, message="broken")
    with pytest.raises(MedomniError, match="slot chunk table"):
        resume(store, atoms, agent, ARM, 1)
    assert gc.isenabled()


def test_a_table_without_states_is_resumed_from_its_runs(
    store: mc.Store, built: Path, tmp_path: Path
) -> None:
    """Tables written before states were kept (the same entries, no states: the ids they
    always had) are resumed by reading their runs: the same answer; with those runs gone,
    resume says which run it could not read."""
    _run(store, built, tmp_path, runner=FailingFirst())
    slots, atoms = _job_slots(store, built)
    agent = store.put(find_agent(built / "bench", "baseline"))
    before = resume(store, atoms, agent, ARM, 1)
    for name, tid in store.refs.items(CHUNK_REFS):
        old = chunk_table(store.get(tid, SlotChunk).entries())
        assert old.states == ()
        store.refs.set(name, store.put(old), expected=tid, message="as written before states")
    lasts, known = latest_states(store, slots)
    assert not known and len([r for r in lasts if r is not None]) == SLOTS
    after = resume(store, atoms, agent, ARM, 1)
    assert (after.to_run, after.done, after.outcomes) == (
        before.to_run,
        before.done,
        before.outcomes,
    )
    # a harness recording on such a table: its states come back once every run has one
    assert _run(store, built, tmp_path).ran == 1
    table = store.get(store.refs[chunk_ref(chunk_ids(slots)[0])], SlotChunk)
    assert table.states == ()  # 15 of its runs were recorded without a state
    store.backend.delete_many([bytes(r) for r in lasts if r is not None][1:2])
    with pytest.raises(MedomniError, match=str(lasts[1])):
        resume(store, atoms, agent, ARM, 1)


def test_a_table_whose_states_do_not_match_its_runs_is_named(store: mc.Store) -> None:
    slot = b"\x01" * 32
    run = store.put_blob(b"a run")  # a table's links are stored before it
    tid = store.put(SlotChunk(slots=slot, runs=(run,), states=(("answered", 1, True),) * 2))
    chunk = chunk_ids([slot])[0]
    store.refs.set(chunk_ref(chunk), tid, expected=None)
    with pytest.raises(
        MedomniError, match=f"slot chunk table {tid}: slot chunk: 2 states for 1 runs"
    ):
        read_chunks(store, [chunk])


# -- reading many refs under a prefix ----------------------------------------------------------
@pytest.mark.parametrize("scheme", ["lmdb", "file", "s3"])
def test_many_refs_under_a_prefix_read_alike_on_every_backend(
    scheme: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`Refs.get_many_by_id` of many names, few of them present (on S3 a listing first,
    then only those read): the same answer on every backend."""
    if scheme == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        url = f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={endpoint}"
    else:
        url = f"{scheme}://{tmp_path / 'store'}"
    ids = [bytes([i]) * 32 for i in range(40)]
    with mc.open(url) as s:
        a, b = s.put_blob(b"a"), s.put_blob(b"b")
        s.refs.set(f"runs/slots/{ids[3].hex()}", a)
        s.refs.set(f"runs/slots/{ids[39].hex()}", b)
        s.refs.set(f"runs/slots/{ids[7].hex()}", a)
        s.refs.delete(f"runs/slots/{ids[7].hex()}")  # deleted: absent
        s.refs.set(f"runs/slotsx/{ids[5].hex()}", a)  # another prefix sharing the start
        got = s.refs.get_many_by_id("runs/slots/", ids)
        want = [a if i == 3 else b if i == 39 else None for i in range(40)]
        assert got == want
        assert s.refs.get_many_by_id("runs/slots/", ids[:3]) == [None] * 3
