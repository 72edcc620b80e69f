"""The data's unigram level (lm_ablate/data/unigram.py) and the stall rule (lm_ablate/stall.py), and that the loop
records both in summary.json (issue 23.2)."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from lm_ablate import metrics as M
from lm_ablate import stall
from lm_ablate.config import compose
from lm_ablate.data import TokenShards, load_data
from lm_ablate.data import unigram as U
from lm_ablate.data.common import TokenData

pytestmark = pytest.mark.usefixtures("one_thread")


def brute_unigram(train: list[int], val: list[int], vocab: int) -> float:
    """Add-one smoothed unigram cross-entropy, written out token by token."""
    seen = Counter(train)
    total = 0.0
    for token in val:
        total -= math.log((seen[token] + 1) / (len(train) + vocab))
    return total / len(val)


def test_unigram_loss_against_a_token_by_token_count(monkeypatch):
    rng = np.random.default_rng(0)
    train = rng.zipf(1.5, size=5000) % 40  # skewed, and id 39 may never occur
    train = train[train != 7]  # an id seen only in validation: smoothing keeps it finite
    val = np.concatenate([rng.zipf(1.5, size=700) % 40, [7, 7, 39]])
    want = brute_unigram(train.tolist(), val.tolist(), 50)
    monkeypatch.setattr(U, "CHUNK", 333)  # several chunks per split
    shards = TokenShards([train[:1234].astype(np.uint16), train[1234:].astype(np.uint16)])
    assert U.unigram_loss(shards, val.astype(np.uint16), 50) == pytest.approx(want, rel=1e-12)
    assert U.unigram_loss(train, val, 50) == pytest.approx(want, rel=1e-12)
    # a uniform stream over the whole vocabulary is at ln V
    flat = np.tile(np.arange(16), 100)
    assert U.unigram_loss(flat, flat, 16) == pytest.approx(math.log(16), rel=1e-3)


def brute_bigram(streams: list[list[int]], val: list[int], vocab: int) -> float:
    """Add-one smoothed bigram cross-entropy, written out pair by pair (pairs within each stream only)."""
    pairs = Counter((a, b) for stream in streams for a, b in zip(stream, stream[1:]))
    starts = Counter(a for stream in streams for a in stream[:-1])
    logs = [math.log((pairs[a, b] + 1) / (starts[a] + vocab)) for a, b in zip(val, val[1:])]
    return -sum(logs) / len(logs)


def test_bigram_loss_against_a_pair_by_pair_count(monkeypatch):
    rng = np.random.default_rng(1)
    train = rng.zipf(1.4, size=3000) % 30
    val = np.concatenate([rng.zipf(1.4, size=500) % 30, [29, 7, 29]])
    monkeypatch.setattr(U, "CHUNK", 257)  # pairs across chunk boundaries are counted once
    want = brute_bigram([train[:1000].tolist(), train[1000:].tolist()], val.tolist(), 32)
    shards = TokenShards([train[:1000].astype(np.uint16), train[1000:].astype(np.uint16)])
    assert U.bigram_loss(shards, val.astype(np.uint16), 32) == pytest.approx(want, rel=1e-12)
    whole = brute_bigram([train.tolist()], val.tolist(), 32)
    assert whole != pytest.approx(want, rel=1e-9)  # the pair across the shard boundary is not a pair
    assert U.bigram_loss(train, val, 32) == pytest.approx(whole, rel=1e-12)
    # a stream that repeats 0 1 2 ... 15: each next token is certain, so far below the unigram's ln 16
    cycle = np.tile(np.arange(16), 200)
    assert U.bigram_loss(cycle, cycle, 16) < 0.1 < math.log(16) - 0.01 < U.unigram_loss(cycle, cycle, 16)
    assert U.bigram_loss(cycle, cycle, U.BIGRAM_MAX_VOCAB + 1) is None


def test_unigram_loss_is_cached_per_data_key(tmp_path, monkeypatch):
    data = TokenData(np.array([0, 1, 1, 2]), np.array([1, 2]), 4, None, "k1")
    first = U.data_unigram_loss(data, tmp_path)
    assert first == pytest.approx(brute_unigram([0, 1, 1, 2], [1, 2], 4))
    record = json.loads((tmp_path / "unigram" / "k1.json").read_text())
    assert record["smoothing"] == "add-one" and record["vocab_size"] == 4
    assert record["bigram_loss"] == pytest.approx(brute_bigram([[0, 1, 1, 2]], [1, 2], 4))
    monkeypatch.setattr(U, "unigram_loss", lambda *a: pytest.fail("counted again"))
    monkeypatch.setattr(U, "bigram_loss", lambda *a: pytest.fail("counted again"))
    assert U.data_unigram_loss(data, tmp_path) == first
    assert U.data_levels(data, tmp_path)["bigram_loss"] == record["bigram_loss"]


def test_bundled_corpus_unigram_level(cache_dir):
    """DESIGN.md: 3.31 nats/byte for the Shakespeare validation split; its bigram model's 2.50 is 2.51 with the
    add-one smoothing over all 256 bytes."""
    data = load_data(compose([f"data.cache_dir={cache_dir}"]).data)
    assert U.unigram_loss(data.train, data.val, data.vocab_size) == pytest.approx(3.31, abs=0.005)
    assert U.bigram_loss(data.train, data.val, data.vocab_size) == pytest.approx(2.514, abs=0.002)


@pytest.mark.parametrize(
    ("losses", "unigram", "expected"),
    [
        ([3.9, 3.32, 3.30], 3.31, stall.UNIGRAM),  # on the plateau
        ([3.9, 3.40, 3.25], 3.31, stall.UNIGRAM),  # 1.8% below it: still within the 2% margin
        ([3.9, 3.0, 3.22], 3.31, None),  # 2.7% below: left it
        ([4.6, 4.59, 4.58], 3.31, stall.UNIGRAM),  # above the plateau
        ([2.90, 2.88], 3.31, stall.FLAT),  # fell 0.7%: a plateau elsewhere
        ([2.90, 2.85], 3.31, None),  # fell 1.7%
        ([2.90, 2.88], None, stall.FLAT),  # without the unigram level the flat rule still applies
        ([3.30], None, None),  # one evaluation and no level: cannot tell
        ([3.30], 3.31, stall.UNIGRAM),
        ([2.9, 2.5, math.nan], 3.31, None),  # the last loss is not finite: diverged, not stalled
        ([math.nan, 2.90, 2.89], 3.31, stall.FLAT),  # a non-finite loss before the last is left out
        ([], 3.31, None),
    ],
)
def test_stall_rule(losses, unigram, expected):
    assert stall.reason(losses, unigram) == expected


@pytest.mark.parametrize(
    ("losses", "steps", "expected"),
    [
        # a ladder's smallest rung: evaluated at steps 250 and 314 of 314, falling 1.1%: too late to tell
        ([2.532, 2.505], [250, 314], None),
        ([2.53, 2.505], [157, 314], stall.FLAT),  # the first one at half the run: a flat second half
        ([2.53, 2.505], None, stall.FLAT),  # steps unknown: the first evaluation, as before
        ([2.53, 2.505], [314], stall.FLAT),  # not one step per loss (resumed from an older checkpoint): unknown
        ([3.0, 2.53, 2.505], [100, 250, 314], None),  # fell 16% from the first one within the first half
        ([2.60, 2.90, 2.59], [100, 250, 314], stall.FLAT),  # fell 0.4% from there (rose in between)
        ([2.90, math.nan, 2.89], [100, 200, 300], stall.FLAT),  # non-finite losses are left out with their steps
        ([2.53, 3.30], [250, 314], stall.UNIGRAM),  # the unigram test needs no early evaluation
    ],
)
def test_flat_test_starts_within_the_first_half_of_the_run(losses, steps, expected):
    assert stall.reason(losses, 3.31, steps) == expected


def test_analysis_judges_the_flat_test_by_the_logged_steps(tmp_path):
    """The runs table re-judges each run from metrics.jsonl with the evaluations' steps: two late evaluations of a
    short run are not a plateau; the same losses with the first one at half the run are."""
    from analysis.sources.load import load_runs
    from tests.test_claims import run_config, write_run

    curves = {"late": [(0, 5.5), (250, 2.53), (314, 2.505)], "half": [(0, 5.5), (157, 2.53), (314, 2.505)]}
    for name, val in curves.items():
        summary = {M.STATUS: M.STATUS_COMPLETED, M.SEED: 0, M.FINAL_VAL_LOSS: 2.505, M.STEPS: 314,
                   M.UNIGRAM_LOSS: 3.31, M.VOCAB_SIZE: 256, M.STALLED: True, M.STALL_REASON: stall.FLAT}  # fmt: skip
        write_run(tmp_path / name, run_config("pre", 0), summary, val, 1000.0)
    runs = load_runs([tmp_path]).runs.set_index("run_id")
    assert runs[M.STALLED].to_dict() == {"late": False, "half": True}
    assert runs.loc["half", M.STALL_REASON] == stall.FLAT and pd.isna(runs.loc["late", M.STALL_REASON])


def test_stall_rule_from_a_logged_curve():
    """after_init drops step 0 and the rows without an evaluation (NaN in a history table), in step order."""
    steps = [20, 0, 10, 5, 15]
    losses = [2.5, 5.5, 3.0, math.nan, 2.9]
    assert stall.after_init(steps, losses) == [3.0, 2.9, 2.5]
    assert stall.evaluations(steps, losses) == ([10.0, 15.0, 20.0], [3.0, 2.9, 2.5])


def test_summary_records_levels_and_the_stall_flag(tmp_path, cache_dir, monkeypatch):
    from lm_ablate.train import train

    judged, rule = [], stall.reason  # the loop's own judgment gets the steps it evaluated at
    monkeypatch.setattr(stall, "reason", lambda v, u=None, s=None: judged.append((list(v), list(s))) or rule(v, u, s))

    cfg = compose(["debug=smoke", f"data.cache_dir={cache_dir}", "train.max_steps=4", "train.eval_every=2"])
    summary = train(cfg, tmp_path / "run")
    on_disk = json.loads((tmp_path / "run" / M.SUMMARY_FILE).read_text())
    data = load_data(cfg.data)
    assert on_disk[M.UNIGRAM_LOSS] == pytest.approx(U.unigram_loss(data.train, data.val, 256), rel=1e-12)
    assert on_disk[M.LOG_VOCAB] == pytest.approx(math.log(256))
    assert on_disk[M.BIGRAM_LOSS] == pytest.approx(U.bigram_loss(data.train, data.val, 256), rel=1e-12)
    rows = [json.loads(line) for line in (tmp_path / "run" / M.METRICS_FILE).read_text().splitlines()]
    steps, val = stall.evaluations(
        [r[M.STEP] for r in rows if M.VAL_LOSS in r], [r[M.VAL_LOSS] for r in rows if M.VAL_LOSS in r]
    )
    assert len(val) == 2 and steps == [2.0, 4.0] and judged[-1] == (val, [2, 4])
    why = stall.reason(val, on_disk[M.UNIGRAM_LOSS], steps)
    assert on_disk[M.STALLED] is (why is not None) and on_disk[M.STALL_REASON] == why
    assert why == stall.UNIGRAM  # 4 steps of a tiny model: nowhere near below the unigram level
    assert on_disk[M.STALL_RULE] == stall.RULE and summary[M.STALLED] is True
