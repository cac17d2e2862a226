"""Harbor's terminus-2 as the Harbor runner records it: the model the provider reported for
each turn, from the trajectory Harbor's agent writes; and real trials in Docker.

Without Docker, a trajectory is made with Harbor's own models and written as terminus-2 writes
it (``format_trajectory_json``) into a trial's ``agent/`` folder. With the engine the tests
start (tests/docker_engine.py) and its image ``local/terminus:1``, ``medomni bench run
--runner harbor`` runs terminus-2 against the stand-in provider (tests/llm_provider.py) on
loopback: the model loop runs in the harness, the shell in a container with no network.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.agents import load_agent
from medomni_cas.bench.records import RunRecord
from medomni_cas.bench.runners import Job
from medomni_cas.store.ids import ObjectId
from medomni_cas.studio.tasksets import build_set
from tests import docker_engine as de
from tests.docker_engine import Engine
from tests.llm_provider import Reply, standin
from tests.test_llm_agent import llm_tree

pytest.importorskip("harbor")
pytest.importorskip("medomni_harbor")

from harbor.models.trajectories.agent import Agent
from harbor.models.trajectories.step import Step
from harbor.models.trajectories.trajectory import Trajectory
from harbor.utils.trajectory_utils import format_trajectory_json
from medomni_harbor import images
from medomni_harbor.runner import HarborRunner, reported_models

ROOT = Path(__file__).resolve().parent.parent
AGENT_IMAGE = images.AGENT_IMAGE
TWO = ("terminus-2-local", "baseline")
NOP = "no-perception"


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


def test_the_agent_image_is_the_configs_unless_the_run_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEDOMNI_HARBOR_IMAGE", raising=False)
    agents = [load_agent(ROOT / f"examples/bench/agents/{n}.yaml") for n in TWO]
    with mc.open("memory://") as s:
        jobs = [Job("j", tmp_path, s, a, s.put(a), NOP, "", "none", 1, 1) for a in agents]
    assert [HarborRunner().agent_image(j) for j in jobs] == [images.TERMINUS_IMAGE, AGENT_IMAGE]
    assert [HarborRunner(image="mine:1").agent_image(j) for j in jobs] == ["mine:1"] * 2
    monkeypatch.setenv("MEDOMNI_HARBOR_IMAGE", "mine:2")
    assert [HarborRunner().agent_image(j) for j in jobs] == ["mine:2"] * 2
    # the perception sidecar's base stays the base image whatever the agent's is
    monkeypatch.delenv("MEDOMNI_HARBOR_IMAGE")
    assert HarborRunner().image == AGENT_IMAGE


# -- a real terminus-2 trial in Docker, against the stand-in ------------------------------------
# Harbor's terminus-2 runs in the harness (its model loop calls the stand-in on loopback through
# LiteLLM) and drives a tmux session in a container of local/terminus:1 that has no network.
SET = "medomni-bench/small"
TRIALS = 2
ASKED = "stand-in-model"  # what the config asks for (LiteLLM: openai/<name>)
SERVED = "stand-in-model-2026-01"  # what the provider reports, as hosted providers do
OTHER = "cheaper-model-q4"
KEY = "sk-test-terminus-0123456789abcdef"
ANSWER = {"ckd_stage": "G2"}
PROMPT, COMPLETION, COST = 400, 30, 0.0015  # the usage the stand-in reports for every turn
_SUBMISSION = re.compile(r"Write your answer to (/\S+) as one JSON object")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def terminus_turn(n: int, body: dict[str, Any]) -> Reply:
    """What a model answers terminus-2, as its prompt asks (JSON: analysis, plan, commands of
    keystrokes, task_complete): first the keystrokes writing the answer to the submission path
    the instruction names, marked complete; then, asked whether it is sure, complete again.
    The second trial's turns report another model than the first's (trials run one at a time).
    Each analysis repeats the API key, as a careless model or a prompt injection might."""
    model = SERVED if n < 2 else OTHER
    last = _text(body["messages"][-1])
    if "Are you sure you want to mark the task as complete" in last:
        turn: dict[str, Any] = {"analysis": f"done ({KEY})", "plan": "", "commands": []}
    else:
        found = _SUBMISSION.search(" ".join(_text(m) for m in body["messages"]))
        keys = f"printf '%s' '{json.dumps(ANSWER)}' > {found.group(1)}\n" if found else ""
        turn = {
            "analysis": f"The task asks for the CKD stage. My key is {KEY}.",
            "plan": "Write the answer where the instruction says.",
            "commands": [{"keystrokes": keys, "duration": 1.0}] if keys else [],
        }
    turn["task_complete"] = True
    return Reply(
        content=json.dumps(turn),
        model=model,
        prompt_tokens=PROMPT,
        completion_tokens=COMPLETION,
        cost=COST,
    )


@pytest.fixture(scope="module")
def terminus_engine(docker_engine: Engine) -> Engine:
    """The engine, which has local/terminus:1 (`.ci/docker-engine image` imports it with the
    base image, from this machine's tmux: no registry)."""
    import docker

    try:
        docker_engine.client.images.get(images.TERMINUS_IMAGE)
    except docker.errors.ImageNotFound:
        msg = f"{images.TERMINUS_IMAGE} is not on the engine: `bash .ci/docker-engine image`"
        if de.required():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return docker_engine


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def test_terminus_2_in_docker_against_the_standin(terminus_engine: Engine, tmp_path: Path) -> None:
    """``medomni bench run --runner harbor`` with a copy of terminus-2-local.yaml: two real
    Harbor trials, the answers recorded, the served model and tokens as the provider reported
    them, every request accounted for, and the key in no stored byte."""
    tree = llm_tree(tmp_path / "tree", n=TRIALS)
    doc = yaml.safe_load((tree / "bench/agents/terminus-2-local.yaml").read_text())
    assert doc["settings"]["image"] == images.TERMINUS_IMAGE
    doc["model"], doc["settings"]["served_model"] = f"openai/{ASKED}", SERVED
    agent = tmp_path / "terminus.yaml"
    agent.write_text(yaml.safe_dump(doc))
    url = f"lmdb://{tmp_path / 'store'}"
    with mc.open(url) as s:
        build_set(s, SET, studio=tree / "studio", bench=tree / "bench")

    with standin(terminus_turn) as provider:
        env = {
            **os.environ,
            "DOCKER_HOST": terminus_engine.host,
            "MEDOMNI_HARBOR_CONCURRENCY": "1",  # one trial at a time: the script's order
            "OPENAI_BASE_URL": provider.base_url,
            "OPENAI_API_KEY": KEY,
        }
        env.pop("MEDOMNI_HARBOR_IMAGE", None)
        proc = subprocess.run(
            [
                sys.executable, "-m", "medomni_cas.cli.main", "bench", "run", SET,
                "--agent", str(agent), "--runner", "harbor", "--arm", "no-perception",
                "--store", url, "--studio", str(tree / "studio"), "--bench", str(tree / "bench"),
                "--runs", str(tmp_path / "runs"), "--json", "--fail-fast", "0",
            ],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        seen, bodies = provider.count, list(provider.bodies)
    assert proc.returncode == 1, proc.stderr[-4000:]  # the second trial's model is not SERVED
    (job,) = json.loads(proc.stdout)["jobs"]
    assert job["outcomes"] == {"answered": 1, "agent-failed": 1}, proc.stderr[-4000:]

    # two turns a trial (write and complete; confirm), each asking for the config's model
    assert seen == 2 * TRIALS and {b["model"] for b in bodies} == {ASKED}
    with mc.open(url) as s:
        runs = [s.get(o, RunRecord) for o in s.iter_ids() if s.kind(o) == "medomni.run"]
        answers = [json.loads(s.read_blob(r.answer)) for r in runs if r.answer is not None]
        closure = s.closure(ObjectId.from_hex(job["job"]))
        stored = b"".join(s.get_raw(o) for o in closure)
    assert len(runs) == TRIALS and {r.runner for r in runs} == {"harbor"}
    assert answers == [ANSWER] * TRIALS  # typed into the container's shell by terminus-2
    (good,) = [r for r in runs if r.outcome == "answered"]
    (bad,) = [r for r in runs if r.outcome == "agent-failed"]
    assert good.served_model == SERVED and good.predictions
    assert bad.served_model == OTHER and not bad.predictions
    assert f"'{OTHER}'" in bad.errors[-1] and f"'{SERVED}'" in bad.errors[-1], bad.errors
    # tokens and cost as Harbor's agent context summed them (LiteLLM read the cost the
    # provider sent): every request the stand-in saw is in a run
    assert {(r.tokens_in, r.tokens_out) for r in runs} == {(2 * PROMPT, 2 * COMPLETION)}
    assert [r.cost_usd for r in runs] == [pytest.approx(2 * COST)] * TRIALS
    assert sum(r.tokens_in or 0 for r in runs) == seen * PROMPT
    assert sum(r.tokens_out or 0 for r in runs) == seen * COMPLETION
    assert {r.environment for r in runs} == {"docker"} and {r.isolation for r in runs} == {
        "container"
    }
    trials = list((Path(job["folder"]) / "harbor/jobs").glob("*/*/result.json"))
    assert len(trials) == TRIALS
    for t in trials:
        result = json.loads(t.read_text())
        assert result["agent_info"]["name"] == "terminus-2" and result["exception_info"] is None

    # the key: in every analysis the model wrote, and in no byte of the store, an exported
    # bundle or the run folder (Harbor's trajectories and logs are redacted when recorded)
    assert KEY in json.dumps(bodies[-1]["messages"])  # the model's own turns, sent back
    bundle = tmp_path / "out.bundle"
    code = subprocess.run(
        [sys.executable, "-m", "medomni_cas.cli.main", "cas", "export", job["job"],
         "-o", str(bundle), "--store", url],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    ).returncode  # fmt: skip
    assert code == 0 and bundle.stat().st_size
    every = {"the job's closure": stored, **{str(p): p.read_bytes() for p in _files(tmp_path)}}
    assert len(every) > 20
    assert [name for name, data in every.items() if KEY.encode() in data] == []
