"""``python -m benchmarks_perf studio [--quick]``: Build at scale, against the naive layout.

One run builds the example CKD template on a cohort of 10,000 generated patients (``--quick``:
500) under the three encoder arms and the six ladder rungs (the cohort is made the ladder
cohort), into a fresh ``lmdb://`` store, and reports:

1. atom renders/s: atom tasks rendered / the time spent rendering them (the cohort selection
   and evidence writing, done once for all arms, is timed on its own row);
2. stored bytes (every object's canonical bytes, trees, records and answers included) against
   the unique content bytes (the payload of every distinct file an atom task holds: evidence
   files and instructions);
3. the naive layout: the same atom tasks as plain per-arm task folders (``instruction.md``,
   the staged evidence files, ``task.json``), counted as apparent bytes, no block rounding;
4. a rebuild with nothing changed against the first build.
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

import msgspec

import medomni_cas as mc
from benchmarks_perf._table import Row, render
from examples import synth
from medomni_cas.store import encoding, trees
from medomni_cas.studio.build import build_pair
from medomni_cas.studio.records import AtomTask, BuildResult, FormatCheck

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TEMPLATE = "synth-ehr_ckd-staging"
COHORT = "nbench"


def _studio(tmp: Path, n: int) -> Path:
    studio = tmp / "studio"
    shutil.copytree(EXAMPLES / "studio", studio, ignore=shutil.ignore_patterns("data"))
    folder = studio / "datasets/synth-ehr/tasks" / TEMPLATE
    base = (folder / "cohorts/n50.yaml").read_text().splitlines()
    lines, skip = [], False
    for line in base:
        if line.startswith("per_class:"):
            skip = True  # every eligible patient, in the seeded order: no per-class counts
            continue
        if skip and line.startswith(" "):
            continue
        skip = False
        lines.append(f"n: {n}" if line.startswith("n:") else line)
    (folder / "cohorts" / f"{COHORT}.yaml").write_text("\n".join(lines) + "\n")
    ladder = folder / "arms/modality-ladder.yaml"
    ladder.write_text(ladder.read_text().replace("cohort: n20", f"cohort: {COHORT}"))
    return studio


def _stored_bytes(store: mc.Store) -> tuple[int, int]:
    ids = list(store.iter_ids())
    total = sum(len(data) for _, data in store.get_raw_many(ids))
    return total, len(ids)


def _layouts(store: mc.Store, results: list[mc.ObjectId]) -> tuple[int, int, int]:
    """(unique content bytes, naive layout bytes, atoms) over every atom of ``results``."""
    unique: dict[mc.ObjectId, int] = {}
    naive = atoms = 0
    sizes: dict[mc.ObjectId, int] = {}
    enc = msgspec.json.Encoder()
    for rid in results:
        result = store.get(rid, BuildResult)
        for _, atom in store.get_many(result.atoms, AtomTask):
            atoms += 1
            if atom.instruction not in sizes:
                sizes[atom.instruction] = len(store.read_blob(atom.instruction))
            unique[atom.instruction] = sizes[atom.instruction]
            naive += sizes[atom.instruction]
            for _name, oid, _kind in trees.iter_tree(store, atom.evidence):
                if oid not in sizes:
                    sizes[oid] = len(encoding.blob_data(store.get_raw(oid)))
                unique[oid] = sizes[oid]
                naive += sizes[oid]
            check = store.get(atom.format_check, FormatCheck)
            task = {
                "pair": atom.pair,
                "version": atom.version,
                "patient": atom.patient,
                "prediction_time": atom.prediction_time,
                "arm": atom.arm,
                "arm_variant": atom.arm_variant,
                "environment": msgspec.to_builtins(atom.environment),
                "submission_path": atom.submission_path,
                "format_check": msgspec.to_builtins(check.targets),
            }
            naive += len(enc.encode(task))
    return sum(unique.values()), naive, atoms


def run(tmp: Path, patients: int, cohort: int) -> list[Row]:
    data = tmp / "data-root"
    synth.generate(data / "data", patients=patients, seed=0)
    studio = _studio(tmp, cohort)
    store = mc.open(f"lmdb://{tmp / 'store'}")
    marks: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    built = build_pair(
        store,
        studio,
        TEMPLATE,
        COHORT,
        data_root=data,
        progress=lambda msg: marks.append((time.perf_counter(), msg)),
    )
    first = time.perf_counter() - t0
    end = time.perf_counter()
    render_s = content_s = 0.0
    for (t, msg), nxt in zip(marks, [*(m[0] for m in marks[1:]), end], strict=True):
        if "rendering" in msg:
            render_s += nxt - t
        else:
            content_s += nxt - t
    t1 = time.perf_counter()
    again = build_pair(store, studio, TEMPLATE, COHORT, data_root=data)
    rebuild = time.perf_counter() - t1
    assert all(b.cached for b in again)
    stored, objects = _stored_bytes(store)
    unique, naive, atoms = _layouts(store, [b.result for b in built])
    store.close()
    arms = len(built)
    note = f"{cohort:,} patients x {arms} renders (3 arms + 6 rungs)"
    return [
        Row(
            "build: atom renders",
            atoms / render_s,
            "renders/s",
            baseline=2000,
            baseline_name="the spec's floor",
            target=1.0,
            note=note,
        ),
        Row(
            "build: cohort + evidence (once for all arms)",
            content_s,
            "s",
            note=f"{cohort:,} patients' evidence files written as blobs and trees",
        ),
        Row(
            "stored bytes vs unique content",
            stored / 1e6,
            "MB",
            baseline=unique / 1e6,
            baseline_name="unique content",
            max_ratio=1.1,
            note=f"{objects:,} objects: blobs, trees, atoms, configs, content, answer key",
        ),
        Row(
            "naive per-arm task folders vs stored",
            naive / 1e6,
            "MB",
            baseline=stored / 1e6,
            baseline_name="stored",
            target=5.0,
            note=f"{atoms:,} folders: instruction.md + staged evidence + task.json",
        ),
        Row(
            "rebuild, nothing changed",
            rebuild,
            "s",
            baseline=first,
            baseline_name="first build",
            max_ratio=0.1,
            note="target: >= 10x faster",
        ),
    ]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf studio")
    parser.add_argument("--quick", action="store_true", help="500 patients, for a smoke test")
    args = parser.parse_args(argv)
    patients, cohort = (700, 500) if args.quick else (12_000, 10_000)
    print("$ python -m benchmarks_perf studio" + (" --quick" if args.quick else ""))
    print(
        f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
        f"{platform.platform()}"
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="medomni-studio-bench-", dir="/tmp") as d:
        rows = run(Path(d), patients, cohort)
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0
