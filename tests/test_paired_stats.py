"""The paired statistics' fast paths give the numbers of their plain forms, bit for bit.

A comparison is re-derived by ``audit verify`` and its id is its bytes: a faster way of
computing an interval or a p-value may change no bit of it (`tests/test_compare.py`
checks every number against scipy; these check the fast forms against the plain ones).
"""

from __future__ import annotations

import numpy as np
import scipy.stats  # type: ignore[import-untyped]

from medomni_cas.bench.paired_stats import (
    mcnemar_exact,
    mcnemar_exact_many,
    resample_counts,
    resample_sums,
)


def test_exact_sums_are_the_other_orientations_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    n = 700
    # integer statistics (correct answers, rows, per-class counts over 3 repetitions)
    stats = rng.integers(0, 4, size=(n, 9)).astype(np.float64)
    for dtype in (np.float32, np.float64):
        s = stats.astype(dtype)
        fast = resample_sums(s, 1000, 5, exact=True)
        plain = resample_sums(s, 1000, 5)
        assert fast.dtype == plain.dtype == dtype
        assert fast.shape == (1000, 9)
        assert np.array_equal(fast, plain)
    # and both are the sums of the seeded resamples themselves
    counts = np.concatenate(list(resample_counts(n, 1000, 5)))
    assert np.array_equal(resample_sums(stats, 1000, 5, exact=True), counts @ stats)
    assert resample_sums(stats, 0, 5, exact=True).shape == (0, 9)


def test_many_mcnemar_tests_are_each_ones() -> None:
    pairs = [(0, 0), (3, 0), (0, 3), (7, 9), (12, 40), (1, 1), (250, 199), (0, 0), (5, 2)]
    many = mcnemar_exact_many(pairs)
    assert many == [mcnemar_exact(a, b) for a, b in pairs]
    for (a, b), p in zip(pairs, many, strict=True):
        if a + b:
            assert np.isclose(p, scipy.stats.binomtest(a, a + b, 0.5).pvalue, rtol=1e-12)
    assert mcnemar_exact_many([]) == []
    assert mcnemar_exact_many([(0, 0)]) == [1.0]
