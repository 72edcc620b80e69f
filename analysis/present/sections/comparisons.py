"""The report's comparison sections: per compared axis, the table of arms within each context and its figures,
and the closing "How to read this"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from analysis.compute.compare import ALL_RUNS, REFUSED, TEST_PAIRED, TEST_WELCH, Comparison, key_label
from analysis.present.document import Block, Details, Fig, Heading, Para, Table
from analysis.present.format import STALL_WORDS, count, delta_text, finite, mean_pm, p_text, rate_text, ratio_text
from analysis.present.style import PlotFigure
from analysis.sources.load import DOWNSTREAM_KEY
from lm_ablate import metrics as M


def keys_text(keys: Sequence[str]) -> str:
    return ", ".join(key_label(k) for k in keys)


def _pm(row: pd.Series, metric: str, digits: int = 4, comma: bool = False) -> str:
    return mean_pm(*(row[f"{metric}_{s}"] for s in ("mean", "ci_low", "ci_high")), digits, comma)


def seed_values(text: str) -> str:
    """``0:2.61 1:3.31*`` (compute/compare.py's seed_finals) as ``2.6100, 3.3100 (stalled)``, seed order."""
    out = []
    for item in str(text).split():
        _, _, value = item.partition(":")
        stalled = value.endswith("*")
        out.append(f"{float(value.rstrip('*')):.4f}" + (" (stalled)" if stalled else ""))
    return ", ".join(out)


def test_text(row: pd.Series) -> str:
    if row["is_baseline"] or not row.get("test"):
        return ""
    return test_name(row["test"], row["n_pairs"])


def test_name(test: str, n_pairs: Any) -> str:
    """``paired t (3 seeds)`` or ``Welch t``: the test a Δ and its interval came from."""
    if test == TEST_PAIRED:
        return f"paired t ({int(n_pairs)} seeds)"
    return "Welch t" if test == TEST_WELCH else str(test)


def score_label(score: str) -> str:
    """``downstream/shakespeare_order/acc`` as a column names it: ``shakespeare_order acc``."""
    if score == M.FINAL_VAL_BPB:
        return "val bits per byte"
    m = DOWNSTREAM_KEY.match(score)
    return f"{m.group(1)} {m.group(2)}" if m else score


def shown_scores(comp: Comparison) -> tuple[list[str], list[str]]:
    """(downstream metrics the table shows, those left out): a task's acc_norm is left out where it equals its acc
    in every row (the choices have the same characters, as in shakespeare_order); comparisons.csv keeps both."""
    table, shown, same = comp.table, [], []
    for score in comp.scores:
        m = DOWNSTREAM_KEY.match(score)
        acc = M.downstream(m.group(1), "acc") if m and m.group(2) == "acc_norm" else None
        same_as_acc = acc in comp.scores and all(
            table[f"{score}{part}"].equals(table[f"{acc}{part}"]) for part in ("_mean", "_ci_low", "_ci_high")
        )
        if same_as_acc:
            same.append(score)
        else:
            shown.append(score)
    return shown, same


def score_delta_text(row: pd.Series, score: str) -> str:
    """Δ arm − baseline of a downstream metric with its 95% interval, as final val loss's Δ; the test is named
    when it is not the one the row's final val loss used (a seed without the score, say)."""
    if row["is_baseline"]:
        return "baseline"
    d, lo, hi = (row[f"delta_{score}{s}"] for s in ("", "_ci_low", "_ci_high"))
    if not finite(d):
        return "–"
    text = f"{d:+.4f}" + (f" [{lo:+.4f}, {hi:+.4f}]" if finite(lo) and finite(hi) else "")
    test, pairs = row[f"delta_{score}_test"], row[f"delta_{score}_n_pairs"]
    if test and (test, int(pairs)) != (row.get("test"), int(row["n_pairs"])):
        text += f" ({test_name(test, pairs)})"
    return text


def runs_text(r: pd.Series) -> str:
    """``3 completed`` or ``3: 2 completed (1 stalled), 1 diverged``: an arm's runs in one cell."""
    done = f"{r['n_completed']} completed" + (f" ({r['n_stalled']} stalled)" if r["n_stalled"] else "")
    rest = [f"{r['n_diverged']} diverged"] * bool(r["n_diverged"]) + [f"{r['n_other']} other"] * bool(r["n_other"])
    return f"{r['n_runs']}: " + ", ".join([done, *rest]) if rest else done


def _arm_text(r: pd.Series) -> str:
    return r["arm"] + (" (baseline)" if r["is_baseline"] else "")


def _comparison_table(comp: Comparison) -> Table:
    """The comparison's main table, narrow enough for the page: per arm and context its runs, final val loss and Δ
    with its p and test. Downstream scores are in :func:`_scores_table`, spikes, speed and sizes in
    :func:`_dynamics_table`; comparisons.csv has every column."""
    headers = ["context", "arm", "runs", "final val loss (mean ± 95% CI)", "Δ vs baseline [95% CI]", "p", "test"]
    rows = []
    for _, r in comp.table.iterrows():
        final = _pm(r, M.FINAL_VAL_LOSS) + (f"; seeds {seed_values(r['seed_finals'])}" if r["n_stalled"] else "")
        p = "" if r["is_baseline"] else p_text(r["p_value"])
        rows.append([r["context"], _arm_text(r), runs_text(r), final, delta_text(r), p, test_text(r)])
    return Table(headers, rows, frozenset({headers.index("Δ vs baseline [95% CI]"), headers.index("p")}))


def _scores_table(comp: Comparison) -> Table | None:
    """Each downstream score of each arm, one row per (context, arm, score): as many scores as the eval group has
    tasks and kinds make rows, not columns. None without scores."""
    scores, _ = shown_scores(comp)
    if not scores:
        return None
    headers = ["context", "arm", "score", "mean ± 95% CI", "Δ vs baseline [95% CI]"]
    rows = [[r["context"], _arm_text(r), score_label(s), _pm(r, s), score_delta_text(r, s)]
            for _, r in comp.table.iterrows() for s in scores]  # fmt: skip
    return Table(headers, rows, frozenset({3, 4}))


DYNAMICS = "Training dynamics, speed and size per arm"


def _dynamics_table(comp: Comparison) -> Table:
    """The comparison's second table: best val loss, spikes, divergence, speed and parameter counts per arm."""
    headers = ["context", "arm", "best val loss", "grad-norm spikes", "loss spikes",
               "spikes / 1k steps (grad norm, loss)", "divergence rate", "tokens/s", "tokens/s ratio",
               "params (total / non-emb.)"]  # fmt: skip
    rows = [
        [
            r["context"],
            _arm_text(r),
            _pm(r, M.BEST_VAL_LOSS),
            _pm(r, M.GRAD_NORM_SPIKES, digits=1),
            _pm(r, M.LOSS_SPIKES, digits=1),
            ", ".join(rate_text(r[f"{k}_spikes_per_1k_steps"]) for k in ("grad_norm", "loss")),
            f"{r['n_diverged']}/{r['n_runs']}" if r["n_runs"] else "–",
            _pm(r, M.MEAN_TOKENS_PER_SEC, digits=0, comma=True),
            "" if r["is_baseline"] else ratio_text(r["tokens_per_sec_ratio"]),
            f"{count(r[M.PARAMS_TOTAL])} / {count(r[M.PARAMS_NON_EMBEDDING])}",
        ]
        for _, r in comp.table.iterrows()
    ]
    return Table(headers, rows, frozenset(range(2, len(headers))))


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
    text += (
        " Means and Δ use completed runs only; diverged and unfinished runs are counted, not averaged. "
        "Stalled runs (on the data's unigram plateau or flat; see 'How to read this') are in the means and "
        "counted; where an arm has any, its seeds are listed one by one."
    )
    text += scores_text(comp)
    if REFUSED in comp.table:  # the arms differ in tokenizer: no Δ of per-token loss (compute/compare.py)
        text += f" Δ final val loss: refused, {comp.table[REFUSED].iloc[0]}."
    out += [Para(text), _comparison_table(comp)]
    scores = _scores_table(comp)
    out += [scores] if scores is not None else []
    out.append(Details(DYNAMICS, [_dynamics_table(comp)]))
    for fig in figures:
        out.append(Fig(fig, f"fig{index:02d}_{fig.name}.png"))
    return out


def scores_text(comp: Comparison) -> str:
    """What the scores table holds, when there is one ("" otherwise: the paragraph is as before)."""
    shown, same = shown_scores(comp)
    text = ""
    if M.FINAL_VAL_BPB in shown:
        shown = [s for s in shown if s != M.FINAL_VAL_BPB]
        text += (
            " Val bits per byte: each completed run's nats over the held-out text at the end / (ln 2 x its UTF-8 "
            "bytes), the same text for every tokenizer (docs/data.md); a run made before it existed has none."
        )
    if not shown:
        return text
    text += (
        " Downstream scores (the second table, a row per arm and score; the eval group, docs/evaluation.md): each "
        "completed run's last evaluation, mean ± "
        "95% CI over seeds, and Δ arm − baseline with its 95% interval by the test final val loss uses (paired by "
        "seed where both arms have two seeds with the score, else Welch); acc and acc_norm are fractions right "
        "(higher is better), bpb bits per byte of the right answer (lower is better)."
    )
    if same:
        text += (
            " Not shown, equal to acc in every row (comparisons.csv has them): "
            + ", ".join(map(score_label, same))
            + "."
        )
    return text


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
    "Diverged runs (a non-finite loss or gradient norm) are counted and listed, never averaged. A stalled "
    f"run never learned past token frequencies: {STALL_WORDS}. A cell with stalled seeds is bimodal, so its "
    "seeds are listed and a claim decided on it is inconclusive. LR "
    "sensitivity (Wortsman et al. 2023) is E_lr[min(loss(lr), ln V) − loss*] over an arm's LR grid: "
    "each run's final val loss is capped at ln V, the loss of the uniform prediction over its vocabulary (where "
    "a standard init starts; an init with large logits starts far above it, so its step-0 loss would bound "
    "nothing), a diverged run counts as ln V, loss(lr) is the mean over seeds, loss* the arm's best loss(lr), "
    "and the expectation a plain mean over the LRs tried; it is 0 when every LR does as well as the best, "
    "and comparable between arms only over the same grid."
)
