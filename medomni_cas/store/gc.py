"""Garbage collection: delete objects that nothing names and that are old enough to be garbage.

Mark: everything reachable from every ref, and from every id named (old or new) in a ref's
history within ``reflog_retention`` — so a ref moved or deleted by mistake can be restored.
Sweep: an unreachable object is deleted only if its write time is older than the start of
this run minus ``grace``. The start is read before anything is listed, so an object written
while gc runs is never deleted; ``grace`` protects a writer that has put objects but not yet
the ref that names them.

How: one pass over the store in key order (`Backend.iter_stamped_parts`, each object read
once with its write time and its hash checked), kept on disk as the pass read it
(`medomni_cas.store._reach`); the refs are read after it, and what they reach is marked
a level at a time, one byte per listed object; the sweep deletes from the listing. A
store 16 times as large takes about 16 times as long (RESULTS.md, stop 31), where marking
by a walk (a read per reachable object, wherever its level found it) took 1.4 times as
long per object. The listing takes 48 bytes per object and 32 per link of TMPDIR; a full
disk there stops gc before it deletes anything. A backend that does not list in key order
(`Backend.lists_in_key_order`: LMDB does) is marked by the store's checked walk instead
(`medomni_cas.store.verify.CheckedWalk`, not canonical), whose set of what it met spills
to sorted runs on disk beyond a bound. Either way a killed gc has deleted only what a
finished mark did not reach (the mark completes before the first delete), and leaves its
temporary files in TMPDIR. The pass reads unreachable objects too: a corrupt one that
nothing reaches is garbage; one that something reaches stops gc, as would a walk.

Limits a writer must respect (as in git): an object is protected by its write time, so a
writer that links to an object already in the store without putting it again relies on that
object being reachable or younger than ``grace``. The LMDB backend refreshes a write time on
a repeated put only when it is older than its ``FRESHEN_AFTER_MS`` (one hour), so a grace
shorter than that is for tests and single-user stores only.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import closing
from itertools import batched
from typing import TYPE_CHECKING

import msgspec

from medomni_cas.errors import IntegrityError, InvalidObject, UnsupportedOperation
from medomni_cas.store._crash import crash_point
from medomni_cas.store._fast import BATCH, BatchChecker, Findings
from medomni_cas.store._fast.pool import HELD_BYTES
from medomni_cas.store._reach import Reach, Unordered, listed
from medomni_cas.store._spill import scratch, split
from medomni_cas.store.reflog import RefLogEntry
from medomni_cas.store.verify import CORRUPT, MALFORMED, CheckedWalk, ClosureCheck

if TYPE_CHECKING:
    from medomni_cas.store.store import Progress, Store

__all__ = ["MAX_SWEPT_IDS", "GcReport", "gc"]

#: At most this many swept ids are listed in a report (the count is always exact).
MAX_SWEPT_IDS = 1000
_BATCH = 1024
_LIST_BATCH = 4096  # listed keys asked of the mark at a time
_HISTORIES = 1024  # ref histories read at a time
# Write times are stored coarsely (ms in LMDB, whole seconds on some filesystems and object
# stores); an object written just after the start may carry a stamp slightly before it.
_STAMP_SLACK = 2.0


class GcReport(msgspec.Struct):
    """What gc kept and deleted (or would delete, when ``dry_run``).

    ``swept_ids`` lists the first `MAX_SWEPT_IDS` of them, as hex.
    """

    reachable: int
    swept: int
    kept_young: int
    dry_run: bool
    swept_ids: list[str]
    #: leftovers of killed writers removed (temp files, packs without an index)
    orphans: int = 0


def _roots(store: Store, since: float) -> Iterator[bytes]:
    """Every ref's target, then every id in ref history entries written at or after
    ``since`` (repeats included: the walk meets each once), as they are listed."""
    for _, oid in store.refs.items():
        yield oid
    # read a chunk of names at a time: a store's 100,000 slot refs, each read alone, are
    # 100,000 read transactions
    for names in batched(store.backend.ref_log_names(), _HISTORIES):
        try:
            read = store.refs.histories(names)
        except (msgspec.DecodeError, msgspec.ValidationError):
            read = [_history(store, name) for name in names]  # to name the one that is not
        for entries in read:
            for entry in entries:
                if entry.time >= since:
                    for logged in (entry.old_id, entry.new_id):
                        if logged is not None:
                            yield logged


def _history(store: Store, name: str) -> list[RefLogEntry]:
    try:
        return store.refs.history(name)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        # Without the history we cannot know what it protects: refuse rather than guess.
        raise InvalidObject(
            f"{store.url}: the history of ref {name!r} cannot be read ({e}); gc refuses to run"
        ) from None


def _refuse_bad(store: Store, check: ClosureCheck) -> None:
    """Raise for the first corrupt or malformed object the mark met: its links cannot be
    read, so the mark is incomplete (a missing one is no reason: it has none to follow)."""
    for key, (kind, detail) in check.bad.items():
        _refuse(store, key, kind, detail)


def _refuse(store: Store, key: bytes, kind: str, detail: str) -> None:
    """Raise for an object the mark met ``kind`` (corrupt or malformed; else nothing)."""
    oid = bytes(key).hex()
    if kind == CORRUPT:
        raise IntegrityError(oid, detail, store.url)
    if kind == MALFORMED:
        raise InvalidObject(f"object {oid}: {detail}")


def gc(
    store: Store,
    *,
    grace: float = 86400.0,
    reflog_retention: float = 30 * 86400.0,
    dry_run: bool = False,
    progress: Progress | None = None,
    jobs: int | None = 1,
) -> GcReport:
    """Delete unreachable objects written more than ``grace`` seconds before this run.

    A missing reachable object does not stop gc; a corrupt or malformed one raises
    `IntegrityError` or `InvalidObject` before anything is deleted (its links cannot be read,
    so the mark would be incomplete). ``progress`` gets the number of objects the pass
    has read, then how far the sweep has come through them (by a walk: the objects marked,
    then listed). ``jobs``: processes that may share a walk's mark (1: this one; None: one
    per core, up to 4); the pass is read in this process.
    """
    backend = store.backend
    if not backend.supports_deletes:
        raise UnsupportedOperation(f"{store.url}: this backend cannot delete objects, so no gc")
    if grace < 0:  # a cutoff after the start would sweep objects written during this run
        raise ValueError(f"grace must be at least 0 seconds, got {grace}")
    start = time.time()  # before any listing: whatever is written from now on is kept
    cutoff = start - grace - _STAMP_SLACK

    if backend.lists_in_key_order:
        try:
            return _by_pass(store, start, reflog_retention, cutoff, dry_run, progress)
        except Unordered:
            pass  # it was not (or a key is not an id): marked by the walk, which names it
    # The mark: the store's checked walk (`medomni_cas.store.verify`), whose set of what it
    # met stays in memory up to a bound and spills to sorted runs on disk beyond it (removed
    # with the walk; a killed gc leaves it in TMPDIR and has deleted nothing the mark had
    # not finished with).
    with CheckedWalk(store, canonical=False, jobs=jobs, progress=progress) as mark:
        mark.walk(_roots(store, start - reflog_retention))
        _refuse_bad(store, mark.check)
        return _sweep(store, mark, cutoff, dry_run, progress)


def _by_pass(
    store: Store,
    start: float,
    reflog_retention: float,
    cutoff: float,
    dry_run: bool,
    progress: Progress | None,
) -> GcReport:
    """gc by one pass over the store in key order (`medomni_cas.store._reach`): list it,
    mark what the refs (read after the pass) reach, delete from the listing."""
    backend = store.backend
    check = BatchChecker(canonical=False)

    def read(ids: list[bytes]) -> Findings:  # an id reached that the pass did not list
        return check(ids, backend.get_list(ids), owners=True)

    folder = scratch("gc")  # removed here; a killed gc leaves it empty (`unnamed` files)
    try:
        parts = backend.iter_stamped_parts(HELD_BYTES, BATCH)
        with (
            closing(listed(parts, check, folder, progress)) as listing,
            closing(Reach(listing, folder, read)) as reach,
        ):
            # the roots after the pass: an object a ref names that the pass did not list
            # (put since) is read, and its links followed
            reach.walk(_roots(store, start - reflog_retention))
            bad = reach.reached_bad()
            if bad is not None:
                _refuse(store, *bad)
            return _sweep_listed(store, reach, cutoff, dry_run, progress)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _sweep_listed(
    store: Store, reach: Reach, cutoff: float, dry_run: bool, progress: Progress | None
) -> GcReport:
    """Delete the objects of the pass's listing that ``reach`` did not mark and that are
    older than ``cutoff``, a first byte at a time."""
    listing = reach.listing
    reachable = reach.reachable
    reach.marked[listing.absent] = True  # gone since they were listed
    kept_young = 0

    def candidates() -> Iterator[tuple[bytes, int]]:
        nonlocal kept_young
        for byte in range(256):
            lo, hi = listing.starts[byte], listing.starts[byte + 1]
            unmarked = ~reach.marked[lo:hi]
            if not unmarked.any():
                continue
            old = listing.stamps(lo, hi) < cutoff
            kept_young += int((unmarked & ~old).sum())
            for key in split(listing.keys(lo, hi)[unmarked & old].tobytes()):
                yield key, hi

    swept, swept_ids, orphans = _delete(store, candidates(), dry_run, cutoff, progress)
    return GcReport(
        reachable=reachable,
        swept=swept,
        kept_young=kept_young,
        dry_run=dry_run,
        swept_ids=swept_ids,
        orphans=orphans,
    )


def _delete(
    store: Store,
    candidates: Iterator[tuple[bytes, int]],
    dry_run: bool,
    cutoff: float,
    progress: Progress | None,
) -> tuple[int, list[str], int]:
    """Delete the ``candidates`` (each with how far the listing has come), then the
    leftovers of killed writers: how many deleted, the first of them, the leftovers."""
    backend = store.backend
    swept = 0
    swept_ids: list[str] = []
    for chunk in batched(candidates, _BATCH):
        part = [key for key, _ in chunk]
        n = len(part) if dry_run else backend.delete_many(part, older_than=cutoff)
        crash_point("gc-sweep")  # the tests kill gc here: the mark is done, some swept
        swept += n
        room = MAX_SWEPT_IDS - len(swept_ids)
        if room > 0:
            swept_ids.extend(bytes(k).hex() for k in part[:room])
        if progress:
            progress(chunk[-1][1])
    orphans = 0 if dry_run else backend.remove_orphans(cutoff)
    return swept, swept_ids, orphans


def _sweep(
    store: Store, mark: CheckedWalk, cutoff: float, dry_run: bool, progress: Progress | None
) -> GcReport:
    """Delete what ``mark`` did not reach and is older than ``cutoff``, listing the store
    a chunk at a time."""
    backend = store.backend
    kept_young = 0

    def candidates() -> Iterator[tuple[bytes, int]]:
        nonlocal kept_young
        listed = 0
        for part in batched(backend.iter_stamps(), _LIST_BATCH):
            listed += len(part)
            unmarked = set(mark.seen.absent([key for key, _ in part]))
            for key, stamp in part:
                if key not in unmarked:
                    continue
                if stamp >= cutoff:
                    kept_young += 1
                    continue
                yield key, listed

    swept, swept_ids, orphans = _delete(store, candidates(), dry_run, cutoff, progress)
    return GcReport(
        reachable=mark.check.objects,
        swept=swept,
        kept_young=kept_young,
        dry_run=dry_run,
        swept_ids=swept_ids,
        orphans=orphans,
    )
