"""Verification: re-hash stored objects, check they decode, and check that closures are whole.

`fsck` checks every object a backend holds and the closure of every ref; `verify_closure`
checks only what some roots reach (an audit of one result). Both read through the backend
in batches and never raise for a bad object: each finding becomes a `Problem` in the report.

Order of work: first the closures are walked (so a problem found there names the ref and the
parent that reach it), then `fsck` lists the backend and checks the objects the walk did not
reach. `fsck` walks the closures of all refs at once first, and walks them again one ref at a
time only when that finds a problem, to name the ref. A walk reads, hashes and decodes each
object once. A batch is worked in a few C-level passes (`medomni_cas.store._checks`,
`medomni_cas.store._links`), here or, for the big levels of a walk and the listing, in helper
processes (`medomni_cas.store._helpers`, when the store is a local database): hashed and
compared with its keys in one go, then each kind's objects decoded by a mirror of their
record class and re-encoded, which is the canonical check and gives their links; a kind
without a mirror is checked by one decode whose extension hook notes the links and one
re-encode, once one object of the kind has passed the full check
(`encoding.validate_canonical`, then `encoding.links`). Any doubt sends an object through
the full check, which says what is wrong with it. Links met before are dropped by set
operations; the object that links a missing one is looked for only when one is missing (the
level above is read again).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from itertools import compress
from typing import TYPE_CHECKING

import msgspec

from medomni_cas.store._checks import Findings
from medomni_cas.store._helpers import BATCH as _BATCH
from medomni_cas.store._helpers import Helpers
from medomni_cas.store._links import batch_links, unseen
from medomni_cas.store.ids import ID_SIZE, ObjectId, parse_id

if TYPE_CHECKING:
    from medomni_cas.store.store import Progress, Store

__all__ = [
    "CORRUPT",
    "DANGLING_REF",
    "MALFORMED",
    "MISSING",
    "FsckReport",
    "Problem",
    "fsck",
    "verify_closure",
]

CORRUPT = "corrupt"
MISSING = "missing"
MALFORMED = "malformed"
DANGLING_REF = "dangling-ref"
_FIRST_BYTE = operator.itemgetter(0)


class Problem(msgspec.Struct, frozen=True):
    """One finding: ``kind`` is corrupt, missing, malformed or dangling-ref; ``id`` is the
    object's hex id (the ref's name for dangling-ref); ``ref`` the ref it was reached from."""

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


class _Checker:
    """Checks objects once each and collects problems, one per id."""

    def __init__(self, store: Store, progress: Progress | None, jobs: int | None) -> None:
        self.backend = store.backend
        self.progress = progress
        self.seen: set[bytes] = set()
        self.absent: set[bytes] = set()
        self.bad: set[bytes] = set()  # corrupt or malformed: their links are not followed
        self.checked = 0
        self.problems: dict[tuple[str, str], Problem] = {}
        self.helpers = Helpers(self.backend, canonical=True, jobs=jobs)

    def report(self, kind: str, key: str, message: str, ref: str = "") -> None:
        self.problems.setdefault((kind, key), Problem(kind, key, message, ref))

    def findings(self, f: Findings, where: str, ref: str) -> list[bytes]:
        """Report a batch's corrupt and malformed objects; its links (its absent objects
        are the caller's: a walk names who links them, a scan re-reads them)."""
        self.checked += f.objects
        for key, digest in f.corrupt:
            oid = key.hex()
            self.report(
                CORRUPT, oid, f"object {oid} is corrupt{where}: its bytes hash to {digest}", ref
            )
            self.bad.add(key)
        for key, e in f.malformed:
            oid = key.hex()
            self.report(MALFORMED, oid, f"object {oid}{where}: {e}", ref)
            self.bad.add(key)
        self._tick()
        return f.links

    def _ids(self, keys: list[bytes]) -> list[bytes]:
        """The keys that are ids; the others (listed by a damaged store) reported."""
        if set(map(len, keys)) <= {ID_SIZE}:
            return keys
        for key in keys:
            if len(key) != ID_SIZE:
                self.report(
                    MALFORMED, key.hex(), f"stored key {key.hex()} of {len(key)} bytes is not an id"
                )
        return [k for k in keys if len(k) == ID_SIZE]

    # -- walks ---------------------------------------------------------------------------------
    def walk(self, roots: Iterable[tuple[ObjectId, str]]) -> None:
        """Check the closure of each ``(root, ref name or "")``, reporting missing links."""
        for root, ref in roots:
            if root in self.seen:
                if ref and root in self.absent:  # another ref reached it first
                    self._report_missing(root, None, ref)
                continue
            self.seen.add(root)
            self._closure([root], f" (reached from ref {ref})" if ref else "", ref)

    def walk_together(self, roots: Iterable[bytes]) -> None:
        """Check the closures of all ``roots`` as one walk, each level of all of them read in
        batches (a store's 100,000 slot refs are otherwise 100,000 small walks); a problem
        found this way names no ref."""
        frontier = [r for r in dict.fromkeys(roots) if r not in self.seen]
        self.seen.update(frontier)
        self._closure(frontier, "", "")

    def _closure(self, frontier: list[bytes], via: str, ref: str) -> None:
        above: list[bytes] = []  # the level above the frontier
        while frontier:
            # read close together in key order (LMDB's page order, ~1.5x faster)
            frontier.sort(key=_FIRST_BYTE)
            nxt: list[bytes] = []
            gone: list[bytes] = []
            for f in self.helpers.check(frontier):
                gone += f.absent
                nxt += unseen(self.seen, self.findings(f, via, ref))
            if gone:
                self._report_gone(gone, above, ref)
            above, frontier = frontier, nxt

    def _report_gone(self, gone: list[bytes], above: list[bytes], ref: str) -> None:
        """Report missing objects, each with the object above that links it first."""
        self.absent.update(gone)
        parents = self._first_linkers(set(gone), above) if above else {}
        for oid in gone:
            parent = parents.get(oid)
            self._report_missing(ObjectId(oid), parent and ObjectId(parent), ref)

    def _first_linkers(self, wanted: set[bytes], level: list[bytes]) -> dict[bytes, bytes]:
        """For each of ``wanted``, the first object of ``level`` (in walk order) linking it:
        the level is read again, which only happens when something is missing."""
        out: dict[bytes, bytes] = {}
        for i in range(0, len(level), _BATCH):
            keys, datas, _ = _present(
                level[i : i + _BATCH], self.backend.get_list(level[i : i + _BATCH])
            )
            sound = [k not in self.bad for k in keys]
            keys, datas = list(compress(keys, sound)), list(compress(datas, sound))
            ids, owners, _ = batch_links(datas, ordered=True)
            for link, owner in zip(ids, owners, strict=True):
                if link in wanted and link not in out:
                    out[link] = keys[owner]
            if len(out) == len(wanted):
                break
        return out

    def _report_missing(self, oid: ObjectId, parent: ObjectId | None, ref: str) -> None:
        if parent is not None:
            via = f", reached from ref {ref}" if ref else ""
            self.report(
                MISSING, oid.hex(), f"object {oid} is missing (linked from {parent}{via})", ref
            )
        elif ref:
            self.report(DANGLING_REF, ref, f"ref {ref} points to {oid}, which is not stored", ref)
        else:
            self.report(MISSING, oid.hex(), f"root object {oid} is missing")

    def scan(self) -> None:
        """Check every stored object the walk did not reach."""
        keys = self._ids([k for k in self.backend.iter_keys() if k not in self.seen])
        for f in self.helpers.check(keys):
            for key in f.absent:
                # Listed but unreadable: gone since the listing (a concurrent gc), or its
                # bytes are lost (an LMDB large-object marker without its file).
                if self.backend.contains(key):
                    self.report(
                        MISSING,
                        bytes(key).hex(),
                        f"object {bytes(key).hex()} is listed but its bytes cannot be read",
                    )
            self.findings(f, "", "")

    def _tick(self) -> None:
        if self.progress:
            self.progress(self.checked)

    def result(self, refs: int) -> FsckReport:
        problems = list(self.problems.values())
        return FsckReport(ok=not problems, objects=self.checked, refs=refs, problems=problems)


def _present(
    keys: list[bytes], got: list[bytes | None]
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The keys and bytes of the objects read, and the keys of those that were not."""
    if None not in got:
        return keys, got, []  # type: ignore[return-value]
    here = [data is not None for data in got]  # not truthiness: b"" is an object
    absent = list(compress(keys, map(operator.not_, here)))
    return list(compress(keys, here)), list(compress(got, here)), absent  # type: ignore[arg-type]


def fsck(store: Store, *, progress: Progress | None = None, jobs: int | None = None) -> FsckReport:
    """Re-hash every stored object, check it decodes and is canonical, and check that the
    closure of every ref is complete. ``progress`` gets the number of objects checked;
    ``jobs`` is how many processes may share the work (`medomni_cas.store._helpers`;
    default: one per core, up to 4; 1: this process only)."""
    refs = list(store.refs.items())
    fast = _Checker(store, progress, jobs)
    with fast.helpers:
        fast.walk_together(oid for _, oid in refs)
        if not fast.problems:
            fast.scan()
            return fast.result(len(refs))
    # something is wrong: walked again one ref at a time, so that each problem names the ref
    # that reaches it first (which the walk of all at once does not know)
    checker = _Checker(store, progress, jobs)
    with checker.helpers:
        checker.walk((oid, name) for name, oid in refs)
        checker.scan()
    return checker.result(len(refs))


def verify_closure(
    store: Store,
    roots: Iterable[ObjectId | str],
    *,
    progress: Progress | None = None,
    jobs: int | None = None,
) -> FsckReport:
    """The checks of `fsck`, restricted to the closure of ``roots``."""
    checker = _Checker(store, progress, jobs)
    with checker.helpers:
        checker.walk(_unreffed(roots))
    return checker.result(0)


def _unreffed(roots: Iterable[ObjectId | str]) -> Iterator[tuple[ObjectId, str]]:
    for r in roots:
        yield parse_id(r), ""
