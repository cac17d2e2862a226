"""``python -m benchmarks_perf store [--quick]``: the store against raw LMDB, the disk and git.

Every row pairs our figure with a baseline measured in the same run on the same tmp disk:

1. small records: ``Store.put_many`` / ``get_raw_many`` / typed ``get_many`` on ``lmdb://``
   against raw ``lmdb`` (``putmulti`` / ``get``) of the same canonical bytes and keys;
2. a generated 1 GiB blob: durable ``put_blob`` against ``dd conv=fsync`` and single-threaded
   BLAKE3 of the same bytes; ``open_blob`` reads; peak RSS of the put (in a child process);
3. 20,000 small objects into ``lmdb://`` and ``file://`` against ``git fast-import`` and
   ``git hash-object -w --stdin-paths`` of the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import blake3
import lmdb

import medomni_cas as mc
from benchmarks_perf._table import Row, render
from medomni_cas.store import encoding
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.encoding import Record
from medomni_cas.store.ids import ObjectId

MiB = 1 << 20
BATCH = 10_000


class BenchPrediction(Record, kw_only=True):
    """A model's answer to one item, shaped like MedOmni's prediction records (~170-300 B)."""

    __kind__ = "bench-prediction"

    run: ObjectId
    model: str
    item: str
    answer: str
    score: float
    latency_ms: int
    tokens: int


@dataclass(frozen=True)
class Sizes:
    records: int
    blob_mib: int
    objects: int
    repeats: int


FULL = Sizes(records=200_000, blob_mib=1024, objects=20_000, repeats=3)
QUICK = Sizes(records=10_000, blob_mib=32, objects=1_000, repeats=1)


def run_of(store: mc.Store, salt: str) -> None:
    """Store the object `make_records`'s records link (a put refuses a link to an object
    that is not stored): a small blob, untimed."""
    store.put_blob(salt.encode())


def make_records(n: int, salt: str) -> list[BenchPrediction]:
    run = blob_object(salt.encode())[0]  # stored by `run_of`
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
        BenchPrediction(
            run=run,
            model="medomni-llm-7b-v2",
            item=f"{salt}-item-{i:07d}",
            # varying length keeps the records in the ~170-300 B range of real predictions
            answer=" ".join(words[: 3 + i % 10]) + f" ({i})",
            score=(i % 1000) / 1000 + 0.0005,
            latency_ms=100 + i % 5000,
            tokens=20 + i % 400,
        )
        for i in range(n)
    ]


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _open_raw_env(path: Path) -> lmdb.Environment:
    # the same settings LMDBBackend uses, so the only difference is our code on top
    return lmdb.open(
        str(path),
        map_size=1 << 30,
        max_dbs=8,
        sync=True,
        metasync=True,
        readahead=False,
        max_readers=512,
    )


# -- 1. small records ----------------------------------------------------------------------
def bench_records(tmp: Path, sizes: Sizes) -> list[Row]:
    records = make_records(sizes.records, "rec")
    datas = [encoding.encode(r) for r in records]
    keys = [blake3.blake3(d).digest() for d in datas]
    sizes_b = [len(d) for d in datas]
    size_note = f"{len(records):,} records of {min(sizes_b)}-{max(sizes_b)} B, batches of {BATCH:,}"
    batches = range(0, len(records), BATCH)

    put_ours: list[float] = []
    put_raw: list[float] = []
    get_ours: list[float] = []
    get_typed: list[float] = []
    get_raw: list[float] = []
    put_all_ours: list[float] = []
    put_all_raw: list[float] = []
    # Repeats are interleaved (ours, raw, ours, raw…) in fresh environments so that drift in
    # the machine's state hits both alike; the median is reported.
    for rep in range(sizes.repeats):
        store = mc.open(f"lmdb://{tmp}/store-{rep}")
        run_of(store, "rec")
        ids: list[ObjectId] = []

        def put() -> None:
            for i in batches:
                ids.extend(store.put_many(records[i : i + BATCH]))  # noqa: B023

        put_ours.append(_timed(put))
        assert ids == keys, "ids differ from the precomputed keys"

        def get() -> None:
            for _ in store.get_raw_many(ids):  # noqa: B023
                pass

        def get_cls() -> None:
            for _ in store.get_many(ids, BenchPrediction):  # noqa: B023
                pass

        get_ours.append(_timed(get))
        get_typed.append(_timed(get_cls))
        store.close()

        env = _open_raw_env(tmp / f"raw-{rep}")
        db = env.open_db(b"objects")
        pairs = list(zip(keys, datas, strict=True))

        def raw_put() -> None:
            for i in batches:
                with env.begin(write=True) as txn:  # noqa: B023
                    txn.cursor(db).putmulti(  # noqa: B023
                        pairs[i : i + BATCH],  # noqa: B023
                        dupdata=False,
                        overwrite=False,
                    )

        def raw_get() -> None:
            for i in batches:
                with env.begin() as txn:  # noqa: B023
                    get = txn.get
                    for k in keys[i : i + BATCH]:
                        get(k, db=db)  # noqa: B023

        put_raw.append(_timed(raw_put))
        get_raw.append(_timed(raw_get))
        env.close()

        # The same records in one call each: the store chooses its own batches, raw LMDB
        # takes them in one transaction (the best case for both).
        with mc.open(f"lmdb://{tmp}/store-all-{rep}") as store:
            run_of(store, "rec")
            put_all_ours.append(_timed(lambda: store.put_many(records)))  # noqa: B023
        env = _open_raw_env(tmp / f"raw-all-{rep}")
        db = env.open_db(b"objects")
        with env.begin(write=True) as txn:
            t = time.perf_counter()
            txn.cursor(db).putmulti(pairs, dupdata=False, overwrite=False)
            txn.commit()
            put_all_raw.append(time.perf_counter() - t)
        env.close()
        for name in ("store", "raw", "store-all", "raw-all"):
            shutil.rmtree(tmp / f"{name}-{rep}")

    n = len(records)

    def rate(times: list[float]) -> float:
        return n / statistics.median(times)

    reps = f", median of {sizes.repeats}" if sizes.repeats > 1 else ""
    return [
        Row(
            "records: Store.put_many (lmdb, sync)",
            rate(put_ours),
            "puts/s",
            rate(put_raw),
            "raw putmulti",
            target=0.4,
            note=f"{size_note}{reps}; also needs >= 200k puts/s: "
            + ("PASS" if rate(put_ours) >= 200_000 else "MISS"),
        ),
        Row(
            "records: Store.put_many, all in one call",
            rate(put_all_ours),
            "puts/s",
            rate(put_all_raw),
            "raw, 1 putmulti",
            note="store batches internally; raw commits once",
        ),
        Row(
            "records: Store.get_raw_many (blake3 verify)",
            rate(get_ours),
            "gets/s",
            rate(get_raw),
            "raw txn.get",
            target=0.35,
        ),
        Row(
            "records: Store.get_many(ids, cls) (verify+decode)",
            rate(get_typed),
            "gets/s",
            rate(get_raw),
            "raw txn.get",
            note="typed decode on top of verify; no target",
        ),
    ]


# -- 2. a large blob -----------------------------------------------------------------------
class GeneratedStream(io.RawIOBase):
    """``size`` bytes, made on the fly: a random base buffer of ``base`` bytes, cut into
    1 MiB pieces, each piece stamped with its index so no two chunks are alike (dedup must
    not shrink the blob). Memory stays at the base buffer whatever ``size`` is."""

    def __init__(self, size: int, base: int = 64 * MiB) -> None:
        super().__init__()
        self._base = os.urandom(min(base, max(size, MiB)))
        self._size = size
        self._pieces = self._generate()
        self._pending = b""

    def _generate(self) -> Iterator[bytes]:
        per_base = len(self._base) // MiB
        base = memoryview(self._base)
        for index, start in enumerate(range(0, self._size, MiB)):
            off = (index % per_base) * MiB
            n = min(MiB, self._size - start)
            yield (index.to_bytes(8, "little") + base[off + 8 : off + n])[:n]

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        # put_blob reads whole chunks: handing over the piece itself avoids a copy per MiB
        if not self._pending:
            self._pending = next(self._pieces, b"")
        if n < 0 or n >= len(self._pending):
            out, self._pending = self._pending, b""
        else:
            out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        memoryview(buffer)[: len(data)] = data
        return len(data)


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


def blob_child(store_path: str, size: int) -> int:
    """Run in a child process: put one generated blob, durable; print timings as JSON.

    A child so that its peak RSS (VmHWM) is the put's alone, not this benchmark's."""
    stream = GeneratedStream(size)
    rss_before = _status_kib("VmRSS")
    with mc.open(f"lmdb://{store_path}") as store:
        t = time.perf_counter()
        oid = store.put_blob(stream)
        seconds = time.perf_counter() - t
    out = {"id": oid.hex(), "seconds": seconds, "hwm_kib": _status_kib("VmHWM")}
    out["rss_before_kib"] = rss_before
    print(json.dumps(out))
    return 0


def _dd(path: Path, mib: int) -> float:
    """The disk's own sequential write rate, bytes/s (dd's own figure, fsync included)."""
    proc = subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"],
        capture_output=True,
        text=True,
        check=True,
    )
    path.unlink()
    m = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", proc.stderr, re.M)
    if m is None:
        raise RuntimeError(f"cannot parse dd output: {proc.stderr!r}")
    return int(m.group(1)) / float(m.group(2))


def bench_blob(tmp: Path, sizes: Sizes) -> list[Row]:
    size = sizes.blob_mib * MiB
    disk = _dd(tmp / "dd.bin", sizes.blob_mib)

    h = blake3.blake3()
    stream = GeneratedStream(size)
    t = time.perf_counter()
    while piece := stream.read(MiB):
        h.update(piece)
    hash_rate = size / (time.perf_counter() - t)
    del stream

    store_path = tmp / "blob-store"
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks_perf",
            "store",
            "--blob-child",
            str(store_path),
            str(size),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    put_rate = size / result["seconds"]

    with mc.open(f"lmdb://{store_path}") as store:
        buf_read = 0
        t = time.perf_counter()
        with store.open_blob(result["id"]) as f:
            while piece := f.read(MiB):
                buf_read += len(piece)
        read_rate = size / (time.perf_counter() - t)
    if buf_read != size:
        raise RuntimeError(f"read {buf_read} bytes of a {size}-byte blob")
    shutil.rmtree(store_path)

    hwm = result["hwm_kib"] / 1024
    before = result["rss_before_kib"] / 1024
    what = f"{sizes.blob_mib} MiB blob"
    return [
        Row(
            f"blob: put_blob {what} (durable)",
            put_rate / 1e6,
            "MB/s",
            disk / 1e6,
            "dd conv=fsync",
            target=0.4,
            note="LMDB synced, chunk files fsynced before put_blob returns",
        ),
        Row(
            f"blob: put_blob {what}",
            put_rate / 1e6,
            "MB/s",
            hash_rate / 1e6,
            "blake3 1 thread",
            note="same bytes hashed once, single-threaded",
        ),
        Row(
            f"blob: open_blob {what}, 1 MiB reads",
            read_rate / 1e6,
            "MB/s",
            hash_rate / 1e6,
            "blake3 1 thread",
            note="page cache warm; every chunk re-hashed",
        ),
        Row(
            f"blob: peak RSS of put_blob {what}",
            hwm,
            "MiB",
            max_value=256,
            note=f"child process VmHWM; {before:.0f} MiB before the put "
            f"(interpreter + {min(64, sizes.blob_mib)} MiB generator buffer)",
        ),
    ]


# -- 3. many small objects vs git ----------------------------------------------------------
def _git(*args: str, cwd: Path, stdin: object = None) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, stdin=stdin, stdout=subprocess.DEVNULL)


def bench_objects(tmp: Path, sizes: Sizes) -> list[Row]:
    records = make_records(sizes.objects, "obj")
    datas = [encoding.encode(r) for r in records]
    n = len(records)

    def ours(url: str) -> float:
        with mc.open(url) as store:
            run_of(store, "obj")
            return n / _timed(lambda: store.put_many(records))

    lmdb_rate = ours(f"lmdb://{tmp}/objs-lmdb")
    try:
        dir_rate: float | None = ours(f"file://{tmp}/objs-dir")
    except (ImportError, ModuleNotFoundError):
        dir_rate = None  # the directory backend is not there yet

    stream = b"".join(
        b"blob\nmark :%d\ndata %d\n%s\n" % (i + 1, len(d), d) for i, d in enumerate(datas)
    )
    repo = tmp / "fast-import.git"
    _git("init", "-q", "--bare", str(repo), cwd=tmp)
    t = time.perf_counter()
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=stream, check=True)
    fast_rate = n / (time.perf_counter() - t)

    files = tmp / "files"
    files.mkdir()
    paths = []
    for i, d in enumerate(datas):
        p = files / f"{i:06d}"
        p.write_bytes(d)
        paths.append(str(p))
    (tmp / "paths.txt").write_text("\n".join(paths) + "\n")
    repo = tmp / "hash-object.git"
    _git("init", "-q", "--bare", str(repo), cwd=tmp)
    with open(tmp / "paths.txt", "rb") as f:
        hash_rate = n / _timed(
            lambda: _git("hash-object", "-w", "--stdin-paths", cwd=repo, stdin=f)
        )

    what = f"{n:,} objects"
    rows = [
        Row(
            f"objects: lmdb put_many {what}",
            lmdb_rate,
            "obj/s",
            fast_rate,
            "git fast-import",
            target=10,
        ),
        Row(f"objects: lmdb put_many {what}", lmdb_rate, "obj/s", hash_rate, "git hash-object"),
    ]
    if dir_rate is None:
        rows.append(Row(f"objects: file:// {what}", 0, "obj/s", note="no directory backend yet"))
    else:
        rows += [
            Row(
                f"objects: file:// put_many {what}", dir_rate, "obj/s", fast_rate, "git fast-import"
            ),
            Row(
                f"objects: file:// put_many {what}", dir_rate, "obj/s", hash_rate, "git hash-object"
            ),
        ]
    return rows


# -- driver --------------------------------------------------------------------------------
def _command(argv: Sequence[str]) -> str:
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):  # outside the cwd: print it whole
        exe = exe.relative_to(Path.cwd())
    return shlex.join([str(exe), "-m", "benchmarks_perf", "store", *argv])


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf store")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--blob-child", nargs=2, metavar=("STORE", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.blob_child:
        return blob_child(args.blob_child[0], int(args.blob_child[1]))

    sizes = QUICK if args.quick else FULL
    print(f"$ {_command(argv)}")
    print(
        f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
        f"lmdb {lmdb.version()}, {platform.platform()}"
    )
    start = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="medomni-bench-", dir="/tmp") as d:
        tmp = Path(d)
        for bench in (bench_records, bench_blob, bench_objects):
            part = tmp / bench.__name__
            part.mkdir()
            rows += bench(part, sizes)
            shutil.rmtree(part)
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0
