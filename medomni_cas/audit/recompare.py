"""Checking a comparison: its contrast rows computed again from its jobs, and its links.

The rule is the one `medomni_cas.audit.rederive` applies to results: nothing a `Comparison`
says about itself is trusted. Its rows are computed again from the jobs it links
(`medomni_cas.bench.contrasts.derive_comparison`, with its ``n_boot``, ``seed``, contrasts
and agents) and compared field by field; its task set, set build, answer keys and answer
columns with what the comparer gives; its Parquet table with its rows; and every job the
store records for the task set under an agent and an arm it compared must be among its
jobs (a job left out is named).

Floats are compared to 1e-9 of their size: the bootstrap's sums are matrix products, whose
last bits may depend on the BLAS library's order of summation; a forged value differs by
more than that.
"""

from __future__ import annotations

import io
import math
from typing import Any

import msgspec
import pyarrow.parquet as pq

from medomni_cas.audit._common import short
from medomni_cas.audit.rederive import ScoreCheck, ScoreProblem
from medomni_cas.bench.comparisons import Comparison, ContrastRow
from medomni_cas.bench.contrasts import (
    COMPARER,
    COMPARER_VERSION,
    derive_comparison,
    rows_table,
)
from medomni_cas.bench.records import AgentConfig, JobRecord
from medomni_cas.bench.refnames import JOB_REFS
from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_label

__all__ = ["check_comparison"]

_LISTED = 100
_FIELDS = ContrastRow.__struct_fields__


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def _row_name(r: ContrastRow) -> str:
    return f"{r.agent} {r.a} - {r.b} {r.pair} {r.target} {r.metric}"


def check_comparison(store: Store, cid: ObjectId, record: Comparison | None = None) -> ScoreCheck:
    """Compute ``cid``'s contrasts again and check its links; see the module docstring."""
    c = store.get(cid, Comparison) if record is None else record
    out = ScoreCheck([], [])

    def problem(kind: str, message: str, **kw: Any) -> None:
        out.problems.append(ScoreProblem(kind=kind, message=message, **kw))

    if (c.comparer, c.comparer_version) != (COMPARER, COMPARER_VERSION):
        problem(
            "scorer",
            f"compared by {c.comparer} {c.comparer_version}, which verify cannot compute "
            f"again (it computes {COMPARER} {COMPARER_VERSION})",
            field="comparer_version",
            recorded=f"{c.comparer} {c.comparer_version}",
        )
        return out
    _check_table(store, c, problem)
    try:
        d = derive_comparison(
            store, c.jobs, contrasts=c.asked, agents=c.agents, n_boot=c.n_boot, seed=c.seed
        )
    except MedomniError as e:
        problem("rows", f"contrasts cannot be computed again from the jobs: {e}")
        return out
    out.jobs = len(d.jobs)
    for name in ("task_set", "set_build"):
        mine, theirs = getattr(c, name), getattr(d, name)
        if mine != theirs:
            problem(
                "link",
                f"{name}: the comparison links {short(mine)}, its jobs give {short(theirs)}",
                field=name,
                recorded=mine.hex(),
                derived=theirs.hex(),
            )
    for name in ("jobs", "answer_keys", "answer_columns"):
        mine, theirs = list(getattr(c, name)), list(getattr(d, name))
        if sorted(mine) != sorted(theirs):
            problem(
                "link",
                f"{name}: the comparison links {len(mine)}, computing it again reads "
                f"{len(theirs)} ({', '.join(short(x) for x in set(mine) ^ set(theirs))} differ)",
                field=name,
                recorded=[x.hex() for x in mine],
                derived=[x.hex() for x in theirs],
            )
    _check_dropped(store, c, problem)
    _compare_rows(c.rows, d.rows, out, problem)
    return out


def _check_table(store: Store, c: Comparison, problem: Any) -> None:
    try:
        table = pq.read_table(io.BytesIO(store.read_blob(c.table)))
    except MedomniError as e:
        problem("table", f"table {short(c.table)} cannot be read: {e}", field="table")
        return
    except Exception as e:  # a blob that is no Parquet file, whatever pyarrow raises
        problem("table", f"table {short(c.table)} is not a Parquet table: {e}", field="table")
        return
    if not table.equals(rows_table(c.rows)):
        problem(
            "table",
            f"table {short(c.table)}: the Parquet table is not the comparison's rows",
            field="table",
        )


def _check_dropped(store: Store, c: Comparison, problem: Any) -> None:
    """Every job recorded for the task set, of an agent and an arm compared, is linked."""
    have = set(c.jobs)
    labels = {x for r in c.rows for x in (r.a, r.b)}
    agents = {r.agent for r in c.rows}
    for ref, jid in sorted(store.refs.items(JOB_REFS)):
        if jid in have:
            continue
        try:
            j = store.get(jid, JobRecord)
            agent = store.get(j.agent_config, AgentConfig).name
        except MedomniError:
            continue  # a damaged ref is `cas fsck`'s to name
        label = arm_label(j.arm, j.arm_variant)
        if j.task_set == c.task_set and label in labels and agent in agents:
            problem(
                "link",
                f"jobs: job {j.name} (agent {agent}, arm {label}, rep {j.repetition}) is "
                f"recorded ({ref}) but not in the comparison: left out of it, or run after "
                "it (compare again)",
                field="jobs",
                job=jid.hex(),
                derived=jid.hex(),
            )


def _compare_rows(
    mine: tuple[ContrastRow, ...], theirs: tuple[ContrastRow, ...], out: ScoreCheck, problem: Any
) -> None:
    out.rows = len(mine)
    by = {_row_name(r): r for r in theirs}
    listed = 0
    extra = 0
    for r in mine:
        d = by.pop(_row_name(r), None)
        if d is None:
            problem("row", f"row {_row_name(r)}: not a contrast its jobs give", row=_row_name(r))
            continue
        for f in _FIELDS:
            a, b = getattr(r, f), getattr(d, f)
            if _same(a, b):
                continue
            if listed >= _LISTED:
                extra += 1
                continue
            listed += 1
            problem(
                "row",
                f"row {_row_name(r)}: {f} is {a!r}, its jobs give {b!r}",
                row=_row_name(r),
                field=f,
                recorded=msgspec.to_builtins(a),
                derived=msgspec.to_builtins(b),
            )
    for name in by:
        problem("row", f"row {name}: its jobs give it, the comparison leaves it out", row=name)
    if extra:
        problem("row", f"... and {extra} more fields of rows differ")
    names = [_row_name(r) for r in mine]
    if not by and len(mine) == len(theirs) and names != [_row_name(r) for r in theirs]:
        problem("rows", "rows: not in the order the comparer gives them")
