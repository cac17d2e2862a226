"""Loading a studio's folders: datasets, templates with their cohorts and ladder, task sets
and benchmarks, each checked against the others (a target's label exists in its dataset, a
set's pair is pinned at its cohort's N, or below it once the pair moved on: a frozen pair).

Kept cohorts
------------
When a cohort moves to a new N, its file as it was may be kept in ``cohorts/N<k>/`` (such
as ``cohorts/N1/n50.yaml``, at 1.x): a set that pins the pair at N=k (a frozen pair) then
builds it from that file, to the ids it was built to, on any machine (`at_pins`). Without
one, the set keeps the pair's last build in the store it was built in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from medomni_cas.studio.cohorts import NestingError, nested_prefix, not_first
from medomni_cas.studio.labels import Guard
from medomni_cas.studio.schema import (
    FIRST,
    LADDER_ARM,
    METRICS,
    NESTED,
    Benchmark,
    Cohort,
    Dataset,
    Ladder,
    TaskSet,
    Template,
    Version,
)
from medomni_cas.studio.specfile import (
    Doc,
    SpecError,
    bad_name,
    check_named,
    load_with_doc,
    load_yaml,
)

__all__ = [
    "BenchmarkFolder",
    "FrozenPair",
    "Studio",
    "TemplateFolder",
    "at_pins",
    "find_template",
    "kept_dir",
    "load_benchmark",
    "load_cohort",
    "load_dataset",
    "load_ladder",
    "load_set",
    "load_set_with_frozen",
    "load_studio",
    "load_template",
    "nesting_notes",
]


def _dataset(directory: Path) -> tuple[Dataset, Doc]:
    ds, doc = load_with_doc(directory / "dataset.yaml", Dataset)
    check_named(doc, "name", ds.name, directory.name, "folder")
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


def _check_guard(doc: Doc, field: str, g: Guard, ds: Dataset) -> None:
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


#: A folder under ``cohorts/`` keeping cohort files as they were at N=k: ``N<k>``.
_KEPT_DIR = re.compile(r"N([1-9][0-9]*)")


def kept_dir(n: int) -> str:
    """The folder under ``cohorts/`` that keeps cohort files at N=``n``."""
    return f"N{n}"


@dataclass(frozen=True)
class TemplateFolder:
    """A template folder as loaded and checked against its dataset."""

    name: str
    path: Path
    dataset: Dataset
    template: Template
    cohorts: dict[str, Cohort]
    ladder: Ladder | None
    #: cohort name -> N -> its file kept in ``cohorts/N<k>/``, always below its N now
    kept: dict[str, dict[int, Cohort]] = field(default_factory=dict)
    #: the cohorts that `at_pins` took from ``kept`` (the set pins them below their N)
    pinned_below: frozenset[str] = frozenset()

    def kept_path(self, cohort: str, n: int) -> Path:
        return self.path / "cohorts" / kept_dir(n) / f"{cohort}.yaml"


def load_template(directory: str | Path, *, dataset: Dataset | None = None) -> TemplateFolder:
    """``tasks/<template>/``: template.yaml, cohorts/*.yaml and arms/modality-ladder.yaml,
    checked against the dataset two folders up (or ``dataset``)."""
    d = Path(directory)
    tpl, doc = load_with_doc(d / "template.yaml", Template)
    ds = dataset if dataset is not None else load_dataset(d.parent.parent)
    check_named(doc, "name", tpl.name, d.name, "folder")
    _check_template(doc, tpl, ds)
    cohorts: dict[str, Cohort] = {}
    docs: dict[str, Doc] = {}
    for path in sorted((d / "cohorts").glob("*.yaml")):
        cohort, cdoc = load_with_doc(path, Cohort)
        if msg := bad_name(path.stem):
            raise SpecError(path, None, "", f"cohort file name: {msg}")
        _check_cohort(cdoc, cohort, tpl, ds)
        cohorts[path.stem] = cohort
        docs[path.stem] = cdoc
    for name, cdoc in docs.items():
        _check_nesting(cdoc, cohorts, name)
    kept = _kept_cohorts(d / "cohorts", cohorts, tpl, ds)
    ladder = None
    ladder_path = d / "arms" / f"{LADDER_ARM}.yaml"
    if ladder_path.exists():
        ladder, ldoc = load_with_doc(ladder_path, Ladder)
        if ladder.cohort not in cohorts:
            have = ", ".join(cohorts) or "none"
            raise ldoc.error("cohort", f"no cohort {ladder.cohort!r} in cohorts/ (have: {have})")
        for i, rung in enumerate(ladder.rungs):
            for j, fam in enumerate(rung.add):
                if fam not in tpl.input.families:
                    raise ldoc.error(
                        f"rungs[{i}].add[{j}]", f"family {fam!r} is not in the template's input"
                    )
    return TemplateFolder(d.name, d, ds, tpl, cohorts, ladder, kept)


def _check_nesting(doc: Doc, cohorts: dict[str, Cohort], name: str) -> None:
    """A nested cohort's smaller ones fit in it; a per-class cohort with a smaller one of
    the same recipe within it says which rule it follows (`Cohort.selection`), since the
    two rules order it differently: a file written today gets the Tasks document's rule
    only by asking for it, and one written before keeps its ids by saying ``first``."""
    try:
        nested_prefix(cohorts, name)
    except NestingError as e:
        raise doc.error("selection", str(e)) from None
    smaller = not_first(cohorts, name)
    if smaller and not cohorts[name].selection:
        raise doc.error(
            "selection",
            f"the patients of {', '.join(smaller)} (the same recipe, smaller) are within this "
            f'cohort: say where they go. `selection: {NESTED}` puts them first ("the patients '
            f'of n20 are the first ones of n50"; for a cohort already built, a new N); '
            f"`selection: {FIRST}` keeps the rule it was built with before `{NESTED}` "
            "existed, and its ids",
        )


def _kept_cohorts(
    folder: Path, cohorts: dict[str, Cohort], tpl: Template, ds: Dataset
) -> dict[str, dict[int, Cohort]]:
    """``cohorts/N<k>/<cohort>.yaml``: each at N=k, below its cohort's N now."""
    kept: dict[str, dict[int, Cohort]] = {}
    if not folder.is_dir():
        return kept
    # hidden folders (an editor's, a notebook's checkpoints) are nobody's kept files
    subs = [p for p in sorted(folder.iterdir()) if p.is_dir() and not p.name.startswith(".")]
    for sub in subs:
        m = _KEPT_DIR.fullmatch(sub.name)
        if m is None:
            raise SpecError(
                sub,
                None,
                "",
                "a folder under cohorts/ keeps cohort files at an earlier N, "
                "and is named N<k> (such as N1)",
            )
        k = int(m.group(1))
        for path in sorted(sub.glob("*.yaml")):
            cohort, doc = load_with_doc(path, Cohort)
            if msg := bad_name(path.stem):
                raise SpecError(path, None, "", f"cohort file name: {msg}")
            _check_cohort(doc, cohort, tpl, ds)
            now = cohorts.get(path.stem)
            if now is None:
                raise SpecError(
                    path,
                    None,
                    "",
                    f"no cohorts/{path.stem}.yaml: {sub.name}/ keeps earlier "
                    "versions of the template's cohorts",
                )
            if cohort.version.n != k:
                raise doc.error("version", f"a file kept in {sub.name}/ is at N={k}")
            if now.version.n <= k:
                raise doc.error(
                    "version",
                    f"cohorts/{path.stem}.yaml is at {now.version}: {sub.name}/ keeps it at "
                    "an N it has moved past",
                )
            _check_nesting(doc, {**cohorts, path.stem: cohort}, path.stem)
            kept.setdefault(path.stem, {})[k] = cohort
    return kept


def at_pins(folder: TemplateFolder, pins: Mapping[str, int]) -> TemplateFolder:
    """The template as a set pinning its cohorts at ``pins`` (cohort -> N) builds it: each
    cohort pinned below its N is its kept file at that N, where one is kept."""
    swap = {
        c: folder.kept[c][n]
        for c, n in pins.items()
        if c in folder.cohorts and n < folder.cohorts[c].version.n and n in folder.kept.get(c, {})
    }
    if not swap:
        return folder
    view = replace(folder, cohorts={**folder.cohorts, **swap}, pinned_below=frozenset(swap))
    for name in swap:
        try:
            nested_prefix(view.cohorts, name)
        except NestingError as e:
            path = folder.kept_path(name, swap[name].version.n)
            raise SpecError(path, None, "selection", str(e)) from None
    return view


def _check_template(doc: Doc, tpl: Template, ds: Dataset) -> None:
    for i, t in enumerate(tpl.targets):
        label = ds.label(t.label)
        if label is None:
            have = ", ".join(lb.name for lb in ds.labels) or "none"
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


def _check_cohort(doc: Doc, cohort: Cohort, tpl: Template, ds: Dataset) -> None:
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


def nesting_notes(studio: str | Path, pairs: list[str]) -> list[str]:
    """A line for each of ``pairs`` whose smaller cohorts are within it but not its first
    patients: it keeps the first selection rule, so that it keeps its ids; the letter of
    the Tasks document ("the patients of n20 are the first ones of n50") needs
    ``selection: nested`` in its file, and with it a new N."""
    out = []
    folders: dict[str, TemplateFolder] = {}
    for pair in dict.fromkeys(pairs):
        template, _, cohort = pair.partition("@")
        if template not in folders:
            path = find_template(studio, template)
            if path is None:
                continue
            folders[template] = load_template(path)
        tf = folders[template]
        if cohort not in tf.cohorts:
            continue
        smaller = not_first(tf.cohorts, cohort)
        if smaller:
            out.append(
                f"{pair}: the patients of {', '.join(smaller)} are within it, not its first "
                f"ones; `selection: nested` in {tf.path / 'cohorts' / cohort}.yaml makes them "
                "so (the order changes: a new N)"
            )
    return out


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


@dataclass(frozen=True)
class FrozenPair:
    """A pair a set pins below its cohort's N: the set keeps the pair's last build, which
    no file can make again ("a new N enters only a new task set")."""

    task: str
    pinned: int  # the set's N
    version: Version  # the cohort file's, now
    where: str  # "<set file>:<line>: pairs[i].n", for messages
    #: its cohort's file kept at N=pinned (``cohorts/N<k>/``), which builds it again
    kept: Path | None = None

    def __str__(self) -> str:
        return f"{self.task} frozen at N={self.pinned} (its cohort file is at {self.version})"


def load_set(path: str | Path, *, studio: str | Path | None = None) -> TaskSet:
    """``sets/<set>.yaml``, checked against the studio (by default the ``studio`` folder
    beside ``bench``): every pair exists and is pinned at its cohort's N, or below it
    (a frozen pair, see `FrozenPair`)."""
    return load_set_with_frozen(path, studio=studio)[0]


def load_set_with_frozen(
    path: str | Path, *, studio: str | Path | None = None
) -> tuple[TaskSet, dict[str, FrozenPair]]:
    """`load_set`, with the set's frozen pairs by task."""
    p = Path(path)
    return _load_set(p, Path(studio) if studio is not None else _studio_of(p), {})


def _load_set(
    p: Path, studio: Path, templates: dict[str, TemplateFolder]
) -> tuple[TaskSet, dict[str, FrozenPair]]:
    frozen: dict[str, FrozenPair] = {}
    ts, doc = load_with_doc(p, TaskSet)
    if msg := bad_name(p.stem):
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
        if cohort.version.n < pair.n:
            raise doc.error(
                f"pairs[{i}].n",
                f"pinned at N={pair.n}, but {pair.task} is at version {cohort.version}",
            )
        if cohort.version.n > pair.n:  # the pair moved on: this set keeps its last build
            where = f"{p}:{doc.line(['pairs', i, 'n'])}: pairs[{i}].n"
            has = pair.n in tf.kept.get(pair.cohort, {})
            kept = tf.kept_path(pair.cohort, pair.n) if has else None
            frozen[pair.task] = FrozenPair(pair.task, pair.n, cohort.version, where, kept)
        if LADDER_ARM in ts.arms and tf.ladder is None:
            raise doc.error(
                f"arms[{ts.arms.index(LADDER_ARM)}]",
                f"{pair.task} has no arms/{LADDER_ARM}.yaml for this arm",
            )
    return ts, frozen


@dataclass(frozen=True)
class BenchmarkFolder:
    """``bench/benchmarks/<benchmark>/``: the card and its task sets by set name, and each
    set's frozen pairs (pinned below their cohort's N) by set name and task."""

    name: str
    path: Path
    card: Benchmark
    sets: dict[str, TaskSet]
    frozen: dict[str, dict[str, FrozenPair]] = field(default_factory=dict)


def load_benchmark(directory: str | Path, *, studio: str | Path | None = None) -> BenchmarkFolder:
    """A benchmark folder: ``benchmark.yaml`` and every ``sets/*.yaml``, each checked."""
    d = Path(directory)
    card, doc = load_with_doc(d / "benchmark.yaml", Benchmark)
    check_named(doc, "name", card.name, d.name, "folder")
    cache: dict[str, TemplateFolder] = {}  # sets share templates: load each once
    sets: dict[str, TaskSet] = {}
    frozen: dict[str, dict[str, FrozenPair]] = {}
    for p in sorted((d / "sets").glob("*.yaml")):
        root = Path(studio) if studio is not None else _studio_of(p)
        sets[p.stem], frozen[p.stem] = _load_set(p, root, cache)
    return BenchmarkFolder(card.name, d, card, sets, frozen)
