"""A stand-in for a cloud provider that enforces an egress allowlist, on the tests' engine.

Harbor refuses ``network_mode = "allowlist"`` on an environment that does not declare it can
enforce one, and Harbor's own docker environment enforces it with a sidecar image it pulls
from Docker Hub, which the tests cannot reach. This environment enforces it at the network
level instead, on our bridge-less engine (`MedomniDockerEnvironment`, which it extends):

* the agent's container starts with no network (``--network none``) and without
  ``CAP_NET_RAW`` (Docker's default capabilities keep ``CAP_NET_ADMIN`` out already): it can
  neither change its routes nor write packets of its own making, so the kernel's routing
  decides where everything it sends goes;
* then (as root, with iproute2's ``ip`` and ``nsenter``) its network namespace gets one veth,
  ``eth0``, whose peer stays on the host: a ``/30`` of the ``subnet`` the test gives, the
  host end ``.1``, the container ``.2`` (``noprefixroute``: no route to the ``/30``), IPv6 off
  on both ends (no link-local addresses), forwarding off on the host end (a packet that
  arrives there for any address but the host's own is dropped), and one ``/32`` route per
  allowed host, through ``eth0``, and no other route (no default route);
* when the trial stops, the veth is deleted (both ends go together) and its ``/30`` returned.

Only numeric IPv4 allowed hosts are supported (the capabilities say so: Harbor refuses
hostnames before the trial starts); ``public`` tasks are refused. What enforces the allowlist
here is this module, not a cloud provider's; the tests check it from inside the container.
Every trial's links are named ``<link_prefix>t<n>``, so a test can find what it left.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode
from medomni_harbor.environment import MedomniDockerEnvironment

__all__ = ["AllowlistDockerEnvironment", "ip", "links", "why_not_here"]

_TIMEOUT = 30.0  # seconds, for each `ip` or `nsenter` command
_leases: dict[str, set[int]] = {}  # subnet -> the /30 blocks trials of this process hold
_leases_lock = threading.Lock()


def why_not_here() -> str | None:
    """Why this machine cannot run the stand-in (not root, no ``ip`` or ``nsenter``), or None."""
    if os.geteuid() != 0:
        return "the egress-allowlist stand-in needs root (it adds veth links)"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"the egress-allowlist stand-in needs `{tool}` (iproute2, util-linux)"
    return None


def ip(*args: str, pid: int | None = None) -> str:
    """Run ``ip ARGS`` (in the network namespace of ``pid`` when given); its output.

    Raises `RuntimeError` with ``ip``'s message when it fails.
    """
    cmd = ["ip", *args]
    if pid is not None:
        cmd = ["nsenter", f"--net=/proc/{pid}/ns/net", "--", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")
    return done.stdout


def sysctl(name: str, value: str, *, pid: int | None = None) -> None:
    """Set ``/proc/sys/<name>`` (in the network namespace of ``pid`` when given)."""
    path = "/proc/sys/" + name.replace(".", "/")
    if pid is None:
        Path(path).write_text(value)
        return
    cmd = ["nsenter", f"--net=/proc/{pid}/ns/net", "--", "sh", "-c", f"echo {value} > {path}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"setting {name} in pid {pid}'s namespace: {done.stderr.strip()}")


def links(prefix: str) -> list[str]:
    """The host's network links whose name starts with ``prefix``."""
    out = []
    for line in ip("-o", "link", "show").splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0]
        if name.startswith(prefix):
            out.append(name)
    return out


def _lease(subnet: str) -> int:
    """A free ``/30`` block of ``subnet`` (its index), held until `_release`."""
    count = 2 ** (30 - ipaddress.IPv4Network(subnet).prefixlen)
    with _leases_lock:
        held = _leases.setdefault(subnet, set())
        for n in range(count):
            if n not in held:
                held.add(n)
                return n
    raise RuntimeError(f"no free /30 left in {subnet} for another trial")


def _release(subnet: str, n: int) -> None:
    with _leases_lock:
        _leases.get(subnet, set()).discard(n)


class AllowlistDockerEnvironment(MedomniDockerEnvironment):
    """The agent's container with one veth routed to the allowed hosts only (see the module).

    Keyword arguments (``environment.kwargs``), besides `MedomniDockerEnvironment`'s:
    ``subnet`` (an IPv4 network of at least a /30, private, that nothing else on the host
    uses: each trial takes a /30 of it) and ``link_prefix`` (the start of the trial links'
    names, at most 9 characters). The engine must run on this machine (the container's
    network namespace is entered through its pid).
    """

    def __init__(
        self,
        *args: Any,
        subnet: str,
        link_prefix: str,
        **kwargs: Any,
    ) -> None:
        net = ipaddress.IPv4Network(subnet)
        if net.prefixlen > 30:
            raise ValueError(f"subnet {subnet}: needs at least a /30")
        if not link_prefix or len(link_prefix) > 9:
            raise ValueError(f"link_prefix {link_prefix!r}: 1 to 9 characters")
        self._subnet = str(net)
        self._link_prefix = link_prefix
        self._block: int | None = None
        #: the trial's addresses, once its veth exists: (host end, container end)
        self.addresses: tuple[str, str] | None = None
        super().__init__(*args, **kwargs)
        # the agent reaches the job's gateway directly (the task's allowlist), not a relay
        self._perception = None

    @staticmethod
    def type() -> str:
        return "medomni-allowlist-standin"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # what Harbor checks before it runs an allowlist task here: numeric IPv4 only
        return EnvironmentCapabilities(
            disable_internet=True, network_allowlist=True, network_allowlist_ipv4_addresses=True
        )

    @property
    def link(self) -> str:
        """The host end's name (valid once the trial holds its /30)."""
        return f"{self._link_prefix}t{self._block}"

    def _limits(self, cpus: float | None, memory_mb: int | None) -> dict[str, Any]:
        # the base class passes these to the agent container's `create` (and this class
        # starts no relay): no CAP_NET_RAW, so nothing it sends bypasses its routing table
        return {**super()._limits(cpus, memory_mb), "cap_drop": ["NET_RAW"]}

    def _allowed(self) -> list[ipaddress.IPv4Address]:
        """The allowed hosts, numeric IPv4 (anything else is refused)."""
        policy = self.network_policy
        if policy.network_mode == NetworkMode.PUBLIC:
            raise ValueError("the egress-allowlist stand-in gives no public network")
        if policy.network_mode != NetworkMode.ALLOWLIST:
            return []
        out = []
        for host in policy.allowed_hosts:
            try:
                out.append(ipaddress.IPv4Address(host))
            except ValueError:
                raise ValueError(
                    f"allowed host {host!r}: the stand-in routes numeric IPv4 addresses only"
                ) from None
        return out

    def _start(self) -> None:
        allowed = self._allowed()  # refused before any container exists
        super()._start()  # the agent's container, `--network none`, started
        if allowed:
            self._attach(allowed)

    def _attach(self, allowed: list[ipaddress.IPv4Address]) -> None:
        """Give the started container its veth and its /32 routes."""
        self._main.reload()
        pid = int(self._main.attrs["State"]["Pid"])
        if pid <= 0:
            raise RuntimeError("the agent's container has no process to attach a network to")
        self._block = _lease(self._subnet)
        block = list(ipaddress.IPv4Network(self._subnet).subnets(new_prefix=30))[self._block]
        host, inside = str(block[1]), str(block[2])
        # the container's end is made in its namespace, down, as eth0: nothing of it is ever
        # on the host
        ip("link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", str(pid))
        self.addresses = (host, inside)
        sysctl(f"net.ipv6.conf.{self.link}.disable_ipv6", "1")
        sysctl(f"net.ipv4.conf.{self.link}.forwarding", "0")
        ip("addr", "add", f"{host}/30", "dev", self.link)
        ip("link", "set", self.link, "up")
        sysctl("net.ipv6.conf.eth0.disable_ipv6", "1", pid=pid)
        ip("addr", "add", f"{inside}/30", "noprefixroute", "dev", "eth0", pid=pid)
        ip("link", "set", "eth0", "up", pid=pid)
        for address in allowed:
            ip("route", "add", f"{address}/32", "dev", "eth0", "src", inside, pid=pid)

    def _remove(self, delete: bool) -> None:
        try:
            super()._remove(delete)
        finally:
            if self._block is not None:
                # a stopped (not removed) container may keep its namespace: delete the veth
                # here, not only with the namespace (deleting one end deletes both)
                if self.link in links(self.link):
                    with contextlib.suppress(RuntimeError):
                        ip("link", "del", self.link)
                _release(self._subnet, self._block)
                self._block = None
