"""The performance benchmark still runs: ``python -m benchmarks_perf store --quick``.

Timing is not asserted (it depends on the machine); only that every suite runs to the end
and prints its table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_rows(suite: str, *extra: str, timeout: float = 120) -> list[str]:
    """Run ``python -m benchmarks_perf SUITE --quick [EXTRA...]``; its table's rows (header
    first)."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks_perf", suite, "--quick", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("$ ") and f"benchmarks_perf {suite} --quick" in out.splitlines()[0]
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| benchmark ")
    return rows


def test_store_benchmark_quick_prints_a_table() -> None:
    rows = quick_rows("store")
    for name in ("records: Store.put_many", "blob: put_blob", "objects: lmdb put_many"):
        assert any(name in row for row in rows), f"no row for {name!r}"


def test_remote_benchmark_quick_prints_a_table() -> None:
    rows = quick_rows("remote")
    for name in ("lmdb -> s3", "s3 -> lmdb", "push with nothing new: requests", "MiB blob"):
        assert any(name in row for row in rows), f"no row for {name!r}"


def test_llm_benchmark_quick_prints_a_table() -> None:
    rows = quick_rows("llm", "--only", "process", timeout=600)  # terminus-2's needs Docker
    for name in ("stand-in response time", "our part per trial", "redaction per trial"):
        assert any(name in row for row in rows), f"no row for {name!r}"


def test_scale_benchmark_quick_prints_a_table() -> None:
    rows = quick_rows("scale", timeout=600)
    for op in ("build", "resume", "score", "verify", "fsck", "gc", "push", "pull"):
        assert any(row.startswith(f"| {op} (") for row in rows), f"no row for {op!r}"


def test_scale_benchmark_baselines_read_what_the_operations_read() -> None:
    """``--baseline``: verify and fsck in memory, verify and push with every page kept
    mapped, and the reads of resume and verify by py-lmdb alone (the child checks it read as
    many keys, all found, as the parent listed)."""
    rows = quick_rows(
        "scale",
        "--baseline",
        *("--only", "resume", "--only", "verify", "--only", "fsck", "--only", "push"),
    )
    for name in (
        "push, pages kept",
        "resume, raw reads",
        "verify, in memory",
        "verify, raw reads",
        "verify, raw reads, pages dropped",
        "verify, pages kept",
        "fsck, in memory",
    ):
        assert any(row.startswith(f"| {name} (") for row in rows), f"no row for {name!r}"


def test_scale_benchmark_rounds_put_back_what_a_run_changed() -> None:
    """``--repeat 2``: the second round finds each store as the first found it (gc's litter
    back for fsck to count, a fresh destination for push); the child's counts are checked
    against the store's every run, so a store left changed fails the run."""
    rows = quick_rows("scale", "--repeat", "2", "--only", "fsck", "--only", "gc", "--only", "push")
    for op in ("fsck", "gc", "push"):
        assert any(row.startswith(f"| {op} (") for row in rows), f"no row for {op!r}"
