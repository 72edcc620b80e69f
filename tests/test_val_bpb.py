"""Validation bits per byte (lm_ablate/eval/bpb.py, lm_ablate/data/heldout.py), the text budget train.max_bytes,
and the refusal of per-token comparisons across tokenizers (claims, comparisons)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, DataConfig, compose
from lm_ablate.data import BPETokenizer, ByteTokenizer, load_data, shakespeare_works
from lm_ablate.data.heldout import bytes_per_token, encode_pieces, held_out, pick_pieces
from lm_ablate.eval.bpb import IGNORE, bits_per_byte, prepare, total_nats
from lm_ablate.model import TransformerLM
from lm_ablate.train import evaluate, train

pytestmark = pytest.mark.usefixtures("one_thread")
LN2 = math.log(2)
DOCS = [
    "Short one.\n",
    "Caf\u00e9 na\u00efve \u2014 \u00fcber \u65e5\u672c\n" * 3,  # multi-byte UTF-8: bytes, not characters, count
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 6,  # > context
]


def tiny_model(vocab: int, context: int = 32, seed: int = 0) -> TransformerLM:
    cfg = compose(["model=tiny", f"model.context={context}", "model.init_std=0.5"])  # far from uniform
    torch.manual_seed(seed)
    return TransformerLM(cfg, vocab).eval()


def no_autocast():
    return torch.autocast("cpu", enabled=False)


def brute_force_nats(model: TransformerLM, ids: list[int], given: int, context: int) -> float:
    """The docstring's rule written out: the model called on each window of one document, unpadded, every id
    after the separator predicted once."""
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, context):
            x = torch.tensor([ids[start : start + context]])
            y = torch.tensor(ids[start + 1 : start + context + 1])
            ce = torch.nn.functional.cross_entropy(model(x)[0, : len(y)], y, reduction="none").double()
            first_scored = max(0, given - 1 - start)  # targets before this are the separator's own ids
            total += float(ce[first_scored:].sum())
    return total


def test_byte_bpb_is_val_loss_over_ln2_on_the_same_text() -> None:
    tok, context = ByteTokenizer(), 32
    seqs = encode_pieces(tok, DOCS)
    n_bytes = sum(len(d.encode("utf-8")) for d in DOCS)
    text = prepare(seqs, 2, n_bytes, context)
    model = tiny_model(256, context)
    assert text.n_tokens == n_bytes  # every byte scored once, the separator "\n\n" never
    # the loop's validation loss (train.evaluate: mean cross-entropy) over the same windows, in one batch
    val_loss = evaluate(model, [(text.x, text.y)], no_autocast)
    bpb = bits_per_byte(model, text, no_autocast)
    assert bpb == pytest.approx(val_loss / LN2, rel=1e-6)
    brute = sum(brute_force_nats(model, s.tolist(), 2, context) for s in seqs)
    assert bpb == pytest.approx(brute / (LN2 * n_bytes), rel=1e-6)


def test_bpe_bpb_matches_a_brute_force_per_document_computation() -> None:
    bpe = BPETokenizer.train([w[:200_000] for w in shakespeare_works().values()][:3], 400)
    context = 16
    model = tiny_model(bpe.vocab_size, context)
    seqs = encode_pieces(bpe, DOCS)
    n_bytes = sum(len(d.encode("utf-8")) for d in DOCS)
    text = prepare(seqs, 1, n_bytes, context)
    brute, n_tokens = 0.0, 0
    for doc in DOCS:  # the tokenizers library directly, EOS in front: the per-document rule
        ids = [bpe.tok.token_to_id("<|endoftext|>"), *bpe.tok.encode(doc, add_special_tokens=False).ids]
        brute += brute_force_nats(model, ids, 1, context)
        n_tokens += len(ids) - 1
    assert max(map(len, seqs)) > 2 * context  # several windows per document are exercised
    assert text.n_tokens == n_tokens < n_bytes
    assert total_nats(model, text, no_autocast) == pytest.approx(brute, rel=1e-6)
    assert bits_per_byte(model, text, no_autocast) == pytest.approx(brute / (LN2 * n_bytes), rel=1e-6)
    assert int((text.y != IGNORE).sum()) == n_tokens


def test_pieces_are_evenly_spread_line_aligned_and_utf8_whole() -> None:
    raw = "".join(f"line {i} \u00e9\u00e9\u00e9 " + "x" * (i % 37) + "\n" for i in range(3000)).encode()
    pieces = pick_pieces(raw, 4096, 1024)
    assert len(pieces) == 4
    for p in pieces:
        assert 0 < len(p.encode()) <= 1024 and p.endswith("\n") and p.startswith("line ")
        assert p.encode() in raw
    offsets = [raw.find(p.encode()) for p in pieces]
    assert offsets[0] < 1024 and offsets[-1] > len(raw) - 2048 and offsets == sorted(offsets)
    assert pick_pieces(b"short\n", 4096) == ["short\n"]


def test_held_out_text_is_the_same_for_every_tokenizer_and_held_out(tmp_path: Path) -> None:
    cfg = compose([f"data.cache_dir={tmp_path}"]).data
    byte = load_data(cfg)
    text = held_out(cfg, byte.source, 3072)
    val = "\n\n".join(shakespeare_works()[w] for w in sorted(cfg.val_works))
    train = "\n\n".join(t for w, t in shakespeare_works().items() if w not in cfg.val_works)
    assert len(text.pieces) == 3 and all(p in val and p not in train for p in text.pieces)
    assert text.n_bytes == sum(len(p.encode()) for p in text.pieces)
    other = compose([f"data.cache_dir={tmp_path}", "data.tokenizer=bpe", "data.vocab_size=300"]).data
    from lm_ablate.registry import DATASETS

    assert held_out(other, DATASETS.build(other), 3072) == text  # the key ignores the tokenizer


def small_corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    works = shakespeare_works()
    paragraphs = [p for p in works["hamlet"].split("\n\n") if p][:1500]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(paragraphs))
    return path, paragraphs


def test_bytes_per_token_of_bpe_is_the_training_text_over_its_tokens(tmp_path: Path) -> None:
    path, paragraphs = small_corpus(tmp_path)
    cfg = DataConfig(name="hf", path=str(path), tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path / "c"))
    data = load_data(cfg)
    train_docs = [p for i, p in enumerate(paragraphs) if not math.floor((i + 1) * 0.05) > math.floor(i * 0.05)]
    expected = sum(len(p.encode()) for p in train_docs) / len(data.train)
    assert bytes_per_token(data) == pytest.approx(expected, rel=1e-12)
    byte = load_data(DataConfig(name="hf", path=str(path), cache_dir=str(tmp_path / "c")))
    assert bytes_per_token(byte) == pytest.approx(sum(len(p.encode()) for p in train_docs) / len(byte.train))


def run(tmp_path: Path, cache: str, name: str, *over: str) -> dict:
    cfg = compose(["debug=smoke", f"data.cache_dir={cache}", *over])
    return train(cfg, tmp_path / name)


@pytest.mark.slow
def test_a_run_records_val_bpb_at_the_end(tmp_path: Path, cache_dir: str) -> None:
    s = run(tmp_path, cache_dir, "a", "train.max_steps=10", "train.eval_every=5")
    rows = [json.loads(x) for x in (tmp_path / "a" / M.METRICS_FILE).read_text().splitlines()]
    with_bpb = [r for r in rows if M.VAL_BPB in r]
    assert [r[M.STEP] for r in with_bpb] == [10] and M.VAL_LOSS in with_bpb[0]
    assert s[M.FINAL_VAL_BPB] == with_bpb[0][M.VAL_BPB] and 1 < s[M.FINAL_VAL_BPB] < 8
    assert s[M.VAL_BPB_BYTES] == s[M.VAL_BPB_TOKENS] > 2000  # bytes: one token per byte
    assert json.loads((tmp_path / "a" / M.SUMMARY_FILE).read_text())[M.FINAL_VAL_BPB] == s[M.FINAL_VAL_BPB]
    off = run(tmp_path, cache_dir, "b", "train.max_steps=10", "train.val_bpb_bytes=0")
    assert off[M.FINAL_VAL_BPB] is None and "train.val_bpb_bytes=0" in off[M.VAL_BPB_NOTE]


@pytest.mark.slow
def test_max_bytes_gives_byte_and_bpe_arms_the_same_text(tmp_path: Path) -> None:
    path, _ = small_corpus(tmp_path)
    cache = str(tmp_path / "c")
    common = ["data=hf", f"data.path={path}", "train.max_bytes=6000", "train.max_steps=100000", "train.eval_every=1000"]
    byte = run(tmp_path, cache, "byte", *common)
    bpe = run(tmp_path, cache, "bpe", *common, "data.tokenizer=bpe", "data.vocab_size=400")
    tokens_per_step = 4 * 32
    for s in (byte, bpe):
        assert s[M.STOP_REASON] == "max_bytes"
        assert 6000 <= s[M.TRAIN_BYTES] < 6000 + s[M.TRAIN_BYTES_PER_TOKEN] * tokens_per_step  # within one step
        assert s[M.TRAIN_FLOPS] == s[M.FLOPS_PER_TOKEN] * s[M.TOTAL_TOKENS]
        assert s[M.STEPS] == math.ceil(6000 / (s[M.TRAIN_BYTES_PER_TOKEN] * tokens_per_step))
    assert 0.95 < byte[M.TRAIN_BYTES_PER_TOKEN] < 1  # the "\n\n" between paragraphs are separators, not text
    assert bpe[M.STEPS] < byte[M.STEPS] / 1.5  # BPE reads more bytes per step
    assert byte[M.VAL_BPB_BYTES] == bpe[M.VAL_BPB_BYTES] and bpe[M.VAL_BPB_TOKENS] < bpe[M.VAL_BPB_BYTES]


@pytest.mark.parametrize(
    ("over", "needles"),
    [
        (["train.max_bytes=6000", "train.max_tokens=100"], ["train.max_bytes=6000", "train.max_tokens=100"]),
        (["train.max_bytes=600000"], ["train.max_steps=20", "train.max_bytes=600000", "bytes/token"]),
        (["train.max_bytes=0"], ["train.max_bytes=0", "> 0"]),
        (["train.val_bpb_bytes=-1"], ["train.val_bpb_bytes=-1"]),
    ],
)
def test_bad_text_budgets_are_one_line(tmp_path: Path, cache_dir: str, over: list[str], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        run(tmp_path, cache_dir, "x", *over)
    msg = str(info.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    assert not (tmp_path / "x").exists()  # nothing written


# ---------------------------------------------------------------------------------------------- analysis


def write_run(root: Path, name: str, tokenizer: str, vocab: int, seed: int, loss: float, bpb: float | None) -> None:
    d = root / name
    d.mkdir(parents=True)
    claims = [{"id": "c", "source": "s", "statement": "t", "axis": "data.vocab_size", "arm": 512,
               "baseline": 256, "metric": "final_val_bpb", "expect": "lower"}]  # fmt: skip
    cfg = {"seed": seed, "study": "v", "data": {"name": "shakespeare", "tokenizer": tokenizer, "vocab_size": vocab},
           "model": {"vocab_size": vocab}, "claims": claims}  # fmt: skip
    (d / M.CONFIG_FILE).write_text(json.dumps(cfg))
    summary = {M.STATUS: M.STATUS_COMPLETED, M.SEED: seed, M.FINAL_VAL_LOSS: loss, M.STEPS: 10}
    if bpb is not None:
        summary[M.FINAL_VAL_BPB] = bpb
    (d / M.SUMMARY_FILE).write_text(json.dumps(summary))


def test_analysis_reads_bpb_and_refuses_per_token_loss_across_tokenizers(tmp_path: Path) -> None:
    from analysis.compute.claims import evaluate_claims
    from analysis.compute.compare import REFUSED, compare_runs
    from analysis.sources.load import AnalysisError, load_runs
    from lm_ablate.claim_spec import parse_claims

    for seed in range(3):
        write_run(tmp_path, f"byte{seed}", "byte", 256, seed, 1.5 + 0.01 * seed, 2.20 + 0.01 * seed)
        write_run(tmp_path, f"bpe{seed}", "bpe", 512, seed, 4.0 + 0.01 * seed, 2.10 + 0.012 * seed)
    rs = load_runs([tmp_path])
    table = compare_runs(rs, by=["data.vocab_size"], baseline="data.vocab_size=256").table
    arm = table[~table["is_baseline"]].iloc[0]
    assert arm["delta_final_val_bpb"] == pytest.approx(-0.098)  # paired by seed: -0.1, -0.098, -0.096
    assert math.isnan(arm["delta_final_val_loss"]) and table["delta_final_val_loss"].isna().all()
    assert "final_val_bpb" in arm[REFUSED] and "(bpe 512 vs byte)" in arm[REFUSED]
    (result,) = evaluate_claims(rs).results
    assert result.verdict == "held"
    loss_claim = parse_claims([{"id": "l", "source": "s", "statement": "t", "axis": "choices.data", "arm": 512,
                                "baseline": 256, "metric": "final_val_loss", "expect": "lower"}])  # fmt: skip
    loss_claim = [c.__class__(**{**c.__dict__, "axis": "data.vocab_size"}) for c in loss_claim]
    with pytest.raises(AnalysisError) as info:
        evaluate_claims(rs, loss_claim)
    assert "\n" not in str(info.value) and "final_val_bpb" in str(info.value)
    with pytest.raises(ConfigError) as err:  # a tokenizer axis with a per-token metric: refused at launch
        parse_claims([{**loss_claim[0].as_dict(), "axis": "data.tokenizer"}])
    assert "\n" not in str(err.value) and "final_val_bpb" in str(err.value)


def test_runs_made_before_val_bpb_load_and_say_so(tmp_path: Path) -> None:
    from analysis.compute.claims import WHY_NO_BPB, evaluate_claims
    from analysis.compute.compare import REFUSED, compare_runs
    from analysis.present.sections.claims import WHY_TEXT
    from analysis.sources.load import load_runs
    from lm_ablate.claim_spec import parse_claims

    for seed in range(2):  # the same tokenizer: the per-token comparison stands
        write_run(tmp_path, f"old{seed}", "byte", 256, seed, 1.5 + 0.01 * seed, None)
        write_run(tmp_path, f"new{seed}", "byte", 256, seed, 1.4 + 0.01 * seed, None)
        for name, lr in ((f"old{seed}", 0.02), (f"new{seed}", 0.01)):
            cfg = json.loads((tmp_path / name / M.CONFIG_FILE).read_text())
            (tmp_path / name / M.CONFIG_FILE).write_text(json.dumps({**cfg, "optim": {"lr": lr}}))
    rs = load_runs([tmp_path])
    assert rs.runs[M.FINAL_VAL_BPB].isna().all()
    table = compare_runs(rs).table
    assert REFUSED not in table and "final_val_bpb_mean" not in table and table["delta_final_val_loss"].notna().any()
    claim = parse_claims([{"id": "b", "source": "s", "statement": "t", "axis": "optim.lr", "arm": 0.01,
                           "baseline": 0.02, "metric": "final_val_bpb", "expect": "lower"}])  # fmt: skip
    (result,) = evaluate_claims(rs, claim).results
    assert result.verdict == "untested" and result.why == WHY_NO_BPB
    assert WHY_TEXT[WHY_NO_BPB] == "val bits per byte not recorded (run predates val bits per byte)"
