"""Pre-tokenized corpora (``data=tokens``): ids someone else made, memory-mapped where they lie, never copied.

    file                                    layout                              dtype
    *.bin   (nanoGPT's prepare.py)          headerless 1-D ids                  data.dtype: uint16 | uint32
    *.npy   with numpy's header             a 1-D array                         from the header
    *.npy   without one (OLMo, Dolma)       headerless 1-D ids (np.memmap)      data.dtype

``data.path`` is a file, a folder or a glob. Splits follow the file names: ``data.train_split*`` and
``data.val_split*`` (nanoGPT's ``train.bin`` / ``val.bin`` with the defaults of conf/data/tokens.yaml); with
``data.val_split=null`` every k-th shard (``data.val_fraction``, the :func:`hold_out` rule) is validation, and a
single training file is cut instead: its last ``data.val_fraction`` of tokens is validation (:func:`tail_cut`,
as nanoGPT's data/shakespeare_char/prepare.py splits its one text 90/10).
The shards of a split are read as one stream (:class:`TokenShards`) in file-name order. Every id is checked
once against ``data.vocab_size`` by a chunked scan whose result is cached by file identity, so a sweep pays it
once; the tokenizer is only for printing samples (``data.tokenizer=pretrained`` with ``data.tokenizer_path``).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

import numpy as np

from lm_ablate.data.batching import TokenShards
from lm_ablate.data.common import DataError, TokenData, absolute, bad, digest
from lm_ablate.data.sources import _split_of, hold_out
from lm_ablate.registry import DATASETS

EXTENSIONS = (".bin", ".npy")
DTYPES = ("uint16", "uint32")
SCAN_BYTES = 64 << 20  # the id check reads this much at a time into one reused buffer


class IdsTokenizer:
    """Stands in for the unknown tokenizer of a pre-tokenized corpus: decodes to the ids themselves."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> np.ndarray:
        raise DataError(
            "data=tokens has no tokenizer to encode text; set data.tokenizer=pretrained data.tokenizer_path=..."
        )

    def decode(self, ids: Any) -> str:
        return " ".join(str(i) for i in np.asarray(ids).tolist())


def open_shard(path: Path, dtype: str) -> np.memmap:
    """A read-only memmap of one shard; one-line errors for sizes, shapes and types that cannot be ids."""
    name = str(path)
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"data.path: file {name!r} is empty")
    with open(path, "rb") as f:
        numpy_header = f.read(6) == b"\x93NUMPY"
    if numpy_header:
        try:
            arr = np.load(path, mmap_mode="r")
        except ValueError as e:
            raise DataError(f"data.path: file {name!r} is not a readable .npy array ({e})") from None
        if arr.ndim != 1 or arr.dtype.kind not in "ui":
            raise DataError(
                f"data.path: file {name!r} holds a {arr.ndim}-D {arr.dtype} array; 1-D integer ids expected"
            )
        return arr
    itemsize = np.dtype(dtype).itemsize
    if size % itemsize:
        why = f"file {name!r} has {size} bytes, not a multiple of {itemsize}: another dtype, or a damaged file"
        raise bad("data.dtype", dtype, why)
    return np.memmap(path, dtype=dtype, mode="r")


def id_range(path: Path, arr: np.memmap, cache: Path) -> tuple[int, int]:
    """(smallest, largest) id of a shard, read through one reused buffer (no growing page cache in our RSS) and
    cached by (path, size, mtime, dtype)."""
    stat = path.stat()
    record = (
        cache / "checked" / f"{digest([str(path), stat.st_size, stat.st_mtime_ns, arr.dtype.str, arr.offset])}.json"
    )
    try:
        found = json.loads(record.read_text())
        return found["min"], found["max"]
    except (OSError, ValueError, KeyError):
        pass
    lo, hi = None, None
    buf = np.empty(max(1, SCAN_BYTES // arr.dtype.itemsize), dtype=arr.dtype)
    with open(path, "rb") as f:
        f.seek(arr.offset)
        while n := f.readinto(memoryview(buf).cast("B")) // arr.dtype.itemsize:
            part = buf[:n]
            lo = int(part.min()) if lo is None else min(lo, int(part.min()))
            hi = int(part.max()) if hi is None else max(hi, int(part.max()))
    assert lo is not None and hi is not None
    from lm_ablate.data.files import write_atomic

    record.parent.mkdir(parents=True, exist_ok=True)
    blob = json.dumps({"min": lo, "max": hi, "file": str(path)}).encode()
    write_atomic(record, lambda f: f.write(blob))
    return lo, hi


class TokensSource:
    """nanoGPT / OLMo-style token files as the train and val splits (see the module docstring)."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        if cfg.dtype not in DTYPES:
            raise bad("data.dtype", cfg.dtype, f"allowed: {', '.join(DTYPES)}")
        if not cfg.path:
            raise bad("data.path", cfg.path, "set a folder, file(s) or glob of .bin / .npy token files")
        if cfg.tokenizer == "bpe":
            why = "data=tokens reads ids made elsewhere; allowed: pretrained (data.tokenizer_path to decode samples), byte"
            raise bad("data.tokenizer", cfg.tokenizer, why)
        if cfg.val_split is None and not 0.0 < cfg.val_fraction < 1.0:
            raise bad("data.val_fraction", cfg.val_fraction, "must be in (0, 1) when data.val_split is null")
        self.tail: float | None = None  # a single training file: the share of its tokens at the end held out
        self.splits = self._layout(self._files())

    def _files(self) -> list[Path]:
        path = self.cfg.path
        p = absolute(path)
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in EXTENSIONS)
            if not files:
                raise bad("data.path", path, "the folder holds no .bin or .npy file")
            return files
        if p.is_file():
            files = [p]
        elif glob.has_magic(path):
            files = sorted(Path(f) for f in glob.glob(str(p)) if Path(f).is_file())
            if not files:
                raise bad("data.path", path, "no file matches this pattern")
        else:
            raise bad("data.path", path, "no such file or folder")
        others = sorted({f.suffix for f in files if f.suffix.lower() not in EXTENSIONS})
        if others:
            raise bad("data.path", path, f"unsupported file type {others}; allowed: {', '.join(EXTENSIONS)}")
        return files

    def _layout(self, files: list[Path]) -> dict[str, list[Path]]:
        cfg = self.cfg
        val = [f for f in files if cfg.val_split is not None and _split_of(f, cfg.val_split)]
        train = [f for f in files if _split_of(f, cfg.train_split)] or [f for f in files if f not in val]
        names = ", ".join(f.name for f in files)
        if cfg.val_split is not None and not val:
            one = len(files) == 1
            held = "the last data.val_fraction of its tokens" if one else "every k-th shard (data.val_fraction)"
            why = f"no file named {cfg.val_split}* among {names}; name one so, or set data.val_split=null to hold out {held}"
            raise bad("data.val_split", cfg.val_split, why)
        if not train:
            raise bad("data.train_split", cfg.train_split, f"no training file among {names}")
        if cfg.val_split is None and len(train) == 1:  # one file: its tail is validation
            self.tail = cfg.val_fraction
            return {"train": train, "val": []}
        if cfg.val_split is None:
            train, val = hold_out(train, cfg.val_fraction, what="shards")
        return {"train": train, "val": val}

    def identity(self) -> dict:
        cfg = self.cfg
        files = {
            split: [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in fs] for split, fs in self.splits.items()
        }
        ident = {"source": "tokens", "files": files, "dtype": cfg.dtype, "vocab_size": cfg.vocab_size}
        return ident if self.tail is None else {**ident, "val_tail": self.tail}

    def token_data(self, tokenizer: Any, cache: Path) -> TokenData:
        cfg = self.cfg
        arrays = {}
        for split, files in self.splits.items():
            if not files:  # the validation split of a single file: its tail, cut below
                continue
            shards = []
            for f in files:
                arr = open_shard(f, cfg.dtype)
                lo, hi = id_range(f, arr, cache)
                if hi >= cfg.vocab_size:
                    why = f"file {str(f)!r} holds id {hi} (needs data.vocab_size >= {hi + 1}; or is data.dtype={cfg.dtype!r} wrong?)"
                    raise bad("data.vocab_size", cfg.vocab_size, why)
                if lo < 0:
                    raise DataError(f"data.path: file {str(f)!r} holds a negative id ({lo})")
                shards.append(arr)
            arrays[split] = shards[0] if len(shards) == 1 else TokenShards(shards)
        if self.tail is not None:
            arrays["train"], arrays["val"] = tail_cut(arrays["train"], self.tail)
        return TokenData(arrays["train"], arrays["val"], cfg.vocab_size, tokenizer, digest(self.identity()))


def tail_cut(ids: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) of one file of n ids: val is its last round(n * fraction) ids, train the ids before them.
    Both are views of the memmap: nothing is copied."""
    cut = len(ids) - round(len(ids) * fraction)
    return ids[:cut], ids[cut:]


@DATASETS.register("tokens", reads=("path", "vocab_size", "dtype", "train_split", "val_split", "val_fraction"))
def tokens(cfg: Any) -> TokensSource:
    return TokensSource(cfg)
