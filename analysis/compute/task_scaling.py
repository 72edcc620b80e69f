"""Two-step task prediction on a ladder (Bhagia et al. 2024, "Establishing Task Scaling Laws via Compute-Efficient
Model Ladders"): compute -> task loss -> accuracy, each step checked at the held-out rung.

    step 1   task loss of arm k:  BPB_k(C) = E_k + A_k·C^(−α_k)       per arm (L(N, D) per arm when the study's
             (bits per byte of the correct continuation)              chosen form is an L(N, D) one), the fit
                                                                      of analysis/compute/scaling_forms.py
    step 2   accuracy: Acc(BPB) = b + a / (1 + exp(k·(BPB − m)))     one sigmoid across arms (accuracy is a
                                                                      function of the task loss, whatever the
                                                                      arm), least squares, 0 ≤ b, a + b ≤ 1, k > 0

The held-out check refits both steps without each arm's largest rung and predicts that rung: step 1's BPB at the
rung's compute (relative error against the measured mean BPB), step 2's accuracy at the *measured* BPB (its own
error, in points of accuracy) and the chained prediction compute -> predicted BPB -> accuracy (in points).

Metric names are parameters: ``downstream/<task>/bpb`` and ``downstream/<task>/acc`` (lm_ablate/metrics.py,
written into summary.json by the loop's downstream evaluation); the tasks are those every fitted run has.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from analysis.compute import scaling_forms as SF
from lm_ablate import metrics as M

BPB, ACC = "bpb", "acc"
MIN_CELLS_SIGMOID = 5  # four parameters


@dataclass
class TaskCheck:
    """One arm's held-out cell of one task."""

    arm: int
    rung: int
    budget: float
    compute: float
    bpb_observed: float
    bpb_predicted: float  # step 1, fitted without the rung
    acc_observed: float
    acc_from_bpb: float  # step 2 (fitted without the rung) at the observed BPB
    acc_chained: float  # step 2 at step 1's predicted BPB

    @property
    def bpb_rel_error(self) -> float:
        return abs(self.bpb_predicted - self.bpb_observed) / self.bpb_observed

    @property
    def acc_points(self) -> float:
        """|chained prediction − measured| in points of accuracy (100 × the fraction)."""
        return 100 * abs(self.acc_chained - self.acc_observed)

    @property
    def step2_points(self) -> float:
        return 100 * abs(self.acc_from_bpb - self.acc_observed)


@dataclass
class TaskFit:
    task: str
    bpb_key: str
    acc_key: str
    form: str  # step 1's form
    laws: np.ndarray | None = None  # (arms, 3) BPB(C) per arm (L(N, D): its compute-optimal frontier)
    sigmoid: np.ndarray | None = None  # (b, a, k, m) fitted on every cell
    checks: list[TaskCheck] = field(default_factory=list)
    cells: list[tuple[int, int, float, float, float, float]] = field(
        default_factory=list
    )  # arm, rung, budget, C, bpb, acc
    why_not: str | None = None


@dataclass
class TaskStudy:
    tasks: list[TaskFit]
    missing: int  # fitted runs without the task metrics (left out)


def sigmoid(params: np.ndarray, bpb: Any) -> np.ndarray:
    b, a, k, m = params
    return b + a / (1 + np.exp(k * (np.asarray(bpb, dtype=float) - m)))


def fit_sigmoid(bpb: np.ndarray, acc: np.ndarray) -> np.ndarray | None:
    """(b, a, k, m) of Acc = b + a / (1 + exp(k (BPB − m))) by bounded least squares (a few starts); None with
    fewer than MIN_CELLS_SIGMOID points."""
    if len(bpb) < MIN_CELLS_SIGMOID:
        return None
    lo, hi = float(np.min(acc)), float(np.max(acc))
    spread = max(float(np.ptp(bpb)), 1e-3)
    best = None
    for k0 in (1.0 / spread, 4.0 / spread, 16.0 / spread):
        x0 = [max(0.0, lo - 0.01), min(1.0, hi + 0.01) - max(0.0, lo - 0.01), k0, float(np.median(bpb))]
        res = least_squares(
            lambda p: sigmoid(p, bpb) - acc, x0, bounds=([0, 1e-6, 1e-6, -np.inf], [1, 1, np.inf, np.inf]),
            xtol=1e-12, ftol=1e-12,
        )  # fmt: skip
        if res.x[0] + res.x[1] <= 1 + 1e-9 and (best is None or res.cost < best.cost):
            best = res
    return None if best is None else best.x


def task_names(summaries: list[dict[str, Any]], bpb: str = BPB, acc: str = ACC) -> list[str]:
    """Tasks with both ``downstream/<task>/<bpb>`` and ``.../<acc>`` in every summary given."""
    pattern = re.compile("^" + re.escape(M.DOWNSTREAM).replace(r"\{task\}", "(.+)").replace(r"\{kind\}", "(.+)") + "$")
    found: set[str] | None = None
    for s in summaries:
        mine = {
            m.group(1)
            for k in s
            if (m := pattern.match(k)) and m.group(2) == bpb and M.downstream(m.group(1), acc) in s
        }
        found = mine if found is None else found & mine
    return sorted(found or ())


def read_summary(run_dir: Any) -> dict[str, Any]:
    try:
        out = json.loads((Path(str(run_dir)) / M.SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def task_study(study: Any, run_dirs: dict[str, Any], tasks: list[str] | None = None, bpb: str = BPB,
               acc: str = ACC) -> TaskStudy | None:  # fmt: skip
    """Both steps for every task (``tasks``: default those every fitted run has) of a ScalingStudy's arms and cells;
    None when no fitted run has downstream metrics. ``run_dirs``: run id -> its directory (summary.json)."""
    arms = study.arms
    summaries = {r: read_summary(run_dirs.get(r)) for a in arms for cell in a.rungs for r in cell.run_ids}
    if not summaries:
        return None
    with_metrics = [s for s in summaries.values() if any(str(k).startswith("downstream/") for k in s)]
    names = task_names(with_metrics, bpb, acc) if tasks is None else list(tasks)
    if not names:
        return None
    chosen = study.chosen_fit
    form = SF.FORMS["nd_per_arm" if chosen is not None and chosen.form.kind == "ND" else "per_arm"]
    out, missing = [], 0
    for task in names:
        kb, ka = M.downstream(task, bpb), M.downstream(task, acc)
        rows = []
        for k, a in enumerate(arms):
            for cell in a.rungs:
                for r, c in zip(cell.run_ids, cell.computes):
                    s = summaries[r]
                    vb, va = s.get(kb), s.get(ka)
                    if not (isinstance(vb, (int, float)) and isinstance(va, (int, float)) and vb > 0):
                        missing += 1
                        continue
                    rows.append((k, cell.rung, cell.budget, float(c), cell.params, cell.tokens, float(vb), float(va)))
        out.append(fit_task(task, kb, ka, form, rows, len(arms), chosen.flops if chosen is not None else []))
    return TaskStudy(out, missing)


def fit_task(task: str, kb: str, ka: str, form: SF.Form, rows: list[tuple], n_arms: int,
             flops: list[tuple[float, float]]) -> TaskFit:  # fmt: skip
    tf = TaskFit(task, kb, ka, form.name)
    if not rows:
        tf.why_not = "no_runs"
        return tf
    a = np.array(rows, dtype=float)
    pts = SF.Points(a[:, 0].astype(int), a[:, 1].astype(int), a[:, 2], a[:, 3], a[:, 4], a[:, 5], a[:, 6])
    accs = a[:, 7]
    cells = pts.cells()
    means = {}
    for cell in cells:
        m = (pts.arm == cell[0]) & (pts.rung == cell[1]) & (pts.budget == cell[2])
        means[cell] = (float(np.median(pts.compute[m])), float(pts.loss[m].mean()), float(accs[m].mean()))
    tf.cells = [(c[0], c[1], c[2], *means[c]) for c in cells]
    if any(len({r for (arm, r, _) in cells if arm == k}) < SF.MIN_RUNGS for k in range(n_arms)):
        tf.why_not = "few_rungs"
        return tf
    refs = pts.refs()
    fit = SF.fit_form(form, pts, n_arms, np.ones((1, len(pts))), refs)
    if not np.isfinite(fit.theta[0]).all():
        tf.why_not = "not_fitted"
        return tf
    raw = SF.to_raw(form, fit.theta[0], n_arms, refs)
    tf.laws = SF.laws_of(form, raw, flops, SF.bands_of(pts, n_arms)) if form.kind == "ND" and flops else raw
    tf.sigmoid = fit_sigmoid(np.array([v[1] for v in means.values()]), np.array([v[2] for v in means.values()]))
    # held out: every arm's largest rung, both steps refitted without it
    left = SF.largest_rung(pts)[0]
    rest = pts.take(~left)
    refit = SF.fit_form(form, rest, n_arms, np.ones((1, len(rest))), refs, extra=fit.theta[0])
    if not np.isfinite(refit.theta[0]).all():
        return tf
    raw_h = SF.to_raw(form, refit.theta[0], n_arms, refs)
    kept = [c for c in cells if not left[(pts.arm == c[0]) & (pts.rung == c[1]) & (pts.budget == c[2])].any()]
    sig_h = fit_sigmoid(np.array([means[c][1] for c in kept]), np.array([means[c][2] for c in kept]))
    for c in cells:
        if c in kept:
            continue
        m = (pts.arm == c[0]) & (pts.rung == c[1]) & (pts.budget == c[2])
        pred = float(SF.predict(form, raw_h, np.array([c[0]]), np.array([means[c][0]]),
                                np.array([np.median(pts.params[m])]), np.array([np.median(pts.tokens[m])]))[0])  # fmt: skip
        from_bpb = float(sigmoid(sig_h, means[c][1])) if sig_h is not None else math.nan
        chained = float(sigmoid(sig_h, pred)) if sig_h is not None else math.nan
        tf.checks.append(TaskCheck(c[0], c[1], c[2], means[c][0], means[c][1], pred, means[c][2], from_bpb, chained))
    return tf
