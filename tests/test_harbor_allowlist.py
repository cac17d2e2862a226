"""Encoder-arm trials through an egress allowlist (the runner's ``gateway_url`` path), for real.

No cloud sandbox is reachable from here, and Harbor's own docker environment enforces an
allowlist with a sidecar image from Docker Hub, so the provider is a stand-in:
`tests._allowlist_env.AllowlistDockerEnvironment`, which declares the capability Harbor asks
for and enforces the allowlist itself on the tests' engine (the agent's container gets one
veth and a /32 route to each allowed host, nothing else). Everything else is real: the
``HarborRunner`` renders each task as ``network_mode = "allowlist"`` with the gateway's host,
one Harbor job runs the trials, the job's gateway listens on an address of a veth the test
made, and the agent reaches it at ``MEDOMNI_PERCEPTION_URL`` = ``<gateway_url>/t/<token>``.

The agent (`AllowlistProbe`) first looks at its container from inside (its links, routes,
capabilities; an encode call with its own URL; calls with no token, with a finished trial's
token, to an address that is not allowed), then runs the baseline agent command, whose
encoder calls cross the same allowlist (`medomni_harbor.agents.CommandAgent`'s relay execs
``nc`` to the gateway inside the container). Network rules: every packet goes to loopback or
to an address of a veth this module made (a private /24 no host address or route overlaps),
and the container's own attempts elsewhere fail in its routing table, before any packet.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import random
import re
import secrets
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.records import RunRecord
from tests import docker_engine as de
from tests.docker_engine import Engine
from tests.test_harbor import REQ, SET, _log, _runs, _shard, engine, tree
from tests.test_harbor_relay import built

pytest.importorskip("harbor")
pytest.importorskip("medomni_harbor")

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from medomni_harbor import gateway
from medomni_harbor.agents import CommandAgent, task_env
from medomni_harbor.runner import HarborRunner

from tests import _allowlist_env as standin

__all__ = ["AllowlistProbe", "built", "engine", "tree"]  # the fixtures are test_harbor's

ENV = "tests._allowlist_env:AllowlistDockerEnvironment"
BASELINE = ["python", "-m", "medomni_cas.bench.baseline"]
_CAP_NET_ADMIN, _CAP_NET_RAW = 12, 13
_FINISHED_WAIT_SEC = 60.0


@dataclass(frozen=True)
class Net:
    """The addresses, ports and link names of the network the test makes.

    The gateway's host and a host that is not allowed are on a veth pair the test made, in
    the first /30 of a private /24; the trials' /30s come from ``trials``, a /26 of it.
    """

    trials: str
    gateway: str
    port: int
    forbidden: str
    forbidden_port: int
    prefix: str

    @property
    def url(self) -> str:
        return f"http://{self.gateway}:{self.port}"


# -- the probe: the agent's container seen from inside, then the baseline ---------------------
def _probe_script(net: Net, finished: str, host_end: str) -> str:
    """The container's view, sections split by ``--`` lines."""
    own = '"$MEDOMNI_PERCEPTION_URL"'
    status = "wget -S -q -O /dev/null {} 2>&1 | grep -o 'HTTP/1.[01] [0-9]*' | head -n 1"
    finished_check = status.format(f"'{finished}/v1/encoders'") if finished else "echo none"
    return "; echo --; ".join(
        [
            "ls /sys/class/net",
            "tail -n +2 /proc/net/route",
            "cat /proc/net/if_inet6 2>/dev/null",
            f"echo {own}",
            "timeout 10 wget -q -O /dev/null --header 'Content-Type: application/json' "
            '--post-data \'{"encoder": "table-summary", "family": "labs"}\' '
            f"{own}/v1/encode && echo encoded || echo not-encoded",
            f"timeout 10 {status.format(own + '/v1/encoders')}",  # its own token: 200
            f"timeout 10 {status.format(f'{net.url}/v1/encoders')}",  # no token: 401
            f"timeout 10 {finished_check}",  # a finished trial's token: 403
            f"timeout 5 wget -q -O - http://{net.forbidden}:{net.forbidden_port}/ 2>&1",
            f"timeout 5 wget -q -O - http://{host_end}:{net.port}/health 2>&1",
            f"ip route add {net.forbidden}/32 dev eth0 2>&1; echo status $?",
            "grep CapEff /proc/self/status",
        ]
    )


#: the module's network, for its probe agents (not in the agent config: a config's id picks
#: the shard's slots, and the network's addresses are new at each run)
_NET: list[Net] = []
#: (task name, MEDOMNI_PERCEPTION_URL) of this module's probe trials, in the order they ran
_SEEN: list[tuple[str, str]] = []
_SEEN_LOCK = threading.Lock()


def _finished_url(task_dir: Path) -> str:
    """The URL of an earlier trial of the job whose token has ended, or "" if none ran.

    Waits, bounded, for one of them to end: the runner ends a trial's token when Harbor
    reports the trial ended.
    """
    job = gateway.lookup(task_dir)
    with _SEEN_LOCK:
        earlier = list(_SEEN)
    if job is None or not earlier:
        return ""
    deadline = time.monotonic() + _FINISHED_WAIT_SEC
    while time.monotonic() < deadline:
        for name, url in earlier:
            if name not in job._open:  # the job gateway's open trials, by task name
                return url
        time.sleep(0.05)
    return ""


class AllowlistProbe(CommandAgent):
    """Probes its container, then runs its command (the baseline) as `CommandAgent`.

    The probe's output (`_probe_script`) is kept as ``agent/probe.txt``, what it was given
    as ``agent/probe.json``.
    """

    @staticmethod
    def name() -> str:
        return "medomni-test-allowlist-probe"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        own = task_env(environment)["MEDOMNI_PERCEPTION_URL"]
        finished = await asyncio.to_thread(_finished_url, environment.environment_dir.parent)
        with _SEEN_LOCK:
            _SEEN.append((environment.environment_name, own))
        addresses = getattr(environment, "addresses", None)
        assert addresses is not None, "the stand-in environment gave the container no veth"
        script = _probe_script(_NET[0], finished, addresses[0])
        result = await environment.exec(script, timeout_sec=120)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / "probe.txt").write_text(result.stdout or "")
        seen = {
            "url": own,
            "finished": finished,
            "host_end": addresses[0],
            "stderr": result.stderr or "",
        }
        (self.logs_dir / "probe.json").write_text(json.dumps(seen))
        await super().run(instruction, environment, context)


# -- the network the test makes ----------------------------------------------------------------
def _taken() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address or a route in (but the default route)."""
    text = standin.ip("-4", "-o", "addr", "show") + standin.ip(
        "-4", "route", "show", "table", "all"
    )
    out = []
    for m in re.finditer(r"\b(\d+\.\d+\.\d+\.\d+)(/\d+)?", text):
        net = ipaddress.IPv4Network(m.group(1) + (m.group(2) or "/32"), strict=False)
        if net.prefixlen:
            out.append(net)
    return out


def _free_subnet() -> ipaddress.IPv4Network:
    """A private /24 of 10.0.0.0/8 that overlaps nothing the host has (bounded tries)."""
    taken = _taken()
    rng = random.Random()
    for _ in range(64):
        net = ipaddress.IPv4Network(f"10.{rng.randint(200, 254)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free private /24 in 10.200.0.0-10.254.255.255 on this host")


class _Forbidden(BaseHTTPRequestHandler):
    """The server at the address that is not allowed: the host reaches it, no trial may."""

    def do_GET(self) -> None:
        body = b"forbidden host reached\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def allowlist_net(engine: Engine) -> Iterator[Net]:
    """A veth pair on the host with the gateway's address and a forbidden one.

    A server answers at the forbidden address; both are in a private /24 of their own. Every
    link named with this module's prefix is gone when the module ends, whatever happened.
    """
    why = standin.why_not_here()
    if why is None and not engine.host.startswith("unix://"):
        why = (
            f"the stand-in enters containers' namespaces: the engine must be local ({engine.host})"
        )
    if why is not None:
        if de.required():
            pytest.fail(why)
        pytest.skip(why)
    prefix = f"mdh{secrets.token_hex(3)}"
    subnet = _free_subnet()
    gw, forbidden = str(subnet[1]), str(subnet[2])
    anchor, peer = f"{prefix}ga", f"{prefix}gb"
    server: ThreadingHTTPServer | None = None
    try:
        standin.ip("link", "add", anchor, "type", "veth", "peer", "name", peer)
        for name in (anchor, peer):
            standin.sysctl(f"net.ipv6.conf.{name}.disable_ipv6", "1")
            standin.sysctl(f"net.ipv4.conf.{name}.forwarding", "0")
        standin.ip("addr", "add", f"{gw}/32", "dev", anchor)
        standin.ip("addr", "add", f"{forbidden}/32", "dev", anchor)
        standin.ip("link", "set", peer, "up")
        standin.ip("link", "set", anchor, "up")  # local addresses answer once both ends are up
        server = ThreadingHTTPServer((forbidden, 0), _Forbidden)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        yield Net(
            trials=str(list(subnet.subnets(new_prefix=26))[1]),
            gateway=gw,
            port=_free_port(gw),
            forbidden=forbidden,
            forbidden_port=int(server.server_address[1]),
            prefix=prefix,
        )
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        for name in standin.links(prefix):
            with contextlib.suppress(RuntimeError):  # one end's deletion took its peer
                standin.ip("link", "del", name)
        assert not standin.links(prefix), "links left on the host"


@dataclass
class Probed:
    """The job's run records, each with its probe's output and what its agent was given."""

    runs: list[tuple[RunRecord, str, dict[str, Any]]]
    calls: dict[str, list[dict[str, Any]]]  # run id -> its call log
    left: list[str]  # trial links on the host once the job ended
    elapsed: float


@pytest.fixture(scope="module")
def probed(
    allowlist_net: Net,  # first: it skips at once where the stand-in cannot run
    tree: Path,
    engine: Engine,
    built: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Probed:
    """The encoder arm's trials (one shard) on the stand-in, through ``gateway_url``."""
    net = allowlist_net
    name = "allowlist-probe"
    agent = {
        "kind": "agent",
        "agent": name,
        "model": "none",
        "route": "local",
        "settings": {
            "scaffold": "allowlist-probe",
            "served_model": "none",
            "limits": {"time_sec": 120},
            "harbor_agent": "tests.test_harbor_allowlist:AllowlistProbe",
            "harbor_kwargs": {"command": BASELINE},
        },
    }
    (tree / f"bench/agents/{name}.yaml").write_text(yaml.safe_dump(agent))
    root = tmp_path_factory.mktemp("allowlist")
    runner = HarborRunner(
        environment=ENV,
        environment_kwargs={
            "docker_host": engine.host,
            "subnet": net.trials,
            "link_prefix": net.prefix,
        },
        concurrency=2,
        gateway_url=net.url,
        gateway_host=net.gateway,
        gateway_port=net.port,
    )
    _SEEN.clear()
    _NET[:] = [net]
    t0 = time.monotonic()
    with mc.open(built) as store:
        run_set(
            store,
            SET,
            find_agent(tree / "bench", name),
            runs_dir=root,
            studio=tree / "studio",
            runner=runner,
            arms=[REQ],
            shard=_shard(store, tree, name, 2, (REQ,)),
        )
        elapsed = time.monotonic() - t0
        runs, calls = [], {}
        for r in _runs(store, name):
            seen = json.loads(_log(store, r, "agent.probe.json"))
            runs.append((r, _log(store, r, "agent.probe.txt").decode(), seen))
            log = r.agent_block.encoder_log
            text = store.read_blob(log).decode() if log is not None else ""
            calls[r.run_id] = [json.loads(line) for line in text.splitlines()]
    left = [
        c.name
        for c in engine.client.containers.list(all=True)
        if c.labels.get("medomni-harbor.trial-dir", "").startswith(str(root))
    ]
    assert not left, f"containers left behind: {left}"
    return Probed(runs, calls, standin.links(f"{net.prefix}t"), elapsed)


# -- the tests -----------------------------------------------------------------------------------
def test_encoder_arm_trials_answer_through_the_allowlist(
    probed: Probed, allowlist_net: Net
) -> None:
    """Every trial is recorded and answered; its encoder calls are its own alone.

    They went to the gateway under its own token and are counted for it alone (the refused
    calls of its probe for none).
    """
    net = allowlist_net
    assert len(probed.runs) >= 3, [r.run_id for r, _, _ in probed.runs]
    urls = set()
    for r, text, seen in probed.runs:
        why = f"{r.run_id}: {r.outcome} {r.errors}; probe: {text!r} {seen['stderr']!r}"
        assert r.outcome == "answered", why
        assert (r.environment, r.isolation) == (ENV, "unknown")
        assert re.fullmatch(rf"{re.escape(net.url)}/t/[0-9a-f]{{32}}", seen["url"]), why
        urls.add(seen["url"])
        calls = probed.calls[r.run_id]
        # the probe's own encode call and the baseline's (through CommandAgent's relay)
        assert sorted(c["encoder"] for c in calls) == ["ecg-summary", "table-summary"], (
            why,
            r.agent_block,
        )
        assert {c["atom"] for c in calls} == {r.atom.hex()}, calls
        assert r.agent_block.encoder_calls == len(calls) and r.agent_block.meets_arm
        assert {e.name for e in r.agent_block.encoders_served} >= {"table-summary"}
    assert len(urls) == len(probed.runs)  # a token of its own per trial


def test_the_agent_container_reaches_the_gateway_and_nothing_else(
    probed: Probed, allowlist_net: Net
) -> None:
    """The agent's container has the veth and one route, to the gateway's host alone.

    Inside it: ``lo`` and the veth, one route (the gateway's /32), no IPv6 address but
    loopback's, neither CAP_NET_ADMIN nor CAP_NET_RAW; the gateway answers its own token
    (200), refuses no token (401) and a finished trial's token (403); the host that is not
    allowed, and the host's end of its own veth, are unreachable (no route), while the
    forbidden host's server answers the host.
    """
    net = allowlist_net
    gateway_hex = ipaddress.IPv4Address(net.gateway).packed[::-1].hex().upper()
    finished_checked = 0
    for r, text, seen in probed.runs:
        why = f"{r.run_id}: {text!r} {seen['stderr']!r}"
        parts = text.split("--")
        assert len(parts) == 12, why
        links, routes, inet6, url, encoded, own, none, finished = parts[:8]
        forbidden, host_end, route_add, caps = parts[8:]
        assert links.split() == ["eth0", "lo"], why
        fields = [line.split() for line in routes.strip().splitlines()]
        assert len(fields) == 1, why  # one route: the gateway's host, nothing by default
        iface, dest, via, _flags, _ref, _use, _metric, mask = fields[0][:8]
        assert (iface, dest, via, mask) == ("eth0", gateway_hex, "00000000", "FFFFFFFF"), why
        assert all(line.split()[-1] == "lo" for line in inet6.strip().splitlines()), why
        assert url.strip() == seen["url"], why  # the agent's URL, with its token
        assert encoded.strip() == "encoded", why
        assert own.strip().endswith(" 200") and none.strip().endswith(" 401"), why
        if seen["finished"]:
            assert seen["finished"] != seen["url"]
            assert finished.strip().endswith(" 403"), why
            finished_checked += 1
        assert "Network is unreachable" in forbidden, why
        assert "Network is unreachable" in host_end, why
        assert "Operation not permitted" in route_add and "status 0" not in route_add, why
        effective = int(caps.split()[-1], 16)
        assert not effective & (1 << _CAP_NET_ADMIN | 1 << _CAP_NET_RAW), why
    assert finished_checked >= 1, "no trial ran after another one's token ended"
    # the forbidden host is up, so "unreachable" above is the container's routing, not a
    # server that was not there
    url = f"http://{net.forbidden}:{net.forbidden_port}/"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == b"forbidden host reached\n"


def test_no_trial_link_outlives_its_trial(probed: Probed) -> None:
    """The veths of the job's trials are gone once the job ends.

    (The containers too: the `probed` fixture checks them.)
    """
    assert probed.left == []
