"""Tokenizers (``data.tokenizer``, registry ``TOKENIZERS``): text -> ids, and what goes between documents.

    option      vocabulary                                            between documents   stored
    byte        the 256 UTF-8 byte values                             the bytes of "\\n\\n"  nothing
    bpe         <|endoftext|> + 256 bytes + merges, data.vocab_size    <|endoftext|>       cache_dir/tokenizers/
                at most (a small corpus runs out of merges sooner)
    pretrained  the tokenizer's (data.tokenizer_path)                  its EOS token       (the user's file)

* ``bpe``: byte-level BPE (Sennrich et al. 2016; GPT-2's byte-level variant and pre-tokenizer, Radford et al.
  2019) trained with Hugging Face ``tokenizers`` from an iterator over the training documents (all of them, or
  the first ``data.tokenizer_sample`` bytes), so the corpus is never held in memory. Validation text never
  shapes the vocabulary. Same documents and size -> same merges; the JSON file is cached by source identity.
* ``pretrained``: ``data.tokenizer_path`` is a ``tokenizer.json`` file, a folder (``transformers``
  ``save_pretrained`` layout) or a hub name such as ``gpt2`` (the HF cache, else one request to the hub: without
  a network that is one line at once, not a minute of retries). Vocabulary size and EOS come from it (EOS:
  ``tokenizer_config.json``'s ``eos_token``, else ``AutoTokenizer``'s, else a well-known name such as
  ``<|endoftext|>`` or ``</s>``); documents are encoded without BOS or other post-processing, and EOS separates
  them (as GPT-2 and nanoGPT's prepare.py do).
* Special-token text inside a document (a literal ``<|endoftext|>``) is encoded as text, never as the id.

Every tokenizer has ``vocab_size``, ``encode(text)``, ``decode(ids)``, ``encode_docs(docs, lead)`` (the ids of
the documents joined by the separator, with one in front when ``lead``, and each document's share of them),
``identity()`` (its part of the token-cache key) and ``state()``, from which a worker process rebuilds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lm_ablate.data.common import absolute, bad, cache_root, digest, first_line, token_dtype
from lm_ablate.registry import TOKENIZERS

SEP = "\n\n"  # byte-level: joins documents; a blank line is what separates works and paragraphs anyway
EOS = "<|endoftext|>"  # our BPE's document separator (GPT-2's name for it)
BPE_FORMAT = 2  # 1: no special token, trained on the joined text; 2: <|endoftext|> at id 0, trained per document
LONG_DOC = 1 << 20  # characters: longer documents are encoded in pieces (HF Encodings cost ~100 bytes a token)
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "<|im_end|>")


def chunks(text: str, size: int = 1 << 16) -> list[str]:
    """Cut ``text`` into ~``size``-char pieces just before a newline that precedes a printable character.

    GPT-2's byte-level pre-tokenizer always makes such a newline a token of its own, so encoding the pieces
    separately (in parallel, without one huge string) gives exactly the ids of the whole text. Other
    pre-tokenizers (SentencePiece's, Llama 3's) may merge across the cut: a few ids differ at the cuts.
    """
    cut = re.compile(r"\n(?=[!-~])")
    out, start = [], 0
    while start < len(text):
        m = cut.search(text, start + size) if start + size < len(text) else None
        end = m.start() if m else len(text)
        out.append(text[start:end])
        start = end
    return out


def utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


# ------------------------------------------------------------------------------------------------ byte


class ByteTokenizer:
    """UTF-8 bytes as tokens: 256 symbols, nothing to train or store, works on any text."""

    vocab_size = 256
    # encoding runs at GB/s in one process: workers would only add pickling (bench/data_scale.py measures it)
    parallel = False

    def identity(self) -> dict:
        return {"kind": "byte"}

    def state(self) -> tuple:
        return ("byte",)

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def encode_docs(self, docs: Sequence[str], lead: bool) -> tuple[np.ndarray, np.ndarray]:
        """The bytes of ``SEP.join(docs)`` (``SEP`` first when ``lead``), exactly the former whole-text rule."""
        text = (SEP if lead else "") + SEP.join(docs)
        ids = self.encode(text)
        sizes = map(len, docs) if text.isascii() else map(utf8_len, docs)  # isascii: O(1) on a CPython str
        lens = np.fromiter(sizes, dtype=np.int64, count=len(docs)) + len(SEP)
        if not lead:
            lens[0] -= len(SEP)
        return ids, lens

    def decode(self, ids: Any) -> str:
        # windows of a stream can cut a multi-byte character: replace rather than fail when printing samples
        return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------ Hugging Face based


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` and the EOS token that separates documents."""

    parallel = True  # ~4 MB/s per core (byte-level BPE, 4k vocabulary): worth worker processes
    kind = "hf"

    def __init__(self, tok: Any, eos: str, long_doc: int = LONG_DOC):
        self.tok, self.eos, self.long_doc = tok, eos, long_doc
        self.eos_id: int = tok.token_to_id(eos)
        tok.encode_special_tokens = True  # a literal "<|endoftext|>" in a document is text, not a separator
        # ids need not be dense (added tokens can sit past the base vocabulary): the largest id decides
        self.vocab_size: int = max(tok.get_vocab(with_added_tokens=True).values()) + 1
        self.dtype = token_dtype(self.vocab_size)

    def identity(self) -> dict:
        return {"kind": self.kind, "sha256": digest(self.tok.to_str()), "eos": self.eos}

    def state(self) -> tuple:
        return ("hf", self.tok.to_str(), self.eos, self.long_doc)

    def _ids(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)]

    def encode(self, text: str) -> np.ndarray:
        return np.asarray([i for ids in self._ids(chunks(text)) for i in ids], dtype=self.dtype)

    def encode_docs(self, docs: Sequence[str], lead: bool) -> tuple[np.ndarray, np.ndarray]:
        pieces = [chunks(d, self.long_doc // 4) if len(d) > self.long_doc else [d] for d in docs]
        encoded = iter(self._ids([p for ps in pieces for p in ps]))
        out: list[int] = []
        lens = np.empty(len(docs), dtype=np.int64)
        for k, ps in enumerate(pieces):
            start = len(out)
            if k or lead:
                out.append(self.eos_id)
            for _ in ps:
                out.extend(next(encoded))
            lens[k] = len(out) - start
        return np.asarray(out, dtype=self.dtype), lens

    def decode(self, ids: Any) -> str:
        return self.tok.decode(np.asarray(ids).tolist(), skip_special_tokens=False)


class BPETokenizer(HFTokenizer):
    """Byte-level BPE (GPT-2 style) trained here: lossless on any text, no unknown id."""

    kind = "bpe"

    def __init__(self, tok: Any, path: Path | None = None):
        super().__init__(tok, EOS)
        self.path = path  # the cached JSON file it was loaded from or saved to

    @staticmethod
    def train(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        """Train from an iterator: memory grows with the distinct words, not the corpus. Same texts and size ->
        same merges (the tests train twice and compare), so a deleted file is rebuilt without changing ids."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if isinstance(texts, str):  # one text, not an iterable of its characters
            texts = [texts]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[EOS],
            show_progress=False,
        )
        # long texts in exact pieces (chunks), so no single string in Rust is larger than ~1 MB
        tok.train_from_iterator(
            (p for t in texts for p in (chunks(t, LONG_DOC // 4) if len(t) > LONG_DOC else [t])), trainer
        )
        return BPETokenizer(tok)


class PretrainedTokenizer(HFTokenizer):
    """A tokenizer someone else trained (GPT-2, Llama, OLMo...), loaded from ``data.tokenizer_path``."""

    kind = "pretrained"

    def __init__(self, tok: Any, eos: str, name: str):
        super().__init__(tok, eos)
        self.name = name


# ------------------------------------------------------------------------------------- worker processes

_WORKER: Any = None


def from_state(state: tuple) -> Any:
    """Rebuild a tokenizer from :meth:`state` (in a worker process)."""
    if state[0] == "byte":
        return ByteTokenizer()
    from tokenizers import Tokenizer

    return HFTokenizer(Tokenizer.from_str(state[1]), *state[2:])


def init_worker(state: tuple) -> None:
    """Pool initializer: one tokenizer per worker, one Rust thread each (the pool is the parallelism). A worker
    whose parent died (kill -9) exits by itself: the pool's task pipe reaches end-of-file."""
    global _WORKER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = from_state(state)


def encode_task(docs: list[str], lead: bool) -> tuple[np.ndarray, np.ndarray]:
    return _WORKER.encode_docs(docs, lead)


# ---------------------------------------------------------------------------------------------- registry


@TOKENIZERS.register("byte")
def byte_tokenizer(cfg: Any, source: Any, cache: Path) -> ByteTokenizer:
    return ByteTokenizer()


@TOKENIZERS.register("bpe", reads=("vocab_size", "tokenizer_sample"))
def bpe_tokenizer(cfg: Any, source: Any, cache: Path) -> BPETokenizer:
    """Trained on the training split only (validation text must not shape the vocabulary), cached by the source's
    identity; one run of a parallel sweep trains it while the others wait for the file."""
    from tokenizers import Tokenizer

    from lm_ablate.data.files import locked, write_atomic

    check_bpe_size(cfg)
    path = bpe_path(cfg, source, cache)
    cache_root(cfg)  # made only now that something is written to it (or one line saying why it cannot be)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_suffix(".lock")):
        if path.exists():
            return BPETokenizer(Tokenizer.from_file(str(path)), path)
        bpe = BPETokenizer.train(source.train_texts(cfg.tokenizer_sample), cfg.vocab_size)
        blob = bpe.tok.to_str().encode()
        write_atomic(path, lambda f: f.write(blob))
    bpe.path = path
    return bpe


def check_bpe_size(cfg: Any) -> None:
    if not 257 <= cfg.vocab_size <= 1 << 32:
        raise bad("data.vocab_size", cfg.vocab_size, "bpe needs 257..2**32 (<|endoftext|> + 256 bytes + merges)")


def bpe_path(cfg: Any, source: Any, cache: Path) -> Path:
    """Where the BPE of this request (data.vocab_size, data.tokenizer_sample) on this source is cached. A corpus
    with fewer distinct merges than the request gives a smaller vocabulary, so its size is read from the file."""
    spec = ["bpe", BPE_FORMAT, cfg.vocab_size, cfg.tokenizer_sample, source.identity()]
    return cache / "tokenizers" / f"{digest(spec)}.json"


@TOKENIZERS.register("pretrained", reads=("tokenizer_path",))
def pretrained_tokenizer(cfg: Any, source: Any, cache: Path) -> PretrainedTokenizer:
    return load_pretrained(cfg.tokenizer_path)


def load_pretrained(name: str | None) -> PretrainedTokenizer:
    """``data.tokenizer_path``: a tokenizer.json file, a folder, or a hub name; one-line errors.

    A tokenizer.json (given, in the folder, or the hub repo's, kept in the HF cache after the first download)
    is read with ``tokenizers`` alone: a cache hit never imports transformers. Folders and repos without one
    (SentencePiece files only) go through ``transformers.AutoTokenizer``, which converts them."""
    from tokenizers import Tokenizer

    key = "data.tokenizer_path"
    if not name:
        raise bad(key, name, "data.tokenizer=pretrained needs a tokenizer.json file, a folder or a hub name")
    path, repo_without_json = absolute(name), False
    if path.is_dir() and (path / "tokenizer.json").is_file():
        path = path / "tokenizer.json"
    elif not path.exists() and path.suffix != ".json" and not name.startswith((".", "/", "~")):
        found = _hub_file(name)
        path, repo_without_json = (path, True) if found is None else (found, False)
    if path.is_file():
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:
            raise bad(key, name, f"not a Hugging Face tokenizer.json [{first_line(e)}]") from None
        sibling = path.parent / "tokenizer_config.json"
        config = json.loads(sibling.read_text()) if sibling.is_file() else {}
    elif path.is_dir() or repo_without_json:
        tok, config = _auto(name, str(path) if path.is_dir() else name)
    else:
        raise bad(key, name, "no such file or folder")
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if eos is None or tok.token_to_id(eos) is None:
        eos = next((n for n in EOS_NAMES if tok.token_to_id(n) is not None), None)
    if eos is None:
        names = ", ".join(EOS_NAMES)
        why = f"no EOS token to separate documents (eos_token in tokenizer_config.json, or one of {names})"
        raise bad(key, name, why)
    return PretrainedTokenizer(tok, eos, name)


def _hub_file(name: str) -> Path | None:
    """The hub repo's tokenizer.json (and tokenizer_config.json beside it), or None if the repo has none.

    The HF cache first, without the network (a tokenizer downloaded once is read offline, the same file every
    run). Else ONE metadata request decides: huggingface_hub's own download retries five more times over
    ~25 s when no local copy exists (file_download.py, ``_ETAG_RETRY_TIMEOUT``), logging each retry, which
    also made Hydra create the refused run's log file; ``get_hf_file_metadata`` does not retry by default."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

    with _quiet_requests():
        with contextlib.suppress(LocalEntryNotFoundError):
            path = Path(hf_hub_download(name, "tokenizer.json", local_files_only=True))
            with contextlib.suppress(Exception):  # optional: where the EOS is named
                hf_hub_download(name, "tokenizer_config.json", local_files_only=True)
            return path
        try:
            get_hf_file_metadata(hf_hub_url(name, "tokenizer.json"))  # one HEAD request, HF_HUB_ETAG_TIMEOUT (10 s)
            path = Path(hf_hub_download(name, "tokenizer.json"))
        except RemoteEntryNotFoundError:  # the repo exists and has no such file: transformers may convert it
            return None
        except Exception as e:
            why = f"no such file or folder, and the hub has no such tokenizer (no network?) [{first_line(e)}]"
            raise bad("data.tokenizer_path", name, why) from None
        with contextlib.suppress(Exception):
            hf_hub_download(name, "tokenizer_config.json")
    return path


@contextlib.contextmanager
def _quiet_requests() -> Iterator[None]:
    """huggingface_hub's HTTP client logs every request at INFO: under Hydra that line alone creates the run's
    log file, which a refused launch must not leave behind. Warnings still pass."""
    import logging

    loggers = [logging.getLogger(name) for name in ("httpx", "httpx2")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(max(log.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def _auto(name: str, where: str) -> tuple[Any, dict]:
    """A folder or repo without tokenizer.json, through transformers (it converts SentencePiece models)."""
    from tokenizers import Tokenizer

    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(where)
    except Exception as e:
        raise bad("data.tokenizer_path", name, f"no tokenizer there [{first_line(e)}]") from None
    backend = getattr(auto, "backend_tokenizer", None)
    if backend is None:
        raise bad(
            "data.tokenizer_path", name, f"{type(auto).__name__} is a slow (Python) tokenizer; a fast one is needed"
        )
    return Tokenizer.from_str(backend.to_str()), {"eos_token": auto.eos_token}


def texts_upto(texts: Iterable[str], limit: int | None) -> Iterator[str]:
    """The texts until ``limit`` UTF-8 bytes (the last one cut there); all of them when ``limit`` is None."""
    left = limit
    for t in texts:
        if left is None:
            yield t
            continue
        n = utf8_len(t)
        if n >= left:
            yield t.encode("utf-8")[:left].decode("utf-8", errors="ignore")
            return
        left -= n
        yield t
