"""Decoder-only transformer assembled from the axis registries.

Nothing here compares option names: each axis builds its component from its own config, and a block only
asks its two ``Residual`` placements to combine the stream with attention and the FFN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from lm_ablate.components.placement import build_residual, needs_final_norm
from lm_ablate.components.position import PositionScheme
from lm_ablate.config import head_dim, validate
from lm_ablate.registry import ACTIVATIONS, ATTENTIONS, NORMS, POSITIONS


class Block(nn.Module):
    def __init__(self, cfg: DictConfig):
        super().__init__()
        d, p = cfg.model.d_model, cfg.regularization.dropout
        self.attn = ATTENTIONS.build(cfg.attention, cfg.model, dropout=p)
        self.ffn = ACTIVATIONS.build(cfg.activation, d)
        self.attn_residual = build_residual(cfg.norm, d, p)
        self.ffn_residual = build_residual(cfg.norm, d, p)

    def forward(self, x: Tensor, position: PositionScheme) -> Tensor:
        x = self.attn_residual(x, lambda h: self.attn(h, position))
        return self.ffn_residual(x, self.ffn)


class TransformerLM(nn.Module):
    def __init__(self, cfg: DictConfig, vocab_size: int):
        super().__init__()
        validate(cfg)
        m = cfg.model
        self.vocab_size, self.context = vocab_size, m.context
        self.embed = nn.Embedding(vocab_size, m.d_model)
        self.position = POSITIONS.build(cfg.position, m)
        self.embed_drop = nn.Dropout(cfg.regularization.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(m.n_layers))
        self.final_norm = NORMS.build(cfg.norm, m.d_model) if needs_final_norm(cfg.norm) else nn.Identity()
        self.head = nn.Linear(m.d_model, vocab_size, bias=False)
        self.init_weights(m.init_std, m.n_layers if m.scaled_residual_init else None)
        if m.tie_embeddings:
            self.head.weight = self.embed.weight

    def init_weights(self, std: float, n_layers: int | None) -> None:
        """N(0, std) for every matrix and embedding, zero biases, norms at their identity (w=1, b=0).
        With ``n_layers``, sublayer output projections get std / sqrt(2 * n_layers) (GPT-2, Radford et al. 2019)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                scale = 1 / math.sqrt(2 * n_layers) if n_layers and getattr(module, "is_residual_out", False) else 1
                nn.init.normal_(module.weight, std=std * scale)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)

    def forward(self, idx: Tensor) -> Tensor:
        """Token ids [B, T] -> logits [B, T, vocab] (fp32 under autocast too, so the loss is stable)."""
        x = self.embed_drop(self.position.embed(self.embed(idx)))
        for block in self.blocks:
            x = block(x, self.position)
        return self.head(self.final_norm(x)).float()


@dataclass(frozen=True)
class ModelCost:
    """Size and compute of a model, so a user sees what an ablation arm costs before running it."""

    params_total: int  # unique trainable parameters (a tied matrix counted once)
    params_embedding: int  # token embedding + learned position table
    params_non_embedding: int  # total - embedding (an untied output layer counts here: it is a matmul)
    flops_per_token: float  # training FLOPs per token, PaLM appendix B (see below)


def model_cost(model: TransformerLM, cfg: DictConfig) -> ModelCost:
    """FLOPs/token = 6 * N_matmul + 12 * n_layers * n_heads * head_dim * context  (Chowdhery et al. 2022, app. B).

    N_matmul is every parameter used in a matrix multiply: the non-embedding parameters plus, when the
    output layer is tied, the shared vocab x d matrix (the embedding lookup itself is free). The second term
    is the attention-score and value matmuls (forward + backward, full causal window counted as in PaLM).
    Norm gains and biases are counted in N; their cost is negligible and the convention keeps N simple.
    """
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embed.weight.numel() + model.position.embedding_params
    non_embedding = total - embedding
    matmul = non_embedding + (model.head.weight.numel() if model.head.weight is model.embed.weight else 0)
    m = cfg.model
    hd = head_dim(m)
    flops = 6 * matmul + 12 * m.n_layers * m.n_heads * hd * m.context
    return ModelCost(total, embedding, non_embedding, float(flops))

