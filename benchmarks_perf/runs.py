"""``python -m benchmarks_perf runs [--quick]``: running a set, on one machine and on S3 (issue 17).

1. concurrency: the demo's runs (medomni-bench/v1 under its four arms, 660 slots, the
   baseline agent with the process runner) at ``--concurrency 2`` against ``--concurrency 1``,
   each on a fresh copy of the same built store, in the same run; the rounds alternate so
   that both see the same load. Where the time goes is printed with it: the harness's own
   CPU per trial, the agents' (children's) CPU per trial, and the load average, since the
   machine is shared.

2. s3: one job of 140 slots (the demo's no-perception arm) on an ``s3://`` store (moto's
   server on loopback, in a child process) against the same job on LMDB, both with the
   process runner and the baseline agent; and the S3 requests per run, counted at the
   server (`benchmarks_perf._s3server`), for that job, and for the same job with an instant
   in-process runner (only the harness and the store are measured), repeated 7 times (980
   runs), without and with a local cache in front of the store.

``--quick`` runs one n20 pair under one arm. ``--only concurrency|s3`` runs some parts.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import yaml

import medomni_cas as mc
from benchmarks_perf._s3server import fetch_counts, reset_counts
from benchmarks_perf._table import Row, render
from examples import synth
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.runners import Job, Runner, Trial
from medomni_cas.store import sync
from medomni_cas.studio.tasksets import build_set

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEMO_SET = "medomni-bench/v1"
QUICK_SET = "medomni-bench/quick"
BUCKET = "medomni-runs"


@dataclass(frozen=True)
class Sizes:
    set_name: str
    rounds: int  # alternating rounds of (concurrency 1, concurrency 2)
    reps: int  # repetitions of the set for the requests amortized over many runs


FULL = Sizes(DEMO_SET, rounds=2, reps=7)  # 7 jobs of 140 runs: the issue's ~1,000 runs
QUICK = Sizes(QUICK_SET, rounds=1, reps=1)


def demo_tree(root: Path, quick: bool) -> Path:
    """The example studio and bench trees (copies) with the demo's data (200 patients, seed
    0), and a one-pair set for ``--quick``."""
    shutil.copytree(EXAMPLES / "studio", root / "studio", ignore=shutil.ignore_patterns("data"))
    shutil.copytree(EXAMPLES / "bench", root / "bench")
    if quick:
        doc = {
            "description": "one pair, for the quick benchmark",
            "builder": "medomni-v1",
            "arms": ["no-perception"],
            "pairs": [{"task": "synth-ehr_ckd-staging@n20", "n": 1}],
        }
        sets = root / "bench/benchmarks/medomni-bench/sets"
        (sets / "quick.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    synth.generate(root / "studio/datasets/synth-ehr/data", patients=200, seed=0)
    return root


@dataclass
class Timing:
    wall: float
    runs: int
    harness_cpu: float
    agents_cpu: float
    load: float  # the 1-minute load average when the round ended


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_run(tree: Path, built: Path, tmp: Path, set_name: str, concurrency: int) -> Timing:
    """One harness run of the whole set on a fresh copy of the built store."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copytree(built, tmp / "store")
    with mc.open(f"lmdb://{tmp / 'store'}") as store:
        agent = find_agent(tree / "bench", "baseline")
        cpu, children, t = time.process_time(), _children_cpu(), time.perf_counter()
        report = run_set(
            store,
            set_name,
            agent,
            runs_dir=tmp / "runs",
            studio=tree / "studio",
            bench=tree / "bench",
            concurrency=concurrency,
        )
        wall = time.perf_counter() - t
        timing = Timing(
            wall,
            report.ran,
            time.process_time() - cpu,
            _children_cpu() - children,
            os.getloadavg()[0],
        )
    if not report.complete:
        raise SystemExit(f"the run at --concurrency {concurrency} did not complete")
    shutil.rmtree(tmp)
    return timing


def bench_concurrency(tmp: Path, sizes: Sizes) -> list[Row]:
    tree = demo_tree(tmp / "tree", sizes.set_name == QUICK_SET)
    built = tmp / "built"
    with mc.open(f"lmdb://{built}") as store:
        build_set(store, sizes.set_name, studio=tree / "studio", bench=tree / "bench")
    rounds: dict[int, list[Timing]] = {1: [], 2: []}
    for r in range(sizes.rounds):
        # alternate which goes first, so a change of load falls on both alike
        for n in (1, 2) if r % 2 == 0 else (2, 1):
            got = time_run(tree, built, tmp / f"run-{n}", sizes.set_name, n)
            rounds[n].append(got)
            print(
                f"round {r + 1}, --concurrency {n}: {got.runs} runs in {got.wall:.1f} s; "
                f"harness CPU {got.harness_cpu / got.runs * 1000:.0f} ms/run, agents' CPU "
                f"{got.agents_cpu / got.runs * 1000:.0f} ms/run; load average {got.load:.1f}",
                flush=True,
            )
    one, two = (statistics.median(t.wall for t in rounds[n]) for n in (1, 2))
    runs = rounds[1][0].runs
    cpu = statistics.median((t.harness_cpu + t.agents_cpu) / t.runs for t in rounds[2])
    load = statistics.median(t.load for t in rounds[1] + rounds[2])
    return [
        Row(
            f"{sizes.set_name}: {runs} runs at --concurrency 2",
            runs / two,
            "runs/s",
            runs / one,
            "--concurrency 1",
            target=1.7,
            note=f"median of {sizes.rounds} alternating rounds; {cpu * 1000:.0f} ms CPU per "
            f"run (harness + agent); load average {load:.1f} on {os.cpu_count()} cores",
        )
    ]


# -- 2: S3 -------------------------------------------------------------------------------------
class InstantRunner(Runner):
    """Answers every trial at once, in this process: what is left is the harness's work."""

    name: ClassVar[str] = "instant"
    claims_each: ClassVar[bool] = True

    def run(self, job: Job) -> Iterator[Trial]:
        for spec in job.trials:
            if job.claim is not None and not job.claim(spec):
                continue
            targets = spec.format_check.targets
            answer = {t.name: (t.classes[0] if t.classes else 1.0) for t in targets}
            now = datetime.now(UTC).isoformat(timespec="milliseconds")
            yield Trial(
                spec.slot,
                spec.attempt,
                "answered",
                now,
                now,
                0,
                answer=json.dumps(answer).encode(),
                served_model=job.agent.served_model,
                logs={"stdout.txt": b"", "stderr.txt": b""},
                environment="local",
            )


@contextlib.contextmanager
def counting_s3() -> Iterator[str]:
    """The counting moto server in a child process; yields its endpoint, with a bucket."""
    for var, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(var, value)
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks_perf._s3server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert proc.stdout is not None
        endpoint = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True).mkdir(BUCKET)
        yield endpoint
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _requests(counts: dict[str, int]) -> int:
    return sum(counts.values())


def _by_method(counts: dict[str, int]) -> str:
    methods: collections.Counter[str] = collections.Counter()
    for key, n in counts.items():
        methods[key.split()[0]] += n
    return ", ".join(f"{m} {n}" for m, n in sorted(methods.items()))


def _run_on(
    url: str,
    tree: Path,
    runs: Path,
    set_name: str,
    arm: str | None,
    cache: str | None = None,
    **options: Any,
) -> tuple[float, int]:
    with mc.open(url, cache=cache) as store:
        agent = find_agent(tree / "bench", "baseline")
        t = time.perf_counter()
        report = run_set(
            store,
            set_name,
            agent,
            runs_dir=runs,
            studio=tree / "studio",
            bench=tree / "bench",
            arms=[arm] if arm else None,
            **options,
        )
        wall = time.perf_counter() - t
    if not report.complete:
        raise SystemExit(f"the run on {url} did not complete")
    return wall, report.ran


def bench_s3(tmp: Path, sizes: Sizes) -> list[Row]:
    tree = demo_tree(tmp / "tree", sizes.set_name == QUICK_SET)
    built = tmp / "built"
    with mc.open(f"lmdb://{built}") as store:
        build_set(store, sizes.set_name, studio=tree / "studio", bench=tree / "bench")
    arm = "no-perception"
    rows: list[Row] = []
    with counting_s3() as endpoint:

        def remote() -> str:
            url = f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={endpoint}"
            with mc.open(f"lmdb://{built}") as local, mc.open(url) as dest:
                sync.push(local, dest)  # the built set, as the studio's host publishes it
            return url

        # one job with the process runner and the baseline agent, on LMDB and on S3
        shutil.copytree(built, tmp / "lmdb")
        lmdb_s, ran = _run_on(
            f"lmdb://{tmp / 'lmdb'}", tree, tmp / "runs-lmdb", sizes.set_name, arm
        )
        url = remote()
        reset_counts(endpoint)
        s3_s, ran_s3 = _run_on(url, tree, tmp / "runs-s3", sizes.set_name, arm)
        counts = fetch_counts(endpoint)
        assert ran_s3 == ran
        print(f"{ran} runs of one job on s3: {_by_method(counts)}; {sorted(counts.items())}")
        rows.append(
            Row(
                f"{sizes.set_name} {arm}: one job of {ran} slots on s3://",
                s3_s,
                "s",
                lmdb_s,
                "the same job on lmdb://",
                max_ratio=1.5,
                note="process runner, baseline agent, default concurrency; moto on loopback",
            )
        )
        rows.append(
            Row(
                f"S3 requests per run, one job of {ran} runs",
                _requests(counts) / ran,
                "requests",
                max_value=3.001,
                note=_by_method(counts) + " (at the server)",
            )
        )
        # the harness and the store alone (an instant runner), without and with a cache
        for cache in (None, f"lmdb://{tmp / 'cache'}"):
            url = remote()
            reset_counts(endpoint)
            _, many = _run_on(
                url,
                tree,
                tmp / f"runs-instant-{bool(cache)}",
                sizes.set_name,
                arm,
                cache=cache,
                runner=InstantRunner(),
                reps=sizes.reps,
            )
            counts = fetch_counts(endpoint)
            how = "with a local cache (cache=True)" if cache else "no cache"
            print(f"{many} runs, instant runner, {how}: {sorted(counts.items())}")
            rows.append(
                Row(
                    f"S3 requests per run, {many:,} runs (instant runner), {how}",
                    _requests(counts) / many,
                    "requests",
                    max_value=3.001,
                    note=_by_method(counts) + " (at the server)",
                )
            )
    return rows


def _command(argv: Sequence[str]) -> str:
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):  # outside the cwd: print it whole
        exe = exe.relative_to(Path.cwd())
    return shlex.join([str(exe), "-m", "benchmarks_perf", "runs", *argv])


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf runs")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument(
        "--only", choices=("concurrency", "s3"), action="append", help="run only these parts"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="alternating rounds of each concurrency"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.rounds is not None:
        sizes = Sizes(sizes.set_name, max(1, args.rounds), sizes.reps)
    parts = set(args.only or ("concurrency", "s3"))
    print(f"$ {_command(argv)}")
    print(
        f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
        f"{platform.platform()}; load average {os.getloadavg()[0]:.1f} at the start"
    )
    start = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="medomni-runs-", dir="/tmp") as d:
        tmp = Path(d)
        if "concurrency" in parts:
            rows += bench_concurrency(tmp / "concurrency", sizes)
        if "s3" in parts:
            rows += bench_s3(tmp / "s3", sizes)
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0
