"""Checking a result's score: its rows computed again from its jobs, and its links.

Re-hashing a result's closure proves its objects are the ones it links, not that its rows
are what those objects give: anyone can store a `Result` with a score of their choosing,
linking honest jobs, and move ``results/<set>`` to it. `check_score` trusts nothing the
result says about itself:

Rows
    Every row is computed again from the linked jobs' prediction columns and the answer
    keys (`medomni_cas.bench.scorer.derive`, with the result's scorer version, ``n_boot``
    and ``seed``) and compared field by field, exactly: the scorer is deterministic. The
    result's ``task_set``, ``set_build``, ``answer_keys`` and ``answer_columns`` are
    compared with what the scorer gives too, and the Parquet table (what results.parquet
    is made of) with the rows.
Links
    Every job must be of the result's task set and set build (a job swapped in from another
    set is named), no two jobs may share a key (agent config, arm label, repetition), and
    every job the store records for the task set (its ``runs/jobs/`` refs) under an agent
    config of the result, and an arm it scored, must have a job of its key in the result:
    a job left out (with or without its rows) is named. A job whose ref has moved on to a
    later record is a notice, not a problem: the store moved on after the score. A job the
    ref never pointed at, in a store whose harness made the ref, was made outside the
    harness: a problem.
Scorer versions
    `ROW_FIELDS` lists the row fields each scorer version wrote: a result is compared on
    its version's fields, and the fields added later must be at their defaults. A scorer
    or a version this library does not know is a problem (nothing can be re-derived).
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec
import pyarrow.parquet as pq

from medomni_cas.audit._common import arm_label, short
from medomni_cas.bench.records import AgentConfig, JobRecord, Result, ScoreRow
from medomni_cas.bench.refnames import JOB_REFS
from medomni_cas.bench.scorer import SCORER, SCORER_VERSIONS, Derived, derive, rows_table
from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.records import SetBuild, TaskSetRecord

__all__ = ["ROW_FIELDS", "ScoreCheck", "ScoreProblem", "check_score", "known_versions"]

_V1_0 = (
    "agent",
    "arm",
    "arm_variant",
    "pair",
    "target",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n",
    "n_missing",
    "config",
    "config_flag",
    "attempts",
)
_V1_1 = (
    *_V1_0,
    "task_set",
    "expected",
    "answered",
    "unanswered",
    "never_run",
    "partial",
    "runner",
    "isolation",
    "run_flag",
)
#: The `ScoreRow` fields each scorer version writes, oldest first: the one place that says
#: so. A new version adds its entry here when it adds fields.
ROW_FIELDS: dict[str, tuple[str, ...]] = {"1.0.0": _V1_0, "1.1.0": _V1_1}

#: Row problems listed one by one before the rest are counted (a forged seed changes every
#: interval of a large set).
_LISTED = 100


def known_versions() -> tuple[str, ...]:
    """The scorer versions this library can re-derive: those of `ROW_FIELDS` its scorer
    computes (`SCORER_VERSIONS`)."""
    return tuple(v for v in ROW_FIELDS if v in SCORER_VERSIONS)


class ScoreProblem(msgspec.Struct, kw_only=True):
    """One thing of a result that is not what its inputs give.

    ``kind``: ``scorer`` (a scorer or version not known), ``link`` (a job, task set, set
    build, answer key or answer columns link), ``result`` (a field of the result that
    follows from its rows: ``partial``), ``row`` (a row's field), ``rows`` (the rows
    as a whole: their order, or why they could not be computed), ``table`` (the Parquet
    table). ``row`` names the row (agent, arm label, pair, target, metric), ``field`` the
    field, ``recorded`` what the result says and ``derived`` what it should say (for
    ``table``: what the table says, and what the rows say)."""

    kind: str
    message: str
    field: str = ""
    row: str = ""
    job: str = ""
    recorded: Any = None
    derived: Any = None


@dataclasses.dataclass
class ScoreCheck:
    """What `check_score` found: ``rows`` compared, ``jobs`` re-derived from."""

    problems: list[ScoreProblem]
    notices: list[str]
    rows: int = 0
    jobs: int = 0


def check_score(store: Store, rid: ObjectId, result: Result | None = None) -> ScoreCheck:
    """Compute ``rid``'s rows again and check its links; see the module docstring."""
    res = store.get(rid, Result) if result is None else result
    out = ScoreCheck([], [])
    if res.scorer != SCORER:
        out.problems.append(
            ScoreProblem(
                kind="scorer",
                field="scorer",
                recorded=res.scorer,
                derived=SCORER,
                message=f"scored by {res.scorer!r}, a scorer verify does not know "
                f"(it knows {SCORER!r}): nothing can be re-derived",
            )
        )
        return out
    if res.scorer_version not in known_versions():
        out.problems.append(
            ScoreProblem(
                kind="scorer",
                field="scorer_version",
                recorded=res.scorer_version,
                message=f"scored by {SCORER} {res.scorer_version}, a version verify does not "
                f"know (it knows {', '.join(known_versions())}): nothing can be re-derived",
            )
        )
        return out
    _Checker(store, res, out).run()
    return out


_JobKey = tuple[ObjectId, ObjectId, str, int]  # task set, agent config, arm label, repetition


class _Checker:
    def __init__(self, store: Store, res: Result, out: ScoreCheck) -> None:
        self.store = store
        self.res = res
        self.out = out
        self.fields = ROW_FIELDS[res.scorer_version]
        self.agents: dict[ObjectId, str] = {}
        self.sets: dict[ObjectId, str] = {}

    # -- naming ---------------------------------------------------------------------------
    def agent(self, config: ObjectId) -> str:
        name = self.agents.get(config)
        if name is None:
            try:
                name = self.store.get(config, AgentConfig).name
            except MedomniError:
                name = f"config {short(config)}"  # what it is not, derive names
            self.agents[config] = name
        return name

    def job(self, job: JobRecord) -> str:
        label = arm_label(job.arm, job.arm_variant)
        agent = self.agent(job.agent_config)
        return f"job {job.name} (agent {agent}, arm {label}, rep {job.repetition})"

    def task_set(self, ts: ObjectId) -> str:
        name = self.sets.get(ts)
        if name is None:
            try:
                name = self.store.get(ts, TaskSetRecord).name
            except MedomniError:
                name = ""  # a link to something else: the id says it
            self.sets[ts] = name
        return f"task set {short(ts)}" + (f" ({name})" if name else "")

    def problem(self, kind: str, message: str, **kw: Any) -> None:
        self.out.problems.append(ScoreProblem(kind=kind, message=message, **kw))

    # -- the checks -----------------------------------------------------------------------
    def run(self) -> None:
        res = self.res
        self.check_table()
        records = []
        for i, jid in enumerate(res.jobs):
            try:
                records.append((jid, self.store.get(jid, JobRecord)))
            except MedomniError as e:
                self.problem("link", f"jobs[{i}]: {e}", field=f"jobs[{i}]", job=jid.hex())
        if len(records) < len(res.jobs):
            return  # links to what is not a job: nothing is re-derived from them
        basis = self.check_task_sets(records)
        self.check_set_build(records, basis)
        self.check_keys(records)
        self.check_dropped(records)
        mine = [jid for jid, j in records if j.task_set == basis]
        if not mine:
            self.problem("rows", "rows cannot be re-derived: the result links no job")
            return
        try:
            derived = derive(
                self.store,
                list(dict.fromkeys(mine)),  # a job listed twice is named above, scored once
                n_boot=res.n_boot,
                seed=res.seed,
                scorer_version=res.scorer_version,
                arms=res.arms,
            )
        except MedomniError as e:
            self.problem("rows", f"rows cannot be re-derived from the jobs: {e}")
            return
        self.out.jobs = len(set(mine))
        self.compare_result(derived)
        self.compare_rows(derived.rows)

    def check_task_sets(self, records: Sequence[tuple[ObjectId, JobRecord]]) -> ObjectId:
        """Each job of the result's task set; returns the task set the rows are derived on
        (the jobs' own, when every job names one other than the result's)."""
        res = self.res
        theirs = Counter(j.task_set for _, j in records)
        if records and res.task_set not in theirs and len(theirs) == 1:
            (basis,) = theirs
            self.problem(
                "link",
                f"task_set: the result links {self.task_set(res.task_set)}, but its jobs are "
                f"all of {self.task_set(basis)}",
                field="task_set",
                recorded=res.task_set.hex(),
                derived=basis.hex(),
            )
            return basis
        for i, (jid, j) in enumerate(records):
            if j.task_set != res.task_set:
                self.problem(
                    "link",
                    f"jobs[{i}]: {self.job(j)} is of {self.task_set(j.task_set)}, not the "
                    f"result's {self.task_set(res.task_set)}",
                    field=f"jobs[{i}]",
                    job=jid.hex(),
                    recorded=j.task_set.hex(),
                    derived=res.task_set.hex(),
                )
        return res.task_set

    def check_set_build(
        self, records: Sequence[tuple[ObjectId, JobRecord]], basis: ObjectId
    ) -> None:
        res = self.res
        try:
            built = self.store.get(res.set_build, SetBuild).task_set
        except MedomniError as e:
            self.problem("link", f"set_build {short(res.set_build)} is not a set build: {e}")
            return
        if built != basis:
            self.problem(
                "link",
                f"set_build: set build {short(res.set_build)} is a build of "
                f"{self.task_set(built)}, not of {self.task_set(basis)}",
                field="set_build",
                recorded=built.hex(),
                derived=basis.hex(),
            )
        for i, (jid, j) in enumerate(records):
            if j.task_set == basis and j.set_build != res.set_build:
                self.problem(
                    "link",
                    f"jobs[{i}]: {self.job(j)} ran on set build {short(j.set_build)}, not the "
                    f"result's {short(res.set_build)}",
                    field=f"jobs[{i}]",
                    job=jid.hex(),
                    recorded=j.set_build.hex(),
                    derived=res.set_build.hex(),
                )

    def check_keys(self, records: Sequence[tuple[ObjectId, JobRecord]]) -> None:
        by: dict[_JobKey, list[tuple[ObjectId, JobRecord]]] = {}
        for jid, j in records:
            by.setdefault(_key(j), []).append((jid, j))
        for same in by.values():
            if len(same) > 1:
                j = same[0][1]
                label = arm_label(j.arm, j.arm_variant)
                names = ", ".join(f"job {r.name} ({short(jid)})" for jid, r in same)
                self.problem(
                    "link",
                    f"jobs: {len(same)} jobs of one key (agent {self.agent(j.agent_config)}, "
                    f"arm {label}, rep {j.repetition}): {names}",
                    field="jobs",
                    job=same[0][0].hex(),
                    recorded=[jid.hex() for jid, _ in same],
                )

    def check_dropped(self, records: Sequence[tuple[ObjectId, JobRecord]]) -> None:
        """Every job the store records for the result's task set, under an agent config of
        the result, has a job of its key in the result."""
        res = self.res
        have = {_key(j): jid for jid, j in records}
        configs = {j.agent_config for _, j in records}
        for ref, jid in sorted(self.store.refs.items(JOB_REFS)):
            try:
                j = self.store.get(jid, JobRecord)
            except MedomniError:
                continue  # a damaged ref is `cas fsck`'s to name
            if j.task_set != res.task_set or j.agent_config not in configs:
                continue
            if res.arms and arm_label(j.arm, j.arm_variant) not in res.arms:
                continue  # an arm the user did not score (``--arm``)
            kept = have.get(_key(j))
            if kept is None:
                self.problem(
                    "link",
                    f"jobs: {self.job(j)} of {self.task_set(j.task_set)} is recorded ({ref}) "
                    "but not in the result: left out of it, or run after it was scored "
                    "(score again)",
                    field="jobs",
                    job=jid.hex(),
                    derived=jid.hex(),
                )
            elif kept != jid:
                self.check_earlier(ref, jid, kept, j)

    def check_earlier(self, ref: str, now: ObjectId, kept: ObjectId, j: JobRecord) -> None:
        """A result's job of a key whose ref has moved on: an earlier record of the ref (a
        notice), unless the ref's whole history is here and never held it."""
        history = self.store.refs.history(ref)
        if any(e.new == kept for e in history):
            self.out.notices.append(
                f"{self.job(j)}: the result has an earlier record of it ({short(kept)}); "
                f"{ref} has moved on to {short(now)}"
            )
            return
        # the harness made the ref in this store: every record of the job went through it
        # (a ref that came by a pull or a bundle has only the history from then on)
        whole = bool(history) and history[0].old is None and history[0].message.startswith("job ")
        if whole:
            self.problem(
                "link",
                f"jobs: the result's job {short(kept)} is of the key of {self.job(j)}, but no "
                f"harness recorded it: {ref} never pointed at it",
                field="jobs",
                job=kept.hex(),
                recorded=kept.hex(),
                derived=now.hex(),
            )
        else:
            self.out.notices.append(
                f"{self.job(j)}: the result has another record of it ({short(kept)}), which "
                f"{ref} has not pointed at since its history here begins"
            )

    def compare_result(self, d: Derived) -> None:
        res = self.res
        # the task set and set build are the links' checks, job by job
        for f in dataclasses.fields(Derived):
            if f.name in ("rows", "task_set", "set_build") or not hasattr(res, f.name):
                continue
            mine, theirs = getattr(res, f.name), getattr(d, f.name)
            if mine == theirs:
                continue
            self.problem(
                "link",
                f"{f.name}: the result links {_ids(mine)}, the jobs give {_ids(theirs)}",
                field=f.name,
                recorded=_hexed(mine),
                derived=_hexed(theirs),
            )
        # partial: whether some row has a slot never run (scorers before coverage: never)
        partial = any(r.partial for r in d.rows) if "partial" in self.fields else False
        if res.partial != partial:
            self.problem(
                "result",
                f"partial: the result says {res.partial}, its rows say {partial}",
                field="partial",
                recorded=res.partial,
                derived=partial,
            )

    def compare_rows(self, derived: Sequence[ScoreRow]) -> None:
        recorded = self.res.rows
        self.out.rows = len(recorded)
        problems: list[ScoreProblem] = []
        newer = [f for f in ScoreRow.__struct_fields__ if f not in self.fields]
        defaults = _defaults()
        mine, theirs = _by_key(recorded), _by_key(derived)
        for key in dict.fromkeys([*theirs, *mine]):
            a, b = mine.get(key, []), theirs.get(key, [])
            total = max(len(a), len(b))
            for i in range(total):
                name = _row_name(key, i, total)
                if i >= len(b):
                    problems.append(
                        ScoreProblem(
                            kind="row",
                            row=name,
                            message=f"row ({name}) is in the result, but the jobs give no such row",
                        )
                    )
                    continue
                if i >= len(a):
                    problems.append(
                        ScoreProblem(
                            kind="row",
                            row=name,
                            message=f"row ({name}) is what the jobs give, but the result "
                            "does not have it",
                        )
                    )
                    continue
                r, d = a[i], b[i]
                for f in self.fields:
                    x, y = getattr(r, f), getattr(d, f)
                    if not _same(x, y):
                        problems.append(
                            ScoreProblem(
                                kind="row",
                                row=name,
                                field=f,
                                recorded=x,
                                derived=y,
                                message=f"row ({name}): {f} recorded {_fmt(x)}, "
                                f"re-derived {_fmt(y)}",
                            )
                        )
                for f in newer:
                    x = getattr(r, f)
                    if not _same(x, defaults[f]):
                        problems.append(
                            ScoreProblem(
                                kind="row",
                                row=name,
                                field=f,
                                recorded=x,
                                derived=defaults[f],
                                message=f"row ({name}): {f} is {_fmt(x)}, but scorer "
                                f"{self.res.scorer_version} writes no {f}",
                            )
                        )
        if not problems and [_row_key(r) for r in recorded] != [_row_key(r) for r in derived]:
            problems.append(
                ScoreProblem(kind="rows", message="rows are not in the order the scorer writes")
            )
        self.out.problems += _counted(problems, "rows differ")

    def check_table(self) -> None:
        """The Parquet table holds the rows: every column it has, and every column of the
        scorer version, row for row."""
        res = self.res
        try:
            table = pq.read_table(io.BytesIO(self.store.read_blob(res.table)))
        except (MedomniError, OSError, ValueError) as e:
            self.problem("table", f"table {short(res.table)} is not a Parquet table: {e}")
            return
        expected = rows_table(res.rows)
        if table.num_rows != len(res.rows):
            self.problem(
                "table",
                f"table {short(res.table)} has {table.num_rows} rows, the result {len(res.rows)}",
                recorded=table.num_rows,
                derived=len(res.rows),
            )
            return
        missing = [f for f in self.fields if f not in table.column_names]
        extra = [c for c in table.column_names if c not in expected.column_names]
        if missing or extra:
            what = [f"no column {', '.join(missing)}"] if missing else []
            what += [f"columns no row has: {', '.join(extra)}"] if extra else []
            self.problem("table", f"table {short(res.table)}: {'; '.join(what)}")
        problems: list[ScoreProblem] = []
        keys = [_row_key(r) for r in res.rows]
        totals = Counter(keys)
        for col in table.column_names:
            if col in extra:
                continue
            got, want = table.column(col).to_pylist(), expected.column(col).to_pylist()
            seen: Counter[tuple[str, ...]] = Counter()
            for i, (x, y) in enumerate(zip(got, want, strict=True)):
                key = keys[i]
                seen[key] += 1
                if _same(x, y):
                    continue
                name = _row_name(key, seen[key] - 1, totals[key])
                problems.append(
                    ScoreProblem(
                        kind="table",
                        row=name,
                        field=col,
                        recorded=x,
                        derived=y,
                        message=f"table row {i} ({name}): {col} is {_fmt(x)} in the Parquet "
                        f"table, {_fmt(y)} in the result's rows",
                    )
                )
        self.out.problems += _counted(problems, "table cells differ")


# -- helpers -------------------------------------------------------------------------------
def _key(job: JobRecord) -> _JobKey:
    return (job.task_set, job.agent_config, arm_label(job.arm, job.arm_variant), job.repetition)


def _row_key(r: ScoreRow) -> tuple[str, ...]:
    return (r.agent, arm_label(r.arm, r.arm_variant), r.pair, r.target, r.metric)


def _by_key(rows: Sequence[ScoreRow]) -> dict[tuple[str, ...], list[ScoreRow]]:
    out: dict[tuple[str, ...], list[ScoreRow]] = {}
    for r in rows:
        out.setdefault(_row_key(r), []).append(r)
    return out


def _row_name(key: tuple[str, ...], i: int, total: int) -> str:
    agent, arm, pair, target, metric = key
    name = f"agent {agent}, arm {arm}, pair {pair}, target {target}, metric {metric}"
    # rows of repetitions share every named field: say which of them
    return name + (f", #{i + 1} of {total}" if total > 1 else "")


def _defaults() -> dict[str, Any]:
    out = {}
    for f in msgspec.structs.fields(ScoreRow):
        if f.default is not msgspec.NODEFAULT:
            out[f.name] = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            out[f.name] = f.default_factory()
    return out


def _same(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    if isinstance(x, dict) and isinstance(y, list | tuple):  # a map column read back
        return sorted(x.items()) == sorted(map(tuple, y))
    if isinstance(y, dict) and isinstance(x, list | tuple):
        return _same(y, x)
    return x == y


def _fmt(v: object) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def _ids(v: object) -> str:
    if isinstance(v, ObjectId):
        return short(v)
    if isinstance(v, tuple | list):
        return "(" + ", ".join(_ids(x) for x in v) + ")"
    return _fmt(v)


def _hexed(v: object) -> Any:
    if isinstance(v, ObjectId):
        return v.hex()
    if isinstance(v, tuple | list):
        return [_hexed(x) for x in v]
    return v


def _counted(problems: list[ScoreProblem], what: str) -> list[ScoreProblem]:
    if len(problems) <= _LISTED:
        return problems
    rest = len(problems) - _LISTED
    more = ScoreProblem(kind=problems[-1].kind, message=f"... and {rest} more {what}")
    return [*problems[:_LISTED], more]
