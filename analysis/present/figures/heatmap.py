"""A map of arm − baseline over a grid of two other axes: where does an intervention start to matter?

Drawn for a comparison whose contexts are the cells of exactly two other varied axes, both numeric and each
with at least two values (``sweeps/prepost_map.yaml``: norm.placement compared within model.n_layers x
optim.lr). One panel per non-baseline arm; each cell holds the comparison table's own numbers for that
context: the difference of mean final validation loss (arm − baseline, completed runs) and its 95% interval,
coloured on a diverging scale centred at 0 (red: the arm's loss is higher). Beneath them, per side, how many runs
stalled or diverged, so a cell whose mean hides a failed run says so:

* **diverged**: the run ended on a non-finite loss or gradient (status ``diverged``; it has no final loss);
* **stalled**: the runs table's ``stalled`` (analysis.sources.load judges every run by lm_ablate/stall.py, the
  loop's own rule): completed, but on the data's unigram plateau or flat after its first evaluation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from analysis.compute.compare import Axis, Comparison, find_axes, is_stalled
from analysis.present.format import STALL_WORDS
from analysis.present.style import PlotFigure, label_text, metric_title, png_bytes, slug
from analysis.sources.load import RunSet
from analysis.sources.values import override_text, value_order
from lm_ablate import metrics as M

CELL_W, CELL_H = 1.45, 0.95  # inches per cell
GREY = "#e6e6e6"


def grid_axes(rs: RunSet, comp: Comparison) -> tuple[Axis, Axis] | None:
    """The two other varied axes (rows, columns) whose values make up the comparison's contexts, or None unless
    there are exactly two, both numeric with at least two values each."""
    axes, _, _, _ = find_axes(rs)
    others = [a for a in axes if not set(a.keys) & set(comp.axis.keys)]
    if len(others) != 2:
        return None
    values = [{cfg[a.name] for cfg in rs.configs.values()} for a in others]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for vs in values for v in vs)
    if not numeric or any(len(v) < 2 for v in values):
        return None  # a map is over two numeric axes (depth x LR); a categorical one reads better as a table
    return others[0], others[1]


def _counts(rs: RunSet, runs: list[str]) -> tuple[int, int, int]:
    """(runs, stalled, diverged)."""
    status = dict(zip(rs.runs["run_id"], rs.runs[M.STATUS]))
    flags = dict(zip(rs.runs["run_id"], rs.runs[M.STALLED])) if M.STALLED in rs.runs else {}
    n_stalled = sum(is_stalled(flags.get(r)) for r in runs)
    n_diverged = sum(status[r] == M.STATUS_DIVERGED for r in runs)
    return len(runs), n_stalled, n_diverged


def _failures(name: str, counts: tuple[int, int, int]) -> str:
    n, s, d = counts
    parts = [f"{s}/{n} stalled"] if s else []
    parts += [f"{d}/{n} diverged"] if d else []
    return f"{name}: " + ", ".join(parts) if parts else ""


def heatmap_figures(rs: RunSet, comp: Comparison) -> list[PlotFigure]:
    """One figure (a panel per non-baseline arm) when the comparison's contexts form a two-axis grid; else none."""
    grid = grid_axes(rs, comp)
    if grid is None or comp.table.empty:
        return []
    rows_axis, cols_axis = grid
    row_values = sorted({cfg[rows_axis.name] for cfg in rs.configs.values()}, key=value_order)
    col_values = sorted({cfg[cols_axis.name] for cfg in rs.configs.values()}, key=value_order)
    members: dict[tuple[str, str], list[str]] = {}
    for r, key in comp.assignment.items():
        members.setdefault(key, []).append(r)
    table = comp.table.set_index(["context", "arm"])
    arms = [a for a in comp.arms if a != comp.baseline]
    finite = pd.to_numeric(comp.table["delta_final_val_loss"], errors="coerce").abs()
    vmax = max(0.05, float(finite[np.isfinite(finite)].max()) if np.isfinite(finite).any() else 0.05)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-vmax, vmax=vmax)
    cmap = _cmap()
    n_rows, n_cols = len(row_values), len(col_values)
    width = max(6.0, CELL_W * n_cols + 3.1) * len(arms)
    height = CELL_H * n_rows + 2.1
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(1, len(arms), squeeze=False).ravel()
    marked = False
    for ax, arm in zip(axes, arms):
        image = np.full((n_rows, n_cols), np.nan)
        for i, rv in enumerate(row_values):
            for j, cv in enumerate(col_values):
                context = f"{rows_axis.label}={override_text(rv)}, {cols_axis.label}={override_text(cv)}"
                row = table.loc[(context, arm)] if (context, arm) in table.index else None
                delta = _num(row["delta_final_val_loss"]) if row is not None else math.nan
                image[i, j] = delta
                lines = [f"{delta:+.3f}" if math.isfinite(delta) else "no Δ"]
                if row is not None and math.isfinite(_num(row["delta_ci_low"])):
                    lines.append(f"[{row['delta_ci_low']:+.3f}, {row['delta_ci_high']:+.3f}]")
                for name, runs in ((arm, members.get((context, arm), [])), (comp.baseline, members.get((context, comp.baseline), []))):  # fmt: skip
                    text = _failures(name, _counts(rs, runs)) if runs else ""
                    if text:
                        lines.append(text)
                        marked = True
                colour = "black" if not math.isfinite(delta) or abs(delta) < 0.6 * vmax else "white"
                ax.text(j, i, "\n".join(label_text(t, 40) for t in lines), ha="center", va="center", fontsize=7,
                        color=colour)  # fmt: skip
        shown = np.ma.masked_invalid(image)
        mesh = ax.imshow(shown, cmap=cmap, norm=norm, aspect="auto")
        ax.set_xticks(range(n_cols), [override_text(v) for v in col_values], fontsize=8)
        ax.set_yticks(range(n_rows), [override_text(v) for v in row_values], fontsize=8)
        ax.set_xlabel(cols_axis.label, fontsize=9)
        ax.set_ylabel(rows_axis.label, fontsize=9)
        ax.set_title(label_text(f"{arm} − {comp.baseline}", 50), fontsize=9)
        fig.colorbar(mesh, ax=ax, fraction=0.05, pad=0.03).set_label(f"Δ final {M.VAL_LOSS}", fontsize=8)
    title = (f"{comp.axis.label}: final {metric_title(M.VAL_LOSS)}, arm − baseline, by {rows_axis.label} × "
             f"{cols_axis.label}")  # fmt: skip
    fig.suptitle(label_text(title, int(width * 10)), fontsize=11)
    fig.subplots_adjust(left=0.95 / width, right=1 - 0.85 / width, top=1 - 0.95 / height, bottom=0.7 / height,
                        wspace=0.45)  # fmt: skip
    caption = (
        f"Difference of mean final validation loss, {comp.axis.label} arm minus baseline ({comp.baseline}), in "
        f"each cell of {rows_axis.label} × {cols_axis.label}, with its 95% interval (paired t over shared "
        "seeds, else Welch; the comparison table's numbers). Red: the arm's loss is higher. Grey: no difference "
        "(a side without a completed run)."
        + (
            f" Under the numbers, per side: runs that diverged (no final loss) or stalled ({STALL_WORDS})."
            if marked
            else " No run stalled or diverged."
        )
    )
    return [PlotFigure(f"{slug(comp.axis.label)}_heatmap_1", title, caption, png_bytes(fig))]


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _cmap() -> Any:
    from matplotlib import colormaps

    return colormaps["RdBu_r"].with_extremes(bad=GREY)
