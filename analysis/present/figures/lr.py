"""Final validation loss against learning rate, one line per arm, for an LR sweep (the report's LR section)."""

from __future__ import annotations

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from analysis.compute.compare import LRSweep
from analysis.present.style import (
    COLORS,
    MARKERS,
    MAX_PANELS,
    PlotFigure,
    arm_legend,
    hidden_lines,
    hidden_note,
    label_text,
    log_ticks_in_view,
    metric_title,
    panel_grid,
    png_bytes,
    slug,
    style_axes,
)
from lm_ablate import metrics as M

LINES_PER_PANEL = 8
# the data's reference levels drawn across each panel: label, line style, its name in the caption
LEVELS = {M.UNIGRAM_LOSS: ("unigram level", ":", "dotted"), M.BIGRAM_LOSS: ("bigram level", "--", "dashed")}
LEVEL_REACH = 0.5  # a level is drawn when it lies within this share of a panel's loss range beyond its losses


def _lr_layout(sweep: LRSweep) -> tuple[str | None, list[tuple[str, list[str]]]]:
    """(axis drawn as lines, [(panel title, contexts)]). The other axis with the most values that still fit
    in one panel is drawn as lines (colour = its value, the same in every panel); every combination of the
    remaining axes gets a panel. Without such an axis, contexts are drawn eight to a panel."""
    counts = {a: len({v[a] for v in sweep.context_values.values()}) for a in sweep.others}
    fitting = [a for a in sweep.others if counts[a] <= LINES_PER_PANEL]
    if not sweep.others:
        return None, [("", list(sweep.contexts))]
    if not fitting:
        chunks = [sweep.contexts[i : i + LINES_PER_PANEL] for i in range(0, len(sweep.contexts), LINES_PER_PANEL)]
        return None, [("", c) for c in chunks]
    line_axis = max(fitting, key=lambda a: (counts[a], -sweep.others.index(a)))
    panels: dict[str, list[str]] = {}
    for context in sweep.contexts:
        values = sweep.context_values.get(context, {})
        title = ", ".join(f"{a}={values.get(a)}" for a in sweep.others if a != line_axis)
        panels.setdefault(title, []).append(context)
    return line_axis, list(panels.items())


def lr_figures(sweep: LRSweep, max_pages: int | None = None) -> list[PlotFigure]:
    """Final val loss against learning rate (log x), one line per arm: mean over completed runs with 95% CI
    bars, the best LR circled, and an X along the top of the panel at every LR where a run diverged."""
    points = sweep.points
    if points.empty:
        return []
    line_axis, panels = _lr_layout(sweep)
    if line_axis is None:
        labels = list(sweep.contexts)
        label_of = {c: c for c in labels}
    else:
        label_of = {c: f"{line_axis}={sweep.context_values[c][line_axis]}" for c in sweep.contexts}
        labels = list(dict.fromkeys(label_of[c] for c in sweep.contexts))
    pages = [panels[i : i + MAX_PANELS] for i in range(0, len(panels), MAX_PANELS)]
    shown_pages = pages[:max_pages] if max_pages else pages
    best = sweep.best.set_index("context")
    final = M.FINAL_VAL_LOSS
    extra = [
        Line2D([], [], color="0.3", marker="o", label="mean of completed runs; bars: 95% CI"),
        Line2D([], [], color="0.3", marker="o", ms=10, mfc="none", ls="", label="best LR of the arm"),
        Line2D([], [], color="0.3", marker="X", ls="", label="a run diverged at this LR"),
        *(Line2D([], [], color="0.45", lw=1, ls=LEVELS[k][1], label=f"{LEVELS[k][0]} of the data ({v:.2f})")
          for k, v in sweep.levels.items()),
    ]  # fmt: skip
    out = []
    for page, group in enumerate(shown_pages, 1):
        page_labels = labels if line_axis else [c for _, cs in group for c in cs]
        fig, axes = panel_grid(len(group), page_labels, len(extra))
        hidden: list[tuple[str, str, str]] = []
        for ax, (title, contexts) in zip(axes, group):
            trans = blended_transform_factory(ax.transData, ax.transAxes)
            lines: list[tuple[str, np.ndarray, np.ndarray]] = []
            for context in contexts:
                i = page_labels.index(label_of[context])
                color, marker = COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]
                pts = points[points["context"] == context].sort_values("lr")
                sel = pts[np.isfinite(pts[f"{final}_mean"].to_numpy(dtype=float))]
                if len(sel):
                    mean = sel[f"{final}_mean"].to_numpy(dtype=float)
                    err = np.vstack([mean - sel[f"{final}_ci_low"], sel[f"{final}_ci_high"] - mean])
                    err = np.where(np.isfinite(err), err, 0.0)
                    ax.errorbar(sel["lr"], mean, yerr=err, color=color, marker=marker, ms=4, lw=1.4, capsize=2.5)
                    lines.append((label_of[context], np.log(sel["lr"].to_numpy(dtype=float)), mean))
                b = best.loc[context]
                if np.isfinite(b["best_lr"]):
                    ax.plot(b["best_lr"], b[f"{final}_mean"], marker="o", ms=12, mfc="none", mec=color, mew=1.5)
                div = pts[pts["n_diverged"] > 0]
                if len(div):
                    ax.plot(div["lr"], [0.97 - 0.035 * (i % 8)] * len(div), ls="", marker="X", ms=6,
                            color=color, transform=trans, clip_on=False)  # fmt: skip
            low, high = ax.get_ylim()
            hidden += [(title, a, b) for a, b in hidden_lines(lines, high - low)]
            for key, level in sweep.levels.items():  # a level far off the losses would squash them: left out
                if low - LEVEL_REACH * (high - low) <= level <= high + LEVEL_REACH * (high - low):
                    ax.axhline(level, color="0.45", lw=1, ls=LEVELS[key][1], zorder=0)
            ax.set_xscale("log")
            log_ticks_in_view(ax.xaxis)
            style_axes(ax, title, sweep.axis.label + " (log)", f"final {M.VAL_LOSS}")
        arm_legend(fig, page_labels, extra)
        title = f"final {metric_title(M.VAL_LOSS)} vs {sweep.axis.label}" + (
            f" ({page}/{len(shown_pages)})" if len(shown_pages) > 1 else ""
        )
        fig.suptitle(label_text(title, 90), fontsize=11)
        colour = f"; colour: {line_axis}, one panel per value of the rest" if line_axis and len(panels) > 1 else ""
        omitted = len(shown_pages) < len(pages) and page == len(shown_pages)
        caption = (
            f"Final validation loss against {sweep.axis.label} (log scale), one line per arm (the values "
            f"of the other varied axes{colour}): mean over completed runs with 95% Student-t bars (none with "
            "one seed). The circle marks each arm's best LR; an X along the top marks an LR at which a run of "
            "that arm diverged (a diverged run has no final loss to plot)."
            + (" Grey lines: the data's " + " and ".join(f"{LEVELS[k][0]} ({LEVELS[k][2]}, {v:.2f})"
                                                        for k, v in sweep.levels.items())
               + ", the validation split's cross-entropy under the training split's add-one unigram and bigram "
               "distributions (a run near the bigram level has learned little past the previous token), drawn in "
               f"a panel when within {LEVEL_REACH:.0%} of its loss range beyond its losses."
               if sweep.levels else "")
            + hidden_note(hidden)
            + (f" Only the first {sum(len(p) for p in shown_pages)} of {len(panels)} panels are drawn; the "
               "table holds every arm." if omitted else "")
        )  # fmt: skip
        out.append(PlotFigure(f"{slug(sweep.axis.label)}_lr-sweep_{page}", title, caption, png_bytes(fig)))
    return out
