"""The job's perception gateway: one server per Harbor job, each trial's state under its token.

The harness serves one `Tokens` router (`medomni_cas.bench.perception`) for the whole job, on
its own side; each trial that attaches the service gets a `Gateway` of its own (the task's
staged families, its call budget, its call log) under a fresh unguessable token, issued when
the trial starts (`JobGateway.open`) and revoked when it ends (`JobGateway.close`): a request
with an unknown or finished token is refused (403) and credited to no trial, and a trial's
calls count against its own budget only. On close, the trial's calls and the encoders served
go to ``<trial>/perception/`` (``calls.jsonl``, ``encoders.json``), as the runner reads them.

How a trial's container reaches it, on our docker environment::

    agent container --(lo only, shared)--> relay :8899 --(unix socket, named volume)-->
        forwarder (host network) --> 127.0.0.1:<gateway port>

The relay (``medomni-relay relay``, `medomni_harbor.images`) runs in the network namespace the
agent's container joins, for one trial at a time (the job keeps it for its next trial:
`take_relay`, `give_back_relay`): it has only ``lo`` and no route, and it knows only the
token of the trial it serves and the socket's path. The forwarder (``medomni-relay
forward``) runs once per job, with the host's network, and listens on a unix socket in a
Docker named volume the relays mount read-only: the relays reach the gateway through a
file, never a network route. No host folder is mounted anywhere. `medomni_harbor.compose`
renders the same topology as a task's ``docker-compose.yaml`` (relay, forwarder and
``main`` per trial).

Environments find their job's gateway through `lookup`, by the task folder (Harbor builds
environments from its own configuration, which holds no Python objects).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from medomni_cas.bench.perception import Gateway, Tokens, serve
from medomni_harbor import _docker

__all__ = [
    "PERCEPTION_DIR",
    "RELAY_MOUNT",
    "RELAY_SOCKET",
    "JobGateway",
    "lookup",
    "perception_of",
    "write_trial_files",
]

PERCEPTION_DIR = "perception"  # in the trial folder: encoders.json, calls.jsonl
RELAY_MOUNT = "/relay"  # where the named volume is, in the relay and forwarder containers
RELAY_SOCKET = f"{RELAY_MOUNT}/gateway.sock"

_jobs: dict[Path, JobGateway] = {}
_jobs_lock = threading.Lock()


def perception_of(task_dir: Path) -> dict[str, Any] | None:
    """The perception block of a rendered task (``[metadata.medomni.perception]``), if any."""
    import tomllib

    path = task_dir / "task.toml"
    if not path.is_file():
        return None
    meta = tomllib.loads(path.read_text()).get("metadata", {}).get("medomni", {})
    block = meta.get("perception")
    return dict(block) if block else None


def lookup(task_dir: Path) -> JobGateway | None:
    """The gateway of the job whose tasks folder holds ``task_dir``, if one is open here."""
    with _jobs_lock:
        return _jobs.get(Path(task_dir).resolve().parent)


@dataclass
class _Open:
    token: str
    gateway: Gateway
    opened: float = field(default_factory=time.monotonic)


def write_trial_files(gateway: Gateway, trial_dir: Path) -> None:
    """The trial's call log and served encoders, where the runner reads them."""
    folder = trial_dir / PERCEPTION_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "calls.jsonl").write_bytes(
        b"".join(msgspec.json.encode(c) + b"\n" for c in list(gateway.calls))
    )
    served = {"gateway": "job", "encoders": gateway.listing()}
    (folder / "encoders.json").write_text(json.dumps(served, indent=2) + "\n")


class JobGateway:
    """One job's gateway server, its trials' gateways by token, and (on our docker
    environment) the forwarder container and named volume the trials' relays use.

    ``host``/``port`` are where the server listens (loopback by default: the forwarder has
    the host's network); ``address`` is what a forwarder or an agent outside this machine
    connects to (default: the bound host and port).
    """

    def __init__(
        self,
        tasks_root: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        address: str | None = None,
    ) -> None:
        self.tasks_root = Path(tasks_root).resolve()
        self.tokens = Tokens()
        self._host, self._port, self._address = host, port, address
        self._stack = contextlib.ExitStack()
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()
        self.url = ""
        self.volume = ""
        self.forwarder: Any = None
        # relays no trial holds now, kept for the job's next trials (a container's start
        # and removal cost about 300 ms of CPU, a quarter of a short trial's); none once
        # the job's containers are removed
        self._idle_relays: list[Any] | None = []

    # -- the server --------------------------------------------------------------------------
    def __enter__(self) -> JobGateway:
        try:
            self.url = self._stack.enter_context(serve(self.tokens, self._host, self._port))
            with _jobs_lock:
                _jobs[self.tasks_root] = self
            self._stack.callback(self._unregister)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            left = list(self._open)
        for name in left:  # trials Harbor never stopped: their tokens end with the job
            self.close(name, None)
        self._stack.close()

    def _unregister(self) -> None:
        with _jobs_lock:
            if _jobs.get(self.tasks_root) is self:
                del _jobs[self.tasks_root]

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) a forwarder connects to."""
        if self._address:
            host, _, port = self._address.rpartition(":")
            return host.strip("[]"), int(port)
        rest = self.url.split("://", 1)[1]
        host, _, port = rest.rpartition(":")
        return host.strip("[]"), int(port)

    # -- trials --------------------------------------------------------------------------------
    def open(self, task_dir: Path) -> str:
        """A fresh token for the trial of ``task_dir``, its gateway made from the task's
        staged files (``environment/``) and perception block; the token it had, if open."""
        task_dir = Path(task_dir)
        name = task_dir.name
        with self._lock:
            if name in self._open:
                return self._open[name].token
        block = perception_of(task_dir)
        if block is None:
            raise ValueError(f"{task_dir}: the task attaches no perception service")
        gateway = Gateway(
            task_dir / str(block.get("evidence", "environment")),
            list(block.get("families", [])),
            budget=int(block.get("budget", 0)),
            atom=str(block.get("atom", "")),
        )
        token = self.tokens.issue(gateway)
        with self._lock:
            self._open[name] = _Open(token, gateway)
        return token

    def close(self, task_name: str, trial_dir: Path | None) -> Gateway | None:
        """End the trial's token (its calls from now on are refused) and write its files
        into ``trial_dir``; its gateway, or None if it was not open."""
        with self._lock:
            state = self._open.pop(task_name, None)
        if state is None:
            return None
        self.tokens.revoke(state.token)
        if trial_dir is not None:
            write_trial_files(state.gateway, trial_dir)
        return state.gateway

    # -- relays kept for the job's trials (our docker environment) ---------------------------
    def take_relay(self) -> Any | None:
        """A relay container a finished trial gave back (still holding that trial's revoked
        token), or None."""
        with self._lock:
            return self._idle_relays.pop() if self._idle_relays else None

    def give_back_relay(self, ctr: Any) -> bool:
        """Keep ``ctr`` for a later trial of this job, removed when the job's gateway closes;
        False once it has closed (the caller removes ``ctr``)."""
        with self._lock:
            if self._idle_relays is None:
                return False
            self._idle_relays.append(ctr)
            return True

    def _remove_idle_relays(self) -> None:
        with self._lock:
            left, self._idle_relays = self._idle_relays or [], None
        for ctr in left:
            _remove_container(ctr)

    # -- the forwarder (our docker environment) ----------------------------------------------
    def labels(self, role: str) -> dict[str, str]:
        """The labels of a container or volume of this job (not of one trial), in ``role``:
        a later run removes what a killed one left behind (`_docker.remove_stale`)."""
        return {
            _docker.LABEL: role,
            _docker.OWNER_LABEL: _docker.owner(),
            "medomni-harbor.tasks": str(self.tasks_root),
        }

    def start_forwarder(self, docker_host: str | None, image: str, timeout: float = 60.0) -> None:
        """The job's forwarder container and its named volume, on the engine at
        ``docker_host``; removed when the job's gateway closes."""
        import blake3

        c = _docker.client(docker_host)
        key = blake3.blake3(f"{self.tasks_root} {self.url}".encode()).hexdigest()[:12]
        labels = self.labels("gateway")
        volume = c.volumes.create(name=f"mdh-gw-{key}", labels=labels)
        self.volume = volume.name
        self._stack.callback(_remove_volume, c, volume)
        host, port = self.address
        ctr = c.containers.create(
            image,
            command=["medomni-relay", "forward", RELAY_SOCKET, host, str(port)],
            name=f"mdh-gw-{key}",
            network_mode="host",
            volumes={volume.name: {"bind": RELAY_MOUNT, "mode": "rw"}},
            labels=labels,
            nano_cpus=int(0.5 * 1e9),
            mem_limit="64m",
        )
        self.forwarder = ctr
        self._stack.callback(_remove_container, ctr)
        # the relays kept go first: the volume is removed once no container mounts it
        self._stack.callback(self._remove_idle_relays)
        ctr.start()
        wait_ready(ctr, timeout, "the perception gateway's forwarder")


def wait_ready(ctr: Any, timeout: float, what: str) -> None:
    """Until the relay binary in ``ctr`` says it listens (its first line of output)."""
    from medomni_harbor.environment import ContainerFailure

    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        if b"medomni-relay: ready" in ctr.logs(stdout=True, stderr=False):
            return
        ctr.reload()
        if ctr.status not in ("created", "running"):
            tail = ctr.logs(tail=30).decode(errors="replace")
            raise ContainerFailure(f"{what} exited while starting:\n{tail}")
        if time.monotonic() > deadline:
            raise ContainerFailure(f"{what} did not start listening within {timeout} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _remove_container(ctr: Any) -> None:
    with contextlib.suppress(Exception):
        ctr.remove(force=True)


def _remove_volume(c: Any, volume: Any) -> None:
    for _ in range(50):  # removed once the last container using it is gone
        try:
            volume.remove(force=True)
            return
        except Exception:
            time.sleep(0.1)
    with contextlib.suppress(Exception):
        c.volumes.get(volume.name).remove(force=True)
