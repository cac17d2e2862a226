"""The read-only fsspec filesystem over trees: fsspec's own get suite, paths and refs, ranged
reads across chunks, pyarrow and pandas reading Parquet straight from the store."""

from __future__ import annotations

import errno
import os
import pickle
import posixpath
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

import medomni_cas as mc
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import CHUNK_SIZE, ChunkedBlob
from medomni_cas.store.trees import iter_tree, put_directory
from medomni_cas.views.fs import MedomniFileSystem

REF = "studio/pairs/x/encoders"
BIG = int(2.5 * CHUNK_SIZE)


def _table() -> pa.Table:
    rng = random.Random(7)
    n = 500
    return pa.table(
        {
            "patient": [f"p{i:04d}" for i in range(n)],
            "age": [rng.randint(18, 90) for _ in range(n)],
            "score": [rng.random() for _ in range(n)],
            "label": [rng.choice(["yes", "no", None]) for _ in range(n)],
        }
    )


@pytest.fixture
def cas() -> Iterator[mc.Store]:
    s = mc.open("memory://")
    yield s
    s.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Nested folders, an empty one, small files, a chunked file and Parquet tables."""
    root = tmp_path / "src"
    (root / "dir" / "deep").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "empty").mkdir()
    (root / "dir" / "note.txt").write_bytes(b"hello\n")
    (root / "dir" / "deep" / "same.txt").write_bytes(b"hello\n")
    (root / "zero").write_bytes(b"")
    (root / "big.raw").write_bytes(random.Random(1).randbytes(BIG))
    table = _table()
    pq.write_table(table, root / "dir" / "table.parquet")
    pq.write_table(table.slice(0, 200), root / "data" / "part-0.parquet")
    pq.write_table(table.slice(200), root / "data" / "part-1.parquet")
    return root


@pytest.fixture
def tree(cas: mc.Store, folder: Path) -> ObjectId:
    oid = put_directory(cas, folder)
    cas.refs.set(REF, oid)
    return oid


@pytest.fixture
def fs(cas: mc.Store, tree: ObjectId) -> MedomniFileSystem:
    """A filesystem over a store holding ``folder`` under ref `REF`."""
    return MedomniFileSystem(store=cas)


# -- fsspec's reusable suites ---------------------------------------------------------------------
Build = Callable[[Any, Callable[..., str], str], str]


class _Prebuilt:
    """Our filesystem, for an upstream test that makes its files through ``mkdir``/``touch``:
    the files are built into the store beforehand, and those calls check they are there."""

    def __init__(self, fs: MedomniFileSystem) -> None:
        self._fs = fs

    def mkdir(self, path: str, *args: Any, **kwargs: Any) -> None:
        assert self._fs.isdir(path)

    def touch(self, path: str, *args: Any, **kwargs: Any) -> None:
        assert self._fs.isfile(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


class TestMedomniGet(AbstractFixtures, AbstractGetTests):
    """Every test of fsspec's get suite, copying out of trees rooted at an id and at a ref
    with slashes. The scenarios are made by fsspec's own builders in a local folder, stored
    with `put_directory`, and named in the store instead of written through the filesystem."""

    @pytest.fixture(params=["id", "ref"])
    def root_style(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    @pytest.fixture
    def fs(self, cas: mc.Store) -> MedomniFileSystem:
        return MedomniFileSystem(store=cas)

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return posixpath.join

    @pytest.fixture
    def store_scenario(
        self,
        cas: mc.Store,
        root_style: str,
        local_fs: LocalFileSystem,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Callable[[Build], str]:
        def build(make: Build) -> str:
            folder = str(tmp_path_factory.mktemp("scenario"))
            source = make(local_fs, os.path.join, folder)
            root = put_directory(cas, folder)
            if root_style == "id":
                spec = root.hex()
            else:
                spec = "suite/scenarios/current"
                cas.refs.set(spec, root)
            inner = os.path.relpath(source, folder)
            return spec if inner == "." else posixpath.join(spec, inner)

        return build

    @pytest.fixture
    def fs_path(self, store_scenario: Callable[[Build], str]) -> str:
        return store_scenario(lambda fs, join, path: path)

    @pytest.fixture
    def fs_bulk_operations_scenario_0(self, store_scenario: Callable[[Build], str]) -> str:
        return store_scenario(self._bulk_operations_scenario_0)

    @pytest.fixture
    def fs_glob_edge_cases_files(self, store_scenario: Callable[[Build], str]) -> str:
        return store_scenario(self._glob_edge_cases_files)

    @pytest.fixture
    def fs_dir_and_file_with_same_name_prefix(self, store_scenario: Callable[[Build], str]) -> str:
        return store_scenario(self._dir_and_file_with_same_name_prefix)

    @pytest.fixture
    def fs_10_files_with_hashed_names(self, store_scenario: Callable[[Build], str]) -> str:
        return store_scenario(self._10_files_with_hashed_names)

    def test_get_directory_recursive(
        self,
        fs: MedomniFileSystem,
        fs_join: Callable[..., str],
        store_scenario: Callable[[Build], str],
        local_fs: LocalFileSystem,
        local_join: Callable[..., str],
        local_target: str,
    ) -> None:
        # upstream makes src/file with fs.mkdir and fs.touch; build it in the store instead
        def make(some_fs: Any, join: Callable[..., str], path: str) -> str:
            some_fs.touch(join(path, "src", "file"))
            return path

        root = store_scenario(make)
        super().test_get_directory_recursive(
            _Prebuilt(fs), fs_join, root, local_fs, local_join, local_target
        )


_WRITES = "writes into the filesystem, which is read-only (see test_writes_are_refused)"


@pytest.mark.skip(reason=f"copy within the filesystem {_WRITES}")
class TestMedomniCopy(AbstractCopyTests):
    pass


@pytest.mark.skip(reason=f"put {_WRITES}")
class TestMedomniPut(AbstractPutTests):
    pass


@pytest.mark.skip(reason=f"pipe {_WRITES}")
class TestMedomniPipe(AbstractPipeTests):
    pass


@pytest.mark.skip(reason=f"open in 'wb'/'xb' mode {_WRITES}")
class TestMedomniOpen(AbstractOpenTests):
    pass


# -- registration and URLs -------------------------------------------------------------------------
def test_registered_by_entry_point() -> None:
    assert fsspec.get_filesystem_class("medomni") is MedomniFileSystem


def test_strip_protocol() -> None:
    strip = MedomniFileSystem._strip_protocol
    assert strip("medomni://a/b/c/") == "a/b/c"
    assert strip("medomni:///a/b") == "a/b"
    assert strip(["medomni://x", "y/"]) == ["x", "y"]


def test_fsspec_open_by_ref_id_and_prefix(cas: mc.Store, tree: ObjectId, folder: Path) -> None:
    want = (folder / "dir" / "table.parquet").read_bytes()
    for root in (REF, tree.hex(), tree.hex()[:10]):
        with fsspec.open(f"medomni://{root}/dir/table.parquet", "rb", store=cas) as f:
            assert f.read() == want
    with fsspec.open(f"medomni://{REF}/dir/note.txt", "r", store=cas) as f:
        assert f.read() == "hello\n"


def test_instances_of_two_stores_stay_apart(tmp_path: Path) -> None:
    # both stores print as Store('memory://'): fsspec's instance cache must not merge them
    a, b = mc.open("memory://"), mc.open("memory://")
    a.refs.set("main", a.put_tree({"f": a.put_blob(b"a")}))
    b.refs.set("main", b.put_tree({"f": b.put_blob(b"b")}))
    assert fsspec.filesystem("medomni", store=a).cat("main/f") == b"a"
    assert fsspec.filesystem("medomni", store=b).cat("main/f") == b"b"


def test_store_by_url_and_workspace_default(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"lmdb://{tmp_path}/ws/store"
    with mc.open(url) as s:
        s.refs.set(REF, put_directory(s, folder))
    want = (folder / "dir" / "note.txt").read_bytes()
    with fsspec.open(f"medomni://{REF}/dir/note.txt", store=url) as f:
        assert f.read() == want
    (tmp_path / "ws" / "workspace.yaml").write_text("store: lmdb://./store\n")
    monkeypatch.chdir(tmp_path / "ws")
    fs = fsspec.filesystem("medomni")
    assert fs.cat(f"{REF}/dir/note.txt") == want
    assert fs.store is MedomniFileSystem(store=url).store  # one LMDB environment per process
    pickled = pickle.dumps(fs)
    monkeypatch.chdir(tmp_path)  # the default store was pinned when fs was made
    assert pickle.loads(pickled).cat(f"{REF}/dir/note.txt") == want
    with pytest.raises(FileNotFoundError, match="no store"):
        MedomniFileSystem(store=f"lmdb://{tmp_path}/nowhere")


# -- listing ------------------------------------------------------------------------------------
def test_ls_and_info(fs: MedomniFileSystem, cas: mc.Store, tree: ObjectId, folder: Path) -> None:
    top = fs.ls(REF)
    assert [(e["name"], e["type"]) for e in top] == [
        (f"{REF}/big.raw", "file"),
        (f"{REF}/data", "directory"),
        (f"{REF}/dir", "directory"),
        (f"{REF}/empty", "directory"),
        (f"{REF}/zero", "file"),
    ]
    assert fs.ls(f"medomni://{REF}/dir/", detail=False) == [
        f"{REF}/dir/deep",
        f"{REF}/dir/note.txt",
        f"{REF}/dir/table.parquet",
    ]
    assert fs.ls(f"{REF}/empty") == []
    big = fs.info(f"{REF}/big.raw")
    assert big["size"] == BIG and big["kind"] == "chunked-blob"
    assert big["id"] == cas.get(tree, mc.Tree)["big.raw"].hex()
    assert fs.info(f"{REF}/zero")["size"] == 0
    root = fs.info(REF)
    assert (root["name"], root["type"], root["id"]) == (REF, "directory", tree.hex())
    note = fs.info(f"{REF}/dir/note.txt")
    assert fs.ls(f"{REF}/dir/note.txt") == [note]
    assert fs.isdir(f"{REF}/dir/deep") and fs.isfile(f"{REF}/dir/note.txt")
    assert not fs.exists(f"{REF}/dir/nothing")
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert fs.du(REF) == sum(p.stat().st_size for p in files)


def test_find_matches_iter_tree(fs: MedomniFileSystem, cas: mc.Store, tree: ObjectId) -> None:
    assert fs.find(REF) == [f"{REF}/{p}" for p, _, _ in iter_tree(cas, tree)]
    assert fs.glob(f"{REF}/**/*.parquet") == [
        f"{REF}/data/part-0.parquet",
        f"{REF}/data/part-1.parquet",
        f"{REF}/dir/table.parquet",
    ]
    assert f"{REF}/empty" in fs.find(REF, withdirs=True)


def test_checksum_and_ukey_are_the_object_id(fs: MedomniFileSystem) -> None:
    a, b = f"{REF}/dir/note.txt", f"{REF}/dir/deep/same.txt"
    assert fs.ukey(a) == fs.ukey(b) == fs.info(a)["id"]
    assert fs.checksum(a) == fs.checksum(b) == int(fs.info(a)["id"], 16)
    assert fs.ukey(a) != fs.ukey(f"{REF}/zero")


def test_root_option(cas: mc.Store, tree: ObjectId) -> None:
    fs = MedomniFileSystem(store=cas, root=REF)
    assert fs.info("")["id"] == tree.hex()
    assert "dir" in fs.ls("", detail=False)
    assert fs.info("dir/note.txt")["name"] == "dir/note.txt"
    assert fs.cat("medomni://dir/note.txt") == b"hello\n"


def test_blob_root_is_a_file(fs: MedomniFileSystem, cas: mc.Store) -> None:
    blob = cas.put_blob(b"just bytes")
    info = fs.info(blob.hex())
    assert (info["type"], info["size"]) == ("file", 10)
    assert fs.ls(blob.hex()) == [info]
    assert fs.cat(blob.hex()[:12]) == b"just bytes"


# -- reading ------------------------------------------------------------------------------------
def test_open_seek_read_across_chunks(fs: MedomniFileSystem, folder: Path) -> None:
    data = (folder / "big.raw").read_bytes()
    with fs.open(f"{REF}/big.raw", "rb") as f:
        assert f.size == BIG and f.seekable() and f.readable()
        f.seek(CHUNK_SIZE - 10)
        assert f.read(20) == data[CHUNK_SIZE - 10 : CHUNK_SIZE + 10]
        assert f.tell() == CHUNK_SIZE + 10
        f.seek(-5, os.SEEK_END)
        assert f.read() == data[-5:]
        f.seek(2 * CHUNK_SIZE - 1)
        assert f.read(3) == data[2 * CHUNK_SIZE - 1 : 2 * CHUNK_SIZE + 2]
        f.seek(0)
        assert f.read() == data
        assert f.read(1) == b""


def test_cat_file_ranges(fs: MedomniFileSystem, folder: Path) -> None:
    data = (folder / "big.raw").read_bytes()
    path = f"{REF}/big.raw"
    cases: list[tuple[int | None, int | None]] = [
        (None, None),
        (CHUNK_SIZE - 3, CHUNK_SIZE + 3),
        (-7, None),
        (None, 5),
        (10, -10),
        (BIG + 5, None),
        (5, 5),
        (0, BIG + 100),
    ]
    for start, end in cases:
        assert fs.cat_file(path, start, end) == data[start:end], (start, end)
    assert fs.cat_ranges([path, path], [0, CHUNK_SIZE], [4, CHUNK_SIZE + 4]) == [
        data[:4],
        data[CHUNK_SIZE : CHUNK_SIZE + 4],
    ]
    with pytest.raises(IsADirectoryError):
        fs.cat_file(f"{REF}/dir")


def test_ranged_read_fetches_only_its_chunks(
    fs: MedomniFileSystem, cas: mc.Store, tree: ObjectId, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = cas.get(tree, mc.Tree)["big.raw"]
    chunks = cas.get(big, ChunkedBlob).chunks
    fs.info(f"{REF}/big.raw")  # the manifest is read (and cached) here
    fetched: list[bytes] = []
    get = cas.backend.get
    monkeypatch.setattr(cas.backend, "get", lambda key: fetched.append(key) or get(key))
    fs.cat_file(f"{REF}/big.raw", CHUNK_SIZE - 10, CHUNK_SIZE + 10)
    assert set(fetched) - {big} == {chunks[0], chunks[1]}
    fetched.clear()
    with fs.open(f"{REF}/big.raw") as f:
        f.seek(2 * CHUNK_SIZE + 1)
        f.read(100)
    assert set(fetched) - {big} == {chunks[2]}


def test_corrupt_chunk_raises_integrity_error_on_read(
    fs: MedomniFileSystem, cas: mc.Store, tree: ObjectId, folder: Path
) -> None:
    big = cas.get(tree, mc.Tree)["big.raw"]
    chunk = cas.get(big, ChunkedBlob).chunks[1]
    cas.backend.delete_many([chunk])
    cas.backend.put_many([(chunk, b"rotten bytes")])
    data = (folder / "big.raw").read_bytes()
    with fs.open(f"{REF}/big.raw", block_size=1024) as f:
        assert f.read(100) == data[:100]  # chunk 0 is sound
        f.seek(CHUNK_SIZE + 1)
        with pytest.raises(mc.IntegrityError, match=str(chunk)):
            f.read(10)
    with pytest.raises(mc.IntegrityError, match=str(chunk)):
        fs.cat(f"{REF}/big.raw")


def test_corrupt_small_blob_raises_integrity_error(
    fs: MedomniFileSystem, cas: mc.Store, tree: ObjectId
) -> None:
    note = fs.info(f"{REF}/dir/note.txt")["id"]
    oid = ObjectId.from_hex(note)
    cas.backend.delete_many([oid])
    cas.backend.put_many([(oid, b"\x93\xa4blob\x01\xc4\x06HELLO\n")])
    fresh = MedomniFileSystem(store=cas)
    with pytest.raises(mc.IntegrityError, match=note):
        fresh.cat(f"{REF}/dir/note.txt")


# -- pyarrow and pandas ---------------------------------------------------------------------------
def test_pyarrow_reads_parquet(cas: mc.Store, tree: ObjectId) -> None:
    want = _table()
    fs = MedomniFileSystem(store=cas, root=REF)
    assert pq.read_table("dir/table.parquet", filesystem=fs).equals(want)
    full = MedomniFileSystem(store=cas)
    assert pq.read_table(f"{tree.hex()}/dir/table.parquet", filesystem=full).equals(want)
    # a folder of parts: pyarrow discovers them through find
    assert pq.read_table(f"{REF}/data", filesystem=full).equals(want)
    assert pq.ParquetFile(full.open(f"{REF}/dir/table.parquet")).metadata.num_rows == 500


def test_pandas_reads_parquet_by_url(cas: mc.Store, tree: ObjectId, folder: Path) -> None:
    want = pd.read_parquet(folder / "dir" / "table.parquet")
    got = pd.read_parquet(f"medomni://{REF}/dir/table.parquet", storage_options={"store": cas})
    pd.testing.assert_frame_equal(got, want)
    assert got.equals(_table().to_pandas())


# -- refs ----------------------------------------------------------------------------------------
def test_longest_ref_name_wins(fs: MedomniFileSystem, cas: mc.Store) -> None:
    inner = cas.put_tree({"x": cas.put_blob(b"entry b of ref a")})
    cas.refs.set("a", cas.put_tree({"b": inner, "c": cas.put_blob(b"entry c of ref a")}))
    cas.refs.set("a/b", cas.put_tree({"x": cas.put_blob(b"ref a/b")}))
    assert fs.cat("a/b/x") == b"ref a/b"
    assert fs.cat("a/c") == b"entry c of ref a"
    assert fs.ls("a", detail=False) == ["a/b", "a/c"]
    assert fs.info("a/b")["id"] == cas.refs["a/b"].hex()


def test_ref_is_read_once_until_invalidate_cache(fs: MedomniFileSystem, cas: mc.Store) -> None:
    cas.refs.set("runs/latest", cas.put_tree({"f": cas.put_blob(b"old")}))
    assert fs.cat("runs/latest/f") == b"old"
    cas.refs.set("runs/latest", cas.put_tree({"f": cas.put_blob(b"new")}))
    assert fs.cat("runs/latest/f") == b"old"  # one consistent view per instance
    fs.invalidate_cache()
    assert fs.cat("runs/latest/f") == b"new"
    assert fsspec.filesystem("medomni", store=cas).cat("runs/latest/f") == b"new"


# -- errors --------------------------------------------------------------------------------------
def test_unknown_root_and_missing_paths(
    fs: MedomniFileSystem, cas: mc.Store, tree: ObjectId
) -> None:
    for root in ("nosuchref", "no/such/ref", "deadbeefdeadbeef", "abc", "0" * 64):
        with pytest.raises(FileNotFoundError, match=root.split("/")[0]) as e:
            fs.info(f"{root}/file")
        assert e.value.errno == errno.ENOENT
    with pytest.raises(FileNotFoundError) as e:
        fs.open(f"medomni://{REF}/dir/missing.txt")
    assert e.value.filename == f"{REF}/dir/missing.txt"
    with pytest.raises(NotADirectoryError, match=r"note\.txt"):
        fs.info(f"{REF}/dir/note.txt/inside")
    with pytest.raises(FileNotFoundError, match="starts with"):
        fs.ls("")
    with pytest.raises(FileNotFoundError, match="refs under studio/ do not start"):
        fs.ls("studio/pairs")  # a prefix of ref names is not a folder
    record = cas.put_object("run-note", 1, {"text": "not a folder"})
    with pytest.raises(NotADirectoryError, match="run-note"):
        fs.ls(record.hex())
    assert not fs.exists("nosuchref")


@pytest.mark.parametrize(
    "path", [f"{REF}/dir/../big.raw", f"{REF}/../x", "../etc/passwd", f"{REF}/./zero"]
)
def test_dot_segments_are_refused(fs: MedomniFileSystem, tree: ObjectId, path: str) -> None:
    with pytest.raises(mc.InvalidName, match=r"'\.\.'"):
        fs.info(path)
    with pytest.raises(mc.InvalidName):
        fs.cat(f"medomni://{path}")


@pytest.mark.parametrize(
    "read",
    [
        lambda fs, bad: fs.ls("crafted"),
        lambda fs, bad: fs.ls("crafted", detail=False),
        lambda fs, bad: fs.info("crafted/f"),
        lambda fs, bad: fs.open("crafted/f").read(),
        lambda fs, bad: fs.cat("crafted/f"),
        lambda fs, bad: fs.info(bad.hex()),  # the manifest as the root
    ],
    ids=["ls", "ls-names", "info", "open", "cat", "info-root"],
)
def test_manifest_that_does_not_add_up_is_refused_by_every_read(
    cas: mc.Store, read: Callable[..., Any]
) -> None:
    # a crafted manifest: two chunks of 10 bytes cannot hold 100. ls and info once reported
    # its size while open refused it; every read must refuse it, naming the object
    chunk = cas.put_blob(b"x" * 10)
    body = {"size": 100, "chunk_size": 10, "chunks": [chunk, chunk]}
    bad = cas.put_object("chunked-blob", 1, body)
    cas.refs.set("crafted", cas.put_tree({"f": bad, "ok": cas.put_blob(b"fine")}))
    fs = MedomniFileSystem(store=cas)
    with pytest.raises(mc.InvalidObject, match=f"{bad}.*size 100 does not fit 2 chunks of 10"):
        read(fs, bad)
    assert fs.cat("crafted/ok") == b"fine"


@pytest.mark.parametrize(
    "write",
    [
        lambda fs, p: fs.open(p, "wb"),
        lambda fs, p: fs.open(p, "ab"),
        lambda fs, p: fs.open(p, "w"),
        lambda fs, p: fs.pipe(p, b"x"),
        lambda fs, p: fs.write_text(p, "x"),
        lambda fs, p: fs.touch(p),
        lambda fs, p: fs.mkdir(p),
        lambda fs, p: fs.makedirs(p, exist_ok=True),
        lambda fs, p: fs.rmdir(f"{REF}/empty"),
        lambda fs, p: fs.rm(f"{REF}/zero"),
        lambda fs, p: fs.rm_file(f"{REF}/zero"),
        lambda fs, p: fs.mv(f"{REF}/zero", p),
        lambda fs, p: fs.cp_file(f"{REF}/zero", p),
        lambda fs, p: fs.copy(f"{REF}/dir", p, recursive=True),
        lambda fs, p: fs.put(__file__, p),
    ],
)
def test_writes_are_refused(
    fs: MedomniFileSystem, cas: mc.Store, tree: ObjectId, write: Callable[..., Any]
) -> None:
    before = set(cas.iter_ids()), cas.refs.as_dict()
    with pytest.raises(PermissionError) as e:
        write(fs, f"{REF}/new")
    assert e.value.errno == errno.EROFS and "read-only" in str(e.value)
    assert (set(cas.iter_ids()), cas.refs.as_dict()) == before


# -- every backend -------------------------------------------------------------------------------
def test_reads_on_every_backend(store: mc.Store, folder: Path) -> None:
    store.refs.set(REF, put_directory(store, folder))
    fs = MedomniFileSystem(store=store)
    assert fs.cat(f"{REF}/dir/note.txt") == b"hello\n"
    data = (folder / "big.raw").read_bytes()
    assert (
        fs.cat_file(f"{REF}/big.raw", CHUNK_SIZE - 4, CHUNK_SIZE + 4)
        == data[CHUNK_SIZE - 4 : CHUNK_SIZE + 4]
    )
    assert pq.read_table(f"{REF}/dir/table.parquet", filesystem=fs).equals(_table())
