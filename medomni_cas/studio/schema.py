"""The files a Studio user writes, as msgspec schemas over YAML, and their loaders.

These are file schemas, not store records: the build step turns them into records. Every
error a user can make is a `SpecError` whose message names the file, the line and the field:
``tasks/t/template.yaml:7: targets[0].metric: unknown metric 'f1' (known: accuracy, ...)``.

Checks come in three layers: the types (msgspec), each struct's own ``problems()`` (values
that are well typed but wrong, such as a route policy that is not allow/deny/conditional),
and the cross-file checks of the ``load_*`` folder loaders (a target's label exists in its
dataset, a set's pair is pinned at its cohort's N).
"""

from __future__ import annotations

import difflib
import functools
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import msgspec
import yaml

from medomni_cas.errors import MedomniError
from medomni_cas.studio.labels import Bins, Guard, Recipe, recipe_type

__all__ = [
    "ARMS",
    "METRICS",
    "Agent",
    "ArrayFamily",
    "Benchmark",
    "BenchmarkFolder",
    "Bins",
    "Cohort",
    "Dataset",
    "Environment",
    "Inclusion",
    "Input",
    "Ladder",
    "Pair",
    "PerClass",
    "PredictionTime",
    "Route",
    "Routes",
    "RowFilter",
    "Rung",
    "Spec",
    "SpecError",
    "Studio",
    "Table",
    "Target",
    "TaskSet",
    "Template",
    "TemplateFolder",
    "Timeouts",
    "Version",
    "find_template",
    "load_benchmark",
    "load_cohort",
    "load_dataset",
    "load_ladder",
    "load_set",
    "load_studio",
    "load_template",
    "load_yaml",
]

# metric -> the label kind it scores
METRICS = {
    "accuracy": "classification",
    "balanced_accuracy": "classification",
    "macro_f1": "classification",
    "mae": "numeric",
    "rmse": "numeric",
}
ARMS = ("encoders", "no-perception", "encoders-required", "modality-ladder")
LADDER_ARM = "modality-ladder"
RUNGS = tuple(f"r{i}" for i in range(1, 7))
ROUTE_POLICIES = ("allow", "deny", "conditional")
EVIDENCE_BUILT = "default"
TABLE_SUFFIXES = (".parquet", ".csv", ".csv.gz")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
Problems = Iterator[tuple[str, str]]


class SpecError(MedomniError, ValueError):
    """A file a user wrote is wrong: where (file, line, field) and what."""

    def __init__(self, file: str | Path, line: int | None, field: str, problem: str) -> None:
        self.file = str(file)
        self.line = line
        self.field = field
        self.problem = problem
        where = self.file if line is None else f"{self.file}:{line}"
        super().__init__(": ".join(p for p in (where, field, problem) if p))


@functools.total_ordering
class Version:
    """A task version N.X: N rises when results stop being comparable, X for anything else.

    Written ``"1.0"`` in a cohort file. A plain class rather than a Struct so that msgspec
    hands the string to the loader's hook, which parses it at the field's own path.
    """

    __slots__ = ("n", "x")
    n: int
    x: int

    def __init__(self, n: int, x: int) -> None:
        if n < 0 or x < 0:
            raise ValueError("version numbers are not negative")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "x", x)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Version is immutable")

    _RE: typing.ClassVar[re.Pattern[str]] = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\Z")

    @classmethod
    def parse(cls, text: str) -> Version:
        m = cls._RE.match(text)
        if m is None:
            raise ValueError(f'a version is N.X with whole numbers, like "1.0"; got {text!r}')
        return cls(int(m[1]), int(m[2]))

    def __str__(self) -> str:
        return f"{self.n}.{self.x}"

    def __repr__(self) -> str:
        return f"Version({self.n}, {self.x})"

    def __eq__(self, other: object) -> bool:
        return (
            (self.n, self.x) == (other.n, other.x) if isinstance(other, Version) else NotImplemented
        )

    def __lt__(self, other: Version) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return (self.n, self.x) < (other.n, other.x)

    def __hash__(self) -> int:
        return hash((self.n, self.x))


class Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every file schema.

    frozen: a loaded file is a value, compared and hashed, never edited in place;
    kw_only: every field is named, so fields can be added in any order later;
    forbid_unknown_fields: a misspelt key is an error naming it, not a silently ignored line.
    Subclasses pass ``kw_only=True`` too (msgspec applies it per class). A struct may define
    ``problems()``, yielding ``(field, what is wrong)`` for values its types cannot refuse.
    """


def _unique(names: typing.Sequence[str], field: str, what: str) -> Problems:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            yield f"{field}[{i}]", f"duplicate {what} {name!r}"
        seen.add(name)


def _bad_name(name: str) -> str | None:
    if _NAME.match(name):
        return None
    return f"{name!r} is not a valid name (lowercase letters, digits, '.', '_', '-')"


def _relative(path: str) -> str | None:
    p = Path(path)
    if p.is_absolute() or ".." in p.parts:
        return f"{path!r} must be a path inside the folder (relative, no '..')"
    return None


# -- dataset.yaml ----------------------------------------------------------------------------
class Table(Spec, kw_only=True):
    """One table of the dataset: a Parquet or CSV file (relative to the dataset folder), the
    family its columns belong to, and its time column (none for a static table)."""

    name: str
    file: str
    family: str
    time_column: str | None = None
    description: str = ""

    def problems(self) -> Problems:
        if msg := _relative(self.file):
            yield "file", msg
        if not self.file.lower().endswith(TABLE_SUFFIXES):
            yield "file", f"a table is a {', '.join(TABLE_SUFFIXES)} file; got {self.file!r}"


class ArrayFamily(Spec, kw_only=True):
    """A family stored as zarr v3 arrays: a ``.zarr`` folder, or (with ``ref``) a medomni
    store folder whose ref ``ref`` names the hierarchy's tree (`medomni_cas.views.zarr_store`).
    Paths are relative to the dataset folder."""

    name: str
    store: str
    ref: str = ""
    description: str = ""

    def problems(self) -> Problems:
        if msg := _relative(self.store):
            yield "store", msg
        if self.ref:
            from medomni_cas.errors import InvalidName
            from medomni_cas.store.refs import check_ref_name

            try:
                check_ref_name(self.ref)
            except InvalidName as e:
                yield "ref", str(e)
        elif not self.store.rstrip("/").endswith(".zarr"):
            yield (
                "store",
                f"an array family is a .zarr folder, or a store with a ref; got {self.store!r}",
            )


class Route(Spec, kw_only=True):
    """May data of this dataset go through a route: allow, deny, or conditional (with the
    conditions the harness prints before a run)."""

    policy: str
    conditions: str = ""

    def problems(self) -> Problems:
        if self.policy not in ROUTE_POLICIES:
            yield "policy", f"must be one of {', '.join(ROUTE_POLICIES)}; got {self.policy!r}"
        elif self.policy == "conditional" and not self.conditions.strip():
            yield "conditions", "a conditional route states its conditions"
        elif self.policy != "conditional" and self.conditions:
            yield "conditions", f"only a conditional route has conditions, not {self.policy!r}"


class Routes(Spec, kw_only=True):
    local: Route
    cloud: Route


class Dataset(Spec, kw_only=True):
    """``studio/datasets/<dataset>/dataset.yaml``."""

    name: str
    release: str
    description: str = ""
    patient_key: str
    credentialed: bool
    routes: Routes
    tables: tuple[Table, ...]
    arrays: tuple[ArrayFamily, ...] = ()
    labels: tuple[Recipe, ...] = ()

    def problems(self) -> Problems:
        if msg := _bad_name(self.name):
            yield "name", msg
        if not self.tables:
            yield "tables", "list at least one table"
        yield from _unique([t.name for t in self.tables], "tables", "table")
        yield from _unique([a.name for a in self.arrays], "arrays", "array family")
        yield from _unique([lb.name for lb in self.labels], "labels", "label")  # type: ignore[attr-defined]
        table_families = {t.family for t in self.tables}
        for i, a in enumerate(self.arrays):
            if a.name in table_families:
                yield f"arrays[{i}].name", f"{a.name!r} is already the family of a table"

    @property
    def families(self) -> tuple[str, ...]:
        """Every family, tables' first, in file order."""
        names = [t.family for t in self.tables] + [a.name for a in self.arrays]
        return tuple(dict.fromkeys(names))

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)

    def label(self, name: str) -> Recipe | None:
        return next((lb for lb in self.labels if lb.name == name), None)  # type: ignore[attr-defined]


# -- template.yaml ---------------------------------------------------------------------------
class Target(Spec, kw_only=True):
    label: str
    metric: str
    question: str | None = None

    def problems(self) -> Problems:
        if self.metric not in METRICS:
            yield "metric", f"unknown metric {self.metric!r} (known: {', '.join(METRICS)})"


class Input(Spec, kw_only=True):
    """The tables and families the proposal named, kept as a record."""

    tables: tuple[str, ...] = ()
    families: tuple[str, ...]

    def problems(self) -> Problems:
        if not self.families:
            yield "families", "name at least one family"
        yield from _unique(self.tables, "tables", "table")
        yield from _unique(self.families, "families", "family")


class Timeouts(Spec, kw_only=True):
    agent_sec: int
    verifier_sec: int = 60

    def problems(self) -> Problems:
        for f in ("agent_sec", "verifier_sec"):
            if getattr(self, f) <= 0:
                yield f, "a timeout is a positive number of seconds"


class Environment(Spec, kw_only=True):
    cpus: int
    memory_mb: int
    timeouts: Timeouts
    internet: bool = False

    def problems(self) -> Problems:
        if self.cpus < 1:
            yield "cpus", "at least 1"
        if self.memory_mb < 64:
            yield "memory_mb", "at least 64 (MB)"
        if self.internet:
            yield "internet", "atom tasks run with no network; internet must be false"


class Agent(Spec, kw_only=True):
    statement: str
    instruction: str
    environment: Environment
    submission_path: str

    def problems(self) -> Problems:
        if not self.statement.strip():
            yield "statement", "the clinical question must not be empty"
        p = Path(self.submission_path)
        if not p.is_absolute() or ".." in p.parts or self.submission_path.endswith("/"):
            yield "submission_path", f"an absolute file path in the task; got {p}"


class Template(Spec, kw_only=True):
    """``studio/datasets/<dataset>/tasks/<template>/template.yaml``."""

    name: str
    description: str = ""
    targets: tuple[Target, ...]
    input: Input
    evidence: tuple[str, ...] = (EVIDENCE_BUILT,)
    agent: Agent

    def problems(self) -> Problems:
        if msg := _bad_name(self.name):
            yield "name", msg
        if not self.targets:
            yield "targets", "list at least one target"
        yield from _unique([t.label for t in self.targets], "targets", "target label")
        if not self.evidence:
            yield "evidence", f"list the evidence variants; {EVIDENCE_BUILT!r} is built"
        for i, v in enumerate(self.evidence):
            if v != EVIDENCE_BUILT:
                yield (
                    f"evidence[{i}]",
                    f"evidence variant {v!r} is not built by this release; "
                    f"only {EVIDENCE_BUILT!r} is",
                )


# -- cohorts/<cohort>.yaml -------------------------------------------------------------------
class RowFilter(Spec, kw_only=True):
    """Rows of a table that match every ``column: value`` of ``where``."""

    table: str
    where: dict[str, str | int | float | bool] = {}


class Inclusion(Spec, kw_only=True):
    """Who is in: patients with at least one row of each ``requires`` before the prediction
    time, and (by default) every target label defined."""

    description: str
    requires: tuple[RowFilter, ...] = ()
    labels_defined: bool = True


class PredictionTime(Spec, kw_only=True):
    """The time of the ``pick`` (first or last) matching row of ``table``, plus an offset."""

    description: str = ""
    table: str
    where: dict[str, str | int | float | bool] = {}
    pick: str = "last"
    offset_days: int = 0

    def problems(self) -> Problems:
        if self.pick not in ("first", "last"):
            yield "pick", f"must be first or last; got {self.pick!r}"


class PerClass(Spec, kw_only=True):
    """How many patients of each class of one classification target."""

    label: str
    counts: dict[str, int]

    def problems(self) -> Problems:
        for cls, k in self.counts.items():
            if k < 0:
                yield "counts", f"class {cls!r} has a negative count"


class Cohort(Spec, kw_only=True):
    """``tasks/<template>/cohorts/<cohort>.yaml``; its name is the file's stem."""

    version: Version
    description: str = ""
    inclusion: Inclusion
    prediction_time: PredictionTime
    n: int
    per_class: PerClass | None = None
    seed: int = 0

    def problems(self) -> Problems:
        if self.n < 1:
            yield "n", "a cohort holds at least one patient"
        if self.per_class is not None and sum(self.per_class.counts.values()) != self.n:
            total = sum(self.per_class.counts.values())
            yield "per_class.counts", f"the counts add up to {total}, not n = {self.n}"


# -- arms/modality-ladder.yaml ---------------------------------------------------------------
class Rung(Spec, kw_only=True):
    name: str
    add: tuple[str, ...]
    description: str = ""


class Ladder(Spec, kw_only=True):
    """The modality ladder: rungs r1..r6, each staging the families of the one before plus
    ``add``, all on one ladder cohort (a cohort of the same template)."""

    cohort: str
    description: str = ""
    rungs: tuple[Rung, ...]

    def problems(self) -> Problems:
        if len(self.rungs) != len(RUNGS):
            yield "rungs", f"list exactly the six rungs r1..r6; got {len(self.rungs)}"
        staged: dict[str, str] = {}
        for i, rung in enumerate(self.rungs):
            want = RUNGS[i] if i < len(RUNGS) else None
            if rung.name != want:
                yield f"rungs[{i}].name", f"expected {want!r} here (rungs are r1..r6 in order)"
            if not rung.add:
                yield f"rungs[{i}].add", "each rung adds at least one family to the one before"
            for j, fam in enumerate(rung.add):
                if fam in staged:
                    yield (
                        f"rungs[{i}].add[{j}]",
                        f"family {fam!r} is already staged at {staged[fam]}",
                    )
                staged[fam] = rung.name

    def families(self, rung: str) -> tuple[str, ...]:
        """The families staged at ``rung`` (its own and every earlier rung's)."""
        out: list[str] = []
        for r in self.rungs:
            out.extend(r.add)
            if r.name == rung:
                return tuple(out)
        raise KeyError(f"no rung {rung!r}")


# -- bench/benchmarks/<benchmark>/ -----------------------------------------------------------
class Benchmark(Spec, kw_only=True):
    """``benchmark.yaml``: the card of a benchmark."""

    name: str
    version: str
    owner: str
    license: str
    description: str = ""
    intelligence_kinds: tuple[str, ...]

    def problems(self) -> Problems:
        if msg := _bad_name(self.name):
            yield "name", msg
        if not self.intelligence_kinds:
            yield "intelligence_kinds", "name at least one kind (v0.3.0 has 'agent')"
        yield from _unique(self.intelligence_kinds, "intelligence_kinds", "kind")


class Pair(Spec, kw_only=True):
    """``<template>@<cohort>`` pinned at its version N."""

    task: str
    n: int

    def problems(self) -> Problems:
        if self.task.count("@") != 1 or not all(self.task.split("@")):
            yield "task", f"a pair is written <template>@<cohort>; got {self.task!r}"
        if self.n < 0:
            yield "n", "a version N is a whole number"

    @property
    def template(self) -> str:
        return self.task.partition("@")[0]

    @property
    def cohort(self) -> str:
        return self.task.partition("@")[2]


class TaskSet(Spec, kw_only=True):
    """``sets/<set>.yaml``; its name is ``<benchmark>/<file stem>``."""

    description: str = ""
    builder: str
    arms: tuple[str, ...]
    pairs: tuple[Pair, ...]

    def problems(self) -> Problems:
        if msg := _bad_name(self.builder):
            yield "builder", msg
        if not self.arms:
            yield "arms", "list at least one arm"
        known = known_arms()
        for i, arm in enumerate(self.arms):
            if arm not in known:
                yield f"arms[{i}]", f"unknown arm {arm!r} (known: {', '.join(known)})"
        yield from _unique(self.arms, "arms", "arm")
        if not self.pairs:
            yield "pairs", "list at least one pair"
        yield from _unique([p.task for p in self.pairs], "pairs", "pair")


def known_arms() -> tuple[str, ...]:
    """The built-in arms and those plug-ins register in ``medomni.arms``."""
    extra = sorted(ep.name for ep in entry_points(group="medomni.arms") if ep.name not in ARMS)
    return (*ARMS, *extra)


# -- YAML with lines -------------------------------------------------------------------------
# Keys whose values are names, never numbers: `version: 1.10` must not become 1.1.
_STRING_KEYS = frozenset({"version", "release", "name", "license"})
_DATA_KEYS = frozenset({"where", "params", "counts"})
_STR_TAG = "tag:yaml.org,2002:str"
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_AT = re.compile(r" - at `(\$[^`]*)`")


@dataclass(frozen=True)
class _Doc:
    """A parsed file: where errors about it point."""

    path: Path
    root: yaml.Node | None

    def line(self, parts: typing.Sequence[str | int]) -> int | None:
        """The line of the deepest node on the path (the key's line for a mapping entry)."""
        node = self.root
        if node is None:
            return 1
        line = node.start_mark.line + 1
        for part in parts:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                hit = next((kv for kv in node.value if kv[0].value == part), None)
                if hit is None:
                    break
                line, node = hit[0].start_mark.line + 1, hit[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    break
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def error(self, field: str, problem: str) -> SpecError:
        return SpecError(self.path, self.line(_parts(field)), field, problem)


def _parts(field: str) -> list[str | int]:
    """``targets[0].metric`` (or ``$.targets[0].metric``) -> ["targets", 0, "metric"]."""
    text = field.removeprefix("$")
    if text and not text.startswith((".", "[")):
        text = "." + text
    out: list[str | int] = []
    for m in _PATH_PART.finditer(text):
        if m[1] is not None:
            out.append(m[1])
        elif m[2] != "...":
            out.append(int(m[2]))
        else:
            out.append("...")
    return out


def _render(parts: typing.Sequence[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) or p == "..." else (f".{p}" if out else p)
    return out


def _prepare(
    node: yaml.Node,
    doc: _Doc,
    path: list[str | int],
    *,
    data: bool = False,
    above: tuple[int, ...] = (),
) -> None:
    """Refuse duplicate keys (PyYAML keeps the last silently) and recursive aliases, and keep
    names as text (not inside ``data`` mappings such as ``where``: those values are the user's)."""
    if id(node) in above:
        raise SpecError(doc.path, node.start_mark.line + 1, _render(path), "recursive YAML alias")
    above = (*above, id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            k = key.value if isinstance(key, yaml.ScalarNode) else None
            if k is not None and k in seen:
                field = _render([*path, k])
                raise SpecError(doc.path, key.start_mark.line + 1, field, "duplicate key")
            if k is not None:
                seen.add(k)
            if (
                not data
                and k in _STRING_KEYS
                and isinstance(value, yaml.ScalarNode)
                and value.style is None
                and value.tag != "tag:yaml.org,2002:null"
            ):
                value.tag = _STR_TAG
            inner = data or k in _DATA_KEYS
            _prepare(value, doc, [*path, k if k is not None else "?"], data=inner, above=above)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _prepare(item, doc, [*path, i], data=data, above=above)


def _parse(path: Path) -> tuple[Any, _Doc]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(path, None, "", "no such file") from None
    except IsADirectoryError:
        raise SpecError(path, None, "", "is a folder, not a file") from None
    except UnicodeDecodeError as e:
        raise SpecError(path, None, "", f"not UTF-8 text: {e}") from None
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        doc = _Doc(path, root)
        if root is not None:
            _prepare(root, doc, [])
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(p for p in (e.context, e.problem) if p)
        if e.context_mark is not None and mark is not None and e.context_mark.line != mark.line:
            problem += f" (opened on line {e.context_mark.line + 1})"
        raise SpecError(path, line, "", f"YAML syntax: {problem}") from None
    except yaml.YAMLError as e:
        raise SpecError(path, None, "", f"YAML syntax: {e}") from None
    finally:
        loader.dispose()
    return data, doc


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is Version:
        if isinstance(obj, str):
            return Version.parse(obj)
        raise ValueError(f'a version is written N.X, like "1.0"; got {obj!r}')
    if tp is Recipe:
        return _recipe(obj)
    raise NotImplementedError


def _recipe(obj: Any) -> Recipe:
    if not isinstance(obj, dict):
        raise ValueError(f"Expected `object`, got `{type(obj).__name__}`")
    name = obj.get("recipe")
    if name is None:
        raise ValueError("Object missing required field `recipe`")
    try:
        cls = recipe_type(str(name))
    except KeyError as e:
        raise ValueError(f"{e.args[0]} - at `$.recipe`") from None
    try:
        return msgspec.convert(obj, cls, dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        # The hook's own path is lost by msgspec: keep it in the text, `_located` joins them.
        raise ValueError(str(e)) from None


def _type_at(tp: Any, data: Any, parts: typing.Sequence[str | int]) -> Any:
    """The schema type at a path, following the data through unions and recipes."""
    for part in parts:
        tp = _concrete(tp, data)
        if isinstance(part, str) and isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            tp = typing.get_type_hints(tp).get(part)
            data = data.get(part) if isinstance(data, dict) else None
        elif isinstance(part, int) and typing.get_origin(tp) is tuple:
            tp = typing.get_args(tp)[0]
            data = data[part] if isinstance(data, list) and part < len(data) else None
        else:
            return None
    return _concrete(tp, data)


def _concrete(tp: Any, data: Any) -> Any:
    if tp is Recipe:
        try:
            return recipe_type(str(data.get("recipe"))) if isinstance(data, dict) else None
        except KeyError:
            return None
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _located(e: msgspec.ValidationError, doc: _Doc, tp: Any, data: Any) -> SpecError:
    text = str(e)
    paths = _AT.findall(text)
    problem = _AT.sub("", text)
    parts: list[str | int] = []
    for p in reversed(paths):  # outermost last in the text; inner paths are relative
        parts.extend(_parts(p))
    if m := re.fullmatch(r"Object missing required field `([^`]+)`", problem):
        line = doc.line(parts)
        return SpecError(doc.path, line, _render([*parts, m[1]]), "missing required field")
    if m := re.fullmatch(r"Object contains unknown field `([^`]+)`", problem):
        cls = _type_at(tp, data, parts)
        fields = list(getattr(cls, "__struct_fields__", ()))
        hint = difflib.get_close_matches(m[1], fields, n=1)
        why = f"unknown field {m[1]!r}"
        if hint:
            why += f" (did you mean {hint[0]!r}?)"
        elif fields:
            why += f" (allowed: {', '.join(fields)})"
        parts.append(m[1])
        return SpecError(doc.path, doc.line(parts), _render(parts), why)
    problem = (
        problem.replace("`object`", "a mapping")
        .replace("`array`", "a list")
        .replace("`null`", "nothing")
    )
    if not parts and data is None:
        problem = "the file is empty; expected a mapping"
    problem = problem[:1].lower() + problem[1:]
    return SpecError(doc.path, doc.line(parts), _render(parts) or "(top level)", problem)


def _walk(value: Any, path: list[str | int]) -> Iterator[tuple[list[str | int], str]]:
    """Every ``problems()`` of the struct tree, deepest first, with absolute paths."""
    if isinstance(value, msgspec.Struct):
        for f in value.__struct_fields__:
            yield from _walk(getattr(value, f), [*path, f])
        check = getattr(value, "problems", None)
        if check is not None:
            for field, problem in check():
                yield [*path, *_parts(field)], problem
    elif isinstance(value, tuple | list):
        for i, v in enumerate(value):
            yield from _walk(v, [*path, i])


def _load[T](path: str | Path, tp: type[T]) -> tuple[T, _Doc]:
    data, doc = _parse(Path(path))
    try:
        obj = msgspec.convert(data, tp, dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        raise _located(e, doc, tp, data) from None
    first = next(_walk(obj, []), None)  # one error, the deepest first: fix it, then the next
    if first is not None:
        raise doc.error(_render(first[0]) or "(top level)", first[1])
    return obj, doc


def load_yaml[T](path: str | Path, tp: type[T]) -> T:
    """Read one YAML file as the schema ``tp``; every error is a `SpecError` with its line."""
    return _load(path, tp)[0]


# -- folders and cross-file checks -----------------------------------------------------------
def _named(doc: _Doc, field: str, got: str, want: str, what: str) -> None:
    if got != want:
        raise doc.error(field, f"{got!r} must match its {what}'s name {want!r}")


def _dataset(directory: Path) -> tuple[Dataset, _Doc]:
    ds, doc = _load(directory / "dataset.yaml", Dataset)
    _named(doc, "name", ds.name, directory.name, "folder")
    tables = {t.name: t for t in ds.tables}
    for i, label in enumerate(ds.labels):
        table = getattr(label, "table", None)
        if table is not None and table not in tables:
            raise doc.error(f"labels[{i}].table", f"no table {table!r} in this dataset")
        if table is not None and tables[table].time_column is None:
            raise doc.error(f"labels[{i}].table", f"table {table!r} has no time_column")
        for j, g in enumerate(getattr(label, "guards", ())):
            _check_guard(doc, f"labels[{i}].guards[{j}]", g, ds)
    return ds, doc


def _check_guard(doc: _Doc, field: str, g: Guard, ds: Dataset) -> None:
    if g.table is not None and ds.table(g.table) is None:
        raise doc.error(f"{field}.table", f"no table {g.table!r} in this dataset")
    if g.family is not None and g.family not in ds.families:
        raise doc.error(f"{field}.family", f"no family {g.family!r} in this dataset")


def load_dataset(directory: str | Path) -> Dataset:
    """``<dataset>/dataset.yaml``, checked: its name is its folder's, labels read real tables."""
    return _dataset(Path(directory))[0]


def load_cohort(path: str | Path) -> Cohort:
    """One cohort file, on its own (`load_template` checks it against its template)."""
    return load_yaml(path, Cohort)


def load_ladder(path: str | Path) -> Ladder:
    """``arms/modality-ladder.yaml``, on its own (`load_template` checks its families)."""
    return load_yaml(path, Ladder)


@dataclass(frozen=True)
class TemplateFolder:
    """A template folder as loaded and checked against its dataset."""

    name: str
    path: Path
    dataset: Dataset
    template: Template
    cohorts: dict[str, Cohort]
    ladder: Ladder | None


def load_template(directory: str | Path, *, dataset: Dataset | None = None) -> TemplateFolder:
    """``tasks/<template>/``: template.yaml, cohorts/*.yaml and arms/modality-ladder.yaml,
    checked against the dataset two folders up (or ``dataset``)."""
    d = Path(directory)
    tpl, doc = _load(d / "template.yaml", Template)
    ds = dataset if dataset is not None else load_dataset(d.parent.parent)
    _named(doc, "name", tpl.name, d.name, "folder")
    _check_template(doc, tpl, ds)
    cohorts: dict[str, Cohort] = {}
    for path in sorted((d / "cohorts").glob("*.yaml")):
        cohort, cdoc = _load(path, Cohort)
        if msg := _bad_name(path.stem):
            raise SpecError(path, None, "", f"cohort file name: {msg}")
        _check_cohort(cdoc, cohort, tpl, ds)
        cohorts[path.stem] = cohort
    ladder = None
    ladder_path = d / "arms" / f"{LADDER_ARM}.yaml"
    if ladder_path.exists():
        ladder, ldoc = _load(ladder_path, Ladder)
        if ladder.cohort not in cohorts:
            have = ", ".join(cohorts) or "none"
            raise ldoc.error("cohort", f"no cohort {ladder.cohort!r} in cohorts/ (have: {have})")
        for i, rung in enumerate(ladder.rungs):
            for j, fam in enumerate(rung.add):
                if fam not in tpl.input.families:
                    raise ldoc.error(
                        f"rungs[{i}].add[{j}]", f"family {fam!r} is not in the template's input"
                    )
    return TemplateFolder(d.name, d, ds, tpl, cohorts, ladder)


def _check_template(doc: _Doc, tpl: Template, ds: Dataset) -> None:
    for i, t in enumerate(tpl.targets):
        label = ds.label(t.label)
        if label is None:
            have = ", ".join(lb.name for lb in ds.labels) or "none"  # type: ignore[attr-defined]
            raise doc.error(
                f"targets[{i}].label", f"no label {t.label!r} in dataset {ds.name} (has: {have})"
            )
        if METRICS[t.metric] != label.kind:
            raise doc.error(
                f"targets[{i}].metric",
                f"{t.metric} scores {METRICS[t.metric]} labels; {t.label!r} is {label.kind}",
            )
    for i, table in enumerate(tpl.input.tables):
        if ds.table(table) is None:
            raise doc.error(f"input.tables[{i}]", f"no table {table!r} in dataset {ds.name}")
    for i, fam in enumerate(tpl.input.families):
        if fam not in ds.families:
            have = ", ".join(ds.families)
            raise doc.error(f"input.families[{i}]", f"no family {fam!r} (has: {have})")


def _check_cohort(doc: _Doc, cohort: Cohort, tpl: Template, ds: Dataset) -> None:
    for i, req in enumerate(cohort.inclusion.requires):
        if ds.table(req.table) is None:
            raise doc.error(f"inclusion.requires[{i}].table", f"no table {req.table!r}")
    pt = ds.table(cohort.prediction_time.table)
    if pt is None:
        raise doc.error("prediction_time.table", f"no table {cohort.prediction_time.table!r}")
    if pt.time_column is None:
        raise doc.error("prediction_time.table", f"table {pt.name!r} has no time_column")
    if cohort.per_class is None:
        return
    name = cohort.per_class.label
    if name not in [t.label for t in tpl.targets]:
        raise doc.error("per_class.label", f"{name!r} is not a target of {tpl.name}")
    label = ds.label(name)
    assert label is not None  # targets were checked against the dataset
    if label.kind != "classification":
        raise doc.error("per_class.label", f"{name!r} is numeric; per-class counts need classes")
    for cls in cohort.per_class.counts:
        if cls not in label.classes:
            known = ", ".join(label.classes)
            raise doc.error("per_class.counts", f"no class {cls!r} in {name} (has: {known})")


def find_template(studio: str | Path, name: str) -> Path | None:
    """The folder of template ``name`` under ``studio/datasets/*/tasks/``."""
    hits = sorted(Path(studio).glob(f"datasets/*/tasks/{name}/template.yaml"))
    return hits[0].parent if hits else None


@dataclass(frozen=True)
class Studio:
    """A whole studio tree: every dataset and every template."""

    path: Path
    datasets: dict[str, Dataset]
    templates: dict[str, TemplateFolder]


def load_studio(root: str | Path) -> Studio:
    """``studio/``: every ``datasets/<dataset>/`` and each of its ``tasks/<template>/``."""
    r = Path(root)
    datasets: dict[str, Dataset] = {}
    templates: dict[str, TemplateFolder] = {}
    for ds_yaml in sorted(r.glob("datasets/*/dataset.yaml")):
        ds = load_dataset(ds_yaml.parent)
        datasets[ds.name] = ds
        for tpl_yaml in sorted(ds_yaml.parent.glob("tasks/*/template.yaml")):
            tf = load_template(tpl_yaml.parent, dataset=ds)
            if tf.name in templates:
                raise SpecError(tpl_yaml, None, "name", f"template {tf.name!r} is defined twice")
            templates[tf.name] = tf
    return Studio(r, datasets, templates)


def _studio_of(set_path: Path) -> Path:
    # bench/benchmarks/<benchmark>/sets/<set>.yaml -> the `studio` folder beside `bench`
    parents = set_path.resolve().parents
    if len(parents) < 5:
        raise SpecError(set_path, None, "", "not under bench/benchmarks/<b>/sets/: pass studio=")
    return parents[4] / "studio"


def load_set(path: str | Path, *, studio: str | Path | None = None) -> TaskSet:
    """``sets/<set>.yaml``, checked against the studio (by default the ``studio`` folder
    beside ``bench``): every pair exists and is pinned at its cohort's N."""
    p = Path(path)
    return _load_set(p, Path(studio) if studio is not None else _studio_of(p), {})


def _load_set(p: Path, studio: Path, templates: dict[str, TemplateFolder]) -> TaskSet:
    ts, doc = _load(p, TaskSet)
    if msg := _bad_name(p.stem):
        raise SpecError(p, None, "", f"set file name: {msg}")
    for i, pair in enumerate(ts.pairs):
        tf = templates.get(pair.template)
        if tf is None:
            folder = find_template(studio, pair.template)
            if folder is None:
                raise doc.error(
                    f"pairs[{i}].task", f"no template {pair.template!r} under {studio}/datasets"
                )
            tf = templates[pair.template] = load_template(folder)
        cohort = tf.cohorts.get(pair.cohort)
        if cohort is None:
            have = ", ".join(tf.cohorts) or "none"
            raise doc.error(
                f"pairs[{i}].task", f"template {tf.name} has no cohort {pair.cohort!r} ({have})"
            )
        if cohort.version.n != pair.n:
            raise doc.error(
                f"pairs[{i}].n",
                f"pinned at N={pair.n}, but {pair.task} is at version {cohort.version}",
            )
        if LADDER_ARM in ts.arms and tf.ladder is None:
            raise doc.error(
                f"arms[{ts.arms.index(LADDER_ARM)}]",
                f"{pair.task} has no arms/{LADDER_ARM}.yaml for this arm",
            )
    return ts


@dataclass(frozen=True)
class BenchmarkFolder:
    """``bench/benchmarks/<benchmark>/``: the card and its task sets by set name."""

    name: str
    path: Path
    card: Benchmark
    sets: dict[str, TaskSet]


def load_benchmark(directory: str | Path, *, studio: str | Path | None = None) -> BenchmarkFolder:
    """A benchmark folder: ``benchmark.yaml`` and every ``sets/*.yaml``, each checked."""
    d = Path(directory)
    card, doc = _load(d / "benchmark.yaml", Benchmark)
    _named(doc, "name", card.name, d.name, "folder")
    cache: dict[str, TemplateFolder] = {}  # sets share templates: load each once
    sets: dict[str, TaskSet] = {}
    for p in sorted((d / "sets").glob("*.yaml")):
        root = Path(studio) if studio is not None else _studio_of(p)
        sets[p.stem] = _load_set(p, root, cache)
    return BenchmarkFolder(card.name, d, card, sets)
