"""Causal self-attention (axis ``attention``): multi-head with ``n_kv_heads`` key/value heads.

    n_kv_heads == n_heads : MHA (Vaswani et al. 2017)
    1 < n_kv_heads < n_heads: GQA (Ainslie et al. 2023), each K/V head shared by n_heads / n_kv_heads queries
    n_kv_heads == 1       : MQA (Shazeer 2019)

softmax(q k^T / sqrt(head_dim) + causal mask) v, computed by ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lm_ablate.components.position import PositionScheme
from lm_ablate.config import AttentionConfig, ModelConfig, head_dim
from lm_ablate.registry import ATTENTIONS


@ATTENTIONS.register("mha", "gqa", "mqa")
class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: AttentionConfig, model: ModelConfig, dropout: float = 0.0):
        super().__init__()
        self.n_heads = model.n_heads
        self.n_kv_heads = cfg.n_kv_heads or model.n_heads
        self.head_dim = head_dim(model)
        self.dropout = dropout
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        self.qkv = nn.Linear(model.d_model, q_dim + 2 * kv_dim, bias=cfg.bias)  # one matmul for q, k and v
        self.out = nn.Linear(q_dim, model.d_model, bias=cfg.bias)
        self.out.is_residual_out = True  # scaled init (model.scaled_residual_init)

    def forward(self, x: Tensor, position: PositionScheme) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, hd]
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = position.rotate(q, k)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )
        return self.out(y.transpose(1, 2).reshape(B, T, -1))
