"""Normalization layers (axis ``norm``).

LayerNorm (Ba et al. 2016):          y = (x - mean(x)) / sqrt(var(x) + eps) * w + b
RMSNorm  (Zhang & Sennrich 2019):    y = x / sqrt(mean(x^2) + eps) * w
RMSNorm, ``unit_offset`` (Gemma):    y = x / sqrt(mean(x^2) + eps) * (1 + w),  w initialised at 0
none:                                y = x

The plain variants are torch's own modules; under autocast torch already runs them in fp32. The Gemma
variant is computed in fp32 explicitly and cast back to the input dtype (as Gemma does), so a bf16 input or a
bf16 model still normalises with fp32 statistics and an fp32 gain.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lm_ablate.config import NormConfig
from lm_ablate.registry import NORMS


@NORMS.register("layernorm")
def layernorm(cfg: NormConfig, dim: int) -> nn.Module:
    return nn.LayerNorm(dim, eps=cfg.eps, bias=cfg.bias)


class OffsetRMSNorm(nn.RMSNorm):
    """RMSNorm with gain (1 + w): the stored w is 0 at init, so weight decay pulls the gain towards 1, not 0
    (Gemma, Team et al. 2024)."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        gain = 1.0 + self.weight.float()
        return F.rms_norm(x.float(), self.normalized_shape, gain, self.eps).type_as(x)


@NORMS.register("rmsnorm")
def rmsnorm(cfg: NormConfig, dim: int) -> nn.Module:
    return (OffsetRMSNorm if cfg.unit_offset else nn.RMSNorm)(dim, eps=cfg.eps)


@NORMS.register("none")
def no_norm(cfg: NormConfig, dim: int) -> nn.Module:
    """No normalization anywhere (every placement's norm and the final norm become the identity)."""
    return nn.Identity()

