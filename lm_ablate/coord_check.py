"""Coordinate check: is a parametrization's training width-independent? (Yang et al. 2022, Tensor Programs V:
the test of a muP implementation that microsoft/mup ships as ``mup.coord_check``.)

    python -m lm_ablate.coord_check                  # model=small, widths 64..512, 4 x 64 tokens a step, sp and mup
    python -m lm_ablate.coord_check --widths 64,128,256,512,1024 --steps 5 model=tiny model.n_layers=2

For each parametrization and width (``model.d_model``; n_heads fixed, so head_dim grows with it) it builds the model
from the same seed, trains ``--steps`` steps of ``optim`` (AdamW; ``optim=muon`` checks Muon's rule) at the constant
``optim.lr`` (LR groups and multipliers exactly as the loop gets them from lm_ablate/parametrization.py) and records
the RMS of every layer's output (embedding, each block's attention and FFN outputs and its residual stream, the
logits) in the forward pass of step t: t = 0 is the model at init, t = k the model after k updates. Under a correct
muP the curves of RMS against width are flat at every t (but the logits at init, which shrink like m^-1/2 by
design); under sp (one init std, one LR) they grow with width, at init already and far more once updated: the update
of a width-w matrix sums w coordinates. One PNG per parametrization (a panel per step, RMS against width, log-log, a
line per layer) and ``coord_check.csv`` go to ``--out``; printed: per parametrization, the largest ratio max/min of
a layer's RMS across the widths at the last step, then the folder.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from lm_ablate.config import ConfigError, compose, compose_error_message, validate
from lm_ablate.data import get_batch, load_data
from lm_ablate.model import TransformerLM
from lm_ablate.parametrization import optimizer_groups, set_lr
from lm_ablate.registry import OPTIMIZERS, REGULARIZERS

DEFAULT_WIDTHS = (64, 128, 256, 512)
# few tokens per step, as in Yang et al.'s checks: the width-independence is a limit at a fixed batch. With
# many more tokens per step than the width, the narrow models move more than the wide ones under mup
# (measured, model=small, widths 64..512, 4 steps: the largest RMS ratio across widths is 1.6-1.8 at 64-512
# tokens per step, 4.2 at 1024, 12 at 2048). Overridable (train.batch_size=..., model.context=...).
CLI_DEFAULTS = ("train.batch_size=4", "model.context=64")


@dataclass(frozen=True)
class Coord:
    parametrization: str
    width: int
    step: int  # updates before this forward pass (0 = at init)
    layer: str
    rms: float


def observed_layers(model: TransformerLM) -> dict[str, nn.Module]:
    """Layer name -> the module whose output is measured, in forward order."""
    layers: dict[str, nn.Module] = {"embedding": model.embed}
    for i, block in enumerate(model.blocks):
        layers |= {f"block{i}.attn": block.attn, f"block{i}.ffn": block.ffn, f"block{i}": block}
    return layers | {"logits": model.head}


def rms_of_outputs(model: TransformerLM, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """The logits of ``model(x)`` and the RMS sqrt(mean(y^2)) of every observed layer's output y."""
    seen: dict[str, float] = {}
    hooks = [
        module.register_forward_hook(
            lambda m, i, y, name=name: seen.__setitem__(name, y.detach().float().square().mean().sqrt().item())
        )
        for name, module in observed_layers(model).items()
    ]
    try:
        logits = model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return logits, seen


def coord_data(
    overrides: Sequence[str],
    widths: Sequence[int] = DEFAULT_WIDTHS,
    steps: int = 4,
    parametrizations: Sequence[str] = ("sp", "mup"),
    base_width: int | None = None,
) -> list[Coord]:
    """Per-layer output RMS at steps 0..``steps`` for every parametrization x width (module docstring).
    ``base_width`` (mup's ``model.mup_base_width``) defaults to the smallest width."""
    base = base_width or min(widths)
    arms = [
        compose([*overrides, f"model.d_model={width}", f"model.parametrization={name}",
                 *([f"model.mup_base_width={base}"] if name == "mup" else [])])  # sp has no base width
        for name in parametrizations
        for width in widths
    ]  # fmt: skip
    for cfg in arms:  # every arm is accepted or refused before anything trains
        validate(cfg)
    if arms[0].train.threads:
        torch.set_num_threads(arms[0].train.threads)
    data = load_data(arms[0].data)
    return [coord for cfg in arms for coord in train_and_measure(cfg, data.train, data.vocab_size, steps)]


def train_and_measure(cfg: DictConfig, tokens: np.ndarray, vocab_size: int, steps: int) -> list[Coord]:
    """One arm: build, then ``steps`` optimizer steps at the constant optim.lr (the check is about the size of an
    update, not a schedule), measuring the layers in the forward pass of steps 0..``steps``."""
    torch.manual_seed(cfg.seed)
    model = TransformerLM(cfg, vocab_size)
    regularizer = REGULARIZERS.build(cfg.regularization)
    groups = optimizer_groups(cfg, model, regularizer.param_groups(model))
    optimizer = OPTIMIZERS.build(cfg.optim, groups, torch.device("cpu"))
    set_lr(optimizer, cfg.optim.lr)
    name, width, rows = cfg.model.parametrization, cfg.model.d_model, []
    for step in range(steps + 1):
        x, y = get_batch(tokens, cfg.train.batch_size, cfg.model.context, cfg.seed, step + 1)
        logits, seen = rms_of_outputs(model, x)
        rows += [Coord(name, width, step, layer, value) for layer, value in seen.items()]
        if step == steps:
            break
        loss, _, _ = regularizer.loss(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), regularizer.grad_clip or math.inf)
        optimizer.step()
    return rows


def spread(rows: Sequence[Coord], parametrization: str, step: int) -> dict[str, float]:
    """Layer -> max / min of its RMS across the widths, at ``step``: 1 = flat in width."""
    by_layer: dict[str, list[float]] = {}
    for r in rows:
        if r.parametrization == parametrization and r.step == step:
            by_layer.setdefault(r.layer, []).append(r.rms)
    return {layer: max(v) / min(v) for layer, v in by_layer.items()}


def growth(rows: Sequence[Coord], parametrization: str, step: int) -> dict[str, float]:
    """Layer -> RMS at the largest width / RMS at the smallest width, at ``step`` (> 1: grows with width)."""
    ends: dict[str, dict[int, float]] = {}
    for r in rows:
        if r.parametrization == parametrization and r.step == step:
            ends.setdefault(r.layer, {})[r.width] = r.rms
    return {layer: v[max(v)] / v[min(v)] for layer, v in ends.items()}


def write_csv(rows: Sequence[Coord], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f.name for f in fields(Coord)])
        writer.writerows(astuple(r) for r in rows)


def plot(rows: Sequence[Coord], parametrization: str, path: Path) -> None:
    """The figure of one parametrization (:func:`figure`) as a PNG at ``path``."""
    figure(rows, parametrization).savefig(path)


# one look per kind of layer (colour family and line style) and one marker per block, so each of the
# 3 x n_layers + 2 lines can be told from every other: block i's attention, FFN and residual share its marker
KIND_STYLE = {  # kind -> (colormap shaded by depth, or a fixed colour; line style)
    "attn": ("Blues", "--"), "ffn": ("Greens", "-."), "block": ("Purples", "-"),
    "embedding": ("black", "-"), "logits": ("#d62728", "-"),
}  # fmt: skip
DEPTH_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">")
PANEL_W, PANEL_H, LEFT, GAP, PAD = 2.9, 2.6, 0.65, 0.15, 0.15  # inches
TOP, BOTTOM = 0.35, 0.5


def layer_style(layer: str, n_blocks: int) -> dict[str, Any]:
    """Colour, line style and marker of a layer's line: ``block3.attn`` -> a blue, dashed, the 4th marker."""
    from matplotlib import colormaps

    head, _, part = layer.partition(".")
    depth = int(head[len("block") :]) if head.startswith("block") and head[len("block") :].isdigit() else None
    kind = part or ("block" if depth is not None else layer)
    color, linestyle = KIND_STYLE.get(kind, ("0.4", ":"))
    if color in colormaps:  # light (first block) to dark (last block), never white
        color = colormaps[color](0.45 + 0.5 * (depth or 0) / max(1, n_blocks - 1))
    marker = DEPTH_MARKERS[depth % len(DEPTH_MARKERS)] if depth is not None else "o" if kind == "embedding" else "*"
    return {"color": color, "linestyle": linestyle, "marker": marker}


def figure(rows: Sequence[Coord], parametrization: str) -> Any:
    """RMS against width, one panel per step, one line per layer (Yang et al.'s figure layout), the legend to
    the right of the panels, level with their top; the figure is as wide as panels and legend need."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mine = [r for r in rows if r.parametrization == parametrization]
    steps = sorted({r.step for r in mine})
    layers = list(dict.fromkeys(r.layer for r in mine))
    n_blocks = sum(1 for layer in layers if layer.startswith("block") and "." not in layer)
    panels_w = LEFT + PANEL_W * len(steps) + GAP * (len(steps) - 1)
    fig = Figure(figsize=(panels_w, PANEL_H + TOP + BOTTOM), dpi=110)
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(steps), sharey=True, squeeze=False)[0]
    for ax, step in zip(axes, steps):
        for layer in layers:
            pts = sorted((r.width, r.rms) for r in mine if r.step == step and r.layer == layer)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ms=4, lw=1.1, label=layer, **layer_style(layer, n_blocks))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{parametrization}: step {step}" + (" (init)" if step == 0 else ""), fontsize=9)
        ax.set_xlabel("width (d_model)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("activation RMS", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    legend = fig.legend(handles, labels, loc="upper left", fontsize=7, frameon=False, borderaxespad=0,
                        handlelength=3)  # fmt: skip
    legend_w = legend.get_window_extent(canvas.get_renderer()).width / fig.dpi
    width, height = panels_w + PAD + legend_w + PAD, PANEL_H + TOP + BOTTOM
    fig.set_size_inches(width, height)
    top = 1 - TOP / height
    fig.subplots_adjust(left=LEFT / width, right=panels_w / width, bottom=BOTTOM / height, top=top,
                        wspace=GAP / PANEL_W)  # fmt: skip
    legend.set_bbox_to_anchor(((panels_w + PAD) / width, top), transform=fig.transFigure)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lm_ablate.coord_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default=",".join(map(str, DEFAULT_WIDTHS)), help="d_model values, comma-separated")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (records steps 0..k)")
    parser.add_argument("--parametrizations", default="sp,mup")
    parser.add_argument("--base", type=int, help="model.mup_base_width (default: the smallest width)")
    parser.add_argument("--out", type=Path, default=Path("outputs/coord_check"))
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. model=tiny train.batch_size=8 optim.lr=1e-2"
    )
    args = parser.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        parser.error(f"--widths={args.widths!r} is invalid: comma-separated integers, e.g. 64,128,256,512")
    if len(widths) < 2 or args.steps < 1:
        parser.error("needs at least two widths and --steps >= 1")
    names = args.parametrizations.split(",")
    try:
        rows = coord_data([*CLI_DEFAULTS, *args.overrides], widths, args.steps, names, args.base)
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # Hydra's composition errors as one line; anything else is a bug: full traceback
        line = compose_error_message(err)
        if line is None:
            raise
        print(f"lm-ablate: error: {line}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "coord_check.csv")
    for name in names:
        plot(rows, name, args.out / f"coord_check_{name}.png")
    span = f"{min(widths)}..{max(widths)}"
    for name in names:
        worst = max(spread(rows, name, args.steps).items(), key=lambda kv: kv[1])
        print(f"{name}: step {args.steps}, widths {span}: largest RMS ratio across widths {worst[1]:.2f} ({worst[0]})")
    print(args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
