"""Data: text sources, tokenizers, a content-keyed token cache filled in parallel, and stateless batching.

Every run of an ablation must see the same tokens, so everything here is a pure function of the config:

* the validation split is fixed (held-out works, a named split, every k-th document or shard; never a random
  draw);
* the token cache is keyed by a hash of (source identity, split settings, tokenizer), so the runs of a sweep
  share one tokenization; it is filled by streaming the source through worker processes in bounded memory,
  and an entry counts as complete only once its meta.json is written (cache.py);
* :func:`get_batch` draws its offsets from ``(seed, step)`` alone, so a run resumed at step ``s`` continues
  with exactly the batches it would have seen, and :func:`val_batches` is the same for every run and seed.

    module          holds
    sources.py      DATASETS shakespeare, hf (local files, hub, hub streaming); hold-out rule
    pretokenized.py DATASETS tokens: nanoGPT .bin / .npy token files, memory-mapped, no copy
    tokenizers.py   TOKENIZERS byte, bpe, pretrained; the document separator; worker-side encoding
    cache.py        the cache entry: key, lock, parallel bounded-memory fill, crash safety
    batching.py     get_batch, val_batches, check_length, TokenShards

:func:`load_data` is the only entry point the training loop needs. Nothing here imports torch or datasets at
import time: tokenizer worker processes import this package.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from lm_ablate.data.batching import TokenShards, check_length, get_batch, val_batches
from lm_ablate.data.cache import FORMAT, clean, fill, open_cached
from lm_ablate.data.common import DataError, TokenData, absolute, bad, cache_root, digest
from lm_ablate.data.files import locked, write_atomic
from lm_ablate.data.pretokenized import DTYPES, IdsTokenizer, TokensSource
from lm_ablate.data.sources import HFSource, ShakespeareSource, TextSource, hold_out, shakespeare_works
from lm_ablate.data.tokenizers import (
    SEP,
    BPETokenizer,
    ByteTokenizer,
    PretrainedTokenizer,
    bpe_path,
    check_bpe_size,
    load_pretrained,
)
from lm_ablate.registry import DATASETS, TOKENIZERS

__all__ = [  # what the loop, the tests and notebooks import from lm_ablate.data
    "FORMAT",
    "SEP",
    "BPETokenizer",
    "ByteTokenizer",
    "DataError",
    "HFSource",
    "PretrainedTokenizer",
    "ShakespeareSource",
    "TextSource",
    "TokenData",
    "TokenShards",
    "TokensSource",
    "Vocabulary",
    "check_config",
    "check_length",
    "check_vocab_key",
    "get_batch",
    "hold_out",
    "load_data",
    "record_vocabulary",
    "shakespeare_works",
    "val_batches",
    "vocabulary",
]


def check_config(cfg: Any) -> None:
    """Domains of the data keys that need no file: one line naming key, value and what is allowed. Called by
    :func:`lm_ablate.config.validate` (so a sweep is checked before it launches) and by :func:`load_data`."""
    for key in ("num_proc", "tokenizer_sample", "max_tokens"):
        if cfg[key] is not None and cfg[key] < 1:
            raise bad(f"data.{key}", cfg[key], "must be a positive integer or null")
    if cfg.dtype is not None and cfg.dtype not in DTYPES:
        raise bad("data.dtype", cfg.dtype, f"allowed: {', '.join(DTYPES)}")
    if cfg.name == "tokens" and cfg.vocab_size < 1:
        why = "data=tokens needs the size of the ids' vocabulary (50257 for GPT-2's); every id must be below it"
        raise bad("data.vocab_size", cfg.vocab_size, why)
    for key in ("streaming", "max_tokens"):
        if cfg[key] and cfg.name != "hf":
            raise bad(f"data.{key}", cfg[key], f"only data=hf reads a stream it can cut; data={cfg.name} is read whole")
    if cfg.streaming and cfg.max_tokens is None:
        raise bad(
            "data.max_tokens", None, "data.streaming=true reads a split that may never end; set how many tokens to take"
        )
    if cfg.tokenizer == "pretrained" and not cfg.tokenizer_path and cfg.name != "tokens":
        raise bad(
            "data.tokenizer_path",
            cfg.tokenizer_path,
            "data.tokenizer=pretrained needs a tokenizer.json, a folder or a hub name",
        )
    if cfg.tokenizer == "bpe" and cfg.name != "tokens" and cfg.max_tokens is not None and cfg.tokenizer_sample is None:
        why = "with data.max_tokens set, bpe needs the bytes of text to train on (the corpus may be far larger)"
        raise bad("data.tokenizer_sample", None, why)


def _node(cfg: Any) -> Any:
    """A DataConfig dataclass as the typed config Hydra would give (so ``${oc.env:...}`` defaults resolve)."""
    return cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)


def load_data(cfg: Any) -> TokenData:
    """Tokenized train/val splits for ``cfg`` (a DataConfig or the ``data`` node of the Hydra config).

    Tokenizes once per (source, split settings, tokenizer) and memory-maps the result thereafter. A refused
    config leaves nothing in the cache: the cache folder is made when first written to, lock files go with
    their holders, and an entry whose fill failed is removed."""
    cfg = _node(cfg)
    check_config(cfg)
    TOKENIZERS.check("data.tokenizer", cfg.tokenizer)
    source = DATASETS.build(cfg)
    if isinstance(source, TokensSource):
        decoder = load_pretrained(cfg.tokenizer_path) if cfg.tokenizer_path else None
        decoder = decoder or (ByteTokenizer() if cfg.tokenizer == "byte" else IdsTokenizer(cfg.vocab_size))
        return source.token_data(decoder, cache_root(cfg))
    tokenizer = TOKENIZERS.get(cfg.tokenizer)(cfg, source, absolute(cfg.cache_dir))
    key = digest({"format": FORMAT, "sep": SEP, "source": source.identity(), "tokenizer": tokenizer.identity()})
    folder = cache_root(cfg) / "tokens" / key
    folder.parent.mkdir(parents=True, exist_ok=True)
    with locked(folder.parent / f"{key}.lock"):
        hit = open_cached(folder)
        if hit is None:
            folder.mkdir(exist_ok=True)
            clean(folder)
            try:
                counts = fill(source, tokenizer, folder, cfg.num_proc or cpu_cores())
            except BaseException:
                with contextlib.suppress(OSError):  # what fill wrote is gone: drop the folder unless it holds more
                    folder.rmdir()
                raise
            meta = {
                "format": FORMAT,
                "key": key,
                "identity": source.identity(),
                "tokenizer": tokenizer.identity(),
                "vocab_size": tokenizer.vocab_size,
                **counts,
            }
            blob = json.dumps(meta, indent=1, sort_keys=True).encode()
            write_atomic(folder / "meta.json", lambda f: f.write(blob))
            hit = open_cached(folder)
            assert hit is not None, f"token cache {folder} unreadable right after writing it"
    meta, train, val = hit
    return TokenData(train, val, tokenizer.vocab_size, tokenizer, key, meta, source)


@dataclass(frozen=True)
class Vocabulary:
    """The vocabulary a data config gives, found without tokenizing anything: the size the model is built
    with (``model.vocab_size``), or, for a BPE not trained yet on this corpus, the requested size as an upper
    bound (training stops earlier when the corpus has fewer distinct merges)."""

    size: int
    upper_bound: bool = False


def vocabulary(cfg: Any) -> Vocabulary:
    """What :func:`load_data` would give as ``vocab_size``, without tokenizing or writing to the token cache:

        data=tokens        data.vocab_size (every id is below it)
        byte               256
        pretrained         the tokenizer's (its tokenizer.json; a hub one not in the HF cache is fetched there)
        bpe                the cached trained tokenizer's size; not trained yet: data.vocab_size, an upper bound

    The one answer for the training loop's record, ``python -m lm_ablate.cost`` and the sweep check."""
    cfg = _node(cfg)
    check_config(cfg)
    TOKENIZERS.check("data.tokenizer", cfg.tokenizer)
    if cfg.name == "tokens":
        return Vocabulary(int(cfg.vocab_size))
    if cfg.tokenizer == "byte":
        return Vocabulary(ByteTokenizer.vocab_size)
    if cfg.tokenizer == "pretrained":
        return Vocabulary(load_pretrained(cfg.tokenizer_path).vocab_size)
    check_bpe_size(cfg)
    path = bpe_path(cfg, DATASETS.build(cfg), absolute(cfg.cache_dir))
    if path.is_file():
        from tokenizers import Tokenizer

        return Vocabulary(BPETokenizer(Tokenizer.from_file(str(path))).vocab_size)
    return Vocabulary(int(cfg.vocab_size), upper_bound=True)


def check_vocab_key(cfg: Any) -> None:
    """``model.vocab_size`` is the run's to set, from its data: a value on the command line is refused."""
    if cfg.model.vocab_size is not None:
        why = "set by the run from its data (data.tokenizer, data.vocab_size); leave it null"
        raise bad("model.vocab_size", cfg.model.vocab_size, why)


def record_vocabulary(cfg: DictConfig, vocab_size: int) -> str | None:
    """Set ``model.vocab_size`` to the vocabulary the data gave, so the run record (config.yaml, the resume
    and finished-run checks, the report) holds the size the model is built with; call it before the config
    is recorded. A value already there must agree (the same config object trained again has it). Returns the
    one line to print when a BPE stopped short of ``data.vocab_size``, else None."""
    if cfg.model.vocab_size not in (None, vocab_size):
        why = f"the data give {vocab_size:,} tokens (model.vocab_size is set by the run from its data); leave it null"
        raise bad("model.vocab_size", cfg.model.vocab_size, why)
    with open_dict(cfg):
        cfg.model.vocab_size = vocab_size
    data = cfg.data
    if data.name != "tokens" and data.tokenizer == "bpe" and vocab_size < data.vocab_size:
        return (f"data.vocab_size={data.vocab_size}: BPE on this corpus stops at {vocab_size:,} tokens; "
                f"the run uses {vocab_size:,} (model.vocab_size)")  # fmt: skip
    return None


def cpu_cores() -> int:
    """The cores this process may run on (a SLURM or container limit), the default of ``data.num_proc``."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
