"""One small scored flow for the attestation and commitment tests: one pair under one arm,
the baseline agent, scored, in an LMDB store built once per session (shared by xdist
workers through a file lock). Tests that change more than attestations work on copies."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

import medomni_cas as mc
from tests._sets import small_tree

SET = "medomni-bench/tiny"
PAIR = "synth-ehr_ckd-staging@n20"


@dataclass(frozen=True)
class Flow:
    dir: str
    url: str
    result: str

    @property
    def root(self) -> Path:
        return Path(self.dir)


def _build(root: Path) -> Flow:
    from medomni_cas.bench.agents import find_agent
    from medomni_cas.bench.harness import run_set
    from medomni_cas.bench.scorer import jobs_of, score_jobs
    from medomni_cas.studio.tasksets import build_set

    small_tree(root, arms=["no-perception"], pairs=(PAIR,), name="tiny")
    url = f"lmdb://{root}/store"
    with mc.open(url) as store:
        built = build_set(store, SET, studio=root / "studio", bench=root / "bench")
        assert built is not None
        agent = find_agent(root / "bench", "baseline")
        run_set(store, SET, agent, runs_dir=root / "runs", studio=root / "studio")
        scored = score_jobs(store, jobs_of(store, built.task_set), n_boot=50, set_name=SET)
    return Flow(str(root), url, scored.result.hex())


def attest_flow(tmp_path_factory: pytest.TempPathFactory) -> Flow:
    """The session's flow, built by the first test that asks for it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / "attest-flow"
    root.mkdir(exist_ok=True)
    done = root / "flow.json"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            done.write_bytes(msgspec.json.encode(_build(root)))
    return msgspec.json.decode(done.read_bytes(), type=Flow)
