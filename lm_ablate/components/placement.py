"""Where the norms sit around a sublayer and how the residual combines (``norm.placement``).

A placement wraps one sublayer f (attention or FFN) of a block; the block only calls ``residual(x, f)``.

    pre  (GPT-2, Xiong et al. 2020):   x + f(norm(x))          needs a final norm before the LM head
    post (Vaswani et al. 2017):        norm(x + f(x))          the stream leaves every block normalized

Adding a placement touches only this file: subclass ``Residual`` and register it.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from lm_ablate.config import NormConfig
from lm_ablate.registry import NORMS, PLACEMENTS

Sublayer = Callable[[Tensor], Tensor]


class Residual(nn.Module):
    """One residual connection with its norm(s). ``needs_final_norm``: default for norm.final_norm=null."""

    needs_final_norm = True

    def __init__(self, cfg: NormConfig, dim: int, dropout: float):
        super().__init__()
        self.norm = NORMS.build(cfg, dim)
        self.drop = nn.Dropout(dropout)  # on the sublayer output, before it joins the residual stream


@PLACEMENTS.register("pre")
class PreNorm(Residual):
    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.drop(f(self.norm(x)))


@PLACEMENTS.register("post")
class PostNorm(Residual):
    needs_final_norm = False

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return self.norm(x + self.drop(f(x)))


def build_residual(cfg: NormConfig, dim: int, dropout: float) -> Residual:
    return PLACEMENTS.get(cfg.placement)(cfg, dim, dropout)


def needs_final_norm(cfg: NormConfig) -> bool:
    if cfg.final_norm is not None:
        return bool(cfg.final_norm)
    return PLACEMENTS.get(cfg.placement).needs_final_norm
