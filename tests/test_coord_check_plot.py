"""The coordinate check's figure (lm_ablate/coord_check.py): one line per layer that a reader can tell apart
from every other, and a legend that starts level with the panels (issue 21.12)."""

from __future__ import annotations

import itertools

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb

from lm_ablate.coord_check import Coord, figure

WIDTHS = (64, 128, 256, 512)
LAYERS = ["embedding", *(f"block{i}{part}" for i in range(4) for part in (".attn", ".ffn", "")), "logits"]


def rows() -> list[Coord]:
    """model=small's 14 observed layers over 4 widths and steps 0..4, each at its own level."""
    return [Coord("mup", w, step, layer, 0.01 * (1 + i) * (1 + step) * (w / 64) ** 0.1)
            for step in range(5) for w in WIDTHS for i, layer in enumerate(LAYERS)]  # fmt: skip


def test_every_layer_line_differs_from_every_other():
    """Two lines differ in marker or line style, or their colours are far apart (> 0.25 in RGB, where the 14
    viridis steps were 0.04-0.1 apart)."""
    fig = figure(rows(), "mup")
    for ax in fig.axes:
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == LAYERS
        for a, b in itertools.combinations(lines, 2):
            same_shape = (a.get_marker(), a.get_linestyle()) == (b.get_marker(), b.get_linestyle())
            distance = np.linalg.norm(np.subtract(to_rgb(a.get_color()), to_rgb(b.get_color())))
            assert not same_shape or distance > 0.25, (a.get_label(), b.get_label(), distance)


def test_legend_starts_level_with_the_panels_and_fits_the_figure():
    fig = figure(rows(), "mup")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    (legend,) = fig.legends
    box, panels = legend.get_window_extent(renderer), fig.axes[0].get_window_extent(renderer)
    assert abs(box.y1 - panels.y1) < 0.1 * fig.dpi, (box.y1, panels.y1)  # no blank band above the legend
    drawn, (width, height) = fig.get_tightbbox(renderer), fig.get_size_inches()
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01 and drawn.x1 <= width + 0.01 and drawn.y1 <= height + 0.01
    assert width - drawn.x1 < 0.3  # nor a blank band right of it
