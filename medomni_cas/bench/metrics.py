"""Metrics for the scorer: point estimates and percentile-bootstrap intervals over pyarrow.

A metric scores one group of rows (an arm, variant, agent and target): ``truth`` and ``pred``
columns, strings (or any hashable labels) for a class target and numbers for a numeric one,
plus, for `auroc`, a ``scores`` matrix ``[n_rows, n_classes]`` whose columns are ``classes``.

Missing answers. A null ``pred`` means the agent gave no valid answer for that atom:

* classification: the row is wrong. It counts in ``n`` and against accuracy; for the macro
  metrics it is a false negative of its true class and a false positive of no class (as if
  the agent had answered a label outside the vocabulary that is not itself scored);
* numeric (a null, NaN or infinite ``pred``): MAE and RMSE are over the answered rows only,
  and ``n_missing`` says how many were not. All rows missing gives ``None``;
* scores (a row with a non-finite score, or a null ``pred`` when ``pred`` is given): the row
  is ranked worst-case, below every negative in its true class's column and above every
  positive in the others, so that every pair it is part of counts as wrong.

A null or non-finite ``truth`` is an error (`ValueError`): the scorer scores only atoms with
an answer key.

Label sets follow scikit-learn's defaults. `macro_f1` averages the per-class F1,
``2 TP / (2 TP + FP + FN)``, over the classes present in truth or among the answered
predictions (``f1_score(average="macro", zero_division=0)``: a class never predicted, or
never right, scores 0);
`balanced_accuracy` averages recall over the classes present in truth
(``balanced_accuracy_score``); `auroc` is the macro one-vs-rest AUC over ``classes``,
skipping a class with no positive or no negative, and is ``None`` with fewer than two
usable classes, which is when truth holds a single class (a binary target gives a score
column for each of its two classes; truth must hold only labels among ``classes``).

Implementation. Labels are integer-coded once over one vocabulary, the labels of truth and
pred (`pyarrow.compute.dictionary_encode`); accuracy needs no codes (`pyarrow.compute.equal`).
Every metric is a function of an index matrix ``[n_boot, n]`` of resampled rows (or of the
sample itself) returning one value per resample, so the point estimate and the bootstrap
share one vectorized code path: per-class counts come from one `numpy.bincount` per block of
resamples (offset by the resample number), so no confusion matrix of ``K²`` cells per
resample is ever built. AUROC is the Mann-Whitney U statistic with average ranks for ties,
from counts per (run of tied scores, positive) in the same way, each column ranked once.

Results are plain Python floats or ``None``, never NaN, an infinity or ``-0.0``, which the
canonical encoding refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "METRICS",
    "ArrayLike",
    "Kind",
    "MetricResult",
    "MetricSpec",
    "bootstrap_ci",
    "score",
]

Kind = Literal["classification", "numeric", "scores"]
type ArrayLike = pa.Array | pa.ChunkedArray | np.ndarray | Sequence[Any]

# Resamples are drawn in blocks of about this many row indices (8 MB a block), so memory
# stays bounded for any n. The block size depends on n only, never on the metric, so for one
# (n, n_boot, seed) every metric sees the same resampled rows: two arms scored on the same
# atoms in the same order get paired resamples.
_BLOCK = 1 << 20


class MetricResult(msgspec.Struct, frozen=True, kw_only=True):
    """One metric on one group of rows: ``value`` and its percentile-bootstrap interval
    ``[ci_low, ci_high]`` (``None`` when undefined: no rows, fewer than two rows for the
    interval, ``n_boot=0``, or fewer than two usable classes for AUROC). ``n`` counts every
    row, ``n_missing`` those without a valid answer; ``n_boot`` and ``seed`` are those asked
    for, which make the interval reproducible."""

    metric: str
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    n_missing: int
    n_boot: int
    seed: int


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A metric: its ``name``, the ``kind`` of targets it scores ("classification",
    "numeric", or "scores" for classification with per-class scores), and whether higher is
    better. ``batch(data, idx)`` is its vectorized core: prepared data and an index matrix
    ``[b, n]`` of resampled rows (``None`` for the sample itself) to one float64 value per
    resample, NaN where the metric is undefined."""

    name: str
    kind: Kind
    higher_is_better: bool
    batch: Callable[[Any, np.ndarray | None], np.ndarray] = field(repr=False, compare=False)

    def fn(
        self,
        truth: ArrayLike,
        pred: ArrayLike | None,
        scores: np.ndarray | None = None,
        classes: Sequence[Any] | None = None,
    ) -> float | None:
        """The metric's value on these rows, ``None`` when undefined (no rows, say)."""
        return _value(self, _prepare(self.kind, truth, pred, scores, classes))


# --- preparing the columns ----------------------------------------------------------------


def _column(x: ArrayLike) -> pa.Array:
    """One contiguous `pyarrow.Array`, dictionaries decoded."""
    if isinstance(x, pa.ChunkedArray):
        if pa.types.is_dictionary(x.type):
            x = x.cast(x.type.value_type)
        x = x.combine_chunks()
    elif not isinstance(x, pa.Array):
        x = pa.array(x)
    if pa.types.is_dictionary(x.type):
        x = x.dictionary_decode()
    return x


def _columns(truth: ArrayLike, pred: ArrayLike | None) -> tuple[pa.Array, pa.Array | None]:
    t = _column(truth)
    if t.null_count:
        raise ValueError(f"truth has {t.null_count} null(s): score only atoms with an answer")
    if pred is None:
        return t, None
    p = _column(pred)
    if len(p) != len(t):
        raise ValueError(f"truth has {len(t)} rows but pred has {len(p)}")
    if pa.types.is_null(t.type):  # no rows (a null truth was refused above)
        t = t.cast(p.type)
    elif p.type != t.type:
        p = p.cast(t.type)
    return t, p


class _Labels:
    """Class labels, prepared lazily: accuracy needs only `correct`, the macro metrics the
    integer codes over the labels of truth and pred."""

    def __init__(self, truth: pa.Array, pred: pa.Array) -> None:
        self.truth = truth
        self.pred = pred
        self.n = len(truth)
        self.n_missing = pred.null_count

    @cached_property
    def correct(self) -> np.ndarray:
        """Whether each row's answer is its truth (a missing answer is not)."""
        eq = pc.fill_null(pc.equal(self.truth, self.pred), False)
        return eq.to_numpy(zero_copy_only=False)

    @cached_property
    def codes(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``(truth_code + k * correct, pred_code, k)``: the k labels of truth and pred coded
        ``0..k-1``, and code k for a missing answer."""
        both = pa.concat_arrays([self.truth, self.pred]).dictionary_encode()
        k = len(both.dictionary)
        idx = pc.fill_null(both.indices, k).to_numpy().astype(np.intp)
        t, p = idx[: self.n], idx[self.n :]
        return t + k * self.correct, p, k


@dataclass(frozen=True, slots=True)
class _Numbers:
    """Numeric answers: per-row errors, zero on unanswered rows, which ``answered`` flags."""

    abs_err: np.ndarray
    sq_err: np.ndarray
    answered: np.ndarray
    n: int
    n_missing: int


@dataclass(frozen=True, slots=True)
class _Ranking:
    """One usable class's column: each row's ``tie_run + runs * positive``, where
    ``tie_run`` numbers the ``runs`` runs of tied scores in increasing order and
    ``positive`` is whether the row's truth is the class."""

    code: np.ndarray
    runs: int


@dataclass(frozen=True, slots=True)
class _Scores:
    rankings: tuple[_Ranking, ...]
    n: int
    n_missing: int


def _numbers(truth: pa.Array, pred: pa.Array) -> _Numbers:
    t = truth.cast(pa.float64()).to_numpy(zero_copy_only=False)
    p = pred.cast(pa.float64()).to_numpy(zero_copy_only=False)  # null -> NaN
    if not np.isfinite(t).all():
        raise ValueError("truth has NaN or infinite values: score only atoms with an answer")
    answered = np.isfinite(p)
    err = np.where(answered, p - t, 0.0)
    abs_err = np.abs(err)
    n_answered = int(np.count_nonzero(answered))
    return _Numbers(abs_err, abs_err * abs_err, answered, len(t), len(t) - n_answered)


def _scores(
    truth: pa.Array, pred: pa.Array | None, scores: np.ndarray | None, classes: Sequence[Any] | None
) -> _Scores:
    if scores is None or classes is None:
        raise ValueError("a scores metric needs scores and classes")
    classes = list(classes)
    s = np.asarray(scores, dtype=np.float64)
    n = len(truth)
    if s.ndim != 2 or s.shape != (n, len(classes)):
        raise ValueError(f"scores has shape {s.shape}, expected ({n}, {len(classes)})")
    if len(set(classes)) != len(classes):
        raise ValueError("classes has duplicates")
    value_set = pa.array(classes)
    if pa.types.is_null(truth.type):  # no rows
        truth = truth.cast(value_set.type)
    code = pc.index_in(truth, value_set=value_set.cast(truth.type))
    if code.null_count:
        unknown = pc.unique(pc.filter(truth, code.is_null())).to_pylist()[:5]
        raise ValueError(f"truth has labels that are not among classes: {unknown}")
    code = code.to_numpy()
    missing = ~np.isfinite(s).all(axis=1)
    if pred is not None:
        missing |= pred.is_null().to_numpy(zero_copy_only=False)
    rankings = []
    for c in range(len(classes)):
        positive = code == c
        if not 0 < np.count_nonzero(positive) < n:
            continue  # no positive or no negative: skipped
        col = np.where(missing, np.where(positive, -np.inf, np.inf), s[:, c])
        runs, run = np.unique(col, return_inverse=True)
        rankings.append(_Ranking(run.astype(np.intp) + len(runs) * positive, len(runs)))
    return _Scores(tuple(rankings), n, int(np.count_nonzero(missing)))


def _prepare(
    kind: Kind,
    truth: ArrayLike,
    pred: ArrayLike | None,
    scores: np.ndarray | None,
    classes: Sequence[Any] | None,
) -> _Labels | _Numbers | _Scores:
    t, p = _columns(truth, pred)
    if kind == "scores":
        return _scores(t, p, scores, classes)
    if p is None:
        raise ValueError(f"a {kind} metric needs pred")
    if kind == "numeric":
        return _numbers(t, p)
    return _Labels(t, p)


# --- the metrics, vectorized over resamples -----------------------------------------------


def _take(x: np.ndarray, idx: np.ndarray | None) -> np.ndarray:
    """``x`` resampled: ``[b, n]`` for an index matrix, ``[1, n]`` (a view) for None."""
    return x[None, :] if idx is None else x[idx]


def _counts(codes: np.ndarray, idx: np.ndarray | None, m: int) -> np.ndarray:
    """``[b, m]``: how often each code in ``range(m)`` occurs in each resample."""
    if idx is None:
        return np.bincount(codes, minlength=m)[None, :]
    g = codes[idx]
    g += (np.arange(len(idx), dtype=np.intp) * m)[:, None]
    return np.bincount(g.ravel(), minlength=len(idx) * m).reshape(len(idx), m)


def _per_class(d: _Labels, idx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(true positives, support)``, each ``[b, k]``."""
    tc, _, k = d.codes
    c = _counts(tc, idx, 2 * k).reshape(-1, 2, k)
    return c[:, 1], c[:, 0] + c[:, 1]


def _ratio(num: np.ndarray, den: np.ndarray | int) -> np.ndarray:
    """``num / den``, NaN where ``den`` is 0."""
    num = np.asarray(num, dtype=np.float64)
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den != 0)


def _accuracy(d: _Labels, idx: np.ndarray | None) -> np.ndarray:
    return _ratio(np.count_nonzero(_take(d.correct, idx), axis=1), d.n)


def _macro_f1(d: _Labels, idx: np.ndarray | None) -> np.ndarray:
    tp, support = _per_class(d, idx)
    _, pc_, k = d.codes
    predicted = _counts(pc_, idx, k + 1)[:, :k]  # the last column counts missing answers
    den = support + predicted  # 2 tp + fp + fn
    present = den > 0
    f1 = np.divide(2.0 * tp, den, out=np.zeros(den.shape), where=present)
    return _ratio(f1.sum(axis=1), present.sum(axis=1))


def _balanced_accuracy(d: _Labels, idx: np.ndarray | None) -> np.ndarray:
    tp, support = _per_class(d, idx)
    present = support > 0
    recall = np.divide(tp, support, out=np.zeros(support.shape), where=present)
    return _ratio(recall.sum(axis=1), present.sum(axis=1))


def _mae(d: _Numbers, idx: np.ndarray | None) -> np.ndarray:
    answered = np.count_nonzero(_take(d.answered, idx), axis=1)
    return _ratio(_take(d.abs_err, idx).sum(axis=1), answered)


def _rmse(d: _Numbers, idx: np.ndarray | None) -> np.ndarray:
    answered = np.count_nonzero(_take(d.answered, idx), axis=1)
    return np.sqrt(_ratio(_take(d.sq_err, idx).sum(axis=1), answered))


def _auroc(d: _Scores, idx: np.ndarray | None) -> np.ndarray:
    """Macro one-vs-rest AUC by Mann-Whitney U with average ranks for ties: over the runs of
    tied scores in increasing order, U gains ``pos * (neg_below + neg_tied / 2)`` for each
    run, kept in integers times 2 (exact), from a resample's counts per (run, positive)."""
    b = 1 if idx is None else len(idx)
    aucs = np.full((b, len(d.rankings)), np.nan)
    for i, r in enumerate(d.rankings):
        c = _counts(r.code, idx, 2 * r.runs).reshape(b, 2, r.runs)
        neg, pos = c[:, 0], c[:, 1]
        below = np.cumsum(neg, axis=1) - neg
        u2 = np.einsum("ij,ij->i", pos, 2 * below + neg)
        aucs[:, i] = _ratio(u2, 2 * pos.sum(axis=1) * neg.sum(axis=1))
    usable = np.isfinite(aucs)
    n_usable = usable.sum(axis=1)
    mean = np.where(usable, aucs, 0.0).sum(axis=1) / np.maximum(n_usable, 1)
    return np.where(n_usable >= 2, mean, np.nan)


METRICS: dict[str, MetricSpec] = {
    m.name: m
    for m in (
        MetricSpec("accuracy", "classification", True, _accuracy),
        MetricSpec("balanced_accuracy", "classification", True, _balanced_accuracy),
        MetricSpec("macro_f1", "classification", True, _macro_f1),
        MetricSpec("mae", "numeric", False, _mae),
        MetricSpec("rmse", "numeric", False, _rmse),
        MetricSpec("auroc", "scores", True, _auroc),
    )
}


# --- values, intervals, results -----------------------------------------------------------


def _clean(x: float) -> float | None:
    """A plain float for msgspec, None for NaN and infinities, 0.0 for -0.0."""
    x = float(x)
    return x + 0.0 if math.isfinite(x) else None


def _spec(metric: str | MetricSpec) -> MetricSpec:
    if isinstance(metric, MetricSpec):
        return metric
    try:
        return METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r} (known: {', '.join(METRICS)})") from None


def _value(spec: MetricSpec, data: Any) -> float | None:
    if data.n == 0:
        return None
    return _clean(spec.batch(data, None)[0])


def _resamples(n: int, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """The bootstrap's index matrices, ``[b, n]`` blocks of ``n_boot`` rows in all, from
    `numpy.random.default_rng` (PCG64) seeded with ``seed``: the same for the same
    ``(n, n_boot, seed)``, whatever the metric."""
    rng = np.random.default_rng(seed)
    block = max(1, _BLOCK // n)
    for start in range(0, n_boot, block):
        yield rng.integers(0, n, size=(min(block, n_boot - start), n), dtype=np.intp)


def _check(n_boot: int, alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 0:
        raise ValueError(f"n_boot must not be negative, got {n_boot}")


def _interval(
    spec: MetricSpec, data: Any, n_boot: int, alpha: float, seed: int
) -> tuple[float | None, float | None]:
    if data.n < 2 or n_boot == 0:
        return None, None
    values = np.concatenate([spec.batch(data, idx) for idx in _resamples(data.n, n_boot, seed)])
    values = values[np.isfinite(values)]  # resamples where the metric is undefined
    if not len(values):
        return None, None
    lo, hi = np.percentile(values, [50 * alpha, 100 - 50 * alpha])
    return _clean(lo), _clean(hi)


def bootstrap_ci(
    metric: str | MetricSpec,
    truth: ArrayLike,
    pred: ArrayLike | None,
    scores: np.ndarray | None = None,
    *,
    classes: Sequence[Any] | None = None,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float | None, float | None]:
    """The percentile bootstrap ``(1 - alpha)`` interval of ``metric``, resampling rows.

    ``n_boot`` resamples of all ``n`` rows with replacement (missing answers included, so
    the interval reflects how many are missing too), deterministic for ``(n, n_boot,
    seed)``. A resample on which the metric is undefined (every numeric answer missing,
    fewer than two usable AUROC classes) is left out. ``(None, None)`` when ``n < 2``,
    ``n_boot=0`` or no resample is defined. Costs O(n_boot * n) time, in blocks of about 1M
    row indices.
    """
    _check(n_boot, alpha)
    spec = _spec(metric)
    data = _prepare(spec.kind, truth, pred, scores, classes)
    return _interval(spec, data, n_boot, alpha, seed)


def score(
    metric: str | MetricSpec,
    truth: ArrayLike,
    pred: ArrayLike | None,
    scores: np.ndarray | None = None,
    classes: Sequence[Any] | None = None,
    *,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> MetricResult:
    """``metric`` on these rows with its bootstrap interval (none when ``n_boot=0``).

    ``truth`` and ``pred`` are columns (`pyarrow.Array`, `pyarrow.ChunkedArray`, numpy
    arrays or lists) of equal length; ``scores`` ``[n, len(classes)]`` and ``classes`` are
    for the "scores" metrics (`auroc`), where ``pred`` may be None. The data is prepared
    once for the value and the interval.
    """
    _check(n_boot, alpha)
    spec = _spec(metric)
    data = _prepare(spec.kind, truth, pred, scores, classes)
    value = _value(spec, data)
    lo, hi = (None, None) if value is None else _interval(spec, data, n_boot, alpha, seed)
    return MetricResult(
        metric=spec.name,
        value=value,
        ci_low=lo,
        ci_high=hi,
        n=data.n,
        n_missing=data.n_missing,
        n_boot=n_boot,
        seed=seed,
    )
