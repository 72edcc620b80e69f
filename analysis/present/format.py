"""Values as the report writes them for people: every missing or non-finite value is "–", numbers keep a fixed
number of digits, an interval is ``[low, high]`` or ``± half-width``, ratios carry ×, compute is 1.23e13."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lm_ablate import stall

# what "stalled" means, in words, with the thresholds lm_ablate/stall.py decides by
STALL_WORDS = (
    f"completed, but its last val loss is at least {1 - stall.UNIGRAM_MARGIN:.0%} of the data's unigram loss "
    f"(the validation split's cross-entropy under the training split's add-one unigram distribution: "
    f"{stall.UNIGRAM}) or fell less than {stall.FELL_LESS_THAN:.1%} from the first evaluation after step 0 (within "
    f"the first {stall.FLAT_FROM:.0%} of the run's steps) to the last ({stall.FLAT}); lm_ablate/stall.py"
)


def finite(x: Any) -> bool:
    """A finite number, not a bool (a missing value in a table is NaN or None)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def num(x: Any, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if finite(x) else "–"


def mean_pm(mean: Any, low: Any, high: Any, digits: int = 4, comma: bool = False) -> str:
    """``mean ± half-width``; the t-interval is symmetric, so the half-width says all of it."""
    if not finite(mean):
        return "–"
    spec = f",.{digits}f" if comma else f".{digits}f"
    text = format(mean, spec)
    return text + (f" ± {format((high - low) / 2, spec)}" if finite(low) and finite(high) else "")


def count(x: Any) -> str:
    return f"{int(x):,}" if finite(x) else "–"


def delta_text(row: pd.Series) -> str:
    if row["is_baseline"]:
        return "baseline"
    d, lo, hi = row["delta_final_val_loss"], row["delta_ci_low"], row["delta_ci_high"]
    if not finite(d):
        return "–"
    return f"{d:+.4f}" + (f" [{lo:+.4f}, {hi:+.4f}]" if finite(lo) and finite(hi) else "")


def ratio_text(x: Any) -> str:
    return f"{x:.3f}×" if finite(x) else "–"


def p_text(p: Any) -> str:
    if not finite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def rate_text(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if finite(x) else "–"


# --- a scaling study's numbers: ∞ is a value there (a multiplier the baseline never reaches) -------------
def number(x: Any) -> bool:
    """A number that is not NaN (±∞ included: a compute multiplier can be infinite), not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def sci(x: Any, digits: int = 3) -> str:
    """1.23e13 style, ∞ for +inf, – for missing."""
    if not number(x):
        return "–"
    return "∞" if math.isinf(x) else f"{x:.{digits - 1}e}".replace("e+", "e")


def fixed(x: Any, digits: int = 4) -> str:
    if not number(x):
        return "–"
    return "∞" if math.isinf(x) else f"{x:.{digits}f}"


OUTSIDE_MARK = "⚠ outside"  # a point estimate outside its own interval (a percentile bootstrap can do that)


def outside(value: Any, low: Any, high: Any) -> bool:
    """A number outside [low, high] (False when any of the three is missing)."""
    return number(value) and number(low) and number(high) and not low <= value <= high


def with_interval(value: Any, low: Any, high: Any, fmt: Any = fixed) -> str:
    """``value [low, high]``; flagged with OUTSIDE_MARK when the value lies outside its interval, which a percentile
    bootstrap interval can do (the Scaling section says what it means)."""
    if not number(value):
        return "–"
    if not (number(low) and number(high)):
        return fmt(value)
    return f"{fmt(value)} [{fmt(low)}, {fmt(high)}]" + (f" {OUTSIDE_MARK}" if outside(value, low, high) else "")


def pct(x: Any) -> str:
    return f"{100 * x:.2f}%" if number(x) else "–"


def cm_text(x: Any) -> str:
    if not number(x):
        return "–"
    return "∞" if math.isinf(x) else f"{x:.3f}×"
