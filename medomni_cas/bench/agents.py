"""Agent configs: ``bench/agents/<name>.yaml``, checked, and their store record.

::

    kind: agent                 # the intelligence kind (v0.3.0: agent)
    agent: baseline             # the agent's name, as results show it
    model: none                 # the model the scaffold drives
    route: local                # local | cloud: checked against each dataset's route policy
    settings:
      scaffold: baseline        # what drives the model; a runner must know it
      served_model: none        # what the provider must report back; else the run is an error
      limits: {time_sec: 600, tokens: 100000, cost_usd: 1.0}
      env: [OPENAI_BASE_URL, OPENAI_API_KEY]   # variables passed from your environment
      endpoint_env: OPENAI_BASE_URL   # the variable holding the model endpoint's URL
      secrets: [OPENAI_API_KEY] # variables whose values are redacted from everything stored
      command: [python, -m, medomni_cas.bench.baseline]   # scaffold options, passed through

Errors name the file, line and field, as Studio's files do.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from medomni_cas.bench.records import AgentConfig, Limits
from medomni_cas.errors import MedomniError
from medomni_cas.studio.schema import Problems, Spec, SpecError
from medomni_cas.studio.specfile import load_yaml, read_yaml

__all__ = ["AgentFile", "UnknownAgent", "agent_record", "find_agent", "load_agent"]

KINDS = ("agent",)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ROUTES = ("local", "cloud")


class UnknownAgent(MedomniError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class LimitsSpec(Spec, frozen=True, kw_only=True):
    """The run limits of an agent, per atom task; a limit left out is not set.

    Fields:
        time_sec: Seconds per atom task.
        tokens: Model tokens per atom task.
        cost_usd: Cost per atom task, in US dollars.
    """

    time_sec: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None

    def problems(self) -> Problems:
        for name in ("time_sec", "tokens", "cost_usd"):
            v = getattr(self, name)
            if v is not None and v < 0:
                yield name, "a limit is not negative"


class Settings(Spec, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """The scaffold, the model name to check, the limits; other keys are the scaffold's.

    Keys other than scaffold, served_model and limits are passed through to the runner as
    the scaffold's options (``command`` for the process runner, ``source`` for replay,
    ``env``) and are part of the agent config's id.

    Fields:
        scaffold: What drives the model; the runner must know it (``process``, ``replay``, a
            Harbor agent such as ``terminus-2``).
        served_model: The model name the provider must report back; a run whose served model
            differs is an error.
        limits: Time, token and cost limits per atom task.
        env: Names of environment variables the agent gets from the harness's environment
            (an API key, say); the agent gets no other variable of it. A name that is not
            set when the set runs fails the check.
        endpoint_env: The environment variable holding the model endpoint's URL (such as
            ``OPENAI_BASE_URL``); the URL is never written in the file. Before anything runs,
            a ``local`` route's endpoint must resolve to this machine or a private network.
        secrets: Environment variables holding secrets (API keys, tokens); their values are
            redacted from the logs, errors and answers of every run before they are stored.
            A variable of ``env`` whose name says KEY, TOKEN, SECRET or PASSWORD is one too.
        endpoint_timeout_sec: For the process runner's endpoint relay: seconds the endpoint
            may take to answer a request (or send its next chunk) before the harness counts
            it as not answering (default 120). Set it to at most your agent's own time-out.
    """

    scaffold: str
    served_model: str
    limits: LimitsSpec = LimitsSpec()
    env: tuple[str, ...] = ()
    endpoint_env: str = ""
    secrets: tuple[str, ...] = ()
    endpoint_timeout_sec: float | None = None

    def problems(self) -> Problems:
        if self.endpoint_timeout_sec is not None and not self.endpoint_timeout_sec > 0:
            yield "endpoint_timeout_sec", "a time-out is more than 0 seconds"
        for i, name in enumerate(self.env):
            if not _ENV_NAME.fullmatch(name):
                yield f"env[{i}]", f"not an environment variable name: {name!r}"
        for i, name in enumerate(self.secrets):
            if not _ENV_NAME.fullmatch(name):
                yield f"secrets[{i}]", f"not an environment variable name: {name!r}"
        if self.endpoint_env and not _ENV_NAME.fullmatch(self.endpoint_env):
            yield "endpoint_env", f"not an environment variable name: {self.endpoint_env!r}"


class AgentFile(Spec, frozen=True, kw_only=True):
    """``bench/agents/<name>.yaml``: an agent config; its name is the file's stem.

    Fields:
        kind: The intelligence kind; v0.3.0 has ``agent``.
        agent: The agent's name, as results show it.
        model: The model the scaffold drives.
        route: ``local`` or ``cloud``: checked against the route policy of each dataset the
            tasks hold data from.
        settings: The scaffold, the served model to check, the limits and the scaffold's
            options.
    """

    kind: str
    agent: str
    model: str
    route: str
    settings: Settings

    def problems(self) -> Problems:
        if self.kind not in KINDS:
            yield "kind", f"must be one of {', '.join(KINDS)}; got {self.kind!r}"
        if self.route not in ROUTES:
            yield "route", f"must be one of {', '.join(ROUTES)}; got {self.route!r}"
        if not self.agent.strip():
            yield "agent", "name the agent"


def _options(path: Path) -> dict[str, Any]:
    data = read_yaml(path) or {}
    settings = data.get("settings") or {}
    return {k: v for k, v in settings.items() if k not in ("scaffold", "served_model", "limits")}


def load_agent(path: str | Path) -> AgentConfig:
    """Read and check one agent config file; its name is the file's stem."""
    p = Path(path)
    spec = load_yaml(p, AgentFile)
    if not p.stem or "/" in p.stem:
        raise SpecError(p, None, "", "an agent config is named by its file")
    return agent_record(p.stem, spec, _options(p))


def agent_record(name: str, spec: AgentFile, options: dict[str, Any]) -> AgentConfig:
    lim = spec.settings.limits
    return AgentConfig(
        name=name,
        kind=spec.kind,
        agent=spec.agent,
        model=spec.model,
        route=spec.route,
        scaffold=spec.settings.scaffold,
        served_model=spec.settings.served_model,
        limits=Limits(time_sec=lim.time_sec, tokens=lim.tokens, cost_usd=lim.cost_usd),
        options=options,
    )


def find_agent(bench_root: str | Path, name_or_path: str) -> AgentConfig:
    """``--agent`` as a path to a YAML file, or a name under ``bench/agents/``."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return load_agent(p)
    candidate = Path(bench_root) / "agents" / f"{name_or_path}.yaml"
    if candidate.is_file():
        return load_agent(candidate)
    have = sorted(q.stem for q in (Path(bench_root) / "agents").glob("*.yaml"))
    raise UnknownAgent(
        f"no agent config {name_or_path!r} in {Path(bench_root) / 'agents'} "
        f"(have: {', '.join(have) or 'none'})"
    )
