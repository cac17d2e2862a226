"""`make demo`: MedOmni's main job in the example workspace (the repository's workspace.yaml).

The workspace names the store (``lmdb://.medomni/store``), the Studio and Bench folders
(``examples/studio``, ``examples/bench``) and the runs folder (``runs``), so after the demo
the README's commands work from the repository's root with no flags. The demo:

1. generates the example dataset (`examples.synth`, 200 patients, seed 0) into
   ``examples/studio/datasets/synth-ehr/data`` if it is not there yet;
2. builds the task set medomni-bench/v1 under all four arms;
3. runs the deterministic baseline agent (medomni_cas/bench/baseline.py) with the process
   runner, the perception gateway attached on the encoder arms;
4. scores the runs, writes ``results/medomni-bench.v1/`` and prints the results table;
5. prints the audit summary of the result and re-hashes its whole closure;
6. attests the result with a throw-away Ed25519 key (an in-toto statement in a DSSE
   envelope, ``results/medomni-bench.v1/result.intoto.json``) and verifies the attestation
   against the store.

Running it again resumes: every slot already has a run, so nothing runs again, and the
result has the same id.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from examples import synth
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.scorer import jobs_of, score_jobs, write_results
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.tasksets import build_set
from medomni_cas.workspace import Workspace

if TYPE_CHECKING:
    from medomni_cas.audit.verify import VerifyReport
    from medomni_cas.store.ids import ObjectId
    from medomni_cas.store.store import Store

#: The example workspace: the repository's root, whatever the current directory.
WORKSPACE = Path(__file__).resolve().parent.parent
SET = "medomni-bench/v1"


def _say(step: str, text: str) -> None:
    print(f"{step:<10} {text}", flush=True)


def main() -> int:
    ws = Workspace.load(WORKSPACE)
    data = ws.studio / "datasets/synth-ehr/data"
    if not (data / "patients.parquet").is_file() or not (data / synth.ARRAYS).is_dir():
        synth.generate(data, patients=200, seed=0)
        _say("data", f"generated 200 synthetic patients in {data}")
    else:
        _say("data", f"using {data}")
    with ws.open_store() as store:
        _say("store", store.url)
        return _demo(ws, store)


def _demo(ws: Workspace, store: Store) -> int:
    t = time.monotonic()
    built = build_set(store, SET, studio=ws.studio, bench=ws.bench)
    fresh = sum(not b.cached for b in built.builds)
    _say(
        "build",
        f"{SET}: {len(built.builds)} pair x arm builds ({fresh} new) in "
        f"{time.monotonic() - t:.1f} s; task set hash {built.task_set.hex()[:16]}",
    )

    agent = find_agent(ws.bench, "baseline")
    t = time.monotonic()
    report = run_set(store, SET, agent, runs_dir=ws.runs, studio=ws.studio)
    for j in report.jobs:
        _say("run", f"{j.name}: {j.ran} run, {j.done} already done")
    _say(
        "run",
        f"{report.ran} runs in {time.monotonic() - t:.1f} s "
        + ("(resumed: nothing left to run)" if report.ran == 0 else ""),
    )

    scored = score_jobs(store, jobs_of(store, built.task_set), n_boot=1000, set_name=SET)
    files = write_results(scored, ws.root / "results" / SET.replace("/", "."))
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
    what = f"{check.objects} objects re-hashed, answer columns and score rows made again"
    _say("verify", f"{'ok' if check.ok else 'PROBLEMS'}: {what}")
    for p in check.problems:
        print(f"  {p.kind}: {p.message}")
    for d in check.derived:
        print(f"  derived: {d}")
    signed = _attest(store, scored.result, check, files[0].parent)
    return 0 if check.ok and signed else 1


def _attest(store: Store, result: ObjectId, check: VerifyReport, folder: Path) -> bool:
    """Sign the result's in-toto statement with a throw-away key, then verify the
    envelope against the store (`medomni audit attest` / `verify-attestation`)."""
    from medomni_cas.audit.attest import attest, verify_attestation
    from medomni_cas.audit.keys import generate
    from medomni_cas.audit.statement import result_check

    key = generate()  # throw-away: a real signer keeps one (medomni keygen -o PATH)
    path = folder / "result.intoto.json"
    done = attest(store, result, key, output=path, check=lambda *_: result_check(check))
    report = verify_attestation(done.envelope, key.public_key(), store)
    verdict = "ok" if report.ok else "PROBLEMS"
    _say("attest", f"{done.check.result}, keyid {done.keyid[:16]}…: {path}")
    _say("attest", f"verify-attestation {verdict}: signature, subject and statement re-derived")
    for p in report.problems:
        print(f"  {p.message}")
    return report.ok


if __name__ == "__main__":
    sys.exit(main())
