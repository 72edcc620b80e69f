"""Feed-forward sublayer (axis ``activation``).

    ungated:  W_down act(W_up x)                      (Vaswani et al. 2017; GELU: Hendrycks & Gimpel 2016)
    gated:    W_down (act(W_gate x) * W_up x)         (GLU variants, Shazeer 2020; SwiGLU uses SiLU)

``d_ff: null`` keeps the parameter count of an ungated FFN of width 4d: the ungated one has 2 * d * 4d = 8d^2
weights, a gated one 3 * d * d_ff, so d_ff = 8d/3, rounded up to ``multiple_of``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from lm_ablate.config import ActivationConfig
from lm_ablate.registry import ACTIVATIONS

Act = Callable[[Tensor], Tensor]


def hidden_width(cfg: ActivationConfig, d_model: int, gated: bool) -> int:
    if cfg.d_ff is not None:
        return cfg.d_ff
    if not gated:
        return 4 * d_model
    return cfg.multiple_of * math.ceil(8 * d_model / 3 / cfg.multiple_of)


class FFN(nn.Module):
    def __init__(self, d_model: int, d_ff: int, act: Act, bias: bool):
        super().__init__()
        self.act = act
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.down.is_residual_out = True

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))


class GatedFFN(nn.Module):
    def __init__(self, d_model: int, d_ff: int, act: Act, bias: bool):
        super().__init__()
        self.act = act
        self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=bias)  # W_gate and W_up stacked: one matmul
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.down.is_residual_out = True

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


def _option(name: str, act: Act, gated: bool) -> None:
    def build(cfg: ActivationConfig, d_model: int) -> nn.Module:
        cls = GatedFFN if gated else FFN
        return cls(d_model, hidden_width(cfg, d_model, gated), act, cfg.bias)

    ACTIVATIONS.register(name)(build)


_option("relu", F.relu, gated=False)
_option("gelu", F.gelu, gated=False)  # exact (erf) GELU
_option("swiglu", F.silu, gated=True)
