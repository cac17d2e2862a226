"""Paired statistics for contrasts between arms: a patient bootstrap, McNemar, Wilcoxon, Holm.

The bootstrap
    Resamples patients (clusters), not rows: a patient's repetitions come along whole, and
    both arms see the same resample, so a contrast's interval is paired. A metric is written
    as a function of per-patient sums (`resample_sums`: a ``[n, m]`` matrix of statistics,
    one row a patient), so a resample is a vector of patient counts and its sums are one
    matrix product, ``counts @ stats``: many contrasts of the same patients share one set of
    resamples and one product. The resamples are those of `numpy.random.default_rng`
    (PCG64) seeded with ``seed`` drawn as indices in blocks, the same for the same
    ``(n, n_boot, seed)``: a comparison is re-derivable.

Tests (scipy, the ``compare`` extra)
    `mcnemar_exact` on the discordant pairs of per-patient correctness (the exact binomial
    test, two-sided); `wilcoxon` signed-rank on per-patient differences (scipy's defaults:
    exact for small samples without ties, else the normal approximation); `holm` adjusts the
    p-values of one comparison for their number (Holm's step-down).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from medomni_cas._extras import require

__all__ = [
    "holm",
    "mcnemar_exact",
    "mcnemar_exact_many",
    "percentile_interval",
    "percentile_intervals",
    "resample_counts",
    "resample_sums",
    "wilcoxon",
]

# Resample count matrices are made about this many cells at a time (16 MB of float32).
_BLOCK = 1 << 22


def resample_counts(
    n: int, n_boot: int, seed: int, dtype: type[np.floating] = np.float64
) -> Iterator[np.ndarray]:
    """``[b, n]`` blocks (``n_boot`` rows in all): how often each of ``n`` patients is
    drawn in each resample of ``n`` draws with replacement.

    The draws are `numpy.random.default_rng` (PCG64) seeded with ``seed``, as ``uint32``
    indices ``rng.integers(0, n, size=(b, n), dtype=np.uint32)`` for blocks of
    ``b = max(1, 2**22 // n)`` resamples (the last one smaller): the same for the same
    ``(n, n_boot, seed)``, which is what makes a comparison re-derivable."""
    if n <= 0 or n_boot <= 0:
        return
    rng = np.random.default_rng(seed)
    block = max(1, _BLOCK // n)
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        idx = rng.integers(0, n, size=(b, n), dtype=np.uint32)
        # a resample at a time: its n counts stay in the cache, and no offset indices
        # (b * n of them) are made to count the whole block in one call
        counts = np.empty((b, n), dtype=dtype)
        for i in range(b):
            counts[i] = np.bincount(idx[i], minlength=n)
        yield counts


def resample_sums(stats: np.ndarray, n_boot: int, seed: int, *, exact: bool = False) -> np.ndarray:
    """``[n_boot, m]``: the column sums of ``stats`` (``[n, m]``, a row a patient) in each
    resample of `resample_counts`, in ``stats``' float type; ``[0, m]`` when there is
    nothing to resample.

    ``exact``: the caller knows every sum is exact in the float type (integer statistics
    whose sums stay below its 2**24 or 2**53), so the order of summation cannot change a
    bit of it and the product runs as ``counts @ stats``, which OpenBLAS's kernels run
    several times faster than the other orientation. Otherwise the product keeps the
    orientation (and so the rounding) every comparison has been computed with."""
    n, m = stats.shape
    dtype = np.float32 if stats.dtype == np.float32 else np.float64
    if exact:
        ordered = np.ascontiguousarray(stats, dtype=dtype)
        blocks = [c @ ordered for c in resample_counts(n, n_boot, seed, dtype)]
    else:
        # (m x n) @ (n x b): the rounding of non-integer sums is that of this orientation
        by_patient = np.ascontiguousarray(stats.T)
        blocks = [(by_patient @ c.T).T for c in resample_counts(n, n_boot, seed, dtype)]
    return np.concatenate(blocks) if blocks else np.zeros((0, m), dtype=dtype)


def percentile_interval(
    values: np.ndarray, alpha: float = 0.05
) -> tuple[float | None, float | None]:
    """The percentile interval of the finite ``values`` (``(None, None)`` when none are)."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return None, None
    lo, hi = np.percentile(finite, [50 * alpha, 100 - 50 * alpha])
    return float(lo) + 0.0, float(hi) + 0.0


def percentile_intervals(
    rows: np.ndarray, alpha: float = 0.05
) -> list[tuple[float | None, float | None]]:
    """`percentile_interval` of each row of ``rows`` (``[k, n_boot]``), the same numbers:
    the rows that are all finite in one `numpy.percentile` along the rows (one call, not
    one a row: a comparison has hundreds), the others one by one."""
    k = rows.shape[0]
    out: list[tuple[float | None, float | None]] = [(None, None)] * k
    if not k:
        return out
    finite = np.isfinite(rows).all(axis=1)
    whole = np.flatnonzero(finite)
    if len(whole) and rows.shape[1]:
        lo, hi = np.percentile(rows[whole], [50 * alpha, 100 - 50 * alpha], axis=1)
        for i, a, b in zip(whole.tolist(), lo.tolist(), hi.tolist(), strict=True):
            out[i] = (a + 0.0, b + 0.0)
    for i in np.flatnonzero(~finite).tolist():
        out[i] = percentile_interval(rows[i], alpha)
    return out


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """McNemar's exact test: the two-sided binomial p-value of ``a_only`` of the
    ``a_only + b_only`` discordant pairs under p = 1/2 (1.0 when there are none), which
    by symmetry is ``min(1, 2 P(X <= min(a_only, b_only)))``, as scipy's ``binomtest``
    gives (computed from the binomial CDF: ``binomtest`` takes milliseconds a call)."""
    discordant = a_only + b_only
    if discordant == 0:
        return 1.0
    stats = require("scipy.stats", "compare", "McNemar's exact test")
    return min(1.0, 2.0 * float(stats.binom.cdf(min(a_only, b_only), discordant, 0.5)))


def mcnemar_exact_many(pairs: Sequence[tuple[int, int]]) -> list[float]:
    """`mcnemar_exact` of each ``(a_only, b_only)``, the same numbers, in one call of the
    binomial CDF (elementwise, the same function a call of one evaluates): a comparison has
    hundreds of tests, and scipy's distribution machinery costs about a millisecond a call."""
    out = [1.0] * len(pairs)
    todo = [i for i, (a, b) in enumerate(pairs) if a + b]
    if not todo:
        return out
    stats = require("scipy.stats", "compare", "McNemar's exact test")
    k = np.array([min(pairs[i]) for i in todo])
    n = np.array([sum(pairs[i]) for i in todo])
    cdf = np.atleast_1d(stats.binom.cdf(k, n, 0.5))
    for i, c in zip(todo, cdf.tolist(), strict=True):
        out[i] = min(1.0, 2.0 * float(c))
    return out


def wilcoxon(differences: np.ndarray) -> tuple[float | None, float]:
    """The Wilcoxon signed-rank test of paired ``differences`` (zeros dropped, scipy's
    ``zero_method="wilcox"``): ``(statistic, two-sided p)``; ``(None, 1.0)`` when no
    difference is non-zero."""
    d = np.asarray(differences, dtype=np.float64)
    if not np.count_nonzero(d):
        return None, 1.0
    stats = require("scipy.stats", "compare", "the Wilcoxon signed-rank test")
    res = stats.wilcoxon(d)
    return float(res.statistic) + 0.0, float(res.pvalue)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of the p-values given (None: no test, left out of the
    count and left None)."""
    present = [(p, i) for i, p in enumerate(pvalues) if p is not None]
    m = len(present)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out
