"""``python -m benchmarks_perf llm [--quick]``: a model-backed agent's trial, and our part of it.

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


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks_perf llm")
    parser.add_argument("--quick", action="store_true", help="5 patients")
    args = parser.parse_args(argv)
    n = 5 if args.quick else 20
    print("$ python -m benchmarks_perf llm" + (" --quick" if args.quick else ""))
    print(
        f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
        f"{platform.platform()}"
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="medomni-llm-bench-", dir="/tmp") as d:
        rows = run(Path(d), n)
    print(render(rows))
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0
