"""A numeric axis as a basin, drawn as Kaplan et al. 2020 draw shape at a fixed parameter count (Fig. 5: d_ff /
d_model, aspect ratio, head dim): every value of the axis at its own best LR, its loss relative to the best value's
in %, with 95% intervals over seeds. Numbers only (analysis/present/sections/basin.py words them, figures/basin.py
draws them).

In each context of the other varied axes (the LR is no context: it is chosen per value), for each value x of the
axis (a *point*):

    best LR(x)  analysis.compute.best_lr.best_lr_of over the point's runs: the lowest mean final val loss over its
                completed seeds (seed-adjusted where its LRs ran different seeds, compare.selection_means), the
                fair rule every claim uses; ``at_edge`` when it is the smallest or largest LR of a grid of more
                than one (the point's optimum is not bracketed: its value is an upper bound)
    L(x)        the mean metric over the completed runs at that LR
    x*          the point with the lowest L (compare.selection_means over the points: seed-adjusted when the points
                ran different seeds), the basin's floor
    r(x)        = 100 (L(x) - L(x*)) / L(x*)  in %, with L(x) - L(x*) and its 95% (and 90%) interval from
                compare.compare_to_baseline (the paired t-test over the seeds both points ran when they share two,
                else Welch's), all three divided by L(x*) (taken as known: its relative standard error is ~0.1%
                here, against effects of ~1%)

    F(x)        the point's training FLOPs per token (summary.json flops_per_token; one shape per point): at a fixed
                parameter count a shape can still cost more compute (attention's 12 L d T grows with depth at a
                fixed N), so the report shows F(x) / F(x*) beside r(x) where the points' F differ; where the
                tokenizers differ a token is not a unit of text, so the run's training FLOPs (F x tokens seen,
                the same training bytes for every point under train.max_bytes) take F's place

x* has r = 0 and no interval. Metric: final val loss, or final val bits per byte where the points' tokenizers
differ (loss per token is not comparable across tokenizers; without bits per byte such a basin is refused:
``refused``); for one tokenizer both give the same r (bits per byte = loss x tokens / (bytes ln 2), one factor).
Caveat (as for every best-of-a-grid pick): x* is the minimum of noisy means, so r(x) leans up by about the noise
of L(x*). Stalled runs are counted per point (``stalled``): the report marks them and a claim decided on a point
with stalled seeds is inconclusive (analysis/compute/claims.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.compute.best_lr import BestLR, best_lr_of
from analysis.compute.compare import (
    ALL_RUNS,
    LR_KEY,
    Axis,
    ComparisonSet,
    compare_to_baseline,
    is_stalled,
    pick_best_lr,
    selection_means,
    tokenizers_differ,
)
from analysis.sources.load import RunSet
from analysis.sources.values import override_text, value_order
from lm_ablate import metrics as M

MIN_POINTS = 3  # fewer values make a comparison, not a basin
POOLED = (LR_KEY, "choices.lr_mult")  # chosen per point, never a context
VALUE = "value"


@dataclass(frozen=True)
class Point:
    """One value of the axis at its best LR. ``relative`` (%), ``low``/``high`` (95%), ``low90``/``high90``: r(x)
    against the best point (0 and NaN for the best point itself); ``values``: (run id, seed, metric) of the
    completed runs it is read from; ``stalled``: (stalled, runs) among all its runs at that LR."""

    x: float
    value: Any  # as the config writes it
    lr: BestLR
    mean: float
    n: int
    relative: float
    low: float
    high: float
    low90: float
    high90: float
    test: str
    n_pairs: int
    values: tuple[tuple[str, Any, float], ...]
    stalled: tuple[int, int]
    is_best: bool = False
    flops_per_token: float = math.nan  # F(x): mean over the point's runs at its best LR (NaN where not recorded)
    train_flops: float = math.nan  # F(x) x tokens seen, the same mean

    @property
    def runs(self) -> tuple[str, ...]:
        """Every run at the point's best LR (any status): what it is decided on."""
        return self.lr.run_ids


@dataclass(frozen=True)
class Basin:
    """One axis in one context: its points in axis order, the best one, and the metric they are read on."""

    axis: str  # config key
    label: str  # as the report names the axis
    context: str
    metric: str  # M.FINAL_VAL_LOSS | M.FINAL_VAL_BPB
    points: tuple[Point, ...]
    refused: str = ""  # why there is no basin (tokenizers differ and no bits per byte)

    @property
    def best(self) -> Point | None:
        return next((p for p in self.points if p.is_best), None)

    @property
    def per_token(self) -> bool:
        """Is compute compared per token (one tokenizer), or per run (tokenizers differ: training FLOPs)?"""
        return self.metric != M.FINAL_VAL_BPB

    def cost(self, p: Point) -> float:
        """What point ``p`` costs: FLOPs per token, or its run's training FLOPs where tokenizers differ."""
        return p.flops_per_token if self.per_token else p.train_flops

    @property
    def table(self) -> pd.DataFrame:
        rows = []
        for p in self.points:
            rows.append({
                "axis": self.label, "context": self.context, "metric": self.metric, "value": override_text(p.value),
                "x": p.x, "best_lr": p.lr.lr, "best_lr_at_edge": p.lr.at_edge,
                "lr_grid": " ".join(override_text(v) for v in p.lr.grid), "mean": p.mean, "n": p.n,
                "relative_pct": p.relative, "ci_low_pct": p.low, "ci_high_pct": p.high, "test": p.test,
                "n_pairs": p.n_pairs, "is_best": p.is_best, "n_stalled": p.stalled[0], "runs_at_best_lr": p.stalled[1],
                "flops_per_token": p.flops_per_token, "train_flops": p.train_flops,
            })  # fmt: skip
        return pd.DataFrame(rows)


def axis_number(value: Any) -> float | None:
    """A config value as a point of a numeric axis: a number (not a boolean), finite or +inf; None otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    x = float(value)
    return x if math.isfinite(x) or x == math.inf else None


def is_numeric(values: Iterable[Any]) -> bool:
    """Can these values be a basin's axis: at least MIN_POINTS numbers, every other value null (an option's own
    rule, e.g. shape.ffn_ratio=null: the activation's d_ff, no point of the basin)."""
    xs = [axis_number(v) for v in values if v is not None]
    return len(xs) >= MIN_POINTS and all(x is not None for x in xs)


def basin_metric(rs: RunSet, run_ids: Sequence[str], prefer: str = M.FINAL_VAL_LOSS) -> tuple[str, str]:
    """(metric, refusal): ``prefer`` where the runs share a tokenizer; final val bits per byte where they do not
    (refusal "" then, unless some completed run lacks it: those records predate it)."""
    mixed = tokenizers_differ(rs.configs[r] for r in run_ids)
    if not mixed:
        return prefer, ""
    rows = rs.runs.set_index("run_id", drop=False)
    done = [r for r in run_ids if rows.loc[r, M.STATUS] == M.STATUS_COMPLETED]
    have = M.FINAL_VAL_BPB in rows.columns and all(np.isfinite(_num(rows.loc[r, M.FINAL_VAL_BPB])) for r in done)
    if have:
        return M.FINAL_VAL_BPB, ""
    return M.FINAL_VAL_BPB, (f"the runs' tokenizers differ ({mixed}), so loss per token does not compare, and some "
                             "completed run has no val bits per byte (recorded before it existed)")  # fmt: skip


def basin_of(
    rs: RunSet, key: str, run_ids: Sequence[str], context: str = ALL_RUNS, label: str | None = None,
    metric: str | None = None,
) -> Basin:  # fmt: skip
    """The basin of axis ``key`` over ``run_ids`` (one context's runs, every LR): each value at its best LR,
    relative to the best value (module docstring). ``metric``: None chooses (:func:`basin_metric`)."""
    refused = ""
    if metric is None:
        metric, refused = basin_metric(rs, run_ids)
    name = label or key
    if refused:
        return Basin(key, name, context, metric, (), refused)
    rows = rs.runs.set_index("run_id", drop=False)
    by_x: dict[float, list[str]] = {}
    written: dict[float, Any] = {}
    for r in run_ids:
        x = axis_number(rs.configs[r].get(key))
        if x is not None:
            by_x.setdefault(x, []).append(r)
            written.setdefault(x, rs.configs[r].get(key))
    stalled = {r: is_stalled(v) for r, v in zip(rs.runs["run_id"], rs.runs.get(M.STALLED, [None] * len(rs.runs)))}
    picks = {x: best_lr_of(rs, ids) for x, ids in by_x.items()}
    values = {x: _values(rows, rs, best.run_ids, metric) for x, best in picks.items()}
    means, _ = selection_means({x: [(_num(seed), v) for _, seed, v in vs] for x, vs in values.items()})
    best_x, _ = pick_best_lr(means)
    points = []
    for x in sorted(by_x):
        best, vs = picks[x], values[x]
        mean = float(np.mean([v for *_, v in vs])) if vs else math.nan
        stall = (sum(stalled.get(r, False) for r in best.run_ids), len(best.run_ids))
        common = dict(x=x, value=written[x], lr=best, mean=mean, n=len(vs), values=tuple(vs), stalled=stall,
                      flops_per_token=_mean_of(rows, best.run_ids, M.FLOPS_PER_TOKEN),
                      train_flops=_mean_of(rows, best.run_ids, M.FLOPS_PER_TOKEN, M.TOTAL_TOKENS))  # fmt: skip
        if x == best_x or not math.isfinite(best_x):
            nan = math.nan
            rel = 0.0 if x == best_x else nan
            points.append(Point(relative=rel, low=nan, high=nan, low90=nan, high90=nan, test="", n_pairs=0,
                                is_best=x == best_x, **common))  # fmt: skip
            continue
        points.append(Point(**relative_to(vs, values[best_x]), **common))
    return Basin(key, name, context, metric, tuple(points))


def relative_to(point: Sequence[tuple[str, Any, float]], best: Sequence[tuple[str, Any, float]]) -> dict[str, Any]:
    """r(x) in % of one point's (run id, seed, value)s against the best point's, with 95% and 90% intervals."""
    arm = [{"run_id": r, M.SEED: s, VALUE: v} for r, s, v in point]
    base = [{"run_id": r, M.SEED: s, VALUE: v} for r, s, v in best]
    if not arm or not base:
        nan = math.nan
        return dict(relative=nan, low=nan, high=nan, low90=nan, high90=nan, test="", n_pairs=0)
    floor = float(np.mean([r[VALUE] for r in base]))
    r95 = compare_to_baseline(arm, base, VALUE, 0.95)
    r90 = compare_to_baseline(arm, base, VALUE, 0.90)
    pct = lambda d: 100.0 * d / floor
    return dict(relative=pct(r95["delta_final_val_loss"]), low=pct(r95["delta_ci_low"]),
                high=pct(r95["delta_ci_high"]), low90=pct(r90["delta_ci_low"]), high90=pct(r90["delta_ci_high"]),
                test=r95["test"], n_pairs=int(r95["n_pairs"]))  # fmt: skip


def _values(rows: pd.DataFrame, rs: RunSet, ids: Iterable[str], metric: str) -> list[tuple[str, Any, float]]:
    """(run id, seed, metric) of the completed runs among ``ids`` with a finite metric."""
    out = []
    for r in ids:
        row = rows.loc[r]
        v = _num(row.get(metric))
        if row.get(M.STATUS) == M.STATUS_COMPLETED and math.isfinite(v):
            out.append((r, rs.configs.get(r, {}).get(M.SEED, row.get(M.SEED)), v))
    return out


def _mean_of(rows: pd.DataFrame, ids: Iterable[str], column: str, times: str | None = None) -> float:
    """The mean of ``column`` (times ``times``) over the finite values ``ids`` recorded (NaN where none did)."""
    factor = (lambda r: _num(rows.loc[r].get(times))) if times else (lambda r: 1.0)
    vs = [_num(rows.loc[r].get(column)) * factor(r) for r in ids] if column in rows.columns else []
    vs = [v for v in vs if math.isfinite(v)]
    return float(np.mean(vs)) if vs else math.nan


def flops_differ(b: Basin, tolerance: float = 0.005) -> bool:
    """Do the points' costs (:meth:`Basin.cost`) differ by more than ``tolerance`` (relative): is compute a second
    axis?"""
    fs = [b.cost(p) for p in b.points if math.isfinite(b.cost(p))]
    return len(fs) >= 2 and max(fs) > (1 + tolerance) * min(fs)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def contexts(
    rs: RunSet, run_ids: Iterable[str], others: Sequence[Axis]
) -> list[tuple[str, list[str]]]:  # fmt: skip
    """The runs grouped by their values of the ``others`` axes, labelled as the comparison tables label a context,
    in value order."""
    groups: dict[str, tuple[tuple[Any, ...], list[str]]] = {}
    for r in run_ids:
        cfg = rs.configs[r]
        label = ", ".join(f"{a.label}={override_text(cfg.get(a.name))}" for a in others) or ALL_RUNS
        order = tuple(value_order(cfg.get(a.name)) for a in others)
        groups.setdefault(label, (order, []))[1].append(r)
    return [(label, ids) for label, (_, ids) in sorted(groups.items(), key=lambda kv: kv[1][0])]


def other_axes(axis: Axis, axes: Sequence[Axis]) -> list[Axis]:
    """The axes a basin of ``axis`` is drawn within (not the axis itself, not the LR it chooses per point)."""
    return [a for a in axes if not set(a.keys) & set(axis.keys) and not set(a.keys) & set(POOLED)]


def basins(rs: RunSet, cs: ComparisonSet, exclude: Iterable[str] = ()) -> list[Basin]:
    """A basin for every varied numeric axis (at least MIN_POINTS values; not the LR, nor an axis setting a key of
    ``exclude``: a scaling study's size keys, along which loss falls rather than has a floor) in every context."""
    out = []
    skip = set(POOLED) | set(exclude)
    for axis in cs.varied:
        if set(axis.keys) & skip or not is_numeric(cs.values.get(axis.name, [])):
            continue
        ids = [r for r in rs.configs if axis_number(rs.configs[r].get(axis.name)) is not None]
        for label, members in contexts(rs, ids, other_axes(axis, cs.varied)):
            if len({axis_number(rs.configs[r].get(axis.name)) for r in members}) >= MIN_POINTS:
                out.append(basin_of(rs, axis.name, members, label, axis.label))
    return out
