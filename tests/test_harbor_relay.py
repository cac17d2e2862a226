"""Encoder-arm trials with the perception relay, on our docker environment and on Harbor's own
compose path (its ``docker`` environment through the ``docker compose`` v2 plugin that
``.ci/docker-engine install`` installs): real Harbor trials in the tests' engine.

A probe agent looks at the agent's container from inside, in both: only ``lo``, no route,
``http://perception:8899`` answers and encodes (one call, logged for its own trial), a path
naming another token stays inside the trial's own gateway, and the relay's socket folder is
not there. No packet leaves this machine: the trials' containers have only ``lo``; the
forwarder (host network) connects only to the job's gateway on 127.0.0.1.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.records import RunRecord
from medomni_cas.bench.runners import RunnerError
from medomni_cas.studio.tasksets import build_set
from tests import docker_engine as de
from tests.docker_engine import Engine
from tests.test_harbor import REQ, SET, ProbeAgent, _log, _runs, _shard, engine, tree

pytest.importorskip("harbor")
pytest.importorskip("medomni_harbor")

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from medomni_harbor import images
from medomni_harbor.runner import HarborRunner

__all__ = ["RelayProbe", "engine", "tree"]  # the fixtures are test_harbor's

PROBE = (
    "ls /sys/class/net; echo --; tail -n +2 /proc/net/route; echo --; "
    "timeout 5 wget -q -O - http://perception:8899/health || echo unreachable; echo; echo --; "
    "timeout 10 wget -q -O - --header 'Content-Type: application/json' "
    '--post-data \'{"encoder": "table-summary", "family": "labs"}\' '
    "http://perception:8899/v1/encode >/dev/null && echo encoded || echo not-encoded; echo --; "
    f"timeout 5 wget -q -O - http://perception:8899/t/{'0' * 32}/v1/encoders "
    ">/dev/null 2>&1 && echo other-token || echo own-gateway-only; echo --; "
    "ls /relay >/dev/null 2>&1 && echo socket-visible || echo no-socket"
)


class RelayProbe(ProbeAgent):
    """test_harbor's probe, with the relay's own checks."""

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        result = await environment.exec(PROBE, timeout_sec=60)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / "probe.txt").write_text(result.stdout or "")


def _compose_works(host: str) -> str | None:
    """Why `docker compose` v2 cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker client"
    done = subprocess.run(
        ["docker", "compose", "version"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "DOCKER_HOST": host},
    )
    if done.returncode != 0:
        return "no docker compose v2 plugin (`bash .ci/docker-engine install` installs it)"
    return None


@pytest.fixture(scope="module")
def built(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL of a store with the set built, shared by this module's tests."""
    url = f"lmdb://{tmp_path_factory.mktemp('relay-store') / 'store'}"
    with mc.open(url) as store:
        build_set(store, SET, studio=tree / "studio", bench=tree / "bench")
    return url


# relay containers our environment created for the probe job (the `probed` fixture)
_RELAYS_CREATED: dict[str, int] = {}


@pytest.fixture(scope="module")
def probed(
    tree: Path, engine: Engine, built: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[tuple[RunRecord, str]]]:
    """The encoder arm's probe trials (one shard) on each environment: ``docker`` (ours) and
    ``harbor-docker`` (Harbor's compose path); their run records."""
    why = _compose_works(engine.host)
    if why is not None:
        if de.required():
            pytest.fail(why)
        pytest.skip(why)
    images.ensure_relay_image(engine.host)
    root = tmp_path_factory.mktemp("relay")
    doc = yaml.safe_load((tree / "bench/agents/probe.yaml").read_text())
    doc["settings"]["harbor_agent"] = "tests.test_harbor_relay:RelayProbe"
    out: dict[str, list[tuple[RunRecord, str]]] = {}
    with pytest.MonkeyPatch.context() as mp, mc.open(built) as store:
        mp.setenv("DOCKER_HOST", engine.host)  # Harbor's docker environment runs the CLI
        for env in ("docker", "harbor-docker"):
            since = time.time()
            name = f"relay-probe-{env}"
            (tree / f"bench/agents/{name}.yaml").write_text(yaml.safe_dump({**doc, "agent": name}))
            runner = HarborRunner(environment=env, docker_host=engine.host, concurrency=2)
            run_set(
                store,
                SET,
                find_agent(tree / "bench", name),
                runs_dir=root / env,
                studio=tree / "studio",
                runner=runner,
                arms=[REQ],
                shard=_shard(store, tree, name, 5, (REQ,)),
            )
            out[env] = [(r, _log(store, r, "agent.probe.txt").decode()) for r in _runs(store, name)]
            if env == "docker":  # the relays the job started (it keeps them for its trials)
                events = engine.client.events(
                    since=int(since),
                    until=int(time.time()) + 1,
                    decode=True,
                    filters={"type": "container", "event": "create"},
                )
                _RELAYS_CREATED[env] = sum(  # the forwarder is of the same image
                    1
                    for e in events
                    if "-relay-" in e.get("Actor", {}).get("Attributes", {}).get("name", "")
                )
    ours = ("medomni-harbor.trial-dir", "medomni-harbor.tasks")
    compose_dir = "com.docker.compose.project.working_dir"
    left = [  # of this module's runs (an engine may be shared with other runs)
        c.name
        for c in engine.client.containers.list(all=True)
        if any(c.labels.get(k, "").startswith(str(root)) for k in (*ours, compose_dir))
    ]
    assert not left, f"containers left behind: {left}"
    volumes = engine.client.volumes.list(filters={"label": "medomni-harbor.tasks"})
    assert not [
        v for v in volumes if v.attrs["Labels"]["medomni-harbor.tasks"].startswith(str(root))
    ]
    return out


def test_our_environment_keeps_a_relay_for_the_jobs_next_trials(
    probed: dict[str, list[tuple[RunRecord, str]]],
) -> None:
    """Trials 2 at a time: 2 relays serve them all (each trial's own calls and closed
    network are checked by the test below, on the same trials)."""
    assert len(probed["docker"]) > 2
    assert 1 <= _RELAYS_CREATED["docker"] <= 2, _RELAYS_CREATED


@pytest.mark.parametrize("env", ["docker", "harbor-docker"])
def test_encoder_arm_trials_run_with_the_relay_on_a_closed_network(
    probed: dict[str, list[tuple[RunRecord, str]]], env: str
) -> None:
    runs = [r for r, _ in probed[env]]
    assert runs
    for r, text in probed[env]:
        interfaces, routes, health, encoded, other, socket = text.split("--")
        assert interfaces.split() == ["lo"], text  # no interface but loopback
        assert not routes.strip(), text  # and no route at all
        assert health.strip() == '{"ok":true}', text  # while the perception service answers
        assert encoded.strip() == "encoded", text
        assert other.strip() == "own-gateway-only", text
        assert socket.strip() == "no-socket", text
        assert r.agent_block.encoder_calls == 1 and r.agent_block.meets_arm
        assert {e.name for e in r.agent_block.encoders_served} >= {"table-summary"}
        assert r.outcome == "agent-failed" and "no answer" in r.errors[-1]
    expected = "container" if env == "docker" else "harbor-container"
    assert {(r.environment, r.isolation) for r in runs} == {(env, expected)}


def test_tasks_for_compose_and_allowlist_environments(built: str, tmp_path: Path) -> None:
    """What the compose path and an egress-allowlist environment are given: for compose,
    the staged files under environment/workspace (the only thing main's image copies) and a
    compose file closing the network; for an allowlist, the gateway's host alone, and the
    URL with the trial's token written when the job starts."""
    import tomllib

    from harbor.models.task.config import TaskConfig
    from medomni_harbor import compose
    from medomni_harbor.render import render_task, set_perception_url

    from medomni_cas.bench.agents import load_agent
    from medomni_cas.bench.runners import Job, TrialSpec
    from medomni_cas.studio.records import AtomTask, BuildResult, FormatCheck
    from medomni_cas.studio.tasksets import show_set
    from tests.test_harbor import ROOT

    with mc.open(built) as store:
        entry = next(e for e in show_set(store, SET).entries if e.arm == REQ)
        aid = store.get(entry.result, BuildResult).atoms[0]
        atom = store.get(aid, AtomTask)
        check = store.get(atom.format_check, FormatCheck)
        agent = load_agent(ROOT / "examples/bench/agents/baseline.yaml")
        job = Job("j", tmp_path, store, agent, store.put(agent), atom.arm, "", "required", 1, 4)
        spec = TrialSpec(mc.ObjectId(bytes(32)), 1, aid, atom, check)
        folder = render_task(job, spec, tmp_path / "c", image=images.AGENT_IMAGE, compose=True)
        env = folder / "environment"
        assert sorted(p.name for p in env.iterdir()) == [
            "Dockerfile",
            "docker-compose.yaml",
            "workspace",
        ]
        assert (env / "workspace/labs.jsonl").is_file()
        assert "COPY workspace/ /workspace/" in (env / "Dockerfile").read_text()
        doc = tomllib.loads((folder / "task.toml").read_text())
        assert doc["environment"]["network_mode"] == "public"  # the compose file closes it
        assert "docker_image" not in doc["environment"]  # main is built from the Dockerfile
        assert doc["metadata"]["medomni"]["perception"]["evidence"] == "environment/workspace"
        assert yaml.safe_load((env / "docker-compose.yaml").read_text()) == compose.closed_main()
        compose.write_perception(folder, "local/medomni-relay:x", "tok", ("127.0.0.1", 5))
        services = yaml.safe_load((env / "docker-compose.yaml").read_text())["services"]
        assert services["main"]["network_mode"] == "service:perception"
        assert services["perception"]["network_mode"] == "none"
        assert services["perception"]["command"][-1] == "tok"
        assert "tok" not in (env / "Dockerfile").read_text()

        hosts = ["gw.example.org"]
        folder = render_task(job, spec, tmp_path / "a", image=images.AGENT_IMAGE, allowlist=hosts)
        set_perception_url(folder, "http://gw.example.org:8899/t/tok")
        text = (folder / "task.toml").read_text()
        TaskConfig.model_validate_toml(text)  # what Harbor reads
        env_doc = tomllib.loads(text)["environment"]
        assert env_doc["network_mode"] == "allowlist" and env_doc["allowed_hosts"] == hosts
        assert env_doc["env"]["MEDOMNI_PERCEPTION_URL"] == "http://gw.example.org:8899/t/tok"

        remote = HarborRunner(environment="daytona", gateway_url="http://gw.example.org:8899")
        assert remote.direct and not remote.compose
        # the gateway listens on the URL's port unless told another (a port forwarded)
        assert remote.gateway_port == 8899
        forwarded = HarborRunner(
            environment="daytona", gateway_url="http://gw.example.org:8899", gateway_port=9000
        )
        assert forwarded.gateway_port == 9000
        with pytest.raises(RunnerError, match="runner option gateway_url 'http://gw:port'"):
            HarborRunner(environment="daytona", gateway_url="http://gw:port")
        assert not [p for p in remote.check(job) if "perception service" in p]
        assert [p for p in HarborRunner(environment="daytona").check(job) if "egress" in p]
