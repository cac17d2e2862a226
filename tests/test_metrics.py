"""Metrics against plain-Python references (random and hand-made cases), the bootstrap's
determinism and vectorized resamples, and the no-NaN, plain-float results."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medomni_cas.bench import metrics as M
from medomni_cas.studio import schema

LABELS = ("a", "b", "c", "négatif", "🙂")
CLASSIFICATION = ("accuracy", "balanced_accuracy", "macro_f1")
NUMERIC = ("mae", "rmse")
FEW = settings(max_examples=80, deadline=None)

Label = str | None
Ref = Callable[..., float | None]


# --- plain-Python references: a missing answer (None) is wrong ------------------------------


def ref_accuracy(truth: Sequence[str], pred: Sequence[Label]) -> float | None:
    if not truth:
        return None
    return sum(t == p for t, p in zip(truth, pred, strict=True)) / len(truth)


def ref_macro_f1(truth: Sequence[str], pred: Sequence[Label]) -> float | None:
    labels = set(truth) | {p for p in pred if p is not None}
    if not labels:
        return None
    f1s = []
    for c in labels:
        tp = sum(t == c and p == c for t, p in zip(truth, pred, strict=True))
        fp = sum(t != c and p == c for t, p in zip(truth, pred, strict=True))
        fn = sum(t == c and p != c for t, p in zip(truth, pred, strict=True))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(f1s) / len(f1s)


def ref_balanced_accuracy(truth: Sequence[str], pred: Sequence[Label]) -> float | None:
    labels = set(truth)
    if not labels:
        return None
    recalls = []
    for c in labels:
        rows = [p for t, p in zip(truth, pred, strict=True) if t == c]
        recalls.append(sum(p == c for p in rows) / len(rows))
    return sum(recalls) / len(recalls)


def _answered(truth: Sequence[float], pred: Sequence[float | None]) -> list[float]:
    return [p - t for t, p in zip(truth, pred, strict=True) if p is not None and math.isfinite(p)]


def ref_mae(truth: Sequence[float], pred: Sequence[float | None]) -> float | None:
    errs = _answered(truth, pred)
    return sum(abs(e) for e in errs) / len(errs) if errs else None


def ref_rmse(truth: Sequence[float], pred: Sequence[float | None]) -> float | None:
    errs = _answered(truth, pred)
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else None


def ref_auroc(
    truth: Sequence[str], scores: Sequence[Sequence[float]], classes: Sequence[str]
) -> float | None:
    """Pairwise: per class, the share of (positive, negative) pairs ranked right, a tie
    counting half; a pair with a missing row (a NaN score) is wrong."""
    aucs = []
    for j, c in enumerate(classes):
        pos = [s for t, s in zip(truth, scores, strict=True) if t == c]
        neg = [s for t, s in zip(truth, scores, strict=True) if t != c]
        if not pos or not neg:
            continue
        total = 0.0
        for sp in pos:
            for sn in neg:
                if any(math.isnan(x) for x in (*sp, *sn)):
                    continue
                total += 1.0 if sp[j] > sn[j] else 0.5 if sp[j] == sn[j] else 0.0
        aucs.append(total / (len(pos) * len(neg)))
    return sum(aucs) / len(aucs) if len(aucs) >= 2 else None


REFS: dict[str, Ref] = {
    "accuracy": ref_accuracy,
    "macro_f1": ref_macro_f1,
    "balanced_accuracy": ref_balanced_accuracy,
    "mae": ref_mae,
    "rmse": ref_rmse,
}


def close(got: float | None, want: float | None) -> bool:
    if want is None:
        return got is None
    return got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)


def assert_plain(x: float | None) -> None:
    """What the canonical encoding accepts: None or a finite plain float, never -0.0."""
    if x is not None:
        assert type(x) is float
        assert math.isfinite(x)
        assert math.copysign(1.0, x) > 0 or x != 0.0


def assert_result_plain(r: M.MetricResult) -> None:
    for x in (r.value, r.ci_low, r.ci_high):
        assert_plain(x)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(r), type=M.MetricResult) == r


# --- random cases ---------------------------------------------------------------------------

labels = st.sampled_from(LABELS)
label_rows = st.lists(st.tuples(labels, st.none() | labels), max_size=30)
finite = st.floats(-1e6, 1e6, allow_nan=False)
number_rows = st.lists(
    st.tuples(finite, st.none() | finite | st.just(math.nan) | st.just(math.inf)), max_size=30
)


@FEW
@given(label_rows)
def test_classification_matches_reference(rows: list[tuple[str, Label]]) -> None:
    truth = [t for t, _ in rows]
    pred = [p for _, p in rows]
    for name in CLASSIFICATION:
        got = M.METRICS[name].fn(pa.array(truth, pa.string()), pa.array(pred, pa.string()))
        assert close(got, REFS[name](truth, pred)), name
        assert_plain(got)


@FEW
@given(number_rows)
def test_numeric_matches_reference(rows: list[tuple[float, float | None]]) -> None:
    truth = [t for t, _ in rows]
    pred = [p for _, p in rows]
    for name in NUMERIC:
        r = M.score(name, pa.array(truth, pa.float64()), pa.array(pred, pa.float64()), n_boot=20)
        assert close(r.value, REFS[name](truth, pred)), name
        assert r.n == len(rows)
        assert r.n_missing == len(rows) - len(_answered(truth, pred))
        assert_result_plain(r)


score_values = st.sampled_from([0.0, 0.25, 0.5, 1.0])  # few values: many ties
score_rows = st.lists(
    st.tuples(
        st.sampled_from(LABELS[:3]),
        st.tuples(score_values, score_values, score_values),
        st.booleans(),
    ),
    max_size=25,
)


@FEW
@given(score_rows)
def test_auroc_matches_reference(rows: list[tuple[str, tuple[float, ...], bool]]) -> None:
    truth = [t for t, _, _ in rows]
    scores = [list(s) if ok else [math.nan] * 3 for _, s, ok in rows]
    matrix = np.array(scores, dtype=np.float64).reshape(len(rows), 3)
    r = M.score("auroc", pa.array(truth, pa.string()), None, matrix, LABELS[:3], n_boot=20)
    assert close(r.value, ref_auroc(truth, scores, LABELS[:3]))
    assert r.n_missing == sum(not ok for _, _, ok in rows)
    assert_result_plain(r)


@settings(max_examples=25, deadline=None)
@given(label_rows.filter(lambda rows: len(rows) >= 2), st.integers(0, 2**32))
def test_each_resample_matches_reference(rows: list[tuple[str, Label]], seed: int) -> None:
    """The vectorized bootstrap computes, for every resample, what the reference computes on
    the resampled rows; the interval is the percentiles of those values."""
    truth = [t for t, _ in rows]
    pred = [p for _, p in rows]
    n, n_boot = len(rows), 30
    (idx,) = M._resamples(n, n_boot, seed)
    for name in CLASSIFICATION:
        spec = M.METRICS[name]
        data = M._prepare(spec.kind, truth, pred, None, None)
        got = spec.batch(data, idx)
        want = [REFS[name]([truth[i] for i in row], [pred[i] for i in row]) for row in idx]
        assert all(close(float(g), w) for g, w in zip(got, want, strict=True)), name
        lo, hi = M.bootstrap_ci(name, truth, pred, n_boot=n_boot, seed=seed)
        assert close(lo, float(np.percentile(want, 2.5)))
        assert close(hi, float(np.percentile(want, 97.5)))


def test_numeric_and_auroc_resamples_match_reference() -> None:
    rng = np.random.default_rng(7)
    n, n_boot = 40, 25
    truth = rng.normal(size=n).round(1)
    pred = (truth + rng.normal(size=n)).round(1).astype(object)
    pred[rng.random(n) < 0.3] = None
    (idx,) = M._resamples(n, n_boot, 3)
    for name in NUMERIC:
        spec = M.METRICS[name]
        got = spec.batch(M._prepare("numeric", truth, list(pred), None, None), idx)
        want = [REFS[name](truth[row].tolist(), pred[row].tolist()) for row in idx]
        assert all(close(float(g), w) for g, w in zip(got, want, strict=True)), name

    classes = ["x", "y", "z"]
    labels = [classes[i] for i in rng.integers(0, 3, n)]
    scores = rng.integers(0, 4, size=(n, 3)) / 4
    scores[rng.random(n) < 0.2] = np.nan
    data = M._prepare("scores", labels, None, scores, classes)
    got = M.METRICS["auroc"].batch(data, idx)
    for g, row in zip(got, idx, strict=True):
        want = ref_auroc([labels[i] for i in row], scores[row].tolist(), classes)
        assert close(None if math.isnan(g) else float(g), want)


# --- hand-made cases ------------------------------------------------------------------------


def values(truth: list[Any], pred: list[Any]) -> dict[str, float | None]:
    return {name: M.METRICS[name].fn(truth, pred) for name in CLASSIFICATION}


def test_perfect_and_all_wrong() -> None:
    truth = ["a", "b", "c", "a"]
    assert values(truth, truth) == dict.fromkeys(CLASSIFICATION, 1.0)
    assert values(truth, ["b", "c", "a", "c"]) == dict.fromkeys(CLASSIFICATION, 0.0)
    assert M.METRICS["mae"].fn([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert M.METRICS["rmse"].fn([1.0, 2.0], [1.0, 2.0]) == 0.0
    scores = np.eye(3)[[0, 1, 2, 0]]
    assert M.METRICS["auroc"].fn(truth, None, scores, ["a", "b", "c"]) == 1.0
    assert M.METRICS["auroc"].fn(truth, None, 1 - scores, ["a", "b", "c"]) == 0.0


def test_imbalanced() -> None:
    truth = ["a"] * 90 + ["b"] * 10
    got = values(truth, ["a"] * 100)
    assert got["accuracy"] == pytest.approx(0.9)
    assert got["balanced_accuracy"] == pytest.approx(0.5)
    assert got["macro_f1"] == pytest.approx((180 / 190 + 0) / 2)


def test_missing_predictions() -> None:
    got = values(["a", "b", "a"], ["a", None, None])
    assert got["accuracy"] == pytest.approx(1 / 3)
    assert got["macro_f1"] == pytest.approx((2 / 3 + 0) / 2)  # a: tp 1, fn 1; b: never right
    assert got["balanced_accuracy"] == pytest.approx((1 / 2 + 0) / 2)
    r = M.score("accuracy", ["a", "b", "a"], ["a", None, None])
    assert (r.n, r.n_missing) == (3, 2)

    r = M.score("mae", [1.0, 2.0, 3.0, 4.0], [2.0, None, math.nan, 2.0])
    assert (r.value, r.n, r.n_missing) == (1.5, 4, 2)
    assert M.METRICS["rmse"].fn([1.0, 2.0, 3.0, 4.0], [2.0, None, math.nan, 2.0]) == pytest.approx(
        math.sqrt(2.5)
    )


def test_all_missing() -> None:
    assert values(["a", "b"], [None, None]) == dict.fromkeys(CLASSIFICATION, 0.0)
    r = M.score("accuracy", ["a", "b", "b"], [None, None, None])
    assert (r.value, r.ci_low, r.ci_high, r.n_missing) == (0.0, 0.0, 0.0, 3)
    r = M.score("mae", [1.0, 2.0, 3.0], [None, None, None])
    assert (r.value, r.ci_low, r.ci_high, r.n, r.n_missing) == (None, None, None, 3, 3)
    nan = np.full((3, 2), np.nan)
    assert M.METRICS["auroc"].fn(["a", "b", "b"], None, nan, ["a", "b"]) == 0.0  # all wrong


def test_empty() -> None:
    empty = pa.array([], pa.string())
    for name in CLASSIFICATION:
        r = M.score(name, empty, empty)
        assert (r.value, r.ci_low, r.ci_high, r.n, r.n_missing) == (None, None, None, 0, 0)
        assert_result_plain(r)
    for name in NUMERIC:
        assert M.score(name, pa.array([], pa.float64()), []).value is None
    assert M.score("auroc", empty, None, np.zeros((0, 2)), ["a", "b"]).value is None
    assert M.bootstrap_ci("accuracy", empty, empty) == (None, None)
    # plain empty lists carry no type
    for name in (*CLASSIFICATION, *NUMERIC):
        assert M.score(name, [], []).value is None
    assert M.score("auroc", [], None, np.zeros((0, 2)), ["a", "b"]).value is None


def test_one_class_only() -> None:
    assert values(["a"] * 5, ["a"] * 5) == dict.fromkeys(CLASSIFICATION, 1.0)
    got = values(["a"] * 4, ["a", "a", "b", None])
    assert got["accuracy"] == 0.5
    assert got["balanced_accuracy"] == 0.5  # recall over truth's classes only
    assert got["macro_f1"] == pytest.approx((2 / 3 + 0) / 2)  # "b" was predicted: it counts
    # one class in truth: no class has both positives and negatives
    assert M.METRICS["auroc"].fn(["a"] * 4, None, np.ones((4, 2)), ["a", "b"]) is None
    assert M.score("accuracy", ["a"], ["a"]).ci_low is None  # n < 2: no interval


def test_auroc_ties_and_skipped_classes() -> None:
    auroc = M.METRICS["auroc"].fn
    # binary, as two columns; positives 0.5 and 0.9, negatives 0.5 and 0.2: (0.5 + 1 + 2) / 4
    s = np.array([0.5, 0.5, 0.2, 0.9])
    two = np.column_stack([1 - s, s])
    assert auroc(["n", "p", "n", "p"], None, two, ["n", "p"]) == pytest.approx(0.875)
    assert auroc(["n", "p", "n", "p"], None, np.full((4, 2), 0.5), ["n", "p"]) == 0.5
    # the scikit-learn docs' example
    s = np.array([0.1, 0.4, 0.35, 0.8])
    got = auroc(["0", "0", "1", "1"], None, np.column_stack([1 - s, s]), ["0", "1"])
    assert got == pytest.approx(0.75)
    # "c" has no positive: skipped, the mean is over "a" and "b"
    three = np.array([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.6, 0.4, 0.0]])
    assert auroc(["a", "b", "b"], None, three, ["a", "b", "c"]) == pytest.approx((1.0 + 1.0) / 2)
    # a class is usable when truth has it and another class, so usable classes come in twos
    # or more: one class in truth gives None
    assert auroc(["b", "b"], None, three[:2], ["a", "b", "c"]) is None


def test_auroc_missing_is_worst_case() -> None:
    truth = ["n", "p", "n", "p"]
    s = np.array([0.1, 0.9, 0.2, 0.8])
    two = np.column_stack([1 - s, s])
    r = M.score("auroc", truth, None, two, ["n", "p"])
    assert (r.value, r.n_missing) == (1.0, 0)
    r = M.score("auroc", truth, ["n", None, "n", "p"], two, ["n", "p"])
    assert (r.value, r.n_missing) == (0.5, 1)  # the missing positive loses both its pairs
    two[0] = np.nan
    assert M.score("auroc", truth, None, two, ["n", "p"]).value == 0.5


def test_unicode_and_arrow_types() -> None:
    truth = ["négatif", "🙂", "中文", "négatif"]
    pred = ["négatif", "🙂", "négatif", None]
    want = values(truth, pred)
    assert want["accuracy"] == 0.5
    chunked = pa.chunked_array([pa.array(truth[:2]), pa.array(truth[2:])])
    dictionary = pa.array(pred).dictionary_encode()
    large = pa.array(pred, pa.large_string())
    for t, p in [(chunked, dictionary), (pa.array(truth), large), (np.array(truth), pred)]:
        assert values(t, p) == want
    # integer labels and integer numeric columns
    assert M.METRICS["accuracy"].fn(pa.array([1, 2, 3]), pa.array([1, 2, 2])) == 2 / 3
    assert M.METRICS["mae"].fn(pa.array([1, 2, 3]), pa.array([1, 2, 5])) == 2 / 3


def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        M.score("f1", ["a"], ["a"])
    with pytest.raises(ValueError, match="null"):
        M.score("accuracy", ["a", None], ["a", "a"])
    with pytest.raises(ValueError, match="NaN"):
        M.score("mae", [1.0, math.nan], [1.0, 1.0])
    with pytest.raises(ValueError, match="rows"):
        M.score("accuracy", ["a", "b"], ["a"])
    with pytest.raises(ValueError, match="not among classes"):
        M.score("auroc", ["a", "z"], None, np.ones((2, 2)), ["a", "b"])
    with pytest.raises(ValueError, match="shape"):
        M.score("auroc", ["a", "b"], None, np.ones((2, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="needs scores"):
        M.score("auroc", ["a", "b"], ["a", "b"])
    with pytest.raises(ValueError, match="alpha"):
        M.bootstrap_ci("accuracy", ["a", "b"], ["a", "b"], alpha=1.5)
    with pytest.raises(ValueError, match="n_boot"):
        M.score("accuracy", ["a", "b"], ["a", "b"], n_boot=-1)


# --- the registry, the bootstrap, the results -----------------------------------------------


def test_registry() -> None:
    assert set(METRIC_KINDS) <= set(M.METRICS)
    for name, spec in M.METRICS.items():
        assert spec.name == name
        assert spec.higher_is_better == (name not in NUMERIC)
        assert spec.kind == METRIC_KINDS[name]
    # every metric a task template may name is here, scoring the same kind of label
    for name, kind in schema.METRICS.items():
        assert M.METRICS[name].kind == kind


METRIC_KINDS = {
    "accuracy": "classification",
    "balanced_accuracy": "classification",
    "macro_f1": "classification",
    "mae": "numeric",
    "rmse": "numeric",
    "auroc": "scores",
}


def noisy_labels(n: int, seed: int) -> tuple[pa.Array, pa.Array]:
    rng = np.random.default_rng(seed)
    labels = np.array(LABELS, dtype=object)
    t = rng.integers(0, len(LABELS), n)
    p = np.where(rng.random(n) < 0.7, t, rng.integers(0, len(LABELS), n))
    pred = labels[p]
    pred[rng.random(n) < 0.05] = None
    return pa.array(labels[t], pa.string()), pa.array(pred, pa.string())


def test_bootstrap_is_deterministic_and_covers_the_estimate() -> None:
    truth, pred = noisy_labels(500, 1)
    for name in CLASSIFICATION:
        r = M.score(name, truth, pred, n_boot=500, seed=11)
        assert r == M.score(name, truth, pred, n_boot=500, seed=11)
        assert M.bootstrap_ci(name, truth, pred, n_boot=500, seed=11) == (r.ci_low, r.ci_high)
        assert M.bootstrap_ci(name, truth, pred, n_boot=500, seed=12) != (r.ci_low, r.ci_high)
        assert r.ci_low is not None and r.ci_high is not None and r.value is not None
        assert r.ci_low < r.value < r.ci_high
        assert r.ci_high - r.ci_low < 0.2
        assert (r.n, r.n_missing, r.n_boot, r.seed) == (500, pred.null_count, 500, 11)
        assert_result_plain(r)
    wide = M.bootstrap_ci("accuracy", truth, pred, n_boot=500, seed=11, alpha=0.01)
    r = M.score("accuracy", truth, pred, n_boot=500, seed=11)
    assert wide[0] <= r.ci_low and r.ci_high <= wide[1]
    assert M.score("accuracy", truth, pred, n_boot=0).ci_low is None

    rng = np.random.default_rng(2)
    t = rng.normal(size=300)
    for name in NUMERIC:
        r = M.score(name, t, t + rng.normal(size=300), n_boot=300)
        assert r.ci_low < r.value < r.ci_high
    classes = list(LABELS)
    codes = [classes.index(x) for x in truth.to_pylist()]
    scores = rng.random((500, len(classes)))
    scores[np.arange(500), codes] += 0.5
    r = M.score("auroc", truth, None, scores, classes, n_boot=300)
    assert r.ci_low < r.value < r.ci_high
    assert_result_plain(r)


def test_bootstrap_many_blocks() -> None:
    """More resamples than one block holds: the blocks together are still deterministic."""
    truth, pred = noisy_labels(3000, 3)  # 349 resamples a block
    a = M.bootstrap_ci("macro_f1", truth, pred, n_boot=1000, seed=5)
    assert a == M.bootstrap_ci("macro_f1", truth, pred, n_boot=1000, seed=5)
    blocks = list(M._resamples(3000, 1000, 5))
    assert len(blocks) > 1 and sum(len(b) for b in blocks) == 1000


@FEW
@given(label_rows, number_rows, st.integers(0, 5))
def test_never_nan(
    lrows: list[tuple[str, Label]], nrows: list[tuple[float, float | None]], seed: int
) -> None:
    for name in CLASSIFICATION:
        assert_result_plain(
            M.score(name, [t for t, _ in lrows], [p for _, p in lrows], n_boot=20, seed=seed)
        )
    for name in NUMERIC:
        t = pa.array([t for t, _ in nrows], pa.float64())
        p = pa.array([p for _, p in nrows], pa.float64())
        assert_result_plain(M.score(name, t, p, n_boot=20, seed=seed))


def test_million_rows() -> None:
    n = 1_000_000
    rng = np.random.default_rng(0)
    t = rng.integers(0, 5, n)
    p = np.where(rng.random(n) < 0.8, t, rng.integers(0, 5, n))
    labels = pa.array(list(LABELS))
    truth, pred = labels.take(pa.array(t)), labels.take(pa.array(p))
    got = M.METRICS["accuracy"].fn(truth, pred)
    assert got == pytest.approx(float(np.mean(t == p)))
    assert M.METRICS["macro_f1"].fn(truth, pred) == pytest.approx(0.84, abs=0.01)
