"""`medomni studio …` and `medomni plugins` in a workspace, in-process through `main`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from examples import synth
from medomni_cas.cli.main import main

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth")
    synth.generate(root / "data", patients=150, seed=0)
    return root


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "workspace.yaml").write_text(
        "store: lmdb://.medomni/store\n"
        f"studio: {EXAMPLES / 'studio'}\nbench: {EXAMPLES / 'bench'}\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> Any:
    got, out, err = run(capsys, *argv, "--json")
    assert got == code, err
    return json.loads(out)


def test_task_build_json_and_text(capsys: pytest.CaptureFixture[str], ws: Path, data: Path) -> None:
    pair = "synth-ehr_ckd-staging@n50"
    first = run_json(capsys, "studio", "task", "build", pair, "--data-root", str(data))
    assert {b["arm"] for b in first["builds"]} == {
        "encoders",
        "no-perception",
        "encoders-required",
    }
    assert not any(b["cached"] for b in first["builds"])
    code, out, _ = run(
        capsys, "studio", "task", "build", pair, "--arm", "encoders", "--data-root", str(data)
    )
    assert code == 0 and "unchanged" in out and first["builds"][0]["config_hash"][:12] in out


def test_taskset_build_show_publish_rebuild(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path, tmp_path: Path
) -> None:
    built = run_json(
        capsys, "studio", "taskset", "build", "medomni-bench/v1", "--data-root", str(data)
    )
    shown = run_json(capsys, "studio", "taskset", "show", "medomni-bench/v1")
    assert shown["task_set"] == built["task_set"] and len(shown["pairs"]) == 4
    assert len(shown["entries"]) == len(built["builds"])
    code, out, _ = run(capsys, "studio", "taskset", "show", "medomni-bench/v1")
    assert code == 0 and built["task_set"] in out
    bundle = tmp_path / "v1.bundle"
    info = run_json(
        capsys,
        "studio",
        "taskset",
        "publish",
        "medomni-bench/v1",
        "-o",
        str(bundle),
        "--configs-only",
    )
    assert bundle.is_file() and info["objects"] == 3 + len(
        {b["config_hash"] for b in built["builds"]}
    )
    other = tmp_path / "other"
    other.mkdir()
    store = f"lmdb://{other}/store"
    rebuilt = run_json(
        capsys,
        "studio",
        "taskset",
        "rebuild",
        str(bundle),
        "--store",
        store,
        "--data-root",
        str(data),
    )
    assert rebuilt["ok"] and {p["status"] for p in rebuilt["pairs"]} == {"match"}
    # someone else's data: the ids differ, and the exit code says so
    other_data = tmp_path / "other-data"
    synth.generate(other_data / "data", patients=150, seed=3)
    code, out, _ = run(
        capsys,
        "studio",
        "taskset",
        "rebuild",
        str(bundle),
        "--store",
        f"lmdb://{tmp_path}/third",
        "--data-root",
        str(other_data),
    )
    assert code == 1 and "data differs" in out


def test_bad_input_exits_2_naming_it(capsys: pytest.CaptureFixture[str], ws: Path) -> None:
    code, _, err = run(capsys, "studio", "taskset", "show", "medomni-bench/v1")
    assert code == 2 and "no store at" in err  # read verbs never create a store
    code, _, err = run(capsys, "studio", "task", "build", "no-at-sign")
    assert code == 2 and "<template>@<cohort>" in err
    code, _, err = run(capsys, "studio", "task", "build", "nope@n20")
    assert code == 2 and "no template 'nope'" in err
    code, _, err = run(capsys, "studio", "task", "build", "synth-ehr_ckd-staging@n99")
    assert code == 2 and "no cohort 'n99'" in err
    code, _, err = run(capsys, "studio", "taskset", "build", "medomni-bench/v7")
    assert code == 2 and "no set 'v7'" in err
    assert not (ws / ".medomni").exists()  # nothing was created for bad input
    code, _, err = run(capsys, "studio", "template", "signoff", "nope")
    assert code == 2 and "no template 'nope'" in err


def test_signoff_then_changed_template_is_refused(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path, tmp_path: Path
) -> None:
    import shutil

    studio = tmp_path / "studio"
    shutil.copytree(EXAMPLES / "studio", studio, ignore=shutil.ignore_patterns("data"))
    signed = run_json(
        capsys, "studio", "template", "signoff", "synth-ehr_hba1c-next", "--studio", str(studio)
    )
    assert signed["cohorts"] == {"n20": "1.0", "n50": "1.0"}
    tpl = studio / "datasets/synth-ehr/tasks/synth-ehr_hba1c-next/template.yaml"
    text = tpl.read_text()
    tpl.write_text(text.replace("agent_sec: 900", "agent_sec: 1200"))
    assert tpl.read_text() != text
    code, _, err = run(
        capsys,
        "studio",
        "task",
        "build",
        "synth-ehr_hba1c-next@n20",
        "--studio",
        str(studio),
        "--data-root",
        str(data),
    )
    assert code == 2 and "signed off" in err and '"1.1"' in err


def test_plugins_lists_arms_benchmarks_and_groups(
    capsys: pytest.CaptureFixture[str], ws: Path
) -> None:
    found = run_json(capsys, "plugins")
    names = {a["name"]: a for a in found["arms"]}
    assert {"encoders", "no-perception", "encoders-required", "modality-ladder"} <= set(names)
    assert names["checklist"]["source"] == "medomni-example-arm"
    benches = {b["name"]: b["source"] for b in found["benchmarks"]}
    assert benches == {"medomni-bench": "workspace", "checklist-bench": "medomni-example-arm"}
    assert {b["name"] for b in found["store backends"]} >= {"lmdb", "memory", "file"}
    code, out, _ = run(capsys, "plugins")
    assert code == 0 and "checklist" in out and "runners:" in out


def test_a_broken_workspace_file_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "workspace.yaml").write_text("store: [unclosed\n")
    monkeypatch.chdir(tmp_path)
    for argv in (["cas", "refs"], ["studio", "taskset", "show", "medomni-bench/v1"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "workspace.yaml:2: YAML syntax" in err
    (tmp_path / "workspace.yaml").write_text("stroe: lmdb://x\n")
    code, _, err = run(capsys, "studio", "taskset", "show", "medomni-bench/v1")
    assert code == 2 and "workspace.yaml:1: stroe: unknown field 'stroe'" in err
    assert not (tmp_path / ".medomni").exists()
