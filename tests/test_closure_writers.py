"""Presence implies closure, on every writer: a killed or failed write leaves no object
whose links are not all stored, and sync never trusts presence it has not verified.

Every test kills a real ``medomni`` subprocess with SIGKILL (at the k-th backend write, by
the crash hook `medomni_cas.store._crash`, or after a delay), or makes it fail on a real
file size limit (``RLIMIT_FSIZE``: the kernel refuses to grow LMDB's data file, as a full
disk does), then checks the store directly (every stored object's links are stored), runs
``cas pull`` / ``cas push`` into it and requires ``cas fsck`` to pass.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.store import encoding, sync
from medomni_cas.store._crash import CRASH_ENV
from medomni_cas.store.bundle import export_bundle, import_bundle
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.verify import fsck
from tests._cli import medomni_here

ROOT = Path(__file__).resolve().parents[1]
REF = "data/main"
LEAVES = 3000  # three import batches of leaves alone
FAN = 50


def _medomni(
    *args: str, env: dict[str, str] | None = None, **kw: object
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "medomni_cas.cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,  # type: ignore[call-overload]
    )


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """A command nobody kills: the CLI in this process (`medomni_here`)."""
    return medomni_here(*args, cwd=ROOT)


def make_source(url: str) -> tuple[ObjectId, int]:
    """A store holding a three-level DAG under ``REF``: leaves, trees of FAN leaves, a
    root tree, and a record linking the root and a shared leaf; its root and size."""
    with mc.open(url) as s:
        leaves = s.put_raw_many(
            (None, encoding.encode_blob_header(8) + i.to_bytes(8, "big")) for i in range(LEAVES)
        )
        trees = s.put_trees(
            {f"f{j}": leaves[i + j] for j in range(FAN)} for i in range(0, LEAVES, FAN)
        )
        top = s.put_tree({f"t{i}": t for i, t in enumerate(trees)})
        root = s.put_object("closure-test", 1, {"top": top, "first": leaves[0]})
        s.refs.set(REF, root)
        return root, len(s.closure(root))


def unclosed(url: str) -> list[tuple[str, str]]:
    """Every (stored object, link of it that is not stored): empty when presence implies
    closure."""
    out: list[tuple[str, str]] = []
    with mc.open(url) as s:
        for oid in s.iter_ids():
            links = encoding.links(s.backend.get(oid))
            out += [(oid.hex(), ObjectId(m).hex()) for m in s.backend.missing(links)]
    return out


def fsck_ok(url: str) -> None:
    with mc.open(url) as s:
        report = fsck(s, jobs=1)
    assert report.ok, report.problems[:5]


def pull(dst: str, src: str) -> sync.SyncReport:
    with mc.open(dst) as d, mc.open(src) as s:
        return sync.pull(d, s)


def push(src: str, dst: str) -> sync.SyncReport:
    with mc.open(src) as s, mc.open(dst) as d:
        return sync.push(s, d)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, ObjectId, int]:
    """Made once per module: every test only reads it (kills and damage are elsewhere)."""
    folder = tmp_path_factory.mktemp("source")
    url = f"lmdb://{folder}/src"
    root, size = make_source(url)
    bundle = folder / "big.bundle"
    with mc.open(url) as s:
        export_bundle(s, [root], bundle, refs={REF: root})
    return url, bundle, root, size


def _killed_import(bundle: Path, dst: str, at: int) -> None:
    proc = _medomni("cas", "import", str(bundle), "--store", dst, env={CRASH_ENV: f"write:{at}"})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err.decode()


# -- the observed case: import killed, then pull and push --------------------------------------
def test_killed_import_then_cas_pull_and_push(
    source: tuple[str, Path, ObjectId, int], tmp_path: Path
) -> None:
    """The observed case, through the CLI: after the killed import, pull said "0 objects"
    and fsck found the store's missing objects; push into such a store did the same."""
    src, bundle, root, size = source
    pulled, pushed = f"lmdb://{tmp_path}/pulled", f"file://{tmp_path}/pushed"
    for dst in (pulled, pushed):
        _killed_import(bundle, dst, 2)
        assert unclosed(dst) == []
    got = _run("cas", "pull", src, "--store", pulled)
    assert got.returncode == 0, got.stderr
    got = _run("cas", "push", pushed, "--store", src)
    assert got.returncode == 0, got.stderr
    for dst in (pulled, pushed):
        got = _run("cas", "fsck", "--store", dst)
        assert got.returncode == 0, got.stdout + got.stderr
        with mc.open(dst) as s:
            assert s.refs[REF] == root and len(s.closure(root)) == size


@pytest.mark.parametrize("at", [1, 3, 4, 6])
def test_import_killed_at_each_batch(
    source: tuple[str, Path, ObjectId, int], tmp_path: Path, at: int
) -> None:
    src, bundle, root, size = source
    pulled, pushed = f"lmdb://{tmp_path}/pulled", f"file://{tmp_path}/pushed"
    for dst in (pulled, pushed):
        _killed_import(bundle, dst, at)
        assert unclosed(dst) == []
    pull(pulled, src)
    push(src, pushed)
    for dst in (pulled, pushed):
        fsck_ok(dst)
        with mc.open(dst) as s:
            assert s.refs[REF] == root and len(s.closure(root)) == size


@pytest.mark.parametrize("delay", [0.5, 1.5])
def test_import_killed_after_a_delay(
    source: tuple[str, Path, ObjectId, int], tmp_path: Path, delay: float
) -> None:
    src, bundle, _, _ = source
    dst = f"lmdb://{tmp_path}/dst"
    proc = _medomni("cas", "import", str(bundle), "--store", dst)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    if os.path.exists(f"{tmp_path}/dst"):
        assert unclosed(dst) == []
    pull(dst, src)
    fsck_ok(dst)


def test_import_on_a_full_disk(source: tuple[str, Path, ObjectId, int], tmp_path: Path) -> None:
    """LMDB's data file may not grow past a limit (``RLIMIT_FSIZE``, set in the child): its
    commits fail as on a full disk, part way through the import."""
    src, bundle, _, _ = source
    dst = f"lmdb://{tmp_path}/dst"
    with mc.open(dst):
        pass
    empty = (tmp_path / "dst" / "data.mdb").stat().st_size
    with mc.open(f"lmdb://{tmp_path}/whole") as whole:
        import_bundle(whole, bundle)
    full = (tmp_path / "whole" / "data.mdb").stat().st_size
    limit = empty + (full - empty) // 2  # room for half the import

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = _medomni("cas", "import", str(bundle), "--store", dst, preexec_fn=small_disk)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, "the import should have run out of room"
    # LMDB says EIO for the refused write; other layers say EFBIG or ENOSPC
    assert any(w in err for w in (b"Input/output", b"File too large", b"No space", b"full")), (
        err.decode()[-2000:]
    )
    assert unclosed(dst) == []
    pull(dst, src)
    fsck_ok(dst)


# -- sync itself, killed ------------------------------------------------------------------------
@pytest.mark.parametrize("at", [1, 2])
def test_killed_pull_and_push_keep_closure(
    source: tuple[str, Path, ObjectId, int], tmp_path: Path, at: int
) -> None:
    src = source[0]
    pulled, pushed = f"lmdb://{tmp_path}/pulled", f"file://{tmp_path}/pushed"
    scratch = tmp_path / "tmp"  # where their plans spill (a tiny bound)
    scratch.mkdir()
    env = {CRASH_ENV: f"write:{at}", "MEDOMNI_SPILL_IDS": "64", "TMPDIR": str(scratch)}
    proc = _medomni("cas", "pull", src, "--store", pulled, env=env)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    proc = _medomni("cas", "push", pushed, "--store", src, env=env)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert any(scratch.glob("medomni-plan-*")), "the plans did not spill"
    left = [p for p in scratch.rglob("*") if not p.is_dir()]
    assert left == [], "a killed transfer left its spilled plan in TMPDIR"
    for dst in (pulled, pushed):
        assert unclosed(dst) == []
    pull(pulled, src)
    push(src, pushed)
    for dst in (pulled, pushed):
        fsck_ok(dst)


# -- sync does not trust presence it has not verified -------------------------------------------
def _damaged(url: str, src: str, root: ObjectId) -> int:
    """Copy ``root`` and a third of its closure's interior into ``url`` around every writer
    (parents without their children), as stores damaged by older writers are; return how
    many objects are missing."""
    with mc.open(src) as s, mc.open(url) as d:
        closure = s.closure(root)
        interior = [o for o in closure if encoding.links(s.get_raw(o))]
        kept = [root, *interior[::3]]
        d.backend.put_many([(o, s.get_raw(o)) for o in kept])
        return len(closure) - len(set(kept))


@pytest.mark.parametrize("kind", ["lmdb", "file"])
def test_pull_and_push_fill_a_store_damaged_by_an_older_writer(
    source: tuple[str, Path, ObjectId, int], tmp_path: Path, kind: str
) -> None:
    src, _, root, _ = source
    dst = f"{kind}://{tmp_path}/dst"
    lost = _damaged(dst, src, root)
    assert len(unclosed(dst)) > 0
    report = pull(dst, src) if kind == "lmdb" else push(src, dst)
    assert report.objects == lost
    fsck_ok(dst)
    assert unclosed(dst) == []


# -- the other writers ---------------------------------------------------------------------------
_PUT_RAW = """
import sys
import medomni_cas as mc
from medomni_cas.store import encoding
with mc.open(sys.argv[1]) as src, mc.open(sys.argv[2]) as dst:
    root = src.refs["data/main"]
    items = [(oid, data) for oid, data in src.walk([root])]  # parents first
    dst.put_raw_many(items)
"""


@pytest.mark.parametrize("at", [1, 2])
def test_put_raw_many_killed_keeps_closure(
    source: tuple[str, Path, ObjectId, int], tmp_path: Path, at: int
) -> None:
    """`Store.put_raw_many` (bench import's writer, and anyone copying objects) takes
    items in any order: given parents first, it still writes children first."""
    dst = f"file://{tmp_path}/dst"
    proc = subprocess.run(
        [sys.executable, "-c", _PUT_RAW, source[0], dst],
        env={**os.environ, CRASH_ENV: f"write:{at}"},
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert unclosed(dst) == []
