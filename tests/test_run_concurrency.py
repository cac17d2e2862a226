"""``bench run --concurrency N``: the process runner keeps N trials running, each isolated
as alone, and the runs, answers and scores are those of one trial at a time; a bad N is
refused naming the option. (Signals and SIGKILL mid-run at concurrency 2, then resume:
tests/test_leases.py, whose harnesses run two trials at once.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import medomni_cas as mc
import medomni_cas.bench.baseline
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.records import RunRecord
from medomni_cas.bench.scorer import jobs_of, score_jobs
from medomni_cas.bench.slottables import slot_runs
from medomni_cas.cli.main import main
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree

SET = "medomni-bench/conc"
SLOTS = 20  # one n20 pair under the encoders arm (the gateway serves trials at once)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trees, the baseline agent run as its file (no package to import: a quick trial),
    and a store with the set built (copied for each run)."""
    root = small_tree(
        tmp_path_factory.mktemp("conc"),
        arms=["encoders"],
        pairs=("synth-ehr_ckd-staging@n20",),
        name="conc",
    )
    doc = yaml.safe_load((root / "bench/agents/baseline.yaml").read_text())
    doc["agent"] = "quick"
    doc["settings"]["command"] = ["python", str(Path(medomni_cas.bench.baseline.__file__))]
    (root / "bench/agents/quick.yaml").write_text(yaml.safe_dump(doc))
    with mc.open(f"lmdb://{root / 'store'}") as s:
        build_set(s, SET, studio=root / "studio", bench=root / "bench")
    return root


def _run(built: Path, tmp: Path, concurrency: int) -> tuple[object, ...]:
    shutil.copytree(built / "store", tmp / "store")
    with mc.open(f"lmdb://{tmp / 'store'}") as store:
        agent = find_agent(built / "bench", "quick")
        report = run_set(
            store,
            SET,
            agent,
            runs_dir=tmp / "runs",
            studio=built / "studio",
            concurrency=concurrency,
        )
        assert report.complete and report.ran == SLOTS
        assert not store.refs.as_dict("runs/claims/")
        index = {}
        for name, rid in slot_runs(store).items():
            run = store.get(rid, RunRecord)
            answer = store.read_blob(run.answer) if run.answer else None
            calls = run.agent_block.encoder_calls
            index[name] = (run.atom, run.outcome, run.attempt, answer, calls, run.predictions)
        runs = [o for o in store.iter_ids() if store.kind(o) == "medomni.run"]
        assert len(runs) == SLOTS  # no slot ran twice
        scored = score_jobs(
            store, jobs_of(store, show_set(store, SET).task_set), n_boot=50, set_name=SET
        )
        return index, scored.record.rows, scored.record.table, scored.record.answer_keys


def test_concurrency_changes_no_run_and_no_score(built: Path, tmp_path: Path) -> None:
    one = _run(built, tmp_path / "one", 1)
    many = _run(built, tmp_path / "many", 3)  # more than the cores: trials wait their turn
    assert len(one[0]) == SLOTS  # type: ignore[arg-type]
    assert any(v[4] for v in one[0].values())  # type: ignore[attr-defined]  # gateway was used
    assert many == one  # every slot's run, answer, calls and predictions; the score table


@pytest.mark.parametrize("n", ["0", "-1"])
def test_a_concurrency_below_one_exits_2_naming_the_option(
    built: Path, tmp_path: Path, n: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(built / "store", tmp_path / "store")
    folders = ["--studio", str(built / "studio"), "--bench", str(built / "bench")]
    code = main(
        [
            "bench",
            "run",
            SET,
            "--agent",
            "quick",
            "--store",
            f"lmdb://{tmp_path / 'store'}",
            *folders,
            "--runs",
            str(tmp_path / "runs"),
            "--concurrency",
            n,
        ]
    )
    assert code == 2
    assert f"--concurrency must be at least 1 trial at once, got {n}" in capsys.readouterr().err
    with mc.open(f"lmdb://{tmp_path / 'store'}") as s:
        assert not slot_runs(s)  # nothing ran
