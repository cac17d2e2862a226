"""The Docker engine the project starts itself, and what the Harbor runner relies on from it.

Containers here never get a network of their own: ``network_mode="none"`` or a sidecar's
namespace (``container:<id>``), so no packet leaves a container's loopback.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker_engine import BASE_IMAGE, TERMINUS_IMAGE, Engine

LABEL = {"medomni-cas.test": "docker-engine"}


@pytest.fixture
def containers(docker_engine: Engine) -> Iterator[list[Any]]:
    """Containers a test made; force-removed afterwards (the engine may be shared)."""
    made: list[Any] = []
    yield made
    for c in reversed(made):
        with contextlib.suppress(Exception):
            c.remove(force=True)


def run(
    engine: Engine, made: list[Any], command: list[str], image: str = BASE_IMAGE, **kwargs: Any
) -> tuple[int, str]:
    """Run ``command`` in a fresh container of ``image``; its exit code and output."""
    kwargs.setdefault("network_mode", "none")
    c = engine.client.containers.run(image, command, detach=True, labels=LABEL, **kwargs)
    made.append(c)
    status = c.wait(timeout=60)
    return status["StatusCode"], c.logs().decode()


def test_base_image_runs_bash(docker_engine: Engine, containers: list[Any]) -> None:
    image = docker_engine.client.images.get(BASE_IMAGE)
    assert BASE_IMAGE in image.tags
    code, out = run(docker_engine, containers, ["bash", "-c", 'echo ok "${BASH_VERSINFO[0]}"'])
    assert (code, out.split()[0]) == (0, "ok")
    assert int(out.split()[1]) >= 5


def test_terminus_image_runs_a_tmux_session(docker_engine: Engine, containers: list[Any]) -> None:
    # What Harbor's terminus-2 does in it: a detached session running bash, keys typed into
    # it, `tmux wait` for the command's end, the pane read back. The pane may show the typed
    # line twice (the tty echoes keys sent before bash's readline starts, then readline
    # redraws them; seen once on CI), so the check is that it shows, not how often.
    session = (
        "tmux new-session -x 160 -y 40 -d -s s 'bash --login' && "
        "tmux send-keys -t s -- 'echo $((6 * 7)) > /tmp/out; tmux wait -S done' Enter && "
        "timeout 10s tmux wait done && cat /tmp/out && "
        "tmux capture-pane -p -t s | grep -q 'wait -S done' && echo pane"
    )
    code, out = run(docker_engine, containers, ["bash", "-c", session], image=TERMINUS_IMAGE)
    assert (code, out.split()) == (0, ["42", "pane"]), out


def test_sleep_infinity_then_exec_bash(docker_engine: Engine, containers: list[Any]) -> None:
    # Harbor's pattern: a long-lived container, commands through `bash -c`.
    c = docker_engine.client.containers.run(
        BASE_IMAGE, ["sleep", "infinity"], detach=True, network_mode="none", labels=LABEL
    )
    containers.append(c)
    code, out = c.exec_run(["bash", "-c", "echo $((6 * 7)); env | grep -c '^PATH='"])
    assert code == 0
    assert out.decode().split() == ["42", "1"]


def test_cpu_and_memory_limits(docker_engine: Engine, containers: list[Any]) -> None:
    # What the container's own cgroup says, v1 or v2 layout; "-" where it cannot be read.
    script = (
        "cg=/sys/fs/cgroup;"
        " echo mem=$(cat $cg/memory/memory.limit_in_bytes 2>/dev/null"
        " || cat $cg/memory.max 2>/dev/null || echo -);"
        " if [ -r $cg/cpu/cpu.cfs_quota_us ]; then"
        " echo cpu=$(cat $cg/cpu/cpu.cfs_quota_us) $(cat $cg/cpu/cpu.cfs_period_us);"
        " else echo cpu=$(cat $cg/cpu.max 2>/dev/null || echo -); fi"
    )
    code, out = run(
        docker_engine,
        containers,
        ["sh", "-c", script],
        nano_cpus=500_000_000,
        mem_limit="64m",
    )
    assert code == 0, out
    host_config = containers[-1].attrs["HostConfig"]
    assert host_config["NanoCpus"] == 500_000_000
    assert host_config["Memory"] == 64 * 1024 * 1024
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if seen.get("mem", "-") != "-":
        assert int(seen["mem"]) == 64 * 1024 * 1024
    if seen.get("cpu", "-") != "-":
        quota, period = (int(v) for v in seen["cpu"].split())
        assert quota / period == pytest.approx(0.5)


def _net_report() -> str:
    # Interfaces, then the routing table's entries (its first line is a header).
    return "ls /sys/class/net; echo --; tail -n +2 /proc/net/route"


def _parse_net(out: str) -> tuple[list[str], list[str]]:
    interfaces, _, routes = out.partition("--\n")
    return interfaces.split(), [r for r in routes.splitlines() if r.strip()]


def test_network_none_has_only_loopback_and_no_route(
    docker_engine: Engine, containers: list[Any]
) -> None:
    code, out = run(docker_engine, containers, ["sh", "-c", _net_report()])
    assert code == 0
    assert _parse_net(out) == (["lo"], [])


def test_sidecar_serves_perception_to_agent_sharing_its_namespace(
    docker_engine: Engine, containers: list[Any]
) -> None:
    # Issue 5 §3: the sidecar has no network but loopback and names it `perception`; the agent
    # joins the sidecar's namespace, so it reaches the sidecar's port and nothing else.
    token = uuid.uuid4().hex
    sidecar = docker_engine.client.containers.run(
        BASE_IMAGE,
        [
            "sh",
            "-c",
            f"mkdir -p /www && echo {token} > /www/index.html"
            " && exec httpd -f -p 127.0.0.1:8899 -h /www",
        ],
        detach=True,
        network_mode="none",
        extra_hosts={"perception": "127.0.0.1"},
        labels=LABEL,
    )
    containers.append(sidecar)
    # Until the sidecar listens. (`timeout`, not wget's -T: busybox-static 1.35's wget -T
    # segfaults.)
    fetch = (
        "for i in $(seq 1 100); do"
        " if out=$(timeout 5 wget -q -O - http://perception:8899/); then"
        ' echo "$out"; break; fi; sleep 0.05; done; '
    )
    code, out = run(
        docker_engine,
        containers,
        ["bash", "-c", fetch + _net_report()],
        network_mode=f"container:{sidecar.id}",
    )
    assert code == 0, out
    fetched, _, net = out.partition("\n")
    assert fetched == token, out
    assert _parse_net(net) == (["lo"], [])


def test_build_from_base_image(
    docker_engine: Engine, containers: list[Any], tmp_path: Path
) -> None:
    tag = f"local/medomni-test-build:{uuid.uuid4().hex[:12]}"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "RUN echo built-by-legacy-builder > /built.txt\n"
        'CMD ["cat", "/built.txt"]\n'
    )
    client = docker_engine.client
    image, _logs = client.images.build(
        path=str(tmp_path), tag=tag, rm=True, forcerm=True, network_mode="none"
    )
    try:
        assert tag in image.tags
        c = client.containers.run(tag, detach=True, network_mode="none", labels=LABEL)
        containers.append(c)
        assert c.wait(timeout=60)["StatusCode"] == 0
        assert c.logs().decode().strip() == "built-by-legacy-builder"
    finally:
        # Containers before the image they use (the engine may be shared, so leave nothing).
        for made in containers:
            with contextlib.suppress(Exception):
                made.remove(force=True)
        containers.clear()
        client.images.remove(tag, force=True)
