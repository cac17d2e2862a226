"""push / pull / clone between stores, packs on remote stores, the object cache, and the CLI.

S3 runs against moto's server on 127.0.0.1 (the ``s3_endpoint`` fixture of test_backends);
requests are counted at s3fs's one door to the server, ``_call_s3``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import medomni_cas as mc
from medomni_cas.cli import main
from medomni_cas.errors import ConflictError, IntegrityError, NotFound, UnsupportedOperation
from medomni_cas.store import encoding, sync
from medomni_cas.store.backends import fsspec as fsspec_backend
from medomni_cas.store.backends.cached import CachedBackend
from medomni_cas.store.backends.fsspec import CorruptPack, FsspecBackend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.sync import RefRejected, SyncProgress
from medomni_cas.store.verify import fsck
from medomni_cas.workspace import Workspace
from tests.test_backends import BUCKET, s3_endpoint  # noqa: F401 - a fixture

Counter = collections.Counter[str]


# -- helpers ---------------------------------------------------------------------------------
def s3(endpoint: str) -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={endpoint}"


def fsmem() -> str:
    return f"fsspec+memory://m-{uuid.uuid4().hex}/x"


@contextlib.contextmanager
def counting(store: mc.Store) -> Iterator[Counter]:
    """Count the S3 requests of ``store`` (by API call) while the block runs."""
    backend = store.backend
    if isinstance(backend, CachedBackend):
        backend = backend.remote
    assert isinstance(backend, FsspecBackend)
    fs = backend.fs
    counts: Counter = collections.Counter()
    original = fs._call_s3

    async def counted(method: str, *args: Any, **kwargs: Any) -> Any:
        counts[method] += 1
        return await original(method, *args, **kwargs)

    fs._call_s3 = counted
    try:
        yield counts
    finally:
        del fs._call_s3


def build(store: mc.Store, n: int, salt: str = "", fanout: int = 100) -> ObjectId:
    """A DAG: ``n`` small blobs under trees of ``fanout`` entries, a 2.5 MiB chunked blob
    (large, loose on a remote), all under one root tree."""
    datas = [blob_object(b"%s blob %d" % (salt.encode(), i))[1] for i in range(n)]
    ids = store.put_raw_many((None, d) for d in datas)
    groups = {
        f"g{i:05d}": store.put_tree({f"b{j}": ids[j] for j in range(i, min(i + fanout, n))})
        for i in range(0, n, fanout)
    }
    big = store.put_blob(salt.encode() * 7 + bytes(range(256)) * 10_240)
    return store.put_tree({"groups": store.put_tree(groups), "big": big})


def closure_ok(store: mc.Store) -> None:
    """Every stored object's links are stored too (sync's invariant), and fsck is clean."""
    report = fsck(store)
    assert report.ok, report.problems
    keys = list(store.backend.iter_keys())
    links = {link for _, data in store.get_raw_many(keys) for link in encoding.links(data)}
    assert store.missing(links) == []


# -- round trips -----------------------------------------------------------------------------
@pytest.mark.parametrize("remote_kind", ["memory", "lmdb", "fsspec-memory", "s3"])
def test_push_pull_round_trip(
    remote_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = {
        "memory": "memory://",
        "lmdb": f"lmdb://{tmp_path}/remote",
        "fsspec-memory": fsmem(),
        "s3": "",
    }[remote_kind]
    if remote_kind == "s3":
        url = s3(request.getfixturevalue("s3_endpoint"))
    local = mc.open("memory://")
    root = build(local, 300)
    local.refs.set("main", root)
    local.refs.set("tasksets/a/set-1", local.put_blob(b"a set"))
    remote = mc.open(url, single_writer=remote_kind == "fsspec-memory")
    report = sync.push(local, remote)
    assert report.objects == len(local.closure(root)) + 1
    assert {r.name: r.status for r in report.refs} == {
        "main": "created",
        "tasksets/a/set-1": "created",
    }
    again = mc.open(f"lmdb://{tmp_path}/again")
    pulled = sync.pull(again, remote)
    assert pulled.objects == report.objects
    assert again.refs.as_dict() == local.refs.as_dict()
    assert again.closure(root) == local.closure(root)
    closure_ok(again)
    closure_ok(remote)
    assert "pull from" in again.refs.history("main")[-1].message


def test_push_sends_only_what_the_remote_lacks(tmp_path: Path) -> None:
    local = mc.open(f"lmdb://{tmp_path}/local")
    remote = mc.open(f"lmdb://{tmp_path}/remote")
    first = build(local, 200, "one")
    local.refs.set("main", first)
    sync.push(local, remote)
    second = local.put_tree({"old": first, "new": local.put_blob(b"new leaf")})
    local.refs.set("main", second)
    seen: list[SyncProgress] = []
    report = sync.push(local, remote, ["main"], progress=seen.append)
    assert report.objects == 2  # the new tree and its new leaf; the walk stops at `first`
    assert report.checked == 3  # second; then its two links
    assert seen and seen[-1] == SyncProgress(3, 2, report.bytes)
    assert [r.status for r in report.refs] == ["updated"]
    assert sync.push(local, remote).objects == 0


# -- S3: request counts --------------------------------------------------------------------------
def test_s3_request_counts(s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    n = 5000
    local = mc.open(f"lmdb://{tmp_path}/local")
    root = build(local, n, fanout=1000)
    local.refs.set("main", root)
    total = len(local.closure(root))
    remote = mc.open(s3(s3_endpoint))
    with counting(remote) as pushed:
        assert sync.push(local, remote).objects == total
    # the DAG is 4 levels deep: a presence check per level, packs, a few loose objects
    # (the 3 chunks and the 2 top trees), the ref's compare-and-swap
    assert sum(pushed.values()) <= n / 1000 + 20, pushed
    assert pushed["put_object"] <= 12, pushed

    with counting(remote) as noop:
        report = sync.push(local, remote)
    assert report.objects == 0 and [r.status for r in report.refs] == ["unchanged"]
    assert sum(noop.values()) <= 3, noop  # one GET of the ref

    fresh = mc.open(remote.url)  # a new process's view: no index loaded yet
    dest = mc.open(f"lmdb://{tmp_path}/dest")
    with counting(fresh) as pulled:
        assert sync.pull(dest, fresh).objects == total
    assert pulled["head_object"] == 0, pulled  # every GET is ranged: no HEAD before it
    assert sum(pulled.values()) <= n / 1000 + 20, pulled
    closure_ok(dest)


def test_s3_packs_small_objects(s3_endpoint: str) -> None:  # noqa: F811
    store = mc.open(s3(s3_endpoint))
    backend = store.backend
    assert isinstance(backend, FsspecBackend)
    with counting(store) as counts:
        ids = store.put_raw_many((None, blob_object(b"%d" % i)[1]) for i in range(1000))
    assert counts == {"list_objects_v2": 1, "put_object": 2}  # listing, pack, index
    names = sorted(p.rsplit("/", 1)[-1] for p in backend.fs.ls(backend.io.path("packs")))
    assert [n.rsplit(".", 1)[1] for n in names] == ["idx", "pack"]
    other = mc.open(store.url)
    with counting(other) as counts:
        assert len(list(other.get_raw_many(ids))) == 1000
    assert counts == {"list_objects_v2": 1, "get_object": 2}  # listing, index, one range


# -- many writers --------------------------------------------------------------------------------
def test_sixteen_writers_race_one_ref(s3_endpoint: str) -> None:  # noqa: F811
    url = s3(s3_endpoint)
    writers, each = 16, 2
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def append(store: mc.Store, entry: ObjectId) -> Callable[[ObjectId | None], ObjectId]:
        def fn(current: ObjectId | None) -> ObjectId:
            entries = [] if current is None else store.get(current).body["entries"]
            return store.put_object("test-run-index", 1, {"entries": [*entries, entry]})

        return fn

    def work(w: int) -> None:
        try:
            store = mc.open(url)
            start.wait()
            for i in range(each):
                entry = store.put_blob(b"run %d.%d" % (w, i))
                store.refs.update("runs/index", append(store, entry), f"append {w}.{i}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store = mc.open(url)
    entries = store.get(store.refs["runs/index"]).body["entries"]
    expected = {blob_object(b"run %d.%d" % (w, i))[0] for w in range(writers) for i in range(each)}
    assert len(entries) == writers * each and set(entries) == expected  # no update lost
    history = store.refs.history("runs/index")
    assert len(history) == writers * each
    assert all(a.new == b.old for a, b in itertools.pairwise(history))


# -- interrupted and corrupted transfers --------------------------------------------------------
def test_interrupted_push_resumes(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sync, "WRITE_ITEMS", 100)  # many batches
    local = mc.open(f"lmdb://{tmp_path}/local")
    root = build(local, 1000)
    local.refs.set("main", root)
    total = len(local.closure(root))
    remote = mc.open(s3(s3_endpoint))
    backend = remote.backend
    put_many = backend.put_many
    calls = 0

    def failing(items: Any) -> int:
        nonlocal calls
        calls += 1
        if calls > 4:
            raise ConnectionError("network gone")
        return put_many(items)

    monkeypatch.setattr(backend, "put_many", failing)
    with pytest.raises(ConnectionError):
        sync.push(local, remote)
    monkeypatch.setattr(backend, "put_many", put_many)
    assert remote.refs.get("main") is None
    fresh = mc.open(remote.url)
    stored = len(list(fresh.backend.iter_keys()))
    assert 0 < stored < total
    closure_ok(fresh)  # what got there came with its closure: the walk can stop there
    report = sync.push(local, fresh)
    assert report.objects == total - stored  # resumed, not restarted
    assert fresh.refs["main"] == root
    closure_ok(fresh)


def _flip_packed_byte(store: mc.Store, oid: ObjectId) -> None:
    backend = store.backend
    assert isinstance(backend, FsspecBackend)
    backend.refresh()
    name, offset, length, _ = backend.index.where[oid]
    path = backend.index.pack_path(name, "pack")
    data = bytearray(backend.fs.cat_file(path))
    data[offset + length - 1] ^= 0xFF
    backend.fs.pipe_file(path, bytes(data))


def test_corrupt_remote_object_is_detected_and_not_stored(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    local = mc.open("memory://")
    root = build(local, 300)
    local.refs.set("main", root)
    remote = mc.open(s3(s3_endpoint))
    sync.push(local, remote)
    tree = next(iter(local.get(local.get(root)["groups"]).values()))  # a tree of blobs
    # one of its blobs: they are packed (a sync writes the three trees of a level together,
    # too few to pack)
    victim = next(iter(local.get(tree).values()))
    _flip_packed_byte(remote, victim)

    dest = mc.open(f"lmdb://{tmp_path}/dest")
    with pytest.raises(IntegrityError, match=victim.hex()) as info:
        sync.pull(dest, mc.open(remote.url))
    assert remote.url in str(info.value)
    assert victim not in dest
    assert dest.refs.get("main") is None
    closure_ok(dest)

    cached = mc.open(remote.url, cache=f"lmdb://{tmp_path}/cache")
    with pytest.raises(IntegrityError, match=victim.hex()):
        cached.get_raw(victim)
    assert isinstance(cached.backend, CachedBackend)
    assert cached.backend.local.missing([victim]) == [victim]  # not cached


# -- packs ---------------------------------------------------------------------------------------
@pytest.fixture(params=["fsspec-memory", "s3"])
def packed(request: pytest.FixtureRequest) -> Iterator[FsspecBackend]:
    if request.param == "s3":
        yield FsspecBackend(s3(request.getfixturevalue("s3_endpoint")))
    else:
        yield FsspecBackend(fsmem())


def _blobs(n: int, salt: bytes = b"") -> list[tuple[ObjectId, bytes]]:
    return [blob_object(salt + b"%d" % i) for i in range(n)]


def test_truncated_pack_is_detected(packed: FsspecBackend) -> None:
    items = _blobs(50)
    packed.put_many(items)
    (name,) = packed.index.packs
    path = packed.index.pack_path(name, "pack")
    data = packed.fs.cat_file(path)
    packed.fs.pipe_file(path, data[: len(data) // 2])
    reader = FsspecBackend(packed.url)
    with pytest.raises(CorruptPack, match=f"{name}.pack.*truncated"):
        dict(reader.get_many(k for k, _ in items))
    with pytest.raises(IntegrityError):  # the store's own error for a damaged store
        reader.get(items[-1][0])


def test_truncated_index_is_detected_and_rebuilt_from_its_pack(packed: FsspecBackend) -> None:
    items = _blobs(50)
    packed.put_many(items)
    (name,) = packed.index.packs
    path = packed.index.pack_path(name, "idx")
    packed.fs.pipe_file(path, packed.fs.cat_file(path)[:-7])
    reader = FsspecBackend(packed.url)
    assert reader.missing([items_key(0)]) == []
    assert reader.get_list([k for k, _ in items]) == [d for _, d in items]
    ((file, message),) = reader.damage()
    assert file == path and "truncated" in message and "rebuilt from its pack" in message
    again = FsspecBackend(packed.url)
    assert again.missing([items_key(0)]) == [] and again.damage() == []  # written back


def items_key(i: int) -> bytes:
    return _blobs(i + 1)[i][0]


def test_loose_layout_of_older_stores_is_read(packed: FsspecBackend, tmp_path: Path) -> None:
    store = mc.open("memory://")
    root = build(store, 40)
    for oid, data in store.walk([root]):  # written as before packs: one file per object
        h = oid.hex()
        packed.fs.pipe_file(packed.io.path("objects", h[:2], h[2:]), data)
    old = mc.open(packed.url, single_writer=True)
    assert old.missing(store.closure(root)) == []
    assert sorted(old.iter_ids()) == sorted(store.closure(root))
    assert old.read_blob(store.get(root)["big"]) == store.read_blob(store.get(root)["big"])
    old.refs.set("main", root)
    dest = mc.open(f"lmdb://{tmp_path}/dest")
    assert sync.pull(dest, old).objects == len(store.closure(root))
    closure_ok(dest)


def test_pack_deletes_rewrite_survivors(packed: FsspecBackend) -> None:
    items = _blobs(20)
    packed.put_many(items)
    (old_name,) = packed.index.packs
    reader = FsspecBackend(packed.url)
    assert reader.missing(k for k, _ in items) == []  # loads the index, then gc moves things
    doomed = [k for k, _ in items[:5]]
    assert packed.delete_many(doomed) == 5
    (new_name,) = packed.index.packs
    assert new_name != old_name
    assert not packed.fs.exists(packed.index.pack_path(old_name, "pack"))
    assert reader.get(items[10][0]) == items[10][1]  # stale index: re-read from the new pack
    assert dict(reader.get_many(k for k, _ in items)) == {
        k: (None if k in doomed else d) for k, d in items
    }
    assert sorted(FsspecBackend(packed.url).iter_keys()) == sorted(k for k, _ in items[5:])


def test_pack_delete_keeps_objects_put_again(packed: FsspecBackend) -> None:
    items = _blobs(10)
    packed.put_many(items)
    (name,) = packed.index.packs
    # gc listed them long ago; then a writer put one again (freshened into a new pack)
    idx = packed.index.packs[name]
    packed.index.packs[name] = idx._replace(stamps=tuple(0 for _ in idx.stamps))
    packed.index.rebuild()
    packed.put_many(items[:4])
    assert packed.delete_many([k for k, _ in items], older_than=1000.0) == 6
    assert packed.missing(k for k, _ in items) == [k for k, _ in items[4:]]


def test_orphan_pack_is_removed(packed: FsspecBackend) -> None:
    packed.put_many(_blobs(10))
    (name,) = packed.index.packs
    packed.fs.rm_file(packed.index.pack_path(name, "idx"))  # a writer died before the index
    assert packed.remove_orphans(older_than=0.0) == 0  # too young
    assert packed.remove_orphans(older_than=4e9) == 1
    assert not packed.fs.exists(packed.index.pack_path(name, "pack"))


def test_gc_on_a_packed_remote(packed: FsspecBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    from medomni_cas.store import gc as gc_module

    monkeypatch.setattr(gc_module, "_STAMP_SLACK", 0.0)  # no waiting for coarse clocks
    store = mc.Store(packed, single_writer=True)
    root = build(store, 50)
    store.refs.set("main", root)
    garbage = store.put_raw_many((None, blob_object(b"g%d" % i)[1]) for i in range(30))
    mixed = store.put_raw_many(  # one pack of garbage and live objects together
        [(None, blob_object(b"m%d" % i)[1]) for i in range(10)]
        + [(None, d) for _, d in store.get_raw_many(list(store.get(root).values()))]
    )
    time.sleep(0.01)
    report = gc_module.gc(store, grace=0.0)
    assert report.swept == 40
    assert store.missing(garbage + mixed[:10]) == garbage + mixed[:10]
    closure_ok(mc.Store(FsspecBackend(packed.url)))


def test_repack_merges_small_packs(
    packed: FsspecBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    batches = [_blobs(10, b"batch %d " % i) for i in range(5)]
    for batch in batches:
        packed.put_many(batch)
    reader = FsspecBackend(packed.url)
    assert reader.missing(k for b in batches for k, _ in b) == []  # an index of 5 packs
    assert len(reader.index.packs) == 5
    code, out, err = cli(capsys, "cas", "repack", "--store", packed.url, "--json")
    assert code == 0, err
    assert json.loads(out)["merged"] == 5
    assert packed.repack() == 0  # this instance saw them go: nothing left to merge
    fresh = FsspecBackend(packed.url)
    assert fresh.missing(k for b in batches for k, _ in b) == []
    assert len(fresh.index.packs) == 1
    everything = [item for b in batches for item in b]
    assert dict(reader.get_many(k for k, _ in everything)) == dict(everything)  # stale reader


def test_large_and_few_objects_are_loose(packed: FsspecBackend) -> None:
    big = blob_object(b"x" * fsspec_backend.LOOSE_SIZE)
    few = _blobs(fsspec_backend.PACK_MIN - 1, b"few")
    assert packed.put_many([big, *few]) == 1 + len(few)
    assert packed.index.packs == {}
    assert packed.put_many([big, *few]) == 0
    assert FsspecBackend(packed.url).get(big[0]) == big[1]


# -- refs: fast-forwards, rejections, races ---------------------------------------------------
def test_ref_rules(tmp_path: Path) -> None:
    a = mc.open(f"lmdb://{tmp_path}/a")
    b = mc.open(f"lmdb://{tmp_path}/b")
    remote = mc.open(f"lmdb://{tmp_path}/remote")
    v1 = a.put_tree({"x": a.put_blob(b"1")})
    a.refs.set("r", v1)
    sync.push(a, remote)
    v2 = a.put_tree({"prev": v1, "x": a.put_blob(b"2")})  # made from v1: a fast-forward
    a.refs.set("r", v2)
    assert [c.status for c in sync.push(a, remote).refs] == ["updated"]

    sync.pull(b, remote)
    v3 = b.put_tree({"x": b.put_blob(b"3")})  # unrelated, but b saw v2 and moved on
    b.refs.set("r", v3)
    assert [c.status for c in sync.push(b, remote).refs] == ["updated"]

    v4 = a.put_tree({"prev": v2, "x": a.put_blob(b"4")})  # a never saw v3
    a.refs.set("r", v4)
    with pytest.raises(RefRejected, match="pull and combine first") as info:
        sync.push(a, remote)
    assert info.value.current == v3.hex() and info.value.incoming == v4.hex()
    assert [c.status for c in info.value.report.refs] == ["rejected"]
    assert remote.refs["r"] == v3
    assert v4 not in remote  # nothing was sent for a rejected ref
    with pytest.raises(RefRejected):
        sync.pull(a, remote)  # nor does pull overwrite a's own unseen work
    assert a.refs["r"] == v4
    assert [c.status for c in sync.push(a, remote, force=True).refs] == ["updated"]
    assert remote.refs["r"] == v4
    with pytest.raises(NotFound, match="nope"):
        sync.push(a, remote, ["nope"])


def test_lost_race_is_a_conflict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = mc.open("memory://")
    remote = mc.open(f"lmdb://{tmp_path}/remote")
    local.refs.set("r", local.put_blob(b"ours"))
    theirs = remote.put_blob(b"theirs")
    update = remote.backend.ref_update

    def racing(name: str, old: bytes | None, new: bytes | None, entry: bytes) -> bool:
        update(name, None, theirs, b"")  # another writer gets there first
        return update(name, old, new, entry)

    monkeypatch.setattr(remote.backend, "ref_update", racing)
    with pytest.raises(ConflictError, match=theirs.hex()) as info:
        sync.push(local, remote)
    assert not isinstance(info.value, RefRejected)
    assert info.value.current == theirs.hex()
    assert remote.refs["r"] == theirs


def test_remote_without_conditional_writes_needs_an_opt_in() -> None:
    local = mc.open("memory://")
    local.refs.set("r", local.put_blob(b"x"))
    url = fsmem()
    with pytest.raises(UnsupportedOperation, match="single_writer"):
        sync.push(local, mc.open(url))
    assert not list(mc.open(url).backend.iter_keys())  # refused before sending anything
    sync.push(local, mc.open(url, single_writer=True))


def test_clone(tmp_path: Path) -> None:
    src = mc.open(f"lmdb://{tmp_path}/src")
    root = build(src, 50)
    src.refs.set("main", root)
    src.close()
    report = sync.clone(f"lmdb://{tmp_path}/src", f"lmdb://{tmp_path}/copy")
    assert [r.status for r in report.refs] == ["created"]
    with mc.open(f"lmdb://{tmp_path}/copy") as copy:
        assert copy.refs["main"] == root
        closure_ok(copy)
    with pytest.raises(ValueError, match="already has refs"):
        sync.clone(f"lmdb://{tmp_path}/src", f"lmdb://{tmp_path}/copy")
    with pytest.raises(FileNotFoundError):
        sync.clone(f"lmdb://{tmp_path}/absent", f"lmdb://{tmp_path}/other")


# -- the object cache -------------------------------------------------------------------------
def test_cached_store_reads_through_and_publishes_on_ref_update(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = s3(s3_endpoint)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    store = mc.open(url, cache=True)
    assert isinstance(store.backend, CachedBackend)
    assert store.backend.local.url.startswith(f"lmdb://{tmp_path}/xdg/medomni/")
    with counting(store) as counts:
        root = build(store, 100)  # local writes only
    assert counts["put_object"] == 0
    store.refs.set("main", root)  # publishes the closure, then sets the remote's ref
    plain = mc.open(url)
    assert plain.refs["main"] == root
    closure_ok(plain)

    reader = mc.open(url, cache=f"lmdb://{tmp_path}/other-cache")
    assert reader.refs["main"] == root  # refs are the remote's
    first = sorted(reader.closure(root))
    with counting(reader) as counts:
        assert sorted(reader.closure(root)) == first
    assert sum(counts.values()) == 0  # all from the cache
    with pytest.raises(UnsupportedOperation, match="cache"):
        reader.backend.delete_many(first)


# -- workspace remotes and the CLI -------------------------------------------------------------
def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_push_pull_clone(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_endpoint: str,  # noqa: F811
) -> None:
    remote = s3(s3_endpoint)
    one, two, three = (tmp_path / n for n in ("one", "two", "three"))
    for d in (one, two, three):
        d.mkdir()
    (one / "workspace.yaml").write_text(f"store: lmdb://./st\nremotes:\n  origin: {remote}\n")
    monkeypatch.chdir(one)
    (one / "data").mkdir()
    (one / "data" / "f.txt").write_text("hello")
    code, out, err = cli(capsys, "cas", "put", "data", "--ref", "main", "--json")
    assert code == 0, err
    root = json.loads(out)["id"]
    code, out, err = cli(capsys, "cas", "push")
    assert code == 0, err
    assert out.splitlines() == [
        f"push to {remote}: 2 objects (0.0 MB), 2 ids checked",
        "refs: 1 created",
    ]
    code, out, _ = cli(capsys, "cas", "push", "origin", "main", "--json")
    report = json.loads(out)
    assert report["objects"] == 0 and report["refs"][0]["status"] == "unchanged"

    monkeypatch.chdir(two)
    code, out, err = cli(capsys, "cas", "clone", remote, "lmdb://./st", "--workspace", "--json")
    assert code == 0, err
    assert json.loads(out)["refs"] == [{"name": "main", "status": "created", "new": root}]
    assert Workspace.load(two).remotes == {"origin": remote}
    (two / "more").write_text("more")
    code, out, err = cli(capsys, "cas", "put", "more", "--json")
    more = json.loads(out)["id"]
    code, out, err = cli(capsys, "cas", "ref", "set", "main", more)
    assert code == 0, err
    assert cli(capsys, "cas", "push")[0] == 0  # two saw root and moved on

    monkeypatch.chdir(one)
    code, out, err = cli(capsys, "cas", "pull", "--json")
    assert code == 0, err
    assert json.loads(out)["refs"][0]["status"] == "updated"

    # three: unrelated work on main is refused, exit code 2 and a message naming the ref
    monkeypatch.chdir(three)
    (three / "x").write_text("x")
    assert cli(capsys, "cas", "--store", "lmdb://./st", "put", "x", "--ref", "main")[0] == 0
    code, out, err = cli(capsys, "cas", "--store", "lmdb://./st", "push", remote)
    assert code == 2
    assert err.startswith("medomni: error: ") and "'main'" in err and "Traceback" not in err
    assert "rejected  main" in out
    code, out, err = cli(capsys, "cas", "--store", "lmdb://./st", "push", "nowhere")
    assert code == 2 and "no remote named 'nowhere'" in err


def test_cli_progress_line_only_on_a_terminal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from medomni_cas.cli import cas

    monkeypatch.setattr(cas.sys.stderr, "isatty", lambda: True, raising=False)
    line = cas._ProgressLine("push", "sent")
    line(SyncProgress(10, 5, 2_000_000))
    line.close()
    err = capsys.readouterr().err
    assert err.startswith("\rpush: 5 objects (2.0 MB) sent, 10 checked") and err.endswith("\n")
    monkeypatch.setattr(cas.sys.stderr, "isatty", lambda: False, raising=False)
    quiet = cas._ProgressLine("push", "sent")
    quiet(SyncProgress(1, 1, 1))
    quiet.close()
    assert capsys.readouterr().err == ""


# -- porcelain push / pull ----------------------------------------------------------------------
def test_porcelain_push_and_pull_by_remote_name(tmp_path: Path) -> None:
    from medomni_cas import porcelain

    (tmp_path / "workspace.yaml").write_text("remotes:\n  origin: file://far\n")
    seen: list[SyncProgress] = []
    with mc.open(f"lmdb://{tmp_path}/one") as one:
        root = one.put_tree({"f": one.put_blob(b"hello")})
        one.refs.set("main", root)
        report = porcelain.push(one, refs=["main"], workspace=tmp_path, progress=seen.append)
    assert report.dst == f"file://{tmp_path.resolve()}/far"  # relative to the workspace
    assert (report.objects, [r.status for r in report.refs]) == (2, ["created"])
    assert seen and seen[-1].sent == 2

    with mc.open(f"lmdb://{tmp_path}/two") as two:
        report = porcelain.pull(two, "origin", workspace=Workspace.load(tmp_path))
        assert two.refs["main"] == root and report.objects == 2
        with mc.open(report.src) as far:  # an open Store is used as it is, and left open
            assert porcelain.pull(two, far).refs[0].status == "unchanged"
            assert far.refs["main"] == root
    with pytest.raises(ValueError, match="no remote named 'nope'"):
        porcelain.push(mc.open("memory://"), "nope", workspace=tmp_path)
    with pytest.raises(FileNotFoundError, match="no store"):
        porcelain.pull(mc.open("memory://"), f"file://{tmp_path}/nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_cli_push_summarises_refs_by_outcome(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workspace.yaml").write_text("store: lmdb://st\nremotes:\n  origin: file://far\n")
    with mc.open("lmdb://st") as store:
        blob = store.put_blob(b"x")
        for i in range(30):
            store.refs.set(f"runs/slots/{i:03}", blob)
    code, out, err = cli(capsys, "cas", "push")
    assert code == 0, err
    assert out.splitlines()[1:] == ["refs: 30 created"]
    with mc.open("lmdb://st") as store:
        store.refs.set("runs/slots/000", store.put_blob(b"y"))
    code, out, err = cli(capsys, "cas", "push")  # one moved, 29 unchanged: two lines
    assert out.splitlines()[1:] == ["refs: 1 updated, 29 unchanged"]
    code, out, err = cli(capsys, "cas", "pull", "-v")
    lines = out.splitlines()
    assert lines[0].startswith(f"pull from file://{tmp_path.resolve()}/far: 0 objects")
    assert lines[1] == "refs: 30 unchanged" and len(lines) == 32
    assert lines[2].startswith("  unchanged runs/slots/000  ")
    code, out, err = cli(capsys, "cas", "push", "--json")
    assert len(json.loads(out)["refs"]) == 30
