"""What every part of the data package shares: the error type, the result type, hashing and paths.

Nothing here imports torch or datasets: tokenizer worker processes import this package, and each of them
would otherwise pay seconds and hundreds of MB for libraries it never uses.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lm_ablate.errors import ConfigError


class DataError(ConfigError):
    """A data problem the user can fix in the config or on disk; one line naming the ``data.*`` key."""


def bad(key: str, value: Any, allowed: str) -> DataError:
    """:func:`lm_ablate.config.bad`'s one-line format, as a DataError so callers can tell data problems."""
    return DataError(f"{key}={value!r} is invalid: {allowed}")


@dataclass
class TokenData:
    train: Any  # 1-D token ids: a read-only np.memmap, or TokenShards (several memmaps read as one, no copy)
    val: Any
    vocab_size: int
    tokenizer: Any  # vocab_size, encode(text), decode(ids) (lm_ablate/data/tokenizers.py)
    key: str  # identity of source, split settings and tokenizer (the token cache's folder name)
    meta: dict = field(default_factory=dict)  # the cache entry's meta.json (train_docs, ...); {} for data=tokens
    source: Any = None  # the TextSource the text came from (the held-out text of val/bpb); None for data=tokens


def digest(obj: Any) -> str:
    """Short stable hash of a JSON-able object (sorted keys, so dict order never changes a key)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def absolute(path: str) -> Path:
    """Absolute path against the launch directory, so a Hydra run that chdirs still finds the same files."""
    from hydra.utils import to_absolute_path

    return Path(to_absolute_path(os.path.expanduser(path)))


def cache_root(cfg: Any) -> Path:
    """``data.cache_dir``, created when first written to (a refused launch creates nothing); one line if it cannot be."""
    cache = absolute(cfg.cache_dir)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = f"cannot create the token cache there ({first_line(e)}); allowed: a writable folder"
        raise bad("data.cache_dir", cfg.cache_dir, why) from None
    return cache


def first_line(e: BaseException) -> str:
    """``Type: first line of the message``, so a wrapped library error keeps our messages one line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type holding every id: uint16 up to 65,536 symbols (GPT-2, OLMo), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
