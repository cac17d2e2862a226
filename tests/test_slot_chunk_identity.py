"""Golden vector of the slot table record (`medomni_cas.bench.slottables.SlotChunk`): its
canonical bytes and id are forever."""

from __future__ import annotations

from medomni_cas.bench.slottables import SlotChunk, chunk_ids, chunk_table
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId, hash_bytes

TABLE = chunk_table({b"\x02" * 32: ObjectId(b"\x0b" * 32), b"\x01" * 32: ObjectId(b"\x0a" * 32)})
ID = "b237e04a11027ff3a94e983354eabe3796ebe3db525f87ec198d98ec07b69a6c"
CHUNK = "acdcb434210e024e0458c2a348b4e9408bb77a93a5c60d5d92bcb968814a3461"


def test_slot_chunk_golden_vector() -> None:
    data = encoding.encode(TABLE)
    assert TABLE.slots == b"\x01" * 32 + b"\x02" * 32  # slots ascending, runs alike
    assert hash_bytes(data).hex() == ID
    assert encoding.decode_body(data, SlotChunk) == TABLE
    assert encoding.links(data) == [ObjectId(b"\x0a" * 32), ObjectId(b"\x0b" * 32)]


def test_chunk_ids_are_forever() -> None:
    """A chunk's id names its claim and its table: made from its slots, 16 to a chunk."""
    slots = [bytes([i]) * 32 for i in range(20)]
    chunks = chunk_ids(slots)
    assert len(set(chunks[:16])) == 1 and len(set(chunks[16:])) == 1
    assert chunks[0].hex() == CHUNK
