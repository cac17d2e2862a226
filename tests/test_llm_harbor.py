"""Harbor's terminus-2 as the Harbor runner records it: the model the provider reported for
each turn, from the trajectory Harbor's agent writes; and real trials in Docker.

Without Docker, a trajectory is made with Harbor's own models and written as terminus-2 writes
it (``format_trajectory_json``) into a trial's ``agent/`` folder. With the engine the tests
start (tests/docker_engine.py) and its image ``local/terminus:1``, ``medomni bench run
--runner harbor`` runs terminus-2 against the stand-in provider (tests/llm_provider.py) on
loopback: the model loop runs in the harness, the shell in a container with no network.

The Docker tests share one module fixture, `trials`: a job of five real trials of a copy of
terminus-2-local.yaml whose stand-in script differs per trial (an answer, another served
model, a 504, a hang past the client's time-out, usage past the limits), resumed once; and
one trial of terminus-2-cloud.yaml as it is. Each test reads what they recorded.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.agents import load_agent
from medomni_cas.bench.records import RunRecord
from medomni_cas.bench.runners import Job
from medomni_cas.cli.main import main
from medomni_cas.store.ids import ObjectId
from medomni_cas.studio.tasksets import build_set
from tests import docker_engine as de
from tests.docker_engine import Engine
from tests.llm_provider import Provider, TerminusScript, standin
from tests.test_llm_agent import llm_tree

pytest.importorskip("harbor")
pytest.importorskip("medomni_harbor")

from harbor.llms.lite_llm import LiteLLM
from harbor.models.trajectories.agent import Agent
from harbor.models.trajectories.step import Step
from harbor.models.trajectories.trajectory import Trajectory
from harbor.utils.trajectory_utils import format_trajectory_json
from medomni_harbor import images
from medomni_harbor.runner import HarborRunner, reported_models
from tenacity import wait_fixed  # Harbor's own dependency

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


# -- real terminus-2 trials in Docker, against the stand-in --------------------------------------
# Harbor's terminus-2 runs in the harness (its model loop calls the stand-in on loopback through
# LiteLLM) and drives a tmux session in a container of local/terminus:1 that has no network.
SET = "medomni-bench/small"
PLAN = ("good", "other-model", "504", "hang", "over")  # one trial each
ASKED = "stand-in-model"  # what the config asks for (LiteLLM: openai/<name>)
SERVED = "stand-in-model-2026-01"  # what the provider reports, as hosted providers do
OTHER = "cheaper-model-q4"
KEY = "sk-test-terminus-0123456789abcdef"
ANSWER = {"ckd_stage": "G2"}
PROMPT, COMPLETION, COST = 400, 30, 0.0015  # the usage the stand-in reports for each turn
CLOUD_SERVED = "gpt-4o-mini-2024-07-18"  # terminus-2-cloud.yaml's served_model
#: LiteLLM's time-out per request, and no retries of the OpenAI client below Harbor's own
#: (terminus-2 tries a failing call 3 x 3 times, LiteLLM waiting between its tries, before the
#: trial fails)
CALL = {"timeout": 1, "max_retries": 0}


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


@dataclass
class Ran:
    """What a `bench run` printed and recorded, and what the stand-in saw meanwhile."""

    code: int
    job: dict[str, Any]
    url: str
    seen: int
    bodies: list[dict[str, Any]]
    script: TerminusScript
    answered: Counter[str]  # the script's 200s so far, by behaviour

    def runs(self) -> list[RunRecord]:
        with mc.open(self.url) as s:
            return [s.get(o, RunRecord) for o in s.iter_ids() if s.kind(o) == "medomni.run"]


@dataclass
class Trials:
    first: Ran  # the five trials
    resumed: Ran  # the same command again
    cloud: Ran  # terminus-2-cloud.yaml, one trial
    root: Path


def _bench_run(tree: Path, url: str, agent: Path, runs: Path, *extra: str) -> tuple[int, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "bench", "run", SET, "--agent", str(agent), "--runner", "harbor",
                "--arm", "no-perception", "--store", url, "--studio", str(tree / "studio"),
                "--bench", str(tree / "bench"), "--runs", str(runs), "--json", *extra,
            ]
        )  # fmt: skip
    return code, json.loads(out.getvalue())


def _ran(provider: Provider, script: TerminusScript, code: int, report: Any, url: str) -> Ran:
    (job,) = report["jobs"]
    return Ran(
        code, job, url, provider.count, list(provider.bodies), script, Counter(script.answered)
    )


@pytest.fixture(scope="module")
def trials(terminus_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trials]:
    root = tmp_path_factory.mktemp("terminus")
    tree = llm_tree(root / "tree", n=len(PLAN))
    doc = yaml.safe_load((tree / "bench/agents/terminus-2-local.yaml").read_text())
    assert doc["settings"]["image"] == images.TERMINUS_IMAGE
    doc["model"], doc["settings"]["served_model"] = f"openai/{ASKED}", SERVED
    doc["settings"]["harbor_kwargs"]["llm_call_kwargs"] = CALL
    local = root / "terminus.yaml"
    local.write_text(yaml.safe_dump(doc))
    url = f"lmdb://{root / 'store'}"
    one = llm_tree(root / "tree-1", n=1)  # for the cloud config: one trial
    cloud_url = f"lmdb://{root / 'store-cloud'}"
    for u, t in ((url, tree), (cloud_url, one)):
        with mc.open(u) as s:
            build_set(s, SET, studio=t / "studio", bench=t / "bench")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", terminus_engine.host)
        mp.setenv("OPENAI_API_KEY", KEY)
        mp.delenv("MEDOMNI_HARBOR_IMAGE", raising=False)
        # Harbor's retries stay as they are (a failing call is tried 3 x 3 times); only the
        # 4-15 s sleeps of LiteLLM's between them are cut, which the 504 and the hang would
        # otherwise spend asleep (about 25 s of the job's wall time)
        mp.setattr(LiteLLM.call.retry, "wait", wait_fixed(0.1))
        script = TerminusScript(PLAN, served=SERVED, other=OTHER, answer=ANSWER, leak=KEY)
        script.prompt_tokens, script.completion_tokens, script.cost = PROMPT, COMPLETION, COST
        with standin(script) as provider:
            mp.setenv("OPENAI_BASE_URL", provider.base_url)
            # all five at once: the 504 and the hang each take terminus-2's 9 tries and waits
            opts = ("--runner-option", f"concurrency={len(PLAN)}", "--fail-fast", "0")
            code, report = _bench_run(tree, url, local, root / "runs", *opts)
            first = _ran(provider, script, code, report, url)
            script.healed = True  # the provider is back: resume
            code, report = _bench_run(tree, url, local, root / "runs", *opts)
            resumed = _ran(provider, script, code, report, url)
        # terminus-2-cloud.yaml as it is; the stand-in serves the model it names
        script = TerminusScript(served=CLOUD_SERVED, leak=KEY)
        with standin(script) as provider:
            mp.setenv("OPENAI_BASE_URL", provider.base_url)
            cloud_agent = one / "bench/agents/terminus-2-cloud.yaml"
            code, report = _bench_run(
                one, cloud_url, cloud_agent, root / "runs-cloud", "--accept-conditions"
            )
            cloud = _ran(provider, script, code, report, cloud_url)
    yield Trials(first, resumed, cloud, root)


def _by_behaviour(ran: Ran) -> dict[str, list[RunRecord]]:
    """The runs of each behaviour of the plan, first attempts first (each trial's behaviour is
    the one its evidence's checksum got, which Harbor's trial folder shows in its log)."""
    out: dict[str, list[RunRecord]] = {}
    for r in sorted(ran.runs(), key=lambda r: r.attempt):
        text = b"".join(_logs(ran.url, r).values())
        (what,) = [w for digest, w in ran.script.of.items() if digest.encode() in text]
        out.setdefault(what, []).append(r)
    return out


def _logs(url: str, run: RunRecord) -> dict[str, bytes]:
    if run.logs is None:
        return {}
    with mc.open(url) as s:
        tree = s.get(run.logs)
        return {name: s.read_blob(tree[name]) for name in tree}


def test_terminus_2_answers_with_the_served_model_tokens_and_cost_recorded(
    trials: Trials,
) -> None:
    """An answer typed into the container's shell by terminus-2, recorded with the model the
    provider reported and Harbor's token and cost counts; every request the stand-in
    answered is in a run's counts."""
    first = trials.first
    assert first.code == 1  # some trials failed, by design
    by = _by_behaviour(first)
    (good,) = by["good"]
    assert good.outcome == "answered" and good.served_model == SERVED and good.predictions
    with mc.open(first.url) as s:
        assert json.loads(s.read_blob(good.answer)) == ANSWER  # type: ignore[arg-type]
    # three turns: checksum, write and complete, confirm; each asking for the config's model
    assert (good.tokens_in, good.tokens_out) == (3 * PROMPT, 3 * COMPLETION)
    assert good.cost_usd == pytest.approx(3 * COST)
    assert {b["model"] for b in first.bodies} == {ASKED}
    # every 200 the stand-in sent is counted in one run (a failed request has no usage)
    answered = first.answered
    runs = first.runs()
    over = answered["over"]
    want_in = PROMPT * (sum(answered.values()) - over) + 250_000 * over
    firsts = [r for r in runs if r.attempt == 1]
    assert sum(r.tokens_in or 0 for r in firsts) == want_in
    assert sum(r.tokens_out or 0 for r in firsts) == COMPLETION * sum(answered.values())
    assert {r.runner for r in runs} == {"harbor"}
    assert {(r.environment, r.isolation) for r in runs} == {("docker", "container")}
    results = list((Path(first.job["folder"]) / "harbor/jobs").glob("*/*/result.json"))
    assert len(results) == len(PLAN) + 2  # the first job's five, the resumed job's two
    for t in results:
        assert json.loads(t.read_text())["agent_info"]["name"] == "terminus-2"


def test_another_served_model_is_an_error_of_the_run_naming_both(trials: Trials) -> None:
    (bad,) = _by_behaviour(trials.first)["other-model"]
    assert bad.outcome == "agent-failed" and not bad.predictions
    assert OTHER in bad.served_model  # the provider switched models after the first turn
    assert OTHER in bad.errors[-1] and f"the config's '{SERVED}'" in bad.errors[-1], bad.errors


def test_tokens_and_cost_past_the_limits_end_over_limit(trials: Trials) -> None:
    (over,) = _by_behaviour(trials.first)["over"]
    assert over.outcome == "over-limit" and not over.predictions
    assert over.tokens_in == PROMPT + 2 * 250_000
    assert any("over the token limit: 500490 tokens, the limit is 200000" in e for e in over.errors)
    assert any("over the cost limit: $5.0015, the limit is $1" in e for e in over.errors)


def test_a_504_and_a_hang_are_infra_errors_and_only_they_run_again(trials: Trials) -> None:
    """marin-community/marin#7789 through a real scaffold: the trials that hit the provider's
    504 or a hang past LiteLLM's time-out end as infrastructure errors, are kept, and resume
    runs exactly those again (linked from their first attempt); the rest are kept as they
    ended."""
    first, resumed = trials.first, trials.resumed
    assert first.job["outcomes"] == {
        "answered": 1, "agent-failed": 1, "over-limit": 1, "infra-error": 2
    }  # fmt: skip
    assert first.job["infra_errors"] == 2
    by = _by_behaviour(resumed)
    for what, cause in (("504", "stand-in fault 504"), ("hang", "Request timed out")):
        failed, again = by[what]
        assert failed.outcome == "infra-error" and failed.attempt == 1, failed.errors
        assert any(cause in e for e in failed.errors), failed.errors
        assert again.attempt == 2 and again.outcome == "answered" and again.predictions
        assert again.slot == failed.slot and again.previous is not None
    assert resumed.job["ran"] == 2 and resumed.job["done"] == 3
    assert resumed.job["outcomes"] == {"answered": 3, "agent-failed": 1, "over-limit": 1}
    assert resumed.code == 1 and resumed.job["infra_errors"] == 0  # two runs failed: final
    # the resumed job asked the stand-in only for the two: three turns each
    assert resumed.seen - first.seen == 2 * 3
    assert len(resumed.runs()) == len(PLAN) + 2


def test_the_cloud_config_runs_as_it_is(trials: Trials) -> None:
    """terminus-2-cloud.yaml, unchanged, against an endpoint serving the model it names (the
    example dataset's cloud route is conditional: accepted)."""
    cloud = trials.cloud
    assert cloud.code == 0 and cloud.job["outcomes"] == {"answered": 1}
    (run,) = cloud.runs()
    assert run.served_model == CLOUD_SERVED and run.predictions
    assert {b["model"] for b in cloud.bodies} == {"gpt-4o-mini"} and cloud.seen == 3
    assert (run.tokens_in, run.tokens_out) == (3 * 400, 3 * 30)


def test_the_key_is_in_no_stored_byte(trials: Trials, capsys: pytest.CaptureFixture[str]) -> None:
    """The key: in every analysis the model wrote, and in no byte of the stores, an exported
    bundle or the run folders (Harbor's trajectories and logs are redacted when recorded)."""
    first = trials.first
    assert KEY in json.dumps(first.bodies[-1]["messages"])  # the model's own turns, sent back
    stored = b""
    for ran in (first, trials.cloud):
        bundle = trials.root / f"{ran.job['job'][:12]}.bundle"
        assert main(["cas", "export", ran.job["job"], "-o", str(bundle), "--store", ran.url]) == 0
        with mc.open(ran.url) as s:
            stored += b"".join(s.get_raw(o) for o in s.closure(ObjectId.from_hex(ran.job["job"])))
    capsys.readouterr()
    every = {"the jobs' closures": stored, **{str(p): p.read_bytes() for p in _files(trials.root)}}
    assert len(every) > 40
    assert [name for name, data in every.items() if KEY.encode() in data] == []
