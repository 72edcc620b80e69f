"""Figures of a scaling study: final loss against training compute per arm, and the compute multiplier
against compute.

Both are single-panel log-log figures drawn with matplotlib's object API and encoded by
:func:`analysis.present.style.png_bytes`, like every other figure of the report. Only fitted runs are drawn
(completed, at the chosen LR when the LR varies); the section's warnings list the rest.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from analysis.compute import scaling_forms as SF
from analysis.compute.scaling import EXTRAPOLATE, ScalingStudy
from analysis.present.style import (
    COLORS,
    MARKERS,
    PlotFigure,
    label_text,
    legend_columns,
    plain_log_ticks,
    png_bytes,
    style_axes,
)

WIDTH, HEIGHT = 8.0, 4.6  # inches, before the legend rows
FIT_POINTS = 200


def _figure(labels: list[str], extra: int) -> Figure:
    """One panel with room below for a legend of ``labels`` and ``extra`` entries (as style.panel_grid does)."""
    lines = max([label_text(label, 30).count("\n") + 1 for label in labels] + [1])
    legend_rows = -(-(len(labels) + extra) // legend_columns(WIDTH)) * lines
    bottom = 0.6 + 0.22 * legend_rows
    height = HEIGHT + bottom
    fig = Figure(figsize=(WIDTH, height))
    fig.subplots_adjust(left=0.75 / WIDTH, right=1 - 0.2 / WIDTH, top=1 - 0.55 / height, bottom=bottom / height)
    return fig


def _colors(study: ScalingStudy) -> dict[str, str]:
    """One colour per arm, by its place in the study (the baseline first), the same in both figures."""
    return {a.arm: COLORS[i % len(COLORS)] for i, a in enumerate(study.arms)}


def _legend(fig: Figure, entries: list[tuple[str, str]], extra: list[Line2D]) -> None:
    handles: list = [Patch(color=color, label=label_text(label, 30)) for label, color in entries] + extra
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), fontsize=8, frameon=False,
               ncols=min(len(handles), legend_columns(fig.get_figwidth())))  # fmt: skip


def loss_compute_figure(study: ScalingStudy) -> PlotFigure | None:
    """Final validation loss against training compute, log-log: every fitted run, the mean of each rung, the
    fit of each arm over its rungs (solid) and beyond them up to the largest multiple of EXTRAPOLATE
    (dashed), and the held-out check's prediction of the largest rung."""
    arms = [a for a in study.arms if a.rungs]
    if not arms:
        return None
    color_of = _colors(study)
    labels = [a.arm + (" (baseline)" if a.is_baseline else "") for a in arms]
    ff = study.chosen_fit
    joint = ff is not None and ff.fitted and ff.laws is not None
    what = (
        "the best allocation within the trained tokens per parameter under " if joint and ff.form.kind == "ND" else ""
    ) + (f"the {study.chosen} fit" if joint else "each arm's fit")
    extra = [
        Line2D([], [], color="0.3", marker=".", ls="", alpha=0.5, label="one run"),
        Line2D([], [], color="0.3", marker="o", ls="", label="mean over seeds"),
        Line2D(
            [],
            [],
            color="0.3",
            lw=1.5,
            label=("best trained allocation" if joint and ff.form.kind == "ND" else "fit") + " over the rungs",
        ),
        Line2D([], [], color="0.3", lw=1.2, ls="--", label=f"fit extrapolated to {max(EXTRAPOLATE):g}×"),
        Line2D([], [], color="0.3", marker="D", mfc="none", ls="", label="held-out prediction"),
    ]
    fig = _figure(labels, len(extra))
    ax = fig.add_subplot()
    ys: list[float] = []
    held_any = False
    for i, arm in enumerate(arms):
        color, marker = color_of[arm.arm], MARKERS[i % len(MARKERS)]
        c = np.concatenate([r.computes for r in arm.rungs])
        y = np.concatenate([r.losses for r in arm.rungs])
        ax.plot(c, y, ls="", marker=".", ms=5, color=color, alpha=0.5)
        means = np.array([[r.compute, r.mean_loss] for r in arm.rungs])
        ax.plot(means[:, 0], means[:, 1], ls="", marker=marker, ms=6, color=color, mec="white", mew=0.6, zorder=3)
        ys += [float(y.min()), float(y.max())]
        k = study.arm_index(arm.arm)
        curve = (lambda c, k=k: SF.curve_loss(ff.laws[k], c)) if joint else (arm.fit.loss if arm.fit else None)
        if curve is not None:
            lo, hi = arm.compute_range
            inside = np.geomspace(lo, hi, FIT_POINTS)
            beyond = np.geomspace(hi, hi * max(EXTRAPOLATE), FIT_POINTS)
            ax.plot(inside, curve(inside), color=color, lw=1.5)
            ax.plot(beyond, curve(beyond), color=color, lw=1.2, ls="--")
            ys.append(float(curve(beyond[-1])))
        held = [(c.compute, c.predicted) for c in ff.held_out if c.arm == k] if joint else (
            [(arm.held_out.compute, arm.held_out.predicted)] if arm.held_out is not None else []
        )  # fmt: skip
        for c, pred in held:
            ax.plot(c, pred, marker="D", ms=7, mfc="none", mec=color, mew=1.3, ls="", zorder=4)
        held_any = held_any or bool(held)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(min(ys) / 1.02, max(ys) * 1.02)
    plain_log_ticks(ax)
    style_axes(ax, "", "training compute C = FLOPs/token × tokens (log)", "final val/loss (log)")
    _legend(fig, [(label, color_of[a.arm]) for label, a in zip(labels, arms)], extra)
    title = "Final validation loss vs training compute"
    fig.suptitle(title, fontsize=11)
    caption = (
        f"Final validation loss against training compute (log-log), one colour per arm; the rungs are the values "
        f"of {study.size}. "
        "Small dots: every fitted run; large markers: the mean over seeds at each rung"
        + (" and budget" if len(study.budgets) > 1 else "")
        + f"; solid: {what} over the arm's rungs; dashed: the same beyond the largest rung, up to "
        f"{max(EXTRAPOLATE):g}× its compute; open diamonds: the losses predicted for the largest rung by "
        + (f"the {study.chosen} fit" if joint else "each arm's own fit")
        + " without it (its held-out check"
        + ("" if held_any else "; none here: too few cells are left without the largest rung")
        + ")."
        + _drawn(study)
    )
    return PlotFigure("scaling_loss-vs-compute", title, caption, png_bytes(fig))


def _drawn(study: ScalingStudy) -> str:
    """Which runs of a cell the figure draws: those at its best LR and ladder.tune setting, when chosen."""
    if study.tuned:
        lr = " and the learning rate" if study.lr_selected else ""
        return f" Only each (arm, rung)'s runs at its best setting of {', '.join(study.tuned)}{lr} are drawn."
    return " Only each (arm, rung)'s runs at its best learning rate are drawn." if study.lr_selected else ""


def multiplier_figure(study: ScalingStudy) -> PlotFigure | None:
    """Compute multiplier of each arm against the baseline over compute, with its bootstrap band. The y range
    holds every point estimate and the band over the arm's rungs; a band that widens beyond that (as it does
    far out) runs off the panel. +inf point estimates (the baseline never reaches the arm's loss) are drawn as
    triangles on the top edge."""
    if not study.curves:
        return None
    color_of = _colors(study)
    labels = [c.arm for c in study.curves]
    infinite = any((~np.isfinite(c.cm)).any() for c in study.curves)
    extra = [
        Line2D([], [], color="0.3", lw=1.5, label="CM over the arm's rungs"),
        Line2D([], [], color="0.3", lw=1.2, ls="--", label="extrapolated"),
        Line2D([], [], color="0.3", lw=6, alpha=0.2, label=f"{study.confidence:.0%} bootstrap band"),
    ] + ([Line2D([], [], color="0.3", marker="^", ls="", label="∞ (baseline never gets there)")] if infinite else [])
    fig = _figure(labels, len(extra))
    ax = fig.add_subplot()
    core = [np.array([1.0])]
    for c in study.curves:
        inside = c.compute <= study.arm(c.arm).compute_range[1]
        core += [c.cm, c.low[inside], c.high[inside]]
    values = np.concatenate(core)
    values = values[np.isfinite(values) & (values > 0)]
    top, bottom = float(values.max()) * 2, float(values.min()) / 2
    for curve in study.curves:
        color = color_of[curve.arm]
        data_hi = study.arm(curve.arm).compute_range[1]
        shown = np.where(np.isfinite(curve.cm), curve.cm, np.nan)
        inside = curve.compute <= data_hi
        ax.plot(curve.compute[inside], shown[inside], color=color, lw=1.5)
        beyond = np.r_[curve.compute[inside][-1:], curve.compute[~inside]]  # joined at the last point inside
        ax.plot(beyond, np.r_[shown[inside][-1:], shown[~inside]], color=color, lw=1.2, ls="--")
        span = (bottom / 10, top * 10)  # beyond the view, so the band's edge never shows at the panel's edge
        low = np.clip(np.where(np.isfinite(curve.low), curve.low, span[1]), *span)
        high = np.clip(np.where(np.isfinite(curve.high), curve.high, span[1]), *span)
        ax.fill_between(curve.compute, low, high, color=color, alpha=0.18, lw=0)
        inf = ~np.isfinite(curve.cm)
        if inf.any():
            ax.plot(curve.compute[inf], np.full(inf.sum(), top), ls="", marker="^", color=color, ms=5, clip_on=False)
        ax.axvline(data_hi, color=color, lw=0.8, ls=":")
    ax.axhline(1.0, color="0.2", lw=0.9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom, top)
    plain_log_ticks(ax)
    # the baseline is named in the title, which wraps: a y label as long as an arm's name would be cut off
    style_axes(ax, "", "training compute C of the arm (log)", "compute multiplier CM (log)")
    _legend(fig, [(label, color_of[label]) for label in labels], extra)
    title = f"Compute multiplier vs {study.baseline}"
    fig.suptitle(label_text(title, 90), fontsize=11)
    caption = (
        f"Compute multiplier CM(C) of each arm against the baseline ({study.baseline}): the compute the "
        "baseline's fit needs to reach the loss the arm's fit reaches with C, divided by C (above 1: the arm "
        f"is better). Band: {study.confidence:.0%} percentile interval over {study.n_boot} bootstrap "
        "resamples (seeds resampled within each rung, both fits refitted). Solid up to the arm's largest "
        f"rung (dotted vertical line), dashed beyond it, up to {max(EXTRAPOLATE):g}× that compute; the "
        "horizontal line is CM = 1. Where the band is wider than the panel it runs off its edge."
        + (" Triangles on the top edge: compute at which the point estimate is ∞." if infinite else "")
    )
    return PlotFigure("scaling_compute-multiplier", title, caption, png_bytes(fig))


def scaling_figures(study: ScalingStudy) -> list[PlotFigure]:
    return [f for f in (loss_compute_figure(study), multiplier_figure(study)) if f is not None]
