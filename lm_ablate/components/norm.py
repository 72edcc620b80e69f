"""Normalization layers (axis ``norm``): torch's own LayerNorm and RMSNorm.

LayerNorm (Ba et al. 2016):  y = (x - mean(x)) / sqrt(var(x) + eps) * w + b
RMSNorm  (Zhang & Sennrich 2019):  y = x / sqrt(mean(x^2) + eps) * w
"""

from __future__ import annotations

from torch import nn

from lm_ablate.config import NormConfig
from lm_ablate.registry import NORMS


@NORMS.register("layernorm")
def layernorm(cfg: NormConfig, dim: int) -> nn.Module:
    return nn.LayerNorm(dim, eps=cfg.eps, bias=cfg.bias)


@NORMS.register("rmsnorm")
def rmsnorm(cfg: NormConfig, dim: int) -> nn.Module:
    return nn.RMSNorm(dim, eps=cfg.eps)
