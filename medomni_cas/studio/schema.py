"""The files a Studio user writes, as msgspec schemas: dataset.yaml, template.yaml, cohorts,
the modality ladder, benchmark.yaml and sets.

These are file schemas, not store records: the build step turns them into records. Each
struct checks its own values in ``problems()``; reading a file with its line numbers is
`medomni_cas.studio.specfile`, and the cross-file checks are `medomni_cas.studio.folders`.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import PurePosixPath

from medomni_cas.studio.labels import Bins, Recipe
from medomni_cas.studio.specfile import (
    Problems,
    Spec,
    SpecError,
    Version,
    bad_name,
    not_relative,
    unique,
)

__all__ = [
    "ARMS",
    "FIRST",
    "LADDER_ARM",
    "METRICS",
    "NESTED",
    "RUNGS",
    "SELECTIONS",
    "TASK_WORKSPACE",
    "Agent",
    "ArrayFamily",
    "Benchmark",
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
    "Problems",
    "Route",
    "Routes",
    "RowFilter",
    "Rung",
    "Spec",
    "SpecError",
    "Table",
    "Target",
    "TaskSet",
    "Template",
    "Timeouts",
    "Version",
    "known_arms",
    "submission_problem",
]

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
#: A cohort's selection rules: "first" (or left out) the first one, "nested" (see `Cohort`).
SELECTIONS = ("", "first", "nested")
FIRST = "first"
NESTED = "nested"
TABLE_SUFFIXES = (".parquet", ".csv", ".csv.gz")


# -- dataset.yaml ----------------------------------------------------------------------------
class Table(Spec, frozen=True, kw_only=True):
    """One table of the dataset: a Parquet or CSV file (relative to the dataset folder), the
    family its columns belong to, and its time column (none for a static table).

    Fields:
        name: The table's name, as a template's ``input.tables`` and label recipes name it.
        file: The file, relative to the dataset folder: ``.parquet``, ``.csv`` or ``.csv.gz``.
        family: The input family its columns belong to; atom tasks stage evidence by family.
        time_column: The column holding each row's time; leave it out for a static table
            (one row per patient, such as demographics).
        description: What the table holds, for people.
    """

    name: str
    file: str
    family: str
    time_column: str | None = None
    description: str = ""

    def problems(self) -> Problems:
        if msg := not_relative(self.file):
            yield "file", msg
        if not self.file.lower().endswith(TABLE_SUFFIXES):
            yield "file", f"a table is a {', '.join(TABLE_SUFFIXES)} file; got {self.file!r}"


class ArrayFamily(Spec, frozen=True, kw_only=True):
    """A family stored as zarr v3 arrays: a ``.zarr`` folder, or (with ``ref``) a medomni
    store folder whose ref ``ref`` names the hierarchy's tree (`medomni_cas.views.zarr_store`).
    Paths are relative to the dataset folder.

    Fields:
        name: The family's name; not also the family of a table.
        store: A ``.zarr`` folder, or (with ``ref``) a medomni store folder, relative to the
            dataset folder.
        ref: The ref in ``store`` that names the zarr hierarchy's tree; empty for a
            ``.zarr`` folder.
        description: What the arrays hold, for people.
    """

    name: str
    store: str
    ref: str = ""
    description: str = ""

    def problems(self) -> Problems:
        if msg := not_relative(self.store):
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


class Route(Spec, frozen=True, kw_only=True):
    """May data of this dataset go through a route: allow, deny, or conditional (with the
    conditions the harness prints before a run).

    Fields:
        policy: ``allow``, ``deny`` (the harness refuses the run) or ``conditional``.
        conditions: What you must meet to use a conditional route; printed before a run, and
            accepted with ``bench run --accept-conditions``. Only a conditional route has them.
    """

    policy: str
    conditions: str = ""

    def problems(self) -> Problems:
        if self.policy not in ROUTE_POLICIES:
            yield "policy", f"must be one of {', '.join(ROUTE_POLICIES)}; got {self.policy!r}"
        elif self.policy == "conditional" and not self.conditions.strip():
            yield "conditions", "a conditional route states its conditions"
        elif self.policy != "conditional" and self.conditions:
            yield "conditions", f"only a conditional route has conditions, not {self.policy!r}"


class Routes(Spec, frozen=True, kw_only=True):
    """The dataset's policy for each agent route (an agent config's ``route``).

    Fields:
        local: Agents whose model runs on your machine.
        cloud: Agents whose model is a provider's service.
    """

    local: Route
    cloud: Route


class Dataset(Spec, frozen=True, kw_only=True):
    """``studio/datasets/<dataset>/dataset.yaml``: a dataset release, its tables and array
    families, its route policies and its library of label recipes.

    Fields:
        name: The dataset's name; must be its folder's name.
        release: The dataset's release; part of every config hash built from it.
        description: What the dataset is, for people.
        patient_key: The column naming the patient in every table (a pseudonymous key).
        credentialed: Whether access needs credentials: a task set over it is published as
            configs only, and others rebuild it from their own access.
        routes: Whether data may go to a local or a cloud model.
        tables: The dataset's tables; at least one.
        arrays: Families stored as zarr arrays (such as waveforms).
        labels: The label recipes templates' targets name; each computes one answer per patient.
    """

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
        if msg := bad_name(self.name):
            yield "name", msg
        if not self.tables:
            yield "tables", "list at least one table"
        yield from unique([t.name for t in self.tables], "tables", "table")
        yield from unique([a.name for a in self.arrays], "arrays", "array family")
        yield from unique([lb.name for lb in self.labels], "labels", "label")
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
        return next((lb for lb in self.labels if lb.name == name), None)


# -- template.yaml ---------------------------------------------------------------------------
class Target(Spec, frozen=True, kw_only=True):
    """One target of a template: a label from the dataset's library, the metric that scores
    it, and the question put to the agent.

    Fields:
        label: The name of a label recipe in the dataset's ``labels``.
        metric: How predictions are scored; a classification metric for a label with
            classes, a numeric one for a number.
        question: The question for this target in the instruction; "your prediction" if left
            out.
    """

    label: str
    metric: str
    question: str | None = None

    def problems(self) -> Problems:
        if self.metric not in METRICS:
            yield "metric", f"unknown metric {self.metric!r} (known: {', '.join(METRICS)})"


class Input(Spec, frozen=True, kw_only=True):
    """The tables and families the proposal named, kept as a record: it masks nothing, the
    evidence is the patient's whole record minus the targets' guards (only the modality
    ladder's rungs stage part of it, from these families).

    Fields:
        tables: Tables of the dataset the proposal named.
        families: The families the proposal named; at least one. The modality ladder's rungs
            add families from this list.
    """

    tables: tuple[str, ...] = ()
    families: tuple[str, ...]

    def problems(self) -> Problems:
        if not self.families:
            yield "families", "name at least one family"
        yield from unique(self.tables, "tables", "table")
        yield from unique(self.families, "families", "family")


class Timeouts(Spec, frozen=True, kw_only=True):
    """How long an atom task may take.

    Fields:
        agent_sec: Seconds the agent has.
        verifier_sec: Seconds the format check has.
    """

    agent_sec: int
    verifier_sec: int = 60

    def problems(self) -> Problems:
        for f in ("agent_sec", "verifier_sec"):
            if getattr(self, f) <= 0:
                yield f, "a timeout is a positive number of seconds"


class Environment(Spec, frozen=True, kw_only=True):
    """What an atom task runs with.

    Fields:
        cpus: CPUs for the agent's container; at least 1.
        memory_mb: Memory for the agent's container, in MB; at least 64.
        timeouts: The agent's and the format check's time limits.
        internet: Always false: atom tasks run with no network.
    """

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


#: The task's workspace: where an atom's files are staged and its answer is read back.
TASK_WORKSPACE = PurePosixPath("/workspace")


def submission_problem(path: str) -> str | None:
    """What is wrong with a submission path, or None: it must name a file inside
    `TASK_WORKSPACE` (``/workspace/answer.json``), with no ``..``, NUL or trailing ``/``."""
    p = PurePosixPath(path)
    want = f"a file inside {TASK_WORKSPACE}, like {TASK_WORKSPACE}/answer.json; got {path!r}"
    if "\x00" in path or path.endswith("/") or ".." in p.parts or not p.is_absolute():
        return want
    try:
        inside = p.relative_to(TASK_WORKSPACE)
    except ValueError:
        return want
    return None if inside.parts else want


class Agent(Spec, frozen=True, kw_only=True):
    """What an agent needs to run the task: the question, the instruction, the environment and
    where to write the answer.

    Fields:
        statement: The clinical question; it opens every atom task's instruction.
        instruction: The template's own paragraph, on the prediction time and what was removed.
        environment: CPUs, memory, timeouts, no internet.
        submission_path: The absolute path in the task where the agent writes its answer (one
            JSON object, one prediction per target): a file inside the task's workspace,
            ``/workspace/…``, the only folder a run stages and reads back.
    """

    statement: str
    instruction: str
    environment: Environment
    submission_path: str

    def problems(self) -> Problems:
        if not self.statement.strip():
            yield "statement", "the clinical question must not be empty"
        if (problem := submission_problem(self.submission_path)) is not None:
            yield "submission_path", problem


class Template(Spec, frozen=True, kw_only=True):
    """``studio/datasets/<dataset>/tasks/<template>/template.yaml``: the clinical question, its
    targets and what the agent is given.

    Fields:
        name: The template's name; must be its folder's name.
        description: What the task asks, for people.
        targets: One or more; each names a label and its metric.
        input: The tables and families the proposal named.
        evidence: The evidence variants; this release builds ``default`` only.
        agent: The question, the instruction, the environment and the submission path.
    """

    name: str
    description: str = ""
    targets: tuple[Target, ...]
    input: Input
    evidence: tuple[str, ...] = (EVIDENCE_BUILT,)
    agent: Agent

    def problems(self) -> Problems:
        if msg := bad_name(self.name):
            yield "name", msg
        if not self.targets:
            yield "targets", "list at least one target"
        yield from unique([t.label for t in self.targets], "targets", "target label")
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
class RowFilter(Spec, frozen=True, kw_only=True):
    """Rows of a table that match every ``column: value`` of ``where``.

    Fields:
        table: A table of the dataset.
        where: ``column: value`` pairs a row must all match; empty for every row.
    """

    table: str
    where: dict[str, str | int | float | bool] = {}


class Inclusion(Spec, frozen=True, kw_only=True):
    """Who is in: patients with at least one row of each ``requires`` before the prediction
    time, and (by default) every target label defined.

    Fields:
        description: Who is in, for people.
        requires: Rows a patient must have before the prediction time, one filter each.
        labels_defined: Leave out patients for whom a target label has no value.
    """

    description: str
    requires: tuple[RowFilter, ...] = ()
    labels_defined: bool = True


class PredictionTime(Spec, frozen=True, kw_only=True):
    """The time of the ``pick`` (first or last) matching row of ``table``, plus an offset.

    Fields:
        description: When the prediction is made, for people.
        table: The table whose rows give the time (it must have a ``time_column``).
        where: ``column: value`` pairs the row must match; empty for every row.
        pick: Take the ``first`` or the ``last`` matching row of the patient.
        offset_days: Days added to that row's time (negative for earlier).
    """

    description: str = ""
    table: str
    where: dict[str, str | int | float | bool] = {}
    pick: str = "last"
    offset_days: int = 0

    def problems(self) -> Problems:
        if self.pick not in ("first", "last"):
            yield "pick", f"must be first or last; got {self.pick!r}"


class PerClass(Spec, frozen=True, kw_only=True):
    """How many patients of each class of one classification target.

    Fields:
        label: The classification label whose classes are counted.
        counts: Class name to number of patients; they add up to the cohort's ``n``.
    """

    label: str
    counts: dict[str, int]

    def problems(self) -> Problems:
        for cls, k in self.counts.items():
            if k < 0:
                yield "counts", f"class {cls!r} has a negative count"


class Cohort(Spec, frozen=True, kw_only=True):
    """``tasks/<template>/cohorts/<cohort>.yaml``; its name is the file's stem.

    Who is included, at which prediction time, and how many. Without ``per_class`` the
    patients of a smaller cohort are the first ones of a larger one with the same recipe and
    seed; with it, ``selection: nested`` makes them so.

    Fields:
        version: The task's version N.X, written as text such as ``"1.0"``: N rises when
            results stop being comparable, X for any other change. Tasks start at 1.0.
        description: Who the cohort holds, for people.
        inclusion: Who is in.
        prediction_time: When each patient's prediction is made.
        n: How many patients; at least one.
        per_class: How many patients of each class of one classification target; without it,
            the first ``n`` eligible patients in the seeded order.
        seed: The seed of the patients' order: with the same seed, a smaller cohort's
            patients are within a larger one (its first ones without ``per_class``, or
            with ``selection: nested``).
        selection: ``nested``: the patients of every smaller cohort of the template with
            the same recipe (inclusion, prediction time, seed, per-class label) come first,
            in their own order, then this cohort's others. ``first``: a per-class cohort
            takes each class's first patients in the seeded order, in that order (the rule
            cohorts were built with before ``nested`` existed, kept so that they keep their
            ids): a smaller cohort is within it, not its first patients. A per-class cohort
            with a smaller one of the same recipe within it states which (the rules differ
            there); elsewhere both select alike, and leaving it out means ``first``.
    """

    version: Version
    description: str = ""
    inclusion: Inclusion
    prediction_time: PredictionTime
    n: int
    per_class: PerClass | None = None
    seed: int = 0
    selection: str = ""

    def problems(self) -> Problems:
        if self.version.n < 1:
            yield "version", f"tasks start at 1.0; got {self.version}"
        if self.selection not in SELECTIONS:
            yield (
                "selection",
                f"must be {' or '.join(SELECTIONS[1:])}; got {self.selection!r}",
            )
        if self.n < 1:
            yield "n", "a cohort holds at least one patient"
        if self.per_class is not None and sum(self.per_class.counts.values()) != self.n:
            total = sum(self.per_class.counts.values())
            yield "per_class.counts", f"the counts add up to {total}, not n = {self.n}"


# -- arms/modality-ladder.yaml ---------------------------------------------------------------
class Rung(Spec, frozen=True, kw_only=True):
    """One rung of the modality ladder.

    Fields:
        name: ``r1`` to ``r6``, in order.
        add: The families this rung stages on top of the rung before; at least one, each in
            the template's ``input.families`` and staged at one rung only.
        description: What the rung adds, for people.
    """

    name: str
    add: tuple[str, ...]
    description: str = ""


class Ladder(Spec, frozen=True, kw_only=True):
    """``tasks/<template>/arms/modality-ladder.yaml``: the modality ladder, rungs r1..r6, each
    staging the families of the one before plus ``add``, all on one ladder cohort.

    Fields:
        cohort: The ladder cohort: a cohort file of the same template, the same at every rung.
        description: How the ladder climbs, for people.
        rungs: Exactly six rungs, r1 to r6.
    """

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
class Benchmark(Spec, frozen=True, kw_only=True):
    """``bench/benchmarks/<benchmark>/benchmark.yaml``: the card of a benchmark.

    Fields:
        name: The benchmark's name; its task sets are named ``<benchmark>/<set>``.
        version: The benchmark's version, as text.
        owner: Who maintains it.
        license: The license of its task sets, such as ``Apache-2.0``.
        description: What the benchmark measures, for people.
        intelligence_kinds: The kinds of intelligence it accepts (v0.3.0: ``agent``).
    """

    name: str
    version: str
    owner: str
    license: str
    description: str = ""
    intelligence_kinds: tuple[str, ...]

    def problems(self) -> Problems:
        if msg := bad_name(self.name):
            yield "name", msg
        if not self.intelligence_kinds:
            yield "intelligence_kinds", "name at least one kind (v0.3.0 has 'agent')"
        yield from unique(self.intelligence_kinds, "intelligence_kinds", "kind")


class Pair(Spec, frozen=True, kw_only=True):
    """``<template>@<cohort>`` pinned at its version N.

    Fields:
        task: The pair, ``<template>@<cohort>``.
        n: The version N the set pins; a new N enters only a new task set.
    """

    task: str
    n: int

    def problems(self) -> Problems:
        if self.task.count("@") != 1 or not all(self.task.split("@")):
            yield "task", f"a pair is written <template>@<cohort>; got {self.task!r}"
        if self.n < 1:
            yield "n", f"tasks start at 1.0: N is at least 1; got {self.n}"

    @property
    def template(self) -> str:
        return self.task.partition("@")[0]

    @property
    def cohort(self) -> str:
        return self.task.partition("@")[2]


class TaskSet(Spec, frozen=True, kw_only=True):
    """``bench/benchmarks/<benchmark>/sets/<set>.yaml``; its name is ``<benchmark>/<file stem>``.

    A task set only grows: pairs are added, never changed.

    Fields:
        description: What the set is for, for people.
        builder: The builder that builds every pair under every arm (``medomni-v1``).
        arms: The arms to build and run, built-in or from plug-ins (``medomni.arms``).
        pairs: The pairs, each pinned at its N.
    """

    description: str = ""
    builder: str
    arms: tuple[str, ...]
    pairs: tuple[Pair, ...]

    def problems(self) -> Problems:
        if msg := bad_name(self.builder):
            yield "builder", msg
        if not self.arms:
            yield "arms", "list at least one arm"
        known = known_arms()
        for i, arm in enumerate(self.arms):
            if arm not in known:
                yield f"arms[{i}]", f"unknown arm {arm!r} (known: {', '.join(known)})"
        yield from unique(self.arms, "arms", "arm")
        if not self.pairs:
            yield "pairs", "list at least one pair"
        yield from unique([p.task for p in self.pairs], "pairs", "pair")


def known_arms() -> tuple[str, ...]:
    """The built-in arms and those plug-ins register in ``medomni.arms``."""
    extra = sorted(ep.name for ep in entry_points(group="medomni.arms") if ep.name not in ARMS)
    return (*ARMS, *extra)
