"""Failures of the environment, through the CLI as a subprocess: exit 2, one line, nothing lost.

A full LMDB map (a real map with ``max_size``), a full disk (a real tmpfs of 512 KiB), a
store that cannot be written (a read-only mount for root, a mode for anyone else), a
damaged LMDB file and an S3 endpoint nobody listens on: each command exits 2 with one line
that says what failed and that nothing was lost, never a traceback; and the store keeps
what it held (fsck stays clean, no ref moved).

The failing command runs in a fresh process of the console script (a crash, a mount or an
rlimit is the process's own); the set-up before it and the checks after it run the CLI in
this process (`tests._cli.medomni_here`), which a fresh interpreter would only slow down.

Mounts are made in a mount namespace of their own (``unshare -m``), so they vanish with
the command and nothing outside the test's folder is touched; where that is not allowed,
those cases are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests._cli import medomni_here

EXE = Path(sys.executable).parent / "medomni"
NOTHING_LOST = "nothing was lost"


def medomni(
    *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    if not EXE.exists():
        pytest.skip(f"console script not installed at {EXE}")
    return subprocess.run(
        [str(EXE), *argv],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def in_namespace(setup: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``medomni ARGV`` after shell ``setup`` (mounts), in a mount namespace of its own."""
    command = f"{setup} && exec {shlex.quote(str(EXE))} {shlex.join(argv)}"
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", command],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _can_mount(tmp_path: Path) -> str | None:
    """Why mounts in a namespace of our own are not possible here (None: they are)."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = tmp_path / "probe"
    probe.mkdir()
    got = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(probe))}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    probe.rmdir()
    return None if got.returncode == 0 else f"cannot mount in a namespace: {got.stderr.strip()}"


def assert_environment_failure(run: subprocess.CompletedProcess[str], *what: str) -> None:
    """Exit 2; stderr is one line naming what failed and saying that nothing was lost."""
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("medomni: error: ") and NOTHING_LOST in lines[0], lines[0]
    for part in what:
        assert part in lines[0], lines[0]


def _files(folder: Path, count: int, size: int) -> Path:
    folder.mkdir()
    for i in range(count):
        (folder / f"f{i:05d}").write_bytes(os.urandom(size))
    return folder


def _store_is_whole(url: str, cwd: Path, refs: list[str]) -> None:
    """fsck finds nothing wrong and the refs are those given."""
    fsck = medomni_here("--store", url, "cas", "fsck", cwd=cwd)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    listed = medomni_here("--store", url, "cas", "refs", "--json", cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(listed.stdout)) == sorted(refs)


# -- LMDB ----------------------------------------------------------------------------------
def test_a_full_lmdb_map_exits_2_and_loses_nothing(tmp_path: Path) -> None:
    """A real map capped at 256 KiB, and a folder of 2,000 small files that does not fit."""
    url = f"lmdb://{tmp_path / 'store'}"
    small = tmp_path / "small.txt"
    small.write_text("fits\n")
    put = medomni_here("--store", url, "cas", "put", str(small), "--ref", "kept", cwd=tmp_path)
    assert put.returncode == 0, put.stderr
    big = _files(tmp_path / "big", 1200, 300)
    run = medomni(
        "--store", f"{url}?max_size=262144", "cas", "put", str(big), "--ref", "big", cwd=tmp_path
    )
    assert_environment_failure(run, "is full", "max_size (262144 bytes)")
    _store_is_whole(url, tmp_path, ["kept"])


def test_a_damaged_lmdb_file_exits_2(tmp_path: Path) -> None:
    """Pages of data.mdb overwritten with noise: LMDB's own errors (corrupted or missing
    pages) are one line, for a reader (refs) as for fsck."""
    url = f"lmdb://{tmp_path / 'store'}"
    put = medomni_here(
        "--store",
        url,
        "cas",
        "put",
        str(_files(tmp_path / "f", 500, 300)),
        "--ref",
        "f",
        cwd=tmp_path,
    )
    assert put.returncode == 0, put.stderr
    data = tmp_path / "store" / "data.mdb"
    size = data.stat().st_size
    with data.open("r+b") as f:
        # each page's type flags (bytes 10-11 of its header) zeroed: LMDB finds pages of no
        # type where it expects branches and leaves (random bytes could make it read past
        # the file instead, which the kernel answers with SIGBUS)
        for page in range(2, size // 4096):
            f.seek(page * 4096 + 10)
            f.write(b"\x00\x00")
    for argv in (["cas", "refs"], ["cas", "fsck"], ["cas", "ls", "f"]):
        run = medomni("--store", url, *argv, cwd=tmp_path)
        assert_environment_failure(run, "LMDB", url)


def test_a_full_disk_exits_2_and_loses_nothing(tmp_path: Path) -> None:
    """A real tmpfs of 512 KiB under the store, for LMDB and for a file:// store."""
    why = _can_mount(tmp_path)
    if why is not None:
        pytest.skip(why)
    disk = tmp_path / "disk"
    disk.mkdir()
    big = _files(tmp_path / "big", 2000, 300)
    mount = f"mount -t tmpfs -o size=512k tmpfs {shlex.quote(str(disk))}"
    for url in (f"lmdb://{disk / 'store'}", f"file://{disk / 'store'}"):
        run = in_namespace(
            mount, "--store", url, "cas", "put", str(big), "--ref", "big", cwd=tmp_path
        )
        assert_environment_failure(run, "No space left on device")


def test_a_store_that_cannot_be_written_exits_2(tmp_path: Path) -> None:
    """A store folder without write permission; as root, whom permissions do not stop, the
    folder is mounted read-only instead."""
    root = os.geteuid() == 0
    if root and (why := _can_mount(tmp_path)) is not None:
        pytest.skip(f"running as root, and {why}")
    small = tmp_path / "small.txt"
    small.write_text("cannot land\n")
    for scheme in ("lmdb", "file"):
        folder = tmp_path / f"{scheme}-store"
        url = f"{scheme}://{folder}"
        put = medomni_here("--store", url, "cas", "put", str(small), "--ref", "kept", cwd=tmp_path)
        assert put.returncode == 0, put.stderr
        new = _files(tmp_path / f"{scheme}-new", 3, 100)
        argv = ("--store", url, "cas", "put", str(new), "--ref", "new")
        if root:
            q = shlex.quote(str(folder))
            ro = f"mount --bind {q} {q} && mount -o remount,bind,ro {q}"
            assert_environment_failure(in_namespace(ro, *argv, cwd=tmp_path), "Read-only")
        else:
            folders = [folder, *(p for p in folder.rglob("*") if p.is_dir())]
            for path in folders:
                path.chmod(0o555)
            try:
                run = medomni(*argv, cwd=tmp_path)
            finally:
                for path in folders:
                    path.chmod(0o755)
            assert_environment_failure(run, "Permission denied")
        _store_is_whole(url, tmp_path, ["kept"])


# -- remote endpoints -------------------------------------------------------------------------
def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("argv", [["cas", "refs"], ["cas", "fsck"]])
def test_an_unreachable_s3_endpoint_exits_2(tmp_path: Path, argv: list[str]) -> None:
    pytest.importorskip("s3fs")
    port = _closed_port()
    url = f"s3://bucket/prefix?endpoint_url=http://127.0.0.1:{port}"
    creds = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    run = medomni("--store", url, *argv, cwd=tmp_path, env=creds)
    assert_environment_failure(run, "could not be reached", f"127.0.0.1:{port}")


def test_a_push_to_an_unreachable_s3_endpoint_exits_2(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    local = f"lmdb://{tmp_path / 'store'}"
    small = tmp_path / "small.txt"
    small.write_text("stays here\n")
    put = medomni_here("--store", local, "cas", "put", str(small), "--ref", "main", cwd=tmp_path)
    assert put.returncode == 0, put.stderr
    port = _closed_port()
    creds = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    remote = f"s3://bucket/prefix?endpoint_url=http://127.0.0.1:{port}"
    run = medomni("--store", local, "cas", "push", remote, "main", cwd=tmp_path, env=creds)
    assert_environment_failure(run, "could not be reached")
    _store_is_whole(local, tmp_path, ["main"])
