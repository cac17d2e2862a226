"""A Harbor environment on the docker SDK: a closed network, and the perception relay.

Harbor loads it through ``environment.import_path`` =
``medomni_harbor.environment:MedomniDockerEnvironment``; it needs no ``docker compose``.
Per trial it starts:

* when the task attaches the perception service (``[metadata.medomni.perception]`` in its
  ``task.toml``), the trial's **relay**: the relay image (a static binary on the busybox
  base, no host mounts) with ``--network none`` and ``--add-host perception:127.0.0.1``,
  listening on port 8899 and forwarding each request, with the trial's token, through a unix
  socket in the job's named volume to the job's gateway (`medomni_harbor.gateway`), where
  the trial's budget, family filter and call log are kept. A relay serves one trial at a
  time and is kept for the job's next trial once its trial's container is gone: its token
  is a file in its own file system (`RELAY_TOKEN_FILE`, which the agent's container does
  not share), written when a trial takes it, so it holds one trial's token at a time (the
  last trial's, revoked at the gateway, until the next takes it; a new relay refuses every
  request until then). A container's start and removal cost about 300 ms of CPU on a local
  engine: a relay per trial was about a quarter of a short trial's cost. The job's relays
  are removed with it;
* the agent's container from the task's ``docker_image``, with ``sleep infinity`` as its main
  process (under ``--init``), the task's cpus and memory as hard limits, and either
  ``--network container:<relay>`` (it shares the relay's loopback, so
  ``http://perception:8899`` answers and nothing else does) or ``--network none``.

Neither container has any interface but ``lo`` nor any route: this does not depend on the
engine's iptables (a Docker ``--internal`` network does, and leaks without them). Commands run
as ``bash -c``; files move as tar archives (``put_archive``/``get_archive``). When the trial
stops, its token is revoked, its call log and served-encoder list go to
``<trial>/perception/``, the agent's container is removed and the relay kept (or removed,
when the agent's container could not be, or the job is over). Containers carry the owning process
in a label, so a later run removes what a killed one left behind
(`medomni_harbor._docker.remove_stale`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)

from medomni_harbor import _docker, gateway
from medomni_harbor.gateway import PERCEPTION_DIR, RELAY_MOUNT, RELAY_SOCKET, perception_of

__all__ = [
    "PERCEPTION_DIR",
    "PERCEPTION_PORT",
    "ContainerFailure",
    "MedomniDockerEnvironment",
    "perception_of",
]

PERCEPTION_PORT = 8899
# Go's os.FileMode bits, as the engine's stat reports them
_MODE_DIR = 1 << 31
_MODE_SYMLINK = 1 << 27
_MODE_TYPE = _MODE_DIR | _MODE_SYMLINK | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
_LOG_TAIL = 256 * 1024
#: in the relay's own file system (the agent's container shares only its network)
RELAY_TOKEN_FILE = "/run/medomni-relay/token"


class ContainerFailure(RuntimeError):
    """The engine failed under a trial (it died, a container vanished): the infrastructure's
    failure, never the agent's, whatever phase it happened in."""


async def _engine(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn`` in the engine's thread pool; engine failures become `ContainerFailure` (a
    missing path stays ``docker.errors.NotFound`` for the caller to answer)."""
    import docker
    import requests

    try:
        return await _docker.in_thread(fn, *args, **kwargs)
    except docker.errors.NotFound:
        raise
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        raise ContainerFailure(f"the Docker engine failed: {e}") from e


def _name(session_id: str, role: str) -> str:
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in session_id)
    return f"mdh-{safe}-{role}"[:120]


class MedomniDockerEnvironment(BaseEnvironment):
    """One trial's containers on a Docker engine (see the module docstring).

    Keyword arguments (Harbor's ``environment.kwargs``): ``docker_host`` (default
    ``$DOCKER_HOST``), ``relay_image`` (needed when a task attaches the service),
    ``relay_cpus`` and ``relay_memory_mb`` (the relay's own limits), ``health_timeout_sec``
    (how long the relay may take to listen). A task that attaches the service runs only
    inside a job whose gateway is open in this process (`medomni_harbor.gateway`).
    """

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: Any,
        task_env_config: Any,
        logger: Any = None,
        *args: Any,
        docker_host: str | None = None,
        relay_image: str | None = None,
        relay_cpus: float = 0.25,
        relay_memory_mb: int = 32,
        health_timeout_sec: float = 60.0,
        **kwargs: Any,
    ) -> None:
        self._host = _docker.docker_host(docker_host)
        self._task_dir = Path(environment_dir).parent
        self._perception = perception_of(self._task_dir)
        self._relay_image = relay_image
        self._relay_cpus = relay_cpus
        self._relay_memory_mb = relay_memory_mb
        self._health_timeout = health_timeout_sec
        self._main: Any = None
        self._relay: Any = None
        self._relay_since = 0  # when this trial took its relay (its part of the relay's log)
        self._gateway: gateway.JobGateway | None = None
        super().__init__(
            environment_dir,
            environment_name,
            session_id,
            trial_paths,
            task_env_config,
            logger,
            *args,
            **kwargs,
        )

    # -- what Harbor asks of an environment ------------------------------------------------
    @staticmethod
    def type() -> str:
        return "medomni-docker"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # no-network is enforced (network none, or the relay's loopback-only namespace)
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    def _validate_definition(self) -> None:
        if not self.task_env_config.docker_image:
            raise FileNotFoundError(
                f"{self.environment_dir.parent}: [environment].docker_image is required by "
                "the medomni-docker environment (it builds no Dockerfile)"
            )

    @property
    def perception_attached(self) -> bool:
        return self._perception is not None

    @property
    def workdir(self) -> str:
        return self.task_env_config.workdir or "/workspace"

    # -- start and stop ----------------------------------------------------------------------
    async def start(self, force_build: bool) -> None:
        try:
            await _engine(self._start)
        except BaseException:
            await _docker.in_thread(self._remove, True)
            raise

    def _labels(self, role: str) -> dict[str, str]:
        return {
            _docker.LABEL: role,
            _docker.OWNER_LABEL: _docker.owner(),
            "medomni-harbor.session": self.session_id,
            "medomni-harbor.trial-dir": str(self.trial_paths.trial_dir),
        }

    def _limits(self, cpus: float | None, memory_mb: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if cpus:
            out["nano_cpus"] = int(float(cpus) * 1e9)
        if memory_mb:
            out["mem_limit"] = f"{int(memory_mb)}m"
            out["memswap_limit"] = f"{int(memory_mb)}m"  # no swap beyond the limit
        return out

    def _start(self) -> None:
        c = _docker.client(self._host)
        network = "none"
        if self._perception is not None:
            self._start_relay(c)
            network = f"container:{self._relay.id}"
        cpus = self._resource_limit_value("cpu", auto_mode=_limit_mode())
        memory = self._resource_limit_value("memory", auto_mode=_limit_mode())
        self._main = c.containers.create(
            self.task_env_config.docker_image,
            command=["sleep", "infinity"],
            init=True,
            name=_name(self.session_id, "main"),
            working_dir=self.workdir,
            environment=self._startup_env(),
            network_mode=network,
            labels=self._labels("main"),
            **self._limits(cpus, memory),
        )
        # Harbor's folders, then the task's files into the working folder, before it starts
        logs = [("logs", 0o755)] + [
            (f"logs/{d}", 0o777) for d in ("agent", "verifier", "artifacts")
        ]
        self._main.put_archive("/", _docker.tar_dirs([*logs, ("tests", 0o755)]))
        if self._upload_environment_dir():
            self._main.put_archive(self.workdir, _docker.tar_tree(self.environment_dir))
        self._main.start()

    def _upload_environment_dir(self) -> bool:
        from harbor.environments.definition import should_upload_environment_dir

        return self._enable_environment_dir_upload and should_upload_environment_dir(
            self.environment_dir, docker_image=self.task_env_config.docker_image
        )

    def _start_relay(self, c: Any) -> None:
        """The trial's token from the job's gateway, and its relay, listening."""
        if not self._relay_image:
            raise RuntimeError(
                "the task attaches the perception service, but the environment has no "
                "relay_image (environment.kwargs)"
            )
        job = gateway.lookup(self._task_dir)
        if job is None or not job.volume:
            raise RuntimeError(
                f"the task {self._task_dir.name} attaches the perception service, but no job "
                "gateway is open for it in this process (run it with the harbor runner)"
            )
        token = job.open(self._task_dir)
        self._gateway = job
        relay = _alive(job.take_relay())
        if relay is None:  # none kept by an earlier trial of the job: a new one
            relay = c.containers.create(
                c.images.get(self._relay_image).id,
                # the token is read from a file at each request: the relay serves the job's
                # trials one after another, each with its own token (see `_remove`)
                command=[
                    "medomni-relay",
                    "relay",
                    str(PERCEPTION_PORT),
                    RELAY_SOCKET,
                    f"@{RELAY_TOKEN_FILE}",
                ],
                name=f"{job.forwarder.name}-relay-{os.urandom(4).hex()}",
                network_mode="none",
                extra_hosts={"perception": "127.0.0.1"},
                volumes={job.volume: {"bind": RELAY_MOUNT, "mode": "ro"}},
                labels=job.labels("perception"),  # the job's, not a trial's: it serves several
                **self._limits(self._relay_cpus, self._relay_memory_mb),
            )
            relay.start()
            gateway.wait_ready(relay, self._health_timeout, "the perception relay")
        self._relay_since = int(time.time())
        try:
            relay.put_archive("/", _token_tar(token))
        except BaseException:  # not this trial's, nor kept for another
            with contextlib.suppress(Exception):
                relay.remove(force=True)
            raise
        self._relay = relay

    async def stop(self, delete: bool) -> None:
        await _docker.in_thread(self._remove, delete)

    def _remove(self, delete: bool) -> None:
        job = self._gateway
        if job is not None:  # its token ends first: nothing left running can call
            with contextlib.suppress(Exception):
                job.close(self._task_dir.name, self.trial_paths.trial_dir)
            self._gateway = None
        if self._relay is not None:
            with contextlib.suppress(Exception):
                log = self._relay.logs(since=self._relay_since)
                folder = self.trial_paths.trial_dir / PERCEPTION_DIR
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "relay.log").write_bytes(log[-_LOG_TAIL:])
        main_gone = self._main is None
        if self._main is not None:  # the agent first: it uses the relay's network
            with contextlib.suppress(Exception):
                if delete:
                    self._main.remove(force=True)
                    main_gone = True
                else:
                    self._main.kill()
        # the relay is kept for the job's next trial when it can be: nothing of this one is
        # left in its network namespace, and the token it holds is revoked at the gateway
        # (a request with it is refused and credited to no trial) until the next writes its own
        relay = self._relay
        if relay is not None:
            kept = delete and main_gone and job is not None and job.give_back_relay(relay)
            if not kept:
                with contextlib.suppress(Exception):
                    if delete:
                        relay.remove(force=True)
                    else:
                        relay.kill()
        if delete:
            self._main = self._relay = None

    # -- commands and files ----------------------------------------------------------------
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if self._main is None:
            raise RuntimeError("the environment is not started")
        merged = self._merge_env(env)
        who = self._resolve_user(user)
        api = _docker.client(self._host).api
        created = await _engine(
            api.exec_create,
            self._main.id,
            ["bash", "-c", command],
            environment=merged,
            workdir=cwd or self.workdir,
            user=str(who) if who is not None else "",
        )
        exec_id = created["Id"]

        def run() -> ExecResult:
            out, err = api.exec_start(exec_id, demux=True)
            code = api.exec_inspect(exec_id)["ExitCode"]
            return ExecResult(
                stdout=(out or b"").decode(errors="replace"),
                stderr=(err or b"").decode(errors="replace"),
                return_code=code if code is not None else -1,
            )

        import asyncio

        try:
            return await asyncio.wait_for(_engine(run), timeout=timeout_sec)
        except TimeoutError:
            await _docker.in_thread(self._kill_exec, api, exec_id)
            return ExecResult(stdout="", stderr=f"timed out after {timeout_sec} s", return_code=124)

    def _kill_exec(self, api: Any, exec_id: str) -> None:
        """A command past its timeout: kill it (its pid is in the host's namespace, so only
        an engine on this machine can be reached this way; elsewhere it ends with the trial)."""
        with contextlib.suppress(Exception):
            pid = api.exec_inspect(exec_id).get("Pid")
            if pid and self._host.startswith("unix://"):
                os.kill(int(pid), 9)

    async def _mkdir(self, path: str) -> None:
        await self.exec(f"mkdir -p {shlex.quote(path)}", user="root")

    async def _put(self, folder: str, data: bytes) -> None:
        import docker

        try:
            await _engine(self._main.put_archive, folder, data)
        except docker.errors.NotFound:
            await self._mkdir(folder)
            await _engine(self._main.put_archive, folder, data)

    def _stat(self, path: str) -> dict[str, Any] | None:
        """The engine's stat of ``path`` in the agent's container (a HEAD request, no exec:
        a few ms instead of a process), or None when there is nothing there."""
        import base64

        api = _docker.client(self._host).api
        r = api.head(api._url("/containers/{0}/archive", self._main.id), params={"path": path})
        if r.status_code == 404:
            return None
        r.raise_for_status()
        stat: dict[str, Any] = json.loads(
            base64.b64decode(r.headers["X-Docker-Container-Path-Stat"])
        )
        return stat

    async def _kind(self, path: str, user: str | int | None, *, want_dir: bool) -> bool:
        stat = await _engine(self._stat, path)
        if stat is None:
            return False
        mode = int(stat.get("mode", 0))
        if mode & _MODE_SYMLINK:  # `test` follows links: let it
            check = super().is_dir if want_dir else super().is_file
            return await check(path, user=user)
        if want_dir:
            return bool(mode & _MODE_DIR)
        return not mode & _MODE_TYPE

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        return await self._kind(path, user, want_dir=True)

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        return await self._kind(path, user, want_dir=False)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = PurePosixPath(target_path)
        if target_path.endswith("/") or await self.is_dir(target_path, user="root"):
            folder, name = str(target), Path(source_path).name
        else:
            folder, name = str(target.parent), target.name
        await self._put(folder, _docker.tar_file(Path(source_path), name))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._put(target_dir, _docker.tar_tree(Path(source_dir)))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        import docker

        try:
            chunks, _ = await _engine(self._main.get_archive, source_path)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{source_path} is not in the container") from None
        await _engine(_docker.extract_file, chunks, Path(target_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        import docker

        try:
            chunks, _ = await _engine(self._main.get_archive, source_dir)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{source_dir} is not in the container") from None
        await _engine(_docker.extract_tree, chunks, Path(target_dir))


def _token_tar(token: str) -> bytes:
    """The relay's token file, as one ``put_archive("/")``."""
    path = PurePosixPath(RELAY_TOKEN_FILE.lstrip("/"))
    return _docker.tar_dirs(
        [(str(path.parent), 0o700)], [(str(path), f"{token}\n".encode(), 0o600)]
    )


def _alive(ctr: Any) -> Any:
    """``ctr`` if it is still running (a kept relay may have died), else None (removed)."""
    if ctr is None:
        return None
    try:
        ctr.reload()
        if ctr.status == "running":
            return ctr
    except Exception:
        pass
    with contextlib.suppress(Exception):
        ctr.remove(force=True)
    return None


def _limit_mode() -> Any:
    from harbor.models.trial.config import ResourceMode

    return ResourceMode.LIMIT
