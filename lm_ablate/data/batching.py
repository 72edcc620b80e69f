"""Stateless batching: windows of a 1-D token stream as a pure function of (seed, step).

* :func:`get_batch` draws its offsets from ``default_rng([seed, step])`` alone, so a run resumed at step ``s``
  continues with exactly the batches it would have seen;
* :func:`val_batches` is the same for every run and seed: evenly spaced windows over the whole split.

A stream is a 1-D ndarray (a memmap of the token cache) or :class:`TokenShards` (several memmaps read as one).
torch is imported inside the functions: tokenizer worker processes import this package and never batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lm_ablate.data.common import TokenData, bad

if TYPE_CHECKING:
    import torch


class TokenShards:
    """Several 1-D arrays (memmaps of token shards) read as their concatenation, without copying them.

    Supports what batching and inspection use: ``len``, ``dtype``, an integer, a slice, or an integer array of
    any shape (windows may run from one shard into the next, as in the concatenated stream)."""

    ndim = 1

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts])
        self.dtype = np.result_type(*[p.dtype for p in parts])
        self.shape = (int(self.starts[-1]),)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return self[np.arange(*idx.indices(len(self)))]
        flat = np.asarray(idx, dtype=np.int64)
        scalar = flat.ndim == 0
        flat = flat.reshape(-1)
        flat = np.where(flat < 0, flat + len(self), flat)  # negative indices count from the end, as for an array
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} tokens")
        shard = np.searchsorted(self.starts, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=self.dtype)
        for s in np.unique(shard):
            hit = shard == s
            out[hit] = self.parts[s][flat[hit] - self.starts[s]]
        return out[0] if scalar else out.reshape(np.shape(idx))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The whole stream in memory (small data, tests): a copy, which batching never makes."""
        return np.concatenate([np.asarray(p) for p in self.parts]).astype(dtype or self.dtype, copy=False)


def check_length(data: TokenData, context: int) -> None:
    """Fail at start, not at the first batch, when a split cannot hold one (context + 1)-token window."""
    for split, tokens in (("train", data.train), ("val", data.val)):
        if len(tokens) < context + 1:
            why = (
                f"the {split} split has only {len(tokens)} tokens (needs context + 1 = {context + 1}); "
                "use a smaller model.context or more data"
            )
            raise bad("model.context", context, why)


def _need(tokens: Any, context: int) -> None:
    if len(tokens) < context + 1:
        raise bad("model.context", context, f"the split has only {len(tokens)} tokens (needs context + 1)")


def _windows(tokens: Any, starts: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    idx = starts[:, None] + np.arange(context + 1)
    buf = torch.from_numpy(np.asarray(tokens[idx]).astype(np.int64))
    return buf[:, :-1], buf[:, 1:]


def get_batch(tokens: Any, batch_size: int, context: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) int64 [batch_size, context] with y = x shifted by one, from offsets drawn by
    ``default_rng([seed, step])``: stateless, so resuming at ``step`` reproduces the uninterrupted run."""
    if seed < 0 or step < 0:
        raise bad("seed", seed, "seed and step must be >= 0 (they seed numpy's SeedSequence)")
    _need(tokens, context)
    starts = np.random.default_rng([seed, step]).integers(0, len(tokens) - context, size=batch_size)
    return _windows(tokens, starts, context)


def val_batches(tokens: Any, batch_size: int, context: int, n_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed evaluation batches: ``batch_size * n_batches`` evenly spaced windows over the whole split, no
    randomness, so every arm and seed is scored on the same tokens."""
    _need(tokens, context)
    starts = np.linspace(0, len(tokens) - context - 1, num=batch_size * n_batches).round().astype(np.int64)
    return [_windows(tokens, s, context) for s in starts.reshape(n_batches, batch_size)]
