"""Figures per arm for one comparison: curves over steps (losses, gradient norm, attention and output logits)
and profiles at one moment (per-layer gradients at init, loss against context length).

Each context of a comparison gets its own panel (arms are only compared within a context). Only completed
runs enter a mean; runs that diverged or did not finish are drawn individually as dashed lines and named in
the caption, because averaging a curve that stops (or explodes) halfway would bend the mean. A figure whose
data no run logged is not drawn at all (the function returns no figure).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from analysis.compute.compare import Comparison
from analysis.compute.stats import mean_ci
from analysis.present.style import (
    COLORS,
    MARKERS,
    MAX_PANELS,
    PlotFigure,
    arm_legend,
    hidden_lines,
    hidden_note,
    label_text,
    metric_title,
    panel_grid,
    plain_log_ticks,
    png_bytes,
    slug,
    style_axes,
)
from analysis.sources.load import (
    EXTRAPOLATION_KEY,
    FIRST_PROBE_PREFIX,
    FIRST_PROBE_STEP,
    LAYER_KEY,
    MAX_ATTN_LOGIT_ALL,
    RunSet,
)
from lm_ablate import metrics as M

MAX_POINTS = 1500  # per drawn line: more than a 500-pixel-wide panel can show


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
        fig, axes = panel_grid(len(contexts), comp.arms, len(extra))
        drawn = False
        hidden: list[tuple[str, str, str]] = []
        for ax, context in zip(axes, contexts):
            ylims: list[float] = []
            means: list[tuple[str, np.ndarray, np.ndarray]] = []
            for arm in comp.arms:
                members = members_of.get((context, arm), [])
                done = [r for r in members if status[r] == M.STATUS_COMPLETED]
                band = _mean_band([ema(series(r), smoothing) for r in done])
                if band is not None:
                    steps, mean, low, high = band
                    x, y = _thin(steps.to_numpy(), mean)
                    ax.plot(x, y, color=colors[arm], lw=1.6)
                    means.append((arm, x, y))
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
                log = log_y and lo > 0
                span = math.log(hi / lo) if log else hi - lo
                hidden += [(context, a, b) for a, b in hidden_lines(means, span, log)]
                if log_y and lo > 0:
                    ax.set_yscale("log")
                    ax.set_ylim(lo / 1.1, hi * 1.1)
                    plain_log_ticks(ax)
                else:
                    pad = 0.05 * (hi - lo or abs(hi) or 1.0)
                    ax.set_ylim(lo - pad, hi + pad)
            style_axes(ax, context, "step", ylabel)
        if not drawn:
            continue
        arm_legend(fig, comp.arms, extra)
        title = _title(metric_title(label), comp, page, len(pages))
        fig.suptitle(label_text(title, 90), fontsize=11)
        text = (
            caption
            + " Solid line: mean over completed runs at the steps all of them logged;"
            + " band: min–max over seeds"
            + (f"; each run EMA-smoothed (β={smoothing:g}) first" if smoothing else "")
            + "."
            + _not_completed_note(rs, comp, contexts)
            + hidden_note([(c if len(comp.contexts) > 1 else "", a, b) for c, a, b in hidden])
            + (_omitted_note(comp, max_pages) if page == len(pages) else "")
        )
        out.append(PlotFigure(f"{slug(comp.axis.label)}_{kind}_{page}", title, text, png_bytes(fig)))
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
        fig, axes = panel_grid(len(contexts), comp.arms, len(extra))
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
            plain_log_ticks(ax)
            style_axes(ax, context, "step", f"{M.GRAD_NORM} (log)")
        if not drawn:
            continue
        arm_legend(fig, comp.arms, extra)
        title = _title(metric_title(M.GRAD_NORM), comp, page, len(pages))
        fig.suptitle(label_text(title, 90), fontsize=11)
        caption = (
            "Gradient norm before clipping, every run drawn on its own (log scale); "
            "triangles mark steps the "
            f"spike detector flagged. One panel per context of {comp.axis.label}."
            + _not_completed_note(rs, comp, contexts, averaged=False)
            + (_omitted_note(comp, max_pages) if page == len(pages) else "")
        )
        out.append(PlotFigure(f"{slug(comp.axis.label)}_grad-norm_{page}", title, caption, png_bytes(fig)))
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
        fig, axes = panel_grid(len(contexts), comp.arms, 1)
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
                plain_log_ticks(ax)
            if xs_all:
                ticks = sorted(xs_all)
                ax.xaxis.set_major_locator(FixedLocator(ticks))
                ax.xaxis.set_minor_locator(NullLocator())
                ax.set_xticklabels([_tick(t, kind) for t in ticks])
            style_axes(ax, context, xlabel, ylabel)
        if not drawn:
            continue
        arm_legend(fig, comp.arms, extra)
        title = _title(what, comp, page, len(pages))
        fig.suptitle(label_text(title, 90), fontsize=11)
        text = caption + (_omitted_note(comp, max_pages) if page == len(pages) else "")
        out.append(PlotFigure(f"{slug(comp.axis.label)}_{kind}_{page}", title, text, png_bytes(fig)))
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
