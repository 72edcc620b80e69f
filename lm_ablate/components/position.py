"""Position information (axis ``position``).

A scheme can act at three places; each defaults to "do nothing", so a scheme overrides only its own:
  ``embed(x)``                  adds absolute position vectors to the token embeddings   (learned, sinusoidal)
  ``rotate(q, k)``              rotates queries and keys by position                     (rope)
  ``score_bias(n_q, n_k, ...)`` an additive bias on the attention logits, [H, n_q, n_k]  (alibi, t5)
The model owns one scheme and hands it to every attention layer, so a learned table in a scheme (t5) is
shared by all layers. Queries are the last ``n_q`` of the ``n_k`` key positions (n_q == n_k in training).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lm_ablate.registry import POSITIONS, Registry
from lm_ablate.schema import ModelConfig, PositionConfig, head_dim

ROPE_LAYOUTS: Registry = Registry("position.layout")


class PositionScheme(nn.Module):
    embedding_params = 0  # parameters that count as embedding (excluded from non-embedding counts)
    max_length: int | None = None  # longest sequence the scheme can encode; None = any (extrapolation)

    def embed(self, x: Tensor) -> Tensor:
        return x

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def score_bias(self, n_q: int, n_k: int, device: torch.device, dtype: torch.dtype) -> Tensor | None:
        return None


def relative_distance(n_q: int, n_k: int, device: torch.device | None = None) -> Tensor:
    """i - j for query i (at position n_k - n_q + i) and key j: [n_q, n_k], negative for future keys."""
    return torch.arange(n_k - n_q, n_k, device=device)[:, None] - torch.arange(n_k, device=device)


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
        self.max_length = model.context

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


# RoPE layouts (``position.layout``). Both rotate pair i by angle p * theta_i; they differ in which two dims
# form pair i. ``spread`` turns the per-pair angles [T, r/2] into per-dim angles [T, r]; ``partner`` puts
# (-x_b, x_a) where (x_a, x_b) sit, so that  x * cos + partner(x) * sin  rotates every pair.
@ROPE_LAYOUTS.register("half")
class RotateHalf:
    """HF transformers / GPT-NeoX: pair i = (x_i, x_{i+r/2})."""

    @staticmethod
    def spread(angles: Tensor) -> Tensor:
        return torch.cat((angles, angles), dim=-1)

    @staticmethod
    def partner(x: Tensor) -> Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)


@ROPE_LAYOUTS.register("interleaved")
class RotateInterleaved:
    """Su et al. 2021 / GPT-J / Meta's LLaMA code: pair i = (x_{2i}, x_{2i+1})."""

    @staticmethod
    def spread(angles: Tensor) -> Tensor:
        return angles.repeat_interleave(2, dim=-1)

    @staticmethod
    def partner(x: Tensor) -> Tensor:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


@POSITIONS.register("rope", reads=("theta", "fraction", "layout"))
class RotaryPosition(PositionScheme):
    """RoPE (Su et al. 2021): pair i of the first r = fraction * head_dim dims of every query and key at
    position p is rotated by angle p * theta^(-2i/r); the other dims pass through (partial rotary, GPT-J /
    GPT-NeoX, whose frequencies also use r). The score q_m . k_n then depends on m - n only."""

    def __init__(self, cfg: PositionConfig, model: ModelConfig):
        super().__init__()
        self.dims = round(cfg.fraction * head_dim(model))  # validated even and >= 2
        self.layout = ROPE_LAYOUTS.get(cfg.layout)
        inv_freq = cfg.theta ** (-torch.arange(0, self.dims, 2, dtype=torch.float32) / self.dims)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache_len = 0
        self._cos = self._sin = torch.empty(0)

    def _angles(self, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if n > self._cache_len or self._cos.device != device:
            pos = torch.arange(n, device=device, dtype=torch.float32)
            angles = self.layout.spread(torch.outer(pos, self.inv_freq.to(device)))
            self._cos, self._sin, self._cache_len = angles.cos(), angles.sin(), n
        return self._cos[:n], self._sin[:n]

    def _rotate_one(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if self.dims == x.shape[-1]:  # fraction 1: no pass-through part, so no slice and no concatenation
            return x * cos.to(x.dtype) + self.layout.partner(x) * sin.to(x.dtype)
        x_rot, x_pass = x[..., : self.dims], x[..., self.dims :]
        x_rot = x_rot * cos.to(x.dtype) + self.layout.partner(x_rot) * sin.to(x.dtype)
        return torch.cat((x_rot, x_pass), dim=-1)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self._angles(q.shape[-2], q.device)
        return self._rotate_one(q, cos, sin), self._rotate_one(k, cos, sin)


def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al. 2022: for n a power of two, the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8).
    Otherwise (their footnote; BLOOM): the slopes for the closest lower power of two p, then every other
    slope of the sequence for 2p, for the remaining n - p heads."""

    def geometric(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    p = 2 ** math.floor(math.log2(n_heads))
    return geometric(p) + geometric(2 * p)[0::2][: n_heads - p]


@POSITIONS.register("alibi")
class ALiBi(PositionScheme):
    """ALiBi (Press et al. 2022): no position vectors; head h adds -m_h * (i - j) to the logit of query i
    and key j, a fixed linear penalty on distance with a different steepness per head."""

    def __init__(self, cfg: PositionConfig, model: ModelConfig):
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(model.n_heads)), persistent=False)

    def score_bias(self, n_q: int, n_k: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        distance = relative_distance(n_q, n_k, device).float()
        return (-self.slopes.to(device)[:, None, None] * distance).to(dtype)


def t5_bucket(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Unidirectional T5 bucketing (Raffel et al. 2020; Mesh TensorFlow): for d = i - j (future keys count
    as 0), the first num_buckets/2 distances get a bucket each; larger ones share log-spaced buckets up to
    max_distance, and everything farther lands in the last bucket."""
    d = distance.clamp(min=0)
    exact = num_buckets // 2
    log_spaced = (
        exact
        + (torch.log(d.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)).long()
    )
    return torch.where(d < exact, d, log_spaced.clamp(max=num_buckets - 1))


@POSITIONS.register("t5", reads=("num_buckets", "max_distance"))
class T5RelativeBias(PositionScheme):
    """T5 relative attention bias (Raffel et al. 2020): one learned scalar per (distance bucket, head) added
    to the logits. As in T5 the table is shared by all layers (it lives in the model's one scheme)."""

    def __init__(self, cfg: PositionConfig, model: ModelConfig):
        super().__init__()
        self.num_buckets, self.max_distance = cfg.num_buckets, cfg.max_distance
        self.table = nn.Embedding(cfg.num_buckets, model.n_heads)
        self.embedding_params = self.table.weight.numel()

    def score_bias(self, n_q: int, n_k: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        buckets = t5_bucket(relative_distance(n_q, n_k, device), self.num_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1).to(dtype)  # [n_q, n_k, H] -> [H, n_q, n_k]
