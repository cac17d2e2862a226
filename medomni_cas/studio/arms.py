"""The build side of arms: what an arm changes in the atom tasks a builder renders.

An arm has a name and a one-line description (entry point group ``medomni.arms``, whose
run side Bench reads), and, per builder, a build side (group ``medomni.arm_builds``, named
``<builder>:<arm>``). The built-in arms of ``medomni-v1`` register here the same way a
plug-in's do; a builder refuses any arm it has no build side for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from medomni_cas.errors import MedomniError
from medomni_cas.studio.folders import TemplateFolder
from medomni_cas.studio.schema import LADDER_ARM

__all__ = [
    "ARMS_GROUP",
    "ARM_BUILDS_GROUP",
    "BUILDER",
    "ArmBuild",
    "ArmError",
    "LadderArm",
    "Variant",
    "arm_build",
    "arm_builds",
    "arm_label",
    "arm_descriptions",
    "reset_registry",
]

BUILDER = "medomni-v1"
ARMS_GROUP = "medomni.arms"
ARM_BUILDS_GROUP = "medomni.arm_builds"
PERCEPTION_URL = "http://perception:8899"


def arm_label(arm: str, variant: str = "") -> str:
    """``<arm>`` or ``<arm>.<variant>``: how run slots, run folders and refs name an arm."""
    return arm + (f".{variant}" if variant else "")


class ArmError(MedomniError, ValueError):
    """An arm that does not exist, or that a builder or template cannot build."""


@dataclass(frozen=True)
class Variant:
    """One rendering of an arm: its variant name ("" for none) and the families staged."""

    name: str
    families: tuple[str, ...]


@dataclass(frozen=True)
class ArmBuild:
    """An arm's build side: its instruction paragraph and encoder access, same evidence.

    Subclasses override `variants` (what is staged) and `cohort` (what it builds from).
    """

    name: str
    description: str
    paragraph: str
    encoders: str  # "allowed" | "none" | "required": what the run side attaches
    extra: dict[str, Any] = field(default_factory=dict)

    def definition(self, folder: TemplateFolder, variant: Variant) -> dict[str, Any]:
        """Everything about the arm that the config hash covers."""
        out = {
            "description": self.description,
            "paragraph": self.paragraph,
            "encoders": self.encoders,
            "families": list(variant.families),
        }
        return out | self.extra

    def cohort(self, folder: TemplateFolder, cohort: str) -> str:
        """The cohort this arm renders for the pair ``folder@cohort``."""
        return cohort

    def variants(self, folder: TemplateFolder) -> list[Variant]:
        # the patient's whole record (the build cuts the guarded families): a template's
        # `input` is the proposal's record, never a mask
        return [Variant("", folder.dataset.families)]


class LadderArm(ArmBuild):
    """modality-ladder: one variant per rung, all on the ladder cohort, later families masked."""

    def cohort(self, folder: TemplateFolder, cohort: str) -> str:
        if folder.ladder is None:
            raise ArmError(
                f"{folder.path}/arms/{LADDER_ARM}.yaml: missing; {folder.name} "
                f"cannot be built under {LADDER_ARM}"
            )
        if cohort != folder.ladder.cohort:
            raise ArmError(
                f"{folder.path}/arms/{LADDER_ARM}.yaml: {LADDER_ARM} builds on cohort "
                f"{folder.ladder.cohort!r}, not {cohort!r}; build "
                f"{folder.name}@{folder.ladder.cohort}"
            )
        return cohort

    def variants(self, folder: TemplateFolder) -> list[Variant]:
        assert folder.ladder is not None  # `cohort` refused the folder otherwise
        staged: list[str] = []
        out = []
        for rung in folder.ladder.rungs:
            staged += rung.add
            out.append(Variant(rung.name, tuple(staged)))
        return out


_ENCODER_NOTE = f"Perception encoders are served at {PERCEPTION_URL}"
ENCODERS = ArmBuild(
    "encoders",
    "with encoders",
    f"{_ENCODER_NOTE} for the families in your files; use them as you see fit.",
    "allowed",
)
NO_PERCEPTION = ArmBuild(
    "no-perception",
    "without encoders",
    "No encoders are available for this task: work from the files alone.",
    "none",
)
ENCODERS_REQUIRED = ArmBuild(
    "encoders-required",
    "must call at least one encoder",
    f"{_ENCODER_NOTE} for the families in your files; call at least one of them before you answer.",
    "required",
)
MODALITY_LADDER = LadderArm(
    LADDER_ARM,
    "with encoders, at six rungs, r1 to r6; each rung adds input families",
    f"Only some of the patient's record is staged for this task. {_ENCODER_NOTE} "
    "for the families in your files.",
    "allowed",
)
#: The built-in arms. They are also registered in pyproject.toml's entry points, as a
#: plug-in's are; this table keeps them available when the package is not installed.
BUILTIN: dict[str, ArmBuild] = {
    a.name: a for a in (ENCODERS, NO_PERCEPTION, ENCODERS_REQUIRED, MODALITY_LADDER)
}

_builds: dict[str, dict[str, ArmBuild]] | None = None
_descriptions: dict[str, str] | None = None


def arm_builds(builder: str = BUILDER) -> dict[str, ArmBuild]:
    """Every arm ``builder`` can build, built-in and plugged in, by name."""
    global _builds
    if _builds is None:
        _builds = {BUILDER: dict(BUILTIN)}
        for ep in entry_points(group=ARM_BUILDS_GROUP):
            b, sep, arm = ep.name.partition(":")
            if not sep or not b or not arm:
                raise ArmError(
                    f"entry point {ARM_BUILDS_GROUP} {ep.name!r}: name it <builder>:<arm>"
                )
            obj = ep.load()
            build = obj() if isinstance(obj, type) else obj
            if not isinstance(build, ArmBuild) or build.name != arm:
                raise ArmError(
                    f"entry point {ARM_BUILDS_GROUP} {ep.name!r}: not an ArmBuild named {arm!r}"
                )
            _builds.setdefault(b, {}).setdefault(arm, build)  # built-ins win
    return _builds.get(builder, {})


def arm_descriptions() -> dict[str, str]:
    """Every arm's one-line description: built-in, then ``medomni.arms`` plug-ins."""
    global _descriptions
    if _descriptions is None:
        _descriptions = {n: a.description for n, a in BUILTIN.items()}
        for ep in entry_points(group=ARMS_GROUP):
            if ep.name not in _descriptions:
                obj = ep.load()
                _descriptions[ep.name] = str(getattr(obj, "description", "")).strip()
    return _descriptions


def arm_build(builder: str, arm: str) -> ArmBuild:
    """The build side of ``arm`` for ``builder``; an `ArmError` naming what it supports."""
    builds = arm_builds(builder)
    if arm not in builds:
        known = ", ".join(builds) or "none"
        what = "unknown arm" if arm not in arm_descriptions() else "arm not supported"
        raise ArmError(f"builder {builder}: {what} {arm!r} (it builds: {known})")
    return builds[arm]


def reset_registry() -> None:
    """Forget loaded plug-ins, so that the next lookup reads the entry points again."""
    global _builds, _descriptions
    _builds = _descriptions = None
