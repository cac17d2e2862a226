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
import pyarrow as pa
import pyarrow.compute as pc

from medomni_cas.bench.columns import Truths
from medomni_cas.bench.records import AgentConfig, AnswerColumns, JobRecord
from medomni_cas.bench.scorer import _Answers, _answers, _answers_of, _predictions
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


def _labels(array: pa.Array) -> tuple[list[object], np.ndarray]:
    """``array``'s distinct values and each row's index among them (-1: null)."""
    if pa.types.is_null(array.type):
        return [], np.full(len(array), -1, dtype=np.intp)
    enc = pc.dictionary_encode(array)
    indices = enc.indices
    idx = pc.fill_null(indices, -1).to_numpy() if indices.null_count else indices.to_numpy()
    return enc.dictionary.to_pylist(), idx.astype(np.intp)


def confusion_tables(
    store: Store, jobs: Sequence[ObjectId], answer_columns: Sequence[ObjectId] = ()
) -> list[ConfusionTable]:
    """The confusion of every class target of ``jobs``, by (agent, arm label, pair, target).

    ``answer_columns``: score against these (a `Result`'s), read only, and leave out a
    job of an arm they do not cover; else each arm's are found or made (and kept), as
    the scorer does. Columnar: each job's rows are coded by value, never a row a time."""
    truths: Truths = {}
    answers: dict[tuple[ObjectId, str, str], _Answers] = {}
    for aid in answer_columns:
        rec = store.get(aid, AnswerColumns)
        answers[(rec.set_build, rec.arm, rec.arm_variant)] = _answers_of(store, aid, rec)
    names: dict[ObjectId, str] = {}
    # by key: each part's (truth values, their codes; answer values, their codes)
    Part = tuple[list[object], np.ndarray, list[object], np.ndarray]
    pooled: dict[tuple[str, str, str, str], list[Part]] = {}
    truth_parts: dict[tuple[ObjectId, int], tuple[list[object], np.ndarray]] = {}
    for jid in jobs:
        job = store.get(jid, JobRecord)
        where = (job.set_build, job.arm, job.arm_variant)
        if where not in answers:
            if answer_columns:
                continue
            answers[where] = _answers(store, *where, truths)
        a = answers[where]
        if all(g.numeric for g in a.record.groups):
            continue
        preds = _predictions(store, job, a, columns=frozenset({"value_text", "status"}))
        if job.agent_config not in names:
            names[job.agent_config] = store.get(job.agent_config, AgentConfig).name
        agent = names[job.agent_config]
        for g in a.record.groups:
            if g.numeric:
                continue
            n = g.stop - g.start
            tk = (a.id, g.start)
            if tk not in truth_parts:  # an arm's jobs share its truth: coded once
                truth_parts[tk] = _labels(a.truth_text.slice(g.start, n))
            value = preds.value_text
            pred = _labels(pa.nulls(n, pa.string()) if value is None else value.slice(g.start, n))
            key = (agent, arm_label(job.arm, job.arm_variant), g.pair, g.target)
            pooled.setdefault(key, []).append((*truth_parts[tk], *pred))
    out = []
    for (agent, label, pair, target), parts in sorted(pooled.items()):
        # a class is any truth present (a missing truth is the class "None", as str() says)
        # or any answer given
        seen = set()
        for t_values, t_idx, p_values, p_idx in parts:
            used = np.unique(t_idx)
            seen |= {"None" if i < 0 else str(t_values[i]) for i in used.tolist()}
            seen |= {str(p_values[i]) for i in np.unique(p_idx).tolist() if i >= 0}
        classes = sorted(seen)
        index = {c: i for i, c in enumerate(classes)}
        k = len(classes)
        counts = np.zeros(k * (k + 1), dtype=np.int64)
        for t_values, t_idx, p_values, p_idx in parts:
            t_map = np.array([index[str(v)] for v in t_values] + [index.get("None", 0)])
            p_map = np.array([index[str(v)] for v in p_values] + [k])
            cell = t_map[t_idx] * (k + 1) + p_map[p_idx]  # -1 picks each map's last entry
            counts += np.bincount(cell, minlength=k * (k + 1))
        matrix = counts.reshape(k, k + 1).tolist()
        out.append(ConfusionTable(agent, label, pair, target, classes, matrix))
    return out
