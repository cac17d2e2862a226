"""The whole MedOmni flow against an ``s3://`` store (moto's server on loopback), once in
one process and once as four processes each building and running a disjoint shard: objects
merge by identity, only refs coordinate, so the task set, run index and scores agree."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.records import RunRecord
from medomni_cas.bench.scorer import jobs_of, score_jobs
from medomni_cas.bench.slottables import slot_runs
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree
from tests.test_backends import BUCKET, s3_endpoint  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SET = "medomni-bench/small"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # one pair is enough to show the shards merge (moto serves each request in turn)
    return small_tree(
        tmp_path_factory.mktemp("flow"),
        arms=["no-perception", "encoders"],
        pairs=("synth-ehr_ckd-staging@n20",),
    )


def _flow(store: mc.Store, tree: Path, runs: Path) -> tuple[mc.ObjectId, dict[str, tuple], list]:  # type: ignore[type-arg]
    built = build_set(store, SET, studio=tree / "studio", bench=tree / "bench")
    assert built is not None
    agent = find_agent(tree / "bench", "baseline")
    run_set(store, SET, agent, runs_dir=runs, studio=tree / "studio", arms=["no-perception"])
    return _outcome(store)


def _outcome(store: mc.Store) -> tuple[mc.ObjectId, dict[str, tuple], list]:  # type: ignore[type-arg]
    view = show_set(store, SET)
    index = {}
    for name, rid in slot_runs(store).items():
        run = store.get(rid, RunRecord)
        answer = store.read_blob(run.answer) if run.answer else None
        index[name] = (run.atom, run.outcome, run.attempt, answer)
    jobs = jobs_of(store, view.task_set)
    scored = score_jobs(store, jobs, n_boot=100, set_name=SET, arms=["no-perception"])
    rows = [
        (r.agent, r.arm, r.pair, r.target, r.value, r.ci_low, r.ci_high, r.n)
        for r in scored.record.rows
    ]
    return view.task_set, index, rows


@pytest.fixture(scope="module")
def reference(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:  # type: ignore[type-arg]
    """The same flow on a local LMDB store, in one process."""
    tmp = tmp_path_factory.mktemp("ref")
    with mc.open(f"lmdb://{tmp / 'store'}") as store:
        return _flow(store, tree, tmp / "runs")


def _url(endpoint: str) -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={endpoint}"


def test_the_whole_flow_on_s3(
    s3_endpoint: str,  # noqa: F811
    tree: Path,
    tmp_path: Path,
    reference: tuple,  # type: ignore[type-arg]
) -> None:
    store = mc.open(_url(s3_endpoint))
    got = _flow(store, tree, tmp_path / "runs")
    assert got[0] == reference[0]  # the task set hash
    assert got[1] == reference[1]  # every slot: the same atom, outcome and answer
    assert got[2] == reference[2]  # the same scores
    from medomni_cas.store.verify import verify_closure

    assert verify_closure(store, [store.refs[f"results/{SET}"]]).ok


def _medomni(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "medomni_cas.cli.main", *args],
        cwd=ROOT,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()


def test_four_shards_into_one_s3_store_equal_one_process(
    s3_endpoint: str,  # noqa: F811
    tree: Path,
    tmp_path: Path,
    reference: tuple,  # type: ignore[type-arg]
) -> None:
    url = _url(s3_endpoint)
    folders = ("--studio", str(tree / "studio"), "--bench", str(tree / "bench"))
    _all(
        [
            _medomni(
                "studio", "taskset", "build", SET, "--shard", f"{i}/4", "--store", url, *folders
            )
            for i in range(4)
        ]
    )
    _all([_medomni("studio", "taskset", "build", SET, "--store", url, *folders)])
    run = (
        "bench",
        "run",
        SET,
        "--agent",
        "baseline",
        "--arm",
        "no-perception",
        "--store",
        url,
        *folders,
        "--runs",
        str(tmp_path / "runs"),
    )
    _all([_medomni(*run, "--shard", f"{i}/4") for i in range(4)])
    finish = _medomni(*run, "--json")
    out, err = finish.communicate(timeout=600)
    assert finish.returncode == 0, err.decode()
    import json

    assert all(j["ran"] == 0 for j in json.loads(out)["jobs"])  # the shards ran every slot
    with mc.open(url) as store:
        got = _outcome(store)
        runs = [o for o in store.iter_ids() if store.kind(o) == "medomni.run"]
    assert got[0] == reference[0]
    assert got[1] == reference[1]
    assert got[2] == reference[2]
    assert len(runs) == len(got[1])  # no slot ran twice
