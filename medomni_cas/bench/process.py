"""The ``process`` runner: an agent command as a subprocess, for writing agents without Docker.

Each trial gets a private scratch folder (`medomni_cas.bench.scratch`: mode 0700, an
unguessable name under the runs folder's ``.scratch/``) holding the atom task's files and
nothing else (see `medomni_cas.bench.staging`), the time limit, and, when the arm attaches
it, a perception gateway of its own on loopback. The agent finds everything in its
environment::

    MEDOMNI_WORKSPACE       the task's folder (it stands for /workspace), also the cwd
    MEDOMNI_INSTRUCTION     instruction.md in it
    MEDOMNI_SUBMISSION      where to write the answer
    MEDOMNI_PERCEPTION_URL  the gateway, with this trial's token (only on arms that attach it)
    MEDOMNI_MODEL           the agent config's ``model``: the model to ask for
    MEDOMNI_RUN_INFO        where the agent may write what its provider reported, as JSON:
                            {"served_model", "tokens_in", "tokens_out", "cost_usd"}; without
                            it the run records the config's served model and no usage. An
                            ``"infra_error": "<why>"`` in it says the model endpoint failed
                            (a 5xx, a time-out); see "Infrastructure errors" below
    <endpoint_env>          (the variable the config's ``settings.endpoint_env`` names) this
                            trial's URL of the endpoint relay, in place of the endpoint's

Infrastructure errors
---------------------
An infrastructure error is run again on resume instead of scored, so the harness counts one
only when it saw the failure itself: the trial could not be staged or started, the sandbox
failed, or, for an agent's ``infra_error`` claim, the endpoint relay
(`medomni_cas.bench.endpoint_relay`) logged a fault of the endpoint during this trial (a 5xx
or 429, no answer within ``settings.endpoint_timeout_sec``, no connection). A claim the relay
does not bear out (no fault logged, or no relay: the config names no ``endpoint_env``) is kept
in the run's errors and the run stands as it ended: an agent cannot trade a bad run for a
new attempt by saying so.

Isolation
---------
* The environment is built from an allowlist, never the harness's own: PATH, HOME, LANG,
  TMPDIR (the trial's private tmp folder), the harness's ``MEDOMNI_*`` variables, the
  variables the agent config names (``settings.env``; one that is unset fails the check),
  and PYTHONPATH when the command is ``python`` (this interpreter, with its packages).
* The agent runs under `medomni_cas.bench.sandbox`, in a session of its own; when it exits
  (or its time is up) every process it started is killed, even one that left the session.
* ``isolation=namespaces`` (the default ``auto`` picks it where Linux allows user and mount
  namespaces): the store, the studio and runs folders and other trials' folders are not
  visible to the agent, nor are the harness's processes (a fresh /proc). Else ``none``:
  the agent runs as you and sees your files; the run records say which.
* A gateway call counts only for the trial whose token made it; a call without a token, or
  with one of a trial that ended, is refused.

The network is not closed: isolation from the network is the Harbor runner's job.

Concurrency
-----------
``bench run --concurrency N`` keeps N trials running at once (`medomni_cas.bench.trialpool`),
each in its own folder, session and sandbox as above, under ``isolation=namespaces`` only:
without namespaces a trial could see and write the folders of the trials beside it, so
they run one at a time.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from medomni_cas.bench import sandbox
from medomni_cas.bench._inotify import OpenWatcher
from medomni_cas.bench.records import EncoderServed, Outcome
from medomni_cas.bench.runners import Job, Runner, RunnerError, Trial, TrialSpec
from medomni_cas.bench.scratch import SCRATCH_FOLDER, Scratch
from medomni_cas.bench.secrets import redactor
from medomni_cas.bench.staging import RESERVED, stage_atom
from medomni_cas.bench.trialpool import run_concurrently

__all__ = ["ISOLATIONS", "ProcessRunner", "agent_env", "namespaces_available", "now_iso"]

_LOG_LIMIT = 1 << 20  # keep the last MiB of each stream
_GRACE_SEC = 10.0  # after SIGTERM at a timeout, before SIGKILL
ISOLATIONS = ("auto", "namespaces", "none")
_ALLOWED = ("PATH", "HOME", "LANG")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SANDBOX = str(Path(sandbox.__file__).resolve())
_probed: dict[str, str] = {}


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _command(job: Job) -> list[str]:
    cmd = job.agent.options.get("command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
        raise RunnerError(
            f"agent config {job.agent.name}: the process runner needs settings.command, a "
            "list of strings such as [python, -m, medomni_cas.bench.baseline]"
        )
    # "python" means this interpreter, so the agent sees the same installed packages
    return [sys.executable if cmd[0] in ("python", "python3") else cmd[0], *cmd[1:]]


def _named(job: Job) -> list[str]:
    names = job.agent.options.get("env") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise RunnerError(f"agent config {job.agent.name}: settings.env must be a list of names")
    return names


def agent_env(job: Job, cmd: Sequence[str], own: dict[str, str]) -> dict[str, str]:
    """The agent's environment: the allowlist (module docstring), then the runner's ``own``."""
    env = {k: os.environ[k] for k in _ALLOWED if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("MEDOMNI_")})
    if cmd[0] == sys.executable and "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update({k: os.environ[k] for k in _named(job)})  # `check` made sure they are set
    env.update(own)
    return env


def namespaces_available() -> str:
    """Why the sandbox cannot use namespaces here ("" when it can); probed once a process."""
    if sys.executable not in _probed:
        if not sys.platform.startswith("linux"):
            _probed[sys.executable] = "namespaces are Linux's"
        else:
            done = subprocess.run(
                [sys.executable, "-I", "-S", _SANDBOX, "--probe"],
                capture_output=True,
                text=True,
                env={},
            )
            why = done.stderr.strip().removeprefix("medomni-sandbox: ") or "probe failed"
            _probed[sys.executable] = "" if done.returncode == 0 else why
    return _probed[sys.executable]


def _local_paths(store: Any) -> list[Path]:
    """The local folders of a store's backends (an LMDB or directory store, a cache)."""
    out: list[Path] = []
    todo = [getattr(store, "backend", None)]
    while todo:
        b = todo.pop()
        if b is None:
            continue
        path = getattr(b, "path", None)
        if isinstance(path, str | Path):
            out.append(Path(path))
        todo += [getattr(b, "local", None), getattr(b, "remote", None)]
    return out


class ProcessRunner(Runner):
    name: ClassVar[str] = "process"
    description: ClassVar[str] = (
        "an agent command as a subprocess (namespaces where Linux allows them, else none)"
    )
    isolated: ClassVar[bool] = False
    scaffolds: ClassVar[tuple[str, ...]] = ("process", "baseline", "command")
    claims_each: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "run" in cls.__dict__ and "claims_each" not in cls.__dict__:
            cls.claims_each = False  # a run() of its own asks no `Job.claim`: claim up front

    def __init__(
        self,
        *,
        scratch: str | os.PathLike[str] | None = None,
        keep: bool | str = False,
        isolation: str = "auto",
    ) -> None:
        self.scratch = Path(scratch) if scratch is not None else None
        # options may come as text from the command line (--runner-option keep=1)
        self.keep = keep if isinstance(keep, bool) else keep.lower() in ("1", "true", "yes")
        if isolation not in ISOLATIONS:
            raise RunnerError(
                f"process runner: isolation={isolation!r}; want one of {', '.join(ISOLATIONS)}"
            )
        self.isolation = isolation

    def _isolation(self) -> str:
        if self.isolation == "none":
            return "none"
        return "namespaces" if not namespaces_available() else "none"

    def check(self, job: Job) -> list[str]:
        try:
            cmd = _command(job)
            named = _named(job)
        except RunnerError as e:
            return [str(e)]
        problems = []
        if shutil.which(cmd[0]) is None and not Path(cmd[0]).is_file():
            problems.append(f"agent config {job.agent.name}: command {cmd[0]!r} not found")
        for n in named:
            if not _NAME.fullmatch(n):
                problems.append(f"agent config {job.agent.name}: settings.env: {n!r} is no name")
            elif n not in os.environ:
                problems.append(
                    f"agent config {job.agent.name}: settings.env names {n}, which is not set"
                )
        problems += _relay_problems(job)
        if self.isolation == "namespaces" and (why := namespaces_available()):
            problems.append(f"process runner: isolation=namespaces is not available here: {why}")
        if job.encoders != "none":
            from medomni_cas.bench.encoders import encoders

            if not encoders():
                problems.append("the perception service has no encoders to serve")
        return problems

    def _scratch_root(self, job: Job) -> Path:
        if self.scratch is not None:
            return self.scratch
        if job.scratch is not None:
            return job.scratch
        return job.folder.parent / SCRATCH_FOLDER  # the runs folder's

    def _scratch(self, job: Job) -> Scratch:
        # a kept folder holds the agent's logs and files: redacted as its records are
        redact = redactor(job.agent).folder if self.keep else None
        return Scratch(self._scratch_root(job), keep=self.keep, redact=redact)

    def run(self, job: Job) -> Iterator[Trial]:
        cmd = _command(job)
        isolation = self._isolation()
        with contextlib.ExitStack() as stack:
            scratch = stack.enter_context(self._scratch(job))
            hide = [*_local_paths(job.store), *job.private, job.folder, scratch.root]
            relay, relay_url = self._relay(job, stack)
            tokens, url = None, ""
            if job.encoders != "none":
                # one server for the job, one gateway (budget, filter, log) per atom task,
                # reached only with that task's token
                from medomni_cas.bench.perception import Tokens, serve

                tokens = Tokens()
                url = stack.enter_context(serve(tokens, host="127.0.0.1", port=0))

            def runs() -> Iterator[_Run]:
                for spec in job.trials:
                    # claimed as it starts: harnesses sharing the store share the job
                    if job.claim is None or job.claim(spec):
                        folder = scratch.trial()
                        yield _Run(job, spec, cmd, folder, isolation, hide, relay, relay_url)

            # without namespaces a trial sees the others' folders: then one at a time, so
            # what a trial leaves behind is killed before the next one starts
            if job.concurrency > 1 and isolation == "namespaces":
                yield from run_concurrently(runs(), job.concurrency, tokens, url, scratch)
                return
            for run in runs():
                try:
                    yield run.go(tokens, url)  # the harness records it before we get here again
                finally:
                    scratch.remove(run.folder)

    def _relay(self, job: Job, stack: contextlib.ExitStack) -> tuple[Any, str]:
        """The endpoint relay of the job (and its URL), when the config names an http(s)
        endpoint; (None, "") otherwise."""
        from medomni_cas.bench.endpoint_relay import DEFAULT_TIMEOUT_SEC, EndpointRelay, relayable
        from medomni_cas.bench.perception import serve
        from medomni_cas.bench.routes import endpoint_url

        upstream = endpoint_url(job.agent)
        if not upstream or not relayable(upstream):
            return None, ""

        timeout = job.agent.options.get("endpoint_timeout_sec") or DEFAULT_TIMEOUT_SEC
        relay = EndpointRelay(upstream, timeout=float(timeout))
        return relay, stack.enter_context(serve(relay, host="127.0.0.1", port=0))

    # kept for runners built on this one (tests, wrappers): one trial in a folder of its own
    def _trial(self, job: Job, spec: TrialSpec, cmd: Sequence[str]) -> Trial:
        with self._scratch(job) as scratch:
            folder = scratch.trial()
            hide = [*_local_paths(job.store), *job.private, job.folder, scratch.root]
            if job.encoders == "none":
                return _Run(job, spec, cmd, folder, self._isolation(), hide).go(None, "")
            from medomni_cas.bench.perception import Tokens, serve

            tokens = Tokens()
            with serve(tokens, host="127.0.0.1", port=0) as url:
                return _Run(job, spec, cmd, folder, self._isolation(), hide).go(tokens, url)


class _Run:
    """One trial in its folder: stage, launch under the sandbox, collect."""

    def __init__(
        self,
        job: Job,
        spec: TrialSpec,
        cmd: Sequence[str],
        folder: Path,
        isolation: str,
        hide: Sequence[Path],
        relay: Any = None,
        relay_url: str = "",
    ) -> None:
        self.job, self.spec, self.cmd, self.folder = job, spec, cmd, folder
        self.isolation, self.hide = isolation, hide
        self.relay, self.relay_url = relay, relay_url
        # what the agent may see is agent/; the logs and the sandbox's status sit beside it
        self.agent = folder / "agent"
        self.work = self.agent / "workspace"
        self.tmp = self.agent / "tmp"
        self.run_info = self.agent / "run_info.json"
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False

    def stop(self) -> None:
        """End the trial from another thread: its sandbox gets SIGTERM (it kills every
        process of the agent), and a trial not launched yet never starts."""
        with self._lock:
            self._stopped = True
            if self._proc is not None and self._proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """What `stop` left of the trial's process group, killed."""
        with self._lock:
            if self._proc is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._proc.pid, signal.SIGKILL)

    def go(self, tokens: Any, url: str) -> Trial:
        failed = self.stage(tokens, url)
        return failed if failed is not None else self.launch()

    def stage(self, tokens: Any, url: str) -> Trial | None:
        """Stage the task's files and the trial's gateway (the store is read here, so the
        caller's thread does it); an infrastructure error's trial when staging failed."""
        job, spec = self.job, self.spec
        self.started, self.t0 = now_iso(), time.monotonic()
        try:
            self.agent.mkdir(mode=0o700)
            self.answer_path = stage_atom(job.store, spec.atom, spec.format_check, self.work)
            self.tmp.mkdir(mode=0o700)
        except Exception as e:  # the task could not be staged: not the agent's doing
            return _infra(spec, self.started, self.t0, f"staging failed: {e}")
        answer_path = self.answer_path
        limit = spec.atom.environment.agent_timeout_sec
        if job.agent.limits.time_sec:
            limit = min(limit, job.agent.limits.time_sec)
        own = {
            "TMPDIR": str(self.tmp),
            "MEDOMNI_WORKSPACE": str(self.work),
            "MEDOMNI_INSTRUCTION": str(self.work / "instruction.md"),
            "MEDOMNI_SUBMISSION": str(answer_path),
            "MEDOMNI_RUN_INFO": str(self.run_info),
            "MEDOMNI_MODEL": job.agent.model,
        }
        self.tokens, self.gateway, self.token = tokens, None, ""
        if tokens is not None:
            from medomni_cas.bench.perception import Gateway

            self.gateway = Gateway(
                self.work, spec.atom.families, budget=job.budget, atom=spec.atom_id.hex()
            )
            self.token = tokens.issue(self.gateway)
            own["MEDOMNI_PERCEPTION_URL"] = f"{url}{tokens.PREFIX}{self.token}"
        self.relay_token = ""
        if self.relay is not None:
            self.relay_token = self.relay.issue()
            own[job.agent.options["endpoint_env"]] = self.relay.url(
                self.relay_url, self.relay_token
            )
        self.env, self.limit = agent_env(job, self.cmd, own), limit
        return None

    def launch(self) -> Trial:
        """Run the staged agent and collect what it did (reads no store: any thread)."""
        job, spec, answer_path = self.job, self.spec, self.answer_path
        started, t0, gateway = self.started, self.t0, self.gateway
        try:
            with OpenWatcher(self.work, ignore=RESERVED) as watcher:
                outcome, errors, out, err = self._exec(self.env, self.limit)
                opened = watcher.opened()
        finally:
            if self.tokens is not None:
                self.tokens.revoke(self.token)  # whatever it left running can call no more
            if self.relay is not None:
                self.relay.revoke(self.relay_token)
        trial = Trial(
            slot=spec.slot,
            attempt=spec.attempt,
            outcome=outcome,
            started=started,
            finished=now_iso(),
            elapsed_ms=int((time.monotonic() - t0) * 1000),
            served_model=job.agent.served_model,  # a subprocess reports no model of its own
            errors=errors,
            logs={"stdout.txt": out, "stderr.txt": err},
            files_opened=[f for f in opened if f != answer_path.name],
            environment="local",
            isolation=self.isolation,
        )
        _read_run_info(self.run_info, trial, self._endpoint_faults(self.relay_token))
        if self.relay is not None:
            self.relay.forget(self.relay_token)
        if trial.outcome == "infra-error":
            return trial
        if answer_path.is_file():
            trial.answer = answer_path.read_bytes()
        elif outcome == "answered":
            trial.outcome = "agent-failed"
            trial.errors.append(f"no answer at {spec.atom.submission_path}")
        if gateway is not None:
            trial.encoder_calls = list(gateway.calls)
            trial.encoders_served = [
                EncoderServed(name=e["name"], version=e["version"], digest=e["digest"])
                for e in gateway.encoders_served()
            ]
        return trial

    def _endpoint_faults(self, token: str) -> Callable[[], list[str]]:
        """What the relay saw the endpoint fail in this trial, asked only for a claim."""

        def faults() -> list[str]:
            if self.relay is None:
                return []
            return [c.describe() for c in self.relay.faults(token)]

        return faults

    def _launcher(self, status: Path) -> list[str]:
        argv = [sys.executable, "-I", "-S", _SANDBOX, "--isolation", self.isolation]
        argv += ["--status", str(status), "--parent", str(os.getpid())]
        if self.isolation == "namespaces":
            for p in self.hide:
                argv += ["--hide", str(p)]
            # the agent's own folder, and the interpreter wherever it lives
            keep = [self.agent, Path(sys.prefix), Path(sys.base_prefix)]
            for p in dict.fromkeys(keep):
                argv += ["--keep", str(p)]
        return [*argv, "--", *self.cmd]

    def _exec(self, env: dict[str, str], limit: int) -> tuple[Outcome, list[str], bytes, bytes]:
        status = self.folder / "sandbox-status"
        logs = self.folder / "stdout.txt", self.folder / "stderr.txt"
        argv = self._launcher(status)
        # files, not pipes: a process that escaped cannot keep the harness reading forever
        with open(logs[0], "wb") as out, open(logs[1], "wb") as err, self._lock:
            if self._stopped:
                return "infra-error", ["the harness stopped before the trial started"], b"", b""
            try:
                self._proc = proc = subprocess.Popen(
                    argv,
                    cwd=self.work,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own session and process group
                )
            except OSError as e:
                return "infra-error", [f"could not start {self.cmd[0]}: {e}"], b"", b""
        timed_out = False
        try:
            rc = _wait(proc, limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)  # the sandbox kills every process of the agent
            try:
                rc = proc.wait(timeout=_GRACE_SEC)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        except BaseException:  # the harness was stopped (a signal): the trial ends with it
            proc.send_signal(signal.SIGTERM)  # the sandbox kills every process of the agent
            try:
                proc.wait(timeout=_GRACE_SEC)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
        finally:
            # whatever of the group is left (the sandbox reaps all it can see, this is the rest)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = (_tail(p) for p in logs)
        if status.is_file() and status.stat().st_size:
            problem = status.read_text(errors="replace").strip()
            return "infra-error", [f"sandbox: {problem}"], stdout, stderr
        if timed_out:
            return "timeout", [f"no answer within {limit} s"], stdout, stderr
        if rc != 0:
            return "agent-failed", [f"exit status {rc}"], stdout, stderr
        return "answered", [], stdout, stderr


def _relay_problems(job: Job) -> list[str]:
    """What the endpoint relay needs and lacks (the web stack of the ``bench`` extra)."""
    from medomni_cas._extras import MissingExtra, require
    from medomni_cas.bench.endpoint_relay import relayable
    from medomni_cas.bench.routes import endpoint_url

    upstream = endpoint_url(job.agent)
    if not upstream or not relayable(upstream):
        return []
    try:
        for module in ("starlette", "uvicorn", "httpx"):
            require(module, "bench", "the process runner's relay to the model endpoint")
    except MissingExtra as e:
        return [f"agent config {job.agent.name}: {e}"]
    return []


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """`Popen.wait`, woken the moment the process exits (``wait(timeout=)`` polls in naps
    of up to 50 ms, which a set of many short trials pays for each)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return proc.wait(timeout=timeout)
    try:
        import select

        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(timeout * 1000):
            raise subprocess.TimeoutExpired(proc.args, timeout)
        return proc.wait()
    finally:
        os.close(fd)


def _tail(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - _LOG_LIMIT))
        return f.read()


def _infra(spec: TrialSpec, started: str, t0: float, error: str) -> Trial:
    return Trial(
        slot=spec.slot,
        attempt=spec.attempt,
        outcome="infra-error",
        started=started,
        finished=now_iso(),
        elapsed_ms=int((time.monotonic() - t0) * 1000),
        errors=[error],
        environment="local",
    )


def _read_run_info(path: Path, trial: Trial, faults: Callable[[], list[str]] = lambda: []) -> None:
    """What the agent says its provider reported; a malformed file is the agent's error.
    ``faults`` says what the endpoint relay saw fail (module docstring: Infrastructure
    errors)."""
    if not path.is_file():
        return
    import msgspec

    try:
        info = msgspec.json.decode(path.read_bytes())
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
        if "served_model" in info:
            trial.served_model = str(info["served_model"])
        for key in ("tokens_in", "tokens_out"):
            if info.get(key) is not None:
                setattr(trial, key, int(info[key]))
        why = info.get("infra_error")
        if why and trial.outcome in ("answered", "agent-failed"):
            # the agent says its model endpoint failed: run again only if the relay saw it
            seen = faults()
            if seen:
                trial.outcome = "infra-error"
                trial.errors[:0] = [f"model endpoint: {why}", f"the relay saw: {seen[0]}"]
            else:
                trial.errors.append(
                    f"MEDOMNI_RUN_INFO: the agent says its model endpoint failed ({why}), "
                    "but the harness saw no fault of the endpoint in this run: it stands "
                    "as it ended"
                )
        if info.get("cost_usd") is not None:
            cost = float(info["cost_usd"])
            if cost != cost or cost in (float("inf"), float("-inf")) or cost < 0:
                raise ValueError(f"cost_usd {cost!r} is not a cost")
            trial.cost_usd = cost
    except (ValueError, TypeError, msgspec.DecodeError) as e:
        trial.errors.append(f"MEDOMNI_RUN_INFO: unreadable: {e}")
