"""``python -m benchmarks_perf harbor [--quick]``: the Harbor runner's cost, against Harbor's own.

A set of two pairs (the example's CKD-staging and HbA1c templates on a cohort of 20 patients
each; ``--quick``: 5) runs with the baseline agent on the no-perception arm through
``run_set(..., runner="harbor")`` in a Docker engine (``$DOCKER_HOST`` if one answers, else a
private one started and stopped here, as the tests do). It reports:

1. the time of one trial split into our part (rendering the task folder, turning Harbor's
   ``TrialResult`` into a trial, recording it as objects) and Harbor + Docker's part (the Harbor
   job's wall time), at 1 trial at a time, so the parts add up; target: ours < 5%;
2. trials/s at 1, 2 and 4 concurrent trials (a fresh store each, the same set), and once with
   the perception sidecar (arm encoders-required) at 2;
3. stored bytes per trial (every object a run added to the store: run and prediction records,
   answer, logs, job record and table) against the bytes of Harbor's own job folder for the
   same trials; target: ours smaller.

``--relay`` measures only the perception arm against the no-perception arm at 2 concurrent
trials (issue 17: target >= 0.9x), alternating the two arms over ``--rounds`` rounds (default
2) so that a change in the machine's load falls on both alike; each row sums its rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

import medomni_cas as mc
from benchmarks_perf._table import Row, render
from examples import synth

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SET = "medomni-bench/perf"
PAIRS = ["synth-ehr_ckd-staging", "synth-ehr_hba1c-next"]


def _tree(root: Path, n: int) -> None:
    shutil.copytree(EXAMPLES / "studio", root / "studio", ignore=shutil.ignore_patterns("data"))
    shutil.copytree(EXAMPLES / "bench", root / "bench")
    for task in PAIRS:
        cohorts = root / "studio/datasets/synth-ehr/tasks" / task / "cohorts"
        doc = yaml.safe_load((cohorts / "n20.yaml").read_text())
        doc.pop("per_class", None)
        doc.update(n=n, description=f"{n} patients, for benchmarks_perf harbor.")
        (cohorts / f"nperf{n}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    perf = {
        "description": "Two pairs, for benchmarks_perf harbor.",
        "builder": "medomni-v1",
        "arms": ["no-perception", "encoders-required"],
        "pairs": [{"task": f"{t}@nperf{n}", "n": 1} for t in PAIRS],
    }
    sets = root / "bench/benchmarks/medomni-bench/sets"
    (sets / "perf.yaml").write_text(yaml.safe_dump(perf, sort_keys=False))
    synth.generate(root / "studio/datasets/synth-ehr/data", patients=200, seed=0)


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _one(root: Path, host: str, tag: str, arm: str, concurrency: int) -> dict[str, Any]:
    """Run the set's ``arm`` once into a fresh store; what it cost."""
    from medomni_harbor.runner import HarborRunner

    from medomni_cas.bench import harness
    from medomni_cas.bench.agents import find_agent
    from medomni_cas.studio.tasksets import build_set

    store = mc.open(f"lmdb://{root / f'store-{tag}'}")
    build_set(store, SET, studio=root / "studio", bench=root / "bench")
    before = set(store.iter_ids())
    recording = [0.0]
    original = harness.record_trial

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            recording[0] += time.perf_counter() - t0

    runner = HarborRunner(docker_host=host, concurrency=concurrency)
    harness.record_trial = timed  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        report = harness.run_set(
            store,
            SET,
            find_agent(root / "bench", "baseline"),
            runs_dir=root / f"runs-{tag}",
            studio=root / "studio",
            runner=runner,
            arms=[arm],
        )
        wall = time.perf_counter() - t0
    finally:
        harness.record_trial = original  # type: ignore[assignment]
    added = [oid for oid in store.iter_ids() if oid not in before]
    stored = sum(len(data) for _, data in store.get_raw_many(added))
    store.close()
    (job,) = report.jobs
    outcomes = job.ran - job.infra_errors
    return {
        "trials": job.ran,
        "ok": outcomes,
        "wall": wall,
        "render": runner.timings["render"],
        "collect": runner.timings["collect"],
        "record": recording[0],
        "harbor": runner.timings["harbor"],
        "stored": stored,
        "harbor_bytes": _du(job.folder / "harbor" / "jobs"),
    }


def run(tmp: Path, n: int, host: str) -> list[Row]:
    from medomni_harbor import images

    _tree(tmp, n)
    images.ensure_relay_image(host)
    serial = _one(tmp, host, "c1", "no-perception", 1)
    trials = serial["trials"]
    ours = (serial["render"] + serial["collect"] + serial["record"]) / trials
    theirs = serial["harbor"] / trials
    rows = [
        Row(
            "per trial: ours (render + collect + record)",
            ours * 1000,
            "ms",
            baseline=theirs * 1000,
            baseline_name="Harbor + Docker",
            max_ratio=0.05,
            note=(
                f"render {serial['render'] / trials * 1000:.0f} ms, collect "
                f"{serial['collect'] / trials * 1000:.0f} ms, record "
                f"{serial['record'] / trials * 1000:.0f} ms; 1 trial at a time, {trials} trials"
            ),
        )
    ]
    runs = {1: serial}
    for c in (2, 4):
        runs[c] = _one(tmp, host, f"c{c}", "no-perception", c)
    for c, r in runs.items():
        rows.append(
            Row(
                f"trials/s, {c} concurrent (no-perception)",
                r["trials"] / r["wall"],
                "trials/s",
                baseline=runs[1]["trials"] / runs[1]["wall"] if c > 1 else None,
                baseline_name="1 concurrent",
                note=f"{r['trials']} trials in {r['wall']:.1f} s, {r['ok']} without infra error",
            )
        )
    side = _one(tmp, host, "p2", "encoders-required", 2)
    rows.append(
        Row(
            "trials/s, 2 concurrent (perception relay)",
            side["trials"] / side["wall"],
            "trials/s",
            baseline=runs[2]["trials"] / runs[2]["wall"],
            baseline_name="no perception",
            target=0.9,
            note=f"{side['trials']} trials in {side['wall']:.1f} s: one relay container a trial",
        )
    )
    for label, r in (("no-perception", serial), ("perception", side)):
        rows.append(
            Row(
                f"stored bytes per trial ({label})",
                r["stored"] / r["trials"] / 1000,
                "kB",
                baseline=r["harbor_bytes"] / r["trials"] / 1000,
                baseline_name="Harbor's job folder",
                max_ratio=1.0,
                note="run + predictions + answer + logs + job record, as objects",
            )
        )
    return rows


def relay_rows(tmp: Path, n: int, host: str, rounds: int) -> list[Row]:
    """The perception arm (job gateway, one relay a trial) against no perception, at 2
    concurrent trials, the arms alternated round by round."""
    from medomni_harbor import images

    _tree(tmp, n)
    images.ensure_relay_image(host)
    total = {"no-perception": [0, 0.0, 0], "encoders-required": [0, 0.0, 0]}
    for i in range(rounds):
        for arm in ("no-perception", "encoders-required"):
            r = _one(tmp, host, f"{arm}-{i}", arm, 2)
            t = total[arm]
            t[0] += r["trials"]
            t[1] += r["wall"]
            t[2] += r["ok"]
    (n0, w0, ok0), (n1, w1, ok1) = total["no-perception"], total["encoders-required"]
    return [
        Row(
            "trials/s, 2 concurrent (no perception)",
            n0 / w0,
            "trials/s",
            note=f"{n0} trials in {w0:.1f} s over {rounds} rounds, {ok0} without infra error",
        ),
        Row(
            "trials/s, 2 concurrent (perception relay)",
            n1 / w1,
            "trials/s",
            baseline=n0 / w0,
            baseline_name="no perception",
            target=0.9,
            note=f"{n1} trials in {w1:.1f} s over {rounds} rounds, {ok1} without infra error",
        ),
    ]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf harbor")
    parser.add_argument("--quick", action="store_true", help="5 patients per pair")
    parser.add_argument("--relay", action="store_true", help="perception vs none at 2 only")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --relay")
    args = parser.parse_args(argv)
    n = 5 if args.quick else 20
    shown = " --quick" if args.quick else ""
    shown += f" --relay --rounds {args.rounds}" if args.relay else ""
    print("$ python -m benchmarks_perf harbor" + shown)
    print(
        f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
        f"{platform.platform()}"
    )
    from tests import docker_engine

    start = time.perf_counter()
    engine = docker_engine.acquire("perf")
    try:
        with tempfile.TemporaryDirectory(prefix="medomni-harbor-bench-", dir="/tmp") as d:
            if args.relay:
                rows = relay_rows(Path(d), n, engine.host, args.rounds)
            else:
                rows = run(Path(d), n, engine.host)
    finally:
        engine.close()
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0
