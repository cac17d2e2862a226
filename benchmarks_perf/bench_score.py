"""The scoring part of ``python -m benchmarks_perf bench``: `score_jobs` over 10M rows.

A set build of five arms x four pairs (one 6-class target, accuracy), with the records the
scorer reads (set build, build configs and results, contents, answer keys; the atoms are
ids only, the scorer never reads them), and 100 jobs of 100,000 rows (four agents x five
repetitions per arm, ~70% right, 2% unanswered) whose predictions are stored the way the
harness stores them: `PredictionColumns` in the arm's key order, the key columns made by
`ArmRows.arrays`, so they are the answer columns' own objects.

Timed, each against the spec's floor of 20M rows/s:

* ``score_jobs(..., n_boot=0)`` on every job once the arms' answer columns are kept (the
  second and later scores of a set), median of three;
* the first score, which also derives the answer columns from the answer keys;
* a plain-Python loop on a tenth of the jobs (a dict of the answers, a lookup per row),
  scaled: the ratio row;
* older jobs, whose predictions are one Arrow blob each (`PredictionTable`): joined on
  (atom, target), on a tenth of the jobs.

Every way's scores are checked equal to the others'.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import medomni_cas as mc
from benchmarks_perf._table import Row
from benchmarks_perf._timing import median_time, timed
from medomni_cas.bench.columns import (
    PREDICTION_COLUMNS,
    answer_columns,
    arm_rows,
    put_columns,
    read_column,
    read_predictions,
)
from medomni_cas.bench.records import (
    AgentConfig,
    JobRecord,
    Limits,
    PredictionColumns,
    PredictionTable,
    ScoreRow,
)
from medomni_cas.bench.refnames import answers_ref
from medomni_cas.bench.scorer import score_jobs
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.encoding import encode
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.studio.records import (
    AnswerKey,
    BuildConfig,
    BuildResult,
    Content,
    SetBuild,
    SetEntry,
)

CLASSES = ("G1", "G2", "G3a", "G3b", "G4", "G5")
PAIRS = 4
ARMS = 5
AGENTS = 4


class ScoreSizes(Protocol):
    score_jobs: int
    rows_per_job: int
    python_jobs: int
    repeats: int


@dataclass
class ScoreSet:
    store: mc.Store
    set_build: ObjectId
    jobs: list[ObjectId]
    rows: int


#: Makes a build's atoms: (store, pair, arm, its patients) -> their ids, in order.
Atoms = Callable[[mc.Store, str, str, tuple[str, ...]], list[ObjectId]]


def _ids(rng: np.random.Generator, n: int) -> list[ObjectId]:
    """``n`` random ids from one draw (a draw an id costs more than the rest of a row)."""
    data = rng.bytes(32 * n)
    return [ObjectId(data[i : i + 32]) for i in range(0, len(data), 32)]


def _hex_column(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` random 64-character hex strings (a slot id each), made in one go."""
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 64).tobytes())
    text = pa.py_buffer(rng.bytes(32 * n).hex().encode())
    return pa.Array.from_buffers(pa.string(), n, [None, offsets, text])


def put_written(store: mc.Store, records: list[mc.Record]) -> list[ObjectId]:
    """Records whose links are ids only, written straight to the backend in one batch:
    the store's own encoding and ids, without `Store.put`'s link check (the links are
    ids only) or `Store.put_raw`'s re-validation of the bytes this process just encoded,
    and one transaction for many objects rather than one each (what made a 10M-row world
    take over 30 minutes to build)."""
    items = []
    for r in records:
        data = encode(r)
        items.append((hash_bytes(data), data))
    for i in range(0, len(items), 10_000):
        store.backend.put_many(items[i : i + 10_000])
    return [oid for oid, _ in items]


def _put_linking_ids(store: mc.Store, record: mc.Record) -> ObjectId:
    """A record whose links are ids only (atoms, which the scorer never reads): put as
    raw bytes, the plumbing that trusts its caller, as `Store.put` refuses what links an
    object that is not stored."""
    return store.put_raw(encode(record))


def _set_build(
    store: mc.Store,
    sizes: ScoreSizes,
    rng: np.random.Generator,
    atoms: Atoms | None = None,
) -> ObjectId:
    """Four pairs (contents and answer keys shared by the arms) under five arms. ``atoms``
    makes each (store, pair, arm)'s atoms (the comparer reads them); else atoms are
    ids."""
    per_pair = sizes.rows_per_job // PAIRS
    entries = []
    shared = []
    for p in range(PAIRS):
        pair = f"synth-ehr_ckd-staging-{p}@n{per_pair}"
        patients = tuple(f"p{p}-{i:06d}" for i in range(per_pair))
        truth = rng.integers(0, len(CLASSES), per_pair)
        content = store.put(
            Content(
                dataset="synth-ehr",
                dataset_release="1",
                pair=pair,
                patients=patients,
                evidence={},
                prediction_times={},
            )
        )
        key = store.put(
            AnswerKey(
                content=content,
                targets=("ckd_stage",),
                values={
                    pt: {"ckd_stage": CLASSES[c]} for pt, c in zip(patients, truth, strict=True)
                },
            )
        )
        shared.append((pair, content, key, patients))
    for a in range(ARMS):
        arm = f"arm{a}"
        for pair, content, key, patients in shared:
            config = store.put(
                BuildConfig(
                    pair=pair,
                    version="1.0",
                    builder="bench",
                    builder_version="1",
                    medomni_release="0.3.0",
                    dataset="synth-ehr",
                    dataset_release="1",
                    template={},
                    targets=({"label": "ckd_stage", "metric": "accuracy"},),
                    cohort={},
                    labels={},
                    arm=arm,
                    arm_definition={},
                )
            )
            result = BuildResult(
                pair=pair,
                version="1.0",
                arm=arm,
                config=config,
                content=content,
                answer_key=key,
                atoms=tuple(
                    _ids(rng, len(patients)) if atoms is None else atoms(store, pair, arm, patients)
                ),
            )
            entries.append(
                SetEntry(
                    pair=pair,
                    version="1.0",
                    arm=arm,
                    config=config,
                    result=_put_linking_ids(store, result),
                )
            )
    # the scorer links the task set from its result, so it is stored (as a stand-in blob)
    task_set = store.put_blob(b"the task set of the scoring benchmark")
    return store.put(SetBuild(task_set=task_set, entries=tuple(entries)))


def build_scoring(path: Path, sizes: ScoreSizes, atoms: Atoms | None = None) -> ScoreSet:
    """The set build and ``score_jobs`` jobs of predictions, in the harness's layout
    (``atoms``: see `_set_build`)."""
    store = mc.Store(LMDBBackend(path, durable=False))
    rng = np.random.default_rng(2)
    sb = _set_build(store, sizes, rng, atoms)
    record = store.get(sb, SetBuild)
    agents = [
        store.put(
            AgentConfig(
                name=f"agent-{i}",
                kind="agent",
                agent="bench",
                model="none",
                route="local",
                scaffold="bench",
                served_model="none",
                limits=Limits(),
            )
        )
        for i in range(AGENTS)
    ]
    keys = {}
    for a in range(ARMS):
        key = arm_rows(store, sb, f"arm{a}")
        # the truth, as codes, from the answer keys (what a job gets right depends on it)
        truth = []
        for g in key.groups:
            values = store.get(g.answer_key, AnswerKey).values
            patients = store.get(g.content, Content).patients
            truth += [CLASSES.index(values[p]["ckd_stage"]) for p in patients]
        # each row's build config, as the harness records it (the same for every job)
        config = pc.dictionary_encode(pa.array([g.entry.config.hex() for g, _ in key.row_atoms()]))
        keys[key.arm] = (key, np.array(truth), config)
    jobs = []
    n = sizes.rows_per_job
    for j in range(sizes.score_jobs):
        arm = f"arm{j % ARMS}"
        key, truth_codes, config = keys[arm]
        right = rng.random(n) < 0.7
        codes = np.where(right, truth_codes, rng.integers(0, len(CLASSES), n))
        answered = rng.random(n) >= 0.02
        slots = _hex_column(rng, n)
        cols = {
            **key.arrays,
            "run_id": pc.binary_join_element_wise(slots, pa.scalar("1"), "-"),
            "slot": slots,
            "value_text": pa.array(CLASSES).take(pa.array(codes, mask=~answered)),
            "intelligence": pa.array(["agent"] * n),
            "config": config,
            "outcome": pa.array(np.where(answered, "answered", "malformed")),
            "attempt": pa.array(np.ones(n, dtype=np.int32)),
        }
        table = store.put(PredictionColumns(rows=n, columns=put_columns(store, cols)))
        jobs.append(
            store.put(
                JobRecord(
                    name=f"job-{j}",
                    task_set=record.task_set,
                    set_build=sb,
                    agent_config=agents[j // ARMS % AGENTS],
                    arm=arm,
                    repetition=1 + j // (ARMS * AGENTS),
                    runner="bench",
                    runs=(),
                    attempts=n,
                    predictions=table,
                    started="2026-11-30T00:00:00.000+00:00",
                )
            )
        )
    return ScoreSet(store, sb, jobs, n * sizes.score_jobs)


def _as_one_blob(store: mc.Store, job_id: ObjectId) -> ObjectId:
    """The job again with its predictions as one Arrow blob, as jobs were written before."""
    job = store.get(job_id, JobRecord)
    table = read_predictions(store, job)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    pt = PredictionTable(
        rows=table.num_rows,
        columns=PREDICTION_COLUMNS,
        table=store.put_blob(sink.getvalue().to_pybytes()),
    )
    return store.put(msgspec.structs.replace(job, predictions=store.put(pt)))


def score_python(store: mc.Store, jobs: list[ObjectId]) -> list[tuple[str, str, str, float, int]]:
    """Accuracy per (job, pair, target) by a plain-Python loop: a dict of the answers, one
    lookup a row (an unanswered row counts as wrong)."""
    out = []
    truth: dict[str, dict[tuple[str, str], tuple[str, str]]] = {}
    for job_id in jobs:
        job = store.get(job_id, JobRecord)
        key = truth.get(job.arm)
        if key is None:
            _, answers = answer_columns(store, job.set_build, job.arm)
            cols = {
                c: read_column(store, answers.columns[c], c).to_pylist()
                for c in ("atom", "target", "pair", "truth_text")
            }
            key = truth[job.arm] = {
                (a, t): (p, v)
                for a, t, p, v in zip(
                    cols["atom"], cols["target"], cols["pair"], cols["truth_text"], strict=True
                )
            }
        preds = store.get(job.predictions, PredictionColumns)
        atoms, targets, values = (
            read_column(store, preds.columns[c], c).to_pylist()
            for c in ("atom", "target", "value_text")
        )
        right: dict[tuple[str, str], int] = {}
        count: dict[tuple[str, str], int] = {}
        for atom, target, value in zip(atoms, targets, values, strict=True):
            pair, text = key[(atom, target)]
            right[(pair, target)] = right.get((pair, target), 0) + (value == text)
            count[(pair, target)] = count.get((pair, target), 0) + 1
        out += [(job.name, p, t, right[(p, t)] / c, c) for (p, t), c in sorted(count.items())]
    return out


def _scores(rows: tuple[ScoreRow, ...]) -> list[tuple[Any, ...]]:
    """Score rows in a comparable form, sorted."""
    return sorted((r.agent, r.arm, r.pair, r.target, round(r.value or 0.0, 12), r.n) for r in rows)


def _check(ours: list[tuple[Any, ...]], other: list[tuple[Any, ...]], what: str) -> None:
    if ours != other:
        raise RuntimeError(f"{what} scores differently: {ours[:2]} vs {other[:2]}")


def bench_scoring(tmp: Path, sizes: ScoreSizes) -> list[Row]:
    path = tmp / "score"
    t_build, s = timed(lambda: build_scoring(path, sizes))
    store, n_rows = s.store, s.rows
    print(f"built {len(s.jobs)} jobs of {sizes.rows_per_job:,} rows in {t_build:.0f} s")
    os.sync()  # written with durable=False: flushed now, not by the kernel while timing
    what = f"{n_rows:,} rows"
    reps = f", median of {sizes.repeats}" if sizes.repeats > 1 else ""

    t_cold, first = timed(lambda: score_jobs(store, s.jobs, n_boot=0, allow_partial=True))
    arms = min(ARMS, len(s.jobs))
    for a in range(arms):  # the answer columns are kept
        assert store.refs.get(answers_ref(s.set_build, f"arm{a}")) is not None
    t_warm, scored = median_time(
        lambda: score_jobs(store, s.jobs, n_boot=0, allow_partial=True), sizes.repeats
    )
    if scored.result != first.result:
        raise RuntimeError("a second score gave another result")

    sub = s.jobs[: sizes.python_jobs]
    sub_rows = sizes.python_jobs * sizes.rows_per_job
    t_py, py = timed(lambda: score_python(store, sub))
    # the jobs hold columns, not runs (partial to the scorer), of these arms only
    sub_arms = sorted({f"arm{j % ARMS}" for j in range(sizes.python_jobs)})
    sub_scored = score_jobs(store, sub, n_boot=0, allow_partial=True, arms=sub_arms)
    ours = sorted(
        (r.pair, r.target, round(r.value or 0.0, 12), r.n) for r in sub_scored.record.rows
    )
    theirs = sorted((p, t, round(v, 12), n) for _, p, t, v, n in py)
    _check(ours, theirs, "the plain-Python loop")

    older = [_as_one_blob(store, j) for j in sub]
    t_join, joined = median_time(
        lambda: score_jobs(store, older, n_boot=0, allow_partial=True, arms=sub_arms),
        sizes.repeats,
    )
    _check(_scores(joined.record.rows), _scores(sub_scored.record.rows), "the join")

    read = 0
    for j in s.jobs:
        preds = store.get(store.get(j, JobRecord).predictions, PredictionColumns)
        read += store.open_blob(preds.columns["value_text"]).size
        read += store.open_blob(preds.columns["attempt"]).size
        status = preds.columns.get("status") or preds.columns["outcome"]
        read += store.open_blob(status).size
    whole = 0
    for j in sub:
        preds = store.get(store.get(j, JobRecord).predictions, PredictionColumns)
        whole += sum(store.open_blob(b).size for b in preds.columns.values())
    store.close()
    shutil.rmtree(path)
    return [
        Row(
            f"score: {what} from the store",
            n_rows / t_warm,
            "rows/s",
            20e6,
            "the spec's floor",
            target=1,
            note=f"score_jobs(n_boot=0) over {len(s.jobs)} jobs' PredictionColumns, answer "
            f"columns kept{reps}: reads {read / n_rows:.1f} B/row (answers, attempts, slot "
            f"states) of {whole / sub_rows:.0f}",
        ),
        Row(
            f"score: {what} from the store",
            n_rows / t_warm,
            "rows/s",
            sub_rows / t_py,
            "plain-Python loop",
            note=f"the loop on {sub_rows:,} of the rows (a dict lookup per row), scaled",
        ),
        Row(
            f"score: {what}, first score of the set",
            n_rows / t_cold,
            "rows/s",
            20e6,
            "the spec's floor",
            target=1,
            note=f"also derives the {arms} arms' answer columns from the answer keys "
            f"({arms * sizes.rows_per_job:,} answers)",
        ),
        Row(
            f"score: {sub_rows:,} rows of older jobs",
            sub_rows / t_join,
            "rows/s",
            n_rows / t_warm,
            "lined up by id",
            note="predictions as one Arrow blob a job (PredictionTable): joined on "
            f"(atom, target){reps}",
        ),
    ]
