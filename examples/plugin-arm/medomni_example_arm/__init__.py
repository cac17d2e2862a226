"""The `checklist` arm and the `checklist-bench` benchmark, as a plug-in would ship them."""

from __future__ import annotations

from pathlib import Path

from medomni_cas.studio.arms import ArmBuild

__all__ = ["ARM", "benchmark_folder"]

#: Both sides of the arm: the build side renders this paragraph into the instruction; the
#: run side reads ``encoders`` ("none": no perception service is attached).
ARM = ArmBuild(
    name="checklist",
    description="without encoders, with a reasoning checklist in the instruction",
    paragraph=(
        "No encoders are available for this task. Before you answer, go through this "
        "checklist: list the findings that bear on each target, note what is missing from "
        "the record, then commit to one prediction per target."
    ),
    encoders="none",
)


def benchmark_folder() -> Path:
    """The folder holding ``benchmark.yaml`` and ``sets/``."""
    return Path(__file__).parent / "checklist-bench"
