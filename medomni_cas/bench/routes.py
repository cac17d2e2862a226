"""Where an agent's model endpoint is, checked against its config's route before anything runs.

An agent config that names its endpoint (``settings.endpoint_env``: the variable holding the
URL, such as ``OPENAI_BASE_URL``) on the ``local`` route must reach a model on this machine
or a private network: the endpoint's host is resolved at check time, and every address it
resolves to must be loopback, private (RFC 1918, unique local IPv6) or link-local; a unix
socket (``unix:///path``, ``http+unix://…``) is local. A host with a public address is
refused, naming the host and the address. (A DNS answer can change after the check: this
catches a wrong URL, not an adversary; the Harbor runner's closed network is the guarantee.)

The dataset policies (allow, deny, conditional) are checked by
`medomni_cas.bench.harness.checks.check_routes`, which calls `check_endpoint`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from medomni_cas.bench.records import AgentConfig

__all__ = ["Endpoint", "check_endpoint", "endpoint_url", "resolve_endpoint"]

_UNIX_SCHEMES = ("unix", "http+unix", "https+unix")


@dataclass(frozen=True)
class Endpoint:
    """An endpoint URL as resolved now: its host, the addresses, and whether all are local."""

    url: str
    host: str
    addresses: tuple[str, ...] = ()
    public: tuple[str, ...] = field(default=())  # the addresses that are not local
    problem: str = ""  # why it could not be resolved

    @property
    def local(self) -> bool:
        return not self.problem and not self.public


def endpoint_url(agent: AgentConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The endpoint URL ``agent`` names (the value of its ``endpoint_env``); None when it names
    none, "" when the variable is not set."""
    name = agent.options.get("endpoint_env")
    if not isinstance(name, str) or not name:
        return None
    return (os.environ if environ is None else environ).get(name, "")


def _is_local(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone is not part of it
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_private or ip.is_link_local


def resolve_endpoint(url: str) -> Endpoint:
    """Resolve ``url``'s host now and say whether every address is local."""
    parts = urlsplit(url)
    if parts.scheme in _UNIX_SCHEMES:
        return Endpoint(url, parts.netloc or parts.path, ("unix socket",))
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        return Endpoint(url, host, problem=f"not an http(s) URL or unix socket: {url!r}")
    try:
        infos = socket.getaddrinfo(host, parts.port or 0, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as e:
        return Endpoint(url, host, problem=f"host {host} does not resolve: {e}")
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    return Endpoint(url, host, addresses, tuple(a for a in addresses if not _is_local(a)))


def check_endpoint(
    agent: AgentConfig, problems: list[str], environ: Mapping[str, str] | None = None
) -> Endpoint | None:
    """The local route's rule on ``agent``'s endpoint, its failures appended to ``problems``;
    the endpoint as resolved (None when the config names none)."""
    url = endpoint_url(agent, environ)
    if url is None:
        return None
    name = agent.options["endpoint_env"]
    where = f"route: agent config {agent.name}"
    if not url:
        problems.append(f"{where}: settings.endpoint_env names {name}, which is not set")
        return Endpoint("", "", problem=f"{name} is not set")
    endpoint = resolve_endpoint(url)
    if agent.route != "local":
        return endpoint
    if endpoint.problem:
        problems.append(f"{where}: the local route's endpoint ({name}): {endpoint.problem}")
    elif endpoint.public:
        problems.append(
            f"{where}: the local route's endpoint host {endpoint.host} ({name}) resolves to "
            f"{', '.join(endpoint.public)}, which is not this machine or a private network; "
            "use route: cloud for a hosted provider"
        )
    return endpoint
