"""Identity is forever: fixed objects must keep these exact ids and bytes on every machine.

If a test here fails, a change altered canonical bytes. Do not regenerate the vectors:
find the change and undo it (or give the new encoding a new kind version).
"""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import medomni_cas as mc
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.objects import CHUNK_SIZE


class Golden(mc.Record, kw_only=True):
    __kind__ = "golden-test"
    name: str
    n: int
    x: float
    tags: list[str]
    link: ObjectId
    meta: dict[str, int] = {}
    opt: str | None = None


class GoldenLater(mc.Record, kw_only=True):
    """Golden as it would be after adding an optional field: old ids must not move."""

    __kind__ = "golden-test-later"
    name: str
    added: int = 0


HELLO = "cc24e231ab610e4e50b6e1dad839f8d46c7ffd7c0e6627952bde85022fa4ef77"
VECTORS = {
    "empty": "467d896ddb822732a00eeb2d3959b3a8f841b000ffc6644a52d6435c9653eb98",
    "hello": HELLO,
    "tree": "93bdc2da3534eff5f90149634762a026ed5fbd2f261415110ffab21b971fa998",
    "golden": "5a15b86d280ca71b9b0218875370f1edbb39345cbe37843f07b977cd520f30c1",
    "big": "432da7c734abcba14eb95245802ef8dd05679eaed77923516b190d6924f8722e",
    "generic": "6181d41e0ed20d52d0c8b29a2906a8aed50250e0565bc33aa0494b927aea4c36",
}
GOLDEN_BYTES = (
    "93ab676f6c64656e2d746573740186a46c696e6bc72001" + HELLO + "a46d65746182a16102a17a01a16ed3"
    "ffffff0000000000a46e616d65b14ec3a469766520e29c9320e682a3e88085a47461677392a162a161a178cb"
    "3fb999999999999a"
)
TREE_BYTES = (
    "93a4747265650182a5656d707479c72001" + VECTORS["empty"] + "a968656c6c6f2e747874c72001" + HELLO
)


def make_vectors(s: mc.Store) -> dict[str, ObjectId]:
    e = s.put_blob(b"")
    h = s.put_blob(b"hello")
    return {
        "empty": e,
        "hello": h,
        "tree": s.put_tree({"hello.txt": h, "empty": e}),
        "golden": s.put(
            Golden(
                name="Näive ✓ 患者",
                n=-(2**40),
                x=0.1,
                tags=["b", "a"],
                link=h,
                meta={"z": 1, "a": 2},
            )
        ),
        "big": s.put_blob(bytes(range(256)) * (CHUNK_SIZE // 256) + b"!"),
        "generic": s.put_object(
            "x-generic", 3, {"k": [1, 2.5, None, True, b"\x00\xff", "s"], "a": {"y": 1, "x": 2}}
        ),
    }


def test_golden_ids(store: mc.Store) -> None:
    ids = make_vectors(store)
    assert {k: v.hex() for k, v in ids.items()} == VECTORS


def test_golden_bytes() -> None:
    s = mc.open("memory://")
    ids = make_vectors(s)
    assert s.get_raw(ids["golden"]).hex() == GOLDEN_BYTES
    assert s.get_raw(ids["tree"]).hex() == TREE_BYTES
    assert s.get_raw(ids["hello"]) == b"\x93\xa4blob\x01\xc4\x05hello"
    assert CHUNK_SIZE == 1 << 20


def test_field_order_and_dict_order_do_not_matter() -> None:
    s = mc.open("memory://")
    h = s.put_blob(b"hello")
    a = Golden(
        meta={"a": 2, "z": 1}, tags=["b", "a"], link=h, x=0.1, n=-(2**40), name="Näive ✓ 患者"
    )
    assert s.put(a).hex() == VECTORS["golden"]
    assert s.put_tree({"empty": s.put_blob(b""), "hello.txt": h}).hex() == VECTORS["tree"]


def test_optional_defaults_are_omitted() -> None:
    plain = encoding.encode(GoldenLater(name="x"))
    assert b"added" not in plain
    assert encoding.encode(GoldenLater(name="x", added=0)) == plain
    assert b"added" in encoding.encode(GoldenLater(name="x", added=1))


def test_kind_and_version_are_hashed() -> None:
    body = {"a": 1}
    ids = {
        hash_bytes(encoding.encode_object(k, v, body))
        for k, v in [("x-a", 1), ("x-b", 1), ("x-a", 2)]
    }
    assert len(ids) == 3


def test_a_blob_is_never_a_record() -> None:
    s = mc.open("memory://")
    h = s.put_blob(b"hello")
    with pytest.raises(mc.InvalidObject, match="blob"):
        s.get(h, Golden)
    rec = s.put(Golden(name="a", n=1, x=1.0, tags=[], link=h))
    with pytest.raises(mc.InvalidObject, match="not a blob"):
        s.read_blob(rec)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.0])
def test_non_canonical_floats_refused(bad: float) -> None:
    s = mc.open("memory://")
    h = s.put_blob(b"x")
    with pytest.raises(mc.InvalidObject, match=r"golden-test\.x"):
        s.put(Golden(name="a", n=1, x=bad, tags=[], link=h))
    with pytest.raises(mc.InvalidObject, match=r"\.k\[1\]"):
        s.put_object("x-generic", 1, {"k": [0.5, bad]})
    assert list(s.iter_ids()) == [h]


def test_false_positive_float_pattern_is_allowed() -> None:
    # bytes that look like a NaN float64 inside a blob or a string are fine
    s = mc.open("memory://")
    s.put_blob(b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00")
    s.put_object("x-generic", 1, {"b": b"\xcb\x7f\xff\x00\x00\x00\x00\x00\x00"})


def test_non_canonical_values_refused() -> None:
    s = mc.open("memory://")
    with pytest.raises(mc.InvalidObject):
        s.put_object("x-generic", 1, {1: "int key"})
    with pytest.raises(mc.InvalidObject):
        s.put_object("x-generic", 1, {"o": object()})
    with pytest.raises(mc.InvalidObject):
        s.put_object("x-generic", 1, {"o": "\ud800"})  # lone surrogate


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x92\xa1a\x01",  # two-element envelope
        b"\x93\x01\x01\x01",  # kind not a string
        b"\x93\xa1a\x01\x81\x01\x02",  # non-string key
        b"\x93\xa1a\x01\x82\xa1b\x01\xa1a\x02",  # keys out of order
        b"\x93\xa1a\x01\xd1\x00\x01",  # int16 for a fixint: not minimal
        b"\x93\xa4blob\x01\xc4\x05hell",  # truncated blob
        b"\x93\xa1a\x01\xd4\x07\x00",  # unknown extension type
        b"\x93\xa1a\x01\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00",  # NaN
    ],
)
def test_validate_canonical_refuses(data: bytes) -> None:
    s = mc.open("memory://")
    with pytest.raises(mc.InvalidObject):
        s.put_raw(data)
    assert list(s.iter_ids()) == []


def test_put_raw_checks_expected_id() -> None:
    s = mc.open("memory://")
    data = encoding.encode_object("x-generic", 1, {"a": 1})
    with pytest.raises(mc.IntegrityError) as err:
        s.put_raw(data, expected=ObjectId(b"\x01" * 32))
    assert err.value.expected == "01" * 32
    assert s.put_raw(data) == hash_bytes(data)


# -- round trips -----------------------------------------------------------------------------
_keys = st.text(min_size=1, max_size=8)
_floats = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda f: not (f == 0.0 and math.copysign(1.0, f) < 0)
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | _floats
    | st.text(max_size=20)
    | st.binary(max_size=40)
    | st.binary(min_size=32, max_size=32).map(ObjectId)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(body=_values)
def test_generic_round_trip_and_determinism(body: object) -> None:
    data = encoding.encode_object("x-generic", 1, body)
    kind, version, back = encoding.decode(data)
    assert (kind, version) == ("x-generic", 1)
    assert encoding.encode_object("x-generic", 1, back) == data
    assert encoding.validate_canonical(data) == ("x-generic", 1)
    links = list(encoding.iter_links(back))
    assert encoding.links(data) == links


@settings(max_examples=200, deadline=None)
@given(
    name=st.text(max_size=30),
    n=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    x=_floats,
    tags=st.lists(st.text(max_size=5), max_size=5),
    meta=st.dictionaries(_keys, st.integers(min_value=0, max_value=2**32), max_size=5),
    link=st.binary(min_size=32, max_size=32).map(ObjectId),
)
def test_record_round_trip(
    name: str, n: int, x: float, tags: list[str], meta: dict[str, int], link: ObjectId
) -> None:
    rec = Golden(name=name, n=n, x=x, tags=tags, link=link, meta=meta)
    data = encoding.encode(rec)
    assert encoding.decode_body(data, Golden) == rec
    assert encoding.decode(data)[2] == rec
    assert encoding.links(data) == [link]
    shuffled = Golden(name=name, n=n, x=x, tags=tags, link=link, meta=dict(reversed(meta.items())))
    assert encoding.encode(shuffled) == data
    assert msgspec.msgpack.decode(data)[0] == "golden-test"
