"""The batch paths of walks and checks agree with the one-object definitions they speed up.

`medomni_cas.store._fast` reads links and checks canonical form a batch at a time (a mirror
of each record class, link marks counted against a view); the backends read a batch as one
list and refs by id; `Store.walk`, `verify_closure`, `verify_result` and sync are built on
them. Each test compares a fast path with `encoding.links`, `encoding.validate_canonical`
or the one-at-a-time API, on registered kinds (which take the fast paths) and odd bytes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

import medomni_cas as mc
from medomni_cas.audit.verify import verify_result
from medomni_cas.bench.records import Result
from medomni_cas.errors import InvalidId, InvalidName, InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store._fast import BatchReader, fast_links, mismatches, unseen
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.encoding import LINK_MARK, Record
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.verify import verify_closure
from tests.conftest import store_url

Ext = msgspec.msgpack.Ext


class _Inner(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    note: str = ""
    log: ObjectId | None = None


class FastRec(Record, kw_only=True):
    """Every shape of link field a mirror reads: one, optional, many, nested, in a map."""

    __kind__ = "test-fast.rec"

    name: str
    one: ObjectId
    maybe: ObjectId | None = None
    many: tuple[ObjectId, ...] = ()
    inner: _Inner | None = None
    by_name: dict[str, ObjectId] = {}
    score: float | None = None
    count: int = 0
    data: bytes = b""


class AnyRec(Record, kw_only=True):
    """A field typed ``Any``: no mirror, links read by a view and counted marks."""

    __kind__ = "test-fast.any"

    one: ObjectId
    payload: Any = None


def _id(i: int) -> ObjectId:
    return hash_bytes(b"fast %d" % i)


def _raw(*value: object) -> bytes:
    """Plain msgpack, keys in the order given (so not necessarily canonical)."""
    return msgspec.msgpack.encode(list(value))


def _link(oid: bytes) -> Ext:
    return Ext(encoding.LINK_EXT, bytes(oid))


GOOD = [
    FastRec(name="a", one=_id(1)),
    FastRec(
        name="b",
        one=_id(1),
        maybe=_id(2),
        many=(_id(3), _id(4), _id(3)),
        inner=_Inner(note="n", log=_id(5)),
        by_name={"x": _id(6), "a": _id(7)},
        score=0.5,
        count=3,
        data=LINK_MARK + bytes(32),  # a link mark inside bytes: not a link
    ),
    FastRec(name="c" * 200, one=_id(8), inner=_Inner(note="\xc7 \x01")),
    AnyRec(one=_id(9), payload={"k": [_id(10), {"deep": _id(11)}], "b": LINK_MARK + b"x" * 32}),
    AnyRec(one=_id(12), payload=[1.5, "s"]),
]


def _crafted() -> list[bytes]:
    """Bytes of registered kinds that no encoder of ours writes (and some that it could)."""
    k, v = FastRec.__kind__, FastRec.__version__
    good = encoding.encode(GOOD[1])
    base = {"name": "q", "one": _link(_id(1))}
    return [
        _raw(k, v, {"one": _link(_id(1)), "name": "q"}),  # keys not sorted
        _raw(k, v, {**base, "count": 0}),  # a default written out (canonical for the store)
        _raw(k, v, {**base, "score": float("nan")}),
        _raw(k, v, {**base, "score": -0.0}),
        _raw(k, v, {**base, "score": float("inf")}),
        _raw(k, v, {**base, "score": 1}),  # an int in a float field (canonical for the store)
        _raw(k, v, {"name": "q", "one": Ext(2, bytes(_id(1)))}),  # an unknown extension
        _raw(k, v, {**base, "maybe": Ext(1, b"short")}),  # a link of the wrong length
        _raw(k, v, {"name": _link(_id(13)), "one": _link(_id(1))}),  # a link where a str is
        _raw(k, v, {**base, "zz_newer": _link(_id(14))}),  # a newer writer's link field
        _raw(k, v, {**base, "inner": {"log": _link(_id(15)), "zz": _link(_id(16))}}),
        _raw(k, v, {**base, "count": True}),  # a bool for an int
        _raw(k, v, {**base, "by_name": {1: _link(_id(17))}}),  # an integer map key
        _raw(k, v, base) + b"\x00",  # trailing bytes
        _raw(k, v, base, 4),  # four elements
        good.replace(b"\xa5count\x03", b"\xa5count\xcd\x00\x03"),  # an int not in its least
        good.replace(b"\xa4name\xa1b", b"\xa4name\xd9\x01b"),  # a str header not the least
        good[:-1],  # truncated
        good.replace(b"\xa3one", b"\xa3one\xc7\x20\x01" + bytes(_id(18)) + b"\xa3one", 1),
        _raw(AnyRec.__kind__, 1, {"one": _link(_id(9)), "payload": Ext(3, b"x")}),
        _raw(AnyRec.__kind__, 1, {"one": _link(_id(9)), "payload": [_link(_id(19)), -0.0]}),
        encoding.encode_blob_header(5) + b"abc",  # a truncated blob
        encoding.encode_blob_header(3)[:-2] + b"\xc5\x00\x03abc",  # a blob header not least
    ]


def _objects() -> list[bytes]:
    return [encoding.encode(r) for r in GOOD] + _crafted() + [blob_object(b"blob")[1]]


def _links_or_error(data: bytes) -> list[bytes] | None:
    try:
        return [bytes(x) for x in encoding.links(data)]
    except InvalidObject:
        return None


def _canonical(data: bytes) -> bool:
    try:
        encoding.validate_canonical(data)
    except InvalidObject:
        return False
    return True


def _per_owner(ids: list[bytes], owners: list[int], n: int) -> list[list[bytes]]:
    out: list[list[bytes]] = [[] for _ in range(n)]
    for link, owner in zip(ids, owners, strict=True):
        out[owner].append(link)
    return [list(dict.fromkeys(x)) for x in out]


def test_batch_links_are_exactly_encoding_links() -> None:
    datas = _objects()
    rng = random.Random(3)
    reader = BatchReader(exact=False)
    for _ in range(5):  # and in batches that mix kinds in any order
        rng.shuffle(datas)
        ids, owners, errors = reader.links(datas, ordered=True)
        got = _per_owner(ids, owners, len(datas))
        assert owners == sorted(owners)
        for i, data in enumerate(datas):
            want = _links_or_error(data)
            if want is not None:
                # in the order of the bytes, for a canonical object (whose fields are sorted)
                same = (lambda x: x) if _canonical(data) else sorted
                assert i not in errors and same(got[i]) == same(want), data
                assert same(list(dict.fromkeys(fast_links(data)))) == same(want)
            elif i not in errors:
                # links readable although the object is not (an unknown extension outside
                # any link): every link mark is one of them
                assert len(fast_links(data)) == data.count(LINK_MARK)


def test_batch_check_never_passes_what_the_full_check_refuses() -> None:
    datas = _objects()
    ids, owners, doubtful = BatchReader(exact=False).check(datas)
    got = _per_owner(ids, owners, len(datas))
    affirmed = set(range(len(datas))) - set(doubtful)
    for i in affirmed:
        encoding.validate_canonical(datas[i])  # raises if the fast path passed a bad one
        assert got[i] == _links_or_error(datas[i])
    refused = []
    for i, data in enumerate(datas):
        try:
            encoding.validate_canonical(data)
        except InvalidObject:
            refused.append(i)
    assert refused and set(refused) <= set(doubtful)
    # records our encoder wrote take the fast path (a kind with an ``Any`` field has none),
    # whatever else their batch holds
    assert affirmed >= {i for i, r in enumerate(GOOD) if isinstance(r, FastRec)}
    assert {i for i, r in enumerate(GOOD) if isinstance(r, AnyRec)} <= set(doubtful)


def test_a_malformed_object_leaves_no_header_behind() -> None:
    """The headers of one batch speed up the next; a malformed object's would-be header
    (here b"") must not be kept, or every later object would be grouped with it and take
    the slow path (as it did after fsck met one)."""
    garbage = b"\xc1 not msgpack at all"
    reader = BatchReader(exact=False)
    reader.links([garbage])
    reader.check([garbage])
    datas = [encoding.encode(r) for r in GOOD]
    _, _, doubtful = reader.check(datas)
    assert not {i for i, r in enumerate(GOOD) if isinstance(r, FastRec)} & set(doubtful)
    ids, owners, errors = reader.links(datas, ordered=True)
    assert not errors
    assert _per_owner(ids, owners, len(datas)) == [_links_or_error(d) for d in datas]


def test_mismatches_and_unseen() -> None:
    datas = [b"a", b"", b"c" * 5000]
    keys = [hash_bytes(d) for d in datas]
    assert mismatches(keys, datas) == []
    assert mismatches([keys[0], keys[0], keys[2]], datas) == [1]
    seen = {b"x"}
    assert unseen(seen, [b"y", b"x", b"z", b"y"]) == [b"y", b"z"]
    assert seen == {b"x", b"y", b"z"}
    assert unseen(seen, [b"z", b"w"], ordered=False) == {b"w"}


@pytest.mark.parametrize("kind", ["memory", "lmdb", "file"])
def test_get_list_and_ref_get_prefixed_agree_with_one_at_a_time(kind: str, tmp_path: Path) -> None:
    store = mc.open(store_url(kind, tmp_path))
    try:
        backend = store.backend
        big = random.Random(5).randbytes(300 * 1024)  # an LMDB large object (a file)
        items = [(hash_bytes(d), d) for d in (b"x", b"", big)]
        backend.put_many(items)
        keys = [k for k, _ in items] + [bytes(32)]
        want = [d for _, d in backend.get_many(keys)]
        assert backend.get_list(keys) == want == [b"x", b"", big, None]
        assert backend.get_list([]) == []
        if isinstance(backend, LMDBBackend):
            backend._file(items[2][0]).unlink()  # its bytes are lost: read as absent
            assert backend.get_list(keys) == [b"x", b"", None, None]
        target = store.put_blob(b"run")
        slots = [hash_bytes(b"slot %d" % i) for i in range(5)]
        for s in slots[::2]:
            store.refs.set(f"runs/slots/{s.hex()}", target)
        names = [f"runs/slots/{s.hex()}" for s in slots]
        assert backend.ref_get_prefixed("runs/slots/", slots) == backend.ref_get_many(names)
        got = store.refs.get_many_by_id("runs/slots/", slots)
        assert got == store.refs.get_many(names) == [target, None, target, None, target]
        assert all(type(g) is ObjectId for g in got if g is not None)
        assert store.refs.get_many_by_id("runs/slots/", iter(slots[:1])) == [target]
        assert store.refs.get_many_by_id("runs/slots/", []) == []
    finally:
        store.close()


def test_get_many_by_id_refuses_bad_names_and_ids() -> None:
    store = mc.open("memory://")
    slot = hash_bytes(b"slot")
    for prefix in ("runs//slots/", "/runs/", "runs/.slots/", "runs/slots.lock/", "a b/"):
        with pytest.raises(InvalidName, match=prefix.replace(".", r"\.")):
            store.refs.get_many_by_id(prefix, [slot])
    with pytest.raises(InvalidName, match=r"runs/\.\./" + slot.hex()):  # names the ref
        store.refs.get_many_by_id("runs/../", [slot, slot])
    with pytest.raises(InvalidName, match="1 to 1024"):
        store.refs.get_many_by_id("r" * 961 + "/", [slot])
    with pytest.raises(InvalidId):
        store.refs.get_many_by_id("runs/slots/", [slot, b"short"])
    # hex digits are valid anywhere in a component: a prefix without a slash works too
    assert store.refs.get_many_by_id("runs/slot-", [slot]) == [None]


def _reference_walk(store: mc.Store, roots: list[ObjectId]) -> list[ObjectId]:
    """`Store.walk` as it was: one object at a time, links by `encoding.links`."""
    seen, frontier, out = set(roots), list(roots), []
    while frontier:
        nxt = []
        for oid, data in store.get_raw_many(frontier):
            out.append(oid)
            for link in encoding.links(data):
                if link not in seen:
                    seen.add(link)
                    nxt.append(link)
        frontier = nxt
    return out


def _fill(store: mc.Store) -> ObjectId:
    """Records of every shape linking blobs and trees, some shared, over several levels."""
    blobs = [store.put_blob(b"leaf %d" % i) for i in range(40)]
    trees = [store.put_tree({f"f{j}": blobs[(i + j) % 40] for j in range(3)}) for i in range(8)]
    recs = [
        store.put(
            FastRec(
                name=f"r{i}",
                one=trees[i % 8],
                maybe=blobs[i] if i % 2 else None,
                many=(blobs[i], blobs[(i * 7) % 40]),
                inner=_Inner(log=trees[(i + 1) % 8]) if i % 3 else None,
                by_name={"k": blobs[(i + 5) % 40]},
                score=i / 3,
            )
        )
        for i in range(30)
    ]
    anys = [store.put(AnyRec(one=recs[i], payload={"x": [recs[i + 1]]})) for i in range(10)]
    return store.put_tree({f"a{i}": a for i, a in enumerate(anys)} | {"r": recs[-1]})


@pytest.mark.parametrize("kind", ["memory", "lmdb"])
def test_walk_is_the_one_object_walk(kind: str, tmp_path: Path) -> None:
    store = mc.open(store_url(kind, tmp_path))
    try:
        root = _fill(store)
        walked = [oid for oid, _ in store.walk([root])]
        assert walked == _reference_walk(store, [root])
        assert all(type(oid) is ObjectId for oid in walked)
        assert verify_closure(store, [root]).objects == len(walked)
    finally:
        store.close()


def test_walk_raises_at_the_bad_object_in_turn() -> None:
    store = mc.open("memory://")
    root = _fill(store)
    order = _reference_walk(store, [root])
    victim = order[len(order) // 2]
    store.backend._objects[victim] = (store.backend._objects[victim][0], b"tampered")  # type: ignore[attr-defined]
    seen: list[ObjectId] = []
    with pytest.raises(mc.IntegrityError, match=victim.hex()):
        for oid, _ in store.walk([root]):
            seen.append(oid)
    assert seen == order[: order.index(victim)]


def _put_raw(store: mc.Store, data: bytes) -> ObjectId:
    oid = hash_bytes(data)
    store.backend.put_many([(oid, data)])  # below the Store, which would check them
    return oid


def test_verify_finds_what_only_a_full_decode_sees() -> None:
    """A link in a field the class does not know (a newer writer) is followed; a record
    that is not canonical, or that its class cannot decode (a link in a field typed as
    something else: no reader reads it), is reported."""
    store = mc.open("memory://")
    k, v = FastRec.__kind__, FastRec.__version__
    gone = [_id(100 + i) for i in range(2)]  # never stored
    objs = [
        _put_raw(store, _raw(k, v, {"name": "q", "one": _link(_id(1)), "zz": _link(gone[0])})),
        _put_raw(
            store, _raw(AnyRec.__kind__, 1, {"one": _link(_id(1)), "payload": _link(gone[1])})
        ),
    ]
    mistyped = _put_raw(store, _raw(k, v, {"name": _link(_id(102)), "one": _link(_id(1))}))
    unsorted = _put_raw(store, _raw(k, v, {"one": _link(_id(1)), "name": "q"}))
    nan = _put_raw(store, _raw(k, v, {"name": "q", "one": _link(_id(1)), "score": float("nan")}))
    store.backend.put_many([(_id(1), b"not the bytes of _id(1)")])
    objs += [mistyped, unsorted, nan]
    report = verify_closure(store, objs)
    found = {(p.kind, p.id) for p in report.problems}
    assert {("missing", g.hex()) for g in gone} <= found
    assert {("malformed", o.hex()) for o in (mistyped, unsorted, nan)} <= found
    assert ("corrupt", _id(1).hex()) in found
    assert len(report.problems) == 6
    # the audit's walk (no canonical check) follows the same links
    holder = store.put_tree({f"o{i}": o for i, o in enumerate(objs)})
    walk_found = {p.id for p in verify_closure(store, [holder]).problems}
    assert walk_found == {p.id for p in report.problems}


def test_verify_result_follows_a_newer_writers_link(tmp_path: Path) -> None:
    """`verify_result` reads links by the mirror of each class; a record with a field the
    class does not know is read in full, and what that field links is checked."""
    store = mc.open(store_url("lmdb", tmp_path))
    try:
        hidden = store.put_blob(b"only a newer field links me")
        rec = _put_raw(
            store,
            _raw(FastRec.__kind__, 1, {"name": "n", "one": _link(hidden), "zz": _link(hidden)}),
        )
        others = [store.put(FastRec(name=f"o{i}", one=hidden)) for i in range(50)]
        key = store.put(AnyRec(one=rec, payload=others))
        result = store.put(
            Result(
                task_set=key,
                set_build=key,
                jobs=(),
                answer_keys=(),
                scorer="s",
                scorer_version="1",
                n_boot=0,
                seed=0,
                rows=(),
                table=hidden,
            )
        )
        report = verify_result(store, result)
        assert report.ok and report.objects == 54
        data = store.backend.get(hidden)
        with store.backend.env.begin(write=True) as txn:  # type: ignore[attr-defined]
            value = txn.get(hidden, db=store.backend._objects)  # type: ignore[attr-defined]
            txn.put(hidden, bytes(value[:9]) + data[:-1] + b"!", db=store.backend._objects)  # type: ignore[attr-defined]
        report = verify_result(store, result)
        assert [(p.kind, p.id) for p in report.problems] == [("corrupt", hidden.hex())]
        assert len(report.problems[0].linked_from) == 52  # the result, rec and the 50
        assert verify_result(store, result, canonical=True).problems == report.problems
    finally:
        store.close()
