"""The Harbor runner (adapters/harbor) end to end: real Harbor trials in the Docker engine the
tests start (tests/docker_engine.py), no model calls.

A tiny set (two pairs of 5 patients, arms no-perception and encoders-required) runs through
``run_set(..., runner="harbor")`` with the baseline agent, the replay agent and the null
agent; it is scored and audited; a probe agent looks at the agent container's network from
inside; a harness killed mid-job resumes without losing or repeating a run. No packet is ever
sent to an address off this machine: trial containers have ``network none`` or the relay's
loopback-only namespace, and the job's forwarder (host network) connects only to the job's
gateway on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import medomni_cas as mc
from examples import synth
from medomni_cas.bench.agents import find_agent, load_agent
from medomni_cas.bench.harness import CheckFailed, run_set
from medomni_cas.bench.records import RunRecord, slot_id
from medomni_cas.bench.scorer import PartialScore, jobs_of, score_jobs
from medomni_cas.bench.slottables import slot_runs
from medomni_cas.studio.records import AnswerKey, BuildResult
from medomni_cas.studio.tasksets import build_set, show_set
from tests._slots import forget_run
from tests.docker_engine import Engine

pytest.importorskip("harbor")
pytest.importorskip("medomni_harbor")

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from medomni_harbor import _docker, images
from medomni_harbor.render import format_check_script, render_task
from medomni_harbor.runner import HarborRunner

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SET = "medomni-bench/tiny"
N = 5
PAIRS = ["synth-ehr_ckd-staging", "synth-ehr_hba1c-next"]
SLOTS_PER_ARM = 2 * N
NOP, REQ = "no-perception", "encoders-required"


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(docker_engine: Engine) -> Engine:
    """The engine, with the perception relay's image built here (no registry)."""
    images.ensure_relay_image(docker_engine.host)
    return docker_engine


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Studio and bench copies with an n5 cohort per pair and the set ``tiny`` listing them."""
    root = tmp_path_factory.mktemp("harbor")
    shutil.copytree(EXAMPLES / "studio", root / "studio", ignore=shutil.ignore_patterns("data"))
    shutil.copytree(EXAMPLES / "bench", root / "bench")
    for task in PAIRS:
        cohorts = root / "studio/datasets/synth-ehr/tasks" / task / "cohorts"
        doc = yaml.safe_load((cohorts / "n20.yaml").read_text())
        doc.pop("per_class", None)  # every eligible patient in seeded order, the first five
        doc.update(n=N, description=f"{N} patients, for the Harbor tests.")
        (cohorts / f"n{N}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    tiny = {
        "description": "Two pairs of five patients, for the Harbor tests.",
        "builder": "medomni-v1",
        "arms": ["no-perception", "encoders-required"],
        "pairs": [{"task": f"{t}@n{N}", "n": 1} for t in PAIRS],
    }
    sets = root / "bench/benchmarks/medomni-bench/sets"
    (sets / "tiny.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    probe = {
        "kind": "agent",
        "agent": "probe",
        "model": "none",
        "route": "local",
        "settings": {
            "scaffold": "probe",
            "served_model": "none",
            "limits": {"time_sec": 60},
            "harbor_agent": "tests.test_harbor:ProbeAgent",
        },
    }
    (root / "bench/agents/probe.yaml").write_text(yaml.safe_dump(probe))
    synth.generate(root / "studio/datasets/synth-ehr/data", patients=150, seed=0)
    return root


@pytest.fixture
def store(tree: Path, tmp_path: Path) -> Iterator[mc.Store]:
    s = mc.open(f"lmdb://{tmp_path / 'store'}")
    build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    yield s
    s.close()


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """Every container a test's trials started is gone when it ends (trials are told apart by
    their folder, under the test's own tmp_path: an engine may be shared)."""
    yield
    if "engine" in request.fixturenames:
        engine: Engine = request.getfixturevalue("engine")
        left = [
            c.name
            for c in engine.client.containers.list(all=True, filters={"label": _docker.LABEL})
            if c.labels.get("medomni-harbor.trial-dir", "").startswith(str(tmp_path))
        ]
        assert not left, f"containers left behind: {left}"


def _run(store: mc.Store, tree: Path, tmp: Path, engine: Engine, agent: str, **kw: Any):  # type: ignore[no-untyped-def]
    runner = kw.pop("runner", None) or HarborRunner(docker_host=engine.host, concurrency=2)
    return run_set(
        store,
        SET,
        find_agent(tree / "bench", agent),
        runs_dir=tmp / "runs",
        studio=tree / "studio",
        runner=runner,
        **kw,
    )


def _runs(store: mc.Store, agent: str | None = None) -> list[RunRecord]:
    runs = [store.get(o, RunRecord) for o in store.iter_ids() if store.kind(o) == "medomni.run"]
    if agent is None:
        return runs
    ids = {store.refs.get(f"bench/agents/{agent}")}
    return [r for r in runs if r.agent_config in ids]


def _log(store: mc.Store, run: RunRecord, name: str) -> bytes:
    assert run.logs is not None
    return store.read_blob(store.get(run.logs)[name])


def _trial_results(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in (folder / "harbor/jobs").glob("*/*/result.json")]


def _shard(
    store: mc.Store, tree: Path, agent: str, n: int, arms: tuple[str, ...] = ("no-perception",)
) -> tuple[int, int]:
    """A shard of ``n`` (the harness's, by slot id) holding slots of ``agent`` in every arm of
    ``arms``: a few trials instead of the set, and never none."""
    agent_id = store.put(find_agent(tree / "bench", agent))
    have: dict[int, set[str]] = {}
    for e in show_set(store, SET).entries:
        for aid in store.get(e.result, BuildResult).atoms:
            slot = slot_id(aid, agent_id, e.arm, 1)
            have.setdefault(int.from_bytes(slot[:8], "big") % n, set()).add(e.arm)
    return next((i, n) for i in range(n) if set(arms) <= have.get(i, set()))


# -- a probe agent: looks at the container's network from inside -------------------------------
PROBE = (
    "ls /sys/class/net; echo --; tail -n +2 /proc/net/route; echo --; "
    "timeout 5 wget -q -O - http://perception:8899/health || echo unreachable; echo; echo --; "
    "timeout 10 wget -q -O - --header 'Content-Type: application/json' "
    '--post-data \'{"encoder": "table-summary", "family": "labs"}\' '
    "http://perception:8899/v1/encode >/dev/null && echo encoded || echo not-encoded"
)


class ProbeAgent(BaseAgent):
    """Runs `PROBE` in the agent's container and keeps its output as ``agent/probe.txt``."""

    @staticmethod
    def name() -> str:
        return "medomni-test-probe"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def set_web_tools_disabled(self, disabled: bool, environment: BaseEnvironment) -> None:
        return None

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        result = await environment.exec(PROBE, timeout_sec=60)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / "probe.txt").write_text(result.stdout or "")
        # what a failing check shows: the exec's status and stderr (a time-out has no stdout)
        (self.logs_dir / "probe.err").write_text(f"{result.return_code}\n{result.stderr or ''}")


class FailingAgent(ProbeAgent):
    """Fails in the agent phase: ``fail="engine"`` as the engine would (`ContainerFailure`),
    anything else as an agent's own bug."""

    def __init__(self, *args: Any, fail: str = "bug", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail = fail

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        from medomni_harbor.environment import ContainerFailure

        await environment.exec("true")
        if self.fail == "engine":
            raise ContainerFailure("the Docker engine failed: simulated")
        raise ValueError("a bug in the agent")


# -- the task folder ----------------------------------------------------------------------------
def test_task_folder_holds_no_answer_and_its_format_check_runs_in_bash(
    store: mc.Store, engine: Engine, tmp_path: Path
) -> None:
    from medomni_cas.bench.runners import Job, TrialSpec
    from medomni_cas.studio.records import AtomTask, FormatCheck

    entry = next(e for e in show_set(store, SET).entries if e.arm == "encoders-required")
    result = store.get(entry.result, BuildResult)
    aid = result.atoms[0]
    atom = store.get(aid, AtomTask)
    check = store.get(atom.format_check, FormatCheck)
    agent = load_agent(ROOT / "examples/bench/agents/baseline.yaml")
    job = Job("j", tmp_path, store, agent, store.put(agent), atom.arm, "", "required", 1, 4)
    spec = TrialSpec(mc.ObjectId(bytes(32)), 1, aid, atom, check)
    folder = render_task(job, spec, tmp_path / "tasks", image=images.AGENT_IMAGE)
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert "tests/test.sh" in names and "task.toml" in names and "instruction.md" in names
    assert not any(n.startswith("solution") for n in names)
    assert "environment/answer_schema.json" in names and "environment/labs.jsonl" in names
    # no file of the task holds the patient's answer (a class label appears only as a choice)
    truth = store.get(result.answer_key, AnswerKey).values[atom.patient]
    texts = {n: (folder / n).read_text(errors="replace") for n in names}
    for t in check.targets:
        value = json.dumps(truth[t.name])
        for n, text in texts.items():
            squeezed = "".join(text.split())
            assert f'"{t.name}":{value}' not in squeezed, (n, t.name)
    toml = (folder / "task.toml").read_text()
    assert 'network_mode = "no-network"' in toml and "[metadata.medomni.perception]" in toml
    # the format check itself, in the base image (bash + busybox, no python)
    targets = [t.name for t in check.targets]
    script = format_check_script("/workspace/answer.json", targets)
    good = json.dumps({t: "x" for t in targets})
    for answer, ok in ((good, 1), ("{}", 0), ("not json", 0), (None, 0)):
        setup = "mkdir -p /workspace; "
        if answer is not None:
            setup += f"printf '%s' '{answer}' > /workspace/answer.json; "
        c = engine.client.containers.run(
            images.AGENT_IMAGE,
            ["bash", "-c", f"{setup}(\n{script}\n)\ncat /logs/verifier/reward.json"],
            network_mode="none",
            remove=False,
            detach=True,
        )
        try:
            c.wait(timeout=60)
            out = c.logs().decode()
        finally:
            c.remove(force=True)
        assert json.loads(out.strip().splitlines()[-1]) == {"format_ok": ok}, out


# -- the main path ------------------------------------------------------------------------------
def test_baseline_and_replay_run_in_harbor_score_and_audit(
    store: mc.Store, tree: Path, engine: Engine, tmp_path: Path
) -> None:
    from medomni_cas.audit.verify import verify_result

    report = _run(store, tree, tmp_path, engine, "baseline")
    assert [j.ran for j in report.jobs] == [SLOTS_PER_ARM, SLOTS_PER_ARM]
    runs = _runs(store, "baseline")
    assert len(runs) == 2 * SLOTS_PER_ARM and {r.outcome for r in runs} == {"answered"}, [
        (r.outcome, r.errors) for r in runs if r.outcome != "answered"
    ]
    assert {r.runner for r in runs} == {"harbor"}
    assert all("labs.jsonl" in r.agent_block.files_opened for r in runs)
    assert all(r.predictions for r in runs)
    req = [r for r in runs if r.agent_block.arm == "encoders-required"]
    from medomni_cas.bench.encoders import encoders

    digests = {n: e.digest for n, e in encoders().items()}
    for r in req:  # the job's gateway served, logged each call, and the arm's rule holds
        assert r.agent_block.encoder_calls >= 1 and r.agent_block.meets_arm
        served = {e.name: e.digest for e in r.agent_block.encoders_served}
        assert "ecg-summary" in served and all(d == digests[n] for n, d in served.items())
        calls = store.read_blob(r.agent_block.encoder_log).decode().splitlines()  # type: ignore[arg-type]
        assert json.loads(calls[0])["status"] == "ok"
    nop = [r for r in runs if r.agent_block.arm == "no-perception"]
    assert all(not r.agent_block.encoders_served and r.agent_block.encoder_calls == 0 for r in nop)
    # Harbor's own record of each trial is kept with the run, and its job folder in the run folder
    result = json.loads(_log(store, runs[0], "result.json"))
    assert result["agent_info"]["name"] == "medomni-command"
    assert result["verifier_result"]["rewards"] == {"format_ok": 1}
    for j in report.jobs:
        trials = _trial_results(j.folder)
        assert len(trials) == SLOTS_PER_ARM and all(t["exception_info"] is None for t in trials)
        assert (j.folder / "runs.jsonl").read_text().count("\n") == SLOTS_PER_ARM
        assert not (j.folder / "harbor/tasks").exists()  # rendered tasks are not kept

    # running again resumes: nothing runs, no Harbor job is started
    jobs_before = sorted(p.name for j in report.jobs for p in (j.folder / "harbor/jobs").iterdir())
    again = _run(store, tree, tmp_path, engine, "baseline")
    assert again.ran == 0 and [j.skipped for j in again.jobs] == [SLOTS_PER_ARM] * 2
    jobs_after = sorted(p.name for j in report.jobs for p in (j.folder / "harbor/jobs").iterdir())
    assert jobs_after == jobs_before

    # a slot Harbor finished that the harness never recorded (it died in between) is collected
    # from Harbor's result.json, not run again: ours agrees with Harbor's resume
    lost = nop[0]
    ref = f"runs/slots/{lost.slot}"
    forget_run(store, bytes.fromhex(lost.slot))  # simulate a harness killed
    third = _run(store, tree, tmp_path, engine, "baseline", arms=["no-perception"])
    assert third.ran == 1
    assert store.get(slot_runs(store)[ref], RunRecord).run_id == lost.run_id  # the same run
    nop_folder = report.jobs[0].folder
    assert len(_trial_results(nop_folder)) == SLOTS_PER_ARM  # no new trial

    # the replay agent repeats the baseline's answers in real containers, with no model
    rep = _run(store, tree, tmp_path, engine, "replay-baseline", arms=["no-perception"])
    assert rep.ran == SLOTS_PER_ARM
    replayed = _runs(store, "replay-baseline")
    assert {r.outcome for r in replayed} == {"answered"}
    assert all(r.tokens_in == 0 and r.cost_usd == 0.0 for r in replayed)
    ts = show_set(store, SET).task_set
    a = score_jobs(store, jobs_of(store, ts, ["baseline"]), n_boot=0).record.rows
    nop = ["no-perception"]  # the replay ran this arm only
    b = score_jobs(store, jobs_of(store, ts, ["replay-baseline"]), n_boot=0, arms=nop).record.rows
    nop_rows = [r.value for r in a if r.arm == "no-perception"]
    assert nop_rows and nop_rows == [r.value for r in b]

    # scored and audited: every object under the result re-hashes
    with pytest.raises(PartialScore, match="replay-baseline encoders-required r1: no job"):
        score_jobs(store, jobs_of(store, ts), n_boot=0)
    scored = score_jobs(store, jobs_of(store, ts), n_boot=50, set_name=SET, arms=nop)
    assert all(r.n == N and r.value is not None for r in scored.record.rows)
    # agent commands and replays run on the host against the container: no isolation
    assert {(r.runner, r.isolation) for r in scored.record.rows} == {("harbor", "none")}
    audit = verify_result(store, scored.result)
    assert audit.ok and audit.objects > 100, audit.problems


def test_null_agent_fails_the_format_check_and_nop_answers_nothing(
    store: mc.Store, tree: Path, engine: Engine, tmp_path: Path
) -> None:
    _run(store, tree, tmp_path, engine, "null", arms=[NOP], shard=_shard(store, tree, "null", 3))
    runs = _runs(store, "null")
    assert runs and {r.outcome for r in runs} == {"malformed"}
    assert all("missing" in r.errors[0] for r in runs)
    for r in runs:  # Harbor's verifier (tests/test.sh) says so too
        result = json.loads(_log(store, r, "result.json"))
        assert result["verifier_result"]["rewards"] == {"format_ok": 0}
        assert store.read_blob(r.answer) == b"{}"  # type: ignore[arg-type]
    # Harbor's own nop agent, by name: it writes nothing
    nop = yaml.safe_load((tree / "bench/agents/null.yaml").read_text())
    nop.update(agent="nop")
    nop["settings"] = {"scaffold": "nop", "served_model": "none"}
    (tree / "bench/agents/nop.yaml").write_text(yaml.safe_dump(nop))
    _run(store, tree, tmp_path, engine, "nop", arms=[NOP], shard=_shard(store, tree, "nop", 3))
    nothing = _runs(store, "nop")
    assert nothing and {r.outcome for r in nothing} == {"agent-failed"}
    assert all(r.answer is None and "no answer" in r.errors[-1] for r in nothing)
    assert all(
        json.loads(_log(store, r, "result.json"))["agent_info"]["name"] == "nop" for r in nothing
    )
    # Harbor's oracle, handed the answers from outside the task: right every time
    oracle = {**nop, "agent": "oracle"}
    oracle["settings"] = {"scaffold": "oracle", "served_model": "none"}
    (tree / "bench/agents/oracle.yaml").write_text(yaml.safe_dump(oracle))
    _run(
        store, tree, tmp_path, engine, "oracle", arms=[NOP], shard=_shard(store, tree, "oracle", 3)
    )
    right = _runs(store, "oracle")
    assert right and {r.outcome for r in right} == {"answered"}, [r.errors for r in right]
    for r in right:
        result = json.loads(_log(store, r, "result.json"))
        assert result["verifier_result"]["rewards"] == {"format_ok": 1}


def test_the_agent_container_has_only_loopback_and_reaches_only_perception(
    store: mc.Store, tree: Path, engine: Engine, tmp_path: Path
) -> None:
    both = (NOP, REQ)
    _run(store, tree, tmp_path, engine, "probe", shard=_shard(store, tree, "probe", 4, both))
    runs = _runs(store)
    arms = Counter(r.agent_block.arm for r in runs)
    assert set(arms) == {"no-perception", "encoders-required"}
    for r in runs:
        seen = _log(store, r, "agent.probe.txt").decode()
        status = _log(store, r, "agent.probe.err")
        why = f"{r.agent_block.arm}: {r.outcome} {r.errors}; exec: {status!r}"
        assert seen.count("--") == 3, f"the probe's output is {seen!r} ({why})"
        interfaces, routes, health, encoded = seen.split("--")
        assert interfaces.split() == ["lo"]  # no interface but loopback
        assert not routes.strip()  # and no route at all
        if r.agent_block.arm == "encoders-required":
            assert json.loads(health) == {"ok": True}  # while the perception service answers
            assert encoded.strip() == "encoded" and r.agent_block.encoder_calls == 1
            assert r.agent_block.meets_arm
        else:
            assert health.strip() == "unreachable" and encoded.strip() == "not-encoded"
        assert r.outcome == "agent-failed" and "no answer" in r.errors[-1]


# -- outcomes ------------------------------------------------------------------------------------
def test_timeouts_and_infrastructure_failures_are_told_apart(
    store: mc.Store, tree: Path, engine: Engine, tmp_path: Path
) -> None:
    token = f"medomni-sleeper-{os.getpid()}"
    sleeper = yaml.safe_load((tree / "bench/agents/baseline.yaml").read_text())
    sleeper["agent"] = "sleeper"
    sleeper["settings"].update(
        limits={"time_sec": 2}, command=["python", "-c", f"import time; time.sleep(60)  # {token}"]
    )
    (tree / "bench/agents/sleeper.yaml").write_text(yaml.safe_dump(sleeper))
    t0 = time.monotonic()
    _run(
        store,
        tree,
        tmp_path,
        engine,
        "sleeper",
        arms=[NOP],
        shard=_shard(store, tree, "sleeper", 5),
    )
    timed_out = _runs(store, "sleeper")
    assert timed_out and {r.outcome for r in timed_out} == {"timeout"}
    assert time.monotonic() - t0 < 45 and all("2.0 seconds" in r.errors[0] for r in timed_out)
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if token in _read(p)]

    # a relay that cannot start is the infrastructure's failure: kept, and run again
    gone = {"relay_image": "local/medomni-relay:gone"}
    broken = HarborRunner(docker_host=engine.host, environment_kwargs=gone)
    kw = {"arms": [REQ], "shard": _shard(store, tree, "baseline", 5, (REQ,))}
    first = _run(store, tree, tmp_path, engine, "baseline", runner=broken, **kw)
    assert first.jobs[0].infra_errors == first.ran > 0
    failed = _runs(store, "baseline")
    assert all(r.errors[0].startswith("ImageNotFound") for r in failed), failed[0].errors
    second = _run(store, tree, tmp_path, engine, "baseline", **kw)
    assert second.ran == first.ran and second.jobs[0].infra_errors == 0
    retried = [r for r in _runs(store, "baseline") if r.attempt == 2]
    assert len(retried) == first.ran and {r.outcome for r in retried} == {"answered"}
    assert all(store.get(r.previous, RunRecord).outcome == "infra-error" for r in retried)  # type: ignore[arg-type]


def test_failures_in_the_agent_phase_are_the_agents_or_the_engines(
    store: mc.Store, tree: Path, engine: Engine, tmp_path: Path
) -> None:
    for name, fail in (("buggy", "bug"), ("orphan", "engine")):
        doc = yaml.safe_load((tree / "bench/agents/probe.yaml").read_text())
        doc["agent"] = name
        doc["settings"].update(
            harbor_agent="tests.test_harbor:FailingAgent", harbor_kwargs={"fail": fail}
        )
        (tree / f"bench/agents/{name}.yaml").write_text(yaml.safe_dump(doc))
        _run(store, tree, tmp_path, engine, name, arms=[NOP], shard=_shard(store, tree, name, 5))
    buggy, orphan = _runs(store, "buggy"), _runs(store, "orphan")
    assert buggy and {r.outcome for r in buggy} == {"agent-failed"}
    assert all(r.errors[0] == "ValueError: a bug in the agent" for r in buggy)
    assert orphan and {r.outcome for r in orphan} == {"infra-error"}  # run again on resume
    assert all(r.errors[0].startswith("ContainerFailure") for r in orphan)


def _read(p: Path) -> str:
    try:
        return p.read_bytes().decode(errors="replace")
    except OSError:
        return ""


# -- checks ---------------------------------------------------------------------------------------
def test_checks_run_before_anything(
    store: mc.Store, tree: Path, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    terminus = yaml.safe_load((tree / "bench/agents/baseline.yaml").read_text())
    terminus.update(agent="terminus", model="openai/gpt-4o")
    terminus["settings"] = {"scaffold": "terminus-2", "served_model": "gpt-4o"}
    (tree / "bench/agents/terminus.yaml").write_text(yaml.safe_dump(terminus))
    with pytest.raises(CheckFailed, match=r"Harbor's preflight: .*OPENAI_API_KEY"):
        _run(store, tree, tmp_path, engine, "terminus", arms=["no-perception"])
    missing = HarborRunner(docker_host=engine.host, relay_image="local/none:1")
    with pytest.raises(CheckFailed, match="relay's image local/none:1 is not on the engine"):
        _run(store, tree, tmp_path, engine, "baseline", runner=missing)
    elsewhere = HarborRunner(environment="daytona")
    with pytest.raises(
        CheckFailed, match="only the docker environment, Harbor's compose-based ones"
    ):
        _run(store, tree, tmp_path, engine, "baseline", runner=elsewhere)
    no_engine = HarborRunner(docker_host="unix:///nonexistent/docker.sock")
    with pytest.raises(CheckFailed, match="no Docker engine answers"):
        _run(store, tree, tmp_path, engine, "baseline", runner=no_engine)
    assert not _runs(store)


# -- a killed harness ------------------------------------------------------------------------
def _cli(tmp: Path, tree: Path, url: str, engine: Engine) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DOCKER_HOST": engine.host, "MEDOMNI_HARBOR_CONCURRENCY": "2"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "medomni_cas.cli.main",
            "bench",
            "run",
            SET,
            "--agent",
            "baseline",
            "--runner",
            "harbor",
            "--arm",
            "no-perception",
            "--store",
            url,
            "--studio",
            str(tree / "studio"),
            "--bench",
            str(tree / "bench"),
            "--runs",
            str(tmp / "runs"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_a_killed_job_resumes_without_loss_or_duplicates(
    tree: Path, engine: Engine, tmp_path: Path
) -> None:
    url = f"lmdb://{tmp_path / 'store'}"
    with mc.open(url) as s:
        build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    p = _cli(tmp_path, tree, url, engine)
    deadline = time.monotonic() + 240
    done = 0
    while time.monotonic() < deadline and p.poll() is None:
        with mc.open(url) as s:
            done = len(slot_runs(s))
        if done >= 3:
            break
        time.sleep(0.1)
    assert p.poll() is None, p.communicate()[1].decode()[-3000:]
    p.send_signal(signal.SIGKILL)
    p.wait()
    with mc.open(url) as s:
        done = len(slot_runs(s))
    assert 3 <= done < SLOTS_PER_ARM, done
    # the killed run's containers are still there; the next run removes them
    again = _cli(tmp_path, tree, url, engine)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err.decode()[-3000:]
    with mc.open(url) as s:
        runs = _runs(s)
        assert len(runs) == SLOTS_PER_ARM and len({r.slot for r in runs}) == SLOTS_PER_ARM
        assert {r.outcome for r in runs} == {"answered"}, [(r.outcome, r.errors) for r in runs]
        assert not s.refs.as_dict("runs/claims/")
    # and Harbor ran each slot to a result exactly once, across its jobs
    (folder,) = (tmp_path / "runs").iterdir()
    names = Counter(t["task_name"].rsplit("-", 1)[0] for t in _trial_results(folder))
    assert len(names) == SLOTS_PER_ARM and set(names.values()) == {1}, names


def test_an_environment_that_cannot_start_records_its_cause(
    store: mc.Store, tree: Path, engine: Engine, tmp_path: Path
) -> None:
    """A bad option fails each trial before Harbor has a result for it, and Harbor's job as a
    whole (an exception group): each run still says what failed, in its record and in the run
    folder, never just "ExceptionGroup ... (n sub-exceptions)"."""
    bad = HarborRunner(
        docker_host=engine.host, environment_kwargs={"cpu_enforcement_policy": "strictest"}
    )
    kw = {"arms": [NOP], "shard": _shard(store, tree, "baseline", 5)}
    report = _run(store, tree, tmp_path, engine, "baseline", runner=bad, **kw)
    runs = _runs(store, "baseline")
    assert runs and {r.outcome for r in runs} == {"infra-error"}
    assert report.jobs[0].infra_errors == len(runs)
    for r in runs:
        assert not any("ExceptionGroup" in e for e in r.errors), r.errors
        assert "ValueError: 'strictest' is not a valid ResourceMode" in r.errors[0], r.errors
        # the baseline is an agent command: it runs on the host against the container
        assert r.environment == "docker" and r.isolation == "none"
        text = _log(store, r, "harbor.exception.txt").decode()
        assert "Traceback" in text and "strictest" in text
    folder = report.jobs[0].folder
    lines = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines()]
    assert all("strictest" in x["record"]["errors"][0] for x in lines)
    for r in runs:
        assert "strictest" in (folder / "trials" / r.run_id / "harbor.exception.txt").read_text()


def _recorded(run: Any) -> Any:
    """What Harbor records of a trial whose environment raised what ``run()`` raises."""
    from harbor.models.trial.result import ExceptionInfo

    class Result:  # the fields `_outcome` reads of a `TrialResult`
        agent_execution = None
        verifier = None
        exception_info: ExceptionInfo | None = None

    result = Result()
    try:
        run()
    except BaseException as e:  # as Harbor's trial does: `from_exception` reads format_exc()
        assert isinstance(e, Exception)
        result.exception_info = ExceptionInfo.from_exception(e)
    return result


def test_trial_exceptions_are_read_to_their_last_lines() -> None:
    """A trial's recorded exception group gives its sub-exceptions, not their count; an empty
    message gives the traceback's last line."""
    import asyncio

    from medomni_harbor.runner import _outcome

    async def build() -> None:
        raise OSError("the image cannot be built: no such base image")

    async def start() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(build())

    def empty() -> None:
        raise RuntimeError("")

    outcome, errors = _outcome(_recorded(lambda: asyncio.run(start())), False)
    assert outcome == "infra-error"
    assert errors[0] == "OSError: the image cannot be built: no such base image", errors
    assert _outcome(_recorded(empty), False)[1][0] == "RuntimeError"
