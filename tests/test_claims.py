"""Claims as data (lm_ablate/claim_spec.py) and their verdicts (analysis/claims.py), the report's Claims
section, Findings and speed warning, and the prepost heatmap.

Verdicts are checked against the definitions written out here with scipy (a paired t interval, and TOST as two
one-sided t-tests), on constructed comparisons, and each verdict is shown to follow the data: the same claim
flips from held to contradicted when the data flip.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from scipy import stats as st

from analysis.compute.claims import (
    CONTRADICTED,
    HELD,
    INCONCLUSIVE,
    METRIC_FUNCTIONS,
    MIXED,
    UNTESTED,
    WHY_NO_ARM_VALUES,
    WHY_NOT_VARIED,
    Effect,
    annotate_comparisons,
    evaluate_claims,
    verdict,
)
from analysis.compute.compare import compare_runs
from analysis.sources.load import (
    FIRST_PROBE_PREFIX,
    INIT_VAL_LOSS,
    SUMMARY_KEYS,
    TEXT_SUMMARY_KEYS,
    RunRecord,
    assemble,
    flatten,
)
from lm_ablate import metrics as M
from lm_ablate.claim_spec import METRICS, Claim, check_claims_against_arms, parse_claims
from lm_ablate.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def claim(**kw: Any) -> Claim:
    raw = {"id": "c", "source": "Someone et al. 2020", "statement": "s", "axis": "norm.placement", "arm": "post",
           "baseline": "pre", "metric": "final_val_loss", "expect": "lower", **kw}  # fmt: skip
    return parse_claims([raw])[0]


def effect(est: float, lo95: float, hi95: float, lo90: float | None = None, hi90: float | None = None) -> Effect:
    lo90 = lo95 if lo90 is None else lo90
    hi90 = hi95 if hi90 is None else hi90
    return Effect(est, lo95, hi95, lo90, hi90, 0.01, "paired", 3, 3, 3, 1.0, 1.0)


# --- the verdict rule -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "expect, interval, want",
    [
        ("lower", (-0.3, -0.1), HELD),
        ("lower", (0.1, 0.3), CONTRADICTED),
        ("lower", (-0.1, 0.2), INCONCLUSIVE),
        ("higher", (0.1, 0.3), HELD),
        ("higher", (-0.3, -0.1), CONTRADICTED),
        ("higher", (-0.1, 0.2), INCONCLUSIVE),
        ("lower", (-0.3, 0.0), INCONCLUSIVE),  # touching 0 does not exclude it
    ],
)
def test_directional_verdicts(expect, interval, want):
    c = claim(expect=expect)
    lo, hi = interval
    assert verdict(effect((lo + hi) / 2, lo, hi), c) == want


@pytest.mark.parametrize(
    "interval95, interval90, want",
    [
        ((-0.04, 0.045), (-0.03, 0.03), HELD),  # 90% inside (-0.05, 0.05), though the 95% is not
        ((-0.06, 0.02), (-0.055, 0.01), INCONCLUSIVE),  # 90% crosses the lower bound
        ((0.06, 0.2), (0.07, 0.18), CONTRADICTED),  # 95% entirely above the band
        ((-0.3, -0.05), (-0.25, -0.07), CONTRADICTED),  # entirely below, touching the bound counts as outside
        ((-0.2, 0.2), (-0.1, 0.1), INCONCLUSIVE),  # straddles the whole band
    ],
)
def test_equal_within_margin_tost(interval95, interval90, want):
    c = claim(expect="equal", margin=0.05)
    e = effect(sum(interval90) / 2, *interval95, *interval90)
    assert verdict(e, c) == want


def test_ratio_metric_is_judged_against_one_and_a_factor_band():
    c = claim(metric="tokens_per_sec", expect="higher")
    assert verdict(effect(1.2, 1.1, 1.3), c) == HELD
    assert verdict(effect(0.8, 0.7, 0.9), c) == CONTRADICTED
    assert verdict(effect(1.05, 0.95, 1.15), c) == INCONCLUSIVE
    eq = claim(metric="tokens_per_sec", expect="equal", margin=0.1)  # within a factor 1.1: (1/1.1, 1.1)
    assert verdict(effect(1.0, 0.9, 1.09, 0.92, 1.08), eq) == HELD
    assert verdict(effect(1.0, 0.9, 1.12, 0.905, 1.09), eq) == INCONCLUSIVE  # 0.905 < 1/1.1 = 0.909
    assert verdict(effect(1.3, 1.1, 1.5), eq) == CONTRADICTED
    assert verdict(None, c) == UNTESTED


def test_tost_verdict_agrees_with_two_one_sided_t_tests():
    """On paired data, 'held' for equal within δ must coincide with both one-sided t-tests rejecting at 5%
    (H0: mean diff <= -δ, and H0: mean diff >= δ), computed here with scipy, not analysis.compute.stats."""
    rng = np.random.default_rng(0)
    c = claim(expect="equal", margin=0.05)
    agree = 0
    for _ in range(60):
        base = rng.normal(2.5, 0.05, 4)
        arm = base + rng.normal(rng.uniform(-0.08, 0.08), rng.uniform(0.005, 0.04), 4)
        rs = runset([(("pre",), s, {M.FINAL_VAL_LOSS: float(v)}) for s, v in enumerate(base)]
                    + [(("post",), s, {M.FINAL_VAL_LOSS: float(v)}) for s, v in enumerate(arm)])  # fmt: skip
        (result,) = evaluate_claims(rs, [c]).results
        d = arm - base
        p_low = st.ttest_1samp(d, -0.05, alternative="greater").pvalue
        p_high = st.ttest_1samp(d, 0.05, alternative="less").pvalue
        tost_held = p_low < 0.05 and p_high < 0.05
        assert (result.verdict == HELD) == tost_held, (d.mean(), p_low, p_high, result)
        agree += tost_held
    assert 0 < agree < 60  # both outcomes were exercised


# --- synthetic run sets ---------------------------------------------------------------------------------
def run_config(placement: str, seed: int, **other: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model": {"name": "small", "n_layers": 2},
        "norm": {"name": "layernorm", "placement": placement},
        "optim": {"name": "adamw", "lr": 3e-3, "warmup_steps": 0},
        "seed": seed,
        "study": "s",
        "choices": {"norm": "layernorm"},
    }
    for key, value in other.items():
        section, _, name = key.partition(".")
        cfg.setdefault(section, {})[name] = value
    return cfg


def runset(specs: list[tuple[tuple, int, dict[str, Any]]], other_keys: tuple[str, ...] = ()) -> Any:
    """specs: ((placement, *values of other_keys), seed, {summary or extra values, 'status', 'history'})."""
    records = []
    for i, (arm, seed, values) in enumerate(specs):
        values = dict(values)
        status = values.pop("status", M.STATUS_COMPLETED)
        history = values.pop("history", pd.DataFrame(index=pd.Index([], name=M.STEP)))
        cfg = run_config(arm[0], seed, **dict(zip(other_keys, arm[1:])))
        summary: dict[str, Any] = {k: None if k in TEXT_SUMMARY_KEYS else math.nan for k in SUMMARY_KEYS}
        summary.update({M.SEED: seed, M.STEPS: 100, M.GRAD_NORM_SPIKES: 0, M.LOSS_SPIKES: 0})
        extras = {
            k: v for k, v in values.items() if k == INIT_VAL_LOSS or k.startswith((FIRST_PROBE_PREFIX, "val/loss@"))
        }
        summary.update({k: v for k, v in values.items() if k not in extras})
        records.append(RunRecord(str(i), f"/r/{i}", str(i), status, summary, flatten(cfg), history, extras))
    return assemble(records)


def two_arm(post: list[float], pre: list[float], key: str = M.FINAL_VAL_LOSS, **more: Any) -> Any:
    return runset([(("pre",), s, {key: v, **more}) for s, v in enumerate(pre)]
                  + [(("post",), s, {key: v, **more}) for s, v in enumerate(post)])  # fmt: skip


def paired_interval(a: list[float], b: list[float], conf: float = 0.95) -> tuple[float, float, float]:
    d = np.asarray(a) - np.asarray(b)
    half = st.t.ppf(0.5 + conf / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean(), d.mean() - half, d.mean() + half


def test_effect_is_the_paired_t_interval_and_the_verdict_follows_the_data():
    pre, post = [2.50, 2.55, 2.60], [2.40, 2.47, 2.49]
    c = claim(expect="lower")
    (res,) = evaluate_claims(two_arm(post, pre), [c]).results
    d, lo, hi = paired_interval(post, pre)
    _, lo90, hi90 = paired_interval(post, pre, 0.90)
    e = res.effect
    assert e is not None and e.test == "paired" and e.n_pairs == 3
    assert (e.estimate, e.low95, e.high95, e.low90, e.high90) == pytest.approx((d, lo, hi, lo90, hi90))
    assert res.verdict == HELD and res.context == "all runs"
    # the same claim on flipped data: contradicted; on noise around 0: inconclusive
    assert evaluate_claims(two_arm(pre, post), [c]).results[0].verdict == CONTRADICTED
    noisy = [2.45, 2.62, 2.50]
    assert evaluate_claims(two_arm(noisy, pre), [c]).results[0].verdict == INCONCLUSIVE
    assert evaluate_claims(two_arm(post, pre), [claim(expect="higher")]).results[0].verdict == CONTRADICTED


def test_effect_agrees_with_the_comparison_table():
    """The claim's numbers are the report's own: the same delta and interval as comparisons.csv."""
    pre, post = [2.50, 2.55, 2.61], [2.40, 2.47, 2.49]
    rs = two_arm(post, pre)
    (res,) = evaluate_claims(rs, [claim()]).results
    row = compare_runs(rs).table.query("arm == 'post'").iloc[0]
    assert (res.effect.estimate, res.effect.low95, res.effect.high95) == pytest.approx(
        (row["delta_final_val_loss"], row["delta_ci_low"], row["delta_ci_high"])
    )
    annotated = annotate_comparisons(compare_runs(rs).table, evaluate_claims(rs, [claim()]))
    assert annotated.set_index("arm").loc["post", "claim_verdicts"] == "c:held"
    assert annotated.set_index("arm").loc["pre", "claims"] == ""


def test_ratio_metric_is_a_geometric_mean_ratio_on_logs():
    pre, post = [1000.0, 1100.0, 900.0], [1200.0, 1300.0, 1150.0]
    rs = two_arm(post, pre, M.MEAN_TOKENS_PER_SEC, **{M.FINAL_VAL_LOSS: 2.0})
    (res,) = evaluate_claims(rs, [claim(metric="tokens_per_sec", expect="higher")]).results
    d, lo, hi = paired_interval(list(np.log(post)), list(np.log(pre)))
    assert (res.effect.estimate, res.effect.low95, res.effect.high95) == pytest.approx(np.exp([d, lo, hi]))
    assert res.verdict == HELD and not res.effect.notes
    # a seed twice as fast as another in the same arm: the speed is not to be trusted, and the result says so
    rs = two_arm([1200.0, 2600.0, 1150.0], pre, M.MEAN_TOKENS_PER_SEC, **{M.FINAL_VAL_LOSS: 2.0})
    (res,) = evaluate_claims(rs, [claim(metric="tokens_per_sec", expect="higher")]).results
    assert res.effect.notes == ("speed_unsteady",)


def test_capped_loss_counts_a_diverged_run_as_its_init_loss():
    specs = [(("pre",), s, {M.FINAL_VAL_LOSS: v, INIT_VAL_LOSS: 5.5}) for s, v in enumerate([2.5, 2.6, 2.55])]
    specs += [(("post",), 0, {M.FINAL_VAL_LOSS: math.nan, INIT_VAL_LOSS: 5.4, "status": M.STATUS_DIVERGED}),
              (("post",), 1, {M.FINAL_VAL_LOSS: 5.9, INIT_VAL_LOSS: 5.5}),  # worse than at init: capped
              (("post",), 2, {M.FINAL_VAL_LOSS: 3.3, INIT_VAL_LOSS: 5.5})]  # fmt: skip
    rs = runset(specs)
    (res,) = evaluate_claims(rs, [claim(metric="capped_val_loss", expect="higher")]).results
    d, lo, hi = paired_interval([5.4, 5.5, 3.3], [2.5, 2.6, 2.55])
    assert (res.effect.estimate, res.effect.low95) == pytest.approx((d, lo))
    # final_val_loss uses completed runs only: the diverged seed drops out of the pairs
    (res,) = evaluate_claims(rs, [claim(metric="final_val_loss", expect="higher")]).results
    assert res.effect.n_pairs == 2


def test_init_grad_growth_is_last_over_first_block():
    def grads(g0: float, g1: float) -> dict[str, float]:
        return {f"{FIRST_PROBE_PREFIX}layer/0/grad_norm": g0, f"{FIRST_PROBE_PREFIX}layer/1/grad_norm": g1,
                M.FINAL_VAL_LOSS: 2.0}  # fmt: skip

    pre = [grads(2.0, 1.6), grads(2.1, 1.5), grads(1.9, 1.7)]
    post = [grads(1.5, 2.7), grads(1.8, 3.2), grads(1.9, 3.3)]
    rs = runset([(("pre",), s, v) for s, v in enumerate(pre)] + [(("post",), s, v) for s, v in enumerate(post)])
    (res,) = evaluate_claims(rs, [claim(metric="init_grad_growth", expect="higher")]).results
    ratio = [np.log(p[f"{FIRST_PROBE_PREFIX}layer/1/grad_norm"] / p[f"{FIRST_PROBE_PREFIX}layer/0/grad_norm"])
             for p in post]  # fmt: skip
    base = [np.log(p[f"{FIRST_PROBE_PREFIX}layer/1/grad_norm"] / p[f"{FIRST_PROBE_PREFIX}layer/0/grad_norm"])
            for p in pre]  # fmt: skip
    assert res.effect.estimate == pytest.approx(math.exp(np.mean(np.array(ratio) - np.array(base))))
    assert res.verdict == HELD


def test_lr_sensitivity_is_computed_per_seed_over_the_grid():
    """Wortsman et al. 2023's E_lr[min(loss(lr), loss_init) - loss*], per seed, paired over seeds."""
    lrs = [1e-3, 1e-2, 1e-1]
    finals = {"none": {0: [2.6, 2.4, 5.9], 1: [2.7, 2.45, math.nan]},  # seed 1 diverges at 1e-1
              "per_head": {0: [2.6, 2.42, 2.9], 1: [2.65, 2.41, 3.0]}}  # fmt: skip
    specs = []
    for qk, by_seed in finals.items():
        for seed, values in by_seed.items():
            for lr, v in zip(lrs, values):
                status = M.STATUS_DIVERGED if math.isnan(v) else M.STATUS_COMPLETED
                specs.append((("pre", qk, lr), seed, {M.FINAL_VAL_LOSS: v, INIT_VAL_LOSS: 5.5, "status": status}))
    rs = runset(specs, ("attention.qk_norm", "optim.lr"))
    c = claim(axis="attention.qk_norm", arm="per_head", baseline="none", metric="lr_sensitivity")
    (res,) = evaluate_claims(rs, [c]).results

    def sens(values: list[float]) -> float:
        capped = np.array([5.5 if math.isnan(v) else min(v, 5.5) for v in values])
        return float((capped - capped.min()).mean())

    arm = [sens(finals["per_head"][s]) for s in (0, 1)]
    base = [sens(finals["none"][s]) for s in (0, 1)]
    assert res.context == "all runs"  # the LR grid is pooled, not a context
    assert res.effect.estimate == pytest.approx(np.mean(arm) - np.mean(base))
    assert res.effect.n_pairs == 2 and res.effect.arm_value == pytest.approx(np.mean(arm))


def test_contexts_filters_and_mixed():
    """A claim applies in every context its filter allows (one result each); contexts may disagree."""
    specs = []
    for layers, (pre, post) in {
        2: ([2.5, 2.6, 2.55], [2.4, 2.45, 2.42]),
        4: ([2.5, 2.6, 2.55], [3.3, 3.4, 3.35]),
    }.items():
        specs += [(("pre", layers), s, {M.FINAL_VAL_LOSS: v}) for s, v in enumerate(pre)]
        specs += [(("post", layers), s, {M.FINAL_VAL_LOSS: v}) for s, v in enumerate(post)]
    rs = runset(specs, ("model.n_layers",))
    cs = evaluate_claims(rs, [claim(expect="lower")])
    assert [(r.context, r.verdict) for r in cs.results] == [
        ("model.n_layers=2", HELD),
        ("model.n_layers=4", CONTRADICTED),
    ]
    assert cs.verdict("c") == MIXED
    only = evaluate_claims(rs, [claim(expect="lower", context={"model.n_layers": 2})])
    assert [(r.context, r.verdict) for r in only.results] == [("model.n_layers=2", HELD)]
    assert only.verdict("c") == HELD
    row = annotate_comparisons(compare_runs(rs, by=["norm.placement"]).table, cs)
    marked = row[row["claim_verdicts"] != ""][["context", "arm", "claim_verdicts"]].values.tolist()
    assert marked == [["model.n_layers=2", "post", "c:held"], ["model.n_layers=4", "post", "c:contradicted"]]


def test_untested_claims_say_why():
    rs = two_arm([2.4, 2.5], [2.5, 2.6])
    res = evaluate_claims(rs, [claim(axis="optim.lr", arm=0.1, baseline=0.003)]).results
    assert [(r.verdict, r.why) for r in res] == [(UNTESTED, WHY_NOT_VARIED)]
    # the arm never completed: no value to compare
    specs = [(("pre",), s, {M.FINAL_VAL_LOSS: 2.5}) for s in range(3)]
    specs += [(("post",), s, {M.FINAL_VAL_LOSS: math.nan, "status": M.STATUS_DIVERGED}) for s in range(3)]
    (res,) = evaluate_claims(runset(specs), [claim()]).results
    assert (res.verdict, res.why) == (UNTESTED, WHY_NO_ARM_VALUES)
    # one seed a side: a value, no interval
    (res,) = evaluate_claims(two_arm([2.4], [2.5]), [claim()]).results
    assert res.verdict == INCONCLUSIVE and res.effect.estimate == pytest.approx(-0.1)


def test_finding_counts_verdicts_per_context():
    """One sentence per claim: the verdict the tested contexts share, with the count when contexts differ."""
    from analysis.present.sections.claims import claim_finding

    specs = [(("pre", n), s, {M.FINAL_VAL_LOSS: v}) for n in (2, 4) for s, v in enumerate([2.5, 2.6, 2.55])]
    specs += [(("post", 2), s, {M.FINAL_VAL_LOSS: v}) for s, v in enumerate([2.4, 2.45, 2.42])]
    specs += [(("post", 4), s, {M.FINAL_VAL_LOSS: math.nan, "status": M.STATUS_DIVERGED}) for s in range(3)]
    c = claim(expect="lower", statement="Post is better.", source="Liu et al. 2020, Understanding")
    cs = evaluate_claims(runset(specs, ("model.n_layers",)), [c])
    assert cs.verdict("c") == HELD
    assert claim_finding(cs, c) == (
        "Held (held in 1, untested in 1 of 2 contexts): Post is better (Liu et al. 2020); final val loss, "
        "post − pre: -0.1267 [-0.1892, -0.0642] at model.n_layers=2 (held)."
    )


def test_compute_multiplier_reads_the_scaling_study():
    """compute_multiplier takes the scaling study's CM and its bootstrap interval for the arm whose fit holds
    the arm's runs, pooled over the rungs (a size key is no context), and only against the study's baseline."""
    from types import SimpleNamespace as NS

    specs = [((arm, d), s, {M.FINAL_VAL_LOSS: 3.0}) for arm in ("pre", "post") for d in (64, 128) for s in (0, 1)]
    rs = runset(specs, ("model.d_model",))
    ids = {arm: [r for r, c in rs.configs.items() if c["norm.placement"] == arm] for arm in ("pre", "post")}
    study = NS(
        baseline="norm.placement=pre", size_keys=["model.d_model"], lr_selected=False, tuned=[],
        arms=[NS(arm=f"norm.placement={a}", rungs=[NS(run_ids=ids[a][:2]), NS(run_ids=ids[a][2:])]) for a in ids],
        multipliers=[NS(arm="norm.placement=post", at="largest", cm=1.4, low=1.1, high=1.8, beyond_validated=False),
                     NS(arm="norm.placement=post", at="10x", cm=0.9, low=0.7, high=1.2, beyond_validated=True)],
        held_out_error={"norm.placement=pre": 0.01, "norm.placement=post": math.nan}.get,  # post: no check
        warnings=[], every_budget=None,
    )  # fmt: skip
    c = claim(metric="compute_multiplier", expect="higher")
    (res,) = evaluate_claims(rs, [c], scaling=study).results
    assert res.context == "all runs" and (res.effect.estimate, res.effect.low95, res.effect.high95) == (1.4, 1.1, 1.8)
    assert res.verdict == HELD and res.effect.test == "bootstrap" and res.effect.n_arm == 2
    assert res.effect.notes == ()
    (res,) = evaluate_claims(rs, [claim(metric="compute_multiplier", expect="higher", at="10x")], scaling=study).results
    assert res.verdict == INCONCLUSIVE and res.effect.estimate == 0.9
    assert res.effect.notes == ("beyond_validated_range",)  # said beside the verdict: the fits were not checked there
    reverse = claim(metric="compute_multiplier", expect="higher", arm="pre", baseline="post")
    (res,) = evaluate_claims(rs, [reverse], scaling=study).results
    assert (res.verdict, res.why) == (UNTESTED, "baseline_not_scaling_baseline")
    # the baseline's fit misses its held-out rung by 3% (> the 2% goal): the multiplier is shown, decides nothing
    study.held_out_error = {"norm.placement=pre": 0.03, "norm.placement=post": 0.01}.get
    (res,) = evaluate_claims(rs, [c], scaling=study).results
    assert (res.verdict, res.why, res.effect.estimate, res.effect.notes) == (
        INCONCLUSIVE, "fit_off_goal", 1.4, ("fit_off_goal",)
    )  # fmt: skip
    study.held_out_error = {"norm.placement=pre": 0.019, "norm.placement=post": 0.019}.get
    assert evaluate_claims(rs, [c], scaling=study).results[0].verdict == HELD
    # the chosen L(N, D) curve of the baseline follows the edge of its trained allocations (the fit's unconstrained
    # optimum lies outside them): said beside the verdict, which it does not change (another arm's warning: no note)
    from analysis.compute.scaling import W_ALLOCATION_EDGE, ScalingWarning

    study.warnings = [ScalingWarning(W_ALLOCATION_EDGE, "norm.placement=other", value=20.0, previous=13.0)]
    (res,) = evaluate_claims(rs, [c], scaling=study).results
    assert (res.verdict, res.effect.notes) == (HELD, ())
    study.warnings.append(ScalingWarning(W_ALLOCATION_EDGE, "norm.placement=pre", value=20.0, previous=0.4))
    (res,) = evaluate_claims(rs, [c], scaling=study).results
    assert (res.verdict, res.effect.estimate, res.effect.notes) == (HELD, 1.4, ("allocation_edge",))
    # a fit window (ladder.fit_budgets): the same form on every budget decides the claim otherwise -> a note beside
    # the verdict, which the window's fit still makes; the same reading (or another `at`'s multiplier) -> none
    study.warnings = []
    every = lambda cm, low, high, err, at="largest": NS(
        multipliers=[NS(arm="norm.placement=post", at=at, cm=cm, low=low, high=high)],
        held_out_error={"norm.placement=pre": err, "norm.placement=post": err}.get,
    )  # fmt: skip
    for other, note in (
        (every(1.2, 0.9, 1.6, 0.01), True),  # its interval includes 1: undecided
        (every(1.4, 1.1, 1.8, 0.03), True),  # off the held-out goal: undecided
        (every(0.7, 0.5, 0.9, 0.01), True),  # the other direction
        (every(1.9, 1.3, 2.4, 0.01), False),  # another number, the same reading
        (every(1.2, 0.9, 1.6, 0.01, at="10x"), False),  # no multiplier at the claim's `at`
    ):
        study.every_budget = other
        (res,) = evaluate_claims(rs, [c], scaling=study).results
        assert (res.verdict, res.effect.estimate) == (HELD, 1.4)
        assert res.effect.notes == (("fit_window_decides",) if note else ()), other
    study.held_out_error = {"norm.placement=pre": 0.03, "norm.placement=post": 0.01}.get  # undecided by the window
    study.every_budget = every(1.9, 1.3, 2.4, 0.01)
    (res,) = evaluate_claims(rs, [c], scaling=study).results
    assert res.verdict == INCONCLUSIVE and res.effect.notes == ("fit_off_goal", "fit_window_decides")
    study.every_budget = every(1.9, 0.9, 2.4, 0.01)
    assert evaluate_claims(rs, [c], scaling=study).results[0].effect.notes == ("fit_off_goal",)
    # the note asks the claim's own rule (verdict()), not "which side of 1": an `equal` claim (margin 0.2, band
    # [0.83, 1.2]) is undecided by the window's 1.4 [1.1, 1.8]; an every-budget interval above 1 inside the band
    # leaves it undecided too (no note), one beyond the band contradicts it (note), though both lie above 1
    study.held_out_error = {"norm.placement=pre": 0.01, "norm.placement=post": 0.01}.get
    same = claim(metric="compute_multiplier", expect="equal", margin=0.2)
    for other, note in ((every(1.1, 1.02, 1.19, 0.01), False), (every(1.5, 1.3, 1.8, 0.01), True)):
        study.every_budget = other
        (res,) = evaluate_claims(rs, [same], scaling=study).results
        assert res.verdict == INCONCLUSIVE and res.effect.notes == (("fit_window_decides",) if note else ()), other


def test_an_unbounded_multiplier_interval_is_shown_as_the_scaling_table_shows_it():
    """Issue 21.4: the Claims table gave the 10x multiplier without its interval when the bootstrap's upper end
    is ∞ (the baseline never reaches the arm's loss in 2.5% of resamples); the Scaling table shows [0.676×, ∞]."""
    from analysis.present.sections.claims import effect_text
    from analysis.present.sections.scaling import with_interval

    c = claim(metric="compute_multiplier", expect="higher", at="10x")
    unbounded = Effect(1.647, 0.676, math.inf, math.nan, math.nan, math.nan, "bootstrap", 0, 5, 5, math.nan, math.nan)
    assert effect_text(unbounded, c) == "1.647× [0.676, ∞]"
    assert effect_text(replace(unbounded, estimate=math.inf), c) == "∞ [0.676, ∞]"
    assert effect_text(replace(unbounded, high95=math.nan), c) == "1.647×"  # no upper end: no interval
    assert with_interval(1.647, 0.676, math.inf).endswith(", ∞]")


def test_extrapolation_attention_logit_and_spike_metrics():
    """Per-run values of the remaining metrics, each written out: val/loss@4x - final val loss; the largest
    attention logit over the history; spikes per 1000 steps."""
    from analysis.sources.load import MAX_ATTN_LOGIT_ALL

    def hist(peak: float) -> pd.DataFrame:
        return pd.DataFrame({MAX_ATTN_LOGIT_ALL: [1.0, peak, np.nan]}, index=pd.Index([0, 10, 20], name=M.STEP))

    at4 = {"pre": [3.9, 4.1, 4.0], "post": [2.6, 2.7, 2.65]}
    peaks = {"pre": [40.0, 55.0, 47.0], "post": [9.0, 10.0, 8.0]}
    spikes = {"pre": [3, 5, 4], "post": [0, 1, 0]}
    specs = [((arm,), s, {M.FINAL_VAL_LOSS: 2.5, "val/loss@4x": at4[arm][s], "history": hist(peaks[arm][s]),
                          M.GRAD_NORM_SPIKES: spikes[arm][s]}) for arm in ("pre", "post") for s in range(3)]  # fmt: skip
    rs = runset(specs)
    gap, logit, rate = (
        evaluate_claims(rs, [claim(metric=m, expect="lower")]).results[0]
        for m in ("extrapolation_gap", "max_attn_logit", "grad_norm_spike_rate")
    )
    assert gap.effect.estimate == pytest.approx(np.mean(np.subtract(at4["post"], at4["pre"])))
    assert gap.effect.arm_value == pytest.approx(np.mean(at4["post"]) - 2.5) and gap.verdict == HELD
    log_ratio = np.log(peaks["post"]) - np.log(peaks["pre"])
    assert logit.effect.estimate == pytest.approx(math.exp(log_ratio.mean())) and logit.verdict == HELD
    assert rate.effect.estimate == pytest.approx(1000 * (np.mean(spikes["post"]) - np.mean(spikes["pre"])) / 100)
    at2 = evaluate_claims(rs, [claim(metric="val_loss_at_context", expect="lower", at=2)]).results[0]
    assert (at2.verdict, at2.why) == (UNTESTED, WHY_NO_ARM_VALUES)  # no val/loss@2x logged


def test_every_metric_has_a_function():
    assert set(METRIC_FUNCTIONS) == set(METRICS)


# --- the schema: one line per bad claim -----------------------------------------------------------------
BASE = {"id": "x", "source": "A 2020", "statement": "s", "axis": "norm.placement", "arm": "post",
        "baseline": "pre", "metric": "final_val_loss", "expect": "lower"}  # fmt: skip


@pytest.mark.parametrize(
    "change, start",
    [
        ({"metric": "loss"}, "claims[x].metric='loss' is invalid: allowed: final_val_loss, "),
        ({"expect": "smaller"}, "claims[x].expect='smaller' is invalid: allowed: lower, higher, equal"),
        ({"expect": "equal"}, "claims[x].margin=None is invalid: expect: equal needs a margin > 0"),
        ({"margin": 0.1}, "claims[x].margin=0.1 is invalid: only expect: equal takes a margin"),
        ({"baseline": "post"}, "claims[x].arm='post' is invalid: must differ from the baseline"),
        ({"colour": 1}, "claims[x].colour=1 is invalid: unknown field; fields: id, source"),
        ({"statement": ""}, "claims[x].statement='' is invalid: must be a non-empty string"),
        ({"context": {"norm.placement": "pre"}}, "claims[x].context.norm.placement='pre' is invalid: the compared"),
        ({"metric": "lr_sensitivity", "context": {"optim.lr": 0.01}}, "claims[x].context.optim.lr=0.01 is invalid"),
        ({"at": 4}, "claims[x].at=4 is invalid: final_val_loss takes no 'at'"),
        ({"id": "a b"}, "claims[a b].id='a b' is invalid: allowed: letters, digits"),
    ],
)
def test_bad_claim_is_one_line(change, start):
    with pytest.raises(ConfigError) as err:
        parse_claims([{**BASE, **change}])
    assert str(err.value).startswith(start) and "\n" not in str(err.value)


def test_duplicate_ids_and_missing_fields():
    with pytest.raises(ConfigError, match=r"^claims\[x\]\.id='x' is invalid: ids must be unique"):
        parse_claims([BASE, BASE])
    with pytest.raises(ConfigError, match=r"^claims\[x\]\.metric=None is invalid: required field is missing"):
        parse_claims([{k: v for k, v in BASE.items() if k != "metric"}])


def flat_arms(placements: list[str], lrs: list[float]) -> list[dict[str, Any]]:
    arms = [run_config(p, 0, **{"optim.lr": lr}) for p in placements for lr in lrs]
    return [flatten(a) | {"choices.norm": "layernorm"} for a in arms]


@pytest.mark.parametrize(
    "change, start",
    [
        ({"axis": "model.n_layers"}, "claims[x].axis='model.n_layers' is invalid: does not vary in this sweep"),
        ({"axis": "norm.placment"}, "claims[x].axis='norm.placment' is invalid: not a config key of this sweep"),
        (
            {"arm": "sandwich"},
            "claims[x].arm='sandwich' is invalid: not a value of norm.placement in this sweep; values: pre, post",
        ),
        ({"context": {"optim.lr": 0.1}}, "claims[x].context.optim.lr=0.1 is invalid: no arm has this value"),
        ({"context": {"optim.lrr": 0.1}}, "claims[x].context.optim.lrr=0.1 is invalid: not a config key"),
    ],
)
def test_claim_that_the_sweep_cannot_test_is_refused(change, start):
    check_claims_against_arms(parse_claims([BASE]), flat_arms(["pre", "post"], [1e-3, 1e-2]))  # fine
    with pytest.raises(ConfigError) as err:
        check_claims_against_arms(parse_claims([{**BASE, **change}]), flat_arms(["pre", "post"], [1e-3, 1e-2]))
    assert str(err.value).startswith(start), str(err.value)
    # arm and context exist, but never together
    arms = [
        a
        for a in flat_arms(["pre", "post"], [1e-3, 1e-2])
        if not (a["norm.placement"] == "post" and a["optim.lr"] == 1e-2)
    ]
    with pytest.raises(ConfigError, match=r"no arm of this sweep has norm.placement=post with optim.lr=0.01"):
        check_claims_against_arms(parse_claims([{**BASE, "context": {"optim.lr": 1e-2}}]), arms)


def test_sweep_with_a_bad_claim_fails_at_start_in_one_line(tmp_path, cache_dir):
    """A claim naming an arm the sweep does not run: exit 2, one line, no folder made, no job launched."""
    (tmp_path / "bad.yaml").write_text(
        "defaults:\n  - train\n  - override experiment: norm_2x2\n  - _self_\n"
        "claims:\n  - {id: typo, source: A 2020, statement: s, axis: norm.placement, arm: postt, baseline: pre,"
        " metric: final_val_loss, expect: lower}\n"
        "hydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n      norm.placement: pre,post\n      seed: 0,1\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "lm_ablate.train", "--config-dir", str(tmp_path), "--config-name", "bad",
         f"hydra.sweep.dir={tmp_path / 'sweep'}", "tracking=none", f"data.cache_dir={cache_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [
        "lm-ablate: error: claims[typo].arm='postt' is invalid: not a value of norm.placement in this sweep; "
        "values: pre, post"
    ]
    assert not (tmp_path / "sweep").exists()


def test_narrowing_a_study_on_the_command_line_keeps_its_claims_valid():
    """`optim.lr=3e-3` on pre_vs_post_norm leaves its 1e-2 claims without runs (untested in the report), which
    is allowed: claims are checked against the sweep file's own arms. An ad-hoc `--multirun experiment=...`
    without a sweep file (one placement only, here) has no design to check them against: also allowed."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from lm_ablate.config import CONF_DIR
    from lm_ablate.study import SWEEPS_DIR
    from lm_ablate.sweep_check import ArmChecker, claim_errors, sweep_arms

    narrowed = [f"hydra.searchpath=[file://{CONF_DIR}]", "hydra.sweep.dir=/nonexistent", "optim.lr=3e-3",
                "seed=0", "variant=gpt2_init"]  # fmt: skip
    with initialize_config_dir(str(SWEEPS_DIR), version_base="1.3"):
        master = GlobalHydra.instance().hydra.compose_config("pre_vs_post_norm", narrowed, run_mode=RunMode.MULTIRUN)
        checker, arms = ArmChecker(master), sweep_arms(master)
        assert len(arms) == 4 and all(checker.error(arm) is None for arm in arms)
        assert claim_errors(master, checker) == []
        assert len(checker.claim_arms) == 1 and len(next(iter(checker.claim_arms.values()))) == 48
    adhoc = ["hydra.sweep.dir=/nonexistent", "experiment=pre_vs_post_norm", "norm.placement=post",
             "optim.warmup_steps=0,50"]  # fmt: skip
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        master = GlobalHydra.instance().hydra.compose_config("train", adhoc, run_mode=RunMode.MULTIRUN)
        checker, arms = ArmChecker(master), sweep_arms(master)
        assert len(arms) == 2 and all(checker.error(arm) is None for arm in arms)
        assert claim_errors(master, checker) == [] and checker.claim_arms == {}


# --- the report -----------------------------------------------------------------------------------------
def write_run(run_dir: Path, cfg: dict, summary: dict, val: list[tuple[int, float]], tps: float) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / M.CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    rows = [{M.STEP: s, M.VAL_LOSS: v, M.TRAIN_LOSS: v, M.GRAD_NORM: 1.0, M.TOKENS_PER_SEC: tps} for s, v in val]
    (run_dir / M.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / M.SUMMARY_FILE).write_text(json.dumps(summary))


CLAIMS = [
    {"id": "post_worse", "source": "Xiong et al. 2020, On Layer Normalization", "statement": "Post-LN is worse.",
     "axis": "norm.placement", "arm": "post", "baseline": "pre", "metric": "capped_val_loss", "expect": "higher",
     "context": {"optim.lr": 1e-2}},
    {"id": "post_loss_worse", "source": "Xiong et al. 2020, On Layer Normalization",
     "statement": "Post-LN reaches a higher loss.", "axis": "norm.placement", "arm": "post", "baseline": "pre",
     "metric": "final_val_loss", "expect": "higher", "context": {"optim.lr": 1e-2}},
    {"id": "post_slower", "source": "Nobody 2021", "statement": "Post-LN is slower.", "axis": "norm.placement",
     "arm": "post", "baseline": "pre", "metric": "tokens_per_sec", "expect": "lower"},
]  # fmt: skip


def map_sweep(root: Path, finals: dict[tuple[str, int, float], list[float]], tps: dict[str, list[float]]) -> Path:
    """A pre/post x n_layers x lr sweep with the given final losses per seed; post at (4 layers, 1e-2) stalls."""
    job = 0
    for (placement, layers, lr), values in finals.items():
        for seed, final in enumerate(values):
            cfg = run_config(placement, seed, **{"optim.lr": lr, "model.n_layers": layers})
            cfg["claims"] = CLAIMS
            stalled = placement == "post" and layers == 4 and lr == 1e-2
            val = [(0, 5.5), (50, 3.31 if stalled else final + 0.2), (100, final)]
            summary = {M.STATUS: M.STATUS_COMPLETED, M.SEED: seed, M.FINAL_VAL_LOSS: final,
                       M.BEST_VAL_LOSS: final, M.MEAN_TOKENS_PER_SEC: tps[placement][seed], M.STEPS: 100,
                       M.GRAD_NORM_SPIKES: 0, M.LOSS_SPIKES: 0, M.VOCAB_SIZE: 256}  # fmt: skip
            write_run(root / str(job), cfg, summary, val, tps[placement][seed])
            job += 1
    return root


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    finals = {}
    for layers in (2, 4):
        for lr in (1e-3, 1e-2):
            finals[("pre", layers, lr)] = [2.50, 2.55, 2.60]
            bad = layers == 4 and lr == 1e-2
            finals[("post", layers, lr)] = [3.30, 3.30, 3.30] if bad else [2.45, 2.62, 2.66]
    tps = {"pre": [1000.0, 1010.0, 990.0], "post": [1000.0, 2300.0, 1000.0]}  # post's seed 1 ran alone
    return map_sweep(tmp_path_factory.mktemp("grid"), finals, tps)


def test_report_leads_with_claims_and_findings_and_writes_the_verdicts(grid, tmp_path):
    from analysis.report import build_report

    build_report([grid], tmp_path, workers=1)
    md = (tmp_path / "report.md").read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[:2] == ["## Claims", "## Summary"]
    # the answer first (issue 46.11): one row per claim, its verdict in the first column
    answer = md.split("## Claims", 1)[1].split("**How a verdict is decided", 1)[0]
    rows = [line for line in answer.splitlines() if line.startswith("| ")]
    assert rows[0] == "| verdict | effect [95% CI] | claim |" and len(rows) == 1 + 3  # post_worse, _loss_worse, _slower
    assert rows[1].startswith(
        "| mixed (held in 1, inconclusive in 1 of 2 contexts) | model.n_layers=2, optim.lr=0.01: post − pre = "
        "+0.0267 [-0.1387, +0.1921] (inconclusive); model.n_layers=4, optim.lr=0.01: post − pre = +0.7500 "
        "[+0.6258, +0.8742] (held; 3 of 3 seeds of post stalled (data of this metric)) | post_worse: Post-LN is "
        "worse (Xiong et al. 2020)."
    )  # capped loss is about failing to train: the stalled seeds are its data
    assert (
        "model.n_layers=4, optim.lr=0.01: post − pre = +0.7500 [+0.6258, +0.8742] (3 of 3 seeds of post stalled) | "
        "post_loss_worse"
        in rows[2]
        and rows[2].startswith("| inconclusive in all 2 contexts |")
    )  # the same runs on final val loss: stalled seeds are no data points of an effect
    summary = md.split("## Summary", 1)[1]
    assert summary.lstrip().startswith("### Findings")
    findings = summary.split("### Findings", 1)[1].split("### Runs", 1)[0]
    assert "Post-LN" not in findings  # the claims table holds the claims; the Findings the largest effects
    assert "Largest effect" not in findings  # the only interval excluding 0 has stalled seeds: not an effect
    assert "Warning: tokens/s varies by more than 1.5x between the runs of 4 arm(s)" in summary
    claims = pd.read_csv(tmp_path / "claims.csv")
    worse = claims[claims["claim_id"] == "post_worse"].set_index("context")["verdict"].to_dict()
    assert worse["model.n_layers=4, optim.lr=0.01"] == "held" and set(worse.values()) == {"held", "inconclusive"}
    loss = claims[claims["claim_id"] == "post_loss_worse"].set_index("context").loc["model.n_layers=4, optim.lr=0.01"]
    assert (loss["verdict"], loss["why"], loss["arm_stalled"], loss["arm_seeds"]) == (
        "inconclusive",
        "stalled_seeds",
        3,
        3,
    )
    assert set(claims["claim_verdict"]) == {"mixed", "inconclusive"}
    slower = claims[claims["claim_id"] == "post_slower"]
    assert (slower["notes"] == "speed_unsteady").all()
    # speed is not pinned to an LR: each side at its own best LR per depth (here 1e-3, the grid's low edge)
    assert list(slower["context"]) == ["model.n_layers=2", "model.n_layers=4"]
    assert (slower["arm_lr"] == 1e-3).all() and slower["arm_lr_at_edge"].all() and (slower["baseline_lr"] == 1e-3).all()
    assert "post at LR 0.001 ⚠ grid edge (grid 0.001 0.01)" in md
    assert "post seeds: 3.3000 (stalled), 3.3000 (stalled), 3.3000 (stalled); pre seeds: 2.5000, 2.5500" in md
    comparisons = pd.read_csv(tmp_path / "comparisons.csv", keep_default_na=False)
    assert "post_worse:held" in set(comparisons["claim_verdicts"].str.split(" ").explode())
    html = (tmp_path / "report.html").read_text()
    assert html.index("<h2>Claims</h2>") < html.index("<h2>Summary</h2>") < html.index("<h3>Findings</h3>")
    assert "heatmap" in " ".join(p.name for p in tmp_path.glob("*.png"))


def test_heatmap_marks_stalled_runs_and_renders(grid):
    from analysis.present.figures.heatmap import grid_axes, heatmap_figures
    from analysis.sources.load import load_runs

    rs = load_runs([grid])
    (comp,) = [c for c in compare_runs(rs).comparisons if c.axis.name == "norm.placement"]
    rows, cols = grid_axes(rs, comp)
    assert (rows.name, cols.name) == ("model.n_layers", "optim.lr")
    (fig,) = heatmap_figures(rs, comp)
    assert fig.png.startswith(b"\x89PNG") and "stalled" in fig.caption
    assert fig.title == "norm.placement: final validation loss, arm − baseline, by model.n_layers × optim.lr"
    stall = set(rs.runs.loc[rs.runs[M.STALLED], "run_id"])
    expected = {r for r, c in rs.configs.items() if c["norm.placement"] == "post" and c["model.n_layers"] == 4
                and c["optim.lr"] == 1e-2}  # fmt: skip
    assert stall == expected and len(stall) == 3
    # a comparison whose contexts are not a grid of two numeric axes gets none (lr by n_layers x placement)
    (other,) = [c for c in compare_runs(rs).comparisons if c.axis.name == "optim.lr"]
    assert heatmap_figures(rs, other) == []


def test_a_claim_edited_between_runs_uses_the_majority_definition(grid, tmp_path):
    from analysis.compute.claims import claims_of
    from analysis.sources.load import load_runs

    cfg_path = grid / "0" / M.CONFIG_FILE
    original = cfg_path.read_text()
    try:
        cfg = OmegaConf.to_container(OmegaConf.load(cfg_path))
        cfg["claims"][0]["expect"] = "lower"
        cfg_path.write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
        claims, invalid, conflicts = claims_of(load_runs([grid]))
    finally:
        cfg_path.write_text(original)
    assert claims[0].expect == "higher" and conflicts == {"post_worse": (23, 24)} and not invalid


def test_loss_at_best_lr_takes_each_side_at_its_own_best():
    """Optimizers tuned alike: each side at the LR of its grid with the lowest mean loss, then paired over seeds
    (the arms' grids need not share a value)."""
    finals = {"post": {1e-3: [2.60, 2.62, 2.61], 3e-3: [2.40, 2.43, 2.42], 1e-2: [2.50, 2.49, 2.55]},
              "pre": {3e-2: [2.55, 2.52, 2.53], 1e-1: [2.45, 2.47, 2.49], 3e-1: [2.90, 2.80, 2.85]}}  # fmt: skip
    specs = [((arm, lr), s, {M.FINAL_VAL_LOSS: v}) for arm, grid in finals.items()
             for lr, vs in grid.items() for s, v in enumerate(vs)]  # fmt: skip
    rs = runset(specs, ("optim.lr",))
    c = claim(metric="final_val_loss_at_best_lr", expect="lower")
    (res,) = evaluate_claims(rs, [c]).results
    d, lo, hi = paired_interval(finals["post"][3e-3], finals["pre"][1e-1])
    assert res.context == "all runs"
    assert (res.effect.estimate, res.effect.low95, res.effect.high95) == pytest.approx((d, lo, hi))
    assert res.verdict == HELD
    # worse at its best (now 1e-2): the verdict follows
    finals["post"][3e-3], finals["post"][1e-2] = [2.60, 2.62, 2.61], [2.58, 2.57, 2.59]
    specs = [((arm, lr), s, {M.FINAL_VAL_LOSS: v}) for arm, grid in finals.items()
             for lr, vs in grid.items() for s, v in enumerate(vs)]  # fmt: skip
    assert evaluate_claims(runset(specs, ("optim.lr",)), [c]).results[0].verdict == CONTRADICTED


def test_best_lr_spread_is_max_over_min_of_each_widths_best():
    """lr_transfer: per width the LR with the lowest mean capped loss; spread = max / min over widths; arm /
    baseline with a seed bootstrap."""
    lrs, widths = [1e-3, 3e-3, 1e-2], [32, 64, 128]
    best = {"post": {32: 3e-3, 64: 3e-3, 128: 1e-2}, "pre": {32: 1e-2, 64: 3e-3, 128: 1e-3}}  # spreads 3.3x, 10x
    specs = []
    for arm, by_width in best.items():
        for w in widths:
            for lr in lrs:
                for s in range(3):
                    loss = 2.5 + (0.0 if lr == by_width[w] else 0.2) + 0.01 * s
                    specs.append(((arm, w, lr), s, {M.FINAL_VAL_LOSS: loss, INIT_VAL_LOSS: 5.5}))
    rs = runset(specs, ("model.d_model", "optim.lr"))
    c = claim(metric="best_lr_spread", expect="lower")
    (res,) = evaluate_claims(rs, [c]).results
    assert res.effect.arm_value == pytest.approx(1e-2 / 3e-3) and res.effect.baseline_value == pytest.approx(10)
    assert res.effect.estimate == pytest.approx((1e-2 / 3e-3) / 10)
    assert res.effect.low95 == pytest.approx(res.effect.estimate)  # noiseless: every resample agrees
    assert res.verdict == HELD and res.context == "all runs"
