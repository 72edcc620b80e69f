"""The transformer block (key ``model.block``), one class per kind, each built from the axis registries:

    serial     h + f(h) then + g(.), each through its norm placement (components/placement.py)
    parallel   h + attn(norm h) + ffn(norm h), one fused input matmul (GPT-J, PaLM; GPT-NeoX with 2 norms)

A class's ``placements`` lists the norm.placement values it is defined for (None = all), checked by
lm_ablate/validation.py. Blocks are components like the others: the model (lm_ablate/model.py) stacks them.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from lm_ablate.components.placement import build_residual
from lm_ablate.components.position import PositionScheme
from lm_ablate.registry import ACTIVATIONS, ATTENTIONS, NORMS, Registry

# model.block -> block class; a class's ``placements`` lists the norm.placement values it is defined for
# (None = all), checked by config validation.
BLOCKS: Registry = Registry("model.block")


def site_dropout(reg: Any, site: str) -> float:
    """The rate of one dropout site (``embedding_dropout`` ...): its own value, or ``dropout`` when null."""
    rate = getattr(reg, site)
    return reg.dropout if rate is None else rate


def value_path(attn: nn.Module) -> list[Tensor]:
    """The attention weights DeepNet scales at init: the V rows of the fused qkv (the last split) and the
    output projection; Q and K keep their init (Wang et al. 2022)."""
    return [attn.qkv.weight[sum(attn.split[:-1]) :], attn.out.weight]


def matrices(module: nn.Module) -> list[Tensor]:
    return [m.weight for m in module.modules() if isinstance(m, nn.Linear)]


def sublayers(cfg: DictConfig, layer: int) -> tuple[nn.Module, nn.Module]:
    """Attention (with its attention-probability dropout) and FFN of block ``layer``."""
    p_attn = site_dropout(cfg.regularization, "attention_dropout")
    attn = ATTENTIONS.build(cfg.attention, cfg.model, dropout=p_attn, layer=layer)
    return attn, ACTIVATIONS.build(cfg.activation, cfg.model.d_model)


@BLOCKS.register("serial")
class SerialBlock(nn.Module):
    """x <- residual(x, attn), then x <- residual(x, ffn); the placement (norm.placement) decides the rest."""

    placements = None

    def __init__(self, cfg: DictConfig, layer: int):
        super().__init__()
        m, p = cfg.model, site_dropout(cfg.regularization, "residual_dropout")
        self.attn, self.ffn = sublayers(cfg, layer)
        self.attn_residual = build_residual(cfg.norm, m.d_model, p, m.n_layers)
        self.ffn_residual = build_residual(cfg.norm, m.d_model, p, m.n_layers)

    def init_branches(self) -> None:
        self.attn_residual.init_branch(value_path(self.attn))
        self.ffn_residual.init_branch(matrices(self.ffn))

    def forward(self, x: Tensor, position: PositionScheme) -> Tensor:
        x = self.attn_residual(x, lambda h: self.attn(h, position))
        return self.ffn_residual(x, self.ffn)


class Columns(nn.Module):
    """Stands in for a sublayer's input projection once a block computes it inside a fused matmul: returns
    its columns [start, start + width) of the sublayer's part of the fused output plus its own bias (kept
    here, so fusing adds or drops no parameter). A part that is exactly these columns passes through as is."""

    def __init__(self, start: int, width: int, bias: nn.Parameter | None):
        super().__init__()
        self.start, self.width = start, width
        self.register_parameter("bias", bias)

    def forward(self, h: Tensor) -> Tensor:
        whole = self.start == 0 and h.shape[-1] == self.width
        y = h if whole else h.narrow(-1, self.start, self.width)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"columns [{self.start}, {self.start + self.width})"


def fuse_input_projections(d_model: int, *sublayers: nn.Module) -> tuple[nn.Linear, list[int]]:
    """One Linear whose weight is the concatenation of every input projection of ``sublayers`` (their direct
    Linear children that read the d_model-wide input, i.e. not marked ``is_residual_out``: attention's qkv,
    the FFN's up or gate_up), and the width of each sublayer's part of its output. Each projection is
    replaced by its ``Columns`` within its sublayer's part, so a sublayer fed its part computes exactly what
    it computed from the normalized input before."""
    fused_rows, widths = [], []
    for owner in sublayers:
        start = 0
        for name, linear in list(owner.named_children()):
            if (isinstance(linear, nn.Linear) and linear.in_features == d_model
                    and not getattr(linear, "is_residual_out", False)):  # fmt: skip
                fused_rows.append(linear.weight)
                setattr(owner, name, Columns(start, linear.out_features, linear.bias))
                start += linear.out_features
        widths.append(start)
    fused = nn.Linear(d_model, sum(widths), bias=False)
    with torch.no_grad():
        fused.weight.copy_(torch.cat(fused_rows))
    return fused, widths


@BLOCKS.register("parallel", reads=("parallel_norms",))
class ParallelBlock(nn.Module):
    """Attention and FFN read the same stream and are added together (GPT-J, Wang & Komatsuzaki 2021; PaLM):

        parallel_norms=1:  x + drop(attn(norm(x))) + drop(ffn(norm(x)))
        parallel_norms=2:  x + drop(attn(norm1(x))) + drop(ffn(norm2(x)))     (GPT-NeoX use_parallel_residual)

    With one shared norm both sublayers read the same h, so their input projections are ONE matmul: the block
    owns ``fused`` (weight = [W_qkv; W_ffn_in]), splits its output in two and hands each sublayer its part,
    which the sublayer's ``Columns`` takes in place of its own projection. Defined for
    pre-norm only: post-style placements normalize the sum of the stream and a branch, which a parallel
    block does not have; validation rejects other ``norm.placement`` values."""

    placements = ("pre",)

    def __init__(self, cfg: DictConfig, layer: int):
        super().__init__()
        m = cfg.model
        self.attn, self.ffn = sublayers(cfg, layer)
        self.norm = NORMS.build(cfg.norm, m.d_model)
        self.ffn_norm = NORMS.build(cfg.norm, m.d_model) if m.parallel_norms == 2 else None
        self.fused, self.widths = None, None
        if self.ffn_norm is None:
            self.fused, self.widths = fuse_input_projections(m.d_model, self.attn, self.ffn)
        self.drop = nn.Dropout(site_dropout(cfg.regularization, "residual_dropout"))

    def init_branches(self) -> None:
        """Pre-norm prescribes no branch init beyond the model's own."""

    def forward(self, x: Tensor, position: PositionScheme) -> Tensor:
        if self.fused is None:
            return x + self.drop(self.attn(self.norm(x), position)) + self.drop(self.ffn(self.ffn_norm(x)))
        # both input projections in one matmul, its output split once (two narrows of the whole output would
        # each cost a full-width zero gradient in backward: bench/proposals.py)
        h_attn, h_ffn = self.fused(self.norm(x)).split(self.widths, dim=-1)
        return x + self.drop(self.attn(h_attn, position)) + self.drop(self.ffn(h_ffn))
