"""Porcelain push and pull: a store to and from a workspace's remotes (folded into
`medomni_cas.porcelain` when the two are merged).

A remote is named as in ``workspace.yaml``'s ``remotes:`` (default ``origin``, or the only
one), given as a store URL, or given as an open `Store`. A remote opened here is closed
here; the local store is the caller's. ``progress`` is called with a `SyncProgress` as
objects move. The rules for which refs move are `medomni_cas.store.sync`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from medomni_cas.store import sync
from medomni_cas.store.store import Store
from medomni_cas.store.url import open_store
from medomni_cas.workspace import Workspace

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from medomni_cas.store.sync import SyncProgress, SyncReport

__all__ = ["pull", "push"]

Remote = str | Store | None


def _remote(
    remote: Remote, workspace: Workspace | str | Path, **options: bool
) -> AbstractContextManager[Store]:
    if isinstance(remote, Store):
        return nullcontext(remote)  # the caller's: not closed here
    ws = workspace if isinstance(workspace, Workspace) else Workspace.load(workspace)
    return open_store(ws.remote_url(remote), **options)


def push(
    store: Store,
    remote: Remote = None,
    refs: Sequence[str] | None = None,
    *,
    workspace: Workspace | str | Path = ".",
    force: bool = False,
    progress: Callable[[SyncProgress], None] | None = None,
    single_writer: bool = False,
) -> SyncReport:
    """Send ``refs`` (default: all of ``store``'s) and what they reach to ``remote``.

    ``single_writer`` opens the remote allowing ref updates without conditional writes."""
    with _remote(remote, workspace, single_writer=single_writer) as dst:
        return sync.push(store, dst, refs, force=force, progress=progress)


def pull(
    store: Store,
    remote: Remote = None,
    refs: Sequence[str] | None = None,
    *,
    workspace: Workspace | str | Path = ".",
    force: bool = False,
    progress: Callable[[SyncProgress], None] | None = None,
) -> SyncReport:
    """Fetch ``refs`` (default: all of the remote's) and what they reach into ``store``.

    The remote must exist: pulling from a mistyped local path is an error, not an empty
    store."""
    with _remote(remote, workspace, create=False) as src:
        return sync.pull(store, src, refs, force=force, progress=progress)
