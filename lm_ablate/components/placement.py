"""Where the norms sit around a sublayer and how the residual combines (``norm.placement``).

A placement wraps one sublayer f (attention or FFN) of a block; the block only calls ``residual(x, f)``.
``drop`` is the residual dropout (``regularization.residual_dropout``) on the sublayer's output.

    pre       (GPT-2; Xiong et al. 2020)       x + drop(f(norm(x)))             final norm: yes
    post      (Vaswani et al. 2017)            norm(x + drop(f(x)))             final norm: no
    sandwich  (Gemma 2, Team et al. 2024)      x + drop(norm2(f(norm1(x))))     final norm: yes
    reordered (OLMo 2, OLMo et al. 2024)       x + drop(norm(f(x)))             final norm: yes
    deepnorm  (DeepNet, Wang et al. 2022)      norm(alpha * x + drop(f(x)))     final norm: no
    rezero    (Bachlechner et al. 2020)        x + alpha * drop(f(x))           final norm: no (has no norms)
    none      (the no-normalization baseline)  x + drop(f(x))                   final norm: no (has no norms)

"final norm" is each placement's default for ``norm.final_norm: null``: the stream reaching the LM head is
un-normalized after pre, sandwich and reordered, already normalized after post and deepnorm, and ReZero's
point is a network without norms.

Adding a placement touches only this file: subclass ``Residual``, name its norms, register it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from lm_ablate.registry import NORMS, PLACEMENTS
from lm_ablate.schema import NormConfig

Sublayer = Callable[[Tensor], Tensor]


class Residual(nn.Module):
    """One residual connection with its norm(s).

    ``norms``: attribute names of the norms this placement owns, each built from ``cfg`` (so ``norm=none``
    makes them identities). ``needs_final_norm``: the default for ``norm.final_norm: null``."""

    needs_final_norm = True
    norms: tuple[str, ...] = ("norm",)

    def __init__(self, cfg: NormConfig, dim: int, dropout: float, n_layers: int = 1):
        super().__init__()
        for name in self.norms:
            self.add_module(name, NORMS.build(cfg, dim))
        self.drop = nn.Dropout(dropout)  # on the sublayer output, before it joins the residual stream

    @torch.no_grad()
    def init_branch(self, weights: list[Tensor]) -> None:
        """Called once after the model's init with the sublayer's value-path weights (attention's V and output
        projections, every FFN matrix). Only a placement that prescribes an init for them (DeepNorm) acts."""

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        raise NotImplementedError


@PLACEMENTS.register("pre")
class PreNorm(Residual):
    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.drop(f(self.norm(x)))


@PLACEMENTS.register("post")
class PostNorm(Residual):
    needs_final_norm = False

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return self.norm(x + self.drop(f(x)))


@PLACEMENTS.register("sandwich")
class SandwichNorm(Residual):
    """Pre-norm plus a norm on the sublayer output before the add (Gemma 2's pre/post-attention norms;
    CogView's sandwich-LN, Ding et al. 2021): bounds what each sublayer can write into the stream."""

    norms = ("norm", "post_norm")

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.drop(self.post_norm(f(self.norm(x))))


@PLACEMENTS.register("reordered")
class ReorderedNorm(Residual):
    """OLMo 2: the sublayer reads the raw stream and only its output is normalized (no input norm)."""

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.drop(self.norm(f(x)))


def deepnorm_alpha(n_layers: int) -> float:
    """Residual scale of a decoder-only DeepNet (Wang et al. 2022): alpha = (2N)^(1/4), N = layers."""
    return (2 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    """Init gain of a decoder-only DeepNet's V, output and FFN matrices (Wang et al. 2022): (8N)^(-1/4)."""
    return (8 * n_layers) ** -0.25


@PLACEMENTS.register("deepnorm", reads=("deepnorm_alpha", "deepnorm_beta"))
class DeepNorm(Residual):
    """Post-LN with the residual up-weighted by alpha and the branch's value path down-scaled by beta at
    init; together they bound the model update, so deep post-LN trains (Wang et al. 2022).
    ``norm.deepnorm_alpha`` / ``norm.deepnorm_beta`` override the formulas. beta multiplies the normal init
    the model already gave those weights (the paper multiplies a Xavier-normal gain); set
    ``model.scaled_residual_init=false`` for the paper's init, otherwise both scalings apply."""

    needs_final_norm = False

    def __init__(self, cfg: NormConfig, dim: int, dropout: float, n_layers: int = 1):
        super().__init__(cfg, dim, dropout, n_layers)
        self.alpha = deepnorm_alpha(n_layers) if cfg.deepnorm_alpha is None else float(cfg.deepnorm_alpha)
        self.beta = deepnorm_beta(n_layers) if cfg.deepnorm_beta is None else float(cfg.deepnorm_beta)

    @torch.no_grad()
    def init_branch(self, weights: list[Tensor]) -> None:
        for w in weights:
            w.mul_(self.beta)

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return self.norm(self.alpha * x + self.drop(f(x)))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, beta={self.beta:.4g}"


@PLACEMENTS.register("rezero")
class ReZero(Residual):
    """No norm; each branch is gated by a learned scalar that starts at 0, so every block is the identity at
    init and the signal propagates perfectly through any depth (Bachlechner et al. 2020)."""

    needs_final_norm = False
    norms = ()

    def __init__(self, cfg: NormConfig, dim: int, dropout: float, n_layers: int = 1):
        super().__init__(cfg, dim, dropout, n_layers)
        self.alpha = nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.alpha * self.drop(f(x))


def build_residual(cfg: NormConfig, dim: int, dropout: float, n_layers: int = 1) -> Residual:
    return PLACEMENTS.get(cfg.placement)(cfg, dim, dropout, n_layers)


@PLACEMENTS.register("none")
class NoNorm(Residual):
    """A plain residual, no normalization anywhere: what every placement is an improvement over."""

    needs_final_norm = False
    norms = ()

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.drop(f(x))


def needs_final_norm(cfg: NormConfig) -> bool:
    if cfg.final_norm is not None:
        return bool(cfg.final_norm)
    return PLACEMENTS.get(cfg.placement).needs_final_norm
