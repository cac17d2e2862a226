"""Partial decoding: views, arrays of links and link frames agree with the whole record.

`encoding.decode_view`, `encoding.link_array` and `encoding.link_frame` let code outside the
store read a few fields of canonical bytes, or hash many records that differ in one link,
without knowing msgpack. Each is compared here with encoding or decoding the whole record.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from medomni_cas.bench.records import RunSlot, slot_digests, slot_id
from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store.encoding import Record, View
from medomni_cas.store.ids import ObjectId, hash_bytes


class _Inner(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    note: str = ""
    log: ObjectId | None = None


class Framed(Record, kw_only=True):
    """Fields that sort before and after the link, of every width."""

    __kind__ = "test-partial.framed"

    a_first: str = ""
    inner: _Inner | None = None
    link: ObjectId
    maybe: ObjectId | None = None
    many: tuple[ObjectId, ...] = ()
    score: float = 0.0
    z_last: dict[str, int] = {}


class FramedView(View):
    __kind__ = Framed.__kind__

    link: ObjectId
    # omitted at their defaults, as in the record: the same defaults (as bytes for Raw)
    many: msgspec.Raw = msgspec.Raw(b"\x90")
    score: float = 0.0


def _id(i: int) -> ObjectId:
    return hash_bytes(b"partial %d" % i)


def _records() -> list[Framed]:
    rng = random.Random(7)
    out = []
    for i in range(40):
        out.append(
            Framed(
                a_first="x" * rng.choice([0, 1, 31, 32, 255, 256, 70000]),
                inner=_Inner(note="\xc7 \x01", log=_id(i)) if i % 3 else None,
                link=_id(1000 + i),
                maybe=_id(i) if i % 2 else None,
                many=tuple(_id(j) for j in range(rng.choice([0, 1, 15, 16, 300]))),
                score=rng.choice([0.0, 0.5, -2.25, 1e300]),
                z_last={str(k): k for k in range(rng.choice([0, 3, 20]))},
            )
        )
    return out


def test_decode_view_reads_what_the_whole_record_holds() -> None:
    for rec in _records():
        view = encoding.decode_view(encoding.encode(rec), FramedView)
        assert view.link == rec.link and type(view.link) is ObjectId
        assert view.score == rec.score
        assert encoding.link_array(view.many) == b"".join(rec.many)


def test_decode_view_refuses_another_kind_or_version() -> None:
    data = encoding.encode(_records()[0])

    class Other(View):
        __kind__ = "other.kind"

        link: ObjectId

    with pytest.raises(InvalidObject, match=r"is a test-partial\.framed v1, not a other\.kind v1"):
        encoding.decode_view(data, Other)

    class Newer(View):
        __kind__ = Framed.__kind__
        __version__ = 2

        link: ObjectId

    with pytest.raises(InvalidObject, match=r"not a test-partial\.framed v2"):
        encoding.decode_view(data, Newer)
    with pytest.raises(InvalidObject, match="is a blob v1"):
        encoding.decode_view(encoding.encode_blob_header(1) + b"x", FramedView)
    with pytest.raises(InvalidObject, match="not a medomni object"):
        encoding.decode_view(b"\xc1 garbage", FramedView)
    no_link = encoding.encode_object(Framed.__kind__, 1, {"many": []})
    with pytest.raises(InvalidObject, match=r"malformed test-partial\.framed object"):
        encoding.decode_view(no_link, FramedView)
    wrong_ext = encoding.encode_object(
        Framed.__kind__, 1, {"link": msgspec.msgpack.Ext(2, bytes(32)), "many": []}
    )
    with pytest.raises(InvalidObject, match="unknown msgpack extension type 2"):
        encoding.decode_view(wrong_ext, FramedView)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 65535, 65536])
def test_link_array_is_the_ids_of_any_length(n: int) -> None:
    ids = [ObjectId(random.Random(n + i).randbytes(32)) for i in range(min(n, 64))]
    ids = (ids * (n // 64 + 1))[:n]
    raw = msgspec.msgpack.encode([msgspec.msgpack.Ext(encoding.LINK_EXT, bytes(i)) for i in ids])
    assert encoding.link_array(raw) == b"".join(ids)


def test_link_array_refuses_what_is_not_an_array_of_links() -> None:
    link = encoding.LINK_MARK + bytes(32)
    for raw in (
        b"",
        b"\xc0",  # nil
        b"\x81\xa1a\x01",  # a map
        b"\x91\x01",  # an int
        b"\x92" + link,  # one item short
        b"\x91" + link[:-1],  # a short link
        b"\x91\xc7\x20\x02" + bytes(32),  # another extension type
        b"\x91\xc4\x20" + bytes(32) + b"\x00",  # bytes of the same length
        b"\xdc\x00\x01" + link + b"\x00",  # a trailing byte
    ):
        with pytest.raises(InvalidObject, match="not an array"):
            encoding.link_array(raw)


def test_link_frame_is_the_record_around_its_link() -> None:
    for rec in _records():
        head, tail = encoding.link_frame(rec, "link")
        assert head.endswith(encoding.LINK_MARK)
        for other in (
            _id(1),
            ObjectId(bytes([0xC7]) * 32),
            ObjectId(encoding.LINK_MARK * 10 + b"xy"),
        ):
            again = msgspec.structs.replace(rec, link=other)
            assert head + other + tail == encoding.encode(again)


def test_link_frame_refuses_a_field_without_a_link() -> None:
    rec = _records()[0]
    with pytest.raises(InvalidObject, match="holds no link"):
        encoding.link_frame(msgspec.structs.replace(rec, maybe=None), "maybe")
    with pytest.raises(ValueError, match="no field 'nope'"):
        encoding.link_frame(rec, "nope")


def test_slot_ids_from_the_frame_are_the_encoded_slots() -> None:
    """The run slot ids made from a frame are the hash of the `RunSlot`, for labels and
    repetitions of every width (the golden vectors pin a few; this covers the rest)."""
    rng = random.Random(11)
    atoms = [_id(i) for i in range(20)]
    for label in ("a", "arm.variant", "x" * 31, "x" * 32, "y" * 300, "\xc7 \x01"):
        for rep in (0, 1, 127, 128, 65536, 2**40):
            agent = _id(rng.randrange(10**6))
            want = [
                encoding.encode(
                    RunSlot(atom=a, agent_config=agent, arm_variant=label, repetition=rep)
                )
                for a in atoms
            ]
            assert [slot_id(a, agent, label, rep) for a in atoms] == [hash_bytes(w) for w in want]
            assert slot_digests(atoms, agent, label, rep) == [bytes(hash_bytes(w)) for w in want]
