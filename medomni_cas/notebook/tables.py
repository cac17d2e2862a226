"""The notebook's tables: task sets, atom tasks, runs, predictions and score rows, from records.

Each builder reads only what the records hold and returns a ``pyarrow.Table`` of one of
Bench's schemas (`medomni_cas.bench.schemas`). Ids are full lowercase hex, so tables join
on them. `to_pandas` keeps the types: integers stay integers where a value is missing,
times are timestamps, and lists and maps are list and map columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec
import pyarrow as pa

from medomni_cas._extras import require
from medomni_cas.bench.records import AgentConfig, JobRecord, RunRecord
from medomni_cas.bench.refnames import JOB_REFS
from medomni_cas.bench.schemas import (
    ATOM_SCHEMA,
    JOB_COLUMNS,
    PREDICTION_TABLE_SCHEMA,
    RESULT_COLUMNS,
    RESULT_TABLE_SCHEMA,
    RUN_SCHEMA,
    SCORES_TYPE,
    TASK_SET_SCHEMA,
)
from medomni_cas.bench.scorer import prediction_table
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.records import AtomTask, BuildResult, SetBuild, SetEntry, TaskSetRecord
from medomni_cas.studio.refnames import SET_BUILD_REFS, TASK_SET_REFS, set_build_ref

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "Job",
    "Names",
    "atoms_table",
    "concat",
    "jobs",
    "predictions_table",
    "prepend",
    "results_table",
    "runs_table",
    "task_sets_table",
    "to_pandas",
]


# -- shared --------------------------------------------------------------------------------------
def concat(tables: list[pa.Table], empty: pa.Schema) -> pa.Table:
    if not tables:
        return empty.empty_table()
    return pa.concat_tables(tables, promote_options="default")


def prepend(table: pa.Table, columns: list[tuple[str, pa.DataType]], values: list[str]) -> pa.Table:
    """``table`` with a constant column in front for each of ``columns``."""
    for i, ((name, typ), value) in enumerate(zip(columns, values, strict=True)):
        table = table.add_column(i, pa.field(name, typ), pa.array([value] * table.num_rows, typ))
    return table


def _pandas_type(typ: pa.DataType) -> object:
    import pandas as pd

    if pa.types.is_integer(typ):
        # pandas' own int64 has no missing value: a column with one would turn into floats
        return pd.api.types.pandas_dtype(str(typ).replace("int", "Int"))
    if pa.types.is_list(typ) or pa.types.is_map(typ):
        return pd.ArrowDtype(typ)  # a list a row (NumPy arrays otherwise)
    return None  # pandas' default: text as str, timestamps as datetime64


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """A DataFrame of the same types (pandas is imported only now: the notebook extra)."""
    require("pandas", "notebook", "notebook tables")
    return table.to_pandas(types_mapper=_pandas_type)


def _columns(schema: pa.Schema, rows: Iterable[dict[str, object]]) -> pa.Table:
    cols: dict[str, list[object]] = {f.name: [] for f in schema}
    for row in rows:
        for k, v in row.items():
            cols[k].append(v)
    return pa.table(cols, schema=schema)


def _time(text: str) -> datetime:
    """A run's ISO-8601 time (UTC, to the millisecond)."""
    return datetime.fromisoformat(text)


def _local_time(text: str) -> datetime:
    """A cohort's time as the dataset wrote it: without a zone, or in UTC when it had one."""
    t = datetime.fromisoformat(text)
    return t if t.tzinfo is None else t.astimezone(UTC).replace(tzinfo=None)


# -- names (records are immutable: cached by id) -------------------------------------------------
class Names:
    """The names of task sets and agent configs by id, each read once."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._sets: dict[ObjectId, str] = {}
        self._agents: dict[ObjectId, str] = {}

    def sets(self, ids: Iterable[ObjectId]) -> dict[ObjectId, str]:
        want = [i for i in dict.fromkeys(ids) if i not in self._sets]
        for oid, rec in self.store.get_many(want, TaskSetRecord):
            self._sets[oid] = rec.name
        return self._sets

    def agents(self, ids: Iterable[ObjectId]) -> dict[ObjectId, str]:
        want = [i for i in dict.fromkeys(ids) if i not in self._agents]
        for oid, rec in self.store.get_many(want, AgentConfig):
            self._agents[oid] = rec.name
        return self._agents


# -- task sets -----------------------------------------------------------------------------------
def task_sets_table(store: Store) -> pa.Table:
    """One row per recorded task set (``tasksets/…``) with its latest build
    (``studio/sets/…``): name, task set hash, builder, arms, pairs, entries built."""
    refs = dict(store.refs.items(TASK_SET_REFS))
    builds = dict(store.refs.items(SET_BUILD_REFS))
    records = dict(store.get_many(dict.fromkeys(refs.values()), TaskSetRecord))
    set_builds = dict(store.get_many(dict.fromkeys(builds.values()), SetBuild))

    def rows() -> Iterable[dict[str, object]]:
        for ref in sorted(refs):
            name = ref.removeprefix(TASK_SET_REFS)
            rid = refs[ref]
            rec = records[rid]
            sb_id = builds.get(set_build_ref(name))
            sb = set_builds.get(sb_id) if sb_id is not None else None
            if sb is not None and sb.task_set != rid:
                sb_id, sb = None, None  # built before the set last grew
            yield {
                "name": name,
                "task_set": rid.hex(),
                "builder": rec.builder,
                "arms": list(rec.arms),
                "pairs": [f"{p.task} (N={p.n})" for p in rec.pairs],
                "build": sb_id.hex() if sb_id is not None else None,
                "entries": len(sb.entries) if sb is not None else 0,
                "built": sb is not None,
            }

    return _columns(TASK_SET_SCHEMA, rows())


def atoms_table(store: Store, entries: Sequence[SetEntry]) -> pa.Table:
    """One row per atom task of a set build's entries: pair, version, arm, variant, patient,
    atom id, config hash, prediction time, families staged and the pair's build."""
    results = dict(store.get_many([e.result for e in entries], BuildResult))
    ids = [a for e in entries for a in results[e.result].atoms]
    atoms = dict(store.get_many(dict.fromkeys(ids), AtomTask))
    rows = (
        {
            "pair": e.pair,
            "version": e.version,
            "arm": e.arm,
            "arm_variant": e.arm_variant,
            "patient": atoms[aid].patient,
            "atom": aid.hex(),
            "config": e.config.hex(),
            "prediction_time": _local_time(atoms[aid].prediction_time),
            "families": list(atoms[aid].families),
            "build": e.result.hex(),
        }
        for e in entries
        for aid in results[e.result].atoms
    )
    return _columns(ATOM_SCHEMA, rows)


# -- jobs, runs and predictions ------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """A recorded job with the names of its task set and agent config."""

    id: ObjectId
    record: JobRecord
    set_name: str
    agent: str


def jobs(
    store: Store, names: Names, set_name: str | None, agent: str | Sequence[str] | None
) -> list[Job]:
    """Every job (``runs/jobs/…``), optionally of one task set (by name: every version of
    it) and some agents, in (set, agent, arm, variant, repetition, start) order."""
    ids = [jid for _, jid in store.refs.items(JOB_REFS)]
    records = dict(store.get_many(dict.fromkeys(ids), JobRecord))
    sets = names.sets(r.task_set for r in records.values())
    agents = names.agents(r.agent_config for r in records.values())
    wanted = {agent} if isinstance(agent, str) else set(agent) if agent else None
    found = [
        Job(jid, r, sets[r.task_set], agents[r.agent_config])
        for jid, r in records.items()
        if (set_name is None or sets[r.task_set] == set_name)
        and (wanted is None or agents[r.agent_config] in wanted)
    ]
    return sorted(
        found,
        key=lambda j: (
            j.set_name,
            j.agent,
            j.record.arm,
            j.record.arm_variant,
            j.record.repetition,
            j.record.started,
        ),
    )


def runs_table(store: Store, jobs: Sequence[Job]) -> pa.Table:
    """The final run of every slot of ``jobs``, one row each."""

    def rows() -> Iterable[dict[str, object]]:
        for job in jobs:
            j = job.record
            for rid, run in store.get_many(j.runs, RunRecord):
                block = run.agent_block
                yield {
                    "set": job.set_name,
                    "task_set": j.task_set.hex(),
                    "job": j.name,
                    "job_id": job.id.hex(),
                    "agent": job.agent,
                    "agent_config": j.agent_config.hex(),
                    "arm": j.arm,
                    "arm_variant": j.arm_variant,
                    "repetition": j.repetition,
                    "pair": run.pair,
                    "task_version": run.task_version,
                    "config": run.config.hex(),
                    "atom": run.atom.hex(),
                    "run_id": run.run_id,
                    "record": rid.hex(),
                    "outcome": run.outcome,
                    "attempt": run.attempt,
                    "runner": run.runner,
                    "environment": run.environment,
                    "isolation": run.isolation,
                    "served_model": run.served_model,
                    "started": _time(run.started),
                    "finished": _time(run.finished),
                    "elapsed_ms": run.elapsed_ms,
                    "cost_usd": run.cost_usd,
                    "tokens_in": run.tokens_in,
                    "tokens_out": run.tokens_out,
                    "encoder_calls": block.encoder_calls,
                    "meets_arm": block.meets_arm,
                    "errors": list(run.errors),
                }

    return _columns(RUN_SCHEMA, rows())


_SCORES = msgspec.json.Decoder(dict[str, float])


def _scores_map(column: pa.ChunkedArray) -> pa.Array:
    """The stored JSON text of class probabilities as a map column."""
    return pa.array(
        [None if text is None else _SCORES.decode(text) for text in column.to_pylist()],
        SCORES_TYPE,
    )


def predictions_table(store: Store, jobs: Sequence[Job]) -> pa.Table:
    """Every job's prediction table, one after the other, with the set and job in front:
    one blob read per job, never one per prediction."""
    tables = []
    for job in jobs:
        table = prediction_table(store, job.record)
        i = table.schema.get_field_index("scores")
        table = table.set_column(i, pa.field("scores", SCORES_TYPE), _scores_map(table["scores"]))
        tables.append(prepend(table, JOB_COLUMNS, [job.set_name, job.record.name, job.id.hex()]))
    return concat(tables, PREDICTION_TABLE_SCHEMA)


# -- results -------------------------------------------------------------------------------------
def results_table(results: Iterable[tuple[str, ObjectId, ObjectId, pa.Table]]) -> pa.Table:
    """Score rows of (set name, result id, task set, rows) one after the other, in
    `RESULT_TABLE_SCHEMA` (rows of older scorers get the columns they lacked, null)."""
    tables = []
    for name, rid, task_set, rows in results:
        if "task_set" in rows.column_names:  # the rows' own (scorer 1.1.0): the result's too
            rows = rows.drop_columns(["task_set"])
        tables.append(prepend(rows, RESULT_COLUMNS, [name, rid.hex(), task_set.hex()]))
    if not tables:
        return RESULT_TABLE_SCHEMA.empty_table()
    return pa.concat_tables(
        [_conform(t, RESULT_TABLE_SCHEMA) for t in tables], promote_options="none"
    )


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``'s columns and order, a column it lacks null throughout."""
    n = table.num_rows
    columns = [
        table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)
