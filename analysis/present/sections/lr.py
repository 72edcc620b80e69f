"""The report's Learning rate section: each arm's best LR and LR sensitivity, every arm × LR, each arm at its
own best LR against the baseline at its own (compute/best_lr.py), and the LR figure."""

from __future__ import annotations

from analysis.compute.best_lr import BestLRComparison
from analysis.compute.compare import LRSweep
from analysis.present.document import Block, Bullets, Details, Fig, Heading, Para, Table
from analysis.present.format import delta_text, finite, mean_pm, num, p_text
from analysis.present.sections.comparisons import test_text
from analysis.present.style import PlotFigure
from analysis.sources.values import override_text
from lm_ablate import metrics as M


def _best_lr_blocks(best: BestLRComparison) -> list[Block]:
    """Each arm at its own best LR against the baseline arm at its own best (analysis/compute/best_lr.py)."""
    rows = []
    for _, b in best.table.iterrows():
        row = b.rename({"baseline": "is_baseline"})
        lr = override_text(b["best_lr"]) if finite(b["best_lr"]) else "–"
        stalled = int(b["n_stalled_at_best"])
        rows.append([
            b["context"], lr + (" ⚠ grid edge" if b["best_at_edge"] else ""),
            mean_pm(b[f"{M.FINAL_VAL_LOSS}_mean"], b[f"{M.FINAL_VAL_LOSS}_ci_low"], b[f"{M.FINAL_VAL_LOSS}_ci_high"])
            + (f" ({stalled} of {int(b[f'{M.FINAL_VAL_LOSS}_n'])} stalled)" if stalled else ""),
            delta_text(row), p_text(b.get("p_value")), test_text(row),
        ])  # fmt: skip
    headers = ["arm", "its best LR", "final val loss there (mean ± 95% CI)", "Δ vs baseline at its best", "p", "test"]
    return [
        Heading(3, "Each arm at its own best learning rate"),
        Para(
            f"Baseline: {best.baseline}, at its own best LR. Every arm is compared where it is best (arms tuned "
            "alike: Wen et al. 2025 find most claimed optimizer speed-ups shrink to 1.1-1.4x once each is tuned). "
            "The best LR is picked on the same runs its loss is read from, so each loss at best is biased a little "
            "low, alike for equal grids; an arm at its grid's edge may do better beyond it."
        ),
        Table(headers, rows, frozenset({2, 3, 4})),
    ]


def lr_blocks(sweep: LRSweep, figures: list[PlotFigure], at_best: BestLRComparison | None = None) -> list[Block]:
    final = M.FINAL_VAL_LOSS
    out: list[Block] = [
        Heading(2, f"Learning rate ({sweep.axis.label})"),
        Para(
            f"{sweep.axis.label} varies ({len(sweep.lrs)} values). Per arm (the values of the other varied "
            "axes): the LR with the lowest mean final val loss over completed runs (⚠ at an end of the grid: "
            "the optimum may lie beyond it; where an arm's LRs ran different seeds, on seed-adjusted means, the "
            "least-squares fit of loss = LR effect + seed effect: seed-adjusted beside the LR), and the LR "
            "sensitivity E_lr[min(loss(lr), ln V) − loss*] "
            "(Wortsman et al. 2023; capped at ln V, the uniform prediction's loss, and diverged runs count as "
            "ln V; see 'How to read this'). Lower sensitivity: the arm tolerates a wider range of learning rates. "
            "Stalled runs (completed, but on the data's unigram plateau or flat; lm_ablate/stall.py) are "
            "counted beside the means they are part of."
        ),
    ]
    rows = []
    for _, b in sweep.best.iterrows():
        best = override_text(b["best_lr"]) if finite(b["best_lr"]) else "–"
        rows.append([
            b["context"], b["lr_grid"],
            best + (" ⚠ grid edge" if b["best_at_edge"] else "")
            + (" (seed-adjusted)" if b["seed_adjusted"] else ""),
            mean_pm(b[f"{final}_mean"], b[f"{final}_ci_low"], b[f"{final}_ci_high"]),
            str(int(b[f"{final}_n"])), str(int(b["n_diverged_at_best"])), str(int(b["n_stalled_at_best"])),
            str(int(b["n_diverged"])), num(b["lr_sensitivity"]), num(b["loss_cap"]), num(b["loss_star"]),
        ])  # fmt: skip
    headers = [
        "arm", "LR grid", "best LR", "final val loss at best (mean ± 95% CI)", "seeds", "diverged at best",
        "stalled at best", "diverged (all LRs)", "LR sensitivity", "cap (ln V)", "loss*",
    ]  # fmt: skip
    out.append(Table(headers, rows, frozenset({3, 4, 5, 6, 7, 8, 9, 10})))
    point_rows = [
        [p["context"], override_text(p["lr"]), str(p["n_runs"]), str(p["n_completed"]), str(p["n_diverged"]),
         str(p["n_stalled"]), mean_pm(p[f"{final}_mean"], p[f"{final}_ci_low"], p[f"{final}_ci_high"]),
         num(p["capped_loss"])]
        for _, p in sweep.points.iterrows()
    ]  # fmt: skip
    out.append(Details(f"Every arm × LR: {len(point_rows)} rows", [Table(
        ["arm", "LR", "runs", "completed", "diverged", "stalled", "final val loss (mean ± 95% CI)",
         "loss(lr) for sensitivity"], point_rows, frozenset({2, 3, 4, 5, 6, 7}))]))  # fmt: skip
    if sweep.left_out:
        out.append(Bullets([f"{sweep.left_out} run(s) without a positive numeric {sweep.axis.name} left out"]))
    if at_best is not None:
        out += _best_lr_blocks(at_best)
    out += [Fig(fig, f"lr_{fig.name}.png") for fig in figures]
    return out
