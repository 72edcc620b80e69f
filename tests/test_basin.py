"""Basins (analysis/compute/basin.py) and basin claims (relative_val_loss / relative_val_bpb, expect within |
worse): a planted run set whose losses per axis value, LR and seed are known, so each point's best LR, its loss
relative to the best point and the 95% interval are computed here by hand (the paired Student-t interval written
out with scipy's t quantile), and the verdicts flip where the planted numbers cross the margin."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from analysis.compute.basin import basin_of, basins
from analysis.compute.claims import (
    CONTRADICTED,
    HELD,
    INCONCLUSIVE,
    NOTE_LR_AT_EDGE,
    UNTESTED,
    WHY_NO_ARM,
    WHY_STALLED,
    evaluate_claims,
)
from analysis.compute.compare import compare_runs
from analysis.sources.load import SUMMARY_KEYS, TEXT_SUMMARY_KEYS, AnalysisError, RunRecord, assemble, flatten
from lm_ablate import metrics as M
from lm_ablate.claim_spec import check_claims_against_arms, parse_claims
from lm_ablate.config import ConfigError

KEY = "model.ffn_ratio"
SEEDS = (0, 1, 2)
SEED_OFFSET = {0: 0.0, 1: 0.021, 2: -0.013}  # shared by every point: the paired test removes it
# each ratio's own LR grid and the LR it is best at (x = 16 is best at its grid's largest LR: not bracketed)
GRIDS = {1: (1e-3, 3e-3, 1e-2), 2: (1e-3, 3e-3, 1e-2), 4: (1e-3, 3e-3, 1e-2), 16: (3e-3, 1e-2, 3e-2),
         32: (3e-3, 1e-2, 3e-2)}  # fmt: skip
BEST_LR = {1: 3e-3, 2: 3e-3, 4: 1e-3, 16: 3e-2, 32: 1e-2}
NOISE = {(1, 0): 0.004, (1, 1): -0.003, (1, 2): 0.001, (2, 0): 0.0, (2, 1): 0.002, (2, 2): -0.002,
         (4, 0): -0.005, (4, 1): 0.006, (4, 2): 0.001, (16, 0): 0.003, (16, 1): -0.004, (16, 2): 0.002,
         (32, 0): 0.0, (32, 1): 0.005, (32, 2): -0.006}  # fmt: skip


def planted(base: dict[int, float], stalled: tuple[int, int] | None = None, bpe: bool = False,
            bpb: dict[int, float] | None = None, widths: dict[int, int] | None = None,
            shape: str | None = None, flops: dict[int, float] | None = None,
            tokens: dict[int, int] | None = None) -> Any:  # fmt: skip
    """A run set: final val loss = base[x] + 0.05 per grid step away from the point's best LR + the seed's offset
    + the (x, seed) noise. ``stalled``: (x, seed) whose run at its best LR stalled; ``bpe``: each x its own BPE
    vocabulary (256 x) (a vocabulary study: the axis is the tokenizer); ``bpb``: bits per byte = loss x bpb[x];
    ``flops``: each x's training FLOPs per token; ``tokens``: the tokens each x's runs trained on."""
    records = []
    for x, grid in GRIDS.items():
        for lr in grid:
            steps_off = abs(grid.index(lr) - grid.index(BEST_LR[x]))
            for s in SEEDS:
                loss = base[x] + 0.05 * steps_off + SEED_OFFSET[s] + NOISE[(x, s)]
                summary: dict[str, Any] = {k: None if k in TEXT_SUMMARY_KEYS else math.nan for k in SUMMARY_KEYS}
                summary.update({M.SEED: s, M.STEPS: 100, M.GRAD_NORM_SPIKES: 0, M.LOSS_SPIKES: 0,
                                M.FINAL_VAL_LOSS: loss})  # fmt: skip
                if bpb is not None:
                    summary[M.FINAL_VAL_BPB] = loss * bpb[x]
                if flops is not None:
                    summary[M.FLOPS_PER_TOKEN] = flops[x]
                if tokens is not None:
                    summary[M.TOTAL_TOKENS] = tokens[x]
                if stalled == (x, s) and lr == BEST_LR[x]:
                    summary.update({M.STALLED: True, M.STALL_REASON: "unigram"})
                cfg = {
                    "model": {"name": "small", "ffn_ratio": x, **({"d_model": widths[x]} if widths else {})},
                    **({"shape": {"name": shape}} if shape else {}),
                    "optim": {"name": "adamw", "lr": lr},
                    "data": {
                        "name": "shakespeare",
                        "tokenizer": "bpe" if bpe else "byte",
                        "vocab_size": 256 * x if bpe else None,
                    },
                    "seed": s,
                    "study": "basin",
                }
                i = str(len(records))
                empty = pd.DataFrame(index=pd.Index([], name=M.STEP))
                records.append(RunRecord(i, f"/r/{i}", i, M.STATUS_COMPLETED, summary, flatten(cfg), empty, {}))
    return assemble(records)


BASE = {1: 2.05, 2: 2.00, 4: 2.02, 16: 2.10, 32: 2.16}  # best: x = 2; x = 1, 4 within ~1-2.5%; 16, 32 worse


def at_best(base: dict[int, float], x: int) -> np.ndarray:
    """The planted losses of x at its best LR, seed by seed."""
    return np.array([base[x] + SEED_OFFSET[s] + NOISE[(x, s)] for s in SEEDS])


def by_hand(base: dict[int, float], x: int, floor_x: int = 2) -> tuple[float, float, float]:
    """r(x) = 100 (mean d) / L(x*) with the paired 95% interval: mean(d) -/+ t_{0.975, n-1} sd(d) / sqrt(n)."""
    d = at_best(base, x) - at_best(base, floor_x)
    half = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    floor = at_best(base, floor_x).mean()
    return 100 * d.mean() / floor, 100 * (d.mean() - half) / floor, 100 * (d.mean() + half) / floor


def test_each_point_at_its_own_best_lr_relative_to_the_best_point_by_hand():
    rs = planted(BASE)
    b = basin_of(rs, KEY, list(rs.configs))
    assert [p.x for p in b.points] == [1, 2, 4, 16, 32] and b.metric == M.FINAL_VAL_LOSS
    assert {p.x: p.lr.lr for p in b.points} == BEST_LR
    assert {p.x for p in b.points if p.lr.at_edge} == {4, 16}  # the smallest / largest of their grids
    assert b.best is not None and b.best.x == 2 and b.best.relative == 0.0
    for p in b.points:
        assert p.n == 3 and p.mean == pytest.approx(at_best(BASE, int(p.x)).mean())
        if p.x != 2:
            assert p.test == "paired" and p.n_pairs == 3
            assert (p.relative, p.low, p.high) == pytest.approx(by_hand(BASE, int(p.x)), rel=1e-9)
    # the basin's shape: x = 32 ~8% above the floor
    assert 7 < b.points[-1].relative < 9


def test_basins_are_found_for_a_numeric_axis_and_not_for_the_lr():
    rs = planted(BASE)
    found = basins(rs, compare_runs(rs))
    assert [(b.axis, b.context) for b in found] == [(KEY, "all runs")]
    assert found[0].table["relative_pct"].tolist()[1] == 0.0


def claim(expect: str, margin: float, over: list[Any], **more: Any) -> dict[str, Any]:
    return {"id": "c", "source": "Kaplan et al. 2020", "statement": "s", "axis": KEY, "metric": "relative_val_loss",
            "expect": expect, "margin": margin, "over": over, **more}  # fmt: skip


def decide(rs: Any, raw: dict[str, Any]) -> Any:
    (res,) = evaluate_claims(rs, parse_claims([raw])).results
    return res


def test_within_flips_across_the_margin():
    rs = planted(BASE)
    highs = {x: by_hand(BASE, x)[2] for x in (1, 4)}
    lows = {x: by_hand(BASE, x)[1] for x in (1, 4)}
    worst = max(highs.values())  # x = 1 or 4 decides held
    held = decide(rs, claim("within", worst + 0.1, [1, 4]))
    assert held.verdict == HELD and held.effect.high95 == pytest.approx(worst)
    assert held.effect.notes == (NOTE_LR_AT_EDGE,)  # x = 4 is best at the smallest LR of its grid
    assert held.arm_lr.lr in (BEST_LR[1], BEST_LR[4]) and held.baseline_lr.lr == BEST_LR[2]
    inconclusive = decide(rs, claim("within", worst - 0.1, [1, 4]))
    assert inconclusive.verdict == INCONCLUSIVE
    contradicted = decide(rs, claim("within", max(lows.values()) - 0.1, [1, 4]))
    assert contradicted.verdict == CONTRADICTED
    # the planted numbers moved: x = 4 raised by 4% of the floor leaves the basin of the same margin
    moved = {**BASE, 4: BASE[4] + 0.04 * at_best(BASE, 2).mean()}
    assert by_hand(moved, 4)[1] > worst + 0.1  # by hand: its whole interval is now above the margin
    assert decide(planted(moved), claim("within", worst + 0.1, [1, 4])).verdict == CONTRADICTED


def test_worse_beyond_a_value_and_the_best_point_in_range_contradicts():
    rs = planted(BASE)
    low16 = by_hand(BASE, 16)[1]  # 16 is nearer the floor than 32: it decides
    assert decide(rs, claim("worse", low16 - 0.2, [16, None])).verdict == HELD
    assert decide(rs, claim("worse", low16 + 0.2, [16, None])).verdict == INCONCLUSIVE
    assert decide(rs, claim("worse", by_hand(BASE, 16)[2] + 0.5, [16, None])).verdict == CONTRADICTED
    best_inside = decide(rs, claim("worse", 1.0, [None, 2]))  # x = 2 is the floor: 0% worse
    assert best_inside.verdict == CONTRADICTED and best_inside.effect.estimate == 0.0
    nothing = decide(rs, claim("worse", 1.0, [40, None]))
    assert (nothing.verdict, nothing.why) == (UNTESTED, WHY_NO_ARM)


def test_a_stalled_seed_at_a_deciding_point_makes_it_inconclusive():
    low16 = by_hand(BASE, 16)[1]
    res = decide(planted(BASE, stalled=(16, 1)), claim("worse", low16 - 0.2, [16, None]))
    assert (res.verdict, res.why, res.arm_stalled) == (INCONCLUSIVE, WHY_STALLED, (1, 6))
    at_floor = decide(planted(BASE, stalled=(2, 0)), claim("worse", low16 - 0.2, [16, None]))
    assert (at_floor.verdict, at_floor.baseline_stalled) == (INCONCLUSIVE, (1, 3))
    counted = decide(planted(BASE, stalled=(16, 1)), claim("worse", low16 - 0.2, [16, None], counts_failures=True))
    assert counted.verdict == HELD
    # a stalled run at a point outside the range, off its best LR nothing: the claim is still decided
    assert decide(planted(BASE, stalled=(32, 0)), claim("within", 3.5, [1, 4])).verdict == HELD


def test_across_tokenizers_the_basin_is_on_bits_per_byte_and_per_token_loss_is_refused():
    factor = {1: 1.0, 2: 1.0, 4: 0.5, 16: 0.5, 32: 0.5}  # bpb = loss x factor: a larger vocabulary's tokens are longer
    rs = planted(BASE, bpe=True, bpb=factor)
    b = basin_of(rs, KEY, list(rs.configs))
    assert b.metric == M.FINAL_VAL_BPB and b.best is not None and b.best.x == 4  # 2.02 x 0.5 is the lowest bpb
    four = at_best(BASE, 4) * 0.5
    d = at_best(BASE, 16) * 0.5 - four
    assert b.points[3].relative == pytest.approx(100 * d.mean() / four.mean())
    with pytest.raises(AnalysisError, match="final_val_bpb"):
        evaluate_claims(rs, parse_claims([claim("within", 2, [1, 4])]))
    res = decide(rs, claim("within", 2, [1, 4], metric="relative_val_bpb"))
    assert res.verdict == CONTRADICTED  # x = 1, 2 are ~100% above the floor in bits per byte
    no_bpb = basin_of(planted(BASE, bpe=True), KEY, list(rs.configs))
    assert no_bpb.refused and no_bpb.points == ()


@pytest.mark.parametrize(
    "raw, says",
    [
        (claim("within", 0, [1, 4]), "claims[c].margin=0 is invalid: expect: within needs a margin > 0, in percent"),
        (claim("within", -2, [1, 4]), "margin=-2 is invalid"),
        ({k: v for k, v in claim("within", 2, [1, 4]).items() if k != "over"}, "claims[c].over=None is invalid"),
        (claim("within", 2, [1, None]), "expect: within needs both ends"),
        (claim("worse", 2, [None, None]), "claims[c].over=[None, None] is invalid"),
        (claim("within", 2, [4, 1]), "must be [a, b] with a < b"),
        (claim("within", 2, [1]), "over=[1] is invalid"),
        (claim("within", 2, [1, 4], arm=2), "claims[c].arm=2 is invalid: a basin claim"),
        (claim("lower", 2, [1, 4]), "claims[c].expect='lower' is invalid: metric relative_val_loss allows: within"),
        (claim("within", 2, [1, 4], metric="final_val_loss", arm=1, baseline=2), "expect: within is for a basin"),
        ({"id": "c", "source": "s", "statement": "s", "axis": KEY, "arm": 1, "baseline": 2, "metric": "final_val_loss",
          "expect": "lower", "over": [1, 4]}, "claims[c].over=[1, 4] is invalid: only a basin claim"),
    ],
)  # fmt: skip
def test_a_bad_basin_claim_is_one_line(raw, says):
    with pytest.raises(ConfigError) as err:
        parse_claims([raw])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_basin_claim_is_checked_against_the_sweep():
    arms = [{KEY: x, "optim.lr": 1e-3} for x in (1, 2, 4)]
    check_claims_against_arms(parse_claims([claim("within", 2, [1, 4])]), arms)  # fine
    with pytest.raises(ConfigError, match=r"claims\[c\].over=\[8.0, None\] is invalid: no value of model.ffn_ratio"):
        check_claims_against_arms(parse_claims([claim("worse", 2, [8, None])]), arms)
    text = [{KEY: v} for v in ("a", "b")]
    with pytest.raises(ConfigError, match="a basin needs a numeric axis"):
        check_claims_against_arms(parse_claims([claim("within", 2, [1, 4])]), text)


def test_the_report_has_a_basins_section_with_its_table_and_figure():
    from analysis.present.document import figures_in, render_markdown
    from analysis.present.figures.basin import positions
    from analysis.present.report import build_blocks

    rs = planted(BASE)
    blocks = build_blocks(rs, compare_runs(rs), "t")
    md = render_markdown(blocks)
    section = md[md.index("## Basins") :]
    r, lo, hi = by_hand(BASE, 1)
    assert f"| 1 | 0.003 | {at_best(BASE, 1).mean():.4f} | 3 | {r:+.2f}% [{lo:+.2f}, {hi:+.2f}] |" in section
    assert "| 2 | 0.003 |" in section and "0 (best)" in section and "0.03 ⚠ grid edge" in section
    assert [f.file_name for f in figures_in(blocks)] == ["model.ffn_ratio_basin_1.png"]
    # tau/T's no-decay value (inf) and a lambda of 0 sit a decade beyond the finite values on the log axis
    assert positions([0.0, 0.1, 1.0, math.inf]) == ([0.01, 0.1, 1.0, 10.0], ["0", "0.1", "1", "∞"])


def test_where_the_points_cost_different_flops_the_report_shows_each_ones_ratio_to_the_best():
    from analysis.present.document import Table, render_markdown
    from analysis.present.figures.basin import basin_figures
    from analysis.present.sections.basin import basin_blocks

    # an aspect study: deeper points pay more attention FLOPs at the same N (the best point, x = 2, costs 2.0M)
    rs = planted(BASE, flops={1: 1.75e6, 2: 2.0e6, 4: 2.1e6, 16: 2.45e6, 32: 2.45e6})
    (b,) = basins(rs, compare_runs(rs))
    assert {p.x: p.flops_per_token for p in b.points} == {1: 1.75e6, 2: 2.0e6, 4: 2.1e6, 16: 2.45e6, 32: 2.45e6}
    (table,) = [x for x in basin_blocks([b], []) if isinstance(x, Table)]
    assert table.headers[5] == "FLOPs/token (× the best's)"
    assert [row[5] for row in table.rows] == ["1.75M (×0.88)", "2.00M (×1.00)", "2.10M (×1.05)", "2.45M (×1.23)",
                                              "2.45M (×1.23)"]  # fmt: skip
    (fig,) = basin_figures([b])
    assert "FLOPs per token relative to the best value's" in fig.caption
    assert "FLOPs/token (× the best's)" in render_markdown(basin_blocks([b], []))
    # one shape's cost at every point (a heads study at attn_ratio 1): no column, no second axis
    same = planted(BASE, flops=dict.fromkeys(BASE, 1.62e6))
    (b,) = basins(same, compare_runs(same))
    (table,) = [x for x in basin_blocks([b], []) if isinstance(x, Table)]
    assert "FLOPs/token (× the best's)" not in table.headers
    assert "FLOPs per token" not in basin_figures([b])[0].caption
    # across tokenizers a token is no unit of text: the runs' training FLOPs (FLOPs/token x tokens) instead
    bpe = planted(BASE, bpe=True, bpb=dict.fromkeys(BASE, 1.5), flops={1: 1e6, 2: 2e6, 4: 3e6, 16: 4e6, 32: 5e6},
                  tokens={1: 8e5, 2: 4e5, 4: 3e5, 16: 2e5, 32: 2e5})  # fmt: skip
    (b,) = basins(bpe, compare_runs(bpe))
    assert b.metric == M.FINAL_VAL_BPB and b.best is not None and b.best.x == 512  # the axis: 256 x
    (table,) = [x for x in basin_blocks([b], []) if isinstance(x, Table)]
    assert table.headers[5] == "training FLOPs (× the best's)"
    assert [row[5] for row in table.rows] == ["0.80T (×1.00)", "0.80T (×1.00)", "0.90T (×1.12)", "0.80T (×1.00)",
                                              "1.00T (×1.25)"]  # fmt: skip
    assert "training FLOPs (a token is no unit of text" in basin_figures([b])[0].caption


# two requests that solve to one width (shape=iso: GELU at 4 and SwiGLU at 8/3 are both d_model 74), so the width
# splits the runs differently from the axis
WIDTHS = {1: 104, 2: 90, 4: 74, 16: 44, 32: 44}


def test_sizes_solved_by_shape_iso_are_not_axes_of_their_own():
    rs = planted(BASE, widths=WIDTHS, shape="iso")
    cs = compare_runs(rs)
    assert [a.name for a in cs.varied] == [KEY, "optim.lr"]
    (b,) = basins(rs, cs)
    assert [p.x for p in b.points] == [1, 2, 4, 16, 32]  # one basin over every value, not one-point contexts
    # without shape=iso the width is an intervention of its own (it cuts the runs into contexts)
    cs = compare_runs(planted(BASE, widths=WIDTHS, shape="none"))
    assert "model.d_model" in [a.name for a in cs.varied]
