"""The zarr v3 store over the CAS: zarr's own conformance suite and stateful tests, then
deduplication, commits and refs, key checks, read-only views, byte ranges and integrity."""

from __future__ import annotations

import pickle
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import zarr
from hypothesis import HealthCheck, settings
from hypothesis.stateful import rule, run_state_machine_as_test
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype
from zarr.core.sync import _collect_aiterator, sync
from zarr.testing.stateful import ZarrHierarchyStateMachine, ZarrStoreStateMachine
from zarr.testing.store import StoreTests

import medomni_cas as mc
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.objects import CHUNK_SIZE, Tree
from medomni_cas.store.trees import iter_tree
from medomni_cas.views.zarr_store import VALUE_ENTRY, CASStore, put_zarr_directory


def _buf(data: bytes) -> Buffer:
    return cpu.Buffer.from_bytes(data)


def _listed(keys: AsyncIterator[str]) -> list[str]:
    return sorted(sync(_collect_aiterator(keys)))


def _bytes(store: CASStore, key: str, **kw: Any) -> bytes | None:
    value = store.get_sync(key, **kw)
    return None if value is None else value.to_bytes()


@pytest.fixture(params=["memory", "lmdb"])
def cas(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[mc.Store]:
    if request.param == "memory":
        store = mc.open("memory://")
    else:  # not durable: the suite opens a store per test and fsync would dominate
        store = mc.Store(LMDBBackend(tmp_path / "lmdb", durable=False))
    yield store
    store.close()


# -- zarr's conformance suite ------------------------------------------------------------------
# The project runs pytest-asyncio in strict mode; zarr's suite is written for auto mode, so its
# async fixtures are redeclared with pytest_asyncio and its coroutine tests marked here (the
# sync ones then warn about the mark, which says nothing about this store).
@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:The test .* is marked with '@pytest.mark.asyncio'")
class TestCASStore(StoreTests[CASStore, cpu.Buffer]):
    store_cls = CASStore
    buffer_cls = cpu.Buffer

    @pytest.fixture
    def store_kwargs(self, cas: mc.Store) -> dict[str, Any]:
        return {"store": cas}

    @pytest_asyncio.fixture(loop_scope="function")
    async def store(self, open_kwargs: dict[str, Any]) -> CASStore:
        return await self.store_cls.open(**open_kwargs)

    @pytest_asyncio.fixture(loop_scope="function")
    async def store_not_open(self, store_kwargs: dict[str, Any]) -> CASStore:
        return self.store_cls(**store_kwargs)

    async def set(self, store: CASStore, key: str, value: Buffer) -> None:
        # bypass CASStore.set: put the blob and record it as an uncommitted write
        store._session.put(key, store.cas.put_blob(value.to_bytes()))

    async def get(self, store: CASStore, key: str) -> Buffer:
        # bypass CASStore.get: build the trees, read them back with the CAS's own tree walker
        files = {path: oid for path, oid, _ in iter_tree(store.cas, store._session.build())}
        return self.buffer_cls.from_bytes(store.cas.read_blob(files[key]))

    def test_store_repr(self, store: CASStore) -> None:
        assert repr(store) == f"CASStore({store.cas.url!r}, root=None)"

    def test_store_supports_writes(self, store: CASStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: CASStore) -> None:
        assert store.supports_listing


# -- zarr's stateful tests ---------------------------------------------------------------------
# Each machine also commits now and then and carries on from a fresh store opened at the new
# root, so every invariant is checked against trees read back from the CAS too.
def _stateful(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=15,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


class _CommittingStoreMachine(ZarrStoreStateMachine):
    @rule()
    def commit_and_reopen(self) -> None:
        old = self.store.store
        assert isinstance(old, CASStore)
        self.store.store = CASStore(old.cas, old.commit())


class _CommittingHierarchyMachine(ZarrHierarchyStateMachine):
    @rule()
    def commit_and_reopen(self) -> None:
        assert isinstance(self.store, CASStore)
        self.store = CASStore(self.store.cas, self.store.commit())


@pytest.mark.parametrize(
    "machine",
    [ZarrStoreStateMachine, _CommittingStoreMachine],
    ids=["zarr", "committing"],
)
def test_zarr_store_state_machine(machine: Callable[[CASStore], Any]) -> None:
    run_state_machine_as_test(
        lambda: machine(CASStore(mc.open("memory://"))), settings=_stateful(30)
    )


@pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")
@pytest.mark.parametrize(
    "machine",
    [ZarrHierarchyStateMachine, _CommittingHierarchyMachine],
    ids=["zarr", "committing"],
)
def test_zarr_hierarchy_state_machine(machine: Callable[[CASStore], Any]) -> None:
    run_state_machine_as_test(
        lambda: machine(CASStore(mc.open("memory://"))), settings=_stateful(12)
    )


# -- our own -------------------------------------------------------------------------------------
DATA = np.arange(100, dtype="i4").reshape(10, 10)


def _write(store: CASStore, name: str, data: np.ndarray = DATA, **kw: Any) -> zarr.Array:
    arr = zarr.create_array(
        store, name=name, shape=data.shape, dtype=data.dtype, chunks=(5, 5), **kw
    )
    arr[:] = data
    return arr


def test_identical_chunks_are_stored_once() -> None:
    cas = mc.open("memory://")
    store = CASStore(cas)
    _write(store, "a")
    before = set(cas.iter_ids())
    _write(store, "b", attributes={"name": "b"})
    # only b's zarr.json (its attributes differ) is new: its four chunks are a's
    assert len(set(cas.iter_ids()) - before) == 1
    root = cas.get(store.commit(), Tree)
    a, b = cas.get(root["a"], Tree), cas.get(root["b"], Tree)
    assert a["zarr.json"] != b["zarr.json"]
    assert a["c"] == b["c"]  # and so the chunk folders are one tree


def test_commit_gives_a_tree_that_reopens_to_the_same_arrays(cas: mc.Store) -> None:
    store = CASStore(cas)
    zarr.create_group(store, attributes={"title": "demo"})
    _write(store, "g/a")
    assert store.root is None and store.has_changes
    root = store.commit()
    assert cas.kind(root) == "tree"
    assert store.root == root and not store.has_changes
    assert store.commit() == root  # nothing changed, same id
    for spec in (root, str(root), str(root)[:12]):
        reopened = CASStore(cas, spec, read_only=True)
        np.testing.assert_array_equal(zarr.open_array(reopened, path="g/a")[:], DATA)
        assert zarr.open_group(reopened, mode="r").attrs["title"] == "demo"
    # the same keys and values give the same id, however they got there
    again = CASStore(cas)
    zarr.create_group(again, attributes={"title": "demo"})
    _write(again, "g/a")
    assert again.commit() == root


def test_reads_after_reopening_an_lmdb_store(tmp_path: Path) -> None:
    url = f"lmdb://{tmp_path}/store"
    with mc.open(url) as cas:
        store = CASStore(cas)
        _write(store, "a")
        root = store.commit(ref="arrays/demo")
    with mc.open(url) as cas:
        store = CASStore(cas, "arrays/demo", read_only=True)
        assert store.root == root
        np.testing.assert_array_equal(zarr.open_array(store, path="a")[:], DATA)


def test_changes_on_top_of_a_root() -> None:
    cas = mc.open("memory://")
    first = CASStore(cas)
    _write(first, "a")
    _write(first, "b")
    root = first.commit()
    store = CASStore(cas, root)
    arr = zarr.open_array(store, path="a")
    arr[0, 0] = -1
    sync(store.delete_dir("b"))
    assert _listed(store.list_dir("")) == ["a", "zarr.json"]
    new = store.commit()
    tree = cas.get(new, Tree)
    assert sorted(tree) == ["a", "zarr.json"]
    old_a, new_a = cas.get(cas.get(root, Tree)["a"], Tree), cas.get(tree["a"], Tree)
    assert old_a["zarr.json"] == new_a["zarr.json"]  # untouched entries keep their ids
    expected = DATA.copy()
    expected[0, 0] = -1
    np.testing.assert_array_equal(zarr.open_array(CASStore(cas, new), path="a")[:], expected)


def test_a_key_can_be_a_value_and_a_folder() -> None:
    cas = mc.open("memory://")
    store = CASStore(cas)
    store.set_sync("x/y", _buf(b"inside"))  # the folder first, then its value
    store.set_sync("x", _buf(b"file"))
    store.set_sync("a", _buf(b"file"))  # the value first, then the folder
    store.set_sync("a/b", _buf(b"inside"))
    store.set_sync("c/d", _buf(b"deep"))
    root = store.commit()
    assert VALUE_ENTRY in cas.get(cas.get(root, Tree)["a"], Tree)
    reopened = CASStore(cas, root)
    assert [_bytes(reopened, k) for k in ("a", "a/b", "x", "x/y")] == [b"file", b"inside"] * 2
    assert _bytes(reopened, "c") is None and not sync(reopened.exists("c"))
    assert _listed(reopened.list()) == ["a", "a/b", "c/d", "x", "x/y"]
    assert _listed(reopened.list_dir("a")) == ["b"]
    sync(reopened.delete_dir("a"))  # "a" itself is not under "a/"
    reopened.delete_sync("x")  # nor is "x/y" gone with "x"
    assert _listed(reopened.list()) == ["a", "c/d", "x/y"]
    # a folder left with only its value becomes that value: same tree as never a folder
    plain = CASStore(cas)
    for key, value in (("a", b"file"), ("c/d", b"deep"), ("x/y", b"inside")):
        plain.set_sync(key, _buf(value))
    assert reopened.commit() == plain.commit()


def test_commit_to_a_ref_and_a_racing_commit() -> None:
    cas = mc.open("memory://")
    start = CASStore(cas).commit(ref="arrays/x")  # a new ref: created
    a, b = CASStore(cas, "arrays/x"), CASStore(cas, "arrays/x")
    _write(a, "a")
    won = a.commit(ref="arrays/x")
    assert cas.refs["arrays/x"] == won != start
    _write(b, "b")
    with pytest.raises(mc.ConflictError) as e:
        b.commit(ref="arrays/x")
    assert (e.value.expected, e.value.current) == (str(start), str(won))
    assert cas.refs["arrays/x"] == won
    assert b.has_changes and b.root == start  # nothing lost: commit elsewhere instead
    mine = b.commit(ref="arrays/y")
    assert cas.refs["arrays/y"] == mine
    with pytest.raises(mc.NotFound):
        CASStore(cas, "arrays/absent")
    with pytest.raises(mc.InvalidObject, match="not a tree"):
        CASStore(cas, cas.put_blob(b"not a tree"))
    # a ref this store never built on must not exist yet
    c = CASStore(cas)
    c.set_sync("k", _buf(b"v"))
    with pytest.raises(mc.ConflictError):
        c.commit(ref="arrays/x")
    assert [e.new_id for e in cas.refs.history("arrays/x")] == [start, won]


@pytest.mark.parametrize(
    "key",
    ["../x", "a//b", "a/\x00b", "", "/a", "a/", "a/./b", "a\\b", f"a/{VALUE_ENTRY}", "x" * 300],
)
def test_invalid_keys_are_refused_naming_the_key(key: str) -> None:
    store = CASStore(mc.open("memory://"))
    shown = re.escape(repr(key)[:40])
    with pytest.raises(ValueError, match=shown):
        store.set_sync(key, _buf(b"x"))
    with pytest.raises(ValueError, match=shown):
        sync(store.set(key, _buf(b"x")))
    with pytest.raises(ValueError, match=shown):
        sync(store.get(key, default_buffer_prototype()))
    with pytest.raises(ValueError, match=shown):
        store.delete_sync(key)
    assert not store.has_changes


def test_read_only_store_refuses_writes_and_sees_the_writers_changes() -> None:
    cas = mc.open("memory://")
    writer = CASStore(cas)
    writer.set_sync("k", _buf(b"v"))
    reader = writer.with_read_only(True)
    assert _bytes(reader, "k") == b"v"  # one location: uncommitted writes are shared
    for write in (
        lambda: reader.set_sync("k", _buf(b"w")),
        lambda: reader.delete_sync("k"),
        lambda: sync(reader.set("k", _buf(b"w"))),
        lambda: sync(reader.delete_dir("")),
        lambda: sync(reader.clear()),
        reader.commit,
    ):
        with pytest.raises(ValueError, match="read-only"):
            write()
    root = writer.commit()
    opened = CASStore(cas, root, read_only=True)
    with pytest.raises(ValueError, match="read-only"):
        zarr.create_array(opened, name="x", shape=(1,), dtype="i1")
    assert _bytes(opened, "k") == b"v"


def test_a_corrupted_blob_is_detected_on_read() -> None:
    cas = mc.open("memory://")
    store = CASStore(cas)
    _write(store, "a", compressors=None)
    root = store.commit()
    reopened = CASStore(cas, root)
    node = reopened._session.locate("a/c/0/0")[0]
    assert node is not None
    oid = node.id
    objects = cas.backend._objects  # type: ignore[attr-defined]
    stamp, data = objects[oid]
    objects[oid] = (stamp, data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(mc.IntegrityError) as e:
        reopened.get_sync("a/c/0/0")
    assert e.value.expected == oid.hex()
    with pytest.raises(mc.IntegrityError):
        zarr.open_array(reopened, path="a")[:]


@pytest.mark.parametrize(
    "read",
    [
        lambda store: store.get_sync("f"),
        lambda store: sync(store.getsize("f")),
        lambda store: sync(store.exists("f")),
        lambda store: _listed(store.list()),
        lambda store: _listed(store.list_dir("")),
    ],
    ids=["get", "getsize", "exists", "list", "list_dir"],
)
def test_a_manifest_that_does_not_add_up_is_refused_by_every_read(
    read: Callable[[CASStore], Any],
) -> None:
    cas = mc.open("memory://")
    chunk = cas.put_blob(b"x" * 10)
    body = {"size": 100, "chunk_size": 10, "chunks": [chunk, chunk]}
    bad = cas.put_object("chunked-blob", 1, body)
    store = CASStore(cas, cas.put_tree({"f": bad, "ok": cas.put_blob(b"fine")}))
    with pytest.raises(mc.InvalidObject, match=f"{bad}.*size 100 does not fit 2 chunks of 10"):
        read(store)
    assert _bytes(store, "ok") == b"fine"


def test_byte_ranges_read_only_the_chunks_they_cover() -> None:
    cas = mc.open("memory://")
    store = CASStore(cas)
    data = bytes(range(256)) * (CHUNK_SIZE * 5 // 2 // 256)  # 2.5 CAS chunks
    store.set_sync("big", _buf(data))
    store = CASStore(cas, store.commit())
    fetched: list[bytes] = []
    get = cas.backend.get

    def spy(key: bytes) -> bytes:
        fetched.append(key)
        return get(key)

    cas.backend.get = spy  # type: ignore[method-assign]
    n = len(data)
    cases = [
        (
            RangeByteRequest(CHUNK_SIZE - 10, CHUNK_SIZE + 10),
            data[CHUNK_SIZE - 10 : CHUNK_SIZE + 10],
        ),
        (OffsetByteRequest(n - 5), data[-5:]),
        (SuffixByteRequest(7), data[-7:]),
        (RangeByteRequest(n + 1, n + 9), b""),
    ]
    for request, expected in cases:
        assert _bytes(store, "big", byte_range=request) == expected
    assert sync(store.getsize("big")) == n
    # besides the manifest, only the chunks each range covers: 2, 1, 1 and none
    manifest = store._session.locate("big")[0]
    assert manifest is not None and manifest.kind == "chunked-blob"
    assert len([k for k in fetched if k != manifest.id]) == 4
    with pytest.raises(TypeError, match="Unexpected byte_range"):
        store.get_sync("big", byte_range=(0, 1))  # type: ignore[arg-type]


def test_pickle_keeps_the_state_and_refuses_a_lost_memory_store() -> None:
    store = CASStore(mc.open("memory://"))
    store.set_sync("k", _buf(b"v"))
    copy = pickle.loads(pickle.dumps(store))
    assert copy == store and copy.cas is store.cas
    assert _bytes(copy, "k") == b"v"
    state = store.__getstate__()
    state["token"] = "from-another-process"
    with pytest.raises(ValueError, match="another process"):
        CASStore.__new__(CASStore).__setstate__(state)


def test_put_zarr_directory_imports_a_local_store(tmp_path: Path) -> None:
    local = zarr.storage.LocalStore(tmp_path / "data.zarr")
    zarr.create_group(local, attributes={"title": "demo"})
    _write(local, "g/a")  # type: ignore[arg-type]
    (tmp_path / "data.zarr" / "empty").mkdir()
    cas = mc.open("memory://")
    root = put_zarr_directory(cas, tmp_path / "data.zarr")
    store = CASStore(cas, root, read_only=True)
    np.testing.assert_array_equal(zarr.open_array(store, path="g/a")[:], DATA)
    direct = CASStore(cas)
    zarr.create_group(direct, attributes={"title": "demo"})
    _write(direct, "g/a")
    assert direct.commit() == root  # same keys, same bytes: same tree
    (tmp_path / "data.zarr" / "link").symlink_to(tmp_path / "data.zarr" / "zarr.json")
    before = set(cas.iter_ids())
    with pytest.raises(mc.InvalidObject, match="symlink"):
        put_zarr_directory(cas, tmp_path / "data.zarr")
    assert set(cas.iter_ids()) == before
