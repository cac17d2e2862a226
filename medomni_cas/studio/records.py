"""The store records Build writes: configs, content, answer keys, atom tasks and builds.

Kind names start with ``medomni.`` and are forever once released. Records stay small and
link-based: an instruction is a blob and a patient's evidence a tree, so the atoms of one
pair share them. The one rule the links keep: an `AnswerKey` links its `Content`, never the
other way, and no `AtomTask` links either, so no answer is in an atom's closure.
"""

from __future__ import annotations

from typing import Any

from medomni_cas.store.encoding import Part, Record
from medomni_cas.store.ids import ObjectId

__all__ = [
    "AnswerKey",
    "BenchmarkCard",
    "PinnedPair",
    "PublishedEntry",
    "PublishedSet",
    "SetBuild",
    "SetEntry",
    "TaskSetRecord",
    "TemplateRecord",
    "AtomEnvironment",
    "AtomTask",
    "BuildConfig",
    "BuildResult",
    "Content",
    "FormatCheck",
    "TargetShape",
]

AnswerValue = str | float | None
#: The answer's optional key for class probabilities: {target: {class: probability}}.
SCORES_KEY = "_scores"


class BuildConfig(Record, frozen=True, kw_only=True):
    """What a pair is built from under one arm (and variant); its id is the config hash.

    It holds definitions only, never patient data. Fields are grouped by how a change to
    them moves the version (see `COMPARABILITY`): a change to one of those needs a higher N,
    a change to any other a higher X.
    """

    __kind__ = "medomni.build-config"

    pair: str
    version: str
    builder: str
    builder_version: str
    medomni_release: str
    dataset: str
    dataset_release: str
    template: dict[str, Any]  # the template file minus its targets (they have their own field)
    targets: tuple[dict[str, Any], ...]  # label, metric (the scoring), question
    cohort: dict[str, Any]  # the cohort file minus its version
    labels: dict[str, dict[str, Any]]  # label name -> recipe, as the dataset file states it
    arm: str
    arm_variant: str = ""
    arm_definition: dict[str, Any]


#: Fields of `BuildConfig` whose change makes results incomparable: they need a higher N.
COMPARABILITY = ("dataset", "dataset_release", "cohort", "labels", "targets")


class Content(Record, frozen=True, kw_only=True):
    """The evidence of every patient of a cohort: one tree per patient, with no answers."""

    __kind__ = "medomni.content"

    dataset: str
    dataset_release: str
    pair: str
    patients: tuple[str, ...]  # cohort order
    evidence: dict[str, ObjectId]  # patient -> evidence tree (every family, before masks)
    prediction_times: dict[str, str]  # patient -> ISO time


class AnswerKey(Record, frozen=True, kw_only=True):
    """Each patient's value of each target. Stored apart: only a `BuildResult` links it."""

    __kind__ = "medomni.answer-key"

    content: ObjectId
    targets: tuple[str, ...]
    values: dict[str, dict[str, AnswerValue]]  # patient -> target -> value


class TargetShape(Part, frozen=True, kw_only=True):
    """One target an answer must hold: a number, or one of ``classes``."""

    name: str
    kind: str  # "numeric" | "class"
    classes: tuple[str, ...] = ()
    question: str = ""


class FormatCheck(Record, frozen=True, kw_only=True):
    """The answer's shape: one prediction per target. It checks shape and never scores."""

    __kind__ = "medomni.format-check"

    targets: tuple[TargetShape, ...]

    def problems(self, answer: object) -> list[str]:
        """What is wrong with an answer's shape (a JSON object: target -> prediction)."""
        if not isinstance(answer, dict):
            return [f"the answer is a JSON object of targets, not {type(answer).__name__}"]
        out: list[str] = []
        names = {t.name for t in self.targets}
        out += [f"unknown target {k!r}" for k in answer if k not in names and k != SCORES_KEY]
        if SCORES_KEY in answer:
            out += self._score_problems(answer[SCORES_KEY])
        for t in self.targets:
            if t.name not in answer:
                out.append(f"{t.name}: missing")
                continue
            v = answer[t.name]
            if t.kind == "class" and v not in t.classes:
                out.append(f"{t.name}: {v!r} is not one of {', '.join(t.classes)}")
            elif t.kind == "numeric" and (isinstance(v, bool) or not isinstance(v, int | float)):
                out.append(f"{t.name}: {v!r} is not a number")
        return out

    def _score_problems(self, scores: object) -> list[str]:
        # optional: {target: {class: probability}} for class targets, which AUROC needs
        if not isinstance(scores, dict):
            return [f"{SCORES_KEY}: a JSON object of class targets, not {type(scores).__name__}"]
        kinds = {t.name: t for t in self.targets}
        out = []
        for name, per in scores.items():
            t = kinds.get(name)
            if t is None or t.kind != "class":
                out.append(f"{SCORES_KEY}.{name}: not a class target")
            elif not isinstance(per, dict) or not per:
                out.append(f"{SCORES_KEY}.{name}: a JSON object of class -> probability")
            else:
                for c, v in per.items():
                    if c not in t.classes:
                        out.append(f"{SCORES_KEY}.{name}: {c!r} is not one of its classes")
                    elif isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                        out.append(f"{SCORES_KEY}.{name}.{c}: {v!r} is not a probability")
        return out


class AtomEnvironment(Part, frozen=True, kw_only=True):
    cpus: int
    memory_mb: int
    agent_timeout_sec: int
    verifier_timeout_sec: int
    internet: bool = False


class AtomTask(Record, frozen=True, kw_only=True):
    """One patient, every target, at the patient's prediction time, under one arm.

    ``families`` is the manifest the harness and the perception family filter read: the
    families staged in ``evidence``.
    """

    __kind__ = "medomni.atom-task"

    pair: str
    version: str
    patient: str  # the dataset's pseudonymous key
    prediction_time: str
    arm: str
    arm_variant: str = ""
    instruction: ObjectId  # blob, UTF-8: shared by every atom of the pair and arm
    evidence: ObjectId  # tree
    families: tuple[str, ...]
    environment: AtomEnvironment
    submission_path: str
    format_check: ObjectId
    config: ObjectId


class BuildResult(Record, frozen=True, kw_only=True):
    """One build of a pair under one arm and variant: what it was built from and made."""

    __kind__ = "medomni.build"

    pair: str
    version: str
    arm: str
    arm_variant: str = ""
    config: ObjectId
    content: ObjectId
    answer_key: ObjectId
    atoms: tuple[ObjectId, ...]  # cohort order


# -- templates, task sets and benchmarks --------------------------------------------------------
class TemplateRecord(Record, frozen=True, kw_only=True):
    """A template as signed off: the file's content and its cohorts' versions at that time.

    The ref ``studio/signoff/<template>`` holds its id; from then on a change to the template
    needs a version rise in each of those cohorts (see `medomni_cas.studio.signoff`).
    """

    __kind__ = "medomni.template"

    name: str
    dataset: str
    template: dict[str, Any]
    cohorts: dict[str, str]  # cohort -> "N.X" when signed off


class BenchmarkCard(Record, frozen=True, kw_only=True):
    """``benchmark.yaml``: a benchmark's card. Not part of a task set's hash."""

    __kind__ = "medomni.benchmark"

    name: str
    version: str
    owner: str
    license: str
    description: str = ""
    intelligence_kinds: tuple[str, ...]


class PinnedPair(Part, frozen=True, kw_only=True):
    task: str  # <template>@<cohort>
    n: int


class TaskSetRecord(Record, frozen=True, kw_only=True):
    """A task set; its id is the task set content hash.

    It holds what the spec says the hash covers (every pair pinned at N, the arms, the
    builder) in sorted order, so that reordering the YAML file moves nothing. It links no
    build: an X rise of a pair reaches the set without changing its hash.
    """

    __kind__ = "medomni.task-set"

    name: str  # <benchmark>/<set>
    builder: str
    arms: tuple[str, ...]
    pairs: tuple[PinnedPair, ...]


class SetEntry(Part, frozen=True, kw_only=True):
    pair: str
    version: str  # N.X the pair was built at
    arm: str
    arm_variant: str = ""
    config: ObjectId
    result: ObjectId  # the `BuildResult`


class SetBuild(Record, frozen=True, kw_only=True):
    """One build of a whole task set: every pair under every arm (and rung)."""

    __kind__ = "medomni.task-set-build"

    task_set: ObjectId
    entries: tuple[SetEntry, ...]


class PublishedEntry(Part, frozen=True, kw_only=True):
    """One pair under one arm as published: its config, and the ids it built to written as
    text, never as links, so that no patient data or answer is in the bundle's closure."""

    pair: str
    version: str
    arm: str
    arm_variant: str = ""
    config: ObjectId
    result: str
    content: str
    atoms: tuple[str, ...]


class PublishedSet(Record, frozen=True, kw_only=True):
    """What ``taskset publish --configs-only`` writes: configs, and the ids to rebuild to."""

    __kind__ = "medomni.published-set"

    task_set: ObjectId
    benchmark: ObjectId  # its card
    entries: tuple[PublishedEntry, ...]
