"""MedOmni's agents as Harbor agents (Harbor loads them through ``agent.import_path``).

Harbor's agents run on the host and act on the container through the environment (``exec``,
uploads, downloads); so do these, and only through it:

* `CommandAgent` runs an agent *command* (an agent config's ``settings.command``, such as
  ``python -m medomni_cas.bench.baseline``) on the host, against a copy of the container's
  ``/workspace`` downloaded at the start, with the same environment variables the process
  runner gives (``MEDOMNI_WORKSPACE``, ``MEDOMNI_SUBMISSION``, ``MEDOMNI_RUN_INFO``...). When the
  task attaches the perception service, ``MEDOMNI_PERCEPTION_URL`` is a loopback relay that
  sends each request *from inside the agent's container* (``nc perception 8899`` through
  ``exec``), so every encoder call crosses the same closed network an in-container agent
  would. Its answer is uploaded to the submission path in the container, which is where the
  runner reads it (a Harbor artifact). The files it opened are read by inotify on the copy.
* `ReplayAgent` writes a recorded answer to the submission path (no model, no command).

Harbor's own agents (``nop``, ``oracle``, ``terminus-2``...) need nothing from here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from harbor.agents.base import BaseAgent
from harbor.agents.installed.base import NonZeroAgentExitCodeError
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from medomni_harbor import __version__

__all__ = ["CommandAgent", "NothingToReplay", "ReplayAgent", "task_env"]

_LOG_LIMIT = 1 << 20
_RESERVED = ("instruction.md", "answer_schema.json")


def task_env(environment: BaseEnvironment) -> dict[str, str]:
    """The task's ``[environment.env]``: where the workspace, submission and service are."""
    from harbor.utils.env import resolve_env_vars

    return resolve_env_vars(dict(environment.task_env_config.env or {}))


def _paths(environment: BaseEnvironment) -> tuple[str, str, str | None]:
    env = task_env(environment)
    workspace = env.get("MEDOMNI_WORKSPACE") or environment.task_env_config.workdir or "/workspace"
    submission = env.get("MEDOMNI_SUBMISSION") or f"{workspace}/answer.json"
    return workspace, submission, env.get("MEDOMNI_PERCEPTION_URL")


class NothingToReplay(RuntimeError):
    """The replay source has no answer for this task."""


class _HostAgent(BaseAgent):
    """What both agents share: no model, no setup, no web tools to turn off."""

    def version(self) -> str:
        return __version__

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def set_web_tools_disabled(self, disabled: bool, environment: BaseEnvironment) -> None:
        return None  # no web tools; the container's network is closed either way


class ReplayAgent(_HostAgent):
    """Writes the recorded answer ``<answers_dir>/<task name>.json`` to the submission path."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        logger: Any = None,
        *,
        answers_dir: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir, model_name, logger, **kwargs)
        self.answers_dir = Path(answers_dir)

    @staticmethod
    def name() -> str:
        return "medomni-replay"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        _, submission, _ = _paths(environment)
        source = self.answers_dir / f"{environment.environment_name}.json"
        context.n_input_tokens = context.n_output_tokens = 0
        context.cost_usd = 0.0
        if not source.is_file():
            raise NothingToReplay(f"nothing to replay for task {environment.environment_name}")
        meta = source.with_suffix(".run")
        context.metadata = {"replayed": meta.read_text().strip() if meta.is_file() else ""}
        await environment.upload_file(source, submission)


def _allowed_env(command: list[str], names: list[str], tmp: Path) -> dict[str, str]:
    """The command's environment, as the process runner builds it: an allowlist (PATH,
    HOME, LANG, MEDOMNI_*, PYTHONPATH for this interpreter, the names its config lists),
    never the harness's own credentials."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("MEDOMNI_")})
    if command[0] == sys.executable and "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update({k: os.environ[k] for k in names if k in os.environ})
    env["TMPDIR"] = str(tmp)
    return env


class CommandAgent(_HostAgent):
    """Runs ``command`` on the host against a copy of the workspace (see the module docstring).

    ``python``/``python3`` as the command's first word means this interpreter.
    """

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        logger: Any = None,
        *,
        command: list[str],
        env: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir, model_name, logger, **kwargs)
        if not command or not all(isinstance(c, str) for c in command):
            raise ValueError("CommandAgent needs command: a non-empty list of strings")
        first = sys.executable if command[0] in ("python", "python3") else command[0]
        self.command = [first, *command[1:]]
        self.env_names = list(env or [])

    @staticmethod
    def name() -> str:
        return "medomni-command"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        workspace, submission, perception = _paths(environment)
        rel = PurePosixPath(submission).relative_to(workspace)
        with tempfile.TemporaryDirectory(prefix="medomni-agent-") as tmp:
            mirror = Path(tmp) / "workspace"
            await environment.download_dir(workspace, mirror)
            answer = mirror.joinpath(*rel.parts)
            answer.parent.mkdir(parents=True, exist_ok=True)
            run_info = Path(tmp) / "run_info.json"
            env = {
                **_allowed_env(self.command, self.env_names, Path(tmp)),
                "MEDOMNI_WORKSPACE": str(mirror),
                "MEDOMNI_INSTRUCTION": str(mirror / "instruction.md"),
                "MEDOMNI_SUBMISSION": str(answer),
                "MEDOMNI_RUN_INFO": str(run_info),
            }
            env.pop("MEDOMNI_PERCEPTION_URL", None)
            async with contextlib.AsyncExitStack() as stack:
                if perception:
                    relay = await stack.enter_async_context(_Relay(environment, perception))
                    env["MEDOMNI_PERCEPTION_URL"] = relay.url
                from medomni_cas.bench._inotify import OpenWatcher

                watcher = stack.enter_context(OpenWatcher(mirror, ignore=_RESERVED))
                code, out, err = await _run(self.command, mirror, env)
                opened = [f for f in watcher.opened() if f != rel.as_posix()]
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            (self.logs_dir / "stdout.txt").write_bytes(out[-_LOG_LIMIT:])
            (self.logs_dir / "stderr.txt").write_bytes(err[-_LOG_LIMIT:])
            metadata: dict[str, Any] = {"files_opened": opened}
            _read_run_info(run_info, context, metadata)
            context.metadata = metadata
            if answer.is_file():
                await environment.upload_file(answer, submission)
        if code != 0:
            raise NonZeroAgentExitCodeError(f"agent command exited with status {code}")


async def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # a timeout kills the command's children too
    )
    try:
        out, err = await proc.communicate()
    except BaseException:  # Harbor's timeout cancels us: the command must not outlive the trial
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await proc.wait()
        raise
    return proc.returncode or 0, out, err


def _read_run_info(path: Path, context: AgentContext, metadata: dict[str, Any]) -> None:
    """What the command says its provider reported (as the process runner reads it)."""
    if not path.is_file():
        return
    try:
        info = json.loads(path.read_bytes())
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
        if "served_model" in info:
            metadata["served_model"] = str(info["served_model"])
        if info.get("tokens_in") is not None:
            context.n_input_tokens = int(info["tokens_in"])
        if info.get("tokens_out") is not None:
            context.n_output_tokens = int(info["tokens_out"])
        if info.get("cost_usd") is not None:
            cost = float(info["cost_usd"])
            if cost != cost or cost in (float("inf"), float("-inf")) or cost < 0:
                raise ValueError(f"cost_usd {cost!r} is not a cost")
            context.cost_usd = cost
    except (ValueError, TypeError) as e:
        metadata["errors"] = [f"MEDOMNI_RUN_INFO: unreadable: {e}"]


# -- the perception relay -------------------------------------------------------------------
# the gateway's own limit on a request body (medomni_cas.bench.perception.MAX_BODY)
_MAX_BODY = 64 * 1024
_POLL_SEC = 0.02  # how often the relay's serving loop looks for a shutdown


class _Relay:
    """``http://127.0.0.1:<port>`` on the host, each request replayed inside the container.

    A request becomes one ``exec`` of ``nc -w <t> <host> <port>`` (``perception 8899``, or
    the gateway's address on an egress allowlist) fed the raw HTTP/1.0 request, its path
    after the target's own (the trial's ``/t/<token>`` there); the raw response goes back as
    it came (status, headers, body). Requests are bounded (the gateway's own limit is
    64 KiB), so they travel in the command line.
    """

    def __init__(self, environment: BaseEnvironment, target: str) -> None:
        self.environment = environment
        parts = urlsplit(target)
        self.host = parts.hostname or "perception"
        self.port = parts.port or 80
        # a gateway reached directly (an egress allowlist) names the trial's token in the
        # URL's path (`/t/<token>`): each request's own path goes after it
        self.prefix = parts.path.rstrip("/")
        self.loop = asyncio.get_running_loop()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                return None

            def _relay(self) -> None:
                declared = self.headers.get("content-length") or "0"
                if not declared.isdigit() or int(declared) > _MAX_BODY:
                    # refused unread: the body would be buffered, then put on a command line
                    self.wfile.write(_error(413, f"request body over {_MAX_BODY} bytes"))
                    return
                size = int(declared)
                body = self.rfile.read(size) if size else b""
                raw = relay.forward(self.command, self.path, self.headers, body)
                self.wfile.write(raw)

            do_GET = do_POST = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(_POLL_SEC,), daemon=True
        )

    def forward(self, method: str, path: str, headers: Any, body: bytes) -> bytes:
        lines = [f"{method} {self.prefix}{path} HTTP/1.0", f"Host: {self.host}:{self.port}"]
        for key in ("content-type", "accept"):
            if headers.get(key):
                lines.append(f"{key.title()}: {headers[key]}")
        lines.append(f"Content-Length: {len(body)}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        b64 = base64.b64encode(request).decode()
        command = f"printf %s {b64} | base64 -d | nc -w 60 {self.host} {self.port}"
        future = asyncio.run_coroutine_threadsafe(
            self.environment.exec(command, timeout_sec=90, user="root"), self.loop
        )
        try:
            result = future.result(timeout=120)
        except Exception as e:
            return _error(502, f"perception relay: {e}")
        raw = (result.stdout or "").encode()  # the gateway answers UTF-8 JSON
        if result.return_code != 0 or not raw.startswith(b"HTTP/"):
            return _error(502, f"perception service unreachable: {result.stderr or result.stdout}")
        return raw

    async def __aenter__(self) -> _Relay:
        self.thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # in a thread: a shutdown waits for the serving loop, and on the event loop's thread
        # that wait held every other trial of the job (perception trials ran in lockstep,
        # at 0.54x the rate of those without: RESULTS.md, stop 29)
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _error(status: int, text: str) -> bytes:
    body = json.dumps({"error": text[:2000]}).encode()
    head = (
        f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body
