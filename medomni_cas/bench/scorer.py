"""The scorer: prediction records and answer keys -> a `Result`, as pyarrow columns.

Reads each job's predictions as columns (`medomni_cas.bench.columns`), never one object per
prediction, against its arm's `AnswerColumns` (derived from the answer keys once and kept):
a job whose atom and target columns are the answers' own objects lines up row for row and
only its answer column is read; any other (a `PredictionTable` of older jobs, say) is
joined on (atom, target). Each (agent, arm, rung, pair, target) is scored with the metric
its template names, with a percentile bootstrap interval. An atom with no valid answer
counts against the agent (see `medomni_cas.bench.metrics` for how each metric treats it).

Jobs of different task sets are never put in one table (a clear error). A row whose runs
were built under more than one config hash, or whose config hash differs from another
agent's row for the same pair and arm, is flagged in ``config_flag``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medomni_cas.bench.columns import (
    Truths,
    answer_columns,
    read_column,
    read_or_nulls,
    read_predictions,
)
from medomni_cas.bench.metrics import score as metric_score
from medomni_cas.bench.records import (
    AgentConfig,
    AnswerColumns,
    JobRecord,
    PredictionColumns,
    Result,
    ScoreRow,
)
from medomni_cas.bench.refnames import JOB_REFS, result_ref
from medomni_cas.bench.schemas import SCORE_SCHEMA
from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

__all__ = [
    "SCORER",
    "SCORER_VERSION",
    "ScoreError",
    "Derived",
    "Scored",
    "derive",
    "jobs_of",
    "prediction_table",
    "rows_table",
    "score_jobs",
    "write_results",
]

SCORER = "medomni-scorer"
SCORER_VERSION = "1.0.0"


class ScoreError(MedomniError, ValueError):
    """Jobs that cannot be scored together, or nothing to score."""


def prediction_table(store: Store, job: JobRecord) -> pa.Table:
    """A job's predictions as one Arrow table (see `read_predictions`)."""
    return read_predictions(store, job)


def jobs_of(
    store: Store, task_set: ObjectId, agents: Sequence[str] | None = None
) -> list[ObjectId]:
    """Every recorded job of ``task_set`` (optionally of some agents), in a stable order."""
    out = []
    for _, jid in sorted(store.refs.items(JOB_REFS)):
        job = store.get(jid, JobRecord)
        if job.task_set != task_set:
            continue
        if agents:
            name = store.get(job.agent_config, AgentConfig).name
            if name not in agents:
                continue
        out.append(jid)
    return out


@dataclass
class _Answers:
    """An arm's answer columns as the scorer reads them: truth once, key columns if a job
    needs joining."""

    id: ObjectId
    record: AnswerColumns
    truth_text: pa.Array
    truth_num: pa.Array
    _key: pa.Table | None = None

    def key(self, store: Store) -> pa.Table:
        """``atom``, ``target`` and each row's number, for joining a job that does not line up."""
        if self._key is None:
            cols = self.record.columns
            self._key = pa.table(
                {
                    "atom": read_column(store, cols["atom"], "atom"),
                    "target": read_column(store, cols["target"], "target"),
                    "row": pa.array(np.arange(self.record.rows, dtype=np.int64)),
                }
            )
        return self._key


def _answers(
    store: Store, set_build: ObjectId, arm: str, arm_variant: str, truths: Truths
) -> _Answers:
    aid, record = answer_columns(store, set_build, arm, arm_variant, truths)
    cols, n = record.columns, record.rows
    return _Answers(
        aid,
        record,
        read_or_nulls(store, cols, "truth_text", n, pa.string()),
        read_or_nulls(store, cols, "truth_num", n, pa.float64()),
    )


@dataclass
class _Predictions:
    """A job's columns in its arm's answer rows; None where the job has none."""

    value_text: pa.Array | None
    value_num: pa.Array | None
    attempt: pa.Array | None
    scores: pa.Array | None
    config: pa.Array | None  # the runs' config hashes; None when they are the key's own


def _predictions(store: Store, job: JobRecord, answers: _Answers) -> _Predictions:
    """Read only what the answers' groups score: a job whose key columns are the answers'
    own objects lines up row for row; any other is joined on (atom, target)."""
    record = store.get(job.predictions)
    key = answers.record
    if (
        isinstance(record, PredictionColumns)
        and record.rows == key.rows
        and all(record.columns.get(c) == key.columns[c] for c in ("atom", "target"))
    ):
        # only the columns the groups score (text targets: answers and class probabilities)
        numeric = any(g.numeric for g in key.groups)
        text = not all(g.numeric for g in key.groups)

        def column(name: str, needed: bool) -> pa.Array | None:
            blob = record.columns.get(name) if needed else None
            return None if blob is None else read_column(store, blob, name)

        return _Predictions(
            column("value_text", text),
            column("value_num", numeric),
            column("attempt", True),
            column("scores", text),
            None,
        )
    table = read_predictions(store, job)
    joined = answers.key(store).join(
        table.select(["atom", "target", "value_text", "value_num", "attempt", "scores", "config"]),
        keys=["atom", "target"],
        join_type="left outer",
    )
    if joined.num_rows != key.rows:
        raise ScoreError(f"job {job.name}: its predictions list some (atom, target) more than once")
    joined = joined.sort_by("row")  # back in the answers' order, which the groups index

    def joined_column(name: str) -> pa.Array:
        return joined[name].combine_chunks()

    return _Predictions(
        joined_column("value_text"),
        joined_column("value_num"),
        joined_column("attempt"),
        joined_column("scores"),
        joined_column("config"),
    )


@dataclass(frozen=True)
class Scored:
    result: ObjectId
    record: Result
    table: pa.Table


@dataclass(frozen=True)
class Derived:
    """A score as the scorer computes it from jobs, before anything is stored: what
    `score_jobs` stores as a `Result`, and what ``audit verify`` computes again to compare."""

    task_set: ObjectId
    set_build: ObjectId
    rows: tuple[ScoreRow, ...]
    answer_keys: tuple[ObjectId, ...]
    answer_columns: tuple[ObjectId, ...]


def derive(
    store: Store,
    jobs: Sequence[ObjectId],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    scorer_version: str = SCORER_VERSION,
) -> Derived:
    """Score ``jobs`` (all of one task set) without storing a result (the answer columns it
    needs are made and kept, as they are derived objects)."""
    if not jobs:
        raise ScoreError("no jobs to score: run the set first (`medomni bench run`)")
    records = [store.get(j, JobRecord) for j in jobs]
    sets = {r.task_set for r in records}
    if len(sets) > 1:
        raise ScoreError(
            "these jobs come from different task sets ("
            + ", ".join(sorted(s.hex()[:12] for s in sets))
            + "); scores of different task set hashes are never put in one table"
        )
    names = {r.agent_config: store.get(r.agent_config, AgentConfig).name for r in records}
    answers: dict[tuple[ObjectId, str, str], _Answers] = {}
    truths: Truths = {}  # answer keys read for one arm, for the next
    rows: list[ScoreRow] = []
    for job in records:
        arm = (job.set_build, job.arm, job.arm_variant)
        if arm not in answers:
            answers[arm] = _answers(store, *arm, truths)
        preds = _predictions(store, job, answers[arm])
        rows += _rows(answers[arm], preds, names[job.agent_config], job, n_boot, seed)
    rows = sorted(_flag(rows), key=lambda r: (r.agent, r.arm, r.arm_variant, r.pair, r.target))
    answer_keys = dict.fromkeys(k for a in answers.values() for k in a.record.answer_keys)
    return Derived(
        task_set=records[0].task_set,
        set_build=records[-1].set_build,
        rows=tuple(rows),
        answer_keys=tuple(answer_keys),
        answer_columns=tuple(a.id for a in answers.values()),
    )


def score_jobs(
    store: Store,
    jobs: Sequence[ObjectId],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    set_name: str | None = None,
) -> Scored:
    """Score ``jobs`` (all of one task set) into a stored `Result`."""
    d = derive(store, jobs, n_boot=n_boot, seed=seed)
    table = rows_table(d.rows)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    result = Result(
        task_set=d.task_set,
        set_build=d.set_build,
        jobs=tuple(jobs),
        answer_keys=d.answer_keys,
        scorer=SCORER,
        scorer_version=SCORER_VERSION,
        n_boot=n_boot,
        seed=seed,
        rows=d.rows,
        table=store.put_blob(sink.getvalue()),
        answer_columns=d.answer_columns,
    )
    rid = store.put(result)
    if set_name is not None:
        ref = result_ref(set_name)
        if store.refs.get(ref) != rid:
            store.refs.update(ref, lambda _old: rid, message="score")
    return Scored(rid, result, table)


def _rows(
    answers: _Answers, preds: _Predictions, agent: str, job: JobRecord, n_boot: int, seed: int
) -> list[ScoreRow]:
    out = []
    for g in sorted(answers.record.groups, key=lambda g: (g.pair, g.target)):
        n = g.stop - g.start
        if g.numeric:
            truth, pred = answers.truth_num, preds.value_num
        else:
            truth, pred = answers.truth_text, preds.value_text
        truth = truth.slice(g.start, n)
        pred = pa.nulls(n, truth.type) if pred is None else pred.slice(g.start, n)
        m = metric_score(g.metric, truth, pred, n_boot=n_boot, seed=seed)
        configs = {g.config.hex()}
        if preds.config is not None:
            configs |= {c for c in pc.unique(preds.config.slice(g.start, n)).to_pylist() if c}
        ordered = sorted(configs)
        attempts = 0
        if preds.attempt is not None:
            attempts = pc.sum(preds.attempt.slice(g.start, n)).as_py() or 0
        out.append(
            ScoreRow(
                agent=agent,
                arm=job.arm,
                arm_variant=job.arm_variant,
                pair=g.pair,
                target=g.target,
                metric=g.metric,
                value=m.value,
                ci_low=m.ci_low,
                ci_high=m.ci_high,
                n=m.n,
                n_missing=m.n_missing,
                config=ordered[0],
                config_flag=(
                    f"runs of {len(ordered)} config hashes: " + ", ".join(c[:12] for c in ordered)
                    if len(ordered) > 1
                    else ""
                ),
                attempts=int(attempts),
            )
        )
        scores = preds.scores
        if not g.numeric and scores is not None:
            scores = scores.slice(g.start, n)
            if scores.null_count < n:
                out.append(_auroc_row(truth, scores, n_boot, seed, out[-1]))
    return out


def _auroc_row(
    truth: pa.Array, scores: pa.Array, n_boot: int, seed: int, base: ScoreRow
) -> ScoreRow:
    """AUROC from the class probabilities agents gave (rows without them count as missing)."""
    given = [None if s is None else msgspec.json.decode(s) for s in scores.to_pylist()]
    labels = truth.to_pylist()
    classes = sorted({c for c in labels if c is not None} | {c for s in given if s for c in s})
    matrix = np.full((len(given), len(classes)), np.nan)
    for i, s in enumerate(given):
        if s:
            matrix[i] = [float(s.get(c, 0.0)) for c in classes]
    m = metric_score("auroc", truth, None, matrix, classes, n_boot=n_boot, seed=seed)
    return msgspec.structs.replace(
        base,
        metric="auroc",
        value=m.value,
        ci_low=m.ci_low,
        ci_high=m.ci_high,
        n=m.n,
        n_missing=m.n_missing,
    )


def _flag(rows: list[ScoreRow]) -> list[ScoreRow]:
    """Flag rows whose config hash differs from another row of the same pair and arm."""
    by: dict[tuple[str, str, str, str], set[str]] = {}
    for r in rows:
        by.setdefault((r.arm, r.arm_variant, r.pair, r.target), set()).add(r.config)
    out = []
    for r in rows:
        others = by[(r.arm, r.arm_variant, r.pair, r.target)] - {r.config}
        if others and not r.config_flag:
            flag = "config hash differs from other rows: " + ", ".join(
                c[:12] for c in sorted(others)
            )
            r = msgspec.structs.replace(r, config_flag=flag)
        out.append(r)
    return out


def rows_table(rows: Sequence[ScoreRow]) -> pa.Table:
    """A result's rows as the table its Parquet blob holds (`SCORE_SCHEMA`)."""
    data = {f: [getattr(r, f) for r in rows] for f in SCORE_SCHEMA.names}
    return pa.table(data, schema=SCORE_SCHEMA)


def write_results(scored: Scored, folder: Path) -> tuple[Path, Path]:
    """``results.json`` and ``results.parquet`` in ``folder`` (the result id in both)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "result": scored.result.hex(),
        "task_set": scored.record.task_set.hex(),
        "scorer": f"{scored.record.scorer} {scored.record.scorer_version}",
        "n_boot": scored.record.n_boot,
        "seed": scored.record.seed,
        "rows": msgspec.to_builtins(scored.record.rows),
    }
    j = folder / "results.json"
    j.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    p = folder / "results.parquet"
    meta = {b"medomni.result": scored.result.hex().encode()}
    pq.write_table(scored.table.replace_schema_metadata(meta), p)
    return j, p
