"""Slot tables: the latest run of each slot of a chunk of a job, under one ref per chunk.

Why
---
On an object store each ref update costs three requests and there is no conditional write
of many keys at once, so one ref per run slot (``runs/slots/<slot>``) costs a harness about
ten requests per run (claim, slot ref, release). A job's slots are therefore grouped in
chunks of `CHUNK_SLOTS` consecutive slots (in the arm's atom order); a harness claims a
chunk at a time (`medomni_cas.bench.harness.chunkclaims`) and records the runs of a chunk
as one `SlotChunk` record under ``runs/chunks/<chunk>``, moved by compare-and-swap: one
ref update for a batch of runs.

Reading
-------
`latest_runs` is what every reader of a slot's latest run calls (resume, the job report,
the claims' re-check, replay): the per-slot refs of stores written before chunks, overlaid
by the chunk tables (a chunk's entry is newer: a run recorded under chunks links the
per-slot ref's run as its ``previous``). `slot_runs` lists every slot of a store that way.

States
------
A table also holds each run's `State` (its outcome, attempt and whether its answer met its
arm), copied from the record by the harness that wrote both, so that resume reads a job's
tables and none of its runs: a table per 16 slots instead of a run record per slot, read at
random from a store far larger than the job (at 320k slots in a store of 1.7M objects, the
runs' reads grew 1.4x faster than the work). `latest_states` gives them. Tables written
before states were added have none (the field is optional: their ids stay) and the runs of
such a table are read, as before. A table holds a state for every run or for none.

A state is a copy, not a new fact: whoever can write a table can as well write a run record
saying the same, and a score reads the run records themselves, never the tables.

A chunk's id is ``hash("medomni.slot-chunk", its slots' ids)``: every harness of a job
makes the same chunks from the same slots, so their claims exclude each other. The chunk
size is part of the names on disk: it is forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from medomni_cas.bench.records import RunRecord
from medomni_cas.bench.refnames import CHUNK_REFS, SLOT_REFS
from medomni_cas.errors import InvalidObject, MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.encoding import Record
from medomni_cas.store.ids import ID_SIZE, ObjectId, hash_bytes
from medomni_cas.store.store import Store

__all__ = [
    "CHUNK_SLOTS",
    "SlotChunk",
    "State",
    "chunk_ids",
    "chunk_table",
    "latest_run",
    "latest_runs",
    "latest_states",
    "read_chunks",
    "slot_runs",
    "state_of",
]

#: Slots per chunk: a claim and a table per this many runs (forever: it names the chunks).
CHUNK_SLOTS = 16

#: A run as resume sees it: its outcome, its attempt, whether its answer met its arm (the
#: fields of `medomni_cas.bench.harness.RunState`, in its order).
State = tuple[str, int, bool]


def state_of(record: RunRecord) -> State:
    """``record``'s state, as its table holds it."""
    return (record.outcome, record.attempt, record.agent_block.meets_arm)


class SlotChunk(Record, frozen=True, kw_only=True):
    """The latest run of each slot of one chunk that has one recorded under chunks."""

    __kind__ = "medomni.slot-chunk"

    slots: bytes  # the 32-byte slot ids, concatenated, ascending
    runs: tuple[ObjectId, ...]  # the latest run of each, in the same order
    # each run's state, in the same order; empty in tables written before states were kept
    states: tuple[State, ...] = ()

    def entries(self) -> dict[bytes, ObjectId]:
        """Slot id -> its latest run."""
        s = self.slots
        if len(s) != ID_SIZE * len(self.runs):
            raise InvalidObject(f"slot chunk: {len(s)} bytes of slots for {len(self.runs)} runs")
        return {s[i * ID_SIZE : (i + 1) * ID_SIZE]: r for i, r in enumerate(self.runs)}

    def run_states(self) -> dict[ObjectId, State]:
        """Run -> its state, as this table holds them (empty: a table without states)."""
        if not self.states:
            return {}
        if len(self.states) != len(self.runs):
            raise InvalidObject(f"slot chunk: {len(self.states)} states for {len(self.runs)} runs")
        return dict(zip(self.runs, self.states, strict=True))


def chunk_table(
    entries: Mapping[bytes, ObjectId], states: Mapping[ObjectId, State] | None = None
) -> SlotChunk:
    """The table of ``entries`` (slot -> latest run), in its canonical order, with each
    run's state from ``states`` when it has one for every run (else with none)."""
    order = sorted(entries)
    runs = tuple(entries[s] for s in order)
    held: tuple[State, ...] = ()
    if states is not None and all(r in states for r in runs):
        held = tuple((str(o), int(a), bool(m)) for o, a, m in (states[r] for r in runs))
    return SlotChunk(slots=b"".join(order), runs=runs, states=held)


def chunk_ids(slots: Sequence[bytes]) -> list[bytes]:
    """The chunk of each of a job's ``slots`` (all of them, in the arm's atom order)."""
    out: list[bytes] = []
    for i in range(0, len(slots), CHUNK_SLOTS):
        part = slots[i : i + CHUNK_SLOTS]
        chunk = bytes(hash_bytes(b"medomni.slot-chunk\0" + b"".join(part)))
        out += [chunk] * len(part)
    return out


#: A chunk's table as read: its id (None: no table yet), slot -> latest run, run -> state.
Table = tuple[ObjectId | None, dict[bytes, ObjectId], dict[ObjectId, State]]


def read_chunks(store: Store, chunks: Sequence[bytes]) -> list[Table]:
    """Each chunk's table id (None: no table yet), entries and states: one batch of ref
    reads, one of verified object reads."""
    if not chunks:
        return []
    tables = store.refs.get_many_by_id(CHUNK_REFS, list(chunks))
    present = [t for t in dict.fromkeys(tables) if t is not None]
    decoded: dict[ObjectId, tuple[dict[bytes, ObjectId], dict[ObjectId, State]]] = {}
    for tid, data in store.get_raw_many(present):
        try:
            table = encoding.decode_body(data, SlotChunk)
            decoded[tid] = (table.entries(), table.run_states())
        except InvalidObject as e:
            raise MedomniError(f"slot chunk table {tid}: {e}") from None
    return [(None, {}, {}) if t is None else (t, *decoded[t]) for t in tables]


def latest_states(
    store: Store, slots: Sequence[bytes]
) -> tuple[list[ObjectId | None], dict[ObjectId, State]]:
    """The latest run of each of a job's ``slots`` (all of them, in the arm's atom order;
    None: never run), the per-slot refs overlaid by the chunk tables; and the states the
    tables hold of those runs (a run not in it is read for its state)."""
    if not slots:
        return [], {}
    lasts = store.refs.get_many_by_id(SLOT_REFS, slots)
    chunks = chunk_ids(slots)
    unique = list(dict.fromkeys(chunks))
    tables: dict[bytes, dict[bytes, ObjectId]] = {}
    states: dict[ObjectId, State] = {}
    for chunk, (_, entries, held) in zip(unique, read_chunks(store, unique), strict=True):
        tables[chunk] = entries
        states.update(held)
    latest = [tables[c].get(s, last) for s, c, last in zip(slots, chunks, lasts, strict=True)]
    return latest, states


def latest_runs(store: Store, slots: Sequence[bytes]) -> list[ObjectId | None]:
    """`latest_states`' runs alone."""
    return latest_states(store, slots)[0]


def latest_run(store: Store, slots: Sequence[bytes], i: int) -> ObjectId | None:
    """`latest_runs` of slot ``slots[i]`` alone (a job's ``slots``: its chunk is made of
    them): its per-slot ref and its chunk's table."""
    start = i - i % CHUNK_SLOTS
    chunk = chunk_ids(slots[start : start + CHUNK_SLOTS])[0]
    _, entries, _ = read_chunks(store, [chunk])[0]
    last = entries.get(bytes(slots[i]))
    if last is None:
        last = store.refs.get_many_by_id(SLOT_REFS, [slots[i]])[0]
    return last


def slot_runs(store: Store) -> dict[str, ObjectId]:
    """Every slot of the store with a run, as ``runs/slots/<slot hex>`` -> its latest run:
    the per-slot refs overlaid by every chunk table."""
    out = dict(store.refs.items(SLOT_REFS))
    tables = [t for _, t in store.refs.items(CHUNK_REFS)]
    for _, data in store.get_raw_many(tables):
        for slot, run in encoding.decode_body(data, SlotChunk).entries().items():
            out[f"{SLOT_REFS}{slot.hex()}"] = run
    return dict(sorted(out.items()))
