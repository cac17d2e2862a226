"""``python -m benchmarks_perf scale [--quick]``: how time and memory grow with the work.

Each operation runs at 1x, 4x and 16x the work, in a fresh process of its own
(`benchmarks_perf.scale_ops`) on stores built beforehand (building is not timed):

* build: `build_pair` of the example CKD template (3 arms + 6 ladder rungs) on a cohort of
  N patients, into a fresh store;
* resume: `harness.resume` of every job's slots (2 arms x 2 repetitions), their runs recorded
  in chunk tables, as the harness records them;
* score: `score_jobs` (``n_boot=0``, answer columns already kept) over N rows;
* verify: `verify_result` of the result over those runs (``--jobs 1``), N objects;
* fsck: `fsck` of the whole store (``-j 1``), N objects, a tenth unreachable;
* push / pull: the result's ref and its closure, ``lmdb://`` to a fresh ``lmdb://``;
* gc: `gc` (``grace=0``) of the same store, a tenth of its objects unreachable (swept).

Reported per operation: seconds (the fastest run's) and peak RSS at each size; the slope of
time against work on log-log (1.0 is linear; the target is <= 1.05, i.e. 16x the work in
<= 1.15 x 16x the time), the median of each round's (`rounds`), and the slope of the
fastest runs beside it; and peak RSS at 16x over peak RSS at 1x (target <= 2x for fsck,
gc, verify and push). Peak RSS is the child's ``VmHWM`` (anonymous and mapped pages: LMDB's map
counts where its pages were read); "anon" is the peak of its anonymous pages alone
(``RssAnon``, sampled every 10 ms from outside), what the process itself holds.

``--only OP`` (repeatable) runs some operations; ``--factors 1,4,16`` other sizes;
``--size F`` makes 1x a fraction F of the full run's (a loaded machine);
``--repeat N`` runs N rounds (and keeps the largest peak RSS): on a shared machine one run
of a second at 1x may take half as long again as the next, which moves a slope by more
than the target's margin. Every size's stores are built first; in each round every
operation runs at its sizes there and back (1x, 4x, 16x, 4x, 1x), so that the speed's
drift over the minutes of a round weighs on the small sizes as on the large one, and the
round's slope compares like with like; the slope reported is the median of the rounds'.
The fastest runs' slope is printed beside it: it compares a run of a second's best spell
with a run of a minute's, which cannot have one as short. For the length of each run the
parent holds the store's files in the page cache, mapped and locked (`benchmarks_perf._resident`):
a machine that pages out what sits idle, as this one does, would otherwise take back, during
a run of a minute, pages a warm read brought in, and the run would read them again from the
disk (about 2 ms a page here), a cost of the machine's that falls on the large sizes; where
locking is refused the files are read once before the run instead, and the report says so;
``--baseline`` also runs verify and fsck with the spill bound lifted (every set and level
of the walk in memory, `medomni_cas.store._spill`), the time ratio printed below the table,
as "raw reads", the reads resume and verify make (the same keys in the same order,
objects hashed) by py-lmdb alone: what the medium costs at each size, the ratio below;
and, as "pages kept", verify, push and pull with the mapped-page budget lifted (every LMDB
page read stays mapped, `medomni_cas.store._mapped`): what bounding their RSS costs, the
ratio below (resume keeps its pages: it has no RSS target); "raw reads, pages dropped" are
verify's raw reads under the same budget as verify: the medium's cost under that bound.
``--quick`` (the tests): tiny stores at 1x and 2x, to show that every operation runs.

Below the table, each row's most major page faults in one run at each size: pages read
from the disk during the run (with the store's files locked, the ones a run writes and
reads back: a push's spool, a fresh destination). They cost a larger store's run more, and
are the machine's doing, not the code's: a slope with many of them at 16x and few at 1x is
steeper than the code's growth. Then the slope of each row's time on the CPU (user and
system, the rounds' median, as the slope's): the wall time less what the run waited for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lmdb

import medomni_cas as mc
from benchmarks_perf._resident import Resident
from benchmarks_perf.scale_ops import OPS, run_child
from medomni_cas.store.backends.lmdb import LMDBBackend

if TYPE_CHECKING:
    from benchmarks_perf.bench import Runs

# The stores' builders (numpy, pyarrow, the studio) are imported where used: a child that
# runs one operation imports only what that operation needs, so its memory is the op's.

ROOT = Path(__file__).resolve().parent.parent
REF = "scale/result"
MiB = 1 << 20
#: operations whose peak RSS at 16x must stay within 2x of that at 1x
BOUNDED = ("verify", "fsck", "gc", "push")
MAX_SLOPE = 1.05
MAX_RSS_RATIO = 2.0
#: the environment of a baseline run: the spill bound lifted, every set and level in memory
IN_MEMORY = {"MEDOMNI_SPILL_IDS": str(1 << 40)}
#: the environment of a baseline run: every LMDB page read stays mapped (no page dropped, so
#: none faulted in again; the RSS grows with the store)
PAGES_KEPT = {"MEDOMNI_MAPPED_BYTES": str(1 << 40)}


@dataclass(frozen=True)
class Sizes:
    atoms_per_arm: int  # 1x: 2 arms x 2 repetitions x this many slots (about 4.2 objects each)
    score_jobs: int  # 1x: this many jobs of rows_per_job rows
    rows_per_job: int
    patients: int  # 1x: the cohort built


FULL = Sizes(atoms_per_arm=1_250, score_jobs=10, rows_per_job=100_000, patients=120)
QUICK = Sizes(atoms_per_arm=50, score_jobs=1, rows_per_job=1_000, patients=5)
QUICK_FACTORS = "1,2"


@dataclass
class Measure:
    work: int
    seconds: float  # the fastest run's
    maxrss: float  # MiB
    anon: float  # MiB, sampled
    rounds: list[float] = field(default_factory=list)  # each round's seconds (`rounds`)
    majflt: int = 0  # the most major page faults of a run (pages read from the disk)
    cpu: list[float] = field(default_factory=list)  # each round's CPU seconds (user + system)
    unlocked: str | None = None  # why a run's files were not locked in memory (None: all were)


def _status(pid: int) -> dict[str, int]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+):\s+(\d+) kB", text, re.M)}


@dataclass
class Trial:
    """One operation (a row of the table) at one size: the child's ``op`` on ``spec``, with
    ``env``; ``want`` what it must report; ``before`` and ``after`` what readies the work
    before each run and puts back after it what the run changed (a fresh destination; the
    litter gc swept, which the other operations count); ``warm`` the folders held in the page
    cache for the length of each run (`Resident`: the store's pages, wherever the last round
    left them)."""

    row: str
    f: int
    op: str
    spec: dict[str, Any]
    work: int
    want: dict[str, int]
    env: dict[str, str] | None = None
    before: Callable[[], None] | None = None
    after: Callable[[], None] | None = None
    warm: tuple[Path, ...] = ()
    runs: list[dict[str, Any]] = field(default_factory=list)

    def measure(self) -> Measure:
        """The fastest run's seconds and the largest peaks (RSS and anonymous) of them all:
        the fastest of a few is the figure a shared machine's noise disturbs least (it only
        ever adds time)."""

        def each_round(key: str) -> list[float]:
            # a round's runs of one size (there and back): their geometric mean
            by_round: dict[int, list[float]] = {}
            for r in self.runs:
                by_round.setdefault(r.get("round", 0), []).append(max(r.get(key, 0.0), 1e-6))
            means = (statistics.fmean(map(math.log, t)) for _, t in sorted(by_round.items()))
            return [math.exp(m) for m in means]

        return Measure(
            self.work,
            min(r["seconds"] for r in self.runs),
            max(r["maxrss_kib"] for r in self.runs) / 1024,
            max(r["anon_kib"] for r in self.runs) / 1024,
            each_round("seconds"),
            max(r.get("majflt", 0) for r in self.runs),
            each_round("cpu") if all("cpu" in r for r in self.runs) else [],
            next((r["unlocked"] for r in self.runs if r.get("unlocked")), None),
        )


def rounds(trials: list[Trial], tmp: Path, repeat: int) -> None:
    """Run ``repeat`` rounds; in each, every row's sizes there and back (1x, 4x, 16x, 4x,
    1x), one row after the other.

    Rounds, not a trial's runs back to back: this machine's speed drifts by more than the
    slope's margin over minutes (a push of 360k objects took 15.6-19.7 s, then 12.7-14.8 s
    a few minutes later), and a row's slope compares its sizes. There and back: the
    smaller sizes run just before and just after the largest, so a drift in the speed over
    the round weighs on both sides of the comparison (each size's runs of the round are
    averaged, geometrically), and each round gives a slope of its own (`render`)."""
    rows: dict[str, list[Trial]] = {}
    for t in trials:
        rows.setdefault(t.row, []).append(t)
    for r in range(repeat):
        if repeat > 1:
            print(f"  round {r + 1} of {repeat}", flush=True)
        for row in rows.values():
            for t in [*row, *row[-2::-1]]:
                if t.before is not None:
                    t.before()
                with Resident(t.warm) as held:
                    got = _run_once(t.op, t.spec, tmp, t.env, label=f"{t.row} {t.f}x")
                got["unlocked"] = held.why
                if t.after is not None:
                    t.after()
                _expect(t.row, got, **t.want)
                got["round"] = r
                t.runs.append(got)


def _run_once(
    op: str, spec: dict[str, Any], tmp: Path, env: dict[str, str] | None, *, label: str
) -> Any:
    path = tmp / f"spec-{op}.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks_perf", "scale", "--child", op, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    anon = 0
    while proc.poll() is None:
        anon = max(anon, _status(proc.pid).get("RssAnon", 0))
        time.sleep(0.01)
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"scale {op} failed ({proc.returncode}):\n{err}")
    got = json.loads(out.strip().splitlines()[-1])
    got["anon_kib"] = anon
    path.unlink()
    # each figure as it comes: a run cut short still tells what it measured
    print(f"    {label}: {got}", flush=True)
    return got


def _expect(op: str, got: dict[str, Any], **want: int) -> None:
    for k, v in want.items():
        if got.get(k) != v:
            raise RuntimeError(f"scale {op}: {k} is {got.get(k)}, expected {v}: {got}")


# -- the stores ---------------------------------------------------------------------------------
def runs_trials(tmp: Path, sizes: Sizes, f: int, only: set[str], baseline: bool) -> list[Trial]:
    """resume, verify, fsck, push, pull and gc at ``f`` times the work, on one store built
    here (and the baselines asked for)."""
    from benchmarks_perf import bench
    from medomni_cas.store.blobs import blob_object

    path = tmp / f"runs-{f}"
    runs = bench.build_runs(
        path,
        bench.Sizes(
            arms=2,
            reps=2,
            atoms_per_arm=sizes.atoms_per_arm * f,
            score_jobs=0,
            rows_per_job=0,
            python_jobs=0,
            repeats=1,
        ),
        chunks=True,  # as the harness records runs now
    )
    store = runs.store
    store.refs.set(REF, runs.result)
    # the result's closure, counted before anything is timed: the store also holds what the
    # harness's refs reach and the result does not (its jobs' slot tables), so it is not
    # the total less the litter
    closure = sum(1 for _ in store.walk([runs.result]))
    # a tenth of the objects unreachable (gc sweeps them, fsck checks them)
    garbage = runs.objects // 9

    def litter(store: mc.Store) -> None:
        for i in range(0, garbage, 10_000):
            store.backend.put_many(
                [
                    blob_object(f"unreachable {j}: a run's log that no record names".encode())
                    for j in range(i, min(garbage, i + 10_000))
                ]
            )

    litter(store)
    written = time.time()
    total = sum(1 for _ in store.backend.iter_keys())
    slots = 4 * sizes.atoms_per_arm * f
    spec: dict[str, Any] = {
        "store": str(path),
        "result": runs.result.hex(),
        "ref": REF,
        "modules": ["benchmarks_perf._records"],
        "agent": runs.agent.hex(),
        "jobs": [([a.hex() for a in atoms], arm, rep) for atoms, arm, rep in runs.jobs],
    }
    raw: dict[str, dict[str, Any]] = {}
    if baseline:  # the reads resume and verify make, in their order, for py-lmdb alone
        if "resume" in only:
            raw["resume"] = _resume_reads(store, runs, tmp / f"raw-resume-{f}")
        if "verify" in only:
            raw["verify"] = _walk_reads(store, runs.result, tmp / f"raw-verify-{f}")
    store.close()
    os.sync()  # written with durable=False: flushed now, not by the kernel while timing
    print(f"  {f}x: {slots:,} slots, {total:,} objects ({garbage:,} unreachable)", flush=True)
    warm = (path,)
    out: list[Trial] = []

    def trial(row: str, op: str, work: int, want: dict[str, int], **kw: Any) -> None:
        out.append(Trial(row, f, op, kw.pop("spec", spec), work, want, warm=warm, **kw))

    if "resume" in only:
        trial("resume", "resume", slots, {"slots": slots})
        if baseline:
            out.append(_raw_reads("resume, raw reads", f, raw["resume"], spec, slots))
    verified = {"problems": 0, "objects": closure}
    if "verify" in only:
        trial("verify", "verify", closure, verified)
        if baseline:
            trial("verify, in memory", "verify", closure, verified, env=IN_MEMORY)
            out.append(_raw_reads("verify, raw reads", f, raw["verify"], spec, closure))
            out.append(
                _raw_reads(
                    "verify, raw reads, pages dropped",
                    f,
                    raw["verify"],
                    spec,
                    closure,
                    dropped=True,
                )
            )
            trial("verify, pages kept", "verify", closure, verified, env=PAGES_KEPT)
    checked = {"objects": total, "problems": 0, "history": 0}
    if "fsck" in only:
        trial("fsck", "fsck", total, checked)
        if baseline:
            trial("fsck, in memory", "fsck", total, checked, env=IN_MEMORY)
    for op in ("push", "pull"):
        if op in only:
            other = tmp / f"{op}-{f}"

            def fresh(other: Path = other) -> None:  # a fresh destination each time
                shutil.rmtree(other, ignore_errors=True)

            sent = {"objects": closure}
            to = {**spec, "other": str(other)}
            trial(op, op, closure, sent, spec=to, before=fresh)
            if baseline:
                trial(f"{op}, pages kept", op, closure, sent, spec=to, before=fresh, env=PAGES_KEPT)
    if "gc" in only:
        littered = [written]

        def old_enough() -> None:  # the litter older than gc's stamp slack (3 s)
            time.sleep(max(0.0, littered[0] + 3.0 - time.time()))

        def relitter() -> None:  # what gc swept, back: the other operations count it
            with mc.Store(LMDBBackend(path, durable=False)) as again:
                litter(again)
            os.sync()
            littered[0] = time.time()

        want = {"swept": garbage, "objects": total}
        trial("gc", "gc", total, want, before=old_enough, after=relitter)
    return out


def _keys(path: Path, keys: Sequence[bytes]) -> str:
    path.write_bytes(b"".join(keys))
    return str(path)


def _resume_reads(store: mc.Store, runs: Runs, folder: Path) -> dict[str, Any]:
    """What resume reads of each job: its slots' refs (where the store has any), its
    chunks' refs and tables, then the records of its slots' latest runs whose tables hold
    no state."""
    from medomni_cas.bench.records import slot_digests
    from medomni_cas.bench.refnames import CHUNK_REFS, SLOT_REFS, chunk_ref, slot_ref
    from medomni_cas.bench.slottables import chunk_ids, latest_states

    folder.mkdir()
    slot_refs = next(store.refs.items(SLOT_REFS), None) is not None
    sections: list[list[Any]] = []
    reads = 0

    def section(table: str, name: str, keys: list[bytes]) -> None:
        nonlocal reads
        if keys:
            sections.append([table, _keys(folder / name, keys), len(keys[0])])
            reads += len(keys)

    for n, (atoms, arm, rep) in enumerate(runs.jobs):
        slots = slot_digests(atoms, runs.agent, arm, rep)
        if slot_refs:
            section("refs", f"{n}.slots", [slot_ref(s).encode() for s in slots])
        chunks = list(dict.fromkeys(chunk_ids(slots)))
        tables = store.refs.get_many_by_id(CHUNK_REFS, chunks)
        named = [chunk_ref(c).encode() for c, t in zip(chunks, tables, strict=True) if t]
        section("refs", f"{n}.chunks", named)
        section("objects", f"{n}.tables", [bytes(t) for t in dict.fromkeys(tables) if t])
        lasts, known = latest_states(store, slots)
        section("objects", f"{n}.runs", [r for r in lasts if r is not None and r not in known])
    return {"sections": sections, "reads": reads}


def _walk_reads(store: mc.Store, root: mc.ObjectId, folder: Path) -> dict[str, Any]:
    """What a walk from ``root`` reads: its closure, level by level, each level in key
    order (as the walk's reads are)."""
    from medomni_cas.store import encoding

    folder.mkdir()
    sections: list[list[Any]] = []
    seen = {bytes(root)}
    level = [bytes(root)]
    reads = 0
    while level:
        level.sort()
        sections.append(["objects", _keys(folder / f"{len(sections)}", level), 32])
        reads += len(level)
        below = []
        for _, data in store.get_raw_many(map(mc.ObjectId, level)):
            for link in map(bytes, encoding.links(data)):
                if link not in seen:
                    seen.add(link)
                    below.append(link)
        level = below
    return {"sections": sections, "reads": reads}


def _raw_reads(
    row: str,
    f: int,
    raw: dict[str, Any],
    spec: dict[str, Any],
    work: int,
    *,
    dropped: bool = False,
) -> Trial:
    child = {"store": spec["store"], "sections": raw["sections"], "dropped": dropped}
    want = {"reads": raw["reads"], "found": raw["reads"]}
    return Trial(row, f, "raw", child, work, want, warm=(Path(spec["store"]),))


def score_trials(tmp: Path, sizes: Sizes, f: int) -> list[Trial]:
    from benchmarks_perf import bench_score
    from medomni_cas.bench.scorer import score_jobs

    path = tmp / f"score-{f}"
    jobs = sizes.score_jobs * f

    @dataclass
    class _ScoreSizes:
        score_jobs: int
        rows_per_job: int
        python_jobs: int = 0
        repeats: int = 1

    s = bench_score.build_scoring(path, _ScoreSizes(jobs, sizes.rows_per_job))
    score_jobs(s.store, s.jobs, n_boot=0, allow_partial=True)  # keeps the answer columns
    s.store.close()
    os.sync()
    spec = {"store": str(path), "jobs": [j.hex() for j in s.jobs], "rows": s.rows}
    return [Trial("score", f, "score", spec, s.rows, {}, warm=(path,))]


def build_trials(tmp: Path, data: Path, sizes: Sizes, f: int) -> list[Trial]:
    from benchmarks_perf import studio

    n = sizes.patients * f
    root = studio._studio(tmp / f"studio-{f}", n)
    store = tmp / f"build-{f}"
    spec = {
        "store": str(store),
        "studio": str(root),
        "template": studio.TEMPLATE,
        "cohort": studio.COHORT,
        "data": str(data),
        "patients": n,
    }

    def fresh() -> None:  # a fresh store each time
        shutil.rmtree(store, ignore_errors=True)

    return [Trial("build", f, "build", spec, n, {"patients": n}, before=fresh, warm=(root, data))]


# -- the table ----------------------------------------------------------------------------------
def slope(points: list[Measure], seconds: Sequence[float] | None = None) -> float:
    """Least squares slope of log(seconds) against log(work): the fastest runs', or the
    ``seconds`` given (one round's)."""
    xs = [math.log(p.work) for p in points]
    ys = [math.log(max(t, 1e-6)) for t in (seconds or [p.seconds for p in points])]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


UNITS = {
    "build": "patients",
    "resume": "slots",
    "score": "rows",
    "verify": "objects",
    "fsck": "objects",
    "gc": "objects",
    "push": "objects",
    "pull": "objects",
}


def _n(x: float) -> str:
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.0f}"


def render(results: dict[str, list[Measure]], factors: Sequence[int]) -> str:
    head = [
        "benchmark",
        "work " + " / ".join(f"{f}x" for f in factors),
        "seconds (fastest)",
        "peak RSS MiB",
        "anon MiB",
        "slope",
        f"t({factors[-1]}x) / linear",
        "fastest: slope",
        f"RSS {factors[-1]}x/{factors[0]}x",
        "result",
    ]
    body = []
    spread: list[str] = []
    faults: list[str] = []
    cpu: list[str] = []
    unlocked: list[str] = []
    for op, points in results.items():
        base = op.split(",")[0]
        first, last = points[0], points[-1]
        # each round's slope, and the median of them: the fastest runs of each size came
        # from different minutes, and a run of a second catches a fast spell more often
        # than one of a minute can (the same push at 1x: 2.68-4.34 s in one run of this)
        each = [
            (slope(points, ts), ts[-1] / (ts[0] * last.work / first.work))
            for ts in zip(*(p.rounds for p in points), strict=True)
        ]
        s = statistics.median(e[0] for e in each)
        linear = statistics.median(e[1] for e in each)
        if len(each) > 1:
            spread.append(f"{op}: each round's slope " + " / ".join(f"{e[0]:.2f}" for e in each))
        if any(p.majflt for p in points):
            faults.append(f"{op}: " + " / ".join(f"{p.majflt:,}" for p in points))
        if all(p.cpu for p in points):
            cpus = [slope(points, ts) for ts in zip(*(p.cpu for p in points), strict=True)]
            cpu.append(f"{op} {statistics.median(cpus):.2f}")
        unlocked += [f"{op} {p.work:,}: {p.unlocked}" for p in points if p.unlocked]
        rss = last.maxrss / first.maxrss
        bounded = op in BOUNDED  # a baseline row (", in memory") has no target
        ok = s <= MAX_SLOPE and (not bounded or rss <= MAX_RSS_RATIO)
        body.append(
            [
                f"{op} ({UNITS[base]})",
                " / ".join(_n(p.work) for p in points),
                " / ".join(f"{p.seconds:.3g}" for p in points),
                " / ".join(f"{p.maxrss:.0f}" for p in points),
                " / ".join(f"{p.anon:.0f}" for p in points),
                f"{s:.2f}",
                f"{linear:.2f}x",
                f"{slope(points):.2f}",
                f"{rss:.2f}x" + ("" if bounded else " (no target)"),
                ("PASS" if ok else "MISS") if "," not in op else "",
            ]
        )
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    table = "\n".join([line(head), sep, *(line(b) for b in body)])
    notes = []
    # (the rows divided, their names, what the ratio says) for each pair of rows run
    pairs = [(op, f"{op}, in memory", "time with the bound / bound lifted") for op in BOUNDED]
    for op in ("resume", "verify"):
        raw, dropped = f"{op}, raw reads", f"{op}, raw reads, pages dropped"
        pairs += [
            (op, raw, "time / the same reads by py-lmdb alone"),
            (dropped, raw, "raw reads with the page budget / without"),
        ]
    for op in ("verify", "push", "pull"):
        pairs.append((op, f"{op}, pages kept", "time with the page budget / pages kept"))
    for top, bottom, what in pairs:
        a, b = results.get(top), results.get(bottom)
        if a and b:
            ratios = " / ".join(f"{p.seconds / q.seconds:.2f}x" for p, q in zip(a, b, strict=True))
            notes.append(f"{top.split(',')[0]}: {what}, at each size: {ratios}")
    if faults:  # a page the kernel took back from the cache, read again: not the code's cost
        faults.insert(0, "major page faults, the most in one run, at each size:")
    if cpu:
        cpu = ["slope of the time on the CPU (user + system, rounds' median): " + ", ".join(cpu)]
    if unlocked:  # the store's pages could be taken back during these runs
        unlocked.insert(0, "files not locked in memory during a run (read before it instead):")
    return "\n".join([table, *spread, *faults, *cpu, *unlocked, *notes])


# -- driver -------------------------------------------------------------------------------------
def _command(argv: Sequence[str]) -> str:
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):  # outside the cwd: print it whole
        exe = exe.relative_to(Path.cwd())
    return shlex.join([str(exe), "-m", "benchmarks_perf", "scale", *argv])


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf scale")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--only", choices=sorted(OPS), action="append", help="some operations")
    parser.add_argument("--factors", help="the sizes, as multiples of 1x (default 1,4,16)")
    parser.add_argument(
        "--size", type=float, default=1.0, help="1x as this fraction of the full run's 1x"
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also run verify and fsck with the spill bound lifted (all in memory), verify, "
        "push and pull with every page read kept mapped, and the reads of resume and verify by "
        "py-lmdb alone",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run this many rounds, each every size there and back; the slope is the rounds' "
        "median (a shared machine)",
    )
    parser.add_argument("--child", nargs=2, metavar=("OP", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(*args.child)
    sizes = QUICK if args.quick else FULL
    if args.size != 1.0:
        sizes = Sizes(
            atoms_per_arm=max(1, round(sizes.atoms_per_arm * args.size)),
            score_jobs=max(1, round(sizes.score_jobs * args.size)),
            rows_per_job=sizes.rows_per_job,
            patients=max(1, round(sizes.patients * args.size)),
        )
    factors = [
        int(f) for f in (args.factors or (QUICK_FACTORS if args.quick else "1,4,16")).split(",")
    ]
    only = set(args.only or OPS)
    print(f"$ {_command(argv)}")
    print(
        f"machine: nproc={os.cpu_count()}, load {os.getloadavg()[0]:.2f}, python "
        f"{platform.python_version()}, lmdb {lmdb.version()}, {platform.platform()}"
    )
    bound = os.environ.get("MEDOMNI_SPILL_IDS")
    print(f"1x: {sizes}; spill bound {bound or 'default (131,072 ids)'}", flush=True)
    start = time.perf_counter()
    results: dict[str, list[Measure]] = {}
    for op in OPS:
        if op in only:
            results[op] = []
            if args.baseline and op in ("verify", "fsck"):
                results[f"{op}, in memory"] = []
            if args.baseline and op in ("resume", "verify"):
                results[f"{op}, raw reads"] = []
            if args.baseline and op == "verify":
                results[f"{op}, raw reads, pages dropped"] = []
            if args.baseline and op in ("verify", "push", "pull"):
                results[f"{op}, pages kept"] = []
    with tempfile.TemporaryDirectory(prefix="medomni-scale-", dir="/tmp") as d:
        tmp = Path(d)
        trials: list[Trial] = []
        if "build" in only:
            from examples import synth

            data = tmp / "data-root"
            synth.generate(data / "data", patients=sizes.patients * max(factors) * 6 // 5, seed=0)
        # every size's stores first, then the rounds (`rounds`)
        for f in factors:
            if "build" in only:
                trials += build_trials(tmp, data, sizes, f)
            if only & {"resume", "verify", "fsck", "push", "pull", "gc"}:
                trials += runs_trials(tmp, sizes, f, only, args.baseline)
            if "score" in only:
                trials += score_trials(tmp, sizes, f)
        print(f"stores built in {time.perf_counter() - start:.0f} s", flush=True)
        order = list(results)
        trials.sort(key=lambda t: (order.index(t.row), t.f))
        rounds(trials, tmp, args.repeat)
        for t in trials:
            results[t.row].append(t.measure())
    print(render(results, factors))
    took = time.perf_counter() - start
    print(f"load at the end {os.getloadavg()[0]:.2f}; total time: {took:.0f} s")
    return 0
