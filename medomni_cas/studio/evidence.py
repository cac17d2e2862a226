"""Cohort selection and each patient's evidence files, for Build.

A cohort is every eligible patient in a seeded hash order, taken per class, so a smaller
cohort with the same rules is within a larger one (n20 within n50), and with ``selection:
nested`` its first patients. A patient's evidence is every row strictly before the
prediction time (as `labels` reads "before") minus the targets' guards, as JSON lines with
the table's column order, plus each array family's row as a ``.npy`` v1.0 file: the same
data gives the same bytes anywhere.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import zarr

from medomni_cas.studio.arrays import open_array_group
from medomni_cas.studio.errors import BuildError
from medomni_cas.studio.folders import TemplateFolder
from medomni_cas.studio.labels import Guard, Recipe, Value
from medomni_cas.studio.schema import Cohort

__all__ = [
    "BuildError",
    "Selection",
    "evidence_files",
    "rows_before",
    "select_cohort",
    "where_mask",
]

_JSON = msgspec.json.Encoder()
_SORTED = msgspec.json.Encoder(order="sorted")


def where_mask(table: pa.Table, where: dict[str, Any]) -> pa.ChunkedArray | pa.Array:
    mask: Any = pa.array(np.ones(table.num_rows, dtype=bool))
    for col, want in where.items():
        mask = pc.and_(mask, pc.fill_null(pc.equal(table[col], pa.scalar(want)), False))
    return mask


def rows_before(table: pa.Table, key: str, time_col: str, pts: dict[Any, dt.datetime]) -> pa.Table:
    """Rows of the patients of ``pts``, strictly before each one's prediction time."""
    ids = pa.array(list(pts), type=table.schema.field(key).type)
    idx = pc.index_in(table[key], value_set=ids)
    table = table.filter(pc.is_valid(idx))
    idx = pc.index_in(table[key], value_set=ids)
    times = pa.array(list(pts.values()), type=table.schema.field(time_col).type)
    return table.filter(pc.fill_null(pc.less(table[time_col], pc.take(times, idx)), False))


# -- cohort ---------------------------------------------------------------------------------
@dataclass
class Selection:
    patients: list[Any]
    times: dict[Any, dt.datetime]
    answers: dict[Any, dict[str, Value]]


def select_cohort(
    folder: TemplateFolder,
    name: str,
    tables: dict[str, pa.Table],
    prefix: Sequence[Mapping[str, int]] = (),
) -> Selection:
    """The cohort's patients: every eligible one in a seeded hash order, taken per class.

    The order depends only on the seed and the patient, so a smaller cohort with the same
    rules is within a larger one (n20 within n50). ``prefix``: the counts of the stages a
    nested per-class cohort fills first (`medomni_cas.studio.cohorts`), as its build config
    records them, so that the smaller cohorts' patients come first.
    """
    ds, c = folder.dataset, folder.cohorts[name]
    where = f"{folder.path}/cohorts/{name}.yaml"
    key, pt = ds.patient_key, c.prediction_time
    pt_table = ds.table(pt.table)
    assert pt_table is not None and pt_table.time_column is not None  # load_template checked
    rows = tables[pt.table].filter(where_mask(tables[pt.table], dict(pt.where)))
    agg = "max" if pt.pick == "last" else "min"
    picked = rows.group_by(key).aggregate([(pt_table.time_column, agg)])
    offset = dt.timedelta(days=pt.offset_days)
    times = {
        p: t + offset
        for p, t in zip(
            picked[key].to_pylist(),
            picked[f"{pt_table.time_column}_{agg}"].to_pylist(),
            strict=True,
        )
        if p is not None and t is not None
    }
    for req in c.inclusion.requires:
        t = tables[req.table]
        rows = t.filter(where_mask(t, dict(req.where)))
        tcol = ds.table(req.table).time_column  # type: ignore[union-attr]  # folders.py checked it exists
        if tcol is not None:
            rows = rows_before(rows, key, tcol, times)
        have = set(rows[key].to_pylist())
        times = {p: t for p, t in times.items() if p in have}
    answers = _labels(folder, tables, times)
    if c.inclusion.labels_defined:
        times = {p: t for p, t in times.items() if None not in answers[p].values()}
    order = sorted(times, key=lambda p: blake3.blake3(f"{c.seed}\0{p}".encode()).digest())
    chosen = _take(c, order, answers, where, prefix)
    return Selection(chosen, {p: times[p] for p in chosen}, {p: answers[p] for p in chosen})


def _take(
    c: Cohort,
    order: list[Any],
    answers: dict[Any, dict[str, Value]],
    where: str,
    prefix: Sequence[Mapping[str, int]] = (),
) -> list:
    if c.per_class is None:
        if len(order) < c.n:
            raise BuildError(f"{where}: n: {c.n} patients asked, {len(order)} are eligible")
        return order[: c.n]
    label, want = c.per_class.label, dict(c.per_class.counts)
    got: dict[str, int] = dict.fromkeys(want, 0)
    chosen: list[Any] = []
    taken: set[Any] = set()
    # one stage per smaller cohort, then this one's: without a prefix, one scan of the order
    for stage in (*prefix, want):
        for p in order:
            cls = answers[p][label]
            if p not in taken and isinstance(cls, str) and got.get(cls, 0) < stage.get(cls, 0):
                got[cls] = got.get(cls, 0) + 1
                chosen.append(p)
                taken.add(p)
    short = [f"{k}: {got[k]} of {n}" for k, n in want.items() if got[k] < n]
    if short:
        raise BuildError(
            f"{where}: per_class.counts: too few eligible patients ({', '.join(short)})"
        )
    return chosen


def _labels(
    folder: TemplateFolder, tables: dict[str, pa.Table], times: dict[Any, dt.datetime]
) -> dict[Any, dict[str, Value]]:
    ds = folder.dataset
    out: dict[Any, dict[str, Value]] = {p: {} for p in times}
    requests = list(times.items())
    for target in folder.template.targets:
        recipe: Recipe = ds.label(target.label)  # type: ignore[assignment]  # folders.py checked it
        table_name = getattr(recipe, "table", None)
        tinfo = ds.table(table_name) if table_name else None
        if tinfo is None or tinfo.time_column is None:
            raise BuildError(f"label {target.label!r}: table {table_name!r} has no time column")
        values = recipe.evaluate(
            tables[tinfo.name], requests, patient_key=ds.patient_key, time_column=tinfo.time_column
        )
        for (p, _), v in zip(requests, values, strict=True):
            out[p][target.label] = v
    return out


# -- evidence -------------------------------------------------------------------------------
def _guards(folder: TemplateFolder) -> list[Guard]:
    out: list[Guard] = []
    for t in folder.template.targets:
        for g in folder.dataset.label(t.label).all_guards():  # type: ignore[union-attr]  # folders.py checked it exists
            if g not in out:
                out.append(g)
    return out


def _json_value(v: Any) -> Any:
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, float) and (math.isnan(v) or v == 0.0):
        return None if math.isnan(v) else 0.0  # no NaN in JSON; one zero
    return v


def _cut(table: pa.Table, name: str, guards: list[Guard]) -> pa.Table:
    """Apply every guard on ``table``: drop the guarded column, or the guarded rows."""
    for g in guards:
        # "after" guards cut rows at or after the prediction time: evidence has none of them
        if g.table != name or g.period != "all":
            continue
        if g.column is not None and not g.where:
            table = table.drop_columns([g.column])
            continue
        # the matching rows go whole, even when the guard names one column: a blanked value
        # would still tell the agent when the guarded measurement was taken
        table = table.filter(pc.invert(where_mask(table, dict(g.where))))
    return table


def evidence_files(
    folder: TemplateFolder, root: Path, tables: dict[str, pa.Table], co: Selection
) -> tuple[dict[Any, dict[str, bytes]], dict[str, str]]:
    """Per patient, file name -> bytes; and each file's family (for masks)."""
    ds, key = folder.dataset, folder.dataset.patient_key
    guards = _guards(folder)
    cut_families = {g.family for g in guards if g.family is not None}
    files: dict[Any, dict[str, bytes]] = {p: {} for p in co.patients}
    family_of: dict[str, str] = {}
    for t in ds.tables:
        if t.family in cut_families:
            continue
        fname = f"{t.name}.jsonl"
        family_of[fname] = t.family
        table = tables[t.name]
        if t.time_column is not None:
            table = rows_before(table, key, t.time_column, co.times)
        table = _cut(table, t.name, guards)
        lines: dict[Any, list[bytes]] = {p: [] for p in co.patients}
        for row in table.to_pylist():
            if row[key] in lines:
                lines[row[key]].append(_JSON.encode({k: _json_value(v) for k, v in row.items()}))
        for p in co.patients:
            files[p][fname] = b"".join(line + b"\n" for line in lines[p])
    for a in ds.arrays:
        if a.name in cut_families:
            continue
        with open_array_group(root, a) as group:
            patient_ids = group["patient_id"]
            if not isinstance(patient_ids, zarr.Array):
                raise BuildError(f"array family {a.name}: patient_id is a group, not an array")
            ids = np.asarray(patient_ids[:]).tolist()
            row_of = {p: i for i, p in enumerate(ids)}
            attrs = _SORTED.encode(dict(group.attrs)) + b"\n"
            family_of[f"{a.name}.attrs.json"] = a.name
            for arr_name, arr in sorted(group.arrays()):
                if arr_name == "patient_id":
                    continue
                fname = f"{a.name}.{arr_name}.npy"
                family_of[fname] = a.name
                present = [p for p in co.patients if p in row_of]
                if not present:
                    continue
                # one orthogonal read decodes each chunk once, not once per patient
                at = np.asarray([row_of[p] for p in present], dtype=np.int64)
                rows = np.asarray(arr.oindex[at])
                for p, row in zip(present, rows, strict=True):
                    buf = io.BytesIO()
                    np.lib.format.write_array(buf, np.ascontiguousarray(row), version=(1, 0))
                    files[p][fname] = buf.getvalue()
            for p in co.patients:
                if p in row_of:
                    files[p][f"{a.name}.attrs.json"] = attrs
    return files, family_of
