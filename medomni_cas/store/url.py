"""Opening a store by URL: scheme -> backend class, found lazily through entry points.

``memory://`` (this process only), ``lmdb://PATH`` (the embedded default), ``file://PATH``
(a git-like folder of files) and any other fsspec URL (``s3://bucket/prefix``, ``gs://…``).
Third-party backends register a class with a ``from_url`` classmethod in the
``medomni.backends`` entry point group under their scheme.

A remote store can be opened behind a local cache of its objects
(`medomni_cas.store.backends.cached`): ``open_store("s3://bucket/prefix", cache=True)``
keeps the cache in ``$XDG_CACHE_HOME/medomni/<hash of the URL>`` (``~/.cache`` by default);
``cache="lmdb://PATH"`` puts it elsewhere.

A workspace folder's ``workspace.yaml`` names its store and its remotes::

    store: lmdb://./.medomni/store
    remotes:
      origin: s3://bucket/prefix?endpoint_url=http://127.0.0.1:9000

Relative ``lmdb://`` and ``file://`` paths in it are relative to the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import blake3

from medomni_cas.store.backend import Backend
from medomni_cas.store.store import Store

__all__ = [
    "DEFAULT_STORE_URL",
    "default_cache_url",
    "default_store_url",
    "open_backend",
    "open_store",
    "read_workspace",
    "remote_url",
    "workspace_remotes",
    "workspace_store_url",
]

DEFAULT_STORE_URL = "lmdb://./.medomni/store"
WORKSPACE_FILE = "workspace.yaml"
DEFAULT_REMOTE = "origin"

_BUILTIN = {
    "memory": "medomni_cas.store.backends.memory:MemoryBackend",
    "lmdb": "medomni_cas.store.backends.lmdb:LMDBBackend",
    "file": "medomni_cas.store.backends.directory:DirectoryBackend",
}
_FSSPEC = "medomni_cas.store.backends.fsspec:FsspecBackend"


def _load(target: str) -> type[Backend]:
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _backend_class(scheme: str) -> type[Backend]:
    # imported here, like yaml below: importing the store (every command, every helper
    # process of a check) need not pay for reading the installed distributions
    from importlib.metadata import entry_points

    for ep in entry_points(group="medomni.backends"):
        if ep.name == scheme:
            return ep.load()
    if scheme in _BUILTIN:
        return _load(_BUILTIN[scheme])
    return _load(_FSSPEC)


# -- workspace.yaml --------------------------------------------------------------------------
def read_workspace(start: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """``start/workspace.yaml`` and its settings, or None without one."""
    ws = Path(start) / WORKSPACE_FILE
    if not ws.is_file():
        return None
    import yaml

    try:
        data = yaml.safe_load(ws.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{ws}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{ws}: expected a mapping at the top level")
    return ws, data


def _relative_to(ws: Path, url: str) -> str:
    """Relative local paths in a workspace file are relative to that file."""
    for scheme in ("lmdb://", "file://"):
        if url.startswith(scheme) and not url.startswith(scheme + "/"):
            rel, sep, query = url.removeprefix(scheme).partition("?")
            path = Path(rel).expanduser()
            return scheme + str((ws.parent / path).resolve()) + sep + query
    return url


def workspace_store_url(ws: Path, data: dict[str, Any]) -> str:
    """The ``store:`` of a read workspace file (local paths relative to it), else the default."""
    url = data.get("store")
    if url is None:
        return DEFAULT_STORE_URL
    if not isinstance(url, str):
        raise ValueError(f"{ws}: field 'store' must be a URL string")
    return _relative_to(ws, url) if url.startswith("lmdb://") else url


def default_store_url(start: str | Path = ".") -> str:
    """The store of the workspace in ``start`` (its workspace.yaml), else the default."""
    found = read_workspace(start)
    return DEFAULT_STORE_URL if found is None else workspace_store_url(*found)


def workspace_remotes(start: str | Path = ".") -> dict[str, str]:
    """The ``remotes:`` of the workspace in ``start``: name -> URL (empty without one)."""
    found = read_workspace(start)
    if found is None:
        return {}
    ws, data = found
    remotes = data.get("remotes") or {}
    if not isinstance(remotes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in remotes.items()
    ):
        raise ValueError(f"{ws}: field 'remotes' must map names to URL strings")
    return {name: _relative_to(ws, url) for name, url in remotes.items()}


def remote_url(name: str | None = None, start: str | Path = ".") -> str:
    """The URL of a remote: ``name`` as a URL if it has ``://``, else looked up in the
    workspace; with no name, ``origin`` or the workspace's only remote."""
    if name is not None and "://" in name:
        return name
    remotes = workspace_remotes(start)
    where = Path(start) / WORKSPACE_FILE
    if name is None:
        if DEFAULT_REMOTE in remotes:
            return remotes[DEFAULT_REMOTE]
        if len(remotes) == 1:
            return next(iter(remotes.values()))
        known = ", ".join(sorted(remotes)) or "none"
        raise ValueError(f"{where}: name a remote (known: {known}) or give a URL")
    if name not in remotes:
        known = ", ".join(sorted(remotes)) or "none"
        raise ValueError(f"{where}: no remote named {name!r} (known: {known})")
    return remotes[name]


# -- opening ---------------------------------------------------------------------------------
def default_cache_url(url: str) -> str:
    """Where ``open_store(url, cache=True)`` keeps its cache: one LMDB store per URL."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = blake3.blake3(url.encode()).hexdigest()[:16]
    return f"lmdb://{os.path.join(base, 'medomni', digest)}"


def open_backend(url: str, *, create: bool = True, cls: type[Backend] | None = None) -> Backend:
    """The backend at ``url``; with ``create=False`` a local store must already exist.
    ``cls``: the backend class, when the caller knows it (no lookup by scheme)."""
    if "://" not in url:
        raise ValueError(f"not a store URL (expected scheme://…): {url!r}")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if not create and scheme in ("lmdb", "file"):
        path = Path(rest.split("?", 1)[0]).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"no store at {url} (create one with `medomni cas init`)")
    if cls is None:
        cls = _backend_class(scheme)
    return cls.from_url(url)


def open_store(
    url: str | None = None,
    *,
    single_writer: bool = False,
    create: bool = True,
    cache: bool | str | None = None,
) -> Store:
    """Open the store at ``url``; with none, the workspace's store, else
    ``lmdb://./.medomni/store``. With ``create=False`` a local store must already exist.

    ``cache`` puts a local object cache in front (for remote stores): True for the default
    place (`default_cache_url`), or the URL of the cache store. Refs stay the remote's;
    objects written reach it when a ref is set to them (`CachedBackend`)."""
    backend = open_backend(url or default_store_url(), create=create)
    if cache:
        from collections.abc import Iterable

        from medomni_cas.store.backends.cached import CachedBackend
        from medomni_cas.store.sync import send

        def publish(source: Backend, remote: Backend, roots: Iterable[bytes]) -> int:
            return send(Store(source), Store(remote), roots).objects

        local_url = default_cache_url(backend.url) if cache is True else str(cache)
        try:
            backend = CachedBackend(open_backend(local_url), backend, publish=publish)
        except BaseException:
            backend.close()
            raise
    return Store(backend, single_writer=single_writer)
