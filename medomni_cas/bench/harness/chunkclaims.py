"""Which of a job's slots this harness runs: claimed a chunk at a time, recorded in batches.

A job's slots are grouped in chunks (`medomni_cas.bench.slottables`). A runner that pulls
its trials one at a time (`Runner.claims_each`, the process runner) asks `JobClaims.claim`
just before it starts each one; the first slot of a chunk claims the whole chunk (one
claim ref, `medomni_cas.bench.harness.claims`), so harnesses sharing a store share a job
chunk by chunk: a fast host takes more chunks than a slow one. For other runners (a batch
system that takes the whole list) every chunk is claimed before the runner starts
(`claim_all`).

A claim is not enough: between the harness's resume check and its claim, another harness
may have run the chunk's slots and released it. So once claimed, the chunk's table is read
again; a slot that moved since the plan is not run (it is done).

Recording. A finished run's objects wait in a `RunBatch` (`add`); `flush` writes the
batch's objects at once (one pack on a remote store), then moves each chunk's table ref by
compare-and-swap from the table this harness last saw, after checking that the chunk's
claim is still its own. A lost race (a harness that took the chunk over after this one's
lease lapsed recorded it meanwhile) is read again: runs of slots that moved are dropped, as
a slot's run is recorded once. `flush` runs when `due`: on a local store after every run;
on a remote one (where each write is a request) after a chunk's worth of runs, a chunk
whose runs are all in (its claim is then released), or runs waiting longer than a quarter
of the lease; a harness killed before it loses at most those runs, which another harness
runs again once the lease lapses.

A slot whose chunk another live harness holds is set aside (`waiting`); once the runner has
run what it could, the harness looks at those again (`retry`): a slot recorded meanwhile is
done, one whose holder died (or whose lease lapsed) is taken over and run here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from medomni_cas.bench.harness.claims import Holder, Lease
from medomni_cas.bench.recording import RunBatch
from medomni_cas.bench.records import RunRecord
from medomni_cas.bench.refnames import chunk_ref
from medomni_cas.bench.runners import TrialSpec
from medomni_cas.bench.slottables import (
    CHUNK_SLOTS,
    SlotChunk,
    State,
    chunk_ids,
    chunk_table,
    read_chunks,
    state_of,
)
from medomni_cas.errors import MedomniError
from medomni_cas.store import encoding
from medomni_cas.store._crash import crash_point
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

__all__ = ["Committed", "JobClaims"]

_RACES = 8  # compare-and-swap rounds on one chunk's table before giving its runs up

#: A run recorded in its chunk's table: (slot, run id, record).
Committed = tuple[ObjectId, ObjectId, RunRecord]


@dataclass
class _Chunk:
    """A chunk this harness holds: its table as last seen, and its runs in flight."""

    table: ObjectId | None
    entries: dict[bytes, ObjectId]
    states: dict[ObjectId, State]  # of the table's runs (empty: a table without states)
    running: int = 0  # claimed slots not yet recorded or given up
    closed: bool = False  # the runner has moved past it: no more slots will be claimed

    def made(self) -> SlotChunk:
        """The table record of these entries and states."""
        return chunk_table(self.entries, self.states)


def _recorded(held: _Chunk, runs: list[Committed]) -> _Chunk:
    """``held``'s table with ``runs`` recorded in it (its id not known yet), each run's
    state from its record."""
    entries = dict(held.entries)
    states = dict(held.states)
    for slot, rid, record in runs:
        entries[bytes(slot)] = rid
        states[rid] = state_of(record)
    return _Chunk(None, entries, states)


@dataclass
class JobClaims:
    """The claims of one job of this harness run; ``slots`` are all the job's slots (the
    chunks are made from them) and ``previous`` maps each slot to run to its latest run
    when the job was planned."""

    store: Store
    lease: Lease
    slots: list[bytes]
    previous: dict[ObjectId, ObjectId | None]
    #: Whether finished runs wait to be recorded together (a remote store, where each write
    #: is a request); on a local one each is recorded as it ends.
    batched: bool = True
    #: Claimed by this harness and not recorded yet.
    specs: dict[ObjectId, TrialSpec] = field(default_factory=dict)
    #: Held by another live harness when last asked, with its holder.
    waiting: dict[ObjectId, tuple[TrialSpec, Holder]] = field(default_factory=dict)
    #: Run and recorded by another harness since the plan.
    moved: set[ObjectId] = field(default_factory=set)
    batch: RunBatch = field(default_factory=RunBatch)
    #: Called with each chunk this harness claims (the staging cache reads its tasks ahead).
    on_claim: Callable[[bytes], object] | None = None
    #: Called with the objects of each batch written (the staging cache keeps a copy).
    on_write: Callable[[list[tuple[ObjectId, bytes]]], object] | None = None

    def __post_init__(self) -> None:
        self.chunk_of = dict(zip(self.slots, chunk_ids(self.slots), strict=True))
        self._held: dict[bytes, _Chunk] = {}
        self._pending: list[Committed] = []
        self._since = 0.0  # monotonic time of the oldest pending run

    # -- claiming ---------------------------------------------------------------------------
    def claim(self, spec: TrialSpec) -> bool:
        """Whether this harness is to run ``spec`` now: its chunk claimed, and still to run."""
        chunk = self.chunk_of[spec.slot]
        held = self._held.get(chunk)
        if held is None:
            holder = self.lease.claim(chunk)
            if holder is not None:
                self.waiting[spec.slot] = (spec, holder)
                return False
            held = self._held[chunk] = _Chunk(*read_chunks(self.store, [chunk])[0])
            if self.on_claim is not None:
                self.on_claim(chunk)
        for other, h in self._held.items():
            if other != chunk:
                h.closed = True  # the runner pulls its trials in order: it is past them
        self._release_idle()  # chunks it is past with nothing left to record
        if self._moved(spec.slot, held.entries):
            self.moved.add(spec.slot)
            return False
        held.running += 1
        self.specs[spec.slot] = spec
        return True

    def _moved(self, slot: bytes, entries: dict[bytes, ObjectId]) -> bool:
        return slot in entries and entries[slot] != self.previous[ObjectId(slot)]

    def claim_all(
        self, trials: list[TrialSpec], check: Callable[[], None] | None = None
    ) -> list[TrialSpec]:
        """`claim` each of ``trials`` (calling ``check`` first, if given); those claimed."""
        out = []
        for t in trials:
            if check is not None:
                check()
            if self.claim(t):
                out.append(t)
        for h in self._held.values():
            h.closed = True
        return out

    def retry(self) -> list[TrialSpec]:
        """The waiting slots that may run now: those not recorded by their holder since
        (their chunks' tables read in one batch); `claim` tells which this harness gets."""
        if not self.waiting:
            return []
        chunks = list(dict.fromkeys(self.chunk_of[s] for s in self.waiting))
        tables = dict(zip(chunks, (e for _, e, _ in read_chunks(self.store, chunks)), strict=True))
        out, done = [], set(chunks)
        for slot in list(self.waiting):
            spec, _ = self.waiting.pop(slot)
            chunk = self.chunk_of[slot]
            if self._moved(slot, tables[chunk]):
                self.moved.add(slot)
            else:
                out.append(spec)
                done.discard(chunk)
        if done:
            # recorded whole by a harness that may have died before releasing the claim
            self.lease.sweep(done, ())
        return out

    def holders(self) -> list[str]:
        """``"<host> pid <pid>"`` of each slot still held by another harness."""
        return [str(holder) for _, holder in self.waiting.values()]

    # -- recording --------------------------------------------------------------------------
    def add(self, spec: TrialSpec, rid: ObjectId, record: RunRecord) -> None:
        """A run of ``spec`` whose objects are in `batch`, to record at the next `flush`."""
        self.specs.pop(spec.slot, None)
        if not self._pending:
            self._since = time.monotonic()
        self._pending.append((spec.slot, rid, record))

    def give_up(self, slot: ObjectId) -> None:
        """A claimed slot that will not be recorded (the runner reported it ended early)."""
        if self.specs.pop(slot, None) is not None:
            self._held[self.chunk_of[slot]].running -= 1

    def due(self) -> bool:
        """Whether to `flush` now (see the module docstring)."""
        if not self._pending:
            return False
        if not self.batched:
            return True  # a harness killed then loses only its trials in flight
        if len(self._pending) >= CHUNK_SLOTS:
            return True
        if time.monotonic() - self._since >= self.lease.timeout / 4:
            return True
        # a closed chunk with runs pending and none in flight: flushing frees its claim
        flying = {self.chunk_of[s] for s in self.specs}
        pending = {self.chunk_of[s] for s, _, _ in self._pending}
        return any(self._held[c].closed and c not in flying for c in pending)

    def flush(self) -> list[Committed]:
        """Write the pending runs' objects and record them in their chunks' tables; release
        the chunks that are closed and idle. The runs recorded (see the module docstring)."""
        pending, self._pending = self._pending, []
        committed: list[Committed] = []
        if pending:
            by_chunk: dict[bytes, list[Committed]] = {}
            for c in pending:
                by_chunk.setdefault(self.chunk_of[c[0]], []).append(c)
            tables: dict[bytes, tuple[ObjectId, _Chunk]] = {}
            for chunk, runs in by_chunk.items():
                table = _recorded(self._held[chunk], runs)
                tables[chunk] = (self.batch.add(encoding.encode(table.made())), table)
            written = self.batch.write(self.store)  # the runs' objects and tables: one batch
            if self.on_write is not None:
                self.on_write(written)
            crash_point("batch")  # written, not yet recorded: the tests kill a harness here
            for chunk, runs in by_chunk.items():
                committed += self._commit(chunk, runs, *tables[chunk])
                self._held[chunk].running -= len(runs)
        self._release_idle()
        return committed

    def _commit(
        self, chunk: bytes, runs: list[Committed], tid: ObjectId, table: _Chunk
    ) -> list[Committed]:
        held = self._held[chunk]
        ref = chunk_ref(chunk)
        for _ in range(_RACES):
            if not self.lease.holds(chunk):
                return []  # our lease lapsed and another harness took the chunk over
            message = f"{len(runs)} run{'s' * (len(runs) != 1)}"
            if self.store.refs.set_if_equals(ref, held.table, tid, message):
                held.table, held.entries, held.states = tid, table.entries, table.states
                return runs
            # moved under us: keep the runs of slots still where the plan left them
            held.table, held.entries, held.states = read_chunks(self.store, [chunk])[0]
            runs = [r for r in runs if not self._moved(r[0], held.entries)]
            if not runs:
                return []
            table = _recorded(held, runs)
            tid = self.store.put(table.made())
        raise MedomniError(f"{ref}: lost {_RACES} races in a row recording runs")

    def _release_idle(self) -> None:
        flying = {self.chunk_of[s] for s in self.specs}
        for chunk, h in list(self._held.items()):
            if h.closed and h.running <= 0 and chunk not in flying:
                self.lease.release(chunk)
                del self._held[chunk]

    def close(self) -> list[Committed]:
        """At the job's end (or when it stops): record what is pending, release every
        chunk (slots claimed but not run are free for the next try)."""
        for slot in list(self.specs):
            self.give_up(slot)
        for h in self._held.values():
            h.closed = True
        return self.flush()
