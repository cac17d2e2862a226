"""``python -m benchmarks_perf llm [--quick] [--only process|terminus]``: a model-backed agent's
trial, and our part of it, for the process agent and for Harbor's terminus-2 in Docker.

Process agent
-------------
The example's process agent (``examples/llm_agent.py``, config ``llm-local``) runs the
CKD-staging pair on a cohort of 20 patients (``--quick``: 5) on the no-perception arm,
through ``run_set``, against the stand-in provider on loopback (tests/llm_provider.py), in a
fresh store. It reports:

1. the stand-in's own response time (one chat completion from this process, with the same
   client): the floor of any trial;
2. trials/s of the whole set (the process runner runs one trial at a time);
3. the time of one trial split into the agent's part (its subprocess: interpreter, ``openai``
   import, the request) and ours (staging the task, collecting, redacting secrets,
   recording the run as objects), so the parts add up; target: ours < 5% of the trial;
4. redaction alone, per trial (its logs, errors and answer), with one configured secret.

terminus-2
----------
A copy of ``terminus-2-local.yaml`` runs the CKD-staging pair on a cohort of 8 patients
(``--quick``: 4) as real Harbor trials in Docker (``$DOCKER_HOST`` if an engine answers, else
one started here, as the tests do), against the stand-in scripted as a model driving
terminus-2 (`tests.llm_provider.TerminusScript`: three turns a trial), at 1, 2 and 4 trials
at once, a fresh store each. It reports:

1. the stand-in's response time for a terminus-2-sized prompt, and the floor it sets: a trial
   is at least its three model calls;
2. trials/s at 1, 2 and 4 concurrent, against 1 concurrent;
3. our part per trial at 1 concurrent (rendering the task folder, collecting Harbor's result,
   redacting the trial and Harbor's folders, recording the run) against the whole trial
   (the set's wall time over its trials); target < 5%, redaction included.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

import medomni_cas as mc
from benchmarks_perf._table import Row, render
from medomni_cas.bench import process, secrets
from medomni_cas.bench.agents import load_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.studio.tasksets import build_set

SET = "medomni-bench/llm-perf"
PAIR = "synth-ehr_ckd-staging"
MODEL = "stand-in-model"
KEY = "sk-bench-0123456789abcdef"


def _tree(root: Path, n: int) -> None:
    from tests._sets import EXAMPLES, small_tree

    cohorts = EXAMPLES / "studio/datasets/synth-ehr/tasks" / PAIR / "cohorts"
    doc = yaml.safe_load((cohorts / "n20.yaml").read_text())
    doc.pop("per_class", None)
    doc.update(n=n, description=f"{n} patients, for benchmarks_perf llm.")
    small_tree(root, arms=["no-perception"], pairs=(f"{PAIR}@nllm{n}",), name="llm-perf")
    mine = root / "studio/datasets/synth-ehr/tasks" / PAIR / "cohorts"
    (mine / f"nllm{n}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


class _Clock:
    """Seconds spent inside the wrapped functions."""

    def __init__(self) -> None:
        self.total = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - t0

        return timed


def _floor(base_url: str, rounds: int) -> float:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    messages = [{"role": "user", "content": "x" * 4000}]
    client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for _ in range(rounds):
        client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    return (time.perf_counter() - t0) / rounds


def run(tmp: Path, n: int) -> list[Row]:
    from tests.llm_provider import Reply, standin

    _tree(tmp, n)
    doc = yaml.safe_load((tmp / "bench/agents/llm-local.yaml").read_text())
    doc["model"] = doc["settings"]["served_model"] = MODEL
    (tmp / "llm-bench.yaml").write_text(yaml.safe_dump(doc))
    agent = load_agent(tmp / "llm-bench.yaml")
    os.environ["OPENAI_API_KEY"] = KEY
    agent_clock, redact_clock = _Clock(), _Clock()
    exec_orig, redact_orig = process._Run._exec, secrets.Redactor.trial
    with standin(Reply(content='{"ckd_stage": "G2"}', prompt_tokens=900)) as provider:
        os.environ["OPENAI_BASE_URL"] = provider.base_url
        floor = _floor(provider.base_url, 50)
        before = provider.count
        with mc.open(f"lmdb://{tmp / 'store'}") as store:
            build_set(store, SET, studio=tmp / "studio", bench=tmp / "bench")
            process._Run._exec = agent_clock.wrap(exec_orig)  # type: ignore[method-assign]
            secrets.Redactor.trial = redact_clock.wrap(redact_orig)  # type: ignore[method-assign]
            try:
                t0 = time.perf_counter()
                report = run_set(
                    store, SET, agent, runs_dir=tmp / "runs", studio=tmp / "studio",
                    bench=tmp / "bench", runner="process", fail_fast=0,
                )  # fmt: skip
                wall = time.perf_counter() - t0
            finally:
                process._Run._exec = exec_orig  # type: ignore[method-assign]
                secrets.Redactor.trial = redact_orig  # type: ignore[method-assign]
        requests = provider.count - before
    trials = report.ran
    ours = wall - agent_clock.total
    per = wall / trials
    return [
        Row("stand-in response time", floor * 1000, "ms",
            note="one chat completion from this process: the floor of a trial"),
        Row("trials/s (process runner, 1 at a time)", trials / wall, "trials/s",
            note=f"{trials} trials in {wall:.1f} s, {requests} requests to the stand-in"),
        Row("agent's part per trial", agent_clock.total / trials * 1000, "ms",
            note="its subprocess: Python, import openai, the request"),
        Row("our part per trial", ours / trials * 1000, "ms", baseline=per * 1000,
            baseline_name="the whole trial", max_ratio=0.05,
            note="plan, claim, stage, collect, redact, record, job record, run folder"),
        Row("redaction per trial", redact_clock.total / trials * 1e6, "us",
            baseline=per * 1e6, baseline_name="the whole trial", max_ratio=0.01,
            note="logs, errors, answer; one secret and bearer tokens"),
    ]  # fmt: skip


TURNS = 3  # TerminusScript's turns a trial: checksum, write and complete, confirm


def _terminus_one(tmp: Path, host: str, agent: Any, concurrency: int) -> dict[str, float]:
    """Run the terminus-2 set once at ``concurrency`` into a fresh store; what it cost."""
    from medomni_harbor.runner import HarborRunner

    from medomni_cas.bench import harness
    from tests.llm_provider import TerminusScript, standin

    store = mc.open(f"lmdb://{tmp / f'store-t{concurrency}'}")
    build_set(store, SET, studio=tmp / "studio", bench=tmp / "bench")
    record, redact_trial, redact_folder = _Clock(), _Clock(), _Clock()
    originals = harness.record_trial, secrets.Redactor.trial, secrets.Redactor.folder
    runner = HarborRunner(docker_host=host, concurrency=concurrency)
    with standin(TerminusScript(served=MODEL, leak=KEY)) as provider:
        os.environ["OPENAI_BASE_URL"] = provider.base_url
        harness.record_trial = record.wrap(originals[0])
        secrets.Redactor.trial = redact_trial.wrap(originals[1])  # type: ignore[method-assign]
        secrets.Redactor.folder = redact_folder.wrap(originals[2])  # type: ignore[method-assign]
        try:
            t0 = time.perf_counter()
            report = harness.run_set(
                store, SET, agent, runs_dir=tmp / f"runs-t{concurrency}", studio=tmp / "studio",
                bench=tmp / "bench", runner=runner, arms=["no-perception"], fail_fast=0,
            )  # fmt: skip
            wall = time.perf_counter() - t0
        finally:
            harness.record_trial = originals[0]
            secrets.Redactor.trial = originals[1]  # type: ignore[method-assign]
            secrets.Redactor.folder = originals[2]  # type: ignore[method-assign]
        requests = provider.count
    store.close()
    (job,) = report.jobs
    return {
        "trials": job.ran,
        "answered": job.outcomes.get("answered", 0),
        "wall": wall,
        "requests": requests,
        "render": runner.timings["render"],
        "collect": runner.timings["collect"],
        "harbor": runner.timings["harbor"],
        "record": record.total,
        "redact": redact_trial.total + redact_folder.total,
    }


def _terminus_floor(base_url: str, rounds: int) -> float:
    """One completion of a terminus-2-sized prompt (its first is about 6 kB) from here."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    messages = [{"role": "user", "content": "x" * 6000}]
    client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for _ in range(rounds):
        client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    return (time.perf_counter() - t0) / rounds


def terminus(tmp: Path, n: int, host: str) -> list[Row]:
    """The terminus-2 rows (module docstring), in an engine at ``host``."""
    from tests.llm_provider import TerminusScript, standin

    _tree(tmp, n)
    doc = yaml.safe_load((tmp / "bench/agents/terminus-2-local.yaml").read_text())
    doc["model"], doc["settings"]["served_model"] = f"openai/{MODEL}", MODEL
    (tmp / "terminus-bench.yaml").write_text(yaml.safe_dump(doc))
    agent = load_agent(tmp / "terminus-bench.yaml")
    os.environ["OPENAI_API_KEY"] = KEY
    os.environ["DOCKER_HOST"] = host
    with standin(TerminusScript(served=MODEL)) as provider:
        floor = _terminus_floor(provider.base_url, 50)
    runs = {c: _terminus_one(tmp, host, agent, c) for c in (1, 2, 4)}
    one = runs[1]
    per = one["wall"] / one["trials"]
    ours = one["render"] + one["collect"] + one["record"] + one["redact"]
    rows = [
        Row("stand-in response time (terminus-2 prompt)", floor * 1000, "ms",
            note=f"one chat completion from this process; a trial makes {TURNS}"),
    ]  # fmt: skip
    for c, r in runs.items():
        rows.append(
            Row(
                f"terminus-2 trials/s, {c} concurrent",
                r["trials"] / r["wall"],
                "trials/s",
                baseline=one["trials"] / one["wall"] if c > 1 else None,
                baseline_name="1 concurrent",
                note=(
                    f"{r['trials']:.0f} trials in {r['wall']:.1f} s, {r['answered']:.0f} "
                    f"answered, {r['requests']:.0f} requests; floor (model calls only) "
                    f"{c / (TURNS * floor):.0f} trials/s"
                ),
            )
        )
    rows += [
        Row("terminus-2: our part per trial", ours / one["trials"] * 1000, "ms",
            baseline=per * 1000, baseline_name="the whole trial", max_ratio=0.05,
            note=(f"render {one['render'] / one['trials'] * 1000:.0f} ms, collect "
                  f"{one['collect'] / one['trials'] * 1000:.0f} ms, record (redaction in it) "
                  f"{one['record'] / one['trials'] * 1000:.0f} ms, Harbor's folders "
                  "redacted at the job's end; 1 trial at a time")),
        Row("terminus-2: redaction per trial", one["redact"] / one["trials"] * 1e3, "ms",
            baseline=per * 1e3, baseline_name="the whole trial", max_ratio=0.01,
            note="the trial's logs, errors, answer, and Harbor's trial folders (one secret)"),
    ]  # fmt: skip
    return rows


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf llm")
    parser.add_argument("--quick", action="store_true", help="5 patients; terminus-2: 4")
    parser.add_argument(
        "--only", choices=("process", "terminus"), help="one part (terminus needs Docker)"
    )
    args = parser.parse_args(argv)
    print("$ python -m benchmarks_perf llm" + " ".join(["", *(argv or [])]).rstrip())
    print(
        f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
        f"{platform.platform()}, load average {os.getloadavg()[0]:.1f} at the start"
    )
    start = time.perf_counter()
    rows: list[Row] = []
    if args.only in (None, "process"):
        with tempfile.TemporaryDirectory(prefix="medomni-llm-bench-", dir="/tmp") as d:
            rows += run(Path(d), 5 if args.quick else 20)
    if args.only in (None, "terminus"):
        from tests import docker_engine

        try:
            engine = docker_engine.acquire("perf")
        except docker_engine.EngineUnavailable as e:
            print(f"terminus-2: no Docker engine: {e.detail}")
            print(render(rows))
            return 1
        try:
            with tempfile.TemporaryDirectory(prefix="medomni-llm-bench-", dir="/tmp") as d:
                rows += terminus(Path(d), 4 if args.quick else 8, engine.host)
        finally:
            engine.close()
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
    return 0
