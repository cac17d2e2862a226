"""Trials cannot touch each other, and agents get no secrets (issue 13, section 6).

Each test runs real agents (small Python scripts in tmp_path) through the real process
runner and harness, on a real LMDB store: a detached child that tries to answer for later
trials and spend their encoder calls, an agent that reads the store through the harness's
/proc entry, one that dumps its environment, a harness killed mid-trial.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.agents import load_agent
from medomni_cas.bench.harness import CheckFailed, RunReport, run_set
from medomni_cas.bench.process import ProcessRunner, namespaces_available
from medomni_cas.bench.records import AgentConfig, RunRecord
from medomni_cas.bench.scratch import SCRATCH_FOLDER, Scratch, sweep
from medomni_cas.studio.tasksets import build_set
from tests._sets import small_tree

ROOT = Path(__file__).resolve().parent.parent
SET = "medomni-bench/iso"
SANDBOX = ROOT / "medomni_cas/bench/sandbox.py"
needs_namespaces = pytest.mark.skipif(
    bool(namespaces_available()), reason=f"no namespaces here: {namespaces_available()}"
)
ISOLATIONS = ["none", pytest.param("namespaces", marks=needs_namespaces)]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One pair of four atom tasks (a cohort of four patients, added to the copy) on an arm
    that attaches the perception service."""
    root = small_tree(
        tmp_path_factory.mktemp("iso"),
        arms=["encoders-required"],
        pairs=("synth-ehr_ckd-staging@n4",),
        name="iso",
    )
    cohorts = root / "studio/datasets/synth-ehr/tasks/synth-ehr_ckd-staging/cohorts"
    doc = yaml.safe_load((cohorts / "n20.yaml").read_text())
    doc |= {"description": "Four patients.", "n": 4}
    doc["per_class"]["counts"] = {"G1": 1, "G3a": 1, "G4": 1, "G5": 1}
    (cohorts / "n4.yaml").write_text(yaml.safe_dump(doc))
    return root


@pytest.fixture
def ws(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A workspace folder, the harness's cwd, with its store in ``.medomni/store``; agents
    find the report folder in ``ISO_REPORT`` (their configs name it, so their commands and
    slots are the same from one run of the tests to the next)."""
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "report").mkdir()
    monkeypatch.setenv("ISO_REPORT", str(tmp_path / "report"))
    with mc.open(f"lmdb://{root / '.medomni/store'}") as s:
        build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    monkeypatch.chdir(root)
    yield root


def _agent(
    tmp_path: Path, name: str, script: str, env: tuple[str, ...] = (), **limits: int
) -> AgentConfig:
    """An agent config running ``script`` with ``python -c``."""
    doc = {
        "kind": "agent",
        "agent": name,
        "model": "none",
        "route": "local",
        "settings": {
            "scaffold": "process",
            "served_model": "none",
            "env": ["ISO_REPORT", *env],
            "limits": limits,
            "command": ["python", "-c", textwrap.dedent(script)],
        },
    }
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(doc))
    return load_agent(config)


def _run(
    ws: Path, tree: Path, agent: AgentConfig, isolation: str
) -> tuple[RunReport, list[RunRecord]]:
    """Run the set's four slots; the report, and every run record by start time."""
    with mc.open(f"lmdb://{ws / '.medomni/store'}") as s:
        report = run_set(
            s,
            SET,
            agent,
            runs_dir=ws / "runs",
            studio=tree / "studio",
            runner=ProcessRunner(isolation=isolation),
            concurrency=1,  # one after another: the agents here tell the first trial apart
        )
        runs = [s.get(o, RunRecord) for o in s.iter_ids() if s.kind(o) == "medomni.run"]
    return report, sorted(runs, key=lambda r: r.started)


ANSWER = """
import json, os
from pathlib import Path
report = Path(os.environ["ISO_REPORT"])
work = Path(os.environ["MEDOMNI_WORKSPACE"])
sub = Path(os.environ["MEDOMNI_SUBMISSION"])
schema = json.loads((work / "answer_schema.json").read_text())["targets"]
answer = json.dumps({t["name"]: (t["classes"][0] if t["classes"] else 1.0) for t in schema})
"""

# Answers at once, after one encoder call (the arm requires one).
QUICK = (
    ANSWER
    + """
import urllib.request
url = os.environ["MEDOMNI_PERCEPTION_URL"]
with urllib.request.urlopen(url + "/v1/encoders", timeout=10) as r:
    name = json.load(r)[0]["name"]
body = json.dumps({"encoder": name}).encode()
urllib.request.urlopen(url + "/v1/encode", data=body, timeout=30).read()
sub.write_text(answer)
"""
)

# The first trial answers, then leaves a detached child (setsid, double fork) that writes
# its answer into every other trial folder it finds and calls the gateway. Later trials do
# nothing of their own: they wait while the child lives (it holds a lock) for it to answer.
DETACHING = (
    ANSWER
    + """
import fcntl, sys, time, urllib.request
try:
    os.close(os.open(report / "first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except FileExistsError:
    fd = os.open(report / "alive", os.O_RDONLY)
    deadline = time.time() + 20
    while time.time() < deadline and not sub.exists():
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break  # the child is dead
        except OSError:
            time.sleep(0.05)
    sys.exit(0)
sub.write_text(answer)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for n in (0, 1, 2):
            os.dup2(null, n)
        lock = os.open(report / "alive", os.O_CREAT | os.O_RDWR)
        fcntl.flock(lock, fcntl.LOCK_EX)
        (report / "locked").touch()
        url = os.environ["MEDOMNI_PERCEPTION_URL"]
        rel = sub.relative_to(work)
        deadline = time.time() + 30
        while time.time() < deadline and not (report / "stop").exists():
            (report / "beat").write_text(str(time.time()))
            for root, pattern in ((work.parent.parent, "*/workspace"),
                                  (work.parent.parent.parent, "*/agent/workspace")):
                for other in root.glob(pattern):
                    if other != work and not (other / rel).exists():
                        (other / rel).write_text(answer)
            try:
                urllib.request.urlopen(url + "/v1/encoders", timeout=2).read()
            except OSError:
                pass
            time.sleep(0.05)
        os._exit(0)
    os._exit(0)
os.wait()
deadline = time.time() + 20
while time.time() < deadline and not (report / "locked").exists():
    time.sleep(0.02)
"""
)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_detached_child_dies_with_its_trial(
    ws: Path, tree: Path, tmp_path: Path, isolation: str
) -> None:
    agent = _agent(tmp_path, "detaching", DETACHING)
    report_dir = tmp_path / "report"
    try:
        _, runs = _run(ws, tree, agent, isolation)
    finally:
        (report_dir / "stop").touch()  # on a runner that let it live, end the child
    assert len(runs) == 4 and (report_dir / "locked").exists()
    first, later = runs[0], runs[1:]
    # nothing it left behind answered for a later trial or spent its calls
    assert [r.outcome for r in later] == ["agent-failed"] * len(later)
    assert all(r.agent_block.encoder_calls == 0 for r in later)
    assert not any(r.agent_block.meets_arm for r in later)
    assert first.outcome == "answered"
    assert all(r.environment == "local" and r.isolation == isolation for r in runs)
    beat = (report_dir / "beat").stat().st_mtime
    time.sleep(0.3)
    assert (report_dir / "beat").stat().st_mtime == beat  # and it is not running now


# The first trial runs past its time limit; it and a child in a session of its own both
# ignore SIGTERM. Later trials fail at once.
STUBBORN = """
import fcntl, os, signal, sys, time
from pathlib import Path
report = Path(os.environ["ISO_REPORT"])
try:
    os.close(os.open(report / "first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except FileExistsError:
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    lock = os.open(report / "alive", os.O_CREAT | os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    (report / "locked").touch()
    time.sleep(60)
    os._exit(0)
while not (report / "locked").exists():
    time.sleep(0.02)
time.sleep(60)
"""


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_timeout_kills_every_process_of_the_trial(
    ws: Path, tree: Path, tmp_path: Path, isolation: str
) -> None:
    agent = _agent(tmp_path, "stubborn", STUBBORN, time_sec=2)
    _, runs = _run(ws, tree, agent, isolation)
    assert [r.outcome for r in runs] == ["timeout", *["agent-failed"] * 3]
    assert "within 2 s" in runs[0].errors[0]
    assert _free(tmp_path / "report/alive")  # its detached child went with it


TOKENS = """
import json, os, sys, urllib.error, urllib.request
from pathlib import Path
report = Path(os.environ["ISO_REPORT"])
url = os.environ["MEDOMNI_PERCEPTION_URL"]

def status(u, path="/v1/encoders", data=None):
    try:
        with urllib.request.urlopen(u + path, data=data, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code

with urllib.request.urlopen(url + "/v1/encoders", timeout=10) as r:
    name = json.load(r)[0]["name"]

def encode(u):
    return status(u, "/v1/encode", json.dumps({"encoder": name}).encode())

seen = report / "urls"
earlier = seen.read_text().split() if seen.exists() else []
with seen.open("a") as f:
    f.write(url + "\\n")
got = {"own": status(url), "none": status(url.split("/t/")[0]), "encode": encode(url)}
if earlier:
    got["ended"] = status(earlier[-1])
    got["ended_encode"] = encode(earlier[-1])
with (report / "statuses").open("a") as f:
    f.write(json.dumps(got) + "\\n")
"""


def test_gateway_calls_need_the_trials_own_token(ws: Path, tree: Path, tmp_path: Path) -> None:
    agent = _agent(tmp_path, "tokens", TOKENS)
    _, runs = _run(ws, tree, agent, "none")
    assert len(runs) == 4
    got = [json.loads(line) for line in (tmp_path / "report/statuses").read_text().splitlines()]
    assert got[0] == {"own": 200, "none": 401, "encode": 200}
    later = {"own": 200, "none": 401, "encode": 200, "ended": 403, "ended_encode": 403}
    assert all(g == later for g in got[1:])
    # a refused call is no trial's: each run logged only its own encode call
    assert [r.agent_block.encoder_calls for r in runs] == [1] * len(runs)


SNOOP = """
import json, os
from pathlib import Path
report = Path(os.environ["ISO_REPORT"])
harness, store, studio, runs = json.loads(os.environ["ISO_SNOOP"])

def ls(p):
    try:
        return sorted(os.listdir(p))
    except OSError as e:
        return "error: " + e.strerror

work = os.environ["MEDOMNI_WORKSPACE"]
got = {
    "via_proc": ls(f"/proc/{harness}/cwd/.medomni/store"),
    "store": ls(store),
    "studio": ls(studio),
    "runs": ls(runs),
    "up_from_cwd": ls("../../../../.."),
    "owner": ls(Path(work).parent.parent.parent),
    "pids": [p for p in os.listdir("/proc") if p.isdigit()],
}
(report / "snoop.json").write_text(json.dumps(got))
"""


@needs_namespaces
def test_an_agent_cannot_see_the_store_studio_or_runs(
    ws: Path, tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ws / ".medomni/store"
    assert "data.mdb" in os.listdir(f"/proc/{os.getpid()}/cwd/.medomni/store")  # the attack
    paths = [os.getpid(), str(store), str(tree / "studio"), str(ws / "runs")]
    monkeypatch.setenv("ISO_SNOOP", json.dumps(paths))
    agent = _agent(tmp_path, "snoop", SNOOP, env=("ISO_SNOOP",))
    _, runs = _run(ws, tree, agent, "namespaces")
    got = json.loads((tmp_path / "report/snoop.json").read_text())
    assert not isinstance(got["via_proc"], list) or "data.mdb" not in got["via_proc"]
    assert got["store"] == [] and got["studio"] == []
    assert got["runs"] == [SCRATCH_FOLDER] == got["up_from_cwd"]  # no job folders, no store
    assert len(got["owner"]) == 1  # its own trial folder, no other
    assert str(os.getpid()) not in got["pids"] and len(got["pids"]) <= 3
    assert runs and all(r.isolation == "namespaces" for r in runs)


ENVIRONMENT = """
import json, os, stat, sys
from pathlib import Path
work = Path(os.environ["MEDOMNI_WORKSPACE"])
folders = {"trial": work.parent.parent, "scratch": work.parent.parent.parent.parent,
           "tmp": Path(os.environ.get("TMPDIR", "/"))}
Path(os.environ["ISO_REPORT"], "env.json").write_text(json.dumps({
    "env": dict(os.environ),
    "modes": {k: stat.S_IMODE(p.stat().st_mode) for k, p in folders.items()},
}))
"""


def test_agents_get_an_allowlisted_environment_and_private_folders(
    ws: Path, tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("MODEL_API_KEY", "named-by-the-config")
    agent = _agent(tmp_path, "env", ENVIRONMENT, env=("MODEL_API_KEY",))
    _, runs = _run(ws, tree, agent, "none")
    got = json.loads((tmp_path / "report/env.json").read_text())
    env = got["env"]
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["MODEL_API_KEY"] == "named-by-the-config"
    assert {k for k in env if not k.startswith("MEDOMNI_")} <= {
        "PATH", "HOME", "LANG", "TMPDIR", "MODEL_API_KEY", "PYTHONPATH", "ISO_REPORT"
    }  # fmt: skip
    scratch = (ws / "runs" / SCRATCH_FOLDER).resolve()
    assert Path(env["MEDOMNI_WORKSPACE"]).is_relative_to(scratch)
    assert Path(env["TMPDIR"]).is_relative_to(scratch)
    assert got["modes"] == {"trial": 0o700, "scratch": 0o700, "tmp": 0o700}
    assert os.listdir(scratch) == []  # removed once recorded
    assert runs and runs[0].isolation == "none"
    # a variable the config names but nobody set is a check failure naming both
    monkeypatch.delenv("MODEL_API_KEY")
    agent = _agent(tmp_path, "env", ENVIRONMENT + "# slots not run yet\n", env=("MODEL_API_KEY",))
    with pytest.raises(CheckFailed, match=r"agent config env: settings\.env names MODEL_API_KEY"):
        _run(ws, tree, agent, "none")


SLOW = """
import fcntl, os, sys, time
from pathlib import Path
report = Path(os.environ["ISO_REPORT"])
lock = os.open(report / "alive", os.O_CREAT | os.O_RDWR)
fcntl.flock(lock, fcntl.LOCK_EX)
(report / "started").write_text(os.environ["MEDOMNI_WORKSPACE"])
time.sleep(60)
"""


def _free(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def test_a_killed_harness_leaves_no_agent_and_its_scratch_is_swept(
    ws: Path, tree: Path, tmp_path: Path
) -> None:
    _agent(tmp_path, "slow", SLOW)
    argv = [sys.executable, "-m", "medomni_cas.cli.main", "bench", "run", SET]
    argv += ["--agent", str(tmp_path / "slow.yaml"), "--store", f"lmdb://{ws / '.medomni/store'}"]
    argv += ["--studio", str(tree / "studio"), "--bench", str(tree / "bench")]
    argv += ["--runs", str(ws / "runs")]
    harness = subprocess.Popen(argv, cwd=ws, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = tmp_path / "report/started"
    deadline = time.monotonic() + 120
    while not started.exists() and harness.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), harness.stderr.read().decode() if harness.stderr else ""
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    harness.stderr.close()  # type: ignore[union-attr]
    work = Path(started.read_text())
    scratch = (ws / "runs" / SCRATCH_FOLDER).resolve()
    assert work.is_relative_to(scratch) and work.is_dir()  # left behind, where it belongs
    deadline = time.monotonic() + 60
    while not _free(tmp_path / "report/alive") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _free(tmp_path / "report/alive")  # the agent died with its harness
    quick = _agent(tmp_path, "quick", QUICK)
    _, runs = _run(ws, tree, quick, "auto")
    assert any(r.outcome == "answered" for r in runs), [(r.outcome, r.errors) for r in runs]
    assert not work.exists() and os.listdir(scratch) == []  # swept, and this run's removed


def test_without_namespaces_auto_runs_with_none_and_says_so(
    ws: Path, tree: Path, tmp_path: Path
) -> None:
    """Root without CAP_SYS_ADMIN (as in a default container) may not make namespaces."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to drop CAP_SYS_ADMIN")
    _agent(tmp_path, "quick", QUICK)
    argv = [setpriv, "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"]
    argv += [sys.executable, "-m", "medomni_cas.cli.main", "bench", "run", SET]
    argv += ["--agent", str(tmp_path / "quick.yaml"), "--store", f"lmdb://{ws / '.medomni/store'}"]
    argv += ["--studio", str(tree / "studio"), "--bench", str(tree / "bench")]
    argv += ["--runs", str(ws / "runs")]
    strict = subprocess.run([*argv, "--runner-option", "isolation=namespaces"], capture_output=True)
    assert strict.returncode == 1
    assert b"isolation=namespaces is not available here" in strict.stderr
    auto = subprocess.run(argv, capture_output=True)
    assert auto.returncode == 0, auto.stderr.decode()
    with mc.open(f"lmdb://{ws / '.medomni/store'}") as s:
        runs = [s.get(o, RunRecord) for o in s.iter_ids() if s.kind(o) == "medomni.run"]
    assert [(r.outcome, r.isolation) for r in runs] == [("answered", "none")] * 4
    assert all(r.agent_block.meets_arm for r in runs)
    with pytest.raises(mc.MedomniError, match="isolation='bogus'"):
        ProcessRunner(isolation="bogus")


def test_the_sweep_spares_live_owners_and_keeps_what_was_kept(tmp_path: Path) -> None:
    root = tmp_path / SCRATCH_FOLDER
    live = Scratch(root)
    mine = live.trial()
    kept = Scratch(root, keep=True)
    kept_trial = kept.trial()
    kept.close()
    (root / "orphan").mkdir()  # an owner folder whose lock is gone
    assert sweep(root) == [root / "orphan"]
    assert mine.is_dir() and oct(root.stat().st_mode & 0o777) == "0o700"
    assert (root / f"kept-{kept.folder.name}" / kept_trial.name).is_dir()
    live.close()
    assert sorted(os.listdir(root)) == [f"kept-{kept.folder.name}"]


def _as_nobody() -> list[str]:
    """A command prefix running as nobody with an interpreter nobody may run, if any."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return []
    prefix = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    for python in (sys.executable, "/usr/bin/python3", shutil.which("python3") or ""):
        if (
            python
            and subprocess.run([*prefix, python, "-c", ""], capture_output=True).returncode == 0
        ):
            return [*prefix, python]
    return []


def test_the_sandbox_works_unprivileged_where_user_namespaces_are_allowed() -> None:
    nobody = _as_nobody()
    if not nobody:
        pytest.skip("needs root, setpriv and an interpreter nobody may run")
    if subprocess.run([*nobody, "-I", "-S", str(SANDBOX), "--probe"]).returncode != 0:
        pytest.skip("this kernel allows no unprivileged user namespaces")
    hidden = SANDBOX.parent
    pids = "sum(p.isdigit() for p in os.listdir('/proc'))"
    code = f"import os; print(os.listdir({str(hidden)!r}), {pids} <= 3)"
    done = subprocess.run(
        [*nobody, "-I", "-S", str(SANDBOX), "--hide", str(hidden), "--", *nobody[-1:], "-c", code],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True"]
