"""``python -m benchmarks_perf bench [--quick]``: Bench's store paths at scale (issue 4 §11).

Every row pairs our figure with a baseline measured in the same run on the same tmp disk:

1. resume: the resume check of 100,000 run slots (10 jobs): each slot's id, then its
   ``runs/slots/<hex>`` ref, as `slot_digests` + `Refs.get_many_by_id` per job, against the
   same work one slot at a time (the `RunSlot` record encoded and hashed, one `Refs.get` per
   slot);
   the ids and the ref reads alone against their definition and raw LMDB gets; and what the
   harness reads next (each final run's outcome), typed against a two-field view;
2. scoring: `score_jobs` over 10,000,000 prediction rows (100 jobs of 100,000 rows, in
   the harness's `PredictionColumns`), against the spec's floor of 20M rows/s and a
   plain-Python loop on a tenth of the rows; see `benchmarks_perf.bench_score`;
3. audit: ``medomni audit verify``'s `verify_result` of a `Result` over 100,000 runs (each
   with two prediction records and an answer blob: 420,101 objects), in objects re-hashed
   per second, against the spec's floor of 300k objects/s and raw LMDB gets + BLAKE3 of
   the same objects in one process; and `verify_closure` (with the canonical check). Both
   with their default jobs (helper processes on a machine's spare cores) and with one
   process.

Stores are ``lmdb://`` with ``durable=False`` while they are filled (writing is not timed).
``--only resume|score|audit`` runs some parts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import lmdb
import numpy as np
import pyarrow as pa

import medomni_cas as mc
from benchmarks_perf._records import BenchAtom
from benchmarks_perf._table import Row, render
from benchmarks_perf._timing import median_time, timed
from benchmarks_perf.bench_score import bench_scoring
from medomni_cas.audit.verify import VerifyReport, verify_result
from medomni_cas.bench.columns import PREDICTION_SCHEMA, put_columns
from medomni_cas.bench.harness import resume, run_states
from medomni_cas.bench.harness.claims import Lease
from medomni_cas.bench.records import (
    AGENT_OUTCOMES,
    AgentBlock,
    AgentConfig,
    JobRecord,
    Limits,
    PredictionColumns,
    PredictionRecord,
    Result,
    RunRecord,
    RunSlot,
    ScoreRow,
    slot_digests,
    slot_ids,
)
from medomni_cas.bench.refnames import SLOT_REFS, chunk_ref, slot_ref
from medomni_cas.bench.slottables import chunk_ids, chunk_table, state_of
from medomni_cas.store import encoding
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.reflog import RefLogEntry, chained
from medomni_cas.store.verify import FsckReport, verify_closure

CLASSES = ("G1", "G2", "G3a", "G3b", "G4", "G5")


@dataclass(frozen=True)
class Sizes:
    arms: int  # the runs: arms x reps jobs of atoms_per_arm slots each
    reps: int
    atoms_per_arm: int
    score_jobs: int  # the scoring tables: score_jobs jobs of rows_per_job rows
    rows_per_job: int
    python_jobs: int  # jobs the plain-Python loop scores (its rate is scaled)
    repeats: int

    @property
    def runs(self) -> int:
        return self.arms * self.reps * self.atoms_per_arm


FULL = Sizes(
    arms=2,
    reps=5,
    atoms_per_arm=10_000,
    score_jobs=100,
    rows_per_job=100_000,
    python_jobs=10,
    repeats=3,
)
QUICK = Sizes(
    arms=2,
    reps=2,
    atoms_per_arm=1_000,
    score_jobs=4,
    rows_per_job=20_000,
    python_jobs=2,
    repeats=1,
)


def _open(path: Path) -> mc.Store:
    return mc.Store(LMDBBackend(path, durable=False))


# -- the runs of a set: records, slot refs, jobs and a result -------------------------------
@dataclass
class Runs:
    store: mc.Store
    agent: ObjectId
    jobs: list[tuple[list[ObjectId], str, int]]  # (atoms in set order, arm label, rep)
    result: ObjectId
    objects: int  # objects written


def _record_chunks(
    store: mc.Store,
    slots: Sequence[ObjectId],
    runs: Sequence[ObjectId],
    records: Sequence[RunRecord],
    now: float,
) -> None:
    """Each chunk's table of its slots' runs with their states, as the harness writes it,
    and its ref with a valid history entry."""
    chunks = chunk_ids([bytes(s) for s in slots])
    entries: dict[bytes, dict[bytes, ObjectId]] = {}
    for chunk, slot, rid in zip(chunks, slots, runs, strict=True):
        entries.setdefault(chunk, {})[bytes(slot)] = rid
    states = {rid: state_of(r) for rid, r in zip(runs, records, strict=True)}
    tables = store.put_many(chunk_table(e, states) for e in entries.values())
    for chunk, tid in zip(entries, tables, strict=True):
        _new_ref(store, chunk_ref(chunk), tid, now)


def _new_ref(store: mc.Store, name: str, target: ObjectId, now: float) -> None:
    """Create ref ``name`` with a valid history entry, as `Refs` writes it (fsck and gc read
    it), straight through the backend (a bench writes many)."""
    entry = chained(name, RefLogEntry(old=None, new=bytes(target), time=now))
    if not store.backend.ref_update(name, None, target, entry):
        raise RuntimeError(f"{name} written twice")


def _standin(store: mc.Store, what: str) -> ObjectId:
    return store.put_object("bench.standin", 1, {"what": what})


def build_runs(path: Path, sizes: Sizes, *, chunks: bool = False) -> Runs:
    """arms x reps jobs over atoms_per_arm atoms each: a run per slot with two prediction
    records and an answer blob, the slot refs, a job record per job and one result. With
    ``chunks``, the runs are recorded as the harness records them now, in chunk tables
    (`medomni_cas.bench.slottables`: a table and a ref per 16 slots), not a ref per slot."""
    store = _open(path)
    before = sum(1 for _ in store.backend.iter_keys())
    agent_cfg = AgentConfig(
        name="bench-agent",
        kind="agent",
        agent="baseline",
        model="medomni-llm-7b",
        route="local",
        scaffold="baseline",
        served_model="medomni-llm-7b",
        limits=Limits(time_sec=600, tokens=200_000),
    )
    agent = store.put(agent_cfg)
    task_set, set_build, config = (_standin(store, w) for w in ("task set", "set build", "config"))
    rng = np.random.default_rng(1)
    jobs: list[tuple[list[ObjectId], str, int]] = []
    job_ids: list[ObjectId] = []
    for a in range(sizes.arms):
        arm = ("text", "text+image", "image")[a % 3] if a < 3 else f"arm{a}"
        pairs = [f"synth-ehr_ckd-staging-{i % 4}" for i in range(sizes.atoms_per_arm)]
        atoms = store.put_many(
            BenchAtom(pair=pairs[i], arm=arm, index=i) for i in range(sizes.atoms_per_arm)
        )
        for rep in range(1, sizes.reps + 1):
            slots = slot_ids(atoms, agent, arm, rep)
            stages = rng.integers(0, len(CLASSES), len(atoms))
            egfr = np.round(rng.uniform(5, 120, len(atoms)), 1)
            answers: list[tuple[ObjectId, bytes]] = []
            preds: list[PredictionRecord] = []
            for i, slot in enumerate(slots):
                run_id = f"{slot.hex()}-1"
                stage, gfr = CLASSES[stages[i]], float(egfr[i])
                text = (
                    f'{{"ckd_stage": "{stage}", "egfr": {gfr}, '
                    f'"rationale": "creatinine trend over 12 months, run {run_id[:16]}"}}\n'
                )
                answers.append(blob_object(text.encode()))
                preds.append(
                    PredictionRecord(
                        run_id=run_id,
                        atom=atoms[i],
                        target="ckd_stage",
                        value=stage,
                        intelligence="agent",
                    )
                )
                preds.append(
                    PredictionRecord(
                        run_id=run_id, atom=atoms[i], target="egfr", value=gfr, intelligence="agent"
                    )
                )
            for i in range(0, len(answers), 10_000):
                store.backend.put_many(answers[i : i + 10_000])
            pred_ids = store.put_many(preds)
            runs = [
                RunRecord(
                    run_id=f"{slot.hex()}-1",
                    slot=slot.hex(),
                    attempt=1,
                    intelligence="agent",
                    agent_config=agent,
                    task_set=task_set,
                    atom=atoms[i],
                    pair=pairs[i],
                    task_version="1.0",
                    config=config,
                    repetition=rep,
                    runner="process",
                    outcome="answered",
                    served_model="medomni-llm-7b",
                    cost_usd=0.0125,
                    tokens_in=1800 + i % 700,
                    tokens_out=120 + i % 50,
                    started="2026-11-30T10:00:00.000+00:00",
                    finished="2026-11-30T10:00:41.250+00:00",
                    elapsed_ms=41_250,
                    agent_block=AgentBlock(arm=arm, encoders="none"),
                    answer=answers[i][0],
                    predictions=(pred_ids[2 * i], pred_ids[2 * i + 1]),
                )
                for i, slot in enumerate(slots)
            ]
            run_ids = store.put_many(runs)
            now = time.time()
            if chunks:
                _record_chunks(store, slots, run_ids, runs, now)
            else:
                for slot, rid in zip(slots, run_ids, strict=True):
                    _new_ref(store, slot_ref(slot), rid, now)
            pt = store.put(
                PredictionColumns(rows=2 * len(runs), columns=put_columns(store, _columns(runs)))
            )
            job_ids.append(
                store.put(
                    JobRecord(
                        name=f"bench--{arm}--r{rep}",
                        task_set=task_set,
                        set_build=set_build,
                        agent_config=agent,
                        arm=arm,
                        repetition=rep,
                        runner="process",
                        runs=tuple(run_ids),
                        attempts=len(run_ids),
                        predictions=pt,
                        started="2026-11-30T10:00:00.000+00:00",
                    )
                )
            )
            jobs.append((atoms, arm, rep))
    rows = tuple(
        ScoreRow(
            agent=agent_cfg.name,
            arm=arm,
            pair=f"synth-ehr_ckd-staging-{p}",
            target="ckd_stage",
            metric="accuracy",
            value=0.5,
            n=sizes.atoms_per_arm // 4,
            config=config.hex(),
        )
        for _, arm, _ in jobs
        for p in range(4)
    )
    result = store.put(
        Result(
            task_set=task_set,
            set_build=set_build,
            jobs=tuple(job_ids),
            answer_keys=(_standin(store, "answer key"),),
            scorer="medomni-scorer",
            scorer_version="1.0.0",
            n_boot=0,
            seed=0,
            rows=rows,
            table=store.put_blob(b"rows as parquet (a stand-in)"),
        )
    )
    objects = sum(1 for _ in store.backend.iter_keys()) - before
    return Runs(store, agent, jobs, result, objects)


def _columns(runs: list[RunRecord]) -> dict[str, pa.Array]:
    """A job's predictions as the harness stores them (two rows a run: two targets)."""
    n = 2 * len(runs)
    cols: dict[str, list[Any]] = {
        "atom": [r.atom.hex() for r in runs for _ in (0, 1)],
        "target": ["ckd_stage", "egfr"] * len(runs),
        "pair": [r.pair for r in runs for _ in (0, 1)],
        "run_id": [r.run_id for r in runs for _ in (0, 1)],
        "slot": [r.slot for r in runs for _ in (0, 1)],
        "value_text": ["G3a", None] * len(runs),
        "value_num": [None, 42.5] * len(runs),
        "intelligence": ["agent"] * n,
        "config": [r.config.hex() for r in runs for _ in (0, 1)],
        "outcome": [r.outcome for r in runs for _ in (0, 1)],
        "attempt": [r.attempt for r in runs for _ in (0, 1)],
    }
    return {c: pa.array(v, PREDICTION_SCHEMA.field(c).type) for c, v in cols.items()}


def bench_resume(runs: Runs, sizes: Sizes) -> list[Row]:
    store, agent = runs.store, runs.agent
    n = sizes.runs

    def ours() -> int:
        found = 0
        for atoms, arm, rep in runs.jobs:
            got = store.refs.get_many_by_id(SLOT_REFS, slot_digests(atoms, agent, arm, rep))
            found += len(got) - got.count(None)
        return found

    def one_by_one() -> int:
        found = 0
        for atoms, arm, rep in runs.jobs:
            for atom in atoms:
                slot = hash_bytes(
                    encoding.encode(
                        RunSlot(atom=atom, agent_config=agent, arm_variant=arm, repetition=rep)
                    )
                )
                found += store.refs.get(slot_ref(slot)) is not None
        return found

    def ids_only() -> list[list[bytes]]:
        return [slot_digests(atoms, agent, arm, rep) for atoms, arm, rep in runs.jobs]

    def ids_defined() -> list[list[ObjectId]]:
        return [
            [
                hash_bytes(
                    encoding.encode(
                        RunSlot(atom=a, agent_config=agent, arm_variant=arm, repetition=rep)
                    )
                )
                for a in atoms
            ]
            for atoms, arm, rep in runs.jobs
        ]

    t_ours, found = median_time(ours, sizes.repeats)
    t_one, found_one = median_time(one_by_one, sizes.repeats)
    if found != n or found_one != n:
        raise RuntimeError(f"resume found {found} and {found_one} of {n} slots")
    t_ids, ids = median_time(ids_only, sizes.repeats)
    t_ids_def, ids_def = median_time(ids_defined, sizes.repeats)
    if ids != ids_def:
        raise RuntimeError("slot_ids differ from the RunSlot record's hash")
    slots = [s for job in ids for s in job]
    names = [f"{SLOT_REFS}{s.hex()}" for s in slots]
    if names[0] != slot_ref(ids[0][0]):
        raise RuntimeError("slot ref names differ from the harness's")
    t_get, got = median_time(lambda: store.refs.get_many_by_id(SLOT_REFS, slots), sizes.repeats)
    t_names, by_name = median_time(lambda: store.refs.get_many(names), sizes.repeats)
    if by_name != got:
        raise RuntimeError("Refs.get_many and Refs.get_many_by_id differ")
    keys = [name.encode() for name in names]
    backend = store.backend
    assert isinstance(backend, LMDBBackend)

    def raw_get() -> list[bytes | None]:
        with backend.env.begin(db=backend._refs) as txn:
            get = txn.get
            return [get(k) for k in keys]

    t_raw, raw = median_time(raw_get, sizes.repeats)
    if [bytes(g) if g else None for g in got] != raw:
        raise RuntimeError("Refs.get_many differs from raw LMDB gets")
    run_ids = [g for g in got if g is not None]
    t_typed, done_typed = median_time(
        lambda: sum(r.outcome == "answered" for _, r in store.get_many(run_ids, RunRecord)),
        sizes.repeats,
    )
    t_view, done_view = median_time(
        lambda: sum(s.outcome == "answered" for s in run_states(store, run_ids).values()),
        sizes.repeats,
    )
    if done_typed != n or done_view != n:
        raise RuntimeError(f"outcomes: {done_typed} and {done_view} of {n} runs answered")

    def before() -> int:
        """The resume check as it was before coverage: slot ids, refs, outcome + attempt."""
        done = 0
        for atoms, arm, rep in runs.jobs:
            got = store.refs.get_many_by_id(SLOT_REFS, slot_digests(atoms, agent, arm, rep))
            for _, data in store.get_raw_many([g for g in got if g is not None]):
                state = encoding.decode_view(data, _TwoFields)
                done += state.outcome in AGENT_OUTCOMES
        return done

    def planned() -> int:
        return sum(resume(store, atoms, agent, arm, rep).done for atoms, arm, rep in runs.jobs)

    # alternated, so that a drift of the machine's speed falls on both sides alike
    befores, planneds = [], []
    for _ in range(max(5, sizes.repeats)):
        t, done_before = timed(before)
        befores.append(t)
        with _heartbeat(store):
            t, done_planned = timed(planned)
        planneds.append(t)
    t_before, t_planned = statistics.median(befores), statistics.median(planneds)
    if done_before != n or done_planned != n:
        raise RuntimeError(f"resume: {done_before} and {done_planned} of {n} slots done")
    reps = f", median of {sizes.repeats}" if sizes.repeats > 1 else ""
    what = f"{n:,} slots"
    return [
        Row(
            f"resume: {what}, slot ids + refs",
            t_ours,
            "s",
            t_one,
            "1 slot at a time",
            max_value=0.2,
            note=f"slot_digests + Refs.get_many_by_id per job ({len(runs.jobs)} jobs), as the "
            f"harness does{reps}",
        ),
        Row(
            f"resume: {what}, slot ids alone",
            t_ids,
            "s",
            t_ids_def,
            "encode RunSlot + hash",
            note="slot_digests: the RunSlot bytes around the atom made once per job, one "
            "hasher; same ids",
        ),
        Row(
            f"resume: {what}, Refs.get_many_by_id alone",
            t_get,
            "s",
            t_raw,
            "raw LMDB txn.get",
            note="keys made from the ids (no names), one read transaction",
        ),
        Row(
            f"resume: {what}, Refs.get_many alone",
            t_names,
            "s",
            t_raw,
            "raw LMDB txn.get",
            note="the same refs by name (names made beforehand, untimed): checked in one pass",
        ),
        Row(
            f"resume: {what}, harness.resume (coverage counts, lease heartbeat on)",
            t_planned,
            "s",
            t_before,
            "the check before coverage",
            max_ratio=1.10,
            note="what run_set runs per job: slot ids, refs, each run's outcome, attempt and "
            "arm check, counted by outcome, while the harness's lease heartbeat renews in its "
            "thread (every second); baseline: slot ids, refs and a view of outcome and attempt "
            "(issue 12's); 5 runs each, alternated, medians",
        ),
        Row(
            f"resume: {what}, then each run's outcome",
            t_view,
            "s",
            t_typed,
            "typed RunRecord reads",
            note="harness.run_states: verified bytes decoded as a view of outcome, attempt and "
            "arm check "
            "only; baseline: Store.get_many(runs, RunRecord)",
        ),
    ]


class _TwoFields(encoding.View):
    """The run view resume read before coverage: outcome and attempt."""

    __kind__ = RunRecord.__kind__
    __version__ = RunRecord.__version__

    outcome: str
    attempt: int


@contextlib.contextmanager
def _heartbeat(store: mc.Store) -> Iterator[None]:
    """The lease a harness holds while it plans and runs, its heartbeat renewing every
    second (a default lease renews every 20 s)."""
    with Lease(store, 3.0) as lease:
        lease.start()
        yield
        lease.check()  # it was renewed all along


# -- 3. audit -------------------------------------------------------------------------------
def bench_audit(runs: Runs, sizes: Sizes) -> list[Row]:
    store = runs.store
    order = [oid for oid, _ in store.walk([runs.result])]  # the closure, breadth first
    n = len(order)
    backend = store.backend
    assert isinstance(backend, LMDBBackend)

    def raw() -> int:
        hasher = blake3.blake3
        bad = 0
        with backend.env.begin(db=backend._objects, buffers=True) as txn:
            get = txn.get
            for key in order:
                value = get(key)
                data = value[9:] if value[0] == 0 else backend._file(key).read_bytes()
                bad += hasher(data).digest() != key
        return bad

    def closure(jobs: int | None) -> Callable[[], FsckReport]:
        return lambda: verify_closure(store, [runs.result], jobs=jobs)

    def result(jobs: int | None) -> Callable[[], VerifyReport]:
        return lambda: verify_result(store, runs.result, jobs=jobs)

    t_raw, bad = median_time(raw, sizes.repeats)
    t_ours, report = median_time(closure(None), sizes.repeats)
    if bad or not report.ok or report.objects != n:
        raise RuntimeError(f"audit: {bad} bad, report {report.objects} of {n}: {report.problems}")
    t_one, _ = median_time(closure(1), sizes.repeats)
    t_audit, audit = median_time(result(None), sizes.repeats)
    t_audit_one, _ = median_time(result(1), sizes.repeats)
    if not audit.ok or audit.objects != n:
        raise RuntimeError(f"audit: verify_result saw {audit.objects} of {n}: {audit.problems}")
    what = f"{sizes.runs:,} runs, {n:,} objects"
    procs = f"{audit.processes} processes" if audit.processes > 1 else "1 process"
    return [
        Row(
            f"audit: medomni audit verify (verify_result; {what})",
            n / t_audit,
            "obj/s",
            300_000,
            "the spec's floor",
            target=1,
            note=f"re-hash and links of every object of the closure; {procs} (default jobs)",
        ),
        Row(
            "audit: verify_result vs raw reads",
            n / t_audit,
            "obj/s",
            n / t_raw,
            "raw LMDB get + blake3",
            note="raw: the same objects in walk order, one read transaction, one process",
        ),
        Row(
            "audit: verify_result, one process (--jobs 1)",
            n / t_audit_one,
            "obj/s",
            n / t_raw,
            "raw LMDB get + blake3",
        ),
        Row(
            "audit: verify_closure of the result",
            n / t_ours,
            "obj/s",
            300_000,
            "the spec's floor",
            target=1,
            note="also the canonical check of every object (what cas fsck does); default jobs",
        ),
        Row(
            "audit: verify_closure, one process (jobs=1)",
            n / t_one,
            "obj/s",
            n / t_raw,
            "raw LMDB get + blake3",
        ),
    ]


# -- driver --------------------------------------------------------------------------------
def _command(argv: Sequence[str]) -> str:
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):  # outside the cwd: print it whole
        exe = exe.relative_to(Path.cwd())
    return shlex.join([str(exe), "-m", "benchmarks_perf", "bench", *argv])


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf bench")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument(
        "--only",
        choices=("resume", "score", "audit"),
        action="append",
        help="run only these parts (repeatable)",
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    parts = set(args.only or ("resume", "score", "audit"))
    print(f"$ {_command(argv)}")
    print(
        f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
        f"lmdb {lmdb.version()}, pyarrow {pa.__version__}, {platform.platform()}"
    )
    start = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="medomni-bench-", dir="/tmp") as d:
        tmp = Path(d)
        if parts & {"resume", "audit"}:
            t, runs = timed(lambda: build_runs(tmp / "runs", sizes))
            print(f"built {sizes.runs:,} runs ({runs.objects:,} objects) in {t:.0f} s")
            # written with durable=False: flushed now, not by the kernel while timing
            os.sync()
            if "resume" in parts:
                rows += bench_resume(runs, sizes)
            if "audit" in parts:
                rows += bench_audit(runs, sizes)
            runs.store.close()
            shutil.rmtree(tmp / "runs")
        if "score" in parts:
            rows += bench_scoring(tmp, sizes)
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0
