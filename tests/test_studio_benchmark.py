"""The Studio benchmark still runs: ``python -m benchmarks_perf studio --quick`` prints its
table (figures are not asserted; they depend on the machine)."""

from __future__ import annotations

from tests.test_benchmarks_smoke import quick_rows


def test_studio_benchmark_quick_prints_a_table() -> None:
    rows = quick_rows("studio", timeout=300)
    for name in ("atom renders", "stored bytes vs unique content", "naive per-arm", "rebuild"):
        assert any(name in row for row in rows), f"no row for {name!r}"
