"""Push, pull and clone: copy refs, and the objects they reach, between any two stores.

Only what the other side lacks travels. The walk starts at the roots and asks the
destination which ids of a whole frontier it is missing (one `Backend.missing` call per
level of the DAG, which a remote answers from its pack index and one listing, in the
manner of Bazel's FindMissingBlobs). Sync writes an object only once every object it links
to is durably there (children in an earlier batch than their parents), so a killed push or
pull leaves no object without its closure, and running it again finishes it.

Presence is not trusted. A store damaged by another writer (an import killed before this
rule held for it, a copy made around the store) has objects whose children are missing,
and a walk that stopped at every object the destination has would never mend them. So
the walk goes on below an object the destination has, reading its links on the cheap side
(`Present`): a push reads them from the source (local), a pull reads the destination's
own copy and re-hashes it, and sends again a copy that is corrupt (the backend's put
replaces it). It stops only at the destination's current values of the refs it moves:
a ref is set only once its closure is stored, so the closure of the old value of a ref is
not read again when the new value links it (the common case: a new version of a set).
The cost is one local read of what the new values reach beyond the old ones, about that
of `Store.walk` over it (100,000 objects shared but not through the old value: 1.2 s
against 1.2 s for the walk, on a loaded 2-core machine). A hole found below an object the
destination has is filled in the same run; an object written above it has all its own
links, and the hole is there to be found by the next run if this one is killed.

Every object read from the source is verified before it is written: its bytes must hash
to its id (else `IntegrityError`, naming the id and the source, and nothing of the
unwritten batch is stored) and be canonical (else `InvalidObject`), as
`Store.put_raw_many` checks them. Objects are read in batches sized from the previous
batch's mean object size (about `READ_BYTES` each) and written in batches of up to
`WRITE_BYTES` / `WRITE_ITEMS`, one backend ``put_many`` each: one pack on a remote. A
corrupt or missing object of the source is found before anything is written.

Refs. For each ref, with S its value on the source and D its value on the destination
when the sync starts:

* D == S: nothing to do, and nothing more is read: a push with nothing new costs one
  read of each ref on the destination (one GET on s3).
* D absent: the ref is created, create-only.
* Otherwise S replaces D if S *supersedes* D: D is reachable from S (S was made from
  D), or D appears in the source's history of that ref (the source saw D and moved
  on). If not, moving the ref would lose an update made elsewhere: it is refused with
  `RefRejected` unless ``force=True`` (pull first, and combine).

The update is a compare-and-swap from D, so a writer that moved the ref meanwhile makes
it fail with `ConflictError` naming the current value: no update is ever lost. A failing
ref does not stop the others; the error raised at the end carries the full report as
``.report``. A ref deleted on the source is left alone on the destination.

Update policies. The update runs through the destination's `Refs`, so the policies of the
ref's name (`medomni_cas.store.policies`) decide it on the destination, from the records
themselves: a fast-forward by the rules above is not enough for them (a shrunk task set is
refused even though the old one sits in the source's history). A refused ref is reported
as ``refused`` and raises `RefPolicyRefused`. ``force=True`` overrides both the
fast-forward rule and the policies, and the destination's history records the update as
forced, with ``message``.

Order and memory. A transfer plans, then writes (`_Sender`): the walk gives every object a
depth below every object to be written that links it, keeping the bytes of those dst lacks
(`medomni_cas.store._sendplan.SendPlan`: in memory, or sorted runs of records and a spool
file beyond a bound, never mapped), and the levels are then written deepest first.
Nothing is written before the whole closure is read and checked, and what is held is
bounded: the plan and each level's ids spill to disk, a write batch is at most
`WRITE_ITEMS` objects (fewer for a backend that asks, `Backend.write_batch_items`: LMDB
holds a write's pages in memory until it commits) and `WRITE_BYTES`, and the pages of a
local store read are given back past a budget (`medomni_cas.store._mapped.note`).

Limit: the walk costs one presence round trip per level of the DAG, so a long chain
(each object linking only the previous one) costs one round trip per link.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from itertools import compress
from typing import Literal, NamedTuple, cast

import blake3
import msgspec

from medomni_cas._gcpause import gc_paused
from medomni_cas.errors import ConflictError, IntegrityError, InvalidObject, NotFound
from medomni_cas.store import encoding
from medomni_cas.store._crash import crash_point
from medomni_cas.store._fast import BatchReader, mismatches
from medomni_cas.store._sendplan import SendPlan
from medomni_cas.store._spill import IdList, spill_bound
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.policies import RefPolicyRefused
from medomni_cas.store.refs import check_ref_name
from medomni_cas.store.store import Store

__all__ = [
    "Present",
    "READ_BYTES",
    "WRITE_BYTES",
    "WRITE_ITEMS",
    "RefChange",
    "RefRejected",
    "SyncProgress",
    "SyncReport",
    "clone",
    "pull",
    "push",
    "send",
    "transfer",
]

#: A read batch asks for about this many bytes (judged from the previous batch).
READ_BYTES = 16 << 20
#: A write batch holds at most this many bytes…
WRITE_BYTES = 64 << 20
#: …and this many objects.
WRITE_ITEMS = 65_536
_FIRST_READ = 16  # objects in a level's first read batch, and in every one at least
_MAX_READ = 16_384  # objects per read batch: what a batch holds (bytes, links) is bounded
_MISSING_CHUNK = 32_768  # ids of a level asked of the destination at a time

CREATED = "created"
UPDATED = "updated"
UNCHANGED = "unchanged"
REJECTED = "rejected"
CONFLICT = "conflict"
REFUSED = "refused"


class SyncProgress(NamedTuple):
    """Where a transfer is: ids checked at the destination, objects and bytes written."""

    checked: int
    sent: int
    bytes: int


Callback = Callable[[SyncProgress], None]


class RefChange(msgspec.Struct, omit_defaults=True):
    """What happened to one ref: ``status`` is created, updated, unchanged, rejected (not a
    fast-forward), refused (by an update policy: ``reason`` says why) or conflict (moved
    meanwhile). Ids are hex; ``old`` is the destination's value when the sync started,
    ``new`` the source's, ``current`` the destination's value after a conflict."""

    name: str
    status: str
    old: str | None = None
    new: str | None = None
    current: str | None = None
    reason: str = ""


class SyncReport(msgspec.Struct):
    """A sync: the two stores, what was written (objects, bytes), how many ids were
    checked at the destination, and each ref's fate."""

    src: str
    dst: str
    objects: int = 0
    bytes: int = 0
    checked: int = 0
    refs: list[RefChange] = []

    @property
    def ok(self) -> bool:
        return all(r.status not in (REJECTED, CONFLICT, REFUSED) for r in self.refs)


class RefRejected(ConflictError):
    """Moving a ref would drop a value the source never saw (not a fast-forward).

    ``current`` is the destination's value, ``incoming`` the source's (hex)."""

    def __init__(self, name: str, dst_url: str, current: str, incoming: str, src_url: str):
        super().__init__(name, current, current)
        self.args = (
            f"{dst_url}: ref {name!r} is {current}, which {incoming} from {src_url} neither "
            "descends from nor has in its history; pull and combine first, or force",
        )
        self.incoming = incoming
        self.report: SyncReport | None = None


def _hex(oid: bytes | None) -> str | None:
    return None if oid is None else bytes(oid).hex()


# -- objects ---------------------------------------------------------------------------------
#: How a transfer treats an object the destination already has: "trust" stops the walk
#: there; "src" reads its links from the source (the cheap side of a push) and walks on;
#: "dst" reads the destination's copy (the cheap side of a pull), re-hashed, and walks on;
#: a copy that is corrupt or gone is sent again, and the backend's put replaces it.
Present = Literal["trust", "src", "dst"]


class _Sender:
    """One transfer of closures from ``src`` to ``dst`` (see the module docstring).

    Two passes. The plan: a walk from the roots, a level at a time, asks dst which ids of
    the level it lacks, reads and checks those from src (keeping their bytes in the
    `SendPlan`) and reads the links of those dst has on the cheap side (`Present`). Every
    id met gets a depth, one more than the level that met it first; a link from an object
    dst lacks to an object met at a depth not below that object's is moved one level
    deeper than it (and what it links is looked at again from there), so that every
    object to be written is deeper than every object to be written that links it. Then
    the levels are written deepest first, each level's batches flushed before the next
    level's first: a child is in an earlier batch than its parents. What is held in
    memory is bounded: the plan and each level spill to disk beyond a bound.
    """

    def __init__(
        self,
        src: Store,
        dst: Store,
        progress: Callback | None,
        present: Present,
        trusted: Iterable[bytes],
    ) -> None:
        self.src, self.dst = src, dst
        self.progress = progress
        self.present = present
        self.trusted = set(trusted)
        self.buffer: list[tuple[bytes, bytes]] = []
        self.buffer_bytes = 0
        self.checked = self.sent = self.nbytes = 0
        self.reader = BatchReader()
        # ids per write batch: a backend whose write holds every page it touches in memory
        # until it commits (LMDB) asks for fewer (`Backend.write_batch_items`)
        self.write_items = min(WRITE_ITEMS, dst.backend.write_batch_items or WRITE_ITEMS)
        self._list_bound = max(1, spill_bound() // 8)

    @gc_paused  # a plan's records and levels, kept to the end (`medomni_cas._gcpause`)
    def run(self, roots: Iterable[bytes]) -> None:
        with SendPlan() as plan:
            levels = self._plan(plan, list(dict.fromkeys(roots)))
            try:
                self._write(plan, levels)
            finally:
                for level in levels:
                    level.close()

    def _idlist(self, ids: Iterable[bytes] = ()) -> IdList:
        return IdList(ids, bound=self._list_bound)

    # -- the plan ----------------------------------------------------------------------------
    def _plan(self, plan: SendPlan, roots: list[bytes]) -> list[IdList]:
        """Walk the closures of ``roots``; per depth, the ids dst lacks that may be written
        at that depth (`_write` keeps those whose depth it still is)."""
        fresh, again = self._idlist(), self._idlist()
        plan.meet(roots, 0, deepen=False)
        plan.settle(fresh, again)
        levels: list[IdList] = []
        depth = 0
        try:
            while fresh or again:
                writes = self._idlist()
                levels.append(writes)
                for part in fresh.batches(_MISSING_CHUNK):
                    self._fresh(plan, part, depth, writes)
                self._deepened(plan, again, depth, writes)
                # the level's links, met above, in one pass over the plan
                nxt, deeper = self._idlist(), self._idlist()
                plan.settle(nxt, deeper)
                fresh.close()
                again.close()
                fresh, again = nxt, deeper
                depth += 1
        except BaseException:
            for level in levels:
                level.close()
            raise
        finally:
            fresh.close()
            again.close()
        return levels

    def _fresh(self, plan: SendPlan, part: list[bytes], depth: int, writes: IdList) -> None:
        """Ids met for the first time at ``depth``: asked of dst, read, planned."""
        absent = set(self._missing(part))
        if self.present == "trust":
            part = [k for k in part if k in absent]
        elif not self.trusted.isdisjoint(part):
            part = [k for k in part if k in absent or k not in self.trusted]
        for keys, datas, links in self._level(part, absent):
            if not keys:  # dst has them: only their links matter
                plan.meet(links, depth + 1, deepen=False)
                continue
            plan.hold(list(zip(keys, datas, strict=True)), depth)
            writes.extend(keys)
            plan.meet(links, depth + 1, deepen=True)

    def _deepened(self, plan: SendPlan, again: IdList, depth: int, writes: IdList) -> None:
        """Ids moved to ``depth`` (met before, higher up): those to be written are planned
        here, and what they link moved below them."""
        for items in plan.select(again, depth):
            keys = [k for k, _ in items]
            writes.extend(keys)
            ids, _, errors = self.reader.links([data for _, data in items], owners=False)
            if errors:  # cannot happen: they were checked when read
                j, e = next(iter(errors.items()))
                raise InvalidObject(f"object {bytes(keys[j]).hex()} in {self.src.url}: {e}")
            plan.meet(ids, depth + 1, deepen=True)

    def _level(
        self, frontier: list[bytes], absent: set[bytes]
    ) -> Iterator[tuple[list[bytes], list[bytes], list[bytes]]]:
        """``(keys, bytes, links)`` of batches of the keys of a level that dst lacks, read
        from the source and checked; ``([], [], links)`` for a batch of those dst has, their
        links read on the cheap side (`Present`). A copy found corrupt or gone at dst is
        read from the source as one it lacks."""
        lacking = [k for k in frontier if k in absent]
        have = [k for k in frontier if k not in absent]
        store = self.dst if self.present == "dst" else self.src
        for i in range(0, len(have), _MAX_READ):
            again = yield from self._links(store, have[i : i + _MAX_READ])
            lacking += again
        # each level's reads start small and grow (at most 4 times the ids of the read
        # before): a level of large objects after one of small ones (a job's column blobs
        # after its runs) is otherwise read 16,384 at a time (seen: 111 blobs of 1 MB at
        # once, held twice over by the plan's spool write)
        i, step = 0, _FIRST_READ
        while i < len(lacking):
            part = lacking[i : i + step]
            i += len(part)
            datas, links = self._read(part)
            yield part, datas, links
            mean = max(sum(map(len, datas)) // len(part), 1)
            step = max(_FIRST_READ, min(_MAX_READ, READ_BYTES // mean, 4 * len(part)))

    def _links(
        self, store: Store, keys: list[bytes]
    ) -> Generator[tuple[list[bytes], list[bytes], list[bytes]], None, list[bytes]]:
        """``([], [], links)``: the links of the copies of ``keys`` in ``store``, re-hashed,
        in one list; returns the keys whose copy is corrupt or gone (at dst: sent again; at
        src: an error)."""
        got = store.backend.get_list(keys)
        here = [data is not None for data in got]  # not truthiness: b"" is an object
        bad = [] if all(here) else list(compress(keys, map(operator.not_, here)))
        keys = list(compress(keys, here))
        datas = cast("list[bytes]", list(compress(got, here)))
        corrupt = mismatches(keys, datas)
        if corrupt:
            bad += [keys[j] for j in corrupt]
            fine = sorted(set(range(len(keys))) - set(corrupt))
            keys, datas = [keys[j] for j in fine], [datas[j] for j in fine]
        if bad and store is self.src:
            raise NotFound("object", f"{bytes(bad[0]).hex()} (in {self.src.url}, unreadable)")
        ids, _, errors = self.reader.links(datas, owners=False)
        if errors:
            j, e = next(iter(errors.items()))
            raise InvalidObject(f"object {bytes(keys[j]).hex()} in {store.url}: {e}")
        yield [], [], ids  # the links of the whole batch at once: only they matter
        return bad

    def _missing(self, keys: list[bytes]) -> list[bytes]:
        missing = self.dst.backend.missing(keys)
        self.checked += len(keys)
        self._tick()
        return missing

    def _read(self, keys: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        """The bytes of ``keys`` and the links of all of them, checked (hashed, canonical):
        a batch at a time in a few C-level passes (`BatchReader.check`); the first problem,
        in the order of ``keys``, raised."""
        got = self.src.backend.get_list(keys)
        if None in got:  # not truthiness: b"" is an object
            key = keys[next(i for i, data in enumerate(got) if data is None)]
            raise NotFound("object", f"{bytes(key).hex()} (in {self.src.url})")
        datas = cast("list[bytes]", got)  # no None in it, above
        corrupt = set(mismatches(keys, datas))
        ids, owners, unsure = self.reader.check(datas)
        doubtful = set(unsure)
        if not corrupt and not doubtful:
            return datas, ids
        links: list[list[bytes]] = [[] for _ in keys]
        for link, owner in zip(ids, owners, strict=True):
            links[owner].append(link)
        for j, (key, data) in enumerate(zip(keys, datas, strict=True)):
            if j in corrupt:
                got_hex = blake3.blake3(data).hexdigest()
                raise IntegrityError(bytes(key).hex(), got_hex, self.src.url)
            if j in doubtful:
                links[j] = list(self._check(key, data))
        return datas, [link for each in links for link in each]

    def _check(self, key: bytes, data: bytes) -> list[ObjectId]:
        """The full check of one object: `encoding.validate_canonical`, then its links."""
        try:
            encoding.validate_canonical(data)
            return encoding.links(data)
        except InvalidObject as e:
            raise InvalidObject(f"object {bytes(key).hex()} in {self.src.url}: {e}") from None

    # -- the writes --------------------------------------------------------------------------
    def _write(self, plan: SendPlan, levels: list[IdList]) -> None:
        """Write the plan deepest level first; a level's batches all before the next's."""
        for depth in reversed(range(len(levels))):
            for items in plan.select(levels[depth], depth):
                for key, data in items:
                    self.buffer.append((key, data))
                    self.buffer_bytes += len(data)
                    if len(self.buffer) >= self.write_items or self.buffer_bytes >= WRITE_BYTES:
                        self._flush()
            self._flush()  # the level is written: its parents may come

    def _flush(self) -> None:
        """Write the buffer (one backend ``put_many``)."""
        batch, self.buffer = self.buffer, []
        self.buffer_bytes = 0
        if not batch:
            return
        self.dst.backend.put_many(batch)
        crash_point("write")
        self.sent += len(batch)
        self.nbytes += sum(len(data) for _, data in batch)
        self._tick()

    def _tick(self) -> None:
        if self.progress:
            self.progress(SyncProgress(self.checked, self.sent, self.nbytes))


def send(
    src: Store,
    dst: Store,
    roots: Iterable[ObjectId | bytes],
    *,
    progress: Callback | None = None,
    present: Present = "src",
    trusted: Iterable[bytes] = (),
) -> SyncReport:
    """Copy the closures of ``roots`` from ``src`` to ``dst``, only what ``dst`` lacks.

    ``present`` says how far an object ``dst`` has is trusted (`Present`): by default its
    closure is checked there too, except for the ``trusted`` ids (the values of ``dst``'s
    refs: a ref is set only once its closure is stored), where the walk stops. No ref
    changes. A missing object in ``src`` raises `NotFound`; a corrupt one
    `IntegrityError`. Returns a report with no refs."""
    sender = _Sender(src, dst, progress, present, trusted)
    sender.run(bytes(r) for r in roots)
    return SyncReport(
        src=src.url, dst=dst.url, objects=sender.sent, bytes=sender.nbytes, checked=sender.checked
    )


# -- refs ------------------------------------------------------------------------------------
def _ref_values(store: Store, names: list[str]) -> dict[str, bytes | None]:
    """The value of each ref, read in one batch where the backend can (remote: concurrently)."""
    for name in names:
        check_ref_name(name)
    get_many = getattr(store.backend, "ref_get_many", None)
    values = get_many(names) if get_many is not None else [store.backend.ref_get(n) for n in names]
    return {n: None if v is None else bytes(v) for n, v in zip(names, values, strict=True)}


def _reachable(store: Store, target: bytes, start: bytes) -> bool:
    return any(oid == target for oid, _ in store.walk([ObjectId(start)], allow_missing=True))


def _in_history(store: Store, name: str, value: bytes) -> bool:
    return any(value in (e.old, e.new) for e in store.refs.history(name))


def _supersedes(
    src: Store, dst: Store, local: Literal["src", "dst"], name: str, old: bytes, new: bytes
) -> bool:
    """Whether ``new`` (from src) may replace ``old`` (at dst); the cheap checks first:
    walks run on the local side, which holds the closure of ``new``."""
    if local == "src":
        return _in_history(src, name, old) or _reachable(src, old, new)
    return _reachable(dst, old, new) or _in_history(src, name, old)


def transfer(
    src: Store,
    dst: Store,
    refs: Sequence[str] | None = None,
    *,
    force: bool = False,
    message: str = "",
    progress: Callback | None = None,
    local: Literal["src", "dst"] = "src",
    verb: str = "sync",
) -> SyncReport:
    """Copy ``refs`` (default: every ref of ``src``) and their closures to ``dst``.

    ``local`` names the side that is cheap to walk (it decides where the fast-forward
    check runs); ``verb`` goes into the destination's ref history, with ``message`` (why
    a person forces it). See the module docstring for the rules; raises `RefRejected`,
    `RefPolicyRefused` or `ConflictError` (with ``.report``) after the other refs are
    done."""
    if refs is None:
        src_refs = {name: bytes(v) for name, v in src.refs.items()}
    else:
        src_refs = {}
        for name, value in _ref_values(src, list(dict.fromkeys(refs))).items():
            if value is None:
                raise NotFound("ref", f"{name} (in {src.url})")
            src_refs[name] = value
    changes: dict[str, RefChange] = {}
    before = _ref_values(dst, list(src_refs))
    todo: list[str] = []
    for name, new in src_refs.items():
        if before[name] == new:
            changes[name] = RefChange(name, UNCHANGED, _hex(new), _hex(new))
        else:
            todo.append(name)
    if todo:
        dst.refs.check_writable()  # before anything is sent

    def rejected(name: str) -> bool:
        old = before[name]
        if force or old is None:
            return False
        if _supersedes(src, dst, local, name, old, src_refs[name]):
            return False
        changes[name] = RefChange(name, REJECTED, _hex(old), _hex(src_refs[name]))
        return True

    if local == "src":
        todo = [n for n in todo if not rejected(n)]
    sent = send(
        src,
        dst,
        [src_refs[n] for n in todo],
        progress=progress,
        present=local,
        trusted=[v for v in before.values() if v is not None],
    )
    if local == "dst":
        todo = [n for n in todo if not rejected(n)]
    note = f"{verb} from {src.url}"
    if force:
        note = f"{verb} --force from {src.url}" + (f": {message}" if message else "")
    elif message:
        note = f"{note}: {message}"
    for name in todo:
        old, new = before[name], src_refs[name]
        try:
            moved = dst.refs.set_if_equals(name, old, new, message=note, force=force)
        except RefPolicyRefused as e:
            changes[name] = RefChange(name, REFUSED, _hex(old), _hex(new), reason=e.reason)
            continue
        if moved:
            changes[name] = RefChange(
                name, CREATED if old is None else UPDATED, _hex(old), _hex(new)
            )
        else:
            current = dst.refs.get(name)
            changes[name] = RefChange(name, CONFLICT, _hex(old), _hex(new), _hex(current))
    sent.refs = [changes[n] for n in src_refs]
    _raise_failures(sent)
    return sent


def _raise_failures(report: SyncReport) -> None:
    for change in report.refs:
        if change.status == REJECTED:
            err: ConflictError = RefRejected(
                change.name, report.dst, change.old or "", change.new or "", report.src
            )
        elif change.status == REFUSED:
            err = RefPolicyRefused(change.name, change.old, change.new, change.reason)
            err.args = (f"{report.dst}: {err.args[0]}",)
        elif change.status == CONFLICT:
            err = ConflictError(change.name, change.old, change.current)
            err.args = (f"{report.dst}: {err.args[0]}",)
        else:
            continue
        err.report = report
        raise err


def push(
    local: Store,
    remote: Store,
    refs: Sequence[str] | None = None,
    *,
    force: bool = False,
    message: str = "",
    progress: Callback | None = None,
) -> SyncReport:
    """Send ``refs`` (default: all of ``local``'s) and what they reach to ``remote``."""
    return transfer(
        local, remote, refs, force=force, message=message, progress=progress, verb="push"
    )


def pull(
    local: Store,
    remote: Store,
    refs: Sequence[str] | None = None,
    *,
    force: bool = False,
    message: str = "",
    progress: Callback | None = None,
) -> SyncReport:
    """Fetch ``refs`` (default: all of ``remote``'s) and what they reach into ``local``."""
    return transfer(
        remote,
        local,
        refs,
        force=force,
        message=message,
        progress=progress,
        local="dst",
        verb="pull",
    )


def clone(
    url: str,
    dest: str,
    *,
    refs: Sequence[str] | None = None,
    progress: Callback | None = None,
    single_writer: bool = False,
) -> SyncReport:
    """Make the store at ``dest`` a copy of the store at ``url`` (all refs, or ``refs``).

    ``dest`` must have no refs yet: to update a store, pull into it."""
    from medomni_cas.store.url import open_store

    with open_store(url, create=False) as src, open_store(dest, single_writer=single_writer) as dst:
        if next(iter(dst.refs), None) is not None:
            raise ValueError(
                f"{dest} already has refs; clone makes a new store (pull to update one)"
            )
        return pull(dst, src, refs, progress=progress)
