"""The scorer: prediction records and answer keys -> a `Result`, as pyarrow columns.

Reads each job's `PredictionTable` (one Arrow table per job, not one object per prediction)
and the answer keys of the set's build, joins them on (atom, target), and scores each
(agent, arm, rung, pair, target) with the metric its template names, with a percentile
bootstrap interval. An atom with no valid answer counts against the agent (see
`medomni_cas.bench.metrics` for how each metric treats it).

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

from medomni_cas.bench.metrics import score as metric_score
from medomni_cas.bench.records import (
    AgentConfig,
    JobRecord,
    PredictionTable,
    Result,
    ScoreRow,
)
from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.records import AnswerKey, AtomTask, BuildConfig, BuildResult, SetBuild

__all__ = [
    "SCORER",
    "SCORER_VERSION",
    "ScoreError",
    "Scored",
    "jobs_of",
    "prediction_table",
    "result_ref",
    "score_jobs",
    "write_results",
]

SCORER = "medomni-scorer"
SCORER_VERSION = "1.0.0"


class ScoreError(MedomniError, ValueError):
    """Jobs that cannot be scored together, or nothing to score."""


def result_ref(set_name: str) -> str:
    return f"results/{set_name}"


def prediction_table(store: Store, job: JobRecord) -> pa.Table:
    """A job's predictions as an Arrow table (read from one blob)."""
    pt = store.get(job.predictions, PredictionTable)
    data = store.read_blob(pt.table)
    return pa.ipc.open_stream(pa.BufferReader(data)).read_all()


def jobs_of(
    store: Store, task_set: ObjectId, agents: Sequence[str] | None = None
) -> list[ObjectId]:
    """Every recorded job of ``task_set`` (optionally of some agents), in a stable order."""
    out = []
    for _, jid in sorted(store.refs.items("runs/jobs/")):
        job = store.get(jid, JobRecord)
        if job.task_set != task_set:
            continue
        if agents:
            name = store.get(job.agent_config, AgentConfig).name
            if name not in agents:
                continue
        out.append(jid)
    return out


@dataclass(frozen=True)
class _Truth:
    table: pa.Table  # atom, target, truth_text, truth_num, pair, config, metric, arm, variant
    answer_keys: list[ObjectId]


def _truth(store: Store, set_build: ObjectId) -> _Truth:
    sb = store.get(set_build, SetBuild)
    cols: dict[str, list[object]] = {
        k: []
        for k in (
            "atom",
            "target",
            "truth_text",
            "truth_num",
            "pair",
            "config",
            "metric",
            "arm",
            "arm_variant",
        )
    }
    keys: dict[ObjectId, AnswerKey] = {}
    configs: dict[ObjectId, BuildConfig] = {}
    for e in sb.entries:
        result = store.get(e.result, BuildResult)
        key = keys.get(result.answer_key)
        if key is None:
            key = keys[result.answer_key] = store.get(result.answer_key, AnswerKey)
        cfg = configs.get(e.config)
        if cfg is None:
            cfg = configs[e.config] = store.get(e.config, BuildConfig)
        metric = {t["label"]: t["metric"] for t in cfg.targets}
        for aid, atom in store.get_many(result.atoms, AtomTask):
            truth = key.values.get(atom.patient, {})
            for target, m in metric.items():
                v = truth.get(target)
                cols["atom"].append(aid.hex())
                cols["target"].append(target)
                cols["truth_text"].append(v if isinstance(v, str) else None)
                cols["truth_num"].append(float(v) if isinstance(v, int | float) else None)
                cols["pair"].append(e.pair)
                cols["config"].append(e.config.hex())
                cols["metric"].append(m)
                cols["arm"].append(e.arm)
                cols["arm_variant"].append(e.arm_variant)
    schema = pa.schema([(k, pa.float64() if k == "truth_num" else pa.string()) for k in cols])
    return _Truth(pa.table(cols, schema=schema), list(keys))


@dataclass(frozen=True)
class Scored:
    result: ObjectId
    record: Result
    table: pa.Table


def score_jobs(
    store: Store,
    jobs: Sequence[ObjectId],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    set_name: str | None = None,
) -> Scored:
    """Score ``jobs`` (all of one task set) into a stored `Result`."""
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
    builds = {r.set_build for r in records}
    set_build = records[-1].set_build
    truth = _truth(store, set_build)
    names = {r.agent_config: store.get(r.agent_config, AgentConfig).name for r in records}
    rows: list[ScoreRow] = []
    for job_id, job in zip(jobs, records, strict=True):
        if job.set_build not in builds:
            continue
        preds = prediction_table(store, job)
        if "scores" not in preds.column_names:  # tables written before scores were kept
            preds = preds.append_column("scores", pa.nulls(preds.num_rows, pa.string()))
        t = truth.table.filter(
            pc.and_(
                pc.equal(truth.table["arm"], job.arm),
                pc.equal(truth.table["arm_variant"], job.arm_variant),
            )
        )
        joined = t.join(
            preds.select(
                ["atom", "target", "value_text", "value_num", "config", "attempt", "scores"]
            ).rename_columns(
                ["atom", "target", "value_text", "value_num", "run_config", "attempt", "scores"]
            ),
            keys=["atom", "target"],
            join_type="left outer",
        )
        rows += _rows(joined, names[job.agent_config], job, n_boot, seed)
        del job_id
    rows = sorted(_flag(rows), key=lambda r: (r.agent, r.arm, r.arm_variant, r.pair, r.target))
    table = _rows_table(rows)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    result = Result(
        task_set=records[0].task_set,
        set_build=set_build,
        jobs=tuple(jobs),
        answer_keys=tuple(truth.answer_keys),
        scorer=SCORER,
        scorer_version=SCORER_VERSION,
        n_boot=n_boot,
        seed=seed,
        rows=tuple(rows),
        table=store.put_blob(sink.getvalue()),
    )
    rid = store.put(result)
    if set_name is not None:
        ref = result_ref(set_name)
        if store.refs.get(ref) != rid:
            store.refs.update(ref, lambda _old: rid, message="score")
    return Scored(rid, result, table)


def _rows(joined: pa.Table, agent: str, job: JobRecord, n_boot: int, seed: int) -> list[ScoreRow]:
    out = []
    groups = joined.group_by(["pair", "target", "metric"]).aggregate([]).to_pylist()
    for g in sorted(groups, key=lambda g: (g["pair"], g["target"])):
        mask = pc.and_(pc.equal(joined["pair"], g["pair"]), pc.equal(joined["target"], g["target"]))
        part = joined.filter(mask)
        numeric = part["truth_num"].null_count < part.num_rows
        truth = part["truth_num"] if numeric else part["truth_text"]
        pred = part["value_num"] if numeric else part["value_text"]
        m = metric_score(g["metric"], truth, pred, n_boot=n_boot, seed=seed)
        configs = sorted(
            set(part["config"].to_pylist())
            | {c for c in part["run_config"].to_pylist() if c is not None}
        )
        attempts = pc.sum(part["attempt"]).as_py() or 0
        out.append(
            ScoreRow(
                agent=agent,
                arm=job.arm,
                arm_variant=job.arm_variant,
                pair=g["pair"],
                target=g["target"],
                metric=g["metric"],
                value=m.value,
                ci_low=m.ci_low,
                ci_high=m.ci_high,
                n=m.n,
                n_missing=m.n_missing,
                config=configs[0],
                config_flag=(
                    f"runs of {len(configs)} config hashes: " + ", ".join(c[:12] for c in configs)
                    if len(configs) > 1
                    else ""
                ),
                attempts=int(attempts),
            )
        )
        if not numeric:
            auroc = _auroc_row(part, agent, job, g, n_boot, seed, out[-1])
            if auroc is not None:
                out.append(auroc)
    return out


def _auroc_row(
    part: pa.Table, agent: str, job: JobRecord, g: dict, n_boot: int, seed: int, base: ScoreRow
) -> ScoreRow | None:
    """AUROC from the class probabilities agents gave (rows without them count as missing)."""
    given = [None if s is None else msgspec.json.decode(s) for s in part["scores"].to_pylist()]
    if not any(given):
        return None
    truth = part["truth_text"].to_pylist()
    classes = sorted({c for c in truth if c is not None} | {c for s in given if s for c in s})
    matrix = np.full((len(given), len(classes)), np.nan)
    for i, s in enumerate(given):
        if s:
            matrix[i] = [float(s.get(c, 0.0)) for c in classes]
    m = metric_score("auroc", part["truth_text"], None, matrix, classes, n_boot=n_boot, seed=seed)
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


def _rows_table(rows: list[ScoreRow]) -> pa.Table:
    fields = ScoreRow.__struct_fields__
    data = {f: [getattr(r, f) for r in rows] for f in fields}
    types = {
        "value": pa.float64(),
        "ci_low": pa.float64(),
        "ci_high": pa.float64(),
        "n": pa.int64(),
        "n_missing": pa.int64(),
        "attempts": pa.int64(),
    }
    return pa.table({f: pa.array(data[f], type=types.get(f, pa.string())) for f in fields})


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
