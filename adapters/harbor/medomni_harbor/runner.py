"""The ``harbor`` runner: each medomni job is a Harbor job, each slot a Harbor trial.

``prepare`` renders the job's slots as Harbor task folders (`medomni_harbor.render`); ``run``
runs them with ``harbor.job.Job.create(JobConfig)`` then ``run()`` in a thread of its own, and
yields one `Trial` per Harbor ``TrialResult`` as each trial ends, so the harness records it at
once. Inside the run folder::

    harbor/tasks/<slot>-<attempt>/    the rendered tasks (removed when the job ends)
    harbor/replay/<slot>-<attempt>.json  answers a replay agent writes (replay configs only)
    harbor/jobs/h-<hash>/             Harbor's job folder: config.json, result.json, job.log,
                                      and one folder per trial, as Harbor writes it

Resume agrees with Harbor's: a slot whose trial already has a ``result.json`` in any earlier
Harbor job of this run folder is collected from it, never run again (the harness may have died
between Harbor finishing a trial and recording it); the rest run in a Harbor job named by the
hash of its config, so running the same rest again resumes that same Harbor job, and Harbor
itself skips what finished and discards what did not.

Options (keyword arguments, or ``MEDOMNI_HARBOR_<NAME>`` environment variables), so that where
trials run is a setting of the run, not code:

``environment``
    ``docker`` (default): our `MedomniDockerEnvironment`, on the engine of ``docker_host``,
    each trial's perception relay beside the agent's container. ``harbor-docker``: Harbor's
    own (``docker compose``). Any other Harbor environment type (``daytona``, ``modal``, ``e2b``,
    ``runloop``...), or ``module:Class``. See the README for what holds where.
``concurrency``   trials at once (default 2)
``image``         the agent's image, for every agent config (default: the config's
                  ``settings.image``, else ``local/base:1``; terminus-2's configs name
                  ``local/terminus:1``, which has tmux)
``docker_host``   the engine (default ``$DOCKER_HOST``)
``relay_image``   the perception relay's image (default: the tag `medomni_harbor.images`
                  derives from the base image and the relay's source)
``keep_tasks``    keep the rendered task folders after the job
``compose``       render each task for Harbor's compose-based environments: its own
                  ``environment/docker-compose.yaml`` closes the network and, on arms with the
                  service, runs the trial's relay (`medomni_harbor.compose`); default on for
                  ``harbor-docker`` and ``gke``
``gateway_host``, ``gateway_port``  where the job's perception gateway listens (default
                  127.0.0.1 and ``gateway_url``'s port, else a free port);
                  ``gateway_address`` (``host:port``, numeric) is how a compose trial's
                  forwarder reaches it, when not that (a GKE pod)
``gateway_url``   for an environment with an egress allowlist (not ours, not compose): the
                  gateway's URL as the trials' containers reach it (``http://host:port``);
                  each arm with the service then allows that host alone, and the agent's
                  ``MEDOMNI_PERCEPTION_URL`` is ``<gateway_url>/t/<token>``
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shutil
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import blake3

import medomni_harbor  # noqa: F401 - makes Harbor offline before it is imported
from medomni_cas.bench.encoder_calls import read_call_log
from medomni_cas.bench.harness.checks import oracle_answer
from medomni_cas.bench.records import AgentConfig as AgentRecord
from medomni_cas.bench.records import EncoderServed, Outcome
from medomni_cas.bench.refnames import agent_ref
from medomni_cas.bench.replay import source_run
from medomni_cas.bench.runners import Job, Runner, RunnerError, Trial, TrialSpec
from medomni_cas.studio.records import AnswerKey, BuildResult, SetBuild
from medomni_cas.studio.refnames import SET_BUILD_REFS
from medomni_harbor import _docker, compose, images
from medomni_harbor.gateway import PERCEPTION_DIR, JobGateway
from medomni_harbor.render import ANSWER_ARTIFACT, render_task, set_perception_url, task_name

__all__ = ["HarborRunner", "reported_models", "trial_from_result"]

OURS = "medomni_harbor.environment:MedomniDockerEnvironment"
_LOG_LIMIT = 1 << 20
#: Harbor's failure causes that are the infrastructure's, not the agent's
_INFRA_CAUSES = ("sandbox_failed", "model_provider_failed", "harbor_failed", "cancelled")
#: and exception types Harbor does not classify that are: ours, the docker SDK's, transport
_INFRA_TYPES = frozenset(
    {"ContainerFailure", "DockerException", "APIError", "ConnectionError", "ReadTimeout"}
)
_DONE = object()
#: Harbor's environment types that run a container on this machine (anything else is remote)
_LOCAL_TYPES = frozenset({"docker", "podman", "apple-container", "singularity", "sbx"})
#: environments that run a task's own docker-compose.yaml: tasks are rendered for it
_COMPOSE_TYPES = frozenset({"harbor-docker", "gke"})


def _option(value: Any, name: str, default: Any) -> Any:
    if value is not None:
        return value
    env = os.environ.get(f"MEDOMNI_HARBOR_{name.upper()}")
    return env if env not in (None, "") else default


def _runs_on_host(job: Job) -> bool:
    """Whether the job's agent is one of ours that runs on the host (`medomni_harbor.agents`:
    an agent command, a replay) rather than a Harbor agent inside the container."""
    return not HarborRunner.picks(job.agent)


class HarborRunner(Runner):
    name: ClassVar[str] = "harbor"
    description: ClassVar[str] = "Harbor trials in containers, closed network, perception relay"
    isolated: ClassVar[bool] = True

    @classmethod
    def picks(cls, agent: AgentRecord) -> bool:
        """The runner for Harbor's agents (``terminus-2``, ``oracle``, ``nop``...) and for
        ``settings.harbor_agent``."""
        from harbor.models.agent.name import AgentName

        return agent.scaffold in AgentName.values() or isinstance(
            agent.options.get("harbor_agent"), str
        )

    @classmethod
    def drives(cls, agent: AgentRecord) -> bool:
        """Those, and replays and agent commands (run on the host against the container)."""
        cmd = agent.options.get("command")
        command = isinstance(cmd, list) and bool(cmd) and all(isinstance(c, str) for c in cmd)
        return cls.picks(agent) or agent.scaffold == "replay" or command

    def __init__(
        self,
        *,
        environment: str | None = None,
        concurrency: int | str | None = None,
        image: str | None = None,
        docker_host: str | None = None,
        relay_image: str | None = None,
        environment_kwargs: dict[str, Any] | None = None,
        keep_tasks: bool | str | None = None,
        compose: bool | str | None = None,
        gateway_host: str | None = None,
        gateway_port: int | str | None = None,
        gateway_address: str | None = None,
        gateway_url: str | None = None,
    ) -> None:
        self.environment = str(_option(environment, "environment", "docker"))
        self.concurrency = int(_option(concurrency, "concurrency", 2))
        #: the image given for this run (it wins over an agent config's ``settings.image``)
        self.given_image = _option(image, "image", None)
        #: the image without an agent config: the base of the perception image
        self.image = str(self.given_image or images.AGENT_IMAGE)
        self.docker_host = _option(docker_host, "docker_host", None)
        self._relay_image = _option(relay_image, "relay_image", None)
        self.environment_kwargs = dict(environment_kwargs or {})
        keep = _option(keep_tasks, "keep_tasks", False)
        self.keep_tasks = keep if isinstance(keep, bool) else str(keep).lower() in ("1", "true")
        default = self.environment in _COMPOSE_TYPES
        comp = _option(compose, "compose", default)
        self.compose = comp if isinstance(comp, bool) else str(comp).lower() in ("1", "true")
        self.gateway_host = str(_option(gateway_host, "gateway_host", "127.0.0.1"))
        self.gateway_address = _option(gateway_address, "gateway_address", None)
        self.gateway_url = _option(gateway_url, "gateway_url", None)
        # the gateway listens on the port its URL names unless told otherwise (a port
        # forwarded on the way): a free port would answer none of the trials' calls
        try:
            url_port = urlsplit(str(self.gateway_url)).port if self.gateway_url else None
        except ValueError as e:
            raise RunnerError(f"runner option gateway_url {self.gateway_url!r}: {e}") from None
        self.gateway_port = int(_option(gateway_port, "gateway_port", url_port or 0))
        #: seconds spent on our side of each phase, for benchmarks_perf.harbor
        self.timings: dict[str, float] = {"render": 0.0, "collect": 0.0, "harbor": 0.0}

    # -- options ---------------------------------------------------------------------------
    @property
    def ours(self) -> bool:
        return self.environment == "docker"

    @property
    def direct(self) -> bool:
        """Trials reach the job's gateway at ``gateway_url`` through an egress allowlist."""
        return not self.ours and not self.compose and bool(self.gateway_url)

    def where(self, job: Job | None = None) -> tuple[str, str]:
        """The trials' (environment, isolation), as run records say (`RunRecord.isolation`):
        only our docker environment has the closed network we set up ("container"); a
        container of another Harbor environment on this machine has what that environment
        gave it ("harbor-container"); any other type runs on someone else's machines
        ("remote"), and a ``module:Class`` is not known ("unknown"). Our host agents (an
        agent command, a replay) run on this machine against the container: "none"."""
        if job is not None and _runs_on_host(job):
            return ("docker" if self.ours else self.environment), "none"
        if self.ours:
            return "docker", "container"
        if ":" in self.environment:
            return self.environment, "unknown"
        if self.environment == "harbor-docker" or self.environment in _LOCAL_TYPES:
            return self.environment, "harbor-container"
        return self.environment, "remote"

    def agent_image(self, job: Job) -> str:
        """The image the job's trials run in: the run's ``image`` when given, else the agent
        config's ``settings.image`` (a scaffold that needs tools in the container, such as
        terminus-2's tmux), else the base image."""
        if self.given_image:
            return str(self.given_image)
        named = job.agent.options.get("image")
        return named if isinstance(named, str) and named else self.image

    def relay_image(self) -> str:
        if self._relay_image is None:
            self._relay_image = images.relay_tag(self.docker_host, self.image)
        return str(self._relay_image)

    def _environment_config(self, job: Job) -> Any:
        from harbor.models.trial.config import EnvironmentConfig

        kwargs = dict(self.environment_kwargs)
        if self.ours:
            kwargs.setdefault("docker_host", _docker.docker_host(self.docker_host))
            if job.encoders != "none":
                kwargs.setdefault("relay_image", self.relay_image())
            return EnvironmentConfig(import_path=OURS, kwargs=kwargs)
        if ":" in self.environment:
            return EnvironmentConfig(import_path=self.environment, kwargs=kwargs)
        kind = "docker" if self.environment == "harbor-docker" else self.environment
        return EnvironmentConfig(type=kind, kwargs=kwargs)

    def _agent_config(self, job: Job) -> Any:
        """The Harbor agent for the job's agent config (`RunnerError` if there is none)."""
        from harbor.models.agent.name import AgentName
        from harbor.models.trial.config import AgentConfig

        a = job.agent
        opts = dict(a.options)
        if a.scaffold == "replay":
            folder = job.folder / "harbor" / "replay"
            return AgentConfig(
                import_path="medomni_harbor.agents:ReplayAgent",
                kwargs={"answers_dir": str(folder)},
            )
        if isinstance(opts.get("harbor_agent"), str) or a.scaffold in AgentName.values():
            target = opts.get("harbor_agent", a.scaffold)
            model = None if a.model in ("", "none") else a.model
            kwargs = dict(opts.get("harbor_kwargs") or {})
            if ":" in target:
                return AgentConfig(import_path=target, model_name=model, kwargs=kwargs)
            return AgentConfig(name=target, model_name=model, kwargs=kwargs)
        cmd = opts.get("command")
        if isinstance(cmd, list) and cmd and all(isinstance(c, str) for c in cmd):
            return AgentConfig(
                import_path="medomni_harbor.agents:CommandAgent",
                kwargs={"command": cmd, "env": list(opts.get("env") or [])},
            )
        raise RunnerError(
            f"agent config {a.name}: the harbor runner needs settings.command (run on the host "
            f"against the container), a Harbor agent as scaffold (such as terminus-2), "
            f"settings.harbor_agent (module:Class), or scaffold replay; got {a.scaffold!r}"
        )

    # -- the runner interface --------------------------------------------------------------
    def check(self, job: Job) -> list[str]:
        problems: list[str] = []
        try:
            import harbor.job  # noqa: F401
        except ImportError as e:
            return [f"harbor is not importable: {e} (pip install 'harbor==0.25.*')"]
        try:
            agent = self._agent_config(job)
        except RunnerError as e:
            problems.append(str(e))
            agent = None
        if agent is not None:
            from harbor.agents.factory import AgentFactory

            try:  # Harbor's own preflight: options, model credentials (no request is sent)
                AgentFactory.run_preflight(agent)
            except (Exception, SystemExit) as e:
                problems.append(f"agent config {job.agent.name}: Harbor's preflight: {e}")
        if agent is not None and agent.import_path and agent.import_path.endswith("CommandAgent"):
            cmd = agent.kwargs["command"][0]
            if cmd not in ("python", "python3") and shutil.which(cmd) is None:
                problems.append(f"agent config {job.agent.name}: command {cmd!r} not found")
        if job.agent.scaffold == "replay":
            src = job.agent.options.get("source")
            if not isinstance(src, str) or job.store.refs.get(agent_ref(src)) is None:
                problems.append(
                    f"agent config {job.agent.name}: replay source {src!r} has never run here"
                )
        if not self.ours:
            try:
                self._environment_config(job)
            except ValueError as e:
                problems.append(f"environment {self.environment!r}: {e}")
        if job.encoders != "none":
            from medomni_cas.bench.encoders import encoders

            if not encoders():
                problems.append("the perception service has no encoders to serve")
            if not self.ours and not self.compose and not self.direct:
                problems.append(
                    f"arm {job.arm_label} attaches the perception service, which only the "
                    "docker environment, Harbor's compose-based ones (option compose) and "
                    "environments with an egress allowlist (option gateway_url) run "
                    f"(environment is {self.environment!r}); run --arm no-perception there"
                )
        if self.ours:
            problems += self._check_engine(job)
        elif self.compose and job.encoders != "none" and self.environment == "harbor-docker":
            problems += self._check_relay_image()
        return problems

    def _check_relay_image(self) -> list[str]:
        """Harbor's docker environment uses ``$DOCKER_HOST``'s engine: the relay image must
        be there (elsewhere, a GKE pod say, it is pulled from the registry you name)."""
        import docker

        try:
            _docker.client(self.docker_host).images.get(self.relay_image())
        except docker.errors.ImageNotFound:
            return [
                f"the perception relay's image {self.relay_image()} is not on the engine: "
                "build it with `python -m medomni_harbor images`"
            ]
        except Exception as e:
            return [f"no Docker engine answers for the relay's image: {e}"]
        return []

    def _check_engine(self, job: Job) -> list[str]:
        import docker

        host = _docker.docker_host(self.docker_host)
        try:
            c = _docker.client(self.docker_host)
            c.ping()
        except Exception as e:
            return [f"no Docker engine answers at {host}: {e}"]
        problems = []
        image = self.agent_image(job)
        try:
            c.images.get(image)
        except docker.errors.ImageNotFound:
            return [
                f"the agent image {image} is not on the engine at {host} "
                "(`bash .ci/docker-engine image` imports local/base:1 and local/terminus:1)"
            ]
        if job.encoders != "none":
            tag = self.relay_image()
            try:
                c.images.get(tag)
            except docker.errors.ImageNotFound:
                problems.append(
                    f"the perception relay's image {tag} is not on the engine at {host}: "
                    "build it with `python -m medomni_harbor images` (no registry needed)"
                )
        return problems

    def prepare(self, job: Job) -> None:
        t0 = time.perf_counter()
        root = job.folder / "harbor"
        tasks = root / "tasks"
        tasks.mkdir(parents=True, exist_ok=True)
        answers = _oracle_answers(job) if job.agent.scaffold == "oracle" else {}
        image = self.agent_image(job)
        allowlist = [str(urlsplit(str(self.gateway_url)).hostname)] if self.direct else None
        for spec in job.trials:
            render_task(
                job,
                spec,
                tasks,
                image=image,
                oracle_answer=answers.get(spec.atom_id),
                compose=self.compose and not self.ours,
                allowlist=allowlist,
            )
        if job.agent.scaffold == "replay":
            self._write_replays(job, root / "replay")
        if self.ours:
            _docker.remove_stale(self.docker_host)  # what a killed run left running
        self.timings["render"] += time.perf_counter() - t0

    def _write_replays(self, job: Job, folder: Path) -> None:
        """Each slot's answer to replay: the source config's final run of the same atom, arm
        (and rung) and repetition, else repetition 1 (`replay.source_run`, as the replay
        runner picks it)."""
        folder.mkdir(parents=True, exist_ok=True)
        source = job.store.refs.get(agent_ref(str(job.agent.options.get("source"))))
        if source is None:
            return
        for spec in job.trials:
            run = source_run(
                job.store, source, spec.atom_id, job.arm_label, job.repetition, job.atoms
            )
            if run is not None and run.answer is not None:
                (folder / f"{task_name(spec)}.json").write_bytes(job.store.read_blob(run.answer))
                (folder / f"{task_name(spec)}.run").write_text(run.run_id + "\n")

    def run(self, job: Job) -> Iterator[Trial]:
        root = job.folder / "harbor"
        specs = {task_name(s): s for s in job.trials}
        try:
            # 1. what Harbor finished before (a result.json) and the harness did not record
            for name, trial_dir in _finished(root / "jobs", set(specs)):
                spec = specs.pop(name)
                yield self._collect(job, spec, trial_dir)
            if not specs:
                return
            # 2. the rest, as one Harbor job, beside the job's perception gateway
            with contextlib.ExitStack() as stack:
                gw = None
                if job.encoders != "none" and (self.ours or self.compose or self.direct):
                    gw = stack.enter_context(self._gateway(root / "tasks"))
                if gw is not None and self.ours:
                    gw.start_forwarder(self.docker_host, self.relay_image())
                elif gw is not None:  # each task gets its token in its compose file or URL
                    for name in specs:
                        task_dir = root / "tasks" / name
                        token = gw.open(task_dir)
                        if self.direct:
                            url = f"{str(self.gateway_url).rstrip('/')}{gw.tokens.PREFIX}{token}"
                            set_perception_url(task_dir, url)
                        else:
                            address = gw.address
                            compose.write_perception(task_dir, self.relay_image(), token, address)
                yield from self._run_harbor(job, root, specs, gw)
        finally:
            if not self.keep_tasks:
                shutil.rmtree(root / "tasks", ignore_errors=True)

    def _job_config(self, job: Job, root: Path, names: list[str]) -> Any:
        from harbor.models.job.config import JobConfig, RetryConfig
        from harbor.models.trial.config import TaskConfig

        config = JobConfig(
            job_name="pending",
            jobs_dir=root / "jobs",
            n_attempts=1,
            n_concurrent_trials=max(1, self.concurrency),
            quiet=True,
            retry=RetryConfig(max_retries=0),  # the harness retries infra errors by attempts
            environment=self._environment_config(job),
            agents=[self._agent_config(job)],
            tasks=[TaskConfig(path=root / "tasks" / n) for n in sorted(names)],
        )
        ident = config.model_dump_json(exclude={"job_name", "jobs_dir"}).encode()
        config.job_name = "h-" + blake3.blake3(ident).hexdigest()[:16]
        return config

    def _gateway(self, tasks: Path) -> JobGateway:
        return JobGateway(
            tasks, host=self.gateway_host, port=self.gateway_port, address=self.gateway_address
        )

    def _run_harbor(
        self, job: Job, root: Path, specs: dict[str, TrialSpec], gw: JobGateway | None = None
    ) -> Iterator[Trial]:
        config = self._job_config(job, root, list(specs))
        results: queue.Queue[Any] = queue.Queue()
        state: dict[str, Any] = {}
        thread = threading.Thread(
            target=_harbor_thread, args=(config, results, state), name="harbor-job", daemon=True
        )
        t0 = time.perf_counter()
        thread.start()
        try:
            while True:
                item = results.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    state["error"] = item
                    continue
                spec = specs.pop(item.task_name, None)
                if spec is None:
                    continue
                trial_dir = config.jobs_dir / config.job_name / item.trial_name
                if gw is not None:  # a compose trial's token ends with it (ours: at its stop)
                    gw.close(item.task_name, trial_dir)
                yield self._collect(job, spec, trial_dir)
        finally:
            if thread.is_alive():  # we are stopped early: cancel Harbor's trials, let it clean up
                loop, task = state.get("loop"), state.get("task")
                if loop is not None and task is not None:
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(task.cancel)
                thread.join(timeout=120)
            self.timings["harbor"] += time.perf_counter() - t0
        # Harbor stopped without a result for these (it failed as a whole): the
        # infrastructure's failure, so the harness runs them again on resume. Each gets the
        # exception of its own trial when Harbor raised one, else what stopped the job.
        error = state.get("error")
        own, other = _trial_causes(error) if error is not None else ({}, None)
        environment, isolation = self.where(job)
        for name, spec in specs.items():
            now = _iso(datetime.now(UTC))
            trial = Trial(
                slot=spec.slot,
                attempt=spec.attempt,
                outcome="infra-error",
                started=now,
                finished=now,
                elapsed_ms=0,
                environment=environment,
                isolation=isolation,
            )
            cause = own.get(name) or other
            if cause is not None:
                trial.errors = [f"harbor: {line}" for line in cause.lines]
            elif own:  # cancelled when another trial's exception stopped the job
                first, cause = next(iter(own.items()))
                trial.errors = [
                    f"harbor: not run: Harbor stopped the job when trial {first} failed: "
                    + cause.lines[0]
                ]
            else:
                trial.errors = ["harbor: no result"]
            if cause is not None:
                trial.logs = {"harbor.exception.txt": cause.text.encode()}
            yield trial

    def _collect(self, job: Job, spec: TrialSpec, trial_dir: Path) -> Trial:
        t0 = time.perf_counter()
        try:
            trial = trial_from_result(job, spec, trial_dir)
            trial.environment, trial.isolation = self.where(job)
            return trial
        finally:
            self.timings["collect"] += time.perf_counter() - t0


def _quiet_harbor() -> None:
    """Harbor draws a progress bar on stdout (with the mean reward, which here is the format
    check's pass rate and easy to misread as a score); stdout may carry ``--json`` output and
    the harness reports progress itself, so Harbor's bar is drawn on nothing."""
    import io

    import harbor.job as harbor_job
    from rich.console import Console
    from rich.progress import Progress

    if getattr(harbor_job, "_medomni_quiet", False):
        return

    class _Unseen(Progress):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("console", Console(file=io.StringIO()))
            super().__init__(*args, **kwargs)

    harbor_job.Progress = _Unseen
    harbor_job._medomni_quiet = True


def _harbor_thread(config: Any, results: queue.Queue[Any], state: dict[str, Any]) -> None:
    """Run one Harbor job to its end in this thread's own event loop."""
    from harbor.job import Job as HarborJob

    _quiet_harbor()

    async def main() -> None:
        state["loop"] = asyncio.get_running_loop()
        state["task"] = asyncio.current_task()
        hjob = await HarborJob.create(config)

        async def ended(event: Any) -> None:
            results.put(event.result)

        hjob.on_trial_ended(ended)
        await hjob.run()

    try:
        asyncio.run(main())
    except BaseException as e:  # reported for the slots that got no result
        results.put(e)
    finally:
        results.put(_DONE)


# -- why trials failed -------------------------------------------------------------------------
def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside ``error``, exception groups (Harbor's task group) unwrapped."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for sub in error.exceptions for leaf in _leaves(sub)]
    return [error]


def _describe(error: BaseException) -> list[str]:
    """``Type: first line of the message`` of an exception, then of each exception it was
    raised from (its causes), so an error wrapped on the way keeps its root."""
    out: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        first = str(e).strip().splitlines()
        head = f"{type(e).__name__}: {first[0]}" if first else type(e).__name__
        if not out or head not in out[-1]:
            out.append(head if not out else f"caused by {head}")
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return out


def _trial_of(error: BaseException) -> str | None:
    """The task name of the Harbor trial ``error`` was raised in: the `TrialConfig` one of the
    frames it passed through holds (Harbor's exceptions name no trial)."""
    from harbor.models.trial.config import TrialConfig

    tb = error.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, TrialConfig):
                return Path(str(value.task.path)).name
        tb = tb.tb_next
    return None


@dataclass(frozen=True)
class _Cause:
    """Why a trial failed: its error lines, and the traceback kept with its run."""

    lines: list[str]
    text: str


def _trial_causes(error: BaseException) -> tuple[dict[str, _Cause], _Cause | None]:
    """What a Harbor job that failed as a whole raised: per task name, its trial's own
    exception; and the first exception raised in no trial."""
    own: dict[str, _Cause] = {}
    other: _Cause | None = None
    for leaf in _leaves(error):
        if isinstance(leaf, asyncio.CancelledError):
            continue
        cause = _Cause(_describe(leaf), "".join(traceback.format_exception(leaf)))
        name = _trial_of(leaf)
        if name is not None:
            own.setdefault(name, cause)
        elif other is None:
            other = cause
    return own, other


def _traceback_causes(text: str) -> list[str]:
    """The last line of each exception in a formatted traceback: of each sub-exception of an
    exception group (``| Type: message`` at the end of each numbered block), else the
    traceback's own last line."""
    blocks: list[list[str]] = [[]]
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("+-") or line.startswith("+ "):
            blocks.append([])  # a sub-exception's block starts or ends
            continue
        line = line.lstrip("| ").strip() if line.startswith("|") else line
        if line:
            blocks[-1].append(line)
    out = []
    for block in blocks[1:] or blocks:
        last = block[-1] if block else ""
        if last and not last.startswith(("File ", "Traceback ", "^")) and "Group" not in last:
            out.append(last)
    if not out and text.strip():
        out.append(text.strip().splitlines()[-1].lstrip("| "))
    return list(dict.fromkeys(out))


def _finished(jobs: Path, wanted: set[str]) -> Iterator[tuple[str, Path]]:
    """(task name, trial folder) of trials with a complete ``result.json`` for a wanted task,
    in any Harbor job under ``jobs``; the latest one per task."""
    from harbor.models.trial.result import TrialResult

    if not jobs.is_dir():
        return
    best: dict[str, tuple[datetime, Path]] = {}
    for result_path in jobs.glob("*/*/result.json"):
        try:
            result = TrialResult.model_validate_json(result_path.read_text())
        except Exception:
            continue  # half-written by a killed run: Harbor discards that trial on resume
        if result.task_name not in wanted or result.finished_at is None:
            continue
        seen = best.get(result.task_name)
        if seen is None or result.finished_at > seen[0]:
            best[result.task_name] = (result.finished_at, result_path.parent)
    for name, (_, folder) in sorted(best.items()):
        yield name, folder


# -- a TrialResult as a Trial ------------------------------------------------------------------
def _iso(t: datetime | None) -> str:
    if t is None:
        return ""
    return t.astimezone(UTC).isoformat(timespec="milliseconds")


def _outcome(result: Any, answered: bool) -> tuple[Outcome, list[str]]:
    """The runner's outcome from Harbor's exception info and timing (the README's table).

    Harbor records an exception when it reaches the trial, after the agent phase's timing is
    closed, so the phase is told by what ran next: an exception out of the agent phase stops
    the trial before the verifier starts; a non-zero exit (and a timeout) is recorded by Harbor
    itself, which then goes on to collect and verify.
    """
    exc = result.exception_info
    errors = []
    if exc is not None:
        first = (exc.exception_message or "").strip().splitlines()
        if "ExceptionGroup" in exc.exception_type or not first:
            # a group's message is a count, an empty one says nothing: the traceback's last
            # lines say what was raised
            errors += _traceback_causes(exc.exception_traceback or "") or [exc.exception_type]
        else:
            errors.append(f"{exc.exception_type}: {first[0]}")
        kind, cause = exc.exception_type, exc.policy.cause.value
        infra = cause in _INFRA_CAUSES or kind in _INFRA_TYPES
        if kind == "AgentTimeoutError":
            return "timeout", errors
        if result.agent_execution is None:
            return "infra-error", errors  # the environment or the agent's setup failed
        in_agent = result.verifier is None or kind == "NonZeroAgentExitCodeError"
        if in_agent or not answered:
            return ("infra-error" if infra else "agent-failed"), errors
        # after the agent (collecting, verifying, teardown), its answer collected: it stands
    if not answered:
        errors.append("no answer at the submission path")
        return "agent-failed", errors
    return "answered", errors


def _logs(trial_dir: Path) -> dict[str, bytes]:
    """The trial's log files, flattened (``agent/stdout.txt`` -> ``agent.stdout.txt``):
    Harbor's result, its trial log and exception, the agent's and verifier's files, the
    relay's log. Harbor's config.json/lock.json repeat what result.json holds; the answer
    and the encoder calls are recorded on their own."""
    out: dict[str, bytes] = {}
    for name in ("result.json", "trial.log", "exception.txt"):
        p = trial_dir / name
        if p.is_file():
            out[name] = p.read_bytes()[-_LOG_LIMIT:]
    for sub in ("agent", "verifier"):
        folder = trial_dir / sub
        if folder.is_dir():
            for p in sorted(folder.rglob("*")):
                if p.is_file() and not p.is_symlink():
                    rel = p.relative_to(folder).as_posix().replace("/", ".")
                    out[f"{sub}.{rel}"] = p.read_bytes()[-_LOG_LIMIT:]
    relay = trial_dir / PERCEPTION_DIR / "relay.log"
    if relay.is_file():
        out["perception.relay.log"] = relay.read_bytes()[-_LOG_LIMIT:]
    return out


def reported_models(trial_dir: Path) -> list[str]:
    """The model the provider reported for each of the agent's turns, in order, from the
    trajectories Harbor's agents write (ATIF: ``agent/trajectory*.json``; terminus-2 takes
    each step's ``model_name`` from LiteLLM's response, which is the provider's)."""
    names: list[str] = []
    for path in sorted((trial_dir / "agent").glob("trajectory*.json")):
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        steps = doc.get("steps") if isinstance(doc, dict) else None
        for step in steps if isinstance(steps, list) else ():
            if isinstance(step, dict) and step.get("source") == "agent":
                name = step.get("model_name")
                if isinstance(name, str) and name:
                    names.append(name)
    return names


def trial_from_result(job: Job, spec: TrialSpec, trial_dir: Path) -> Trial:
    """One Harbor trial folder (its ``result.json`` and files) as the harness's `Trial`."""
    from harbor.models.trial.result import TrialResult

    result = TrialResult.model_validate_json((trial_dir / "result.json").read_text())
    answer_path = trial_dir / "artifacts" / ANSWER_ARTIFACT
    answer = answer_path.read_bytes() if answer_path.is_file() else None
    outcome, errors = _outcome(result, answer is not None)
    ctx = result.agent_result
    meta = (ctx.metadata if ctx is not None else None) or {}
    errors += [str(e) for e in meta.get("errors", [])]
    served = meta.get("served_model")
    if served is None and (reported := list(dict.fromkeys(reported_models(trial_dir)))):
        served = ", ".join(reported)  # several: matches no config's, so the run is an error
    if served is None and result.agent_info.model_info is not None:
        mi = result.agent_info.model_info
        served = f"{mi.provider}/{mi.name}" if mi.provider else mi.name
    started, finished = result.started_at, result.finished_at
    elapsed = int((finished - started).total_seconds() * 1000) if started and finished else 0
    trial = Trial(
        slot=spec.slot,
        attempt=spec.attempt,
        outcome=outcome,
        started=_iso(started),
        finished=_iso(finished),
        elapsed_ms=elapsed,
        answer=answer,  # kept whatever the outcome; the harness checks answered runs
        served_model=str(served) if served is not None else job.agent.served_model,
        tokens_in=ctx.n_input_tokens if ctx is not None else None,
        tokens_out=ctx.n_output_tokens if ctx is not None else None,
        cost_usd=ctx.cost_usd if ctx is not None else None,
        errors=errors,
        logs=_logs(trial_dir),
        files_opened=[str(f) for f in meta.get("files_opened", [])],
    )
    perception = trial_dir / PERCEPTION_DIR
    calls = perception / "calls.jsonl"
    if calls.is_file() and calls.stat().st_size:
        trial.encoder_calls = read_call_log(calls)
    listing = perception / "encoders.json"
    if listing.is_file():
        served_doc = json.loads(listing.read_text())
        image = served_doc.get("image", "")
        trial.encoders_served = [
            EncoderServed(
                name=e["name"],
                version=e["version"],
                digest=f"{e['digest']}@{image}" if image else e["digest"],
            )
            for e in served_doc.get("encoders", [])
        ]
    return trial


def _oracle_answers(job: Job) -> dict[Any, dict[str, object]]:
    """Each trial's answer from the answer keys of the set builds holding its atom: what
    Harbor's oracle agent is handed from outside the task (and no other agent ever is)."""
    store = job.store
    wanted = {spec.atom_id: spec for spec in job.trials}
    out: dict[Any, dict[str, object]] = {}
    for _, sb_id in store.refs.items(SET_BUILD_REFS):
        for e in store.get(sb_id, SetBuild).entries:
            if e.arm != job.arm or e.arm_variant != job.arm_variant:
                continue
            result = store.get(e.result, BuildResult)
            hits = [a for a in result.atoms if a in wanted and a not in out]
            if not hits:
                continue
            key = store.get(result.answer_key, AnswerKey)
            for aid in hits:
                spec = wanted[aid]
                answer = oracle_answer(key, spec.atom, spec.format_check)
                if answer is not None:
                    out[aid] = answer
    missing = [a for a in wanted if a not in out]
    if missing:
        raise RunnerError(f"oracle: no answer key holds atom {missing[0]}")
    return out
