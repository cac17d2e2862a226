"""A per-job local cache of what runners stage from a remote store (S3 and the like).

Staging an atom task reads its instruction and its evidence tree, object by object: on a
remote store a request or more per file. Objects are content-addressed and immutable, so
the runner may read them from a local copy: `staging_store` opens one (LMDB in a folder of
the run folder, which agents never see) in front of the remote (`CachedBackend`: what it
fetches is verified against its id before it is kept, and `Store` verifies it again on
every read), and `prefetch` fills it with the closure of a chunk's tasks in a few
batched reads (a level of the trees at a time; packed objects come as merged byte ranges).
The harness `remember`s there what it writes, so that the run folder (a view of the
job's records) is written without reading them back.
Refs are the remote's; a runner never writes to the store, and this one refuses to.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from medomni_cas.bench.runners import TrialSpec
from medomni_cas.errors import UnsupportedOperation
from medomni_cas.store import encoding
from medomni_cas.store.backend import Backend
from medomni_cas.store.backends.cached import CachedBackend
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.store.url import LOCAL_SCHEMES, open_backend

__all__ = ["prefetch", "remember", "staging_store"]

_BATCH = 4096  # objects asked for at once while prefetching


def _refuse(source: Backend, remote: Backend, roots: Iterable[bytes]) -> int:
    raise UnsupportedOperation("a runner's staging store is read-only: runners never write")


def _remote(store: Store) -> bool:
    return not store.url.startswith(LOCAL_SCHEMES) and not isinstance(store.backend, CachedBackend)


@contextmanager
def staging_store(store: Store, folder: Path) -> Iterator[Store]:
    """``store`` itself when it is local (or already cached), else a store over a fresh
    cache in a private folder made under ``folder`` and removed on the way out."""
    if not _remote(store):
        yield store
        return
    folder.mkdir(parents=True, exist_ok=True)
    where = Path(tempfile.mkdtemp(prefix=".stage-cache-", dir=folder))
    try:
        local = open_backend(f"lmdb://{where}")
        cached = Store(CachedBackend(local, store.backend, publish=_refuse))
        try:
            yield cached
        finally:
            local.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)


def remember(store: Store, items: Sequence[tuple[ObjectId, bytes]]) -> None:
    """Keep a copy of objects just written to the remote (their ids made from their
    bytes) in ``store``'s cache, so that the run folder, a view of them, is written
    without reading them back. A no-op on a store that is not cached."""
    if isinstance(store.backend, CachedBackend) and items:
        store.backend.local.put_many(items)


def prefetch(store: Store, trials: Sequence[TrialSpec]) -> int:
    """Read the closure of each trial's instruction and evidence through ``store`` (a
    `staging_store`), a level at a time; how many objects were read. A no-op on a store
    that is not cached."""
    if not isinstance(store.backend, CachedBackend):
        return 0
    seen: set[bytes] = set()
    level: list[ObjectId] = []
    for t in trials:
        level += [t.atom.instruction, t.atom.evidence]
    read = 0
    while level:
        level = [o for o in dict.fromkeys(level) if o not in seen]
        seen.update(level)
        nxt: list[ObjectId] = []
        for i in range(0, len(level), _BATCH):
            for _, data in store.get_raw_many(level[i : i + _BATCH]):
                read += 1
                nxt += encoding.links(data)  # none for a blob
        level = nxt
    return read
