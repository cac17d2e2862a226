"""Claims are leases, and signals stop the harness cleanly: the lease logic against a real
LMDB store and real processes, then `medomni bench run` as a subprocess with a slow agent,
stopped by real signals (SIGTERM, SIGINT, SIGKILL), resumed on this host and on another host
name (a UTS namespace)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.harness import interrupts
from medomni_cas.bench.harness.claims import Holder, Lease, LeaseLost
from medomni_cas.bench.harness.interrupts import Interrupted
from medomni_cas.bench.records import JobRecord, RunRecord
from medomni_cas.bench.slottables import slot_runs
from medomni_cas.store.host import process_start
from medomni_cas.studio.tasksets import build_set
from tests._sets import small_tree

ROOT = Path(__file__).resolve().parent.parent
SET = "medomni-bench/leases"
SLOTS = 20  # one n20 pair under one arm
CONCURRENCY = 2  # trials each harness runs at once (`bench run --concurrency`)
HOST = socket.gethostname()


def _slot(i: int) -> bytes:
    return bytes([i]) * 32


def _gone_pid() -> int:
    """A pid that names no process now."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def store(tmp_path: Path) -> Iterator[mc.Store]:
    s = mc.open(f"lmdb://{tmp_path / 'store'}")
    yield s
    s.close()


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is no harness."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def _beat(store: mc.Store, holder: Holder, age: float = 0.0) -> None:
    """A heartbeat of ``holder`` as its harness writes it, renewed ``age`` seconds ago."""
    beat = store.put_blob(f"{holder.line()} {time.time() - age:.3f}\n".encode())
    store.refs.set(f"runs/leases/{holder.nonce}", beat)


def _forge_claim(store: mc.Store, slot: bytes, holder: Holder) -> None:
    store.refs.set(f"runs/claims/{slot.hex()}", store.put_blob(f"{holder.line()}\n".encode()))


# -- host -------------------------------------------------------------------------------------
def test_process_start_tells_processes_apart(stranger: subprocess.Popen[bytes]) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc: start times cannot be read here")
    mine = process_start(os.getpid())
    assert mine is not None and mine == process_start(os.getpid())
    assert process_start(stranger.pid) not in (None, mine)
    assert process_start(_gone_pid()) is None
    assert process_start(0) is None


# -- the lease logic ----------------------------------------------------------------------------
def test_a_claim_names_its_holder_and_is_released(store: mc.Store) -> None:
    with Lease(store, 30) as a, Lease(store, 30) as b:
        assert a.claim(_slot(1)) is None
        assert a.claim(_slot(1)) is None  # ours already
        text = store.read_blob(store.refs[f"runs/claims/{_slot(1).hex()}"]).decode()
        assert text.split() == [HOST, str(os.getpid()), a.holder.start or "-", a.holder.nonce, "30"]
        assert b.claim(_slot(1)) == a.holder  # live: the same process, its heartbeat fresh
        a.release(_slot(1))
        assert b.claim(_slot(1)) is None
        assert a.claim(_slot(2)) is None and a.held == {_slot(2)}
        assert set(store.refs.as_dict("runs/leases/")) == {
            f"runs/leases/{a.holder.nonce}",
            f"runs/leases/{b.holder.nonce}",
        }
    assert not store.refs.as_dict("runs/claims/")  # close released every claim
    assert not store.refs.as_dict("runs/leases/")  # and ended both heartbeats


def test_one_heartbeat_write_per_beat_however_many_claims(store: mc.Store) -> None:
    with Lease(store, 0.6) as lease:
        for i in range(200):
            assert lease.claim(_slot(i)) is None
        beat = f"runs/leases/{lease.holder.nonce}"
        deadline = time.monotonic() + 60
        while len(store.refs.history(beat)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(store.refs.history(beat)) >= 4  # made, then renewed
        lease.check()
        claims = store.refs.as_dict("runs/claims/")
        assert len(claims) == 200 and len(set(claims.values())) == 1  # one blob for all
        assert all(len(store.refs.history(name)) == 1 for name in claims)  # never rewritten


def test_a_lapsed_lease_is_ended_and_its_claims_taken_over(
    store: mc.Store, stranger: subprocess.Popen[bytes]
) -> None:
    """A holder on another host whose heartbeat was not renewed within its lease."""
    away = Holder("elsewhere", stranger.pid, "1@boot", "feedfacefeedface", 2.0)
    _forge_claim(store, _slot(1), away)
    _beat(store, away, age=1.0)
    with Lease(store, 30) as lease:
        assert lease.claim(_slot(1)) == away  # renewed a second ago: live
    _beat(store, away, age=5.0)
    with Lease(store, 30) as lease:
        assert lease.claim(_slot(1)) is None  # lapsed: taken over
        assert "runs/leases/feedfacefeedface" not in store.refs  # ended first
        history = store.refs.history(f"runs/claims/{_slot(1).hex()}")
        assert history[-1].message == "take over a stale claim"


def test_a_dead_or_reused_pid_on_this_host_is_stale_at_once(
    store: mc.Store, stranger: subprocess.Popen[bytes]
) -> None:
    start = process_start(stranger.pid) or ""
    live = Holder(HOST, stranger.pid, start, "0000000000000001", 600.0)
    dead = Holder(HOST, _gone_pid(), start, "0000000000000002", 600.0)
    reused = Holder(HOST, stranger.pid, "1@another-boot", "0000000000000003", 600.0)
    for i, holder in enumerate((live, dead, reused)):
        _forge_claim(store, _slot(i), holder)
        _beat(store, holder)  # renewed just now: only the process tells
    with Lease(store, 30) as lease:
        assert lease.claim(_slot(0)) == live
        assert lease.claim(_slot(1)) is None
        if start:  # where start times can be read, a pid of another process is no holder
            assert lease.claim(_slot(2)) is None


def test_claims_made_before_leases_keep_their_rule(
    store: mc.Store, stranger: subprocess.Popen[bytes]
) -> None:
    now = time.time()
    old = {
        0: f"{HOST} {stranger.pid} {now:.3f}",  # live pid: live
        1: f"{HOST} {_gone_pid()} {now:.3f}",  # dead pid: stale
        2: f"elsewhere 1 {now - 60:.3f}",  # another host, a minute old: live
        3: f"elsewhere 1 {now - 7 * 3600:.3f}",  # another host, seven hours old: stale
        4: "not a claim",
    }
    for i, text in old.items():
        store.refs.set(f"runs/claims/{_slot(i).hex()}", store.put_blob(text.encode()))
    with Lease(store, 30) as lease:
        got = {i: lease.claim(_slot(i)) for i in old}
    assert got[0] == Holder(HOST, stranger.pid, lease=6 * 3600.0)
    assert got[2] is not None and got[2].host == "elsewhere"
    assert got[1] is None and got[3] is None and got[4] is None


def test_sweep_removes_stale_claims_of_finished_slots_only(
    store: mc.Store, stranger: subprocess.Popen[bytes]
) -> None:
    live = Holder(HOST, stranger.pid, process_start(stranger.pid) or "", "00000000000000aa", 600.0)
    dead = Holder(HOST, _gone_pid(), "", "00000000000000bb", 600.0)
    _beat(store, live)
    for i, holder in ((0, live), (1, dead), (2, dead)):
        _forge_claim(store, _slot(i), holder)
    with Lease(store, 30) as lease:
        lease.sweep([_slot(0), _slot(1), _slot(2)], running={_slot(2)})
    left = {
        bytes.fromhex(n.removeprefix("runs/claims/")) for n in store.refs.as_dict("runs/claims/")
    }
    assert left == {_slot(0), _slot(2)}  # live kept; the running slot is the harness's to claim


def test_a_lease_ended_by_another_harness_stops_its_holder(store: mc.Store) -> None:
    with Lease(store, 0.6) as lease:
        assert lease.claim(_slot(1)) is None
        beat = f"runs/leases/{lease.holder.nonce}"
        assert lease.holds(_slot(1))
        store.refs.delete(beat)  # what a harness does that found it lapsed
        with Lease(store, 30) as other:
            assert other.claim(_slot(1)) is None  # its heartbeat gone: taken over
            assert not lease.holds(_slot(1))  # so its trial there is not recorded
        deadline = time.monotonic() + 60
        with pytest.raises(LeaseLost, match="ended"):  # poll until it notices
            while time.monotonic() < deadline:
                lease.check()
                time.sleep(0.05)
        with pytest.raises(LeaseLost):
            lease.claim(_slot(2))


def test_a_lease_that_cannot_be_renewed_stops_its_holder(tmp_path: Path) -> None:
    """The store is gone (its folder removed): no renewal, so no more trials."""
    folder = tmp_path / "gone"
    store = mc.open(f"file://{folder}")
    lease = Lease(store, 0.6)
    assert lease.claim(_slot(1)) is None
    shutil.rmtree(folder)
    deadline = time.monotonic() + 60
    with pytest.raises(LeaseLost, match="renewed"):  # poll until it notices
        while time.monotonic() < deadline:
            lease.check()
            time.sleep(0.05)
    with pytest.raises(OSError):
        lease.close()  # nothing left to release on
    store.close()


# -- interrupts, in this process ----------------------------------------------------------------
def test_a_signal_raises_where_interruptible_and_waits_where_protected() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.stop_on_signals():
        with interrupts.protected():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler has run: nothing raised in here
            os.kill(os.getpid(), signal.SIGINT)  # a second signal: ignored
            with pytest.raises(Interrupted) as caught:
                interrupts.check()
            interrupts.check()  # raised once only
        assert caught.value.signum == signal.SIGTERM and caught.value.exit_status == 143
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(Interrupted) as caught, interrupts.stop_on_signals():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # cut short
    assert caught.value.exit_status == 130
    assert not isinstance(caught.value, Exception)  # a runner's `except Exception` lets it by


def test_signals_are_left_alone_outside_the_main_thread() -> None:
    seen: list[object] = []

    def run() -> None:
        with interrupts.stop_on_signals():
            seen.append(signal.getsignal(signal.SIGTERM))
            interrupts.check()

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before]


# -- the harness, stopped by real signals ----------------------------------------------------------
AGENT = """
import json, os, sys, time
log = open(sys.argv[1], "a")
log.write(f"start {os.getpid()}\\n"); log.flush()
time.sleep(0.3)
targets = json.load(open("answer_schema.json"))["targets"]
answer = {t["name"]: (t["classes"][0] if t["classes"] else 1.0) for t in targets}
open(os.environ["MEDOMNI_SUBMISSION"], "w").write(json.dumps(answer))
log.write(f"end {os.getpid()}\\n")
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trees, a slow agent that logs its pid as it starts and ends, and a store with the
    set built (copied for each test)."""
    root = small_tree(
        tmp_path_factory.mktemp("leases"),
        arms=["no-perception"],
        pairs=("synth-ehr_ckd-staging@n20",),
        name="leases",
    )
    doc = yaml.safe_load((root / "bench/agents/baseline.yaml").read_text())
    doc["agent"] = "slow"
    doc["settings"]["command"] = ["python", "-c", AGENT, str(root / "agent.log")]
    (root / "bench/agents/slow.yaml").write_text(yaml.safe_dump(doc))
    with mc.open(f"lmdb://{root / 'store'}") as s:
        build_set(s, SET, studio=root / "studio", bench=root / "bench")
    return root


class Bench:
    """A store of the built set for one test, and harnesses run on it."""

    def __init__(self, built: Path, tmp: Path) -> None:
        self.tree, self.tmp = built, tmp
        shutil.copytree(built / "store", tmp / "store")
        self.url = f"lmdb://{tmp / 'store'}"
        self.log = built / "agent.log"
        self.log.write_text("")
        (tmp / "scratch").mkdir()
        self.env = {**os.environ, "TMPDIR": str(tmp / "scratch")}  # trials' scratch folders

    def folders(self) -> list[str]:
        tree = self.tree
        return ["--studio", str(tree / "studio"), "--bench", str(tree / "bench")]

    def cli(self, *extra: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "medomni_cas.cli.main", "bench", "run", SET]
        cmd += ["--agent", "slow", "--store", self.url, *self.folders()]
        cmd += ["--runs", str(self.tmp / "runs"), "--concurrency", str(CONCURRENCY), *extra]
        return subprocess.Popen(
            [*prefix, *cmd], cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def refs(self, prefix: str) -> dict[str, mc.ObjectId]:
        with mc.open(self.url) as s:
            return slot_runs(s) if prefix == "runs/slots/" else s.refs.as_dict(prefix)

    def wait_for_runs(self, n: int, p: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 120
        while len(self.refs("runs/slots/")) < n:
            if p.poll() is not None:
                raise AssertionError(f"harness ended early: {p.stderr.read().decode()}")  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no runs recorded"
            time.sleep(0.05)

    def agents(self) -> tuple[list[int], list[int]]:
        lines = [line.split() for line in self.log.read_text().splitlines()]
        return [int(p) for w, p in lines if w == "start"], [int(p) for w, p in lines if w == "end"]

    def runs(self) -> list[RunRecord]:
        """The runs the slots point at (a harness killed between writing a run and moving
        its slot's ref leaves that run unreachable: not recorded, and gc's to remove)."""
        with mc.open(self.url) as s:
            return [s.get(o, RunRecord) for o in slot_runs(s).values()]

    def assert_every_slot_ran_once(self) -> None:
        runs = self.runs()
        assert len(self.refs("runs/slots/")) == SLOTS
        assert len(runs) == SLOTS and len({r.slot for r in runs}) == SLOTS  # none twice
        assert all(r.outcome == "answered" and r.attempt == 1 for r in runs)
        with mc.open(self.url) as s:
            stored = [o for o in s.iter_ids() if s.kind(o) == "medomni.run"]
        assert len(stored) <= SLOTS + CONCURRENCY  # at most the killed harness's last few
        starts, _ = self.agents()
        assert SLOTS <= len(starts) <= SLOTS + CONCURRENCY  # only the trials in flight again
        assert not self.refs("runs/claims/")


@pytest.fixture
def bench(built: Path, tmp_path: Path) -> Bench:
    return Bench(built, tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_harness_and_records_what_finished(
    bench: Bench, signum: signal.Signals
) -> None:
    p = bench.cli("--claim-timeout", "5")
    bench.wait_for_runs(3, p)
    (beat,) = bench.refs("runs/leases/").values()  # one heartbeat, with the lease asked for
    with mc.open(bench.url) as s:
        assert s.read_blob(beat).decode().split()[4] == "5"
    p.send_signal(signum)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signum, err.decode()
    assert f"interrupted by {signum.name}" in err.decode()
    assert not bench.refs("runs/claims/") and not bench.refs("runs/leases/")
    done = bench.refs("runs/slots/")
    assert 3 <= len(done) < SLOTS
    (job,) = bench.refs("runs/jobs/").values()  # the job is recorded with the runs that finished
    with mc.open(bench.url) as s:
        record = s.get(job, JobRecord)
    assert sorted(record.runs) == sorted(done.values())
    assert f"{len(done)} run" in out.decode()
    # the trials in flight were ended with the harness, not left running
    starts, ends = bench.agents()
    in_flight = set(starts) - set(ends)
    assert len(in_flight) <= CONCURRENCY
    time.sleep(0.5)  # longer than the agent would have needed to write "end"
    assert set(bench.agents()[1]) == set(ends)
    again = bench.cli()
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err.decode()
    bench.assert_every_slot_ran_once()


def _other_host() -> tuple[str, ...]:
    """A prefix that runs a command under another host name (a UTS namespace)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to run a harness under another host name")
    cmd = ["unshare", "--uts"] + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])
    probe = subprocess.run([*cmd, "hostname", "medomni-elsewhere"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare cannot make a UTS namespace here: {probe.stderr.decode().strip()}")
    return (*cmd, "sh", "-c", 'hostname medomni-elsewhere && exec "$@"', "sh")


ELSEWHERE = f"""
import sys
from pathlib import Path
import medomni_cas as mc
from medomni_cas.bench.agents import load_agent
from medomni_cas.bench.harness import run_set
url, tree, runs = sys.argv[1:4]
with mc.open(url) as store:
    agent = load_agent(Path(tree) / "bench/agents/slow.yaml")
    run_set(store, "{SET}", agent, runs_dir=Path(runs), studio=Path(tree) / "studio",
            arms=["no-perception"], claim_timeout=2.0, concurrency={CONCURRENCY})
"""


def test_a_killed_harness_on_another_host_is_taken_over_once_its_lease_lapses(
    bench: Bench,
) -> None:
    """Observed: a dead host's claim lasted 6 hours. A harness on another host name, with a
    lease of 2 s, is killed mid-run; a harness here with the default lease takes its slots
    over once that lease lapsed, and loses or doubles nothing."""
    prefix = _other_host()
    args = [bench.url, str(bench.tree), str(bench.tmp / "runs")]
    away = subprocess.Popen(
        [*prefix, sys.executable, "-c", ELSEWHERE, *args],
        cwd=ROOT,
        env=bench.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    bench.wait_for_runs(3, away)
    away.send_signal(signal.SIGKILL)
    away.communicate()
    with mc.open(bench.url) as s:
        claims = s.refs.as_dict("runs/claims/")
        assert claims and all(
            s.read_blob(c).decode().startswith("medomni-elsewhere ") for c in claims.values()
        )
    time.sleep(3)  # its lease (2 s) lapses: nobody renews it
    here = bench.cli()
    _, err = here.communicate(timeout=300)
    assert here.returncode == 0, err.decode()
    bench.assert_every_slot_ran_once()
    assert not bench.refs("runs/leases/")


def test_a_live_process_with_the_holders_pid_does_not_block_its_slots(
    bench: Bench, stranger: subprocess.Popen[bytes]
) -> None:
    """Observed: a reused pid made a dead holder look alive. A harness killed mid-run leaves
    claims naming its pid; given to an unrelated live process (each claim rewritten to name
    it), the claims do not block the slots."""
    p = bench.cli()
    bench.wait_for_runs(3, p)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    with mc.open(bench.url) as s:
        claims = s.refs.as_dict("runs/claims/")
        assert claims
        for name, claim in claims.items():
            fields = s.read_blob(claim).decode().split()
            assert fields[:2] == [HOST, str(p.pid)]
            fields[1] = str(stranger.pid)  # the pid now names another process
            s.refs.set(name, s.put_blob((" ".join(fields) + "\n").encode()))
    again = bench.cli()
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err.decode()
    bench.assert_every_slot_ran_once()
