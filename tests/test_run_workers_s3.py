"""Many harness hosts on one shared store: four `medomni bench run` processes on one
``s3://`` store (moto's server on loopback) share one job slot by slot; one is killed
(SIGKILL) mid-run, the others take its slots over, and every slot runs exactly once, with
the same runs, answers and score table as one process on LMDB."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.records import RunRecord
from medomni_cas.bench.scorer import jobs_of, score_jobs
from medomni_cas.bench.slottables import slot_runs
from medomni_cas.store.sync import push
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree
from tests.test_backends import BUCKET, s3_endpoint  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent
SET = "medomni-bench/workers"
SLOTS = 20  # one n20 pair under one arm
WORKERS = 4

# a slow agent (so that a kill lands mid-run) whose answer depends on the task's data
AGENT = """
import json, os, time
time.sleep(0.3)
targets = json.load(open("answer_schema.json"))["targets"]
labs = open("labs.jsonl").read()
pick = lambda t: t["classes"][len(labs) % len(t["classes"])] if t["classes"] else len(labs) / 1000
open(os.environ["MEDOMNI_SUBMISSION"], "w").write(json.dumps({t["name"]: pick(t) for t in targets}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = small_tree(
        tmp_path_factory.mktemp("workers"),
        arms=["no-perception"],
        pairs=("synth-ehr_ckd-staging@n20",),
        name="workers",
    )
    doc = yaml.safe_load((root / "bench/agents/baseline.yaml").read_text())
    doc["agent"] = "slow"
    doc["settings"]["command"] = ["python", "-c", AGENT]
    (root / "bench/agents/slow.yaml").write_text(yaml.safe_dump(doc))
    with mc.open(f"lmdb://{root / 'store'}") as s:
        build_set(s, SET, studio=root / "studio", bench=root / "bench")
    return root


def _outcome(store: mc.Store) -> tuple[object, ...]:
    index = {}
    for name, rid in slot_runs(store).items():
        run = store.get(rid, RunRecord)
        answer = store.read_blob(run.answer) if run.answer else None
        index[name] = (run.atom, run.outcome, run.attempt, answer, run.predictions)
    scored = score_jobs(store, jobs_of(store, show_set(store, SET).task_set), n_boot=50)
    return index, scored.record.rows, scored.record.table


def test_four_workers_on_one_s3_store_one_killed(
    s3_endpoint: str,  # noqa: F811
    built: Path,
    tmp_path: Path,
) -> None:
    # one process on LMDB: the reference
    shutil.copytree(built / "store", tmp_path / "one")
    with mc.open(f"lmdb://{tmp_path / 'one'}") as store:
        agent = find_agent(built / "bench", "slow")
        run_set(store, SET, agent, runs_dir=tmp_path / "runs-one", studio=built / "studio")
        reference = _outcome(store)

    url = f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={s3_endpoint}"
    with mc.open(f"lmdb://{built / 'store'}") as local, mc.open(url) as remote:
        push(local, remote)  # the built set, as a studio host would publish it
    folders = ["--studio", str(built / "studio"), "--bench", str(built / "bench")]

    def worker(i: int) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "medomni_cas.cli.main", "bench", "run", SET]
        cmd += ["--agent", "slow", "--store", url, *folders, "--runs", str(tmp_path / f"r{i}")]
        cmd += ["--concurrency", "1", "--json"]
        return subprocess.Popen(
            cmd, cwd=ROOT, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    procs = [worker(i) for i in range(WORKERS)]
    with mc.open(url) as store:
        deadline = time.monotonic() + 300
        while len(slot_runs(store)) < 3:  # mid-run
            assert time.monotonic() < deadline, "no runs recorded"
            assert procs[0].poll() is None, procs[0].communicate()[1].decode()
            time.sleep(0.1)
    procs[0].send_signal(signal.SIGKILL)
    procs[0].communicate()
    ran = 0
    for p in procs[1:]:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()  # each waited for the others' slots: complete
        ran += sum(j["ran"] for j in json.loads(out)["jobs"])
    assert ran <= SLOTS

    with mc.open(url) as store:
        runs = [store.get(o, RunRecord) for o in store.iter_ids() if store.kind(o) == "medomni.run"]
        assert len(runs) == SLOTS and len({r.slot for r in runs}) == SLOTS  # each exactly once
        assert all(r.attempt == 1 for r in runs)
        assert not store.refs.as_dict("runs/claims/")
        got = _outcome(store)
    assert got == reference  # the same runs, answers, predictions and score table
