"""A small world for the comparison tests: a set of two n20 pairs under no-perception,
encoders and the modality ladder, run by an in-process agent that answers from the answer
key with seeded noise (each arm its own), so that arms differ and every run is real."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.process import now_iso
from medomni_cas.bench.runners import Job, Runner, Trial
from medomni_cas.studio.records import AnswerKey, BuildResult, SetBuild
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree

SET = "medomni-bench/small"
ARMS = ["no-perception", "encoders", "modality-ladder"]
CLASSES = ("G1", "G2", "G3a", "G3b", "G4", "G5")
# how often an arm answers right (class targets), and its error's spread (numeric ones)
SKILL = {"no-perception": 0.45, "encoders": 0.8}


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


class NoisyOracle(Runner):
    """Answers each slot from the answer key: right with the arm's skill, else a random
    class; numbers off by noise that shrinks with skill. One in 25 answers is left out."""

    name: ClassVar[str] = "noisy-oracle"

    def __init__(self, truth: dict[tuple[str, str], dict[str, object]]) -> None:
        super().__init__()
        self.truth = truth

    def run(self, job: Job) -> Iterator[Trial]:
        label = job.arm_label
        skill = SKILL.get(label, 0.3 + 0.1 * int(job.arm_variant[1:] or 0))
        for spec in job.trials:
            atom = spec.atom
            rng = _rng(atom.pair, atom.patient, label, job.repetition)
            answer: dict[str, object] = {}
            for target, value in self.truth[(atom.pair, atom.patient)].items():
                if rng.random() < 0.04:
                    continue  # no answer for this target
                if isinstance(value, str):
                    answer[target] = value if rng.random() < skill else str(rng.choice(CLASSES))
                elif isinstance(value, int | float):
                    answer[target] = round(float(value) + rng.normal(0, 2.0 * (1 - skill)), 3)
            yield Trial(
                slot=spec.slot,
                attempt=spec.attempt,
                outcome="answered",
                started=now_iso(),
                finished=now_iso(),
                elapsed_ms=1,
                answer=json.dumps(answer).encode(),
                served_model=job.agent.served_model,
            )


def truth_of(store: mc.Store, set_name: str) -> dict[tuple[str, str], dict[str, object]]:
    build = show_set(store, set_name).build
    assert build is not None
    out: dict[tuple[str, str], dict[str, object]] = {}
    for e in store.get(build, SetBuild).entries:
        key = store.get(store.get(e.result, BuildResult).answer_key, AnswerKey)
        for patient, values in key.values.items():
            out[(e.pair, patient)] = dict(values)
    return out


def make_world(root: Path, *, other: str | None = None) -> str:
    """Build and run the small set in ``root``: the encoder arms twice (two repetitions),
    the ladder once; and, if ``other`` names one, a second set of the same pairs and arms
    (another task set hash) whose no-perception job is recorded too. Returns the store URL."""
    tree = small_tree(root, arms=ARMS)
    sets = tree / "bench/benchmarks/medomni-bench/sets"
    if other is not None:
        (sets / f"{other.split('/')[1]}.yaml").write_text((sets / "small.yaml").read_text())
    url = f"lmdb://{root / 'store'}"
    agent = find_agent(tree / "bench", "baseline")
    studio, bench, runs = tree / "studio", tree / "bench", root / "runs"
    with mc.open(url) as store:
        build_set(store, SET, studio=studio, bench=bench)
        runner = NoisyOracle(truth_of(store, SET))

        def run(name: str, arms: list[str], reps: int = 1) -> None:
            run_set(
                store, name, agent, runs_dir=runs, studio=studio, bench=bench, runner=runner,
                reps=reps, arms=arms,
            )  # fmt: skip

        run(SET, ARMS[:2], reps=2)
        run(SET, ARMS[2:])
        if other is not None:
            build_set(store, other, studio=studio, bench=bench)
            run(other, ARMS[:1])
    return url
