"""The runner interface: prepare, run, collect. Runners are found through the entry point
group ``medomni.runners``; the built-in ``process`` and ``replay`` register the same way.

A runner only turns `Job`s into `Trial`s: what happened when the agent ran one atom task.
The harness owns everything else (checks, slots and claims, records, run folders), so a
runner never writes to the store, and a third-party runner (``adapters/harbor``) gets the
same guarantees by implementing three methods.

Which runner runs an agent config, when none is named, is its scaffold's (`runner_for`):
each runner declares the scaffolds it is the runner for (`Runner.picks`), and which it can
drive at all (`Runner.drives`; the Harbor runner also drives commands and replays).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import ClassVar

from medomni_cas.bench.encoder_calls import EncoderCall
from medomni_cas.bench.records import AgentConfig, EncoderServed, Outcome
from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.records import AtomTask, FormatCheck

__all__ = [
    "RUNNERS_GROUP",
    "Job",
    "Runner",
    "RunnerError",
    "Trial",
    "TrialSpec",
    "get_runner",
    "pick_runner",
    "runner_class",
    "runner_for",
    "runner_names",
]

RUNNERS_GROUP = "medomni.runners"


class RunnerError(MedomniError, ValueError):
    """An unknown runner, or one that cannot run a job as configured."""


@dataclass(frozen=True)
class TrialSpec:
    """One slot to run: an atom task, staged by the runner from the store."""

    slot: ObjectId
    attempt: int
    atom_id: ObjectId
    atom: AtomTask
    format_check: FormatCheck


@dataclass
class Job:
    """One arm (and rung) x one agent x one repetition of a task set: the slots still to run."""

    name: str
    folder: Path  # the run folder (a view of the records; runners may keep files here)
    store: Store
    agent: AgentConfig
    agent_id: ObjectId
    arm: str
    arm_variant: str  # the variant (rung) alone, "" for none; `arm_label` joins them
    encoders: str  # the arm's run side: "allowed" | "none" | "required"
    repetition: int
    budget: int  # encoder calls per atom task, when the arm attaches the perception service
    runner: str = ""
    trials: list[TrialSpec] = field(default_factory=list)
    #: Where a runner makes its private scratch folders (`medomni_cas.bench.scratch`).
    scratch: Path | None = None
    #: Folders agents must not see (the studio, the runs folder), besides the store's own.
    private: tuple[Path, ...] = ()
    #: Trials a runner may run at once (``bench run --concurrency``); each stays isolated.
    concurrency: int = 1
    #: Set by the harness for a runner that `Runner.claims_each`: call it just before
    #: starting a trial, and skip the trial when it says False (another harness has it).
    claim: Callable[[TrialSpec], bool] | None = None
    #: Every atom of the job's arm, in order: its slots' chunks are made of them
    #: (`medomni_cas.bench.slottables`); a replay finds its source's runs with them.
    atoms: tuple[ObjectId, ...] = ()

    @property
    def arm_label(self) -> str:
        return arm_label(self.arm, self.arm_variant)


@dataclass
class Trial:
    """What happened when the agent ran one slot. ``outcome`` is the runner's view:
    "answered" (it wrote something at the submission path; the harness checks its shape),
    "agent-failed", "timeout" or "infra-error"."""

    slot: ObjectId
    attempt: int
    outcome: Outcome  # never "malformed": the harness tells that from the answer
    started: str
    finished: str
    elapsed_ms: int
    answer: bytes | None = None
    served_model: str = ""
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    errors: list[str] = field(default_factory=list)
    logs: dict[str, bytes] = field(default_factory=dict)
    encoder_calls: list[EncoderCall] = field(default_factory=list)
    encoders_served: list[EncoderServed] = field(default_factory=list)
    files_opened: list[str] = field(default_factory=list)
    environment: str = ""  # where it ran (see `RunRecord.environment`)
    isolation: str = "none"  # what kept the agent apart (see `RunRecord.isolation`)


class Runner(ABC):
    """Runs jobs. ``run`` yields trials as they finish (so a killed harness keeps what was
    recorded); ``collect`` yields any that only appear at the end (a batch system)."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    #: True when agents run isolated (containers, closed network). The process runner is not.
    isolated: ClassVar[bool] = False
    #: The scaffolds this is the runner for, when an agent config is run with no runner named.
    scaffolds: ClassVar[tuple[str, ...]] = ()
    #: True when the runner starts its trials one by one and asks `Job.claim` before each:
    #: harnesses on one store then share a job slot by slot. Else the harness claims every
    #: slot before `prepare`.
    claims_each: ClassVar[bool] = False

    @classmethod
    def picks(cls, agent: AgentConfig) -> bool:
        """Whether this is the runner for ``agent`` when no runner is named (`runner_for`)."""
        return agent.scaffold in cls.scaffolds

    @classmethod
    def drives(cls, agent: AgentConfig) -> bool:
        """Whether this runner can run ``agent``'s scaffold at all; one named for an agent
        it cannot drive is refused (`pick_runner`)."""
        return cls.picks(agent)

    def check(self, job: Job) -> list[str]:
        """Problems that would stop ``job`` from running (nothing has run yet)."""
        return []

    def prepare(self, job: Job) -> None:  # noqa: B027 - optional step
        """Stage what the job needs before any trial runs."""

    @abstractmethod
    def run(self, job: Job) -> Iterator[Trial]:
        """Run every trial of ``job``, yielding each as it finishes."""

    def collect(self, job: Job) -> Iterator[Trial]:
        """Trials known only after the job ended; most runners have none."""
        return iter(())


def _builtin() -> dict[str, str]:
    return {
        "process": "medomni_cas.bench.process:ProcessRunner",
        "replay": "medomni_cas.bench.replay:ReplayRunner",
    }


def runner_names() -> list[str]:
    return sorted({*_builtin(), *(ep.name for ep in entry_points(group=RUNNERS_GROUP))})


def runner_class(name: str) -> type[Runner]:
    """The class of runner ``name``, from the entry points (the built-ins also work
    uninstalled)."""
    target = next((ep for ep in entry_points(group=RUNNERS_GROUP) if ep.name == name), None)
    if target is not None:
        cls = target.load()
    elif name in _builtin():
        import importlib

        module, _, attr = _builtin()[name].partition(":")
        cls = getattr(importlib.import_module(module), attr)
    else:
        raise RunnerError(f"unknown runner {name!r} (installed: {', '.join(runner_names())})")
    if not (isinstance(cls, type) and issubclass(cls, Runner)):
        raise RunnerError(f"entry point {RUNNERS_GROUP} {name!r} is not a Runner class")
    return cls


def get_runner(name: str, **options: object) -> Runner:
    """The runner ``name``, made with ``options``."""
    return runner_class(name)(**options)


def runner_for(agent: AgentConfig) -> str:
    """The name of the runner for ``agent`` when none is named: the one that declares its
    scaffold (`Runner.picks`). The built-ins are asked first, and win (no plug-in is loaded
    for their scaffolds); a scaffold no installed runner picks, or several plug-ins do, is a
    `RunnerError` naming the config and the scaffold."""
    builtin = _builtin()
    for name in sorted(builtin):
        if runner_class(name).picks(agent):
            return name
    found = []
    for name in runner_names():
        if name in builtin:
            continue
        try:
            cls = runner_class(name)
        except (RunnerError, ImportError) as e:
            raise RunnerError(f"runner {name!r} does not load: {e}") from None
        if cls.picks(agent):
            found.append(name)
    if len(found) == 1:
        return found[0]
    where = f"agent config {agent.name}: scaffold {agent.scaffold!r}"
    if found:
        raise RunnerError(f"{where} is driven by several runners ({', '.join(found)}); name one")
    raise RunnerError(
        f"{where} is driven by no installed runner (installed: {', '.join(runner_names())}); "
        "set settings.scaffold to one they drive, or name a runner (--runner)"
    )


def pick_runner(
    agent: AgentConfig,
    runner: str | Runner | None = None,
    options: Mapping[str, object] | None = None,
) -> Runner:
    """The runner to run ``agent``: ``runner`` as given (made with ``options`` when named), else
    its scaffold's (`runner_for`). A runner that cannot drive the scaffold is refused."""
    if isinstance(runner, Runner):
        impl = runner
    else:
        impl = get_runner(runner or runner_for(agent), **(options or {}))
    if not impl.drives(agent):
        raise RunnerError(
            f"agent config {agent.name}: runner {impl.name!r} cannot drive scaffold "
            f"{agent.scaffold!r} ({_its_runner(agent)})"
        )
    return impl


def _its_runner(agent: AgentConfig) -> str:
    try:
        return f"its runner is {runner_for(agent)!r}"
    except RunnerError:
        return "no installed runner drives it"
