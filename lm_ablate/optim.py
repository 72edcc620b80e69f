"""Optimizer (group ``optim``) and learning-rate schedules (``optim.schedule``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lm_ablate.config import OptimConfig
from lm_ablate.registry import OPTIMIZERS, SCHEDULES

Schedule = Callable[[int], float]  # step -> multiplier of optim.lr


@OPTIMIZERS.register("adamw")
def adamw(cfg: OptimConfig, param_groups: list[dict], device: torch.device) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019). The fused kernel only on CUDA (the CPU default is already vectorized)."""
    return torch.optim.AdamW(
        param_groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=device.type == "cuda" or None,
    )


def _warmup(cfg: OptimConfig, step: int) -> float | None:
    """Linear warmup: step s (0-based) of the first warmup_steps uses lr * (s + 1) / warmup_steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    return None


@SCHEDULES.register("constant")
def constant(cfg: OptimConfig, max_steps: int) -> Schedule:
    return lambda step: w if (w := _warmup(cfg, step)) is not None else 1.0


@SCHEDULES.register("cosine")
def cosine(cfg: OptimConfig, max_steps: int) -> Schedule:
    """After warmup, half a cosine from 1 to min_lr_ratio, reached at the last step."""

    def at(step: int) -> float:
        w = _warmup(cfg, step)
        if w is not None:
            return w
        span = max(1, max_steps - 1 - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return at


@SCHEDULES.register("wsd")
def warmup_stable_decay(cfg: OptimConfig, max_steps: int) -> Schedule:
    """Warmup, then the peak, then a linear decay to min_lr_ratio over the last decay_fraction of the steps
    (WSD: Hu et al. 2024, MiniCPM; Hägele et al. 2024). A stable phase makes runs of other lengths branches
    of one run, so a budget sweep needs no restart."""
    decay_steps = max(1, round(cfg.decay_fraction * max_steps))
    decay_start = max_steps - decay_steps

    def at(step: int) -> float:
        w = _warmup(cfg, step)
        if w is not None:
            return w
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / decay_steps)
        return 1.0 - (1.0 - cfg.min_lr_ratio) * progress

    return at


@SCHEDULES.register("inverse_sqrt")
def inverse_sqrt(cfg: OptimConfig, max_steps: int) -> Schedule:
    """The original Transformer's rate (Vaswani et al. 2017, eq. 3) normalised to peak at optim.lr: with
    s = step + 1 and w = max(1, warmup_steps), multiplier = min(s / w, sqrt(w / s))."""
    w = max(1, cfg.warmup_steps)
    return lambda step: min((step + 1) / w, math.sqrt(w / (step + 1)))


def build_schedule(cfg: OptimConfig, max_steps: int) -> Schedule:
    return SCHEDULES.get(cfg.schedule)(cfg, max_steps)
