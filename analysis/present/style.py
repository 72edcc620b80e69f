"""The plotting style every figure of the report shares: sizes, colours and markers, label-safe text, the
panel grid with room for a legend, the legend, axis styling, log ticks written plainly, and the PNG encoding.

Matplotlib's object API with the Agg canvas is used instead of pyplot, so importing a figure module neither
switches the caller's backend nor keeps figures alive in pyplot's global registry. Panels are laid out by
hand rather than by the constrained-layout engine, which costs about as much as drawing the figure: a report
on a big sweep draws dozens.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import Locator, LogFormatter
from PIL import Image

from lm_ablate import metrics as M

MAX_PANELS = 6  # per figure; more contexts wrap onto further figures
COLUMNS = 3
DPI = 110
PANEL_W, PANEL_H = 4.6, 3.4  # inches per panel
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
    """A drawn figure: the PNG and the words the report puts beside it."""

    name: str  # file-name-safe slug, unique within a report
    title: str
    caption: str
    png: bytes


HIDDEN_FRACTION = 0.01  # of a panel's y span: a 1.6 pt line (~2.4 px at DPI) on a ~250 px panel covers this much


def hidden_lines(lines: Sequence[tuple[str, Any, Any]], span: float, log: bool = False) -> list[tuple[str, str]]:
    """(hidden, covering) for each line drawn under a later one: ``lines`` are (label, x, y) in drawing order, and a
    line is hidden when a line drawn after it covers its whole x range and stays within HIDDEN_FRACTION · ``span``
    (the panel's y range; with ``log``, in log y) of it at each of its x (the later line linearly interpolated)."""
    out = []
    for i, (label, x, y) in enumerate(lines):
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        ok = np.isfinite(x) & np.isfinite(y) & ((y > 0) if log else True)
        x, y = x[ok], np.log(y[ok]) if log else y[ok]
        if not len(x) or not span > 0:
            continue
        for other, x2, y2 in lines[i + 1 :]:
            x2, y2 = np.asarray(x2, dtype=float), np.asarray(y2, dtype=float)
            ok2 = np.isfinite(x2) & np.isfinite(y2) & ((y2 > 0) if log else True)
            x2, y2 = x2[ok2], np.log(y2[ok2]) if log else y2[ok2]
            if len(x2) < 2 and not (len(x2) == 1 and len(x) == 1 and x2[0] == x[0]):
                continue
            if x.min() < x2.min() or x.max() > x2.max():
                continue
            order = np.argsort(x2)
            if np.max(np.abs(np.interp(x, x2[order], y2[order]) - y)) <= HIDDEN_FRACTION * span:
                out.append((label, other))
                break
    return out


def hidden_note(hidden: Sequence[tuple[str, str, str]]) -> str:
    """A caption's sentence naming each (panel, hidden line, covering line); "" when none is hidden."""
    if not hidden:
        return ""
    parts = [(f"in {panel}, " if panel else "") + f"{a} lies under {b}" for panel, a, b in hidden]
    return (
        " Hidden lines (computed from the data: within " + f"{HIDDEN_FRACTION:.0%} of the panel's height at "
        "every point): " + "; ".join(parts) + "."
    )


def label_text(s: str, width: int = 60) -> str:
    """Label-safe text: ``$`` would start mathtext, a leading ``_`` hides a legend entry."""
    s = s.replace("$", r"\$")
    s = " " + s if s.startswith("_") else s
    return "\n".join(textwrap.wrap(s, width)) or " "


def slug(s: str) -> str:
    """A file-name-safe form of ``s`` (figure names are file names next to report.md)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-")[:60] or "x"


def _grid(n: int) -> tuple[int, int]:
    cols = min(COLUMNS, n)
    return math.ceil(n / cols), cols


def panel_grid(n: int, labels: Sequence[str] = (), extra: int = 0) -> tuple[Figure, list[Axes]]:
    """A figure of ``n`` panels with fixed margins (inches): room for a suptitle above, two-line panel
    titles, and below a legend of ``labels`` (wrapped as :func:`arm_legend` wraps them) and ``extra`` one-line
    entries, in as many columns as the width takes."""
    rows, cols = _grid(n)
    lines = max([label_text(label, 30).count("\n") + 1 for label in labels] + [1])
    legend_rows = math.ceil((len(labels) + extra) / legend_columns(PANEL_W * cols)) * lines
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


def png_bytes(fig: Figure) -> bytes:
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


def legend_columns(width: float) -> int:
    """Legend columns that fit a figure ``width`` inches wide (an entry of up to 30 characters at 8 pt)."""
    return max(1, min(5, int(width // 2.6)))


def arm_legend(fig: Figure, labels: list[str], extra: list[Line2D]) -> None:
    """The legend below the panels: a colour patch per arm (``COLORS`` in order), then the ``extra`` entries."""
    handles: list = [Patch(color=COLORS[i % len(COLORS)], label=label_text(a, 30)) for i, a in enumerate(labels)]
    handles += extra
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), fontsize=8, frameon=False,
               ncols=min(len(handles), legend_columns(fig.get_figwidth())))  # fmt: skip


def style_axes(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    """Titles, labels, tick sizes and the grid of a panel whose data and limits are final."""
    # The title is pinned at the top (y=1), where matplotlib's automatic placement puts it too unless the y
    # axis shows an offset text ("1e3", "+3.2") to clear, which is left to matplotlib; that placement takes
    # the tight box of every y tick label of every panel at each draw (~8% of drawing a big report).
    pinned = {} if _offset_text(ax.yaxis) else {"y": 1.0}
    ax.set_title(label_text(title), fontsize=9, **pinned)
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


def plain_log_ticks(ax: Axes) -> None:
    """Log-scale y ticks written as "6" or "0.4", not mathtext "6×10⁰" or "4e-01"."""
    for setter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        setter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.5)))
    log_ticks_in_view(ax.yaxis)


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


def log_ticks_in_view(axis: Any) -> None:
    axis.set_major_locator(_InView(axis.get_major_locator()))
    axis.set_minor_locator(_InView(axis.get_minor_locator()))
