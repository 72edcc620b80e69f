"""Decoder-only transformer assembled from the axis registries.

    h_0    = drop_emb(pos(en(s * P_in E[idx])))   s = sqrt(d_model) with model.embed_scale (Vaswani et al. 2017)
                                                   en = a norm with model.embed_norm (BLOOM), else the identity
    h_l    = block_l(h_{l-1})                      model.block: serial | parallel (``BLOCKS``, components/blocks.py)
    logits = cap(W_out P_out final_norm(h_L) + b)  cap(z) = c * tanh(z / c), c = model.logit_softcap (Gemma 2)
                                                   b = a learned bias with model.head_bias (GPT-J), else none

E [vocab, e] and W_out [vocab, e] (E itself when tied) are e = model.embed_dim wide; when e != d_model the bias-free
P_in [d_model, e] and P_out [e, d_model] (``project_in`` / ``project_out``) join them to the stream, as OPT-350m
(Zhang et al. 2022) and ALBERT's factorized embedding (Lan et al. 2020); else both are the identity.

``model.parametrization`` (lm_ablate/parametrization.py) says how width enters: under mup the head reads
final_norm(h_L) / m (m = d_model / model.mup_base_width), s = sqrt(mup_base_width), hidden matrices start
m^-1/2 smaller; sp changes nothing.

Nothing here compares option names: each axis builds its component from its own config, a serial block only
asks its two ``Residual`` placements to combine the stream with attention and the FFN, and the block kind
comes from ``BLOCKS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from lm_ablate.components.blocks import BLOCKS, Columns, ParallelBlock, SerialBlock, site_dropout
from lm_ablate.components.placement import needs_final_norm
from lm_ablate.parametrization import parametrization, scale_init
from lm_ablate.registry import NORMS, POSITIONS
from lm_ablate.schema import head_dim
from lm_ablate.validation import validate

# the block kinds (model.block) are components: lm_ablate/components/blocks.py
__all__ = ["BLOCKS", "Columns", "ParallelBlock", "SerialBlock", "TransformerLM", "model_cost", "site_dropout"]


def softcap(logits: Tensor, cap: float | None) -> Tensor:
    """c * tanh(z / c): a smooth clip of the logits to (-c, c) (Gemma 2, Team et al. 2024); None = off."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


class TransformerLM(nn.Module):
    def __init__(self, cfg: DictConfig, vocab_size: int):
        super().__init__()
        validate(cfg)
        m = cfg.model
        self.vocab_size, self.context = vocab_size, m.context
        e = m.embed_dim or m.d_model  # token embedding and LM head input width
        self.embed = nn.Embedding(vocab_size, e)
        self.project_in = nn.Linear(e, m.d_model, bias=False) if e != m.d_model else nn.Identity()
        width = parametrization(m)
        self.embed_scale = width.embed_multiplier if m.embed_scale else 1.0  # sp: sqrt(d_model)
        # BLOOM's word_embeddings_layernorm: normalizes the token embedding before anything is added to it
        self.embed_norm = NORMS.build(cfg.norm, m.d_model) if m.embed_norm else nn.Identity()
        self.position = POSITIONS.build(cfg.position, m)
        self.embed_drop = nn.Dropout(site_dropout(cfg.regularization, "embedding_dropout"))
        self.blocks = nn.ModuleList(BLOCKS.get(m.block)(cfg, layer) for layer in range(m.n_layers))
        self.final_norm = NORMS.build(cfg.norm, m.d_model) if needs_final_norm(cfg.norm) else nn.Identity()
        self.project_out = nn.Linear(m.d_model, e, bias=False) if e != m.d_model else nn.Identity()
        self.head = nn.Linear(e, vocab_size, bias=m.head_bias)  # the bias survives tying (GPT-J)
        self.logit_softcap = m.logit_softcap
        self.init_weights(m.init_std, m.n_layers if m.scaled_residual_init else None, m.output_init_std)
        if m.tie_embeddings:
            self.head.weight = self.embed.weight
        scale_init(self, m)  # mup: hidden matrices x m^-1/2; sp: nothing
        self.output_multiplier = width.output_multiplier  # mup: 1/m on the head's input; sp: 1

    @torch.no_grad()
    def init_weights(self, std: float, n_layers: int | None, output_std: float | None = None) -> None:
        """N(0, std) for every matrix and embedding, zero biases, norms at their identity (as built).
        With ``n_layers``, sublayer output projections get std / sqrt(2 * n_layers) (GPT-2, Radford et al. 2019).
        ``output_std`` re-initialises the LM head (0 = a zero head: uniform predictions at step 0). Last, each
        block's placements apply their own branch init (DeepNorm's beta)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                scale = 1 / math.sqrt(2 * n_layers) if n_layers and getattr(module, "is_residual_out", False) else 1
                nn.init.normal_(module.weight, std=std * scale)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, (nn.Linear, Columns)) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if output_std is not None:
            nn.init.normal_(self.head.weight, std=output_std)
        for block in self.blocks:
            block.init_branches()

    def forward(self, idx: Tensor) -> Tensor:
        """Token ids [B, T] -> logits [B, T, vocab] (fp32 under autocast too, so the loss is stable)."""
        x = self.embed_drop(self.position.embed(self.embed_norm(self.project_in(self.embed(idx)) * self.embed_scale)))
        for block in self.blocks:
            x = block(x, self.position)
        h = self.project_out(self.final_norm(x))
        if self.output_multiplier != 1.0:
            h = h * self.output_multiplier
        return softcap(self.head(h).float(), self.logit_softcap)


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
    output layer is tied, the shared vocab x embed_dim matrix (the embedding lookup itself is free).
    ``model.embed_dim``'s project_in / project_out are matmuls, so they are non-embedding. The second term
    is the attention-score and value matmuls (forward + backward, full causal window counted as in PaLM).
    Norm gains, biases and ReZero's scalars are counted in N; their cost is negligible and the convention
    keeps N simple. Every block variant is covered by counting parameters: a parallel block's fused input
    matmul holds exactly the qkv and FFN-input weights of the unfused one (one norm fewer with a shared norm),
    placements only add or remove norms, and the embedding scale and logit softcap are elementwise (free).
    """
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embed.weight.numel() + model.position.embedding_params
    non_embedding = total - embedding
    matmul = non_embedding + (model.head.weight.numel() if model.head.weight is model.embed.weight else 0)
    m = cfg.model
    hd = head_dim(m)
    flops = 6 * matmul + 12 * m.n_layers * m.n_heads * hd * m.context
    return ModelCost(total, embedding, non_embedding, float(flops))
