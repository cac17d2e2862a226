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
    "percentile_interval",
    "resample_counts",
    "resample_sums",
    "wilcoxon",
]

# Resample count matrices are made this many cells at a time (8 MB of float64).
_BLOCK = 1 << 20


def resample_counts(n: int, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """``[b, n]`` float64 blocks (``n_boot`` rows in all): how often each of ``n`` patients
    is drawn in each resample of ``n`` draws with replacement; deterministic for
    ``(n, n_boot, seed)``."""
    if n <= 0 or n_boot <= 0:
        return
    rng = np.random.default_rng(seed)
    block = max(1, _BLOCK // n)
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        idx = rng.integers(0, n, size=(b, n), dtype=np.intp)
        idx += (np.arange(b, dtype=np.intp) * n)[:, None]
        yield np.bincount(idx.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)


def resample_sums(stats: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """``[n_boot, m]``: the column sums of ``stats`` (``[n, m]``, a row a patient) in each
    resample of `resample_counts`; ``[0, m]`` when there is nothing to resample."""
    n, m = stats.shape
    blocks = [counts @ stats for counts in resample_counts(n, n_boot, seed)]
    return np.concatenate(blocks) if blocks else np.zeros((0, m))


def percentile_interval(
    values: np.ndarray, alpha: float = 0.05
) -> tuple[float | None, float | None]:
    """The percentile interval of the finite ``values`` (``(None, None)`` when none are)."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return None, None
    lo, hi = np.percentile(finite, [50 * alpha, 100 - 50 * alpha])
    return float(lo) + 0.0, float(hi) + 0.0


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """McNemar's exact test: the two-sided binomial p-value of ``a_only`` of the
    ``a_only + b_only`` discordant pairs (1.0 when there are none)."""
    discordant = a_only + b_only
    if discordant == 0:
        return 1.0
    stats = require("scipy.stats", "compare", "McNemar's exact test")
    return float(stats.binomtest(a_only, discordant, 0.5).pvalue)


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
