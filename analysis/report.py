"""Build the ablation report: one self-contained HTML file, the same in Markdown, and the tables as CSV and
Parquet.

Usage::

    python -m analysis.report [PATH ...] [--wandb ENTITY/PROJECT [--group G] [--offline]] --out DIR
                              [--by KEY ...] [--baseline KEY=VALUE] [--title T] [--workers N]

Runs come from run directories (PATHs), a W&B project (``--wandb``; cached under DIR/wandb_cache so
``--offline`` rebuilds without the network), or both.

The report is assembled once as a list of blocks (headings, paragraphs, tables, figures) and rendered twice,
so the HTML and Markdown can never disagree. The HTML embeds its figures as base64 PNG and its CSS inline: it
can be mailed or attached to an issue and still open offline. Every string that comes from a run (config
values, names, paths, error messages) is escaped, because run names and errors are free text.
"""

from __future__ import annotations

import base64
import html
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.best_lr import BestLRComparison, compare_at_best_lr
from analysis.claims import ClaimSet, annotate_comparisons, evaluate_claims, largest_effects, unsteady_speed
from analysis.cli import Parser, error
from analysis.compare import (
    ALL_RUNS,
    TEST_PAIRED,
    TEST_WELCH,
    Comparison,
    ComparisonSet,
    LRSweep,
    compare_runs,
    fmt_value,
    key_label,
    lr_sweep,
)
from analysis.heatmap_plots import heatmap_figures
from analysis.load import MAX_ATTN_LOGIT_ALL, AnalysisError, RunSet, load_runs, merge
from analysis.parallel import default_workers, fork_map
from analysis.plots import MAX_PANELS, PlotFigure, comparison_figure_jobs, lr_figures
from analysis.scaling import ScalingStudy, scaling_study
from lm_ablate import metrics as M
from lm_ablate.sweep_check import unwritable

MAX_PAGES = 2  # figure pages per kind and comparison (12 contexts): more would bury the report
FIGURE_BUDGET = 40  # figures in a report; above it, one page per kind and comparison (6 contexts)
FIGURE_KINDS = 7  # per comparison: see analysis.plots.comparison_figure_jobs
WANDB_CACHE = "wandb_cache"
# history columns the report draws (everything else is dropped while loading, so big sweeps fit in memory)
REPORT_COLUMNS = frozenset(
    {M.VAL_LOSS, M.TRAIN_LOSS, M.GRAD_NORM, M.SPIKE_GRAD_NORM, M.LOGITS_MAX_ABS, M.LOGITS_MEAN_LOG_Z,
     MAX_ATTN_LOGIT_ALL}
)  # fmt: skip


def report_columns(name: str) -> bool:
    return name in REPORT_COLUMNS


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
 padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.5em}
.scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:.85em;margin:.8em 0}
th,td{border:1px solid #ddd;padding:.3em .55em;text-align:left;vertical-align:top}
td{max-width:32em;overflow-wrap:break-word}p,li,summary,figcaption{overflow-wrap:anywhere}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;white-space:nowrap;max-width:none}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
code{background:#f3f3f3;padding:0 .2em}
"""


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    numeric: frozenset[int] = frozenset()  # column indexes right-aligned in HTML


@dataclass
class Fig:
    figure: PlotFigure
    file_name: str  # the PNG next to report.md


@dataclass
class Details:
    summary: str
    blocks: list[Block]


Block = Heading | Para | Bullets | Table | Fig | Details


# --- number formatting ----------------------------------------------------------------------------------
def _ok(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def num(x: Any, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if _ok(x) else "–"


def mean_pm(mean: Any, low: Any, high: Any, digits: int = 4, comma: bool = False) -> str:
    """``mean ± half-width``; the t-interval is symmetric, so the half-width says all of it."""
    if not _ok(mean):
        return "–"
    spec = f",.{digits}f" if comma else f".{digits}f"
    text = format(mean, spec)
    return text + (f" ± {format((high - low) / 2, spec)}" if _ok(low) and _ok(high) else "")


def count(x: Any) -> str:
    return f"{int(x):,}" if _ok(x) else "–"


def delta_text(row: pd.Series) -> str:
    if row["is_baseline"]:
        return "baseline"
    d, lo, hi = row["delta_final_val_loss"], row["delta_ci_low"], row["delta_ci_high"]
    if not _ok(d):
        return "–"
    return f"{d:+.4f}" + (f" [{lo:+.4f}, {hi:+.4f}]" if _ok(lo) and _ok(hi) else "")


def ratio_text(x: Any) -> str:
    return f"{x:.3f}×" if _ok(x) else "–"


def p_text(p: Any) -> str:
    if not _ok(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


# --- content --------------------------------------------------------------------------------------------
def _status_counts(rs: RunSet) -> str:
    counts = rs.runs[M.STATUS].value_counts()
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def _summary_blocks(
    rs: RunSet,
    cs: ComparisonSet,
    findings: Sequence[str] = (),
    warnings: Sequence[str] = (),
    size_keys: frozenset[str] = frozenset(),
) -> list[Block]:
    """The Summary: the Findings first (claim verdicts and the largest effects, with their numbers), then what
    was run, what varied and what was held fixed, and ``warnings``."""
    studies = sorted({str(v) for v in rs.runs.get("study", pd.Series(dtype=object)).dropna()})
    out: list[Block] = [Heading(2, "Summary")]
    if findings:
        out += [Heading(3, "Findings"), Bullets(list(findings)), Heading(3, "Runs")]
    items = [f"Runs: {len(rs.runs)} ({_status_counts(rs)})."]
    if studies:
        items.append("Study: " + ", ".join(studies) + ".")
    # model size (the rungs of a ladder) is the Scaling section's dimension, not an axis compared here
    size_axes = [axis for axis in cs.varied if size_keys and set(axis.keys) <= size_keys]
    if size_axes:
        shown = "; ".join(f"{a.label} = {', '.join(fmt_value(v) for v in cs.values[a.name])}" for a in size_axes)
        items.append(f"Model size varies (the rungs; compared across sizes in the Scaling section): {shown}.")
    if cs.varied:
        for axis in cs.varied:
            if axis in size_axes:
                continue
            values = ", ".join(fmt_value(v) for v in cs.values[axis.name])
            along = f" (changes together with {_keys_text(axis.keys[1:])})" if len(axis.keys) > 1 else ""
            items.append(f"Varied: {axis.label} = {values}{along}.")
    else:
        items.append("Varied: no config key differs between the runs, so there is nothing to compare.")
    if cs.ignored:
        items.append(
            "Also differs, bookkeeping rather than an intervention (not compared): "
            + "; ".join(f"{k} ({_few(v)})" for k, v in cs.ignored.items())
            + "."
        )
    if cs.left_out:
        items.append("Left out of comparisons (no readable config): " + ", ".join(cs.left_out) + ".")
    compared = {k for comp in cs.comparisons for k in comp.axis.keys}
    uncompared = [axis.label for axis in cs.varied if not set(axis.keys) & compared and axis not in size_axes]
    if len(studies) > 1 or uncompared:
        parts = [f"they come from {len(studies)} studies ({', '.join(studies)})"] if len(studies) > 1 else []
        parts += ["also varied but not compared: " + ", ".join(uncompared)] if uncompared else []
        items.append(
            "Warning: the runs differ in more than the compared axes: "
            + "; ".join(parts)
            + ". Each comparison holds the other varied keys fixed within a context; nothing is pooled across them."
        )
    size_labels = tuple(f"{a.label} varies only together" for a in size_axes)
    items += [*(n for n in cs.notes if not n.startswith(size_labels)), *warnings]
    out.append(Bullets(items))
    if cs.fixed:
        rows = [[key, fmt_value(value)] for key, value in cs.fixed.items()]
        out.append(Details(f"Held fixed: {len(cs.fixed)} config keys", [Table(["key", "value"], rows)]))
    return out


def _keys_text(keys: Sequence[str]) -> str:
    return ", ".join(key_label(k) for k in keys)


def _pm(row: pd.Series, metric: str, digits: int = 4, comma: bool = False) -> str:
    return mean_pm(*(row[f"{metric}_{s}"] for s in ("mean", "ci_low", "ci_high")), digits, comma)


def _few(values: list[Any], limit: int = 5) -> str:
    shown = ", ".join(fmt_value(v) for v in values[:limit])
    return shown + (f", … {len(values)} values" if len(values) > limit else "")


def test_text(row: pd.Series) -> str:
    if row["is_baseline"] or not row.get("test"):
        return ""
    if row["test"] == TEST_PAIRED:
        return f"paired t ({int(row['n_pairs'])} seeds)"
    return "Welch t" if row["test"] == TEST_WELCH else str(row["test"])


def rate_text(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if _ok(x) else "–"


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


def _comparison_blocks(comp: Comparison, index: int, figures: list[PlotFigure]) -> list[Block]:
    axis = comp.axis
    out: list[Block] = [Heading(2, f"{index}. {axis.label}: " + " vs ".join(comp.arms))]
    text = f"Arms: values of {axis.label}"
    if len(axis.keys) > 1:
        text += f" (which also sets {_keys_text(axis.keys[1:])})"
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


def _best_lr_blocks(best: BestLRComparison) -> list[Block]:
    """Each arm at its own best LR against the baseline arm at its own best (analysis/best_lr.py)."""
    rows = []
    for _, b in best.table.iterrows():
        row = b.rename({"baseline": "is_baseline"})
        lr = fmt_value(b["best_lr"]) if _ok(b["best_lr"]) else "–"
        rows.append([
            b["context"], lr + (" ⚠ grid edge" if b["best_at_edge"] else ""),
            mean_pm(b[f"{M.FINAL_VAL_LOSS}_mean"], b[f"{M.FINAL_VAL_LOSS}_ci_low"], b[f"{M.FINAL_VAL_LOSS}_ci_high"]),
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


def _lr_blocks(sweep: LRSweep, figures: list[PlotFigure], at_best: BestLRComparison | None = None) -> list[Block]:
    final = M.FINAL_VAL_LOSS
    out: list[Block] = [
        Heading(2, f"Learning rate ({sweep.axis.label})"),
        Para(
            f"{sweep.axis.label} varies ({len(sweep.lrs)} values). Per arm (the values of the other varied "
            "axes): the LR with the lowest mean final val loss over completed runs (⚠ at an end of the grid: "
            "the optimum may lie beyond it), and the LR sensitivity E_lr[min(loss(lr), loss_init) − loss*] "
            "(Wortsman et al. 2023; diverged runs count as their init loss; see 'How to read this'). Lower "
            "sensitivity: the arm tolerates a wider range of learning rates."
        ),
    ]
    rows = []
    for _, b in sweep.best.iterrows():
        best = fmt_value(b["best_lr"]) if _ok(b["best_lr"]) else "–"
        rows.append([
            b["context"], b["lr_grid"], best + (" ⚠ grid edge" if b["best_at_edge"] else ""),
            mean_pm(b[f"{final}_mean"], b[f"{final}_ci_low"], b[f"{final}_ci_high"]),
            str(int(b[f"{final}_n"])), str(int(b["n_diverged_at_best"])), str(int(b["n_diverged"])),
            num(b["lr_sensitivity"]), num(b["loss_init"]), num(b["loss_star"]),
        ])  # fmt: skip
    headers = [
        "arm", "LR grid", "best LR", "final val loss at best (mean ± 95% CI)", "seeds", "diverged at best",
        "diverged (all LRs)", "LR sensitivity", "loss at init", "loss*",
    ]  # fmt: skip
    out.append(Table(headers, rows, frozenset({3, 4, 5, 6, 7, 8, 9})))
    point_rows = [
        [p["context"], fmt_value(p["lr"]), str(p["n_runs"]), str(p["n_completed"]), str(p["n_diverged"]),
         mean_pm(p[f"{final}_mean"], p[f"{final}_ci_low"], p[f"{final}_ci_high"]), num(p["capped_loss"])]
        for _, p in sweep.points.iterrows()
    ]  # fmt: skip
    out.append(Details(f"Every arm × LR: {len(point_rows)} rows", [Table(
        ["arm", "LR", "runs", "completed", "diverged", "final val loss (mean ± 95% CI)",
         "loss(lr) for sensitivity"], point_rows, frozenset({2, 3, 4, 5, 6}))]))  # fmt: skip
    if sweep.notes:
        out.append(Bullets(list(sweep.notes)))
    if at_best is not None:
        out += _best_lr_blocks(at_best)
    out += [Fig(fig, f"lr_{fig.name}.png") for fig in figures]
    return out


def _failed_blocks(rs: RunSet, cs: ComparisonSet) -> list[Block]:
    out: list[Block] = [Heading(2, "Diverged and failed runs")]
    bad = rs.runs[rs.runs[M.STATUS] != M.STATUS_COMPLETED]
    if bad.empty:
        return out + [Para("None: every run completed.")]
    rows = [
        [
            r["run_id"],
            cs.run_label(r["run_id"], rs.configs),
            str(r[M.STATUS]),
            count(r[M.DIVERGED_AT]),
            count(r[M.STEPS]),
            " ".join(str(r[M.ERROR]).split()) if isinstance(r[M.ERROR], str) else "",
        ]
        for _, r in bad.iterrows()
    ]
    return out + [Table(["run", "arm config", "status", "diverged at step", "steps", "error"], rows, frozenset({3, 4}))]


def _runs_blocks(rs: RunSet, cs: ComparisonSet) -> list[Block]:
    rows = [
        [
            r["run_id"],
            str(r[M.RUN_NAME]),
            cs.run_label(r["run_id"], rs.configs),
            fmt_value(rs.configs.get(r["run_id"], {}).get(M.SEED, r[M.SEED])),
            str(r[M.STATUS]),
            num(r[M.FINAL_VAL_LOSS]),
            num(r[M.BEST_VAL_LOSS]),
            count(r[M.STEPS]),
            count(r[M.GRAD_NORM_SPIKES]),
            count(r[M.LOSS_SPIKES]),
        ]
        for _, r in rs.runs.iterrows()
    ]
    headers = [
        "run",
        "name",
        "config",
        "seed",
        "status",
        "final val",
        "best val",
        "steps",
        "gn spikes",
        "loss spikes",
    ]
    return [
        Heading(2, "All runs"),
        Para("Final and best validation loss as each run recorded them (for unfinished runs: the last evaluation)."),
        Table(headers, rows, frozenset(range(5, 10))),
    ]


def _problem_blocks(rs: RunSet) -> list[Block]:
    out: list[Block] = [Heading(2, "Problems")]
    return out + ([Bullets(list(rs.problems))] if rs.problems else [Para("None: every run record was readable.")])


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


def _figure_job_list(rs: RunSet, cs: ComparisonSet, sweep: LRSweep | None, smoothing: float,
                     max_pages: int | None) -> list[tuple[int, Any]]:  # fmt: skip
    """(section index, job) for every figure: 0 is the LR section, i the i-th comparison."""
    jobs: list[tuple[int, Any]] = []
    if sweep is not None:
        jobs.append((0, lambda: lr_figures(sweep, max_pages)))
    for i, comp in enumerate(cs.comparisons, 1):
        jobs += [(i, job) for job in comparison_figure_jobs(rs, comp, smoothing, max_pages)]
        jobs.append((i, lambda comp=comp: heatmap_figures(rs, comp)))
    return jobs


def build_blocks(
    rs: RunSet,
    cs: ComparisonSet,
    title: str,
    smoothing: float = 0.9,
    sweep: LRSweep | None = None,
    workers: int = 1,
    max_pages: int | None = MAX_PAGES,
    scaling: ScalingStudy | None = None,
    claims: ClaimSet | None = None,
) -> list[Block]:
    """The report as blocks: the study's claims and their verdicts first (when it declares any), then the
    summary opening with the Findings, the sections, and the run listings. Figures are drawn first, in
    ``workers`` forked processes. A big sweep (more than FIGURE_BUDGET figures at ``max_pages``) gets one page
    per figure kind: each figure costs ~0.5 s to draw, and the tables hold every context anyway."""
    if max_pages and max_pages > 1:
        pages = sum(min(max_pages, math.ceil(len(c.contexts) / MAX_PANELS)) for c in cs.comparisons)
        if pages * FIGURE_KINDS > FIGURE_BUDGET:
            max_pages = 1
    jobs = _figure_job_list(rs, cs, sweep, smoothing, max_pages)
    drawn = fork_map(lambda job: job[1](), jobs, workers=workers)
    figures: dict[int, list[PlotFigure]] = {}
    for (section, _), figs in zip(jobs, drawn):
        figures.setdefault(section, []).extend(figs)
    blocks: list[Block] = [Heading(1, title)]
    from analysis.claims_report import claims_blocks, findings, speed_warning  # it imports this module's blocks

    if claims is not None and claims.results:
        blocks += claims_blocks(claims)
    baselines = {comp.axis.label: comp.baseline for comp in cs.comparisons}
    warning = speed_warning(unsteady_speed(rs, cs))
    size_keys = frozenset(scaling.size_keys) if scaling is not None else frozenset()
    notes = [warning] if warning else []
    blocks += _summary_blocks(rs, cs, findings(claims, largest_effects(cs), baselines), notes, size_keys)
    if sweep is not None:
        blocks += _lr_blocks(sweep, figures.get(0, []), compare_at_best_lr(rs, sweep=sweep))
    for i, comp in enumerate(cs.comparisons, 1):
        blocks += _comparison_blocks(comp, i, figures.get(i, []))
    if scaling is not None:
        from analysis.scaling_report import scaling_blocks  # it imports this module's block types

        blocks += scaling_blocks(scaling, dict(zip(rs.runs["run_id"], rs.runs[M.STATUS])))
    blocks += _failed_blocks(rs, cs) + _runs_blocks(rs, cs) + _problem_blocks(rs)
    blocks += [Heading(2, "How to read this"), Para(HOW_TO_READ)]
    return blocks


# --- rendering ------------------------------------------------------------------------------------------
def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def render_html(blocks: list[Block], title: str) -> str:
    body = "\n".join(_html_block(b) for b in blocks)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_e(title)}</title>\n'
        f"<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _html_block(b: Block) -> str:
    if isinstance(b, Heading):
        return f"<h{b.level}>{_e(b.text)}</h{b.level}>"
    if isinstance(b, Para):
        return f"<p>{_e(b.text)}</p>"
    if isinstance(b, Bullets):
        return "<ul>" + "".join(f"<li>{_e(i)}</li>" for i in b.items) + "</ul>"
    if isinstance(b, Table):
        head = "".join(f"<th>{_e(h)}</th>" for h in b.headers)
        cell = ('<td class="num">', "<td>")
        rows = "".join(
            "<tr>" + "".join(f"{cell[i not in b.numeric]}{_e(c)}</td>" for i, c in enumerate(r)) + "</tr>"
            for r in b.rows
        )
        return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'
    if isinstance(b, Fig):
        data = base64.b64encode(b.figure.png).decode("ascii")
        return (
            f'<figure><img alt="{_e(b.figure.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(b.figure.caption)}</figcaption></figure>"
        )
    if isinstance(b, Details):
        inner = "\n".join(_html_block(x) for x in b.blocks)
        return f"<details><summary>{_e(b.summary)}</summary>\n{inner}\n</details>"
    raise TypeError(f"unknown block {type(b).__name__}")


MD_ALWAYS = re.compile(r"([\\`*|~])")  # backslash, code span, emphasis, table cell, strikethrough
MD_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # emphasis; an intraword _ is literal
MD_TAG = re.compile(r"<(?=[A-Za-z/!?])[^<>]*>?")  # what a Markdown renderer would pass through as raw HTML
MD_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")  # an & that would start an entity reference
MD_LINK = re.compile(r"\](?=[(\[])")  # the ] of a link or an image, [text](url)
MD_BRACKET = re.compile(r"[\[\]]")
MD_BLOCK_START = re.compile(r"^(?:[#>]|[+-](?=[ -]|$)|\d+[.)](?= |$))")  # heading, quote, list, rule


def md_text(s: Any, block_start: bool = False, alt: bool = False) -> str:
    """Text as Markdown that renders as exactly ``s`` (whitespace collapsed), not HTML-escaped: a backslash
    before each character that would start Markdown syntax (emphasis, code, a table cell, a link; with
    ``block_start``, text that opens a paragraph or list item, a heading, quote or list marker), and character
    references only where a renderer would otherwise pass raw HTML through (``<tag ...>``) or decode one
    (``&amp;``); with ``alt`` (an image's alt text, inside ``![...]``) every bracket. Run names and errors are
    free text: markup in them is shown, never interpreted."""
    text = " ".join(str(s).split())
    text = MD_ALWAYS.sub(r"\\\1", text)
    text = MD_UNDERSCORE.sub(r"\\_", text)
    text = MD_ENTITY.sub("&amp;", text)
    text = MD_TAG.sub(lambda m: m.group(0).replace("<", "&lt;").replace(">", "&gt;"), text)
    text = (MD_BRACKET if alt else MD_LINK).sub(r"\\\g<0>", text)
    if block_start and (m := MD_BLOCK_START.match(text)):
        text = text[: m.end() - 1] + "\\" + text[m.end() - 1 :]
    return text


def render_markdown(blocks: list[Block]) -> str:
    parts: list[str] = []
    for b in blocks:
        parts.append(_md_block(b))
    return "\n\n".join(parts) + "\n"


def _md_block(b: Block) -> str:
    if isinstance(b, Heading):
        return "#" * b.level + " " + md_text(b.text)
    if isinstance(b, Para):
        return md_text(b.text, block_start=True)
    if isinstance(b, Bullets):
        return "\n".join(f"- {md_text(i, block_start=True)}" for i in b.items)
    if isinstance(b, Table):
        lines = ["| " + " | ".join(md_text(h) for h in b.headers) + " |"]
        lines.append("|" + "|".join("---:" if i in b.numeric else "---" for i in range(len(b.headers))) + "|")
        lines += ["| " + " | ".join(md_text(c) for c in r) + " |" for r in b.rows]
        return "\n".join(lines)
    if isinstance(b, Fig):
        return f"![{md_text(b.figure.title, alt=True)}]({b.file_name})\n\n_{md_text(b.figure.caption)}_"
    if isinstance(b, Details):
        return "\n\n".join([f"**{md_text(b.summary)}**", *(_md_block(x) for x in b.blocks)])
    raise TypeError(f"unknown block {type(b).__name__}")


def _figures(blocks: list[Block]) -> list[Fig]:
    out: list[Fig] = []
    for b in blocks:
        if isinstance(b, Fig):
            out.append(b)
        elif isinstance(b, Details):
            out += _figures(b.blocks)
    return out


def default_title(rs: RunSet) -> str:
    studies = sorted({str(v) for v in rs.runs.get("study", pd.Series(dtype=object)).dropna()})
    return "Ablation report: " + ", ".join(studies) if studies else "Ablation report"


def load_sources(
    paths: Sequence[str | Path] | str | Path | None,
    out_dir: str | Path,
    wandb: str | None = None,
    group: str | None = None,
    offline: bool = False,
    workers: int = 1,
) -> RunSet:
    """Runs from the run directories under ``paths`` and/or the W&B project ``wandb`` (cached in
    ``out_dir/wandb_cache``), with only the history columns the report draws."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths or [])
    if not paths and not wandb:
        raise AnalysisError("nothing to report on: give run directories and/or --wandb ENTITY/PROJECT")
    if (group or offline) and not wandb:
        raise AnalysisError("--group and --offline apply to --wandb, which is not given")
    sets = []
    if paths:
        sets.append(load_runs(paths, keep=report_columns, workers=workers))
    if wandb:
        from analysis.wandb_source import load_wandb

        cache = Path(out_dir) / WANDB_CACHE
        sets.append(load_wandb(wandb, cache, group=group, offline=offline, keep=report_columns))
    return sets[0] if len(sets) == 1 else merge(sets)


def write_table(df: pd.DataFrame, out: Path, stem: str) -> None:
    """``stem``.csv and ``stem``.parquet. Parquet needs one type per column: a column mixing types (a config
    key that is a number in one run and text in another) is written as text there."""
    df.to_csv(out / f"{stem}.csv", index=False)
    import pyarrow as pa

    frame = df.copy()
    for col in frame.columns:
        if frame[col].dtype == object:
            try:
                pa.array(frame[col], from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                frame[col] = frame[col].map(_text_or_null)
    frame.to_parquet(out / f"{stem}.parquet", index=False)


def _text_or_null(v: Any) -> Any:
    return v if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def check_out_dir(path: str | Path, flag: str = "--out") -> None:
    """Raise :class:`AnalysisError` (one line naming ``flag``, the path and why) unless ``path`` is a folder this
    process can create and write into; checked before any work, and nothing is left behind."""
    why = unwritable(path)
    if why is not None:
        raise AnalysisError(
            f"{flag} {path}: cannot create or write into this folder ({why}); allowed: a writable folder"
        )


def build_report(
    paths: Sequence[str | Path] | str | Path | None,
    out_dir: str | Path,
    by: Sequence[str] | None = None,
    baseline: str | None = None,
    title: str | None = None,
    smoothing: float = 0.9,
    wandb: str | None = None,
    group: str | None = None,
    offline: bool = False,
    workers: int | None = None,
) -> Path:
    """Load the runs under ``paths`` (and/or of the W&B project ``wandb``), compare them and write
    report.html, report.md (with its PNGs), runs.csv/.parquet, comparisons.csv/.parquet and, when the
    learning rate varies, lr_sweep.csv/.parquet and lr_points.csv/.parquet, and when the runs' study declares
    claims, claims.csv/.parquet (comparisons.csv then names the claims each row decided) into ``out_dir``.
    Returns the path of report.html.

    ``baseline`` is ``"KEY=VALUE"``. ``workers``: processes for loading and drawing (default: the CPUs this
    process may use, at most 8). Raises :class:`AnalysisError` (one line) for no runs or a bad key.
    """
    workers = default_workers() if workers is None else max(1, workers)
    check_out_dir(out_dir)
    rs = load_sources(paths, out_dir, wandb, group, offline, workers)
    cs = compare_runs(rs, by=by, baseline=baseline)
    sweep = lr_sweep(rs)
    scaling = scaling_study(rs, baseline)
    claims = evaluate_claims(rs, scaling=scaling)
    title = title or default_title(rs)
    blocks = build_blocks(rs, cs, title, smoothing, sweep, workers, scaling=scaling, claims=claims)
    out = Path(out_dir)
    try:  # checked at the start; the folder can still vanish or the disk fill up while the report is drawn
        out.mkdir(parents=True, exist_ok=True)
        for fig in _figures(blocks):
            (out / fig.file_name).write_bytes(fig.figure.png)
        (out / "report.md").write_text(render_markdown(blocks), encoding="utf-8")
        write_table(rs.runs, out, "runs")
        write_table(annotate_comparisons(cs.table, claims), out, "comparisons")
        if claims.results:
            write_table(claims.table, out, "claims")
        if sweep is not None:
            write_table(sweep.best, out, "lr_sweep")
            write_table(sweep.points, out, "lr_points")
        if scaling is not None:
            write_table(scaling.table, out, "scaling")
            write_table(scaling.rung_table, out, "scaling_rungs")
        path = out / "report.html"
        path.write_text(render_html(blocks, title), encoding="utf-8")
    except OSError as err:
        raise AnalysisError(
            f"--out {out_dir}: cannot write the report: {err.strerror or err} ({err.filename})"
        ) from None
    return path.resolve()


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m analysis.report",
        description="Compare lm-ablate runs: tables with 95% CIs, curves, and a self-contained HTML report.",
    )
    parser.add_argument("paths", nargs="*", help="run directories, multirun roots, or folders holding them")
    parser.add_argument("--out", required=True, help="directory to write report.html, report.md and CSVs into")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also (or only) report on this W&B project")
    parser.add_argument("--group", help="with --wandb: only the runs of this W&B group")
    parser.add_argument("--offline", action="store_true",
                        help="with --wandb: use only the cache in OUT/wandb_cache (no network)")  # fmt: skip
    parser.add_argument("--by", action="append", metavar="KEY", help="config key to compare (repeatable)")
    parser.add_argument("--baseline", metavar="KEY=VALUE", help="baseline arm, e.g. norm.name=layernorm")
    parser.add_argument("--title", help="report title (default: from the study name)")
    parser.add_argument("--workers", type=int, help="processes for loading and drawing (default: CPUs, max 8)")
    args = parser.parse_args(argv)
    try:
        path = build_report(
            args.paths, args.out, by=args.by, baseline=args.baseline, title=args.title, wandb=args.wandb,
            group=args.group, offline=args.offline, workers=args.workers,
        )  # fmt: skip
    except AnalysisError as exc:
        return error(exc)
    print(path)  # last line of stdout, so scripts can take it with `tail -n1`
    return 0


if __name__ == "__main__":
    # run the imported module's main, not __main__'s: analysis.scaling_report builds blocks from analysis.report's
    # classes, and a second copy of them (this one) would not match them
    from analysis.report import main as report_main

    sys.exit(report_main())
