"""``python -m benchmarks_perf remote [--quick]``: push and pull against moto's S3 on loopback.

moto's S3 server runs in a child process on 127.0.0.1 (its CPU time and GIL are not ours),
with dummy credentials; nothing leaves the machine. Requests are counted at s3fs's one
door to the server (``S3FileSystem._call_s3``), so s3fs's own extra requests count too.

1. push of N small objects (records of ~200 B under 100 trees, one root) from LMDB, and
   pull into a fresh LMDB store with a fresh remote view (no index loaded): objects/s and
   requests, against s3fs writing (``pipe_file``) and reading (``cat_file``) one object per
   request, measured in the same run on fewer objects (the rate does not depend on N);
2. the requests of a push with nothing new;
3. a 1 GiB blob (1 MiB chunks): push and pull MB/s, against s3fs's own ``pipe_file`` of
   the same bytes as one object (multipart, concurrent) and ``cat_file`` of it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

import medomni_cas as mc
from benchmarks_perf._table import Row, render
from benchmarks_perf.store import GeneratedStream
from medomni_cas.store import encoding, sync
from medomni_cas.store.backends.fsspec import FsspecBackend
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.ids import hash_bytes

MiB = 1 << 20
BUCKET = "medomni-bench"
_SERVER = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


@dataclass(frozen=True)
class Sizes:
    objects: int
    baseline: int
    blob_mib: int


FULL = Sizes(objects=100_000, baseline=2_000, blob_mib=1024)
QUICK = Sizes(objects=5_000, baseline=200, blob_mib=32)


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server in a child process; yields its endpoint URL."""
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def counting(fs: Any) -> Iterator[collections.Counter[str]]:
    """Count the requests an s3fs filesystem sends while the block runs, by API call."""
    counts: collections.Counter[str] = collections.Counter()
    original = fs._call_s3

    async def counted(method: str, *args: Any, **kwargs: Any) -> Any:
        counts[method] += 1
        return await original(method, *args, **kwargs)

    fs._call_s3 = counted
    try:
        yield counts
    finally:
        del fs._call_s3


def _fs(store: mc.Store) -> Any:
    backend = store.backend
    assert isinstance(backend, FsspecBackend)
    return backend.fs


def _local(path: Path) -> mc.Store:
    # not synced: the figures are the network's and ours, not the disk's fsync
    return mc.Store(LMDBBackend(path, durable=False))


def _shown(counts: collections.Counter[str]) -> str:
    names = {"list_objects_v2": "LIST", "get_object": "GET", "put_object": "PUT"}
    names["head_object"] = "HEAD"
    return ", ".join(f"{n} {names.get(m, m)}" for m, n in sorted(counts.items()))


# -- 1, 2: many small objects ------------------------------------------------------------------
def make_objects(n: int) -> list[bytes]:
    """``n`` record-like objects of ~200 B, canonical bytes."""
    words = [
        "the",
        "patient",
        "presents",
        "with",
        "acute",
        "chest",
        "pain",
        "radiating",
        "to",
        "the",
        "left",
        "arm",
    ]
    return [
        encoding.encode_object(
            "bench-remote-record",
            1,
            {
                "item": f"item-{i:07d}",
                "model": "medomni-llm-7b-v2",
                "answer": " ".join(words[: 3 + i % 10]) + f" ({i})",
                "latency_ms": 100 + i % 5000,
                "tokens": 20 + i % 400,
            },
        )
        for i in range(n)
    ]


def bench_objects(endpoint: str, tmp: Path, sizes: Sizes) -> list[Row]:
    n = sizes.objects
    datas = make_objects(n)
    local = _local(tmp / "local")
    ids = local.put_raw_many((None, d) for d in datas)
    per = max(1, n // 100)
    groups = {
        f"g{i // per:03d}": local.put_tree({f"r{j:07d}": ids[j] for j in range(i, min(i + per, n))})
        for i in range(0, n, per)
    }
    root = local.put_tree(groups)
    local.refs.set("main", root)
    total = n + len(groups) + 1
    prefix = f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={endpoint}"

    remote = mc.open(prefix)
    with counting(_fs(remote)) as pushed:
        t = time.perf_counter()
        report = sync.push(local, remote)
        push_s = time.perf_counter() - t
    assert report.objects == total, report
    with counting(_fs(remote)) as noop:
        again = sync.push(local, remote)
    assert again.objects == 0

    fresh = mc.open(prefix)  # another machine's view: nothing of the index loaded
    dest = _local(tmp / "dest")
    with counting(_fs(fresh)) as pulled:
        t = time.perf_counter()
        got = sync.pull(dest, fresh)
        pull_s = time.perf_counter() - t
    assert got.objects == total and dest.refs["main"] == root

    # the baseline: s3fs, one object per request, on the first `baseline` objects
    fs = fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)
    base = f"{BUCKET}/baseline-{uuid.uuid4().hex}"
    m = sizes.baseline
    paths = [f"{base}/{hash_bytes(d).hex()}" for d in datas[:m]]
    with counting(fs) as base_put:
        t = time.perf_counter()
        for p, d in zip(paths, datas, strict=False):
            fs.pipe_file(p, d)
        base_put_rate = m / (time.perf_counter() - t)
    with counting(fs) as base_get:
        t = time.perf_counter()
        for p in paths:
            fs.cat_file(p)
        base_get_rate = m / (time.perf_counter() - t)
    t = time.perf_counter()
    fs.pipe({f"{base}-c/{i}": d for i, d in enumerate(datas[:m])})
    base_concurrent = m / (time.perf_counter() - t)

    push_rate, pull_rate = total / push_s, total / pull_s
    limit = total / 1000 + 10
    what = f"{total:,} objects"
    base_note = f"baseline on {m:,} objects"
    return [
        Row(
            f"push {what} lmdb -> s3",
            push_rate,
            "obj/s",
            base_put_rate,
            "s3fs pipe_file x1",
            target=50,
            note=f"{push_s:.1f} s; {base_note}, {_shown(base_put)}",
        ),
        Row(
            f"push {what}: requests",
            sum(pushed.values()),
            "requests",
            max_value=int(limit) + 1,
            note=f"{_shown(pushed)}; target <= N/1000 + 10",
        ),
        Row(
            f"pull {what} s3 -> lmdb",
            pull_rate,
            "obj/s",
            base_get_rate,
            "s3fs cat_file x1",
            target=50,
            note=f"{pull_s:.1f} s; {base_note}, {_shown(base_get)}",
        ),
        Row(
            f"pull {what}: requests",
            sum(pulled.values()),
            "requests",
            max_value=int(limit) + 1,
            note=f"{_shown(pulled)}; cold index; target <= N/1000 + 10",
        ),
        Row(
            f"push {what}",
            push_rate,
            "obj/s",
            base_concurrent,
            "s3fs pipe(dict)",
            note=f"s3fs's own concurrent one-object-per-request batch, {m:,} objects",
        ),
        Row(
            "push with nothing new: requests",
            sum(noop.values()),
            "requests",
            max_value=4,
            note=f"{_shown(noop)}; target <= 3",
        ),
    ]


# -- 3: one large blob -------------------------------------------------------------------------
def bench_blob(endpoint: str, tmp: Path, sizes: Sizes) -> list[Row]:
    size = sizes.blob_mib * MiB
    local = _local(tmp / "blob-local")
    blob = local.put_blob(GeneratedStream(size))
    local.refs.set("blob", blob)
    prefix = f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={endpoint}"
    remote = mc.open(prefix)
    with counting(_fs(remote)) as pushed:
        t = time.perf_counter()
        sync.push(local, remote, ["blob"])
        push_rate = size / (time.perf_counter() - t)
    dest = _local(tmp / "blob-dest")
    fresh = mc.open(prefix)
    with counting(_fs(fresh)) as pulled:
        t = time.perf_counter()
        sync.pull(dest, fresh, ["blob"])
        pull_rate = size / (time.perf_counter() - t)
    assert dest.refs["blob"] == blob
    local.close()
    dest.close()

    fs = fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)
    stream = GeneratedStream(size)
    data = b"".join(iter(lambda: stream.read(MiB), b""))
    path = f"{BUCKET}/baseline-blob-{uuid.uuid4().hex}"
    t = time.perf_counter()
    fs.pipe_file(path, data)
    base_put = size / (time.perf_counter() - t)
    del data
    t = time.perf_counter()
    back = fs.cat_file(path)
    base_get = size / (time.perf_counter() - t)
    assert len(back) == size
    del back
    what = f"{sizes.blob_mib} MiB blob"
    return [
        Row(
            f"push {what} lmdb -> s3",
            push_rate / 1e6,
            "MB/s",
            base_put / 1e6,
            "s3fs pipe_file",
            note=f"1 MiB chunks, one PUT each, {_shown(pushed)}; baseline: one object, multipart",
        ),
        Row(
            f"pull {what} s3 -> lmdb",
            pull_rate / 1e6,
            "MB/s",
            base_get / 1e6,
            "s3fs cat_file",
            note=f"verified, written to LMDB; {_shown(pulled)}; baseline: into memory",
        ),
    ]


# -- driver --------------------------------------------------------------------------------
def _command(argv: Sequence[str]) -> str:
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(Path.cwd())
    return shlex.join([str(exe), "-m", "benchmarks_perf", "remote", *argv])


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf remote")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL"):
        os.environ.pop(var, None)
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        NO_PROXY="127.0.0.1,localhost",
    )
    print(f"$ {_command(argv)}")
    print(
        f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
        f"{platform.platform()}; moto S3 server in a child process on 127.0.0.1"
    )
    start = time.perf_counter()
    rows: list[Row] = []
    with moto_server() as endpoint, tempfile.TemporaryDirectory(prefix="medomni-remote-") as d:
        fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True).mkdir(BUCKET)
        rows += bench_objects(endpoint, Path(d), sizes)
        rows += bench_blob(endpoint, Path(d), sizes)
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0
