"""Array families: opening a dataset's zarr hierarchy, from a folder or from a CAS store.

With ``ref``, the family lives in a medomni store (its chunks are content-addressed blobs,
identical chunks stored once) and its identity is the tree id the ref names: the rebuild
cache keys on that id instead of re-reading every chunk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import blake3
import zarr

from medomni_cas.errors import NotFound
from medomni_cas.store.url import open_store
from medomni_cas.studio.schema import ArrayFamily

__all__ = ["array_digest", "open_array_group"]


def _store_url(root: Path, a: ArrayFamily) -> str:
    return f"lmdb://{(root / a.store).resolve()}"


@contextmanager
def open_array_group(root: Path, a: ArrayFamily) -> Iterator[zarr.Group]:
    """The family's zarr group, read-only."""
    if not a.ref:
        yield zarr.open_group(str(root / a.store), mode="r")
        return
    from medomni_cas.views.zarr_store import CASStore

    with open_store(_store_url(root, a), create=False) as store:
        if store.refs.get(a.ref) is None:
            raise NotFound("ref", f"{a.ref} (array family {a.name} in {root / a.store})")
        yield zarr.open_group(store=CASStore(store, a.ref, read_only=True), mode="r")


def array_digest(root: Path, a: ArrayFamily) -> bytes:
    """What identifies the family's data: its tree id, or a hash of its folder's files."""
    if a.ref:
        with open_store(_store_url(root, a), create=False) as store:
            tree = store.refs.get(a.ref)
        if tree is None:
            raise NotFound("ref", f"{a.ref} (array family {a.name} in {root / a.store})")
        return bytes(tree)
    h = blake3.blake3()
    base = root / a.store
    for p in sorted(q for q in base.rglob("*") if q.is_file()):
        h.update(os.fsencode(p.relative_to(base)) + b"\0" + p.read_bytes() + b"\0")
    return h.digest()
