"""Finding benchmarks: the workspace's ``bench/benchmarks/<name>/`` and plug-ins' own.

A plug-in package publishes a benchmark as the same folder (``benchmark.yaml`` and
``sets/``) inside its distribution, and names it in the entry point group
``medomni.benchmarks``: ``<name> = "package.module:ATTR"``, where ``ATTR`` is the folder's
path or a callable returning it. A folder in the workspace wins over a plug-in of the same
name, so a user can always override what a package ships.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from medomni_cas.errors import MedomniError
from medomni_cas.studio.folders import BenchmarkFolder, load_benchmark
from medomni_cas.studio.records import BenchmarkCard
from medomni_cas.studio.schema import Benchmark
from medomni_cas.studio.specfile import load_yaml

__all__ = [
    "BENCHMARKS_GROUP",
    "BenchmarkSource",
    "UnknownBenchmark",
    "benchmark_card",
    "find_benchmarks",
    "open_benchmark",
    "read_card",
    "split_set_name",
]

BENCHMARKS_GROUP = "medomni.benchmarks"


class UnknownBenchmark(MedomniError, KeyError):
    """No benchmark or set of that name; the message lists what exists."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class BenchmarkSource:
    """Where a benchmark folder was found: ``"workspace"`` or the plug-in's distribution."""

    name: str
    path: Path
    source: str


def split_set_name(name: str) -> tuple[str, str]:
    """``<benchmark>/<set>`` -> its two parts, or a clear error."""
    bench, sep, set_name = name.partition("/")
    if not sep or not bench or not set_name or "/" in set_name:
        raise UnknownBenchmark(
            f"a task set is named <benchmark>/<set>, such as medomni-bench/v1; got {name!r}"
        )
    return bench, set_name


def _plugin_folders() -> dict[str, BenchmarkSource]:
    out: dict[str, BenchmarkSource] = {}
    for ep in entry_points(group=BENCHMARKS_GROUP):
        obj = ep.load()
        path = Path(obj() if callable(obj) else obj)
        if not (path / "benchmark.yaml").is_file():
            raise MedomniError(
                f"entry point {BENCHMARKS_GROUP} {ep.name!r} ({ep.value}): {path} has no "
                "benchmark.yaml"
            )
        dist = ep.dist.name if ep.dist is not None else ep.module
        out.setdefault(ep.name, BenchmarkSource(ep.name, path, dist))
    return out


def find_benchmarks(bench_root: str | Path | None) -> dict[str, BenchmarkSource]:
    """Every benchmark by name: the workspace's folders, then plug-ins'."""
    found: dict[str, BenchmarkSource] = {}
    if bench_root is not None:
        for card in sorted(Path(bench_root).glob("benchmarks/*/benchmark.yaml")):
            found[card.parent.name] = BenchmarkSource(card.parent.name, card.parent, "workspace")
    for name, src in _plugin_folders().items():
        found.setdefault(name, src)
    return found


def open_benchmark(
    name: str, *, bench_root: str | Path | None, studio: str | Path
) -> BenchmarkFolder:
    """The benchmark ``name`` with its sets checked against ``studio``."""
    found = find_benchmarks(bench_root)
    if name not in found:
        have = ", ".join(sorted(found)) or "none"
        where = f"{bench_root}/benchmarks/" if bench_root is not None else "no bench folder"
        raise UnknownBenchmark(f"no benchmark {name!r} in {where} or plug-ins (have: {have})")
    return load_benchmark(found[name].path, studio=studio)


def benchmark_card(folder: BenchmarkFolder) -> BenchmarkCard:
    card: Benchmark = folder.card
    return BenchmarkCard(
        name=card.name,
        version=card.version,
        owner=card.owner,
        license=card.license,
        description=card.description,
        intelligence_kinds=tuple(card.intelligence_kinds),
    )


def read_card(path: str | Path) -> Benchmark:
    """Only the card of the benchmark folder at ``path`` (its sets are not checked)."""
    return load_yaml(Path(path) / "benchmark.yaml", Benchmark)
