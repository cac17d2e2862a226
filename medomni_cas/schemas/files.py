"""The files a user writes: each one's schema struct, where it lives, and which paths it fits.

The paths in `UserFile.globs` are the ones editors match a file's path against (VS Code's
``yaml.schemas``), relative to a workspace folder; a plug-in's benchmark folder has the same
layout under its own package.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from medomni_cas.bench.agents import AgentFile
from medomni_cas.studio.schema import Benchmark, Cohort, Dataset, Ladder, TaskSet, Template
from medomni_cas.workspace import WorkspaceFile

__all__ = ["FILES", "UserFile", "WorkspaceFile", "user_file"]


@dataclass(frozen=True)
class UserFile:
    """One kind of file a user writes."""

    name: str  # the schema's file is <name>.schema.json, its page reference/<name>.md
    title: str
    struct: type[msgspec.Struct]
    where: str  # its path in a workspace, with <placeholders>
    globs: tuple[str, ...]


FILES: tuple[UserFile, ...] = (
    UserFile(
        "workspace",
        "workspace.yaml",
        WorkspaceFile,
        "workspace.yaml",
        ("**/workspace.yaml",),
    ),
    UserFile(
        "dataset",
        "dataset.yaml",
        Dataset,
        "studio/datasets/<dataset>/dataset.yaml",
        ("**/datasets/*/dataset.yaml",),
    ),
    UserFile(
        "template",
        "template.yaml",
        Template,
        "studio/datasets/<dataset>/tasks/<template>/template.yaml",
        ("**/tasks/*/template.yaml",),
    ),
    UserFile(
        "cohort",
        "Cohort file",
        Cohort,
        "studio/datasets/<dataset>/tasks/<template>/cohorts/<cohort>.yaml",
        ("**/tasks/*/cohorts/*.yaml", "**/tasks/*/cohorts/N*/*.yaml"),
    ),
    UserFile(
        "ladder",
        "Modality ladder",
        Ladder,
        "studio/datasets/<dataset>/tasks/<template>/arms/modality-ladder.yaml",
        ("**/tasks/*/arms/modality-ladder.yaml",),
    ),
    UserFile(
        "benchmark",
        "benchmark.yaml",
        Benchmark,
        "bench/benchmarks/<benchmark>/benchmark.yaml",
        ("**/benchmark.yaml",),
    ),
    UserFile(
        "set",
        "Task set file",
        TaskSet,
        "bench/benchmarks/<benchmark>/sets/<set>.yaml",
        ("**/sets/*.yaml",),
    ),
    UserFile(
        "agent",
        "Agent config",
        AgentFile,
        "bench/agents/<agent>.yaml",
        ("**/agents/*.yaml",),
    ),
)


def user_file(name: str) -> UserFile:
    """The file kind called ``name`` (``dataset``, ``agent``, ...)."""
    for f in FILES:
        if f.name == name:
            return f
    raise KeyError(f"no file kind {name!r} (known: {', '.join(f.name for f in FILES)})")
