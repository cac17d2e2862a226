"""Paired contrasts between arms of one task set: the comparer behind ``medomni bench compare``.

For each contrast ``a - b`` (two arm labels), agent, pair and target, the template's metric
under ``a`` minus under ``b`` on the same patients, with a paired bootstrap interval and a
paired test (`medomni_cas.bench.paired_stats`), stored as a `Comparison`.

Pairing is proved, not assumed
    A patient is paired only when both arms hold them with a final run in every
    repetition and, for two arms of the same patients (``kind`` "arms"), their atom tasks'
    evidence trees are the same object, or, for two rungs of the ladder (``kind``
    "ladder", where each rung stages other families, so evidence differs by design), the
    atoms' builds share the content (the ladder cohort and its patients); and the answer
    key gives both the same answer. Every other patient is left out and counted by reason
    (``excluded_why``). Jobs of different task sets are never compared (`CompareError`,
    naming both); a contrast whose runs were built under a config hash other than their
    arm's is flagged (``config_flag``). Paired patients are in cohort order.

Repetitions
    A patient's repetitions (one job each) are pooled: the metric is over every row of the
    paired patients, and the bootstrap resamples patients with all their rows.

Defaults
    encoders - no-perception, encoders-required - encoders, each ladder rung against the
    one before (r2 - r1 ... r6 - r5) and each later one against r1, among the arms the jobs
    hold (`default_contrasts`).

Speed
    Everything is numpy over the jobs' Arrow columns, lined up by patient code: no Python
    loop per row. The atoms' evidence ids are read once per build and kept as a blob
    (``scores/evidence/<build>``, as the scorer keeps answer columns); ``audit verify``
    reads the atoms again instead. Every side (agent, arm, pair, target) is summed per
    patient once, whichever contrasts use it, and all contrasts of the same number of
    patients share one set of resamples and one matrix product. Jobs are read ahead in
    threads, as the scorer reads them (their answers dictionary-encoded there, outside
    the GIL); an arm's truth is coded once for all its jobs; the resampling runs in a
    thread of its own beside the tests. None of this changes a number: a comparison's
    bytes are what ``audit verify`` computes again.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medomni_cas.bench.columns import ArmRows, Truths, arm_rows
from medomni_cas.bench.comparisons import Comparison, ContrastRow
from medomni_cas.bench.evidence import keep_column
from medomni_cas.bench.metrics import METRICS
from medomni_cas.bench.paired_stats import (
    holm,
    mcnemar_exact_many,
    percentile_intervals,
    resample_sums,
    wilcoxon,
)
from medomni_cas.bench.records import AgentConfig, JobRecord
from medomni_cas.bench.refnames import comparison_ref, evidence_ref
from medomni_cas.bench.scorer import _READERS, _Answers, _answers, _Predictions, _predictions
from medomni_cas.errors import InvalidObject, MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.records import AtomTask, BuildConfig, Content, SetBuild
from medomni_cas.studio.schema import LADDER_ARM

__all__ = [
    "ALPHA",
    "COMPARER",
    "COMPARER_VERSION",
    "CONTRAST_SCHEMA",
    "CompareError",
    "Compared",
    "Contrast",
    "DerivedComparison",
    "compare_jobs",
    "comparison_lines",
    "contrast_dicts",
    "default_contrasts",
    "derive_comparison",
    "parse_contrast",
    "rows_table",
    "write_comparisons",
]

COMPARER = "medomni-compare"
COMPARER_VERSION = "1.0.0"
ALPHA = 0.05
# the prediction columns a contrast reads (status: which slots ran; the outcome of jobs
# recorded before status)
_COLUMNS = frozenset({"value_text", "value_num", "status", "outcome"})


class CompareError(MedomniError, ValueError):
    """Jobs that cannot be compared: of different task sets, or no arm to compare."""


@dataclass(frozen=True)
class Contrast:
    """``a - b``: two arm labels, and how their patients pair ("arms" or "ladder")."""

    a: str
    b: str

    @property
    def kind(self) -> str:
        ladder = LADDER_ARM + "."
        return "ladder" if self.a.startswith(ladder) and self.b.startswith(ladder) else "arms"

    def __str__(self) -> str:
        return f"{self.a} - {self.b}"


def parse_contrast(a: str, b: str) -> Contrast:
    if a == b:
        raise CompareError(f"--arms {a} {b}: an arm compared with itself")
    return Contrast(a, b)


def default_contrasts(labels: Sequence[str]) -> list[Contrast]:
    """The contrasts a user reads first, among ``labels`` (arm labels in the set build's
    order): encoders - no-perception, encoders-required - encoders, and the ladder's rungs,
    each against the one before and against the first."""
    have = list(dict.fromkeys(labels))
    out = [
        Contrast(a, b)
        for a, b in (("encoders", "no-perception"), ("encoders-required", "encoders"))
        if a in have and b in have
    ]
    rungs = [x for x in have if x.startswith(LADDER_ARM + ".")]
    out += [Contrast(rungs[i], rungs[i - 1]) for i in range(1, len(rungs))]
    out += [Contrast(r, rungs[0]) for r in rungs[2:]]
    return out


# -- what is read --------------------------------------------------------------------------
class _AtomView(encoding.View):
    """What pairing needs of an atom task: its evidence tree."""

    __kind__ = AtomTask.__kind__
    __version__ = AtomTask.__version__

    evidence: ObjectId


class _PatientsView(encoding.View):
    __kind__ = Content.__kind__
    __version__ = Content.__version__

    patients: tuple[str, ...]


def _ids(data: bytes) -> np.ndarray:
    """32-byte ids (concatenated) as rows of four uint64, compared with ``(x == y).all(1)``."""
    return np.frombuffer(data, dtype=np.uint64).reshape(-1, 4)


@dataclass
class _Group:
    """One job's rows of one (pair, target), in its arm's key order (cohort order)."""

    codes: np.ndarray  # each row's patient, as its code in the pair's `_Universe`
    build: ObjectId  # the `BuildResult` whose atoms the rows are
    atoms: bytes
    content: ObjectId
    config: ObjectId
    metric: str
    numeric: bool
    truth: pa.Array
    pred: pa.Array
    ran: np.ndarray  # whether each row's slot has a final run
    run_configs: frozenset[str]
    families: tuple[str, ...]
    # the answer columns and rows ``truth`` is a slice of: every job of an arm shares them
    truth_key: tuple[ObjectId, int, int] = (ObjectId(bytes(32)), 0, 0)
    # the answers as the reader thread left them: numbers, or (labels, each row's index)
    pred_ready: np.ndarray | tuple[list[str], np.ndarray] | None = None
    # each row's label code in the key's vocabulary (class targets), or its number
    truth_values: np.ndarray | None = None
    pred_values: np.ndarray | None = None


@dataclass
class _Universe:
    """A pair's patients, coded in cohort order (the first content's, then any other's)."""

    code: dict[str, int] = field(default_factory=dict)
    by_content: dict[ObjectId, np.ndarray] = field(default_factory=dict)

    def codes(self, content: ObjectId, patients: tuple[str, ...]) -> np.ndarray:
        got = self.by_content.get(content)
        if got is None:
            code = self.code
            got = None
            if not code:  # the first content: its order is the universe's
                code.update(zip(patients, range(len(patients)), strict=True))
                if len(code) == len(patients):
                    got = np.arange(len(patients), dtype=np.intp)
                else:  # a patient twice: each keeps the code of their first row
                    code.clear()
            if got is None:
                got = np.fromiter(
                    (code.setdefault(p, len(code)) for p in patients), np.intp, len(patients)
                )
            self.by_content[content] = got
        return got


@dataclass
class _Side:
    """One agent under one arm label: its jobs (repetitions) and their groups."""

    agent: str
    label: str
    jobs: list[ObjectId] = field(default_factory=list)
    groups: dict[tuple[str, str], list[_Group]] = field(default_factory=dict)


class _Reader:
    """Reads jobs' columns, answer columns, keys and atoms, each once. ``cached``: use and
    keep the atoms' evidence ids under ``scores/evidence/<build>``; else read every atom."""

    def __init__(self, store: Store, cached: bool) -> None:
        self.store = store
        self.cached = cached
        self.truths: Truths = {}
        self.answers: dict[tuple[ObjectId, str, str], _Answers] = {}
        self.patients: dict[ObjectId, tuple[str, ...]] = {}
        self.evidence: dict[ObjectId, np.ndarray] = {}
        self.families: dict[ObjectId, tuple[str, ...]] = {}
        self.universes: dict[str, _Universe] = {}
        self.keys: dict[tuple[ObjectId, str, str], ArmRows] = {}

    def arm_answers(self, build: ObjectId, arm: str, variant: str) -> _Answers:
        k = (build, arm, variant)
        if k not in self.answers:
            self.answers[k] = _answers(self.store, build, arm, variant, self.truths)
        return self.answers[k]

    def content_patients(self, content: ObjectId) -> tuple[str, ...]:
        if content not in self.patients:
            raw = self.store.get_raw(content)
            self.patients[content] = encoding.decode_view(raw, _PatientsView).patients
        return self.patients[content]

    def config_families(self, config: ObjectId) -> tuple[str, ...]:
        if config not in self.families:
            defn = self.store.get(config, BuildConfig).arm_definition
            self.families[config] = tuple(str(f) for f in defn.get("families", ()))
        return self.families[config]

    def build_evidence(self, build: ObjectId, atoms: bytes) -> np.ndarray:
        """``[atoms, 4]``: the evidence tree id of each atom of ``build``, as `_ids`."""
        got = self.evidence.get(build)
        if got is not None:
            return got
        ref = evidence_ref(build)
        kept = self.store.refs.get(ref) if self.cached else None
        data = self.store.read_blob(kept) if kept is not None else b""
        if len(data) != len(atoms):  # none kept (or not what the atoms need): read them
            ids = [ObjectId(atoms[i : i + 32]) for i in range(0, len(atoms), 32)]
            found = {}
            for oid, raw in self.store.get_raw_many(dict.fromkeys(ids)):
                try:
                    found[oid] = encoding.decode_view(raw, _AtomView).evidence
                except InvalidObject as e:
                    raise InvalidObject(f"atom task {oid}: {e}") from None
            data = b"".join(found[a] for a in ids)
            if self.cached:
                keep_column(self.store, build, data)
        got = self.evidence[build] = _ids(data)
        return got

    def read_ahead(
        self, pool: ThreadPoolExecutor, job: JobRecord
    ) -> tuple[JobRecord, Future[_Read]]:
        """Start reading ``job``'s columns in ``pool`` (the answers are made here, in
        order, as the caches are this thread's)."""
        answers = self.arm_answers(job.set_build, job.arm, job.arm_variant)
        return job, pool.submit(_read_job, self.store, job, answers)

    def job_groups(self, job: JobRecord, read: _Read) -> list[tuple[tuple[str, str], _Group]]:
        preds, ready = read
        answers = self.arm_answers(job.set_build, job.arm, job.arm_variant)
        where = (job.set_build, job.arm, job.arm_variant)
        key = self.keys.get(where)
        if key is None:
            key = self.keys[where] = arm_rows(self.store, *where)
        ran = preds.status.is_valid().to_numpy(zero_copy_only=False)
        out = []
        for i, (g, k) in enumerate(zip(answers.record.groups, key.groups, strict=True)):
            if (g.pair, g.target, g.start, g.stop) != (k.entry.pair, k.target, k.start, k.stop):
                raise CompareError(
                    f"answer columns of {arm_label(job.arm, job.arm_variant)} do not follow "
                    f"the set build's key at {g.pair} {g.target}"
                )
            n = g.stop - g.start
            if g.numeric:
                truth, pred = answers.truth_num, preds.value_num
            else:
                truth, pred = answers.truth_text, preds.value_text
            truth = truth.slice(g.start, n)
            pred = pa.nulls(n, truth.type) if pred is None else pred.slice(g.start, n)
            configs: frozenset[str] = frozenset()
            if preds.config is not None:
                seen = pc.unique(preds.config.slice(g.start, n)).to_pylist()
                configs = frozenset(c for c in seen if c)
            universe = self.universes.setdefault(g.pair, _Universe())
            group = _Group(
                codes=universe.codes(k.content, self.content_patients(k.content)),
                build=k.entry.result,
                atoms=k.atoms,
                content=k.content,
                config=g.config,
                metric=g.metric,
                numeric=g.numeric,
                truth=truth,
                pred=pred,
                ran=ran[g.start : g.stop],
                run_configs=configs,
                families=self.config_families(g.config),
                truth_key=(answers.id, g.start, g.stop),
                pred_ready=ready[i],
            )
            out.append(((g.pair, g.target), group))
        return out


# -- values --------------------------------------------------------------------------------
def _codes(array: pa.Array, vocab: dict[str, int]) -> np.ndarray:
    """Each row's label as its code in ``vocab`` (grown as needed), -1 for a null."""
    return _remap(*_encoded(array), vocab)


def _encoded(array: pa.Array) -> tuple[list[str], np.ndarray]:
    """``array``'s labels (first seen first) and each row's index among them (their number
    for a null): the costly part of `_codes`, which needs no vocabulary (so a reader
    thread does it)."""
    if pa.types.is_null(array.type):
        return [], np.zeros(len(array), dtype=np.intp)
    enc = pc.dictionary_encode(array)
    labels = enc.dictionary.to_pylist()
    indices = enc.indices
    if indices.null_count:  # a null row's index is whatever its slot holds: the last code
        idx = np.where(
            indices.is_valid().to_numpy(zero_copy_only=False),
            pc.fill_null(indices, 0).to_numpy(),
            len(labels),
        )
    else:
        idx = indices.to_numpy()
    return labels, idx.astype(np.intp)


def _remap(labels: list[str], idx: np.ndarray, vocab: dict[str, int]) -> np.ndarray:
    remap = np.array([vocab.setdefault(label, len(vocab)) for label in labels] + [-1])
    return remap[idx]


#: A job's columns as a reader thread leaves them: the predictions, and each answer group's
#: answers ready to code (`_Group.pred_ready`).
_Read = tuple[_Predictions, list[np.ndarray | tuple[list[str], np.ndarray]]]


def _read_job(store: Store, job: JobRecord, answers: _Answers) -> _Read:
    """A job's columns, and each group's answers as numbers or labels and indices (the
    Arrow work, outside the GIL, done here in a reader thread rather than in the
    thread that pairs)."""
    preds = _predictions(store, job, answers, columns=_COLUMNS)
    ready: list[np.ndarray | tuple[list[str], np.ndarray]] = []
    for g in answers.record.groups:
        n = g.stop - g.start
        value = preds.value_num if g.numeric else preds.value_text
        typ = pa.float64() if g.numeric else pa.string()
        pred = pa.nulls(n, typ) if value is None else value.slice(g.start, n)
        ready.append(_numbers(pred) if g.numeric else _encoded(pred))
    return preds, ready


def _numbers(array: pa.Array) -> np.ndarray:
    return array.cast(pa.float64()).to_numpy(zero_copy_only=False)  # null -> NaN


def _prepare_values(groups: Sequence[_Group]) -> int:
    """Give every group of one (pair, target) its rows' values: label codes in one
    vocabulary of every arm's truths and answers (for class targets), or numbers. Returns
    the vocabulary's size (0 for a numeric target)."""
    vocab: dict[str, int] = {}
    # an arm's jobs share its answers: their truth is coded once (and is then one array,
    # which `_facts` recognises); coding it again would add no label to ``vocab``, so the
    # codes are the same as coding every group's
    truths: dict[tuple[ObjectId, int, int], np.ndarray] = {}
    for g in groups:
        if g.truth_values is not None:
            continue
        truth = truths.get(g.truth_key)
        ready = g.pred_ready
        if g.numeric:
            if truth is None:
                truth = truths[g.truth_key] = _numbers(g.truth)
            pred = ready if isinstance(ready, np.ndarray) else _numbers(g.pred)
            g.truth_values, g.pred_values = truth, pred
        else:
            if truth is None:
                truth = truths[g.truth_key] = _codes(g.truth, vocab)
            codes = _remap(*ready, vocab) if isinstance(ready, tuple) else _codes(g.pred, vocab)
            g.truth_values, g.pred_values = truth, codes
        g.pred_ready = None
    return len(vocab)


# -- pairing -------------------------------------------------------------------------------
@dataclass
class _Facts:
    """A side's patients (by code): seen, never run in some repetition, disagreeing between
    repetitions, their proof (evidence or content id) and their answer."""

    seen: np.ndarray
    never: np.ndarray
    mixed: np.ndarray
    proof: np.ndarray
    truth: np.ndarray


def _same_values(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x == y) | (np.isnan(x) & np.isnan(y))


def _same_ids(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Rows of `_ids` equal in all 32 bytes: four column compares, several times faster
    than ``(x == y).all(axis=1)``."""
    same = x[:, 0] == y[:, 0]
    for j in (1, 2, 3):
        same &= x[:, j] == y[:, j]
    return same


def _put_ids(into: np.ndarray, where: np.ndarray, rows: np.ndarray) -> None:
    """``into[where] = rows`` for `_ids` rows, each moved as one 32-byte item (a 2-D
    fancy assignment of uint64 is several times slower)."""
    items = np.ascontiguousarray(rows).view(np.dtype("V32"))[:, 0]
    into.view(np.dtype("V32"))[:, 0][where] = items


def _facts(reader: _Reader, groups: list[_Group], size: int, ladder: bool) -> _Facts:
    seen = np.zeros(size, dtype=bool)
    never = np.zeros(size, dtype=bool)
    mixed = np.zeros(size, dtype=bool)
    proof = np.zeros((size, 4), dtype=np.uint64)
    truth = np.full(size, np.nan)
    first: tuple[object, object, object] | None = None
    same: tuple[object, object, object]
    for g in groups:
        c = g.codes
        never[c[~g.ran]] = True
        if ladder:
            rows = np.broadcast_to(_ids(g.content), (len(c), 4))
            same = (c, g.content, g.truth_values)
        else:
            rows = reader.build_evidence(g.build, g.atoms)
            same = (c, rows, g.truth_values)
        # a repetition of the first group's build and answers (the same arrays, kept once
        # per content, build and answers): the same patients, proofs and answers
        if first is not None and all(x is y for x, y in zip(same, first, strict=True)):
            continue
        t = np.asarray(g.truth_values, dtype=np.float64)
        if first is None:  # nobody seen yet: every row is fresh
            first = same
            _put_ids(proof, c, rows)
            truth[c] = t
            seen[c] = True
            continue
        before = seen[c]
        differs = ~_same_ids(np.take(proof, c, axis=0), rows) | ~_same_values(truth[c], t)
        mixed[c[before & differs]] = True
        fresh = ~before
        _put_ids(proof, c[fresh], np.compress(fresh, rows, axis=0))
        truth[c[fresh]] = t[fresh]
        seen[c] = True
    return _Facts(seen, never, mixed, proof, truth)


@dataclass
class _Pairing:
    patients: np.ndarray  # codes of the paired patients, in cohort order
    excluded: dict[str, int]


def _pair(a: _Facts, b: _Facts, ladder: bool) -> _Pairing:
    what = "cohort content" if ladder else "evidence"
    reasons: list[tuple[str, np.ndarray]] = []
    rest = a.seen & b.seen
    reasons.append(("only under a", a.seen & ~b.seen))
    reasons.append(("only under b", b.seen & ~a.seen))
    for name, mask in (
        ("never run under a", rest & a.never),
        ("never run under b", rest & ~a.never & b.never),
        (f"{what} differs between repetitions", rest & ~a.never & ~b.never & (a.mixed | b.mixed)),
    ):
        reasons.append((name, mask))
        rest = rest & ~mask
    differs = rest & ~_same_ids(a.proof, b.proof)
    reasons.append((f"{what} differs", differs))
    rest = rest & ~differs
    answer = rest & ~_same_values(a.truth, b.truth)
    reasons.append(("answer differs", answer))
    rest = rest & ~answer
    excluded = {name: int(n) for name, mask in reasons if (n := np.count_nonzero(mask))}
    return _Pairing(np.flatnonzero(rest), dict(sorted(excluded.items())))


# -- per-patient statistics ----------------------------------------------------------------
@dataclass
class _Stats:
    """A side's per-patient sums over its repetitions, for the paired patients in order."""

    matrix: np.ndarray  # [n, m]: the metric's statistics (see `_class_stats`, `_num_stats`)
    per_patient: np.ndarray  # [n]: correctness rate, or mean absolute error (NaN: none)
    reps: int
    single: bool  # every paired patient has exactly one row
    columns: np.ndarray | None = None  # where its columns sit in `sums`
    sums: np.ndarray | None = None  # [n_boot, M]: resampled sums of its and others' columns
    _total: np.ndarray | None = None

    def total(self) -> np.ndarray:
        """``[1, m]``: the column sums over the paired patients (a side in several
        contrasts sums them once)."""
        if self._total is None:
            self._total = self.matrix.sum(axis=0)[None]
        return self._total


def _rows_of(g: _Group, patients: np.ndarray, size: int) -> np.ndarray:
    """For each paired patient, their row in ``g`` (-1 where ``g`` has none)."""
    if len(g.codes) == len(patients) and np.array_equal(g.codes, patients):
        return np.arange(len(patients))
    row_of = np.full(size, -1, dtype=np.intp)
    row_of[g.codes] = np.arange(len(g.codes))
    return row_of[patients]


def _rows_values(
    g: _Group, patients: np.ndarray, size: int
) -> tuple[slice | np.ndarray, np.ndarray, np.ndarray]:
    """Where ``g``'s rows go among the paired ``patients`` and their truth and answer
    values: a slice (no copy) when ``g`` holds every paired patient in order, the common
    case."""
    assert g.truth_values is not None and g.pred_values is not None
    if len(g.codes) == len(patients) and np.array_equal(g.codes, patients):
        return slice(None), g.truth_values, g.pred_values
    pos = _rows_of(g, patients, size)
    have = np.flatnonzero(pos >= 0)
    rows = pos[have]
    return have, g.truth_values[rows], g.pred_values[rows]


def _class_stats(
    metric: str, groups: list[_Group], patients: np.ndarray, size: int, k: int
) -> np.ndarray:
    """``[n, m]`` summed over ``groups``: columns ``[correct, rows]`` then, for the macro
    metrics, true positives and support by class (and, for macro F1, answers by class)."""
    n = len(patients)
    macro = metric in ("macro_f1", "balanced_accuracy")
    width = 2 + (3 * k if metric == "macro_f1" else 2 * k if macro else 0)
    total = np.zeros((n, width))
    for g in groups:
        have, t, p = _rows_values(g, patients, size)
        right = (p == t) & (p >= 0)
        total[have, 0] += right
        total[have, 1] += 1.0
        if macro:
            if isinstance(have, slice):
                have = np.arange(n)
            np.add.at(total, (have[right], 2 + t[right]), 1.0)
            np.add.at(total, (have, 2 + k + t), 1.0)
            if metric == "macro_f1":
                answered = p >= 0
                np.add.at(total, (have[answered], 2 + 2 * k + p[answered]), 1.0)
    return total


def _num_stats(groups: list[_Group], patients: np.ndarray, size: int) -> np.ndarray:
    """``[n, 4]`` summed over ``groups``: columns ``[|err|, err², answered, rows]``."""
    total = np.zeros((len(patients), 4))
    for g in groups:
        have, t, p = _rows_values(g, patients, size)
        answered = np.isfinite(p)
        err = np.abs(np.where(answered, p - t, 0.0))
        total[have, 0] += err
        total[have, 1] += err * err
        total[have, 2] += answered
        total[have, 3] += 1.0
    return total


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den != 0)


def _stats(
    metric: str, numeric: bool, groups: list[_Group], patients: np.ndarray, size: int, k: int
) -> _Stats:
    if numeric:
        matrix = _num_stats(groups, patients, size)
        per, rows = _ratio(matrix[:, 0], matrix[:, 2]), matrix[:, 3]
    else:
        matrix = _class_stats(metric, groups, patients, size, k)
        per, rows = _ratio(matrix[:, 0], matrix[:, 1]), matrix[:, 1]
    single = bool(len(rows)) and bool(np.all(rows == 1))
    return _Stats(matrix, per, len(groups), single)


def _finalizer(metric: str, k: int) -> Callable[[np.ndarray], np.ndarray]:
    """The metric from summed statistics, ``[b, m]`` -> ``[b]`` (NaN where undefined); the
    same definitions as `medomni_cas.bench.metrics`."""
    if metric == "accuracy":
        return lambda s: _ratio(s[:, 0], s[:, 1])
    if metric == "balanced_accuracy":

        def balanced(s: np.ndarray) -> np.ndarray:
            tp, support = s[:, 2 : 2 + k], s[:, 2 + k : 2 + 2 * k]
            present = support > 0
            recall = np.divide(tp, support, out=np.zeros(support.shape), where=present)
            return _ratio(recall.sum(axis=1), present.sum(axis=1))

        return balanced
    if metric == "macro_f1":

        def f1(s: np.ndarray) -> np.ndarray:
            tp = s[:, 2 : 2 + k]
            den = s[:, 2 + k : 2 + 2 * k] + s[:, 2 + 2 * k : 2 + 3 * k]
            present = den > 0
            per = np.divide(2.0 * tp, den, out=np.zeros(den.shape), where=present)
            return _ratio(per.sum(axis=1), present.sum(axis=1))

        return f1
    if metric == "mae":
        return lambda s: _ratio(s[:, 0], s[:, 2])
    if metric == "rmse":
        return lambda s: np.sqrt(_ratio(s[:, 1], s[:, 2]))
    raise CompareError(f"metric {metric!r} has no paired contrast (known: {', '.join(METRICS)})")


def _clean(x: float) -> float | None:
    x = float(x)
    return x + 0.0 if np.isfinite(x) else None


# -- one contrast row ----------------------------------------------------------------------
@dataclass
class _Task:
    """A contrast row being computed: its statistics, waiting for the bootstrap."""

    agent: str
    contrast: Contrast
    pair: str
    target: str
    metric: str
    pairing: _Pairing
    a: _Stats
    b: _Stats
    finish: Callable[[np.ndarray], np.ndarray]
    numeric: bool
    config_a: str
    config_b: str
    config_flag: str
    families_a: tuple[str, ...]
    families_b: tuple[str, ...]


def _config_flag(label: str, groups: list[_Group]) -> str:
    own = {g.config.hex() for g in groups}
    runs = set().union(*(g.run_configs for g in groups)) - own
    notes = []
    if len(own) > 1:
        notes.append(f"{label}'s jobs were built under {len(own)} config hashes")
    if runs:
        shown = ", ".join(c[:12] for c in sorted(runs))
        notes.append(f"runs of {label} built under another config hash: {shown}")
    return "; ".join(notes)


class _Planner:
    """Makes the tasks of a comparison, computing each side's facts and statistics once."""

    def __init__(self, reader: _Reader, sides: dict[tuple[str, str], _Side]) -> None:
        self.reader = reader
        self.sides = sides
        self.vocab: dict[tuple[str, str], int] = {}
        self.facts: dict[tuple[str, str, tuple[str, str], bool], _Facts] = {}
        self.stats: dict[tuple[str, str, tuple[str, str], bytes], _Stats] = {}

    def k(self, key: tuple[str, str]) -> int:
        if key not in self.vocab:
            groups = [g for s in self.sides.values() for g in s.groups.get(key, ())]
            self.vocab[key] = _prepare_values(groups)
        return self.vocab[key]

    def side_facts(self, side: _Side, key: tuple[str, str], ladder: bool) -> _Facts:
        fk = (side.agent, side.label, key, ladder)
        if fk not in self.facts:
            size = len(self.reader.universes[key[0]].code)
            self.facts[fk] = _facts(self.reader, side.groups[key], size, ladder)
        return self.facts[fk]

    def side_stats(self, side: _Side, key: tuple[str, str], patients: np.ndarray) -> _Stats:
        sk = (side.agent, side.label, key, patients.tobytes())
        if sk not in self.stats:
            groups = side.groups[key]
            size = len(self.reader.universes[key[0]].code)
            g = groups[0]
            self.stats[sk] = _stats(g.metric, g.numeric, groups, patients, size, self.k(key))
        return self.stats[sk]

    def task(self, agent: str, contrast: Contrast, key: tuple[str, str]) -> _Task | None:
        a, b = self.sides[(agent, contrast.a)], self.sides[(agent, contrast.b)]
        ga, gb = a.groups[key], b.groups[key]
        metric, numeric = ga[0].metric, ga[0].numeric
        if gb[0].metric != metric or gb[0].numeric != numeric:
            return None  # not the same target: nothing to contrast
        k = self.k(key)
        ladder = contrast.kind == "ladder"
        pairing = _pair(self.side_facts(a, key, ladder), self.side_facts(b, key, ladder), ladder)
        flags = [f for f in (_config_flag(a.label, ga), _config_flag(b.label, gb)) if f]
        return _Task(
            agent=agent,
            contrast=contrast,
            pair=key[0],
            target=key[1],
            metric=metric,
            pairing=pairing,
            a=self.side_stats(a, key, pairing.patients),
            b=self.side_stats(b, key, pairing.patients),
            finish=_finalizer(metric, k),
            numeric=numeric,
            config_a=ga[0].config.hex(),
            config_b=gb[0].config.hex(),
            config_flag="; ".join(flags),
            families_a=ga[0].families,
            families_b=gb[0].families,
        )


def _test(t: _Task) -> tuple[str, float | None, float | None, int, int, int]:
    """(test, statistic, p, discordant, a better, b better) on per-patient values."""
    pa_, pb_ = t.a.per_patient, t.b.per_patient
    both = np.isfinite(pa_) & np.isfinite(pb_)
    if not both.any():
        return "", None, None, 0, 0, 0
    d = pa_[both] - pb_[both]
    gain = -d if t.numeric else d  # a lower absolute error is better
    a_better, b_better = int(np.count_nonzero(gain > 0)), int(np.count_nonzero(gain < 0))
    discordant = a_better + b_better
    if not t.numeric and t.a.single and t.b.single:
        # p: computed with every other McNemar test of the comparison (`_finish`)
        return "mcnemar-exact", None, None, discordant, a_better, b_better
    stat, p = wilcoxon(d)
    return "wilcoxon", stat, p, discordant, a_better, b_better


def _bootstrap(tasks: list[_Task], n_boot: int, seed: int) -> None:
    """Set each task's sides' ``columns`` in one matrix of resampled sums per number of
    patients: equal columns (a side in two contrasts, the row counts) are summed once.
    Integer statistics are summed in float32 when every sum is exact in it (twice as
    fast); the others in float64."""
    by_n: dict[int, dict[int, _Stats]] = {}
    for t in tasks:
        n = len(t.pairing.patients)
        if n >= 2 and n_boot > 0:
            for s in (t.a, t.b):
                by_n.setdefault(n, {})[id(s)] = s
    for n, stats in by_n.items():
        unique: dict[bytes, int] = {}
        cols: list[np.ndarray] = []
        for s in stats.values():
            where = []
            for j in range(s.matrix.shape[1]):
                col = np.ascontiguousarray(s.matrix[:, j])
                where.append(unique.setdefault(col.tobytes(), len(unique)))
                if len(cols) < len(unique):
                    cols.append(col)
            s.columns = np.array(where, dtype=np.intp)
        matrix = np.stack(cols, axis=1)
        # a resample's sum is at most n times a column's largest value
        integers = bool(np.all(matrix == np.round(matrix)))
        bound = float(np.abs(matrix).max(initial=0.0)) * n
        exact32 = integers and bound < 2**24
        sums = resample_sums(
            matrix.astype(np.float32) if exact32 else matrix,
            n_boot,
            seed,
            exact=integers and bound < 2**53,
        )
        for s in stats.values():
            s.sums = sums


def _resampled(
    s: _Stats, finish: Callable[[np.ndarray], np.ndarray], done: dict[int, np.ndarray]
) -> np.ndarray:
    """A side's metric in each resample, computed once for the contrasts it is in (its
    finaliser is that of its target, the same in all of them)."""
    if id(s) not in done:
        assert s.sums is not None
        done[id(s)] = finish(np.asarray(s.sums[:, s.columns], dtype=np.float64))
    return done[id(s)]


def _finish(tasks: list[_Task], n_boot: int, seed: int) -> list[ContrastRow]:
    """Bootstrap every task, test each, adjust the p-values together."""
    # the resampling (its draws and its product, mostly outside the GIL) runs in a thread
    # while this one computes the values and the tests, which need none of it
    with ThreadPoolExecutor(1, thread_name_prefix="medomni-bootstrap") as pool:
        booted = pool.submit(_bootstrap, tasks, n_boot, seed)
        values: list[tuple[float | None, float | None, float | None]] = []
        for t in tasks:
            paired = len(t.pairing.patients) > 0
            va = _clean(t.finish(t.a.total())[0]) if paired else None
            vb = _clean(t.finish(t.b.total())[0]) if paired else None
            diff = None if va is None or vb is None else _clean(va - vb)
            values.append((va, vb, diff))
        tests = [_test(t) for t in tasks]
        exact = [i for i, x in enumerate(tests) if x[0] == "mcnemar-exact"]
        p_exact = mcnemar_exact_many([tests[i][4:6] for i in exact])
        for i, p_ in zip(exact, p_exact, strict=True):
            tests[i] = (*tests[i][:2], p_, *tests[i][3:])
        booted.result()
    resampled: list[np.ndarray] = []
    where: list[int | None] = []
    metrics: dict[int, np.ndarray] = {}
    for t, (_, _, diff) in zip(tasks, values, strict=True):
        if t.a.sums is not None and t.b.sums is not None and diff is not None:
            ra, rb = _resampled(t.a, t.finish, metrics), _resampled(t.b, t.finish, metrics)
            where.append(len(resampled))
            resampled += [ra - rb, ra, rb]
        else:
            where.append(None)
    # every interval in one percentile call: one a row costs more than the resampling
    intervals = percentile_intervals(np.stack(resampled), ALPHA) if resampled else []
    rows = []
    for t, (va, vb, diff), w, tested in zip(tasks, values, where, tests, strict=True):
        lo = hi = alo = ahi = blo = bhi = None
        if w is not None:
            (lo, hi), (alo, ahi), (blo, bhi) = intervals[w : w + 3]
        test, stat, p, discordant, a_better, b_better = tested
        rows.append(
            ContrastRow(
                agent=t.agent,
                kind=t.contrast.kind,
                a=t.contrast.a,
                b=t.contrast.b,
                pair=t.pair,
                target=t.target,
                metric=t.metric,
                higher_is_better=METRICS[t.metric].higher_is_better,
                value_a=va,
                value_b=vb,
                difference=diff,
                ci_low=lo,
                ci_high=hi,
                a_ci_low=alo,
                a_ci_high=ahi,
                b_ci_low=blo,
                b_ci_high=bhi,
                patients=len(t.pairing.patients),
                reps_a=t.a.reps,
                reps_b=t.b.reps,
                excluded=sum(t.pairing.excluded.values()),
                excluded_why=t.pairing.excluded,
                test=test,
                statistic=stat,
                p_value=p,
                discordant=discordant,
                a_better=a_better,
                b_better=b_better,
                config_a=t.config_a,
                config_b=t.config_b,
                config_flag=t.config_flag,
                families_a=t.families_a,
                families_b=t.families_b,
            )
        )
    adjusted = holm([r.p_value for r in rows])
    return [msgspec.structs.replace(r, p_holm=q) for r, q in zip(rows, adjusted, strict=True)]


# -- the comparison ------------------------------------------------------------------------
@dataclass(frozen=True)
class DerivedComparison:
    """A comparison as computed from jobs, before anything is stored: what `compare_jobs`
    stores, and what ``audit verify`` computes again to compare."""

    task_set: ObjectId
    set_build: ObjectId
    rows: tuple[ContrastRow, ...]
    jobs: tuple[ObjectId, ...]
    answer_keys: tuple[ObjectId, ...]
    answer_columns: tuple[ObjectId, ...]


def _labels(store: Store, set_build: ObjectId) -> list[str]:
    sb = store.get(set_build, SetBuild)
    return list(dict.fromkeys(arm_label(e.arm, e.arm_variant) for e in sb.entries))


def derive_comparison(
    store: Store,
    jobs: Sequence[ObjectId],
    *,
    contrasts: Sequence[tuple[str, str]] = (),
    agents: Sequence[str] = (),
    n_boot: int = 1000,
    seed: int = 0,
    cached: bool = True,
) -> DerivedComparison:
    """Compare the arms of ``jobs`` (all of one task set): ``contrasts`` as (a, b) arm
    labels, else `default_contrasts`; for ``agents`` (names), else every agent of the jobs.
    ``cached``: use (and keep) the atoms' evidence ids kept per build; without it, every
    atom is read (what ``audit verify`` does)."""
    records = [(j, store.get(j, JobRecord)) for j in dict.fromkeys(jobs)]
    if not records:
        raise CompareError("no jobs to compare: run the set first (`medomni bench run`)")
    sets = sorted({r.task_set for _, r in records})
    if len(sets) > 1:
        raise CompareError(
            "these jobs come from different task sets ("
            + " and ".join(s.hex() for s in sets)
            + "): arms of different task set hashes are never compared"
        )
    names = {r.agent_config: store.get(r.agent_config, AgentConfig).name for _, r in records}
    if agents:
        unknown = [a for a in agents if a not in names.values()]
        if unknown:
            raise CompareError(f"no job of agent {unknown[0]!r} to compare")
    set_build = records[-1][1].set_build
    labels = _labels(store, set_build)
    held = {arm_label(r.arm, r.arm_variant) for _, r in records}
    if contrasts:
        chosen = [parse_contrast(a, b) for a, b in contrasts]
        for c in chosen:
            for label in (c.a, c.b):
                if label not in labels:
                    raise CompareError(
                        f"the task set has no arm {label!r} (has: {', '.join(labels)})"
                    )
    else:
        chosen = default_contrasts([x for x in labels if x in held])
        if not chosen:
            raise CompareError(
                "no default contrast among the arms run ("
                + ", ".join(sorted(held))
                + "): name one with --arms A B"
            )
    wanted = {x for c in chosen for x in (c.a, c.b)}
    reader = _Reader(store, cached)
    sides: dict[tuple[str, str], _Side] = {}
    used: list[ObjectId] = []
    read = []
    for jid, r in records:
        label = arm_label(r.arm, r.arm_variant)
        agent = names[r.agent_config]
        if label not in wanted or (agents and agent not in agents):
            continue
        side = sides.setdefault((agent, label), _Side(agent, label))
        side.jobs.append(jid)
        used.append(jid)
        read.append((side, r))
    # as the scorer does: the next jobs' columns are read (blob reads, hashing, Arrow
    # decoding, mostly outside the GIL) while this one's are lined up
    upcoming = iter(read)
    pending: deque[tuple[_Side, tuple[JobRecord, Future[_Read]]]] = deque()
    with ThreadPoolExecutor(_READERS, thread_name_prefix="medomni-compare") as pool:

        def ahead() -> None:
            nxt = next(upcoming, None)
            if nxt is not None:
                pending.append((nxt[0], reader.read_ahead(pool, nxt[1])))

        for _ in range(_READERS + 1):
            ahead()
        while pending:
            side, (r, future) = pending.popleft()
            ahead()
            for key, group in reader.job_groups(r, future.result()):
                side.groups.setdefault(key, []).append(group)
    planner = _Planner(reader, sides)
    tasks = []
    for agent in sorted({a for a, _ in sides}):
        for c in chosen:
            a, b = sides.get((agent, c.a)), sides.get((agent, c.b))
            if a is None or b is None:
                continue
            for key in sorted(set(a.groups) & set(b.groups)):
                t = planner.task(agent, c, key)
                if t is not None:
                    tasks.append(t)
    if not tasks:
        asked = ", ".join(str(c) for c in chosen)
        raise CompareError(f"no agent has jobs of both arms of any contrast asked ({asked})")
    rows = _finish(tasks, n_boot, seed)
    answers = list(reader.answers.values())
    return DerivedComparison(
        task_set=sets[0],
        set_build=set_build,
        rows=tuple(rows),
        jobs=tuple(used),
        answer_keys=tuple(dict.fromkeys(k for a in answers for k in a.record.answer_keys)),
        answer_columns=tuple(a.id for a in answers),
    )


# -- the table, the record, the files --------------------------------------------------------
_F = pa.float64()
CONTRAST_SCHEMA = pa.schema(
    [
        ("agent", pa.string()),
        ("kind", pa.string()),
        ("a", pa.string()),
        ("b", pa.string()),
        ("pair", pa.string()),
        ("target", pa.string()),
        ("metric", pa.string()),
        ("higher_is_better", pa.bool_()),
        ("value_a", _F),
        ("value_b", _F),
        ("difference", _F),
        ("ci_low", _F),
        ("ci_high", _F),
        ("a_ci_low", _F),
        ("a_ci_high", _F),
        ("b_ci_low", _F),
        ("b_ci_high", _F),
        ("patients", pa.int64()),
        ("reps_a", pa.int64()),
        ("reps_b", pa.int64()),
        ("excluded", pa.int64()),
        ("excluded_why", pa.map_(pa.string(), pa.int64())),
        ("test", pa.string()),
        ("statistic", _F),
        ("p_value", _F),
        ("p_holm", _F),
        ("discordant", pa.int64()),
        ("a_better", pa.int64()),
        ("b_better", pa.int64()),
        ("config_a", pa.string()),
        ("config_b", pa.string()),
        ("config_flag", pa.string()),
        ("families_a", pa.list_(pa.string())),
        ("families_b", pa.list_(pa.string())),
    ]
)


def contrast_dicts(rows: Sequence[ContrastRow]) -> list[dict[str, object]]:
    """Contrast rows as plain dicts with every field (defaults too)."""
    return [msgspec.to_builtins(msgspec.structs.asdict(r)) for r in rows]


def rows_table(rows: Sequence[ContrastRow]) -> pa.Table:
    """A comparison's rows as the table its Parquet blob holds (`CONTRAST_SCHEMA`)."""
    data: dict[str, list[object]] = {f: [] for f in CONTRAST_SCHEMA.names}
    for r in rows:
        for f in CONTRAST_SCHEMA.names:
            v = getattr(r, f)
            data[f].append(list(v.items()) if isinstance(v, dict) else v)
    return pa.table(data, schema=CONTRAST_SCHEMA)


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


@dataclass(frozen=True)
class Compared:
    comparison: ObjectId
    record: Comparison
    table: pa.Table


def compare_jobs(
    store: Store,
    jobs: Sequence[ObjectId],
    *,
    contrasts: Sequence[tuple[str, str]] = (),
    agents: Sequence[str] = (),
    n_boot: int = 1000,
    seed: int = 0,
    set_name: str | None = None,
) -> Compared:
    """Compare the arms of ``jobs`` into a stored `Comparison` (see `derive_comparison`),
    and move ``comparisons/<set>`` to it when ``set_name`` is given."""
    d = derive_comparison(store, jobs, contrasts=contrasts, agents=agents, n_boot=n_boot, seed=seed)
    table = rows_table(d.rows)
    record = Comparison(
        task_set=d.task_set,
        set_build=d.set_build,
        jobs=d.jobs,
        answer_keys=d.answer_keys,
        answer_columns=d.answer_columns,
        comparer=COMPARER,
        comparer_version=COMPARER_VERSION,
        n_boot=n_boot,
        seed=seed,
        asked=tuple((a, b) for a, b in contrasts),
        agents=tuple(agents),
        rows=d.rows,
        table=store.put_blob(_parquet(table)),
    )
    cid = store.put(record)
    if set_name is not None:
        ref = comparison_ref(set_name)
        if store.refs.get(ref) != cid:
            store.refs.update(ref, lambda _old: cid, message="compare")
    return Compared(cid, record, table)


def write_comparisons(compared: Compared, folder: Path) -> tuple[Path, Path]:
    """``comparisons.json`` and ``comparisons.parquet`` in ``folder`` (one row a contrast)."""
    folder.mkdir(parents=True, exist_ok=True)
    r = compared.record
    doc = {
        "comparison": compared.comparison.hex(),
        "task_set": r.task_set.hex(),
        "comparer": f"{r.comparer} {r.comparer_version}",
        "n_boot": r.n_boot,
        "seed": r.seed,
        "rows": contrast_dicts(r.rows),
    }
    j = folder / "comparisons.json"
    j.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    p = folder / "comparisons.parquet"
    meta = {b"medomni.comparison": compared.comparison.hex().encode()}
    pq.write_table(compared.table.replace_schema_metadata(meta), p)
    return j, p


# -- text ------------------------------------------------------------------------------------
def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _p(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def comparison_lines(cid: ObjectId, record: Comparison) -> list[str]:
    """A comparison as the CLI prints it: one line a contrast, then its links."""
    head = (
        f"{'agent':<12} {'contrast':<40} {'pair':<28} {'metric':<9} {'a':>6} {'b':>6} "
        f"{'a - b':>7}  {'95% CI':<17} {'test':<13} {'p':>7} {'p holm':>7}  n"
    )
    lines = [head]
    for r in record.rows:
        contrast = f"{r.a} - {r.b}"
        ci = f"[{_num(r.ci_low)}, {_num(r.ci_high)}]"
        line = (
            f"{r.agent:<12} {contrast:<40} {r.pair:<28} {r.metric:<9} {_num(r.value_a):>6} "
            f"{_num(r.value_b):>6} {_num(r.difference):>7}  {ci:<17} {r.test or '-':<13} "
            f"{_p(r.p_value):>7} {_p(r.p_holm):>7}  {r.patients}"
        )
        if r.discordant:
            line += f" ({r.discordant} discordant: {r.a_better} a, {r.b_better} b)"
        if r.excluded:
            why = ", ".join(f"{n} {w}" for w, n in r.excluded_why.items())
            line += f"  excluded {r.excluded}: {why}"
        if r.config_flag:
            line += f"  ! {r.config_flag}"
        lines.append(line)
    lines.append(
        f"comparison {cid.hex()}: {len(record.rows)} contrasts of {len(record.jobs)} jobs, "
        f"{record.comparer} {record.comparer_version}, n_boot={record.n_boot} "
        f"seed={record.seed}; p holm: Holm-adjusted over the {len(record.rows)} contrasts"
    )
    return lines
