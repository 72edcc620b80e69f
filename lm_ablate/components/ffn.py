"""Feed-forward sublayer (axis ``activation``): the options are one table, each row an activation and a flag.

    ungated:  W_down act(W_up x)                      (Vaswani et al. 2017)
    gated:    W_down (act(W_gate x) * W_up x)         (Shazeer 2020, "GLU Variants Improve Transformer")

Gated: GLU = sigmoid gate, ReGLU = ReLU, GEGLU = GELU, SwiGLU = SiLU (Swish, beta = 1), bilinear = no act.

Activations: ReLU; GELU x * Phi(x) (Hendrycks & Gimpel 2016), exact (erf) or its tanh approximation
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) per ``activation.approximate``; SiLU x * sigmoid(x)
(Elfwing et al. 2017; Swish, Ramachandran et al. 2017); squared ReLU relu(x)^2 (So et al. 2021, Primer).

``d_ff: null`` keeps the parameter count of an ungated FFN of width 4d: the ungated one has 2 * d * 4d = 8d^2
weights, a gated one 3 * d * d_ff, so d_ff = 8d/3, rounded up to ``multiple_of`` (the ungated 4d is kept
as is). An explicit ``d_ff`` is used as given, for both kinds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from lm_ablate.registry import ACTIVATIONS
from lm_ablate.schema import ActivationConfig

MakeAct = Callable[[ActivationConfig], nn.Module]


def hidden_width(cfg: ActivationConfig, d_model: int, gated: bool) -> int:
    if cfg.d_ff is not None:
        return cfg.d_ff
    if not gated:
        return 4 * d_model
    return cfg.multiple_of * math.ceil(8 * d_model / (3 * cfg.multiple_of))


class FFN(nn.Module):
    def __init__(self, d_model: int, d_ff: int, act: nn.Module, bias: bool):
        super().__init__()
        self.act = act
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.down.is_residual_out = True

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))


class GatedFFN(nn.Module):
    def __init__(self, d_model: int, d_ff: int, act: nn.Module, bias: bool):
        super().__init__()
        self.act = act
        self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=bias)  # W_gate and W_up stacked: one matmul
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.down.is_residual_out = True

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_and_up(x)
        return self.down(self.act(gate) * up)

    def gate_and_up(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """W_gate x and W_up x. From the stacked weight as two matmuls into dense outputs: the two halves of
        one output are strided views, on which the activation, its backward and the product run markedly
        slower (+1.5-2.8% of a llama step, bench/proposals.py). A parallel block's fused ``Columns`` hands
        over one output, which is split."""
        if not isinstance(self.gate_up, nn.Linear):
            return self.gate_up(x).chunk(2, dim=-1)
        w_gate, w_up = self.gate_up.weight.chunk(2)
        b_gate, b_up = (None, None) if self.gate_up.bias is None else self.gate_up.bias.chunk(2)
        return F.linear(x, w_gate, b_gate), F.linear(x, w_up, b_up)


class ReLUSquared(nn.Module):
    """relu(x)^2 (So et al. 2021, Primer): no built-in in torch."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x).square()


def plain(act: type[nn.Module]) -> MakeAct:
    """An activation without settings; ``activation.approximate`` is ignored (like theta outside RoPE)."""
    return lambda cfg: act()


def gelu(cfg: ActivationConfig) -> nn.Module:
    """GELU, exact (erf) or the tanh approximation (GPT-2's form), per ``activation.approximate``."""
    return nn.GELU(approximate=cfg.approximate)


def _option(name: str, make_act: MakeAct, gated: bool, reads: tuple[str, ...] = ()) -> None:
    def build(cfg: ActivationConfig, d_model: int) -> nn.Module:
        cls = GatedFFN if gated else FFN
        return cls(d_model, hidden_width(cfg, d_model, gated), make_act(cfg), cfg.bias)

    # a gated option rounds its derived width to multiple_of; gelu and geglu read which GELU
    ACTIVATIONS.register(name, reads=reads + (("multiple_of",) if gated else ()))(build)


_option("relu", plain(nn.ReLU), gated=False)
_option("gelu", gelu, gated=False, reads=("approximate",))
_option("silu", plain(nn.SiLU), gated=False)
_option("relu2", plain(ReLUSquared), gated=False)
_option("glu", plain(nn.Sigmoid), gated=True)
_option("reglu", plain(nn.ReLU), gated=True)
_option("geglu", gelu, gated=True, reads=("approximate",))
_option("swiglu", plain(nn.SiLU), gated=True)
_option("bilinear", plain(nn.Identity), gated=True)
