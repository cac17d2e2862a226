"""`benchmarks_perf._resident`: a benchmark's files held in the page cache for a run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks_perf._resident import Resident

ROOT = Path(__file__).resolve().parent.parent


def _locked_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1])
    raise AssertionError("no VmLck in /proc/self/status")


def _store(tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    (folder / "large" / "ab").mkdir(parents=True)
    (folder / "data.mdb").write_bytes(os.urandom(1 << 20))
    (folder / "large" / "ab" / "cdef").write_bytes(b"x" * 5000)
    (folder / "lock.mdb").write_bytes(b"")  # nothing to map
    return folder


def test_the_files_are_locked_for_the_block_and_released_after(tmp_path: Path) -> None:
    folder = _store(tmp_path)
    before = _locked_kib()
    with Resident([folder]) as held:
        assert held.why is None
        assert held.locked == (1 << 20) + 5000
        # every page of both files, rounded up to whole pages
        assert _locked_kib() - before >= ((1 << 20) + 5000) // 1024
    assert _locked_kib() == before
    assert held.locked == (1 << 20) + 5000  # what the run had, still there to report


def test_files_over_the_budget_are_read_not_locked(tmp_path: Path) -> None:
    folder = _store(tmp_path)
    before = _locked_kib()
    with Resident([folder], budget=1 << 19) as held:
        assert held.locked == 0
        assert held.why is not None and "over the budget of 0 MiB" in held.why
        assert _locked_kib() == before


_REFUSED = """
import json, resource, sys
from pathlib import Path
from benchmarks_perf._resident import Resident
resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
with Resident([Path(sys.argv[1])]) as held:
    status = Path("/proc/self/status").read_text()
    lck = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmLck:"))
    print(json.dumps({"why": held.why, "locked": held.locked, "vmlck": lck}))
"""


def test_a_refused_lock_reads_the_files_and_says_why(tmp_path: Path) -> None:
    """No ``CAP_IPC_LOCK`` and no ``RLIMIT_MEMLOCK``: the kernel refuses the lock; the
    pages mapped so far are released and the files read instead."""
    folder = _store(tmp_path)
    cmd = [sys.executable, "-c", _REFUSED, str(folder)]
    if os.geteuid() == 0:  # root: the capability dropped, so that the limit applies
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root, and no setpriv to drop CAP_IPC_LOCK with")
        cmd = [setpriv, "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock", *cmd]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["locked"] == 0 and got["vmlck"] == 0
    assert got["why"].startswith("mlock ") and str(folder / "data.mdb") in got["why"]
