"""Scaling fits (per arm and joint across arms), compute multipliers against the baseline, held-out checks, the
single-rung ranking and two-step task prediction: numbers only.

A study that trains every arm at several model sizes (the rungs of a ladder) asks whether a difference between
arms survives scale. This module turns the runs of such a study into fits, intervals and warning codes; the
report's Scaling section (analysis/present/sections/scaling.py) turns them into words and figures.

=====================  ========================================================  ==============================
quantity               definition                                                source
=====================  ========================================================  ==============================
compute of a run       C = FLOPs/token × tokens; FLOPs/token = 6N + 12·L·H·d·T   PaLM (Chowdhery et al. 2022),
                       (summary.json ``flops_per_token`` and ``tokens``)         appendix B
loss curve of an arm   L(C) = E + A·C^(−α)                                       Hoffmann et al. 2022, eq. 2
                                                                                 written in compute
fit                    min Σ_runs Huber_δ(log L̂(C_i) − log L_i), δ = 1e-3,        Hoffmann et al. 2022,
                       bounded parameters, best of a grid of starting points     approach 3 (appendix D.2)
compute multiplier     CM(C) = L_base⁻¹(L_X(C)) / C: the compute the baseline     ("compute-equivalent gain");
                       needs to reach the loss X reaches with C; CM > 1: X is    DESIGN.md
                       better; +inf when L_X(C) ≤ E_base (never reached)
interval               95% percentile bootstrap: seeds resampled within each     Efron & Tibshirani 1993;
                       rung (modified residuals), every resample refitted        Davison & Hinkley 1997
held-out error         |L̂₋(C_top) − L̄_top| / L̄_top, L̂₋ fitted without the arm's  Bhagia et al. 2024 (OLMo
                       largest rung, L̄_top that rung's mean loss over seeds      ladder), section 3
joint forms            shared E (and α); L(N, D) = E + A/N^a + B/D^b with       Hoffmann et al. 2022; OLMo-core
                       several budgets per rung; compute-optimal frontier        ladder analysis (fixed E);
                       within the trained tokens per parameter                   Hoffmann et al. eq. 4
                       (analysis/compute/scaling_forms.py)                       Besiroglu et al. 2024
single-rung ranking    mean loss of arm − baseline per (rung, budget), paired    DataDecide (Magnusson et al.
                       t (Welch when the seeds differ)                           2025)
task prediction        compute → task BPB (per arm) → accuracy (one sigmoid)     Bhagia et al. 2024
                       (analysis/compute/task_scaling.py)
=====================  ========================================================  ==============================

Forms and the one the claims use. Every form of scaling_forms.FORMS is fitted to all arms at once (per_arm,
shared_e, shared_e_alpha; with several budgets per rung also nd_per_arm, nd_shared_e, nd_shared_exponents), each
with its bootstrap, its largest-rung check (every arm's largest rung left out at once) and, with three budgets or
more, a leave-one-budget-out check. ``ladder.fit`` (recorded in every run) names the form ``multipliers`` (and so
the claims) come from; ``auto`` takes shared_e (nd_shared_e with several budgets) when the arms were trained on
the same data with the same tokenizer (every ``data.*`` key and the vocabulary agree), each arm its own fit
otherwise, and keeps it unless its held-out score (the worst relative error over arms and checks) is above
HELD_OUT_GOAL while another form's is within it (scaling_forms.choose). A form named by hand that cannot be
fitted here is one line: L(N, D) without several budgets, a shared form across arms on different data, fewer
(arm, rung, budget) points than parameters. Each arm needs MIN_RUNGS_TO_FIT rungs in every form.

Budgets (``ladder.budgets``, WSD-S branches: lm_ablate/budgets.py): a cell is (arm, rung, budget), the budget
``ladder.budget`` of the record (else the largest of ``ladder.budgets``, else 1). N is the parameter count
``ladder.params`` names (non-embedding unless total), D the run's tokens. The branches of a rung share its seeds,
so the bootstrap draws the same seeds for every budget of a rung. ``ladder.fit_budgets`` (or the report's
``--fit-budgets``, which refits recorded runs) names the budgets whose cells the fits use, e.g. only those past an
early plateau (docs/ladders.md); the other cells stay in the rung table and the single-rung ranking, in no fit.

Also: a cell whose runs (at its chosen LR) include a stalled one (the runs table's ``stalled``: lm_ablate/stall.py
on each run's curve; on the unigram plateau or flat) is left out of every fit and warned about: a run that has not
left the plateau is outside the power-law regime (its loss is set by the optimizer's transient, not by N and D;
the CPU ladder's smallest rung at its smallest budget, 40 steps, is one), and keeping it would bend the fit. It is
a whole cell that is left out, never a seed (dropping a cell's worst seeds would bias its mean); the cell stays in
the rung table and in the single-rung ranking, undecided there. Every cell that departs from the chosen fit by
more than HELD_OUT_GOAL is warned about, and the single-rung ranking is computed at every (rung, budget).

Which runs enter a fit. The size dimension is ``ladder.rung`` when the configs have it; otherwise model size,
when the non-embedding parameter count differs between the values of a varied ``model.*`` shape axis
(``--multirun model=tiny,small,medium``). Arms are the combinations of the other varied keys, leaving out the
seed, the ``ladder.*`` keys, the keys a rung sets (SIZE_KEYS) and any key that takes one value per rung. When
``optim.lr`` varies within an (arm, rung), that cell's runs at the LR with the lowest mean final loss over
seeds are used (``RungData.lr``; seed-adjusted where its LRs ran different seeds, the LR table's rule:
:func:`analysis.compute.compare.selection_means`). Keys the runs name in ``ladder.tune`` (μP's base multipliers, where one value
tuned at rung 0 does not transfer along the ladder) are tuned the same way: they are no arm, and each cell is
represented by its runs at the setting (those keys and the LR) with the lowest mean final loss
(``RungData.setting``). Only completed runs with a finite loss and compute are fitted; the others
become warnings.

The fit. Every selected run is a point (a seed is a point, as in Hoffmann et al.). Compute is divided by a
reference C_ref (the geometric mean of the arm's compute) while fitting so the three parameters (E, log A',
α) have similar scales; A = A'·C_ref^α is reported in FLOPs. Bounds: 0 ≤ E ≤ max L, 1e-6·max L ≤ A' ≤
1e3·max L, 1e-3 ≤ α ≤ 3. The minimiser is Levenberg–Marquardt on the Huber loss by iteratively reweighted
least squares, projected onto the box, run on every bootstrap resample × starting point at once (one array
of problems): an arm's 1000 resamples × 5 starts take about a second, where one scipy ``least_squares`` call
per problem would take about a minute; tests/test_scaling.py checks it against scipy's
``least_squares(loss="huber", f_scale=δ, bounds=...)``. The point fit starts from a 4 × 3 grid of (E, α).

Bootstrap. Per rung, the runs of an (arm, rung) cell are sorted by seed and drawn with replacement, n from
n. The draws are shared between arms (one uniform array per rung), so two arms that ran the same seeds at a
rung are resampled by the same seeds: a compute multiplier's interval then keeps the seed-to-seed noise the
arms share out of it, as a paired test does. A rung with one seed contributes no seed noise. Drawing n of n
values has √((n−1)/n) of their spread (0.82 with 3 seeds), so each cell's log losses are first moved away from
the cell mean by √(n/(n−1)) (Davison & Hinkley 1997, §6.2.3: modified residuals, leverage 1/n): on synthetic
5-rung × 3-seed ladders this took the coverage of the multiplier's 95% interval from 80–87% to 85–95% (60
simulated studies each; E, A, α: 87–97% before, 95–97% after).

Compute multiplier, written so that identical fits give exactly 1:
log CM(C) = [(α_X − α_b)·log C − (log A_X − log A_b) − log1p((E_X − E_b)·C^(α_X)/A_X)] / α_b.
"""

from __future__ import annotations

import json
import math
import warnings as py_warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.compute import scaling_forms as SF
from analysis.compute.compare import LR_KEY, Axis, find_axes, is_candidate, parse_baseline, selection_means
from analysis.compute.scaling_forms import FORMS, FormFit, Prediction, lm_huber
from analysis.compute.stats import paired, welch
from analysis.compute.task_scaling import task_study
from analysis.sources.load import MISSING_VALUE, AnalysisError, RunSet
from analysis.sources.values import launch_order, matches_text, override_text, value_order
from lm_ablate import metrics as M
from lm_ablate.validation import FIT_FORMS

RUNG_KEY = "ladder.rung"
LADDER_PREFIX = "ladder."
# the keys a rung sets (the lead's ladder applies the shape and sets the token budget from the parameters)
SIZE_KEYS = frozenset({"model.d_model", "model.n_layers", "model.n_heads", "train.max_tokens", "train.max_steps"})
SHAPE_KEYS = frozenset({"model.name", "model.d_model", "model.n_layers", "model.n_heads"})  # no-ladder sizes
NO_ARM = "all runs"  # the arm label when no other key varies

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, appendix D.2
CONFIDENCE = 0.95
N_BOOT = 1000
MIN_RUNGS_TO_FIT = 3  # three parameters
MIN_RUNGS = 4  # fewer: a warning (and with one budget per rung no held-out check: it needs three cells left)
HELD_OUT_GOAL = 0.02  # relative error the shipped CPU ladders aim for (issue 13)
EXTRAPOLATE = (10.0, 100.0)  # multipliers are reported at these multiples of the largest rung's compute
MAX_ITER = 500
FTOL = 1e-13  # relative objective decrease below which a problem counts as converged
CURVE_POINTS = 80

# Box for (E, log A', alpha), A' = the excess loss at C_ref; bounds on E and A' scale with max loss.
ALPHA_BOUNDS = (1e-3, 3.0)
A_RANGE = (1e-6, 1e3)
START_E = (0.0, 0.5, 0.8, 0.95)  # × min loss
START_ALPHA = (0.1, 0.3, 0.8)
PARAMS = ("E", "A", "alpha")

# --- warning codes (ScalingWarning.code); the report words them -------------------------------------------
W_NOT_COMPLETED = "not_completed"  # run_ids: runs in a (arm, rung) cell that did not complete (never fitted)
W_NO_COMPUTE = "no_compute"  # run_ids: completed runs without flops_per_token × tokens
W_NONFINITE_LOSS = "nonfinite_loss"  # run_ids: completed runs with a non-finite final val loss
W_NO_RUNG = "no_rung"  # run_ids: runs without a usable ladder.rung (not placed on the ladder)
W_NO_CONFIG = "no_config"  # run_ids: runs without a readable config (cannot be placed at all)
W_FEW_RUNGS = "few_rungs"  # arm, value = rungs with data (< MIN_RUNGS)
W_NOT_FITTED = "not_fitted"  # arm, value = rungs with data (< MIN_RUNGS_TO_FIT): no fit at all
W_NON_MONOTONE = "non_monotone"  # arm, rung, value = mean loss, previous = the smaller rung's mean loss
W_SINGLE_SEED = "single_seed"  # arm, rungs: rungs with one fitted run, which the bootstrap cannot vary
W_AT_BOUND = "at_bound"  # arm, param: the fit sits on a bound of that parameter
W_BOOT_FAILED = "bootstrap_failed"  # arm, value = fraction of resamples whose fit failed
W_LR_AT_EDGE = "lr_at_edge"  # arm, rung, value = the chosen LR, at an end of that cell's grid; param = budget
W_HELD_OUT_SKIPPED = "held_out_skipped"  # arm, value = (rung, budget) cells left without the largest rung
W_HELD_OUT_ABOVE_GOAL = "held_out_above_goal"  # arm, value = relative error (> HELD_OUT_GOAL)
W_NO_BASELINE_FIT = "no_baseline_fit"  # arm = the baseline: no compute multipliers
W_CM_INFINITE = "cm_infinite"  # arm, value = compute: L_X(C) ≤ E_base (point estimate): CM = +inf
W_BASELINE_NOT_ARM = "baseline_not_arm"  # value = the --baseline key, which is not an arm key here
W_STALLED = "stalled"  # arm, rung, value = stalled runs of a cell left out of the fits, previous = its runs
W_OFF_FIT = "off_fit"  # arm, rung, value = |chosen fit − mean| / mean of a cell (> HELD_OUT_GOAL), param = budget
W_NOT_CONVERGED = "not_converged"  # param = the form whose point fit stopped at MAX_ITER
W_ALLOCATION_EDGE = "allocation_edge"  # arm, value = the edge's tokens per parameter its curve follows at its largest
# compute, previous = the unconstrained frontier's N_opt there (outside the trained band), param = "lo-hi" of the band

LADDER_PARAMS_KEY = "ladder.params"  # the N a budget is a multiple of: non_embedding | total
FIT_KEY = "ladder.fit"  # the form the claims use (lm_ablate/validation.py FIT_FORMS)
BUDGET_KEY, BUDGETS_KEY = "ladder.budget", "ladder.budgets"
FIT_BUDGETS_KEY = "ladder.fit_budgets"  # the budgets whose cells the fits use (null: every budget)
TUNE_KEY = "ladder.tune"  # keys besides the LR that each cell takes its best value of (lm_ablate/validation.py)
DATA_PREFIX = "data."
DATA_BOOKKEEPING = ("data.cache_dir", "data.num_proc")  # where data are cached, not what they are


@dataclass(frozen=True)
class ScalingWarning:
    code: str
    arm: str | None = None
    rung: int | None = None
    value: float | str | None = None
    run_ids: tuple[str, ...] = ()
    previous: float | None = None  # W_NON_MONOTONE: the mean loss of the next smaller rung
    param: str | None = None  # W_AT_BOUND
    rungs: tuple[int, ...] = ()  # W_SINGLE_SEED


@dataclass(frozen=True)
class PowerLaw:
    """L(C) = E + A·C^(−α), A in loss·FLOPs^α (kept as log A: A itself overflows for large α)."""

    E: float
    log_A: float
    alpha: float

    @property
    def A(self) -> float:
        return math.exp(self.log_A) if self.log_A < 700 else math.inf

    def loss(self, compute: Any) -> np.ndarray:
        c = np.asarray(compute, dtype=float)
        return self.E + np.exp(self.log_A - self.alpha * np.log(c))

    def compute_for(self, loss: Any) -> np.ndarray:
        """The compute at which this curve reaches ``loss``: +inf at or below E."""
        excess = np.asarray(loss, dtype=float) - self.E
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.exp((self.log_A - np.log(excess)) / self.alpha)
        return np.where(excess > 0, out, np.inf)

    def as_array(self) -> np.ndarray:
        return np.array([self.E, self.log_A, self.alpha])


@dataclass
class RungData:
    """The runs of one (arm, rung, budget) cell that enter the fit, and the cell's bookkeeping."""

    rung: int
    label: str  # identifier: the rung index, or the size-axis value (model.name=small)
    compute: float  # median C of the fitted runs
    params: float  # median N (ladder.params: non-embedding parameters unless total)
    run_ids: list[str]  # fitted runs, by seed
    seeds: list[Any]
    losses: np.ndarray  # final val loss of each fitted run
    computes: np.ndarray  # C of each fitted run
    lr: float | None = None  # the chosen LR when optim.lr varies within the cell
    lr_grid: list[float] = field(default_factory=list)
    setting: dict[str, Any] = field(default_factory=dict)  # the chosen value of each ladder.tune key
    n_runs: int = 0  # every run of the cell, fitted or not
    budget: float = 1.0  # multiple of tokens_per_param x N (ladder.budget; 1 without ladder.budgets)
    tokens: float = math.nan  # median D of the fitted runs
    stalled: int = 0  # stalled runs among run_ids (then the cell is left out of the fits: ArmFit.left_out)
    unfitted: bool = False  # its budget is not one of ladder.fit_budgets: in no fit (ArmFit.left_out)
    losses_by_seed: dict[Any, float] = field(default_factory=dict)  # seed -> loss (the single-rung ranking)
    seed_adjusted: bool = False  # its settings ran different seeds: picked on seed-adjusted means

    @property
    def mean_loss(self) -> float:
        return float(np.mean(self.losses))


@dataclass
class HeldOut(Prediction):
    rung: int
    compute: float
    observed: float  # mean final loss over the rung's fitted runs
    predicted: float  # the fit without this rung, at ``compute``
    fit: PowerLaw
    factor: float  # compute of the held-out rung / largest compute of the rest: how far the check extrapolated


@dataclass
class ArmFit:
    arm: str  # identifier: "key=value, ..." over the arm keys
    values: dict[str, Any]  # arm key -> config value
    is_baseline: bool
    rungs: list[RungData]  # the cells the fits use
    fit: PowerLaw | None = None
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # E, A, alpha -> (low, high)
    boot: np.ndarray | None = None  # (n_boot, 3) of (E, log A, alpha); NaN rows: failed resamples
    objective: float = math.nan
    held_out: HeldOut | None = None
    c_ref: float = math.nan
    left_out: list[RungData] = field(default_factory=list)  # cells stalled or outside the fit budgets: in no fit

    @property
    def cells(self) -> list[RungData]:
        """Every cell, fitted or left out, by (rung, budget)."""
        return sorted([*self.rungs, *self.left_out], key=lambda r: (r.rung, r.budget))

    @property
    def compute_range(self) -> tuple[float, float]:
        c = [r.compute for r in self.rungs]
        return (min(c), max(c)) if c else (math.nan, math.nan)


@dataclass
class Multiplier:
    """CM of one arm against the baseline at one compute."""

    arm: str
    at: str  # "largest" (the arm's largest rung) or "10x", "100x" (multiples of it)
    compute: float
    cm: float  # point estimate (+inf: the baseline never reaches X's loss)
    low: float
    high: float
    baseline_compute: float  # = cm × compute: what the baseline needs
    infinite_fraction: float  # share of resamples with CM = +inf
    beyond_data: bool  # C beyond X's largest rung, or the baseline compute outside the baseline's rungs
    factor: float  # how far the farther of the two fits is extrapolated (×, 1 = inside the data)
    validated_factor: float  # how far the held-out checks of both fits extrapolated (NaN: no check)

    @property
    def includes_one(self) -> bool:
        return bool(self.low <= 1.0 <= self.high)

    @property
    def beyond_validated(self) -> bool:
        return self.factor > 1.0 and not (self.factor <= self.validated_factor)


@dataclass
class MultiplierCurve:
    arm: str
    compute: np.ndarray
    cm: np.ndarray
    low: np.ndarray
    high: np.ndarray


@dataclass
class RungRanking:
    """One arm against the baseline at one (rung, budget): the single-rung decision (DataDecide, Magnusson et
    al. 2025: the smallest rung's ranking already gets most decisions at scale right)."""

    arm: str
    rung: int
    budget: float
    compute: float
    diff: float  # mean loss of the arm − the baseline's (negative: the arm is better)
    low: float
    high: float
    paired: bool  # the same seeds on both sides: paired t interval, else Welch
    n: int  # pairs, or the smaller side's runs
    stalled: int  # stalled runs on either side

    @property
    def winner(self) -> str | None:
        """ "arm" or "baseline" when the interval excludes 0 and no run stalled; None otherwise."""
        if self.stalled or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return None
        return "arm" if self.high < 0 else "baseline" if self.low > 0 else None


@dataclass
class ScalingStudy:
    size: str  # the key(s) whose values are the rungs: RUNG_KEY, or model.* shape keys (ordered by parameters)
    size_keys: list[str]  # keys that change with the rung (left out of arms)
    arm_keys: list[str]
    baseline: str
    arms: list[ArmFit]
    multipliers: list[Multiplier]
    curves: list[MultiplierCurve]
    warnings: list[ScalingWarning]
    lr_selected: bool  # optim.lr varied within (arm, rung) cells: the best LR of each cell was used
    n_boot: int
    confidence: float
    delta: float
    rung_labels: dict[int, str] = field(default_factory=dict)  # rung -> identifier (index or size-axis value)
    tuned: list[str] = field(default_factory=list)  # ladder.tune keys each cell took its best value of
    forms: dict[str, FormFit] = field(default_factory=dict)  # every form (analysis/compute/scaling_forms.py)
    form_multipliers: dict[str, list[Multiplier]] = field(default_factory=dict)
    form_curves: dict[str, list[MultiplierCurve]] = field(default_factory=dict)
    chosen: str | None = None  # the form ``multipliers`` and the claims come from
    chosen_by: str = "default"  # requested (ladder.fit) | held_out (ladder.fit=auto) | default
    same_data: bool = True  # every arm trained on the same data with the same tokenizer
    budgets: list[float] = field(default_factory=list)  # the budgets of the cells (several: WSD-S)
    fit_budgets: list[float] | None = None  # ladder.fit_budgets: the budgets the fits use (None: every budget)
    set_at_report: tuple[str, ...] = ()  # the fit keys the report set over the runs' values (--fit, --fit-budgets,
    # --tune)
    params_key: str = "non_embedding"  # ladder.params: the N of budgets and of L(N, D)
    rankings: list[RungRanking] = field(default_factory=list)
    tasks: Any = None  # analysis.compute.task_scaling.TaskStudy, when the runs have downstream metrics
    # the claims' form refitted on every budget the runs trained, when ladder.fit_budgets (or --fit-budgets) leaves
    # some out: the fit window's sensitivity check, shown beside the declared fit (no claim reads it)
    every_budget: ScalingStudy | None = None

    def arm(self, name: str) -> ArmFit:
        return next(a for a in self.arms if a.arm == name)

    def arm_index(self, name: str) -> int:
        return next(i for i, a in enumerate(self.arms) if a.arm == name)

    @property
    def chosen_fit(self) -> FormFit | None:
        return self.forms.get(self.chosen) if self.chosen else None

    def held_out_error(self, arm: str) -> float:
        """The held-out-rung error of the fit the multipliers come from, for one arm: the chosen form's (its
        worst held-out cell), else the arm's own fit's (NaN: no held-out check, e.g. only 3 rungs)."""
        names = [a.arm for a in self.arms]
        if arm not in names:
            return math.nan
        ff = self.chosen_fit
        if ff is not None and ff.fitted:
            return ff.held_out_error(names.index(arm))
        held = self.arms[names.index(arm)].held_out
        return held.rel_error if held is not None else math.nan

    @property
    def forms_table(self) -> pd.DataFrame:
        """One row per (form, arm): parameters, held-out errors and compute multipliers (scaling_forms.csv), the
        budgets each fit read (``fit_budgets``), and the fit window's check (the chosen form on every budget,
        ``chosen`` False) last."""
        rows = []
        every = self.every_budget
        studies = [(self, list(self.forms))] + ([(every, [every.chosen])] if every and every.chosen else [])
        for study, names in studies:
            rows += study._form_rows(names, study is self)
        return pd.DataFrame(rows)

    def _form_rows(self, names: list[str], declared: bool) -> list[dict[str, Any]]:
        rows = []
        fitted = " ".join(f"{b:g}" for b in (self.fit_budgets or self.budgets))
        for name in names:
            ff = self.forms[name]
            for k, a in enumerate(self.arms):
                row: dict[str, Any] = {"form": name, "chosen": declared and name == self.chosen, "arm": a.arm,
                                       "is_baseline": a.is_baseline, "fit_budgets": fitted, "n_params": ff.n_params,
                                       "n_cells": ff.n_cells, "skipped": ff.why_not or ""}  # fmt: skip
                if ff.fitted:
                    assert ff.raw is not None and ff.frontier_laws is not None
                    comps = ff.form.components
                    row.update({f"fit_{c}": float(ff.raw[k, j]) for j, c in enumerate(comps)})
                    own = {c: (f"{c}[{k}]" if f"{c}[{k}]" in ff.intervals else c) for c in comps}
                    for c in ("E", "alpha", "alpha_n", "beta_d"):
                        if c in own:
                            row[f"{c}_low"], row[f"{c}_high"] = ff.intervals[own[c]]
                    row.update(objective=ff.objective, converged=ff.converged, agreeing_starts=ff.agreeing_starts,
                               at_bound=" ".join(ff.at_bound), held_out_rel_error=ff.held_out_error(k),
                               held_out_factor=ff.held_out_factor, lobo_rel_error=ff.lobo_error(k), score=ff.score,
                               law_E=float(ff.frontier_laws[k, 0]), law_log_A=float(ff.frontier_laws[k, 1]),
                               law_alpha=float(ff.frontier_laws[k, 2]))  # fmt: skip
                for m in self.form_multipliers.get(name, []):
                    if m.arm == a.arm:
                        row.update({f"cm_{m.at}": m.cm, f"cm_{m.at}_low": m.low, f"cm_{m.at}_high": m.high,
                                    f"cm_{m.at}_beyond_validated": m.beyond_validated})  # fmt: skip
                rows.append(row)
        return rows

    @property
    def ranking_table(self) -> pd.DataFrame:
        """One row per (arm, rung, budget): the single-rung comparison with the baseline (scaling_ranking.csv)."""
        return pd.DataFrame([{"arm": r.arm, "rung": r.rung, "budget": r.budget, "compute": r.compute,
                              "diff": r.diff, "low": r.low, "high": r.high, "paired": r.paired, "n": r.n,
                              "stalled": r.stalled, "winner": r.winner or ""} for r in self.rankings])  # fmt: skip

    @property
    def table(self) -> pd.DataFrame:
        """One row per arm: fit, intervals, held-out check and compute multipliers (scaling.csv)."""
        rows = []
        for a in self.arms:
            row: dict[str, Any] = {"arm": a.arm, "is_baseline": a.is_baseline, "n_rungs": len(a.rungs),
                                   "n_runs": sum(len(r.run_ids) for r in a.rungs)}  # fmt: skip
            row.update({f"arm.{k}": override_text(v) for k, v in a.values.items()})
            fit = a.fit
            for p in PARAMS:
                row[p] = getattr(fit, p) if fit else math.nan
                row[f"{p}_low"], row[f"{p}_high"] = a.intervals.get(p, (math.nan, math.nan))
            row["c_min"], row["c_max"] = a.compute_range
            h = a.held_out
            row.update(
                held_out_rung=h.rung if h else math.nan, held_out_compute=h.compute if h else math.nan,
                held_out_observed=h.observed if h else math.nan, held_out_predicted=h.predicted if h else math.nan,
                held_out_rel_error=h.rel_error if h else math.nan,
                held_out_signed_error=h.signed_error if h else math.nan, held_out_factor=h.factor if h else math.nan,
            )  # fmt: skip
            for m in (m for m in self.multipliers if m.arm == a.arm):
                row.update({f"cm_{m.at}_compute": m.compute, f"cm_{m.at}": m.cm, f"cm_{m.at}_low": m.low,
                            f"cm_{m.at}_high": m.high, f"cm_{m.at}_includes_1": m.includes_one,
                            f"cm_{m.at}_beyond_validated": m.beyond_validated})  # fmt: skip
            rows.append(row)
        return pd.DataFrame(rows)

    @property
    def rung_table(self) -> pd.DataFrame:
        """One row per (arm, rung): the data each fit saw (scaling_rungs.csv)."""
        rows = [
            {"arm": a.arm, "rung": r.rung, "rung_label": r.label, "budget": r.budget, "params": r.params,
             "params_key": self.params_key, "tokens": r.tokens,
             "compute": r.compute, "n_runs": r.n_runs, "n_fitted": len(r.run_ids), "stalled": r.stalled,
             "in_fit": not (r.stalled or r.unfitted),
             "mean_loss": r.mean_loss, "min_loss": float(np.min(r.losses)), "max_loss": float(np.max(r.losses)),
             "fit_loss": float(a.fit.loss(r.compute)) if a.fit else math.nan,
             "chosen_fit_loss": self.chosen_loss(i, r),
             "lr": r.lr if r.lr is not None else math.nan,
             **{f"tuned.{k}": r.setting.get(k) for k in self.tuned}, "run_ids": " ".join(r.run_ids)}
            for i, a in enumerate(self.arms) for r in a.cells
        ]  # fmt: skip
        return pd.DataFrame(rows)

    def chosen_loss(self, arm: int, r: RungData) -> float:
        """The chosen form's loss at a cell (NaN without a chosen fit)."""
        ff = self.chosen_fit
        if ff is None or ff.raw is None:
            return math.nan
        one = np.array([arm])
        return float(SF.predict(ff.form, ff.raw, one, np.array([r.compute]), np.array([r.params]),
                                np.array([r.tokens]))[0])  # fmt: skip


# --- the fit --------------------------------------------------------------------------------------------
def _model(theta: np.ndarray, logx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log L̂, Jacobian) for problems ``theta`` (P, 3) = (E, log A', α) at log(C/C_ref) ``logx`` (n,)."""
    E, a, alpha = theta[:, :1], theta[:, 1:2], theta[:, 2:3]
    power = a - alpha * logx  # log of A'·x^(−α)
    with np.errstate(divide="ignore"):
        m = np.logaddexp(np.log(E), power)  # log(E + A' x^−α)
    q = np.exp(-m)  # ∂m/∂E
    p = np.exp(power - m)  # ∂m/∂log A'
    return m, np.stack([q, p, -logx * p], axis=-1)


def fit_batch(
    logx: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray,
    starts: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    delta: float = HUBER_DELTA,
    max_iter: int = MAX_ITER,
) -> tuple[np.ndarray, np.ndarray]:
    """Minimise Σ_i w_i·Huber_δ(log L̂(x_i) − y_i) over θ = (E, log A', α) in the box [lo, hi], for P
    problems at once (one per row of ``weights`` (P, n) and ``starts`` (P, 3)). Returns (θ (P, 3), objective
    (P,)); a problem whose objective is not finite is NaN. The minimiser is
    :func:`analysis.compute.scaling_forms.lm_huber` (Levenberg–Marquardt on the Huber loss's iteratively
    reweighted least squares, projected onto the box)."""
    theta, f, _ = lm_huber(lambda th: _model(th, logx), y, weights, starts, lo, hi, delta, max_iter)
    return theta, f


@dataclass
class _Points:
    """What one fit sees: compute, loss and rung of every fitted run, in (rung, seed) order."""

    compute: np.ndarray
    loss: np.ndarray
    rung: np.ndarray  # rung of each point

    @classmethod
    def of(cls, rungs: Sequence[RungData]) -> _Points:
        return cls(
            np.concatenate([r.computes for r in rungs]),
            np.concatenate([r.losses for r in rungs]),
            np.concatenate([np.full(len(r.losses), r.rung) for r in rungs]),
        )


def _box(loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    top = float(np.max(loss))
    lo = np.array([0.0, math.log(A_RANGE[0] * top), ALPHA_BOUNDS[0]])
    hi = np.array([top, math.log(A_RANGE[1] * top), ALPHA_BOUNDS[1]])
    return lo, hi


def _starts(logx: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """A grid of (E, α) with log A' set from the data for each: the median of log(L − E) + α·log x."""
    low = float(np.min(loss))
    out = []
    for e in START_E:
        E = e * low
        excess = np.log(np.maximum(loss - E, 1e-3 * low))
        for alpha in START_ALPHA:
            out.append([E, float(np.median(excess + alpha * logx)), alpha])
    return np.array(out)


def _fit_points(
    pts: _Points, weights: np.ndarray, delta: float, extra_start: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
    """Best of the starting grid for each weight row (B, n): (θ raw (B, 3) = (E, log A, α), objective (B,),
    C_ref). With ``extra_start`` (the point fit, raw units; for the bootstrap) the starts are it and the
    grid's four corners: a resample lies near the data, and on the synthetic ladders of the tests every start
    of the full grid reached the same optimum (to 1e-12 of the objective)."""
    c_ref = float(np.exp(np.mean(np.log(pts.compute))))
    logx = np.log(pts.compute / c_ref)
    y = np.log(pts.loss)
    starts = _starts(logx, pts.loss)
    if extra_start is not None and np.isfinite(extra_start).all():
        e, log_a, alpha = extra_start
        corners = [i * len(START_ALPHA) + j for i in (0, len(START_E) - 1) for j in (0, len(START_ALPHA) - 1)]
        starts = np.vstack([[e, log_a - alpha * math.log(c_ref), alpha], starts[corners]])
    lo, hi = _box(pts.loss)
    B, S = len(weights), len(starts)
    theta, f = fit_batch(logx, y, np.repeat(weights, S, axis=0), np.tile(starts, (B, 1)), lo, hi, delta)
    theta, f = theta.reshape(B, S, 3), f.reshape(B, S)
    best = np.argmin(np.where(np.isfinite(f), f, np.inf), axis=1)
    theta, f = theta[np.arange(B), best], f[np.arange(B), best]
    raw = theta.copy()
    raw[:, 1] = theta[:, 1] + theta[:, 2] * math.log(c_ref)  # log A = log A' + α log C_ref
    return raw, f, c_ref


def fit_power_law(compute: Any, loss: Any, delta: float = HUBER_DELTA) -> PowerLaw:
    """L(C) = E + A·C^(−α) fitted to points (C_i, L_i): the fit every arm gets (see the module docstring)."""
    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    raw, _, _ = _fit_points(_Points(c, y, np.zeros(len(c))), np.ones((1, len(c))), delta)
    return PowerLaw(*map(float, raw[0]))


def log_multiplier(x: np.ndarray, base: np.ndarray, log_c: np.ndarray) -> np.ndarray:
    """log CM of fits ``x`` against ``base`` ((..., 3) of (E, log A, α), broadcast) at log compute ``log_c``:
    +inf where L_X(C) ≤ E_base. Exactly 0 when the two fits are equal."""
    ex, ax, alx = x[..., 0], x[..., 1], x[..., 2]
    eb, ab, alb = base[..., 0], base[..., 1], base[..., 2]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        gap = ex - eb
        ratio = np.where(gap == 0, 0.0, gap * np.exp(alx * log_c - ax))  # (E_X − E_b) / (A_X C^−α_X)
        out = ((alx - alb) * log_c - (ax - ab) - np.log1p(ratio)) / alb
    return np.where(1.0 + ratio > 0, out, np.inf)


def curve_log_multiplier(x: np.ndarray, base: np.ndarray, log_c: np.ndarray) -> np.ndarray:
    """log CM between two arms' curves in compute: power laws (..., 3) in closed form (:func:`log_multiplier`),
    L(N, D) allocation curves (..., 9) by inverting the baseline's curve (scaling_forms.allocation_log_multiplier)."""
    if np.shape(x)[-1] == len(SF.ND_CURVE):
        return SF.allocation_log_multiplier(x, base, log_c)
    return log_multiplier(x, base, log_c)


def compute_multiplier(x: PowerLaw, base: PowerLaw, compute: Any) -> np.ndarray:
    """CM(C) = L_base⁻¹(L_X(C)) / C; +inf where the baseline never reaches L_X(C)."""
    log_c = np.log(np.asarray(compute, dtype=float))
    return np.exp(log_multiplier(x.as_array(), base.as_array(), log_c))


# --- the design: rungs, arms, baseline ------------------------------------------------------------------
@dataclass
class _Design:
    size: str
    size_keys: list[str]
    rung_of: dict[str, int]
    rung_label: dict[int, str]
    arm_axes: list[Axis]
    lr_grid: bool
    warnings: list[ScalingWarning]
    tuned: list[str] = field(default_factory=list)  # ladder.tune keys that vary within the arms


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and float(v).is_integer()


def _constant_within(rs: RunSet, key: str, rung_of: dict[str, int]) -> bool:
    seen: dict[int, Any] = {}
    return all(seen.setdefault(rung, rs.configs[r][key]) == rs.configs[r][key] for r, rung in rung_of.items())


def _params(rs: RunSet) -> dict[str, float]:
    """N of each run: non-embedding parameters, or all of them where the run's ladder.params is total."""
    non_emb = dict(zip(rs.runs["run_id"], pd.to_numeric(rs.runs[M.PARAMS_NON_EMBEDDING], errors="coerce")))
    total = dict(zip(rs.runs["run_id"], pd.to_numeric(rs.runs[M.PARAMS_TOTAL], errors="coerce")))
    return {r: total[r] if rs.configs.get(r, {}).get(LADDER_PARAMS_KEY) == "total" else n for r, n in non_emb.items()}


def _design(rs: RunSet, tune: Sequence[str] | None = None) -> _Design | None:
    axes, varied, _, _ = find_axes(rs)
    warnings: list[ScalingWarning] = []
    run_ids = list(rs.configs)
    if any(rs.configs[r].get(RUNG_KEY, MISSING_VALUE) != MISSING_VALUE for r in run_ids):
        placed = [r for r in run_ids if _is_int(rs.configs[r].get(RUNG_KEY))]
        if len(placed) < len(run_ids):
            warnings.append(ScalingWarning(W_NO_RUNG, run_ids=tuple(r for r in run_ids if r not in placed)))
        rung_of = {r: int(rs.configs[r][RUNG_KEY]) for r in placed}
        label = {k: str(k) for k in set(rung_of.values())}
        size = RUNG_KEY
        size_keys = {k for k in varied if k.startswith(LADDER_PREFIX)} | (SIZE_KEYS & set(varied))
    else:
        params = _params(rs)
        size_axes = []
        for axis in axes:
            if not set(axis.keys) & SHAPE_KEYS:
                continue
            by_value: dict[Any, list[float]] = {}
            for r in run_ids:
                by_value.setdefault(rs.configs[r][axis.name], []).append(params.get(r, math.nan))
            medians = {float(np.median([p for p in v if math.isfinite(p)])) for v in by_value.values()
                       if any(math.isfinite(p) for p in v)}  # fmt: skip
            if len(medians) > 1:
                size_axes.append(axis)
        if not size_axes:
            return None
        names = [a.name for a in size_axes]
        cells: dict[tuple, list[str]] = {}
        for r in run_ids:
            cells.setdefault(tuple(rs.configs[r][n] for n in names), []).append(r)
        size_of = {v: [p for p in (params.get(r, math.nan) for r in members) if math.isfinite(p)]
                   for v, members in cells.items()}  # fmt: skip
        order = sorted(cells, key=lambda v: (float(np.median(size_of[v])) if size_of[v] else math.inf,
                                             [value_order(x) for x in v]))  # fmt: skip
        index = {v: i for i, v in enumerate(order)}
        rung_of = {r: index[v] for v, members in cells.items() for r in members}
        label = {i: ", ".join(f"{n}={override_text(x)}" for n, x in zip(names, v)) for i, v in enumerate(order)}
        size = ", ".join(names)
        size_keys = {k for a in size_axes for k in a.keys} | (SIZE_KEYS & set(varied))
    if len(set(rung_of.values())) < 2:
        return None
    # any other key that takes one value per rung comes with the rung (a per-rung batch size or LR)
    size_keys |= {k for k in varied if is_candidate(k) and _constant_within(rs, k, rung_of)}
    # an LR that follows the arm (each arm its own LR, e.g. tuned per arm for ladder.lr=mup) belongs to the arm;
    # an LR axis of its own is a grid to pick each cell's best from
    # so is a key the runs name in ladder.tune (an axis of such keys alone; one that follows the arm stays in it)
    named = set(tune) if tune is not None else {k for r in run_ids for k in _key_list(rs.configs[r].get(TUNE_KEY))}
    tuned = sorted(named & set(varied) - size_keys)
    arm_axes = [a for a in axes if not set(a.keys) & size_keys and a.name != LR_KEY and not set(a.keys) <= set(tuned)]
    lr_grid = LR_KEY in varied and LR_KEY not in size_keys and not any(LR_KEY in a.keys for a in arm_axes)
    tuned = [k for k in tuned if not any(k in a.keys for a in arm_axes)]
    return _Design(size, sorted(size_keys), rung_of, label, arm_axes, lr_grid, warnings, tuned)


def _recorded_list(value: Any) -> list | None:
    """A list a run recorded (a list, or its JSON text in a flattened config); None for null, a run that predates
    the key, or text that is no list."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return list(value) if isinstance(value, (list, tuple)) else None


def _key_list(value: Any) -> list[str]:
    """A recorded list of keys (ladder.tune); none for a run that predates the key."""
    return [str(v) for v in _recorded_list(value) or []]


def _arm_label(cfg: dict[str, Any], axes: list[Axis]) -> str:
    return ", ".join(f"{a.label}={override_text(cfg[a.name])}" for a in axes) or NO_ARM


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def run_compute(rs: RunSet) -> dict[str, float]:
    """C = flops_per_token × tokens per run. FLOPs/token comes from the runs table when the loader carries it
    (``analysis.sources.load.SUMMARY_KEYS``), else from the run directory's summary.json."""
    tokens = dict(zip(rs.runs["run_id"], pd.to_numeric(rs.runs[M.TOTAL_TOKENS], errors="coerce")))
    if M.FLOPS_PER_TOKEN in rs.runs.columns:
        fpt = dict(zip(rs.runs["run_id"], pd.to_numeric(rs.runs[M.FLOPS_PER_TOKEN], errors="coerce")))
    else:
        fpt = {r: _summary_value(d, M.FLOPS_PER_TOKEN) for r, d in zip(rs.runs["run_id"], rs.runs["run_dir"])}
    out = {}
    for r in rs.runs["run_id"]:
        c = _num(fpt.get(r)) * _num(tokens.get(r))
        out[r] = c if math.isfinite(c) and c > 0 else math.nan
    return out


def _summary_value(run_dir: Any, key: str) -> float:
    try:
        return _num(json.loads((Path(str(run_dir)) / M.SUMMARY_FILE).read_text(encoding="utf-8")).get(key))
    except (OSError, ValueError, AttributeError):
        return math.nan


# --- the study ------------------------------------------------------------------------------------------
def scaling_study(
    rs: RunSet,
    baseline: str | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
    delta: float = HUBER_DELTA,
    confidence: float = CONFIDENCE,
    fit: str | None = None,
    fit_budgets: Sequence[float] | None = None,
    every_budget: bool = True,
    tune: Sequence[str] | None = None,
) -> ScalingStudy | None:
    """Fits, intervals, held-out checks and compute multipliers of every arm, or None when the runs do not
    vary model size. ``baseline`` is the report's ``--baseline KEY=VALUE`` (default: the arm of the first
    run launched). ``fit`` and ``fit_budgets`` (the report's ``--fit`` and ``--fit-budgets``) replace the runs'
    ``ladder.fit`` and ``ladder.fit_budgets``: a ladder refitted without training again. Where those budgets leave
    some out, ``every_budget`` also refits the chosen form on every budget (``study.every_budget``: the window's
    sensitivity check; its own rankings and task fits are not computed). ``tune`` (the report's ``--tune``) replaces
    the runs' ``ladder.tune``. Raises
    :class:`AnalysisError` for a baseline value no run has, or a form or budgets these runs cannot fit."""
    design = _design(rs, tune)
    if design is None:
        return None
    warnings = list(design.warnings)
    status = dict(zip(rs.runs["run_id"], rs.runs[M.STATUS]))
    loss = dict(zip(rs.runs["run_id"], pd.to_numeric(rs.runs[M.FINAL_VAL_LOSS], errors="coerce")))
    params = _params(rs)
    compute = run_compute(rs)
    placed = sorted(design.rung_of, key=launch_order)
    arm_of = {r: _arm_label(rs.configs[r], design.arm_axes) for r in placed}
    first = {arm_of[r]: rs.configs[r] for r in reversed(placed)}  # arm -> the config of its first run
    values = {name: {a.name: cfg[a.name] for a in design.arm_axes} for name, cfg in first.items()}
    base = _baseline(rs, baseline, design, arm_of, placed, warnings)
    arm_names = [base] + sorted((a for a in first if a != base),
                                key=lambda a: [value_order(v) for v in values[a].values()])  # fmt: skip

    budget_of = {r: _budget(rs.configs[r]) for r in placed}
    cells: dict[tuple[str, int, float], list[str]] = {}
    for r in placed:
        cells.setdefault((arm_of[r], design.rung_of[r], budget_of[r]), []).append(r)
    fitted = _fit_budgets(rs, placed, fit_budgets, sorted(set(budget_of.values())))
    bad: dict[str, list[str]] = {W_NOT_COMPLETED: [], W_NO_COMPUTE: [], W_NONFINITE_LOSS: []}
    tokens = dict(zip(rs.runs["run_id"], pd.to_numeric(rs.runs[M.TOTAL_TOKENS], errors="coerce")))
    # the loader's judgment (analysis.sources.load: lm_ablate/stall.py on each run's logged curve), as the claims
    # count it; not summary.json's flag, which a record written by an older rule may hold differently
    stalled = dict(zip(rs.runs["run_id"], rs.runs[M.STALLED].astype(bool)))
    arms: list[ArmFit] = []
    for name in arm_names:
        rungs, left_out = [], []
        for key in sorted(k for k in cells if k[0] == name):
            members = sorted(cells[key], key=lambda r: (value_order(rs.configs[r].get(M.SEED)), r))
            cell = _cell(rs, design, name, key[1], key[2], members, status, loss, compute, params, bad, warnings)
            if cell is not None:
                cell.tokens = float(np.nanmedian([tokens.get(r, math.nan) for r in cell.run_ids]))
                cell.stalled = sum(stalled.get(r, False) for r in cell.run_ids)
                cell.unfitted = fitted is not None and not any(math.isclose(key[2], b) for b in fitted)
                if cell.stalled and not cell.unfitted:
                    warnings.append(ScalingWarning(W_STALLED, name, key[1], cell.stalled, previous=len(cell.run_ids),
                                                   param=f"{key[2]:g}"))  # fmt: skip
                (left_out if cell.stalled or cell.unfitted else rungs).append(cell)
        arms.append(ArmFit(name, values[name], name == base, rungs, left_out=left_out))
    bad[W_NO_CONFIG] = [r for r in rs.runs["run_id"] if r not in rs.configs]
    for code, ids in bad.items():
        if ids:
            warnings.append(ScalingWarning(code, run_ids=tuple(ids)))

    draws = _draws(arms, n_boot, seed)
    for arm in arms:
        _fit_arm(arm, draws, delta, confidence, warnings)
    study = ScalingStudy(
        design.size, design.size_keys, [a.name for a in design.arm_axes], base, arms, [], [],
        warnings, design.lr_grid, n_boot, confidence, delta, design.rung_label,
    )  # fmt: skip
    study.tuned = design.tuned
    study.same_data = _same_data(rs, placed, arm_of)
    study.budgets = sorted({r.budget for a in arms for r in a.cells})
    study.fit_budgets = fitted
    study.set_at_report = (*(["--fit"] if fit is not None else []), *(["--fit-budgets"] if fit_budgets else []),
                           *(["--tune"] if tune is not None else []))  # fmt: skip
    study.params_key = _one_value(rs, placed, LADDER_PARAMS_KEY, "non_embedding")
    requested = fit if fit is not None else _one_value(rs, placed, FIT_KEY, "auto")
    _fit_forms(study, draws, requested, "--fit" if fit is not None else FIT_KEY)
    if study.chosen is None:  # no form fits every arm: each arm's own fit, as far as it goes
        laws = [(a.fit.as_array(), a.boot) if a.fit is not None and a.boot is not None else None for a in arms]
        valid = [_validated(a, arms[0]) for a in arms]
        study.multipliers, study.curves = _multipliers(arms, laws, valid, confidence, warnings)
    if not every_budget:
        return study
    study.rankings = _rankings(study)
    study.tasks = task_study(study, dict(zip(rs.runs["run_id"], rs.runs["run_dir"])))
    trained = sorted(set(budget_of.values()))
    if fitted is not None and len(fitted) < len(trained) and study.chosen is not None:
        try:  # the same form on every cell the window left out (stalled cells stay out, as in every fit)
            study.every_budget = scaling_study(rs, baseline, n_boot, seed, delta, confidence, fit=study.chosen,
                                               fit_budgets=trained, every_budget=False, tune=tune)  # fmt: skip
        except AnalysisError:  # that form cannot be fitted on every budget: no check to show
            study.every_budget = None
    return study


def _one_value(rs: RunSet, runs: list[str], key: str, default: str) -> str:
    """The value every run has for ``key`` (the default where a run lacks it); one line when they differ."""
    seen = {str(v) if (v := rs.configs[r].get(key, MISSING_VALUE)) not in (MISSING_VALUE, None) else default
            for r in runs}  # fmt: skip
    if len(seen) > 1:
        raise AnalysisError(f"{key} differs between the runs of the scaling study ({', '.join(sorted(seen))}): "
                            "one value for every run of a study")  # fmt: skip
    return seen.pop() if seen else default


def _fit_budgets(
    rs: RunSet, runs: list[str], given: Sequence[float] | None, trained: list[float]
) -> list[float] | None:
    """The budgets the fits use: ``given`` (the report's --fit-budgets), else the runs' ladder.fit_budgets (one
    value for every run), else None (every budget). One line when a budget is not one these runs trained."""
    key = "--fit-budgets" if given else FIT_BUDGETS_KEY
    if given:
        chosen: tuple[float, ...] | None = tuple(float(b) for b in given)
    else:
        seen = {_budget_list(rs.configs[r].get(FIT_BUDGETS_KEY)) for r in runs}
        if len(seen) > 1:
            raise AnalysisError(f"{FIT_BUDGETS_KEY} differs between the runs of the scaling study "
                                f"({', '.join(sorted(str(list(v)) if v else 'null' for v in seen))}): one value for "
                                "every run of a study")  # fmt: skip
        chosen = seen.pop() if seen else None
    if chosen is None:
        return None
    unknown = [b for b in chosen if not any(math.isclose(b, t) for t in trained)]
    if not chosen or unknown:
        raise AnalysisError(f"{key}={','.join(f'{b:g}' for b in chosen)} is invalid: allowed: budgets these runs "
                            f"trained ({', '.join(f'{b:g}' for b in trained)})")  # fmt: skip
    return sorted(set(chosen))


def _budget_list(value: Any) -> tuple[float, ...] | None:
    """A recorded list of budgets as floats; None for null."""
    values = _recorded_list(value)
    return None if values is None else tuple(float(_num(v)) for v in values)


def _budget(cfg: dict[str, Any]) -> float:
    """The budget a run trained: ladder.budget, else the largest of ladder.budgets, else 1."""
    b = _num(cfg.get(BUDGET_KEY))
    if math.isfinite(b):
        return b
    budgets = _budget_list(cfg.get(BUDGETS_KEY))
    return max(budgets) if budgets else 1.0


def _same_data(rs: RunSet, runs: list[str], arm_of: dict[str, str]) -> bool:
    """Did every arm train on the same data with the same tokenizer (every data.* key and the vocabulary)?"""
    seen: dict[str, set] = {}
    for r in runs:
        cfg = rs.configs[r]
        key = tuple(sorted((k, str(v)) for k, v in cfg.items()
                           if (k.startswith(DATA_PREFIX) and k not in DATA_BOOKKEEPING) or k == "model.vocab_size"))  # fmt: skip
        seen.setdefault(arm_of[r], set()).add(key)
    return len({frozenset(v) for v in seen.values()}) <= 1


def _baseline(
    rs: RunSet, spec: str | None, design: _Design, arm_of: dict[str, str], placed: list[str],
    warnings: list[ScalingWarning],
) -> str:  # fmt: skip
    ids = sorted(placed, key=launch_order)
    parsed = parse_baseline(spec)
    if parsed is not None:
        key, text = parsed
        if any(key in a.keys for a in design.arm_axes):
            hits = [r for r in ids if matches_text(rs.configs[r][key], text)]
            if not hits:
                raise AnalysisError(f"--baseline {key}={text}: no run of the scaling study has that value")
            return arm_of[hits[0]]
        warnings.append(ScalingWarning(W_BASELINE_NOT_ARM, value=key))
    return arm_of[ids[0]]


def _cell(
    rs: RunSet, design: _Design, arm: str, rung: int, budget: float, members: list[str], status: dict[str, str],
    loss: dict[str, float], compute: dict[str, float], params: dict[str, float], bad: dict[str, list[str]],
    warnings: list[ScalingWarning],
) -> RungData | None:  # fmt: skip
    """The runs of one (arm, rung, budget) cell that enter the fit (at the cell's best LR when the LR varies)."""
    ok = []
    for r in members:
        if status[r] != M.STATUS_COMPLETED:
            bad[W_NOT_COMPLETED].append(r)
        elif not math.isfinite(loss[r]):
            bad[W_NONFINITE_LOSS].append(r)
        elif not math.isfinite(compute[r]):
            bad[W_NO_COMPUTE].append(r)
        else:
            ok.append(r)
    if not ok:
        return None
    lr, grid, setting, adjusted = None, [], {}, False
    if design.lr_grid or design.tuned:
        # each setting of the tuned keys and the LR; the cell takes the one with the lowest mean loss over seeds
        def tuned(r: str) -> tuple:
            return tuple(rs.configs[r].get(k) for k in design.tuned)

        def lr_of(r: str) -> float:
            return _num(rs.configs[r][LR_KEY]) if design.lr_grid else 0.0

        by_setting: dict[tuple, list[str]] = {}
        for r in ok:
            by_setting.setdefault((tuned(r), lr_of(r)), []).append(r)
        # the LR table's rule: plain means where every setting ran the same seeds, seed-adjusted where they did
        # not (a third seed at a cell's best LR only), so a seed's draw cannot move the pick by itself
        means, adjusted = selection_means(
            {v: [(_num(rs.configs[r].get(M.SEED)), loss[r]) for r in ids] for v, ids in by_setting.items()}
        )
        best = min(by_setting, key=lambda v: (means[v], v[1], [value_order(x) for x in v[0]]))
        ok, setting = by_setting[best], dict(zip(design.tuned, best[0]))
        if design.lr_grid:  # the LR grid of the chosen setting of the other keys
            lr, grid = best[1], sorted({lr_of(r) for r in members if tuned(r) == best[0]})
            if len(grid) > 1 and lr in (grid[0], grid[-1]):
                warnings.append(ScalingWarning(W_LR_AT_EDGE, arm, rung, lr, param=f"{budget:g}"))
    c = np.array([compute[r] for r in ok])
    p = [params.get(r, math.nan) for r in ok]
    seeds = [rs.configs[r].get(M.SEED) for r in ok]
    return RungData(
        rung, design.rung_label[rung], float(np.median(c)), float(np.nanmedian(p)) if np.isfinite(p).any() else math.nan,
        ok, seeds, np.array([loss[r] for r in ok]), c, lr, grid, setting, len(members),
        losses_by_seed={str(sd): loss[r] for sd, r in zip(seeds, ok)}, budget=budget, seed_adjusted=adjusted,
    )  # fmt: skip


def _draws(arms: list[ArmFit], n_boot: int, seed: int) -> dict[int, np.ndarray]:
    """One (n_boot, n_max) uniform array per rung, shared by every arm (seeds paired by position)."""
    rng = np.random.default_rng(seed)
    width: dict[int, int] = {}
    for a in arms:
        for r in a.rungs:
            width[r.rung] = max(width.get(r.rung, 0), len(r.run_ids))
    return {rung: rng.random((n_boot, width[rung])) for rung in sorted(width)}


def _spread(rungs: list[RungData]) -> _Points:
    """The points the bootstrap resamples: each cell's log losses moved away from their cell mean by
    √(n/(n−1)), so that drawing n of n has the seed variance of the data (Davison & Hinkley 1997, §6.2.3,
    modified residuals: leverage 1/n in a cell)."""
    pts = _Points.of(rungs)
    out = []
    for r in rungs:
        y = np.log(r.losses)
        n = len(y)
        out.append(np.exp(y.mean() + math.sqrt(n / (n - 1)) * (y - y.mean())) if n > 1 else r.losses)
    return _Points(pts.compute, np.concatenate(out), pts.rung)


def _weights(rungs: list[RungData], draws: dict[int, np.ndarray]) -> np.ndarray:
    """(n_boot, points): how often each fitted run is drawn when its rung's seeds are resampled."""
    cols = []
    for r in rungs:
        n = len(r.run_ids)
        pick = np.minimum((draws[r.rung][:, :n] * n).astype(int), n - 1)
        cols.append((pick[:, :, None] == np.arange(n)).sum(axis=1))
    return np.concatenate(cols, axis=1).astype(float)


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """Percentile interval, no interpolation (so +inf resamples give +inf, never NaN); NaN values dropped."""
    v = values[~np.isnan(values)]
    if not len(v):
        return math.nan, math.nan
    q = (1 - confidence) / 2
    low, high = np.quantile(v, [q, 1 - q], method="inverted_cdf")
    return float(low), float(high)


def _fit_arm(arm: ArmFit, draws: dict[int, np.ndarray], delta: float, confidence: float,
             warnings: list[ScalingWarning]) -> None:  # fmt: skip
    rungs = arm.rungs  # cells: (rung, budget), ordered
    n_rungs = len({r.rung for r in rungs})
    if n_rungs < MIN_RUNGS_TO_FIT:
        warnings.append(ScalingWarning(W_NOT_FITTED, arm.arm, value=n_rungs))
        return
    if n_rungs < MIN_RUNGS:
        warnings.append(ScalingWarning(W_FEW_RUNGS, arm.arm, value=n_rungs))
    for budget in sorted({r.budget for r in rungs}):
        line = [r for r in rungs if r.budget == budget]
        for prev, r in zip(line, line[1:]):
            if r.mean_loss >= prev.mean_loss:
                warnings.append(ScalingWarning(W_NON_MONOTONE, arm.arm, r.rung, r.mean_loss, previous=prev.mean_loss,
                                               param=f"{budget:g}"))  # fmt: skip
    single = tuple(sorted({r.rung for r in rungs if len(r.run_ids) == 1}))
    if single:
        warnings.append(ScalingWarning(W_SINGLE_SEED, arm.arm, value=len(single), rungs=single))
    pts = _Points.of(rungs)
    raw, f, c_ref = _fit_points(pts, np.ones((1, len(pts.loss))), delta)
    arm.fit, arm.objective, arm.c_ref = PowerLaw(*map(float, raw[0])), float(f[0]), c_ref
    lo, hi = _box(pts.loss)
    fitted = np.array([arm.fit.E, arm.fit.log_A - arm.fit.alpha * math.log(c_ref), arm.fit.alpha])
    for i, name in enumerate(PARAMS):
        if np.isclose(fitted[i], lo[i], rtol=1e-6, atol=1e-9) or np.isclose(fitted[i], hi[i], rtol=1e-6, atol=1e-9):
            warnings.append(ScalingWarning(W_AT_BOUND, arm.arm, param=name, value=float(fitted[i])))
    boot, _, _ = _fit_points(_spread(rungs), _weights(rungs, draws), delta, extra_start=arm.fit.as_array())
    arm.boot = boot
    failed = float(np.isnan(boot[:, 0]).mean())
    if failed > 0:
        warnings.append(ScalingWarning(W_BOOT_FAILED, arm.arm, value=failed))
    cols = {"E": boot[:, 0], "A": np.exp(np.minimum(boot[:, 1], 700)), "alpha": boot[:, 2]}
    arm.intervals = {p: _interval(cols[p], confidence) for p in PARAMS}
    last = max(r.rung for r in rungs)  # the largest rung, all its budgets, left out; checked at its largest compute
    top = max((r for r in rungs if r.rung == last), key=lambda r: r.compute)
    rest = [r for r in rungs if r.rung != last]
    if len(rest) < MIN_RUNGS_TO_FIT:  # the per_arm form's rule (scaling_forms.held_out): a cell per parameter left
        warnings.append(ScalingWarning(W_HELD_OUT_SKIPPED, arm.arm, value=len(rest)))
        return
    raw_h, _, _ = _fit_points(_Points.of(rest), np.ones((1, sum(len(r.losses) for r in rest))), delta)
    held = PowerLaw(*map(float, raw_h[0]))
    arm.held_out = HeldOut(top.rung, top.compute, top.mean_loss, float(held.loss(top.compute)), held,
                           top.compute / max(r.compute for r in rest))  # fmt: skip
    if arm.held_out.rel_error > HELD_OUT_GOAL:
        warnings.append(ScalingWarning(W_HELD_OUT_ABOVE_GOAL, arm.arm, top.rung, arm.held_out.rel_error))


Law = tuple[np.ndarray, np.ndarray]  # an arm's L(C): point (3,) and bootstrap (B, 3) of (E, log A, α)


def _multipliers(arms: list[ArmFit], laws: list[Law | None], validated: list[float], confidence: float,
                 warnings: list[ScalingWarning] | None) -> tuple[list[Multiplier], list[MultiplierCurve]]:  # fmt: skip
    """CM of every arm against the baseline (``arms[0]``) from each arm's curve in compute (None: no fit), at
    its largest compute and EXTRAPOLATE times it, and over a grid (the curves); ``validated[k]``: how far the
    held-out checks of arm k's and the baseline's curves extrapolated. W_CM_INFINITE into ``warnings``."""
    base = arms[0]
    if laws[0] is None:
        if len(arms) > 1 and warnings is not None:
            warnings.append(ScalingWarning(W_NO_BASELINE_FIT, base.arm))
        return [], []
    b_fit, b_boot = laws[0]
    b_lo, b_hi = base.compute_range
    out, curves = [], []
    for arm, law, valid in zip(arms[1:], laws[1:], validated[1:]):
        if law is None:
            continue
        x_fit, x_boot = law
        lo, hi = arm.compute_range
        failed = np.isnan(x_boot[:, 0]) | np.isnan(b_boot[:, 0])
        at = [("largest", hi)] + [(f"{k:g}x", k * hi) for k in EXTRAPOLATE]
        for label, c in at:
            log_c = math.log(c)
            point = float(curve_log_multiplier(x_fit, b_fit, np.array(log_c)))
            boot = curve_log_multiplier(x_boot, b_boot, np.full(len(x_boot), log_c))
            boot = np.where(failed, np.nan, boot)
            low, high = _interval(boot, confidence)
            cm = math.exp(point) if point < 700 else math.inf
            base_c = c * cm
            factor = max(c / hi, base_c / b_hi, b_lo / base_c if base_c > 0 else math.inf, 1.0)
            ok = boot[~np.isnan(boot)]
            out.append(Multiplier(
                arm.arm, label, c, cm, _exp(low), _exp(high), base_c,
                float(np.isinf(ok).mean()) if len(ok) else math.nan,
                bool(c > hi * (1 + 1e-9) or base_c > b_hi * (1 + 1e-9) or base_c < b_lo * (1 - 1e-9)), factor, valid,
            ))  # fmt: skip
            if math.isinf(cm) and warnings is not None:
                warnings.append(ScalingWarning(W_CM_INFINITE, arm.arm, value=c))
        grid = np.geomspace(lo, hi * max(EXTRAPOLATE), CURVE_POINTS)
        log_g = np.log(grid)
        point = curve_log_multiplier(x_fit, b_fit, log_g)
        boot = curve_log_multiplier(x_boot[:, None, :], b_boot[:, None, :], log_g[None, :])
        boot[failed] = np.nan
        band = np.array([_interval(boot[:, j], confidence) for j in range(len(grid))])
        curves.append(MultiplierCurve(arm.arm, grid, _exp(point), _exp(band[:, 0]), _exp(band[:, 1])))
    return out, curves


FORM_REFUSED = {
    SF.W_FORM_ONE_BUDGET: "an L(N, D) form needs several budgets per rung (ladder.budgets); these runs have one",
    SF.W_FORM_OTHER_DATA: "the arms were trained on different data or tokenizers, so they share no irreducible loss; "
    "allowed: per_arm, nd_per_arm, auto",
    SF.W_FORM_NO_ARMS: "a shared form needs two arms or more; allowed: per_arm, nd_per_arm, auto",
}


def _fit_forms(study: ScalingStudy, draws: dict[int, np.ndarray], requested: str, key: str = FIT_KEY) -> None:
    """Every form of analysis/compute/scaling_forms.py on all arms at once, the form the claims use (ladder.fit,
    or the report's --fit: ``key``; auto: by held-out error), its multipliers as ``study.multipliers``, and its
    warnings."""
    arms = study.arms
    if requested not in FIT_FORMS:
        raise AnalysisError(f"{key}={requested} is invalid: allowed: {', '.join(FIT_FORMS)}")
    if not any(a.rungs for a in arms):
        return
    cells = [(k, r) for k, a in enumerate(arms) for r in a.rungs]
    rep = lambda f: np.concatenate([np.full(len(r.losses), f(k, r), dtype=float) for k, r in cells])
    pts = SF.Points(
        rep(lambda k, r: k).astype(int), rep(lambda k, r: r.rung).astype(int), rep(lambda k, r: r.budget),
        np.concatenate([r.computes for _, r in cells]), rep(lambda k, r: r.params), rep(lambda k, r: r.tokens),
        np.concatenate([r.losses for _, r in cells]),
    )  # fmt: skip
    spread = np.concatenate([_spread(a.rungs).loss for a in arms if a.rungs])
    weights = np.concatenate([_weights(a.rungs, draws) for a in arms if a.rungs], axis=1)
    flops = []
    for a in arms:
        ok = [r for r in a.rungs if math.isfinite(r.params) and math.isfinite(r.tokens) and r.tokens > 0]
        flops.append(SF.flops_law(np.array([r.params for r in ok]), np.array([r.compute / r.tokens for r in ok]))
                     if ok else (math.nan, math.nan))  # fmt: skip
    names = tuple(FORMS)
    if not (np.isfinite(pts.params).all() and np.isfinite(pts.tokens).all()):
        names = tuple(n for n in names if FORMS[n].kind == "C")
    if any(not a.rungs for a in arms):  # an arm without data: a joint fit of the others would renumber arms
        return
    forms = SF.fit_forms(pts, spread, weights, len(arms), study.same_data, flops, study.confidence, study.delta,
                         names)  # fmt: skip
    if requested != "auto":
        ff = forms.get(requested)
        why = ff.why_not if ff is not None else SF.W_FORM_ONE_BUDGET
        if why == SF.W_FORM_FEW_POINTS and ff is not None:
            raise AnalysisError(f"{key}={requested} is invalid here: it has {ff.n_params} parameters and the "
                                f"runs give {ff.n_cells} (arm, rung, budget) points; allowed: a form with fewer "
                                "parameters, or auto")  # fmt: skip
        if why is not None:
            raise AnalysisError(f"{key}={requested} is invalid here: {FORM_REFUSED[why]}")
    study.forms = forms
    study.chosen, study.chosen_by = SF.choose(forms, requested, HELD_OUT_GOAL)
    for name, ff in forms.items():
        if not ff.fitted:
            continue
        assert ff.laws is not None and ff.laws_boot is not None
        laws: list[Law | None] = [(ff.laws[k], ff.laws_boot[:, k]) for k in range(len(arms))]
        checked = [
            math.isfinite(ff.held_out_error(k)) and math.isfinite(ff.held_out_error(0)) for k in range(len(arms))
        ]
        valid = [ff.held_out_factor if ok else math.nan for ok in checked]
        chosen = name == study.chosen
        study.form_multipliers[name], study.form_curves[name] = _multipliers(
            arms, laws, valid, study.confidence, study.warnings if chosen else None
        )
    if study.chosen is None:
        return
    study.multipliers = study.form_multipliers.get(study.chosen, [])
    study.curves = study.form_curves.get(study.chosen, [])
    ff = forms[study.chosen]
    if ff.fitted and not ff.converged:
        study.warnings.append(ScalingWarning(W_NOT_CONVERGED, param=study.chosen))
    for c in ff.residuals:
        if c.rel_error > HELD_OUT_GOAL:
            study.warnings.append(ScalingWarning(W_OFF_FIT, arms[c.arm].arm, c.rung, c.rel_error,
                                                 param=f"{c.budget:g}"))  # fmt: skip
    if ff.n_opt is not None and ff.bands is not None:
        for k, a in enumerate(arms):  # where the curve is not the compute-optimal frontier (scaling_forms.allocation)
            log_c = math.log(a.compute_range[1])
            log_n_opt = ff.n_opt[k, 0] + ff.n_opt[k, 1] * log_c
            log_n, log_d = SF.allocation(ff.laws[k], np.array(log_c))
            if not np.isclose(float(log_n), log_n_opt, rtol=0, atol=1e-9):
                lo, hi = np.exp(ff.bands[k])
                study.warnings.append(ScalingWarning(
                    W_ALLOCATION_EDGE, a.arm, value=float(np.exp(log_d - log_n)),
                    previous=math.exp(min(log_n_opt, 709.0)), param=f"{lo:.3g}-{hi:.3g}",
                ))  # fmt: skip


def _rankings(study: ScalingStudy) -> list[RungRanking]:
    """Each arm against the baseline at every (rung, budget) both have: the difference of mean final losses with
    its interval (paired by seed when both sides ran the same seeds, else Welch)."""
    if not study.arms:
        return []
    base = {(r.rung, r.budget): r for r in study.arms[0].cells}
    out = []
    for arm in study.arms[1:]:
        for r in arm.cells:
            b = base.get((r.rung, r.budget))
            if b is None:
                continue
            common = sorted(set(r.losses_by_seed) & set(b.losses_by_seed))
            with py_warnings.catch_warnings():  # scipy's p-value on near-identical samples: the interval is ours
                py_warnings.simplefilter("ignore", RuntimeWarning)
                if len(common) >= 2 and len(common) == len(r.losses_by_seed) == len(b.losses_by_seed):
                    d, lo, hi, _, n = paired([r.losses_by_seed[s] for s in common],
                                             [b.losses_by_seed[s] for s in common], study.confidence)  # fmt: skip
                    is_paired = True
                else:
                    d, lo, hi, _ = welch(r.losses, b.losses, study.confidence)
                    n, is_paired = min(len(r.losses), len(b.losses)), False
            out.append(RungRanking(arm.arm, r.rung, r.budget, r.compute, d, lo, hi, is_paired, n,
                                   r.stalled + b.stalled))  # fmt: skip
    return out


def _validated(arm: ArmFit, base: ArmFit) -> float:
    """How far beyond its data each fit was checked (held-out factor); the smaller of the two, NaN if either
    has no held-out check."""
    if arm.held_out is None or base.held_out is None:
        return math.nan
    return min(arm.held_out.factor, base.held_out.factor)


def _exp(x: Any) -> Any:
    with np.errstate(over="ignore"):
        out = np.exp(np.asarray(x, dtype=float))
    return float(out) if out.ndim == 0 else out
