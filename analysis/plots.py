"""Figures per arm for one comparison, and final loss against learning rate for an LR sweep.

Matplotlib's object API with the Agg canvas is used instead of pyplot, so importing this module neither
switches the caller's backend nor keeps figures alive in pyplot's global registry. Panels are laid out by
hand rather than by the constrained-layout engine, which costs about as much as drawing the figure: a report
on a big sweep draws dozens.

Each context of a comparison gets its own panel (arms are only compared within a context). Only completed
runs enter a mean; runs that diverged or did not finish are drawn individually as dashed lines and named in
the caption, because averaging a curve that stops (or explodes) halfway would bend the mean. A figure whose
data no run logged is not drawn at all (the function returns no figure).
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, Locator, LogFormatter, NullLocator
from matplotlib.transforms import blended_transform_factory
from PIL import Image

from analysis.compare import Comparison, LRSweep
from analysis.load import (
    EXTRAPOLATION_KEY,
    FIRST_PROBE_PREFIX,
    FIRST_PROBE_STEP,
    LAYER_KEY,
    MAX_ATTN_LOGIT_ALL,
    RunSet,
)
from analysis.stats import mean_ci
from lm_ablate import metrics as M

MAX_PANELS = 6  # per figure; more contexts wrap onto further figures
COLUMNS = 3
DPI = 110
PANEL_W, PANEL_H = 4.6, 3.4  # inches per panel
MAX_POINTS = 1500  # per drawn line: more than a 500-pixel-wide panel can show
PNG_COMPRESS_LEVEL = 3
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h", "<")
# how a figure's title names a logged metric (axis labels and captions name the key itself)
METRIC_TITLES = {
    M.VAL_LOSS: "validation loss", M.TRAIN_LOSS: "training loss", M.GRAD_NORM: "gradient norm",
    M.LOGITS_MAX_ABS: "largest |output logit|", M.LOGITS_MEAN_LOG_Z: "mean log-partition log Z",
}  # fmt: skip


def metric_title(metric: str) -> str:
    """The words a title uses for ``metric`` (``val/loss`` -> ``validation loss``); other names as they are."""
    return METRIC_TITLES.get(metric, metric)


@dataclass
class PlotFigure:
    name: str  # file-name-safe slug, unique within a report
    title: str
    caption: str
    png: bytes


def _text(s: str, width: int = 60) -> str:
    """Label-safe text: ``$`` would start mathtext, a leading ``_`` hides a legend entry."""
    s = s.replace("$", r"\$")
    s = " " + s if s.startswith("_") else s
    return "\n".join(textwrap.wrap(s, width)) or " "


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-")[:60] or "x"


def ema(series: pd.Series, beta: float) -> pd.Series:
    """Bias-corrected exponential moving average over the finite values (non-finite points are dropped), so
    the first steps are not pulled towards zero as a plain EMA started at 0 would."""
    finite = np.isfinite(series.to_numpy(dtype=float))
    s = series if finite.all() else series[finite]
    if beta <= 0 or s.empty:
        return s
    # pandas' adjust=True weights the past by beta^i normalised by their sum: exactly the debiased EMA
    return s.ewm(alpha=1 - beta, adjust=True).mean()


def _curve(rs: RunSet, run_id: str, metric: str) -> pd.Series:
    hist = rs.history.get(run_id)
    if hist is None or metric not in hist.columns:
        return pd.Series(dtype=float)
    col = hist[metric]
    values = col.to_numpy(dtype=float)
    logged = ~np.isnan(values)
    if logged.all():
        return col
    return pd.Series(values[logged], index=col.index[logged], name=col.name)  # ~5x faster than col[logged]


def _run_arrays(rs: RunSet, run_id: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one run's metric as arrays, rows that did not log it included (as NaN)."""
    hist = rs.history.get(run_id)
    if hist is None or metric not in hist.columns:
        return np.array([], dtype=np.int64), np.array([], dtype=float)
    return hist.index.to_numpy(), hist[metric].to_numpy(dtype=float)


def _thin(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS, peaks: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """At most about ``limit`` points of a line, the last one kept: every k-th point, or with ``peaks`` the
    highest of every k (so a one-step spike still shows)."""
    if len(x) <= limit:
        return x, y
    k = math.ceil(len(x) / limit)
    if peaks:
        n = len(x) // k * k
        idx = np.arange(0, n, k) + np.argmax(y[:n].reshape(-1, k), axis=1)
        idx = np.unique(np.r_[idx, np.arange(n, len(x))])
    else:
        idx = np.unique(np.r_[np.arange(0, len(x), k), len(x) - 1])
    return x[idx], y[idx]


def _mean_band(curves: list[pd.Series]) -> tuple[pd.Index, np.ndarray, np.ndarray, np.ndarray] | None:
    """Mean, min and max over runs at the steps every run logged (a step missing from one seed would change
    which seeds the mean is over from one point to the next)."""
    curves = [c if np.isfinite(c.to_numpy(dtype=float)).all() else c[np.isfinite(c)] for c in curves]
    curves = [c for c in curves if len(c)]
    if not curves:
        return None
    index = curves[0].index
    if all(c.index.equals(index) for c in curves[1:]):  # the usual case: every seed logged the same steps
        values = np.column_stack([c.to_numpy(dtype=float) for c in curves])
    else:
        table = pd.concat(curves, axis=1, join="inner")
        if table.empty:
            return None
        index, values = table.index, table.to_numpy()
    return index, values.mean(axis=1), values.min(axis=1), values.max(axis=1)


def _grid(n: int) -> tuple[int, int]:
    cols = min(COLUMNS, n)
    return math.ceil(n / cols), cols


def _panels(n: int, labels: Sequence[str] = (), extra: int = 0) -> tuple[Figure, list[Axes]]:
    """A figure of ``n`` panels with fixed margins (inches): room for a suptitle above, two-line panel
    titles, and below a legend of ``labels`` (wrapped as :func:`_legend` wraps them) and ``extra`` one-line
    entries, in as many columns as the width takes."""
    rows, cols = _grid(n)
    lines = max([_text(label, 30).count("\n") + 1 for label in labels] + [1])
    legend_rows = math.ceil((len(labels) + extra) / _legend_cols(PANEL_W * cols)) * lines
    top, bottom, left, right = 0.55, 0.6 + 0.22 * legend_rows, 0.62, 0.15
    gap_w, gap_h = 0.6, 0.85
    width, height = PANEL_W * cols, PANEL_H * rows + top + bottom - 0.4
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    inner_w = (width - left - right - gap_w * (cols - 1)) / cols
    inner_h = (height - top - bottom - gap_h * (rows - 1)) / rows
    fig.subplots_adjust(
        left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height,
        wspace=gap_w / inner_w, hspace=gap_h / inner_h,
    )  # fmt: skip
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, list(axes[:n])


def _png(fig: Figure) -> bytes:
    """The figure as PNG at ``DPI``: RGB when every pixel is opaque (a quarter less to compress than
    savefig's RGBA, for the same image), zlib level 3 (half of level 6's time; a report on a big sweep
    encodes dozens of figures, and the files come out smaller than savefig's anyway)."""
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    image = Image.fromarray(np.ascontiguousarray(rgba[..., :3]) if (rgba[..., 3] == 255).all() else rgba)
    buf = io.BytesIO()
    image.save(buf, format="png", compress_level=PNG_COMPRESS_LEVEL, dpi=(DPI, DPI))
    return buf.getvalue()


def _statuses(rs: RunSet) -> dict[str, str]:
    return dict(zip(rs.runs["run_id"], rs.runs[M.STATUS]))


def _pages(comp: Comparison, max_pages: int | None = None) -> list[list[str]]:
    pages = [comp.contexts[i : i + MAX_PANELS] for i in range(0, len(comp.contexts), MAX_PANELS)]
    return pages[:max_pages] if max_pages else pages


def _omitted_note(comp: Comparison, max_pages: int | None) -> str:
    shown = sum(len(p) for p in _pages(comp, max_pages))
    if shown == len(comp.contexts):
        return ""
    return f" Only the first {shown} of {len(comp.contexts)} contexts are drawn; the tables hold all of them."


def _members(comp: Comparison) -> dict[tuple[str, str], list[str]]:
    """(context, arm) -> its runs, in the assignment's order."""
    out: dict[tuple[str, str], list[str]] = {}
    for r, key in comp.assignment.items():
        out.setdefault(key, []).append(r)
    return out


def _not_completed_note(rs: RunSet, comp: Comparison, contexts: list[str], averaged: bool = True) -> str:
    status = _statuses(rs)
    runs = [r for r, (ctx, _) in comp.assignment.items() if ctx in contexts and status[r] != M.STATUS_COMPLETED]
    if not runs:
        return ""
    shown = ", ".join(f"{r} ({comp.assignment[r][1]}, {status[r]})" for r in runs[:8])
    more = f" and {len(runs) - 8} more" if len(runs) > 8 else ""
    what = "drawn alone and left out of the mean" if averaged else "not completed"
    return f" Dashed: runs {what}: {shown}{more}."


def _legend_cols(width: float) -> int:
    """Legend columns that fit a figure ``width`` inches wide (an entry of up to 30 characters at 8 pt)."""
    return max(1, min(5, int(width // 2.6)))


def _legend(fig: Figure, labels: list[str], extra: list[Line2D]) -> None:
    handles: list = [Patch(color=COLORS[i % len(COLORS)], label=_text(a, 30)) for i, a in enumerate(labels)]
    handles += extra
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), fontsize=8, frameon=False,
               ncols=min(len(handles), _legend_cols(fig.get_figwidth())))  # fmt: skip


def _style(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    """Titles, labels, tick sizes and the grid of a panel whose data and limits are final."""
    # The title is pinned at the top (y=1), where matplotlib's automatic placement puts it too unless the y
    # axis shows an offset text ("1e3", "+3.2") to clear, which is left to matplotlib; that placement takes
    # the tight box of every y tick label of every panel at each draw (~8% of drawing a big report).
    pinned = {} if _offset_text(ax.yaxis) else {"y": 1.0}
    ax.set_title(_text(title), fontsize=9, **pinned)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(which="both", labelsize=7)
    ax.grid(alpha=0.3, which="both")


def _offset_text(axis: Any) -> str:
    """The offset text ("1e3", "+3.2") the axis will show, as its draw sets it from its current ticks."""
    formatter = axis.get_major_formatter()
    formatter.set_locs(axis.get_majorticklocs())
    return formatter.get_offset()


class _PlainLogFormatter(LogFormatter):
    """LogFormatter's choice of which ticks to label, each written plainly ("0.4", "6"), not "4e-01"."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:.3g}"


def _plain_log_ticks(ax: Axes) -> None:
    """Log-scale y ticks written as "6" or "0.4", not mathtext "6×10⁰" or "4e-01"."""
    for setter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        setter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.5)))
    _log_ticks_in_view(ax.yaxis)


class _InView(Locator):
    """``base``'s tick locations inside the axis's view, for a log axis.

    Matplotlib builds a tick (three lines, two texts: about a millisecond) for every location a locator
    returns before it drops those outside the view, and a log locator returns whole decades beyond both ends:
    two thirds of a log panel's ticks were never drawn. Log formatters label from the view, not from the
    locations, so the drawn ticks and labels are the same.
    """

    def __init__(self, base: Locator) -> None:
        self.base = base

    def set_axis(self, axis: Any) -> None:
        super().set_axis(axis)
        self.base.set_axis(axis)

    def __call__(self) -> Sequence[float]:
        locs = np.asarray(self.base(), dtype=float)
        lo, hi = sorted(self.axis.get_view_interval())
        return locs[(locs >= lo * (1 - 1e-6)) & (locs <= hi * (1 + 1e-6))]  # slack: matplotlib's "close"

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        return self.base.tick_values(vmin, vmax)

    def nonsingular(self, v0: float, v1: float) -> tuple[float, float]:
        return self.base.nonsingular(v0, v1)

    def view_limits(self, vmin: float, vmax: float) -> tuple[float, float]:
        return self.base.view_limits(vmin, vmax)


def _log_ticks_in_view(axis: Any) -> None:
    axis.set_major_locator(_InView(axis.get_major_locator()))
    axis.set_minor_locator(_InView(axis.get_minor_locator()))


def _title(what: str, comp: Comparison, page: int, pages: int) -> str:
    return f"{what} by {comp.axis.label}" + (f" ({page}/{pages})" if pages > 1 else "")


# --- curves over steps ----------------------------------------------------------------------------------
CurveOf = Callable[[str], pd.Series]  # run_id -> values indexed by step


def curve_figures(
    rs: RunSet,
    comp: Comparison,
    series: CurveOf,
    *,
    label: str,
    kind: str,
    caption: str,
    smoothing: float = 0.0,
    log_y: bool = False,
    max_pages: int | None = None,
) -> list[PlotFigure]:
    """Mean over completed runs per arm with a min–max band across seeds, one panel per context.

    A min–max band rather than a CI: with 2–3 seeds a t-interval is wide and mostly reflects the t
    quantile, while min–max shows the actual seeds. ``series`` gives a run's values by step; ``smoothing``
    is the EMA factor applied per run before averaging. Runs that did not complete are dashed, diverged ones
    end in an X, and neither sets the y range, so one blow-up cannot flatten every other curve.
    """
    status = _statuses(rs)
    members_of = _members(comp)
    colors = {arm: COLORS[i % len(COLORS)] for i, arm in enumerate(comp.arms)}
    pages = _pages(comp, max_pages)
    extra = [
        Line2D([], [], color="0.3", lw=1.6, label="mean of completed runs; band = min–max over seeds"),
        Line2D([], [], color="0.3", lw=1.0, ls="--", label="not completed (not in mean)"),
        Line2D([], [], color="0.3", marker="X", ls="", label="diverged"),
    ]
    ylabel = label + (f" (EMA {smoothing:g})" if smoothing else "")
    out = []
    for page, contexts in enumerate(pages, 1):
        fig, axes = _panels(len(contexts), comp.arms, len(extra))
        drawn = False
        for ax, context in zip(axes, contexts):
            ylims: list[float] = []
            for arm in comp.arms:
                members = members_of.get((context, arm), [])
                done = [r for r in members if status[r] == M.STATUS_COMPLETED]
                band = _mean_band([ema(series(r), smoothing) for r in done])
                if band is not None:
                    steps, mean, low, high = band
                    x, y = _thin(steps.to_numpy(), mean)
                    ax.plot(x, y, color=colors[arm], lw=1.6)
                    if len(done) > 1:
                        xb, lo = _thin(steps.to_numpy(), low)
                        ax.fill_between(xb, lo, _thin(steps.to_numpy(), high)[1], color=colors[arm],
                                        alpha=0.18, lw=0)  # fmt: skip
                    ylims += [float(np.nanmin(low)), float(np.nanmax(high))]
                    drawn = True
                for r in members:
                    if status[r] == M.STATUS_COMPLETED:
                        continue
                    c = ema(series(r), smoothing)
                    if len(c):
                        ax.plot(*_thin(c.index.to_numpy(), c.to_numpy()), color=colors[arm], lw=1.0, ls="--",
                                alpha=0.8)  # fmt: skip
                        if status[r] == M.STATUS_DIVERGED:
                            ax.plot(c.index[-1], c.iloc[-1], marker="X", color=colors[arm], ms=7)
                        else:
                            ylims += [float(c.min()), float(c.max())]
                        drawn = True
            if ylims:
                lo, hi = min(ylims), max(ylims)
                if log_y and lo > 0:
                    ax.set_yscale("log")
                    ax.set_ylim(lo / 1.1, hi * 1.1)
                    _plain_log_ticks(ax)
                else:
                    pad = 0.05 * (hi - lo or abs(hi) or 1.0)
                    ax.set_ylim(lo - pad, hi + pad)
            _style(ax, context, "step", ylabel)
        if not drawn:
            continue
        _legend(fig, comp.arms, extra)
        title = _title(metric_title(label), comp, page, len(pages))
        fig.suptitle(_text(title, 90), fontsize=11)
        text = (
            caption
            + " Solid line: mean over completed runs at the steps all of them logged;"
            + " band: min–max over seeds"
            + (f"; each run EMA-smoothed (β={smoothing:g}) first" if smoothing else "")
            + "."
            + _not_completed_note(rs, comp, contexts)
            + (_omitted_note(comp, max_pages) if page == len(pages) else "")
        )
        out.append(PlotFigure(f"{slug(comp.axis.label)}_{kind}_{page}", title, text, _png(fig)))
    return out


def _has(rs: RunSet, comp: Comparison, metric: str) -> bool:
    return any(len(_curve(rs, r, metric)) for r in comp.assignment)


def loss_figures(
    rs: RunSet,
    comp: Comparison,
    metric: str = M.VAL_LOSS,
    smoothing: float = 0.0,
    max_pages: int | None = None,
) -> list[PlotFigure]:
    """Loss (or any logged metric) per arm, one panel per context: see :func:`curve_figures`."""
    kind = "val-loss" if metric == M.VAL_LOSS else "train-loss" if metric == M.TRAIN_LOSS else slug(metric)
    return curve_figures(
        rs, comp, lambda r: _curve(rs, r, metric), label=metric, kind=kind, smoothing=smoothing,
        caption=f"{metric} per arm of {comp.axis.label}, one panel per context.", max_pages=max_pages,
    )  # fmt: skip


def attention_logit_figures(rs: RunSet, comp: Comparison, max_pages: int | None = None) -> list[PlotFigure]:
    """Max pre-softmax attention logit (max over layers) over training. Growing attention logits are the
    instability QK-norm was introduced against (Dehghani et al. 2023; Wortsman et al. 2023)."""
    if not _has(rs, comp, MAX_ATTN_LOGIT_ALL):
        return []
    return curve_figures(
        rs, comp, lambda r: _curve(rs, r, MAX_ATTN_LOGIT_ALL), label="max attention logit", kind="attn-logit",
        caption=(f"Largest pre-softmax attention logit over all layers at each probe step, per arm of "
                 f"{comp.axis.label} (log scale)."),
        log_y=True, max_pages=max_pages,
    )  # fmt: skip


def logit_growth_figures(rs: RunSet, comp: Comparison, max_pages: int | None = None) -> list[PlotFigure]:
    """Output-logit growth: ``logits/max_abs`` when logged, else ``logits/mean_log_z`` (the quantity
    z-loss pushes to 0; PaLM)."""
    metric = next((m for m in (M.LOGITS_MAX_ABS, M.LOGITS_MEAN_LOG_Z) if _has(rs, comp, m)), None)
    if metric is None:
        return []
    what = "largest |output logit|" if metric == M.LOGITS_MAX_ABS else "mean log-partition log Z"
    return curve_figures(
        rs, comp, lambda r: _curve(rs, r, metric), label=metric, kind="logit-growth",
        caption=f"Output-logit growth: {metric} ({what}) on the probe batch, per arm of {comp.axis.label}.",
        max_pages=max_pages,
    )  # fmt: skip


def grad_norm_figures(rs: RunSet, comp: Comparison, max_pages: int | None = None) -> list[PlotFigure]:
    """Gradient norm of every run (log scale), spikes marked, one panel per context.

    Runs are drawn individually rather than averaged: a spike is an event of one run, and a mean over seeds
    would smear it into a bump that no run had.
    """
    status = _statuses(rs)
    members_of = _members(comp)
    colors = {arm: COLORS[i % len(COLORS)] for i, arm in enumerate(comp.arms)}
    pages = _pages(comp, max_pages)
    extra = [
        Line2D([], [], color="0.3", lw=0.8, label="one line per run"),
        Line2D([], [], color="0.3", lw=0.8, ls="--", label="not completed"),
        Line2D([], [], color="0.3", ls="", marker="^", mfc="none", label=f"spike ({M.SPIKE_GRAD_NORM}=1)"),
        Line2D([], [], color="0.3", marker="X", ls="", label="diverged"),
    ]
    out = []
    for page, contexts in enumerate(pages, 1):
        fig, axes = _panels(len(contexts), comp.arms, len(extra))
        drawn = False
        for ax, context in zip(axes, contexts):
            scale = False
            for arm in comp.arms:
                # one artist per arm and line style, not one per run: a context can hold hundreds of runs
                lines: dict[str, list[np.ndarray]] = {"-": [], "--": []}
                spikes: list[np.ndarray] = []
                ends: list[tuple[float, float]] = []
                for r in members_of.get((context, arm), []):
                    x, y = _run_arrays(rs, r, M.GRAD_NORM)
                    ok = np.isfinite(y) & (y > 0)
                    x, y = x[ok], y[ok]
                    if not len(x):
                        continue
                    ls = "-" if status[r] == M.STATUS_COMPLETED else "--"
                    lines[ls].append(np.column_stack(_thin(x, y, MAX_POINTS // 3, peaks=True)))
                    fx, flags = _run_arrays(rs, r, M.SPIKE_GRAD_NORM)
                    hit = np.isin(x, fx[flags == 1])
                    if hit.any():
                        spikes.append(np.column_stack([x[hit], y[hit]]))
                    if status[r] == M.STATUS_DIVERGED:
                        ends.append((x[-1], y[-1]))
                    drawn = True
                for ls, segments in lines.items():
                    if segments:  # zorder 2, as Line2D's: above the grid
                        ax.add_collection(LineCollection(segments, colors=colors[arm], linewidths=0.8,
                                                         linestyles=ls, alpha=0.75, zorder=2))  # fmt: skip
                        scale = True
                if spikes:
                    xy = np.concatenate(spikes)
                    ax.plot(xy[:, 0], xy[:, 1], ls="", marker="^", ms=6, mfc="none", mec=colors[arm], mew=1.3)
                if ends:
                    ax.plot(*np.array(ends).T, ls="", marker="X", color=colors[arm], ms=7)
            if scale:  # matplotlib < 3.11 does not autoscale to a collection by itself
                ax.autoscale_view()
            ax.set_yscale("log")
            _plain_log_ticks(ax)
            _style(ax, context, "step", f"{M.GRAD_NORM} (log)")
        if not drawn:
            continue
        _legend(fig, comp.arms, extra)
        title = _title(metric_title(M.GRAD_NORM), comp, page, len(pages))
        fig.suptitle(_text(title, 90), fontsize=11)
        caption = (
            "Gradient norm before clipping, every run drawn on its own (log scale); "
            "triangles mark steps the "
            f"spike detector flagged. One panel per context of {comp.axis.label}."
            + _not_completed_note(rs, comp, contexts, averaged=False)
            + (_omitted_note(comp, max_pages) if page == len(pages) else "")
        )
        out.append(PlotFigure(f"{slug(comp.axis.label)}_grad-norm_{page}", title, caption, _png(fig)))
    return out


# --- profiles at one moment: per-layer gradients at init, loss against context length -------------------
def _profile_figures(
    rs: RunSet,
    comp: Comparison,
    values: Callable[[str], pd.Series],
    runs_for: Callable[[str], bool],
    *,
    what: str,
    kind: str,
    xlabel: str,
    ylabel: str,
    caption: str,
    log_x: bool = False,
    log_y: bool = False,
    max_pages: int | None = None,
) -> list[PlotFigure]:
    """One line per arm through x → mean over runs (error bars: 95% t-interval when there are 2+ runs),
    one panel per context. ``values`` gives a run's y by x; ``runs_for`` says which runs enter the mean."""
    status = _statuses(rs)
    members_of = _members(comp)
    colors = {arm: COLORS[i % len(COLORS)] for i, arm in enumerate(comp.arms)}
    pages = _pages(comp, max_pages)
    extra = [Line2D([], [], color="0.3", marker="o", label="mean over runs; bars: 95% CI")]
    out = []
    for page, contexts in enumerate(pages, 1):
        fig, axes = _panels(len(contexts), comp.arms, 1)
        drawn = False
        for ax, context in zip(axes, contexts):
            xs_all: set[float] = set()
            for i, arm in enumerate(comp.arms):
                runs = [r for r in members_of.get((context, arm), []) if runs_for(status[r])]
                table = pd.concat([values(r) for r in runs], axis=1) if runs else pd.DataFrame()
                if table.empty:
                    continue
                stats = [mean_ci(table.loc[x].tolist()) for x in table.index]
                x = table.index.to_numpy(dtype=float)
                mean = np.array([s[0] for s in stats])
                lo = np.array([s[1] for s in stats])
                hi = np.array([s[2] for s in stats])
                ok = np.isfinite(mean)
                if not ok.any():
                    continue
                err = np.vstack([mean - lo, hi - mean])
                err = np.where(np.isfinite(err), err, 0.0)
                ax.errorbar(x[ok], mean[ok], yerr=err[:, ok], color=colors[arm], marker=MARKERS[i % 9], ms=4,
                            lw=1.4, capsize=2.5)  # fmt: skip
                xs_all |= set(x[ok].tolist())
                drawn = True
            if log_x:
                ax.set_xscale("log", base=2)
            if log_y:
                ax.set_yscale("log")
                _plain_log_ticks(ax)
            if xs_all:
                ticks = sorted(xs_all)
                ax.xaxis.set_major_locator(FixedLocator(ticks))
                ax.xaxis.set_minor_locator(NullLocator())
                ax.set_xticklabels([_tick(t, kind) for t in ticks])
            _style(ax, context, xlabel, ylabel)
        if not drawn:
            continue
        _legend(fig, comp.arms, extra)
        title = _title(what, comp, page, len(pages))
        fig.suptitle(_text(title, 90), fontsize=11)
        text = caption + (_omitted_note(comp, max_pages) if page == len(pages) else "")
        out.append(PlotFigure(f"{slug(comp.axis.label)}_{kind}_{page}", title, text, _png(fig)))
    return out


def _tick(x: float, kind: str) -> str:
    text = f"{x:g}"
    return text + "×" if kind == "extrapolation" else text


def _layer_columns(rs: RunSet) -> dict[str, int]:
    """run-table column -> layer index, for the first probe's per-layer gradient norms."""
    out = {}
    for col in rs.runs.columns:
        m = LAYER_KEY.match(col[len(FIRST_PROBE_PREFIX) :]) if col.startswith(FIRST_PROBE_PREFIX) else None
        if m and m.group(2) == M.GRAD_NORM_LAYER:
            out[col] = int(m.group(1))
    return out


def init_grad_figures(rs: RunSet, comp: Comparison, max_pages: int | None = None) -> list[PlotFigure]:
    """Per-layer gradient norm at initialisation (the first probe row), layer index on x.

    Xiong et al. (2020): with post-norm the gradient norm near the output grows with depth at initialisation
    (hence warm-up), with pre-norm it stays flat. Every run counts, diverged ones included: at the first probe
    none has diverged yet.
    """
    cols = _layer_columns(rs)
    if not cols:
        return []
    table = rs.runs.set_index("run_id")[list(cols)].rename(columns=cols)
    table = table.apply(pd.to_numeric, errors="coerce")
    if not table.notna().to_numpy().any():
        return []
    table = table[sorted(table.columns)]

    def values(r: str) -> pd.Series:
        return table.loc[r].dropna().rename(r)

    steps = pd.to_numeric(rs.runs.get(FIRST_PROBE_STEP, pd.Series(dtype=float)), errors="coerce").dropna()
    at = f" (step {int(steps.min())})" if len(steps) and steps.min() == steps.max() else ""
    return _profile_figures(
        rs, comp, values, lambda status: True, what="per-layer grad norm at init", kind="init-grad-norm",
        xlabel="layer", ylabel="grad norm at first probe (log)", log_y=True, max_pages=max_pages,
        caption=(f"Gradient norm of each block (L2 over the block's parameters) at the first probe row{at}, "
                 f"computed from the initial weights, per arm of {comp.axis.label}, layer 0 nearest the input; "
                 "mean over all runs with 95% CI bars (log scale)."),
    )  # fmt: skip


def extrapolation_columns(rs: RunSet) -> dict[str, float]:
    """run-table column -> k, for every ``val/loss@<k>x`` column."""
    return {c: float(m.group(1)) for c in rs.runs.columns if (m := EXTRAPOLATION_KEY.match(str(c)))}


def extrapolation_figures(rs: RunSet, comp: Comparison, max_pages: int | None = None) -> list[PlotFigure]:
    """Validation loss against evaluation context length (k × the training context), per arm.

    Values come from the final metrics row's ``val/loss@<k>x`` keys; the training context (k = 1) is the
    final val loss unless a ``val/loss@1x`` key exists. Completed runs only.
    """
    cols = extrapolation_columns(rs)
    if not cols:
        return []
    table = rs.runs.set_index("run_id")[list(cols)].rename(columns=cols).apply(pd.to_numeric, errors="coerce")
    if not table.notna().to_numpy().any():
        return []
    if 1.0 not in table.columns:
        base = pd.to_numeric(rs.runs.set_index("run_id")[M.FINAL_VAL_LOSS], errors="coerce")
        table[1.0] = base.where(table.notna().any(axis=1))
    table = table[sorted(table.columns)]

    def values(r: str) -> pd.Series:
        return table.loc[r].dropna().rename(r)

    return _profile_figures(
        rs, comp, values, lambda status: status == M.STATUS_COMPLETED, what="length extrapolation",
        kind="extrapolation", xlabel="evaluation context / training context (k)", ylabel="val loss",
        log_x=True, max_pages=max_pages,
        caption=(f"Validation loss at k times the training context (val/loss@<k>x, from each run's final "
                 f"metrics row; k=1: final val loss), per arm of {comp.axis.label}; mean over completed runs "
                 "with 95% CI bars. A flat curve extrapolates; a rising one does not."),
    )  # fmt: skip


# --- learning-rate sweep --------------------------------------------------------------------------------
LINES_PER_PANEL = 8


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
    ]
    out = []
    for page, group in enumerate(shown_pages, 1):
        page_labels = labels if line_axis else [c for _, cs in group for c in cs]
        fig, axes = _panels(len(group), page_labels, len(extra))
        for ax, (title, contexts) in zip(axes, group):
            trans = blended_transform_factory(ax.transData, ax.transAxes)
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
                b = best.loc[context]
                if np.isfinite(b["best_lr"]):
                    ax.plot(b["best_lr"], b[f"{final}_mean"], marker="o", ms=12, mfc="none", mec=color, mew=1.5)
                div = pts[pts["n_diverged"] > 0]
                if len(div):
                    ax.plot(div["lr"], [0.97 - 0.035 * (i % 8)] * len(div), ls="", marker="X", ms=6,
                            color=color, transform=trans, clip_on=False)  # fmt: skip
            ax.set_xscale("log")
            _log_ticks_in_view(ax.xaxis)
            _style(ax, title, sweep.axis.label + " (log)", f"final {M.VAL_LOSS}")
        _legend(fig, page_labels, extra)
        title = f"final {metric_title(M.VAL_LOSS)} vs {sweep.axis.label}" + (
            f" ({page}/{len(shown_pages)})" if len(shown_pages) > 1 else ""
        )
        fig.suptitle(_text(title, 90), fontsize=11)
        colour = f"; colour: {line_axis}, one panel per value of the rest" if line_axis and len(panels) > 1 else ""
        omitted = len(shown_pages) < len(pages) and page == len(shown_pages)
        caption = (
            f"Final validation loss against {sweep.axis.label} (log scale), one line per arm (the values "
            f"of the other varied axes{colour}): mean over completed runs with 95% Student-t bars (none with "
            "one seed). The circle marks each arm's best LR; an X along the top marks an LR at which a run of "
            "that arm diverged (a diverged run has no final loss to plot)."
            + (f" Only the first {sum(len(p) for p in shown_pages)} of {len(panels)} panels are drawn; the "
               "table holds every arm." if omitted else "")
        )  # fmt: skip
        out.append(PlotFigure(f"{slug(sweep.axis.label)}_lr-sweep_{page}", title, caption, _png(fig)))
    return out


# --- all figures of one comparison ----------------------------------------------------------------------
FigureJob = Callable[[], list[PlotFigure]]


def comparison_figure_jobs(
    rs: RunSet, comp: Comparison, smoothing: float = 0.9, max_pages: int | None = None
) -> list[FigureJob]:
    """The figures of one comparison as separate jobs, so a report can draw them in parallel: validation
    loss, smoothed training loss, gradient norm, then (where logged) per-layer gradients at init, attention
    logits, output-logit growth and length extrapolation."""
    return [
        lambda: loss_figures(rs, comp, M.VAL_LOSS, max_pages=max_pages),
        lambda: loss_figures(rs, comp, M.TRAIN_LOSS, smoothing=smoothing, max_pages=max_pages),
        lambda: grad_norm_figures(rs, comp, max_pages=max_pages),
        lambda: init_grad_figures(rs, comp, max_pages=max_pages),
        lambda: attention_logit_figures(rs, comp, max_pages=max_pages),
        lambda: logit_growth_figures(rs, comp, max_pages=max_pages),
        lambda: extrapolation_figures(rs, comp, max_pages=max_pages),
    ]


def comparison_figures(
    rs: RunSet, comp: Comparison, smoothing: float = 0.9, max_pages: int | None = None
) -> list[PlotFigure]:
    """All figures for one comparison (see :func:`comparison_figure_jobs`), drawn here."""
    return [fig for job in comparison_figure_jobs(rs, comp, smoothing, max_pages) for fig in job()]


def save_figures(figures: list[PlotFigure], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fig in figures:
        path = out / f"{fig.name}.png"
        path.write_bytes(fig.png)
        paths.append(path)
    return paths
