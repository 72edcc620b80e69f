"""The held-out text of validation bits per byte, the same text for every tokenizer, and the bytes of tokens.

Loss per token is not comparable across tokenizers (a token is a byte for one and ~4 bytes for another). Bits
per byte over one fixed text is (Tao et al. 2024; the Pile's and GPT-2's "bits per character")::

    val/bpb = (sum over the held-out text's tokens of -ln p(token | what precedes it)) / (ln 2 * its UTF-8 bytes)

**The text** (:func:`held_out`): the validation documents joined by a blank line, read in the source's order up to
``SCAN_BYTES``, and from that ``n = round(train.val_bpb_bytes / PIECE_BYTES)`` pieces of ~``PIECE_BYTES`` bytes at
evenly spaced offsets, each cut at line ends (a piece starts after a newline and ends with one, so no piece cuts a
character or a word; at most ``PIECE_BYTES`` bytes each). It depends on the source and these numbers only, never
on the tokenizer; it is written once to ``cache_dir/heldout/`` (reading a big split to find it costs a pass).
Every piece is held-out text: validation works or documents that no tokenizer or training step has seen.

**Its tokens** (:func:`encode_pieces`): each piece is a document of its own, preceded by the tokenizer's document
separator, which is given, never predicted nor counted (byte: the two bytes ``"\\n\\n"``, BPE and pretrained: the
EOS token), exactly as a document follows the previous one in the training stream. So the first byte of every
piece has a predictor for every tokenizer alike. Scoring (lm_ablate/eval/bpb.py) predicts every other token once.

**Bytes per token of the training data** (:func:`token_bytes`, for ``train.max_bytes``): each id's UTF-8 length
(byte-level BPE: its bytes through GPT-2's byte-to-unicode table, exact; other HF tokenizers: the length of the id
decoded alone; separators and special tokens: 0), summed over the training split's ids; the byte tokenizer's
``"\\n\\n"`` between documents are separators, not text, and are taken off (``docs - 1`` of them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from lm_ablate.data.common import cache_root, digest
from lm_ablate.data.files import locked, write_atomic
from lm_ablate.data.tokenizers import SEP, ByteTokenizer, utf8_len

HELDOUT_FORMAT = 1  # part of the held-out text's key: bump it when the rule above changes
PIECE_BYTES = 1024  # bytes of one piece (8 windows of a 128-byte context)
SCAN_BYTES = 8 << 20  # the pieces are spread over the first 8 MB of validation text (all of smaller splits)
JOIN = "\n\n"  # between validation documents in the scanned text (a blank line, as in the sources' .txt rule)


@dataclass(frozen=True)
class HeldOut:
    """The held-out text: its pieces and their UTF-8 bytes (the denominator of val/bpb)."""

    pieces: tuple[str, ...]
    n_bytes: int
    key: str  # digest of (format, source identity, sizes): the same text whatever the tokenizer


def val_texts(source: Any) -> Iterator[str]:
    """The validation documents of ``source`` (a TextSource) in the token cache's order."""
    for stream in source.streams():
        if "val" not in stream.splits:
            continue
        docs = stream.docs()
        try:
            for split, batch, _ in docs:
                if split == "val":
                    yield from batch
        finally:
            getattr(docs, "close", lambda: None)()


def scanned_text(source: Any, limit: int = SCAN_BYTES) -> bytes:
    """The validation documents joined by ``JOIN``, UTF-8, cut after the first document that reaches ``limit``."""
    out, size = [], 0
    for doc in val_texts(source):
        raw = doc.encode("utf-8")
        out.append(raw)
        size += len(raw) + len(JOIN)
        if size >= limit:
            break
    return JOIN.encode().join(out)[:limit]


def pick_pieces(raw: bytes, total: int, piece: int = PIECE_BYTES) -> list[str]:
    """``round(total / piece)`` (at least 1) pieces of at most ``piece`` bytes of ``raw`` at evenly spaced
    offsets, each from just after a newline to just after a newline (a piece without one: cut at UTF-8
    character starts). All of ``raw`` when it is no longer than ``total``."""
    if len(raw) <= total:
        return [raw.decode("utf-8", errors="ignore")] if raw else []
    n = max(1, round(total / piece))
    starts = np.linspace(0, len(raw) - piece, num=n).round().astype(np.int64)
    out = []
    for s in starts.tolist():
        end = s + piece
        nl = raw.find(b"\n", s, end)
        a = nl + 1 if 0 <= nl < end - 1 else _char_start(raw, s)
        nl = raw.rfind(b"\n", a, end)
        b = nl + 1 if nl >= a else _char_start(raw, end)
        text = raw[a:b].decode("utf-8", errors="ignore")
        if text:
            out.append(text)
    return out


def _char_start(raw: bytes, i: int) -> int:
    """The first index >= i that starts a UTF-8 character (continuation bytes are 0b10xxxxxx)."""
    while i < len(raw) and raw[i] & 0xC0 == 0x80:
        i += 1
    return i


def held_out(cfg: Any, source: Any, n_bytes: int) -> HeldOut:
    """The held-out text of ``source`` (``cfg``: the data config, for the cache folder), read once and cached."""
    key = digest({"format": HELDOUT_FORMAT, "source": source.identity(), "bytes": n_bytes, "piece": PIECE_BYTES,
                  "scan": SCAN_BYTES})  # fmt: skip
    folder = cache_root(cfg) / "heldout"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    with locked(folder / f"{key}.lock"):
        if not path.is_file():
            pieces = pick_pieces(scanned_text(source), n_bytes)
            blob = json.dumps({"key": key, "pieces": pieces}).encode()
            write_atomic(path, lambda f: f.write(blob))
    pieces = tuple(json.loads(path.read_text(encoding="utf-8"))["pieces"])
    return HeldOut(pieces, sum(utf8_len(p) for p in pieces), key)


def separator_ids(tokenizer: Any) -> list[int]:
    """The ids a document follows in the training stream: ``"\\n\\n"``'s bytes, else the EOS id."""
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode(SEP).tolist()
    return [int(tokenizer.eos_id)]


def encode_pieces(tokenizer: Any, pieces: tuple[str, ...] | list[str]) -> list[np.ndarray]:
    """Each piece's ids with the separator in front (int64): the separator is context, the rest is scored."""
    sep = separator_ids(tokenizer)
    return [np.asarray(sep + np.asarray(tokenizer.encode(p)).tolist(), dtype=np.int64) for p in pieces]


# ------------------------------------------------------------------------------------ bytes per token


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table, inverted (Radford et al. 2019, openai/gpt-2 src/encoder.py): byte-level
    BPE spells byte b as this printable character, so a token's string maps back to its exact bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    byte_values = list(printable)
    for b in range(256):
        if b not in printable:
            byte_values.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(byte_values, chars)}


def token_bytes(tokenizer: Any) -> np.ndarray:
    """UTF-8 bytes of each id's text (int64, one per id): 1 for every byte; 0 for special tokens (EOS)."""
    if isinstance(tokenizer, ByteTokenizer):
        return np.ones(tokenizer.vocab_size, dtype=np.int64)
    tok = tokenizer.tok
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    table = _unicode_to_byte()
    byte_level = "ByteLevel" in json.dumps(json.loads(tok.to_str()).get("decoder"))  # GPT-2's byte alphabet
    lens = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        if text in special:
            continue
        if byte_level and all(c in table for c in text):
            lens[i] = len(text)
        else:
            lens[i] = utf8_len(tok.decode([i], skip_special_tokens=False))
    return lens


def bytes_per_token(data: Any) -> float:
    """UTF-8 bytes of training text per training token of ``data`` (a TokenData): the module docstring's rule."""
    train = data.train
    counts = np.zeros(data.vocab_size, dtype=np.int64)
    step = 1 << 24
    for start in range(0, len(train), step):
        counts += np.bincount(np.asarray(train[start : start + step]), minlength=data.vocab_size)[: data.vocab_size]
    n_bytes = int(counts @ token_bytes(data.tokenizer))
    if isinstance(data.tokenizer, ByteTokenizer):
        n_bytes -= len(SEP) * max(0, int(data.meta.get("train_docs", 1)) - 1)
    return n_bytes / max(1, len(train))


def steps_for_bytes(max_bytes: int, per_token: float, tokens_per_step: int) -> int:
    """Optimizer steps that read ``max_bytes`` of training text: ceil(max_bytes / (bytes/token x tokens/step))."""
    return max(1, math.ceil(max_bytes / (per_token * tokens_per_step)))
