"""Every built-in backend against the conformance suite, plus multi-process and crash tests.

The S3 tests run against moto's S3 server on 127.0.0.1 with dummy credentials; nothing
leaves this machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import blake3
import fsspec
import pytest

import medomni_cas as mc
from medomni_cas.errors import UnsupportedOperation
from medomni_cas.store.backend import Backend
from medomni_cas.store.backends import directory
from medomni_cas.store.backends import lmdb as lmdb_backend
from medomni_cas.store.backends._layout import encode_ref_name
from medomni_cas.store.backends._lmdbenv import open_count
from medomni_cas.store.backends._packs import build_index, build_pack
from medomni_cas.store.backends.cached import CachedBackend
from medomni_cas.store.backends.directory import DirectoryBackend
from medomni_cas.store.backends.fsspec import FsspecBackend
from medomni_cas.store.backends.fsspec._remote import Remote
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.backends.memory import MemoryBackend
from medomni_cas.store.host import pid_alive
from medomni_cas.store.url import open_backend
from medomni_cas.testing import BackendTests, counter_key, increment

BUCKET = "medomni-test"
REPO = Path(__file__).resolve().parent.parent

# A worker process: waits for the go file, then does N compare-and-swap increments.
WORKER = """
import sys, time
from pathlib import Path
from medomni_cas.store.url import open_backend
from medomni_cas.testing import increment
url, ref, n, ready, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
backend = open_backend(url)
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.005)
print(increment(backend, ref, n))
"""


# -- the conformance suite on every backend --------------------------------------------------
def _stamp_ms(stamp: float | None) -> int:
    return int((time.time() if stamp is None else stamp) * 1000)


class TestMemoryBackend(BackendTests):
    def make_backend(self, tmp_path: Path) -> Backend:
        return MemoryBackend()

    def set(self, backend: Backend, key: bytes, data: bytes, *, stamp: float | None = None) -> None:
        assert isinstance(backend, MemoryBackend)
        backend._objects[key] = (time.time() if stamp is None else stamp, data)

    def get(self, backend: Backend, key: bytes) -> bytes | None:
        assert isinstance(backend, MemoryBackend)
        entry = backend._objects.get(key)
        return None if entry is None else entry[1]


class TestLMDBBackend(BackendTests):
    def make_backend(self, tmp_path: Path) -> Backend:
        return LMDBBackend(tmp_path / "lmdb", durable=False)

    def set(self, backend: Backend, key: bytes, data: bytes, *, stamp: float | None = None) -> None:
        assert isinstance(backend, LMDBBackend)
        value = lmdb_backend._HDR.pack(lmdb_backend._INLINE, _stamp_ms(stamp)) + data
        with backend.env.begin(write=True) as txn:
            txn.put(key, value, db=backend._objects)

    def get(self, backend: Backend, key: bytes) -> bytes | None:
        assert isinstance(backend, LMDBBackend)
        with backend.env.begin() as txn:
            value = txn.get(key, db=backend._objects)
        if value is None:
            return None
        if value[0] == lmdb_backend._INLINE:
            return bytes(value[lmdb_backend._HDR.size :])
        return backend._file(key).read_bytes()

    def orphans(self, backend: Backend) -> int:
        # a chunk file whose entry was never committed, and a half-written temp file
        assert isinstance(backend, LMDBBackend)
        orphan = backend._file(counter_key(10**6))
        orphan.parent.mkdir(parents=True, exist_ok=True)
        orphan.write_bytes(b"chunk")
        (orphan.parent / ".tmp-1-abcdef").write_bytes(b"half")
        return 2


class _DirectoryHooks(BackendTests):
    def set(self, backend: Backend, key: bytes, data: bytes, *, stamp: float | None = None) -> None:
        assert isinstance(backend, DirectoryBackend)
        path = backend._object_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if stamp is not None:
            os.utime(path, (stamp, stamp))

    def get(self, backend: Backend, key: bytes) -> bytes | None:
        assert isinstance(backend, DirectoryBackend)
        path = backend._object_path(key)
        return path.read_bytes() if path.exists() else None

    def orphans(self, backend: Backend) -> int:
        # the temp files of writers killed before their rename, in each kind of folder
        assert isinstance(backend, DirectoryBackend)
        for folder in ("objects/ab", "refs", "logs", "names"):
            (backend.path / folder).mkdir(parents=True, exist_ok=True)
            (backend.path / folder / ".tmp-1-abcdef").write_bytes(b"half")
        return 4


class TestDirectoryBackend(_DirectoryHooks):
    def make_backend(self, tmp_path: Path) -> Backend:
        return DirectoryBackend.from_url(f"file://{tmp_path}/dir?fsync=0")


class TestDirectoryBackendDurable(_DirectoryHooks):
    """With fsync on, as by default; fewer objects to keep it fast on slow disks."""

    many = 200

    def make_backend(self, tmp_path: Path) -> Backend:
        return DirectoryBackend(tmp_path / "dir")


class _FsspecHooks(BackendTests):
    """Objects planted as a pack written around the backend (write times are in the index:
    a loose file's time is the server's), read back by a second instance."""

    def set(self, backend: Backend, key: bytes, data: bytes, *, stamp: float | None = None) -> None:
        assert isinstance(backend, FsspecBackend)
        pack, offsets = build_pack([data])
        name, idx = build_index(pack, [(key, offsets[0], len(data), _stamp_ms(stamp))])
        backend.fs.pipe_file(backend.index.pack_path(name, "pack"), pack)
        backend.fs.pipe_file(backend.index.pack_path(name, "idx"), idx)

    def get(self, backend: Backend, key: bytes) -> bytes | None:
        assert isinstance(backend, FsspecBackend)
        return next(FsspecBackend(backend.url).get_many([key]))[1]

    def orphans(self, backend: Backend) -> int:
        # a pack whose index a killed writer never wrote
        assert isinstance(backend, FsspecBackend)
        pack, _ = build_pack([b"orphan"])
        backend.fs.pipe_file(backend.index.pack_path("0" * 64, "pack"), pack)
        return 1


class TestFsspecMemoryBackend(_FsspecHooks):
    """fsspec's in-memory filesystem: no conditional writes, so single-writer refs."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[Backend]:
        root = f"/medomni-{uuid.uuid4().hex}"
        b = FsspecBackend(f"fsspec+memory://{root}")
        yield b
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)


def _publish_named(source: Backend, remote: Backend, roots: Iterable[bytes]) -> int:
    """Publish for raw objects: the suite's objects are bytes with no links, so the
    closure of a root is the root (and a ref may name an object never stored)."""
    items = [(k, d) for k, d in source.get_many(roots) if d is not None]
    return remote.put_many(items)


class TestCachedBackend(BackendTests):
    """An LMDB cache in front of a memory remote: what is planted is in the remote only,
    so every hook-based read goes through the cache's read-through path."""

    def make_backend(self, tmp_path: Path) -> Backend:
        local = LMDBBackend(tmp_path / "cache", durable=False)
        return CachedBackend(local, MemoryBackend(), publish=_publish_named)

    def set(self, backend: Backend, key: bytes, data: bytes, *, stamp: float | None = None) -> None:
        assert isinstance(backend, CachedBackend)
        TestMemoryBackend().set(backend.remote, key, data, stamp=stamp)

    def get(self, backend: Backend, key: bytes) -> bytes | None:
        assert isinstance(backend, CachedBackend)
        local = TestLMDBBackend().get(backend.local, key)
        return local if local is not None else TestMemoryBackend().get(backend.remote, key)

    def test_ref_update_publishes_first(self, backend: Backend) -> None:
        assert isinstance(backend, CachedBackend)
        k = blake3.blake3(b"published").digest()
        backend.put(k, b"published")
        assert backend.remote.missing([k]) == [k]  # written to the cache only
        assert backend.ref_update("main", None, k, b"")
        assert backend.remote.get(k) == b"published"
        assert backend.remote.ref_get("main") == k


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with one bucket; dummy credentials in the environment.

    Its conditional PUTs are atomic, as S3's are (see tests/moto_s3.py)."""
    from tests.moto_s3 import AtomicS3Server

    with pytest.MonkeyPatch.context() as mp:
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            mp.delenv(var, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")  # never through a proxy
        server = AtomicS3Server(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            _, port = server.get_host_and_port()
            endpoint = f"http://127.0.0.1:{port}"
            mp.setenv("AWS_ENDPOINT_URL", endpoint)
            s3 = fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)
            # moto keeps its state per process: another module's server made it already
            with contextlib.suppress(FileExistsError):
                s3.mkdir(BUCKET)
            yield endpoint
        finally:
            server.stop()


def s3_url(endpoint: str) -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={endpoint}"


class TestS3Backend(_FsspecHooks):
    """s3fs against moto's S3 server: conditional writes, so multi-writer refs."""

    # moto serves from this process, a few ms a request: fewer objects and increments
    many = 300
    increments_per_thread = 3

    @pytest.fixture
    def backend(self, s3_endpoint: str) -> Iterator[Backend]:
        b = FsspecBackend(s3_url(s3_endpoint))
        assert b.supports_atomic_refs
        yield b


# -- URLs ------------------------------------------------------------------------------------
def test_file_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = open_backend(f"file://{tmp_path}/abs")
    assert isinstance(b, DirectoryBackend) and b.durable and b.path == tmp_path / "abs"
    monkeypatch.chdir(tmp_path)
    rel = open_backend("file://./rel?fsync=0")
    assert isinstance(rel, DirectoryBackend) and not rel.durable
    assert (tmp_path / "rel" / "objects").is_dir()
    with pytest.raises(ValueError, match="unknown option"):
        open_backend("file://./x?sync=0")
    with pytest.raises(ValueError, match="needs a path"):
        open_backend("file://")


def test_fsspec_urls(s3_endpoint: str) -> None:
    mem = open_backend(f"fsspec+memory://m-{uuid.uuid4().hex}/x")
    assert isinstance(mem, FsspecBackend) and not mem.supports_atomic_refs
    s3 = open_backend(f"s3://{BUCKET}/p")  # endpoint from AWS_ENDPOINT_URL
    assert isinstance(s3, FsspecBackend) and s3.supports_atomic_refs
    assert s3.fs.endpoint_url == s3_endpoint
    off = open_backend(f"s3://{BUCKET}/p?conditional_writes=0")
    assert not off.supports_atomic_refs
    with pytest.raises(ValueError, match="unknown option"):
        open_backend(f"s3://{BUCKET}/p?region=x")


def test_store_refuses_multi_writer_refs_without_conditional_writes() -> None:
    url = f"fsspec+memory://m-{uuid.uuid4().hex}/x"
    store = mc.open(url)
    oid = store.put_blob(b"x")
    with pytest.raises(UnsupportedOperation):
        store.refs.set("main", oid, expected=None)
    single = mc.open(url, single_writer=True)
    single.refs.set("main", oid, expected=None)
    assert single.refs["main"] == oid


# -- several processes ---------------------------------------------------------------------------
def run_workers(url: str, tmp_path: Path, processes: int, each: int, env: dict[str, str]) -> None:
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(processes)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, "counter", str(each), str(r), str(go)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in ready
    ]
    try:
        deadline = time.monotonic() + 30
        while not all(r.exists() for r in ready):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        go.touch()  # all start together, so that they contend
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def check_counter(backend: Backend, total: int) -> None:
    value = backend.ref_get("counter")
    assert value is not None
    assert backend.get(value) == b"%d" % total
    assert backend.ref_log("counter") == [b"%d->%d" % (i, i + 1) for i in range(total)]


def test_directory_processes_lose_no_update(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    run_workers(url, tmp_path, processes=4, each=25, env=dict(os.environ))
    check_counter(open_backend(url), 100)


def test_s3_processes_lose_no_update(s3_endpoint: str, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"  # the workers find the endpoint in the env
    run_workers(url, tmp_path, processes=4, each=10, env=dict(os.environ))
    check_counter(open_backend(url), 40)


# -- killed writers: directory ---------------------------------------------------------------
@pytest.fixture
def folder(tmp_path: Path) -> DirectoryBackend:
    return DirectoryBackend(tmp_path / "dir", durable=False)


def test_temp_files_are_never_objects_or_refs(folder: DirectoryBackend) -> None:
    k = counter_key(1)
    folder.put(k, b"1")
    fan = folder.path / "objects" / k.hex()[:2]
    (fan / ".tmp-123-abcdef").write_bytes(b"half an obj")
    (folder.path / "objects" / ".tmp-99").write_bytes(b"")
    (folder.path / "refs" / ".tmp-123-abcdef").write_text(k.hex() + "\n0\n")
    assert list(folder.iter_keys()) == [k]
    assert list(folder.iter_keys(k.hex()[:2])) == [k]
    assert [key for key, _ in folder.iter_stamps()] == [k]
    assert list(folder.ref_iter()) == []
    assert list(folder.ref_log_names()) == []


def test_uncommitted_log_tail_is_ignored_then_replaced(folder: DirectoryBackend) -> None:
    a, b, c = counter_key(1), counter_key(2), counter_key(3)
    assert folder.ref_update("r", None, a, b"first")
    log = folder.path / "logs" / "r"
    # a writer killed after appending a whole entry, before renaming the ref: not committed
    with log.open("ab") as f:
        f.write(b"\x00\x00\x00\x05ghost")
        f.write(b"\x00\x00\x01\x00trunc")  # and one killed mid-append
    assert folder.ref_log("r") == [b"first"]
    assert folder.ref_get("r") == a
    assert folder.ref_update("r", a, b, b"second")
    assert folder.ref_update("r", b, c, b"third")
    assert folder.ref_log("r") == [b"first", b"second", b"third"]
    assert log.stat().st_size == 3 * 4 + len(b"firstsecondthird")


def test_truncated_log_entry_does_not_crash(folder: DirectoryBackend) -> None:
    assert directory.parse_log(b"\x00\x00\x00\x02ok\x00\x00\x00\x09abc") == [b"ok"]
    assert directory.parse_log(b"\x00\x00") == []
    assert directory.parse_log(b"\x00\x00\x00\x02ok\x00\x00\x00\x02no", end=6) == [b"ok"]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_of_dead_writer_is_broken(folder: DirectoryBackend) -> None:
    a = counter_key(1)
    lock = folder.path / "refs" / f"{encode_ref_name('r')}.lock"
    lock.write_text(f"{dead_pid()} {folder._host}\n")
    old = time.time() - directory.DEAD_HOLDER_GRACE - 1
    os.utime(lock, (old, old))
    assert folder.ref_update("r", None, a, b"after a crash")
    assert folder.ref_get("r") == a
    assert not lock.exists()
    assert not [p for p in lock.parent.iterdir() if p.name.startswith(".tmp-")]


def test_lock_of_live_writer_is_respected(
    folder: DirectoryBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(directory, "LOCK_TIMEOUT", 0.2)
    lock = folder.path / "refs" / f"{encode_ref_name('r')}.lock"
    lock.write_text(f"{os.getpid()} {folder._host}\n")  # alive: this very process
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.raises(TimeoutError, match="stayed locked"):
        folder.ref_update("r", None, counter_key(1), b"")
    assert lock.exists()


def test_lock_of_unknown_holder_is_broken_when_old(
    folder: DirectoryBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(directory, "LOCK_TIMEOUT", 0.2)
    lock = folder.path / "refs" / f"{encode_ref_name('r')}.lock"
    lock.write_text("")  # died between creating the lock and writing its pid
    with pytest.raises(TimeoutError):
        folder.ref_update("r", None, counter_key(1), b"")
    old = time.time() - directory.LOCK_STALE_AFTER - 1
    os.utime(lock, (old, old))
    assert folder.ref_update("r", None, counter_key(1), b"")


def test_killed_writer_process(tmp_path: Path) -> None:
    """SIGKILL a writer mid-stream; the store stays consistent and others carry on."""
    url = f"file://{tmp_path}/store"
    backend = open_backend(url)
    go = tmp_path / "go"
    go.touch()
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, url, "counter", "100000", str(tmp_path / "r"), str(go)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while len(backend.ref_log("counter")) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    value = backend.ref_get("counter")
    assert value is not None
    n = int(backend.get(value))
    assert n >= 30
    check_counter(backend, n)
    assert increment(backend, "counter", 5) == 0
    check_counter(backend, n + 5)


def test_writer_killed_as_it_takes_the_lock(tmp_path: Path) -> None:
    """A writer killed the moment its lock file exists leaves a lock naming it, so the next
    writer breaks it at once (an empty lock would say "holder unknown" and block for a
    minute, past the next writer's patience)."""
    url = f"file://{tmp_path}/store"
    backend = open_backend(url)
    go = tmp_path / "go"
    go.touch()
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, url, "counter", "1", str(tmp_path / "r"), str(go)],
        cwd=REPO,
        env={**os.environ, "MEDOMNI_TEST_CRASH": "lock:1"},
        capture_output=True,
    )
    assert proc.returncode == -signal.SIGKILL
    assert list((tmp_path / "store" / "refs").glob("*.lock"))  # it died holding the lock
    assert increment(backend, "counter", 3) == 0
    check_counter(backend, 3)


# -- killed writers: fsspec ---------------------------------------------------------------------
@pytest.fixture(params=["memory", "s3"])
def fsspec_backend(request: pytest.FixtureRequest) -> FsspecBackend:
    if request.param == "memory":
        return FsspecBackend(f"fsspec+memory://m-{uuid.uuid4().hex}/x")
    return FsspecBackend(s3_url(request.getfixturevalue("s3_endpoint")))


def test_decided_update_is_rolled_forward(fsspec_backend: FsspecBackend) -> None:
    """A writer killed after claiming update seq+1, before moving the ref, loses nothing."""
    b = fsspec_backend
    a, dead, c = counter_key(1), counter_key(2), counter_key(3)
    assert b.ref_update("r", None, a, b"first")
    # what the dead writer left: update 2 decided in the log, the ref still at update 1
    b.fs.pipe_file(b.ref_files.log_path("r", 2), dead.hex().encode() + b"\ndead writer")
    assert b.ref_get("r") == a
    assert b.ref_log("r") == [b"first", b"dead writer"]
    # a writer still expecting `a` loses: the decided update comes first
    assert not b.ref_update("r", a, c, b"stale")
    assert b.ref_get("r") == dead
    assert b.ref_update("r", dead, c, b"third")
    assert b.ref_log("r") == [b"first", b"dead writer", b"third"]


def test_s3_conditional_writes_are_enforced(s3_endpoint: str) -> None:
    """moto enforces If-None-Match and If-Match; else the thread tests prove nothing."""
    b = FsspecBackend(s3_url(s3_endpoint))
    remote = b.io
    path = remote.path("probe")
    assert remote.create(path, b"1")
    assert not remote.create(path, b"2")
    data, etag = remote.read_versioned(path)
    assert data == b"1" and etag
    assert remote.replace(path, b"3", etag)
    assert not remote.replace(path, b"4", etag)  # stale ETag
    assert remote.read_versioned(path)[0] == b"3"


def test_s3_conditional_creates_have_one_winner(s3_endpoint: str) -> None:
    """Racing create-only writes of one key: exactly one wins, every time (S3's promise,
    which the ref protocol's update step stands on). Threads switch every microsecond so
    that a check-then-write server (plain moto: 10 of 150 keys had two winners) fails here."""
    remote = FsspecBackend(s3_url(s3_endpoint)).io
    racers = 16
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _race_creates(remote, racers, keys=100)
    finally:
        sys.setswitchinterval(interval)


def _race_creates(remote: Remote, racers: int, keys: int) -> None:
    for key in range(keys):
        path = remote.path(f"race-{key}")
        start = threading.Barrier(racers)
        won: list[bool] = []

        def race(
            i: int, path: str = path, start: threading.Barrier = start, won: list[bool] = won
        ) -> None:
            start.wait()
            won.append(remote.create(path, b"%d" % i))

        threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(won) == [False] * (racers - 1) + [True], path


# -- the suite without pytest ----------------------------------------------------------------
NO_PYTEST = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "pytest" or name.startswith(("pytest.", "_pytest")):
            raise ImportError(f"blocked: {name}")
        return None

sys.meta_path.insert(0, Refuse())
import medomni_cas.testing as t
assert "pytest" not in sys.modules and "_pytest" not in sys.modules
print(sorted(t.__all__))
"""


def test_testing_imports_without_pytest() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    out = subprocess.run(
        [sys.executable, "-c", NO_PYTEST], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "BackendTests" in out.stdout
    # and the finder does block pytest, so the check above can fail
    blocked = subprocess.run(
        [
            sys.executable,
            "-c",
            NO_PYTEST.replace("import medomni_cas.testing as t", "import pytest"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert blocked.returncode != 0 and "blocked: pytest" in blocked.stderr


# -- one LMDB environment per path per process -------------------------------------------------
def test_lmdb_path_opened_twice_shares_one_environment(tmp_path: Path) -> None:
    path = tmp_path / "store"
    first = LMDBBackend(path, durable=False)
    second = LMDBBackend(path)  # asks for durability the environment lacks: flushes itself
    assert second.env is first.env and open_count(path) == 2
    k = counter_key(1)
    second.put(k, b"1")
    assert first.get(k) == b"1"
    first.close()
    first.close()  # closing twice is harmless, and does not drop the other holder
    assert open_count(path) == 1
    assert second.get(k) == b"1"
    second.close()
    assert open_count(path) == 0
    with LMDBBackend(path) as again:  # closed for good: opened afresh
        assert again.get(k) == b"1"
    assert open_count(path) == 0


def test_store_opened_again_while_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-running ``open_workspace``, or ``mc.open()`` while a workspace is open: the same
    path by another spelling (relative, absolute, the workspace file's) shares it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workspace.yaml").write_text("store: lmdb://./.medomni/store\n")
    with mc.open() as ws_store:
        oid = ws_store.put_blob(b"in the workspace")
        with mc.open() as again, mc.open("lmdb://./.medomni/store") as default:
            assert again.read_blob(oid) == default.read_blob(oid) == b"in the workspace"
            again.refs.set("main", oid)
        with mc.open(f"lmdb://{tmp_path}/.medomni/store") as absolute:
            assert absolute.refs["main"] == oid
        assert ws_store.refs["main"] == oid  # still open after the others closed
    assert open_count(tmp_path / ".medomni" / "store") == 0


def test_medomni_view_while_the_store_is_open(tmp_path: Path) -> None:
    """``pd.read_parquet("medomni://…")`` while a store is open opens the store again."""
    url = f"lmdb://{tmp_path}/store"
    with mc.open(url) as store:
        blob = store.put_blob(b"a,b\n1,2\n")
        store.refs.set("data", store.put_tree({"t.csv": blob}))
        fs = fsspec.filesystem("medomni", store=url)
        assert fs.cat("data/t.csv") == b"a,b\n1,2\n"
        assert open_count(tmp_path / "store") == 2


def test_cached_store_opened_twice(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    url = s3_url(s3_endpoint)
    with mc.open(url, cache=True) as one, mc.open(url, cache=True) as two:
        assert isinstance(one.backend, CachedBackend) and isinstance(two.backend, CachedBackend)
        assert one.backend.local.url == two.backend.local.url
        oid = one.put_blob(b"shared cache")
        assert two.read_blob(oid) == b"shared cache"  # in the one cache, not yet remote
        one.refs.set("main", oid)
        assert mc.open(url).read_blob(two.refs["main"]) == b"shared cache"


# -- small pieces ----------------------------------------------------------------------------
def test_pid_alive() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(dead_pid())
    assert not pid_alive(0) and not pid_alive(-1)  # process groups, not a process


def test_from_url_is_declared_on_backend() -> None:
    with pytest.raises(NotImplementedError, match="CachedBackend cannot be opened from a URL"):
        CachedBackend.from_url("s3://bucket/x")
    assert isinstance(open_backend("memory://"), MemoryBackend)
