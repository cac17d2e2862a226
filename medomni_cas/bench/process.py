"""The ``process`` runner: an agent command as a subprocess, for writing agents without Docker.

Each trial gets a fresh scratch folder holding the atom task's files and nothing else (see
`medomni_cas.bench.staging`), the time limit, and, when the arm attaches it, a perception
gateway of its own on loopback. The agent finds everything in its environment::

    MEDOMNI_WORKSPACE       the scratch folder (it stands for /workspace), also the cwd
    MEDOMNI_INSTRUCTION     instruction.md in it
    MEDOMNI_SUBMISSION      where to write the answer
    MEDOMNI_PERCEPTION_URL  the gateway (only on arms that attach it)
    MEDOMNI_RUN_INFO        where the agent may write what its provider reported, as JSON:
                            {"served_model", "tokens_in", "tokens_out", "cost_usd"}; without
                            it the run records the config's served model and no usage

This runner does not isolate anything: the agent runs as you, with your network and your
files. Isolation (a container with no network but the perception service) is the Harbor
runner's job; use this one for agents you wrote, and for tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from medomni_cas.bench._inotify import OpenWatcher
from medomni_cas.bench.records import EncoderServed, Outcome
from medomni_cas.bench.runners import Job, Runner, RunnerError, Trial, TrialSpec
from medomni_cas.bench.staging import RESERVED, stage_atom

__all__ = ["ProcessRunner", "now_iso"]

_LOG_LIMIT = 1 << 20  # keep the last MiB of each stream


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


class _Current:
    """An ASGI app that hands each request to the gateway of the trial running now."""

    def __init__(self) -> None:
        self.gateway: Any = None

    @property
    def app(self) -> _Current:  # `serve` takes anything with an ASGI ``app``
        return self

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        gateway = self.gateway
        if gateway is None:
            if scope.get("type") == "http":
                from starlette.responses import JSONResponse

                if scope.get("path") == "/health":
                    await JSONResponse({"ok": True})(scope, receive, send)
                else:
                    await JSONResponse({"error": "no atom task is running"}, 503)(
                        scope, receive, send
                    )
            return
        await gateway.app(scope, receive, send)


class ProcessRunner(Runner):
    name: ClassVar[str] = "process"
    description: ClassVar[str] = "an agent command as a subprocess (no isolation)"
    isolated: ClassVar[bool] = False
    scaffolds: ClassVar[tuple[str, ...]] = ("process", "baseline", "command")

    def __init__(
        self, *, scratch: str | os.PathLike[str] | None = None, keep: bool | str = False
    ) -> None:
        self.scratch = Path(scratch) if scratch is not None else None
        # options may come as text from the command line (--runner-option keep=1)
        self.keep = keep if isinstance(keep, bool) else keep.lower() in ("1", "true", "yes")

    def check(self, job: Job) -> list[str]:
        try:
            cmd = _command(job)
        except RunnerError as e:
            return [str(e)]
        if shutil.which(cmd[0]) is None and not Path(cmd[0]).is_file():
            return [f"agent config {job.agent.name}: command {cmd[0]!r} not found"]
        if job.encoders != "none":
            from medomni_cas.bench.encoders import encoders

            if not encoders():
                return ["the perception service has no encoders to serve"]
        return []

    def run(self, job: Job) -> Iterator[Trial]:
        cmd = _command(job)
        with contextlib.ExitStack() as stack:
            if job.encoders != "none":
                # one server for the job, one gateway (budget, filter, log) per atom task
                from medomni_cas.bench.perception import serve

                self._current = _Current()
                self._url = stack.enter_context(serve(self._current, host="127.0.0.1", port=0))
            for spec in job.trials:
                yield self._trial(job, spec, cmd)

    def _trial(self, job: Job, spec: TrialSpec, cmd: Sequence[str]) -> Trial:
        started, t0 = now_iso(), time.monotonic()
        base = tempfile.mkdtemp(prefix="medomni-trial-", dir=self.scratch)
        work = Path(base) / "workspace"
        try:
            try:
                answer_path = stage_atom(job.store, spec.atom, spec.format_check, work)
            except Exception as e:  # the task could not be staged: not the agent's doing
                return self._infra(spec, started, t0, f"staging failed: {e}")
            limit = spec.atom.environment.agent_timeout_sec
            if job.agent.limits.time_sec:
                limit = min(limit, job.agent.limits.time_sec)
            env = {
                **os.environ,
                "MEDOMNI_WORKSPACE": str(work),
                "MEDOMNI_INSTRUCTION": str(work / "instruction.md"),
                "MEDOMNI_SUBMISSION": str(answer_path),
                "MEDOMNI_RUN_INFO": str(Path(base) / "run_info.json"),
            }
            gateway = None
            if job.encoders != "none":
                from medomni_cas.bench.perception import Gateway

                gateway = Gateway(
                    work, spec.atom.families, budget=job.budget, atom=spec.atom_id.hex()
                )
                self._current.gateway = gateway
                env["MEDOMNI_PERCEPTION_URL"] = self._url
            try:
                with OpenWatcher(work, ignore=RESERVED) as watcher:
                    outcome, errors, out, err = self._exec(cmd, work, env, limit)
                    opened = watcher.opened()
            finally:
                if gateway is not None:
                    self._current.gateway = None
            trial = Trial(
                slot=spec.slot,
                attempt=spec.attempt,
                outcome=outcome,
                started=started,
                finished=now_iso(),
                elapsed_ms=int((time.monotonic() - t0) * 1000),
                served_model=job.agent.served_model,  # a subprocess reports no model of its own
                errors=errors,
                logs={"stdout.txt": out[-_LOG_LIMIT:], "stderr.txt": err[-_LOG_LIMIT:]},
                files_opened=[f for f in opened if f != answer_path.name],
            )
            _read_run_info(Path(base) / "run_info.json", trial)
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
        finally:
            if not self.keep:
                shutil.rmtree(base, ignore_errors=True)

    @staticmethod
    def _exec(
        cmd: Sequence[str], work: Path, env: dict[str, str], limit: int
    ) -> tuple[Outcome, list[str], bytes, bytes]:
        try:
            proc = subprocess.Popen(
                list(cmd),
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a timeout kills the agent's children too
            )
        except OSError as e:
            return "infra-error", [f"could not start {cmd[0]}: {e}"], b"", b""
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            out, err = proc.communicate()
            return "timeout", [f"no answer within {limit} s"], out, err
        except BaseException:  # the harness was stopped (a signal): the trial ends with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()  # not communicate: a child that left the group may hold the pipes
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            raise
        if proc.returncode != 0:
            return "agent-failed", [f"exit status {proc.returncode}"], out, err
        return "answered", [], out, err

    @staticmethod
    def _infra(spec: TrialSpec, started: str, t0: float, error: str) -> Trial:
        return Trial(
            slot=spec.slot,
            attempt=spec.attempt,
            outcome="infra-error",
            started=started,
            finished=now_iso(),
            elapsed_ms=int((time.monotonic() - t0) * 1000),
            errors=[error],
        )


def _read_run_info(path: Path, trial: Trial) -> None:
    """What the agent says its provider reported; a malformed file is the agent's error."""
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
        if info.get("cost_usd") is not None:
            cost = float(info["cost_usd"])
            if cost != cost or cost in (float("inf"), float("-inf")) or cost < 0:
                raise ValueError(f"cost_usd {cost!r} is not a cost")
            trial.cost_usd = cost
    except (ValueError, TypeError, msgspec.DecodeError) as e:
        trial.errors.append(f"MEDOMNI_RUN_INFO: unreadable: {e}")
