"""The data path at scale: the chunked, parallel fill against a single-process reference, kill -9 during a fill,
pretrained tokenizers, pre-tokenized corpora, hub streaming, $LM_ABLATE_CACHE and one-line errors.

Speed and memory targets live in bench/data_scale.py, never here. Everything writes under tmp_path.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

import lm_ablate.data.cache as C
from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, DataConfig, compose, validate
from lm_ablate.data import DataError, TokenShards, Vocabulary, get_batch, load_data, shakespeare_works, vocabulary
from lm_ablate.data.sources import paragraphs
from lm_ablate.data.tokenizers import EOS
from lm_ablate.registry import DATASETS

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
SEP = "\n\n"


def held_out(i: int, f: float) -> bool:  # the documented rule, written out: evenly spaced, no randomness
    return math.floor((i + 1) * f) > math.floor(i * f)


def split_docs(docs: list[str], f: float) -> tuple[list[str], list[str]]:
    return [d for i, d in enumerate(docs) if not held_out(i, f)], [d for i, d in enumerate(docs) if held_out(i, f)]


def cfg_for(tmp_path: Path, **over: Any) -> Any:
    return OmegaConf.structured(DataConfig(**{"cache_dir": str(tmp_path / "cache"), **over}))


def error(cfg: Any, *needles: str) -> str:
    """load_data(cfg) must raise a one-line DataError (a ConfigError) containing every needle."""
    with pytest.raises(ConfigError) as info:
        load_data(cfg)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert all(n in msg for n in needles), msg
    return msg


def mixed_docs() -> list[str]:
    """Paragraphs of three works, a few non-ASCII ones and long ones (no blank line inside: .txt documents)."""
    works = shakespeare_works()
    docs = [p for w in ("macbeth", "sonnets", "tempest") for p in works[w].split(SEP) if p.strip()][:900]
    docs += ["Ünïcödé ça va — 世界 " * (i + 1) for i in range(5)]
    docs += ["\n".join(works["hamlet"].split(SEP)[k].replace("\n", " ") for k in range(40, 240)) * 3]
    return docs


# ------------------------------------------------------------------------------------------ reading


def test_paragraph_reader_matches_the_datasets_text_builder(tmp_path: Path) -> None:
    import datasets

    text = (
        "first para\r\nline two\r\n\r\n\r\n\r\nsecond  \n\n\n\nthird\rcarriage\n\n  \n\nfourth ü 世界\n\n\n"
        + "x" * 50
        + "\n\n"
        + mixed_docs()[3]
        + "\n\nlast without newline"
    )
    path = tmp_path / "t.txt"
    path.write_bytes(text.encode())
    ref = [r["text"] for r in datasets.load_dataset("text", data_files=str(path), sample_by="paragraph", split="train")]
    assert len(ref) > 6
    for block in (1, 2, 3, 7, 64, 10 << 20):  # every block boundary, including inside "\r\n" and "\n\n"
        assert list(paragraphs(path, block)) == ref, block


# ---------------------------------------------------------------------- parallel fill == reference


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_chunked_parallel_fill_equals_a_single_process_reference(tmp_path: Path, kind: str) -> None:
    docs = mixed_docs()
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    cfg = cfg_for(tmp_path, name="hf", path=str(path), tokenizer=kind, vocab_size=400, val_fraction=0.05)
    first = load_data(cfg)
    train_docs, val_docs = split_docs(docs, 0.05)
    if kind == "byte":  # the former rule: the UTF-8 bytes of the documents joined by a blank line
        ref = {s: np.frombuffer(SEP.join(d).encode(), np.uint8) for s, d in (("train", train_docs), ("val", val_docs))}
    else:  # the HF tokenizer on each whole document, EOS between them
        tok = first.tokenizer.tok
        eos = tok.token_to_id(EOS)
        ids = {
            s: [tok.encode(d, add_special_tokens=False).ids for d in ds]
            for s, ds in (("train", train_docs), ("val", val_docs))
        }
        ref = {
            s: np.asarray(list(itertools.chain(*[[eos, *x] if k else x for k, x in enumerate(v)])))
            for s, v in ids.items()
        }
    assert np.array_equal(first.train, ref["train"]) and np.array_equal(first.val, ref["val"])
    source = DATASETS.build(cfg)
    tokenizer = first.tokenizer
    if kind == "bpe":
        tokenizer.long_doc = 3000  # the long documents are encoded in pieces, in the workers too
        assert max(len(d) for d in docs) > 4 * tokenizer.long_doc
    # chunks of one document or less (documents longer than a chunk), odd sizes, 1 and 2 worker processes
    for chunk, num_proc, pool in ((1 << 20, 1, False), (997, 1, False), (64, 2, True), (20_000, 2, True)):
        folder = tmp_path / f"fill-{chunk}-{num_proc}"
        folder.mkdir()
        C.CHUNK_CHARS, saved = chunk, C.CHUNK_CHARS
        try:
            counts = C.fill(source, tokenizer, folder, num_proc, pool=pool)
        finally:
            C.CHUNK_CHARS = saved
        for split in ("train", "val"):
            got = np.fromfile(folder / f"{split}.bin", dtype=counts["dtype"])
            assert np.array_equal(got, ref[split]), (chunk, num_proc, split)
        assert counts["train_docs"] == len(train_docs) and counts["val_docs"] == len(val_docs)
        assert sorted(p.name for p in folder.iterdir()) == ["train.bin", "val.bin"]  # no temp file left


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find the worker processes")
def test_kill_9_during_tokenization_leaves_no_complete_cache_and_the_next_run_succeeds(tmp_path: Path) -> None:
    works = shakespeare_works()
    text = SEP.join(works[w] for w in sorted(works)[:20])
    path = tmp_path / "corpus.txt"
    path.write_text(SEP.join([text] * 3))
    over = dict(name="hf", path=str(path), tokenizer="bpe", vocab_size=300, tokenizer_sample=200_000, num_proc=2)
    script = (
        "import lm_ablate.data.cache as C\n"
        "C.POOL_MIN_BYTES, C.CHUNK_CHARS = 0, 1 << 16\n"  # worker processes even for this small corpus
        "from lm_ablate.config import DataConfig\nfrom lm_ablate.data import load_data\n"
        f"load_data(DataConfig(cache_dir={str(tmp_path / 'cache')!r}, **{over!r}))\nprint('finished')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tokens = tmp_path / "cache" / "tokens"
    deadline = time.monotonic() + 180
    while True:  # kill once ids are being appended to a temp file
        tmps = [t for t in tokens.glob("*/.train.bin.*.tmp") if t.stat().st_size > 0] if tokens.exists() else []
        if tmps:
            break
        assert proc.poll() is None, f"ended before it could be killed: {proc.communicate()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    workers = children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    folder = tmps[0].parent
    assert len(workers) >= 2 and proc.returncode == -signal.SIGKILL
    assert not (folder / "meta.json").exists() and C.open_cached(folder) is None
    assert not (folder / "train.bin").exists() and list(folder.glob(".*.tmp"))  # only leftovers
    deadline = time.monotonic() + 15
    while any(alive(w) for w in workers):  # the orphaned workers notice and exit
        assert time.monotonic() < deadline, [w for w in workers if alive(w)]
        time.sleep(0.1)

    d = load_data(cfg_for(tmp_path, **{**over, "num_proc": 1}))  # num_proc is not part of the key
    assert d.key == folder.name
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]
    train_docs, val_docs = split_docs(list(paragraphs(path)), 0.05)
    assert d.tokenizer.decode(d.train) == EOS.join(train_docs) and d.tokenizer.decode(d.val) == EOS.join(val_docs)


# ------------------------------------------------------------------------------------- pretrained


def make_pretrained(folder: Path, with_eos: bool = True) -> Path:
    """A tokenizer someone else trained: its own merges, <s> </s> <pad>, a BOS post-processor; saved the
    transformers way (tokenizer.json + tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<pad>"] if with_eos else ["<s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(shakespeare_works()["lear"].split(SEP), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    kwargs = {"eos_token": "</s>"} if with_eos else {}
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", **kwargs).save_pretrained(folder)
    return folder


def test_pretrained_tokenizer_matches_transformers_and_trains_end_to_end(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from lm_ablate.train import train

    folder = make_pretrained(tmp_path / "tok")
    works = shakespeare_works()
    path = tmp_path / "book.txt"
    path.write_text(works["macbeth"] + SEP + works["tempest"])
    cfg = cfg_for(
        tmp_path, name="hf", path=str(path), tokenizer="pretrained", tokenizer_path=str(folder), val_fraction=0.1
    )
    d = load_data(cfg)
    ref_tok = AutoTokenizer.from_pretrained(folder)
    assert d.vocab_size == len(ref_tok) == 420 and d.train.dtype == np.uint16
    train_docs, val_docs = split_docs(list(paragraphs(path)), 0.1)
    for got, docs in ((d.train, train_docs), (d.val, val_docs)):
        ids = [ref_tok(doc, add_special_tokens=False).input_ids for doc in docs]  # no BOS
        assert got.tolist() == [i for k, x in enumerate(ids) for i in ([ref_tok.eos_token_id, *x] if k else x)]
    # the tokenizer.json file alone gives the same ids; another tokenizer is another cache entry
    alone = load_data(cfg_for(tmp_path, **{**cfg, "tokenizer_path": str(folder / "tokenizer.json")}))
    assert np.array_equal(alone.train, d.train)
    assert load_data(cfg_for(tmp_path, **{**cfg, "tokenizer": "byte"})).key != d.key
    run = compose(
        ["debug=smoke", "train.max_steps=3", "data=hf", f"data.path={path}", "data.tokenizer=pretrained"]
        + [f"data.tokenizer_path={folder}", f"data.cache_dir={tmp_path / 'cache'}", "train.threads=1"]
    )
    summary = train(run, tmp_path / "run")
    assert summary[M.STATUS] == M.STATUS_COMPLETED
    assert abs(summary[M.FINAL_VAL_LOSS] - math.log(420)) < 0.5  # a 420-way softmax barely trained, not 256
    # recorded as trained, and what python -m lm_ablate.cost counts with (not data.vocab_size's default 4096)
    assert summary[M.VOCAB_SIZE] == 420 == OmegaConf.load(tmp_path / "run" / M.CONFIG_FILE).model.vocab_size
    assert vocabulary(run.data) == Vocabulary(420)


# -------------------------------------------------------------------------------------- pre-tokenized


def tokens_cfg(tmp_path: Path, path: Path | str, **over: Any) -> Any:
    base = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(ROOT / "conf" / "data" / "tokens.yaml"))
    base.cache_dir, base.path = str(tmp_path / "cache"), str(path)
    for k, v in over.items():
        base[k] = v
    return base


def test_nanogpt_bin_files_are_memory_mapped_not_copied(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    folder = tmp_path / "owt"
    folder.mkdir()
    train, val = rng.integers(0, 1000, 10_000).astype(np.uint16), rng.integers(0, 1000, 2_000).astype(np.uint16)
    train.tofile(folder / "train.bin")
    val.tofile(folder / "val.bin")
    d = load_data(tokens_cfg(tmp_path, folder, vocab_size=1000))
    assert isinstance(d.train, np.memmap) and Path(d.train.filename) == folder / "train.bin"
    assert Path(d.val.filename) == folder / "val.bin"
    assert np.array_equal(d.train, train) and np.array_equal(d.val, val) and d.vocab_size == 1000
    assert d.tokenizer.decode(d.train[:3]) == " ".join(str(i) for i in train[:3])
    assert not (tmp_path / "cache" / "tokens").exists()  # nothing tokenized, nothing copied


def test_npy_shards_with_and_without_header_read_as_one_stream(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    folder = tmp_path / "dolma"
    folder.mkdir()
    shards = [rng.integers(0, 70_000, 300 + 17 * i).astype(np.uint32) for i in range(5)]
    for i, s in enumerate(shards):
        if i % 2:
            np.save(folder / f"part-{i:03d}.npy", s)  # numpy's header
        else:
            s.tofile(folder / f"part-{i:03d}.npy")  # OLMo-style: a headerless memmap named .npy
    d = load_data(tokens_cfg(tmp_path, folder, vocab_size=70_000, dtype="uint32", val_split=None, val_fraction=0.2))
    ref_train, ref_val = np.concatenate(shards[:4]), shards[4]  # shard 4: floor(5 * 0.2) > floor(4 * 0.2)
    assert isinstance(d.train, TokenShards) and len(d.train) == len(ref_train)
    assert np.array_equal(np.asarray(d.train), ref_train) and np.array_equal(d.val, ref_val)
    assert np.array_equal(d.train[295:905], ref_train[295:905]) and d.train[-1] == ref_train[-1]
    for step in range(20):  # 60-token windows over 300-token shards: many run from one shard into the next
        for got, want in zip(
            get_batch(d.train, 8, 60, seed=3, step=step), get_batch(ref_train, 8, 60, seed=3, step=step)
        ):
            assert got.equal(want)


def test_pretokenized_corpus_trains_end_to_end(tmp_path: Path) -> None:
    from lm_ablate.train import train

    folder = tmp_path / "set"
    folder.mkdir()
    rng = np.random.default_rng(2)
    rng.integers(0, 300, 5_000).astype(np.uint16).tofile(folder / "train.bin")
    rng.integers(0, 300, 1_000).astype(np.uint16).tofile(folder / "val.bin")
    run = compose(
        ["debug=smoke", "train.max_steps=3", "data=tokens", f"data.path={folder}", "data.vocab_size=300"]
        + [f"data.cache_dir={tmp_path / 'cache'}", "train.threads=1"]
    )
    summary = train(run, tmp_path / "run")
    assert summary[M.STATUS] == M.STATUS_COMPLETED and abs(summary[M.FINAL_VAL_LOSS] - math.log(300)) < 0.5


@pytest.mark.parametrize("fraction", [0.05, 0.1, 0.07])
def test_a_single_token_file_holds_out_its_tail(tmp_path: Path, fraction: float) -> None:
    """Issue 21.7: one file could not train (val_split's error suggested val_split=null, whose error suggested
    raising val_fraction, which never helps with one shard). Its last round(n x val_fraction) ids are validation."""
    ids = np.random.default_rng(3).integers(0, 300, 1000).astype(np.uint16)
    path = write_ids(tmp_path / "corpus.bin", ids)
    d = load_data(tokens_cfg(tmp_path, path, vocab_size=300, val_split=None, val_fraction=fraction))
    n_val = {0.05: 50, 0.1: 100, 0.07: 70}[fraction]
    assert np.array_equal(d.train, ids[: 1000 - n_val]) and np.array_equal(d.val, ids[1000 - n_val :])
    assert isinstance(d.train, np.memmap) and Path(d.train.filename) == path  # views of the file, no copy
    other = load_data(tokens_cfg(tmp_path, path, vocab_size=300, val_split=None, val_fraction=0.2))
    assert other.key != d.key  # another cut is another split


def test_a_single_token_file_trains_end_to_end(tmp_path: Path) -> None:
    from lm_ablate.train import train

    path = write_ids(tmp_path / "corpus.bin", np.random.default_rng(4).integers(0, 300, 5_000))
    run = compose(
        ["debug=smoke", "train.max_steps=3", "data=tokens", f"data.path={path}", "data.vocab_size=300"]
        + ["data.val_split=null", "data.val_fraction=0.2", f"data.cache_dir={tmp_path / 'cache'}", "train.threads=1"]
    )
    summary = train(run, tmp_path / "run")
    assert summary[M.STATUS] == M.STATUS_COMPLETED and summary[M.VOCAB_SIZE] == 300


# ---------------------------------------------------------------------------------------- streaming


def endless(prefix: str) -> Any:
    def gen() -> Any:
        for i in itertools.count():
            yield {"text": doc(prefix, i), "id": i}

    return gen


def doc(prefix: str, i: int) -> str:
    return f"{prefix} {i}: " + "to be or not — ç " * (i % 5)  # non-ASCII: bytes and characters differ


@pytest.mark.parametrize("chunk", [1 << 20, 300])  # 300: tasks end inside a batch of 1,000 rows
def test_streaming_takes_the_first_max_tokens_of_an_endless_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    import datasets

    monkeypatch.setattr(C, "CHUNK_CHARS", chunk)

    calls = []

    def load_dataset(
        path: str, name: str | None = None, split: str | None = None, streaming: bool = False, **kw: Any
    ) -> Any:
        calls.append((path, name, split, streaming))
        return datasets.IterableDataset.from_generator(endless(split or ""))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cfg = cfg_for(
        tmp_path, name="hf", path="someone/huge", hf_config="sample", streaming=True, max_tokens=5000, val_fraction=0.1
    )
    d = load_data(cfg)
    assert calls == [("someone/huge", "sample", "train", True)]
    # the reference, written out: every 10th document is validation; training bytes cut at 5000; validation
    # keeps the documents before the one that holds the 5000th training byte
    train_text, val_docs, i = "", [], 0
    while len(train_text.encode()) < 5000:
        if held_out(i, 0.1):
            val_docs.append(doc("train", i))
        else:
            train_text += (SEP if train_text else "") + doc("train", i)
        i += 1
    assert bytes(np.asarray(d.train, np.uint8)) == train_text.encode()[:5000]
    assert bytes(np.asarray(d.val, np.uint8)) == SEP.join(val_docs).encode()
    assert load_data(cfg).key == d.key and len(calls) == 1  # a cache hit streams nothing

    # a named validation split is a stream of its own, capped at val_fraction x max_tokens
    named = cfg_for(tmp_path, name="hf", path="someone/huge", streaming=True, max_tokens=3000, val_split="validation")
    d = load_data(named)
    assert calls[1:] == [("someone/huge", None, "train", True), ("someone/huge", None, "validation", True)]
    assert len(d.train) == 3000 and len(d.val) == round(0.05 * 3000)
    assert bytes(np.asarray(d.val, np.uint8)).startswith(f"validation 0: {SEP}validation 1: to be".encode())
    assert bytes(np.asarray(d.train, np.uint8)) == SEP.join(doc("train", i) for i in range(3000)).encode()[:3000]


# ---------------------------------------------------------------------------------- $LM_ABLATE_CACHE


def test_lm_ablate_cache_variable_is_the_default_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LM_ABLATE_CACHE", str(tmp_path / "shared"))
    assert compose(["debug=smoke"]).data.cache_dir == str(tmp_path / "shared")
    assert compose([f"data.cache_dir={tmp_path / 'mine'}"]).data.cache_dir == str(tmp_path / "mine")  # explicit wins
    path = tmp_path / "t.txt"
    path.write_text(SEP.join(f"paragraph {i}" for i in range(40)))
    d = load_data(DataConfig(name="hf", path=str(path)))  # a plain DataConfig resolves the default too
    assert (tmp_path / "shared" / "tokens" / d.key / "meta.json").is_file()
    monkeypatch.delenv("LM_ABLATE_CACHE")
    assert compose(["debug=smoke"]).data.cache_dir == ".cache/lm_ablate"


# --------------------------------------------------------------------------------------- bad input


def write_ids(path: Path, ids: Any, dtype: Any = np.uint16) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.asarray(ids, dtype=dtype).tofile(path)
    return path


def test_pretokenized_bad_inputs_are_one_line_naming_the_key(tmp_path: Path) -> None:
    ok = tmp_path / "ok"
    write_ids(ok / "train.bin", range(100))
    write_ids(ok / "val.bin", range(50))
    error(tokens_cfg(tmp_path, ok, vocab_size=99), "data.vocab_size=99", "holds id 99", "needs data.vocab_size >= 100")
    error(tokens_cfg(tmp_path, ok), "data.vocab_size=0", "data=tokens needs the size")
    odd = tmp_path / "odd"
    write_ids(odd / "train.bin", range(100))
    (odd / "val.bin").write_bytes(b"\x01\x02\x03")
    error(
        tokens_cfg(tmp_path, odd, vocab_size=300), "data.dtype='uint16'", "val.bin", "has 3 bytes, not a multiple of 2"
    )
    only = tmp_path / "only"
    write_ids(only / "train.bin", range(100))
    error(tokens_cfg(tmp_path, only, vocab_size=300), "data.val_split='val'", "no file named val*", "train.bin",
          "data.val_split=null to hold out the last data.val_fraction of its tokens")  # fmt: skip
    shards = tmp_path / "shards"
    for i in range(3):
        write_ids(shards / f"train-{i}.bin", range(100))
    error(tokens_cfg(tmp_path, shards, vocab_size=300), "data.val_split='val'", "hold out every k-th shard")
    error(tokens_cfg(tmp_path, shards, vocab_size=300, val_split=None), "data.val_fraction=0.05", "none of 3 shards")
    error(tokens_cfg(tmp_path, tmp_path / "nowhere", vocab_size=300), "data.path=", "no such file or folder")
    (tmp_path / "empty_dir").mkdir()
    error(tokens_cfg(tmp_path, tmp_path / "empty_dir", vocab_size=300), "data.path=", "no .bin or .npy file")
    error(tokens_cfg(tmp_path, ok, vocab_size=300, tokenizer="bpe"), "data.tokenizer='bpe'", "allowed: pretrained")
    error(tokens_cfg(tmp_path, ok, vocab_size=300, dtype="int8"), "data.dtype='int8'", "allowed: uint16, uint32")
    empty = tmp_path / "empty"
    write_ids(empty / "train.bin", range(10))
    (empty / "val.bin").write_bytes(b"")
    error(tokens_cfg(tmp_path, empty, vocab_size=300), "data.path", "val.bin", "is empty")
    two_d = tmp_path / "twod"
    two_d.mkdir()
    np.save(two_d / "train.npy", np.zeros((4, 4), np.uint16))
    np.save(two_d / "val.npy", np.zeros(8, np.uint16))
    error(tokens_cfg(tmp_path, two_d, vocab_size=300), "data.path", "train.npy", "2-D", "1-D integer ids expected")
    neg = tmp_path / "neg"
    neg.mkdir()
    np.save(neg / "train.npy", np.array([1, -3, 2], np.int16))
    np.save(neg / "val.npy", np.array([1, 2], np.int16))
    error(tokens_cfg(tmp_path, neg, vocab_size=300), "data.path", "train.npy", "negative id (-3)")


def test_new_text_keys_are_checked_before_anything_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text(SEP.join(f"paragraph {i}" for i in range(40)))
    hf = dict(name="hf", path=str(path))
    error(cfg_for(tmp_path, name="shakespeare", max_tokens=10), "data.max_tokens=10", "only data=hf")
    for key, value in (("num_proc", 0), ("tokenizer_sample", 0), ("max_tokens", -5)):
        error(cfg_for(tmp_path, **hf, **{key: value}), f"data.{key}={value}", "positive integer or null")
    error(cfg_for(tmp_path, name="hf", path="a/b", streaming=True), "data.max_tokens=None", "may never end")
    error(cfg_for(tmp_path, **hf, streaming=True, max_tokens=10), "data.streaming=True", "local files")
    error(cfg_for(tmp_path, **hf, tokenizer="bpe", max_tokens=10), "data.tokenizer_sample=None", "data.max_tokens")
    error(cfg_for(tmp_path, **hf, tokenizer="pretrained"), "data.tokenizer_path=None", "needs a tokenizer.json")
    missing = str(tmp_path / "nope" / "tokenizer.json")
    error(
        cfg_for(tmp_path, **hf, tokenizer="pretrained", tokenizer_path=missing), "data.tokenizer_path=", "no such file"
    )
    error(
        cfg_for(tmp_path, **hf, tokenizer="pretrained", tokenizer_path=str(path)),
        "data.tokenizer_path=",
        "not a Hugging Face tokenizer.json",
    )
    error(
        cfg_for(tmp_path, **hf, tokenizer="pretrained", tokenizer_path="no-such-user/no-such-tok"),
        "data.tokenizer_path='no-such-user/no-such-tok'",
        "no network?",
    )
    no_eos = make_pretrained(tmp_path / "no_eos", with_eos=False)
    error(
        cfg_for(tmp_path, **hf, tokenizer="pretrained", tokenizer_path=str(no_eos)),
        "data.tokenizer_path=",
        "no EOS token",
    )
    assert not (tmp_path / "cache" / "tokens").exists()
    # found only by reading the documents: the fill stops, and leaves nothing behind
    few = tmp_path / "few.txt"
    few.write_text(SEP.join(f"paragraph {i}" for i in range(10)))
    error(cfg_for(tmp_path, name="hf", path=str(few)), "data.val_fraction=0.05", "holds out none of 10 documents")
    assert [p.name for p in (tmp_path / "cache" / "tokens").glob("*/*")] == []
    # the same checks run in lm_ablate.config.validate, so a sweep is checked before it launches
    for override, key in (("data.num_proc=0", "data.num_proc=0"), ("data.dtype=int8", "data.dtype='int8'")):
        with pytest.raises(ConfigError, match=key):
            validate(compose([override]))
    with pytest.raises(DataError):
        load_data(cfg_for(tmp_path, **hf, tokenizer="pretrained"))
