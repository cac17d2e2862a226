"""Opening a store by URL: scheme -> backend class, found lazily through entry points.

``memory://`` (this process only), ``lmdb://PATH`` (the embedded default), ``file://PATH``
(a git-like folder of files) and any other fsspec URL (``s3://bucket/prefix``, ``gs://…``).
Third-party backends register a class with a ``from_url`` classmethod in the
``medomni.backends`` entry point group under their scheme.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import yaml

from medomni_cas.store.backend import Backend
from medomni_cas.store.store import Store

__all__ = ["DEFAULT_STORE_URL", "default_store_url", "open_backend", "open_store"]

DEFAULT_STORE_URL = "lmdb://./.medomni/store"
WORKSPACE_FILE = "workspace.yaml"

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
    for ep in entry_points(group="medomni.backends"):
        if ep.name == scheme:
            return ep.load()
    if scheme in _BUILTIN:
        return _load(_BUILTIN[scheme])
    return _load(_FSSPEC)


def default_store_url(start: str | Path = ".") -> str:
    """The store of the workspace in ``start`` (its workspace.yaml), else the default."""
    ws = Path(start) / WORKSPACE_FILE
    if ws.is_file():
        data = yaml.safe_load(ws.read_text()) or {}
        url = data.get("store") if isinstance(data, dict) else None
        if url is not None:
            if not isinstance(url, str):
                raise ValueError(f"{ws}: field 'store' must be a URL string")
            if url.startswith("lmdb://") and not url.startswith("lmdb:///"):
                # relative paths in a workspace file are relative to that file
                rel = url.removeprefix("lmdb://")
                return "lmdb://" + str((ws.parent / rel).resolve())
            return url
    return DEFAULT_STORE_URL


def open_backend(url: str, *, create: bool = True) -> Backend:
    if "://" not in url:
        raise ValueError(f"not a store URL (expected scheme://…): {url!r}")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if not create and scheme in ("lmdb", "file"):
        path = Path(rest.split("?", 1)[0]).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"no store at {url} (create one with `medomni cas init`)")
    cls = _backend_class(scheme)
    return cls.from_url(url)  # type: ignore[attr-defined]


def open_store(
    url: str | None = None, *, single_writer: bool = False, create: bool = True
) -> Store:
    """Open the store at ``url``; with none, the workspace's store, else
    ``lmdb://./.medomni/store``. With ``create=False`` a local store must already exist."""
    backend = open_backend(url or default_store_url(), create=create)
    return Store(backend, single_writer=single_writer)
