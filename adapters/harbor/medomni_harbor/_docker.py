"""The docker SDK, shared: one client per engine, a thread pool for its blocking calls, tars.

The SDK is synchronous; Harbor's environments are async. Every engine call runs in `EXECUTOR`
(sized for many concurrent trials, so a slow ``exec`` of one trial never starves another).
"""

from __future__ import annotations

import asyncio
import functools
import io
import os
import socket
import tarfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from medomni_cas.store.host import pid_alive

__all__ = [
    "EXECUTOR",
    "LABEL",
    "OWNER_LABEL",
    "client",
    "docker_host",
    "extract_file",
    "extract_tree",
    "in_thread",
    "owner",
    "remove_stale",
    "tar_dirs",
    "tar_file",
    "tar_tree",
]

#: Every container this plug-in starts carries it, with the run that owns it in OWNER_LABEL.
LABEL = "medomni-harbor"
OWNER_LABEL = "medomni-harbor.owner"

EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="medomni-docker")
_clients: dict[str, Any] = {}
_lock = threading.Lock()


def docker_host(host: str | None = None) -> str:
    """The engine to use: ``host``, else ``$DOCKER_HOST``, else the default socket."""
    return host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def client(host: str | None = None) -> Any:
    """A docker SDK client for ``host`` (shared: clients are thread-safe)."""
    import docker

    url = docker_host(host)
    with _lock:
        c = _clients.get(url)
        if c is None:
            c = _clients[url] = docker.DockerClient(base_url=url, timeout=300, max_pool_size=64)
        return c


async def in_thread[T](fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(EXECUTOR, functools.partial(fn, *args, **kwargs))


def owner() -> str:
    """``<hostname> <pid>``: who started a container, so a later run can tell it is stale."""
    return f"{socket.gethostname()} {os.getpid()}"


def _alive(label: str) -> bool:
    try:
        host, pid = label.split()
    except ValueError:
        return False
    if host != socket.gethostname():
        return True  # another machine's: never ours to remove
    if not pid.isdecimal():
        return True  # not a pid we can check: kept
    return pid_alive(int(pid))


def remove_stale(host: str | None = None) -> list[str]:
    """Remove containers (and named volumes) of this plug-in whose owning process (on this
    host) is gone, as a killed run leaves them (``sleep infinity`` never ends). Returns their
    names."""
    c = client(host)
    removed = []
    # another run on a shared engine may remove its containers while we list them
    for ctr in c.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True):
        if not _alive(ctr.labels.get(OWNER_LABEL, "")):
            try:
                ctr.remove(force=True)
                removed.append(ctr.name)
            except Exception:  # removed meanwhile by its own run: fine
                pass
    # the job gateways' named volumes (the relays' socket), once no container uses them
    for vol in c.volumes.list(filters={"label": LABEL}):
        if not _alive((vol.attrs.get("Labels") or {}).get(OWNER_LABEL, "")):
            try:
                vol.remove(force=True)
                removed.append(vol.name)
            except Exception:
                pass
    return removed


# -- tars ------------------------------------------------------------------------------------
def _clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def tar_tree(folder: Path) -> bytes:
    """The files and folders under ``folder`` (not the folder itself), owned by root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(
                path, arcname=path.relative_to(folder).as_posix(), recursive=False, filter=_clean
            )
    return buf.getvalue()


def tar_file(source: Path, name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(source, arcname=name, recursive=False, filter=_clean)
    return buf.getvalue()


def tar_dirs(
    dirs: Iterable[tuple[str, int]], files: Iterable[tuple[str, bytes, int]] = ()
) -> bytes:
    """Empty folders (path relative to /, mode), parents first, then ``files`` (path, bytes,
    mode) in them, for one ``put_archive("/")``; owned by root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in dirs:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            tar.addfile(info)
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _stream(chunks: Iterable[bytes]) -> io.BytesIO:
    return io.BytesIO(b"".join(chunks))


def extract_file(chunks: Iterable[bytes], target: Path) -> None:
    """The one regular file of a ``get_archive`` stream, written to ``target``."""
    with tarfile.open(fileobj=_stream(chunks), mode="r|") as tar:
        for member in tar:
            if member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(f.read())
                return
    raise FileNotFoundError(f"no regular file in the archive for {target.name}")


def extract_tree(chunks: Iterable[bytes], target: Path) -> None:
    """A ``get_archive`` stream of a folder, its top folder stripped, into ``target``;
    ``tarfile``'s data filter refuses anything that would land outside it."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=_stream(chunks), mode="r|") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts[1:]
            if not parts or member.isdev() or member.isfifo():
                continue
            member.name = PurePosixPath(*parts).as_posix()
            if member.islnk():
                continue  # hard links into the stripped tree: skip rather than mis-resolve
            try:
                tar.extract(member, target, filter="data")
            except tarfile.FilterError:
                continue  # an absolute or escaping link the agent made: not copied out
