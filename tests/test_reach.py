"""gc's pass: the listing on disk, ids by first byte, and what the refs reach from it."""

from __future__ import annotations

import os
import random
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from medomni_cas.store._fast import BatchChecker, Findings
from medomni_cas.store._reach import ByteRuns, Listing, Reach, Unordered, listed
from medomni_cas.store._spill import split
from medomni_cas.store.encoding import encode_object
from medomni_cas.store.ids import ObjectId, hash_bytes


def _ids(values: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(values), "S32")


def _found(keys: list[bytes]) -> Findings:
    return Findings(objects=len(keys), sound=list(keys), links=[], owners=[])


def test_ids_that_end_in_zero_bytes_are_found_as_themselves(tmp_path: Path) -> None:
    """numpy's S32 drops trailing zero bytes when it gives an id back as bytes: the listing
    compares and returns whole ids, so an id and one that differs only in trailing zeros
    are never mixed up."""
    a = bytes([7] * 30 + [0, 0])
    b = bytes([7] * 30 + [0, 1])
    c = bytes([7] * 31 + [0])
    zero = bytes(32)
    keys = sorted([a, b, c, zero])
    listing = Listing(tmp_path)
    listing.add(keys, [1.0] * 4, _found(keys))
    listing.done()
    try:
        at, outside = listing.find(7, _ids(sorted([a, c, bytes([7] * 30 + [0, 2])])))
        assert [keys[i] for i in at.tolist()] == [a, c]
        assert split(outside.tobytes()) == [bytes([7] * 30 + [0, 2])]
        at, outside = listing.find(0, _ids([zero]))
        assert at.tolist() == [keys.index(zero)] and not outside.size
        assert split(listing.keys(0, 4).tobytes()) == keys
    finally:
        listing.close()


@pytest.mark.parametrize(
    "parts",
    [
        [[bytes([2] * 32), bytes([1] * 32)]],  # out of order within a part
        [[bytes([2] * 32)], [bytes([1] * 32)]],  # and across two
        [[bytes([1] * 32), bytes([1] * 32)]],  # a key twice
        [[b"short"]],  # a key that is not an id
    ],
)
def test_a_listing_out_of_key_order_is_refused(tmp_path: Path, parts: list[list[bytes]]) -> None:
    listing = Listing(tmp_path)
    try:
        with pytest.raises(Unordered):
            for keys in parts:
                listing.add(keys, [0.0] * len(keys), _found(keys))
    finally:
        listing.close()


def test_ids_by_first_byte_are_the_same_spilled_or_held(tmp_path: Path) -> None:
    rng = random.Random(5)
    ids = [bytes(rng.randrange(256) for _ in range(32)) for _ in range(3000)]
    ids += ids[:500]  # repeats come back once
    ids += [bytes([9] * 31 + [0]), bytes([9] * 30 + [0, 0])]  # trailing zeros kept
    got = []
    for bound in (10**9, 50):
        runs = ByteRuns(tmp_path, bound)
        try:
            for i in range(0, len(ids), 97):
                runs.add(np.frombuffer(b"".join(ids[i : i + 97]), np.uint8).reshape(-1, 32))
            got.append([(b, split(part.tobytes())) for b, part in runs.by_first_byte()])
        finally:
            runs.close()
    held, spilled = got
    assert held == spilled
    assert [b for b, _ in held] == sorted({i[0] for i in ids})
    assert [i for _, part in held for i in part] == sorted(set(ids))
    assert os.listdir(tmp_path) == []  # the spill file went with the runs


def _object(tag: str, links: list[ObjectId]) -> tuple[ObjectId, bytes]:
    data = encode_object("test-reach", 1, {"tag": tag, "links": links})
    return hash_bytes(data), data


def test_reach_marks_what_the_roots_reach_level_by_level(tmp_path: Path) -> None:
    """A chain, a diamond and an id no object holds, in parts cut anywhere: the marks are
    the closure of the roots, and an id not listed is read (once) by the reader."""
    leaf = _object("leaf", [])
    mid = [_object(f"mid {i}", [leaf[0]]) for i in range(40)]
    top = _object("top", [m for m, _ in mid])
    away = _object("not listed", [leaf[0]])  # put after the pass: read by id
    lost = _object("garbage", [mid[0][0]])
    stored = dict([leaf, *mid, top, lost])
    keys = sorted(stored)
    check = BatchChecker(canonical=False)
    parts: list[tuple[list[bytes], list[bytes | None], list[float]]] = [
        (list(keys[i : i + 9]), [stored[k] for k in keys[i : i + 9]], [0.0] * len(keys[i : i + 9]))
        for i in range(0, len(keys), 9)
    ]
    reads: list[list[bytes]] = []

    def read(ids: list[bytes]) -> Findings:
        reads.append(ids)
        return check(ids, [away[1] if i == away[0] else None for i in ids], owners=True)

    with closing(listed(parts, check, tmp_path)) as listing:
        reach = Reach(listing, tmp_path, read)
        try:
            reach.walk([top[0], away[0], top[0], bytes(32)])
            marked = {keys[i] for i in np.flatnonzero(reach.marked).tolist()}
            assert marked == set(stored) - {lost[0]}
            assert reach.reachable == len(stored) - 1 + 1  # and the one read by id
            assert sorted(map(sorted, reads)) == [sorted([away[0], bytes(32)])]
            assert reach.reached_bad() is None
        finally:
            reach.close()
