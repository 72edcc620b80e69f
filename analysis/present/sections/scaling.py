"""The report's Scaling section: the words, tables and figures for a :class:`analysis.compute.scaling.ScalingStudy`.

Every sentence for people about a scaling study lives here; analysis/compute/scaling.py holds only numbers and
warning codes. The section appears whenever the study varies model size (a ladder, or a sweep over
``model=...`` whose parameter counts differ).
"""

from __future__ import annotations

from analysis.compute.scaling import (
    EXTRAPOLATE,
    HELD_OUT_GOAL,
    MIN_RUNGS,
    RUNG_KEY,
    W_AT_BOUND,
    W_BASELINE_NOT_ARM,
    W_BOOT_FAILED,
    W_CM_INFINITE,
    W_FEW_RUNGS,
    W_HELD_OUT_ABOVE_GOAL,
    W_HELD_OUT_SKIPPED,
    W_LR_AT_EDGE,
    W_NO_BASELINE_FIT,
    W_NO_COMPUTE,
    W_NO_CONFIG,
    W_NO_RUNG,
    W_NON_MONOTONE,
    W_NONFINITE_LOSS,
    W_NOT_COMPLETED,
    W_NOT_FITTED,
    W_SINGLE_SEED,
    Multiplier,
    ScalingStudy,
    ScalingWarning,
)
from analysis.present.document import Block, Bullets, Details, Fig, Heading, Para, Table
from analysis.present.figures.scaling import scaling_figures
from analysis.present.format import cm_text, fixed, number, pct, sci, with_interval

SCALING_CSV = "scaling"  # one row per arm: fit, intervals, held-out check, compute multipliers
SCALING_RUNGS_CSV = "scaling_rungs"  # one row per (arm, rung): the points each fit saw
MAX_LISTED = 8  # run ids named in one warning


def _runs(ids: tuple[str, ...], status: dict[str, str] | None = None) -> str:
    shown = [f"{r} ({status[r]})" if status and r in status else r for r in ids[:MAX_LISTED]]
    return ", ".join(shown) + (f" and {len(ids) - MAX_LISTED} more" if len(ids) > MAX_LISTED else "")


def warning_text(w: ScalingWarning, study: ScalingStudy, status: dict[str, str] | None = None) -> str:
    """One sentence per warning code."""
    rung = study.rung_labels.get(w.rung, str(w.rung)) if w.rung is not None else ""
    n = len(w.run_ids)
    if w.code == W_NOT_COMPLETED:
        return f"{n} run(s) did not complete and are never fitted: {_runs(w.run_ids, status)}."
    if w.code == W_NO_COMPUTE:
        return (f"{n} completed run(s) have no flops_per_token × tokens in their record and are not fitted: "
                f"{_runs(w.run_ids)}.")  # fmt: skip
    if w.code == W_NONFINITE_LOSS:
        return f"{n} completed run(s) have a non-finite final validation loss and are not fitted: {_runs(w.run_ids)}."
    if w.code == W_NO_RUNG:
        return f"{n} run(s) have no integer ladder.rung and are not placed on the ladder: {_runs(w.run_ids)}."
    if w.code == W_NO_CONFIG:
        return f"{n} run(s) have no readable config and cannot be placed on a rung or an arm: {_runs(w.run_ids)}."
    if w.code == W_NOT_FITTED:
        return f"{w.arm}: {w.value} rung(s) with fitted runs, too few for three parameters: no fit."
    if w.code == W_FEW_RUNGS:
        return (f"{w.arm}: fitted on {w.value} rungs (fewer than {MIN_RUNGS}): three parameters from {w.value} "
                "compute values, so the curve is barely constrained.")  # fmt: skip
    if w.code == W_NON_MONOTONE:
        return (f"{w.arm}: loss does not fall with size at rung {rung}: mean {fixed(w.value)} against "
                f"{fixed(w.previous)} at the rung below.")  # fmt: skip
    if w.code == W_SINGLE_SEED:
        names = ", ".join(study.rung_labels.get(k, str(k)) for k in w.rungs)
        return (f"{w.arm}: {len(w.rungs)} rung(s) have one fitted run ({names}), so their seed noise is not in "
                "the intervals.")  # fmt: skip
    if w.code == W_AT_BOUND:
        return (f"{w.arm}: the fit's {w.param} sits on its bound ({w.value:.4g}): these rungs do not determine "
                f"{w.param}.")  # fmt: skip
    if w.code == W_BOOT_FAILED:
        return f"{w.arm}: {pct(w.value)} of the bootstrap refits failed and are left out of the intervals."
    if w.code == W_LR_AT_EDGE:
        return (f"{w.arm}, rung {rung}: the best learning rate ({w.value:g}) is at an end of the grid; the "
                "optimum may lie beyond it.")  # fmt: skip
    if w.code == W_HELD_OUT_SKIPPED:
        return f"{w.arm}: no held-out check (it needs {MIN_RUNGS} rungs; the arm has {w.value})."
    if w.code == W_HELD_OUT_ABOVE_GOAL:
        return (f"{w.arm}: the held-out rung {rung} is predicted with {pct(w.value)} relative error, above the "
                f"{pct(HELD_OUT_GOAL)} goal.")  # fmt: skip
    if w.code == W_NO_BASELINE_FIT:
        return f"The baseline ({w.arm}) has no fit, so no compute multipliers are given."
    if w.code == W_CM_INFINITE:
        return (f"{w.arm}: at C = {sci(w.value)} its fit goes below the baseline's E: the baseline never "
                "reaches that loss (CM = ∞).")  # fmt: skip
    if w.code == W_BASELINE_NOT_ARM:
        return (f"--baseline {w.value} is not one of the scaling study's arm keys; the baseline is the arm of "
                "the first run launched.")  # fmt: skip
    return f"{w.code}: {w.arm or ''} {w.value if w.value is not None else ''}".strip()


def multiplier_reading(m: Multiplier) -> str:
    """What the interval says, and how far it is extrapolated."""
    if not (number(m.low) and number(m.high)):
        verdict = "no interval"
    elif m.includes_one:
        verdict = "interval includes 1: no evidence of a difference"
    elif m.low > 1:
        verdict = "arm better (interval above 1)"
    else:
        verdict = "baseline better (interval below 1)"
    if not m.beyond_data:
        where = "within the rungs of both fits"
    else:
        where = f"fits extrapolated up to {m.factor:.3g}× beyond their rungs"
        if m.beyond_validated:
            checked = (
                f"held-out check covered {m.validated_factor:.3g}×"
                if number(m.validated_factor)
                else "no held-out check"
            )
            where += f"; beyond the validated range ({checked})"
        else:
            where += f"; within the held-out check's {m.validated_factor:.3g}×"
    if m.infinite_fraction > 0:
        where += f"; ∞ in {pct(m.infinite_fraction)} of resamples"
    return f"{verdict}; {where}"


def _fit_table(study: ScalingStudy) -> Table:
    headers = [
        "arm", "rungs", "runs fitted", "E [95%]", "A [95%]", "α [95%]", "held-out rung", "its mean loss",
        "predicted without it", "relative error", "held-out reach (× compute)",
    ]  # fmt: skip
    rows = []
    for a in study.arms:
        ci = a.intervals
        h = a.held_out
        rows.append([
            a.arm + (" (baseline)" if a.is_baseline else ""),
            str(len(a.rungs)),
            str(sum(len(r.run_ids) for r in a.rungs)),
            with_interval(a.fit.E, *ci["E"]) if a.fit else "–",
            with_interval(a.fit.A, *ci["A"], fmt=sci) if a.fit else "–",
            with_interval(a.fit.alpha, *ci["alpha"]) if a.fit else "–",
            study.rung_labels.get(h.rung, str(h.rung)) if h else "–",
            fixed(h.observed) if h else "–",
            fixed(h.predicted) if h else "–",
            pct(h.rel_error) if h else "–",
            f"{h.factor:.3g}×" if h else "–",
        ])  # fmt: skip
    return Table(headers, rows, frozenset(range(1, len(headers))) - {6})


def _multiplier_table(study: ScalingStudy) -> Table:
    headers = ["arm", "at", "compute C", "CM [95%]", "baseline needs", "reading"]
    rows = [
        [m.arm, "largest rung" if m.at == "largest" else f"{m.at.removesuffix('x')}× the largest rung", sci(m.compute),
         with_interval(m.cm, m.low, m.high, fmt=cm_text), sci(m.baseline_compute), multiplier_reading(m)]
        for m in study.multipliers
    ]  # fmt: skip
    return Table(headers, rows, frozenset({2, 3, 4}))


def _rung_table(study: ScalingStudy) -> Table:
    headers = ["arm", "rung", "non-emb. params", "compute C", "runs", "fitted", "mean loss", "min–max",
               "fit at C", *(["learning rate"] if study.lr_selected else [])]  # fmt: skip
    rows = []
    for a in study.arms:
        for r in a.rungs:
            row = [a.arm, r.label, f"{r.params:,.0f}" if number(r.params) else "–", sci(r.compute), str(r.n_runs),
                   str(len(r.run_ids)), fixed(r.mean_loss), f"{fixed(min(r.losses))}–{fixed(max(r.losses))}",
                   fixed(float(a.fit.loss(r.compute))) if a.fit else "–"]  # fmt: skip
            if study.lr_selected:
                grid = " ".join(f"{v:g}" for v in r.lr_grid)
                row.append(f"{r.lr:g} (of {grid})" if r.lr is not None else "–")
            rows.append(row)
    return Table(headers, rows, frozenset({2, 3, 4, 5, 6, 7, 8}))


def _intro(study: ScalingStudy) -> str:
    arms = f"the values of {', '.join(study.arm_keys)}" if study.arm_keys else "one arm (no other key varies)"
    rungs = (
        f"the values of {study.size}"
        if study.size == RUNG_KEY
        else f"the values of {study.size}, ordered by non-embedding parameter count"
    )
    text = (
        f"Model size varies. Rungs: {rungs} (keys that change with the rung: {', '.join(study.size_keys)}). Arms: "
        f"{arms}; baseline: {study.baseline}. For every arm, the final validation loss of each completed run "
        "against its training compute C = FLOPs/token × tokens (PaLM appendix B) is fitted with "
        "L(C) = E + A·C^(−α) by a Huber loss (δ = "
        f"{study.delta:g}) on log L with bounded parameters and several starting points (Hoffmann et al. 2022, "
        f"approach 3). Intervals: {study.confidence:.0%} percentile bootstrap over {study.n_boot} resamples of "
        "the seeds within each rung, each resample refitted."
    )
    if study.lr_selected:
        text += (
            " The learning rate varies within (arm, rung) cells: each cell is represented by its runs at the "
            "learning rate with the lowest mean final loss over seeds. The choice is made once, on the same runs "
            "the fit then reads (not redone per resample), so each cell's loss is biased slightly low by the pick."
        )
    return text


HOW_TO_READ = (
    "E is the loss the fit approaches with unlimited compute, α how fast the excess A·C^(−α) shrinks. The "
    "compute multiplier CM(C) = L_base⁻¹(L_arm(C)) / C is how many times the baseline's compute it takes to "
    "reach the loss the arm reaches with C: above 1 the arm is better, below 1 worse; ∞ means the arm's "
    "curve goes below the baseline's E, a loss the baseline's fit never reaches. An interval that includes 1 "
    "is no evidence of a difference. Held-out check: each arm is refitted without its largest rung and that "
    "rung's mean loss is predicted (relative error |predicted − observed| / observed; goal ≤ "
    f"{HELD_OUT_GOAL:.0%}); it validates extrapolating by the factor in the table, the largest rung's compute "
    "over the next one's. Multipliers beyond the rungs rest on the fits alone, and further out than that "
    "factor on nothing the data checked. With 2–3 seeds per rung a bootstrap interval is itself uncertain: "
    "each rung's losses are spread by √(n/(n−1)) about their mean before resampling, which corrects the "
    "spread but not the small number of seeds."
)


def scaling_blocks(study: ScalingStudy, status: dict[str, str] | None = None) -> list[Block]:
    """The Scaling section: text, warnings, the fit and multiplier tables, figures, per-rung data."""
    out: list[Block] = [Heading(2, "Scaling"), Para(_intro(study))]
    if study.warnings:
        out.append(Bullets(["Warning: " + warning_text(w, study, status) for w in study.warnings]))
    out.append(_fit_table(study))
    if study.multipliers:
        times = " and ".join(f"{k:g}×" for k in EXTRAPOLATE)
        out.append(Para(f"Compute multipliers against {study.baseline}, at each arm's largest rung and at {times} "
                        "its compute:"))  # fmt: skip
        out.append(_multiplier_table(study))
    out += [Fig(fig, f"{fig.name}.png") for fig in scaling_figures(study)]
    n = sum(len(a.rungs) for a in study.arms)
    out.append(Details(f"Every arm × rung: {n} rows", [_rung_table(study)]))
    out.append(Para(HOW_TO_READ))
    return out
