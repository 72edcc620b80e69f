"""The report's comparison sections: per compared axis, the table of arms within each context and its figures,
and the closing "How to read this"."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from analysis.compute.compare import ALL_RUNS, TEST_PAIRED, TEST_WELCH, Comparison, key_label
from analysis.present.document import Block, Fig, Heading, Para, Table
from analysis.present.format import count, delta_text, mean_pm, p_text, rate_text, ratio_text
from analysis.present.style import PlotFigure
from lm_ablate import metrics as M


def keys_text(keys: Sequence[str]) -> str:
    return ", ".join(key_label(k) for k in keys)


def _pm(row: pd.Series, metric: str, digits: int = 4, comma: bool = False) -> str:
    return mean_pm(*(row[f"{metric}_{s}"] for s in ("mean", "ci_low", "ci_high")), digits, comma)


def test_text(row: pd.Series) -> str:
    if row["is_baseline"] or not row.get("test"):
        return ""
    if row["test"] == TEST_PAIRED:
        return f"paired t ({int(row['n_pairs'])} seeds)"
    return "Welch t" if row["test"] == TEST_WELCH else str(row["test"])


def _comparison_table(comp: Comparison) -> Table:
    headers = [
        "context", "arm", "runs", "completed", "diverged", "other", "final val loss (mean ± 95% CI)",
        "Δ vs baseline [95% CI]", "p", "test", "best val loss", "grad-norm spikes", "loss spikes",
        "spikes / 1k steps (grad norm, loss)", "divergence rate", "tokens/s", "tokens/s ratio",
        "params (total / non-emb.)",
    ]  # fmt: skip
    rows = []
    for _, r in comp.table.iterrows():
        rows.append(
            [
                r["context"],
                r["arm"] + (" (baseline)" if r["is_baseline"] else ""),
                str(r["n_runs"]),
                str(r["n_completed"]),
                str(r["n_diverged"]),
                str(r["n_other"]),
                _pm(r, M.FINAL_VAL_LOSS),
                delta_text(r),
                "" if r["is_baseline"] else p_text(r["p_value"]),
                test_text(r),
                _pm(r, M.BEST_VAL_LOSS),
                _pm(r, M.GRAD_NORM_SPIKES, digits=1),
                _pm(r, M.LOSS_SPIKES, digits=1),
                ", ".join(rate_text(r[f"{k}_spikes_per_1k_steps"]) for k in ("grad_norm", "loss")),
                f"{r['n_diverged']}/{r['n_runs']}" if r["n_runs"] else "–",
                _pm(r, M.MEAN_TOKENS_PER_SEC, digits=0, comma=True),
                "" if r["is_baseline"] else ratio_text(r["tokens_per_sec_ratio"]),
                f"{count(r[M.PARAMS_TOTAL])} / {count(r[M.PARAMS_NON_EMBEDDING])}",
            ]
        )
    return Table(headers, rows, frozenset(range(2, len(headers))) - {9})


def comparison_blocks(comp: Comparison, index: int, figures: list[PlotFigure]) -> list[Block]:
    axis = comp.axis
    out: list[Block] = [Heading(2, f"{index}. {axis.label}: " + " vs ".join(comp.arms))]
    text = f"Arms: values of {axis.label}"
    if len(axis.keys) > 1:
        text += f" (which also sets {keys_text(axis.keys[1:])})"
    text += f"; baseline: {comp.baseline}. "
    text += (
        "Compared within each context (the values of the other varied axes)."
        if comp.contexts != [ALL_RUNS]
        else "No other axis varies: one context holds all runs."
    )
    text += " Means and Δ use completed runs only; diverged and unfinished runs are counted, not averaged."
    out += [Para(text), _comparison_table(comp)]
    for fig in figures:
        out.append(Fig(fig, f"fig{index:02d}_{fig.name}.png"))
    return out


HOW_TO_READ = (
    "Each comparison holds every other varied axis fixed (one context per combination) and reports, per "
    "arm, the mean over seeds of completed runs with a Student-t 95% confidence interval (n-1 degrees of "
    "freedom; with one seed there is no interval). Δ vs baseline is the difference of mean final validation "
    "loss (arm minus baseline; negative is better) with a 95% interval and two-sided p-value. The test "
    "column says which test gave them: 'paired t' when the arm and the baseline completed at least two of "
    "the same seeds (the t-test on per-seed differences over those seeds, scipy's ttest_rel: a seed fixes "
    "the data order, so seed-to-seed noise shared by both arms cancels), otherwise Welch's t-test, which "
    "does not assume equal variance across arms. With 2-3 seeds these intervals are wide: read a Δ whose "
    "interval straddles 0 as 'no detectable difference', not as 'equal'. A spike is a step whose value "
    "exceeds the rolling mean + k·std of the previous window of steps (train.spike.window, train.spike.k; "
    "see lm_ablate.metrics.SpikeDetector); spikes per 1k steps pool completed and diverged runs (total "
    "spikes / total steps × 1000); the divergence rate is diverged runs over all runs of the arm. tokens/s "
    "counts the training step only (no evaluation); the ratio is arm over baseline in the same context. "
    "Diverged runs (a non-finite loss or gradient norm) are counted and listed, never averaged. LR "
    "sensitivity (Wortsman et al. 2023) is E_lr[min(loss(lr), loss_init) − loss*] over an arm's LR grid: "
    "each run's final val loss is capped at its loss at initialisation (the val loss logged at step 0), a "
    "diverged run counts as its init loss, loss(lr) is the mean over seeds, loss* the arm's best loss(lr), "
    "and the expectation a plain mean over the LRs tried; it is 0 when every LR does as well as the best, "
    "and comparable between arms only over the same grid."
)
