"""The harness end to end on real processes: checks, runs, resume, retries, claims, replay,
run folders, scoring. Agents are real subprocesses (medomni_cas/bench/baseline.py and small
inline ones); the store is a real LMDB."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent, load_agent
from medomni_cas.bench.harness import CheckFailed, check_posix_permissions, run_set
from medomni_cas.bench.harness.checks import oracle_answer
from medomni_cas.bench.process import ProcessRunner
from medomni_cas.bench.recording import judge_answer
from medomni_cas.bench.records import JobRecord, Outcome, PredictionColumns, RunRecord
from medomni_cas.bench.refnames import agent_ref
from medomni_cas.bench.replay import source_run
from medomni_cas.bench.runfolders import RunFolderError, import_run_folder
from medomni_cas.bench.runners import Job, Trial, TrialSpec
from medomni_cas.bench.scorer import ScoreError, jobs_of, score_jobs
from medomni_cas.bench.slottables import slot_runs
from medomni_cas.store.verify import verify_closure
from medomni_cas.studio.records import AnswerKey, AtomTask, BuildResult, FormatCheck
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SET = "medomni-bench/small"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Studio and bench copies, generated data, and a small set of two n20 pairs."""
    return small_tree(tmp_path_factory.mktemp("bench"), arms=["no-perception", "encoders-required"])


@pytest.fixture
def store(tree: Path, tmp_path: Path) -> Iterator[mc.Store]:
    s = mc.open(f"lmdb://{tmp_path / 'store'}")
    build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    yield s
    s.close()


def _agent(tree: Path, name: str, **settings: object) -> mc.Record:
    path = tree / "bench/agents" / f"{name}.yaml"
    if settings:
        doc = yaml.safe_load((tree / "bench/agents/baseline.yaml").read_text())
        doc["agent"] = name
        doc["settings"].update(settings)
        path.write_text(yaml.safe_dump(doc))
    return load_agent(path)


def _run(store: mc.Store, tree: Path, agent: object, tmp_path: Path, **kw: object):  # type: ignore[no-untyped-def]
    kw.setdefault("fail_fast", 0)  # these tests run failing agents on purpose, to the end
    return run_set(
        store,
        SET,
        agent,
        runs_dir=tmp_path / "runs",
        studio=tree / "studio",
        **kw,  # type: ignore[arg-type]
    )


def _runs(store: mc.Store) -> list[RunRecord]:
    return [store.get(o, RunRecord) for o in store.iter_ids() if store.kind(o) == "medomni.run"]


# -- the main path ------------------------------------------------------------------------------
def test_run_records_resume_and_score(store: mc.Store, tree: Path, tmp_path: Path) -> None:
    agent = find_agent(tree / "bench", "baseline")
    report = _run(store, tree, agent, tmp_path)
    assert [j.ran for j in report.jobs] == [40, 40] and report.ran == 80
    runs = _runs(store)
    assert len(runs) == 80 and {r.outcome for r in runs} == {"answered"}
    req = [r for r in runs if r.agent_block.arm == "encoders-required"]
    assert all(r.agent_block.encoder_calls >= 1 and r.agent_block.meets_arm for r in req)
    assert all(r.agent_block.encoders_served for r in req)
    nop = [r for r in runs if r.agent_block.arm == "no-perception"]
    assert all(not r.agent_block.encoders_served and r.agent_block.encoder_log is None for r in nop)
    assert all("labs.jsonl" in r.agent_block.files_opened for r in runs)
    # the run folder is a view of the records
    for j in report.jobs:
        assert (j.folder / "runs.jsonl").read_text().count("\n") == 40
        assert (j.folder / "predictions.jsonl").read_text().count("\n") == 40
        assert j.folder.name.startswith("medomni-bench.small--baseline--")
    assert (report.jobs[1].folder / "encoder_use.jsonl").stat().st_size > 0
    # running again resumes: nothing re-runs, the same job folders
    again = _run(store, tree, agent, tmp_path)
    assert again.ran == 0 and [j.skipped for j in again.jobs] == [40, 40]
    assert [j.folder for j in again.jobs] == [j.folder for j in report.jobs]
    assert len(_runs(store)) == 80
    scored = score_jobs(store, jobs_of(store, report.task_set), n_boot=200, set_name=SET)
    assert len(scored.record.rows) == 4 and all(
        r.n == 20 and r.value is not None for r in scored.record.rows
    )
    assert store.refs[f"results/{SET}"] == scored.result


def test_null_agent_fails_the_format_check(store: mc.Store, tree: Path, tmp_path: Path) -> None:
    agent = find_agent(tree / "bench", "null")
    _run(store, tree, agent, tmp_path, arms=["encoders-required"])
    runs = _runs(store)
    assert len(runs) == 40 and {r.outcome for r in runs} == {"malformed"}
    assert all("missing" in r.errors[0] for r in runs)
    assert all(not r.agent_block.meets_arm and "no" in r.agent_block.meets_arm_reason for r in runs)
    jobs = jobs_of(store, show_set(store, SET).task_set)
    scored = score_jobs(store, jobs, n_boot=0, arms=["encoders-required"])
    assert all(r.n_missing == 20 for r in scored.record.rows)
    assert all(r.unanswered == {"malformed": 20} and r.answered == 0 for r in scored.record.rows)


def test_replay_repeats_answers_without_a_model(
    store: mc.Store, tree: Path, tmp_path: Path
) -> None:
    base = find_agent(tree / "bench", "baseline")
    _run(store, tree, base, tmp_path, arms=["no-perception"])
    replay = find_agent(tree / "bench", "replay-baseline")
    rep = _run(store, tree, replay, tmp_path, arms=["no-perception"], runner="replay")
    assert rep.ran == 40
    ts = show_set(store, SET).task_set
    one = ["no-perception"]
    a = score_jobs(store, jobs_of(store, ts, ["baseline"]), n_boot=0, arms=one).record.rows
    b = score_jobs(store, jobs_of(store, ts, ["replay-baseline"]), n_boot=0, arms=one).record.rows
    assert [r.value for r in a] == [r.value for r in b]
    replayed = [r for r in _runs(store) if r.runner == "replay"]
    assert replayed and all(r.tokens_in == 0 and r.cost_usd == 0.0 for r in replayed)
    # what a replay repeats: the source's run at the same repetition, else at repetition 1
    source, atom = store.refs[agent_ref("baseline")], replayed[0].atom
    job = store.get(jobs_of(store, ts, ["baseline"])[0], JobRecord)
    atoms = [store.get(r, RunRecord).atom for r in job.runs]  # the job's, in order
    first = source_run(store, source, atom, "no-perception", 1, atoms)
    assert first is not None and first.agent_config == source and first.atom == atom
    assert source_run(store, source, atom, "no-perception", 3, atoms) == first
    assert source_run(store, source, atom, "encoders-required", 1, atoms) is None


# -- retries, claims, kills -------------------------------------------------------------------
class FlakyRunner(ProcessRunner):
    """The process runner, except that the first attempt of some slots hits an upstream 504."""

    name = "flaky"

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail = fail

    def run(self, job: Job) -> Iterator[Trial]:
        for i, spec in enumerate(job.trials):
            if spec.attempt == 1 and i < self.fail:
                yield Trial(
                    spec.slot,
                    spec.attempt,
                    "infra-error",
                    "t0",
                    "t1",
                    0,
                    errors=["model endpoint returned 504"],
                )
            else:
                yield self._trial(job, spec, _cmd(job))


def _cmd(job: Job) -> list[str]:
    from medomni_cas.bench.process import _command

    return _command(job)


def test_infra_errors_are_kept_and_only_they_rerun(
    store: mc.Store, tree: Path, tmp_path: Path
) -> None:
    agent = find_agent(tree / "bench", "baseline")
    first = _run(store, tree, agent, tmp_path, arms=["no-perception"], runner=FlakyRunner(3))
    assert first.jobs[0].infra_errors == 3
    second = _run(store, tree, agent, tmp_path, arms=["no-perception"], runner=FlakyRunner(3))
    assert second.ran == 3 and second.jobs[0].infra_errors == 0  # only the three, attempt 2
    runs = _runs(store)
    assert len(runs) == 43  # every attempt stays in the store
    retried = [r for r in runs if r.attempt == 2]
    assert len(retried) == 3 and all(r.previous is not None for r in retried)
    assert all(store.get(r.previous, RunRecord).outcome == "infra-error" for r in retried)
    third = _run(store, tree, agent, tmp_path, arms=["no-perception"])
    assert third.ran == 0
    jobs = jobs_of(store, show_set(store, SET).task_set)
    rows = score_jobs(store, jobs, n_boot=0, arms=["no-perception"]).record.rows
    assert sum(r.attempts for r in rows) == 43  # the scorer says how many attempts it took


def test_attempts_stop_at_the_limit(store: mc.Store, tree: Path, tmp_path: Path) -> None:
    agent = find_agent(tree / "bench", "baseline")
    for _ in range(3):
        _run(
            store,
            tree,
            agent,
            tmp_path,
            arms=["no-perception"],
            runner=FlakyRunner(40),
            max_attempts=2,
        )
    runs = _runs(store)
    assert len(runs) == 80 and max(r.attempt for r in runs) == 2


def _cli(tmp: Path, tree: Path, store: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "medomni_cas.cli.main",
            "bench",
            "run",
            SET,
            "--agent",
            "slow",
            "--store",
            store,
            "--studio",
            str(tree / "studio"),
            "--bench",
            str(tree / "bench"),
            "--runs",
            str(tmp / "runs"),
            "--arm",
            "no-perception",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _slow_agent(tree: Path) -> None:
    _agent(
        tree,
        "slow",
        command=[
            "python",
            "-c",
            "import os,time,json; time.sleep(0.15); "
            "s=json.load(open('answer_schema.json'))['targets']; "
            "open(os.environ['MEDOMNI_SUBMISSION'],'w').write(json.dumps("
            "{t['name']: (t['classes'][0] if t['classes'] else 1.0) for t in s}))",
        ],
    )


def test_two_harnesses_never_run_a_slot_twice(tree: Path, tmp_path: Path) -> None:
    url = f"lmdb://{tmp_path / 'store'}"
    with mc.open(url) as s:
        build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    _slow_agent(tree)
    procs = [_cli(tmp_path, tree, url) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        # a slot the other harness held is not done by this one: exit 1, and it says so
        assert p.returncode == 0 or b"held by another harness" in out, err.decode()
    last = _cli(tmp_path, tree, url)
    out, err = last.communicate(timeout=300)
    assert last.returncode == 0, err.decode()
    with mc.open(url) as s:
        runs = _runs(s)
        assert len(runs) == 40 and len({r.slot for r in runs}) == 40
        assert not s.refs.as_dict("runs/claims/")


def test_a_killed_harness_resumes_without_loss_or_duplicates(tree: Path, tmp_path: Path) -> None:
    url = f"lmdb://{tmp_path / 'store'}"
    with mc.open(url) as s:
        build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    _slow_agent(tree)
    p = _cli(tmp_path, tree, url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with mc.open(url) as s:
            if len(slot_runs(s)) >= 5:
                break
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    p.wait()
    with mc.open(url) as s:
        done = len(slot_runs(s))
        assert 5 <= done < 40
    again = _cli(tmp_path, tree, url)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err.decode()
    with mc.open(url) as s:
        recorded = slot_runs(s)
        runs = [s.get(r, RunRecord) for r in recorded.values()]
        # nothing lost, no slot recorded twice, none run again once recorded
        assert len(runs) == 40 and len({r.slot for r in runs}) == 40
        assert all(r.attempt == 1 for r in runs)
        # a run the killed harness had written but not yet recorded (the kill can land
        # between the two) is not a second record: unreachable, gc's to remove, and at most
        # one per run it had in flight (test_slot_chunks kills a harness exactly there)
        kept = set(recorded.values())
        stray = [o for o in s.iter_ids() if s.kind(o) == "medomni.run" and o not in kept]
        assert len(stray) <= (os.cpu_count() or 1)
        assert not s.refs.as_dict("runs/claims/")


def test_a_stale_claim_of_a_finished_slot_is_swept(
    store: mc.Store, tree: Path, tmp_path: Path
) -> None:
    """A harness killed between recording a slot's run and releasing its claim leaves the
    claim; the next run removes it, and keeps a claim whose holder is alive."""
    agent = find_agent(tree / "bench", "baseline")
    _run(store, tree, agent, tmp_path, arms=["no-perception"])
    assert not store.refs.as_dict("runs/claims/")
    done = sorted(slot_runs(store))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid names no process now
    host = socket.gethostname()
    stale = store.put_blob(f"{host} {gone.pid} {time.time():.3f}\n".encode())
    live = store.put_blob(f"{host} {os.getpid()} {time.time():.3f}\n".encode())
    a, b = (name.replace("runs/slots/", "runs/claims/") for name in done[:2])
    store.refs.set(a, stale)
    store.refs.set(b, live)
    again = _run(store, tree, agent, tmp_path, arms=["no-perception"])
    assert again.ran == 0
    assert store.refs.as_dict("runs/claims/") == {b: live}


# -- checks ------------------------------------------------------------------------------------
def test_routes_are_checked_before_anything_runs(
    store: mc.Store, tree: Path, tmp_path: Path
) -> None:
    cloud = tree / "bench/agents/cloud.yaml"
    doc = yaml.safe_load((tree / "bench/agents/baseline.yaml").read_text())
    cloud.write_text(yaml.safe_dump({**doc, "route": "cloud"}))
    agent = load_agent(cloud)
    with pytest.raises(CheckFailed, match="only if: Synthetic data may go"):
        _run(store, tree, agent, tmp_path, arms=["no-perception"])
    assert not _runs(store)
    report = _run(store, tree, agent, tmp_path, arms=["no-perception"], accept_conditions=True)
    assert report.ran == 40 and "you accepted" in report.notices[0]


def test_a_denied_route_refuses_the_run(tree: Path, tmp_path: Path) -> None:
    studio = tmp_path / "studio"
    shutil.copytree(tree / "studio", studio, ignore=shutil.ignore_patterns("data"))
    ds = studio / "datasets/synth-ehr/dataset.yaml"
    text = ds.read_text()
    ds.write_text(text.replace("  local:\n    policy: allow", "  local:\n    policy: deny"))
    assert "policy: deny" in ds.read_text()
    s = mc.open("memory://")
    build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    agent = find_agent(tree / "bench", "baseline")
    with pytest.raises(CheckFailed, match="denies the local route"):
        run_set(s, SET, agent, runs_dir=tmp_path / "runs", studio=studio)


def test_a_damaged_task_is_caught_before_any_run(
    store: mc.Store, tree: Path, tmp_path: Path
) -> None:
    from medomni_cas.studio.records import BuildResult

    entry = show_set(store, SET).entries[0]
    atom = store.get(entry.result, BuildResult).atoms[0]
    store.close()
    import lmdb

    env = lmdb.open(str(tmp_path / "store"), max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        db = env.open_db(b"objects", txn=txn)
        raw = bytearray(txn.get(bytes(atom), db=db))
        raw[-1] ^= 1
        txn.put(bytes(atom), bytes(raw), db=db)
    env.close()
    s = mc.open(f"lmdb://{tmp_path / 'store'}")
    with pytest.raises(CheckFailed, match=f"built tasks: .*{atom.hex()[:12]}"):
        run_set(
            s,
            SET,
            find_agent(tree / "bench", "baseline"),
            runs_dir=tmp_path / "r",
            studio=tree / "studio",
        )
    assert not s.refs.as_dict("runs/")


def test_a_served_model_that_differs_is_an_error_of_the_run(
    store: mc.Store, tree: Path, tmp_path: Path
) -> None:
    agent = _agent(
        tree,
        "liar",
        served_model="model-a",
        command=[
            "python",
            "-c",
            "import os,json,runpy; "
            "json.dump({'served_model': 'model-b', 'tokens_in': 5}, "
            "open(os.environ['MEDOMNI_RUN_INFO'],'w')); "
            "runpy.run_module('medomni_cas.bench.baseline', run_name='__main__')",
        ],
    )
    _run(store, tree, agent, tmp_path, arms=["no-perception"])
    runs = _runs(store)
    assert {r.outcome for r in runs} == {"agent-failed"}
    assert all("'model-b' is not the config's 'model-a'" in r.errors[-1] for r in runs)
    assert all(r.tokens_in == 5 and not r.predictions for r in runs)


def test_the_harness_judges_answers(store: mc.Store, tree: Path) -> None:
    """The verdict on a trial's answer: JSON, the format check, the served model; the
    oracle's answer (from the key, outside the task) passes."""
    result = store.get(show_set(store, SET).entries[0].result, BuildResult)
    atom = store.get(result.atoms[0], AtomTask)
    check = store.get(atom.format_check, FormatCheck)
    oracle = oracle_answer(store.get(result.answer_key, AnswerKey), atom, check)
    assert oracle is not None and set(oracle) == {t.name for t in check.targets}
    spec = TrialSpec(mc.ObjectId(bytes(32)), 1, result.atoms[0], atom, check)
    agent = find_agent(tree / "bench", "baseline")

    def judged(
        answer: bytes | None, outcome: Outcome = "answered", model: str = ""
    ) -> tuple[Outcome, dict[str, object], list[str]]:
        trial = Trial(spec.slot, 1, outcome, "t0", "t1", 0, answer=answer, errors=["runner"])
        trial.served_model = model or agent.served_model
        return judge_answer(spec, trial, agent)

    assert judged(msgspec.json.encode(oracle)) == ("answered", oracle, ["runner"])
    assert judged(None, "timeout") == ("timeout", {}, ["runner"])
    outcome, values, errors = judged(b"{not json")
    assert (outcome, values) == ("malformed", {}) and "not JSON" in errors[1]
    outcome, values, errors = judged(b"{}")
    assert (outcome, values) == ("malformed", {}) and errors[0] == "runner" and len(errors) > 1
    outcome, values, errors = judged(msgspec.json.encode(oracle), model="someone-else")
    assert (outcome, values) == ("agent-failed", {})
    assert "'someone-else' is not the config's" in errors[-1]


def test_the_harness_does_not_import_the_gateway() -> None:
    """Recording reads encoder calls without the perception gateway's web stack."""
    code = (
        "import sys, medomni_cas.bench.harness; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn') "
        "or m == 'medomni_cas.bench.perception'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_arms_and_agents_are_named(store: mc.Store, tree: Path, tmp_path: Path) -> None:
    with pytest.raises(mc.MedomniError, match="no arm 'modality-ladder'"):
        _run(
            store, tree, find_agent(tree / "bench", "baseline"), tmp_path, arms=["modality-ladder"]
        )
    with pytest.raises(KeyError, match=r"no agent config 'nobody'.*baseline"):
        find_agent(tree / "bench", "nobody")


# -- run folders -------------------------------------------------------------------------------
def test_run_folder_imports_into_another_store(store: mc.Store, tree: Path, tmp_path: Path) -> None:
    report = _run(
        store, tree, find_agent(tree / "bench", "baseline"), tmp_path, arms=["encoders-required"]
    )
    folder = report.jobs[0].folder
    other = mc.open("memory://")
    jid = import_run_folder(other, folder)
    assert jid == report.jobs[0].job
    job = other.get(jid, JobRecord)
    assert all(r in other for r in job.runs)
    # what the job made comes back whole: its table, agent config, answers, logs, call logs
    assert job.agent_config in other
    table = other.get(job.predictions, PredictionColumns)
    assert all(c in other for c in table.columns.values())
    runs = [other.get(r, RunRecord) for r in job.runs]
    logs = [r.agent_block.encoder_log for r in runs]
    assert all(logs) and all(log in other for log in logs)
    assert all(r.answer in other for r in runs)
    assert all(r.logs is None or r.logs in other for r in runs)
    assert verify_closure(other, [job.predictions, *logs]).ok
    # a damaged column or call log is refused, naming the file, and nothing is written
    column = next((folder / "columns").iterdir())
    good = column.read_bytes()
    column.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    empty = mc.open("memory://")
    with pytest.raises(RunFolderError, match=re.escape(f"{column.name}: not the column")):
        import_run_folder(empty, folder)
    column.write_bytes(good)
    uses = folder / "encoder_use.jsonl"
    calls = uses.read_text()
    uses.write_text(calls.replace('"status":"ok"', '"status":"error"', 1))
    with pytest.raises(RunFolderError, match=r"encoder_use\.jsonl: the calls of run"):
        import_run_folder(empty, folder)
    uses.write_text(calls)
    assert not list(empty.iter_ids())
    # an edited line is refused, naming the file and line, and nothing is written
    lines = (folder / "runs.jsonl").read_text().splitlines()
    lines[3] = lines[3].replace('"answered"', '"timeout"')
    (folder / "runs.jsonl").write_text("\n".join(lines) + "\n")
    third = mc.open("memory://")
    with pytest.raises(RunFolderError, match=r"runs\.jsonl:4: the record does not hash"):
        import_run_folder(third, folder)
    assert not list(third.iter_ids())


def test_runs_folder_must_keep_permissions(tmp_path: Path) -> None:
    check_posix_permissions(tmp_path / "runs")  # ext4/tmpfs keep them
    vfat = shutil.which("mkfs.vfat")
    if vfat is None or os.geteuid() != 0:
        pytest.skip("needs root and mkfs.vfat to mount a FAT file system")
    image = tmp_path / "fat.img"
    subprocess.run(["truncate", "-s", "8M", str(image)], check=True)
    subprocess.run([vfat, str(image)], check=True, capture_output=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-o", "loop", str(image), str(mnt)]).returncode != 0:
        pytest.skip("cannot loop-mount here")
    try:
        with pytest.raises(mc.MedomniError, match="does not keep POSIX permissions"):
            check_posix_permissions(mnt / "runs")
    finally:
        subprocess.run(["umount", str(mnt)])


def test_scores_of_two_task_sets_are_never_mixed(
    store: mc.Store, tree: Path, tmp_path: Path
) -> None:
    agent = find_agent(tree / "bench", "baseline")
    _run(store, tree, agent, tmp_path, arms=["no-perception"])
    build_set(store, "medomni-bench/v1", studio=tree / "studio", bench=tree / "bench")
    run_set(
        store,
        "medomni-bench/v1",
        agent,
        runs_dir=tmp_path / "runs",
        studio=tree / "studio",
        arms=["no-perception"],
    )
    a = jobs_of(store, show_set(store, SET).task_set)
    b = jobs_of(store, show_set(store, "medomni-bench/v1").task_set)
    with pytest.raises(ScoreError, match="different task sets"):
        score_jobs(store, [*a, *b], arms=["no-perception"])


def test_class_probabilities_give_auroc(store: mc.Store, tree: Path, tmp_path: Path) -> None:
    agent = _agent(
        tree,
        "prober",
        command=[
            "python",
            "-c",
            "import os,json,zlib; s=json.load(open('answer_schema.json'))['targets']; "
            "ev=open('labs.jsonl').read(); h=zlib.crc32(ev.encode()); a={}; sc={}\n"
            "for t in s:\n"
            "    if t['classes']:\n"
            "        a[t['name']]=t['classes'][h % len(t['classes'])]\n"
            "        sc[t['name']]={c: ((h >> i) % 7) / 7 for i, c in enumerate(t['classes'])}\n"
            "    else:\n"
            "        a[t['name']]=6.5\n"
            "a['_scores']=sc\n"
            "open(os.environ['MEDOMNI_SUBMISSION'],'w').write(json.dumps(a))",
        ],
    )
    _run(store, tree, agent, tmp_path, arms=["no-perception"])
    runs = _runs(store)
    assert {r.outcome for r in runs} == {"answered"}
    jobs = jobs_of(store, show_set(store, SET).task_set)
    rows = score_jobs(store, jobs, n_boot=50, arms=["no-perception"]).record.rows
    auroc = [r for r in rows if r.metric == "auroc"]
    assert len(auroc) == 1 and auroc[0].target == "ckd_stage" and 0 <= auroc[0].value <= 1
    assert auroc[0].n == 20 and auroc[0].n_missing == 0


def test_format_check_refuses_bad_probabilities() -> None:
    from medomni_cas.studio.records import FormatCheck, TargetShape

    check = FormatCheck(
        targets=(
            TargetShape(name="y", kind="class", classes=("a", "b")),
            TargetShape(name="z", kind="numeric"),
        )
    )
    assert not check.problems({"y": "a", "z": 1.0, "_scores": {"y": {"a": 0.2, "b": 0.8}}})
    bad = check.problems({"y": "a", "z": 1.0, "_scores": {"y": {"c": 0.5}, "z": {"a": 1}}})
    assert any("'c' is not one of" in p for p in bad) and any("z: not a class" in p for p in bad)
    assert check.problems({"y": "a", "z": 1.0, "_scores": {"y": {"a": 1.5}}})
    assert check.problems({"y": "a", "z": 1.0, "_scores": []})


def test_cli_run_and_score_with_runner_options(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from medomni_cas.cli.main import main

    url = f"lmdb://{tmp_path / 'cli-store'}"
    folders = ["--studio", str(tree / "studio"), "--bench", str(tree / "bench")]
    assert main(["studio", "taskset", "build", SET, "--store", url, *folders]) == 0
    run = [
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
    ]
    assert main([*run, "--runner-option", "keep"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main([*run, "--runner-option", "keep=no", "--json"]) == 0
    assert '"ran":40' in capsys.readouterr().out.replace(" ", "")
    score = ["bench", "score", SET, "--store", url, "--out", str(tmp_path / "res")]
    assert main(score) == 1  # one arm of two was run: no score passes as whole
    assert "no job recorded" in capsys.readouterr().err
    assert not (tmp_path / "res/results.parquet").exists()
    assert main([*score, "--arm", "no-perception"]) == 0
    assert (tmp_path / "res/results.parquet").is_file()
