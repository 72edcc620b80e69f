"""Downstream tasks built from the bundled corpus, so a run shows a downstream number with no network.

Both tasks are read from the four works ``conf/data/shakespeare.yaml`` holds out for validation (Henry V,
Othello, the Sonnets, Twelfth Night: text the default runs never train on) and are built the same way:

1. Lines. Every line of those works whose text (leading indentation aside) is 20-40 bytes long, has single
   spaces between its words, at least 4 words in at least 4 distinct orders, and at least 128 bytes of its
   work before it: 3,734 lines (20-60 bytes would give 9,399, and cost 19% more per item at the same
   accuracy on the default study's models). They are ordered by (work, position) and permuted with ``numpy.random.default_rng(SEED)``;
   the first ``ITEMS`` are the items, so any prefix (``eval.max_examples``) is a sample of all four works.
2. The context: the ``CONTEXT_BYTES[task]`` bytes of the work right before the line's first character
   (newline and indentation included), reaching back to the nearest non-whitespace character when those bytes
   are whitespace only (one item of the order task: a line after a line of spaces), so every context holds
   text (lm-evaluation-harness refuses a context that is empty once its trailing whitespace moves to the
   continuation, lm_ablate/eval/scorer.py): 8 for the order task (the line's own words decide it: on a default
   study's pre-LN model 4, 8 and 16 bytes of context give 0.664, 0.676, 0.684, each +- 0.02), 128 for the
   next-line task (what precedes is the point). The continuation: the line's text. The scorer cuts a context from the
   left to fit ``model.context`` (a 128-token byte model sees about 128 - 40 bytes of the longer one).
3. Choices: the true line and three distractors, the true one at a position drawn uniformly from 0-3 by the
   same generator, so a model that cannot tell the choices apart scores 25% (ties go to choice 0).

    task                   distractors                                        measures
    shakespeare_order      three distinct word-order shuffles of the line     word order given the words (syntax,
                           (the same words and bytes: acc_norm = acc, and a   local grammar); separates the
                           model blind to order ties every choice)            default study's arms
    shakespeare_next_line  three eligible lines from elsewhere in the four    coherence of a line with what
                           works (more than DISTANCE bytes from the true      precedes it; at chance for the
                           line, a different text), of any eligible length    models a CPU trains (acc_norm 0.25
                                                                              after the default study's 150 steps)

Deterministic: the same bytes of the bundled archive give the same items (tests/test_eval_embedded.py).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from lm_ablate.eval.scorer import Example

WORKS = ("henry_v", "othello", "sonnets", "twelfth_night")  # conf/data/shakespeare.yaml's val_works
MIN_BYTES, MAX_BYTES, MIN_WORDS = 20, 40, 4
CONTEXT_BYTES = {"shakespeare_order": 8, "shakespeare_next_line": 128}
LEAD_BYTES = max(CONTEXT_BYTES.values())  # a line needs this much of its work before it
ITEMS = 1000
SEED = 0
CHOICES = 4
DISTANCE = 2000  # next-line distractors come from farther away than this (bytes, or another work)


@dataclass(frozen=True)
class Line:
    work: str
    start: int  # offset of the line's first character in its work
    text: str


def orderings(words: list[str]) -> int:
    """How many distinct sequences the words make (n! / prod k! over repeated words)."""
    count = math.factorial(len(words))
    for k in Counter(words).values():
        count //= math.factorial(k)
    return count


@functools.cache
def eligible_lines() -> tuple[Line, ...]:
    """Every line of WORKS that can be an item (module docstring, step 1), by work and position."""
    from lm_ablate.data import shakespeare_works

    works = shakespeare_works()
    lines = []
    for work in WORKS:
        text, offset = works[work], 0
        for raw in text.split("\n"):
            body = raw.strip()
            start = offset + len(raw) - len(raw.lstrip())
            offset += len(raw) + 1
            words = body.split()
            if not MIN_BYTES <= len(body.encode("utf-8")) <= MAX_BYTES or " ".join(words) != body:
                continue
            if len(words) < MIN_WORDS or orderings(words) < CHOICES or start < LEAD_BYTES:
                continue
            lines.append(Line(work, start, body))
    return tuple(lines)


@functools.cache
def _items(kind: str) -> tuple[Example, ...]:
    from lm_ablate.data import shakespeare_works

    works = shakespeare_works()
    pool = eligible_lines()
    rng = np.random.default_rng(SEED)
    chosen = rng.permutation(len(pool))[:ITEMS]
    items = []
    for index in chosen:
        line = pool[int(index)]
        context = context_before(works[line.work], line.start, CONTEXT_BYTES[kind])
        if kind == "shakespeare_order":
            distractors = shuffles(line.text, rng)
        else:
            distractors = elsewhere(line, pool, rng)
        gold = int(rng.integers(CHOICES))
        choices = [*distractors[:gold], line.text, *distractors[gold:]]
        items.append(Example((context,) * CHOICES, tuple(choices), gold))
    return tuple(items)


def context_before(text: str, start: int, size: int) -> str:
    """The ``size`` characters of ``text`` before ``start``, reaching further back to the nearest character that
    is not whitespace when those are whitespace only (lm-evaluation-harness refuses an empty context, and a
    context is scored without its trailing whitespace)."""
    last = len(text[:start].rstrip()) - 1  # the nearest non-whitespace character before the line
    if last < 0:
        raise ValueError(f"no text before offset {start}")
    return text[min(start - size, last) : start]


def shuffles(text: str, rng: np.random.Generator) -> list[str]:
    """CHOICES - 1 distinct word orders of ``text``, none equal to it."""
    words, seen = text.split(), {text}
    out = []
    while len(out) < CHOICES - 1:
        candidate = " ".join(words[i] for i in rng.permutation(len(words)))
        if candidate not in seen:
            seen.add(candidate)
            out.append(candidate)
    return out


def elsewhere(line: Line, pool: tuple[Line, ...], rng: np.random.Generator) -> list[str]:
    """CHOICES - 1 distinct lines of the pool far from ``line`` (another work, or > DISTANCE bytes away)."""
    seen, out = {line.text}, []
    while len(out) < CHOICES - 1:
        other = pool[int(rng.integers(len(pool)))]
        far = other.work != line.work or abs(other.start - line.start) > DISTANCE
        if far and other.text not in seen:
            seen.add(other.text)
            out.append(other.text)
    return out


def build(kind: str, max_examples: int | None = None) -> list[Example]:
    """The first ``max_examples`` (all ``ITEMS`` when None) items of the embedded task ``kind``."""
    if kind not in CONTEXT_BYTES:
        raise ValueError(f"no embedded task {kind!r}")
    return list(_items(kind)[:max_examples])
