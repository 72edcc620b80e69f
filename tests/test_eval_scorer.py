"""The downstream scorer (lm_ablate/eval/scorer.py) against a brute-force computation: one sequence at a time,
no padding, no batching, the log-probabilities summed position by position in Python, the metrics written out
from their definitions; and models whose answers are known by construction (uniform, bigram) for the switches
acc vs acc_norm, greedy last-word accuracy and bits per byte."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lm_ablate.config import compose
from lm_ablate.eval.scorer import Example, encode_example, encode_pair, loglikelihoods, score
from lm_ablate.model import TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")
V = 256


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


@pytest.fixture(scope="module")
def model() -> TransformerLM:
    torch.manual_seed(0)
    cfg = compose(["model=tiny", "model.context=32"])
    m = TransformerLM(cfg, V)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)  # logits of a few units: choices differ clearly
    return m.train()  # the scorer must switch to eval mode itself (and back)


def brute_ll(model: nn.Module, context: list[int], continuation: list[int], context_len: int) -> tuple[float, bool]:
    tokens = (context + continuation)[-(context_len + 1) :]
    model.eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([tokens[:-1]])).double(), -1)[0]
    model.train()
    total, greedy = 0.0, True
    for k in range(len(tokens) - len(continuation), len(tokens)):
        total += float(logp[k - 1, tokens[k]])
        greedy &= int(logp[k - 1].argmax()) == tokens[k]
    return total, greedy


def split(context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The context's trailing whitespace belongs to the continuation (lm-evaluation-harness's _encode_pair)."""
    kept = context.rstrip()
    return encode(kept), encode(context[len(kept) :] + continuation)


EXAMPLES = [
    Example(("Question: what is it?\nAnswer:",) * 3, (" a cat", " the dog over there", " x"), 1),
    Example(("abc",) * 2, (" defg", " hij"), 0),
    Example(("The sentence with Ann", "The sentence with Bob"), (" ran home.", " ran home."), 1),
    # longer than model.context (32): the context is cut from the left
    Example(("a long context " * 5,) * 4, (" one", " two", " three", " four"), 3),
    # a context ending in a newline and indentation (the embedded tasks): all of it moves to the continuation
    Example(("thus.\n\n  ",) * 2, ("So be it", "it be so"), 1),
]


def test_loglikelihoods_equal_a_one_sequence_brute_force_at_every_batch_size(model):
    requests, expected = [], []
    for ex in EXAMPLES:
        enc = encode_example(encode, ex, 32, "t")
        for c, t in zip(enc.contexts, enc.continuations):
            requests.append((c, t))
    # the brute force reads the untruncated strings and cuts them itself
    for ex in EXAMPLES:
        for c, t in zip(ex.contexts, ex.continuations):
            expected.append(brute_ll(model, *split(c, t), 32))
    for batch_tokens in (1, 40, 100, 10_000):  # one row per batch .. everything in one padded batch
        got = loglikelihoods(model, requests, batch_tokens=batch_tokens)
        assert [g for _, g in got] == [g for _, g in expected]
        for (a, _), (b, _) in zip(got, expected):
            assert a == pytest.approx(b, abs=1e-5)
    assert model.training  # mode restored


def test_score_is_the_mean_of_the_metrics_written_out_per_example(model):
    encoded = [encode_example(encode, ex, 32, "t") for ex in EXAMPLES]
    got = score(model, encoded, batch_tokens=64)
    acc, acc_norm, bpb = [], [], []
    for ex in EXAMPLES:
        ll = [brute_ll(model, *split(c, t), 32)[0] for c, t in zip(ex.contexts, ex.continuations)]
        best = max(range(len(ll)), key=lambda j: (ll[j], -j))  # first index on ties
        norm = [ll[j] / len(ex.continuations[j]) for j in range(len(ll))]
        best_norm = max(range(len(ll)), key=lambda j: (norm[j], -j))
        acc.append(best == ex.gold)
        acc_norm.append(best_norm == ex.gold)
        scored_text = split(ex.contexts[ex.gold], ex.continuations[ex.gold])[1]  # the bytes the ll covers
        bpb.append(-ll[ex.gold] / (math.log(2) * len(scored_text)))
    assert got["acc"] == pytest.approx(sum(acc) / len(acc))
    assert got["acc_norm"] == pytest.approx(sum(acc_norm) / len(acc_norm))
    assert got["bpb"] == pytest.approx(sum(bpb) / len(bpb), abs=1e-6)


class Uniform(nn.Module):
    """Every next token has probability 1/256: a choice's log-likelihood is -len * ln 256."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*x.shape, V)


class Bigram(nn.Module):
    """The next token is most likely the current one + 1: greedy decoding after "a" writes "bcd..."."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 5.0 * nn.functional.one_hot((x + 1) % V, V).float()


def test_acc_norm_divides_by_characters_and_bpb_is_bits_per_utf8_byte():
    ex = Example(("ctx",) * 2, (" aaaa", " a"), 0)
    scores = score(Uniform(), [encode_example(encode, ex, 32, "t")])
    assert scores["acc"] == 0.0  # the shorter choice has the larger total log-likelihood
    assert scores["acc_norm"] == 1.0  # per character they tie: the first index wins
    assert scores["bpb"] == pytest.approx(8.0)  # ln 256 nats per byte = 8 bits
    # multi-byte characters: bytes, not characters, divide the bits
    ex = Example(("ctx",) * 2, (" é", " e"), 0)
    scores = score(Uniform(), [encode_example(encode, ex, 32, "t")])
    assert scores["bpb"] == pytest.approx(8.0)  # 3 byte-tokens, 3 bytes


def test_one_choice_tasks_score_greedy_accuracy():
    hit = Example(("xa",), ("bcd",), 0)
    miss = Example(("xa",), ("bce",), 0)
    scores = score(Bigram(), [encode_example(encode, e, 32, "t") for e in (hit, miss, hit, hit)])
    assert scores["acc"] == 0.75 and scores["acc_norm"] is None


def test_batches_stay_within_the_token_budget_without_gradients():
    seen = []

    class Spy(Uniform):
        def forward(self, x):
            seen.append((x.numel(), torch.is_grad_enabled(), self.training))
            return super().forward(x)

    exs = [Example(("c" * k,) * 2, (" a", " bb"), 0) for k in range(1, 30)]
    score(Spy(), [encode_example(encode, e, 32, "t") for e in exs], batch_tokens=50)
    assert seen and all(n <= 50 for n, _, _ in seen) and not any(g or t for _, g, t in seen)


def test_trailing_whitespace_of_a_context_moves_to_the_continuation():
    assert encode_pair(encode, "Answer: ", "yes") == (encode("Answer:"), encode(" yes"))
    assert encode_pair(encode, "thus.\n\n  ", "So") == (encode("thus."), encode("\n\n  So"))
    assert encode_pair(encode, "a\t \n", "b") == (encode("a"), encode("\t \nb"))


def test_bpb_counts_the_bytes_its_log_likelihood_covers():
    """A uniform byte model spends 8 bits on every byte it scores: bpb is 8 exactly when numerator and
    denominator cover the same text, moved whitespace included (gold bytes alone would give 8 * 5 / 3)."""
    ex = Example(("ctx\n\n",) * 2, ("abc", "xyz"), 0)
    enc = encode_example(encode, ex, 32, "t")
    assert enc.gold_bytes == 5 and enc.chars == (3, 3)  # acc_norm: the choice's own characters (lm-eval)
    assert score(Uniform(), [enc])["bpb"] == pytest.approx(8.0)


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE trained here on a few words, so "Hello" is one token and "Hel" is not."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Hello world, Hello there. Help! Hello.\n\n"] * 50, trainer=trainer)
    return tok


def test_bpb_where_a_bpe_moves_the_boundary_counts_what_the_continuation_ids_decode_to(bpe):
    """lm-eval's split (whole[len(encode(context)):]) can hand the context's last characters to the
    continuation's ids or the reverse: the denominator is then the bytes of what those ids decode to."""
    enc = lambda s: bpe.encode(s).ids
    dec = lambda ids: bpe.decode(list(ids))
    context, gold = "Say Hel", "lo world"  # "Hello" is one token: it lands among the continuation's ids...
    whole, ctx = enc(context + gold), enc(context)
    assert whole[: len(ctx)] != ctx  # ...the boundary moved
    covered = "".join(bpe.id_to_token(i) for i in whole[len(ctx) :]).replace("\u0120", " ")  # Ġ: byte-level space
    ex = Example((context,) * 2, (gold, "lo there"), 0)
    got = encode_example(enc, ex, 32, "t", dec)
    assert got.gold_bytes == len(covered.encode()) != len(gold.encode())
    vocab = bpe.get_vocab_size()

    class UniformV(nn.Module):
        def forward(self, x):
            return torch.zeros(*x.shape, vocab)

    n_tokens = len(whole) - len(ctx)
    assert score(UniformV(), [got])["bpb"] == pytest.approx(n_tokens * math.log2(vocab) / len(covered.encode()))
    with pytest.raises(ValueError, match="needs its decode"):
        encode_example(enc, ex, 32, "t")
    # where the boundary holds (a continuation after whitespace), the moved whitespace + gold, decode unused
    plain = encode_example(enc, Example(("Say\n\n",), ("Hello there",), 0), 32, "t")
    assert plain.gold_bytes == len("\n\nHello there")


def test_a_continuation_longer_than_the_context_is_one_line():
    with pytest.raises(ValueError, match=r"^task example 3: a continuation of 40 tokens does not fit"):
        encode_example(encode, Example(("c",), ("x" * 40,), 0), 32, "task example 3")
