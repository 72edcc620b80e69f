"""Claims -> verdicts: each claim a study declares (``claims`` in its experiment file; schema and field meanings in
lm_ablate/claim_spec.py) decided from its runs. Numbers and verdict codes only; the report words them.

For a claim, in every context of the other varied axes that its ``context`` allows (keys the metric aggregates
over, such as the LR grid of LR sensitivity, are not contexts):

    effect = metric(arm) - metric(baseline)     difference metrics, null value 0
    effect = metric(arm) / metric(baseline)     ratio metrics (tokens/s, attention logit, ...), null value 1,
                                                 computed on logs, so the estimate is a geometric-mean ratio

with the report's own statistics (:func:`analysis.compute.compare.compare_to_baseline`: the paired t-test over the seeds
both arms ran when they share two, else Welch's; here at 95% and at 90%), then

    lower     held if high95 < null;   contradicted if low95 > null;  else inconclusive
    higher    held if low95 > null;    contradicted if high95 < null; else inconclusive
    equal δ   held if the 90% interval lies inside (lo, hi) (TOST: both one-sided tests pass at 5%);
              contradicted if the 95% interval lies entirely outside it (at or below lo, or at or above hi);
              else inconclusive. (lo, hi) = (-δ, δ) for a difference, (1/(1+δ), 1+δ) for a ratio.
    untested  the runs hold no value of the metric for the arm or the baseline there (a one-seed arm has a
              value but no interval: inconclusive).

Fair verdicts (issue 23). **Each side at its own best LR**: when ``optim.lr`` varies among a claim's runs and
its ``context`` does not pin it (nor ``lr_mult``), and the metric does not pool the LR itself (LR sensitivity,
best-LR spread, compute multiplier), the LR is no context: in each context of the other axes, each side is
taken at its own best LR (:func:`analysis.compute.best_lr.best_lr_of`: lowest mean final val loss over its
completed seeds, seed-adjusted where its LRs ran different seeds) and the metric compares those runs, paired by
seed where both have them. The result records which LR won for each side and whether it sits at an edge of that
side's grid. **Stalls**: when the runs a
side is decided on hold stalled seeds (completed runs on the unigram plateau or flat, lm_ablate/stall.py, as
analysis.sources.load judges them), the verdict is ``inconclusive`` with ``why`` = ``stalled_seeds`` and the
counts (k of n) per side, unless the metric or the claim is about failing to train (``Claim.stalls_are_data``). The effect
carries each seed's value (``arm_points``), so a bimodal cell is shown seed by seed, not as a mean alone.
**A fit off its goal**: a compute-multiplier claim whose fit (the chosen form's, else each arm's own) predicts the
arm's or the baseline's held-out rung with more than scaling.HELD_OUT_GOAL relative error is ``inconclusive``
with ``why`` = ``fit_off_goal``: a fit that misses a rung it did not see is no evidence of what it extrapolates.
**Speed under load**: a tokens/s claim whose side's runs (at every LR of its grid: speed does not depend on the
LR) differ by more than ``SPEED_SPREAD_LIMIT`` (max / min) ran on a machine whose load changed, so held or
contradicted becomes ``inconclusive`` with ``why`` = ``speed_unsteady``.

**Basin claims** (``MetricSpec.basin``: relative_val_loss, relative_val_bpb; analysis/compute/basin.py) speak of
every value x of a numeric axis in the claim's ``over`` = [a, b] at once, each at its own best LR, by r(x) =
100 (L(x) - L(x*)) / L(x*) in % against the basin's best point x* (over all values in the context), with its 95%
interval [lo(x), hi(x)] over seeds; m is the claim's ``margin`` (percent). The best point itself has r = 0 = lo = hi.

    within m% over [a, b]   held          every x in [a, b]: hi(x) < m          (intersection-union: each at 2.5%)
                            contradicted  some x in [a, b]: lo(x) > m
                            inconclusive  otherwise (a point with one seed has no interval)
    worse by >= m% over R   held          every x in R: lo(x) > m
    (R = [a, b], [c, null]  contradicted  some x in R: hi(x) < m (the best point in R contradicts it)
    beyond c, [null, c])    inconclusive  otherwise
    untested                no value of the axis in R, or no best point (no completed run)

The effect shown is the deciding point's: the contradicting one, else the one nearest to failing (within: the
largest hi; worse: the smallest lo), so :func:`verdict` of it is the claim's verdict. Stalled seeds at a point the
verdict rests on (held: every point in R and x*; contradicted: the contradicting point and x*) make it
``inconclusive`` (``stalled_seeds``), unless ``counts_failures``. A point whose best LR lies at an edge of its grid
is noted (``lr_at_edge``: its loss is an upper bound on its tuned loss), as every best-LR pick is.

A claim evaluated in several contexts has one verdict per context and, as a whole, the verdict they share,
or ``mixed``. Each metric is one function in :data:`METRIC_FUNCTIONS` (names: lm_ablate.claim_spec.METRICS)
taking a :class:`Selection` (the runs of the arm and of the baseline in one context) and returning an
:class:`Effect` or, when it cannot, a reason code (``WHY_*``). A new metric (``best_lr_shift`` for the μP
transfer study, say: per seed, log2 of the largest over the smallest best LR across widths) is a
``MetricSpec`` in lm_ablate.claim_spec.METRICS (difference or ratio; ``pools``: the keys it aggregates over,
there ``optim.lr`` and ``model.d_model``) plus its function here, usually ``compare_values`` over per-seed
values; tests/test_claims.py checks that the two tables name the same metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from analysis.compute.best_lr import BestLR, best_lr_of
from analysis.compute.compare import (
    ALL_RUNS,
    LR_KEY,
    Axis,
    ComparisonSet,
    capped_loss,
    compare_to_baseline,
    find_axes,
    is_stalled,
    tokenizers_differ,
)
from analysis.sources.load import EXTRAPOLATION_KEY, FIRST_PROBE_PREFIX, MAX_ATTN_LOGIT_ALL, AnalysisError, RunSet
from analysis.sources.values import override_text, value_order
from lm_ablate import metrics as M
from lm_ablate.claim_spec import (
    EQUAL,
    HIGHER,
    LOWER,
    PER_TOKEN_METRICS,
    WITHIN,
    WORSE,
    Claim,
    parse_claims,
    per_token_refusal,
    resolve_key,
    same_value,
)
from lm_ablate.config import ConfigError

HELD, CONTRADICTED, INCONCLUSIVE, UNTESTED, MIXED = "held", "contradicted", "inconclusive", "untested", "mixed"
VERDICTS = (HELD, CONTRADICTED, INCONCLUSIVE, UNTESTED)
# why a claim could not be decided (codes; the report words them)
WHY_UNKNOWN_KEY = "unknown_key"  # the claim's axis or a context key is no config key of these runs
WHY_NOT_VARIED = "axis_not_varied"  # the axis has one value in these runs
WHY_NO_CONTEXT = "no_runs_in_context"  # no run has the claim's context values
WHY_NO_ARM = "no_arm_runs"  # no run of the arm in this context
WHY_NO_BASELINE = "no_baseline_runs"
WHY_NO_ARM_VALUES = "no_arm_values"  # arm runs exist, but none has the metric (not completed, not logged)
WHY_NO_BASELINE_VALUES = "no_baseline_values"
WHY_NO_INTERVAL = "no_interval"  # values on both sides but too few for an interval (one seed)
WHY_NO_SCALING = "no_scaling_study"  # compute_multiplier without a scaling study in the runs
WHY_NOT_SCALING_BASELINE = "baseline_not_scaling_baseline"  # CM is against the scaling study's baseline only
WHY_NO_MULTIPLIER = "no_multiplier"  # the scaling study has no multiplier for the arm at `at`
WHY_STALLED = "stalled_seeds"  # a side has stalled seeds where it is decided: inconclusive (k of n per side)
WHY_FIT_OFF_GOAL = "fit_off_goal"  # a compute multiplier whose fit missed the held-out goal: inconclusive
WHY_NO_BPB = "no_val_bpb"  # final_val_bpb: a side's completed runs predate val bits per byte (M.NO_BPB_RECORDED)
WHY_SPEED_UNSTEADY = "speed_unsteady"  # a tokens/s claim whose side's runs spread > SPEED_SPREAD_LIMIT: inconclusive
LR_MULT_KEY = "choices.lr_mult"  # the LR as a multiple of the optimizer's reference (conf/lr_mult/)
NOTE_FIT_OFF_GOAL = "fit_off_goal"  # the arm's or the baseline's fit predicts its held-out rung > the goal off
NOTE_ALLOCATION_EDGE = "allocation_edge"  # an L(N, D) curve compared follows the edge of its trained allocations
NOTE_SPEED_UNSTEADY = "speed_unsteady"  # tokens/s of a side's runs (every LR) varies > SPEED_SPREAD_LIMIT
NOTE_GRIDS_DIFFER = "lr_grids_differ"  # lr_sensitivity: arm and baseline ran different LR grids
NOTE_SEEDS_LEFT_OUT = "seeds_without_full_grid"  # lr_sensitivity: a seed that missed an LR of its arm's grid
NOTE_BEYOND_VALIDATED = "beyond_validated_range"  # compute_multiplier: extrapolated further than the held-out check
NOTE_CELL_BEST_LR = "each_cell_at_its_best_lr"  # compute_multiplier: each (arm, rung, budget) fitted at its best LR
NOTE_LR_AT_EDGE = "lr_at_edge"  # basin: a point the verdict rests on has its best LR at an edge of its grid
NOTE_FIT_WINDOW = "fit_window_decides"  # compute_multiplier: fitted on every budget, the same form reads otherwise
SPEED_SPREAD_LIMIT = 1.5  # max / min tokens/s of one arm's runs above which speed ratios are not to be trusted
VALUE = "value"  # the per-run value column handed to compare_to_baseline
ENDED = (M.STATUS_COMPLETED, M.STATUS_DIVERGED)


@dataclass(frozen=True)
class Effect:
    """arm vs baseline on one metric: ``estimate`` (difference, or ratio for a ratio metric) with its 95% and 90%
    intervals (NaN where there is none), the test, and each side's value (mean; geometric mean for a ratio)."""

    estimate: float
    low95: float
    high95: float
    low90: float
    high90: float
    p_value: float
    test: str  # paired | welch | bootstrap | "" (no test)
    n_pairs: int  # seeds paired (paired test), else 0
    n_arm: int  # runs (or seeds) with a value
    n_baseline: int
    arm_value: float
    baseline_value: float
    notes: tuple[str, ...] = ()
    arm_points: tuple[tuple[str, Any, float], ...] = ()  # (run id, seed, value) of each run compared
    baseline_points: tuple[tuple[str, Any, float], ...] = ()


@dataclass(frozen=True)
class ClaimResult:
    """One claim in one context."""

    claim: Claim
    context: str  # the context label, as the comparison tables write it ("all runs" when there is none)
    verdict: str
    effect: Effect | None
    why: str = ""  # a WHY_* code when untested, or inconclusive for lack of an interval
    axis: str = ""  # the compared axis as the report labels it (for comparisons.csv)
    arm_label: str = ""  # the arm's value as the comparison table writes it
    arm_runs: tuple[str, ...] = ()  # the runs each side is decided on (at its best LR when the LR was chosen)
    baseline_runs: tuple[str, ...] = ()
    arm_lr: BestLR | None = None  # the LR each side was taken at, when it was chosen per side
    baseline_lr: BestLR | None = None
    arm_stalled: tuple[int, int] = (0, 0)  # (stalled, runs) among arm_runs
    baseline_stalled: tuple[int, int] = (0, 0)
    stalled_runs: tuple[str, ...] = ()  # the stalled runs among arm_runs and baseline_runs


@dataclass
class ClaimSet:
    claims: list[Claim]
    results: list[ClaimResult]
    invalid: list[tuple[str, str]] = field(default_factory=list)  # (run id, one-line error) of unreadable claims
    conflicts: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (runs used, runs with the id)

    def of(self, claim_id: str) -> list[ClaimResult]:
        return [r for r in self.results if r.claim.id == claim_id]

    def verdict(self, claim_id: str) -> str:
        return claim_verdict([r.verdict for r in self.of(claim_id)])

    @property
    def table(self) -> pd.DataFrame:
        """claims.csv: one row per (claim, context)."""
        rows = []
        for r in self.results:
            c, e = r.claim, r.effect
            row: dict[str, Any] = {
                "claim_id": c.id, "source": c.source, "statement": c.statement, "axis": c.axis,
                "arm": override_text(c.arm), "baseline": override_text(c.baseline),
                "context_filter": ", ".join(f"{k}={override_text(v)}" for k, v in c.context), "metric": c.metric_name,
                "expect": c.expect, "margin": c.margin if c.margin is not None else math.nan,
                "at": "" if c.at is None else override_text(c.at), "context": r.context, "verdict": r.verdict,
                "claim_verdict": self.verdict(c.id), "null": c.null, "why": r.why,
            }  # fmt: skip
            for name in ("estimate", "low95", "high95", "low90", "high90", "p_value", "arm_value", "baseline_value"):
                row[name] = getattr(e, name) if e else math.nan
            for name in ("n_pairs", "n_arm", "n_baseline"):
                row[name] = getattr(e, name) if e else 0
            row.update(test=e.test if e else "", notes=" ".join(e.notes) if e else "",
                       arm_runs=" ".join(r.arm_runs), baseline_runs=" ".join(r.baseline_runs))  # fmt: skip
            for side, best in (("arm", r.arm_lr), ("baseline", r.baseline_lr)):
                row[f"{side}_lr"] = best.lr if best else math.nan
                row[f"{side}_lr_at_edge"] = bool(best and best.at_edge)
                row[f"{side}_lr_grid"] = " ".join(override_text(v) for v in best.grid) if best else ""
            for side, (k, n) in (("arm", r.arm_stalled), ("baseline", r.baseline_stalled)):
                row[f"{side}_stalled"], row[f"{side}_seeds"] = k, n
            for side, points in (("arm", e.arm_points if e else ()), ("baseline", e.baseline_points if e else ())):
                row[f"{side}_seed_values"] = " ".join(f"{override_text(seed)}:{v:.6g}" for _, seed, v in points)
            rows.append(row)
        return pd.DataFrame(rows)


# --- the verdict ----------------------------------------------------------------------------------------
def equivalence_bounds(claim: Claim) -> tuple[float, float]:
    """The interval an ``equal`` claim's effect must lie in: null ± margin, or [1/(1+δ), 1+δ] for a ratio."""
    margin = float(claim.margin or 0.0)
    if claim.spec.ratio:
        return 1.0 / (1.0 + margin), 1.0 + margin
    return -margin, margin


def verdict(effect: Effect | None, claim: Claim) -> str:
    """held / contradicted / inconclusive from the intervals (see the module docstring); untested without a value."""
    if effect is None or not math.isfinite(effect.estimate):
        return UNTESTED
    null = claim.null
    lo95, hi95, lo90, hi90 = effect.low95, effect.high95, effect.low90, effect.high90
    if claim.expect == LOWER:
        return HELD if hi95 < null else CONTRADICTED if lo95 > null else INCONCLUSIVE
    if claim.expect == HIGHER:
        return HELD if lo95 > null else CONTRADICTED if hi95 < null else INCONCLUSIVE
    if claim.expect in (WITHIN, WORSE):  # a basin's deciding point, r in % against the margin m (module docstring)
        m = float(claim.margin or 0.0)
        if claim.expect == WITHIN:
            return HELD if hi95 < m else CONTRADICTED if lo95 > m else INCONCLUSIVE
        return HELD if lo95 > m else CONTRADICTED if hi95 < m else INCONCLUSIVE
    if claim.expect == EQUAL:
        lo, hi = equivalence_bounds(claim)
        if lo < lo90 and hi90 < hi:
            return HELD
        if hi95 <= lo or lo95 >= hi:
            return CONTRADICTED
        return INCONCLUSIVE
    raise ValueError(f"unknown expect {claim.expect!r}")


def claim_verdict(verdicts: Sequence[str]) -> str:
    """A claim over its contexts: the verdict they share, else ``mixed``; untested contexts count only when no
    context was tested."""
    tested = [v for v in verdicts if v != UNTESTED]
    if not tested:
        return UNTESTED
    return tested[0] if len(set(tested)) == 1 else MIXED


# --- per-run values and their comparison ----------------------------------------------------------------
@dataclass
class Inputs:
    """What metrics share: the runs, and the scaling study (computed once, when a metric asks for it)."""

    rs: RunSet
    scaling: Any = None  # analysis.compute.scaling.ScalingStudy | None
    scaling_done: bool = False
    stalled: dict[str, bool] = field(default_factory=dict)  # run id -> a completed run that stalled

    def __post_init__(self) -> None:
        if M.STALLED in self.rs.runs.columns:
            self.stalled = {r: is_stalled(v) for r, v in zip(self.rs.runs["run_id"], self.rs.runs[M.STALLED])}

    def scaling_study(self) -> Any:
        if not self.scaling_done:
            from analysis.compute.scaling import scaling_study

            self.scaling, self.scaling_done = scaling_study(self.rs), True
        return self.scaling


@dataclass
class Selection:
    """The runs a claim compares in one context."""

    inputs: Inputs
    claim: Claim
    arm: list[str]  # run ids
    baseline: list[str]
    # each side's runs before it was narrowed to its best LR (at_best_lr): the tokens/s steadiness check looks
    # at all of them, since a run's speed does not depend on its LR but the machine's load does
    whole: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    @property
    def sides(self) -> tuple[Sequence[str], Sequence[str]]:
        """(arm, baseline) before the best-LR narrowing (the runs themselves where none was done)."""
        return self.whole or (self.arm, self.baseline)

    @property
    def rs(self) -> RunSet:
        return self.inputs.rs


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _values(
    sel: Selection, ids: list[str], value: Callable[[dict[str, Any]], float], statuses: Sequence[str] | None
) -> list[dict[str, Any]]:
    """{seed, value} of every run in ``ids`` with one of ``statuses`` (any when None) and a finite value."""
    table = sel.rs.runs.set_index("run_id", drop=False)
    out = []
    for r in ids:
        row = table.loc[r].to_dict()
        if statuses is not None and row.get(M.STATUS) not in statuses:
            continue
        v = value(row)
        if math.isfinite(v):
            out.append({"run_id": r, M.SEED: sel.rs.configs.get(r, {}).get(M.SEED, row.get(M.SEED)), VALUE: v})
    return out


def compare_values(
    arm: list[dict[str, Any]], base: list[dict[str, Any]], ratio: bool = False, notes: Sequence[str] = ()
) -> Effect | str:
    """The :class:`Effect` of per-run values (dicts with ``seed`` and ``value``), as the report compares final
    losses; a ratio metric is compared on logs (values <= 0 dropped) and reported back as a ratio."""
    if ratio:
        arm = [{**r, VALUE: math.log(r[VALUE])} for r in arm if r[VALUE] > 0]
        base = [{**r, VALUE: math.log(r[VALUE])} for r in base if r[VALUE] > 0]
    if not arm:
        return WHY_NO_ARM_VALUES
    if not base:
        return WHY_NO_BASELINE_VALUES
    r95 = compare_to_baseline(arm, base, VALUE, 0.95)
    r90 = compare_to_baseline(arm, base, VALUE, 0.90)
    back = math.exp if ratio else float
    arm_mean = float(np.mean([r[VALUE] for r in arm]))
    base_mean = float(np.mean([r[VALUE] for r in base]))

    def points(rows: list[dict[str, Any]]) -> tuple[tuple[str, Any, float], ...]:
        return tuple((str(r.get("run_id", "")), r.get(M.SEED), back(r[VALUE])) for r in rows)

    return Effect(
        estimate=back(r95["delta_final_val_loss"]),
        low95=back(r95["delta_ci_low"]),
        high95=back(r95["delta_ci_high"]),
        low90=back(r90["delta_ci_low"]),
        high90=back(r90["delta_ci_high"]),
        p_value=r95["p_value"],
        test=r95["test"],
        n_pairs=int(r95["n_pairs"]),
        n_arm=len(arm),
        n_baseline=len(base),
        arm_value=back(arm_mean),
        baseline_value=back(base_mean),
        notes=tuple(notes),
        arm_points=points(arm),
        baseline_points=points(base),
    )


def _per_run(
    value: Callable[[dict[str, Any]], float], statuses: Sequence[str] | None = (M.STATUS_COMPLETED,)
) -> Callable[[Selection], Effect | str]:
    """A metric whose per-run value is ``value(run row)``, compared over runs with ``statuses``."""

    def metric(sel: Selection) -> Effect | str:
        arm = _values(sel, sel.arm, value, statuses)
        base = _values(sel, sel.baseline, value, statuses)
        return compare_values(arm, base, sel.claim.spec.ratio)

    return metric


def _column(name: str) -> Callable[[dict[str, Any]], float]:
    return lambda row: _num(row.get(name))


def _extrapolation_column(rs: RunSet, k: float) -> str | None:
    for col in rs.runs.columns:
        m = EXTRAPOLATION_KEY.match(str(col))
        if m and float(m.group(1)) == k:
            return str(col)
    return None


def _at_k(sel: Selection) -> float:
    return float(sel.claim.at) if sel.claim.at is not None else 4.0


def val_loss_at_context(sel: Selection) -> Effect | str:
    col = _extrapolation_column(sel.rs, _at_k(sel))
    if col is None:
        return WHY_NO_ARM_VALUES
    return _per_run(_column(col))(sel)


def extrapolation_gap(sel: Selection) -> Effect | str:
    col = _extrapolation_column(sel.rs, _at_k(sel))
    if col is None:
        return WHY_NO_ARM_VALUES
    one = _extrapolation_column(sel.rs, 1.0) or M.FINAL_VAL_LOSS
    return _per_run(lambda row: _num(row.get(col)) - _num(row.get(one)))(sel)


def _spike_rate(count: str) -> Callable[[dict[str, Any]], float]:
    def rate(row: dict[str, Any]) -> float:
        steps = _num(row.get(M.STEPS))
        return 1000 * _num(row.get(count)) / steps if steps > 0 else math.nan

    return rate


def max_attn_logit(sel: Selection) -> Effect | str:
    def peak(row: dict[str, Any]) -> float:
        hist = sel.rs.history.get(row["run_id"])
        if hist is None or MAX_ATTN_LOGIT_ALL not in hist.columns:
            return math.nan
        values = hist[MAX_ATTN_LOGIT_ALL].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        return float(values.max()) if len(values) else math.nan

    return _per_run(peak, ENDED)(sel)


def _init_grad_growth(row: dict[str, Any]) -> float:
    """Gradient norm of the last block over the first at the first probe row."""
    layers = {}
    for key, value in row.items():
        if isinstance(key, str) and key.startswith(FIRST_PROBE_PREFIX) and key.endswith("/" + M.GRAD_NORM_LAYER):
            index = key[len(FIRST_PROBE_PREFIX) :].split("/")[1]
            if index.isdigit() and math.isfinite(_num(value)):
                layers[int(index)] = _num(value)
    if len(layers) < 2 or layers[min(layers)] <= 0:
        return math.nan
    return layers[max(layers)] / layers[min(layers)]


def tokens_per_sec(sel: Selection) -> Effect | str:
    effect = _per_run(_column(M.MEAN_TOKENS_PER_SEC))(sel)
    if isinstance(effect, Effect):
        # every run of each side, at every LR of its grid: the runs a side is decided on (its best LR's seeds)
        # can look steady while its other LRs' runs show the load changing under it (rmsnorm_vs_layernorm)
        spread = max(_speed_spread(sel.rs, ids) for ids in sel.sides)
        if spread > SPEED_SPREAD_LIMIT:
            effect = replace(effect, notes=(*effect.notes, NOTE_SPEED_UNSTEADY))
    return effect


def lr_sensitivity(sel: Selection) -> Effect | str:
    """E_lr[min(loss(lr), ln V) - loss*] per seed (each seed's own capped losses and its own best), then
    compared over seeds like a loss. compare.lr_sweep averages the capped losses over seeds first and then
    takes the best: its number (the LR table's) can differ slightly from the mean of the per-seed ones here.
    A seed that misses an LR of its arm's grid is left out (its sensitivity would be over another grid)."""
    notes: list[str] = []
    sides, grids = [], []
    for ids in (sel.arm, sel.baseline):
        rows = _values(sel, ids, capped_loss, ENDED)
        lrs = {r["run_id"]: _num(sel.rs.configs[r["run_id"]].get(LR_KEY)) for r in rows}
        grid = sorted(set(lrs.values()))
        by_seed: dict[Any, dict[float, float]] = {}
        for r in rows:
            by_seed.setdefault(r[M.SEED], {})[lrs[r["run_id"]]] = r[VALUE]
        values = []
        for seed, losses in by_seed.items():
            if sorted(losses) != grid:
                notes.append(NOTE_SEEDS_LEFT_OUT)
                continue
            capped = np.array(list(losses.values()))
            values.append({M.SEED: seed, VALUE: float((capped - capped.min()).mean())})
        sides.append(values)
        grids.append(grid)
    if grids[0] != grids[1]:
        notes.append(NOTE_GRIDS_DIFFER)
    return compare_values(sides[0], sides[1], notes=sorted(set(notes)))


def _lr_of(sel: Selection, run_id: str) -> float:
    return _num(sel.rs.configs[run_id].get(LR_KEY))


def widest(sel: Selection) -> Selection:
    """The runs of the widest model.d_model either side has (widest_val_loss_at_best_lr, lr_transfer: muP at its
    best LR at the widest width against SP at its own best there); each side's best LR is chosen after this."""
    width = {r: _num(sel.rs.configs[r].get("model.d_model")) for r in (*sel.arm, *sel.baseline)}
    top = max((w for w in width.values() if math.isfinite(w)), default=math.nan)
    arm = [r for r in sel.arm if width[r] == top]
    base = [r for r in sel.baseline if width[r] == top]
    return Selection(sel.inputs, sel.claim, arm, base)


def _best_lr_spread(losses: dict[Any, dict[float, dict[Any, float]]], seeds: np.ndarray) -> float:
    """max / min over widths of the LR whose mean capped loss over ``seeds`` (with repeats) is lowest."""
    best = []
    for grid in losses.values():
        means = {lr: np.mean([by_seed[s] for s in seeds if s in by_seed]) for lr, by_seed in grid.items()}
        means = {lr: m for lr, m in means.items() if np.isfinite(m)}
        if means:
            best.append(min(means, key=means.__getitem__))
    return max(best) / min(best) if len(best) > 1 else math.nan


def best_lr_spread(sel: Selection, n_boot: int = 2000) -> Effect | str:
    """max / min over model.d_model of each width's best LR (lowest mean capped loss over seeds; a diverged run
    is its step-0 loss, as LR sensitivity counts it), arm over baseline. Interval: percentile bootstrap over
    seeds, the same seed draws on both sides (paired), each resample's best LRs found anew."""
    sides = []
    for ids in (sel.arm, sel.baseline):
        rows = _values(sel, ids, capped_loss, ENDED)
        losses: dict[Any, dict[float, dict[Any, float]]] = {}
        for r in rows:
            width = sel.rs.configs[r["run_id"]].get("model.d_model")
            losses.setdefault(width, {}).setdefault(_lr_of(sel, r["run_id"]), {})[r[M.SEED]] = r[VALUE]
        sides.append(losses)
    if not sides[0]:
        return WHY_NO_ARM_VALUES
    if not sides[1]:
        return WHY_NO_BASELINE_VALUES
    seeds = np.array(sorted({s for side in sides for g in side.values() for v in g.values() for s in v}))
    arm, base = (_best_lr_spread(side, seeds) for side in sides)
    if not (math.isfinite(arm) and math.isfinite(base)):
        return WHY_NO_INTERVAL
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(n_boot):
        draw = rng.choice(seeds, size=len(seeds), replace=True)
        a, b = _best_lr_spread(sides[0], draw), _best_lr_spread(sides[1], draw)
        if math.isfinite(a) and math.isfinite(b):
            ratios.append(a / b)
    if len(seeds) < 2 or not ratios:
        return WHY_NO_INTERVAL
    low95, high95, low90, high90 = np.quantile(ratios, [0.025, 0.975, 0.05, 0.95])
    n = len(seeds)
    return Effect(arm / base, low95, high95, low90, high90, math.nan, "bootstrap", n, n, n, arm, base)


def final_val_bpb(sel: Selection) -> Effect | str:
    """Val bits per byte per completed run; a side whose completed runs have none predates it (WHY_NO_BPB)."""
    effect = _per_run(_column(M.FINAL_VAL_BPB))(sel)
    if effect in (WHY_NO_ARM_VALUES, WHY_NO_BASELINE_VALUES):
        ids = sel.arm if effect == WHY_NO_ARM_VALUES else sel.baseline
        if _values(sel, ids, lambda row: 0.0, (M.STATUS_COMPLETED,)):  # completed, yet without val/bpb
            return WHY_NO_BPB
    return effect


def downstream(sel: Selection) -> Effect | str:
    """The claim's ``downstream/<task>/<kind>`` (its ``task`` and ``kind``; the last evaluation, summary.json) of
    each completed run, compared as final_val_loss is: arm - baseline, paired by seed."""
    return _per_run(_column(M.downstream(str(sel.claim.task), str(sel.claim.kind))))(sel)


def compute_multiplier(sel: Selection) -> Effect | str:
    """CM of the arm's scaling fit against the scaling study's baseline fit (analysis/compute/scaling.py), at the
    claim's ``at`` ("largest", "10x", "100x"; default largest); its interval is the study's bootstrap (95% only)."""
    study = sel.inputs.scaling_study()
    if study is None:
        return WHY_NO_SCALING
    fitted = {a.arm: {r for rung in a.rungs for r in rung.run_ids} for a in study.arms}

    def fit_of(ids: list[str]) -> str | None:
        overlap = {name: len(runs & set(ids)) for name, runs in fitted.items()}
        best = max(overlap, key=overlap.__getitem__, default=None)
        return best if best is not None and overlap[best] else None

    arm, base = fit_of(sel.arm), fit_of(sel.baseline)
    if arm is None:
        return WHY_NO_ARM_VALUES
    if base != study.baseline:
        return WHY_NOT_SCALING_BASELINE
    at = "largest" if sel.claim.at is None else str(sel.claim.at)
    m = next((m for m in study.multipliers if m.arm == arm and m.at == at), None)
    if m is None:
        return WHY_NO_MULTIPLIER
    rungs = {a.arm: len(a.rungs) for a in study.arms}
    nan = math.nan
    # a fit that cannot predict a rung it did not see (held-out error above the goal) extrapolates nothing: the
    # multiplier is shown, but decides no claim (a fit without a check, too few rungs, is noted as unvalidated)
    from analysis.compute.scaling import HELD_OUT_GOAL, W_ALLOCATION_EDGE  # loaded only where a claim needs it

    off_goal = any(study.held_out_error(a) > HELD_OUT_GOAL for a in (arm, base))
    # the fit window's sensitivity check (ladder.fit_budgets left budgets out): the same form on every budget
    every = study.every_budget
    em = None if every is None else next((x for x in every.multipliers if x.arm == arm and x.at == at), None)
    window = em is not None and _decides(m, off_goal, sel.claim) != _decides(
        em, any(every.held_out_error(a) > HELD_OUT_GOAL for a in (arm, base)), sel.claim
    )
    # an L(N, D) curve is the best allocation within the tokens per parameter its runs trained; where the
    # unconstrained optimum lies outside that band the curve follows the band's edge (noted, not a downgrade: the
    # comparison then rests on allocations the ladder trained, where the frontier would not)
    edge = any(w.code == W_ALLOCATION_EDGE and w.arm in (arm, base) for w in study.warnings)
    flags = ((NOTE_BEYOND_VALIDATED, m.beyond_validated), (NOTE_CELL_BEST_LR, study.lr_selected or bool(study.tuned)),
             (NOTE_FIT_OFF_GOAL, off_goal), (NOTE_ALLOCATION_EDGE, edge), (NOTE_FIT_WINDOW, window))  # fmt: skip
    notes = tuple(note for note, on in flags if on)
    return Effect(m.cm, m.low, m.high, nan, nan, nan, "bootstrap", 0, rungs[arm], rungs[base], nan, nan, notes)


def _decides(m: Any, off_goal: bool, claim: Claim) -> str:
    """The verdict a compute multiplier ``m`` gives ``claim`` by the rule every claim follows (:func:`verdict`:
    its 95% interval against the claim's null and margin); inconclusive where its fit missed the held-out goal."""
    if off_goal:
        return INCONCLUSIVE
    nan = math.nan
    return verdict(Effect(m.cm, m.low, m.high, nan, nan, nan, "bootstrap", 0, 0, 0, nan, nan), claim)


METRIC_FUNCTIONS: dict[str, Callable[[Selection], Effect | str]] = {
    "final_val_loss": _per_run(_column(M.FINAL_VAL_LOSS)),
    "best_val_loss": _per_run(_column(M.BEST_VAL_LOSS)),
    "capped_val_loss": _per_run(capped_loss, ENDED),
    "val_loss_at_context": val_loss_at_context,
    "extrapolation_gap": extrapolation_gap,
    "grad_norm_spike_rate": _per_run(_spike_rate(M.GRAD_NORM_SPIKES), ENDED),
    "loss_spike_rate": _per_run(_spike_rate(M.LOSS_SPIKES), ENDED),
    "tokens_per_sec": tokens_per_sec,
    "max_attn_logit": max_attn_logit,
    "init_grad_growth": _per_run(_init_grad_growth, None),
    "lr_sensitivity": lr_sensitivity,
    # each side's best LR is chosen before the metric is computed (MetricSpec.at_best_lr; _evaluate)
    "final_val_loss_at_best_lr": _per_run(_column(M.FINAL_VAL_LOSS)),
    "best_lr_spread": best_lr_spread,
    "widest_val_loss_at_best_lr": _per_run(_column(M.FINAL_VAL_LOSS)),
    "compute_multiplier": compute_multiplier,
    "final_val_bpb": final_val_bpb,
    "relative_val_loss": lambda sel: basin_effect(sel)[0],  # basin claims (module docstring; _evaluate_basin)
    "relative_val_bpb": lambda sel: basin_effect(sel)[0],
    "downstream": downstream,
}


def fitted_runs(sel: Selection) -> Selection:
    """A compute-multiplier claim's sides narrowed to the runs the scaling study fitted (each (arm, rung, budget)
    cell's runs at its best LR under ladder.lr=grid), so its stalled seeds are counted where it is decided."""
    study = sel.inputs.scaling_study()
    if study is None:
        return sel
    used = {r for a in study.arms for rung in a.rungs for r in rung.run_ids}
    return Selection(sel.inputs, sel.claim, [r for r in sel.arm if r in used], [r for r in sel.baseline if r in used])


# notes that make a held or contradicted effect inconclusive, and the reason given
DOWNGRADES = {
    NOTE_SPEED_UNSTEADY: WHY_SPEED_UNSTEADY,  # the machine's load, not the arm, may set the ratio
    NOTE_FIT_OFF_GOAL: WHY_FIT_OFF_GOAL,  # the fit missed its held-out rung by more than the goal
}


# runs a metric looks at before each side's best LR is chosen (the rest of a side's runs in the context)
NARROW: dict[str, Callable[[Selection], Selection]] = {
    "widest_val_loss_at_best_lr": widest,
    "compute_multiplier": fitted_runs,
}


# --- claims of a run set, and their evaluation ----------------------------------------------------------
def claims_of(rs: RunSet) -> tuple[list[Claim], list[tuple[str, str]], dict[str, tuple[int, int]]]:
    """(claims, invalid, conflicts) read from the runs' configs (``claims``, flattened to JSON by the loader).
    A claim id defined differently in different runs (a study file edited between runs) takes the definition
    most runs hold: conflicts[id] = (runs holding it, runs holding the id)."""
    defs: dict[str, dict[str, list[str]]] = {}  # id -> definition (JSON) -> runs
    order: dict[str, Claim] = {}
    invalid: list[tuple[str, str]] = []
    for run_id, cfg in rs.configs.items():
        raw = cfg.get("claims")
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                continue  # MISSING_VALUE: a run recorded before claims existed
        if not raw:
            continue
        try:
            parsed = parse_claims(raw)
        except ConfigError as err:
            invalid.append((run_id, str(err)))
            continue
        for claim in parsed:
            text = json.dumps(claim.as_dict(), sort_keys=True, default=str)
            defs.setdefault(claim.id, {}).setdefault(text, []).append(run_id)
            order.setdefault(claim.id, claim)
    claims, conflicts = [], {}
    for cid, first in order.items():
        variants = defs[cid]
        text, runs = max(variants.items(), key=lambda kv: len(kv[1]))
        if len(variants) > 1:
            conflicts[cid] = (len(runs), sum(len(v) for v in variants.values()))
        claims.append(first if json.dumps(first.as_dict(), sort_keys=True, default=str) == text
                      else parse_claims([json.loads(text)])[0])  # fmt: skip
    return claims, invalid, conflicts


def evaluate_claims(rs: RunSet, claims: Sequence[Claim] | None = None, scaling: Any = None) -> ClaimSet:
    """Every claim (default: those in the runs' configs) in every context it applies to. ``scaling``: the
    report's scaling study, if it computed one (else computed here when a claim needs it)."""
    invalid: list[tuple[str, str]] = []
    conflicts: dict[str, tuple[int, int]] = {}
    if claims is None:
        claims, invalid, conflicts = claims_of(rs)
    if not claims:
        return ClaimSet([], [], invalid, conflicts)
    inputs = Inputs(rs, scaling, scaling is not None)
    axes, _, _, _ = find_axes(rs) if rs.configs else ([], {}, {}, {})
    results = [r for claim in claims for r in _evaluate(inputs, claim, axes)]
    return ClaimSet(list(claims), results, invalid, conflicts)


def _evaluate(inputs: Inputs, claim: Claim, axes: list[Axis]) -> list[ClaimResult]:
    rs = inputs.rs
    known = rs.config_keys
    key = resolve_key(claim.axis, known)
    if key is None:
        return [ClaimResult(claim, ALL_RUNS, UNTESTED, None, WHY_UNKNOWN_KEY)]
    axis = next((a for a in axes if key in a.keys), None)
    if axis is None:
        return [ClaimResult(claim, ALL_RUNS, UNTESTED, None, WHY_NOT_VARIED)]
    pooled = set(claim.spec.pools)
    if claim.metric == "compute_multiplier" and inputs.scaling_study() is not None:
        # the rung's keys and the keys each cell is tuned over (ladder.tune) are inside the multiplier
        pooled |= set(inputs.scaling_study().size_keys) | set(inputs.scaling_study().tuned)
    filters = []
    for ckey, cvalue in claim.context:
        resolved = resolve_key(ckey, known)
        if resolved is None:
            return [ClaimResult(claim, ALL_RUNS, UNTESTED, None, WHY_UNKNOWN_KEY, axis.label)]
        filters.append((resolved, cvalue))
    tune = tunes_lr(claim, [k for k, _ in filters])
    if tune:
        pooled |= {LR_KEY, LR_MULT_KEY}
    others = [a for a in axes if not set(a.keys) & set(axis.keys) and not set(a.keys) & pooled]
    members = [r for r, cfg in rs.configs.items() if all(same_value(v, cfg.get(k)) for k, v in filters)]
    if not members:
        return [ClaimResult(claim, ALL_RUNS, UNTESTED, None, WHY_NO_CONTEXT, axis.label)]
    if claim.spec.basin:
        return _evaluate_basin(inputs, claim, axis, members, others)
    groups: dict[str, tuple[tuple[Any, ...], list[str], list[str]]] = {}
    for r in members:
        cfg = rs.configs[r]
        label = ", ".join(f"{a.label}={override_text(cfg[a.name])}" for a in others) or ALL_RUNS  # as compare.py
        order = tuple(value_order(cfg[a.name]) for a in others)
        _, arm, base = groups.setdefault(label, (order, [], []))
        if same_value(claim.arm, cfg.get(key)):
            arm.append(r)
        elif same_value(claim.baseline, cfg.get(key)):
            base.append(r)
    out = []
    for label, (_, arm, base) in sorted(groups.items(), key=lambda kv: kv[1][0]):
        if not arm and not base:
            continue  # a context holding neither (another arm of a many-valued axis)
        arm_label = override_text(rs.configs[arm[0]][axis.name]) if arm else override_text(claim.arm)
        if not arm or not base:
            common = dict(axis=axis.label, arm_label=arm_label, arm_runs=tuple(arm), baseline_runs=tuple(base))
            out.append(ClaimResult(claim, label, UNTESTED, None, WHY_NO_ARM if not arm else WHY_NO_BASELINE, **common))
            continue
        if claim.metric in PER_TOKEN_METRICS:  # one line, naming final_val_bpb (lm_ablate/claim_spec.py)
            mixed = tokenizers_differ(rs.configs[r] for r in (*arm, *base))
            if mixed:
                raise AnalysisError(f"claims[{claim.id}].metric={claim.metric!r} is refused: "
                                    + per_token_refusal(claim.metric, f"its arms ({mixed})"))  # fmt: skip
        sel = Selection(inputs, claim, arm, base)
        sel = NARROW.get(claim.metric, lambda x: x)(sel)
        best: tuple[BestLR | None, BestLR | None] = (None, None)
        if tune:
            sel, best = at_best_lr(sel)
        stalled = tuple((sum(inputs.stalled.get(r, False) for r in ids), len(ids)) for ids in (sel.arm, sel.baseline))
        stalled_runs = tuple(r for r in (*sel.arm, *sel.baseline) if inputs.stalled.get(r, False))
        common = dict(axis=axis.label, arm_label=arm_label, arm_runs=tuple(sel.arm), baseline_runs=tuple(sel.baseline),
                      arm_lr=best[0], baseline_lr=best[1], arm_stalled=stalled[0], baseline_stalled=stalled[1],
                      stalled_runs=stalled_runs)  # fmt: skip
        effect = METRIC_FUNCTIONS[claim.metric](sel)
        if isinstance(effect, str):
            out.append(ClaimResult(claim, label, UNTESTED, None, effect, **common))
            continue
        decided = verdict(effect, claim)
        why = WHY_NO_INTERVAL if decided == INCONCLUSIVE and not math.isfinite(effect.low95) else ""
        if decided != UNTESTED and not claim.stalls_are_data and (stalled[0][0] or stalled[1][0]):
            decided, why = INCONCLUSIVE, WHY_STALLED  # stalled seeds are no data points of an effect
        for note, reason in DOWNGRADES.items():
            if decided in (HELD, CONTRADICTED) and note in effect.notes:
                decided, why = INCONCLUSIVE, reason
        out.append(ClaimResult(claim, label, decided, effect, why, **common))
    return out or [ClaimResult(claim, ALL_RUNS, UNTESTED, None, WHY_NO_CONTEXT, axis.label)]


def tunes_lr(claim: Claim, pinned: Sequence[str]) -> bool:
    """Is each side of ``claim`` taken at its own best LR? Yes for a metric that does so by definition
    (``MetricSpec.at_best_lr``); no for one that pools the LR itself (LR sensitivity, best-LR spread, compute
    multiplier) or when the claim's context pins the LR (``pinned``: its resolved context keys); else yes (a
    side whose runs share one LR is then simply taken at it)."""
    if claim.spec.at_best_lr:
        return True
    if LR_KEY in claim.spec.pools:
        return False
    return not ({LR_KEY, LR_MULT_KEY} & set(pinned))


def at_best_lr(sel: Selection) -> tuple[Selection, tuple[BestLR | None, BestLR | None]]:
    """Each side narrowed to its runs at its own best LR (:func:`analysis.compute.best_lr.best_lr_of`), and the
    choices; a side whose runs share one LR keeps them all (no choice recorded)."""
    chosen: list[BestLR | None] = []
    narrowed: list[list[str]] = []
    for ids in (sel.arm, sel.baseline):
        best = best_lr_of(sel.rs, ids) if ids else None
        if best is None or len(best.grid) < 2:
            chosen.append(None)
            narrowed.append(list(ids))
        else:
            chosen.append(best)
            narrowed.append(list(best.run_ids))
    whole = (tuple(sel.arm), tuple(sel.baseline))
    return Selection(sel.inputs, sel.claim, narrowed[0], narrowed[1], whole), (chosen[0], chosen[1])


# --- what the report shows beside the claims ------------------------------------------------------------
def annotate_comparisons(table: pd.DataFrame, claims: ClaimSet) -> pd.DataFrame:
    """comparisons.csv with two more columns on the rows a claim used (the arm's row in its context):
    ``claims`` (ids) and ``claim_verdicts`` (``id:verdict``), space-separated."""
    out = table.copy()
    ids = [""] * len(out)
    verdicts = [""] * len(out)
    if len(out):
        where = {(a, c, arm): i for i, (a, c, arm) in enumerate(zip(out["axis"], out["context"], out["arm"]))}
        members = [(a, set(str(runs).split())) for a, runs in zip(out["axis"], out.get("run_ids", [""] * len(out)))]
        for r in claims.results:
            i = where.get((r.axis, r.context, r.arm_label))
            if i is None and r.arm_runs:  # decided at its best LR: the row holding the runs it used
                i = next((j for j, (a, runs) in enumerate(members) if a == r.axis and set(r.arm_runs) <= runs), None)
            if i is not None and r.verdict != UNTESTED:
                ids[i] = f"{ids[i]} {r.claim.id}".strip()
                verdicts[i] = f"{verdicts[i]} {r.claim.id}:{r.verdict}".strip()
    out["claims"], out["claim_verdicts"] = ids, verdicts
    return out


def largest_effects(cs: ComparisonSet, limit: int = 3) -> pd.DataFrame:
    """Comparison rows whose final-val-loss difference has a 95% interval excluding 0, largest |Δ| first; rows
    where the arm or its baseline (same axis and context) has stalled seeds are left out (stalled runs are no
    data points of an effect; the comparison tables still show and mark them)."""
    table = cs.table
    if table.empty or "delta_final_val_loss" not in table:
        return table
    d, lo, hi = (
        pd.to_numeric(table[c], errors="coerce") for c in ("delta_final_val_loss", "delta_ci_low", "delta_ci_high")
    )
    stalled = pd.to_numeric(table.get("n_stalled", pd.Series(0, index=table.index)), errors="coerce").fillna(0) > 0
    cell = list(zip(table["axis"], table["context"]))
    base_stalled = {c for c, b, s in zip(cell, table["is_baseline"].astype(bool), stalled) if b and s}
    stalled |= pd.Series([c in base_stalled for c in cell], index=table.index)
    keep = ~table["is_baseline"].astype(bool) & np.isfinite(d) & ((lo > 0) | (hi < 0)) & ~stalled
    return (
        table[keep].assign(_size=d[keep].abs()).sort_values("_size", ascending=False).drop(columns="_size").head(limit)
    )


def _speeds(rs: RunSet) -> dict[str, float]:
    """run id -> mean tokens/s of each completed run with a positive value."""
    status = rs.runs[M.STATUS].to_numpy()
    tps = pd.to_numeric(rs.runs[M.MEAN_TOKENS_PER_SEC], errors="coerce").to_numpy(dtype=float)
    return {
        r: float(v) for r, s, v in zip(rs.runs["run_id"], status, tps) if s == M.STATUS_COMPLETED and v > 0
    }  # NaN > 0 is False


def _speed_spread(rs: RunSet, ids: Sequence[str], speeds: dict[str, float] | None = None) -> float:
    speeds = _speeds(rs) if speeds is None else speeds
    tps = [speeds[r] for r in ids if r in speeds]
    return max(tps) / min(tps) if len(tps) > 1 else 1.0


def unsteady_speed(rs: RunSet, cs: ComparisonSet, limit: float = SPEED_SPREAD_LIMIT) -> list[dict[str, Any]]:
    """Arms (runs sharing every varied axis value: they differ only by seed) whose completed runs' mean tokens/s
    differ by more than ``limit`` (max / min): the machine was shared, so speed ratios there are not to be
    trusted. One dict per such arm: ``arm`` (label), ``spread``, ``low``, ``high``, ``n``."""
    cells: dict[str, list[str]] = {}
    for r, cfg in rs.configs.items():
        label = ", ".join(f"{a.label}={override_text(cfg[a.name])}" for a in cs.varied) or ALL_RUNS
        cells.setdefault(label, []).append(r)
    speeds = _speeds(rs)
    out = []
    for label, ids in cells.items():
        tps = [speeds[r] for r in ids if r in speeds]
        if len(tps) > 1 and max(tps) / min(tps) > limit:
            out.append({"arm": label, "spread": max(tps) / min(tps), "low": min(tps), "high": max(tps), "n": len(tps)})
    return out


# --- basin claims (module docstring) ----------------------------------------------------------------------
BASIN_METRIC = {"relative_val_loss": M.FINAL_VAL_LOSS, "relative_val_bpb": M.FINAL_VAL_BPB}


def _point_effect(p: Any, best: Any) -> Effect:
    """A basin point as an :class:`Effect`: r(x) in % and its intervals; the best point is 0 with [0, 0]."""
    if p.is_best:
        return Effect(0.0, 0.0, 0.0, 0.0, 0.0, math.nan, "", 0, p.n, p.n, p.mean, p.mean, (), p.values, p.values)
    return Effect(p.relative, p.low, p.high, p.low90, p.high90, math.nan, p.test, p.n_pairs, p.n, best.n, p.mean,
                  best.mean, (), p.values, best.values)  # fmt: skip


def basin_effect(sel: Selection, label: str = ALL_RUNS) -> tuple[Effect | str, Any, list[Any], Any]:
    """(the deciding point's effect or a WHY_* code, the basin, the points in ``over``, the deciding point) of a
    basin claim over the runs of ``sel`` (arm and baseline together: one context's runs at every axis value)."""
    from analysis.compute.basin import basin_of  # one floor up from compare, as best_lr
    from lm_ablate.claim_spec import in_over

    claim = sel.claim
    key = resolve_key(claim.axis, sel.rs.config_keys) or claim.axis
    ids = [*sel.arm, *sel.baseline]
    metric = BASIN_METRIC[claim.metric]
    if metric == M.FINAL_VAL_LOSS:
        mixed = tokenizers_differ(sel.rs.configs[r] for r in ids)
        if mixed:
            raise AnalysisError(f"claims[{claim.id}].metric={claim.metric!r} is refused: "
                                + per_token_refusal(claim.metric, f"the values of {claim.axis} ({mixed})"))  # fmt: skip
    b = basin_of(sel.rs, key, ids, label, metric=metric)
    best = b.best
    assert claim.over is not None
    inside = [p for p in b.points if in_over(claim.over, p.x)]
    if best is None:
        return WHY_NO_BASELINE_VALUES, b, inside, None
    if not inside:
        return WHY_NO_ARM, b, inside, None
    effects = {p.x: _point_effect(p, best) for p in inside}
    m = float(claim.margin or 0.0)
    inf = math.inf
    up = lambda v: v if math.isfinite(v) else inf  # no interval: nearest to failing
    down = lambda v: v if math.isfinite(v) else -inf
    if claim.expect == WITHIN:
        against = [p for p in inside if effects[p.x].low95 > m]
        pick = max(against or inside, key=lambda p: down(effects[p.x].low95) if against else up(effects[p.x].high95))
    else:
        against = [p for p in inside if effects[p.x].high95 < m]
        pick = min(against or inside, key=lambda p: up(effects[p.x].high95) if against else down(effects[p.x].low95))
    at_edge = any(p.lr.at_edge for p in (*inside, best))
    effect = replace(effects[pick.x], notes=(NOTE_LR_AT_EDGE,) if at_edge else ())
    return effect, b, inside, pick


def _evaluate_basin(
    inputs: Inputs, claim: Claim, axis: Axis, members: list[str], others: list[Axis]
) -> list[ClaimResult]:  # fmt: skip
    """A basin claim in each context of the ``others`` axes (module docstring: the table)."""
    from analysis.compute.basin import contexts

    out = []
    for label, ids in contexts(inputs.rs, members, others):
        sel = Selection(inputs, claim, ids, [])
        effect, basin, inside, pick = basin_effect(sel, label)
        low, high = claim.over or (None, None)
        ends = ("-inf" if low is None else override_text(low), "inf" if high is None else override_text(high))
        arm_label = f"[{ends[0]}, {ends[1]}]"
        if isinstance(effect, str):
            out.append(ClaimResult(claim, label, UNTESTED, None, effect, axis.label, arm_label,
                                   tuple(r for p in inside for r in p.runs)))  # fmt: skip
            continue
        best = basin.best
        decided = verdict(effect, claim)
        rests_on = [p for p in (inside if decided != CONTRADICTED else [pick]) if not p.is_best]
        arm_stalled = (sum(p.stalled[0] for p in rests_on), sum(p.stalled[1] for p in rests_on))
        stalled = (arm_stalled, best.stalled)
        why = WHY_NO_INTERVAL if decided == INCONCLUSIVE and not math.isfinite(effect.low95) else ""
        if decided != UNTESTED and not claim.stalls_are_data and (stalled[0][0] or stalled[1][0]):
            decided, why = INCONCLUSIVE, WHY_STALLED
        runs = tuple(r for p in inside for r in p.runs)
        out.append(ClaimResult(
            claim, label, decided, effect, why, axis.label, arm_label, runs, best.runs, pick.lr, best.lr,
            stalled[0], stalled[1], tuple(r for r in (*runs, *best.runs) if inputs.stalled.get(r, False)),
        ))  # fmt: skip
    return out or [ClaimResult(claim, ALL_RUNS, UNTESTED, None, WHY_NO_CONTEXT, axis.label)]
