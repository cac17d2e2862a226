"""Performance benchmarks: ``python -m benchmarks_perf SUITE [--quick]``.

Each suite is a module here with ``main(argv) -> int``; it measures our figure and a baseline
in the same run, so a ratio never mixes two machines or two moments.
"""
