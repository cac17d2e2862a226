"""Scores you can trust: honest slot states, re-runs, early stops, exit status and coverage.

Each test runs the real harness (``medomni bench run``, in process) with real agent
subprocesses on a small set, and checks what the observed failures of issue 13 got wrong:
a broken agent's 40 failures exiting 0 and never running again, shard and resume reports
counting slots never run as done, a score of slots never run written as whole, a silent
agent meeting an encoders-required arm, and a run over its token limit scored as an answer.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.records import JobRecord, Result, RunRecord
from medomni_cas.bench.refnames import result_ref
from medomni_cas.cli.main import main
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree

SET = "medomni-bench/small"
ONE_PAIR = ("synth-ehr_ckd-staging@n20",)  # 20 slots a job


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_tree(
        tmp_path_factory.mktemp("slots"),
        arms=["no-perception", "encoders-required"],
        pairs=ONE_PAIR,
    )


@pytest.fixture
def url(tree: Path, tmp_path: Path) -> Iterator[str]:
    url = f"lmdb://{tmp_path / 'store'}"
    with mc.open(url) as s:
        build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    yield url


def _agent(tree: Path, tmp_path: Path, name: str, script: str, **settings: object) -> Path:
    """An agent config running ``script`` (Python, at a fixed path: rewriting the script
    later changes what runs, not the config's hash, as fixing an install would)."""
    code = tmp_path / f"{name}.py"
    code.write_text(textwrap.dedent(script))
    doc = yaml.safe_load((tree / "bench/agents/baseline.yaml").read_text())
    doc["agent"] = name
    doc["settings"]["command"] = ["python", str(code)]
    doc["settings"].update(settings)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


ANSWER = """
    import json, os
    s = json.load(open("answer_schema.json"))["targets"]
    a = {t["name"]: (t["classes"][0] if t["classes"] else 1.0) for t in s}
    open(os.environ["MEDOMNI_SUBMISSION"], "w").write(json.dumps(a))
"""


def _run(
    tree: Path, tmp_path: Path, url: str, agent: Path, *extra: str, as_json: bool = True
) -> int:
    return main(
        [
            "bench",
            "run",
            SET,
            "--agent",
            str(agent),
            "--store",
            url,
            "--studio",
            str(tree / "studio"),
            "--bench",
            str(tree / "bench"),
            "--runs",
            str(tmp_path / "runs"),
            *(["--json"] if as_json else []),
            *extra,
        ]
    )


def _report(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    out = capsys.readouterr().out
    return json.loads(out) if out.strip() else {}


def _runs(url: str) -> list[RunRecord]:
    with mc.open(url) as s:
        return [s.get(o, RunRecord) for o in s.iter_ids() if s.kind(o) == "medomni.run"]


def _score(tree: Path, tmp_path: Path, url: str, *extra: str) -> int:
    out = ["--out", str(tmp_path / "results")]
    return main(["bench", "score", SET, "--store", url, *out, "--json", *extra])


def test_a_broken_agent_stops_early_exits_1_and_reruns_once_fixed(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Observed: all 40 runs agent-failed, exit 0, then "0 run, 40 already done" for ever."""
    agent = _agent(tree, tmp_path, "broken", "import medomni_no_such_module\n")
    no_perception = ["--arm", "no-perception"]
    code = _run(tree, tmp_path, url, agent, *no_perception)
    (job,) = _report(capsys)["jobs"]  # type: ignore[misc]
    assert code == 1
    assert job["ran"] == 5 and job["never_run"] == 15 and job["outcomes"] == {"agent-failed": 5}
    assert "No module named 'medomni_no_such_module'" in job["stopped"]
    assert len(_runs(url)) == 5  # the rest of the job was not burnt
    report = json.loads((Path(job["folder"]) / "report.json").read_text())
    assert {k: report[k] for k in ("ran", "never_run", "stopped")} == {
        k: job[k] for k in ("ran", "never_run", "stopped")
    }

    # the install is fixed: the same config (same slots) now answers
    (tmp_path / "broken.py").write_text(textwrap.dedent(ANSWER))
    code = _run(tree, tmp_path, url, agent, *no_perception)
    (job,) = _report(capsys)["jobs"]  # type: ignore[misc]
    # the 5 failures are the agent's own outcome: final, so still counted against the run
    assert code == 1 and job["ran"] == 15 and job["done"] == 5
    assert job["outcomes"] == {"agent-failed": 5, "answered": 15} and job["unanswered"] == 5

    code = _run(tree, tmp_path, url, agent, *no_perception, "--rerun", "failed")
    (job,) = _report(capsys)["jobs"]  # type: ignore[misc]
    assert code == 0 and job["ran"] == 5 and job["done"] == 15 and job["complete"]
    runs = _runs(url)
    assert len(runs) == 25  # every earlier attempt stays in the store
    second = [r for r in runs if r.attempt == 2]
    assert len(second) == 5 and all(r.outcome == "answered" for r in second)
    by_id = {r.run_id: r for r in runs}
    assert all(by_id[f"{r.slot}-1"].outcome == "agent-failed" for r in second)
    assert all(r.previous is not None for r in second)

    # the scorer uses each slot's final attempt, and says how many attempts it took
    assert _score(tree, tmp_path, url, "--arm", "no-perception") == 0
    (row,) = _report(capsys)["rows"]  # type: ignore[misc]
    assert row["answered"] == 20 and row["attempts"] == 25 and not row["partial"]


def test_rerun_all_runs_a_new_attempt_of_every_slot(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = _agent(tree, tmp_path, "answers", ANSWER)
    assert _run(tree, tmp_path, url, agent, "--arm", "no-perception") == 0
    capsys.readouterr()
    assert _run(tree, tmp_path, url, agent, "--arm", "no-perception") == 0
    assert _report(capsys)["jobs"][0]["ran"] == 0  # type: ignore[index]
    assert _run(tree, tmp_path, url, agent, "--arm", "no-perception", "--rerun", "all") == 0
    assert _report(capsys)["jobs"][0]["ran"] == 20  # type: ignore[index]
    assert sorted(r.attempt for r in _runs(url)) == [1] * 20 + [2] * 20


def test_a_shard_counts_what_is_outside_it_not_as_done(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Observed: ``--shard 0/2`` printed "17 run, 23 already done" for 23 slots never run."""
    agent = _agent(tree, tmp_path, "answers", ANSWER)
    code = _run(tree, tmp_path, url, agent, "--arm", "no-perception", "--shard", "0/2")
    (job,) = _report(capsys)["jobs"]  # type: ignore[misc]
    assert code == 0  # every slot asked for (this shard's) answered
    assert job["done"] == 0 and job["ran"] + job["outside_shard"] == 20 and job["ran"] > 0
    main_line = _run(
        tree, tmp_path, url, agent, "--arm", "no-perception", "--shard", "1/2", as_json=False
    )
    text = capsys.readouterr().out
    assert main_line == 0 and f"{job['ran']} outside this shard" in text
    assert "0 already done" in text


def test_a_score_of_slots_never_run_is_refused_unless_allowed(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Observed: a result with missing=20 of 20 was written with exit 0, the ref moved to it."""
    agent = _agent(tree, tmp_path, "answers", ANSWER)
    assert _run(tree, tmp_path, url, agent, "--arm", "no-perception", "--shard", "0/2") == 0
    capsys.readouterr()
    # the other arm never ran, and half of this one
    assert _score(tree, tmp_path, url) == 1
    err = capsys.readouterr().err
    assert "encoders-required r1: no job recorded (20 slots never run)" in err
    assert "no-perception r1:" in err and "of 20 slots never run" in err
    with mc.open(url) as s:
        assert s.refs.get(result_ref(SET)) is None
        assert not [o for o in s.iter_ids() if s.kind(o) == "medomni.result"]
    assert not (tmp_path / "results").exists()

    assert _score(tree, tmp_path, url, "--allow-partial") == 0
    doc = _report(capsys)
    assert doc["partial"] is True
    rows = {r["arm"]: r for r in doc["rows"]}  # type: ignore[attr-defined]
    never = rows["encoders-required"]
    assert never["partial"] and never["never_run"] == 20 and never["value"] is None
    half = rows["no-perception"]
    assert half["partial"] and 0 < half["never_run"] < 20
    assert half["answered"] + half["never_run"] == half["expected"] == 20
    saved = json.loads((tmp_path / "results/results.json").read_text())
    assert saved["partial"] is True and all(r["partial"] for r in saved["rows"])
    table = pq.read_table(tmp_path / "results/results.parquet")
    assert table["partial"].to_pylist() == [True, True]
    with mc.open(url) as s:
        ts = show_set(s, SET).task_set.hex()
        result = s.get(s.refs[result_ref(SET)], Result)
        assert result.partial and all(r.task_set == ts for r in result.rows)
    assert table["task_set"].to_pylist() == [ts, ts]  # each score record carries the hash


def test_an_answer_without_the_required_encoder_call_is_unanswered(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Observed: a silent agent on encoders-required scored 0.228 there, unflagged."""
    agent = _agent(tree, tmp_path, "silent", ANSWER)
    code = _run(tree, tmp_path, url, agent, "--arm", "encoders-required")
    (job,) = _report(capsys)["jobs"]  # type: ignore[misc]
    # five alike is enough to stop: the arm is not met, and would not be by the other 15
    assert code == 1 and job["ran"] == 5 and "no successful encoder call" in job["stopped"]
    code = _run(tree, tmp_path, url, agent, "--arm", "encoders-required", "--fail-fast", "0")
    (job,) = _report(capsys)["jobs"]  # type: ignore[misc]
    assert code == 1 and job["outcomes"] == {"answered": 20} and job["unanswered"] == 20
    assert _score(tree, tmp_path, url, "--arm", "encoders-required") == 0
    (row,) = _report(capsys)["rows"]  # type: ignore[misc]
    assert row["answered"] == 0 and row["unanswered"] == {"encoders-unmet": 20}
    assert row["n_missing"] == 20  # scored as no answer, not as the answer it gave
    with mc.open(url) as s:
        job_record = s.get(s.resolve(job["job"]), JobRecord)
        assert job_record.runs and not any(
            s.get(r, RunRecord).agent_block.meets_arm for r in job_record.runs
        )


def test_a_run_over_its_token_limit_is_over_limit(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Observed: 999,999 tokens against a limit of 1,000 was a plain answer."""
    greedy = textwrap.dedent(ANSWER) + (
        'json.dump({"tokens_in": 999_999, "tokens_out": 1}, '
        'open(os.environ["MEDOMNI_RUN_INFO"], "w"))\n'
    )
    agent = _agent(
        tree, tmp_path, "greedy", greedy, limits={"time_sec": 120, "tokens": 1000, "cost_usd": 1}
    )
    code = _run(tree, tmp_path, url, agent, "--arm", "no-perception", "--fail-fast", "0")
    (job,) = _report(capsys)["jobs"]  # type: ignore[misc]
    assert code == 1 and job["outcomes"] == {"over-limit": 20}
    runs = _runs(url)
    assert all(r.outcome == "over-limit" and not r.predictions for r in runs)
    assert all("1000000 tokens, the limit is 1000" in r.errors[-1] for r in runs)
    assert _score(tree, tmp_path, url, "--arm", "no-perception") == 0
    (row,) = _report(capsys)["rows"]  # type: ignore[misc]
    assert row["unanswered"] == {"over-limit": 20} and row["n_missing"] == 20


def test_rows_of_one_pair_and_arm_on_other_runners_are_flagged(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tree / "bench/agents/baseline.yaml"
    assert _run(tree, tmp_path, url, base, "--arm", "no-perception") == 0
    replay = tree / "bench/agents/replay-baseline.yaml"
    assert _run(tree, tmp_path, url, replay, "--arm", "no-perception", "--runner", "replay") == 0
    capsys.readouterr()
    assert _score(tree, tmp_path, url, "--arm", "no-perception") == 0
    rows = {r["agent"]: r for r in _report(capsys)["rows"]}  # type: ignore[attr-defined]
    assert rows["baseline"]["runner"] == "process" and rows["replay-baseline"]["runner"] == "replay"
    assert (
        "replay" in rows["baseline"]["run_flag"]
        and "process" in rows["replay-baseline"]["run_flag"]
    )
