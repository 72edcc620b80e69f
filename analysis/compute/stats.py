"""Small-sample statistics for comparing arms over a handful of seeds.

Ablations usually run 2-5 seeds per arm, so intervals use Student's t rather than a normal approximation
(which would be far too narrow at n=3), and arm-vs-baseline tests use Welch's t-test, which does not assume
the two arms have equal seed-to-seed variance (a less stable arm typically has a larger one). When both arms
ran the same seeds, a seed fixes the data order (and, for arms with the same shapes, the initialisation), so
the arms' losses are correlated seed by seed; the paired t-test on per-seed differences then removes that
shared variance and can detect a smaller effect with the same runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache

import numpy as np
from scipy import stats


def _finite(values: Iterable[float]) -> np.ndarray:
    arr = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return arr[np.isfinite(arr)]


@lru_cache(maxsize=4096)
def t_quantile(q: float, dof: float) -> float:
    """Student-t quantile, cached: a report on a big sweep asks for the same few thousands of times."""
    return float(stats.t.ppf(q, dof))


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, low, high, n): two-sided Student-t confidence interval of the mean with n-1 degrees of freedom.

    Non-finite values are dropped (a NaN loss cannot be averaged; callers pass completed runs only, so a drop
    here means a damaged record), and n counts what was used. n=1 gives the value with a NaN interval (one
    seed says nothing about seed variance); n=0 gives all NaN.
    """
    x = _finite(values)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(x.mean())
    if n == 1:
        return mean, math.nan, math.nan, 1
    half = t_quantile(0.5 + confidence / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def welch(a: Iterable[float], b: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean(a) - mean(b), ci_low, ci_high, two-sided p) by Welch's unequal-variance t-test.

    The interval is delta ± t_{(1+c)/2, ν} · sqrt(s_a²/n_a + s_b²/n_b) with the Welch–Satterthwaite
    degrees of freedom ν, which is what ``scipy.stats.ttest_ind(equal_var=False)`` uses for its p-value,
    so interval and p agree (the interval excludes 0 exactly when p < 1 - c). Needs 2 finite values on
    each side, else CI and p are NaN. When both arms have zero spread the standard error is 0: the
    interval collapses to the difference and p is 1 if the means are equal, else 0 (the limit of the
    test, rather than scipy's NaN).
    """
    xa, xb = _finite(a), _finite(b)
    if len(xa) == 0 or len(xb) == 0:
        return math.nan, math.nan, math.nan, math.nan
    delta = float(xa.mean() - xb.mean())
    if len(xa) < 2 or len(xb) < 2:
        return delta, math.nan, math.nan, math.nan
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    if se == 0:
        return delta, delta, delta, 1.0 if delta == 0 else 0.0
    res = stats.ttest_ind(xa, xb, equal_var=False)
    dof = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, dof) * se)
    return delta, delta - half, delta + half, float(res.pvalue)


def paired(a: Iterable[float], b: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float, float, int]:
    """(mean(a_i - b_i), ci_low, ci_high, two-sided p, n pairs) by the paired t-test.

    ``a`` and ``b`` are aligned (the i-th of each comes from the same seed); a pair with a non-finite value
    is dropped. The interval is mean(d) ± t_{(1+c)/2, n-1} · sd(d)/√n, and p is
    ``scipy.stats.ttest_rel``'s, so they agree. Needs 2 pairs, else CI and p are NaN; when every difference
    is the same the interval collapses and p is 1 if it is 0, else 0 (as in :func:`welch`).
    """
    xa = np.asarray([float(v) if v is not None else math.nan for v in a], dtype=float)
    xb = np.asarray([float(v) if v is not None else math.nan for v in b], dtype=float)
    if xa.shape != xb.shape:
        raise ValueError(f"paired samples differ in length: {len(xa)} vs {len(xb)}")
    ok = np.isfinite(xa) & np.isfinite(xb)
    d = xa[ok] - xb[ok]
    n = len(d)
    if n == 0:
        return math.nan, math.nan, math.nan, math.nan, 0
    delta = float(d.mean())
    if n < 2:
        return delta, math.nan, math.nan, math.nan, n
    se = float(d.std(ddof=1)) / math.sqrt(n)
    if se <= 1e-12 * max(1.0, abs(delta)):  # the same difference for every seed, up to float rounding
        return delta, delta, delta, 1.0 if abs(delta) <= 1e-12 else 0.0, n
    half = t_quantile(0.5 + confidence / 2, n - 1) * se
    p = float(stats.ttest_rel(xa[ok], xb[ok]).pvalue)
    return delta, delta - half, delta + half, p, n
