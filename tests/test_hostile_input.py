"""Hostile input: what an import accepts is what a reader accepts, and every limit holds.

Objects no reader can read (tree names that leave a folder, records their class does not
decode, nesting deeper than any decoder goes) are crafted below the `Store` (straight into
a scratch backend, as an older release or an attacker would) and carried by the real
bundle writer; put, import, sync and fsck must all refuse them, and import must write
nothing of such a bundle. Then the limits on what users write: YAML aliases and nesting,
path fields, and request bodies to the perception gateway.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

import medomni_cas as mc
from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store.bundle import BundleError, export_bundle, import_bundle
from medomni_cas.store.gc import gc
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.sync import push
from medomni_cas.store.verify import fsck

ROOT = Path(__file__).resolve().parent.parent


EXE = Path(sys.executable).parent / "medomni"


def medomni(*argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess, with this environment (PYTHONPATH reaches it)."""
    if not EXE.exists():
        pytest.skip(f"console script not installed at {EXE}")
    return subprocess.run(
        [str(EXE), *argv],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _raw(kind: str, version: int, body: object) -> bytes:
    """Canonical-looking bytes of any value, made without the encoder's checks (links as
    ObjectId); a deep value is encoded with the recursion limit raised for the call."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        return msgspec.msgpack.encode((kind, version, body), enc_hook=encoding._enc_hook)
    finally:
        sys.setrecursionlimit(limit)


def _below(store: mc.Store, data: bytes) -> ObjectId:
    """Write ``data`` below the Store (no check), as an older release or an attacker would."""
    oid = hash_bytes(data)
    store.backend.put_many([(oid, data)])
    return oid


def _nested(leaf: object, depth: int) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# what no reader reads, each named for the test ids; every one links `leaf`, a real blob
def _tree(name: str) -> Callable[[ObjectId], bytes]:
    return lambda leaf: _raw("tree", 1, {name: leaf})


UNREADABLE = {
    "tree-name-dotdot": _tree("../x"),
    "tree-name-slash": _tree("a/b"),
    "tree-name-nul": _tree("a\x00b"),
    "tree-name-dot": _tree("."),
    "tree-v2": lambda leaf: _raw("tree", 2, {"x": leaf}),
    "tree-entry-not-a-link": lambda leaf: _raw("tree", 1, {"x": "not a link", "y": leaf}),
    "chunked-blob-sizes-lie": lambda leaf: _raw(
        "chunked-blob", 1, {"chunk_size": 1, "chunks": [leaf], "size": 5}
    ),
    "chunked-blob-field-mistyped": lambda leaf: _raw(
        "chunked-blob", 1, {"chunk_size": "1", "chunks": [leaf], "size": 1}
    ),
    "nested-101": lambda leaf: _raw("test-hostile.deep", 1, _nested(leaf, 100)),
    "nested-1000": lambda leaf: _raw("test-hostile.deep", 1, _nested(leaf, 999)),
}


# the cases also run through the CLI (a subprocess each): one of each family
THROUGH_CLI = {"tree-name-dotdot", "chunked-blob-sizes-lie", "nested-1000"}


def _scratch_with(tmp_path: Path, case: str) -> tuple[mc.Store, ObjectId, ObjectId]:
    """A scratch store holding one unreadable object of ``case`` under ref ``bad``."""
    src = mc.open(f"lmdb://{tmp_path / 'scratch'}")
    leaf = src.put_blob(b"a leaf every crafted object links")
    bad = _below(src, UNREADABLE[case](leaf))
    src.refs.set("bad", bad)
    return src, bad, leaf


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_put_raw_refuses_what_no_reader_reads(case: str) -> None:
    store = mc.open("memory://")
    leaf = store.put_blob(b"a leaf every crafted object links")
    data = UNREADABLE[case](leaf)
    with pytest.raises(InvalidObject, match=hash_bytes(data).hex()):
        store.put_raw(data)
    assert store.missing([hash_bytes(data)]) == [hash_bytes(data)]


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_import_refuses_the_bundle_whole(case: str, tmp_path: Path) -> None:
    """The real bundle writer carries the object; import refuses the file, and the store it
    goes into gains no object and no ref."""
    src, bad, leaf = _scratch_with(tmp_path, case)
    bundle = tmp_path / "crafted.bundle"
    try:
        info = export_bundle(src, [bad], bundle, refs={"bad": bad})
    except InvalidObject:
        # only an object too deep for any decoder: the writer cannot read its links
        assert case == "nested-1000"
        _bundle_of(src, [bad, leaf], bad, bundle)
    else:
        assert info.objects == 2
    src.close()
    dst = mc.open(f"lmdb://{tmp_path / 'dst'}")
    with pytest.raises(BundleError, match=f"object {bad}"):
        import_bundle(dst, bundle)
    assert list(dst.backend.iter_keys()) == []
    assert dict(dst.refs.items()) == {}
    dst.close()
    if case not in THROUGH_CLI:
        return
    # through the CLI: exit 2, one line naming the file and the object, nothing written
    url = f"lmdb://{tmp_path / 'dst'}"
    run = medomni("--store", url, "cas", "import", str(bundle), cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert str(bundle) in run.stderr and bad.hex() in run.stderr
    assert "Traceback" not in run.stderr
    dst = mc.open(f"lmdb://{tmp_path / 'dst'}")
    assert list(dst.backend.iter_keys()) == []
    dst.close()


def _bundle_of(store: mc.Store, ids: list[ObjectId], root: ObjectId, path: Path) -> None:
    """A bundle of ``ids`` in the documented format, for an object the writer cannot walk."""
    from tests.test_bundle import craft

    craft(path, [(oid, store.backend.get(oid)) for oid in ids], roots=[root])


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_fsck_reports_what_no_reader_reads(case: str, tmp_path: Path) -> None:
    """An unreadable object already stored (an older release let it in) is malformed to
    fsck, in this process and with helper processes, and by the CLI (exit 1)."""
    src, bad, _ = _scratch_with(tmp_path, case)
    for jobs in (1, 2):
        report = fsck(src, jobs=jobs)
        assert not report.ok
        assert [(p.kind, p.id) for p in report.problems] == [("malformed", bad.hex())]
    src.close()
    if case not in THROUGH_CLI:
        return
    run = medomni("--store", f"lmdb://{tmp_path / 'scratch'}", "cas", "fsck", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert bad.hex() in run.stdout + run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_push_refuses_what_no_reader_reads(case: str, tmp_path: Path) -> None:
    src, bad, _ = _scratch_with(tmp_path, case)
    dst = mc.open(f"file://{tmp_path / 'remote'}")
    with pytest.raises(InvalidObject, match=bad.hex()):
        push(src, dst, ["bad"])
    assert dst.refs.get("bad") is None
    assert dst.missing([bad]) == [bad]


def test_a_deep_object_already_stored_is_a_clean_error_everywhere(tmp_path: Path) -> None:
    """1,000 levels (what crashed fsck, gc, export and push with RecursionError): each
    names the object instead, through the API and the CLI."""
    src, bad, _ = _scratch_with(tmp_path, "nested-1000")
    with pytest.raises(InvalidObject, match=bad.hex()):
        export_bundle(src, [bad], tmp_path / "out.bundle")
    with pytest.raises(InvalidObject, match=bad.hex()):
        gc(src)
    with pytest.raises(InvalidObject, match=bad.hex()):
        src.closure(bad)
    src.close()
    url = f"lmdb://{tmp_path / 'scratch'}"
    for argv in (["cas", "gc"], ["cas", "export", "-o", str(tmp_path / "o.bundle"), "bad"]):
        run = medomni("--store", url, *argv, cwd=tmp_path)
        assert run.returncode in (1, 2), run.stderr
        assert "Traceback" not in run.stderr and bad.hex() in run.stderr, run.stderr


def test_the_depth_limit_is_far_above_real_records() -> None:
    """A record nested to the limit is stored; one level more is refused, by put_object as
    by put_raw."""
    store = mc.open("memory://")
    ok = _nested(1, encoding.MAX_DEPTH - 1)  # the envelope is the first level
    store.put_raw(_raw("test-hostile.deep", 1, ok))
    store.put_object("test-hostile.deep", 1, ok)
    with pytest.raises(InvalidObject, match=f"deeper than {encoding.MAX_DEPTH}"):
        store.put_object("test-hostile.deep", 1, [ok])
    with pytest.raises(InvalidObject, match=f"deeper than {encoding.MAX_DEPTH}"):
        store.put_object("test-hostile.deep", 1, _nested(1, 100_000))


# -- YAML users write -----------------------------------------------------------------------------
EXAMPLES = ROOT / "examples"
CKD = Path("studio/datasets/synth-ehr/tasks/synth-ehr_ckd-staging")

# nine lines whose last value expands to 9**9 strings (about 9x per level)
ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
HOSTILE_YAML = {
    "alias-bomb": (ALIAS_BOMB, 2, "YAML alias *a: aliases are not allowed"),
    "recursive-alias": ("version: '1.0'\nn: &x [*x]\n", 2, "recursive YAML alias *x"),
    "deep-flow": ("name: x\nn: " + "[" * 100_000 + "]" * 100_000 + "\n", 2, "deeper than 64"),
    "deep-block": (
        "".join(f"{'  ' * i}k{i}:\n" for i in range(200)) + "  " * 200 + "v\n",
        64,
        "deeper than 64",
    ),
    "nul": ("name: x\ndescription: a\x00b\n", 2, "character #x0000 is not allowed"),
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the example studio and bench (no generated data) and a workspace file."""
    import shutil

    for part in ("studio", "bench"):
        shutil.copytree(EXAMPLES / part, tmp_path / part, ignore=shutil.ignore_patterns("data"))
    (tmp_path / "workspace.yaml").write_text(
        "store: lmdb://.medomni/store\nstudio: studio\nbench: bench\n"
    )
    return tmp_path


def _loaders(tree: Path) -> dict[str, tuple[Path, Callable[[], object]]]:
    """Each kind of file a user writes, and the function that reads it."""
    from medomni_cas.bench.agents import load_agent
    from medomni_cas.studio import folders
    from medomni_cas.workspace import load_workspace

    return {
        "workspace": (tree / "workspace.yaml", lambda: load_workspace(tree)),
        "template": (tree / CKD / "template.yaml", lambda: folders.load_template(tree / CKD)),
        "cohort": (
            tree / CKD / "cohorts/n20.yaml",
            lambda: folders.load_cohort(tree / CKD / "cohorts/n20.yaml"),
        ),
        "agent": (
            tree / "bench/agents/baseline.yaml",
            lambda: load_agent(tree / "bench/agents/baseline.yaml"),
        ),
        "benchmark": (
            tree / "bench/benchmarks/medomni-bench/benchmark.yaml",
            lambda: folders.load_benchmark(tree / "bench/benchmarks/medomni-bench"),
        ),
    }


@pytest.mark.parametrize("file", ["workspace", "template", "cohort", "agent", "benchmark"])
@pytest.mark.parametrize("case", sorted(HOSTILE_YAML))
def test_hostile_yaml_is_refused_naming_file_and_line(tree: Path, file: str, case: str) -> None:
    from medomni_cas.studio.specfile import SpecError

    text, line, problem = HOSTILE_YAML[case]
    path, load = _loaders(tree)[file]
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load()
    assert Path(info.value.file) == path
    assert (info.value.line, problem in str(info.value)) == (line, True), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("case", sorted(HOSTILE_YAML))
def test_hostile_yaml_through_the_cli_exits_2(tree: Path, case: str) -> None:
    """In the workspace file (read by every command) and in a template (read by a build):
    exit 2, one line naming the file and line, no traceback."""
    text, line, problem = HOSTILE_YAML[case]
    template = tree / CKD / "template.yaml"
    template.write_text(text)
    run = medomni("studio", "task", "build", "synth-ehr_ckd-staging@n20", cwd=tree)
    assert run.returncode == 2, run.stderr
    assert f"{template}:{line}" in run.stderr and problem in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    (tree / "workspace.yaml").write_text(text)
    run = medomni("cas", "refs", cwd=tree)
    assert run.returncode == 2, run.stderr
    assert f"workspace.yaml:{line}" in run.stderr and problem in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


# -- path fields ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "answer.json",
        "/workspace",
        "/workspace/",
        "/workspace/../etc/passwd",
        "/workspace/out/",
        "/workspacex/answer.json",
        "/workspace/a\\0b",
    ],
)
def test_submission_path_outside_the_workspace_is_refused_at_load(tree: Path, path: str) -> None:
    """What staging refused trial by trial (70 of 140 failed) is refused when the template
    is read, naming the file, line and field."""
    from medomni_cas.studio import folders
    from medomni_cas.studio.specfile import SpecError

    template = tree / CKD / "template.yaml"
    text = template.read_text()
    template.write_text(text.replace("/workspace/answer.json", f'"{path}"'))
    with pytest.raises(SpecError) as info:
        folders.load_template(tree / CKD)
    assert info.value.field == "agent.submission_path"
    assert Path(info.value.file) == template and info.value.line is not None
    assert "a file inside /workspace" in info.value.problem


@pytest.mark.parametrize("path", ["/workspace/answer.json", "/workspace/out/answer.json"])
def test_submission_path_inside_the_workspace_loads(tree: Path, path: str) -> None:
    from medomni_cas.studio import folders

    template = tree / CKD / "template.yaml"
    template.write_text(template.read_text().replace("/workspace/answer.json", path))
    assert folders.load_template(tree / CKD).template.agent.submission_path == path


# -- request bodies to the perception gateway -------------------------------------------------
def _rss_kib(pid: int, field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak) of a process, in KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read RSS")
def test_a_400_mb_chunked_post_gets_413_before_it_is_sent(tmp_path: Path) -> None:
    """A real gateway (the sidecar's command) and a chunked POST streamed by the test: the
    answer is 413 while the client is still sending (the server stopped reading), and the
    gateway's peak RSS grows by far less than the body."""
    import select
    import socket
    import time
    import urllib.request

    pytest.importorskip("uvicorn")
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    port = _free_port()
    gw = subprocess.Popen(
        [
            *(sys.executable, "-m", "medomni_cas.bench.perception", "--evidence", str(evidence)),
            *("--families", "ecg", "--budget", "3", "--host", "127.0.0.1", "--port", str(port)),
        ],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert gw.poll() is None, gw.stderr.read() if gw.stderr else ""
                assert time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.1)
        before = _rss_kib(gw.pid, "VmRSS")
        total, piece = 400 << 20, b"x" * (64 << 10)
        chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(
            b"POST /v1/encode HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        sock.setblocking(False)
        sent, answer = 0, b""
        stalled_since = time.monotonic()
        while sent < total:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                try:
                    got = sock.recv(65536)
                except ConnectionResetError:
                    got = b""
                answer += got
                if not got or b"\r\n\r\n" in answer:
                    break  # answered (or closed) before the body was sent
            if writable:
                try:
                    sent += sock.send(chunk)
                    stalled_since = time.monotonic()
                except (BlockingIOError, InterruptedError):
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    break
            # the old gateway read all 400 MB before answering; this one must answer first
            assert time.monotonic() - stalled_since < 60, "the gateway neither reads nor answers"
        sock.setblocking(True)
        sock.settimeout(30)
        if sent >= total:
            sock.sendall(b"0\r\n\r\n")  # the end of the body: the old gateway answers now
        while b"\r\n\r\n" not in answer:
            try:
                got = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not got:
                break
            answer += got
        sock.close()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sent < total, "the whole body was sent before an answer came"
        grown = _rss_kib(gw.pid, "VmHWM") - before
        assert grown < 32 << 10, f"the gateway's peak RSS grew by {grown} KiB"
        # and it still serves
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200
    finally:
        gw.terminate()
        gw.wait(timeout=30)


def test_the_harbor_relay_refuses_a_large_body_unread() -> None:
    """The host-side relay of the Harbor adapter put a whole body on a command line: one
    declared past the gateway's limit is answered 413 before any of it is read, and the
    container is never asked (its environment is not touched)."""
    import asyncio
    import socket

    pytest.importorskip("harbor")
    from medomni_harbor.agents import _Relay

    class Untouched:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the relay used the environment ({name})")

    async def post() -> bytes:
        async with _Relay(Untouched(), "http://perception:8899") as relay:
            host, port = relay.server.server_address[:2]

            def talk() -> bytes:
                with socket.create_connection((str(host), int(port)), timeout=30) as s:
                    s.sendall(
                        b"POST /v1/encode HTTP/1.0\r\nContent-Length: 419430400\r\n\r\n"
                        + b"x" * 1024
                    )
                    out = b""
                    while chunk := s.recv(65536):
                        out += chunk
                    return out

            return await asyncio.to_thread(talk)

    answer = asyncio.run(post())
    assert answer.startswith(b"HTTP/1.0 413"), answer[:200]
