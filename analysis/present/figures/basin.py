"""A basin as Kaplan et al. 2020 draw it (Fig. 5): the metric of each value of a numeric axis, at its own best LR,
relative to the best value's in %, with 95% bars over seeds, on a log x axis (analysis/compute/basin.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.lines import Line2D

from analysis.compute.basin import Basin, flops_differ
from analysis.present.style import (
    COLORS,
    MARKERS,
    MAX_PANELS,
    PlotFigure,
    arm_legend,
    label_text,
    panel_grid,
    png_bytes,
    slug,
    style_axes,
)
from lm_ablate import metrics as M

FLOPS_COLOR = "0.5"
FLOPS_WORDS = {
    "FLOPs/token": "training FLOPs per token",
    "training FLOPs": "training FLOPs (a token is no unit of text across tokenizers: the whole run's, over the "
    "same training bytes)",
}
DECADE = 10.0  # where 0 and inf sit on the log axis: a decade beyond the finite positive values


def positions(xs: Sequence[float]) -> tuple[list[float], list[str]]:
    """Where each axis value is drawn on a log axis, and its tick label: a positive finite value at itself; 0 a
    decade below the smallest positive value (tick "0"); +inf a decade above the largest (tick "∞", e.g. tau/T of
    no weight decay)."""
    finite = [x for x in xs if 0 < x < math.inf]
    low, high = (min(finite), max(finite)) if finite else (1.0, 1.0)
    at, labels = [], []
    for x in xs:
        if x == math.inf:
            at.append(high * DECADE)
            labels.append("∞")
        elif x <= 0:
            at.append(low / DECADE)
            labels.append("0")
        else:
            at.append(x)
            labels.append(f"{x:g}")
    return at, labels


def draw_flops(ax, at: Sequence[float], b: Basin) -> None:
    """100 (F(x) / F(x*) - 1), dashed, on the panel's own % axis: what each value costs per token against the best
    (a twin axis would not fit the report's panel width)."""
    best = b.cost(b.best) if b.best else math.nan
    pct = [100 * (b.cost(p) / best - 1) if best > 0 else math.nan for p in b.points]
    ax.plot(at, pct, color=FLOPS_COLOR, marker="s", ms=3, ls="--", lw=1)


def metric_words(metric: str) -> str:
    return "final val bits per byte" if metric == M.FINAL_VAL_BPB else "final val loss"


def basin_figures(basins: Sequence[Basin], max_pages: int | None = None) -> list[PlotFigure]:
    """One figure per axis, a panel per context (MAX_PANELS a page): r(x) in % against x (log), 95% bars, the
    best point at 0, a hollow marker where a point's best LR lies at an edge of its grid."""
    by_axis: dict[str, list[Basin]] = {}
    for b in basins:
        if b.points:
            by_axis.setdefault(b.label, []).append(b)
    out = []
    for label, group in by_axis.items():
        pages = [group[i : i + MAX_PANELS] for i in range(0, len(group), MAX_PANELS)]
        pages = pages[:max_pages] if max_pages else pages
        compute = any(flops_differ(b) for b in group)
        cost = "FLOPs/token" if group[0].per_token else "training FLOPs"
        extra = [
            Line2D([], [], color="0.3", marker="o", label="each value at its own best LR; bars: 95% CI over seeds"),
            Line2D([], [], color="0.3", marker="o", mfc="none", ls="", label="best LR at an edge of its grid"),
            Line2D([], [], color="0.3", marker="x", ls="", label="stalled seeds at its best LR"),
        ]
        if compute:
            extra.append(Line2D([], [], color=FLOPS_COLOR, marker="s", ms=3, ls="--",
                                label=f"{cost} vs the best value's, %"))  # fmt: skip
        for page, panel in enumerate(pages, 1):
            fig, axes = panel_grid(len(panel), [], len(extra))
            for ax, b in zip(axes, panel):
                xs = [p.x for p in b.points]
                at, ticks = positions(xs)
                rel = np.array([p.relative for p in b.points], dtype=float)
                low = np.array([p.low for p in b.points], dtype=float)
                high = np.array([p.high for p in b.points], dtype=float)
                err = np.vstack(
                    [np.where(np.isfinite(low), rel - low, 0.0), np.where(np.isfinite(high), high - rel, 0.0)]
                )
                color, marker = COLORS[0], MARKERS[0]
                ax.errorbar(at, rel, yerr=err, color=color, marker="", lw=1.4, capsize=2.5)
                for x, r, p in zip(at, rel, b.points):
                    ax.plot(x, r, marker=marker, ms=5, color=color, mfc="none" if p.lr.at_edge else color)
                    if p.stalled[0]:
                        ax.plot(x, r, marker="x", ms=9, color="#d62728")
                ax.axhline(0.0, color="0.45", lw=1, ls=":", zorder=0)
                ax.set_xscale("log")
                ax.set_xticks(at, ticks)
                ax.minorticks_off()
                style_axes(ax, b.context, f"{label} (log)", f"{metric_words(b.metric)} vs the best, %")
                if compute:
                    draw_flops(ax, at, b)
            arm_legend(fig, [], extra)
            title = f"{metric_words(group[0].metric)} relative to the best value of {label}" + (
                f" ({page}/{len(pages)})" if len(pages) > 1 else ""
            )
            fig.suptitle(label_text(title, 90), fontsize=11)
            caption = (
                f"{label} as a basin (Kaplan et al. 2020, Fig. 5): each value at its own best LR (the LR with the "
                f"lowest mean final val loss over its completed seeds), its {metric_words(group[0].metric)} relative "
                "to the best value's in %, 100 (L(x) − L(x*)) / L(x*), with 95% bars over seeds (paired by seed "
                "where the values share two; none with one seed); the best value sits at 0. A hollow marker: that "
                "value's best LR is at an edge of its grid (its loss may be lower beyond it); a red x: stalled "
                "seeds among its runs there. x on a log scale; ∞ and 0 (where the axis has them) a decade beyond."
            ) + (
                f" Dashed grey, on the same axis: each value's {FLOPS_WORDS[cost]} relative to the best value's in % "
                "(the values are matched in parameters and training text, not in compute)."
                if compute
                else ""
            )
            name = f"{slug(label)}_basin_{page}"
            out.append(PlotFigure(name, title, caption, png_bytes(fig)))
    return out
