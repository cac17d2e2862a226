"""A writable copy of the example studio and bench trees with a small task set, for tests
that build and run real sets without paying for all of medomni-bench/v1."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from examples import synth

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
N20_PAIRS = ("synth-ehr_ckd-staging@n20", "synth-ehr_hba1c-next@n20")


def small_tree(
    root: Path,
    *,
    arms: list[str],
    pairs: tuple[str, ...] = N20_PAIRS,
    name: str = "small",
    patients: int = 150,
    extra: dict[str, Any] | None = None,
) -> Path:
    """``root/studio`` and ``root/bench`` (copies), generated data in the dataset's folder,
    and the set ``medomni-bench/<name>`` of ``pairs`` under ``arms``; returns ``root``."""
    shutil.copytree(EXAMPLES / "studio", root / "studio", ignore=shutil.ignore_patterns("data"))
    shutil.copytree(EXAMPLES / "bench", root / "bench")
    doc = {
        "description": f"{len(pairs)} pair(s), for tests.",
        "builder": "medomni-v1",
        "arms": arms,
        "pairs": [{"task": p, "n": 1} for p in pairs],
        **(extra or {}),
    }
    sets = root / "bench/benchmarks/medomni-bench/sets"
    (sets / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    synth.generate(root / "studio/datasets/synth-ehr/data", patients=patients, seed=0)
    return root
