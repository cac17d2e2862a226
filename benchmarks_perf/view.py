"""``python -m benchmarks_perf view [--quick]``: the viewer's pages over a 100,000-run job.

One job of 100,000 runs (each run linking a stand-in atom, an answer blob and a prediction
record), scored into a result, in an ``lmdb://`` store; the viewer (`medomni_cas.view`)
served by uvicorn on loopback, asked over HTTP as a browser would. Each figure is the
median of 20 requests:

* the run list: a page of 50 runs from the middle of the job (the issue's target: under
  200 ms), and its first and last pages;
* the result's page, its provenance tree, the jobs list and the overview (each well under
  a second, the issue's bound for every page);

against, in the same run, the server's floor (``/health``, which reads nothing) and what a
run list that loads every run costs (the job record decoded whole and its 100,000 runs
read: what `medomni audit show --runs` reads).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import medomni_cas as mc
from benchmarks_perf._records import BenchAtom
from benchmarks_perf._table import Row, render
from benchmarks_perf._timing import median_time
from medomni_cas.bench.records import (
    AgentBlock,
    AgentConfig,
    JobRecord,
    Limits,
    PredictionRecord,
    Result,
    RunRecord,
    ScoreRow,
    slot_ids,
)
from medomni_cas.bench.refnames import JOB_REFS, result_ref
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.ids import ObjectId
from medomni_cas.view import make_app, serving

REQUESTS = 20
PAGE_MS = 200.0  # the target for the run list
ANY_PAGE_MS = 1000.0  # "every page loads in well under a second"


def build(path: Path, runs: int) -> tuple[mc.Store, ObjectId, ObjectId]:
    """A store with one job of ``runs`` runs and a result scoring it."""
    store = mc.Store(LMDBBackend(path, durable=False))
    agent = store.put(
        AgentConfig(
            name="bench-agent",
            kind="agent",
            agent="baseline",
            model="medomni-llm-7b",
            route="local",
            scaffold="process",
            served_model="medomni-llm-7b",
            limits=Limits(time_sec=600, tokens=200_000),
        )
    )
    standin = [store.put_object("bench.standin", 1, {"what": w}) for w in ("set", "build", "cfg")]
    task_set, set_build, config = standin
    pairs = [f"synth-ehr_ckd-staging-{i % 4}" for i in range(runs)]
    atoms = store.put_many(BenchAtom(pair=pairs[i], arm="text", index=i) for i in range(runs))
    slots = slot_ids(atoms, agent, "text", 1)
    blobs = [blob_object(f'{{"ckd_stage": "G{i % 5 + 1}"}}\n'.encode()) for i in range(runs)]
    store.backend.put_many(blobs)
    answers = [oid for oid, _ in blobs]
    preds = store.put_many(
        PredictionRecord(
            run_id=f"{s.hex()}-1", atom=a, target="ckd_stage", value="G2", intelligence="agent"
        )
        for s, a in zip(slots, atoms, strict=True)
    )
    run_ids = store.put_many(
        RunRecord(
            run_id=f"{slots[i].hex()}-1",
            slot=slots[i].hex(),
            attempt=1,
            intelligence="agent",
            agent_config=agent,
            task_set=task_set,
            atom=atoms[i],
            pair=pairs[i],
            task_version="1.0",
            config=config,
            repetition=1,
            runner="process",
            outcome="answered",
            served_model="medomni-llm-7b",
            cost_usd=0.0125,
            tokens_in=1800 + i % 700,
            tokens_out=120 + i % 50,
            started="2026-12-01T10:00:00.000+00:00",
            finished="2026-12-01T10:00:41.250+00:00",
            elapsed_ms=41_250,
            agent_block=AgentBlock(arm="text", encoders="none"),
            answer=answers[i],
            predictions=(preds[i],),
        )
        for i in range(runs)
    )
    job = store.put(
        JobRecord(
            name="bench--text--r1",
            task_set=task_set,
            set_build=set_build,
            agent_config=agent,
            arm="text",
            repetition=1,
            runner="process",
            runs=tuple(run_ids),
            attempts=runs,
            predictions=store.put_object("bench.standin", 1, {"what": "predictions"}),
            started="2026-12-01T10:00:00.000+00:00",
        )
    )
    store.refs.set(f"{JOB_REFS}bench", job)
    result = store.put(
        Result(
            task_set=task_set,
            set_build=set_build,
            jobs=(job,),
            answer_keys=(store.put_object("bench.standin", 1, {"what": "answer key"}),),
            scorer="medomni-scorer",
            scorer_version="1.1.0",
            n_boot=0,
            seed=0,
            rows=tuple(
                ScoreRow(
                    agent="bench-agent",
                    arm="text",
                    pair=f"synth-ehr_ckd-staging-{p}",
                    target="ckd_stage",
                    metric="accuracy",
                    value=0.5,
                    n=runs // 4,
                    config=config.hex(),
                )
                for p in range(4)
            ),
            table=store.put_blob(b"rows as parquet (a stand-in)"),
        )
    )
    store.refs.set(result_ref("bench/set"), result)
    return store, job, result


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=120) as r:
        return len(r.read())


def _median_ms(url: str, n: int) -> float:
    _get(url)  # warm: the first request pays for imports and caches
    times = []
    for _ in range(n):
        t = time.perf_counter()
        _get(url)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def run(tmp: Path, runs: int) -> list[Row]:
    t = time.perf_counter()
    store, job, result = build(tmp / "store", runs)
    print(f"built {runs:,} runs in {time.perf_counter() - t:.1f} s")

    def load_all() -> int:
        full = store.get(job, JobRecord)
        return sum(1 for _ in store.get_many(full.runs, RunRecord))

    every, _ = median_time(load_all, 3)
    every_ms = every * 1000
    rows: list[Row] = []
    with serving(make_app(store)) as url:
        floor = _median_ms(url + "health", REQUESTS)
        middle = runs // 2
        pages = [
            (f"run list: 50 runs at {middle:,} of {runs:,}", f"job/{job.hex()}?offset={middle}"),
            ("run list: first page", f"job/{job.hex()}"),
            ("run list: last page", f"job/{job.hex()}?offset={runs - 50}"),
        ]
        for i, (name, path) in enumerate(pages):
            ms = _median_ms(url + path, REQUESTS)
            rows.append(
                Row(
                    name,
                    ms,
                    "ms",
                    baseline=every_ms,
                    baseline_name=f"every run read ({runs:,})",
                    max_value=PAGE_MS,
                    note="median of 20" if i == 0 else "",
                )
            )
        rows.append(Row("server floor: /health", floor, "ms", note="median of 20"))
        for name, path in [
            ("result page", f"result/{result.hex()}"),
            ("provenance of the result", f"provenance/{result.hex()}"),
            ("jobs list", "jobs"),
            ("overview", ""),
        ]:
            ms = _median_ms(url + path, REQUESTS)
            rows.append(Row(name, ms, "ms", max_value=ANY_PAGE_MS, note="median of 20"))
    store.close()
    return rows


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks_perf view")
    p.add_argument("--quick", action="store_true", help="10,000 runs instead of 100,000")
    args = p.parse_args(list(argv))
    runs = 10_000 if args.quick else 100_000
    print(f"{platform.node()} {platform.machine()}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        rows = run(Path(tmp), runs)
    print(render(rows))
    return 0 if all(r.verdict != "MISS" for r in rows) else 1
