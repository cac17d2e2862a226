"""`make demo`: MedOmni's main job on the embedded default store (./.medomni/store).

1. generates the example dataset (`examples.synth`, seeded) if it is not there yet;
2. builds the task set medomni-bench/v1 under all four arms;
3. runs the deterministic baseline agent (examples/baseline_agent.py) with the process
   runner, the perception gateway attached on the encoder arms;
4. scores the runs and prints the results table;
5. prints the audit summary of the result and re-hashes its whole closure.

Running it again resumes: every slot already has a run, so nothing runs again, and the
result has the same id.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import medomni_cas as mc
from examples import synth
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.scorer import jobs_of, score_jobs, write_results
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.tasksets import build_set

HERE = Path(__file__).resolve().parent
STUDIO, BENCH = HERE / "studio", HERE / "bench"
DATA = STUDIO / "datasets/synth-ehr/data"
SET = "medomni-bench/v1"
WORK = Path(".medomni")


def _say(step: str, text: str) -> None:
    print(f"{step:<10} {text}", flush=True)


def main() -> int:
    if not (DATA / "patients.parquet").is_file() or not (DATA / synth.ARRAYS).is_dir():
        synth.generate(DATA, patients=200, seed=0)
        _say("data", f"generated 200 synthetic patients in {DATA}")
    else:
        _say("data", f"using {DATA}")
    store = mc.open()
    _say("store", store.url)

    t = time.monotonic()
    built = build_set(store, SET, studio=STUDIO, bench=BENCH)
    fresh = sum(not b.cached for b in built.builds)
    _say(
        "build",
        f"{SET}: {len(built.builds)} pair x arm builds ({fresh} new) in "
        f"{time.monotonic() - t:.1f} s; task set hash {built.task_set.hex()[:16]}",
    )

    agent = find_agent(BENCH, "baseline")
    t = time.monotonic()
    report = run_set(store, SET, agent, runs_dir=WORK / "runs", studio=STUDIO)
    for j in report.jobs:
        _say("run", f"{j.name}: {j.ran} run, {j.skipped} already done")
    _say(
        "run",
        f"{report.ran} runs in {time.monotonic() - t:.1f} s "
        + ("(resumed: nothing left to run)" if report.ran == 0 else ""),
    )

    scored = score_jobs(store, jobs_of(store, built.task_set), n_boot=1000, set_name=SET)
    files = write_results(scored, WORK / "results")
    print()
    print(f"{'arm':<22} {'pair':<30} {'metric':<9} {'value':>7}  95% CI")
    for r in scored.record.rows:
        arm = arm_label(r.arm, r.arm_variant)
        ci = f"[{r.ci_low:.3f}, {r.ci_high:.3f}]" if r.ci_low is not None else ""
        value = f"{r.value:.3f}" if r.value is not None else "-"
        print(f"{arm:<22} {r.pair:<30} {r.metric:<9} {value:>7}  {ci}")
    print()
    _say("result", f"{scored.result.hex()} -> {files[0]}")

    from medomni_cas.audit.provenance import provenance, render_text
    from medomni_cas.audit.verify import verify_result

    print()
    print("\n".join(render_text(provenance(store, scored.result))))
    check = verify_result(store, scored.result, derived=True)
    what = f"{check.objects} objects re-hashed, answer columns made again"
    _say("verify", f"{'ok' if check.ok else 'PROBLEMS'}: {what}")
    for p in check.problems:
        print(f"  {p.kind}: {p.message}")
    for d in check.derived:
        print(f"  derived: {d}")
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
