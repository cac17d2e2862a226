"""The Studio benchmark still runs: ``python -m benchmarks_perf studio --quick`` prints its
table (figures are not asserted; they depend on the machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_studio_benchmark_quick_prints_a_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks_perf", "studio", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    for name in ("atom renders", "stored bytes vs unique content", "naive per-arm", "rebuild"):
        assert any(name in row for row in rows), f"no row for {name!r}"
