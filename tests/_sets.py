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


def few_patients_cohort(tree: Path, n: int) -> str:
    """Cohort ``n<n>`` of the CKD template in ``tree``: n20's recipe without per-class counts
    (the first ``n`` eligible patients in seeded order), for tests that need a built, run
    and scored set but not twenty runs of it. Returns its pair, for `small_tree`'s sets."""
    cohorts = tree / "studio/datasets/synth-ehr/tasks/synth-ehr_ckd-staging/cohorts"
    doc = yaml.safe_load((cohorts / "n20.yaml").read_text())
    doc.pop("per_class", None)
    doc.update(n=n, description=f"{n} patients, for tests.")
    (cohorts / f"n{n}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return f"synth-ehr_ckd-staging@n{n}"
