"""The scorer: a task's examples and a model in, its downstream metrics out (:func:`score`).

An example is a set of choices, each a (context, continuation) pair of strings, and the index of the gold
choice. Multiple-choice tasks share one context across their choices; WinoGrande's partial scoring shares the
continuation and varies the context; LAMBADA has one choice, the gold continuation. For choice j of example i,

    ll_ij = sum over the continuation's tokens t of  log p(t | context, the continuation's tokens before t)

and the metrics, each the mean over the task's examples:

    metric    per example                                          source
    acc       [argmax_j ll_ij == gold]                             ranked classification (Brown et al. 2020, GPT-3
              (one-choice tasks: every continuation token is       §3; lm-evaluation-harness ``acc``); LAMBADA:
              the model's argmax, i.e. greedy decoding gives it)   last-word accuracy (Paperno et al. 2016)
    acc_norm  [argmax_j ll_ij / chars_ij == gold]                  OLMES's per-character normalisation (Gu et al.
              chars_ij = len(continuation_ij) in characters,       2024, §3.4 "character"; lm-evaluation-harness
              leading space included, the context's moved          ``acc_norm``, len(choice)); none for one-choice
              whitespace not                                       tasks
    bpb       -ll_i,gold / (ln 2 * bytes_i,gold)                   bits per byte of the gold continuation (OLMo-core's
              bytes = UTF-8 bytes of the text the gold's           downstream BPB; Gao et al. 2020, The Pile §3.1):
              continuation tokens stand for: the context's         numerator and denominator over the same text
              trailing whitespace + the gold continuation

``argmax`` takes the lowest index on ties, so a model that cannot tell the choices apart scores the share of
examples whose gold is choice 0 (1/4 on the embedded tasks, where the gold position is uniform).

How the log-likelihoods are computed (:func:`loglikelihoods`): a context's trailing whitespace (spaces,
newlines, indentation: ``n = len(context) - len(context.rstrip())``) moves to the front of the continuation,
then ``whole = encode(context + continuation)`` and ``continuation ids = whole[len(encode(context)):]``:
lm-evaluation-harness's ``_encode_pair`` (lm_eval/api/model.py, 0.4.13) exactly, so a BPE does not end the
context on whitespace and the same task file gives lm-eval's numbers (tests/test_lm_eval.py compares them
item for item). The gold's ``bytes`` (bpb) are those of the text its continuation ids stand for: the moved
whitespace + the gold continuation, or, where a BPE merges across the boundary (the context's tokens are then
no prefix of ``whole``'s), the UTF-8 bytes of ``decode(continuation ids)``. The sequence context +
continuation is cut from the left to ``context_len + 1`` tokens (the model's ``model.context``; the
continuation itself must fit); sequences are sorted by length and packed into right-padded batches of at most
``batch_tokens`` tokens (padding included), so the [batch, length, vocab] logits stay bounded; right padding
is invisible to a causal model. The fp32 token log-probabilities are summed in fp64, where a few dozen of them
add exactly: the same tokens' log-probabilities in another order give the same total, so a model blind to
order ties the choices instead of ranking them by rounding. One forward pass per batch in eval mode without
gradients; the model's train/eval mode is restored afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lm_ablate.errors import ConfigError

LN2 = math.log(2.0)
KINDS = ("acc", "acc_norm", "bpb")  # the metrics every multiple-choice task reports (one-choice: no acc_norm)


@dataclass(frozen=True)
class Example:
    """One item: choice j is the pair (contexts[j], continuations[j]); ``gold`` indexes the right one."""

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int


@dataclass(frozen=True)
class Encoded:
    """An example's choices as token ids (after the cut to the model's context)."""

    contexts: tuple[tuple[int, ...], ...]
    continuations: tuple[tuple[int, ...], ...]
    gold: int
    chars: tuple[int, ...]  # characters of each continuation string (acc_norm)
    gold_bytes: int  # UTF-8 bytes of the text the gold's continuation ids stand for (bpb)


def split_pair(context: str, continuation: str) -> tuple[str, str]:
    """(context, continuation) with the context's trailing whitespace moved to the continuation, as
    lm-evaluation-harness's ``_encode_pair``: ``n = len(context) - len(context.rstrip())``."""
    n = len(context) - len(context.rstrip())
    return (context[:-n], context[-n:] + continuation) if n else (context, continuation)


def encode_pair(encode: Callable[[str], Sequence[int]], context: str, continuation: str) -> tuple[list, list]:
    """(context ids, continuation ids) as described in the module docstring (lm-eval's ``_encode_pair``)."""
    context, continuation = split_pair(context, continuation)
    whole = [int(i) for i in encode(context + continuation)]
    n = len([int(i) for i in encode(context)])
    return whole[:n], whole[n:]


def continuation_bytes(
    encode: Callable[[str], Sequence[int]],
    decode: Callable[[Sequence[int]], str] | None,
    context: str,
    continuation: str,
) -> int:
    """UTF-8 bytes of the text the continuation ids of :func:`encode_pair` stand for: the moved whitespace +
    ``continuation`` when the context's own ids begin the whole's, else ``decode(continuation ids)``'s."""
    context, continuation = split_pair(context, continuation)
    whole = [int(i) for i in encode(context + continuation)]
    ctx = [int(i) for i in encode(context)]
    if whole[: len(ctx)] == ctx:
        return len(continuation.encode("utf-8"))
    if decode is None:
        raise ValueError(f"the tokenizer merges across the boundary of {context[-20:]!r} | {continuation[:20]!r}: "
                         "encode_example needs its decode to count the bytes the continuation ids stand for")  # fmt: skip
    return len(decode(whole[len(ctx) :]).encode("utf-8"))


def fit(ctx: Sequence[int], cont: Sequence[int], context_len: int, where: str) -> tuple[tuple, tuple]:
    """(context, continuation) ids cut from the left to ``context_len + 1`` tokens; one-line ConfigError naming
    ``where`` when the continuation alone does not fit."""
    if len(cont) > context_len:
        raise ConfigError(f"{where}: a continuation of {len(cont)} tokens does not fit the model's context "
                          f"({context_len} tokens, model.context)")  # fmt: skip
    keep = context_len + 1 - len(cont)  # context tokens that fit before the continuation
    return tuple(ctx[-keep:]), tuple(cont)


def encode_example(
    encode: Callable[[str], Sequence[int]],
    example: Example,
    context_len: int,
    where: str,
    decode: Callable[[Sequence[int]], str] | None = None,
) -> Encoded:
    """Token ids of every choice; one-line ConfigError naming ``where`` when a choice cannot be scored.
    ``decode`` (the tokenizer's) counts the gold's bytes where a BPE merges across the boundary."""
    contexts, continuations = [], []
    for ctx_text, cont_text in zip(example.contexts, example.continuations):
        ctx, cont = encode_pair(encode, ctx_text, cont_text)
        if not ctx or not cont:
            part = "context" if not ctx else "continuation"
            raise ConfigError(f"{where}: its {part} {ctx_text if not ctx else cont_text!r} is empty once tokenized")
        ctx, cont = fit(ctx, cont, context_len, where)
        contexts.append(ctx)
        continuations.append(cont)
    gold = example.gold
    gold_bytes = continuation_bytes(encode, decode, example.contexts[gold], example.continuations[gold])
    chars = tuple(len(c) for c in example.continuations)
    return Encoded(tuple(contexts), tuple(continuations), gold, chars, gold_bytes)


@torch.no_grad()
def loglikelihoods(
    model: nn.Module,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    batch_tokens: int = 4096,
    device: torch.device | str = "cpu",
    autocast: Callable = nullcontext,
) -> list[tuple[float, bool]]:
    """(sum of log p(continuation | context), greedy) for each (context ids, continuation ids) request, in the
    requests' order; ``greedy``: every continuation token is the model's argmax. Context + continuation must
    already fit the model (:func:`encode_example` cuts them). Batched and padded as the module docstring says."""
    out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    seqs = [(list(c) + list(t), len(t)) for c, t in requests]
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i][0]))
    was_training = model.training
    model.eval()
    try:
        start = 0
        while start < len(order):
            longest = len(seqs[order[start]][0]) - 1
            rows = max(1, batch_tokens // max(1, longest))
            batch = order[start : start + rows]
            start += len(batch)
            x = torch.zeros(len(batch), longest, dtype=torch.long)
            y = torch.zeros(len(batch), longest, dtype=torch.long)
            scored = torch.zeros(len(batch), longest, dtype=torch.bool)
            for r, i in enumerate(batch):
                tokens, n_cont = seqs[i]
                n = len(tokens) - 1
                x[r, :n] = torch.tensor(tokens[:-1])
                y[r, :n] = torch.tensor(tokens[1:])
                scored[r, n - n_cont : n] = True
            x, y, scored = x.to(device), y.to(device), scored.to(device)
            with autocast():
                logits = model(x)
            rows_of = scored.nonzero()[:, 0]  # the continuation positions only, row by row
            picked, targets = logits[scored].float(), y[scored]
            token_logp = torch.log_softmax(picked, dim=-1).gather(-1, targets[:, None])[:, 0]
            zeros = torch.zeros(len(batch), dtype=torch.float64, device=x.device)
            sums = zeros.index_add(0, rows_of, token_logp.double()).tolist()  # exact for fp32 terms: order-free
            misses = zeros.index_add(0, rows_of, (picked.argmax(-1) != targets).double())
            greedy = (misses == 0).tolist()
            for r, i in enumerate(batch):
                out[i] = (sums[r], bool(greedy[r]))
    finally:
        model.train(was_training)
    return out


def score(
    model: nn.Module,
    examples: Sequence[Encoded],
    batch_tokens: int = 4096,
    device: torch.device | str = "cpu",
    autocast: Callable = nullcontext,
) -> dict[str, float | None]:
    """The task's ``acc``, ``acc_norm`` (None for one-choice tasks) and ``bpb`` (the module docstring's table),
    means over ``examples`` (encoded by :func:`encode_example`)."""
    requests = [(c, t) for e in examples for c, t in zip(e.contexts, e.continuations)]
    results = loglikelihoods(model, requests, batch_tokens, device, autocast)
    acc, acc_norm, bpb = [], [], []
    k = 0
    for e in examples:
        n = len(e.continuations)
        ll = np.array([r[0] for r in results[k : k + n]])
        if n == 1:
            acc.append(float(results[k][1]))
        else:
            acc.append(float(int(np.argmax(ll)) == e.gold))
            acc_norm.append(float(int(np.argmax(ll / np.array(e.chars))) == e.gold))
        bpb.append(-ll[e.gold] / (LN2 * e.gold_bytes))
        k += n
    mean = lambda xs: float(np.mean(xs)) if xs else None
    return {"acc": mean(acc), "acc_norm": mean(acc_norm), "bpb": mean(bpb)}
