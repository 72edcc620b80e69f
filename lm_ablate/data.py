"""Data: text sources, tokenizers, a content-keyed token cache, and stateless batching.

Every run of an ablation must see the same tokens, so everything here is a pure function of the config:

* the validation split is fixed (held-out works, a named split, or every k-th document; never a random draw);
* the token cache is keyed by a hash of (source identity, split settings, tokenizer), so the runs of a sweep
  share one tokenization, and files are written atomically so parallel runs may race for it;
* :func:`get_batch` draws its offsets from ``(seed, step)`` alone, so a run resumed at step ``s`` continues
  with exactly the batches it would have seen, and :func:`val_batches` is the same for every run and seed.

Sources live in the ``DATASETS`` registry (``shakespeare``, ``hf``) and tokenizers in ``TOKENIZERS``
(``byte``, ``bpe``); :func:`load_data` is the only entry point the training loop needs.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import glob
import hashlib
import io
import json
import math
import os
import re
import tarfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from lm_ablate.config import ConfigError, DataConfig
from lm_ablate.registry import DATASETS, TOKENIZERS

SEP = "\n\n"  # joins documents into one stream; a blank line is what separates works and paragraphs anyway
FORMAT = 1  # part of every cache key: bump it when the text assembly or the cache layout changes
CORPUS = "corpus/shakespeare.tar.xz"  # inside the lm_ablate package (see lm_ablate/corpus/README.md)
EXT_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataError(ConfigError):
    """A data problem the user can fix in the config or on disk; one line naming the ``data.*`` key."""


def _bad(key: str, value: Any, allowed: str) -> DataError:
    """:func:`lm_ablate.config.bad`'s one-line format, as a DataError so callers can tell data problems."""
    return DataError(f"{key}={value!r} is invalid: {allowed}")


@dataclass
class TokenData:
    train: np.ndarray  # 1-D token ids (read-only memmap of the cache)
    val: np.ndarray
    vocab_size: int
    tokenizer: Any  # ByteTokenizer | BPETokenizer: vocab_size, encode(text), decode(ids)
    key: str  # the cache hash: identity of source, split settings and tokenizer


# ----------------------------------------------------------------------------------------------- helpers


def _digest(obj: Any) -> str:
    """Short stable hash of a JSON-able object (sorted keys, so dict order never changes a key)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _abs(path: str) -> Path:
    """Absolute path against the launch directory, so a Hydra run that chdirs still finds the same files."""
    from hydra.utils import to_absolute_path

    return Path(to_absolute_path(os.path.expanduser(path)))


def _write_atomic(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """Write to a unique temp name in the same folder, then rename: readers see no file or a whole one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive advisory lock so the runs of a parallel sweep tokenize once; a no-op where flock is missing.

    Correctness never depends on it (writes are atomic and deterministic); it only saves duplicate work.
    """
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks: fall back to racing, which is safe
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _chunks(text: str, size: int = 1 << 16) -> list[str]:
    """Cut ``text`` into ~``size``-char pieces just before a newline that precedes a printable character.

    The byte-level pre-tokenizer always makes such a newline a token of its own, so encoding the pieces
    separately (in parallel, and without one huge string in Rust) gives exactly the ids of the whole text.
    """
    cut = re.compile(r"\n(?=[!-~])")
    out, start = [], 0
    while start < len(text):
        m = cut.search(text, start + size) if start + size < len(text) else None
        end = m.start() if m else len(text)
        out.append(text[start:end])
        start = end
    return out


# ------------------------------------------------------------------------------------------- tokenizers


@dataclass(frozen=True)
class TrainText:
    """The training split's text for a tokenizer: its hash now, the text itself only if needed (lazy).

    On a token-cache hit the text is never assembled unless a BPE file has to be retrained.
    """

    sha256: str
    get: Callable[[], str]


class ByteTokenizer:
    """UTF-8 bytes as tokens: 256 symbols, nothing to train or store, works on any text."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        # windows of a stream can cut a multi-byte character: replace rather than fail when printing samples
        return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) from Hugging Face ``tokenizers``: lossless on any text, no unknown id."""

    def __init__(self, tok: Any, path: Path | None = None):
        self.tok = tok
        self.path = path  # the cached JSON file it was loaded from or saved to
        self.vocab_size: int = tok.get_vocab_size()

    @staticmethod
    def train(text: str, vocab_size: int) -> BPETokenizer:
        """Same text and size -> same merges (the tests train twice and compare), so the cached file can be
        rebuilt if deleted without changing any cached token ids."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        tok.train_from_iterator(_chunks(text), trainer)
        return BPETokenizer(tok)

    def encode(self, text: str) -> np.ndarray:
        ids = [i for enc in self.tok.encode_batch(_chunks(text)) for i in enc.ids]
        return np.asarray(ids, dtype=np.uint32)

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        return self.tok.decode(np.asarray(ids).tolist())


@TOKENIZERS.register("byte")
def byte_tokenizer(cfg: DataConfig, train: TrainText, cache_dir: Path) -> ByteTokenizer:
    return ByteTokenizer()


@TOKENIZERS.register("bpe")
def bpe_tokenizer(cfg: DataConfig, train: TrainText, cache_dir: Path) -> BPETokenizer:
    """Train on the training split only (validation text must not shape the vocabulary), cached by content."""
    from tokenizers import Tokenizer

    if not 257 <= cfg.vocab_size <= 1 << 32:
        raise _bad("data.vocab_size", cfg.vocab_size, "bpe needs 257..2**32 (256 byte symbols + merges)")
    path = cache_dir / "tokenizers" / f"{_digest(['bpe', cfg.vocab_size, train.sha256, FORMAT])}.json"
    if path.exists():
        return BPETokenizer(Tokenizer.from_file(str(path)), path)
    bpe = BPETokenizer.train(train.get(), cfg.vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = bpe.tok.to_str().encode()
    _write_atomic(path, lambda f: f.write(blob))
    bpe.path = path
    return bpe


# ---------------------------------------------------------------------------------------------- sources


class Source(Protocol):
    def identity(self) -> dict:
        """Cheap description that changes whenever the documents could (hashes, paths+sizes+mtimes...)."""
        ...

    def documents(self) -> tuple[list[str], list[str]]:
        """(train documents, validation documents), in a fixed order."""
        ...


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[str, dict[str, str]]:
    """(sha256 of the bundled archive, {work: text}), read in memory: nothing is extracted to disk."""
    raw = resources.files("lm_ablate").joinpath(CORPUS).read_bytes()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:xz") as tar:
        works = {}
        for member in tar.getmembers():
            f = tar.extractfile(member)
            if f is not None:
                works[member.name.removesuffix(".txt")] = f.read().decode("utf-8")
    return hashlib.sha256(raw).hexdigest(), works


def shakespeare_works() -> dict[str, str]:
    """The 42 bundled works of Shakespeare, ``{work: text}`` in sorted order."""
    return dict(_corpus()[1])


class ShakespeareSource:
    """The bundled complete works; validation = whole works held out, so no scene leaks into training."""

    def __init__(self, cfg: DataConfig):
        self.sha, works = _corpus()
        self.names = sorted(works)
        val = list(cfg.val_works)
        unknown = [w for w in val if w not in works]
        if unknown:
            raise _bad("data.val_works", val, f"unknown {unknown}; allowed: {', '.join(self.names)}")
        if not val:
            raise _bad("data.val_works", val, "list at least one work to hold out for validation")
        self.val = sorted(set(val))
        if len(self.val) == len(self.names):
            raise _bad("data.val_works", val, "holds out every work, leaving nothing to train on")

    def identity(self) -> dict:
        return {"source": "shakespeare", "archive_sha256": self.sha, "val_works": self.val}

    def documents(self) -> tuple[list[str], list[str]]:
        works = _corpus()[1]
        return [works[w] for w in self.names if w not in self.val], [works[w] for w in self.val]


@DATASETS.register("shakespeare")
def shakespeare(cfg: DataConfig) -> ShakespeareSource:
    return ShakespeareSource(cfg)


def _split_of(file: Path, split: str) -> bool:
    """Whether a folder's file belongs to ``split``: ``train.jsonl``, ``train-00000-of-00002.parquet``..."""
    stem = file.name.split(".")[0]
    return stem == split or (stem.startswith(split) and stem[len(split)] in "-_")


class HFSource:
    """Anything ``datasets.load_dataset`` reads: a hub name, or local .txt / .jsonl / .json / .parquet.

    Local layout: a single file (training split only), a glob, or a folder whose files are assigned to
    ``data.train_split`` / ``data.val_split`` by name (``train*.jsonl``, ``validation*.jsonl``; the hub
    convention); in a folder with no ``train*`` file, every file is training data. A .txt file yields one
    document per paragraph (blank-line separated), so the hold-out has documents to pick from.
    """

    def __init__(self, cfg: DataConfig):
        self.cfg = cfg
        if not cfg.path:
            raise _bad("data.path", cfg.path, "set a hub dataset or local .txt/.jsonl/.json/.parquet file(s)")
        if cfg.val_split is None and not 0.0 < cfg.val_fraction < 1.0:
            raise _bad("data.val_fraction", cfg.val_fraction, "must be in (0, 1) when data.val_split is null")
        if cfg.max_docs is not None and cfg.max_docs < 1:
            raise _bad("data.max_docs", cfg.max_docs, "must be a positive integer or null")
        self.files = self._local_files()  # None: a hub name

    def _fail(self, why: str) -> DataError:
        return DataError(f"data.path={self.cfg.path!r}: {why}")

    def _local_files(self) -> dict[str, list[Path]] | None:
        cfg, path = self.cfg, self.cfg.path
        assert path is not None
        p = _abs(path)
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in EXT_BUILDERS)
            if not files:
                raise self._fail("the folder holds no .txt, .jsonl, .json or .parquet file")
        elif p.is_file():
            files = [p]
        elif glob.has_magic(path):
            files = sorted(Path(f) for f in glob.glob(str(p)) if Path(f).is_file())
            if not files:
                raise self._fail("no file matches this pattern")
        elif p.suffix.lower() in EXT_BUILDERS or path.startswith((".", "/", "~")):
            raise self._fail("no such file or folder")
        else:
            return None
        kinds = {EXT_BUILDERS.get(f.suffix.lower()) for f in files}
        if None in kinds:
            bad_ext = sorted({f.suffix for f in files if f.suffix.lower() not in EXT_BUILDERS})
            raise self._fail(f"unsupported file type {bad_ext}; allowed: {', '.join(EXT_BUILDERS)}")
        if len(kinds) > 1:
            raise self._fail(f"mixes file kinds {sorted(f.suffix for f in files)}; keep to one kind")
        for f in files:
            if f.stat().st_size == 0:
                raise self._fail(f"file {str(f)!r} is empty")
        self.builder = kinds.pop()
        if not p.is_dir():
            if cfg.val_split is not None:
                raise _bad("data.val_split", cfg.val_split, "needs a folder of split files or a hub dataset")
            return {cfg.train_split: files}
        train = [f for f in files if _split_of(f, cfg.train_split)]
        if cfg.val_split is None:
            return {cfg.train_split: train or files}
        val = [f for f in files if _split_of(f, cfg.val_split)]
        if not val or not train:
            split, what = (cfg.val_split, "val_split") if not val else (cfg.train_split, "train_split")
            names = ", ".join(f.name for f in files)
            why = f"no file named {split}* in data.path={path!r} (files: {names})"
            raise _bad(f"data.{what}", split, why)
        return {cfg.train_split: train, cfg.val_split: val}

    def identity(self) -> dict:
        cfg = self.cfg
        ident: dict[str, Any] = {
            "source": "hf",
            "text_field": cfg.text_field,
            "train_split": cfg.train_split,
            "val_split": cfg.val_split,
            "val_fraction": cfg.val_fraction if cfg.val_split is None else None,
            "max_docs": cfg.max_docs,
        }
        if self.files is None:
            ident.update(hub=cfg.path, hf_config=cfg.hf_config)
        else:
            ident["builder"] = self.builder
            ident["files"] = {
                split: [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
                for split, files in self.files.items()
            }
        return ident

    def _load(self) -> Any:
        """The DatasetDict; every failure becomes a one-line DataError."""
        import datasets

        cfg = self.cfg
        cache = str(_abs(cfg.cache_dir) / "hf")
        if self.files is None:
            try:
                return datasets.load_dataset(cfg.path, cfg.hf_config, cache_dir=cache)
            except Exception as e:
                hub = "could not load from the Hugging Face hub (no network?)"
                raise self._fail(f"{hub} and no local file of that name exists [{_first_line(e)}]") from e
        files = {split: [str(f) for f in fs] for split, fs in self.files.items()}
        extra = {"sample_by": "paragraph"} if self.builder == "text" else {}
        try:
            return datasets.load_dataset(self.builder, data_files=files, cache_dir=cache, **extra)
        except Exception as e:
            if self.builder == "text":
                for f in (f for fs in self.files.values() for f in fs):
                    offset = _first_bad_utf8(f)
                    if offset is not None:
                        why = f"file {str(f)!r} is not UTF-8 text (bad byte at offset {offset})"
                        raise self._fail(why) from e
            raise self._fail(f"could not read the {self.builder} file(s) [{_first_line(e)}]") from e

    def _texts(self, dd: Any, split: str, key: str) -> list[str]:
        cfg = self.cfg
        if split not in dd:
            raise _bad(key, split, f"no such split in data.path={cfg.path!r}; splits: {', '.join(dd)}")
        ds = dd[split]
        field = cfg.text_field
        if field not in ds.column_names:
            raise _bad("data.text_field", field, f"no such column; columns: {', '.join(ds.column_names)}")
        if getattr(ds.features[field], "dtype", None) not in ("string", "large_string"):
            raise _bad("data.text_field", field, f"column holds {ds.features[field]}, not text")
        if cfg.max_docs is not None:
            ds = ds.select(range(min(cfg.max_docs, len(ds))))
        docs = [t for t in ds[field] if t and t.strip()]  # blank rows (wikitext has many): dropped
        if not docs:
            raise self._fail(f"split {split!r} has no text in column {field!r} (empty or blank)")
        return docs

    def documents(self) -> tuple[list[str], list[str]]:
        cfg = self.cfg
        dd = self._load()
        train = self._texts(dd, cfg.train_split, "data.train_split")
        if cfg.val_split is not None:
            return train, self._texts(dd, cfg.val_split, "data.val_split")
        return hold_out(train, cfg.val_fraction)


def _first_line(e: Exception) -> str:
    """``Type: first line of the message``, so a wrapped library error keeps our messages one line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def _first_bad_utf8(path: Path) -> int | None:
    """Byte offset of the first invalid UTF-8 sequence in ``path``, or None if it decodes."""
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                return offset + e.start
            offset += len(block)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return offset
    return None


def hold_out(docs: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """(train, val): document i goes to val when floor((i+1)·f) > floor(i·f), i.e. evenly spaced, exactly
    ~f of them, independent of any random state (every 20th document for f = 0.05)."""
    train, val = [], []
    for i, doc in enumerate(docs):
        (val if math.floor((i + 1) * fraction) > math.floor(i * fraction) else train).append(doc)
    if not val:
        why = f"holds out none of {len(docs)} documents; raise it or set data.val_split"
        raise _bad("data.val_fraction", fraction, why)
    return train, val


@DATASETS.register("hf")
def hf(cfg: DataConfig) -> HFSource:
    return HFSource(cfg)


# ------------------------------------------------------------------------------------------ token cache


def _dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def _open_cached(folder: Path) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """(meta, train, val) memmaps if a complete cache entry is there (meta.json is written last)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        dtype = np.dtype(meta["dtype"])
        arrays = []
        for split in ("train", "val"):
            path = folder / f"{split}.bin"
            if path.stat().st_size != meta[f"{split}_tokens"] * dtype.itemsize:
                return None
            arrays.append(np.memmap(path, dtype=dtype, mode="r"))
        return meta, arrays[0], arrays[1]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_data(cfg: DataConfig) -> TokenData:
    """Tokenized train/val splits for ``cfg`` (a DataConfig or the ``data`` node of the Hydra config).

    Tokenizes once per (source, split settings, tokenizer) and memory-maps the result thereafter.
    """
    TOKENIZERS.check("data.tokenizer", cfg.tokenizer)
    source: Source = DATASETS.build(cfg)
    tok_spec: dict[str, Any] = {"kind": cfg.tokenizer}
    if cfg.tokenizer != "byte":
        tok_spec["vocab_size"] = cfg.vocab_size
    key = _digest({"format": FORMAT, "sep": SEP, "source": source.identity(), "tokenizer": tok_spec})
    cache = _abs(cfg.cache_dir)
    folder = cache / "tokens" / key
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = f"cannot create the token cache there ({_first_line(e)}); allowed: a writable folder"
        raise _bad("data.cache_dir", cfg.cache_dir, why) from None
    make_tokenizer = TOKENIZERS.get(cfg.tokenizer)
    with _locked(folder.parent / f"{key}.lock"):
        hit = _open_cached(folder)
        if hit is not None:
            meta, train, val = hit

            def train_text() -> str:
                return SEP.join(source.documents()[0])

            tokenizer = make_tokenizer(cfg, TrainText(meta["train_text_sha256"], train_text), cache)
            return TokenData(train, val, meta["vocab_size"], tokenizer, key)
        train_docs, val_docs = source.documents()
        texts = {"train": SEP.join(train_docs), "val": SEP.join(val_docs)}
        for split, text in texts.items():
            if not text:
                raise DataError(f"data.path={cfg.path!r} (data={cfg.name}): the {split} split holds no text")
        sha = _sha256(texts["train"])
        tokenizer = make_tokenizer(cfg, TrainText(sha, lambda: texts["train"]), cache)
        dtype = np.dtype(_dtype(tokenizer.vocab_size))
        counts = {}
        for split, text in texts.items():
            ids = np.asarray(tokenizer.encode(text)).astype(dtype, copy=False)
            counts[split] = int(ids.size)
            _write_atomic(folder / f"{split}.bin", ids.tofile)
        meta = {
            "format": FORMAT,
            "key": key,
            "identity": source.identity(),
            "tokenizer": tok_spec,
            "vocab_size": tokenizer.vocab_size,
            "dtype": dtype.name,
            "train_tokens": counts["train"],
            "val_tokens": counts["val"],
            "train_docs": len(train_docs),
            "val_docs": len(val_docs),
            "train_text_sha256": sha,
        }
        blob = json.dumps(meta, indent=1, sort_keys=True).encode()
        _write_atomic(folder / "meta.json", lambda f: f.write(blob))
        hit = _open_cached(folder)
        assert hit is not None, f"token cache {folder} unreadable right after writing it"
        return TokenData(hit[1], hit[2], tokenizer.vocab_size, tokenizer, key)


# --------------------------------------------------------------------------------------------- batching


def check_length(data: TokenData, context: int) -> None:
    """Fail at start, not at the first batch, when a split cannot hold one (context + 1)-token window."""
    for split, tokens in (("train", data.train), ("val", data.val)):
        if len(tokens) < context + 1:
            why = (
                f"the {split} split has only {len(tokens)} tokens (needs context + 1 = {context + 1}); "
                "use a smaller model.context or more data"
            )
            raise _bad("model.context", context, why)


def _need(tokens: np.ndarray, context: int) -> None:
    if len(tokens) < context + 1:
        raise _bad("model.context", context, f"the split has only {len(tokens)} tokens (needs context + 1)")


def _windows(tokens: np.ndarray, starts: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(context + 1)
    buf = torch.from_numpy(np.asarray(tokens[idx]).astype(np.int64))
    return buf[:, :-1], buf[:, 1:]


def get_batch(
    tokens: np.ndarray, batch_size: int, context: int, seed: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) int64 [batch_size, context] with y = x shifted by one, from offsets drawn by
    ``default_rng([seed, step])``: stateless, so resuming at ``step`` reproduces the uninterrupted run."""
    if seed < 0 or step < 0:
        raise _bad("seed", seed, "seed and step must be >= 0 (they seed numpy's SeedSequence)")
    _need(tokens, context)
    starts = np.random.default_rng([seed, step]).integers(0, len(tokens) - context, size=batch_size)
    return _windows(tokens, starts, context)


def val_batches(
    tokens: np.ndarray, batch_size: int, context: int, n_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed evaluation batches: ``batch_size * n_batches`` evenly spaced windows over the whole split, no
    randomness, so every arm and seed is scored on the same tokens."""
    _need(tokens, context)
    starts = np.linspace(0, len(tokens) - context - 1, num=batch_size * n_batches).round().astype(np.int64)
    return [_windows(tokens, s, context) for s in starts.reshape(n_batches, batch_size)]
