"""The unigram and bigram levels of a data set: the losses a model reaches by learning token frequencies alone,
and the frequencies of each token after the one before it.

Definition (add-one / Laplace smoothing over the vocabulary of V tokens): with c_train(v) the count of token v in
the training split (N_train tokens) and c_val(v) its count in the validation split (N_val tokens),

    p(v)         = (c_train(v) + 1) / (N_train + V)
    unigram_loss = -(1 / N_val) * sum_v c_val(v) * ln p(v)        (nats/token)

i.e. the cross-entropy of the whole validation split under the training split's smoothed unigram distribution
(the smoothing keeps a token unseen in training finite). For the bundled Shakespeare bytes it is 3.31 nats
(DESIGN.md; uniform ln 256 = 5.55, bigram 2.50): a model whose validation loss stays near it has learned
nothing past token frequencies, which is what :mod:`lm_ablate.stall` looks for. Likewise, with c(v, w) the count
of the pair "v then w" (adjacent tokens of one stream or shard) and c(v, .) the pairs that start with v,

    p(w | v)     = (c_train(v, w) + 1) / (c_train(v, .) + V)
    bigram_loss  = -(1 / P_val) * sum_{v,w} c_val(v, w) * ln p(w | v)   (P_val pairs of the validation split)

the level a model that looks one token back reaches (2.51 nats for the Shakespeare bytes; DESIGN.md's 2.50 is
less smoothed): a run that ends near it has learned no context past the previous token (issue 23: the 300-step
lr_transfer ended every width there).
The pair table has V^2 cells, so the bigram level is counted for V <= BIGRAM_MAX_VOCAB only (None above).

Counting reads each split once in chunks of ``CHUNK`` tokens (np.bincount needs int64 copies: the chunk bounds
the memory, not the corpus); 0.12 s for the 5M Shakespeare tokens on a loaded 2-core machine, so minutes for a
corpus of billions. The result is cached per token-cache key (the identity of source, split settings and
tokenizer) in ``<data.cache_dir>/unigram/<key>.json``: a sweep counts once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lm_ablate.data.common import TokenData
from lm_ablate.data.files import write_atomic

CHUNK = 1 << 24  # tokens per bincount: 128 MiB of int64 at most
SMOOTHING = "add-one"  # recorded with the value; part of the cache file, so a change of rule is a miss
BIGRAM_MAX_VOCAB = 4096  # the pair table is V^2 int64: 128 MiB at 4096


def counts(tokens: Any, vocab_size: int) -> np.ndarray:
    """How often each id in [0, vocab_size) occurs in a 1-D token stream (memmap, array or TokenShards)."""
    parts = getattr(tokens, "parts", None) or [tokens]
    total = np.zeros(vocab_size, dtype=np.int64)
    for part in parts:
        for start in range(0, len(part), CHUNK):
            found = np.bincount(np.asarray(part[start : start + CHUNK]), minlength=vocab_size)
            total += found[:vocab_size] if len(found) > vocab_size else found
    return total


def unigram_loss(train: Any, val: Any, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of ``val`` under the add-one-smoothed unigram distribution of ``train``
    (see the module docstring)."""
    c_train = counts(train, vocab_size).astype(np.float64)
    c_val = counts(val, vocab_size).astype(np.float64)
    if c_val.sum() == 0:
        return math.nan
    log_p = np.log(c_train + 1.0) - math.log(c_train.sum() + vocab_size)
    return float(-(c_val * log_p).sum() / c_val.sum())


def pair_counts(tokens: Any, vocab_size: int) -> np.ndarray:
    """How often each pair (v, w) of adjacent ids occurs, as a (V, V) array; pairs do not cross shards."""
    parts = getattr(tokens, "parts", None) or [tokens]
    total = np.zeros(vocab_size * vocab_size, dtype=np.int64)
    for part in parts:
        for start in range(0, max(len(part) - 1, 0), CHUNK):
            chunk = np.asarray(part[start : start + CHUNK + 1], dtype=np.int64)  # one token of overlap
            found = np.bincount(chunk[:-1] * vocab_size + chunk[1:], minlength=vocab_size * vocab_size)
            total += found[: vocab_size * vocab_size]
    return total.reshape(vocab_size, vocab_size)


def bigram_loss(train: Any, val: Any, vocab_size: int) -> float | None:
    """Cross-entropy (nats/token) of ``val``'s adjacent pairs under the add-one-smoothed bigram distribution of
    ``train`` (the module docstring); None for a vocabulary above BIGRAM_MAX_VOCAB."""
    if vocab_size > BIGRAM_MAX_VOCAB:
        return None
    c_train = pair_counts(train, vocab_size).astype(np.float64)
    c_val = pair_counts(val, vocab_size).astype(np.float64)
    if c_val.sum() == 0:
        return math.nan
    log_p = np.log(c_train + 1.0) - np.log(c_train.sum(axis=1, keepdims=True) + vocab_size)
    return float(-(c_val * log_p).sum() / c_val.sum())


def data_unigram_loss(data: TokenData, cache_dir: Path) -> float:
    """:func:`unigram_loss` of a data set's splits (:func:`data_levels`)."""
    return data_levels(data, cache_dir)["unigram_loss"]


def data_levels(data: TokenData, cache_dir: Path) -> dict[str, float | None]:
    """{"unigram_loss", "bigram_loss"} of a data set's splits, read from (or written to) the cache beside its
    tokens."""
    path = Path(cache_dir) / "unigram" / f"{data.key}.json"
    try:
        found = json.loads(path.read_text())
        if (
            found.get("smoothing") == SMOOTHING
            and found.get("vocab_size") == data.vocab_size
            and "bigram_loss" in found
        ):
            return {"unigram_loss": float(found["unigram_loss"]), "bigram_loss": found["bigram_loss"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = unigram_loss(data.train, data.val, data.vocab_size)
    bigram = bigram_loss(data.train, data.val, data.vocab_size)
    record = {"unigram_loss": value, "bigram_loss": bigram, "smoothing": SMOOTHING, "vocab_size": data.vocab_size,
              "key": data.key}  # fmt: skip
    blob = json.dumps(record, indent=1, sort_keys=True).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda f: f.write(blob))
    except OSError:
        pass  # a read-only cache: the value is still right, only counted again next time
    return {"unigram_loss": value, "bigram_loss": bigram}
