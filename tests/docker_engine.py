"""A Docker engine for the Docker tests: an engine that answers already, else a private one.

The engine itself is scripted in `.ci/docker-engine` (install, start, stop, image); this module
only decides which engine to use and drives that script. Order of preference:

1. ``$DOCKER_HOST``, when an engine answers there;
2. the engine of ``make docker-engine`` (``.docker/`` in the repo), when it answers;
3. a private engine in a short temporary directory, one per pytest-xdist worker, started here
   and stopped (its directory removed) by :meth:`Engine.close`. This needs root and ``dockerd``.

Every engine gets the base image ``local/base:1`` (busybox-static + bash-static) and
``local/terminus:1`` (that and tmux, for Harbor's terminus-2), imported from the host's Debian
packages: no image registry is used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / ".ci" / "docker-engine"
MAKE_ENGINE_DIR = REPO / ".docker"
BASE_IMAGE = "local/base:1"
TERMINUS_IMAGE = "local/terminus:1"
REQUIRE_ENV = "MEDOMNI_REQUIRE_DOCKER"
SKIP_REASON = (
    "Docker tests need a Docker engine: run `make docker-engine` as root "
    "(installs docker.io from apt) or set DOCKER_HOST"
)


class EngineUnavailable(Exception):
    """No engine could be used or started; ``detail`` says why, ``log_tail`` shows dockerd's log."""

    def __init__(self, detail: str, log_tail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.log_tail = log_tail


@dataclass
class Engine:
    """A running engine: ``host`` is its DOCKER_HOST value, ``client`` a docker SDK client."""

    host: str
    client: Any  # docker.DockerClient
    image: str = BASE_IMAGE
    owned_dir: Path | None = None  # set when this process started the engine

    @property
    def owned(self) -> bool:
        return self.owned_dir is not None

    def close(self) -> None:
        """Close the client; stop the engine and remove its directory if it was started here."""
        try:
            self.client.close()
        finally:
            if self.owned_dir is not None:
                _script("stop", str(self.owned_dir), check=False, timeout=60)
                shutil.rmtree(self.owned_dir, ignore_errors=True)
                self.owned_dir = None


def required() -> bool:
    """True when a missing engine must fail the Docker tests instead of skipping them (CI)."""
    return os.environ.get(REQUIRE_ENV, "0").strip().lower() in {"1", "true", "yes"}


def _script(
    *args: str, check: bool = True, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise EngineUnavailable(
            f"`.ci/docker-engine {' '.join(args)}` failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    return proc


def _client(host: str) -> Any:
    try:
        import docker
    except ImportError as e:  # pragma: no cover - docker comes with the test extras
        raise EngineUnavailable(f"the docker SDK is not installed ({e})") from e
    return docker.DockerClient(base_url=host, timeout=120)


def answers(host: str) -> bool:
    """True when a Docker engine answers a ping at ``host``."""
    if not host:
        return False
    try:
        client = _client(host)
    except EngineUnavailable:
        raise
    except Exception:  # a malformed DOCKER_HOST, say
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def _ensure_image(host: str) -> None:
    _script("image", env={"DOCKER_HOST": host}, timeout=300)


def _log_tail(directory: Path, lines: int = 30) -> str:
    log = directory / "dockerd.log"
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _existing() -> Engine | None:
    host = os.environ.get("DOCKER_HOST", "")
    if host and answers(host):
        _ensure_image(host)
        return Engine(host=host, client=_client(host))
    if (MAKE_ENGINE_DIR / "run").exists() or (MAKE_ENGINE_DIR / "run-dir").exists():
        made = _script("host", str(MAKE_ENGINE_DIR), check=False).stdout.strip()
        if made and answers(made):
            _ensure_image(made)
            return Engine(host=made, client=_client(made))
    return None


def _why_not_startable() -> str | None:
    if shutil.which("dockerd") is None:
        return "no dockerd on PATH; `bash .ci/docker-engine install` installs it"
    if shutil.which("docker") is None:
        return "the docker client is not on PATH"
    if os.geteuid() != 0:
        return "starting a private dockerd needs root"
    return None


def start_private(worker: str = "") -> Engine:
    """Start a private engine in a fresh short directory under /tmp, with the base image."""
    why = _why_not_startable()
    if why:
        raise EngineUnavailable(why)
    # Short: the socket path must stay under ~107 bytes, containerd's sockets included.
    directory = Path(tempfile.mkdtemp(prefix=f"mdk-{worker or 'main'}-", dir="/tmp"))
    try:
        proc = _script("start", str(directory), check=False, timeout=120)
        if proc.returncode != 0:
            # The script's last line says why; dockerd's log is returned on its own.
            why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise EngineUnavailable(f"dockerd did not start: {why}", _log_tail(directory))
        host = proc.stdout.strip().splitlines()[-1]
        _ensure_image(host)
        return Engine(host=host, client=_client(host), owned_dir=directory)
    except BaseException as e:
        tail = _log_tail(directory)
        _script("stop", str(directory), check=False, timeout=60)
        shutil.rmtree(directory, ignore_errors=True)
        if isinstance(e, EngineUnavailable):
            if not e.log_tail:
                e.log_tail = tail
            raise
        if isinstance(e, Exception):
            raise EngineUnavailable(f"starting a private engine failed: {e!r}", tail) from e
        raise


def acquire(worker: str = "") -> Engine:
    """An engine to test against: one that answers already, else a private one started here."""
    engine = _existing()
    if engine is not None:
        return engine
    host = os.environ.get("DOCKER_HOST", "")
    try:
        return start_private(worker)
    except EngineUnavailable as e:
        if host:
            e.detail = f"DOCKER_HOST={host} does not answer, and {e.detail}"
        raise
