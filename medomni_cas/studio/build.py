"""Build (builder ``medomni-v1``): template + cohort + dataset -> content, answers, atom tasks.

For a pair ``<template>@<cohort>`` and each arm (and rung), Build writes

* a `BuildConfig` (its id is the config hash; it holds definitions, no patient data),
* the `Content`: per patient, an evidence tree of the whole record strictly before the
  prediction time minus every target's guards (see `medomni_cas.studio.evidence`),
* an `AnswerKey`, linked only from the `BuildResult`,
* one `AtomTask` per patient, and the `BuildResult` tying them together.

The same inputs give the same ids anywhere. Two refs make rebuilds cheap and versions checked:
``studio/builds/<config>/<data digest>`` -> result (a hit skips rendering and writes nothing),
and ``studio/pairs/<pair>/<arm>[.<variant>]`` -> the last result, whose config the next build
is compared with (`VersionError`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import msgspec
import pyarrow as pa

from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import BUILDER, ArmBuild, Variant, arm_build, arm_label
from medomni_cas.studio.arrays import array_digest
from medomni_cas.studio.cohorts import PREFIX_KEY, nested_prefix
from medomni_cas.studio.errors import BuildError, VersionError
from medomni_cas.studio.evidence import Selection, evidence_files, select_cohort
from medomni_cas.studio.folders import TemplateFolder, at_pins, find_template, load_template
from medomni_cas.studio.labels import Recipe, read_table
from medomni_cas.studio.records import (
    COMPARABILITY,
    AnswerKey,
    AtomEnvironment,
    AtomTask,
    BuildConfig,
    BuildResult,
    Content,
    FormatCheck,
    TargetShape,
)
from medomni_cas.studio.refnames import build_cache_ref, kept_pair_ref, pair_ref
from medomni_cas.studio.schema import (
    FIRST,
    LADDER_ARM,
    Cohort,
    Dataset,
    SpecError,
    Template,
    Version,
)
from medomni_cas.studio.signoff import check_signoff
from medomni_cas.studio.specfile import convert

__all__ = [
    "BUILDER_VERSION",
    "MEDOMNI_RELEASE",
    "BuildError",
    "Built",
    "VersionError",
    "build_configs",
    "build_pair",
    "config_for",
    "config_problems",
]

BUILDER_VERSION = "1.0.0"
MEDOMNI_RELEASE = "0.3.0"  # the MedOmni spec release this builder implements
ENCODER_ARMS = ("encoders", "no-perception", "encoders-required")
Progress = Callable[[str], None]
_SORTED = msgspec.json.Encoder(order="sorted")


@dataclass(frozen=True)
class Built:
    """One arm (and variant) of a built pair."""

    pair: str
    arm: str
    variant: str
    result: ObjectId
    config: ObjectId
    cached: bool  # True: found by the rebuild cache, nothing rendered or written


def _id_of(record: Any) -> ObjectId:
    return hash_bytes(encoding.encode(record))


# -- config ---------------------------------------------------------------------------------
def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value, enc_hook=str)  # Version is its "N.X" text


def config_for(
    folder: TemplateFolder, cohort_name: str, arm: ArmBuild, variant: Variant
) -> BuildConfig:
    """The `BuildConfig` of ``folder@cohort_name`` under ``arm`` and ``variant``."""
    ds, tpl = folder.dataset, folder.template
    cohort = folder.cohorts[cohort_name]
    template = _builtins(tpl)
    del template["targets"]
    cohort_dict = _builtins(cohort)
    del cohort_dict["version"]
    if cohort_dict.get("selection") in ("", FIRST):
        # the first rule is no key at all, so cohorts written before it keep their ids
        cohort_dict.pop("selection", None)
    prefix = nested_prefix(folder.cohorts, cohort_name)
    if prefix:  # what the nested rule reads of the smaller cohorts, for a rebuild
        cohort_dict[PREFIX_KEY] = prefix
    labels = {t.label: _builtins(ds.label(t.label)) for t in tpl.targets}
    cfg = BuildConfig(
        pair=f"{folder.name}@{cohort_name}",
        version=str(cohort.version),
        builder=BUILDER,
        builder_version=BUILDER_VERSION,
        medomni_release=MEDOMNI_RELEASE,
        dataset=ds.name,
        dataset_release=ds.release,
        template=template,
        targets=tuple(_builtins(t) for t in tpl.targets),
        cohort=cohort_dict,
        labels=labels,
        arm=arm.name,
        arm_variant=variant.name,
        arm_definition=arm.definition(folder, variant),
    )
    # a round trip makes it equal to one read back from the store (lists, not tuples)
    return encoding.decode_body(encoding.encode(cfg), BuildConfig)


def _check_version(old: BuildConfig, new: BuildConfig) -> None:
    """Refuse ``new`` unless its version rose as far as its changes need (N, else X)."""
    ov, nv = Version.parse(old.version), Version.parse(new.version)
    fields = [f for f in BuildConfig.__struct_fields__ if f != "version"]
    changed = [f for f in fields if getattr(old, f) != getattr(new, f)]
    if nv < ov:
        raise VersionError(new.pair, "version", str(ov), str(nv), str(ov))
    n_changed = [f for f in changed if f in COMPARABILITY]
    if n_changed and nv.n <= ov.n:
        raise VersionError(new.pair, n_changed[0], str(ov), str(nv), f"{ov.n + 1}.0")
    if changed and nv <= ov:
        raise VersionError(new.pair, changed[0], str(ov), str(nv), f"{ov.n}.{ov.x + 1}")


# -- data -----------------------------------------------------------------------------------
def _data_digest(ds: Dataset, root: Path) -> str:
    """BLAKE3 of every data file the dataset names (an array family in a store: its tree
    id); keys the rebuild cache, never a config."""
    h = blake3.blake3()
    for t in ds.tables:
        p = root / t.file
        if not p.is_file():
            raise BuildError(f"dataset {ds.name}: data file {p} is missing")
        h.update(os.fsencode(t.file) + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    for a in ds.arrays:
        if not (root / a.store).exists():
            raise BuildError(
                f"dataset {ds.name}: array family {a.name}: {root / a.store} is missing"
            )
        h.update(a.name.encode() + b"\0" + array_digest(root, a) + b"\0")
    return h.hexdigest()


def _put_files(store: Store, files: dict[Any, dict[str, bytes]]) -> dict[Any, dict[str, ObjectId]]:
    """Every patient's files as blobs: the small ones in batches, each a blob once however
    many patients share it (a blob over 1 MiB goes through the chunker)."""
    ids: dict[bytes, ObjectId] = {}
    batch: list[tuple[bytes, bytes]] = []
    nbytes = 0

    def flush() -> None:
        nonlocal batch, nbytes
        for (b, _), oid in zip(batch, store.put_raw_many((None, d) for _, d in batch), strict=True):
            ids[b] = oid
        batch, nbytes = [], 0

    for per in files.values():
        for b in per.values():
            if b in ids or len(b) > 1 << 20:
                continue
            ids[b] = ObjectId(bytes(32))  # placeholder: seen, in the batch
            batch.append((b, encoding.encode_blob_header(len(b)) + b))
            nbytes += len(b)
            if len(batch) >= 4096 or nbytes >= 16 << 20:
                flush()
    flush()
    out: dict[Any, dict[str, ObjectId]] = {}
    for p, per in files.items():
        out[p] = {n: ids[b] if len(b) <= 1 << 20 else store.put_blob(b) for n, b in per.items()}
    return out


# -- rendering ------------------------------------------------------------------------------
def _format_check(folder: TemplateFolder) -> FormatCheck:
    shapes = []
    for t in folder.template.targets:
        classes = folder.dataset.label(t.label).classes  # type: ignore[union-attr]  # folders.py checked it exists
        shapes.append(
            TargetShape(
                name=t.label,
                kind="class" if classes else "numeric",
                classes=tuple(classes),
                question=t.question or "",
            )
        )
    return FormatCheck(targets=tuple(shapes))


def _instruction(folder: TemplateFolder, arm: ArmBuild, check: FormatCheck) -> str:
    agent = folder.template.agent
    lines = []
    for t in check.targets:
        want = f"one of {', '.join(t.classes)}" if t.kind == "class" else "a number"
        lines.append(f"- {t.name}: {t.question or 'your prediction'} ({want})")
    example = {t.name: (t.classes[0] if t.classes else 0.0) for t in check.targets}
    answer = (
        f"Write your answer to {agent.submission_path} as one JSON object with one prediction "
        f"per target, such as {_SORTED.encode(example).decode()}. The targets:\n" + "\n".join(lines)
    )
    parts = (agent.statement, agent.instruction, arm.paragraph, answer)
    return "\n\n".join(p.strip() for p in parts) + "\n"


@dataclass
class _Content:
    content: ObjectId
    answer_key: ObjectId
    cohort: Selection
    trees: dict[Any, dict[str, ObjectId]]  # patient -> file -> blob
    family_of: dict[str, str]


def _content(
    store: Store,
    folder: TemplateFolder,
    cohort: str,
    root: Path,
    tables: dict[str, pa.Table],
    cfg: BuildConfig,
) -> _Content:
    # the selection rule is the one the config records, not the one the files would pick
    co = select_cohort(folder, cohort, tables, cfg.cohort.get(PREFIX_KEY, ()))
    files, family_of = evidence_files(folder, root, tables, co)
    trees = _put_files(store, {p: files[p] for p in co.patients})
    names = [str(p) for p in co.patients]
    evidence = store.put_trees(trees[p] for p in co.patients)
    content = Content(
        dataset=folder.dataset.name,
        dataset_release=folder.dataset.release,
        pair=f"{folder.name}@{cohort}",
        patients=tuple(names),
        evidence=dict(zip(names, evidence, strict=True)),
        prediction_times={str(p): co.times[p].isoformat() for p in co.patients},
    )
    cid = store.put(content)
    key = AnswerKey(
        content=cid,
        targets=tuple(t.label for t in folder.template.targets),
        values={str(p): co.answers[p] for p in co.patients},
    )
    return _Content(cid, store.put(key), co, trees, family_of)


def _render(
    store: Store,
    folder: TemplateFolder,
    cfg: BuildConfig,
    arm: ArmBuild,
    variant: Variant,
    c: _Content,
) -> BuildResult:
    agent = folder.template.agent
    check = _format_check(folder)
    check_id = store.put(check)
    instruction = store.put_blob(_instruction(folder, arm, check).encode())
    config = store.put(cfg)
    staged = set(variant.families)
    env = AtomEnvironment(
        cpus=agent.environment.cpus,
        memory_mb=agent.environment.memory_mb,
        agent_timeout_sec=agent.environment.timeouts.agent_sec,
        verifier_timeout_sec=agent.environment.timeouts.verifier_sec,
        internet=agent.environment.internet,
    )
    staged_trees = store.put_trees(
        {n: b for n, b in c.trees[p].items() if c.family_of[n] in staged} for p in c.cohort.patients
    )
    atoms = []
    for p, evidence in zip(c.cohort.patients, staged_trees, strict=True):
        atoms.append(
            AtomTask(
                pair=cfg.pair,
                version=cfg.version,
                patient=str(p),
                prediction_time=c.cohort.times[p].isoformat(),
                arm=arm.name,
                arm_variant=variant.name,
                instruction=instruction,
                evidence=evidence,
                families=tuple(f for f in variant.families if f in set(c.family_of.values())),
                environment=env,
                submission_path=agent.submission_path,
                format_check=check_id,
                config=config,
            )
        )
    return BuildResult(
        pair=cfg.pair,
        version=cfg.version,
        arm=arm.name,
        arm_variant=variant.name,
        config=config,
        content=c.content,
        answer_key=c.answer_key,
        atoms=tuple(store.put_many(atoms)),
    )


# -- the entry point ------------------------------------------------------------------------
def _set_to(oid: ObjectId) -> Callable[[ObjectId | None], ObjectId]:
    """A ref update that moves the ref to ``oid`` whatever it held."""
    return lambda _current: oid


def build_pair(
    store: Store,
    studio_root: str | Path,
    template_name: str,
    cohort_name: str,
    *,
    arms: Sequence[str] | None = None,
    data_root: str | Path | None = None,
    progress: Progress | None = None,
    pins: Mapping[str, int] | None = None,
) -> list[Built]:
    """Build ``template_name@cohort_name`` under ``arms`` (default: the three encoder arms,
    and modality-ladder when the cohort is its ladder cohort); one `Built` per arm/variant.

    ``data_root`` is where the dataset's relative file paths resolve (default: its folder).
    Every config is checked against the pair's last build before anything is written.
    ``pins`` (cohort -> N, a set's): a cohort pinned below its N builds from its file kept
    at that N (`at_pins`); its builds are checked against, and recorded as, the last build
    at that N (`kept_pair_ref`), so the latest N's stay apart.
    """
    folder_path = find_template(studio_root, template_name)
    if folder_path is None:
        raise BuildError(f"no template {template_name!r} under {studio_root}/datasets/*/tasks/")
    folder = load_template(folder_path)
    if pins:
        folder = at_pins(folder, pins)
    if cohort_name not in folder.cohorts:
        have = ", ".join(folder.cohorts) or "none"
        raise SpecError(folder_path / "cohorts", None, "", f"no cohort {cohort_name!r} ({have})")
    if arms is None:
        ladder = folder.ladder is not None and folder.ladder.cohort == cohort_name
        arms = (*ENCODER_ARMS, LADDER_ARM) if ladder else ENCODER_ARMS
    builds = [arm_build(BUILDER, a) for a in dict.fromkeys(arms)]  # refuse before any work
    root = Path(data_root) if data_root is not None else folder.path.parent.parent
    digest = _data_digest(folder.dataset, root)
    say = progress or (lambda _msg: None)

    check_signoff(store, folder, sorted({ab.cohort(folder, cohort_name) for ab in builds}))
    plan: list[tuple[ArmBuild, Variant, str, BuildConfig]] = []
    for ab in builds:
        cohort = ab.cohort(folder, cohort_name)
        for v in ab.variants(folder):
            cfg = config_for(folder, cohort, ab, v)
            old = _last_config(store, folder, cohort, cfg, ab.name, v.name)
            if old is not None:
                _check_version(old, cfg)
            plan.append((ab, v, cohort, cfg))

    tables: dict[str, pa.Table] | None = None
    contents: dict[str, _Content] = {}  # cohort -> content, shared by every arm
    out: list[Built] = []
    for ab, v, cohort, cfg in plan:
        cfg_id = _id_of(cfg)
        cache = build_cache_ref(cfg_id, digest)
        result = store.refs.get(cache)
        cached = result is not None
        if result is None:
            if cohort not in contents:
                say(f"{folder.name}@{cohort}: selecting the cohort and writing evidence")
                if tables is None:
                    tables = {t.name: read_table(root / t.file) for t in folder.dataset.tables}
                contents[cohort] = _content(store, folder, cohort, root, tables, cfg)
            say(f"{cfg.pair}: rendering {ab.name}{'.' + v.name if v.name else ''}")
            result = store.put(_render(store, folder, cfg, ab, v, contents[cohort]))
            store.refs.add_if_new(cache, result, f"build {cfg.pair} {ab.name} {v.name}".strip())
        ref = _lane(folder, cohort, cfg, ab.name, v.name)
        if store.refs.get(ref) != result:
            store.refs.update(
                ref, _set_to(result), message=f"build {cfg.pair} version {cfg.version}"
            )
        out.append(Built(cfg.pair, ab.name, v.name, result, cfg_id, cached))
    return out


def _lane(folder: TemplateFolder, cohort: str, cfg: BuildConfig, arm: str, variant: str) -> str:
    """The ref of the pair's last build that this one follows: the latest N's, or the kept
    N's for a cohort a set pins below its N."""
    if cohort in folder.pinned_below:
        return kept_pair_ref(cfg.pair, Version.parse(cfg.version).n, arm, variant)
    return pair_ref(cfg.pair, arm, variant)


def _last_config(
    store: Store, folder: TemplateFolder, cohort: str, cfg: BuildConfig, arm: str, variant: str
) -> BuildConfig | None:
    """The config of the build ``cfg`` follows: its lane's last, or for a kept N built
    here first, the latest N's last while that was still at the same N (built before the
    cohort moved on)."""
    last = store.refs.get(_lane(folder, cohort, cfg, arm, variant))
    if last is None and cohort in folder.pinned_below:
        last = store.refs.get(pair_ref(cfg.pair, arm, variant))
        if last is not None:
            old = store.get(store.get(last, BuildResult).config, BuildConfig)
            same_n = Version.parse(old.version).n == Version.parse(cfg.version).n
            return old if same_n else None
    if last is None:
        return None
    return store.get(store.get(last, BuildResult).config, BuildConfig)


# -- from configs alone ---------------------------------------------------------------------
def config_problems(cfg: BuildConfig, dataset: Dataset) -> list[str]:
    """What keeps ``cfg`` from building to its published ids here: another builder, or a
    dataset card (one's own ``dataset.yaml``) of another dataset or release."""
    out = []
    for f, have, what in (
        ("builder", BUILDER, "this builder"),
        ("builder_version", BUILDER_VERSION, "this builder"),
        ("dataset", dataset.name, "your dataset.yaml"),
        ("dataset_release", dataset.release, "your dataset.yaml"),
    ):
        if getattr(cfg, f) != have:
            out.append(f"{f}: published {getattr(cfg, f)}, {what} {have}")
    return out


def _folder_of(cfg: BuildConfig, dataset: Dataset) -> tuple[TemplateFolder, str]:
    """The template folder ``cfg`` was built from, as far as Build reads one, from the
    config alone: its template, its one cohort and its labels, over one's own dataset."""
    template, _, cohort = cfg.pair.partition("@")
    where = f"the published config of {cfg.pair} ({cfg.arm})"
    labels = tuple(convert(v, Recipe, where) for v in cfg.labels.values())
    ds = msgspec.structs.replace(dataset, labels=labels)
    tpl = convert({**cfg.template, "targets": list(cfg.targets)}, Template, where)
    fields = {k: v for k, v in cfg.cohort.items() if k != PREFIX_KEY}
    co = convert({**fields, "version": cfg.version}, Cohort, where)
    return TemplateFolder(template, Path(template), ds, tpl, {cohort: co}, None), cohort


def _arm_of(cfg: BuildConfig) -> tuple[ArmBuild, Variant]:
    d = dict(cfg.arm_definition)
    try:
        parts = [d.pop(k) for k in ("description", "paragraph", "encoders", "families")]
    except KeyError as e:
        raise BuildError(
            f"the published config of {cfg.pair} ({cfg.arm}): its arm definition has no "
            f"{e.args[0]!r}; it was not made by {BUILDER}"
        ) from None
    description, paragraph, encoders, families = parts
    arm = ArmBuild(cfg.arm, description, paragraph, encoders, extra=d)
    return arm, Variant(cfg.arm_variant, tuple(families))


def build_configs(
    store: Store,
    configs: Sequence[tuple[ObjectId, BuildConfig]],
    dataset: Dataset,
    *,
    data_root: str | Path,
    progress: Progress | None = None,
) -> list[Built]:
    """Build each config from itself and one's own data (``dataset``'s files under
    ``data_root``), with no template, cohort or set file: one `Built` per config.

    Everything Build reads is in the config (template, targets, cohort and its selection
    rule, labels, the arm's paragraph and families); only the tables come from ``dataset``.
    Refs: the rebuild cache only, so the pair's file-built history is left as it was.
    """
    root = Path(data_root)
    digest = _data_digest(dataset, root)
    say = progress or (lambda _msg: None)
    tables: dict[str, pa.Table] | None = None
    contents: dict[bytes, _Content] = {}  # (pair, cohort) -> content, shared by every arm
    out: list[Built] = []
    for cfg_id, cfg in configs:
        if _id_of(cfg) != cfg_id:
            raise BuildError(f"config {cfg_id}: its record does not encode to its id")
        folder, cohort = _folder_of(cfg, dataset)
        arm, variant = _arm_of(cfg)
        cache = build_cache_ref(cfg_id, digest)
        result = store.refs.get(cache)
        cached = result is not None
        if result is None:
            key = _SORTED.encode([cfg.pair, cfg.cohort])
            if key not in contents:
                say(f"{cfg.pair}: selecting the cohort and writing evidence")
                if tables is None:
                    tables = {t.name: read_table(root / t.file) for t in dataset.tables}
                contents[key] = _content(store, folder, cohort, root, tables, cfg)
            say(f"{cfg.pair}: rendering {arm_label(cfg.arm, cfg.arm_variant)}")
            result = store.put(_render(store, folder, cfg, arm, variant, contents[key]))
            store.refs.add_if_new(
                cache, result, f"rebuild {cfg.pair} {arm_label(cfg.arm, cfg.arm_variant)}"
            )
        out.append(Built(cfg.pair, cfg.arm, cfg.arm_variant, result, cfg_id, cached))
    return out
