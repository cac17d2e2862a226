"""Bundles: round trips between backends, and every damaged or crafted bundle refused whole."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import blake3
import msgspec
import pytest

import medomni_cas as mc
from medomni_cas.store.bundle import (
    BundleError,
    BundleInfo,
    BundleRefConflict,
    export_bundle,
    import_bundle,
    read_bundle_header,
)
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.verify import fsck
from tests.conftest import store_url
from tests.test_verify import build


def craft(
    path: Path,
    records: Iterable[tuple[bytes, bytes]],
    *,
    roots: Iterable[bytes] = (),
    refs: Mapping[str, bytes] | None = None,
    created: float = 0.0,
) -> bytes:
    """A bundle written from the format in bundle.py's docstring, independently of its code."""
    header = msgspec.msgpack.encode(
        {
            "created": created,
            "refs": {n: v.hex() for n, v in sorted((refs or {}).items())},
            "roots": [r.hex() for r in roots],
        }
    )
    out = bytearray(b"MEDOMNI-BUNDLE\x00" + bytes([1]) + len(header).to_bytes(4, "big") + header)
    index = []
    for oid, data in records:
        index.append((bytes(oid), len(out)))
        out += bytes(oid) + len(data).to_bytes(8, "big") + data
    index_offset = len(out)
    for oid, offset in sorted(index):
        out += oid + offset.to_bytes(8, "big")
    out += index_offset.to_bytes(8, "big") + len(index).to_bytes(8, "big")
    out += blake3.blake3(bytes(out)).digest() + b"MOBUNDLE"
    path.write_bytes(bytes(out))
    return bytes(out)


def records_of(store: mc.Store, roots: list[ObjectId]) -> list[tuple[ObjectId, bytes]]:
    return [(oid, data) for oid, data in store.walk(roots) if data is not None]


def populate(store: mc.Store) -> tuple[ObjectId, dict[str, ObjectId]]:
    root, _ = build(store, "bundle")
    big = store.put_blob(random.Random(5).randbytes(2 * 1024 * 1024 + 3))  # chunked
    top = store.put_tree({"data": root, "big": big})
    refs = {"tasksets/demo/set": top, "benchmarks/demo": root}
    for name, oid in refs.items():
        store.refs.set(name, oid)
    return top, refs


@pytest.fixture
def mem() -> Iterator[mc.Store]:
    s = mc.open("memory://")
    yield s
    s.close()


def _rewrite(path: Path, data: bytes) -> None:
    # a new file rather than a truncated one: truncating costs milliseconds on ext4
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def _state(store: mc.Store) -> tuple[set[ObjectId], dict[str, ObjectId]]:
    return set(store.iter_ids()), store.refs.as_dict()


@pytest.mark.parametrize(("src", "dst"), [("memory", "lmdb"), ("lmdb", "memory"), ("file", "lmdb")])
def test_round_trip_between_backends(src: str, dst: str, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with mc.open(store_url(src, tmp_path / "a")) as a, mc.open(store_url(dst, tmp_path / "b")) as b:
        top, refs = populate(a)
        a.put_blob(b"not in the bundle")
        path = tmp_path / "demo.bundle"
        progress: list[int] = []
        info = export_bundle(a, [top], path, refs=refs, progress=progress.append)
        closure = a.closure(top)
        assert info.objects == len(closure) and progress[-1] == len(closure)
        assert info.bytes == path.stat().st_size
        assert read_bundle_header(path) == info
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
        report = import_bundle(b, path, progress=progress.append)
        assert report.objects == report.new == len(closure)
        assert sorted(report.refs_updated) == sorted(refs)
        assert set(b.iter_ids()) == closure
        assert b.refs.as_dict() == refs
        assert fsck(b).ok
        assert b.read_blob(b.get(top)["big"]) == a.read_blob(a.get(top)["big"])
        again = import_bundle(b, path)  # idempotent
        assert again.new == 0 and again.refs_updated == []


def test_export_from_every_backend(store: mc.Store, tmp_path: Path, mem: mc.Store) -> None:
    top, refs = populate(store)
    export_bundle(store, [top], tmp_path / "x.bundle", refs=refs)
    import_bundle(mem, tmp_path / "x.bundle")
    assert set(mem.iter_ids()) == store.closure(top) and mem.refs.as_dict() == refs


def test_file_matches_the_documented_format(mem: mc.Store, tmp_path: Path) -> None:
    top, refs = populate(mem)
    info = export_bundle(mem, [top], tmp_path / "lib.bundle", refs=refs)
    ours = (tmp_path / "lib.bundle").read_bytes()
    theirs = craft(
        tmp_path / "spec.bundle",
        records_of(mem, [top, *refs.values()]),
        roots=[top],
        refs=refs,
        created=info.created,
    )
    assert ours == theirs


def test_refs_outside_the_roots_are_included(mem: mc.Store, tmp_path: Path) -> None:
    top, refs = populate(mem)
    other = mem.put_blob(b"only named by a ref")
    info = export_bundle(mem, [], tmp_path / "r.bundle", refs={"x": other, **refs})
    assert info.roots == [] and info.objects == len(mem.closure([top, other]))
    with mc.open("memory://") as dst:
        import_bundle(dst, tmp_path / "r.bundle")
        assert dst.refs["x"] == other


def test_truncated_bundle_refused_at_every_offset(mem: mc.Store, tmp_path: Path) -> None:
    root, _ = build(mem, "small", leaves=10)
    path = tmp_path / "t.bundle"
    export_bundle(mem, [root], path, refs={"main": root})
    data = path.read_bytes()
    dst = mc.open("memory://")
    dst.refs.set("mine", dst.put_blob(b"already here"))
    before = _state(dst)
    cut = tmp_path / "cut.bundle"
    for n in range(len(data)):
        _rewrite(cut, data[:n])
        with pytest.raises(BundleError) as e:
            import_bundle(dst, cut)
        assert str(cut) in str(e.value)
        assert _state(dst) == before
    with pytest.raises(BundleError, match="truncated"):
        read_bundle_header(cut)


def test_any_flipped_byte_refused(mem: mc.Store, tmp_path: Path) -> None:
    root, _ = build(mem, "flip", leaves=10)
    path = tmp_path / "f.bundle"
    export_bundle(mem, [root], path, refs={"main": root})
    data = path.read_bytes()
    dst = mc.open("memory://")
    before = _state(dst)
    bad = tmp_path / "bad.bundle"
    rng = random.Random(7)
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 1 << rng.randrange(8)
        _rewrite(bad, bytes(flipped))
        with pytest.raises(BundleError, match=str(bad)):
            import_bundle(dst, bad)
        assert _state(dst) == before


def test_bundle_missing_a_linked_object_refused(mem: mc.Store, tmp_path: Path) -> None:
    root, leaves = build(mem, "open")
    records = [(k, d) for k, d in records_of(mem, [root]) if k != leaves[4]]
    path = tmp_path / "open.bundle"
    craft(path, records, roots=[root], refs={"main": root})
    dst = mc.open("memory://")
    with pytest.raises(BundleError, match=f"not closed.*{leaves[4]}"):
        import_bundle(dst, path)
    assert _state(dst) == (set(), {})
    # the same bundle is fine for a store that already holds the missing object
    dst.put_raw(mem.get_raw(leaves[4]))
    assert leaves[4] in dst
    report = import_bundle(dst, path)
    assert report.new == len(records) and fsck(dst).ok


def test_non_canonical_object_refused(mem: mc.Store, tmp_path: Path) -> None:
    root, _ = build(mem, "canon")
    unsorted = msgspec.msgpack.encode(["test-bundle-note", 1, {"z": 1, "a": 2}])
    bad = hash_bytes(unsorted)
    # the bad object comes last: the good ones before it must not be written either
    path = tmp_path / "nc.bundle"
    craft(path, [*records_of(mem, [root]), (bad, unsorted)], roots=[root, bad])
    dst = mc.open("memory://")
    with pytest.raises(BundleError, match=f"{bad}.*canonical"):
        import_bundle(dst, path)
    assert _state(dst) == (set(), {})


def test_record_whose_bytes_do_not_match_its_id_refused(mem: mc.Store, tmp_path: Path) -> None:
    root, leaves = build(mem, "ids")
    records = [
        (k, mem.get_raw(leaves[0]) if k == leaves[1] else d) for k, d in records_of(mem, [root])
    ]
    path = tmp_path / "ids.bundle"
    craft(path, records, roots=[root])
    dst = mc.open("memory://")
    with pytest.raises(BundleError, match=f"{leaves[1]} is corrupt"):
        import_bundle(dst, path)
    assert _state(dst) == (set(), {})


def test_structural_lies_refused(mem: mc.Store, tmp_path: Path) -> None:
    root, _ = build(mem, "lies", leaves=5)
    records = records_of(mem, [root])
    dst = mc.open("memory://")
    path = tmp_path / "lie.bundle"
    craft(path, [*records, records[0]], roots=[root])  # one object twice
    with pytest.raises(BundleError, match="twice"):
        import_bundle(dst, path)
    craft(path, records, roots=[ObjectId(b"\x01" * 32)])  # a root nobody has
    with pytest.raises(BundleError, match="root 0101"):
        import_bundle(dst, path)
    craft(path, records, refs={"../escape": root})
    with pytest.raises(BundleError, match="unreadable header"):
        import_bundle(dst, path)
    path.write_bytes(b"PK\x03\x04 a zip file, not a bundle" + bytes(100))
    with pytest.raises(BundleError, match="not a medomni bundle"):
        read_bundle_header(path)
    data = bytearray(craft(path, records, roots=[root]))
    data[15] = 9
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="version 9 is not supported"):
        import_bundle(dst, path)
    assert _state(dst) == (set(), {})


def test_conflicting_ref_refused_before_writing(mem: mc.Store, tmp_path: Path) -> None:
    top, refs = populate(mem)
    path = tmp_path / "c.bundle"
    export_bundle(mem, [top], path, refs=refs)
    dst = mc.open("memory://")
    theirs = dst.put_blob(b"a different task set")
    dst.refs.set("tasksets/demo/set", theirs)
    before = _state(dst)
    with pytest.raises(BundleRefConflict) as e:
        import_bundle(dst, path)
    assert isinstance(e.value, mc.ConflictError)
    assert e.value.name == "tasksets/demo/set" and e.value.current == theirs.hex()
    assert theirs.hex() in str(e.value) and top.hex() in str(e.value) and str(path) in str(e.value)
    assert _state(dst) == before
    # without refs, the objects come in and every ref stays as it was
    report = import_bundle(dst, path, refs=False)
    assert report.refs_updated == [] and report.new == report.objects
    assert dst.refs.as_dict() == {"tasksets/demo/set": theirs}


def test_fast_forward_moves_ref(mem: mc.Store, tmp_path: Path) -> None:
    old = mem.put_object("test-bundle-set", 1, {"pairs": ["a"]})
    new = mem.put_object("test-bundle-set", 1, {"pairs": ["a", "b"], "previous": old})
    dst = mc.open("memory://")
    export_bundle(mem, [old], tmp_path / "old.bundle", refs={"sets/x": old})
    import_bundle(dst, tmp_path / "old.bundle")
    export_bundle(mem, [new], tmp_path / "new.bundle", refs={"sets/x": new})
    report = import_bundle(dst, tmp_path / "new.bundle")
    assert report.refs_updated == ["sets/x"] and dst.refs["sets/x"] == new
    assert [e.new_id for e in dst.refs.history("sets/x")] == [old, new]
    # going back is not a fast-forward
    with pytest.raises(BundleRefConflict):
        import_bundle(dst, tmp_path / "old.bundle")


def test_failed_export_leaves_nothing(mem: mc.Store, tmp_path: Path) -> None:
    root, leaves = build(mem, "gone")
    mem.backend.delete_many([leaves[2]])
    target = tmp_path / "out" / "x.bundle"
    target.parent.mkdir()
    with pytest.raises(mc.NotFound, match=leaves[2].hex()):
        export_bundle(mem, [root], target)
    assert list(target.parent.iterdir()) == []
    # an existing bundle at the target survives a failed export untouched
    target.write_bytes(b"previous")
    with pytest.raises(mc.NotFound):
        export_bundle(mem, [root], target)
    assert target.read_bytes() == b"previous" and len(list(target.parent.iterdir())) == 1


def test_header_info_serialises(mem: mc.Store, tmp_path: Path) -> None:
    top, refs = populate(mem)
    info = export_bundle(mem, [top], os.fspath(tmp_path / "h.bundle"), refs=refs)
    assert msgspec.json.decode(msgspec.json.encode(info), type=BundleInfo) == info
    assert info.refs == {n: v.hex() for n, v in refs.items()}
