"""One LMDB environment per path per process, shared by every backend opened on it.

LMDB refuses a second ``lmdb.open`` of a path that is open in the same process ("already
open in this process"), and two environments on one file in one process would break its
locks anyway. So every `LMDBBackend` on a path holds a reference to one `SharedEnv`:
opening the path again shares it, and closing the last holder closes it.

The first opener's settings (``durable``, ``map_size``) make the environment. A later
holder that asks for durability the environment lacks flushes it itself after each write
(`SharedEnv.durable` tells). A child made by ``fork`` is never handed its parent's
environment (LMDB forbids using it there); it gets py-lmdb's own refusal instead, as
before sharing: helper processes are started afresh, not forked.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import lmdb

__all__ = ["SharedEnv", "acquire", "open_count"]

_LOCK = threading.Lock()
_OPEN: dict[str, SharedEnv] = {}


class SharedEnv:
    """An open environment with its three databases, and how many backends hold it."""

    def __init__(self, key: str, env: lmdb.Environment, *, durable: bool) -> None:
        self.key = key
        self.env = env
        self.durable = durable
        self.objects = env.open_db(b"objects")
        self.refs = env.open_db(b"refs")
        self.reflog = env.open_db(b"reflog")
        self.pid = os.getpid()
        self.holders = 1

    def release(self) -> None:
        """Drop one holder; the last one closes the environment."""
        with _LOCK:
            self.holders -= 1
            if self.holders > 0:
                return
            if _OPEN.get(self.key) is self:
                del _OPEN[self.key]
        self.env.close()


def acquire(path: Path, *, durable: bool, map_size: int) -> SharedEnv:
    """The environment at ``path`` (a folder, created if absent), opened or shared."""
    path.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(path)
    with _LOCK:
        shared = _OPEN.get(key)
        if shared is not None and shared.pid == os.getpid():
            shared.holders += 1
            return shared
        existing = path / "data.mdb"
        if existing.exists():
            map_size = max(map_size, existing.stat().st_size * 2)
        env = lmdb.open(
            key,
            map_size=map_size,
            max_dbs=8,
            sync=durable,
            metasync=durable,
            readahead=False,
            max_readers=512,
        )
        shared = _OPEN[key] = SharedEnv(key, env, durable=durable)
        return shared


def open_count(path: str | os.PathLike[str]) -> int:
    """How many backends of this process hold the environment at ``path`` (0: closed)."""
    with _LOCK:
        shared = _OPEN.get(os.path.realpath(path))
        return 0 if shared is None or shared.pid != os.getpid() else shared.holders
