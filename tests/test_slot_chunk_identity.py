"""Golden vectors of the slot table record (`medomni_cas.bench.slottables.SlotChunk`), as
written before states were kept and with them: their canonical bytes and ids are forever."""

from __future__ import annotations

from medomni_cas.bench.slottables import SlotChunk, chunk_ids, chunk_table
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId, hash_bytes

TABLE = chunk_table({b"\x02" * 32: ObjectId(b"\x0b" * 32), b"\x01" * 32: ObjectId(b"\x0a" * 32)})
ID = "b237e04a11027ff3a94e983354eabe3796ebe3db525f87ec198d98ec07b69a6c"
CHUNK = "acdcb434210e024e0458c2a348b4e9408bb77a93a5c60d5d92bcb968814a3461"
A, B = ObjectId(b"\x0a" * 32), ObjectId(b"\x0b" * 32)
WITH_STATES = chunk_table(
    {b"\x02" * 32: B, b"\x01" * 32: A}, {A: ("answered", 1, True), B: ("infra-error", 2, False)}
)
WITH_STATES_ID = "b48bbd4e1099824432c8887913ded1e3edc3aeddc9257ed134e0f97503f949ba"
WITH_STATES_BYTES = (
    "93b26d65646f6d6e692e736c6f742d6368756e6b0183a472756e7392c720010a0a0a0a0a0a0a0a0a0a0a0a0a"
    "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0ac720010b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"
    "0b0b0b0b0b0b0b0b0b0ba5736c6f7473c4400101010101010101010101010101010101010101010101010101"
    "0101010101010202020202020202020202020202020202020202020202020202020202020202a67374617465"
    "739293a8616e73776572656401c393ab696e6672612d6572726f7202c2"
)


def test_slot_chunk_golden_vector() -> None:
    data = encoding.encode(TABLE)
    assert TABLE.slots == b"\x01" * 32 + b"\x02" * 32  # slots ascending, runs alike
    assert hash_bytes(data).hex() == ID
    assert encoding.decode_body(data, SlotChunk) == TABLE
    assert encoding.links(data) == [ObjectId(b"\x0a" * 32), ObjectId(b"\x0b" * 32)]


def test_slot_chunk_with_states_golden_vector() -> None:
    """States are an optional field: a table without them keeps the id it always had
    (above); one with them has these bytes, its states in its runs' order."""
    data = encoding.encode(WITH_STATES)
    assert data.hex() == WITH_STATES_BYTES
    assert hash_bytes(data).hex() == WITH_STATES_ID
    assert encoding.decode_body(data, SlotChunk) == WITH_STATES
    assert WITH_STATES.run_states() == {A: ("answered", 1, True), B: ("infra-error", 2, False)}
    assert encoding.links(data) == [A, B]
    # a state missing for one run: the table holds none
    assert chunk_table({b"\x01" * 32: A, b"\x02" * 32: B}, {A: ("answered", 1, True)}) == TABLE


def test_chunk_ids_are_forever() -> None:
    """A chunk's id names its claim and its table: made from its slots, 16 to a chunk."""
    slots = [bytes([i]) * 32 for i in range(20)]
    chunks = chunk_ids(slots)
    assert len(set(chunks[:16])) == 1 and len(set(chunks[16:])) == 1
    assert chunks[0].hex() == CHUNK
