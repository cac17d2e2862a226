"""Task sets: build one, record it under a ref that only grows, publish it, rebuild it.

* The ``TaskSetRecord`` is the set's definition (pairs pinned at N, arms, builder); its id
  is the task set content hash. ``tasksets/<benchmark>/<set>`` points at it and only grows:
  an update that drops a pair or an arm, changes a pair's N or the builder is refused.
* A ``SetBuild`` ties the set to the `BuildResult` of every pair under every arm (and rung);
  ``studio/sets/<benchmark>/<set>`` points at the latest one (it moves with X rises).
* ``publish(configs_only=True)`` writes a bundle whose closure holds the set, the card and
  the build configs, with the ids they built to as text: no patient data, no answers.
  ``rebuild`` builds the same set from one's own data and compares, pair by pair.

modality-ladder renders from its ladder cohort: in a set it is built for the pairs on that
cohort, and a set that lists the arm but no pair on some template's ladder cohort is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from medomni_cas.errors import MedomniError
from medomni_cas.store.bundle import BundleInfo, export_bundle, import_bundle, read_bundle_header
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_build
from medomni_cas.studio.benchmarks import benchmark_card, open_benchmark, split_set_name
from medomni_cas.studio.build import Built, build_pair
from medomni_cas.studio.folders import find_template, load_dataset, load_template
from medomni_cas.studio.records import (
    BuildConfig,
    BuildResult,
    PinnedPair,
    PublishedEntry,
    PublishedSet,
    SetBuild,
    SetEntry,
    TaskSetRecord,
)
from medomni_cas.studio.refnames import TASK_SET_REFS, published_ref, set_build_ref, task_set_ref
from medomni_cas.studio.schema import LADDER_ARM, TaskSet

__all__ = [
    "RebuildRow",
    "SetView",
    "SetBuilt",
    "TaskSetError",
    "build_set",
    "check_grows",
    "publish",
    "rebuild",
    "record_task_set",
    "show_set",
    "task_set_record",
]

Progress = Callable[[str], None]


class TaskSetError(MedomniError, ValueError):
    """A task set update that would not only grow, or a set that cannot be built."""


def task_set_record(name: str, ts: TaskSet) -> TaskSetRecord:
    """The record of ``sets/<set>.yaml``: sorted, so the file's order does not matter."""
    split_set_name(name)
    return TaskSetRecord(
        name=name,
        builder=ts.builder,
        arms=tuple(sorted(ts.arms)),
        pairs=tuple(sorted((PinnedPair(task=p.task, n=p.n) for p in ts.pairs), key=_task)),
    )


def _task(p: PinnedPair) -> str:
    return p.task


def check_grows(old: TaskSetRecord, new: TaskSetRecord) -> None:
    """Refuse ``new`` unless it holds everything ``old`` does, unchanged."""
    where = f"task set {new.name}"
    if old.builder != new.builder:
        raise TaskSetError(
            f"{where}: builder changed from {old.builder} to {new.builder}; "
            "a new builder makes a new set"
        )
    new_n = {p.task: p.n for p in new.pairs}
    for p in old.pairs:
        if p.task not in new_n:
            raise TaskSetError(f"{where}: pair {p.task} was dropped; a task set only grows")
        if new_n[p.task] != p.n:
            raise TaskSetError(
                f"{where}: pair {p.task} moved from N={p.n} to N={new_n[p.task]}; a new N "
                "enters only a new task set (such as v2)"
            )
    dropped = sorted(set(old.arms) - set(new.arms))
    if dropped:
        raise TaskSetError(f"{where}: arm {dropped[0]} was dropped; a task set only grows")


def record_task_set(store: Store, rec: TaskSetRecord) -> ObjectId:
    """Store ``rec`` and move ``tasksets/<name>`` to it if it only grows the old value."""
    rid = store.put(rec)

    def grow(current: ObjectId | None) -> ObjectId:
        if current is not None and current != rid:
            check_grows(store.get(current, TaskSetRecord), rec)
        return rid

    store.refs.update(task_set_ref(rec.name), grow, message=f"task set {rec.name}")
    return rid


@dataclass(frozen=True)
class SetBuilt:
    name: str
    task_set: ObjectId
    build: ObjectId
    builds: list[Built]

    @property
    def cached(self) -> bool:
        return all(b.cached for b in self.builds)


def _plan(ts: TaskSet, studio: Path, name: str) -> list[tuple[str, str, list[str]]]:
    """(template, cohort, arms) per pair: the ladder only where the cohort is its ladder's."""
    plan = []
    ladder_met: dict[str, bool] = {}
    for p in ts.pairs:
        arms = [a for a in ts.arms if a != LADDER_ARM]
        if LADDER_ARM in ts.arms:
            folder = find_template(studio, p.template)
            ladder = load_template(folder).ladder if folder is not None else None
            on_ladder = ladder is not None and ladder.cohort == p.cohort
            ladder_met[p.template] = ladder_met.get(p.template, False) or on_ladder
            if on_ladder:
                arms.append(LADDER_ARM)
        plan.append((p.template, p.cohort, arms))
    missing = sorted(t for t, met in ladder_met.items() if not met)
    if missing:
        raise TaskSetError(
            f"task set {name}: lists {LADDER_ARM} but no pair of {missing[0]} is on its "
            "ladder cohort (see its arms/modality-ladder.yaml)"
        )
    return plan


def build_set(
    store: Store,
    name: str,
    *,
    studio: str | Path,
    bench: str | Path | None,
    data_root: str | Path | None = None,
    progress: Progress | None = None,
    on_pair: Callable[[str, list[Built]], object] | None = None,
    shard: tuple[int, int] | None = None,
) -> SetBuilt | None:
    """Build every pair of ``<benchmark>/<set>`` under every arm, record the set (refusing
    an update that does not only grow) and its build.

    ``shard=(i, n)`` builds only every n-th pair from the i-th and records nothing: any
    number of machines can build shards into one store, then one unsharded build (which
    finds every pair built and renders nothing) records the set. Returns None for a shard.
    """
    if shard is not None and not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise TaskSetError(f"shard {shard[0]}/{shard[1]}: want i/n with 0 <= i < n")
    bench_name, set_name = split_set_name(name)
    folder = open_benchmark(bench_name, bench_root=bench, studio=studio)
    if set_name not in folder.sets:
        have = ", ".join(folder.sets) or "none"
        raise TaskSetError(f"benchmark {bench_name} has no set {set_name!r} (have: {have})")
    ts = folder.sets[set_name]
    for arm in ts.arms:
        arm_build(ts.builder, arm)  # a builder refuses an arm it does not support, up front
    rec = task_set_record(name, ts)
    old = store.refs.get(task_set_ref(name))
    if old is not None:  # refuse before building anything (an unchanged set passes)
        check_grows(store.get(old, TaskSetRecord), rec)
    built: list[Built] = []
    plan = _plan(ts, Path(studio), name)
    if shard is not None:
        plan = plan[shard[0] :: shard[1]]
    for template, cohort, arms in plan:
        pair = build_pair(
            store, studio, template, cohort, arms=arms, data_root=data_root, progress=progress
        )
        built += pair
        if on_pair is not None:
            on_pair(f"{template}@{cohort}", pair)
    if shard is not None:
        return None
    rid = record_task_set(store, rec)
    store.put(benchmark_card(folder))
    entries = []
    for b in built:
        result = store.get(b.result, BuildResult)
        entries.append(
            SetEntry(
                pair=b.pair,
                version=result.version,
                arm=b.arm,
                arm_variant=b.variant,
                config=b.config,
                result=b.result,
            )
        )
    sb = store.put(SetBuild(task_set=rid, entries=tuple(entries)))
    if store.refs.get(set_build_ref(name)) != sb:
        store.refs.update(set_build_ref(name), lambda _old: sb, message=f"build {name}")
    return SetBuilt(name, rid, sb, built)


@dataclass(frozen=True)
class SetView:
    name: str
    task_set: ObjectId
    record: TaskSetRecord
    build: ObjectId | None
    entries: tuple[SetEntry, ...]


def show_set(store: Store, name: str) -> SetView:
    """The recorded set ``name`` and its latest build (if any)."""
    split_set_name(name)
    rid = store.refs.get(task_set_ref(name))
    if rid is None:
        have = sorted(n.removeprefix(TASK_SET_REFS) for n, _ in store.refs.items(TASK_SET_REFS))
        raise TaskSetError(
            f"no task set {name!r} in {store.url} (recorded: {', '.join(have) or 'none'}; "
            f"build it with `medomni studio taskset build {name}`)"
        )
    rec = store.get(rid, TaskSetRecord)
    sb_id = store.refs.get(set_build_ref(name))
    entries: tuple[SetEntry, ...] = ()
    if sb_id is not None:
        sb = store.get(sb_id, SetBuild)
        if sb.task_set == rid:
            entries = sb.entries
        else:
            sb_id = None  # built before the set last grew: not a build of this set
    return SetView(name, rid, rec, sb_id, entries)


def _credentialed(store: Store, studio: Path | None, entries: tuple[SetEntry, ...]) -> list[str]:
    datasets = sorted({store.get(e.config, BuildConfig).dataset for e in entries})
    if studio is None:
        return datasets  # unknown: treat as credentialed
    out = []
    for ds in datasets:
        card = studio / "datasets" / ds / "dataset.yaml"
        if not card.is_file() or load_dataset(card.parent).credentialed:
            out.append(ds)
    return out


def publish(
    store: Store,
    name: str,
    path: str | os.PathLike[str],
    *,
    configs_only: bool = True,
    studio: str | Path | None = None,
    bench: str | Path | None = None,
) -> BundleInfo:
    """Write ``<benchmark>/<set>``'s bundle to ``path``.

    ``configs_only``: the set, its benchmark card and every build config, with the ids they
    built to as text (a `PublishedSet`). Otherwise the whole build, answers included, which
    is refused for a set that reads a credentialed dataset (or one the studio does not show).
    """
    view = show_set(store, name)
    if not view.entries:
        raise TaskSetError(f"task set {name} has no build; run `medomni studio taskset build`")
    studio_path = Path(studio) if studio is not None else None
    refs = {task_set_ref(name): view.task_set}
    if not configs_only:
        cred = _credentialed(store, studio_path, view.entries)
        if cred:
            raise TaskSetError(
                f"task set {name} reads credentialed data ({', '.join(cred)}); only its "
                "configs may leave this store: publish with --configs-only"
            )
        assert view.build is not None
        return export_bundle(
            store, [view.build], path, refs=refs | {set_build_ref(name): view.build}
        )
    bench_name, _ = split_set_name(name)
    if studio_path is None:
        raise TaskSetError("publishing needs the studio folder (for the benchmark's card)")
    folder = open_benchmark(bench_name, bench_root=bench, studio=studio_path)
    card = store.put(benchmark_card(folder))
    entries = []
    for e in view.entries:
        result = store.get(e.result, BuildResult)
        entries.append(
            PublishedEntry(
                pair=e.pair,
                version=e.version,
                arm=e.arm,
                arm_variant=e.arm_variant,
                config=e.config,
                result=e.result.hex(),
                content=result.content.hex(),
                atoms=tuple(a.hex() for a in result.atoms),
            )
        )
    pub = store.put(PublishedSet(task_set=view.task_set, benchmark=card, entries=tuple(entries)))
    return export_bundle(store, [pub], path, refs=refs | {published_ref(name): pub})


@dataclass(frozen=True)
class RebuildRow:
    """One pair under one arm (and rung): does our build match the published ids?"""

    pair: str
    arm: str
    arm_variant: str
    status: str  # "match" | "config differs" | "data differs" | "not built"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "match"


def _config_diff(a: BuildConfig, b: BuildConfig) -> str:
    fields = [f for f in BuildConfig.__struct_fields__ if getattr(a, f) != getattr(b, f)]
    return "fields: " + ", ".join(fields)


def rebuild(
    store: Store,
    bundle: str | os.PathLike[str],
    *,
    studio: str | Path,
    bench: str | Path | None,
    data_root: str | Path | None = None,
    progress: Progress | None = None,
) -> tuple[str, list[RebuildRow]]:
    """Build the set a configs-only bundle describes from one's own data; compare the ids.

    The bundle is verified and its objects (configs only) are added to ``store`` first.
    Returns the set's name and one row per published pair, arm and variant.
    """
    header = read_bundle_header(bundle)
    import_bundle(store, bundle, refs=False)
    pubs = [ObjectId.from_hex(r) for r in header.roots]
    if len(pubs) != 1 or store.kind(pubs[0]) != PublishedSet.__kind__:
        raise TaskSetError(
            f"{os.fspath(bundle)}: not a configs-only task set bundle "
            "(`medomni studio taskset publish --configs-only`)"
        )
    pub = store.get(pubs[0], PublishedSet)
    published_set = store.get(pub.task_set, TaskSetRecord)
    name = published_set.name
    built = build_set(
        store, name, studio=studio, bench=bench, data_root=data_root, progress=progress
    )
    assert built is not None  # unsharded
    if built.task_set != pub.task_set:
        raise TaskSetError(
            f"task set {name}: the local sets file differs from the published one "
            f"(task set hash {built.task_set} here, {pub.task_set} published)"
        )
    ours = {(b.pair, b.arm, b.variant): b for b in built.builds}
    rows = []
    for e in pub.entries:
        b = ours.get((e.pair, e.arm, e.arm_variant))
        if b is None:
            rows.append(RebuildRow(e.pair, e.arm, e.arm_variant, "not built"))
            continue
        if b.config != e.config:
            diff = _config_diff(store.get(e.config, BuildConfig), store.get(b.config, BuildConfig))
            rows.append(RebuildRow(e.pair, e.arm, e.arm_variant, "config differs", diff))
        elif b.result.hex() != e.result:
            result = store.get(b.result, BuildResult)
            theirs = set(e.atoms)
            differ = sum(1 for a in result.atoms if a.hex() not in theirs)
            differ += max(0, len(e.atoms) - len(result.atoms))
            detail = f"{differ} of {len(e.atoms)} atom tasks differ"
            if result.content.hex() == e.content:
                detail += "; the evidence matches (the answers differ)"
            rows.append(RebuildRow(e.pair, e.arm, e.arm_variant, "data differs", detail))
        else:
            rows.append(RebuildRow(e.pair, e.arm, e.arm_variant, "match"))
    return name, rows
