"""lm_ablate.data: bundled corpus, fixed splits, tokenizers, the token cache, batching and error messages.

Everything writes under pytest's tmp_path (data.cache_dir), never the home directory or the network.
"""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lm_ablate import data as D
from lm_ablate.config import DataConfig
from lm_ablate.data import DataError, TokenData, check_length, get_batch, load_data, val_batches
from lm_ablate.data.tokenizers import chunks

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "lm_ablate" / "corpus" / "shakespeare.tar.xz"
TOTAL_CHARS = 5_057_198  # documented in lm_ablate/corpus/README.md


def yaml_cfg(name: str, tmp_path: Path, **over: Any) -> Any:
    """The shipped conf/data/<name>.yaml merged into the typed schema, as Hydra would, with a tmp cache."""
    cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(ROOT / "conf" / "data" / f"{name}.yaml"))
    cfg.cache_dir = str(tmp_path / "cache")
    for k, v in over.items():
        cfg[k] = v
    return cfg


def hf_cfg(tmp_path: Path, path: Any, **over: Any) -> DataConfig:
    return DataConfig(name="hf", path=None if path is None else str(path), cache_dir=str(tmp_path / "cache"), **over)


def error(cfg: Any, *needles: str) -> str:
    """load_data(cfg) must raise a one-line DataError containing every needle."""
    with pytest.raises(DataError) as info:
        load_data(cfg)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def as_text(tokens: np.ndarray) -> bytes:
    return np.asarray(tokens, dtype=np.uint8).tobytes()


# ------------------------------------------------------------------------------------------------ corpus


def test_archive_holds_42_works_as_documented() -> None:
    with tarfile.open(ARCHIVE, "r:xz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert len(names) == 42 and names == sorted(names) and all(n.endswith(".txt") for n in names)
    assert sum(m.size for m in members) == TOTAL_CHARS
    assert all(m.mtime == members[0].mtime and m.uid == 0 and m.uname == "" for m in members)
    assert 1_000_000 < ARCHIVE.stat().st_size < 2_000_000
    readme = (ARCHIVE.parent / "README.md").read_text()
    assert all(f"| {n} |" in readme for n in names) and f"{ARCHIVE.stat().st_size:,}" in readme


def test_archive_rebuilds_byte_identical() -> None:
    spec = importlib.util.spec_from_file_location("make_corpus", ROOT / "scripts" / "make_corpus.py")
    assert spec is not None and spec.loader is not None
    make_corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_corpus)
    raw = ARCHIVE.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:xz") as tar:
        texts = {m.name.removesuffix(".txt"): tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore
    assert make_corpus.pack_corpus(texts) == raw


def test_shakespeare_yaml_holds_out_whole_works(tmp_path: Path) -> None:
    cfg = yaml_cfg("shakespeare", tmp_path)
    val_works = list(cfg.val_works)
    assert len(val_works) == 4
    d = load_data(cfg)
    works = D.shakespeare_works()
    assert d.vocab_size == 256 and d.train.dtype == np.uint16
    # every character once, plus a two-byte separator between consecutive works of each split
    assert len(d.train) + len(d.val) == TOTAL_CHARS + 2 * (38 - 1) + 2 * (4 - 1)
    assert 0.08 < len(d.val) / (len(d.train) + len(d.val)) < 0.12
    train, val = as_text(d.train), as_text(d.val)
    for work, text in works.items():
        middle = text[len(text) // 2 : len(text) // 2 + 500].encode()
        assert (middle in val) == (work in val_works) and (middle in train) == (work not in val_works), work


def test_default_corpus_tokens_and_key_are_those_of_the_former_single_string_rule(tmp_path: Path) -> None:
    """The default study's numbers rest on these ids: byte = the UTF-8 bytes of SEP.join(works) of each split,
    as before the streaming cache; the key is unchanged too, so caches made before stay valid."""
    cfg = yaml_cfg("shakespeare", tmp_path)
    d = load_data(cfg)
    works = D.shakespeare_works()
    val_works = sorted(cfg.val_works)
    train_text = "\n\n".join(works[w] for w in sorted(works) if w not in val_works)
    assert as_text(d.train) == train_text.encode("utf-8") and d.train.dtype == np.uint16
    assert as_text(d.val) == "\n\n".join(works[w] for w in val_works).encode("utf-8")
    assert d.key == "72f6c082f10ceaf62079"  # the key of this entry at commit 9bcf2e2 (lm_ablate/data.py)


def test_byte_tokenizer_round_trip() -> None:
    tok = D.ByteTokenizer()
    text = "To be, or not to be — ça, 世界!\n"
    ids = tok.encode(text)
    assert tok.vocab_size == 256 and ids.max() < 256 and len(ids) == len(text.encode())
    assert tok.decode(ids) == text and tok.decode(torch.as_tensor(ids.astype(np.int64))) == text


# -------------------------------------------------------------------------------------------------- BPE


def test_bpe_deterministic_and_lossless() -> None:
    works = D.shakespeare_works()
    text = "\n\n".join(works[w] for w in ("macbeth", "tempest", "sonnets"))
    a, b = D.BPETokenizer.train(text, 600), D.BPETokenizer.train(text, 600)
    assert a.vocab_size == 600 and a.tok.to_str() == b.tok.to_str()
    sample = works["hamlet"] + "\n\n  odd  spacing\r\n\tü 世界 \n\n\nEnd"
    ids = a.encode(sample)
    assert a.decode(ids) == sample
    # encoding in ~64k-char chunks (hamlet makes 3) must equal encoding the whole string at once
    assert len(chunks(sample)) >= 3 and ids.tolist() == a.tok.encode(sample).ids
    assert len(chunks(sample, size=100)) > 10 and "".join(chunks(sample, size=100)) == sample


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_bpe_tokenizer_sample_trains_on_the_first_bytes_only(tmp_path: Path) -> None:
    path = tmp_path / "two_halves.txt"
    early = [f"the cat sat on the mat {i}" for i in range(300)]
    late = [f"zyzzyva quokka zyzzyva {i}" for i in range(300)]
    path.write_text("\n\n".join(early + late))
    sampled = load_data(hf_cfg(tmp_path, path, tokenizer="bpe", vocab_size=300, tokenizer_sample=4000))
    whole = load_data(hf_cfg(tmp_path, path, tokenizer="bpe", vocab_size=300))
    assert sampled.key != whole.key and sampled.tokenizer.path != whole.tokenizer.path
    assert len(sampled.tokenizer.encode(" the")) == 1 and len(sampled.tokenizer.encode(" zyzzyva")) >= 4
    assert len(whole.tokenizer.encode(" zyzzyva")) == 1  # the counterfactual: trained on all of it, it merges
    # both encode every training document (the sample only shapes the vocabulary), losslessly
    train_docs = [d for i, d in enumerate(early + late) if (i + 1) % 20]  # val_fraction 0.05: every 20th held out
    for d in (sampled, whole):
        assert d.tokenizer.decode(d.train) == "<|endoftext|>".join(train_docs)


def test_bpe_is_trained_on_the_training_split_only(tmp_path: Path) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    common = "the cat sat on the mat and the dog ran to the hat"
    write_jsonl(folder / "train.jsonl", [{"text": f"{common} {i}"} for i in range(200)])
    write_jsonl(folder / "validation.jsonl", [{"text": "zyzzyva " * 50} for _ in range(20)])
    cfg = hf_cfg(tmp_path, folder, tokenizer="bpe", vocab_size=300, val_split="validation")
    d = load_data(cfg)
    assert d.vocab_size == 300 and d.tokenizer.decode(d.val[:16]).startswith("zyzzyva zyzzyva")
    assert len(d.tokenizer.encode(" the")) == 1  # frequent in training: merged
    assert len(d.tokenizer.encode(" zyzzyva")) >= 5  # only in validation: never merged
    # the counterfactual that makes the check meaningful: with validation text in training it would merge
    leaky = D.BPETokenizer.train(common * 200 + " zyzzyva" * 1000, 300)
    assert len(leaky.encode(" zyzzyva")) <= 2


# ----------------------------------------------------------------------------------------------- cache


def test_second_load_hits_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = yaml_cfg("shakespeare", tmp_path)
    first = load_data(cfg)
    folder = Path(cfg.cache_dir) / "tokens" / first.key
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]

    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("re-tokenized despite a cache entry")

    monkeypatch.setattr(D.ByteTokenizer, "encode_docs", boom)
    monkeypatch.setattr(D.ShakespeareSource, "streams", boom)
    second = load_data(cfg)
    assert second.key == first.key and isinstance(second.train, np.memmap)
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)
    # another hold-out is another data set
    other = yaml_cfg("shakespeare", tmp_path, val_works=["hamlet"])
    monkeypatch.undo()
    assert load_data(other).key != first.key


def test_tokenizer_is_part_of_the_key_and_bpe_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." for i in range(60)))
    byte, bpe = load_data(hf_cfg(tmp_path, path)), load_data(hf_cfg(tmp_path, path, tokenizer="bpe", vocab_size=280))
    assert byte.key != bpe.key and len(bpe.train) < len(byte.train) and bpe.vocab_size == 280
    assert load_data(hf_cfg(tmp_path, path, tokenizer="bpe", vocab_size=300)).key != bpe.key
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.json"))) == 2

    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("BPE retrained or re-encoded despite the cache")

    monkeypatch.setattr(D.BPETokenizer, "train", boom)
    monkeypatch.setattr(D.BPETokenizer, "encode_docs", boom)
    again = load_data(hf_cfg(tmp_path, path, tokenizer="bpe", vocab_size=280))
    assert again.key == bpe.key and np.array_equal(again.train, bpe.train)
    assert again.tokenizer.decode(again.train[:5]) == bpe.tokenizer.decode(bpe.train[:5]) != ""


# -------------------------------------------------------------------------------------------- batching


def test_get_batch_is_a_function_of_seed_and_step() -> None:
    tokens = np.arange(5000, dtype=np.uint16)
    x, y = get_batch(tokens, 8, 32, seed=3, step=7)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)  # arange: the target is the next token
    assert torch.equal(x[:, 1:], y[:, :-1])
    np.random.seed(123)
    torch.manual_seed(123)  # global RNG state must not matter
    x2, y2 = get_batch(tokens, 8, 32, seed=3, step=7)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, get_batch(tokens, 8, 32, seed=3, step=8)[0])
    assert not torch.equal(x, get_batch(tokens, 8, 32, seed=4, step=7)[0])
    tight = np.arange(33, dtype=np.uint16)  # exactly context + 1 tokens: a single valid window
    tx, ty = get_batch(tight, 4, 32, seed=0, step=0)
    assert torch.equal(tx[0], torch.arange(32)) and torch.equal(ty, tx + 1) and (tx == tx[0]).all()


def test_val_batches_are_fixed_and_span_the_split() -> None:
    tokens = np.arange(10_000, dtype=np.uint16)
    a = val_batches(tokens, 4, 16, 3)
    np.random.seed(5)
    b = val_batches(tokens, 4, 16, 3)
    assert len(a) == 3 and all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    starts = torch.cat([x[:, 0] for x, _ in a])
    assert starts[0] == 0 and a[-1][1][-1, -1] == len(tokens) - 1  # first window at the start, last at the end
    assert (starts.diff() > 0).all() and all(torch.equal(y, x + 1) for x, y in a)


def test_check_length_names_context_and_split_size() -> None:
    d = TokenData(np.zeros(1000, np.uint16), np.zeros(50, np.uint16), 256, D.ByteTokenizer(), "k")
    check_length(d, 49)
    with pytest.raises(DataError) as info:
        check_length(d, 50)
    msg = str(info.value)
    assert "model.context=50" in msg and "val split has only 50 tokens" in msg and "\n" not in msg


# ------------------------------------------------------------------------------------------ hf sources


def test_hf_local_txt_holds_out_every_kth_paragraph(tmp_path: Path) -> None:
    paras = [f"Paragraph number {i:02d} says something." for i in range(40)]
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(paras) + "\n")
    d = load_data(hf_cfg(tmp_path, path, val_fraction=0.1))
    val, train = as_text(d.val).decode(), as_text(d.train).decode()
    held = [p for p in paras if p in val]
    assert held == [paras[i] for i in (9, 19, 29, 39)] and not any(p in train for p in held)
    assert all(p in train for p in paras if p not in held)
    assert load_data(hf_cfg(tmp_path, path, val_fraction=0.1)).key == d.key


def test_hf_local_jsonl_folder_with_val_split_and_text_field(tmp_path: Path) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"id": i, "body": f"train doc {i}"} for i in range(30)])
    write_jsonl(folder / "validation.jsonl", [{"id": i, "body": f"val doc {i}"} for i in range(5)])
    write_jsonl(folder / "test.jsonl", [{"id": i, "body": f"test doc {i}"} for i in range(5)])
    d = load_data(hf_cfg(tmp_path, folder, text_field="body", val_split="validation"))
    assert as_text(d.val).decode() == "\n\n".join(f"val doc {i}" for i in range(5))
    assert as_text(d.train).decode() == "\n\n".join(f"train doc {i}" for i in range(30))
    # without val_split: train*.jsonl only (never test.jsonl), 1 in 10 documents held out
    d = load_data(hf_cfg(tmp_path, folder, text_field="body", val_fraction=0.1))
    assert as_text(d.val).decode() == "train doc 9\n\ntrain doc 19\n\ntrain doc 29"
    assert b"test doc" not in as_text(d.train)


def test_hf_local_parquet_with_max_docs(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(100)], "n": list(range(100))}), path)
    full = load_data(hf_cfg(tmp_path, path))
    assert as_text(full.val).decode() == "\n\n".join(f"row {i}" for i in range(19, 100, 20))
    small = load_data(hf_cfg(tmp_path, path, max_docs=40))
    assert small.key != full.key and as_text(small.val).decode() == "row 19\n\nrow 39"
    assert as_text(small.train).decode().endswith("row 38")


# ---------------------------------------------------------------------------------------------- errors


def test_unknown_val_work_lists_the_allowed_ones(tmp_path: Path) -> None:
    msg = error(yaml_cfg("shakespeare", tmp_path, val_works=["hamlet", "hamlett"]), "data.val_works", "hamlett")
    assert "allowed:" in msg and "winters_tale" in msg and "lovers_complaint" in msg


def test_hf_yaml_needs_a_path(tmp_path: Path) -> None:
    error(yaml_cfg("hf", tmp_path), "data.path=None")


def test_missing_local_path(tmp_path: Path) -> None:
    error(hf_cfg(tmp_path, tmp_path / "nope.jsonl"), "data.path=", "nope.jsonl", "no such file")
    error(hf_cfg(tmp_path, tmp_path / "missing_dir" / "*.txt"), "data.path=", "no file matches")


def test_empty_or_blank_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    error(hf_cfg(tmp_path, empty), "data.path=", "empty.txt", "is empty")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n  \n\n")
    error(hf_cfg(tmp_path, blank), "data.path=", "no text")


def test_non_utf8_text_names_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("fine text\n\nmore fine text\n")
    (folder / "b.txt").write_bytes("caf\u00e9 ".encode("latin-1") + b"in latin-1\n")
    error(hf_cfg(tmp_path, folder), "data.path=", "b.txt", "not UTF-8", "offset 3")


def test_unknown_text_field_lists_columns(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, [{"content": "hello", "meta": 1}] * 3)
    error(hf_cfg(tmp_path, path), "data.text_field='text'", "content", "meta")
    error(hf_cfg(tmp_path, path, text_field="meta"), "data.text_field='meta'", "not text")


def test_unreachable_hub_name_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # both libraries read those variables at import time, which may have happened already in this process
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    msg = error(hf_cfg(tmp_path, "no-such-user/no-such-dataset"), "data.path='no-such-user/no-such-dataset'")
    assert "could not load from the Hugging Face hub (no network?) and no local file of that name exists" in msg
    assert time.monotonic() - start < 20


def test_corpus_shorter_than_context(tmp_path: Path) -> None:
    path = tmp_path / "tiny.txt"
    path.write_text("\n\n".join(f"p{i}" for i in range(20)))
    d = load_data(hf_cfg(tmp_path, path))
    with pytest.raises(DataError) as info:
        check_length(d, 128)
    assert "model.context=128" in str(info.value) and f"only {len(d.train)} tokens" in str(info.value)
    with pytest.raises(DataError, match="model.context"):
        get_batch(d.val, 2, 128, seed=0, step=0)


# ------------------------------------------------------------------------- refused runs leave nothing


class _Hub:
    """A stand-in hub on a local port that answers every request 503 (the hub down), counting the requests
    for ``repo``'s files; or, with ``down=True``, a port nobody listens on (no network)."""

    def __init__(self, repo: str, down: bool = False):
        import http.server
        import socket
        import threading

        self.repo, self.requests = repo, []
        if down:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]  # closed again at once: connections are refused
            self.server = None
            return
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _unavailable(self) -> None:
                if self.path.startswith(f"/{hub.repo}/"):
                    hub.requests.append(f"{self.command} {self.path}")
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = _unavailable

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.mark.parametrize("down", [False, True], ids=["hub_503", "no_network"])
def test_a_hub_tokenizer_without_network_is_one_try_one_line_and_writes_nothing(tmp_path: Path, down: bool) -> None:
    """Issue 21.6: 23 retry lines over 34 s, and the refused launch left train.log in its run folder."""
    import os
    import subprocess
    import sys

    hub = _Hub("gpt2", down=down)
    run, cache = tmp_path / "run", tmp_path / "cache"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "0",
        "HF_ENDPOINT": f"http://127.0.0.1:{hub.port}",
        "HF_HOME": str(tmp_path / "hf"),
    }
    cmd = [sys.executable, "-m", "lm_ablate.train", "debug=smoke", "data.tokenizer=pretrained"]
    cmd += ["data.tokenizer_path=gpt2", f"hydra.run.dir={run}", f"data.cache_dir={cache}", "train.threads=1"]
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        hub.close()
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert (
        lines[0].startswith("lm-ablate: error: data.tokenizer_path='gpt2' is invalid: ") and "no network?" in lines[0]
    )
    if not down:
        assert hub.requests == ["HEAD /gpt2/resolve/main/tokenizer.json"]  # one try, no retry
    assert not run.exists() and not cache.exists()


def test_a_cached_hub_tokenizer_is_read_without_asking_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub tokenizer downloaded once is read from the HF cache: no request to the hub, online or not."""
    from huggingface_hub import constants, try_to_load_from_cache

    from lm_ablate.data.tokenizers import load_pretrained

    repo = cache_hub_repo(Path(constants.HF_HUB_CACHE), "someone/tok")
    assert try_to_load_from_cache("someone/tok", "tokenizer.json") == str(repo / "tokenizer.json")
    hub = _Hub("someone/tok")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    endpoint = f"http://127.0.0.1:{hub.port}"  # read at import by both names: both are set
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    try:
        tok = load_pretrained("someone/tok")
    finally:
        hub.close()
    assert hub.requests == []
    assert tok.eos == "<|endoftext|>" and tok.vocab_size == tok.tok.get_vocab_size()


def cache_hub_repo(cache: Path, repo: str) -> Path:
    """A repo's snapshot in the HF cache layout (models--<owner>--<name>/snapshots/<commit>, refs/main), holding a
    small BPE's tokenizer.json, as a first download leaves it."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0" * 40)
    D.BPETokenizer.train(["to be or not to be"] * 10, 300).tok.save(str(snapshot / "tokenizer.json"))
    return snapshot


def test_refused_and_finished_fills_leave_no_lock_file_nor_empty_entry(tmp_path: Path) -> None:
    """Issue 21.12: every refused data run left a ``<key>.lock`` (and an empty entry folder) in the cache."""
    few = tmp_path / "few.txt"
    few.write_text("\n\n".join(f"paragraph {i}" for i in range(10)))  # 5% of 10 documents: none held out
    for tokenizer in ("byte", "bpe"):
        error(hf_cfg(tmp_path, few, tokenizer=tokenizer, vocab_size=300), "data.val_fraction=0.05", "holds out none")
    cache = tmp_path / "cache"
    assert [p for p in cache.rglob("*") if not p.is_dir()] == []  # (the BPE's training read the same documents)
    assert list((cache / "tokens").iterdir()) == []
    many = tmp_path / "many.txt"
    many.write_text("\n\n".join(f"paragraph {i}" for i in range(100)))
    load_data(hf_cfg(tmp_path, many, tokenizer="bpe", vocab_size=300))
    assert not list((tmp_path / "cache").rglob("*.lock"))


def _hold(path: str, log: str, rounds: int) -> None:
    """In a process of its own: take the lock ``rounds`` times, writing when it enters and leaves."""
    from lm_ablate.data.files import locked

    for _ in range(rounds):
        with locked(Path(path)):
            with open(log, "a") as f:
                f.write("in\n")
            time.sleep(0.02)
            with open(log, "a") as f:
                f.write("out\n")


def test_the_lock_excludes_while_its_file_comes_and_goes(tmp_path: Path) -> None:
    """The holder removes the lock file on release; waiters that locked the removed file must not enter
    beside the next holder of the new one (they check that the path is still their file)."""
    import multiprocessing

    lock, log = tmp_path / "x.lock", tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hold, args=(str(lock), str(log), 15)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert log.read_text() == "in\nout\n" * 60  # never two inside at once
    assert not lock.exists()


def test_text_field_on_a_txt_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("\n\n".join(f"paragraph {i}" for i in range(40)))
    msg = error(hf_cfg(tmp_path, path, text_field="content"), "data.text_field='content' is invalid", ".txt")
    assert "no columns" in msg
    assert not (tmp_path / "cache").exists()
