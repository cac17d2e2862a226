"""Per-class confusion of class targets: what each arm answered for each true class.

One table per (agent, arm label, pair, target) of a class target, pooled over the
repetitions, read from the jobs' prediction columns against their arm's answer columns (as
the scorer reads them). Plain data (`ConfusionTable`, dicts in JSON), for
`medomni_cas.bench.plots.confusion_figure`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from medomni_cas.bench.columns import Truths
from medomni_cas.bench.records import AgentConfig, JobRecord
from medomni_cas.bench.scorer import _Answers, _answers, _predictions
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_label

__all__ = ["ConfusionTable", "confusion_tables"]


@dataclass
class ConfusionTable:
    """Rows: the true class; columns: the class answered, then "none" (no valid answer)."""

    agent: str
    arm: str  # arm label
    pair: str
    target: str
    classes: list[str]
    matrix: list[list[int]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.agent} {self.arm}\n{self.pair} {self.target}"

    def __getitem__(self, key: str) -> object:  # what `confusion_figure` reads
        return getattr(self, key)

    def get(self, key: str, default: object = None) -> object:
        return getattr(self, key, default)


def confusion_tables(store: Store, jobs: Sequence[ObjectId]) -> list[ConfusionTable]:
    """The confusion of every class target of ``jobs``, by (agent, arm label, pair, target)."""
    truths: Truths = {}
    answers: dict[tuple[ObjectId, str, str], _Answers] = {}
    pooled: dict[tuple[str, str, str, str], list[tuple[list[str | None], list[str | None]]]] = {}
    for jid in jobs:
        job = store.get(jid, JobRecord)
        where = (job.set_build, job.arm, job.arm_variant)
        if where not in answers:
            answers[where] = _answers(store, *where, truths)
        a = answers[where]
        if all(g.numeric for g in a.record.groups):
            continue
        preds = _predictions(store, job, a)
        agent = store.get(job.agent_config, AgentConfig).name
        for g in a.record.groups:
            if g.numeric:
                continue
            n = g.stop - g.start
            truth = a.truth_text.slice(g.start, n).to_pylist()
            value = preds.value_text
            pred = [None] * n if value is None else value.slice(g.start, n).to_pylist()
            key = (agent, arm_label(job.arm, job.arm_variant), g.pair, g.target)
            pooled.setdefault(key, []).append((truth, pred))
    out = []
    for (agent, label, pair, target), parts in sorted(pooled.items()):
        truth = [t for ts, _ in parts for t in ts]
        pred = [p for _, ps in parts for p in ps]
        classes = sorted({str(t) for t in truth} | {str(p) for p in pred if p is not None})
        index = {c: i for i, c in enumerate(classes)}
        t = np.array([index[str(x)] for x in truth], dtype=np.intp)
        p = np.array([len(classes) if x is None else index[str(x)] for x in pred], dtype=np.intp)
        k = len(classes)
        counts = np.bincount(t * (k + 1) + p, minlength=k * (k + 1)).reshape(k, k + 1)
        out.append(ConfusionTable(agent, label, pair, target, classes, counts.tolist()))
    return out
