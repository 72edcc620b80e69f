"""The report's Claims section and Findings list: the words for an :class:`analysis.compute.claims.ClaimSet`.

Every sentence for people about claims lives here (analysis/compute/claims.py holds numbers and verdict codes);
the HTML/Markdown report (analysis/report.py) and the W&B report (analysis/publish/report.py) both use it.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from analysis.compute.best_lr import BestLR
from analysis.compute.claims import (
    CONTRADICTED,
    HELD,
    INCONCLUSIVE,
    MIXED,
    NOTE_ALLOCATION_EDGE,
    NOTE_BEYOND_VALIDATED,
    NOTE_CELL_BEST_LR,
    NOTE_FIT_OFF_GOAL,
    NOTE_FIT_WINDOW,
    NOTE_GRIDS_DIFFER,
    NOTE_LR_AT_EDGE,
    NOTE_SEEDS_LEFT_OUT,
    NOTE_SPEED_UNSTEADY,
    SPEED_SPREAD_LIMIT,
    UNTESTED,
    WHY_FIT_OFF_GOAL,
    WHY_NO_ARM,
    WHY_NO_ARM_VALUES,
    WHY_NO_BASELINE,
    WHY_NO_BASELINE_VALUES,
    WHY_NO_BPB,
    WHY_NO_CONTEXT,
    WHY_NO_INTERVAL,
    WHY_NO_MULTIPLIER,
    WHY_NO_SCALING,
    WHY_NOT_SCALING_BASELINE,
    WHY_NOT_VARIED,
    WHY_SPEED_UNSTEADY,
    WHY_STALLED,
    WHY_UNKNOWN_KEY,
    ClaimResult,
    ClaimSet,
    Effect,
)
from analysis.compute.compare import TEST_PAIRED, TEST_WELCH
from analysis.compute.scaling import HELD_OUT_GOAL
from analysis.present.document import Block, Bullets, Details, Heading, Para, Table
from analysis.present.format import finite
from analysis.sources.values import override_text
from lm_ablate import metrics as M
from lm_ablate.claim_spec import EQUAL, HIGHER, LOWER, METRICS, Claim

MAX_CONTEXTS_IN_FINDING = 4
METRIC_WORDS = {
    "final_val_loss": "final val loss",
    "best_val_loss": "best val loss",
    "capped_val_loss": "final val loss capped at ln V (diverged = ln V)",
    "val_loss_at_context": "val loss at {k}x the training context",
    "extrapolation_gap": "val loss at {k}x minus at 1x the training context",
    "grad_norm_spike_rate": "grad-norm spikes per 1k steps",
    "loss_spike_rate": "loss spikes per 1k steps",
    "tokens_per_sec": "tokens/s",
    "max_attn_logit": "max attention logit",
    "init_grad_growth": "last-block / first-block grad norm at init",
    "lr_sensitivity": "LR sensitivity",
    "compute_multiplier": "compute multiplier",
    "final_val_bpb": "val bits per byte",
    "downstream": "{task} {kind}",  # the claim's task and kind: shakespeare_order acc
    "relative_val_loss": "final val loss vs the best value, %",  # basin claims (analysis/compute/basin.py)
    "relative_val_bpb": "final val bits per byte vs the best value, %",
}
WHY_TEXT = {
    WHY_UNKNOWN_KEY: "a key it names is not a config key of these runs",
    WHY_NOT_VARIED: "its axis does not vary in these runs",
    WHY_NO_CONTEXT: "no run has its context values",
    WHY_NO_ARM: "no run of the arm here",
    WHY_NO_BASELINE: "no run of the baseline here",
    WHY_NO_ARM_VALUES: "no run of the arm has a value (not completed, or the metric was not logged)",
    WHY_NO_BASELINE_VALUES: "no run of the baseline has a value (not completed, or the metric was not logged)",
    WHY_NO_INTERVAL: "one seed per side: no interval",
    WHY_NO_BPB: f"val bits per byte {M.NO_BPB_RECORDED}",
    WHY_NO_SCALING: "the runs do not vary model size (no scaling fit)",
    WHY_NOT_SCALING_BASELINE: "compute multipliers are against the scaling study's baseline, not this one",
    WHY_NO_MULTIPLIER: "the scaling study has no multiplier for the arm there",
    WHY_STALLED: "stalled seeds are no data points of an effect",
    WHY_FIT_OFF_GOAL: (
        f"the fit predicts a held-out rung with more than {HELD_OUT_GOAL:.0%} error (the Scaling section's "
        "held-out checks): what it extrapolates is no evidence"
    ),
    WHY_SPEED_UNSTEADY: (
        f"tokens/s varies more than {SPEED_SPREAD_LIMIT:g}x between the runs of a side (at every LR of its grid): "
        "the machine's load changed while they ran, so the ratio is not to be trusted"
    ),
}
NOTE_OF_WHY = {WHY_SPEED_UNSTEADY: NOTE_SPEED_UNSTEADY, WHY_FIT_OFF_GOAL: NOTE_FIT_OFF_GOAL}  # the note a reason says
NOTE_TEXT = {
    NOTE_BEYOND_VALIDATED: "the fits are extrapolated further than the held-out rung checked them: read with care",
    NOTE_FIT_OFF_GOAL: f"the fit missed its held-out rung by more than {HELD_OUT_GOAL:.0%}",
    NOTE_ALLOCATION_EDGE: (
        "a curve compared follows the edge of the tokens per parameter its runs trained (the fit's compute-optimal "
        "allocation lies outside them)"
    ),
    NOTE_SPEED_UNSTEADY: (
        f"tokens/s varies more than {SPEED_SPREAD_LIMIT:g}x between the runs of a side (at every LR of its grid): "
        "not to be trusted"
    ),
    NOTE_FIT_WINDOW: (
        "fitted on every budget instead of ladder.fit_budgets' window, the same form would not decide the same way "
        "(Scaling: the table of forms, its every-budget row)"
    ),
    NOTE_GRIDS_DIFFER: "the arm and the baseline ran different LR grids",
    NOTE_LR_AT_EDGE: "a value it rests on has its best LR at an edge of its grid (its loss may be lower beyond it)",
    NOTE_SEEDS_LEFT_OUT: "seeds that missed an LR of their grid were left out",
}
CELL_BEST_LR_TEXT = "each (arm, rung, budget) fitted at its best LR (Scaling: the fitted runs' table)"
VERDICT_TEXT = {HELD: "held", CONTRADICTED: "contradicted", INCONCLUSIVE: "inconclusive", UNTESTED: "untested",
                MIXED: "mixed"}  # fmt: skip


def metric_text(claim: Claim) -> str:
    k = override_text(claim.at) if claim.at is not None else "4"
    words = METRIC_WORDS.get(claim.metric, claim.metric).replace("{k}", k)
    return words.replace("{task}", str(claim.task)).replace("{kind}", str(claim.kind))


def _digits(claim: Claim) -> int:
    return 2 if claim.metric.endswith("spike_rate") else 4


def sides(claim: Claim) -> tuple[str, str]:
    """How the report names a claim's two sides: arm and baseline; a basin claim's values in its range and the best
    value."""
    if claim.over is not None:
        low, high = claim.over
        ends = ("−∞" if low is None else override_text(low), "∞" if high is None else override_text(high))
        return f"{claim.axis} in [{ends[0]}, {ends[1]}]", "the best value"
    return override_text(claim.arm), override_text(claim.baseline)


def _infinite(x: Any) -> bool:
    return isinstance(x, float) and math.isinf(x) and x > 0


def value_text(x: Any, claim: Claim, signed: bool = True) -> str:
    if not finite(x):
        return "∞" if _infinite(x) else "–"
    if claim.spec.ratio:
        return f"{x:.3f}×"
    return f"{x:{'+' if signed else ''}.{_digits(claim)}f}"


def interval_text(low: Any, high: Any, claim: Claim) -> str:
    """``[low, high]``; an upper end of +∞ (a compute multiplier's bootstrap) is shown as ∞, as the Scaling
    table shows it; "" when either end is missing."""
    if not (finite(low) and (finite(high) or _infinite(high))):
        return ""
    return f"[{_bound(low, claim)}, {_bound(high, claim)}]"


def _bound(x: float, claim: Claim) -> str:
    if _infinite(x):
        return "∞"
    return f"{x:.3f}" if claim.spec.ratio else f"{x:+.{_digits(claim)}f}"


def effect_text(effect: Effect | None, claim: Claim) -> str:
    if effect is None:
        return "–"
    ci = interval_text(effect.low95, effect.high95, claim)
    return value_text(effect.estimate, claim) + (f" {ci}" if ci else "")


def comparison_text(claim: Claim) -> str:
    """``post − pre`` or ``rmsnorm / layernorm``: what the effect is."""
    op = " / " if claim.spec.ratio else " − "
    if claim.spec.basin:
        return "the deciding value vs the best value (%)"
    return op.join(sides(claim))


def expectation_text(claim: Claim) -> str:
    """``final val loss: post higher than pre``."""
    arm, base = sides(claim)
    if claim.spec.basin:
        words = "within" if claim.expect == "within" else "worse by at least"
        return f"{metric_text(claim)}: {words} {claim.margin:g}% at every {arm}"
    if claim.expect == LOWER:
        rel = f"{arm} lower than {base}"
    elif claim.expect == HIGHER:
        rel = f"{arm} higher than {base}"
    elif claim.expect == EQUAL and claim.spec.ratio:
        rel = f"{arm} within a factor {1 + float(claim.margin or 0):g} of {base}"
    else:
        rel = f"{arm} within ±{claim.margin:g} of {base}"
    return f"{metric_text(claim)}: {rel}"


def test_text(effect: Effect | None) -> str:
    if effect is None or not effect.test:
        return ""
    if effect.test == TEST_PAIRED:
        return f"paired t ({effect.n_pairs} seeds)"
    if effect.test == TEST_WELCH:
        return f"Welch t ({effect.n_arm} vs {effect.n_baseline} runs)"
    return effect.test


def stalled_text(result: ClaimResult) -> str:
    """``2 of 3 seeds of pre stalled`` for each side with stalled seeds where it was decided; "" when none."""
    c = result.claim
    arm, base = sides(c)
    counts = ((arm, result.arm_stalled), (base, result.baseline_stalled))
    what = "fitted runs" if c.metric == "compute_multiplier" else "seeds"  # a ladder: seeds x rungs x budgets
    return "; ".join(f"{k} of {n} {what} of {name} stalled" for name, (k, n) in counts if k)


def reason_text(result: ClaimResult) -> str:
    if result.why == WHY_STALLED:
        parts = [stalled_text(result)]
    else:
        parts = [WHY_TEXT.get(result.why, result.why)] if result.why else []
        if stalled_text(result):  # a metric about failing to train: its stalled seeds are data, and said so
            at_init = result.claim.spec.at_init and not result.claim.counts_failures
            data = " (data of this metric)" if result.claim.spec.failures else " (data: the claim counts failures)"
            parts.append(stalled_text(result) + (" (later; this metric is read at initialization)" if at_init
                                                 else data))  # fmt: skip
    if result.effect is not None:
        said = {NOTE_CELL_BEST_LR, NOTE_OF_WHY.get(result.why, "")}  # said by "decided at", or by the reason
        parts += [NOTE_TEXT.get(n, n) for n in result.effect.notes if n not in said]
    return "; ".join(parts)


def best_lr_text(name: str, best: BestLR | None) -> str:
    """``post at LR 0.003 (grid 0.001 0.003 0.01)``, with ``⚠ grid edge`` when it is at an end of its grid."""
    if best is None:
        return ""
    grid = " ".join(override_text(v) for v in best.grid)
    edge = " ⚠ grid edge" if best.at_edge else ""
    picked = ", seed-adjusted" if best.seed_adjusted else ""
    return f"{name} at LR {override_text(best.lr)}{edge} (grid {grid}{picked})"


def decided_at_text(result: ClaimResult) -> str:
    """Where each side was taken when its LR was chosen per side; "" when the claim was decided at one setting."""
    c = result.claim
    if result.effect is not None and NOTE_CELL_BEST_LR in result.effect.notes:
        return CELL_BEST_LR_TEXT
    arm, base = sides(c)
    if c.spec.basin and result.effect is not None:  # the deciding value: r(x) is the effect of its runs
        arm = "the deciding value"
    parts = [best_lr_text(arm, result.arm_lr), best_lr_text(base, result.baseline_lr)]
    return "; ".join(p for p in parts if p)


def seeds_text(result: ClaimResult) -> str:
    """Each compared seed's value, per side, stalled ones marked: shown wherever a side has stalled seeds (a
    bimodal cell is not to be read from its mean and interval alone)."""
    e, c = result.effect, result.claim
    if (
        e is None
        or not (result.arm_stalled[0] or result.baseline_stalled[0])
        or not (e.arm_points or e.baseline_points)
    ):
        return ""  # no per-seed values (a compute multiplier): the Scaling section's tables list the runs
    stalled = set(result.stalled_runs)
    parts = []
    for name, points in zip(sides(c), (e.arm_points, e.baseline_points)):
        shown = [value_text(v, c, signed=False) + (" (stalled)" if run in stalled else "") for run, _, v in points]
        parts.append(f"{name} seeds: " + ", ".join(shown))
    return "; ".join(parts)


def source_short(claim: Claim) -> str:
    """``Xiong et al. 2020`` from ``Xiong et al. 2020, On Layer Normalization ... (arXiv:...)``."""
    return claim.source.split(",")[0].strip()


# --- the Claims section ---------------------------------------------------------------------------------
CLAIMS_RULES = (
    "Each claim is decided from these runs: the effect is arm − baseline (arm / baseline for a ratio metric, "
    "tested on logs) with the report's statistics (paired t over shared seeds, else Welch). Held: the 95% interval "
    "lies on the expected side of 0 (of 1 for a ratio); contradicted: it lies on the other side; for 'equal within "
    "a margin', held when the 90% interval lies inside the margin (two one-sided tests at 5%, TOST) and "
    "contradicted when the 95% interval lies entirely outside it; inconclusive otherwise; untested when the runs "
    "hold no value for one side. A claim that applies to several contexts (values of the other varied axes) is "
    "decided in each. Each side is taken at its own best learning rate (the LR of its grid with the lowest mean "
    "final val loss over its completed seeds, seed-adjusted where its LRs ran different seeds: loss = LR effect + "
    "seed effect, fitted by least squares; 'decided at' says which, ⚠ at an end of the grid) unless the claim pins "
    "the LR in its context (a claim about a fixed regime). Capped val loss caps every run at ln V, the uniform "
    "prediction's loss (a diverged run counts as ln V)."
)
RULES_SUMMARY = "How a verdict is decided (intervals, the best LR of each side, stalled seeds)"
DETAILS_SUMMARY = "Each claim in each context: where each side was taken, the test, the seeds, notes"


def stall_rule(claims: ClaimSet) -> str:
    """Which claims count a stalled run as a data point, from the claim spec (lm_ablate/claim_spec.py): metrics
    about failing to train (``MetricSpec.failures``), metrics read at initialization (``MetricSpec.at_init``), and
    any claim that says ``counts_failures: true``, naming those of this study that do so on another metric."""
    failing = [name for name, spec in METRICS.items() if spec.failures]
    at_init = [name for name, spec in METRICS.items() if spec.at_init]
    text = (
        "A side with stalled seeds where it is decided (on the data's unigram plateau or flat: lm_ablate/stall.py) "
        "makes the claim inconclusive, its seeds listed one by one, except where a stalled run is a data point: "
        f"on a metric about failing to train ({', '.join(failing)}), on a metric read at initialization, before "
        f"any stall ({', '.join(at_init)}), and on any metric for a claim that declares counts_failures: true "
        "(it is about training worse or not at all)"
    )
    flagged = [c for c in claims.claims if c.counts_failures and not c.spec.failures and not c.spec.at_init]
    if flagged:
        text += "; here " + "; ".join(f"{c.id} ({c.metric_name})" for c in flagged)
    return text + "."


def _context_effect(result: ClaimResult, several: bool, differ: bool, note: str) -> str:
    """One context's part of the answer: ``ctx: post − pre = +0.41 [+0.30, +0.52] (held; note)``."""
    c, e = result.claim, result.effect
    where = f"{result.context}: " if several else ""
    if e is None:
        return f"{where}not tested ({note or VERDICT_TEXT[result.verdict]})"
    text = f"{where}{comparison_text(c)} = {effect_text(e, c)}"
    if c.expect == EQUAL and interval_text(e.low90, e.high90, c):
        text += f", 90% CI {interval_text(e.low90, e.high90, c)}"
    said = ([VERDICT_TEXT[result.verdict]] if differ else []) + ([note] if note else [])
    return text + (f" ({'; '.join(said)})" if said else "")


def effect_cell(claims: ClaimSet, claim: Claim) -> str:
    """Each context's effect with its 95% interval, its verdict where the contexts differ and its reason or notes;
    a note every tested context shares is said once, at the end."""
    results = claims.of(claim.id)
    several, differ = len(results) > 1, len({r.verdict for r in results}) > 1
    notes = [reason_text(r) for r in results]
    shared = notes[0] if several and notes[0] and len(set(notes)) == 1 and all(r.effect for r in results) else ""
    parts = [_context_effect(r, several, differ, "" if shared else n) for r, n in zip(results, notes)]
    return "; ".join(parts) + (f" (in every context: {shared})" if shared else "") if parts else "–"


def verdict_cell(claims: ClaimSet, claim: Claim) -> str:
    """``held``, ``held in all 2 contexts`` or ``mixed (held in 1, inconclusive in 1 of 2 contexts)``."""
    results = claims.of(claim.id)
    overall = VERDICT_TEXT[claims.verdict(claim.id)]
    if len(results) < 2:
        return overall
    verdicts = [r.verdict for r in results]
    if len(set(verdicts)) == 1:
        return f"{overall} in all {len(results)} contexts"
    tally = [f"{VERDICT_TEXT[v]} in {verdicts.count(v)}" for v in (HELD, CONTRADICTED, INCONCLUSIVE, UNTESTED)
             if v in verdicts]  # fmt: skip
    return f"{overall} ({', '.join(tally)} of {len(results)} contexts)"


def answer_table(claims: ClaimSet) -> Table:
    """The report's first table: one row per claim, its verdict first, then its effect with the 95% interval in
    each context, then what it claims."""
    rows = []
    for c in claims.claims:
        claim = f"{c.id}: {c.statement.rstrip('.')} ({source_short(c)}). Expected: {expectation_text(c)}."
        rows.append([verdict_cell(claims, c), effect_cell(claims, c), claim])
    return Table(["verdict", "effect [95% CI]", "claim"], rows)


def detail_table(claims: ClaimSet) -> Table:
    """One row per claim and context: where each side was taken, the effect with the seeds, the test, the notes."""
    headers = ["claim", "context", "decided at", "effect [95% CI]", "test", "verdict"]
    rows = []
    for r in claims.results:
        c, e = r.claim, r.effect
        effect = f"{comparison_text(c)} = {effect_text(e, c)}" if e is not None else "–"
        if e is not None and c.expect == EQUAL and interval_text(e.low90, e.high90, c):
            effect += f"; 90% CI {interval_text(e.low90, e.high90, c)}"
        if seeds_text(r):
            effect += f"; {seeds_text(r)}"
        note = reason_text(r)
        rows.append([f"{c.id} ({c.source})", r.context, decided_at_text(r) or "–", effect, test_text(e) or "–",
                     VERDICT_TEXT[r.verdict] + (f" ({note})" if note else "")])  # fmt: skip
    return Table(headers, rows)


def claims_blocks(claims: ClaimSet) -> list[Block]:
    """The answer first: the heading and one row per claim (verdict, effect, claim); then, folded, the rules and
    the table of every claim in every context; then any claim-definition problems."""
    out: list[Block] = [
        Heading(2, "Claims"),
        answer_table(claims),
        Details(RULES_SUMMARY, [Para(CLAIMS_RULES + " " + stall_rule(claims))]),
        Details(DETAILS_SUMMARY, [detail_table(claims)]),
    ]
    problems = [f"{run}: {err} (its claims are ignored)" for run, err in claims.invalid]
    problems += [
        f"Claim {cid} is defined differently in different runs (the study file changed between runs): the "
        f"definition of {used} of its {total} runs is used."
        for cid, (used, total) in claims.conflicts.items()
    ]
    if problems:
        out.append(Bullets(problems))
    return out


# --- the Findings list ----------------------------------------------------------------------------------
def claim_finding(claims: ClaimSet, claim: Claim) -> str:
    """One sentence: the verdict (with its count per context when there are several), the claim, and the
    effect with its 95% interval in each context it was decided in."""
    results = claims.of(claim.id)
    overall = claims.verdict(claim.id)
    tested = [r for r in results if r.effect is not None]
    counts = ""
    if len(results) > 1 and (overall == MIXED or len({r.verdict for r in results}) > 1):
        tally = {v: sum(r.verdict == v for r in results) for v in (HELD, CONTRADICTED, INCONCLUSIVE, UNTESTED)}
        counts = " (" + ", ".join(f"{VERDICT_TEXT[v]} in {n}" for v, n in tally.items() if n)
        counts += f" of {len(results)} contexts)"
    elif len(results) > 1:
        counts = f" in all {len(results)} contexts"
    head = f"{VERDICT_TEXT[overall].capitalize()}{counts}: {claim.statement.rstrip('.')} ({source_short(claim)})"
    if not tested:
        why = "; ".join(dict.fromkeys(WHY_TEXT.get(r.why, r.why) for r in results if r.why))
        return f"{head}: not tested here ({why})."
    parts = []
    for r in tested[:MAX_CONTEXTS_IN_FINDING]:
        where = "" if r.context == "all runs" else f" at {r.context}"
        verdict = f" ({VERDICT_TEXT[r.verdict]})" if len(results) > 1 else ""
        if r.why == WHY_STALLED:
            verdict = f" ({VERDICT_TEXT[r.verdict]}: {stalled_text(r)})"
        parts.append(f"{effect_text(r.effect, claim)}{where}{verdict}")
    more = len(tested) - MAX_CONTEXTS_IN_FINDING
    tail = f"; {more} more in the Claims table" if more > 0 else ""
    return f"{head}; {metric_text(claim)}, {comparison_text(claim)}: " + "; ".join(parts) + tail + "."


def effect_finding(row: pd.Series, baseline: str) -> str:
    context = "" if row["context"] == "all runs" else f" ({row['context']})"
    p = row["p_value"]
    p_words = "p < 0.001" if finite(p) and p < 0.001 else f"p = {p:.3f}" if finite(p) else ""
    return (
        f"{row['axis']} = {row['arm']} vs {baseline}{context}: final val loss Δ {row['delta_final_val_loss']:+.4f} "
        f"[{row['delta_ci_low']:+.4f}, {row['delta_ci_high']:+.4f}]" + (f", {p_words}" if p_words else "") + "."
    )


def findings(claims: ClaimSet | None, effects: pd.DataFrame, baselines: dict[str, str]) -> list[str]:
    """The summary's first list: every claim's verdict with its numbers, then the largest effects on final
    val loss (``effects``: rows of the comparison table, from analysis.compute.claims.largest_effects; ``baselines``:
    axis label -> its baseline arm)."""
    items = [claim_finding(claims, c) for c in claims.claims] if claims is not None else []
    if len(effects):
        items += [
            "Largest effect: " + effect_finding(row, baselines.get(row["axis"], "baseline"))
            for _, row in effects.iterrows()
        ]
    else:
        items.append(
            "No arm's final val loss differs from its baseline's with a 95% interval that excludes 0 (cells where "
            "either side has stalled seeds are not counted)."
        )
    return items


def speed_warning(unsteady: list[dict[str, Any]]) -> str | None:
    if not unsteady:
        return None
    worst = max(unsteady, key=lambda u: u["spread"])
    return (
        f"Warning: tokens/s varies by more than {SPEED_SPREAD_LIMIT:g}x between the runs of {len(unsteady)} "
        f"arm(s) (most: {worst['arm']}, {worst['low']:,.0f} to {worst['high']:,.0f} tokens/s, "
        f"{worst['spread']:.1f}x): the machine was shared or busy, so speed ratios are not to be trusted."
    )
