"""The token cache: each (source, split settings, tokenizer) is tokenized once, in parallel, in bounded memory.

Layout: ``cache_dir/tokens/<key>/{train.bin, val.bin, meta.json}``, key = hash of (format, separator, source
identity, tokenizer identity), so the runs of a sweep share one tokenization and any change of documents or
tokenizer makes a new entry. A miss is filled by :func:`fill`:

1. under an exclusive lock on ``<key>.lock`` (the other runs of a parallel sweep wait, then hit), what a killed
   run left (temp files, a meta.json whose .bin files do not match it) is removed: a restart starts cleanly;
2. each :class:`~lm_ablate.data.sources.Stream` of the source is read once, its documents gathered per split
   into chunks of ``CHUNK_CHARS`` characters;
3. chunks are encoded by ``data.num_proc`` worker processes (spawned, so nothing of the launching program is
   imported there), at most ``2 x num_proc`` in flight: memory depends on the chunk size, not on the corpus.
   The byte tokenizer and sources under ``POOL_MIN_BYTES`` are encoded inline (workers would cost more than
   they save; bench/data_scale.py measures both);
4. results are appended, in order, to temp files; complete files are renamed to ``<split>.bin`` and
   ``meta.json`` is written last, so an entry with a meta.json that matches its files is complete.

Documents are joined by the tokenizer's separator (``"\\n\\n"`` for bytes, EOS otherwise): chunk k of a split
starts with a separator unless it is the split's first, so the files equal a single-process encoding of the
joined documents whatever the chunk size or the number of workers (tests/test_data_scale.py).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import time
import types
import uuid
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lm_ablate.data.common import DataError, token_dtype
from lm_ablate.data.tokenizers import encode_task, init_worker

FORMAT = 1  # part of every cache key: bump it when the text assembly or the cache layout changes
CHUNK_CHARS = 1 << 20  # characters of one split per task: ~0.3 s of BPE encoding, ~1 MB through a pipe
POOL_MIN_BYTES = 16 << 20  # smaller sources are encoded inline: starting workers (~0.5 s each) would not pay
SUMMARY_AFTER_S = 5.0  # tokenizations longer than this end with a one-line summary on stderr


def open_cached(folder: Path) -> tuple[dict, np.memmap, np.memmap] | None:
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


def clean(folder: Path) -> None:
    """Remove what an interrupted fill left: temp files and a meta.json that does not match its files.
    Called under the entry's lock, so no live writer owns them."""
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
    (folder / "meta.json").unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ writing


class SplitFile:
    """One split's ids, appended to a temp file; renamed to ``<split>.bin`` by :meth:`finish`."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype):
        self.final = folder / f"{split}.bin"
        self.tmp = folder / f".{split}.bin.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        self.dtype, self.f = dtype, open(self.tmp, "wb")  # noqa: SIM115 (closed by finish or discard)
        self.tokens = self.docs = 0
        self.started = False  # a chunk was submitted: the next one starts with a separator
        self.full = False  # reached its stream's cap
        self.doc_index: list[np.ndarray] = []  # with a capped stream: each document's index and end offset
        self.doc_end: list[np.ndarray] = []

    def append(self, ids: np.ndarray, lens: np.ndarray, index: np.ndarray | None = None) -> None:
        self.f.write(np.ascontiguousarray(ids, dtype=self.dtype).data)
        if index is not None:
            self.doc_index.append(index)
            self.doc_end.append(self.tokens + np.cumsum(lens))
        self.tokens += len(ids)
        self.docs += len(lens)

    def keep_through(self, last: int) -> None:
        """Drop the documents whose stream index is past ``last`` (the document that filled the capped split)."""
        if not self.doc_index:
            return
        index, end = np.concatenate(self.doc_index), np.concatenate(self.doc_end)
        keep = int(np.searchsorted(index, last, side="right"))
        self.tokens, self.docs = (int(end[keep - 1]) if keep else 0), keep
        self.f.flush()
        self.f.truncate(self.tokens * self.dtype.itemsize)
        self.f.seek(0, os.SEEK_END)

    def finish(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.final)

    def discard(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)


class _Done:
    """An inline result with the interface of multiprocessing's AsyncResult."""

    def __init__(self, value: Any):
        self.value = value

    def get(self) -> Any:
        return self.value


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """Spawned workers re-import the launching program's ``__main__`` (``lm_ablate.train``: torch, ~4 s and
    ~300 MB each) unless it is hidden while they start; they need nothing from it."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class Workers:
    """Encodes chunks inline, or in ``num_proc`` spawned processes with at most ``window`` chunks in flight."""

    def __init__(self, tokenizer: Any, num_proc: int, size_hint: int | None, pool: bool | None = None):
        self.tokenizer = tokenizer
        if pool is None:  # the default choice (tests and the benchmark force both ways)
            pool = num_proc > 1 and tokenizer.parallel and (size_hint is None or size_hint >= POOL_MIN_BYTES)
        self.pool = None
        if pool:
            ctx = multiprocessing.get_context("spawn")
            with _without_main():
                self.pool = ctx.Pool(num_proc, init_worker, (tokenizer.state(),))
        self.window = 2 * num_proc if self.pool else 0

    def submit(self, docs: list[str], lead: bool) -> Any:
        if self.pool is None:
            return _Done(self.tokenizer.encode_docs(docs, lead))
        return self.pool.apply_async(encode_task, (docs, lead))

    def close(self, ok: bool) -> None:
        if self.pool is not None:
            if ok:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()


class Progress:
    """tqdm bar in tokens, on a terminal only; the total (hence the ETA) is extrapolated from the bytes read."""

    def __init__(self, size_hint: int | None):
        from tqdm.auto import tqdm

        self.size, self.chars, self.tokens, self.start = size_hint, 0, 0, time.perf_counter()
        self.bar = tqdm(
            desc="tokenizing", unit="tok", unit_scale=True, disable=None, leave=False, mininterval=1.0, file=sys.stderr
        )

    def update(self, tokens: int, chars: int) -> None:
        self.tokens, self.chars = self.tokens + tokens, self.chars + chars
        if self.size and self.chars:
            total = int(self.tokens * max(1.0, self.size / self.chars))
            if abs(total - (self.bar.total or 0)) > 0.01 * total:
                self.bar.total = total
        self.bar.set_postfix_str(
            f"{self.chars / max(time.perf_counter() - self.start, 1e-9) / 1e6:.1f} MB/s", refresh=False
        )
        self.bar.update(tokens)

    def close(self, folder: Path, ok: bool = True) -> None:
        """The bar goes; a fill that took a while says what it wrote and where (a failed one wrote nothing)."""
        self.bar.close()
        seconds = time.perf_counter() - self.start
        if ok and seconds >= SUMMARY_AFTER_S:
            rate = f"{self.tokens / seconds / 1e6:.2f} M tokens/s, {self.chars / seconds / 1e6:.1f} MB/s of text"
            print(
                f"lm-ablate: tokenized {self.tokens:,} tokens in {seconds:.1f} s ({rate}) -> {folder}", file=sys.stderr
            )


def fill(source: Any, tokenizer: Any, folder: Path, num_proc: int, pool: bool | None = None) -> dict:
    """Tokenize every stream of ``source`` into ``folder``/{train,val}.bin; returns the counts for meta.json."""
    dtype = token_dtype(tokenizer.vocab_size)
    workers, progress, ok = Workers(tokenizer, num_proc, source.size_hint(), pool), None, False
    files = {split: SplitFile(folder, split, dtype) for split in ("train", "val")}
    try:
        progress = Progress(source.size_hint())
        for stream in source.streams():
            _read(stream, workers, files, progress)
        for split, f in files.items():
            if not f.tokens:
                raise DataError(
                    f"data.path={getattr(getattr(source, 'cfg', None), 'path', None)!r}: the {split} split holds no text"
                )
        ok = True
    finally:
        workers.close(ok)
        for f in files.values():
            f.finish() if ok else f.discard()
        if progress is not None:
            progress.close(folder, ok)
    return {
        "dtype": dtype.name,
        **{f"{split}_tokens": f.tokens for split, f in files.items()},
        **{f"{split}_docs": f.docs for split, f in files.items()},
    }


class _Chunk:
    """Documents of one split gathered for one task."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.index: list[np.ndarray] = []
        self.chars = 0


def _read(stream: Any, workers: Workers, files: dict[str, SplitFile], progress: Progress) -> None:
    """One pass: cut the batches into per-split chunks, keep ``workers.window`` in flight, write in order."""
    capped, cap = stream.cap or (None, 0)
    track = stream.cap is not None  # the uncapped split keeps only documents read before the cap was reached
    chunks: dict[str, _Chunk] = {}
    pending: deque = deque()
    stop: list[int] = []  # index of the document that filled the capped split

    def submit(split: str) -> None:
        chunk, out = chunks.pop(split), files[split]
        if out.full or not chunk.texts:
            return
        result = workers.submit(chunk.texts, out.started)
        pending.append((split, np.concatenate(chunk.index), chunk.chars, result))
        out.started = True
        while len(pending) > workers.window:
            collect()

    def collect() -> None:
        split, index, chars, result = pending.popleft()
        ids, lens = result.get()
        out = files[split]
        progress.update(len(ids), chars)
        if out.full:
            return
        if split == capped and out.tokens + len(ids) >= cap:
            room = cap - out.tokens
            last = int(np.searchsorted(np.cumsum(lens), room))  # the document holding the last kept token
            out.append(ids[:room], lens[: last + 1])
            out.full = True
            stop.append(int(index[last]))
            return
        out.append(ids, lens, index if track else None)

    docs = stream.docs()
    try:
        for split, texts, index in docs:
            if stop and len(index) and index[0] > stop[0]:  # past the document that filled the cap: done
                break
            ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
            start, base = 0, 0  # documents [start, ...) of this batch are not yet in a chunk; base = ends[start - 1]
            while start < len(texts):
                chunk = chunks.get(split) or chunks.setdefault(split, _Chunk())
                end = int(np.searchsorted(ends, base + CHUNK_CHARS - chunk.chars)) + 1  # the chunk is full after it
                end = min(end, len(texts))
                chunk.texts += texts[start:end]
                chunk.index.append(index[start:end])
                chunk.chars += int(ends[end - 1]) - base
                start, base = end, int(ends[end - 1])
                if chunk.chars >= CHUNK_CHARS:
                    submit(split)
    finally:
        getattr(docs, "close", lambda: None)()  # stop reading (files, network) when the cap ended the pass early
    for split in list(chunks):
        submit(split)
    while pending:
        collect()
    if stop:
        for split in stream.splits:
            if split != capped:
                files[split].keep_through(stop[0])
