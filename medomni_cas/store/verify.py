"""Verification: re-hash stored objects, check they decode, and check that closures are whole.

`walk_checked` is the one checked walk: it reads the closure of some roots through the
backend in batches, re-hashes and decodes each object once, and never raises for a bad
object; it returns a `ClosureCheck` saying which objects are bad and, when asked, how each
object was reached. `fsck` (every object a backend holds and the closure of every ref),
`verify_closure` (the closure of some roots) and `medomni_cas.audit.verify` (a result) are
built on it, and only name what it found.

Order of work
    `fsck` first reads the whole store in one pass in key order (`Backend.iter_parts`: each
    object with its key, each page of the store read once), and checks that every link and
    every ref's object is among the keys listed. Only when that finds something does it
    walk: the closures of all refs at once, so that a problem found there names the ref and
    the parent that reach it, then the objects the walk did not reach; and when the walk
    finds a problem, again one ref at a time, to name the ref that reaches it first.
    `verify_closure` and a result's verify walk the closures of their roots.

A batch
    Hashed and compared with its keys in one go, then each kind's objects decoded by a
    mirror of their record class and re-encoded, which is the canonical check and gives
    their links; a kind without a mirror is checked by one decode whose extension hook notes
    the links and one re-encode, once one object of the kind has passed the full check
    (`encoding.validate_canonical`, then `encoding.links`). Any doubt sends an object through
    the full check, which says what is wrong with it. This is the store's private
    `medomni_cas.store._fast`, here or, for the big levels of a walk and the listing, in
    helper processes (when the store is a local database).

Memory
    What a walk has met and each level of it stay in memory up to a bound and spill to
    a temporary directory beyond it (`medomni_cas.store._spill`: sorted runs of the ids
    met, against which each level's links are settled in one pass once the set has
    spilled, and run files of the levels, removed with the walk), with the same answers
    in the same order; a batch's objects are read and checked in parts of about 32 MiB
    (`Backend.get_parts`: large objects a few at a time); fsck lists refs,
    histories and stored keys as it goes, a chunk at a time, and the pages of the store
    the walk has read are given back past a budget (`medomni_cas.store._mapped`).
    So a check of 100M objects holds about what one of a few hundred thousand holds.
    Not bounded: a walk that keeps every object's first linker (``parents=True``, run
    only when something is wrong, to name paths), and the problems found.

Parents
    Links met before are dropped by set operations. The object that links a missing one is
    looked for only when one is missing (the level above is read again), unless the walk
    keeps every object's first linker (``parents=True``, to name paths).
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterable, Iterator
from itertools import batched, chain, compress, groupby, islice
from typing import TYPE_CHECKING, NamedTuple, cast

import msgspec

from medomni_cas._gcpause import gc_paused
from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store._fast import (
    BATCH,
    MIN_LEVEL,
    BatchReader,
    CheckPool,
    Findings,
    Listed,
    new_links,
)
from medomni_cas.store._spill import IdList, MarkSet
from medomni_cas.store.ids import ID_SIZE, ObjectId, parse_id

if TYPE_CHECKING:
    from medomni_cas.store.store import Progress, Store

__all__ = [
    "CORRUPT",
    "DAMAGED",
    "DANGLING_REF",
    "MALFORMED",
    "MISSING",
    "REF_HISTORY",
    "Bad",
    "CheckedWalk",
    "ClosureCheck",
    "FsckReport",
    "Problem",
    "fsck",
    "verify_closure",
    "walk_checked",
]

CORRUPT = "corrupt"
MISSING = "missing"
MALFORMED = "malformed"
DANGLING_REF = "dangling-ref"
DAMAGED = "damaged-file"
REF_HISTORY = "ref-history"
_ROOTS_CHUNK = 65_536  # roots taken at a time (fsck's are every ref: maybe millions)
_SCAN_CHUNK = 65_536  # unreached keys checked at a time by fsck's scan
_HISTORIES_CHUNK = 1024  # ref histories read at a time


class Problem(msgspec.Struct, frozen=True):
    """One finding: ``kind`` is corrupt, missing, malformed, dangling-ref or damaged-file;
    ``id`` is the object's hex id (the ref's name for dangling-ref, the file's path for a
    damaged file of the backend's own, `Backend.damage`); ``ref`` the ref it was reached
    from."""

    kind: str
    id: str
    message: str
    ref: str = ""


class FsckReport(msgspec.Struct):
    """What a check found; ``ok`` is true when ``problems`` is empty."""

    ok: bool
    objects: int
    refs: int
    problems: list[Problem]


class Bad(NamedTuple):
    """What is wrong with one object of a closure."""

    kind: str  # CORRUPT, MISSING or MALFORMED
    detail: str  # corrupt: what its bytes hash to (hex); malformed: what is wrong; else ""


# -- the walk -----------------------------------------------------------------------------------
class ClosureCheck:
    """What `walk_checked` found.

    ``bad`` maps each bad object met to what is wrong with it, in the order they were found
    (the objects below a corrupt or malformed one are not followed through it: its links
    cannot be trusted). ``parent`` maps an object to the object that first linked it (None
    for a root): for every object met with ``parents``, else for the missing ones only.
    ``objects`` and ``nbytes`` count what was read; ``processes`` the processes that read it.
    """

    def __init__(self, store: Store, parents: bool) -> None:
        self.store = store
        self.bad: dict[bytes, Bad] = {}
        self.parent: dict[bytes, bytes | None] = {}
        self.objects = 0
        self.nbytes = 0
        self.processes = 1
        self.parents = parents
        # with parents: each batch's sound keys and the owner of each link found in it, the
        # objects with links that `referrers` reads again
        self._read: list[tuple[list[bytes], list[int]]] = []

    def referrers(self) -> dict[bytes, list[bytes]]:
        """Every sound object of the closure that links each bad one (a shared blob is
        linked by many runs), in walk order. Needs ``parents``; reads the objects with
        links a second time (only worth it when something is wrong)."""
        if not self.parents:
            raise ValueError("referrers needs a walk with parents=True")
        out: dict[bytes, list[bytes]] = {k: [] for k in self.bad}
        linkers = [k for keys, owners in self._read for k in map(keys.__getitem__, set(owners))]
        reader = BatchReader()
        for i in range(0, len(linkers), BATCH):
            keys, datas, _ = _present(
                linkers[i : i + BATCH], self.store.backend.get_list(linkers[i : i + BATCH])
            )
            sound = [k not in self.bad for k in keys]
            keys, datas = list(compress(keys, sound)), list(compress(datas, sound))
            ids, owners, _ = reader.links(datas, ordered=True)
            for link, owner in dict.fromkeys(zip(ids, owners, strict=True)):
                if link in out:
                    out[link].append(keys[owner])
        return out

    def stored_kind(self, oid: bytes) -> tuple[str, int] | None:
        """The kind and version that the stored bytes of ``oid`` name, unverified (a bad
        object's too: a flipped bit elsewhere leaves its header readable); None when they
        are absent or name none."""
        try:
            return encoding.kind_of(self.store.backend.get(oid))
        except (KeyError, InvalidObject):
            return None


class _Walk:
    """Checks closures, each object once, into a `ClosureCheck`; holds the pool of
    processes that check its batches (closed with the walk)."""

    def __init__(
        self,
        store: Store,
        *,
        canonical: bool,
        parents: bool = False,
        jobs: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.check = ClosureCheck(store, parents)
        # with parents, owners are kept, and only this process keeps them
        self.pool = CheckPool(store.backend, canonical, 1 if parents else jobs)
        self.reader = BatchReader(self.pool.checker.exact)  # the level above, read again
        self.progress = progress
        # without parents, what the walk met (``check.parent`` is the set then): in memory,
        # or on disk beyond `spill_bound` ids, as are the levels of the walk
        self.seen = MarkSet()
        # the links of a level not settled yet: a quarter of the bound held, as the set's
        # newest ids are once it has spilled (with the level itself, about what the set
        # held before it spilled)
        self._pending_bound = max(1, self.seen.bound // 4)
        self._new: list[bytes] = []

    def __enter__(self) -> _Walk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.close()
        self.seen.close()
        self.check.processes = 1 + self.pool.helped

    def met(self, oid: bytes) -> bool:
        return oid in (self.check.parent if self.check.parents else self.seen)

    def _admit(self, roots: Iterable[bytes], level: IdList) -> None:
        """Put the roots not met yet in ``level``, each once, a chunk at a time."""
        it = iter(roots)
        with IdList(bound=self._pending_bound) as pending:
            while chunk := list(islice(it, _ROOTS_CHUNK)):
                if self.check.parents:
                    new = [r for r in dict.fromkeys(chunk) if r not in self.check.parent]
                    self.check.parent.update(dict.fromkeys(new))
                    level.extend(new)
                else:
                    self._links(chunk, level, pending)
            self.seen.settle(pending, level)

    def _links(self, ids: list[bytes], level: IdList, pending: IdList) -> None:
        """Put those of ``ids`` not met in ``level``: at once while what was met is held in
        memory; once it has spilled, in ``pending``, for `MarkSet.settle` to decide at the
        end of the level in one pass over the set (a lookup per id would cost a random
        read each)."""
        if self.seen.spilled:
            self.seen.defer(ids, pending)
        else:
            level.extend(self.seen.unseen(ids))

    @gc_paused  # what the walk met and its levels, kept to the end (`medomni_cas._gcpause`)
    def walk(self, roots: Iterable[bytes]) -> list[bytes]:
        """Check the closures of ``roots`` as one walk, breadth first, each level in
        batches (a store's 100,000 slot refs are otherwise 100,000 small walks); return
        the objects it found bad, in order. What an earlier walk met is not read again."""
        self._new = []
        frontier = IdList()
        self._admit(roots, frontier)
        above: IdList | None = None  # the level above the frontier
        try:
            while frontier:
                nxt = IdList()
                gone: list[bytes] = []
                # read in key order: a batch's neighbouring ids share B-tree leaves, each
                # faulted once for all of them (a level of 1.44M objects read in first-byte
                # order faulted 536k times, sorted 390k: RESULTS.md, stop 29)
                held = frontier.as_list()
                keys = held if held is not None else frontier.batches(BATCH)
                try:
                    with IdList(bound=self._pending_bound) as pending:
                        for f in self.pool.check(
                            keys, owners=self.check.parents, count=len(frontier)
                        ):
                            self._note(f, absent=True)
                            gone += f.absent
                            if not f.links:
                                continue
                            if self.check.parents:
                                self.check._read.append((f.sound, f.owners))
                                nxt.extend(new_links(self.check.parent, f.sound, f.links, f.owners))
                            else:
                                self._links(f.links, nxt, pending)
                        self.seen.settle(pending, nxt)
                except BaseException:
                    nxt.close()
                    raise
                if gone and above and not self.check.parents:
                    self.check.parent.update(self._first_linkers(set(gone), above))
                if above is not None:
                    above.close()
                above, frontier = frontier, nxt
        finally:
            frontier.close()
            if above is not None:
                above.close()
        return self._new

    def scan(self, keys: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        """Check ``keys`` without following their links: ``(bad, absent)``, the keys found
        bad and those that could not be read (a walk would call them missing)."""
        self._new = []
        absent: list[bytes] = []
        for f in self.pool.check(keys):
            absent += f.absent
            self._note(f, absent=False)
        return self._new, absent

    def _note(self, f: Findings, *, absent: bool) -> None:
        """Count a batch's objects and note its bad ones."""
        check, new = self.check, self._new
        check.objects += f.objects
        check.nbytes += f.nbytes
        for key in f.absent if absent else ():
            check.bad[key] = Bad(MISSING, "")
            new.append(key)
        for key, got in f.corrupt:
            check.bad[key] = Bad(CORRUPT, got)
            new.append(key)
        for key, e in f.malformed:
            check.bad[key] = Bad(MALFORMED, e)
            new.append(key)
        if self.progress is not None:
            self.progress(check.objects)

    def _first_linkers(self, wanted: set[bytes], level: IdList) -> dict[bytes, bytes]:
        """For each of ``wanted``, the first object of ``level`` (in walk order) linking it:
        the level is read again, which only happens when something is missing."""
        out: dict[bytes, bytes] = {}
        backend, bad = self.check.store.backend, self.check.bad
        for part in level.batches(BATCH):
            keys, datas, _ = _present(part, backend.get_list(part))
            sound = [k not in bad for k in keys]
            keys, datas = list(compress(keys, sound)), list(compress(datas, sound))
            ids, owners, _ = self.reader.links(datas, ordered=True)
            for link, owner in zip(ids, owners, strict=True):
                if link in wanted and link not in out:
                    out[link] = keys[owner]
            if len(out) == len(wanted):
                break
        return out


#: The walk itself, for a caller that needs what it met (gc's mark: `_Walk.seen`).
CheckedWalk = _Walk


def _present(
    keys: list[bytes], got: list[bytes | None]
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The keys and bytes of the objects read, and the keys of those that were not."""
    if None not in got:
        return keys, cast("list[bytes]", got), []
    here = [data is not None for data in got]  # not truthiness: b"" is an object
    absent = list(compress(keys, map(operator.not_, here)))
    datas = cast("list[bytes]", list(compress(got, here)))  # the None left out
    return list(compress(keys, here)), datas, absent


def walk_checked(
    store: Store,
    roots: Iterable[ObjectId],
    *,
    canonical: bool,
    parents: bool = False,
    jobs: int | None = None,
    progress: Progress | None = None,
) -> ClosureCheck:
    """Check the closure of ``roots``: every object's bytes hash to its id, its links can be
    read (with ``canonical``, it is in canonical form: several times the cost), and every
    linked object is present. One walk, breadth first; nothing raised for a bad object.

    ``parents`` keeps the object that first links each one (to name paths; the walk is then
    this process's only). ``jobs`` is how many processes may share the work (default: one
    per core, up to 4; 1: this process only); ``progress`` gets the objects read so far.
    """
    with _Walk(store, canonical=canonical, parents=parents, jobs=jobs, progress=progress) as w:
        w.walk(roots)
    return w.check


# -- fsck and verify_closure ----------------------------------------------------------------------
class _Problems:
    """The problems of a check, one per (kind, id), as `Problem` records."""

    def __init__(self, check: ClosureCheck) -> None:
        self.check = check
        self.found: dict[tuple[str, str], Problem] = {}

    def add(self, kind: str, key: str, message: str, ref: str = "") -> None:
        self.found.setdefault((kind, key), Problem(kind, key, message, ref))

    def bad(self, ids: list[bytes], ref: str) -> None:
        """Report the objects of ``ids`` found bad by a walk from ``ref`` (or "")."""
        where = f" (reached from ref {ref})" if ref else ""
        for key in ids:
            kind, detail = self.check.bad[key]
            oid = key.hex()
            if kind == CORRUPT:
                self.add(
                    CORRUPT, oid, f"object {oid} is corrupt{where}: its bytes hash to {detail}", ref
                )
            elif kind == MALFORMED:
                self.add(MALFORMED, oid, f"object {oid}{where}: {detail}", ref)
            else:
                self.missing(key, self.check.parent.get(key), ref)

    def missing(self, key: bytes, parent: bytes | None, ref: str) -> None:
        """Report a missing object: linked from ``parent``, or (None) a root of ``ref``."""
        oid = key.hex()
        if parent is not None:
            via = f", reached from ref {ref}" if ref else ""
            self.add(
                MISSING, oid, f"object {oid} is missing (linked from {parent.hex()}{via})", ref
            )
        elif ref:
            self.add(DANGLING_REF, ref, f"ref {ref} points to {oid}, which is not stored", ref)
        else:
            self.add(MISSING, oid, f"root object {oid} is missing")

    def report(self, refs: int) -> FsckReport:
        problems = list(self.found.values())
        return FsckReport(ok=not problems, objects=self.check.objects, refs=refs, problems=problems)


def fsck(store: Store, *, progress: Progress | None = None, jobs: int | None = None) -> FsckReport:
    """Re-hash every stored object, check it decodes and is canonical, and check that the
    closure of every ref is complete. ``progress`` gets the number of objects checked;
    ``jobs`` is how many processes may share the work (default: one per core, up to 4; 1:
    this process only)."""
    with _Walk(store, canonical=True, jobs=jobs, progress=progress) as w:
        refs = _sweep(w)
        if refs is not None:
            found = _Problems(w.check)
            for file, message in store.backend.damage():
                found.add(DAMAGED, file, message)
            _check_histories(store, found)
            return found.report(refs)
        swept = w.check.objects
    # the walks count on from what the pass checked: a progress bar never goes back
    return _walked(store, None if progress is None else lambda n: progress(swept + n), jobs)


def _sweep(w: _Walk) -> int | None:
    """Check every stored object in one pass in key order, and that every link and every
    ref's object is stored: the number of refs when all is sound, None when anything is
    not, for `_walked` to find again and name (the ref, the object that links it).

    A walk reads the store once per level, each level's ids all over it; this pass reads
    each object with its key (`Backend.iter_parts`: each B-tree leaf mapped once, past
    the mapped budget faulted once). The links are then checked against the keys listed,
    both sorted, one first byte at a time."""
    backend = w.check.store.backend
    refs = 0
    with IdList() as stored, IdList() as linked:
        parts = w.pool.listed()
        # helpers start for a store as big as a walk's level that starts them
        head: list[Listed] = []
        count = 0
        while count < MIN_LEVEL and (part := next(parts, None)):
            head.append(part)
            count += len(part.keys)

        def batches() -> Iterator[Listed]:
            for part in chain(head, parts):
                if not set(map(len, part.keys)) <= {ID_SIZE}:
                    raise _Unsound
                stored.extend(part.keys)
                yield part

        gone: list[bytes] = []
        try:
            for f in w.pool.check(batches(), count=count):
                w._note(f, absent=False)
                if f.corrupt or f.malformed:
                    return None
                gone += f.absent
                linked.extend(dict.fromkeys(f.links))
        except _Unsound:
            return None
        # listed, then not read: deleted since (a concurrent gc), or its bytes are lost; its
        # key is among those listed, so a link to it would pass: the walks decide
        if gone:
            return None
        for listed in batched(backend.ref_iter(""), _ROOTS_CHUNK):
            targets = [oid for _, oid in listed]
            if not set(map(len, targets)) <= {ID_SIZE}:
                return None
            refs += len(targets)
            linked.extend(targets)
        have = stored.by_first_byte()
        byte, keys = next(have, (256, []))
        for first, links in linked.by_first_byte():
            while byte < first:
                byte, keys = next(have, (256, []))
            if byte != first or not set(links) <= set(keys):
                return None
    return refs


class _Unsound(Exception):
    """A listed key that is not an id: the sweep stops, the walk names it."""


def _walked(store: Store, progress: Progress | None, jobs: int | None) -> FsckReport:
    """`fsck` by walks: the closures of every ref at once, then the objects they did not
    reach; when that finds something wrong, again one ref at a time, so that each problem
    names the ref that reaches it first (which the walk of all at once does not know)."""
    # the refs are listed as the walk goes (a store may have millions: slot refs), twice
    # when something is wrong
    refs = 0

    def targets() -> Iterator[bytes]:
        nonlocal refs
        for _, oid in store.refs.items():
            refs += 1
            yield oid

    with _Walk(store, canonical=True, jobs=jobs, progress=progress) as fast:
        fast.walk(targets())
        if not fast.check.bad:
            found = _Problems(fast.check)
            _scan(fast, found)
            _check_histories(store, found)
            return found.report(refs)
    with _Walk(store, canonical=True, jobs=jobs, progress=progress) as w:
        found = _Problems(w.check)
        refs = 0
        for name, oid in store.refs.items():
            refs += 1
            if not w.met(oid):
                found.bad(w.walk([oid]), name)
            elif (bad := w.check.bad.get(oid)) is not None and bad.kind == MISSING:
                found.missing(oid, None, name)  # another ref reached it first
        _scan(w, found)
    _check_histories(store, found)
    return found.report(refs)


def _unreached(w: _Walk) -> Iterator[list[bytes]]:
    """The stored keys the walk did not reach, in listing order, in chunks of at least
    `_SCAN_CHUNK` (but the last), none of them held all at once."""
    listed = iter(w.check.store.backend.iter_keys())
    out: list[bytes] = []
    while chunk := list(islice(listed, _SCAN_CHUNK)):
        out += (
            w.seen.absent(chunk)
            if not w.check.parents
            else [k for k in chunk if k not in w.check.parent]
        )
        if len(out) >= _SCAN_CHUNK:
            yield out
            out = []
    if out:
        yield out


def _scan(w: _Walk, found: _Problems) -> None:
    """Check every stored object the walk did not reach."""
    backend = w.check.store.backend
    odd: list[bytes] = []  # keys listed by a damaged store that are not ids
    bad: list[bytes] = []
    absent: list[bytes] = []
    for keys in _unreached(w):
        if not set(map(len, keys)) <= {ID_SIZE}:
            odd += [k for k in keys if len(k) != ID_SIZE]
            keys = [k for k in keys if len(k) == ID_SIZE]
        more_bad, more_absent = w.scan(keys)
        bad += more_bad
        absent += more_absent
    for key in odd:
        found.add(MALFORMED, key.hex(), f"stored key {key.hex()} of {len(key)} bytes is not an id")
    for file, message in backend.damage():
        found.add(DAMAGED, file, message)
    for key in absent:
        # Listed but unreadable: gone since the listing (a concurrent gc), or its bytes are
        # lost (an LMDB large-object marker without its file).
        if backend.contains(key):
            oid = bytes(key).hex()
            found.add(MISSING, oid, f"object {oid} is listed but its bytes cannot be read")
    found.bad(bad, "")


def _check_histories(store: Store, found: _Problems) -> None:
    """Check every ref, and every name with a history, against its history (the values
    agree, the hash chain is whole: `medomni_cas.store.reflog.check_history`)."""
    failed: list[Exception] = []

    def logged() -> Iterator[str]:
        try:
            yield from store.backend.ref_log_names()
        except (OSError, ValueError) as e:  # a damaged listing of histories (a flipped key)
            failed.append(e)

    # Both listings come sorted (the refs by contract; histories, by every backend that
    # lists many), so they are merged as they come, never held: a name in both is met
    # twice in a row. A backend that lists otherwise costs a name checked twice, not a
    # problem lost or repeated (problems are kept once, then put in name order).
    problems: dict[tuple[str, str], None] = {}
    names = (name for name, _ in store.backend.ref_iter(""))
    merged = (name for name, _ in groupby(heapq.merge(names, logged())))
    # read a chunk at a time: a store's 100,000 slot refs, each read alone, are 200,000
    # read transactions
    while chunk := list(islice(merged, _HISTORIES_CHUNK)):
        for name, found_here in zip(chunk, store.refs.check_histories(chunk), strict=True):
            for message in found_here:
                problems[(name, message)] = None
    if failed:
        found.add(REF_HISTORY, "", f"the ref histories cannot be listed: {failed[0]}")
    for name, message in sorted(problems, key=operator.itemgetter(0)):
        # one ref may have several problems: each is kept
        found.found.setdefault(
            (REF_HISTORY, f"{name}\x00{message}"), Problem(REF_HISTORY, name, message, name)
        )


def verify_closure(
    store: Store,
    roots: Iterable[ObjectId | str],
    *,
    progress: Progress | None = None,
    jobs: int | None = None,
) -> FsckReport:
    """The checks of `fsck`, restricted to the closure of ``roots`` (each walked in turn)."""
    with _Walk(store, canonical=True, jobs=jobs, progress=progress) as w:
        found = _Problems(w.check)
        for root in roots:
            found.bad(w.walk([parse_id(root)]), "")
    return found.report(0)
