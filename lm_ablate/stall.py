"""When a run has stalled: it completed, but never learned past its data's token frequencies, or stopped learning.

One rule, used by the training loop (``stalled`` and ``stall_reason`` in summary.json) and by the analysis (which
judges every run by it from metrics.jsonl, so records written before the loop recorded the flag are judged by the
same code). With L_1 .. L_n the finite validation losses evaluated after step 0, in step order, and U the data's
unigram loss (:mod:`lm_ablate.data.unigram`), a run is stalled when

* ``unigram``: its last validation loss is no more than ``UNIGRAM_MARGIN`` (relative) below U,
  L_n >= (1 - UNIGRAM_MARGIN) * U: it sits on (or above) the unigram plateau, e.g. >= 3.24 nats for the
  bundled Shakespeare bytes (U = 3.31; the bigram level is 2.50); needs U and one evaluation;
* ``flat``: its validation loss fell by less than ``FELL_LESS_THAN`` (relative) from the first evaluation after
  step 0 to the last, L_1 - L_n < FELL_LESS_THAN * |L_1| (a plateau elsewhere); needs two evaluations, and, where
  the evaluations' steps are known, L_1 is the first one at or before ``FLAT_FROM`` x the last one's step: a run
  that learned nothing over the second half of its steps is flat, while two evaluations near the end of a short
  run (a ladder's smallest rung evaluated at steps 250 and 314 of 314, falling 1% between them) say nothing about
  a plateau (no evaluation that early: the flat test cannot tell).

A run whose last validation loss is not finite has diverged, not stalled (``None``). The rule is about the curve:
the analysis counts a run as stalled only when it completed (a diverged run is counted as diverged).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

FELL_LESS_THAN = 0.015  # relative fall of val loss from the first evaluation past step 0 to the last
FLAT_FROM = 0.5  # the flat test starts at an evaluation within the first half of the run's steps
UNIGRAM_MARGIN = 0.02  # relative: a last val loss above (1 - margin) x the unigram loss is on the plateau
UNIGRAM, FLAT = "unigram", "flat"
RULE = (
    f"stalled: last val loss >= {1 - UNIGRAM_MARGIN:g} x unigram_loss ({UNIGRAM}), or val loss fell by less than "
    f"{FELL_LESS_THAN:.1%} from the first evaluation after step 0 (at most {FLAT_FROM:g} x the last one's step) "
    f"to the last ({FLAT})"
)


def reason(
    val_after_init: Sequence[float], unigram: float | None = None, steps: Sequence[float] | None = None
) -> str | None:
    """``"unigram"``, ``"flat"`` or None (not stalled, or too few evaluations to tell); see the module docstring.
    ``val_after_init``: the validation losses evaluated after step 0, in step order; ``steps``: the step of each
    (ignored unless there is one per loss: a record resumed from a checkpoint written before steps were kept)."""
    losses = [float("nan") if v is None else float(v) for v in val_after_init]
    if not losses or not math.isfinite(losses[-1]):
        return None
    at = [float(s) for s in steps] if steps is not None and len(steps) == len(losses) else [math.nan] * len(losses)
    kept = [(s, v) for s, v in zip(at, losses) if math.isfinite(v)]
    last_step, last = kept[-1]
    if unigram is not None and math.isfinite(unigram) and last >= (1 - UNIGRAM_MARGIN) * unigram:
        return UNIGRAM
    early = [v for s, v in kept[:-1] if not math.isfinite(last_step) or s <= FLAT_FROM * last_step]
    if early and early[0] - last < FELL_LESS_THAN * abs(early[0]):
        return FLAT
    return None


def evaluations(steps: Iterable[float], losses: Iterable[float]) -> tuple[list[float], list[float]]:
    """(steps, losses) of the evaluations after step 0 with a finite loss, in step order, from a metrics.jsonl
    curve (a table of the history has NaN on the rows without an evaluation: they are left out)."""
    pairs = sorted((float(s), float(v)) for s, v in zip(steps, losses) if v is not None and float(s) > 0)
    kept = [(s, v) for s, v in pairs if math.isfinite(v)]
    return [s for s, _ in kept], [v for _, v in kept]


def after_init(steps: Iterable[float], losses: Iterable[float]) -> list[float]:
    """The finite losses logged after step 0, in step order, from a metrics.jsonl curve as (step, val/loss)
    pairs (a table of the history has NaN on the rows without an evaluation: they are left out)."""
    return evaluations(steps, losses)[1]
