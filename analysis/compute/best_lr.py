"""Every arm at its own best learning rate, against the baseline arm at its own best (optimizer studies).

Arms whose good LR ranges differ (SGD wants LRs ~100x AdamW's, Adafactor's LR is relative to each parameter's
scale) are only fairly compared when each is tuned: Wen et al. 2025 ("Fantastic pretraining optimizers and
where to find them") find most claimed speed-ups over AdamW shrink to 1.1-1.4x under equal tuning. So each arm
is taken at the best LR of its own grid, as :func:`analysis.compute.compare.lr_sweep` finds it (arms need not share
grid values: sweeps/optimizer.yaml gives every optimizer its own grid around its own reference LR), and

    delta = mean final val loss(arm at its best LR) - mean final val loss(baseline at its best LR)

over the completed runs there, with its 95% interval: the paired t-test over the seeds both ran when they
share at least two, else Welch's (:func:`analysis.compute.compare.compare_to_baseline`, as in every comparison).

Caveat, said in the report: the best LR is picked on the same runs its loss is read from, so every arm's loss
at its best is biased low by the pick (the minimum of noisy means), more so for a finer grid or noisier runs.
Equal grid sizes make the bias alike across arms; ``best_at_edge`` flags an arm whose optimum may lie outside
its grid (then its loss at best is an upper bound on its tuned loss).

:func:`best_lr_of` is the same choice for any set of runs (one side of a claim in one context): every claim about
quality is decided at each side's own best LR this way (analysis/compute/claims.py) unless its ``context`` pins
the LR.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.compute.compare import (
    LR_KEY,
    LRSweep,
    capped_loss,
    compare_to_baseline,
    lr_sweep,
    pick_best_lr,
    seed_finals,
    selection_means,
)
from analysis.sources.load import AnalysisError, RunSet
from analysis.sources.values import launch_order, override_text
from lm_ablate import metrics as M


@dataclass
class BestLRComparison:
    """``table``: one row per arm (an arm: a context of :class:`LRSweep`), the baseline's row first, with its
    best LR, the loss there (mean, 95% interval, n), and delta against the baseline's best with its interval,
    p and test (paired | welch). ``baseline``: the baseline arm's context label."""

    baseline: str
    table: pd.DataFrame
    sweep: LRSweep


@dataclass(frozen=True)
class BestLR:
    """The LR a set of runs is best at: ``lr`` (NaN when none has a number), ``at_edge`` (the smallest or largest
    of a grid of more than one), the ``grid``, the ``mean`` final val loss there (over all its completed runs),
    the runs there (any status) and ``seed_adjusted``: the LRs, which ran different seeds, were compared on
    seed-adjusted means (:func:`analysis.compute.compare.selection_means`)."""

    lr: float
    at_edge: bool
    grid: tuple[float, ...]
    mean: float
    run_ids: tuple[str, ...]
    seed_adjusted: bool = False


def best_lr_of(rs: RunSet, run_ids: Sequence[str], key: str = LR_KEY) -> BestLR:
    """Where ``run_ids`` (one arm's runs, any LRs) are best: the LR with the lowest mean final val loss over its
    completed runs (:func:`analysis.compute.compare.pick_best_lr`, the LR table's rule; seed-adjusted when its LRs
    ran different seeds, :func:`analysis.compute.compare.selection_means`). When no LR has a completed
    run, the lowest mean capped loss decides (every run diverged: the smallest LR, all at the cap)."""
    rows = rs.runs.set_index("run_id", drop=False)
    by_lr: dict[float, list[str]] = {}
    for r in run_ids:
        try:
            lr = float(rs.configs[r][key])
        except (KeyError, TypeError, ValueError):
            continue
        by_lr.setdefault(lr, []).append(r)
    grid = tuple(sorted(by_lr))

    def mean_of(ids: list[str], completed_only: bool) -> float:
        values = []
        for r in ids:
            row = rows.loc[r]
            if completed_only:
                final = pd.to_numeric(row.get(M.FINAL_VAL_LOSS), errors="coerce")
                if row.get(M.STATUS) == M.STATUS_COMPLETED and final is not None and math.isfinite(final):
                    values.append(float(final))
            elif row.get(M.STATUS) in (M.STATUS_COMPLETED, M.STATUS_DIVERGED):
                values.append(capped_loss(row))
        values = [v for v in values if math.isfinite(v)]
        return float(np.mean(values)) if values else math.nan

    means = {lr: mean_of(ids, True) for lr, ids in by_lr.items()}
    picked_on, adjusted = selection_means({lr: seed_finals(rows.loc[ids]) for lr, ids in by_lr.items()})
    lr, at_edge = pick_best_lr(picked_on)
    if not math.isfinite(lr):
        lr, at_edge = pick_best_lr({g: mean_of(ids, False) for g, ids in by_lr.items()})
    if not math.isfinite(lr):
        return BestLR(math.nan, False, grid, math.nan, ())
    return BestLR(lr, at_edge, grid, means[lr], tuple(by_lr[lr]), adjusted and math.isfinite(picked_on[lr]))


def compare_at_best_lr(
    rs: RunSet, baseline: str | None = None, sweep: LRSweep | None = None
) -> BestLRComparison | None:
    """Each arm at its best LR against the baseline arm at its best; None when no LR varies or there is a
    single arm. ``baseline``: an arm's context label as the LR sweep writes it (``optim.name=adamw``), or
    KEY=VALUE naming one value of the other varied axes (``optim.name=sgd``); default: the arm of the first run
    launched (a sweep lists its baseline first)."""
    sweep = sweep if sweep is not None else lr_sweep(rs)
    if sweep is None or len(sweep.contexts) < 2:
        return None
    best = sweep.best.set_index("context")
    base = _baseline(sweep, baseline)
    records = rs.runs.set_index("run_id", drop=False)
    at_best = {c: _runs_at(sweep, records, c, best.loc[c, "best_lr"]) for c in sweep.contexts}
    rows = []
    for context in [base] + [c for c in sweep.contexts if c != base]:
        row: dict[str, Any] = {
            "context": context,
            "baseline": context == base,
            "best_lr": best.loc[context, "best_lr"],
            "best_at_edge": bool(best.loc[context, "best_at_edge"]),
            "lr_grid": best.loc[context, "lr_grid"],
            "n_stalled_at_best": best.loc[context, "n_stalled_at_best"],
        }
        for key in ("mean", "ci_low", "ci_high", "n"):
            row[f"{M.FINAL_VAL_LOSS}_{key}"] = best.loc[context, f"{M.FINAL_VAL_LOSS}_{key}"]
        row["baseline_best_lr"] = best.loc[base, "best_lr"]
        if context == base:
            row.update(delta_final_val_loss=0.0, delta_ci_low=math.nan, delta_ci_high=math.nan, p_value=math.nan,
                       test="", n_pairs=0)  # fmt: skip
        else:
            row.update(compare_to_baseline(at_best[context], at_best[base]))
        rows.append(row)
    return BestLRComparison(base, pd.DataFrame(rows), sweep)


def _runs_at(sweep: LRSweep, records: pd.DataFrame, context: str, lr: float) -> list[dict[str, Any]]:
    """The completed runs with a finite final loss of one arm at one LR, as compare_to_baseline reads them."""
    if not math.isfinite(lr):
        return []
    wanted = override_text(lr)
    ids = [r for r, (c, value) in sweep.assignment.items() if c == context and _same_lr(value, wanted, lr)]
    out = []
    for r in ids:
        row = records.loc[r]
        final = pd.to_numeric(row.get(M.FINAL_VAL_LOSS), errors="coerce")
        if row.get(M.STATUS) == M.STATUS_COMPLETED and final is not None and math.isfinite(final):
            out.append({"run_id": r, M.SEED: row.get(M.SEED), M.FINAL_VAL_LOSS: float(final)})
    return out


def _same_lr(written: str, wanted: str, lr: float) -> bool:
    try:
        return float(written) == lr
    except ValueError:
        return written == wanted


def _baseline(sweep: LRSweep, spec: str | None) -> str:
    if spec is None:
        first = min(sweep.assignment, key=launch_order)
        return sweep.assignment[first][0]
    if spec in sweep.contexts:
        return spec
    key, sep, value = spec.partition("=")
    hits = [
        c
        for c in sweep.contexts
        if sep and any(k in (key, key.removesuffix(".name")) and v == value for k, v in _values(sweep, c).items())
    ]
    if len(hits) != 1:
        why = "no arm has that value" if not hits else f"{len(hits)} arms match"
        raise AnalysisError(f"baseline {spec!r}: {why}; arms: {'; '.join(sweep.contexts)}")
    return hits[0]


def _values(sweep: LRSweep, context: str) -> dict[str, str]:
    return {k.removeprefix("choices."): v for k, v in sweep.context_values.get(context, {}).items()}
