"""Text sources (``data=...``, registry ``DATASETS``): documents in a fixed order, read as a stream.

    option       documents                                              validation
    shakespeare  the 42 bundled works (lm_ablate/corpus/)                whole works held out (data.val_works)
    hf           local .txt (one per paragraph) / .jsonl / .json /       a named split (data.val_split), else
                 .parquet rows, or a hub dataset (downloaded, or          every k-th document (hold_out)
                 streamed with data.streaming=true)
    tokens       ids tokenized elsewhere (lm_ablate/data/pretokenized.py)

A source never holds its documents: :meth:`TextSource.streams` gives passes over them as ``(split, text)``
pairs, which the token cache (cache.py) reads once, in chunks, and :meth:`TextSource.train_texts` gives the
training documents a BPE is trained on. The split of every document is a pure function of the config, never
of a random draw, so every run of an ablation sees the same tokens.
"""

from __future__ import annotations

import codecs
import functools
import glob
import hashlib
import io
import math
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from lm_ablate.data.common import DataError, absolute, bad, first_line
from lm_ablate.data.hub import HubUnreachable, load_from_hub
from lm_ablate.data.tokenizers import texts_upto
from lm_ablate.registry import DATASETS

CORPUS = "corpus/shakespeare.tar.xz"  # inside the lm_ablate package (see lm_ablate/corpus/README.md)
EXT_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
ROWS_PER_BATCH = 1000  # rows per read from datasets (Arrow -> Python)


@dataclass
class Stream:
    """One pass over (some of) a source: ``docs()`` yields batches ``(split, texts, index)`` in a fixed order,
    ``index`` the documents' positions in the pass (batches: per-document Python work is what limits a
    byte-level fill, so sources hand over lists).

    ``cap``: (split, n) ends the pass once that split holds n tokens (its last document cut there); the
    pass's other split then keeps only the documents before the one that reached the cap, so the result never
    depends on how far ahead the reader got (the pass reads on until a batch starts past that document)."""

    docs: Callable[[], Iterator[tuple[str, list[str], np.ndarray]]]
    splits: tuple[str, ...] = ("train", "val")
    cap: tuple[str, int] | None = None


class TextSource:
    """What the token cache needs of a text source (subclasses fill in the three methods below)."""

    def identity(self) -> dict:
        """Cheap description that changes whenever the documents could (hashes, paths+sizes+mtimes...)."""
        raise NotImplementedError

    def size_hint(self) -> int | None:
        """Bytes of text a full pass reads (progress bar ETA, whether worker processes pay); None: unknown."""
        raise NotImplementedError

    def streams(self) -> list[Stream]:
        raise NotImplementedError

    def train_texts(self, limit: int | None = None) -> Iterator[str]:
        """The training documents in order (the first ``limit`` bytes of them), for training a tokenizer."""

        def texts() -> Iterator[str]:
            for stream in self.streams():
                if "train" in stream.splits:
                    for split, batch, _ in stream.docs():
                        if split == "train":
                            yield from batch

        return texts_upto(texts(), limit)


def is_held_out(i: int, fraction: float) -> bool:
    """Document i is validation when floor((i+1)·f) > floor(i·f): evenly spaced, exactly ~f of them,
    independent of any random state (every 20th document for f = 0.05)."""
    return math.floor((i + 1) * fraction) > math.floor(i * fraction)


def hold_out(docs: list, fraction: float, what: str = "documents") -> tuple[list, list]:
    """(train, val) by :func:`is_held_out`; a one-line error when nothing is held out."""
    train, val = [], []
    for i, doc in enumerate(docs):
        (val if is_held_out(i, fraction) else train).append(doc)
    if not val:
        raise bad(
            "data.val_fraction", fraction, f"holds out none of {len(docs)} {what}; raise it or set data.val_split"
        )
    return train, val


# ------------------------------------------------------------------------------------------ shakespeare


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


class ShakespeareSource(TextSource):
    """The bundled complete works; validation = whole works held out, so no scene leaks into training."""

    def __init__(self, cfg: Any):
        self.sha, works = _corpus()
        self.names = sorted(works)
        val = list(cfg.val_works)
        unknown = [w for w in val if w not in works]
        if unknown:
            raise bad("data.val_works", val, f"unknown {unknown}; allowed: {', '.join(self.names)}")
        if not val:
            raise bad("data.val_works", val, "list at least one work to hold out for validation")
        self.val = sorted(set(val))
        if len(self.val) == len(self.names):
            raise bad("data.val_works", val, "holds out every work, leaving nothing to train on")

    def identity(self) -> dict:
        return {"source": "shakespeare", "archive_sha256": self.sha, "val_works": self.val}

    def size_hint(self) -> int:
        return sum(len(t) for t in _corpus()[1].values())

    def streams(self) -> list[Stream]:
        def docs() -> Iterator[tuple[str, list[str], np.ndarray]]:
            works = _corpus()[1]
            train = [works[w] for w in self.names if w not in self.val]
            yield "train", train, np.arange(len(train))
            yield "val", [works[w] for w in self.val], np.arange(len(train), len(self.names))

        return [Stream(docs)]


@DATASETS.register("shakespeare", reads=("val_works",))
def shakespeare(cfg: Any) -> ShakespeareSource:
    return ShakespeareSource(cfg)


# ---------------------------------------------------------------------------------------------------- hf


def _split_of(file: Path, split: str) -> bool:
    """Whether a folder's file belongs to ``split``: ``train.jsonl``, ``train-00000-of-00002.parquet``..."""
    stem = file.name.split(".")[0]
    return stem == split or (stem.startswith(split) and stem[len(split)] in "-_")


def paragraph_batches(path: Path, block: int = 10 << 20) -> Iterator[list[str]]:
    """The non-empty paragraphs (blank-line separated) of a UTF-8 text file, ``block`` characters at a time.

    The same documents as ``datasets``' text builder with ``sample_by="paragraph"`` (universal newlines, split
    on "\\n\\n", empty pieces dropped; the tests compare the two), about 3x faster."""
    with open(path, encoding="utf-8") as f:
        carry = ""
        while text := f.read(block):
            parts = (carry + text + f.readline()).split("\n\n")
            carry = parts.pop()
            yield [p for p in parts if p]
        if carry:
            yield [carry]


def paragraphs(path: Path, block: int = 10 << 20) -> Iterator[str]:
    for batch in paragraph_batches(path, block):
        yield from batch


def first_bad_utf8(path: Path) -> int | None:
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


class HFSource(TextSource):
    """Anything ``datasets.load_dataset`` reads: a hub name, or local .txt / .jsonl / .json / .parquet.

    Local layout: a single file (training split only), a glob, or a folder whose files are assigned to
    ``data.train_split`` / ``data.val_split`` by name (``train*.jsonl``, ``validation*.jsonl``; the hub
    convention); in a folder with no ``train*`` file, every file is training data. A .txt file yields one
    document per paragraph (blank-line separated), so the hold-out has documents to pick from.

    Local files are read as streams (.txt by :func:`paragraphs`, the others by ``datasets`` in streaming mode):
    nothing is copied into an Arrow cache and memory does not grow with the files. A hub dataset is downloaded
    and prepared by ``datasets`` (its cache under ``data.cache_dir/hf``), or with ``data.streaming=true`` read
    over the network up to ``data.max_tokens``.
    """

    def __init__(self, cfg: Any):
        self.cfg = cfg
        if not cfg.path:
            raise bad("data.path", cfg.path, "set a hub dataset or local .txt/.jsonl/.json/.parquet file(s)")
        if cfg.val_split is None and not 0.0 < cfg.val_fraction < 1.0:
            raise bad("data.val_fraction", cfg.val_fraction, "must be in (0, 1) when data.val_split is null")
        if cfg.max_docs is not None and cfg.max_docs < 1:
            raise bad("data.max_docs", cfg.max_docs, "must be a positive integer or null")
        self.files = self._local_files()  # None: a hub name
        if self.files is not None and cfg.streaming:
            raise bad("data.streaming", cfg.streaming, "streams hub datasets; local files are always read as streams")

    def _fail(self, why: str) -> DataError:
        return DataError(f"data.path={self.cfg.path!r}: {why}")

    def _local_files(self) -> dict[str, list[Path]] | None:
        cfg, path = self.cfg, self.cfg.path
        assert path is not None
        p = absolute(path)
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
        if self.builder == "text" and cfg.text_field != "text":  # it would be ignored: say so rather than train
            why = "a .txt file has no columns (one document per paragraph); it names the text column of .jsonl, .json, .parquet rows and hub datasets"
            raise bad("data.text_field", cfg.text_field, why)
        if not p.is_dir():
            if cfg.val_split is not None:
                raise bad("data.val_split", cfg.val_split, "needs a folder of split files or a hub dataset")
            return {cfg.train_split: files}
        train = [f for f in files if _split_of(f, cfg.train_split)]
        if cfg.val_split is None:
            return {cfg.train_split: train or files}
        val = [f for f in files if _split_of(f, cfg.val_split)]
        if not val or not train:
            split, what = (cfg.val_split, "val_split") if not val else (cfg.train_split, "train_split")
            names = ", ".join(f.name for f in files)
            why = f"no file named {split}* in data.path={path!r} (files: {names})"
            raise bad(f"data.{what}", split, why)
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
        if cfg.max_tokens is not None:  # new keys only when set: caches made before they existed stay valid
            ident.update(max_tokens=cfg.max_tokens, val_fraction=cfg.val_fraction)
        if self.files is None:
            ident.update(hub=cfg.path, hf_config=cfg.hf_config)
            if cfg.streaming:
                ident["streaming"] = True
        else:
            ident["builder"] = self.builder
            ident["files"] = {
                split: [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
                for split, files in self.files.items()
            }
        return ident

    def size_hint(self) -> int | None:
        if self.files is None:
            return None
        return sum(f.stat().st_size for files in self.files.values() for f in files)

    # -- reading ---------------------------------------------------------------------------------------

    def streams(self) -> list[Stream]:
        cfg = self.cfg
        train = functools.partial(self._texts, cfg.train_split, "data.train_split")
        if cfg.val_split is None:
            fraction = cfg.val_fraction  # read once: a DictConfig lookup costs ~100 us

            def mixed() -> Iterator[tuple[str, list[str], np.ndarray]]:
                n = 0
                for texts in train():
                    index = np.arange(n, n + len(texts))
                    held = np.floor((index + 1) * fraction) > np.floor(index * fraction)  # is_held_out, vectorized
                    val, kept = np.flatnonzero(held), np.flatnonzero(~held)
                    yield "train", [texts[i] for i in kept], index[kept]
                    yield "val", [texts[i] for i in val], index[val]
                    n += len(texts)
                if math.floor(n * fraction) == 0:  # read to the end, and no document was held out
                    why = f"holds out none of {n} documents; raise it or set data.val_split"
                    raise bad("data.val_fraction", fraction, why)

            return [Stream(mixed, cap=None if cfg.max_tokens is None else ("train", cfg.max_tokens))]
        val = functools.partial(self._texts, cfg.val_split, "data.val_split")
        val_cap = None if cfg.max_tokens is None else ("val", max(1, round(cfg.val_fraction * cfg.max_tokens)))
        train_cap = None if cfg.max_tokens is None else ("train", cfg.max_tokens)
        return [
            Stream(_numbered("train", train), ("train",), train_cap),
            Stream(_numbered("val", val), ("val",), val_cap),
        ]

    def _texts(self, split: str, key: str) -> Iterator[list[str]]:
        """Batches of the non-blank texts of ``split`` (blank rows, which wikitext has many of, are dropped),
        after at most ``data.max_docs`` rows; a one-line error for an empty split."""
        cfg, n, left = self.cfg, 0, self.cfg.max_docs
        for rows in self._rows(split, key):
            if left is not None:
                rows, left = rows[:left], left - len(rows[:left])
            texts = [t for t in rows if t and not t.isspace()]
            n += len(texts)
            if texts:
                yield texts
            if left == 0:
                break
        if not n:
            raise self._fail(f"split {split!r} has no text in column {cfg.text_field!r} (empty or blank)")

    def _rows(self, split: str, key: str) -> Iterator[list[Any]]:
        if self.files is None:
            yield from self._hub_rows(split, key)
        elif self.builder == "text":
            for f in self.files[split]:
                try:
                    yield from paragraph_batches(f)
                except UnicodeDecodeError:
                    raise self._fail(
                        f"file {str(f)!r} is not UTF-8 text (bad byte at offset {first_bad_utf8(f)})"
                    ) from None
        else:
            import datasets

            files = {split: [str(f) for f in self.files[split]]}
            try:
                ds = datasets.load_dataset(self.builder, data_files=files, split=split, streaming=True)
                yield from self._column(ds, split)
            except DataError:
                raise
            except Exception as e:
                raise self._fail(f"could not read the {self.builder} file(s) [{first_line(e)}]") from None

    def _hub_rows(self, split: str, key: str) -> Iterator[list[Any]]:
        cfg = self.cfg
        cache = str(absolute(cfg.cache_dir) / "hf")
        hub_why = "could not load from the Hugging Face hub (no network?) and no local file of that name exists"
        if cfg.streaming:
            try:
                ds = load_from_hub(cfg.path, cfg.hf_config, split=split, streaming=True, cache_dir=cache)
            except HubUnreachable as e:
                raise self._fail(f"{hub_why} [{e}]") from None
            except ValueError as e:
                if "split" in str(e).lower():
                    raise bad(key, split, f"no such split in data.path={cfg.path!r} [{first_line(e)}]") from None
                raise self._fail(f"{hub_why} [{first_line(e)}]") from None
            except Exception as e:
                raise self._fail(f"{hub_why} [{first_line(e)}]") from None
            yield from self._column(ds, split)
            return
        dd = self._downloaded(cache, hub_why)
        if split not in dd:
            raise bad(key, split, f"no such split in data.path={cfg.path!r}; splits: {', '.join(dd)}")
        ds = dd[split]
        field = cfg.text_field
        if field not in ds.column_names:
            raise bad("data.text_field", field, f"no such column; columns: {', '.join(ds.column_names)}")
        if getattr(ds.features[field], "dtype", None) not in ("string", "large_string"):
            raise bad("data.text_field", field, f"column holds {ds.features[field]}, not text")
        if cfg.max_docs is not None:
            ds = ds.select(range(min(cfg.max_docs, len(ds))))
        for batch in ds.select_columns([field]).iter(batch_size=ROWS_PER_BATCH):
            yield batch[field]

    def _downloaded(self, cache: str, why: str) -> Any:
        """The DatasetDict, downloaded and prepared once per source (both splits read it); from the cache alone
        when the hub does not answer (lm_ablate/data/hub.py: one request, no retries)."""
        if getattr(self, "_dd", None) is None:
            try:
                self._dd = load_from_hub(self.cfg.path, self.cfg.hf_config, cache_dir=cache)
            except HubUnreachable as e:
                raise self._fail(f"{why} [{e}]") from None
            except Exception as e:
                raise self._fail(f"{why} [{first_line(e)}]") from None
        return self._dd

    def _column(self, ds: Any, split: str) -> Iterator[list[Any]]:
        """The text column of a streamed (Iterable) dataset, checked on its first batch."""
        field, checked = self.cfg.text_field, False
        for batch in ds.iter(batch_size=ROWS_PER_BATCH):
            if not checked:
                if field not in batch:
                    raise bad("data.text_field", field, f"no such column; columns: {', '.join(batch)}")
                kinds = sorted({type(v).__name__ for v in batch[field] if v is not None and not isinstance(v, str)})
                if kinds:
                    raise bad("data.text_field", field, f"column holds {', '.join(kinds)}, not text")
                checked = True
            yield batch[field]


def _numbered(split: str, batches: Callable[[], Iterator[list[str]]]) -> Callable[[], Iterator[tuple]]:
    """A one-split stream: each batch with its documents' positions."""

    def docs() -> Iterator[tuple[str, list[str], np.ndarray]]:
        n = 0
        for texts in batches():
            yield split, texts, np.arange(n, n + len(texts))
            n += len(texts)

    return docs


@DATASETS.register(
    "hf",
    reads=(
        "path",
        "hf_config",
        "text_field",
        "train_split",
        "val_split",
        "val_fraction",
        "max_docs",
        "streaming",
        "max_tokens",
    ),
)
def hf(cfg: Any) -> HFSource:
    return HFSource(cfg)
