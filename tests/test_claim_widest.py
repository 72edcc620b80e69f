"""The lr_transfer study's second claim: muP's loss at the widest width, at its best LR there, against SP's best
there (metric widest_val_loss_at_best_lr in lm_ablate/claim_spec.py, analysis/compute/claims.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st
from test_claims import claim, runset

from analysis.compute.claims import HELD, UNTESTED, WHY_NO_ARM_VALUES, evaluate_claims
from lm_ablate import metrics as M

LRS, WIDTHS = (1e-3, 3e-3, 1e-2), (32, 64, 128)


def loss(arm: str, width: int, lr: float, seed: int) -> float:
    """post is best at lr 3e-3 everywhere; pre's best moves to 1e-3 at the widest width; at width 128 post's best
    (2.30 + noise) is lower than pre's best (2.40 + noise); narrower widths favour pre (a decoy)."""
    best = {"post": 3e-3, "pre": 1e-3 if width == 128 else 1e-2}[arm]
    floor = {("post", 128): 2.30, ("pre", 128): 2.40}.get((arm, width), 2.0 if arm == "pre" else 2.6)
    return floor + (0.0 if lr == best else 0.3) + 0.01 * seed + (0.004 * seed**2 if arm == "post" else 0.0)


def specs(arms=("post", "pre"), widths=WIDTHS):
    return [((a, w, lr), s, {M.FINAL_VAL_LOSS: loss(a, w, lr, s)}) for a in arms for w in widths
            for lr in LRS for s in range(3)]  # fmt: skip


def test_each_side_at_its_own_best_lr_at_the_widest_width():
    rs = runset(specs(), ("model.d_model", "optim.lr"))
    (res,) = evaluate_claims(rs, [claim(metric="widest_val_loss_at_best_lr", expect="lower")]).results
    post = np.array([loss("post", 128, 3e-3, s) for s in range(3)])
    pre = np.array([loss("pre", 128, 1e-3, s) for s in range(3)])
    d = post - pre
    half = st.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)  # paired by seed, written out here
    e = res.effect
    assert (e.arm_value, e.baseline_value) == pytest.approx((post.mean(), pre.mean()))
    assert (e.estimate, e.low95, e.high95) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))
    assert e.test == "paired" and res.verdict == HELD and res.context == "all runs"


def test_a_side_without_runs_at_the_widest_width_is_untested():
    """The widest width is the widest either side ran: an arm that stopped at 64 is not compared at 64."""
    rs = runset(specs(("post",), WIDTHS[:2]) + specs(("pre",)), ("model.d_model", "optim.lr"))
    (res,) = evaluate_claims(rs, [claim(metric="widest_val_loss_at_best_lr", expect="lower")]).results
    assert res.verdict == UNTESTED and res.why == WHY_NO_ARM_VALUES
