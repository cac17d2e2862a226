"""The job's perception gateway and the relay binary, without Docker: real processes on loopback.

One `JobGateway` serves two trials; the relay binary (compiled here from
adapters/harbor/medomni_harbor/relay/relay.c) runs as two trial relays and the job's forwarder,
talking through a unix socket in a temporary folder, as they do through the named volume in
Docker. Each trial's calls count against its own budget and land in its own call log; an
unknown or finished token is refused, and credited to no trial.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

pytest.importorskip("harbor")
pytest.importorskip("medomni_harbor")

from medomni_harbor import images
from medomni_harbor.gateway import JobGateway, lookup

from medomni_cas.bench.encoder_calls import read_call_log

LABS = b'{"test": "hba1c", "value": 6.1, "unit": "%", "t": 1}\n'


def _task(tasks: Path, name: str, budget: int) -> Path:
    task = tasks / name
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "labs.jsonl").write_bytes(LABS)
    block = {"families": ["labs"], "budget": budget, "atom": name, "encoders": "required"}
    (task / "task.toml").write_text(tomli_w.dumps({"metadata": {"medomni": {"perception": block}}}))
    return task


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(p: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line == b"medomni-relay: ready\n", (line, p.stderr.read() if p.stderr else b"")
    return p


@pytest.fixture(scope="module")
def relay_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler for the relay (`bash .ci/docker-engine install` adds gcc)")
    return images.compile_relay(tmp_path_factory.mktemp("relay") / "medomni-relay")


class Job:
    """A job gateway, its forwarder, and one relay per trial, as processes here."""

    def __init__(self, gw: JobGateway, binary: Path, sock: Path) -> None:
        self.gw, self.binary, self.sock = gw, binary, sock
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *argv: str) -> None:
        p = subprocess.Popen(
            [str(self.binary), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.procs.append(p)
        _ready(p)

    def relay(self, token: str) -> str:
        port = _free_port()
        self.start("relay", str(port), str(self.sock), token)
        return f"http://127.0.0.1:{port}"


@pytest.fixture
def job(relay_binary: Path, tmp_path: Path) -> Iterator[Job]:
    # a short folder: a unix socket's path has at most 107 bytes
    short = Path(tempfile.mkdtemp(prefix="mdr-", dir="/tmp"))
    sock = short / "gateway.sock"
    with JobGateway(tmp_path / "tasks") as gw:
        j = Job(gw, relay_binary, sock)
        host, port = gw.address
        j.start("forward", str(sock), host, str(port))
        try:
            yield j
        finally:
            for p in j.procs:
                p.terminate()
                p.wait(timeout=10)
                assert p.returncode == 0  # SIGTERM ends it cleanly, even as pid 1
            shutil.rmtree(short, ignore_errors=True)
    assert lookup(tmp_path / "tasks" / "a") is None  # the job's gateway is gone with it


def _encode(url: str) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"encoder": "table-summary", "family": "labs"}).encode()
    req = urllib.request.Request(
        f"{url}/v1/encode", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    try:
        return status, json.loads(body)
    except ValueError:  # Starlette's own 404 is plain text
        return status, body.decode()


def test_each_trial_spends_its_own_budget_through_its_own_relay(job: Job, tmp_path: Path) -> None:
    a, b = _task(tmp_path / "tasks", "a", 1), _task(tmp_path / "tasks", "b", 2)
    assert lookup(a) is job.gw  # environments find their job's gateway by the task folder
    ra, rb = job.relay(job.gw.open(a)), job.relay(job.gw.open(b))
    assert _get(f"{ra}/health") == (200, {"ok": True})
    assert _encode(ra)[0] == 200
    status, refused = _encode(ra)
    assert status == 429 and refused["calls_left"] == 0  # a's budget is spent...
    assert [_encode(rb)[0], _encode(rb)[0], _encode(rb)[0]] == [200, 200, 429]  # ...not b's
    # the relay carries its own token and nothing else: a path naming another token stays
    # inside this trial's gateway (404), whatever the agent writes
    other = job.gw._open["b"].token
    assert _get(f"{ra}/t/{other}/v1/encoders")[0] == 404
    assert _get(f"http://127.0.0.1:{job.gw.address[1]}/t/{other}/v1/encoders")[0] == 200
    # a client that keeps its connection alive still reaches its own gateway each time
    port = int(ra.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(2):
        conn.request("GET", "/v1/encoders")
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("x-calls-left") == "0"
        r.read()
    conn.close()
    ga = job.gw.close("a", tmp_path / "trial-a")
    gb = job.gw.close("b", tmp_path / "trial-b")
    assert ga is not None and gb is not None
    assert [c.status for c in ga.calls] == ["ok", "refused"]
    assert [c.status for c in gb.calls] == ["ok", "ok", "refused"]
    # written where the runner reads them, in the shape the sidecar wrote
    assert read_call_log(tmp_path / "trial-a/perception/calls.jsonl") == ga.calls
    served = json.loads((tmp_path / "trial-b/perception/encoders.json").read_text())
    assert [e["name"] for e in served["encoders"]] == ["table-summary"]


def test_unknown_and_finished_tokens_are_refused_and_credited_to_no_trial(
    job: Job, tmp_path: Path
) -> None:
    a, b = _task(tmp_path / "tasks", "a", 5), _task(tmp_path / "tasks", "b", 5)
    token_a = job.gw.open(a)
    ra, rb = job.relay(token_a), job.relay(job.gw.open(b))
    assert job.gw.open(a) == token_a  # one token per trial
    assert _encode(ra)[0] == 200
    base = f"http://127.0.0.1:{job.gw.address[1]}"
    refused = job.gw.tokens.refused
    assert _get(f"{base}/t/{'0' * 32}/v1/encoders")[0] == 403  # a token no trial holds
    assert _get(f"{base}/v1/encoders")[0] == 401  # no token at all
    done = job.gw.close("a", tmp_path / "trial-a")
    assert done is not None and len(done.calls) == 1
    status, body = _encode(ra)  # whatever a finished trial left running can call no more
    assert status == 403 and "not running" in body["error"]
    assert _get(f"{base}/t/{token_a}/health")[0] == 403
    assert job.gw.tokens.refused == refused + 4
    assert len(done.calls) == 1  # none of it was credited to the trial
    assert _encode(rb)[0] == 200  # the other trial is untouched
    assert job.gw.close("a", None) is None  # closing twice is harmless
    with pytest.raises(ValueError, match="attaches no perception service"):
        (tmp_path / "tasks/c").mkdir()
        job.gw.open(tmp_path / "tasks/c")


def test_relay_refuses_what_is_not_an_http_request(job: Job, tmp_path: Path) -> None:
    relay = job.relay(job.gw.open(_task(tmp_path / "tasks", "a", 1)))
    port = int(relay.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"garbage\r\n\r\n")
        reply = s.makefile("rb").read()
    assert reply.startswith(b"HTTP/1.0 400 ") and b"not an HTTP request line" in reply
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET http://perception:8899/health HTTP/1.0\r\n\r\n")  # a proxy's form
        reply = s.makefile("rb").read()
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b'{"ok":true}')


def test_a_kept_relay_serves_one_trial_after_another_by_its_token_file(
    job: Job, tmp_path: Path
) -> None:
    """A relay kept for the job's trials reads its token from a file at each request: no
    file or an empty one is refused (between trials), and each trial's calls are credited
    to that trial alone, through the same relay process."""
    token_file = tmp_path / "relay-token"
    port = _free_port()
    job.start("relay", str(port), str(job.sock), f"@{token_file}")
    relay = f"http://127.0.0.1:{port}"
    status, body = _encode(relay)  # no trial yet
    assert status == 503 and "no trial" in body["error"]
    a, b = _task(tmp_path / "tasks", "a", 5), _task(tmp_path / "tasks", "b", 5)
    token_file.write_text(job.gw.open(a) + "\n")
    assert _encode(relay)[0] == 200
    done_a = job.gw.close("a", None)
    token_file.write_text("")  # an empty file: refused, as no file is
    assert _encode(relay)[0] == 503
    token_file.write_text(job.gw.open(b))
    assert [_encode(relay)[0], _encode(relay)[0]] == [200, 200]
    done_b = job.gw.close("b", None)
    assert done_a is not None and done_b is not None
    assert [c.status for c in done_a.calls] == ["ok"]
    assert [c.status for c in done_b.calls] == ["ok", "ok"]
    token_file.write_text("../etc/passwd")  # a file holding no token: refused, not sent
    assert _encode(relay)[0] == 503


def test_a_relay_given_back_after_the_jobs_relays_are_removed_is_not_kept(
    tmp_path: Path,
) -> None:
    """Relays kept for the job's trials are removed with its containers; one a trial gives
    back after that is refused (its environment removes it), never kept where nothing
    would remove it."""

    class Relay:
        removed = False

        def remove(self, force: bool = False) -> None:
            self.removed = force

    with JobGateway(tmp_path / "tasks") as gw:
        kept, late = Relay(), Relay()
        assert gw.give_back_relay(kept) and gw.take_relay() is kept
        assert gw.give_back_relay(kept)
        gw._remove_idle_relays()  # as the job's end does, before its volume goes
        assert kept.removed and gw.take_relay() is None
        assert not gw.give_back_relay(late) and not late.removed
        assert gw.take_relay() is None  # nor handed to a trial after the job's end
