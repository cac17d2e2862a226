"""``python -m benchmarks_perf bench [--quick]``: Bench's store paths at scale (issue 4 §11).

Every row pairs our figure with a baseline measured in the same run on the same tmp disk:

1. resume: the resume check of 100,000 run slots (10 jobs): each slot's id, then its
   ``runs/slots/<hex>`` ref, as `slot_ids` + `Refs.get_many` per job, against the same work
   one slot at a time (the `RunSlot` record encoded and hashed, one `Refs.get` per slot);
   the ids and the ref reads alone against their definition and raw LMDB gets; and what the
   harness reads next (each final run's outcome), typed against a two-field view;
2. scoring: 10,000,000 prediction rows, 100 jobs' tables of 100,000 rows (one 6-class
   target, four pairs, 2% unanswered), read from the store, joined with the answer key and
   scored (accuracy per pair and target, `medomni_cas.bench.metrics.score` with
   ``n_boot=0``), against the spec's floor of 20M rows/s and a plain-Python loop on a
   tenth of the rows. The tables are written three ways: as the harness writes them (one
   Arrow IPC blob per job, plain columns), "compact" (the same blob, low-cardinality
   columns dictionary-encoded, zstd) and "columns" (`ColumnTable`: one blob per column, so
   a scorer reads only its columns, and a job whose key columns are the answer key's own
   objects is joined by comparing ids);
3. audit: `verify_closure` of a `Result` over 100,000 runs (each with two prediction records
   and an answer blob: 420,085 objects), in objects checked per second, against the spec's
   floor of 300k objects/s and raw LMDB gets + BLAKE3 of the same objects; and
   `medomni_cas.audit.verify.verify_result` when that module is there.

Stores are ``lmdb://`` with ``durable=False`` while they are filled (writing is not timed).
``--only resume|score|audit`` runs some parts.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
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
import pyarrow.compute as pc

import medomni_cas as mc
from benchmarks_perf._table import Row, render
from medomni_cas.bench.harness import PREDICTION_COLUMNS, run_states
from medomni_cas.bench.metrics import score as metric_score
from medomni_cas.bench.records import (
    AgentBlock,
    AgentConfig,
    JobRecord,
    Limits,
    PredictionRecord,
    PredictionTable,
    Result,
    RunRecord,
    RunSlot,
    ScoreRow,
    slot_ids,
)
from medomni_cas.bench.replay import slot_ref
from medomni_cas.store import encoding
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.encoding import Record
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.objects import ChunkedBlob
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


class BenchAtom(Record, kw_only=True):
    """A stand-in for an atom task: the runs link it, the audit walks to it."""

    __kind__ = "bench.atom"

    pair: str
    arm: str
    index: int


def _timed(fn: Callable[[], object]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _median_time(fn: Callable[[], object], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t, out = _timed(fn)
        times.append(t)
    return statistics.median(times), out


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


def _standin(store: mc.Store, what: str) -> ObjectId:
    return store.put_object("bench.standin", 1, {"what": what})


def build_runs(path: Path, sizes: Sizes) -> Runs:
    """arms x reps jobs over atoms_per_arm atoms each: a run per slot with two prediction
    records and an answer blob, the slot refs, a job record per job and one result."""
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
            for slot, rid in zip(slots, run_ids, strict=True):
                if not store.backend.ref_update(slot_ref(slot), None, rid, b""):
                    raise RuntimeError(f"slot {slot} written twice")
            table = _run_table(runs, agent_cfg.name, arm, rep)
            pt = store.put(
                PredictionTable(
                    rows=2 * len(runs), columns=PREDICTION_COLUMNS, table=store.put_blob(table)
                )
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


def _run_table(runs: list[RunRecord], agent: str, arm: str, rep: int) -> bytes:
    """A job's prediction table as Arrow IPC, in the harness's columns (two rows a run)."""
    n = 2 * len(runs)
    cols: dict[str, list[Any]] = {
        "run_id": [r.run_id for r in runs for _ in (0, 1)],
        "slot": [r.slot for r in runs for _ in (0, 1)],
        "atom": [r.atom.hex() for r in runs for _ in (0, 1)],
        "target": ["ckd_stage", "egfr"] * len(runs),
        "value_text": ["G3a", None] * len(runs),
        "value_num": [None, 42.5] * len(runs),
        "intelligence": ["agent"] * n,
        "agent": [agent] * n,
        "arm": [arm] * n,
        "arm_variant": [""] * n,
        "repetition": [rep] * n,
        "pair": [r.pair for r in runs for _ in (0, 1)],
        "config": [r.config.hex() for r in runs for _ in (0, 1)],
        "outcome": [r.outcome for r in runs for _ in (0, 1)],
        "attempt": [r.attempt for r in runs for _ in (0, 1)],
    }
    return _ipc(_prediction_table(cols, n))


def _prediction_schema() -> pa.Schema:
    # as harness._prediction_table writes it
    return pa.schema(
        [
            (
                c,
                pa.float64()
                if c == "value_num"
                else pa.int32()
                if c in ("repetition", "attempt")
                else pa.string(),
            )
            for c in PREDICTION_COLUMNS
        ]
    )


def _prediction_table(cols: dict[str, Any], n: int) -> pa.Table:
    """``cols`` in the harness's schema; a column the harness has and ``cols`` has not
    (``scores``: an agent's class probabilities, as JSON) is null throughout."""
    schema = _prediction_schema()
    return pa.table(
        [cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in schema], schema=schema
    )


def _ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as w:
        w.write_table(table)
    return sink.getvalue()


# -- 1. resume ------------------------------------------------------------------------------
def bench_resume(runs: Runs, sizes: Sizes) -> list[Row]:
    store, agent = runs.store, runs.agent
    n = sizes.runs

    def ours() -> int:
        found = 0
        for atoms, arm, rep in runs.jobs:
            slots = slot_ids(atoms, agent, arm, rep)
            got = store.refs.get_many([f"runs/slots/{s.hex()}" for s in slots])
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

    def ids_only() -> list[list[ObjectId]]:
        return [slot_ids(atoms, agent, arm, rep) for atoms, arm, rep in runs.jobs]

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

    t_ours, found = _median_time(ours, sizes.repeats)
    t_one, found_one = _median_time(one_by_one, sizes.repeats)
    if found != n or found_one != n:
        raise RuntimeError(f"resume found {found} and {found_one} of {n} slots")
    t_ids, ids = _median_time(ids_only, sizes.repeats)
    t_ids_def, ids_def = _median_time(ids_defined, sizes.repeats)
    if ids != ids_def:
        raise RuntimeError("slot_ids differ from the RunSlot record's hash")
    names = [f"runs/slots/{s.hex()}" for job in ids for s in job]
    if names[0] != slot_ref(ids[0][0]):
        raise RuntimeError("slot ref names differ from the harness's")
    t_get, got = _median_time(lambda: store.refs.get_many(names), sizes.repeats)
    keys = [name.encode() for name in names]
    backend = store.backend
    assert isinstance(backend, LMDBBackend)

    def raw_get() -> list[bytes | None]:
        with backend.env.begin(db=backend._refs) as txn:
            get = txn.get
            return [get(k) for k in keys]

    t_raw, raw = _median_time(raw_get, sizes.repeats)
    if [bytes(g) if g else None for g in got] != raw:
        raise RuntimeError("Refs.get_many differs from raw LMDB gets")
    run_ids = [g for g in got if g is not None]
    t_typed, done_typed = _median_time(
        lambda: sum(r.outcome == "answered" for _, r in store.get_many(run_ids, RunRecord)),
        sizes.repeats,
    )
    t_view, done_view = _median_time(
        lambda: sum(o == "answered" for o, _ in run_states(store, run_ids).values()),
        sizes.repeats,
    )
    if done_typed != n or done_view != n:
        raise RuntimeError(f"outcomes: {done_typed} and {done_view} of {n} runs answered")
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
            note=f"slot_ids + Refs.get_many per job ({len(runs.jobs)} jobs){reps}",
        ),
        Row(
            f"resume: {what}, slot ids alone",
            t_ids,
            "s",
            t_ids_def,
            "encode RunSlot + hash",
            note="slot_ids: the RunSlot bytes around the atom made once per job; same ids",
        ),
        Row(
            f"resume: {what}, Refs.get_many alone",
            t_get,
            "s",
            t_raw,
            "raw LMDB txn.get",
            note="names checked in one pass, one read transaction",
        ),
        Row(
            f"resume: {what}, then each run's outcome",
            t_view,
            "s",
            t_typed,
            "typed RunRecord reads",
            note="harness.run_states: verified bytes decoded as a view of outcome and attempt "
            "only; baseline: Store.get_many(runs, RunRecord)",
        ),
    ]


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

    def ours() -> FsckReport:
        return verify_closure(store, [runs.result])

    t_raw, bad = _median_time(raw, sizes.repeats)
    t_ours, report = _median_time(ours, sizes.repeats)
    if bad or not report.ok or report.objects != n:
        raise RuntimeError(f"audit: {bad} bad, report {report.objects} of {n}: {report.problems}")
    what = f"{sizes.runs:,} runs, {n:,} objects"
    rows = [
        Row(
            f"audit: verify_closure of a result ({what})",
            n / t_ours,
            "obj/s",
            300_000,
            "the spec's floor",
            target=1,
            note="re-hash, canonical check and links of every object of the closure",
        ),
        Row(
            "audit: verify_closure vs raw reads",
            n / t_ours,
            "obj/s",
            n / t_raw,
            "raw LMDB get + blake3",
            note="the same objects in walk order, one read transaction",
        ),
    ]
    verify_result = _optional("medomni_cas.audit.verify", "verify_result")
    if verify_result is not None:
        t_audit, _ = _median_time(lambda: verify_result(store, runs.result), sizes.repeats)
        rows.append(
            Row(
                "audit: medomni_cas.audit verify_result",
                n / t_audit,
                "obj/s",
                300_000,
                "the spec's floor",
                target=1,
            )
        )
    return rows


def _optional(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


# -- 2. scoring -----------------------------------------------------------------------------
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _hex_column(raw: np.ndarray) -> pa.Array:
    """64-character hex strings of the rows of a ``[n, 32]`` uint8 array."""
    n = len(raw)
    text = np.empty((n, 64), dtype=np.uint8)
    text[:, 0::2] = _HEX[raw >> 4]
    text[:, 1::2] = _HEX[raw & 15]
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 64).tobytes())
    return pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(text.tobytes())])


def _repeat(value: str | None, n: int) -> pa.Array:
    return pa.array([value], pa.string()).take(pa.array(np.zeros(n, dtype=np.int32)))


class ColumnTable(Record, kw_only=True):
    """A layout to compare, not what the harness writes: a table as one Arrow IPC blob per
    column. A reader reads only the columns it needs, and equal columns are one object: a
    job whose key columns are the answer key's own is joined by comparing two ids."""

    __kind__ = "bench.column-table"

    rows: int
    columns: dict[str, ObjectId]


@dataclass
class ScoreSet:
    store: mc.Store
    truth: ObjectId  # the answer key: a blob (Arrow IPC), or a tree of arm -> ColumnTable
    jobs: list[tuple[str, ObjectId]]  # (arm, PredictionTable or ColumnTable)
    rows: int


def _answer_key(sizes: Sizes) -> dict[str, tuple[pa.Table, np.ndarray]]:
    """Per arm: its atoms' answer key (one 6-class target, four pairs, sorted by pair) and
    the true class codes."""
    rng = np.random.default_rng(2)
    n = sizes.rows_per_job
    pairs = pa.array(
        np.array([f"synth-ehr_ckd-staging-{p}" for p in range(4)])[np.arange(n) * 4 // n]
    )
    out = {}
    for a in range(min(5, sizes.score_jobs)):
        arm = f"arm{a}"
        codes = rng.integers(0, len(CLASSES), n)
        table = pa.table(
            {
                "atom": _hex_column(rng.integers(0, 256, size=(n, 32), dtype=np.uint8)),
                "target": _repeat("ckd_stage", n),
                "truth_text": pa.array(CLASSES).take(pa.array(codes)),
                "pair": pairs,
                "config": _repeat("c0" * 32, n),
                "metric": _repeat("accuracy", n),
                "arm": _repeat(arm, n),
                "arm_variant": _repeat("", n),
            }
        )
        out[arm] = (table, codes)
    return out


def _job_tables(
    sizes: Sizes, key: dict[str, tuple[pa.Table, np.ndarray]]
) -> Iterator[tuple[str, pa.Table]]:
    """Each job's predictions as the harness writes them: one row per atom of its arm, in
    the set's order; ~70% right, 2% unanswered (null). The same tables on every call."""
    rng = np.random.default_rng(3)
    arms = list(key)
    n = sizes.rows_per_job
    for j in range(sizes.score_jobs):
        arm = arms[j % len(arms)]
        truth, truth_codes = key[arm]
        slot = _hex_column(rng.integers(0, 256, size=(n, 32), dtype=np.uint8))
        right = rng.random(n) < 0.7
        codes = np.where(right, truth_codes, rng.integers(0, len(CLASSES), n))
        answered = rng.random(n) >= 0.02
        cols = {
            "run_id": pc.binary_join_element_wise(slot, _repeat("1", n), "-"),
            "slot": slot,
            "atom": truth["atom"],
            "target": truth["target"],
            "value_text": pa.array(CLASSES).take(pa.array(codes, mask=~answered)),
            "value_num": pa.nulls(n, pa.float64()),
            "intelligence": _repeat("agent", n),
            "agent": _repeat(f"agent-{j // len(arms) % 4}", n),
            "arm": _repeat(arm, n),
            "arm_variant": _repeat("", n),
            "repetition": pa.array(np.full(n, 1 + j // (4 * len(arms)), dtype=np.int32)),
            "pair": truth["pair"],
            "config": truth["config"],
            "outcome": pa.array(np.where(answered, "answered", "malformed")),
            "attempt": pa.array(np.ones(n, dtype=np.int32)),
        }
        yield arm, _prediction_table(cols, n)


def build_scoring(path: Path, sizes: Sizes, layout: str) -> ScoreSet:
    """The jobs' tables in one ``layout``: "harness" (as the harness writes them: one Arrow
    IPC blob per job), "compact" (the same blob with low-cardinality columns dictionary-
    encoded, zstd-compressed) or "columns" (`ColumnTable`, dictionary-encoded)."""
    store = _open(path)
    key = _answer_key(sizes)
    if layout == "columns":
        truth = store.put_tree({arm: _put_columns(store, t) for arm, (t, _) in key.items()})
    else:
        truth = store.put_blob(_ipc(pa.concat_tables(t for t, _ in key.values())))
    jobs: list[tuple[str, ObjectId]] = []
    for arm, table in _job_tables(sizes, key):
        if layout == "columns":
            jobs.append((arm, _put_columns(store, table)))
            continue
        if layout == "compact":
            blob = store.put_blob(_ipc(_dictionary_encoded(table), "zstd"))
        else:
            blob = store.put_blob(_ipc(table))
        pt = PredictionTable(rows=table.num_rows, columns=PREDICTION_COLUMNS, table=blob)
        jobs.append((arm, store.put(pt)))
    return ScoreSet(store, truth, jobs, sizes.rows_per_job * sizes.score_jobs)


def _put_columns(store: mc.Store, table: pa.Table) -> ObjectId:
    # the answers stay plain strings: the scorer reads them as they are
    table = _dictionary_encoded(table, skip=("value_text",))
    columns = {name: store.put_blob(_ipc(table.select([name]))) for name in table.column_names}
    return store.put(ColumnTable(rows=table.num_rows, columns=columns))


#: Columns with a handful of values per job: dictionary-encoded in the compact format.
_LOW_CARDINALITY = (
    "target",
    "value_text",
    "intelligence",
    "agent",
    "arm",
    "arm_variant",
    "pair",
    "config",
    "outcome",
)


def _dictionary_encoded(table: pa.Table, skip: Sequence[str] = ()) -> pa.Table:
    for name in _LOW_CARDINALITY:
        i = table.schema.get_field_index(name)
        if i >= 0 and name not in skip:
            table = table.set_column(i, name, pc.dictionary_encode(table[name]))
    return table


def read_table(store: mc.Store, blob: ObjectId) -> pa.Table:
    """An Arrow IPC blob as a table: its chunks read in verified batches and joined into
    one buffer, which Arrow reads without copying."""
    data = store.get_raw(blob)
    if encoding.kind_of(data)[0] == encoding.BLOB:
        buf = encoding.blob_data(data)
    else:
        manifest = store.get(blob, ChunkedBlob)
        buf = b"".join(  # type: ignore[assignment]
            encoding.blob_data(raw)  # type: ignore[arg-type]
            for _, raw in store.get_raw_many(manifest.chunks)
        )
        if len(buf) != manifest.size:
            raise RuntimeError(f"blob {blob}: {len(buf)} of {manifest.size} bytes")
    return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()


def _plain(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col


@dataclass
class _ArmTruth:
    table: pa.Table  # this arm's rows, with a "row" number column
    groups: list[tuple[str, str, str, int, int]]  # (pair, target, metric, start, stop)


def _runs(table: pa.Table, names: Sequence[str]) -> list[tuple[tuple[Any, ...], int, int]]:
    """The runs of equal ``names`` values in ``table``'s order: ``(values, start, stop)``."""
    n = table.num_rows
    if n == 0:
        return []
    code = np.zeros(n, dtype=np.int64)
    for name in names:
        enc = pc.dictionary_encode(table[name]).combine_chunks()
        code = code * (len(enc.dictionary) + 1) + enc.indices.to_numpy(zero_copy_only=False)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(code)) + 1])
    stops = np.concatenate([starts[1:], [n]])
    firsts = table.select(list(names)).take(pa.array(starts)).to_pylist()
    return [
        (tuple(row[k] for k in names), int(a), int(b))
        for row, a, b in zip(firsts, starts, stops, strict=True)
    ]


def _grouped(table: pa.Table, names: Sequence[str]) -> tuple[pa.Table, list[Any]]:
    """``table`` with each group of equal ``names`` values in one run (sorted only when
    some group is split), and the runs."""
    runs = _runs(table, names)
    if len({values for values, _, _ in runs}) < len(runs):
        table = table.sort_by([(k, "ascending") for k in names])
        runs = _runs(table, names)
    return table, runs


def _arm_truths(truth: pa.Table) -> dict[tuple[str, str], _ArmTruth]:
    """The answer key split by (arm, variant) once, each part's (pair, target) groups as
    row ranges."""
    truth, arms = _grouped(truth, ["arm", "arm_variant"])
    out = {}
    for (arm, variant), start, stop in arms:
        part, groups = _grouped(truth.slice(start, stop - start), ["pair", "target", "metric"])
        part = part.append_column("row", pa.array(np.arange(part.num_rows)))
        out[(arm, variant)] = _ArmTruth(part, [(p, t, m, a, b) for (p, t, m), a, b in groups])
    return out


_PRED_COLUMNS = ["atom", "target", "value_text", "value_num", "config", "attempt"]


def _aligned(truth: pa.Table, preds: pa.Table) -> pa.Table | None:
    """``preds`` in the order of ``truth``'s rows when they have the same keys in the same
    order (a job's table lists the set's atoms in order), without a hash join."""
    if preds.num_rows != truth.num_rows:
        return None
    for key in ("atom", "target"):
        if not _plain(preds[key]).equals(truth[key]):
            return None
    return preds


Scores = list[tuple[int, str, str, float | None, int]]  # (job, pair, target, value, n)


def score_tables(
    store: mc.Store,
    truth_blob: ObjectId,
    jobs: Sequence[tuple[str, ObjectId]],
    *,
    by_position: bool = True,
) -> Scores:
    """What `score_jobs` computes from the columns, with ``n_boot=0``: per job, its rows
    joined with the answer key of its arm and scored per (pair, target). A job whose keys
    line up with the key's rows is joined by position (unless not ``by_position``); any
    other by the hash join score_jobs does."""
    truths = _arm_truths(read_table(store, truth_blob))
    out: Scores = []
    for j, (arm, pt_id) in enumerate(jobs):
        pt = store.get(pt_id, PredictionTable)
        preds = read_table(store, pt.table).select(_PRED_COLUMNS)
        part = truths[(arm, "")]
        aligned = _aligned(part.table, preds) if by_position else None
        if aligned is not None:
            out += _score_groups(j, part, part.table["truth_text"], aligned["value_text"])
        else:
            out += _score_groups(j, part, *_hash_join(part, preds))
    return out


def _hash_join(part: _ArmTruth, preds: pa.Table) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """The truth and answer columns of score_jobs's left outer join, in group order."""
    plain = pa.table([_plain(preds[c]) for c in _PRED_COLUMNS], names=_PRED_COLUMNS)
    joined = part.table.join(
        plain.rename_columns(
            ["atom", "target", "value_text", "value_num", "run_config", "attempt"]
        ),
        keys=["atom", "target"],
        join_type="left outer",
    ).sort_by("row")  # back in the key's order, which the groups' ranges index
    return joined["truth_text"], joined["value_text"]


def _score_groups(
    j: int, part: _ArmTruth, truth: pa.ChunkedArray, values: pa.ChunkedArray
) -> Scores:
    values = _plain(values)
    out: Scores = []
    for pair, target, metric, start, stop in part.groups:
        m = metric_score(
            metric, truth.slice(start, stop - start), values.slice(start, stop - start), n_boot=0
        )
        out.append((j, pair, target, m.value, m.n))
    return out


def _column(store: mc.Store, table: ColumnTable, name: str) -> pa.ChunkedArray:
    return read_table(store, table.columns[name])[name]


def score_columns(
    store: mc.Store, truth_tree: ObjectId, jobs: Sequence[tuple[str, ObjectId]]
) -> Scores:
    """`score_tables` on the `ColumnTable` layout: a job whose atom and target columns are
    the very objects of its arm's answer key is joined by position without reading them,
    so it reads one column, its answers; any other job reads its keys and is hash-joined."""
    keys: dict[str, tuple[ColumnTable, _ArmTruth]] = {}
    for arm, key_id in store.get(truth_tree).items():
        key = store.get(key_id, ColumnTable)
        names = ("atom", "target", "truth_text", "pair", "metric", "arm", "arm_variant")
        table = pa.table({n: _plain(_column(store, key, n)) for n in names})
        part = _arm_truths(table)[(arm, "")]
        if not part.table["atom"].equals(table["atom"]):
            raise RuntimeError(f"the answer key of {arm} does not keep its groups together")
        keys[arm] = (key, part)
    out: Scores = []
    for j, (arm, table_id) in enumerate(jobs):
        table = store.get(table_id, ColumnTable)
        key, part = keys[arm]
        if table.rows == key.rows and all(
            table.columns[c] == key.columns[c] for c in ("atom", "target")
        ):
            values = _column(store, table, "value_text")
            out += _score_groups(j, part, part.table["truth_text"], values)
        else:
            preds = pa.table({c: _column(store, table, c) for c in _PRED_COLUMNS})
            out += _score_groups(j, part, *_hash_join(part, preds))
    return out


def score_python(
    store: mc.Store, truth_blob: ObjectId, jobs: Sequence[tuple[str, ObjectId]]
) -> Scores:
    """The same scores by a plain-Python loop: a dict of the answer key, one lookup a row;
    a key row without an answer counts as wrong."""
    truth = read_table(store, truth_blob).to_pydict()
    key: dict[tuple[str, str, str], tuple[str, str]] = {}
    sizes: dict[tuple[str, str, str], int] = {}
    for arm, atom, target, text, pair in zip(
        truth["arm"],
        truth["atom"],
        truth["target"],
        truth["truth_text"],
        truth["pair"],
        strict=True,
    ):
        key[(arm, atom, target)] = (text, pair)
        sizes[(arm, pair, target)] = sizes.get((arm, pair, target), 0) + 1
    out: Scores = []
    for j, (arm, pt_id) in enumerate(jobs):
        pt = store.get(pt_id, PredictionTable)
        preds = read_table(store, pt.table).select(["atom", "target", "value_text"]).to_pydict()
        right: dict[tuple[str, str], int] = {}
        for atom, target, value in zip(
            preds["atom"], preds["target"], preds["value_text"], strict=True
        ):
            text, pair = key[(arm, atom, target)]
            right[(pair, target)] = right.get((pair, target), 0) + (value == text)
        for (a, pair, target), n in sorted(sizes.items()):
            if a == arm:
                out.append((j, pair, target, right.get((pair, target), 0) / n, n))
    return out


def bench_scoring(tmp: Path, sizes: Sizes) -> list[Row]:
    n_rows = sizes.score_jobs * sizes.rows_per_job
    reps = f", median of {sizes.repeats}" if sizes.repeats > 1 else ""
    what = f"{n_rows:,} rows"

    harness = build_scoring(tmp / "score-harness", sizes, "harness")
    store = harness.store
    t_ours, scores = _median_time(
        lambda: score_tables(store, harness.truth, harness.jobs), sizes.repeats
    )
    sub = harness.jobs[: sizes.python_jobs]
    sub_rows = sizes.python_jobs * sizes.rows_per_job
    first = [s for s in scores if s[0] < sizes.python_jobs]
    t_py, py_scores = _timed(lambda: score_python(store, harness.truth, sub))
    _check_same(first, py_scores, "the plain-Python loop")
    t_join, join_scores = _timed(lambda: score_tables(store, harness.truth, sub, by_position=False))
    _check_same(first, join_scores, "the hash join")
    blobs = [store.get(pt, PredictionTable).table for _, pt in harness.jobs]
    t_read, _ = _median_time(
        lambda: sum(read_table(store, b).num_rows for b in blobs), sizes.repeats
    )
    size = _table_bytes(harness)
    store.close()
    shutil.rmtree(tmp / "score-harness")

    rows = [
        Row(
            f"score: {what} from the store",
            n_rows / t_ours,
            "rows/s",
            20e6,
            "the spec's floor",
            target=1,
            note=f"{sizes.score_jobs} PredictionTables as the harness writes them "
            f"({size / n_rows:.0f} B/row): read, join, accuracy per pair{reps}",
        ),
        Row(
            f"score: {what} from the store",
            n_rows / t_ours,
            "rows/s",
            sub_rows / t_py,
            "plain-Python loop",
            note=f"the loop on {sub_rows:,} of the rows (a dict lookup per row), scaled",
        ),
        Row(
            f"score: {what}, reading the tables alone",
            n_rows / t_read,
            "rows/s",
            20e6,
            "the spec's floor",
            note=f"{size / 1e9:.2f} GB of Arrow IPC, every chunk re-hashed",
        ),
        Row(
            f"score: {sub_rows:,} rows by hash join",
            sub_rows / t_join,
            "rows/s",
            n_rows / t_ours,
            "joined by position",
            note="score_jobs's left outer join, for a job whose rows do not line up",
        ),
    ]
    for layout, note in (
        ("compact", "one blob a job, low-cardinality columns dictionary-encoded, zstd"),
        ("columns", "a blob per column (ColumnTable), key columns compared by id"),
    ):
        other = build_scoring(tmp / f"score-{layout}", sizes, layout)
        score = score_columns if layout == "columns" else score_tables
        t, got = _median_time(
            lambda: score(other.store, other.truth, other.jobs),  # noqa: B023
            sizes.repeats,
        )
        _check_same(scores, got, f"the {layout} layout")
        size = _table_bytes(other)
        if layout == "columns":
            read = _table_bytes(other, ["value_text"])
            note += f"; the scorer reads {read / n_rows:.1f} B/row (value_text)"
        rows.append(
            Row(
                f"score: {what}, {layout} layout",
                n_rows / t,
                "rows/s",
                20e6,
                "the spec's floor",
                target=1,
                note=f"{size / n_rows:.0f} B/row: {note}",
            )
        )
        other.store.close()
        shutil.rmtree(tmp / f"score-{layout}")
    return rows


def _table_bytes(scores: ScoreSet, columns: Sequence[str] | None = None) -> int:
    """The Arrow IPC bytes of every job's table (of its ``columns`` for a `ColumnTable`):
    what reading them reads."""
    store, total = scores.store, 0
    for _, job in scores.jobs:
        record = store.get(job)
        if isinstance(record, ColumnTable):
            blobs = [record.columns[c] for c in columns or record.columns]
        else:
            blobs = [record.table]
        total += sum(store.open_blob(b).size for b in blobs)
    return total


def _check_same(ours: Scores, other: Scores, what: str) -> None:
    def key(rows: Scores) -> list[tuple[int, str, str, float, int]]:
        return sorted((j, p, t, round(v or 0.0, 12), n) for j, p, t, v, n in rows)

    if key(ours) != key(other):
        raise RuntimeError(f"{what} scores differently: {key(ours)[:3]} vs {key(other)[:3]}")


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
            t, runs = _timed(lambda: build_runs(tmp / "runs", sizes))
            print(f"built {sizes.runs:,} runs ({runs.objects:,} objects) in {t:.0f} s")
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
