"""``python -m benchmarks_perf compare [--quick]``: paired contrasts over 10M prediction rows.

The store is the scoring benchmark's (`benchmarks_perf.bench_score`: five arms x four pairs,
one 6-class target scored by accuracy, 100 jobs of 100,000 rows: four agents x five
repetitions per arm, in the harness's `PredictionColumns`), with real atom tasks (an
arm's atoms of a patient share the patient's evidence tree, so every patient pairs). The
comparison is the chain arm1 - arm0, ..., arm4 - arm3 for every agent: it reads all 100
jobs, 64 contrasts of 25,000 patients x 5 repetitions each, 1,000 paired resamples.

Timed in the same run, against ``score_jobs(n_boot=0)`` on the same jobs (the scorer's
time for the same rows without intervals), each the median of three:

* the compare once the atoms' evidence ids are kept (`bench run` keeps them when it plans
  a job, so this is a user's first compare too), with 1,000 resamples: the issue's target
  is at most 3x the scorer;
* the same without intervals (``n_boot=0``), which splits the cost;
* a compare with no evidence ids kept (jobs run before the harness kept them, or written
  as here without it), which also reads every atom (500,000) and keeps their evidence ids;
  and what ``audit verify`` re-derives (the atoms read, nothing kept).

Every arm's value is checked against the scorer's rows (the mean of its repetitions'
accuracies: each repetition has the same rows).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import medomni_cas as mc
from benchmarks_perf._table import Row, render
from benchmarks_perf._timing import median_time, timed
from benchmarks_perf.bench_score import ARMS, build_scoring, put_written
from medomni_cas.bench.contrasts import compare_jobs, derive_comparison
from medomni_cas.bench.scorer import score_jobs
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.studio.records import AtomEnvironment, AtomTask


@dataclass
class Sizes:
    score_jobs: int
    rows_per_job: int
    python_jobs: int
    repeats: int
    n_boot: int


FULL = Sizes(score_jobs=100, rows_per_job=100_000, python_jobs=0, repeats=3, n_boot=1000)
QUICK = Sizes(score_jobs=10, rows_per_job=4_000, python_jobs=0, repeats=1, n_boot=200)
CHAIN = [(f"arm{i}", f"arm{i - 1}") for i in range(1, ARMS)]


def _atoms(store: mc.Store, pair: str, arm: str, patients: tuple[str, ...]) -> list[ObjectId]:
    """Real atom tasks, one a patient, written in one batch (`put_written`: their links
    are ids only; the comparer reads an atom's evidence id, never the evidence); a
    patient's evidence is the same under every arm."""
    return put_written(
        store,
        [
            AtomTask(
                pair=pair,
                version="1.0",
                patient=patient,
                prediction_time="2026-01-01T00:00:00",
                arm=arm,
                instruction=_NONE,
                evidence=hash_bytes(f"evidence {pair} {patient}".encode()),
                families=("demographics",),
                environment=_ENV,
                submission_path="/workspace/answer.json",
                format_check=_NONE,
                config=_NONE,
            )
            for patient in patients
        ],
    )


_NONE = ObjectId(bytes(32))
_ENV = AtomEnvironment(cpus=1, memory_mb=1024, agent_timeout_sec=60, verifier_timeout_sec=60)


def _check(compared: Sequence[object], scored: Sequence[object]) -> None:
    """Each arm's pooled value is the mean of the scorer's per-repetition accuracies."""
    by: dict[tuple[str, str, str], list[float]] = {}
    for r in scored:
        by.setdefault((r.agent, r.arm, r.pair), []).append(r.value)  # type: ignore[attr-defined]
    for c in compared:
        for side in ("a", "b"):
            want = float(np.mean(by[(c.agent, getattr(c, side), c.pair)]))  # type: ignore[attr-defined]
            got = getattr(c, f"value_{side}")
            if abs(got - want) > 1e-9:
                raise RuntimeError(f"{c.agent} {getattr(c, side)} {c.pair}: {got} != {want}")  # type: ignore[attr-defined]


def bench_compare(tmp: Path, sizes: Sizes) -> list[Row]:
    path = tmp / "compare"
    t_build, s = timed(lambda: build_scoring(path, sizes, _atoms))
    store, jobs, n_rows = s.store, s.jobs, s.rows
    print(
        f"built {len(jobs)} jobs of {sizes.rows_per_job:,} rows with their atoms in {t_build:.0f} s"
    )
    os.sync()  # written with durable=False: flushed now, not by the kernel while timing
    reps = f", median of {sizes.repeats}" if sizes.repeats > 1 else ""
    score_jobs(store, jobs, n_boot=0, allow_partial=True)  # the answer columns are kept
    t_score, scored = median_time(
        lambda: score_jobs(store, jobs, n_boot=0, allow_partial=True), sizes.repeats
    )
    t_cold, first = timed(lambda: compare_jobs(store, jobs, contrasts=CHAIN, n_boot=sizes.n_boot))
    t_warm, warm = median_time(
        lambda: compare_jobs(store, jobs, contrasts=CHAIN, n_boot=sizes.n_boot), sizes.repeats
    )
    if warm.comparison != first.comparison:
        raise RuntimeError("a second compare gave another comparison")
    t_plain, _ = median_time(
        lambda: compare_jobs(store, jobs, contrasts=CHAIN, n_boot=0), sizes.repeats
    )
    t_verify, again = timed(
        lambda: derive_comparison(store, jobs, contrasts=CHAIN, n_boot=sizes.n_boot, cached=False)
    )
    if again.rows != warm.record.rows:
        raise RuntimeError("the re-derivation from the atoms gave other rows")
    rows = warm.record.rows
    _check(rows, scored.record.rows)
    patients = rows[0].patients
    store.close()
    what = f"{n_rows:,} rows ({len(jobs)} jobs)"
    scorer = f"score_jobs(n_boot=0){reps}"
    return [
        Row(
            f"compare: {what}, {sizes.n_boot:,} resamples",
            t_warm,
            "s",
            t_score,
            scorer,
            max_ratio=3,
            note=f"{len(rows)} contrasts of {patients:,} patients x {rows[0].reps_a} reps, "
            f"every arm paired (evidence ids kept){reps}",
        ),
        Row(
            f"compare: {what}, no intervals",
            t_plain,
            "s",
            t_score,
            scorer,
            note="n_boot=0: reading, pairing and per-patient sums alone",
        ),
        Row(
            f"compare: {what}, no evidence ids kept yet",
            t_cold,
            "s",
            t_score,
            scorer,
            note=f"also reads {ARMS * 4 * patients:,} atoms' evidence ids and keeps them",
        ),
        Row(
            f"compare: {what}, as audit verify re-derives it",
            t_verify,
            "s",
            t_score,
            scorer,
            note="every atom read, nothing kept; rows checked equal to the compare's",
        ),
    ]


def _command(argv: Sequence[str]) -> str:
    return shlex.join([os.path.basename(sys.executable), "-m", "benchmarks_perf", "compare", *argv])


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf compare")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--jobs", type=int, help="jobs (default 100; a multiple of 5 arms)")
    parser.add_argument("--rows-per-job", type=int, help="rows a job (default 100,000)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.jobs or args.rows_per_job:
        sizes = Sizes(
            score_jobs=args.jobs or sizes.score_jobs,
            rows_per_job=args.rows_per_job or sizes.rows_per_job,
            python_jobs=0,
            repeats=sizes.repeats,
            n_boot=sizes.n_boot,
        )
    print(f"$ {_command(argv)}")
    print(
        f"machine: nproc={os.cpu_count()}, load {os.getloadavg()[0]:.1f}, "
        f"python {platform.python_version()}, numpy {np.__version__}, {platform.platform()}"
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="medomni-compare-", dir="/tmp") as d:
        rows = bench_compare(Path(d), sizes)
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0
