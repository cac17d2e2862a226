"""Task sets: build one, record it under a ref that only grows, publish it, rebuild it.

* The ``TaskSetRecord`` is the set's definition (pairs pinned at N, arms, builder); its id
  is the task set content hash. ``tasksets/<benchmark>/<set>`` points at it and only grows:
  an update that drops a pair or an arm, changes a pair's N or the builder is refused.
* A ``SetBuild`` ties the set to the `BuildResult` of every pair under every arm (and rung);
  ``studio/sets/<benchmark>/<set>`` points at the latest one (it moves with X rises).
* ``publish`` writes, by default, a bundle whose closure holds the set, the card and the
  build configs, with the ids they built to as text: no patient data, no answers. Only
  ``with_data=True`` writes the whole build (evidence and answer keys), and never for a
  set that reads a credentialed dataset. The bundle's manifest says which it holds
  (`HOLDS`). ``rebuild`` builds every published config from itself and one's own dataset
  (no set file or template is read) and compares the ids, pair by pair.
* A pair a set pins below its cohort's N is frozen (`FrozenPair`): the set keeps the pair's
  last build, since a new N enters only a new task set, and cannot change any more.

modality-ladder renders from its ladder cohort: in a set it is built for the pairs on that
cohort, and a set that lists the arm but no pair on some template's ladder cohort is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from medomni_cas.errors import MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.bundle import BundleInfo, export_bundle, import_bundle, read_bundle_header
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_build
from medomni_cas.studio.benchmarks import benchmark_card, open_benchmark, split_set_name
from medomni_cas.studio.build import Built, build_configs, build_pair, config_problems
from medomni_cas.studio.commitments import commitment_of
from medomni_cas.studio.folders import FrozenPair, find_template, load_dataset, load_template
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
from medomni_cas.studio.refnames import (
    TASK_SET_REFS,
    commitment_ref,
    published_ref,
    set_build_ref,
    task_set_ref,
)
from medomni_cas.studio.schema import LADDER_ARM, Dataset, TaskSet, Version

__all__ = [
    "CONFIGS_ONLY",
    "HOLDS",
    "WITH_DATA",
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
    #: pairs pinned below their cohort's N, kept from the set's last build
    frozen: tuple[FrozenPair, ...] = ()

    @property
    def cached(self) -> bool:
        return all(b.cached for b in self.builds)


def _kept_entries(
    store: Store, name: str, rec: TaskSetRecord, frozen: dict[str, FrozenPair]
) -> dict[str, list[SetEntry]]:
    """The last build's entries of each frozen pair: the set keeps them, since no file can
    build the pair at its N again. Refused when the set changed since (a frozen set cannot
    grow) or this store has no build of it."""
    first = next(iter(frozen.values()))
    what = (
        f"task set {name} is frozen at N={first.pinned} for {first.task} (its cohort file "
        f"is at {first.version})"
    )
    rid = hash_bytes(encoding.encode(rec))
    current = store.refs.get(task_set_ref(name))
    sb_id = store.refs.get(set_build_ref(name))
    sb = store.get(sb_id, SetBuild) if sb_id is not None else None
    if current is not None and current != rid:
        raise TaskSetError(
            f"{first.where}: {what}: it keeps its last build and cannot change; add pairs "
            "or arms to a new task set (such as v2)"
        )
    if current is None or sb is None or sb.task_set != rid:
        raise TaskSetError(
            f"{first.where}: {what}, and {store.url} has no build of it: rebuild it from "
            "its published bundle (`medomni studio taskset rebuild BUNDLE`) or pull it "
            f"from a store that has it (a new set pins the cohort's N, {first.version.n})"
        )
    kept: dict[str, list[SetEntry]] = {}
    for task, fp in frozen.items():
        entries = [e for e in sb.entries if e.pair == task]
        if not entries or any(Version.parse(e.version).n != fp.pinned for e in entries):
            raise TaskSetError(
                f"{fp.where}: {fp}, and the last build of {name} has no build of it at "
                f"N={fp.pinned}"
            )
        kept[task] = entries
    return kept


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
    frozen = folder.frozen.get(set_name, {})
    for arm in ts.arms:
        arm_build(ts.builder, arm)  # a builder refuses an arm it does not support, up front
    rec = task_set_record(name, ts)
    old = store.refs.get(task_set_ref(name))
    if old is not None:  # refuse before building anything (an unchanged set passes)
        check_grows(store.get(old, TaskSetRecord), rec)
    kept = _kept_entries(store, name, rec, frozen) if frozen else {}
    built: list[Built] = []
    plan = [p for p in _plan(ts, Path(studio), name) if f"{p[0]}@{p[1]}" not in frozen]
    if shard is not None:
        plan = plan[shard[0] :: shard[1]]
    for template, cohort, arms in plan:
        pair = build_pair(
            store, studio, template, cohort, arms=arms, data_root=data_root, progress=progress
        )
        built += pair
        if on_pair is not None:
            on_pair(f"{template}@{cohort}", pair)
    for task in frozen:
        if on_pair is not None:
            on_pair(task, [])
    if shard is not None:
        return None
    rid = record_task_set(store, rec)
    store.put(benchmark_card(folder))
    by_pair: dict[str, list[SetEntry]] = dict(kept)
    for b in built:
        result = store.get(b.result, BuildResult)
        by_pair.setdefault(b.pair, []).append(
            SetEntry(
                pair=b.pair,
                version=result.version,
                arm=b.arm,
                arm_variant=b.variant,
                config=b.config,
                result=b.result,
            )
        )
    # in the set file's order, frozen pairs in theirs: an unchanged set keeps its build's id
    entries = [e for p in ts.pairs for e in by_pair.get(p.task, [])]
    sb = store.put(SetBuild(task_set=rid, entries=tuple(entries)))
    if store.refs.get(set_build_ref(name)) != sb:
        store.refs.update(set_build_ref(name), lambda _old: sb, message=f"build {name}")
    return SetBuilt(name, rid, sb, built, tuple(frozen.values()))


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


#: The manifest key of a published bundle (`publish`) saying what it holds, and its values.
HOLDS = "holds"
CONFIGS_ONLY = "configs-only"
WITH_DATA = "with-data"


def publish(
    store: Store,
    name: str,
    path: str | os.PathLike[str],
    *,
    with_data: bool = False,
    studio: str | Path | None = None,
    bench: str | Path | None = None,
    with_commitment: bool = True,
) -> BundleInfo:
    """Write ``<benchmark>/<set>``'s bundle to ``path``.

    By default the set, its benchmark card and every build config, with the ids they
    built to as text (a `PublishedSet`): no patient data, no answers. ``with_data``: the
    whole build, evidence and answer keys included, which is refused for a set that reads
    a credentialed dataset (``credentialed: true`` in its ``dataset.yaml``, or one the
    studio does not show). The manifest says which (``holds``: `CONFIGS_ONLY` or
    `WITH_DATA`, and ``task_set``: the name).

    The set's answer commitment (`medomni_cas.studio.commitments`), when it has one for
    this build, goes along by default (``with_commitment``): the small `AnswerCommitment`
    under ``studio/commitments/<set>``, and ``commitment`` in the manifest. Its salts never
    do, in either kind of bundle.
    """
    view = show_set(store, name)
    if not view.entries:
        raise TaskSetError(f"task set {name} has no build; run `medomni studio taskset build`")
    studio_path = Path(studio) if studio is not None else None
    refs = {task_set_ref(name): view.task_set}
    extra: dict[str, str] = {}
    committed = commitment_of(store, name) if with_commitment else None
    if (
        committed is not None
        and view.build is not None
        and (committed[1].set_build == view.build.hex())
    ):
        refs[commitment_ref(name)] = committed[0]
        extra["commitment"] = committed[0].hex()
    if with_data:
        cred = _credentialed(store, studio_path, view.entries)
        if cred:
            raise TaskSetError(
                f"task set {name} reads credentialed data ({', '.join(cred)}); only its "
                "configs may leave this store: publish it without --with-data"
            )
        assert view.build is not None
        return export_bundle(
            store,
            [view.build],
            path,
            refs=refs | {set_build_ref(name): view.build},
            manifest={HOLDS: WITH_DATA, "task_set": name, **extra},
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
    return export_bundle(
        store,
        [pub],
        path,
        refs=refs | {published_ref(name): pub},
        manifest={HOLDS: CONFIGS_ONLY, "task_set": name, **extra},
    )


@dataclass(frozen=True)
class RebuildRow:
    """One pair under one arm (and rung): does our build match the published ids?"""

    pair: str
    arm: str
    arm_variant: str
    status: str  # "match" | "config differs" | "data differs"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "match"


def _datasets(
    names: list[str], studio: Path | None, dataset: Path | None
) -> dict[str, tuple[Dataset, Path]]:
    """One's own card of each dataset the configs read, and its folder: ``dataset`` (a
    folder holding ``dataset.yaml``), else ``<studio>/datasets/<name>/``."""
    out: dict[str, tuple[Dataset, Path]] = {}
    given = (load_dataset(dataset), dataset) if dataset is not None else None
    for ds_name in names:
        if given is not None and given[0].name == ds_name:
            out[ds_name] = given
            continue
        folder = studio / "datasets" / ds_name if studio is not None else None
        if folder is None or not (folder / "dataset.yaml").is_file():
            if folder is not None:
                where = f"{folder}/dataset.yaml is missing"
            elif given is not None:
                where = f"{dataset} holds dataset {given[0].name}"
            else:
                where = "none was given"
            raise TaskSetError(
                f"the set reads dataset {ds_name}: a rebuild builds it from your own copy "
                f"({where}); pass --dataset DIR, the folder holding its dataset.yaml (or "
                "--studio DIR holding datasets/<name>/)"
            )
        out[ds_name] = (load_dataset(folder), folder)
    return out


def rebuild(
    store: Store,
    bundle: str | os.PathLike[str],
    *,
    studio: str | Path | None = None,
    bench: str | Path | None = None,
    dataset: str | Path | None = None,
    data_root: str | Path | None = None,
    progress: Progress | None = None,
) -> tuple[str, list[RebuildRow]]:
    """Build the set a configs-only bundle describes from one's own data; compare the ids.

    The bundle is verified and its objects (configs only) are added to ``store`` first.
    Every pair is built from its published config alone: no set file, template or cohort
    file is read (``bench`` is not needed; it is accepted for callers that pass it), only
    one's own card of each dataset the configs name (``dataset``, or under
    ``<studio>/datasets/``) and its data (``data_root``, default the card's folder). When
    every id matches, the set and its build are recorded here as the publisher's, ready
    to run. Returns the set's name and one row per published pair, arm and variant.
    """
    del bench  # a rebuild reads the bundle, never the publisher's benchmark folder
    header = read_bundle_header(bundle)
    import_bundle(store, bundle, refs=False)
    roots = [ObjectId.from_hex(r) for r in header.roots]
    # other roots (a manifest, say) may ride along; the set is the one `PublishedSet`
    pubs = [r for r in roots if store.kind(r) == PublishedSet.__kind__]
    if len(pubs) != 1:
        raise TaskSetError(
            f"{os.fspath(bundle)}: not a configs-only task set bundle "
            "(`medomni studio taskset publish`, without --with-data)"
        )
    pub = store.get(pubs[0], PublishedSet)
    published_set = store.get(pub.task_set, TaskSetRecord)
    name = published_set.name
    configs = {e.config: store.get(e.config, BuildConfig) for e in pub.entries}
    own = _datasets(
        sorted({c.dataset for c in configs.values()}),
        Path(studio) if studio is not None else None,
        Path(dataset) if dataset is not None else None,
    )
    rows: list[RebuildRow | None] = []
    todo: dict[str, list[tuple[ObjectId, BuildConfig]]] = {}
    for e in pub.entries:
        cfg = configs[e.config]
        problems = config_problems(cfg, own[cfg.dataset][0])
        if problems:
            rows.append(
                RebuildRow(e.pair, e.arm, e.arm_variant, "config differs", "; ".join(problems))
            )
        else:
            rows.append(None)
            todo.setdefault(cfg.dataset, []).append((e.config, cfg))
    ours: dict[ObjectId, Built] = {}
    for ds_name, cfgs in todo.items():
        card, folder = own[ds_name]
        root = Path(data_root) if data_root is not None else folder
        for b in build_configs(store, cfgs, card, data_root=root, progress=progress):
            ours[b.config] = b
    out: list[RebuildRow] = []
    for e, row in zip(pub.entries, rows, strict=True):
        if row is not None:
            out.append(row)
            continue
        b = ours[e.config]
        if b.result.hex() == e.result:
            out.append(RebuildRow(e.pair, e.arm, e.arm_variant, "match"))
            continue
        result = store.get(b.result, BuildResult)
        theirs = set(e.atoms)
        differ = sum(1 for a in result.atoms if a.hex() not in theirs)
        differ += max(0, len(e.atoms) - len(result.atoms))
        detail = f"{differ} of {len(e.atoms)} atom tasks differ"
        if result.content.hex() == e.content:
            detail += "; the evidence matches (the answers differ)"
        out.append(RebuildRow(e.pair, e.arm, e.arm_variant, "data differs", detail))
    if all(r.ok for r in out):
        _record_published(store, pub, published_set)
    return name, out


def _record_published(store: Store, pub: PublishedSet, rec: TaskSetRecord) -> None:
    """The publisher's set and set build, recorded here once every id matched."""
    record_task_set(store, rec)
    entries = tuple(
        SetEntry(
            pair=e.pair,
            version=e.version,
            arm=e.arm,
            arm_variant=e.arm_variant,
            config=e.config,
            result=ObjectId.from_hex(e.result),
        )
        for e in pub.entries
    )
    sb = store.put(SetBuild(task_set=pub.task_set, entries=entries))
    ref = set_build_ref(rec.name)
    if store.refs.get(ref) != sb:
        store.refs.update(ref, lambda _old: sb, message=f"rebuild {rec.name}")
