"""What the Harbor runner reads of a model-backed Harbor agent's trial (terminus-2): the model
the provider reported for each turn, from the trajectory Harbor's agent writes.

No Docker here: the trajectory is made with Harbor's own models and written as terminus-2
writes it (``format_trajectory_json``) into a trial's ``agent/`` folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("harbor")
pytest.importorskip("medomni_harbor")

from harbor.models.trajectories.agent import Agent
from harbor.models.trajectories.step import Step
from harbor.models.trajectories.trajectory import Trajectory
from harbor.utils.trajectory_utils import format_trajectory_json
from medomni_harbor.runner import reported_models


def _write(trial: Path, name: str, models: list[str | None]) -> None:
    steps = [Step(step_id=1, source="user", message="the task")]
    steps += [
        Step(step_id=i + 2, source="agent", message="{}", model_name=m)
        for i, m in enumerate(models)
    ]
    doc = Trajectory(
        agent=Agent(name="terminus-2", version="2", model_name="openai/asked-for"), steps=steps
    )
    (trial / "agent").mkdir(parents=True, exist_ok=True)
    (trial / "agent" / name).write_text(format_trajectory_json(doc.to_json_dict()))


def test_the_served_model_is_each_turns_reported_model(tmp_path: Path) -> None:
    _write(
        tmp_path, "trajectory.json", ["Qwen/Qwen2.5-7B-Instruct", None, "Qwen/Qwen2.5-7B-Instruct"]
    )
    _write(tmp_path, "trajectory.cont-1.json", ["llama-3-8b-q4"])
    assert reported_models(tmp_path) == [
        "llama-3-8b-q4",  # files in name order: cont-1 sorts first
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct",
    ]


def test_no_trajectory_or_a_broken_one_reports_nothing(tmp_path: Path) -> None:
    assert reported_models(tmp_path) == []
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent/trajectory.json").write_text("{not json")
    assert reported_models(tmp_path) == []
