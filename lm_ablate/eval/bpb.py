"""Validation bits per byte: the model's total nats over the held-out text (lm_ablate/data/heldout.py), per bit and
byte, the same text for every tokenizer::

    val/bpb = sum_d sum_{i >= s} -ln p(t_d,i | t_d,<i) / (ln 2 * bytes of the held-out text)

d runs over the held-out pieces, t_d = separator (s ids: the byte tokenizer's "\\n\\n", else EOS) + the piece's ids,
and i over every id of the piece: each is predicted once. Windows: a piece's sequence of n ids is cut into
non-overlapping windows of ``model.context`` predictions, window k reading ids [kC, kC + C) and predicting ids
[kC + 1, kC + C] (as the validation loss's windows of C + 1 ids do), so the first prediction of window k > 0 is
conditioned on one id of what precedes it (the previous window's last) and nothing further back; the last window of
a piece is shorter (padded; padding is never scored, and under causal attention never read by a scored position).
For the byte tokenizer val/bpb is therefore the mean cross-entropy of those windows over ln 2 (tests/test_val_bpb.py
checks it, and a BPE model against a brute-force per-document loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lm_ablate.data.heldout import bytes_per_token, encode_pieces, held_out, separator_ids, steps_for_bytes
from lm_ablate.errors import bad

LN2 = math.log(2.0)
IGNORE = -100  # torch's cross_entropy ignore_index: padding and the separator's own ids are not scored
WINDOWS_PER_PASS = 64  # windows per forward pass


@dataclass(frozen=True)
class BPBText:
    """The held-out text as one tokenizer gives it: windows ready for the model, and the text's UTF-8 bytes."""

    x: torch.Tensor  # [windows, context] int64
    y: torch.Tensor  # [windows, context] int64, IGNORE where nothing is scored
    n_bytes: int
    n_tokens: int  # ids scored (the text's tokens): n_bytes / n_tokens is the tokenizer's bytes/token on it

    def to(self, device: torch.device) -> BPBText:
        return BPBText(self.x.to(device), self.y.to(device), self.n_bytes, self.n_tokens)


def windows(seqs: Sequence[np.ndarray], context: int, given: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) [windows, context] for sequences whose first ``given`` ids are context only (the separator)."""
    xs, ys = [], []
    for seq in seqs:
        seq = np.asarray(seq, dtype=np.int64)
        for start in range(0, len(seq) - 1, context):
            x = np.zeros(context, dtype=np.int64)
            y = np.full(context, IGNORE, dtype=np.int64)
            piece = seq[start : start + context + 1]
            x[: len(piece) - 1], y[: len(piece) - 1] = piece[:-1], piece[1:]
            # target index start + 1 + j is the separator's own id while < given
            y[: max(0, given - 1 - start)] = IGNORE
            xs.append(x)
            ys.append(y)
    if not xs:
        empty = torch.zeros((0, context), dtype=torch.int64)
        return empty, empty.clone()
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def prepare(seqs: Sequence[np.ndarray], given: int, n_bytes: int, context: int) -> BPBText:
    x, y = windows(seqs, context, given)
    return BPBText(x, y, n_bytes, int((y != IGNORE).sum()))


@torch.no_grad()
def total_nats(model: torch.nn.Module, text: BPBText, autocast: Callable, per_pass: int = WINDOWS_PER_PASS) -> float:
    """Sum of -ln p over every scored id of ``text`` (float64 sum of float32 cross-entropies)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(text.x), per_pass):
        x, y = text.x[i : i + per_pass], text.y[i : i + per_pass]
        with autocast():
            logits = model(x)
        nats = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
        total += float(nats.item())
    model.train(was_training)
    return total


def bits_per_byte(model: torch.nn.Module, text: BPBText, autocast: Callable) -> float:
    """val/bpb of ``model`` on ``text`` (the module docstring's formula)."""
    return total_nats(model, text, autocast) / (LN2 * text.n_bytes)


def held_out_text(cfg: Any, data: Any) -> BPBText | None:
    """The run's val/bpb windows: the held-out text of its source (``train.val_bpb_bytes``) in its tokenizer's ids,
    cut into ``model.context`` windows; None for data=tokens (ids, no text) or ``train.val_bpb_bytes=0``."""
    if cfg.train.val_bpb_bytes == 0 or data.source is None:
        return None
    text = held_out(cfg.data, data.source, cfg.train.val_bpb_bytes)
    seqs = encode_pieces(data.tokenizer, text.pieces)
    return prepare(seqs, len(separator_ids(data.tokenizer)), text.n_bytes, cfg.model.context)


@dataclass(frozen=True)
class TextBudget:
    """``train.max_bytes`` as steps: the data's bytes of training text per token and the steps that read it."""

    bytes_per_token: float
    steps: int


def text_budget(cfg: Any, data: Any, tokens_per_step: int) -> TextBudget | None:
    """``train.max_bytes`` in steps at the training split's measured bytes/token (lm_ablate/data/heldout.py); one
    line when ``train.max_steps`` would stop the run before it has read them. None without a text budget."""
    t = cfg.train
    if t.max_bytes is None:
        return None
    per_token = bytes_per_token(data)
    steps = steps_for_bytes(t.max_bytes, per_token, tokens_per_step)
    if t.max_steps < steps:
        raise bad("train.max_steps", t.max_steps, f"stops the run before train.max_bytes={t.max_bytes} is read "
                  f"({steps} steps of {tokens_per_step} tokens at {per_token:.4g} bytes/token): one budget at a "
                  "time, raise it (e.g. 1000000000)")  # fmt: skip
    return TextBudget(per_token, steps)
