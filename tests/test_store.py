"""The Store API on every built-in backend: put/get/has/missing, typed get, resolve, walk."""

from __future__ import annotations

import pytest

import medomni_cas as mc
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.encoding import encode
from medomni_cas.store.ids import ObjectId, hash_bytes


class Note(mc.Record, kw_only=True):
    __kind__ = "test-note"
    text: str
    parent: ObjectId | None = None
    attachments: list[ObjectId] = []


class Other(mc.Record, kw_only=True):
    __kind__ = "test-other"
    text: str


def chain(store: mc.Store, n: int) -> list[ObjectId]:
    ids: list[ObjectId] = []
    parent = None
    for i in range(n):
        parent = store.put(Note(text=f"note {i}", parent=parent))
        ids.append(parent)
    return ids


def test_put_get_round_trip(store: mc.Store) -> None:
    blob = store.put_blob(b"attachment")
    note = Note(text="hello", attachments=[blob])
    oid = store.put(note)
    assert store.get(oid) == note
    assert store.get(oid, Note) == note
    assert store.get(str(oid), Note) == note
    assert store.kind(oid) == "test-note"
    assert store.get(blob) == b"attachment"
    assert store.put(note) == oid  # idempotent


def test_typed_get_refuses_wrong_kind(store: mc.Store) -> None:
    oid = store.put(Note(text="x"))
    with pytest.raises(mc.InvalidObject, match="test-note"):
        store.get(oid, Other)


def test_has_missing_and_not_found(store: mc.Store) -> None:
    a = store.put(Note(text="a"))
    absent = ObjectId(b"\x07" * 32)
    assert store.has(a) and a in store
    assert not store.has(absent) and absent not in store
    assert "not an id" not in store
    assert store.missing([a, absent, a]) == [absent]
    with pytest.raises(mc.NotFound, match="07070707"):
        store.get(absent)
    with pytest.raises(KeyError):  # NotFound is a KeyError for mapping-style callers
        store.get_raw(absent)


def test_put_many_and_get_many(store: mc.Store) -> None:
    notes = [Note(text=f"n{i}") for i in range(2500)]
    seen: list[int] = []
    ids = store.put_many(notes, progress=seen.append)
    assert seen[-1] == 2500
    assert ids == [store.put(n) for n in notes[:3]] + ids[3:]
    got = dict(store.get_many(ids[::-1], Note))
    assert [got[i] for i in ids] == notes


def test_get_raw_many_allow_missing(store: mc.Store) -> None:
    a = store.put(Note(text="a"))
    absent = ObjectId(b"\x01" * 32)
    assert [d is None for _, d in store.get_raw_many([a, absent], allow_missing=True)] == [
        False,
        True,
    ]
    with pytest.raises(mc.NotFound):
        list(store.get_raw_many([a, absent]))


def test_unknown_kind_is_readable(store: mc.Store) -> None:
    link = store.put_blob(b"x")
    oid = store.put_object("someone-elses-kind", 4, {"ref": link, "n": 3})
    obj = store.get(oid)
    assert isinstance(obj, mc.UnknownObject)
    assert obj.kind == "someone-elses-kind" and obj.version == 4
    assert obj.body == {"n": 3, "ref": link}
    assert store.closure(oid) == {oid, link}


def test_closure_and_walk(store: mc.Store) -> None:
    ids = chain(store, 50)
    blob = store.put_blob(b"leaf")
    top = store.put(Note(text="top", parent=ids[-1], attachments=[blob, blob]))
    assert store.closure(top) == {*ids, blob, top}
    walked = [oid for oid, _ in store.walk([top, ids[10]])]
    assert len(walked) == len(set(walked)) == 52
    assert walked[:2] == [top, ids[10]]


def test_put_refuses_a_record_whose_links_are_not_stored(store: mc.Store) -> None:
    """An object is present only when all it links is: put, put_many and put_object refuse
    a parent before its child (one presence check a batch), naming both."""
    ghost = ObjectId(b"\x42" * 32)
    with pytest.raises(mc.NotFound, match=r"4242.*linked by"):
        store.put(Note(text="dangling", parent=ghost))
    with pytest.raises(mc.NotFound, match="4242"):
        store.put_many([Note(text="fine"), Note(text="dangling", parent=ghost)])
    with pytest.raises(mc.NotFound, match="4242"):
        store.put_object("test-raw", 1, {"link": ghost})
    assert list(store.iter_ids()) == []
    # links within one batch count as stored: the child may come later in it
    child = Note(text="child")
    ids = store.put_many([Note(text="parent", parent=hash_bytes(encode(child))), child])
    assert store.get(ids[0], Note).parent == ids[1]


def test_walk_names_missing_object(store: mc.Store) -> None:
    ghost = ObjectId(b"\x42" * 32)
    # a store whose child went missing (put_raw is the plumbing that trusts its caller):
    # walking it names the gap
    top = store.put_raw(encode(Note(text="dangling", parent=ghost)))
    with pytest.raises(mc.NotFound, match="4242"):
        store.closure(top)
    assert dict(store.walk([top], allow_missing=True))[ghost] is None


def test_put_tree_refuses_missing_entries(store: mc.Store) -> None:
    with pytest.raises(mc.NotFound, match=r"a\.txt"):
        store.put_tree({"a.txt": ObjectId(b"\x09" * 32)})
    assert list(store.iter_ids()) == []


def test_resolve_prefix_ref_and_ambiguity(store: mc.Store) -> None:
    ids = [store.put(Note(text=f"{i}")) for i in range(300)]
    target = ids[17]
    assert store.resolve(target.hex()) == target
    assert store.resolve(target.hex()[:12]) == target
    assert store.resolve(target.hex()[:12].upper()) == target
    store.refs.add_if_new("notes/latest", target)
    assert store.resolve("notes/latest") == target
    with pytest.raises(mc.InvalidId, match="too short"):
        store.resolve("abc")
    with pytest.raises(mc.NotFound):
        store.resolve("notes/absent")
    with pytest.raises(mc.NotFound):
        store.resolve("ffffffffffff0000")


def test_ambiguous_prefix_lists_candidates() -> None:
    # two blobs whose ids share 8 hex characters: a birthday search over 32 bits
    seen: dict[str, int] = {}
    pair = None
    for i in range(1_000_000):
        p = blob_object(str(i).encode())[0].hex()[:8]
        if p in seen:
            pair = (seen[p], i)
            break
        seen[p] = i
    assert pair is not None
    store = mc.open("memory://")
    a, b = (store.put_blob(str(i).encode()) for i in pair)
    with pytest.raises(mc.AmbiguousId) as err:
        store.resolve(a.hex()[:8])
    assert err.value.candidates == sorted([a.hex(), b.hex()])
    assert a.hex() in str(err.value) and b.hex() in str(err.value)
    assert store.resolve(a.hex()[:9] if a.hex()[8] != b.hex()[8] else a.hex()) == a


@pytest.mark.parametrize("bad", ["xyz", "12345678zz", "", "../etc/passwd", "a" * 65])
def test_bad_specs_are_clear(store: mc.Store, bad: str) -> None:
    with pytest.raises((mc.InvalidId, mc.NotFound, mc.InvalidName)):
        store.resolve(bad)


def test_ids_print_as_lowercase_hex() -> None:
    oid = ObjectId(bytes(range(32)))
    assert (
        str(oid) == oid.hex() == "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    )
    assert ObjectId.from_hex(str(oid)) == oid
    for bad in ["00" * 31, "zz" * 32, "AB" * 32]:
        with pytest.raises(mc.InvalidId):
            ObjectId.from_hex(bad)
    with pytest.raises(mc.InvalidId):
        ObjectId(b"short")


def test_put_trees_batches_and_checks_every_entry(store: mc.Store) -> None:
    a, b = store.put_blob(b"a"), store.put_blob(b"b")
    ids = store.put_trees([{"x": a}, {"x": a, "y": b}, {"x": a}])
    assert ids[0] == ids[2] == store.put_tree({"x": a}) and ids[1] == store.put_tree(
        {"x": a, "y": b}
    )
    ghost = mc.ObjectId(bytes(32))
    with pytest.raises(mc.NotFound, match="tree entry 'z'"):
        store.put_trees([{"x": a}, {"z": ghost}])
