"""Test helpers for slot tables: what a harness killed before recording a run leaves."""

from __future__ import annotations

import medomni_cas as mc
from medomni_cas.bench.refnames import CHUNK_REFS
from medomni_cas.bench.slottables import SlotChunk, chunk_table

__all__ = ["forget_run"]


def forget_run(store: mc.Store, slot: bytes) -> None:
    """Take ``slot``'s run out of its chunk's table, as if it had never been recorded."""
    for name, tid in store.refs.items(CHUNK_REFS):
        entries = store.get(tid, SlotChunk).entries()
        if entries.pop(slot, None) is not None:
            store.refs.set(name, store.put(chunk_table(entries)), expected=tid, message="forget")
            return
    raise AssertionError(f"slot {slot.hex()} has no run in any chunk table")
