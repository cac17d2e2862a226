"""``medomni bench agent check <config>``: test an agent config before a set runs on it.

It loads the config, lists every field with its value and its meaning (from the config's
schema), resolves the endpoint against the route (`medomni_cas.bench.routes`), sends one
tiny chat completion to the endpoint (``POST <endpoint>/chat/completions``, the
OpenAI-compatible API every supported server speaks) and reports the served model, the
latency and the tokens. Anything that does not match (a variable not set, a refused route,
a failed request, another served model, a scaffold no runner drives) is a problem: exit 1.

A secret's value is never shown: a variable of ``env`` or ``secrets`` is shown as set or not
set, and an endpoint URL without any user and password it holds.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from medomni_cas.bench.agents import AgentFile, LimitsSpec, Settings
from medomni_cas.bench.records import AgentConfig
from medomni_cas.bench.routes import Endpoint, check_endpoint, endpoint_url
from medomni_cas.bench.secrets import redactor, secret_names

__all__ = ["PROMPT", "AgentCheck", "FieldRow", "check_agent", "wire_model"]

PROMPT = "Reply with the single word OK."


@dataclass(frozen=True)
class FieldRow:
    name: str  # dotted: settings.limits.tokens
    value: str
    meaning: str


@dataclass
class AgentCheck:
    """What ``agent check`` found; ``problems`` empty means exit 0."""

    config: AgentConfig
    fields: list[FieldRow] = field(default_factory=list)
    endpoint: Endpoint | None = None
    served_model: str = ""
    latency_ms: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    reply: str = ""
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _doc(cls: type) -> dict[str, str]:
    from medomni_cas.schemas.fields import struct_doc

    return {k: " ".join(v.split()) for k, v in struct_doc(cls).fields.items()}


def _shown_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=f"[user hidden]@{netloc}"))


def _rows(agent: AgentConfig, environ: Mapping[str, str]) -> list[FieldRow]:
    top, settings, limits = _doc(AgentFile), _doc(Settings), _doc(LimitsSpec)
    rows = [
        FieldRow("kind", agent.kind, top["kind"]),
        FieldRow("agent", agent.agent, top["agent"]),
        FieldRow("model", agent.model, top["model"]),
        FieldRow("route", agent.route, top["route"]),
        FieldRow("settings.scaffold", agent.scaffold, settings["scaffold"]),
        FieldRow("settings.served_model", agent.served_model, settings["served_model"]),
    ]
    for name in ("time_sec", "tokens", "cost_usd"):
        value = getattr(agent.limits, name)
        shown = "not set" if value is None else f"{value:g}"
        rows.append(FieldRow(f"settings.limits.{name}", shown, limits[name]))
    secrets = set(secret_names(agent))

    def state(n: str) -> str:
        if n not in environ:
            return f"{n} (not set)"
        return f"{n} (set, secret)" if n in secrets else f"{n} (set)"

    opts = agent.options
    names = {
        k: ", ".join(state(n) for n in opts.get(k) or ()) or "none" for k in ("env", "secrets")
    }
    rows.append(FieldRow("settings.env", names["env"], settings["env"]))
    endpoint_env = opts.get("endpoint_env") or ""
    url = endpoint_url(agent, environ)
    shown = (
        "none" if not endpoint_env else f"{endpoint_env} = {_shown_url(url or '') or '(not set)'}"
    )
    rows.append(FieldRow("settings.endpoint_env", shown, settings["endpoint_env"]))
    rows.append(FieldRow("settings.secrets", names["secrets"], settings["secrets"]))
    known = {"env", "endpoint_env", "secrets"}
    for key in sorted(k for k in opts if k not in known):
        rows.append(
            FieldRow(f"settings.{key}", json.dumps(opts[key]), "an option of the scaffold's runner")
        )
    return rows


def _api_key(agent: AgentConfig, environ: Mapping[str, str]) -> str:
    for name in [*(agent.options.get("secrets") or ()), "OPENAI_API_KEY"]:
        if environ.get(name):
            return environ[name]
    return ""


#: LiteLLM's provider prefixes for OpenAI-compatible servers: a scaffold that calls through
#: LiteLLM (terminus-2) names ``openai/<model>``, and the server sees ``<model>``.
_LITELLM_PREFIXES = ("openai/", "hosted_vllm/", "ollama_chat/", "ollama/", "litellm_proxy/")


def wire_model(agent: AgentConfig) -> str:
    """The model name the endpoint is asked for: the config's ``model``, without a LiteLLM
    provider prefix when a scaffold other than the process runner's calls through LiteLLM."""
    if agent.scaffold not in ("process", "baseline", "command"):
        for prefix in _LITELLM_PREFIXES:
            if agent.model.startswith(prefix):
                return agent.model.removeprefix(prefix)
    return agent.model


def _ask(check: AgentCheck, url: str, key: str, timeout: float) -> None:
    agent = check.config
    body = {
        "model": wire_model(agent),
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
    }
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(), headers=headers
    )
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            raw, cost_header = r.read(), r.headers.get("x-litellm-response-cost")
    except urllib.error.HTTPError as e:
        check.latency_ms = (time.monotonic() - t0) * 1000
        text = e.read()[:300].decode(errors="replace")
        check.problems.append(f"request: the endpoint answered {e.code}: {text}")
        return
    except (OSError, ValueError) as e:  # refused, timed out, not a URL
        check.problems.append(f"request: the endpoint did not answer: {e}")
        return
    check.latency_ms = (time.monotonic() - t0) * 1000
    try:
        reply: Any = json.loads(raw)
        check.served_model = str(reply["model"])
        usage = reply.get("usage") or {}
        check.tokens_in, check.tokens_out = (
            usage.get("prompt_tokens"),
            usage.get("completion_tokens"),
        )
        cost = usage.get("cost", cost_header)
        check.cost_usd = None if cost is None else float(cost)
        check.reply = str(reply["choices"][0]["message"].get("content") or "")[:200]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        check.problems.append(f"request: the reply is not a chat completion: {e!r}")
        return
    if agent.served_model and check.served_model != agent.served_model:
        check.problems.append(
            f"served model {check.served_model!r} is not the config's {agent.served_model!r}"
        )


def check_agent(
    agent: AgentConfig, *, environ: Mapping[str, str] | None = None, timeout: float = 60.0
) -> AgentCheck:
    """Check ``agent`` as the module docstring says; nothing is stored."""
    from medomni_cas.bench.runners import RunnerError, runner_for

    env = os.environ if environ is None else environ
    check = AgentCheck(agent, _rows(agent, env))
    try:
        runner = runner_for(agent)
        check.notices.append(f"runner: {runner} (for scaffold {agent.scaffold!r})")
    except RunnerError as e:
        check.problems.append(str(e))
    for name in agent.options.get("env") or ():
        if name not in env:
            check.problems.append(f"settings.env names {name}, which is not set")
    check.endpoint = check_endpoint(agent, check.problems, env)
    endpoint = check.endpoint
    if endpoint is not None and endpoint.problem and agent.route != "local" and endpoint.url:
        check.problems.append(f"route: the endpoint: {endpoint.problem}")
    if endpoint is None:
        check.notices.append("no endpoint named (settings.endpoint_env): nothing to ask")
    elif endpoint.url and not endpoint.problem and not check.problems:
        _ask(check, endpoint.url, _api_key(agent, env), timeout)
    # what the endpoint said goes to a terminal; it never holds a key
    r = redactor(agent, env)
    check.problems = [r.clean_text(p) for p in check.problems]
    check.reply = r.clean_text(check.reply)
    return check
