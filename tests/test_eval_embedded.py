"""The embedded offline tasks (lm_ablate/eval/embedded.py): deterministic, built as documented from the held-out
works only, 4 choices with the gold position uniform (chance 25%), and an order-blind model at chance on the
word-order task by construction."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from lm_ablate.config import ConfigError, compose
from lm_ablate.data import shakespeare_works
from lm_ablate.eval import embedded
from lm_ablate.eval.loop import check_embedded
from lm_ablate.eval.scorer import encode_example, score

KINDS = ("shakespeare_order", "shakespeare_next_line")


def test_the_items_are_the_same_bytes_every_build():
    first = {k: embedded.build(k) for k in KINDS}
    embedded._items.cache_clear()
    embedded.eligible_lines.cache_clear()
    assert {k: embedded.build(k) for k in KINDS} == first
    assert len(embedded.eligible_lines()) == 3734 and all(len(first[k]) == embedded.ITEMS for k in KINDS)
    assert embedded.build("shakespeare_order", 5) == first["shakespeare_order"][:5]  # eval.max_examples: a prefix


@pytest.mark.parametrize("kind", KINDS)
def test_items_are_built_as_documented(kind):
    works = {w: shakespeare_works()[w] for w in embedded.WORKS}
    items = embedded.build(kind)
    golds = Counter(ex.gold for ex in items)
    assert sorted(golds) == [0, 1, 2, 3] and all(200 <= n <= 300 for n in golds.values()), golds  # ~uniform
    for ex in items:
        gold = ex.continuations[ex.gold]
        assert len(ex.continuations) == 4 == len(set(ex.continuations))
        context = ex.contexts[0]
        assert len(set(ex.contexts)) == 1 and len(context) >= embedded.CONTEXT_BYTES[kind]
        if len(context) > embedded.CONTEXT_BYTES[kind]:  # reached back: the first character is the only text
            assert not context[1:].strip() and context[0].strip(), repr(context)
        # the context is the text right before the true line, in a held-out work
        assert any(ex.contexts[0] + gold in text for text in works.values())
        assert 20 <= len(gold) <= 40 and len(gold.split()) >= 4 and " ".join(gold.split()) == gold
        for other in ex.continuations:
            if kind == "shakespeare_order":  # the same words in another order
                assert sorted(other.split()) == sorted(gold.split())
            else:  # another line of the held-out works, found far from this one or in another work
                assert any("\n" + other in text or other in text for text in works.values())


@pytest.mark.parametrize("kind", KINDS)
def test_every_context_holds_text(kind):
    """lm-evaluation-harness asserts a context that is not empty once its trailing whitespace is moved
    (item 429 of the order task followed a line of spaces: its 8 bytes were whitespace only)."""
    assert all(ex.contexts[0].strip() for ex in embedded.build(kind))
    text = "Act I\n" + " " * 7 + "\n  A line"
    assert embedded.context_before(text, text.index("A line"), 8) == "I\n" + " " * 7 + "\n  "
    assert embedded.context_before(text, text.index("A line"), 4) == "I\n" + " " * 7 + "\n  "
    assert embedded.context_before(text, 3, 2) == "ct"


def test_an_order_blind_model_is_at_chance_on_the_order_task():
    """Shuffles hold the same bytes as the true line: a unigram model gives every choice the same
    log-likelihood, ties go to choice 0, so its accuracy is the share of items whose gold is 0 (~25%)."""

    class Unigram(nn.Module):
        def __init__(self):
            super().__init__()
            self.logits = torch.randn(256)

        def forward(self, x):
            return self.logits.expand(*x.shape, 256)

    items = embedded.build("shakespeare_order", 400)
    encoded = [encode_example(lambda s: list(s.encode()), ex, 128, "t") for ex in items]
    got = score(Unigram(), encoded)
    assert got["acc"] == got["acc_norm"] == pytest.approx(sum(ex.gold == 0 for ex in items) / len(items))
    assert 0.2 < got["acc"] < 0.3


def test_a_run_that_trains_on_the_held_out_works_cannot_score_them():
    cfg = compose(["eval=shakespeare", "data.val_works=[henry_v,othello]"])
    with pytest.raises(ConfigError) as err:
        check_embedded(cfg)
    assert str(err.value).startswith("data.val_works=['henry_v', 'othello'] is invalid: shakespeare_order scores "
                                     "lines of henry_v, othello, sonnets, twelfth_night, and this run trains on "
                                     "sonnets, twelfth_night")  # fmt: skip
    check_embedded(compose(["eval=shakespeare"]))  # the default split holds them out
