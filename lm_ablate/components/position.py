"""Position information (axis ``position``).

A scheme can act at three places; each defaults to "do nothing", so a scheme overrides only its own:
  ``embed(x)``   adds absolute position vectors to the token embeddings   (learned, sinusoidal)
  ``rotate(q, k)`` rotates queries and keys by position                   (rope)
The model owns one scheme and hands it to every attention layer.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lm_ablate.config import ModelConfig, PositionConfig, head_dim
from lm_ablate.registry import POSITIONS


class PositionScheme(nn.Module):
    embedding_params = 0  # parameters that count as embedding (excluded from non-embedding counts)

    def embed(self, x: Tensor) -> Tensor:
        return x

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k


@POSITIONS.register("none")
class NoPosition(PositionScheme):
    """NoPE: causal attention alone carries order (Haviv et al. 2022; Kazemnejad et al. 2023)."""

    def __init__(self, cfg: PositionConfig, model: ModelConfig):
        super().__init__()


@POSITIONS.register("learned")
class LearnedPosition(PositionScheme):
    """A trained vector per absolute position (GPT-2); cannot go past ``model.context``."""

    def __init__(self, cfg: PositionConfig, model: ModelConfig):
        super().__init__()
        self.table = nn.Embedding(model.context, model.d_model)
        self.embedding_params = self.table.weight.numel()

    def embed(self, x: Tensor) -> Tensor:
        return x + self.table.weight[: x.shape[1]]


def sinusoid_table(n: int, dim: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al. 2017: PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d))."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    table = torch.zeros(n, dim)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: dim // 2])
    return table


@POSITIONS.register("sinusoidal")
class SinusoidalPosition(PositionScheme):
    def __init__(self, cfg: PositionConfig, model: ModelConfig):
        super().__init__()
        self.dim = model.d_model
        self.register_buffer("table", sinusoid_table(model.context, self.dim), persistent=False)

    def embed(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        if n > self.table.shape[0]:  # evaluation beyond the training context
            self.table = sinusoid_table(n, self.dim).to(self.table.device)
        return x + self.table[:n].to(x.dtype)


@POSITIONS.register("rope")
class RotaryPosition(PositionScheme):
    """RoPE (Su et al. 2021) in the rotate-half layout of HF transformers / GPT-NeoX:
    the pair (x_i, x_{i+d/2}) is rotated by angle p * theta^(-2i/d)."""

    def __init__(self, cfg: PositionConfig, model: ModelConfig):
        super().__init__()
        hd = head_dim(model)
        self.theta = cfg.theta
        inv_freq = cfg.theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache_len = 0
        self._cos = self._sin = torch.empty(0)

    def _angles(self, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if n > self._cache_len or self._cos.device != device:
            freqs = torch.outer(torch.arange(n, device=device, dtype=torch.float32), self.inv_freq.to(device))
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos, self._sin, self._cache_len = emb.cos(), emb.sin(), n
        return self._cos[:n], self._sin[:n]

    @staticmethod
    def _rotate_half(x: Tensor) -> Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self._angles(q.shape[-2], q.device)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return q * cos + self._rotate_half(q) * sin, k * cos + self._rotate_half(k) * sin

