"""Verification: re-hash stored objects, check they decode, and check that closures are whole.

`fsck` checks every object a backend holds and the closure of every ref; `verify_closure`
checks only what some roots reach (an audit of one result). Both read through the backend
in batches and never raise for a bad object: each finding becomes a `Problem` in the report.

Order of work: first the closures are walked (so a problem found there names the ref and the
parent that reach it), then `fsck` lists the backend and checks the objects the walk did not
reach. Each object is read and hashed once, and decoded once: after one object of a kind
has passed the full check (`encoding.validate_canonical`, then `encoding.links`), the others
are checked by one decode, whose extension hook notes the links, and one re-encode; any
doubt sends an object through the full check, which says what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import batched
from typing import TYPE_CHECKING

import blake3
import msgspec

from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding
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
_BATCH = 1024
_BLOB_PREFIX = encoding.encode_blob_header(0)[:-2]  # what every blob object starts with
_Ext = msgspec.msgpack.Ext
_wrap_id = partial(bytes.__new__, ObjectId)  # an id from 32 bytes (or a view of them)


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


def _noting_hook(note: Callable[[ObjectId], None]) -> Callable[[int, memoryview], _Ext]:
    """The canonical decoder's extension hook, except that a link stays an `Ext` (which
    re-encodes as it was, without the encoder's hook) and its id is passed to ``note``."""
    link_ext, wrap, ext = encoding.LINK_EXT, _wrap_id, _Ext

    def hook(code: int, data: memoryview) -> _Ext:
        if code == link_ext and len(data) == ID_SIZE:
            oid = wrap(data)
            note(oid)
            return ext(code, oid)
        raise InvalidObject(f"unknown msgpack extension type {code} (length {len(data)})")

    return hook


class _Checker:
    """Checks objects once each and collects problems, one per id."""

    def __init__(self, store: Store, progress: Progress | None) -> None:
        self.backend = store.backend
        self.progress = progress
        self.seen: set[bytes] = set()
        self.absent: set[bytes] = set()
        self.checked = 0
        self.problems: dict[tuple[str, str], Problem] = {}
        # the fast path: one decode whose link hook collects the links, one re-encode; kinds
        # (with versions) are admitted to it by passing the full check once
        self._kinds: set[tuple[str, int]] = set()
        self._found: list[ObjectId] = []
        self._decoder = msgspec.msgpack.Decoder(ext_hook=_noting_hook(self._found.append))

    def report(self, kind: str, key: str, message: str, ref: str = "") -> None:
        self.problems.setdefault((kind, key), Problem(kind, key, message, ref))

    def check(self, key: bytes, data: bytes, where: str, ref: str) -> list[ObjectId] | None:
        """The links of a sound object, or None (after reporting) for a bad one."""
        self.checked += 1
        if len(key) != ID_SIZE:
            self.report(
                MALFORMED, key.hex(), f"stored key {key.hex()} of {len(key)} bytes is not an id"
            )
            return None
        digest = blake3.blake3(data).digest()
        if digest != key:
            oid = key.hex()
            self.report(
                CORRUPT,
                oid,
                f"object {oid} is corrupt{where}: its bytes hash to {digest.hex()}",
                ref,
            )
            return None
        found = self._fast_links(data)
        if found is not None:
            return found
        try:
            kind = encoding.validate_canonical(data)
            found = encoding.links(data)
        except InvalidObject as e:
            oid = key.hex()
            self.report(MALFORMED, oid, f"object {oid}{where}: {e}", ref)
            return None
        self._kinds.add(kind)
        return found

    def _fast_links(self, data: bytes) -> list[ObjectId] | None:
        """`encoding.validate_canonical` and `encoding.links` in one decode, for a blob or an
        object of a kind already seen; None when it needs the full check (which says why).

        A canonical object has string map keys only, so the links its decode meets are those
        `encoding.links` collects from the body's values and lists.
        """
        try:
            if data[: len(_BLOB_PREFIX)] == _BLOB_PREFIX:
                encoding.blob_data(data)
                return []
            self._found.clear()
            value = self._decoder.decode(data)
            if type(value) is not list or len(value) != 3:
                return None
            kind, version, body = value
            if type(kind) is not str or type(version) is not int:
                return None
            if (kind, version) not in self._kinds:
                return None
            if encoding.encode_object(kind, version, body) != data:
                return None
        except (msgspec.DecodeError, InvalidObject):
            return None
        return list(dict.fromkeys(self._found))

    def walk(self, roots: Iterable[tuple[ObjectId, str]]) -> None:
        """Check the closure of each ``(root, ref name or "")``, reporting missing links."""
        for root, ref in roots:
            if root in self.seen:
                if ref and root in self.absent:  # another ref reached it first
                    self._report_missing(root, None, ref)
                continue
            self.seen.add(root)
            # frontier entries: (id, the object that links it, or None for the root itself)
            frontier: list[tuple[ObjectId, ObjectId | None]] = [(root, None)]
            via = f" (reached from ref {ref})" if ref else ""
            while frontier:
                nxt: list[tuple[ObjectId, ObjectId | None]] = []
                for part in batched(frontier, _BATCH):
                    # read in key order (LMDB's page order, ~1.25x faster), check in BFS order
                    got = dict(self.backend.get_many(sorted(oid for oid, _ in part)))
                    for oid, parent in part:
                        data = got[oid]
                        if data is None:
                            self.absent.add(oid)
                            self._report_missing(oid, parent, ref)
                            continue
                        found = self.check(oid, data, via, ref)
                        for link in found or ():
                            if link not in self.seen:
                                self.seen.add(link)
                                nxt.append((link, oid))
                    self._tick()
                frontier = nxt

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
        keys = (k for k in self.backend.iter_keys() if k not in self.seen)
        for part in batched(keys, _BATCH):
            for key, data in self.backend.get_many(part):
                if data is None:
                    # Listed but unreadable: gone since the listing (a concurrent gc), or its
                    # bytes are lost (an LMDB large-object marker without its file).
                    if self.backend.contains(key):
                        self.report(
                            MISSING,
                            bytes(key).hex(),
                            f"object {bytes(key).hex()} is listed but its bytes cannot be read",
                        )
                    continue
                self.check(key, data, "", "")
            self._tick()

    def _tick(self) -> None:
        if self.progress:
            self.progress(self.checked)

    def result(self, refs: int) -> FsckReport:
        problems = list(self.problems.values())
        return FsckReport(ok=not problems, objects=self.checked, refs=refs, problems=problems)


def fsck(store: Store, *, progress: Progress | None = None) -> FsckReport:
    """Re-hash every stored object, check it decodes and is canonical, and check that the
    closure of every ref is complete. ``progress`` gets the number of objects checked."""
    checker = _Checker(store, progress)
    refs = list(store.refs.items())
    checker.walk((oid, name) for name, oid in refs)
    checker.scan()
    return checker.result(len(refs))


def verify_closure(
    store: Store, roots: Iterable[ObjectId | str], *, progress: Progress | None = None
) -> FsckReport:
    """The checks of `fsck`, restricted to the closure of ``roots``."""
    checker = _Checker(store, progress)
    checker.walk(_unreffed(roots))
    return checker.result(0)


def _unreffed(roots: Iterable[ObjectId | str]) -> Iterator[tuple[ObjectId, str]]:
    for r in roots:
        yield parse_id(r), ""
