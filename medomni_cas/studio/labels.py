"""Label recipes: the answers, computed declaratively from a dataset's tables.

A label is a recipe over one table, such as "the last eGFR before the prediction time, binned
into CKD stages". Every recipe declares its guards: what it reads, which the build step cuts
from the evidence so that no atom task holds its own answer. Recipes are found by name: the
built-in ones here, plus any that a package registers in the entry point group
``medomni.labels`` (a `Recipe` struct class, or a plain function; see `FunctionRecipe`).

Evaluation rules, shared by the built-in recipes:

* "before" and "after" are strict: a row at exactly the prediction time is neither;
* a null or NaN value is no value: such rows are skipped;
* rows at the same time are taken in table order (`last_before` takes the last of them,
  `first_after` the first);
* a patient with no value on the asked side of the prediction time gets ``None``: the label
  is undefined for them, and a cohort (``labels_defined``) leaves them out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from medomni_cas.errors import MedomniError

__all__ = [
    "ENTRY_POINT_GROUP",
    "PERIODS",
    "Bins",
    "FirstAfter",
    "FunctionRecipe",
    "Guard",
    "LabelError",
    "LastBefore",
    "Recipe",
    "Request",
    "Value",
    "read_table",
    "recipe_type",
    "recipe_types",
    "register",
    "reset_registry",
]

ENTRY_POINT_GROUP = "medomni.labels"
PERIODS = ("all", "after")

Scalar = str | int | float | bool
Value = str | float | None
Request = tuple[Any, Any]  # (patient, prediction time)
Problems = Iterator[tuple[str, str]]  # (field path relative to the struct, what is wrong)


class LabelError(MedomniError, ValueError):
    """A label cannot be evaluated on the data it was given."""


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings shared with `medomni_cas.studio.schema.Spec` (kept here so that this module
    does not import the schema module, which imports it): frozen, since a loaded file is a
    value; kw_only, so every field is named; forbid_unknown_fields, so a typo is an error and
    not a silently ignored key. Subclasses pass ``kw_only=True`` too (msgspec applies it
    per class)."""


class Guard(_Spec, frozen=True, kw_only=True):
    """What a label reads, which the build step cuts from the evidence.

    Either rows of a table (all of them, or those matching ``where``; only ``column`` of them
    when set) or a whole family. ``period: after`` cuts only rows at or after the prediction
    time, for labels that look ahead and leave the past as fair evidence.

    Fields:
        table: The table whose rows are cut (give this or ``family``).
        family: The family cut whole (give this or ``table``).
        column: Cut only this column of the matching rows; every column if left out.
        where: ``column: value`` pairs the cut rows match; empty for every row.
        period: ``all`` rows, or only those ``after`` (at or after) the prediction time.
    """

    table: str | None = None
    family: str | None = None
    column: str | None = None
    where: dict[str, Scalar] = {}
    period: str = "all"

    def problems(self) -> Problems:
        if (self.table is None) == (self.family is None):
            yield "", "a guard names exactly one of `table` or `family`"
        if self.family is not None and (self.column is not None or self.where):
            yield "family", "a family guard cuts the whole family; column and where are for tables"
        if self.period not in PERIODS:
            yield "period", f"must be one of {', '.join(PERIODS)}; got {self.period!r}"


class Bins(_Spec, frozen=True, kw_only=True):
    """Edges that turn a number into a class: ``classes[i]`` holds values in
    ``[edges[i-1], edges[i])``, so each edge belongs to the class above it.

    Fields:
        edges: Strictly increasing finite numbers.
        classes: One more class name than edges, lowest first; unique.
    """

    edges: tuple[float, ...]
    classes: tuple[str, ...]

    def problems(self) -> Problems:
        if not self.edges:
            yield "edges", "list at least one edge"
        if any(not math.isfinite(e) for e in self.edges):
            yield "edges", "edges must be finite numbers"
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            yield "edges", "edges must be strictly increasing"
        if len(self.classes) != len(self.edges) + 1:
            yield (
                "classes",
                f"{len(self.edges)} edges make {len(self.edges) + 1} classes; "
                f"got {len(self.classes)}",
            )
        if len(set(self.classes)) != len(self.classes):
            yield "classes", "class names must be unique"

    def classify(self, values: np.ndarray) -> list[str]:
        idx = np.searchsorted(np.asarray(self.edges, dtype=np.float64), values, side="right")
        return [self.classes[i] for i in idx.tolist()]


class Recipe:
    """What the build step asks of every label recipe.

    Concrete recipes are msgspec Structs tagged by their ``recipe`` field that also inherit
    this class. It is a plain class, not a Struct, so that a schema can name it as a field
    type and let the loader pick the concrete recipe by its tag (see `recipe_type`).
    """

    __slots__ = ()

    if TYPE_CHECKING:  # a field of every concrete recipe (declared here for the checker only)
        name: str

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names of a classification label; empty for a numeric one."""
        raise NotImplementedError

    @property
    def kind(self) -> str:
        return "classification" if self.classes else "numeric"

    def reads(self) -> tuple[Guard, ...]:
        """The guards the recipe implies by what it reads."""
        raise NotImplementedError

    def all_guards(self) -> tuple[Guard, ...]:
        """What it reads plus the guards the file declares, without repeats."""
        declared: tuple[Guard, ...] = getattr(self, "guards", ())
        out: list[Guard] = []
        for g in (*self.reads(), *declared):
            if g not in out:
                out.append(g)
        return tuple(out)

    def evaluate(
        self, table: pa.Table, requests: Sequence[Request], *, patient_key: str, time_column: str
    ) -> list[Value]:
        """One value per (patient, prediction time) request, in order; None where undefined."""
        raise NotImplementedError


class _TableRecipe(_Spec, Recipe, frozen=True, kw_only=True, tag_field="recipe"):
    """A value of ``column`` in the rows of ``table`` that match ``where``, numeric unless
    ``bins`` turns it into a class.

    Fields:
        recipe: The recipe kind, which picks the fields below.
        name: The label's name, as a template's targets name it.
        description: What the label is, for people.
        table: The table the value is read from (it must have a ``time_column``).
        column: The numeric column holding the value.
        where: ``column: value`` pairs the rows match, such as ``{test: eGFR}``.
        bins: Edges that turn the number into a class; a numeric label without them.
        guards: What else to cut from the evidence, beyond the rows the recipe reads (such as
            a lab computed from the same measurement).
    """

    name: str
    description: str = ""
    table: str
    column: str
    where: dict[str, Scalar] = {}
    bins: Bins | None = None
    guards: tuple[Guard, ...] = ()

    _after: ClassVar[bool]
    _period: ClassVar[str]

    @property
    def classes(self) -> tuple[str, ...]:
        return self.bins.classes if self.bins is not None else ()

    def reads(self) -> tuple[Guard, ...]:
        return (Guard(table=self.table, column=self.column, where=self.where, period=self._period),)

    def evaluate(
        self, table: pa.Table, requests: Sequence[Request], *, patient_key: str, time_column: str
    ) -> list[Value]:
        where = f"label {self.name!r} (table {self.table!r})"
        wanted = (patient_key, time_column, self.column, *self.where)
        missing = [c for c in wanted if c not in table.column_names]
        if missing:
            raise LabelError(f"{where}: no column {missing[0]!r} (has {table.column_names})")
        col_type = table.schema.field(self.column).type
        if not (pa.types.is_integer(col_type) or pa.types.is_floating(col_type)):
            raise LabelError(f"{where}: column {self.column!r} is {col_type}, not a number")
        rows = _select(table, self.where).select([patient_key, time_column, self.column])
        found = _nearest(rows, requests, after=self._after)
        values = pc.take(rows[self.column], pa.array(np.where(found < 0, 0, found)))
        numbers = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)
        if self.bins is None:
            return [None if f < 0 else float(v) for f, v in zip(found, numbers, strict=True)]
        classes = self.bins.classify(numbers)
        return [None if f < 0 else c for f, c in zip(found, classes, strict=True)]


class LastBefore(_TableRecipe, tag="last_before", frozen=True):
    """The last value before the prediction time (a current state: a stage, a level)."""

    _after = False
    _period = "all"  # every eGFR would reveal the stage, past or future


class FirstAfter(_TableRecipe, tag="first_after", frozen=True):
    """The first value after the prediction time (a forecast); only later rows are guarded."""

    _after = True
    _period = "after"


class FunctionRecipe(_Spec, Recipe, frozen=True, kw_only=True, tag_field="recipe"):
    """A label computed by a plugged-in function, registered under its entry point's name.

    The function is called as ``fn(table, requests, patient_key=..., time_column=...,
    **params)`` and returns one value per request (a class name, a number, or None). It
    cannot say what it reads, so the file must declare its ``guards``.

    Fields:
        recipe: The name the function is registered under (``medomni.labels``).
        name: The label's name, as a template's targets name it.
        description: What the label is, for people.
        table: The table passed to the function.
        classes: The class names of a classification label; empty for a numeric one.
        params: Keyword arguments passed to the function.
        guards: What the function reads, cut from the evidence; at least one.
    """

    name: str
    description: str = ""
    table: str
    classes: tuple[str, ...] = ()
    params: dict[str, Any] = {}
    guards: tuple[Guard, ...] = ()

    function: ClassVar[Callable[..., Sequence[Value]]]

    def problems(self) -> Problems:
        if not self.guards:
            yield "guards", "a plugged-in recipe must declare the guards it reads"

    def reads(self) -> tuple[Guard, ...]:
        return ()

    def evaluate(
        self, table: pa.Table, requests: Sequence[Request], *, patient_key: str, time_column: str
    ) -> list[Value]:
        fn = type(self).function
        out = list(
            fn(table, requests, patient_key=patient_key, time_column=time_column, **self.params)
        )
        if len(out) != len(requests):
            raise LabelError(
                f"label {self.name!r}: recipe returned {len(out)} values for {len(requests)}"
            )
        for v in out:
            if not self._valid(v):
                want = f"one of {self.classes}" if self.classes else "a finite number"
                raise LabelError(f"label {self.name!r}: recipe returned {v!r}, not {want}")
        return [None if v is None else (v if self.classes else float(v)) for v in out]

    def _valid(self, v: object) -> bool:
        if v is None:
            return True
        if self.classes:
            return isinstance(v, str) and v in self.classes
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# -- evaluation ------------------------------------------------------------------------------
def _select(table: pa.Table, where: Mapping[str, Scalar]) -> pa.Table:
    mask = None
    for col, want in where.items():
        eq = pc.fill_null(pc.equal(table[col], pa.scalar(want)), False)
        mask = eq if mask is None else pc.and_(mask, eq)
    return table if mask is None else table.filter(mask)


def _instants(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Times as int64 on one scale: integers as they are, dates and timestamps in ns."""
    if pa.types.is_integer(values.type):
        return np.asarray(values.cast(pa.int64()).to_numpy(zero_copy_only=False))
    if pa.types.is_timestamp(values.type) and values.type.tz is not None:
        values = values.cast(pa.timestamp(values.type.unit))  # compare wall times, as stored
    ns = values.cast(pa.timestamp("ns")).cast(pa.int64())
    return np.asarray(ns.to_numpy(zero_copy_only=False))


def _nearest(rows: pa.Table, requests: Sequence[Request], *, after: bool) -> np.ndarray:
    """For each request, the row index of the patient's nearest value strictly before (or
    after) its time, or -1. Vectorised: rows are sorted by (patient, time) once, and every
    request is one binary search on a combined (patient code, time rank) key."""
    patient, time, value = rows.column_names
    valid = pc.is_valid(rows[value])
    if pa.types.is_floating(rows.schema.field(value).type):
        valid = pc.and_(valid, pc.invert(pc.fill_null(pc.is_nan(rows[value]), True)))
    valid = pc.and_(valid, pc.and_(pc.is_valid(rows[patient]), pc.is_valid(rows[time])))
    keep = np.flatnonzero(np.asarray(valid.to_numpy(zero_copy_only=False), dtype=bool))
    n = len(requests)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    p_type, t_type = rows.schema.field(patient).type, rows.schema.field(time).type
    try:
        req_p = pa.array([r[0] for r in requests]).cast(p_type)
        req_t = _instants(pa.array([r[1] for r in requests]).cast(t_type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise LabelError(f"requests do not match the table's {patient}/{time} types: {e}") from e
    if len(keep) == 0:
        return np.full(n, -1, dtype=np.int64)
    idx = pa.array(keep)
    patients = pc.take(rows[patient], idx).combine_chunks()
    uniq = pc.unique(patients)
    row_code = np.asarray(pc.index_in(patients, value_set=uniq).to_numpy(zero_copy_only=False))
    req_code_arr = pc.index_in(req_p, value_set=uniq)
    known = np.asarray(req_code_arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    req_code = np.asarray(req_code_arr.fill_null(0).to_numpy(zero_copy_only=False))
    row_t = _instants(pc.take(rows[time], idx))
    # Ranks keep the combined key small: code * (ranks) + rank fits int64 for any real table.
    _, ranks = np.unique(np.concatenate([row_t, req_t]), return_inverse=True)
    span = np.int64(len(ranks) + 1)
    row_key = row_code.astype(np.int64) * span + ranks[: len(row_t)]
    req_key = req_code.astype(np.int64) * span + ranks[len(row_t) :]
    order = np.lexsort((row_key,))  # stable: equal times keep table order
    sorted_key, sorted_code = row_key[order], row_code[order]
    if after:
        pos = np.searchsorted(sorted_key, req_key, side="right")
    else:
        pos = np.searchsorted(sorted_key, req_key, side="left") - 1
    inside = (pos >= 0) & (pos < len(order))
    safe = np.clip(pos, 0, len(order) - 1)
    hit = inside & known & (sorted_code[safe] == req_code)
    return np.where(hit, keep[order[safe]], -1).astype(np.int64)


def read_table(path: str | Path) -> pa.Table:
    """A dataset table from Parquet or CSV, by its suffix."""
    p = Path(path)
    name = p.name.lower()
    if name.endswith(".parquet"):
        return pq.read_table(p)
    if name.endswith((".csv", ".csv.gz")):  # pyarrow decompresses .gz by the name
        return pcsv.read_csv(p)
    raise LabelError(f"{p}: tables are .parquet, .csv or .csv.gz files")


# -- registry --------------------------------------------------------------------------------
_BUILTIN: dict[str, type[Recipe]] = {"last_before": LastBefore, "first_after": FirstAfter}
_registry: dict[str, type[Recipe]] | None = None


def register(name: str, recipe: type[Recipe] | Callable[..., Sequence[Value]]) -> type[Recipe]:
    """Add a recipe kind: a `Recipe` struct class tagged ``name``, or a function, which is
    wrapped in a `FunctionRecipe` subclass tagged ``name``."""
    types = recipe_types()
    if name in types:
        raise ValueError(f"label recipe {name!r} is already registered")
    if isinstance(recipe, type) and issubclass(recipe, Recipe):
        tag = getattr(recipe, "__struct_config__", None)
        if tag is None or tag.tag != name:
            raise ValueError(f"recipe class {recipe.__name__} must be a Struct tagged {name!r}")
        cls: type[Recipe] = recipe
    elif callable(recipe):
        made = msgspec.defstruct(
            f"FunctionRecipe_{name}",
            [],
            bases=(FunctionRecipe,),
            tag=name,
            namespace={"function": staticmethod(recipe)},
        )
        # a subclass of FunctionRecipe, so a Recipe: msgspec's stub says only type[Struct]
        cls = cast("type[Recipe]", made)
    else:
        raise TypeError(f"label recipe {name!r} must be a Recipe class or a function")
    types[name] = cls
    return cls


def recipe_types() -> dict[str, type[Recipe]]:
    """Every recipe kind by name; plug-ins are loaded on first use."""
    global _registry
    if _registry is None:
        _registry = dict(_BUILTIN)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name not in _registry:
                register(ep.name, ep.load())
    return _registry


def recipe_type(name: str) -> type[Recipe]:
    try:
        return recipe_types()[name]
    except KeyError:
        known = ", ".join(sorted(recipe_types()))
        raise KeyError(f"unknown label recipe {name!r} (known: {known})") from None


def reset_registry() -> None:
    """Forget loaded plug-ins, so that the next lookup reads the entry points again."""
    global _registry
    _registry = None
