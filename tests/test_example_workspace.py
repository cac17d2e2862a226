"""The repository's workspace.yaml: from a copy of the example, the README's commands work from
the root with no flags (store, studio, bench and runs all come from the file)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from examples import synth
from medomni_cas.cli import main
from medomni_cas.workspace import Workspace

ROOT = Path(__file__).resolve().parent.parent


def test_the_example_workspace_names_the_example_folders() -> None:
    ws = Workspace.load(ROOT)
    assert ws.exists
    assert ws.store_url == f"lmdb://{ROOT}/.medomni/store"
    assert (ws.studio, ws.bench, ws.runs) == (
        ROOT / "examples/studio",
        ROOT / "examples/bench",
        ROOT / "runs",
    )
    assert (ws.studio / "datasets/synth-ehr/dataset.yaml").is_file()
    assert (ws.bench / "agents/baseline.yaml").is_file()


def test_what_the_example_writes_is_git_ignored() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [
        ".medomni/store/data.mdb",
        "runs/x/run.json",
        "results/medomni-bench.v1/results.json",
        "examples/studio/datasets/synth-ehr/data/patients.parquet",
    ]
    done = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.split() == paths


@pytest.mark.slow
def test_readme_commands_work_from_the_root(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    (repo / "examples").mkdir(parents=True)
    shutil.copy(ROOT / "workspace.yaml", repo)
    no_data = shutil.ignore_patterns("data")
    for name in ("studio", "bench"):
        shutil.copytree(ROOT / "examples" / name, repo / "examples" / name, ignore=no_data)
    synth.generate(
        repo / "examples/studio/datasets/synth-ehr/data", patients=200, seed=0
    )  # as `make demo`
    monkeypatch.chdir(repo)

    code = main(["studio", "taskset", "build", "medomni-bench/v2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    code = main(
        ["bench", "run", "medomni-bench/v2", "--agent", "baseline", "--arm", "no-perception"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "runs in" in out and "no-perception" in out
    assert (repo / ".medomni/store/data.mdb").is_file()
    assert any((repo / "runs").iterdir())
