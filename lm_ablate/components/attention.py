"""Causal self-attention (axis ``attention``): multi-head with n_kv K/V heads, which the option fixes or reads.

    mha   n_kv = n_heads                   (Vaswani et al. 2017)
    gqa   n_kv = attention.n_kv_heads      (Ainslie et al. 2023): each K/V head shared by n_heads / n_kv queries
    mqa   n_kv = 1                         (Shazeer 2019)

    y = softmax(cap(scale * norm(q) norm(k)^T) + bias + mask) v

  norm   ``qk_norm``: none | per_head (RMSNorm over head_dim, Qwen 3) | whole (RMSNorm over the full q / k
         projection before the head split, OLMo 2); applied before RoPE, as both do
  scale  ``scale``, default 1 / sqrt(head_dim); 1 / head_dim under model.parametrization=mup
  cap    ``softcap`` c: c * tanh(s / c) (Gemma 2); none by default
  bias   the position scheme's ``score_bias`` (alibi, t5), added after the cap
  mask   0 where query i may see key j, -inf elsewhere: j <= i, and i - window < j on local layers

Sliding window: with ``window`` set, layer l (0-based) is global (full causal) iff global_every > 0 and
(l + 1) % global_every == 0, else local. Mistral: global_every=0 (all local); Gemma 2: 2 (local, global, ...);
Gemma 3: 6 (five local, then one global).

Paths: without a cap the whole thing is one ``F.scaled_dot_product_attention`` call (``is_causal`` when
there is no bias and no window, else with the float mask bias + mask). A cap sits between the matmul and
the softmax, which SDPA cannot do, so it runs the same equation written out. Dropout on the attention
probabilities applies on both paths.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lm_ablate.components.norm import RMSNorm
from lm_ablate.components.position import PositionScheme, relative_distance
from lm_ablate.parametrization import parametrization
from lm_ablate.registry import ATTENTIONS, Registry
from lm_ablate.schema import AttentionConfig, ModelConfig, head_dim

QK_NORMS: Registry = Registry("attention.qk_norm")  # (width, head_dim, eps) -> module on [B, T, width]


@QK_NORMS.register("none")
def no_qk_norm(width: int, head_dim: int, eps: float) -> nn.Module:
    return nn.Identity()


@QK_NORMS.register("whole", reads=("qk_norm_eps",))
def whole_qk_norm(width: int, head_dim: int, eps: float) -> nn.Module:
    """OLMo 2 (OLMo et al. 2024): one RMSNorm over all heads' dims of the projection at once."""
    return RMSNorm(width, eps=eps)


@QK_NORMS.register("per_head", reads=("qk_norm_eps",))
class PerHeadRMSNorm(nn.Module):
    """Qwen 3 (also Gemma 3): RMSNorm over each head's head_dim dims, one gain vector shared by the heads."""

    def __init__(self, width: int, head_dim: int, eps: float):
        super().__init__()
        self.head_dim = head_dim
        self.norm = RMSNorm(head_dim, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x.unflatten(-1, (-1, self.head_dim))).flatten(-2)


def layer_window(cfg: AttentionConfig, layer: int) -> int | None:
    """The sliding window of layer ``layer`` (0-based); None = global (see the module docstring)."""
    is_global = cfg.global_every > 0 and (layer + 1) % cfg.global_every == 0
    return None if is_global else cfg.window


class CausalSelfAttention(nn.Module):
    force_explicit = False  # tests: run the written-out path even without a cap, to compare it with SDPA
    qk_observer = None  # set by probes.observed: called with (q, k) of every forward while set
    max_logit_scores = 2**24  # max_logit computes at most this many scores at a time

    def __init__(
        self, cfg: AttentionConfig, model: ModelConfig, dropout: float = 0.0, layer: int = 0, n_kv_heads: int = 0
    ):
        super().__init__()
        self.n_heads = model.n_heads
        self.n_kv_heads = n_kv_heads or cfg.n_kv_heads or model.n_heads
        self.head_dim = head_dim(model)
        self.dropout = dropout
        self.scale = parametrization(model).attention_scale(cfg.scale, self.head_dim)  # sp: scale or hd^-1/2
        self.softcap = cfg.softcap
        self.window = layer_window(cfg, layer)
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        self.qkv = nn.Linear(model.d_model, q_dim + 2 * kv_dim, bias=cfg.bias)  # one matmul for q, k and v
        self.q_norm = QK_NORMS.get(cfg.qk_norm)(q_dim, self.head_dim, cfg.qk_norm_eps)
        self.k_norm = QK_NORMS.get(cfg.qk_norm)(kv_dim, self.head_dim, cfg.qk_norm_eps)
        self.out = nn.Linear(q_dim, model.d_model, bias=cfg.bias)
        self.out.is_residual_out = True  # scaled init (model.scaled_residual_init)

    @property
    def explicit(self) -> bool:
        return self.softcap is not None or self.force_explicit

    def mask(self, n_q: int, n_k: int, bias: Tensor | None, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Additive [n_q, n_k] ([H, n_q, n_k] with a bias): the bias where i - window < j <= i, else -inf."""
        distance = relative_distance(n_q, n_k, device)  # i - j
        seen = distance >= 0
        if self.window is not None:
            seen &= distance < self.window
        mask = torch.zeros(n_q, n_k, device=device, dtype=dtype).masked_fill(~seen, float("-inf"))
        return mask if bias is None else bias + mask

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float) -> Tensor:
        if not self.explicit:
            return F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                is_causal=mask is None,
                dropout_p=dropout,
                scale=self.scale,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-2, -1) * self.scale
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        probs = (scores + mask).float().softmax(dim=-1).to(q.dtype)
        return F.dropout(probs, dropout) @ v

    def project(self, x: Tensor, position: PositionScheme) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, H, T, hd], k and v [B, Hkv, T, hd]: projected, qk-normed and rotated."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = position.rotate(q, k)
        return q, k, v

    @torch.no_grad()
    def max_logit(self, q: Tensor, k: Tensor) -> Tensor:
        """Largest pre-softmax logit scale * q.k over the (query, key) pairs the mask lets through, before any
        softcap and position bias: the quantity whose growth QK-norm and softcapping are meant to stop
        (Dehghani et al. 2023). For the stability probes (probes.py); training never calls it. In fp32, at most
        ~2^24 scores at a time: several sequences of the batch at once, or for long contexts a block of query rows
        of one sequence against the keys up to its last row, so memory stays bounded at any context."""
        B, H, T, _ = q.shape
        q, k = q.detach(), k.detach().repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        budget = self.max_logit_scores
        if budget >= H * T * T:  # whole sequences fit: slices of the batch
            mask = self.mask(T, T, None, q.device, torch.float32)
            step = budget // (H * T * T)
            chunks = (
                (q[b : b + step] @ k[b : b + step].transpose(-2, -1)).float() * self.scale + mask
                for b in range(0, B, step)
            )
        else:  # rows [i0, i1) of one sequence see keys [0, i1): the mask of the last i1 - i0 queries of i1 keys
            rows = max(1, budget // (H * T))
            chunks = (
                (q[b : b + 1, :, i0 : i0 + rows] @ k[b : b + 1, :, : i0 + rows].transpose(-2, -1)).float() * self.scale
                + self.mask(min(rows, T - i0), min(i0 + rows, T), None, q.device, torch.float32)
                for b in range(B)
                for i0 in range(0, T, rows)
            )
        return torch.stack([c.amax() for c in chunks]).amax()

    def forward(self, x: Tensor, position: PositionScheme) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self.project(x, position)
        if self.qk_observer is not None:  # a stability probe reads q and k (probes.py); None while training
            self.qk_observer(q, k)
        bias = position.score_bias(T, T, x.device, q.dtype)
        plain_causal = bias is None and self.window is None and not self.explicit
        mask = None if plain_causal else self.mask(T, T, bias, x.device, q.dtype)
        y = self.attend(q, k, v, mask, self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


# The options fix or read the number of K/V heads, so a name always says what is built (lm_ablate/options.py).
@ATTENTIONS.register("mha")
def mha(cfg: AttentionConfig, model: ModelConfig, **runtime: Any) -> CausalSelfAttention:
    """One K/V head per query head (Vaswani et al. 2017)."""
    return CausalSelfAttention(cfg, model, n_kv_heads=model.n_heads, **runtime)


@ATTENTIONS.register("gqa", reads=("n_kv_heads",))
def gqa(cfg: AttentionConfig, model: ModelConfig, **runtime: Any) -> CausalSelfAttention:
    """``attention.n_kv_heads`` K/V heads, each shared by n_heads / n_kv_heads queries (Ainslie et al. 2023, whose
    GQA-G family holds MQA at G = 1 and MHA at G = n_heads)."""
    return CausalSelfAttention(cfg, model, n_kv_heads=cfg.n_kv_heads, **runtime)


@ATTENTIONS.register("mqa")
def mqa(cfg: AttentionConfig, model: ModelConfig, **runtime: Any) -> CausalSelfAttention:
    """One K/V head shared by every query head (Shazeer 2019)."""
    return CausalSelfAttention(cfg, model, n_kv_heads=1, **runtime)
