"""fsck and verify_closure: every damaged byte is found, named, and never raised."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator, Sequence

import msgspec
import pytest

import medomni_cas as mc
from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding, verify
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.backends.memory import MemoryBackend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.verify import FsckReport, Problem, fsck, verify_closure
from tests.conftest import store_url


def build(store: mc.Store, tag: str = "", *, leaves: int = 30) -> tuple[ObjectId, list[ObjectId]]:
    """A root tree over subtrees of blobs and a record with links; returns root and leaves."""
    blobs = [store.put_blob(f"{tag} leaf {i}".encode()) for i in range(leaves)]
    subtrees = [
        store.put_tree({f"f{j}": b for j, b in enumerate(blobs[i : i + 5])})
        for i in range(0, leaves, 5)
    ]
    note = store.put_object("test-verify-note", 1, {"text": tag, "see": subtrees[:2]})
    root = store.put_tree({**{f"d{i}": t for i, t in enumerate(subtrees)}, "note": note})
    return root, blobs


def _tamper(store: mc.Store, key: bytes, data: bytes) -> None:
    """Replace the stored bytes of ``key`` behind the store's back (no API can)."""
    b = store.backend
    if isinstance(b, MemoryBackend):
        b._objects[key] = (b._objects[key][0], data)
    elif isinstance(b, LMDBBackend):
        with b.env.begin(write=True) as txn:
            value = txn.get(key, db=b._objects)
            if value[0] == 0:  # inline: keep the 9-byte header (flag, write time)
                txn.put(key, bytes(value[:9]) + data, db=b._objects)
            else:
                b._file(key).write_bytes(data)
    elif hasattr(b, "_object_path"):  # the directory backend: one file per object
        b._object_path(key).write_bytes(data)
    else:
        pytest.skip(f"no way to tamper with {type(b).__name__}")


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def test_clean_store(store: mc.Store) -> None:
    root, _ = build(store, "a")
    other, _ = build(store, "b")
    store.refs.set("main", root)
    store.refs.set("other/x", other)
    report = fsck(store)
    assert report == FsckReport(ok=True, objects=len(list(store.iter_ids())), refs=2, problems=[])
    assert msgspec.json.decode(msgspec.json.encode(report), type=FsckReport) == report


@pytest.mark.parametrize("kind", ["memory", "lmdb", "file"])
def test_every_single_bit_flip_is_found(kind: str, tmp_path: os.PathLike[str]) -> None:
    store = mc.open(store_url(kind, tmp_path))
    try:
        root, _ = build(store, "flip", leaves=20)
        big = store.put_blob(random.Random(1).randbytes(2 * 1024 * 1024 + 17))  # chunks on disk
        store.refs.set("main", store.put_tree({"data": root, "big": big}))
        stray = store.put_blob(b"reachable from nothing")
        keys = sorted(store.backend.iter_keys())
        rng = random.Random(20240611)
        for _ in range(200):
            key = rng.choice(keys)
            good = store.backend.get(key)
            _tamper(store, key, _flip(good, rng.randrange(len(good) * 8)))
            report = fsck(store)
            hex_id = key.hex()
            assert not report.ok
            assert [(p.kind, p.id) for p in report.problems] == [("corrupt", hex_id)]
            assert hex_id in report.problems[0].message
            assert report.problems[0].ref == ("" if key == stray else "main")
            with pytest.raises(mc.IntegrityError) as e:
                store.get_raw(ObjectId(key))
            assert e.value.expected == hex_id and hex_id in str(e.value)
            _tamper(store, key, good)
        assert fsck(store).ok
    finally:
        store.close()


def test_missing_linked_object_names_parent_and_ref(store: mc.Store) -> None:
    root, blobs = build(store, "m")
    store.refs.set("tasksets/a/b", root)
    parent = store.put_tree({"only": blobs[7]})
    store.refs.set("second", parent)
    assert store.backend.delete_many([blobs[7]]) == 1
    report = fsck(store)
    assert [(p.kind, p.id) for p in report.problems] == [("missing", blobs[7].hex())]
    problem = report.problems[0]
    # reached first from the first ref in name order, through the subtree that holds it
    assert problem.ref == "second"
    assert parent.hex() in problem.message and "second" in problem.message


def _counting_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many roots each walk of fsck is given, walk by walk."""
    walks: list[int] = []
    walk = verify._Walk.walk

    def counted(w: verify._Walk, roots: Iterable[bytes]) -> list[bytes]:
        roots = list(roots)
        walks.append(len(roots))
        return walk(w, roots)

    monkeypatch.setattr(verify._Walk, "walk", counted)
    return walks


def test_fsck_reads_the_store_in_one_pass_and_walks_only_on_a_problem(
    store: mc.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sound store is checked in one pass in key order, with no walk; a problem found
    sends fsck to walk every ref at once, then one ref at a time, to name what reaches it."""
    roots = [build(store, f"r{i}", leaves=10) for i in range(30)]
    for i, (root, _) in enumerate(roots):
        store.refs.set(f"runs/slots/{i:02d}", root)
        store.refs.set(f"runs/again/{i:02d}", root)  # two refs to one closure
    walks = _counting_walks(monkeypatch)
    clean = fsck(store)
    assert clean.ok and clean.objects == len(list(store.iter_ids())) and clean.refs == 60
    assert walks == []  # the pass, no walk
    leaf = roots[17][1][3]
    _tamper(store, leaf, _flip(store.backend.get(leaf), 9))
    report = fsck(store)
    assert walks == [60] + [1] * 30  # then one ref at a time (the other 30 share closures)
    (problem,) = report.problems
    assert (problem.kind, problem.id, problem.ref) == ("corrupt", leaf.hex(), "runs/again/17")
    assert report.objects == clean.objects


def test_a_missing_link_of_an_unreached_object_is_not_a_problem_of_the_refs(
    store: mc.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass sees every object's links, reached or not; fsck reports a missing object
    that a ref's closure needs, as the walks do: an unreached object that links a missing
    one (gc cut short between the two) sends fsck to the walks, which find all sound."""
    root, _ = build(store, "kept")
    store.refs.set("main", root)
    gone = store.put_blob(b"swept")
    store.put_tree({"x": gone})  # unreached, and what it links is then deleted
    store.backend.delete_many([gone])
    walks = _counting_walks(monkeypatch)
    seen: list[int] = []
    report = fsck(store, progress=seen.append)
    assert report.ok, report.problems
    assert walks == [1]  # the pass found the missing link; the walk of the refs did not
    assert report.objects == len(list(store.iter_ids()))
    assert seen == sorted(seen)  # the walks' count goes on from the pass's


def test_a_stored_key_that_is_not_an_id_is_named(tmp_path: os.PathLike[str]) -> None:
    """A key of the wrong length (a flipped B-tree page) stops the pass; the walks name it."""
    store = mc.Store(LMDBBackend(os.path.join(tmp_path, "s"), durable=False))
    with store:
        root, _ = build(store, "odd")
        store.refs.set("main", root)
        b = store.backend
        assert isinstance(b, LMDBBackend)
        with b.env.begin(write=True) as txn:
            txn.put(b"\x00short", b"\x00" * 9 + b"x", db=b._objects)
        report = fsck(store)
        assert [(p.kind, p.id) for p in report.problems] == [("malformed", b"\x00short".hex())]
        assert "of 6 bytes is not an id" in report.problems[0].message


def test_an_object_deleted_between_the_listing_and_its_read_is_found_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass lists keys, then reads them (a backend without a pass of its own): a linked
    object deleted in between is not among those read, though its key was listed, and a
    link to it must not pass for being listed."""
    store = mc.open("memory://")
    root, leaves = build(store, "gone")
    store.refs.set("main", root)
    lost = leaves[4]
    backend = store.backend
    assert isinstance(backend, MemoryBackend)
    get_parts = MemoryBackend.get_parts

    def deleting(
        self: MemoryBackend, keys: Sequence[bytes], held_bytes: int
    ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        self._objects.pop(lost, None)  # a writer elsewhere, between listing and reading
        return get_parts(self, keys, held_bytes)

    monkeypatch.setattr(MemoryBackend, "get_parts", deleting)
    report = fsck(store)
    assert [(p.kind, p.id) for p in report.problems] == [("missing", lost.hex())]


def test_dangling_refs(store: mc.Store) -> None:
    root, _ = build(store, "d")
    store.refs.set("a", root)
    store.refs.set("b", root)
    store.backend.delete_many([root])
    report = fsck(store)
    assert sorted((p.kind, p.id, p.ref) for p in report.problems) == [
        ("dangling-ref", "a", "a"),
        ("dangling-ref", "b", "b"),
    ]
    assert root.hex() in report.problems[0].message
    # its children are still there and still checked
    assert report.objects == len(list(store.iter_ids()))


def test_malformed_objects(store: mc.Store) -> None:
    good, _ = build(store, "g")
    store.refs.set("main", good)
    # a map with unsorted keys: valid msgpack, but not what our encoder writes
    unsorted = msgspec.msgpack.encode(["test-verify-note", 1, {"z": 1, "a": 2}])
    garbage = b"\xc1 not msgpack at all"
    bad = {hash_bytes(unsorted): unsorted, hash_bytes(garbage): garbage}
    store.backend.put_many(bad.items())  # below the Store, which would refuse them
    holder = store.put_tree({"x": hash_bytes(unsorted)})
    store.refs.set("holder", holder)
    report = fsck(store)
    found = {p.id: p for p in report.problems}
    assert set(found) == {k.hex() for k in bad}
    assert {p.kind for p in found.values()} == {"malformed"}
    assert "canonical" in found[hash_bytes(unsorted).hex()].message
    assert found[hash_bytes(unsorted).hex()].ref == "holder"
    assert found[hash_bytes(garbage).hex()].ref == ""


def test_many_problems_at_once_never_raise(tmp_path: os.PathLike[str]) -> None:
    store = mc.open("memory://")
    root, blobs = build(store, "many")
    store.refs.set("main", root)
    store.refs.set("gone", store.put_blob(b"soon gone"))
    store.backend.delete_many([store.refs["gone"], blobs[0]])
    _tamper(store, blobs[1], b"tampered")
    _tamper(store, blobs[2], blob_object(b"another blob")[1])
    report = fsck(store)
    assert sorted((p.kind, p.id) for p in report.problems) == sorted(
        [
            ("dangling-ref", "gone"),
            ("missing", blobs[0].hex()),
            ("corrupt", blobs[1].hex()),
            ("corrupt", blobs[2].hex()),
        ]
    )
    assert all(p.ref == "main" for p in report.problems if p.kind != "dangling-ref")


def test_verify_closure_is_restricted_to_its_roots(store: mc.Store) -> None:
    a, _ = build(store, "a")
    b, b_leaves = build(store, "b")
    store.backend.delete_many([b_leaves[3]])
    report = verify_closure(store, [a])
    assert report.ok and report.refs == 0
    assert report.objects == len(store.closure(a))
    report = verify_closure(store, [str(b)])
    assert [(p.kind, p.id, p.ref) for p in report.problems] == [("missing", b_leaves[3].hex(), "")]
    absent = ObjectId(b"\x05" * 32)
    report = verify_closure(store, [absent])
    assert report.problems == [Problem("missing", absent.hex(), f"root object {absent} is missing")]


def test_verify_closure_finds_corruption_inside_only() -> None:
    store = mc.open("memory://")
    a, _ = build(store, "a")
    b, b_leaves = build(store, "b")
    _tamper(store, b_leaves[0], b"bad")
    assert verify_closure(store, [a]).ok
    assert [p.id for p in verify_closure(store, [a, b]).problems] == [b_leaves[0].hex()]
    assert [p.id for p in fsck(store).problems] == [b_leaves[0].hex()]


def test_lmdb_large_object_file_lost(tmp_path: os.PathLike[str]) -> None:
    store = mc.open(store_url("lmdb", tmp_path))
    try:
        big = store.put_blob(random.Random(2).randbytes(3 * 1024 * 1024))
        chunks = store.get(big).chunks
        store.refs.set("main", big)
        stray = store.put_blob(random.Random(3).randbytes(300 * 1024))  # one large object
        backend = store.backend
        assert isinstance(backend, LMDBBackend)
        backend._file(chunks[1]).unlink()
        backend._file(stray).unlink()
        report = fsck(store)
        found = {p.id: p for p in report.problems}
        assert set(found) == {chunks[1].hex(), stray.hex()}
        assert all(p.kind == "missing" for p in found.values())
        assert big.hex() in found[chunks[1].hex()].message
        assert "cannot be read" in found[stray.hex()].message
    finally:
        store.close()


def test_progress_counts_objects(store: mc.Store) -> None:
    root, _ = build(store, "p")
    store.refs.set("main", root)
    seen: list[int] = []
    report = fsck(store, progress=seen.append)
    assert seen and seen == sorted(seen) and seen[-1] == report.objects


def test_one_decode_path_agrees_with_the_full_check() -> None:
    """Once a kind has passed the full check, verify reads its objects with one decode (the
    links collected by the decoder's hook) and one re-encode; each verdict and every link
    must be what `validate_canonical` and `links` say, odd bytes included."""
    store = mc.open("memory://")
    a, b, c = (store.put_blob(b"leaf %d" % i) for i in range(3))
    kind = "test-verify-note"
    admit = store.put_object(kind, 1, {"see": [a]})

    def raw(*value: object) -> bytes:  # plain msgpack: keys in the order given
        return msgspec.msgpack.encode(list(value))

    def link(oid: bytes) -> msgspec.msgpack.Ext:
        return msgspec.msgpack.Ext(1, bytes(oid))

    crafted = [
        encoding.encode_object(kind, 1, {"x": [b, {"y": a}, b], "z": c}),  # repeats, nesting
        encoding.encode_object(kind, 1, {"n": 1.5, "s": "\xc7 \x01 looks like a link"}),
        encoding.encode_object(kind, 2, {"see": c}),  # a version not seen yet
        raw(kind, 1, {"z": 1, "a": link(a)}),  # keys not sorted
        raw(kind, 1, {"a": -0.0}),
        raw(kind, 1, {"a": float("nan")}),
        raw(kind, 1, {"a": msgspec.msgpack.Ext(2, b"x")}),  # unknown extension
        raw(kind, 1, {"a": msgspec.msgpack.Ext(1, b"short")}),  # a link of the wrong length
        raw(kind, 1, {"a": 1}) + b"\x00",  # trailing bytes
        raw(kind, 1, {"a": 1}, 4),  # four elements
        raw(kind, True, {"a": 1}),  # a bool version
        raw(kind, 1, {"a": {1: 2}}),  # an integer map key
        raw("blob", 2, b"x"),  # a blob kind without the blob header
        encoding.encode_blob_header(5) + b"abc",  # a truncated blob
        b"\xc1 not msgpack",
    ]
    expected: list[Problem] = []
    links: set[bytes] = {a}
    for data in crafted:
        oid = hash_bytes(data)
        try:
            encoding.validate_canonical(data)
            links.update(encoding.links(data))
        except InvalidObject as e:
            expected.append(Problem("malformed", oid.hex(), f"object {oid}: {e}"))
    ids = [hash_bytes(d) for d in crafted]
    store.backend.put_many(zip(ids, crafted, strict=True))
    report = verify_closure(store, [admit, *ids])
    assert sorted(report.problems, key=lambda p: p.id) == sorted(expected, key=lambda p: p.id)
    assert len(expected) == len(crafted) - 3
    assert report.objects == 1 + len(crafted) + len(links)
    # a link that only the one-decode path reads is followed: its absence is found
    store.backend.delete_many([c])
    report = verify_closure(store, [admit, ids[0]])
    assert [(p.kind, p.id) for p in report.problems] == [("missing", c.hex())]
    assert ids[0].hex() in report.problems[0].message


def test_walk_checked_finds_bad_objects_and_how_they_were_reached(store: mc.Store) -> None:
    """The one checked walk: what is bad, who first links each object (with parents), every
    referrer of a shared bad blob, and the kind a damaged object's bytes still name."""
    shared = store.put_blob(b"shared by every note")
    gone = store.put_blob(b"soon gone")
    notes = [
        store.put_object("test-verify-note", 1, {"i": i, "see": [shared, gone]}) for i in range(3)
    ]
    root = store.put_tree({f"n{i}": n for i, n in enumerate(notes)})
    _tamper(store, shared, _flip(store.backend.get(shared), 100))
    store.backend.delete_many([gone])
    fast = verify.walk_checked(store, [root], canonical=True, jobs=1)
    assert {k: b.kind for k, b in fast.bad.items()} == {shared: "corrupt", gone: "missing"}
    assert fast.bad[shared].detail == hash_bytes(store.backend.get(shared)).hex()
    assert fast.objects == 1 + 3 + 1 and fast.processes == 1
    assert set(fast.parent) == {gone} and fast.parent[gone] in notes  # the missing one only
    with pytest.raises(ValueError, match="parents=True"):
        fast.referrers()
    named = verify.walk_checked(store, [root], canonical=False, parents=True)
    assert named.bad == fast.bad
    assert named.parent[root] is None and {named.parent[n] for n in notes} == {root}
    assert named.parent[shared] == named.parent[gone] in notes
    referrers = named.referrers()
    assert sorted(referrers[shared]) == sorted(notes) == sorted(referrers[gone])
    assert named.stored_kind(shared) == ("blob", 1)  # the flipped bit is in the payload
    assert named.stored_kind(gone) is None
