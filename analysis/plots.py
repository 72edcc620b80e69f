"""Curves per arm for one comparison: validation loss, training loss and gradient norm.

Matplotlib's object API with the Agg canvas is used instead of pyplot, so importing this module neither
switches the caller's backend nor keeps figures alive in pyplot's global registry.

Each context of a comparison gets its own panel (arms are only compared within a context). Only completed
runs enter a mean; runs that diverged or did not finish are drawn individually as dashed lines and named in
the caption, because averaging a curve that stops (or explodes) halfway would bend the mean.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import LogFormatter

from analysis.compare import Comparison
from analysis.load import RunSet
from lm_ablate import metrics as M

MAX_PANELS = 6  # per figure; more contexts wrap onto further figures
COLUMNS = 3
DPI = 110
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


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
    s = series[np.isfinite(series)]
    if beta <= 0 or s.empty:
        return s
    # pandas' adjust=True weights the past by beta^i normalised by their sum: exactly the debiased EMA
    return s.ewm(alpha=1 - beta, adjust=True).mean()


def _curve(rs: RunSet, run_id: str, metric: str) -> pd.Series:
    hist = rs.history.get(run_id)
    if hist is None or metric not in hist.columns:
        return pd.Series(dtype=float)
    return hist[metric].dropna()


def _mean_band(curves: list[pd.Series]) -> tuple[pd.Index, np.ndarray, np.ndarray, np.ndarray] | None:
    """Mean, min and max over runs at the steps every run logged (a step missing from one seed would change
    which seeds the mean is over from one point to the next)."""
    curves = [c[np.isfinite(c)] for c in curves]
    curves = [c for c in curves if len(c)]
    if not curves:
        return None
    table = pd.concat(curves, axis=1, join="inner")
    if table.empty:
        return None
    values = table.to_numpy()
    return table.index, values.mean(axis=1), values.min(axis=1), values.max(axis=1)


def _grid(n: int) -> tuple[int, int]:
    cols = min(COLUMNS, n)
    return math.ceil(n / cols), cols


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _statuses(rs: RunSet) -> dict[str, str]:
    return dict(zip(rs.runs["run_id"], rs.runs[M.STATUS]))


def _pages(comp: Comparison) -> list[list[str]]:
    return [comp.contexts[i : i + MAX_PANELS] for i in range(0, len(comp.contexts), MAX_PANELS)]


def _not_completed_note(rs: RunSet, comp: Comparison, contexts: list[str], averaged: bool = True) -> str:
    status = _statuses(rs)
    runs = [
        r for r, (ctx, _) in comp.assignment.items() if ctx in contexts and status[r] != M.STATUS_COMPLETED
    ]
    if not runs:
        return ""
    shown = ", ".join(f"{r} ({comp.assignment[r][1]}, {status[r]})" for r in runs[:8])
    more = f" and {len(runs) - 8} more" if len(runs) > 8 else ""
    what = "drawn alone and left out of the mean" if averaged else "not completed"
    return f" Dashed: runs {what}: {shown}{more}."


def _legend(fig: Figure, comp: Comparison, extra: list[Line2D]) -> None:
    handles: list = [
        Patch(color=COLORS[i % len(COLORS)], label=_text(arm, 30)) for i, arm in enumerate(comp.arms)
    ]
    handles += extra
    fig.legend(
        handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=8, frameon=False
    )


def loss_figures(
    rs: RunSet, comp: Comparison, metric: str = M.VAL_LOSS, smoothing: float = 0.0
) -> list[PlotFigure]:
    """Mean loss per arm over completed runs with a min–max band across seeds, one panel per context.

    A min–max band rather than a CI: with 2–3 seeds a t-interval is wide and mostly reflects the t
    quantile, while min–max shows the actual seeds. ``smoothing`` is the EMA factor applied per run
    before averaging.
    """
    status = _statuses(rs)
    colors = {arm: COLORS[i % len(COLORS)] for i, arm in enumerate(comp.arms)}
    kind = "val-loss" if metric == M.VAL_LOSS else "train-loss" if metric == M.TRAIN_LOSS else slug(metric)
    out = []
    for page, contexts in enumerate(_pages(comp), 1):
        rows, cols = _grid(len(contexts))
        fig = Figure(figsize=(4.6 * cols, 3.4 * rows + 0.8), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        drawn = False
        for ax, context in zip(axes, contexts):
            ylims: list[float] = []
            for arm in comp.arms:
                members = [r for r, key in comp.assignment.items() if key == (context, arm)]
                done = [r for r in members if status[r] == M.STATUS_COMPLETED]
                curves = [ema(_curve(rs, r, metric), smoothing) for r in done]
                band = _mean_band(curves)
                if band is not None:
                    steps, mean, low, high = band
                    ax.plot(steps, mean, color=colors[arm], lw=1.6)
                    if len(done) > 1:
                        ax.fill_between(steps, low, high, color=colors[arm], alpha=0.18, lw=0)
                    ylims += [float(np.nanmin(low)), float(np.nanmax(high))]
                    drawn = True
                for r in members:
                    if status[r] == M.STATUS_COMPLETED:
                        continue
                    c = ema(_curve(rs, r, metric), smoothing)
                    if len(c):
                        ax.plot(c.index, c.to_numpy(), color=colors[arm], lw=1.0, ls="--", alpha=0.8)
                        if status[r] == M.STATUS_DIVERGED:
                            ax.plot(c.index[-1], c.iloc[-1], marker="X", color=colors[arm], ms=7)
                        else:
                            ylims += [float(c.min()), float(c.max())]
                        drawn = True
            if ylims:  # scale without diverged runs, so a blow-up cannot flatten every other curve
                lo, hi = min(ylims), max(ylims)
                pad = 0.05 * (hi - lo or abs(hi) or 1.0)
                ax.set_ylim(lo - pad, hi + pad)
            ax.set_title(_text(context), fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.set_ylabel(metric + (f" (EMA {smoothing:g})" if smoothing else ""), fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in axes[len(contexts) :]:
            ax.set_visible(False)
        if not drawn:
            continue
        _legend(
            fig,
            comp,
            [
                Line2D(
                    [], [], color="0.3", lw=1.6, label="mean of completed runs; band = min–max over seeds"
                ),
                Line2D([], [], color="0.3", lw=1.0, ls="--", label="not completed (not in mean)"),
                Line2D([], [], color="0.3", marker="X", ls="", label="diverged"),
            ],
        )
        title = f"{metric} by {comp.axis.name}" + (
            f" ({page}/{len(_pages(comp))})" if len(_pages(comp)) > 1 else ""
        )
        fig.suptitle(_text(title, 90), fontsize=11)
        caption = (
            f"{metric} per arm of {comp.axis.name}, one panel per context. "
            "Solid line: mean over completed runs "
            f"at the steps all of them logged; band: min–max over seeds"
            + (f"; each run EMA-smoothed (β={smoothing:g}) first" if smoothing else "")
            + "."
            + _not_completed_note(rs, comp, contexts)
        )
        out.append(PlotFigure(f"{slug(comp.axis.name)}_{kind}_{page}", title, caption, _png(fig)))
    return out


def grad_norm_figures(rs: RunSet, comp: Comparison) -> list[PlotFigure]:
    """Gradient norm of every run (log scale), spikes marked, one panel per context.

    Runs are drawn individually rather than averaged: a spike is an event of one run, and a mean over seeds
    would smear it into a bump that no run had.
    """
    status = _statuses(rs)
    colors = {arm: COLORS[i % len(COLORS)] for i, arm in enumerate(comp.arms)}
    out = []
    for page, contexts in enumerate(_pages(comp), 1):
        rows, cols = _grid(len(contexts))
        fig = Figure(figsize=(4.6 * cols, 3.4 * rows + 0.8), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        drawn = False
        for ax, context in zip(axes, contexts):
            for arm in comp.arms:
                for r in (r for r, key in comp.assignment.items() if key == (context, arm)):
                    g = _curve(rs, r, M.GRAD_NORM)
                    g = g[np.isfinite(g) & (g > 0)]
                    if g.empty:
                        continue
                    ls = "-" if status[r] == M.STATUS_COMPLETED else "--"
                    ax.plot(g.index, g.to_numpy(), color=colors[arm], lw=0.8, ls=ls, alpha=0.75)
                    flags = _curve(rs, r, M.SPIKE_GRAD_NORM)
                    spikes = g[g.index.isin(flags.index[flags == 1])]
                    if len(spikes):
                        ax.plot(spikes.index, spikes.to_numpy(), ls="", marker="^", ms=6, mfc="none",
                                mec=colors[arm], mew=1.3)  # fmt: skip
                    if status[r] == M.STATUS_DIVERGED:
                        ax.plot(g.index[-1], g.iloc[-1], marker="X", color=colors[arm], ms=7)
                    drawn = True
            ax.set_yscale("log")
            for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                axis(
                    LogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.5))
                )  # "6", not mathtext "6×10⁰"
            ax.set_title(_text(context), fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.set_ylabel(f"{M.GRAD_NORM} (log)", fontsize=8)
            ax.tick_params(which="both", labelsize=7)
            ax.grid(alpha=0.3, which="both")
        for ax in axes[len(contexts) :]:
            ax.set_visible(False)
        if not drawn:
            continue
        _legend(
            fig,
            comp,
            [
                Line2D([], [], color="0.3", lw=0.8, label="one line per run"),
                Line2D([], [], color="0.3", lw=0.8, ls="--", label="not completed"),
                Line2D(
                    [], [], color="0.3", ls="", marker="^", mfc="none", label=f"spike ({M.SPIKE_GRAD_NORM}=1)"
                ),
                Line2D([], [], color="0.3", marker="X", ls="", label="diverged"),
            ],
        )
        title = f"{M.GRAD_NORM} by {comp.axis.name}" + (
            f" ({page}/{len(_pages(comp))})" if len(_pages(comp)) > 1 else ""
        )
        fig.suptitle(_text(title, 90), fontsize=11)
        caption = (
            "Gradient norm before clipping, every run drawn on its own (log scale); "
            "triangles mark steps the "
            f"spike detector flagged. One panel per context of {comp.axis.name}."
            + _not_completed_note(rs, comp, contexts, averaged=False)
        )
        out.append(PlotFigure(f"{slug(comp.axis.name)}_grad-norm_{page}", title, caption, _png(fig)))
    return out


def comparison_figures(rs: RunSet, comp: Comparison, smoothing: float = 0.9) -> list[PlotFigure]:
    """All figures for one comparison: validation loss, EMA-smoothed training loss, gradient norm."""
    return (
        loss_figures(rs, comp, M.VAL_LOSS)
        + loss_figures(rs, comp, M.TRAIN_LOSS, smoothing=smoothing)
        + grad_norm_figures(rs, comp)
    )


def save_figures(figures: list[PlotFigure], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fig in figures:
        path = out / f"{fig.name}.png"
        path.write_bytes(fig.png)
        paths.append(path)
    return paths
