"""The Bench performance benchmark still runs (``python -m benchmarks_perf bench --quick``),
and the fast slot ids it measures are the slot ids.

Timing is not asserted (it depends on the machine); only that the suite runs to the end and
prints its rows.
"""

from __future__ import annotations

import random

import pytest

from medomni_cas.bench.records import RunSlot, slot_id, slot_ids
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId, hash_bytes
from tests.test_benchmarks_smoke import quick_rows


def test_bench_benchmark_quick_prints_a_table() -> None:
    rows = quick_rows("bench", timeout=180)
    for name in (
        "resume: 4,000 slots, slot ids + refs",
        "resume: 4,000 slots, Refs.get_many alone",
        "audit: medomni audit verify (verify_result; 4,000 runs",
        "audit: verify_result vs raw reads",
        "audit: verify_result, one process (--jobs 1)",
        "audit: verify_closure of the result",
        "audit: verify_closure, one process (jobs=1)",
        "score: 80,000 rows from the store",
        "plain-Python loop",
        "score: 80,000 rows, first score of the set",
        "rows of older jobs",
    ):
        assert any(name in row for row in rows), f"no row for {name!r}"


def _defined(atom: bytes, agent: bytes, arm_variant: object, repetition: object) -> ObjectId:
    """A slot's id by its definition: the hash of the `RunSlot` record's canonical bytes."""
    slot = RunSlot(
        atom=atom,  # type: ignore[arg-type]
        agent_config=agent,  # type: ignore[arg-type]
        arm_variant=arm_variant,  # type: ignore[arg-type]
        repetition=repetition,  # type: ignore[arg-type]
    )
    return hash_bytes(encoding.encode(slot))


@pytest.mark.parametrize("seed", range(4))
def test_slot_ids_are_the_run_slot_hashes(seed: int) -> None:
    rng = random.Random(seed)
    fills = [bytes([f]) * 32 for f in (0, 1, 0xC7, 0x20)]  # ids that look like the probe
    for _ in range(200):
        atom = ObjectId(rng.choice([rng.randbytes(32), *fills]))
        agent = ObjectId(rng.choice([rng.randbytes(32), *fills]))
        arm = rng.choice(["", "text", "ladder.r3", "é" * 40, "x" * 300, "\x00" * 40])
        rep = rng.choice([0, 1, 2, 127, 128, 255, 65_536, 2**40, -1, -33])
        want = _defined(atom, agent, arm, rep)
        got = slot_id(atom, agent, arm, rep)
        assert got == want and type(got) is ObjectId
        assert slot_ids([atom, atom], agent, arm, rep) == [want, want]


def test_slot_ids_of_other_types_follow_the_definition() -> None:
    """Raw bytes (not an `ObjectId`) encode as bytes, not as a link, and a bool repetition
    as a bool: the fast path must not give them the ids of their look-alikes."""
    atom, agent = ObjectId(b"\x05" * 32), ObjectId(b"\x06" * 32)
    for args in (
        (bytes(atom), agent, "text", 1),
        (atom, bytes(agent), "text", 1),
        (atom, agent, "text", True),
    ):
        assert slot_id(*args) == _defined(*args) != slot_id(atom, agent, "text", 1)  # type: ignore[arg-type]
        assert slot_ids([args[0]], *args[1:]) == [_defined(*args)]  # type: ignore[arg-type]
