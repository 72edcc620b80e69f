"""Normalization layers (axis ``norm``).

LayerNorm (Ba et al. 2016):          y = (x - mean(x)) / sqrt(var(x) + eps) * w + b
RMSNorm  (Zhang & Sennrich 2019):    y = x / sqrt(mean(x^2) + eps) * w
RMSNorm, ``unit_offset`` (Gemma):    y = x / sqrt(mean(x^2) + eps) * (1 + w),  w initialised at 0
none:                                y = x

LayerNorm is torch's module. RMSNorm is torch's module with one change on CPU: torch 2.13 runs
``F.rms_norm`` there as a composite (pow, mean, add, rsqrt, mul) that autograd differentiates op by op, 3-5x
the time of LayerNorm's fused kernel; ``RMSNormFunction`` does the same forward with a hand-written backward
(1.5x faster, +1.2-1.8% of a llama step; bench/proposals.py). On CUDA, or with mixed dtypes (autocast), it is
``F.rms_norm`` itself, which torch runs in fp32 under autocast. The Gemma variant is computed in fp32
explicitly and cast back to the input dtype (as Gemma does), so a bf16 input or a bf16 model still
normalises with fp32 statistics and an fp32 gain.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lm_ablate.registry import NORMS
from lm_ablate.schema import NormConfig


@NORMS.register("layernorm", reads=("eps", "bias"))
def layernorm(cfg: NormConfig, dim: int) -> nn.Module:
    return nn.LayerNorm(dim, eps=cfg.eps, bias=cfg.bias)


class RMSNormFunction(torch.autograd.Function):
    """y = x_hat * w with x_hat = x * r, r = rsqrt(mean(x^2) + eps) over the last dim.

    Backward, with g = dL/dy:  dL/dw = sum over rows of g * x_hat,
                               dL/dx = r * (g * w - x_hat * mean(g * w * x_hat))."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        r = torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))
        x_hat = x * r
        ctx.save_for_backward(x_hat, r, weight)
        return x_hat * weight

    @staticmethod
    def backward(ctx, g: Tensor):
        x_hat, r, weight = ctx.saved_tensors
        gw = g * weight
        grad_x = (gw - x_hat * (gw * x_hat).mean(-1, keepdim=True)).mul_(r)
        grad_w = (g * x_hat).flatten(0, -2).sum(0)
        return grad_x, grad_w, None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim: ``RMSNormFunction`` on CPU when x and w share a dtype, else F.rms_norm."""
    if x.is_cuda or x.dtype != weight.dtype:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return RMSNormFunction.apply(x, weight, eps)


class RMSNorm(nn.RMSNorm):
    """torch's RMSNorm (same parameters and state dict), computed by ``rms_norm``."""

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class OffsetRMSNorm(RMSNorm):
    """RMSNorm with gain (1 + w): the stored w is 0 at init, so weight decay pulls the gain towards 1, not 0
    (Gemma, Team et al. 2024)."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x.float(), 1.0 + self.weight.float(), self.eps).type_as(x)


@NORMS.register("rmsnorm", reads=("eps", "unit_offset"))
def rmsnorm(cfg: NormConfig, dim: int) -> nn.Module:
    return (OffsetRMSNorm if cfg.unit_offset else RMSNorm)(dim, eps=cfg.eps)


@NORMS.register("none")
def no_norm(cfg: NormConfig, dim: int) -> nn.Module:
    """No normalization anywhere (every placement's norm and the final norm become the identity)."""
    return nn.Identity()
