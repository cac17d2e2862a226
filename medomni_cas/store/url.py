"""Opening a store by URL: scheme -> backend class, found lazily through entry points.

``memory://`` (this process only), ``lmdb://PATH`` (the embedded default), ``file://PATH``
(a git-like folder of files) and any other fsspec URL (``s3://bucket/prefix``, ``gs://…``).
Third-party backends register a class with a ``from_url`` classmethod in the
``medomni.backends`` entry point group under their scheme.

A remote store can be opened behind a local cache of its objects
(`medomni_cas.store.backends.cached`): ``open_store("s3://bucket/prefix", cache=True)``
keeps the cache in ``$XDG_CACHE_HOME/medomni/<hash of the URL>`` (``~/.cache`` by default);
``cache="lmdb://PATH"`` puts it elsewhere.

This module takes URLs only: which store a folder uses (its ``workspace.yaml``, else
``lmdb://./.medomni/store``) is `medomni_cas.workspace`'s to say.
"""

from __future__ import annotations

import os
from typing import cast

import blake3

from medomni_cas.store.backend import Backend
from medomni_cas.store.store import Store

__all__ = ["LOCAL_SCHEMES", "default_cache_url", "local_path_problem", "open_backend", "open_store"]

_BUILTIN = {
    "memory": "medomni_cas.store.backends.memory:MemoryBackend",
    "lmdb": "medomni_cas.store.backends.lmdb:LMDBBackend",
    "file": "medomni_cas.store.backends.directory:DirectoryBackend",
}
_FSSPEC = "medomni_cas.store.backends.fsspec:FsspecBackend"
#: Schemes whose URL is a local path (relative ones are relative to a workspace's folder).
LOCAL_SCHEMES = ("lmdb://", "file://")


def _load(target: str) -> type[Backend]:
    import importlib

    module, _, name = target.partition(":")
    return cast("type[Backend]", getattr(importlib.import_module(module), name))


def _backend_class(scheme: str) -> type[Backend]:
    # imported here: importing the store (every command, every helper process of a check)
    # need not pay for reading the installed distributions
    from importlib.metadata import entry_points

    for ep in entry_points(group="medomni.backends"):
        if ep.name == scheme:
            return cast("type[Backend]", ep.load())  # what the group's entry points name
    if scheme in _BUILTIN:
        return _load(_BUILTIN[scheme])
    return _load(_FSSPEC)


# -- opening ---------------------------------------------------------------------------------
def default_cache_url(url: str) -> str:
    """Where ``open_store(url, cache=True)`` keeps its cache: one LMDB store per URL."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = blake3.blake3(url.encode()).hexdigest()[:16]
    return f"lmdb://{os.path.join(base, 'medomni', digest)}"


def local_path_problem(url: str) -> str | None:
    """Why a local store URL (``lmdb://``, ``file://``) is unusable: it names no path (which
    a workspace would read as its own folder); None when it is fine or not local."""
    for scheme in LOCAL_SCHEMES:
        if url.startswith(scheme) and not url.removeprefix(scheme).partition("?")[0]:
            return f"{url!r} needs a path: write {scheme}PATH, e.g. {scheme}./.medomni/store"
    return None


def open_backend(url: str, *, create: bool = True, cls: type[Backend] | None = None) -> Backend:
    """The backend at ``url``; with ``create=False`` a store must already be there
    (`Backend.open_at`). ``cls``: the backend class, when the caller knows it (no lookup
    by scheme)."""
    if "://" not in url:
        raise ValueError(f"not a store URL (expected scheme://…): {url!r}")
    if (problem := local_path_problem(url)) is not None:
        raise ValueError(problem)
    if cls is None:
        cls = _backend_class(url.split("://", 1)[0].lower())
    return cls.open_at(url, create=create)


def open_store(
    url: str,
    *,
    single_writer: bool = False,
    create: bool = True,
    cache: bool | str | None = None,
) -> Store:
    """Open the store at ``url``. With ``create=False`` a local store must already exist.

    ``cache`` puts a local object cache in front (for remote stores): True for the default
    place (`default_cache_url`), or the URL of the cache store. Refs stay the remote's;
    objects written reach it when a ref is set to them (`CachedBackend`)."""
    backend = open_backend(url, create=create)
    if cache:
        from collections.abc import Iterable

        from medomni_cas.store.backends.cached import CachedBackend
        from medomni_cas.store.sync import send

        def publish(source: Backend, remote: Backend, roots: Iterable[bytes]) -> int:
            # What the remote has is trusted here: checking it would read it through the
            # cache, which lacks most of it (pull and push check; fsck --repair mends)
            return send(Store(source), Store(remote), roots, present="trust").objects

        local_url = default_cache_url(backend.url) if cache is True else str(cache)
        try:
            backend = CachedBackend(open_backend(local_url), backend, publish=publish)
        except BaseException:
            backend.close()
            raise
    return Store(backend, single_writer=single_writer)
