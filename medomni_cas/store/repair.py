"""Repair: mend a store's corrupt and missing objects with good copies from another store.

`repair` runs `fsck`, then fetches from ``source`` every object it found corrupt or
missing (and a dangling ref's target), with the closure below it, through the walk that a
pull uses (`medomni_cas.store.sync.send` reading the store's own copies): every copy
fetched is verified (hashed, canonical) before it is written, and written children
first; a corrupt stored copy is replaced by the backend's put. Then `fsck` runs again:
the store is repaired when that finds nothing.

What cannot be mended this way: an object ``source`` lacks or holds corrupt too, and a
malformed object (its bytes hash to its id, so every store holds the same bad bytes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from medomni_cas.errors import IntegrityError, InvalidObject, NotFound
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.sync import send
from medomni_cas.store.verify import CORRUPT, DANGLING_REF, MISSING, FsckReport, fsck

if TYPE_CHECKING:
    from medomni_cas.store.store import Progress, Store

__all__ = ["RepairReport", "repair"]


class RepairReport(msgspec.Struct):
    """A repair: the check before, the objects fetched and written, the ids that could not
    be fetched (hex id -> why), and the check after (``ok`` when it found nothing)."""

    source: str
    before: FsckReport
    fetched: int
    failed: dict[str, str]
    after: FsckReport

    @property
    def ok(self) -> bool:
        return self.after.ok


def repair(
    store: Store, source: Store, *, jobs: int | None = None, progress: Progress | None = None
) -> RepairReport:
    """Check ``store``, fetch good copies of what is corrupt or missing from ``source``,
    and check again (see the module docstring)."""
    before = fsck(store, jobs=jobs, progress=progress)
    wanted: dict[ObjectId, None] = {}
    for p in before.problems:
        if p.kind in (CORRUPT, MISSING):
            wanted[ObjectId.from_hex(p.id)] = None
        elif p.kind == DANGLING_REF:
            target = store.refs.get(p.id)
            if target is not None:
                wanted[target] = None
    fetched = 0
    failed: dict[str, str] = {}
    for oid in wanted:
        # one walk per object, so that one the source cannot give stops no other
        try:
            fetched += send(source, store, [oid], present="dst").objects
        except (NotFound, IntegrityError, InvalidObject) as e:
            failed[oid.hex()] = str(e)
    after = fsck(store, jobs=jobs, progress=progress) if wanted else before
    return RepairReport(source.url, before, fetched, failed, after)
