"""``python -m benchmarks_perf SUITE [args]``: run one suite (a module of this package)."""

from __future__ import annotations

import importlib
import sys

# suite name -> module; a suite's module exposes ``main(argv: list[str]) -> int``
SUITES = {
    "store": "benchmarks_perf.store",
    "studio": "benchmarks_perf.studio",
    "remote": "benchmarks_perf.remote",
    "bench": "benchmarks_perf.bench",
    "harbor": "benchmarks_perf.harbor",
    "llm": "benchmarks_perf.llm",
    "compare": "benchmarks_perf.compare",
    "runs": "benchmarks_perf.runs",
    "view": "benchmarks_perf.view",
    "scale": "benchmarks_perf.scale",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in SUITES:
        print(f"usage: python -m benchmarks_perf {{{','.join(SUITES)}}} [--quick]", file=sys.stderr)
        return 2
    return importlib.import_module(SUITES[args[0]]).main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
