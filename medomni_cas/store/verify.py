"""Verification: re-hash stored objects, check they decode, and check that closures are whole.

`fsck` checks every object a backend holds and the closure of every ref; `verify_closure`
checks only what some roots reach (an audit of one result). Both read through the backend
in batches and never raise for a bad object: each finding becomes a `Problem` in the report.

Order of work: first the closures are walked (so a problem found there names the ref and the
parent that reach it), then `fsck` lists the backend and checks the objects the walk did not
reach. Each object is read and hashed once, and decoded once. A batch is worked in a few
C-level passes (`medomni_cas.store._links`): hashed and compared with its keys in one go,
then each kind's objects decoded by a mirror of their record class and re-encoded, which is
the canonical check and gives their links; a kind without a mirror is checked by one decode
whose extension hook notes the links and one re-encode, once one object of the kind has
passed the full check (`encoding.validate_canonical`, then `encoding.links`). Any doubt sends
an object through the full check, which says what is wrong with it. Links met before are
dropped by set operations; the object that links a missing one is looked for only when one
is missing (the level above is read again).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import compress
from typing import TYPE_CHECKING

import blake3
import msgspec

from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store._links import batch_check, batch_links, mismatches, unseen
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
_BATCH = 4096
_FIRST_BYTE = operator.itemgetter(0)
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
        self.bad: set[bytes] = set()  # corrupt or malformed: their links are not followed
        self.checked = 0
        self.problems: dict[tuple[str, str], Problem] = {}
        # kinds without a mirror: one decode whose link hook collects the links, one
        # re-encode; kinds (with versions) are admitted to it by passing the full check once
        self._kinds: set[tuple[str, int]] = set()
        self._found: list[ObjectId] = []
        self._decoder = msgspec.msgpack.Decoder(ext_hook=_noting_hook(self._found.append))

    def report(self, kind: str, key: str, message: str, ref: str = "") -> None:
        self.problems.setdefault((kind, key), Problem(kind, key, message, ref))

    # -- one batch ---------------------------------------------------------------------------
    def check_batch(self, keys: list[bytes], datas: list[bytes], where: str, ref: str) -> list:
        """The links of the sound objects of a batch (repeats included); the others are
        reported."""
        self.checked += len(keys)
        keys, datas = self._hashed(keys, datas, where, ref)
        ids, _, doubtful = batch_check(datas, owners=False)
        for j in doubtful:
            ids += self.check(keys[j], datas[j], where, ref) or ()
        return ids

    def _hashed(
        self, keys: list[bytes], datas: list[bytes], where: str, ref: str
    ) -> tuple[list[bytes], list[bytes]]:
        """The objects whose bytes hash to their key; the others reported."""
        wrong = [] if set(map(len, keys)) == {ID_SIZE} else [len(k) != ID_SIZE for k in keys]
        for key in compress(keys, wrong):
            self.report(
                MALFORMED, key.hex(), f"stored key {key.hex()} of {len(key)} bytes is not an id"
            )
        if wrong:
            keys, datas = _drop(keys, datas, wrong)
        corrupt = mismatches(keys, datas)
        if not corrupt:
            return keys, datas
        for j in corrupt:
            oid, digest = keys[j].hex(), blake3.blake3(datas[j]).hexdigest()
            self.report(
                CORRUPT, oid, f"object {oid} is corrupt{where}: its bytes hash to {digest}", ref
            )
            self.bad.add(keys[j])
        flags = [False] * len(keys)
        for j in corrupt:
            flags[j] = True
        return _drop(keys, datas, flags)

    def check(self, key: bytes, data: bytes, where: str, ref: str) -> list[ObjectId] | None:
        """The links of a sound object, or None (after reporting) for a bad one: by the
        one-decode path for an admitted kind, else by the full check."""
        found = self._fast_links(data)
        if found is not None:
            return found
        try:
            kind = encoding.validate_canonical(data)
            found = encoding.links(data)
        except InvalidObject as e:
            oid = key.hex()
            self.report(MALFORMED, oid, f"object {oid}{where}: {e}", ref)
            self.bad.add(key)
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

    # -- walks ---------------------------------------------------------------------------------
    def walk(self, roots: Iterable[tuple[ObjectId, str]]) -> None:
        """Check the closure of each ``(root, ref name or "")``, reporting missing links."""
        for root, ref in roots:
            if root in self.seen:
                if ref and root in self.absent:  # another ref reached it first
                    self._report_missing(root, None, ref)
                continue
            self.seen.add(root)
            via = f" (reached from ref {ref})" if ref else ""
            above: list[bytes] = []  # the level above the frontier
            frontier: list[bytes] = [root]
            while frontier:
                # read close together in key order (LMDB's page order, ~1.5x faster)
                frontier.sort(key=_FIRST_BYTE)
                nxt: list[bytes] = []
                gone: list[bytes] = []
                for i in range(0, len(frontier), _BATCH):
                    keys = frontier[i : i + _BATCH]
                    keys, datas, absent = _present(keys, self.backend.get_list(keys))
                    gone += absent
                    nxt += unseen(self.seen, self.check_batch(keys, datas, via, ref))
                    self._tick()
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
        keys = [k for k in self.backend.iter_keys() if k not in self.seen]
        for i in range(0, len(keys), _BATCH):
            part, datas, gone = _present(
                keys[i : i + _BATCH], self.backend.get_list(keys[i : i + _BATCH])
            )
            for key in gone:
                # Listed but unreadable: gone since the listing (a concurrent gc), or its
                # bytes are lost (an LMDB large-object marker without its file).
                if self.backend.contains(key):
                    self.report(
                        MISSING,
                        bytes(key).hex(),
                        f"object {bytes(key).hex()} is listed but its bytes cannot be read",
                    )
            self.check_batch(part, datas, "", "")
            self._tick()

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


def _drop(
    keys: list[bytes], datas: list[bytes], flags: list[bool]
) -> tuple[list[bytes], list[bytes]]:
    keep = list(map(operator.not_, flags))
    return list(compress(keys, keep)), list(compress(datas, keep))


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
