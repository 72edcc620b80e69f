"""Reference statistics written out from their textbook formulas (scipy's t distribution only), shared by the
tests that check analysis/stats.py and the report's numbers against them."""

from __future__ import annotations

import numpy as np
from scipy import stats as st


def expected_ci(x: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% Student-t interval: mean ± t_{0.975, n-1} s / sqrt(n)."""
    a = np.array(x)
    half = st.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a))
    return a.mean(), a.mean() - half, a.mean() + half


def expected_welch(a: list[float], b: list[float]) -> tuple[float, float, float, float]:
    """Welch's difference of means: (d, 95% low, 95% high, two-sided p), Welch-Satterthwaite degrees of freedom."""
    xa, xb = np.array(a), np.array(b)
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    dof = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    d, se = xa.mean() - xb.mean(), np.sqrt(va + vb)
    half = st.t.ppf(0.975, dof) * se
    return d, d - half, d + half, 2 * st.t.sf(abs(d / se), dof)


def expected_paired(a: list[float], b: list[float]) -> tuple[float, float, float, float]:
    """Paired t on a - b: (mean difference, 95% low, 95% high, p from scipy's ttest_rel)."""
    diff = np.array(a) - np.array(b)
    d, se = diff.mean(), diff.std(ddof=1) / np.sqrt(len(diff))
    half = st.t.ppf(0.975, len(diff) - 1) * se
    return d, d - half, d + half, st.ttest_rel(a, b).pvalue
