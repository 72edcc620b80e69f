"""The report's Basins section: every numeric axis drawn as Kaplan et al. 2020 draw shape at a fixed size (Fig. 5),
each value at its own best LR, relative to the best value in % (analysis/compute/basin.py), a table per axis and
context and the figure."""

from __future__ import annotations

from collections.abc import Sequence

from analysis.compute.basin import Basin, flops_differ
from analysis.present.document import Block, Fig, Heading, Para, Table
from analysis.present.figures.basin import metric_words
from analysis.present.format import finite, num
from analysis.present.style import PlotFigure
from analysis.sources.values import override_text

INTRO = (
    "Each numeric axis with at least three values, drawn as Kaplan et al. 2020 draw d_ff/d_model, aspect ratio and "
    "head dimension at a fixed parameter count (Fig. 5): every value at its own best LR (the LR of its grid with the "
    "lowest mean final val loss over completed seeds; ⚠ at an end of the grid, where its optimum may lie beyond), its "
    "metric relative to the best value's, 100 (L(x) − L(x*)) / L(x*) in %, with the 95% interval over seeds (the "
    "paired t-test where the values share two seeds, else Welch's, divided by L(x*)). Where the values differ in "
    "tokenizer the metric is bits per byte (loss per token does not compare). The best value is the minimum of "
    "noisy means, so the others lean up by about its noise. Basin claims (within m% of the best over [a, b]; worse "
    "by at least m% beyond c) are decided on these numbers in the Claims section. Where the values' training FLOPs "
    "per token differ (at a fixed parameter count, a deeper model pays more attention FLOPs: 12 L d T), the table "
    "gives each value's FLOPs per token and its ratio to the best value's, and the figure draws it too (in % of "
    "the best value's): the loss is matched in parameters and tokens, not in compute. Where the tokenizers differ, "
    "a token is no unit of text, and each value's training FLOPs (the same training bytes) take their place."
)


def pct_text(value: float, low: float, high: float) -> str:
    if not finite(value):
        return "–"
    if not (finite(low) and finite(high)):
        return f"{value:+.2f}%"
    return f"{value:+.2f}% [{low:+.2f}, {high:+.2f}]"


def basin_table(b: Basin) -> Table:
    compute = flops_differ(b)
    best = b.best
    rows = []
    for p in b.points:
        lr = override_text(p.lr.lr) if finite(p.lr.lr) else "–"
        stalled = f"{p.stalled[0]} of {p.stalled[1]}" if p.stalled[0] else ""
        rel = "0 (best)" if p.is_best else pct_text(p.relative, p.low, p.high)
        row = [override_text(p.value), lr + (" ⚠ grid edge" if p.lr.at_edge else ""), num(p.mean), str(p.n), rel]
        if compute:
            row.append(flops_text(b.cost(p), b.cost(best) if best else float("nan")))
        rows.append([*row, stalled])
    headers = ["value", "its best LR", f"{metric_words(b.metric)} (mean)", "seeds", "vs the best (95% CI)"]
    headers += [f"{cost_words(b)} (× the best's)"] if compute else []
    return Table([*headers, "stalled"], rows, frozenset(range(2, len(headers))))


def cost_words(b: Basin) -> str:
    return "FLOPs/token" if b.per_token else "training FLOPs"


def flops_text(flops: float, best: float) -> str:
    if not finite(flops):
        return "–"
    ratio = f" (×{flops / best:.2f})" if finite(best) and best > 0 else ""
    return (f"{flops / 1e12:.2f}T" if flops >= 1e11 else f"{flops / 1e6:.2f}M") + ratio


def basin_blocks(basins: Sequence[Basin], figures: Sequence[PlotFigure]) -> list[Block]:
    if not basins:
        return []
    out: list[Block] = [Heading(2, "Basins"), Para(INTRO)]
    for b in basins:
        where = "" if b.context == "all runs" else f" ({b.context})"
        out.append(Heading(3, f"{b.label}{where}"))
        if b.refused:
            out.append(Para(f"No basin: {b.refused}."))
            continue
        out.append(basin_table(b))
    out += [Fig(f, f"{f.name}.png") for f in figures]
    return out
