"""The report's Scaling section: the words, tables and figures for a :class:`analysis.compute.scaling.ScalingStudy`.

Every sentence for people about a scaling study lives here; analysis/compute/scaling.py holds only numbers and
warning codes. The section appears whenever the study varies model size (a ladder, or a sweep over
``model=...`` whose parameter counts differ).
"""

from __future__ import annotations

from analysis.compute import scaling_forms as SF
from analysis.compute.scaling import (
    EXTRAPOLATE,
    HELD_OUT_GOAL,
    MIN_RUNGS,
    RUNG_KEY,
    W_ALLOCATION_EDGE,
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
    W_NOT_CONVERGED,
    W_NOT_FITTED,
    W_OFF_FIT,
    W_SINGLE_SEED,
    W_STALLED,
    Multiplier,
    RungData,
    ScalingStudy,
    ScalingWarning,
)
from analysis.present.document import Block, Bullets, Details, Fig, Heading, Para, Table
from analysis.present.figures.scaling import scaling_figures
from analysis.present.format import OUTSIDE_MARK, cm_text, fixed, number, outside, pct, sci, with_interval
from analysis.sources.values import override_text

SCALING_CSV = "scaling"  # one row per arm: fit, intervals, held-out check, compute multipliers
SCALING_RUNGS_CSV = "scaling_rungs"  # one row per (arm, rung, budget): the points each fit saw
SCALING_FORMS_CSV = "scaling_forms"  # one row per (form, arm): every form's fit, checks and multipliers
SCALING_RANKING_CSV = "scaling_ranking"  # one row per (arm, rung, budget): the single-rung comparison
FORMULA = {
    "per_arm": "E_k + A_k·C^(−α_k)",
    "shared_e": "E + A_k·C^(−α_k)",
    "shared_e_alpha": "E + A_k·C^(−α)",
    "nd_per_arm": "E_k + A_k·N^(−a_k) + B_k·D^(−b_k)",
    "nd_shared_e": "E + A_k·N^(−a_k) + B_k·D^(−b_k)",
    "nd_shared_exponents": "E + A_k·N^(−a) + B_k·D^(−b)",
}
SKIPPED = {
    SF.W_FORM_ONE_BUDGET: "one budget per rung (L(N, D) needs ladder.budgets)",
    SF.W_FORM_OTHER_DATA: "the arms differ in data or tokenizer (no shared entropy floor)",
    SF.W_FORM_NO_ARMS: "one arm",
    SF.W_FORM_FEW_POINTS: "fewer points (or rungs per arm) than it needs",
}
CHOSEN_BY = {
    "requested": "named by ladder.fit",
    "default": "ladder.fit=auto's default",
    "held_out": "ladder.fit=auto: the default failed the held-out goal and this form met it",
}
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
                "model sizes, so the curve is barely constrained.")  # fmt: skip
    if w.code == W_NON_MONOTONE:
        at = f" (budget {w.param})" if w.param and w.param != "1" else ""
        return (f"{w.arm}: loss does not fall with size at rung {rung}{at}: mean {fixed(w.value)} against "
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
        at = f" (budget {w.param})" if len(study.budgets) > 1 else ""
        return (f"{w.arm}, rung {rung}{at}: the best learning rate ({w.value:g}) is at an end of the grid; the "
                "optimum may lie beyond it.")  # fmt: skip
    if w.code == W_HELD_OUT_SKIPPED:
        return (f"{w.arm}: its own fit (the first table) has no held-out check: without the largest rung it keeps "
                f"{w.value} (rung, budget) cell(s), fewer than its 3 parameters (the per_arm form's rule in the "
                "table of forms; a form that shares parameters across arms can still be checked there).")  # fmt: skip
    if w.code == W_HELD_OUT_ABOVE_GOAL:
        return (f"{w.arm}: the held-out rung {rung} is predicted with {pct(w.value)} relative error, above the "
                f"{pct(HELD_OUT_GOAL)} goal.")  # fmt: skip
    if w.code == W_NO_BASELINE_FIT:
        return f"The baseline ({w.arm}) has no fit, so no compute multipliers are given."
    if w.code == W_CM_INFINITE:
        return (f"{w.arm}: at C = {sci(w.value)} its fit goes below the baseline's E: the baseline never "
                "reaches that loss (CM = ∞).")  # fmt: skip
    if w.code == W_STALLED:
        return (f"{w.arm}, rung {rung} (budget {w.param}): {w.value} of {w.previous} run(s) stalled (on the "
                "unigram plateau or flat): the cell is left out of every fit (outside the power-law regime), and "
                "that rung's ranking is inconclusive.")  # fmt: skip
    if w.code == W_OFF_FIT:
        return (f"{w.arm}, rung {rung} (budget {w.param}): its mean loss departs from the chosen fit by "
                f"{pct(w.value)}, more than the {pct(HELD_OUT_GOAL)} held-out goal.")  # fmt: skip
    if w.code == W_NOT_CONVERGED:
        return f"The {w.param} fit stopped at its iteration limit before converging."
    if w.code == W_ALLOCATION_EDGE:
        return (f"{w.arm}: at its largest compute the fit's compute-optimal size, N ≈ {w.previous:,.3g}, needs "
                f"tokens per parameter outside those its runs trained ({w.param}); its curve follows the band's "
                f"edge, {w.value:.3g} tokens per parameter, instead.")  # fmt: skip
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


OUTSIDE_NOTE = (
    f"{OUTSIDE_MARK} marks a point estimate outside its own bootstrap interval: nearly every "
    "resample's refit lands on one side of the fit to the data. The percentile interval describes the resamples, "
    "not this estimate (a fit at or near a bound of its box, or a loss surface with several optima, does this): "
    "read the estimate as unsupported, and its interval as no more than the resamples' spread."
)


def outside_intervals(study: ScalingStudy) -> bool:
    """Does any fitted parameter or multiplier the section shows lie outside its own interval?"""
    checks = [(getattr(a.fit, p), *a.intervals.get(p, (float("nan"),) * 2)) for a in study.arms if a.fit
              for p in ("E", "A", "alpha")]  # fmt: skip
    for ff in study.forms.values():
        if ff.fitted and ff.raw is not None:
            key = "E" if "E" in ff.intervals else "E[0]"
            checks.append((float(ff.raw[0, 0]), *ff.intervals.get(key, (float("nan"),) * 2)))
    ms = [m for ms in study.form_multipliers.values() for m in ms] + list(study.multipliers)
    checks += [(m.cm, m.low, m.high) for m in ms]
    return any(outside(v, lo, hi) for v, lo, hi in checks)


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
            str(len({r.rung for r in a.rungs})),
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
    several = len(study.budgets) > 1
    n_name = "non-emb. params" if study.params_key == "non_embedding" else "params (total)"
    chosen = f"{study.chosen} fit at C" if study.chosen else "chosen fit"
    headers = ["arm", "rung", *(["budget"] if several else []), n_name, "compute C", "runs", "fitted", "stalled",
               "mean loss", "min–max", "own fit at C", chosen, *(["learning rate"] if study.lr_selected else []),
               *study.tuned]  # fmt: skip
    rows = []
    for i, a in enumerate(study.arms):
        for r in a.cells:
            row = [a.arm, r.label, *([f"{r.budget:g}"] if several else []),
                   f"{r.params:,.0f}" if number(r.params) else "–", sci(r.compute), str(r.n_runs),
                   _fitted_text(r), str(r.stalled), fixed(r.mean_loss),
                   f"{fixed(min(r.losses))}–{fixed(max(r.losses))}",
                   fixed(float(a.fit.loss(r.compute))) if a.fit else "–", fixed(study.chosen_loss(i, r))]  # fmt: skip
            if study.lr_selected:
                grid = " ".join(f"{v:g}" for v in r.lr_grid)
                row.append(f"{r.lr:g} (of {grid})" if r.lr is not None else "–")
            row += [override_text(r.setting.get(k)) if k in r.setting else "–" for k in study.tuned]
            rows.append(row)
    first = 3 if several else 2
    return Table(headers, rows, frozenset(range(first, first + 10)))


def _fitted_text(r: RungData) -> str:
    """How many of a cell's runs the fits use: all of them, or none, and why."""
    if r.unfitted:
        return "0 (budget not fitted)"
    return "0 (left out)" if r.stalled else str(len(r.run_ids))


def _forms_table(study: ScalingStudy) -> Table:
    """Every form side by side: its parameters, held-out checks and the multipliers of each arm."""
    headers = ["form", "L of arm k", "params / points", "E [95%]", "held-out rung error (worst arm)",
               "leave-one-budget-out (worst)", "arm", *[f"CM {at} [95%]" for at in _ats()]]  # fmt: skip
    rows = []
    for name in study.forms:
        rows += _form_rows(study, name, name + (" (chosen)" if name == study.chosen else ""))
    every = study.every_budget
    if every is not None and every.chosen is not None:  # the fit window's sensitivity check
        budgets = ", ".join(f"{b:g}" for b in every.budgets)
        rows += _form_rows(every, every.chosen, f"{every.chosen} on every budget ({budgets}; a check, no claim)")
    return Table(headers, rows, frozenset({2, 3, 4, 5, 7, 8, 9}))


def _form_rows(study: ScalingStudy, name: str, label: str) -> list[list[str]]:
    """The forms table's rows of one form of ``study``: one per arm compared with the baseline."""
    ff = study.forms[name]
    if not ff.fitted:
        why = SKIPPED.get(ff.why_not or "", "not fitted")
        return [[label, FORMULA[name], f"{ff.n_params} / {ff.n_cells}", "–", f"skipped: {why}", "–", "–",
                 *["–"] * len(_ats())]]  # fmt: skip
    e_name = "E" if "E" in ff.intervals else "E[0]"
    e = with_interval(float(ff.raw[0, 0]), *ff.intervals[e_name]) + ("" if "E" in ff.intervals else " (baseline)")
    worst = max((ff.held_out_error(k) for k in range(ff.n_arms)), default=float("nan"))
    lobo = max((ff.lobo_error(k) for k in range(ff.n_arms)), default=float("nan"))
    reach = f" (reach {ff.held_out_factor:.3g}×)" if number(ff.held_out_factor) else ""
    mults = study.form_multipliers.get(name, [])
    rows = []
    for arm in [a.arm for a in study.arms[1:]] or ["–"]:
        by_at = {m.at: m for m in mults if m.arm == arm}
        cms = [with_interval(m.cm, m.low, m.high, fmt=cm_text) + (" †" if m.beyond_validated else "")
               if (m := by_at.get(at)) else "–" for at in ("largest", *[f"{k:g}x" for k in EXTRAPOLATE])]  # fmt: skip
        rows.append([label, FORMULA[name], f"{ff.n_params} / {ff.n_cells}", e, pct(worst) + reach, pct(lobo), arm,
                     *cms])  # fmt: skip
    return rows


def _ats() -> list[str]:
    return ["largest rung", *[f"{k:g}×" for k in EXTRAPOLATE]]


def _ranking_blocks(study: ScalingStudy) -> list[Block]:
    """The single-rung ranking at every (rung, budget), and whether the fitted multiplier agrees with it."""
    if not study.rankings:
        return []
    several = len(study.budgets) > 1
    headers = ["arm", "rung", *(["budget"] if several else []), "compute C", "Δ loss (arm − baseline) [95%]",
               "interval", "decision"]  # fmt: skip
    rows = []
    for r in study.rankings:
        decided = {"arm": "arm better", "baseline": "baseline better"}.get(r.winner or "", "undecided")
        if r.stalled:
            decided = f"inconclusive ({r.stalled} stalled)"
        rows.append([r.arm, study.rung_labels.get(r.rung, str(r.rung)), *([f"{r.budget:g}"] if several else []),
                     sci(r.compute), with_interval(r.diff, r.low, r.high), "paired t" if r.paired else "Welch",
                     decided])  # fmt: skip
    out: list[Block] = [
        Para(
            "Single-rung ranking (DataDecide: the smallest rung's ranking alone already predicts most decisions "
            "at scale, and no extrapolation beat it there): at every rung the difference of mean final losses, "
            f"with its {study.confidence:.0%} interval."
        ),  # fmt: skip
        Table(headers, rows, frozenset({3, 4} if several else {2, 3})),
    ]
    out += [Para(text) for text in agreement_texts(study)]
    return out


def agreement_texts(study: ScalingStudy) -> list[str]:
    """Does the chosen fit's multiplier at the largest rung order the arms as the rungs do?"""
    texts = []
    for arm in [a.arm for a in study.arms[1:]]:
        m = next((m for m in study.multipliers if m.arm == arm and m.at == "largest"), None)
        mine = [r for r in study.rankings if r.arm == arm]
        if m is None or not mine:
            continue
        decided = [r for r in mine if r.winner is not None]
        fit_says = None if m.includes_one else ("arm" if m.low > 1 else "baseline")
        agree = sum(r.winner == fit_says for r in decided)
        smallest = min(mine, key=lambda r: (r.rung, -r.budget))
        small = {"arm": "the arm", "baseline": "the baseline", None: "neither (undecided)"}[smallest.winner]
        fit_text = {"arm": "the arm better", "baseline": "the baseline better", None: "no difference (CM's interval "
                    "includes 1)"}[fit_says]  # fmt: skip
        texts.append(
            f"{arm}: the chosen fit ({study.chosen}) says {fit_text} at the largest rung; "
            f"{len(decided)} of {len(mine)} rungs decide, {agree} of them the same way"
            + (f", {len(decided) - agree} the other way" if len(decided) - agree else "")
            + f". The smallest rung alone says {small}"
            + (
                ""
                if smallest.winner is None or fit_says is None
                else (", as the fit does." if smallest.winner == fit_says else ", unlike the fit.")
            )  # fmt: skip
        )
    return texts


def _task_blocks(study: ScalingStudy) -> list[Block]:
    tasks = study.tasks
    if tasks is None or not tasks.tasks:
        return []
    several = len({c.budget for t in tasks.tasks for c in t.checks}) > 1  # the held-out rung at each budget
    headers = ["task", "arm", "held-out rung", *(["budget"] if several else []), "BPB measured", "BPB predicted",
               "relative error", "acc measured", "acc from measured BPB", "acc chained", "chained error (points)"]  # fmt: skip
    rows = []
    for t in tasks.tasks:
        if not t.checks:
            rows.append([t.task, "–", "–", *(["–"] if several else []), "–", "–",
                         f"no check ({t.why_not or 'the fit without the rung failed'})", "–", "–", "–", "–"])  # fmt: skip
        for c in t.checks:
            rows.append([t.task, study.arms[c.arm].arm, study.rung_labels.get(c.rung, str(c.rung)),
                         *([f"{c.budget:g}"] if several else []),
                         fixed(c.bpb_observed), fixed(c.bpb_predicted), pct(c.bpb_rel_error), pct(c.acc_observed),
                         pct(c.acc_from_bpb), pct(c.acc_chained), f"{c.acc_points:.2f}" if number(c.acc_points) else "–"])  # fmt: skip
    return [
        Para(
            "Task prediction in two steps (Bhagia et al. 2024): step 1 fits each arm's task loss (bits per byte of "
            "the correct answer) against compute, step 2 one sigmoid from task loss to accuracy across arms; both "
            "refitted without each arm's largest rung, which they then predict."
        ),  # fmt: skip
        Table(headers, rows, frozenset(range(4 if several else 3, 11 if several else 10))),
    ]


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
    n_name = "non-embedding parameters" if study.params_key == "non_embedding" else "all parameters"
    text += (
        f" FLOPs/token counts the output layer's matmul whether or not it is tied to the embedding (PaLM app. B), "
        f"and N (the budget's parameter count, ladder.params) is {n_name}."
    )
    if len(study.budgets) > 1:
        text += (f" Each rung trained {len(study.budgets)} budgets ({', '.join(f'{b:g}' for b in study.budgets)} × "
                 "tokens_per_param × N; the smaller ones decay branches of the largest, WSD-S): the points of an arm "
                 "are its (rung, budget) cells.")  # fmt: skip
    if study.fit_budgets is not None:
        by = ("set at report time (--fit-budgets), over what the runs recorded" if "--fit-budgets" in
              study.set_at_report else "ladder.fit_budgets")  # fmt: skip
        text += (f" The fits use only the cells of budget {', '.join(f'{b:g}' for b in study.fit_budgets)} ({by}); "
                 "the other budgets' cells are in the rung table and the single-rung ranking, in no fit.")  # fmt: skip
        if study.every_budget is not None:
            text += (" As a check of that window, the chosen form is refitted on every budget (the rows 'on every "
                     "budget' of the table of forms); no claim reads it, but a claim it would decide otherwise says "
                     "so.")  # fmt: skip
    if "--fit" in study.set_at_report:
        text += " The form the claims use was set at report time (--fit), over the runs' ladder.fit."
    if study.chosen is not None:
        text += (f" The multipliers below and the claims come from the {study.chosen} form, L = "
                 f"{FORMULA[study.chosen]} ({CHOSEN_BY[study.chosen_by]}); every form is in the table of forms.")  # fmt: skip
        if not study.same_data:
            text += " The arms differ in data or tokenizer, so no form shares parameters across them."
    if study.lr_selected:
        text += (
            " The learning rate varies within (arm, rung) cells: each cell is represented by its runs at the "
            "learning rate with the lowest mean final loss over seeds. The choice is made once, on the same runs "
            "the fit then reads (not redone per resample), so each cell's loss is biased slightly low by the pick."
        )
        if any(r.seed_adjusted for a in study.arms for r in a.rungs):
            text += (
                " Where a cell's learning rates ran different seeds (a further seed at its best ones), the means are "
                "seed-adjusted: loss = LR effect + seed effect by least squares, the LR table's rule, so a seed's "
                "draw cannot move the pick by itself."
            )
    if study.tuned:
        keys = ", ".join(study.tuned)
        text += (
            f" {keys} ({'set at report time (--tune)' if '--tune' in study.set_at_report else 'ladder.tune'}) varies "
            "within the arms: it is tuned, not compared; each cell is represented by "
            f"its runs at the setting of {keys}{' and the learning rate' if study.lr_selected else ''} with the "
            "lowest mean final loss over seeds (the rung table shows the setting chosen)."
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
    if outside_intervals(study):
        out.append(Para(OUTSIDE_NOTE))
    if study.forms:
        out.append(Para("Every form fitted to all arms at once (k: the arm; C compute, N parameters, D tokens). "
                        "Held-out: every arm's largest rung left out and predicted (worst relative error over arms, "
                        "and how far in compute it extrapolated); leave-one-budget-out: each budget in turn, with "
                        "three budgets or more. † beyond the validated range. An L(N, D) form's multiplier compares "
                        "each arm's best allocation of compute within the tokens per parameter its runs trained (the "
                        "compute-optimal frontier where that lies inside them)."))  # fmt: skip
        out.append(_forms_table(study))
    if study.multipliers:
        times = " and ".join(f"{k:g}×" for k in EXTRAPOLATE)
        out.append(Para(f"Compute multipliers against {study.baseline}, at each arm's largest rung and at {times} "
                        "its compute:"))  # fmt: skip
        out.append(_multiplier_table(study))
    out += [Fig(fig, f"{fig.name}.png") for fig in scaling_figures(study)]
    out += _ranking_blocks(study)
    out += _task_blocks(study)
    n = sum(len(a.cells) for a in study.arms)
    out.append(Details(f"Every arm × rung: {n} rows", [_rung_table(study)]))
    out.append(Para(HOW_TO_READ))
    return out
