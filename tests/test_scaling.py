"""analysis/scaling.py and the report's Scaling section, on synthetic ladders with a known answer.

Run records are written as the loop writes them (tests/test_analysis.write_run), with final losses drawn from
L(C) = E + A·C^(−α) times lognormal seed noise. Rung k has N_k = N0·2^(k/2) non-embedding parameters and
trains on 20·N_k tokens at 6·N_k FLOPs/token, so its compute C = 120·N_k² doubles from rung to rung, as on the
CPU ladders. Arm rmsnorm's curve is the baseline's with compute multiplied by 1.5 (L_X(C) = L_base(1.5·C)),
so its true compute multiplier is 1.5 at every compute, its E and α are the baseline's and its A is
A·1.5^(−α).

References computed here, independently of the module: scipy's ``least_squares(loss="huber")`` for the fit,
``brentq`` on the baseline's curve for the compute multiplier, and refits on hand-picked subsets of the runs
for the held-out check.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq, least_squares
from test_analysis import write_run

from analysis.compute import scaling as S
from analysis.present.document import render_markdown
from analysis.present.sections.scaling import scaling_blocks
from analysis.report import build_report
from analysis.sources.load import load_runs
from lm_ablate import metrics as M

E0, ALPHA0, N0, EXCESS0 = 1.6, 0.3, 20_000, 1.2  # excess loss E0 + 1.2 at the smallest rung
C0 = 120.0 * N0 * N0
A0 = EXCESS0 * C0**ALPHA0
CM_TRUE = 1.5
ARMS = ("layernorm", "rmsnorm")  # the baseline is launched first
N_BOOT = 300


def n_params(rung: int) -> int:
    return int(N0 * 2 ** (rung / 2))


def compute(rung: int) -> float:
    n = n_params(rung)
    return 6.0 * n * 20 * n  # flops_per_token × tokens, as written below


def law(c: float, mult: float = 1.0, E: float = E0, A: float = A0, alpha: float = ALPHA0) -> float:
    return E + A * (mult * c) ** -alpha


def write_one(root: Path, job: int, arm: str, rung: int, seed: int, loss: float, *, status: str = M.STATUS_COMPLETED,
              lr: float = 3e-3, ladder: bool = True, model: str | None = None, n_heads: int = 4,
              fit: str | None = None) -> None:  # fmt: skip
    n = n_params(rung)
    cfg = {
        "model": {"name": model or "ladder", "d_model": 32 * (rung + 1), "n_layers": 2 + rung, "n_heads": n_heads},
        "norm": {"name": arm, "placement": "pre"},
        "optim": {"name": "adamw", "lr": lr},
        "train": {"max_tokens": 20 * n, "threads": 1, "device": "cpu"},
        "seed": seed,
        "study": "ladder",
    }
    if ladder:
        cfg["ladder"] = {"name": "cpu", "rung": rung, "tokens_per_param": 20, **({"fit": fit} if fit else {})}
    summary = {
        M.STATUS: status, M.RUN_NAME: f"{arm}-r{rung}-s{seed}", M.SEED: seed, M.FINAL_VAL_LOSS: loss,
        M.BEST_VAL_LOSS: loss, M.PARAMS_NON_EMBEDDING: n, M.PARAMS_TOTAL: n + 4096, "flops_per_token": 6.0 * n,
        M.TOTAL_TOKENS: 20 * n, M.STEPS: 100, M.MEAN_TOKENS_PER_SEC: 1000.0,
    }  # fmt: skip
    rows = [{M.STEP: 0, M.VAL_LOSS: 5.5, M.TRAIN_LOSS: 5.5}, {M.STEP: 100, M.VAL_LOSS: loss, M.TRAIN_LOSS: loss}]
    write_run(root / str(job), cfg, rows, summary)


def write_ladder(root: Path, sigma: float, seed: int = 0, mults: dict[str, float] | None = None,
                 rungs: int = 5, seeds: int = 3) -> Path:  # fmt: skip
    """5 rungs × 3 seeds × 2 arms; arm X = the baseline at ``mults[X]`` times the compute."""
    mults = mults or {"layernorm": 1.0, "rmsnorm": CM_TRUE}
    rng = np.random.default_rng(seed)
    job = 0
    for arm, mult in mults.items():
        for rung in range(rungs):
            for s in range(seeds):
                write_one(root, job, arm, rung, s, law(compute(rung), mult) * math.exp(sigma * rng.standard_normal()))
                job += 1
    return root


def study_of(root: Path, **kw) -> S.ScalingStudy:
    st = S.scaling_study(load_runs(root), n_boot=kw.pop("n_boot", N_BOOT), **kw)
    assert st is not None
    return st


@pytest.fixture(scope="module")
def noisy(tmp_path_factory) -> S.ScalingStudy:
    return study_of(write_ladder(tmp_path_factory.mktemp("noisy"), sigma=0.005))


# --- the fit --------------------------------------------------------------------------------------------
def scipy_fit(c: np.ndarray, y: np.ndarray, delta: float = S.HUBER_DELTA) -> tuple[np.ndarray, float]:
    """Hoffmann et al.'s approach 3 with scipy: Huber on log residuals, bounded, best of a start grid. Returns
    (E, log A, α) in raw units and the Huber objective Σ Huber_δ(r)."""
    c_ref = float(np.exp(np.log(c).mean()))
    lx, ly = np.log(c / c_ref), np.log(y)
    lo = [0.0, math.log(1e-6 * y.max()), 1e-3]
    hi = [y.max(), math.log(1e3 * y.max()), 3.0]
    best = None
    for E in (0.0, 0.5 * y.min(), 0.9 * y.min()):
        for alpha in (0.1, 0.4, 1.0):
            a = float(np.median(np.log(np.maximum(y - E, 1e-3)) + alpha * lx))
            x0 = np.clip([E, a, alpha], np.add(lo, 1e-9), np.subtract(hi, 1e-9))
            res = least_squares(lambda t: np.log(t[0] + np.exp(t[1] - t[2] * lx)) - ly, x0, bounds=(lo, hi),
                                loss="huber", f_scale=delta, xtol=1e-15, ftol=1e-15, gtol=1e-15)  # fmt: skip
            if best is None or res.cost < best.cost:
                best = res
    E, a, alpha = best.x
    return np.array([E, a + alpha * math.log(c_ref), alpha]), float(best.cost)  # scipy's cost = Σ Huber_δ(r)


def huber_objective(theta: np.ndarray, c: np.ndarray, y: np.ndarray, delta: float = S.HUBER_DELTA) -> float:
    r = np.log(theta[0] + np.exp(theta[1] - theta[2] * np.log(c))) - np.log(y)
    return float(np.where(np.abs(r) <= delta, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta)).sum())


@pytest.mark.parametrize("sigma", [0.001, 0.01])
def test_fit_matches_scipy_least_squares(sigma):
    rng = np.random.default_rng(7)
    c = np.repeat([compute(k) for k in range(5)], 3)
    y = np.array([law(x) for x in c]) * np.exp(sigma * rng.standard_normal(len(c)))
    ours = S.fit_power_law(c, y)
    ref, cost = scipy_fit(c, y)
    assert huber_objective(ours.as_array(), c, y) == pytest.approx(cost, rel=1e-9)
    assert ours.as_array() == pytest.approx(ref, rel=1e-4)
    # a bootstrap weight of 2 is the same as the point written twice
    w = np.ones(len(c))
    w[[0, 7, 14]] = 2
    raw, _, _ = S._fit_points(S._Points(c, y, np.zeros(len(c))), w[None, :], S.HUBER_DELTA)
    twice = np.r_[np.arange(len(c)), [0, 7, 14]]
    assert raw[0] == pytest.approx(scipy_fit(c[twice], y[twice])[0], rel=1e-4)


def test_recovers_known_law_and_multiplier(noisy):
    base, x = noisy.arms
    assert (base.arm, x.arm) == ("norm.name=layernorm", "norm.name=rmsnorm") and base.is_baseline
    assert noisy.size == S.RUNG_KEY and noisy.arm_keys == ["norm.name"]
    assert [len(r.run_ids) for r in base.rungs] == [3] * 5
    truth = {
        base.arm: {"E": E0, "A": A0, "alpha": ALPHA0},
        x.arm: {"E": E0, "A": A0 * CM_TRUE**-ALPHA0, "alpha": ALPHA0},
    }
    for arm in (base, x):
        for p, true in truth[arm.arm].items():
            low, high = arm.intervals[p]
            assert low <= true <= high, (arm.arm, p, low, true, high)
            assert low <= getattr(arm.fit, p) <= high
    largest = next(m for m in noisy.multipliers if m.at == "largest")
    assert largest.low <= CM_TRUE <= largest.high and largest.cm == pytest.approx(CM_TRUE, rel=0.15)
    assert largest.compute == pytest.approx(compute(4))
    assert [m.at for m in noisy.multipliers] == ["largest", "10x", "100x"]
    assert [m.compute / compute(4) for m in noisy.multipliers] == pytest.approx([1, 10, 100])
    # past the rungs the interval widens: the 100x one holds 1 (no evidence) and is beyond the validated 2x
    far = noisy.multipliers[-1]
    assert far.includes_one and far.beyond_validated and far.validated_factor == pytest.approx(2.0, rel=1e-3)
    assert far.high - far.low > largest.high - largest.low
    assert not noisy.warnings


def test_small_noise_multiplier_excludes_one(tmp_path):
    st = study_of(write_ladder(tmp_path, sigma=0.001, seed=3))
    largest = st.multipliers[0]
    assert largest.low <= CM_TRUE <= largest.high and not largest.includes_one and largest.low > 1.3
    base = st.arms[0]
    assert base.intervals["alpha"][0] <= ALPHA0 <= base.intervals["alpha"][1]
    assert base.intervals["alpha"][1] - base.intervals["alpha"][0] < 0.05


def test_intervals_cover_the_truth_in_most_studies(tmp_path):
    """A small coverage check: 6 independent noisy ladders; a 95% interval should miss the truth rarely."""
    hits = {"E": 0, "A": 0, "alpha": 0, "cm": 0}
    for i in range(6):
        st = study_of(write_ladder(tmp_path / str(i), sigma=0.005, seed=100 + i), n_boot=200, seed=i)
        base = st.arms[0]
        for p, true in (("E", E0), ("A", A0), ("alpha", ALPHA0)):
            hits[p] += base.intervals[p][0] <= true <= base.intervals[p][1]
        hits["cm"] += st.multipliers[0].low <= CM_TRUE <= st.multipliers[0].high
    assert min(hits.values()) >= 5, hits


def test_compute_is_flops_per_token_times_tokens(tmp_path):
    """From the runs table when the loader carries flops_per_token, else from each run's summary.json."""
    write_one(tmp_path, 0, "layernorm", 3, 0, 2.0)
    rs = load_runs(tmp_path)
    from_summary = S.run_compute(rs)
    rs.runs[M.FLOPS_PER_TOKEN] = 2.0 * 6.0 * n_params(3)
    assert from_summary == {"0": pytest.approx(compute(3))}
    assert S.run_compute(rs) == {"0": pytest.approx(2 * compute(3))}


# --- the compute multiplier -----------------------------------------------------------------------------
def test_multiplier_matches_numerical_inversion():
    base = S.PowerLaw(1.7, math.log(900.0), 0.25)
    x = S.PowerLaw(1.6, math.log(1500.0), 0.28)
    cs = np.geomspace(1e10, 1e14, 7)
    for c, cm in zip(cs, S.compute_multiplier(x, base, cs)):
        target = float(x.loss(c))
        if target <= base.E:
            assert math.isinf(cm)
            continue
        c_base = brentq(lambda t, y=target: float(base.loss(math.exp(t))) - y, 0.0, 200.0, xtol=1e-14)
        assert cm == pytest.approx(math.exp(c_base) / c, rel=1e-9)
        assert float(base.compute_for(target)) == pytest.approx(math.exp(c_base), rel=1e-9)
    # the far end lies below the baseline's E: infinite, not an error
    assert math.isinf(S.compute_multiplier(x, base, 1e30)) and float(x.loss(1e30)) < base.E
    assert math.isinf(base.compute_for(base.E))
    # a pure shift in compute is a constant multiplier
    shifted = S.PowerLaw(base.E, base.log_A - base.alpha * math.log(1.5), base.alpha)
    assert S.compute_multiplier(shifted, base, cs) == pytest.approx(np.full(len(cs), 1.5), rel=1e-12)


def test_identical_arms_give_exactly_one(tmp_path):
    rng = np.random.default_rng(5)
    job = 0
    losses = {(k, s): law(compute(k)) * math.exp(0.005 * rng.standard_normal()) for k in range(5) for s in range(3)}
    for arm in ARMS:
        for (k, s), loss in losses.items():
            write_one(tmp_path, job, arm, k, s, loss)
            job += 1
    st = study_of(tmp_path)
    assert st.arms[0].fit == st.arms[1].fit
    for m in st.form_multipliers["per_arm"]:  # each arm its own fit: the same numbers, exactly 1
        assert (m.cm, m.low, m.high) == (1.0, 1.0, 1.0) and m.includes_one
    curve = st.form_curves["per_arm"][0]
    assert (curve.cm == 1.0).all() and (curve.low == 1.0).all() and (curve.high == 1.0).all()
    for m in st.multipliers:  # one joint fit: 1 up to the solver's rounding
        assert (m.cm, m.low, m.high) == pytest.approx((1.0, 1.0, 1.0), abs=1e-9) and m.includes_one


def test_infinite_multiplier_is_reported_not_raised(tmp_path):
    """Arm rmsnorm has a lower floor E than the baseline: far enough out its loss is one the baseline never
    reaches (each arm its own E: ladder.fit=per_arm)."""
    job = 0
    laws = {"layernorm": dict(E=2.0), "rmsnorm": dict(E=1.0, A=A0 * 1.7)}
    for arm, kw in laws.items():
        for k in range(5):
            for s in range(3):
                write_one(tmp_path, job, arm, k, s, law(compute(k), **kw) * (1 + 0.001 * (s - 1)), fit="per_arm")
                job += 1
    st = study_of(tmp_path)
    far = st.multipliers[-1]
    assert math.isinf(far.cm) and math.isinf(far.high) and far.infinite_fraction > 0.5
    assert any(w.code == S.W_CM_INFINITE and w.value == far.compute for w in st.warnings)
    assert np.isinf(st.curves[0].cm[-1]) and np.isfinite(st.curves[0].cm[0])
    text = render_markdown(scaling_blocks(st))
    assert "never reaches that loss (CM = ∞)" in text and "| ∞ [" in text


# --- held-out rung --------------------------------------------------------------------------------------
def test_held_out_is_the_rung_left_out(tmp_path):
    rng = np.random.default_rng(11)
    losses = {(a, k, s): law(compute(k), 1.0 if a == "layernorm" else CM_TRUE) * math.exp(0.004 * rng.standard_normal())
              for a in ARMS for k in range(5) for s in range(3)}  # fmt: skip

    def held_outs(changed: dict) -> dict[str, S.HeldOut]:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        for job, (key, loss) in enumerate({**losses, **changed}.items()):
            write_one(root, job, key[0], key[1], key[2], loss)
        return {a.arm: a.held_out for a in study_of(root, n_boot=20).arms}

    before = held_outs({})
    x = "norm.name=rmsnorm"
    # by hand: refit on rungs 0-3 only, predict rung 4 at its compute, compare with its mean loss
    c = np.repeat([compute(k) for k in range(4)], 3)
    y = np.array([losses[("rmsnorm", k, s)] for k in range(4) for s in range(3)])
    ref, _ = scipy_fit(c, y)
    predicted = ref[0] + math.exp(ref[1] - ref[2] * math.log(compute(4)))
    observed = np.mean([losses[("rmsnorm", 4, s)] for s in range(3)])
    h = before[x]
    assert h.rung == 4 and h.compute == pytest.approx(compute(4)) and h.factor == pytest.approx(2.0, rel=1e-3)
    assert h.observed == pytest.approx(observed, rel=1e-12) and h.predicted == pytest.approx(predicted, rel=1e-6)
    assert h.rel_error == pytest.approx(abs(predicted - observed) / observed, abs=1e-6)
    assert h.rel_error < S.HELD_OUT_GOAL
    # corrupt the left-out rung of rmsnorm: its prediction stays, its error moves; the baseline is untouched
    top = held_outs({("rmsnorm", 4, s): losses[("rmsnorm", 4, s)] * 1.05 for s in range(3)})
    assert top[x].predicted == before[x].predicted and top[x].fit == before[x].fit
    assert top[x].observed == pytest.approx(before[x].observed * 1.05)
    assert top[x].rel_error > 0.03 > before[x].rel_error
    assert top["norm.name=layernorm"] == before["norm.name=layernorm"]
    # corrupt a rung the check fits on: now the prediction moves
    low = held_outs({("rmsnorm", 2, s): losses[("rmsnorm", 2, s)] * 1.05 for s in range(3)})
    assert low[x].predicted != pytest.approx(before[x].predicted, rel=1e-3)
    assert low[x].observed == before[x].observed


# --- warnings -------------------------------------------------------------------------------------------
def test_warnings_for_few_rungs_non_monotone_and_unfinished_runs(tmp_path):
    job = 0
    unfinished = []
    for arm in ARMS:
        for k in range(5):
            for s in range(3):
                if arm == "rmsnorm" and k in (0, 1):
                    continue  # rmsnorm has 3 rungs only
                loss = law(compute(k)) * (1 + 0.002 * (s - 1))
                if arm == "layernorm" and k == 3:
                    loss = law(compute(1))  # rung 3 no better than rung 2
                status = M.STATUS_COMPLETED
                if (arm, k, s) in (("layernorm", 4, 2), ("rmsnorm", 3, 0)):
                    status = M.STATUS_DIVERGED if arm == "layernorm" else M.STATUS_RUNNING
                    unfinished.append(str(job))
                write_one(tmp_path, job, arm, k, s, loss, status=status)
                job += 1
    st = study_of(tmp_path, n_boot=50)
    codes = {(w.code, w.arm) for w in st.warnings}
    assert (S.W_FEW_RUNGS, "norm.name=rmsnorm") in codes and (S.W_HELD_OUT_SKIPPED, "norm.name=rmsnorm") in codes
    assert (S.W_FEW_RUNGS, "norm.name=layernorm") not in codes
    mono = [w for w in st.warnings if w.code == S.W_NON_MONOTONE]
    assert [(w.arm, w.rung) for w in mono] == [("norm.name=layernorm", 3)]
    assert mono[0].value == pytest.approx(law(compute(1))) and mono[0].previous == pytest.approx(law(compute(2)))
    (incomplete,) = [w for w in st.warnings if w.code == S.W_NOT_COMPLETED]
    assert sorted(incomplete.run_ids) == sorted(unfinished)
    fitted = {r for a in st.arms for rung in a.rungs for r in rung.run_ids}
    assert not fitted & set(unfinished) and len(fitted) == 5 * 3 + 3 * 3 - 2
    # two rungs: no fit at all, and no multipliers against it
    two = tmp_path.parent / "two_rungs"
    job = 0
    for arm in ARMS:
        for k in range(2 if arm == "layernorm" else 5):
            write_one(two, job, arm, k, 0, law(compute(k)))
            job += 1
    st2 = study_of(two, n_boot=20)
    assert st2.arms[0].fit is None and not st2.multipliers
    codes2 = {w.code for w in st2.warnings}
    assert {S.W_NOT_FITTED, S.W_NO_BASELINE_FIT, S.W_SINGLE_SEED} <= codes2
    (single,) = [w for w in st2.warnings if w.code == S.W_SINGLE_SEED]
    assert single.arm == "norm.name=rmsnorm" and single.rungs == (0, 1, 2, 3, 4)
    text = render_markdown(scaling_blocks(st2))
    assert "5 rung(s) have one fitted run (0, 1, 2, 3, 4)" in text and "too few for three parameters" in text


# --- which runs: rungs without a ladder key, LR grids ---------------------------------------------------
def test_model_sweep_without_ladder_key_and_per_cell_lr_grid(tmp_path):
    """model=a,b,c,d (named out of size order) × norm × lr {1e-3, 3e-3}: rungs by parameter count, and each
    (arm, rung) represented by its better LR (3e-3 here, except one cell where 1e-3 wins)."""
    names = {0: "d", 1: "b", 2: "a", 3: "c"}
    job = 0
    for arm in ARMS:
        for k in range(4):
            for lr in (1e-3, 3e-3):
                worse = (lr == 1e-3) != (arm == "rmsnorm" and k == 2)
                for s in range(2):
                    loss = law(compute(k)) * (1.1 if worse else 1.0) * (1 + 0.001 * s)
                    write_one(tmp_path, job, arm, k, s, loss, lr=lr, ladder=False, model=names[k])
                    job += 1
    st = study_of(tmp_path, n_boot=50)
    assert st.size == "model.name" and "model.name" in st.size_keys and st.lr_selected
    assert st.arm_keys == ["norm.name"]
    assert [r.label for r in st.arms[0].rungs] == [f"model.name={names[k]}" for k in range(4)]
    assert [r.lr for r in st.arms[1].rungs] == [3e-3, 3e-3, 1e-3, 3e-3]
    assert all(r.lr_grid == [1e-3, 3e-3] and r.n_runs == 4 and len(r.run_ids) == 2 for a in st.arms for r in a.rungs)
    assert not any(r.seed_adjusted for a in st.arms for r in a.rungs)  # every LR ran the same seeds: plain means
    edge = [w for w in st.warnings if w.code == S.W_LR_AT_EDGE]
    assert len(edge) == 8  # a two-value grid: every best LR is at an edge
    # a shape change that leaves the parameter count alone is not a size dimension
    heads = tmp_path.parent / "heads"
    for job, (h, s) in enumerate((h, s) for h in (4, 8) for s in range(2)):
        write_one(heads, job, "layernorm", 2, s, 2.0 + 0.01 * s, ladder=False, n_heads=h)
    assert S.scaling_study(load_runs(heads)) is None


def test_a_seed_run_at_one_lr_only_does_not_move_a_cells_pick(tmp_path):
    """A third seed run at a cell's best LR only (the ladders' sweeps add one there): the cell is picked on
    seed-adjusted means (loss = LR effect + seed effect, the LR table's rule), so a poor draw of the extra seed
    cannot hand the pick to an LR it never ran; the cell then fits all three seeds of its LR. Planted: 3e-3 beats
    1e-3 by 0.5% on seeds 0 and 1; seed 2, 3% worse than the others at any LR, ran at 3e-3 only (its plain mean,
    +1%, would lose to 1e-3)."""
    job = 0
    for arm in ARMS:
        for k in range(4):
            for lr, seeds in ((1e-3, (0, 1)), (3e-3, (0, 1, 2))):
                for s in seeds:
                    loss = law(compute(k)) * (1.005 if lr == 1e-3 else 1.0) * (1.03 if s == 2 else 1 + 0.001 * s)
                    write_one(tmp_path, job, arm, k, s, loss, lr=lr)
                    job += 1
    st = study_of(tmp_path, n_boot=50)
    for a in st.arms:
        assert [r.lr for r in a.rungs] == [3e-3] * 4, a.arm
        assert all(sorted(r.seeds) == [0, 1, 2] and r.n_runs == 5 and r.seed_adjusted for r in a.rungs), a.arm
    assert set(st.rung_table["lr"]) == {3e-3}
    assert "the means are seed-adjusted" in render_markdown(scaling_blocks(st))


def test_an_lr_that_follows_the_arm_is_part_of_the_arm_not_a_grid(tmp_path):
    """ladder.lr=mup with each arm at the LR tuned for it at rung 0 (ladder_activation: GELU 2.4e-2, SwiGLU 6e-3):
    the LR splits the runs exactly as the arm does, so it is the arm's (not a grid to pick from, not a reason to
    drop the arm: before, the ladder became one arm, "all runs", and had no multiplier)."""

    def ladder(root: Path, lrs: dict[str, float]) -> S.ScalingStudy:
        rng = np.random.default_rng(0)
        job = 0
        for arm, mult in (("layernorm", 1.0), ("rmsnorm", CM_TRUE)):
            for rung in range(5):
                for s in range(3):
                    loss = law(compute(rung), mult) * math.exp(0.002 * rng.standard_normal())
                    write_one(root, job, arm, rung, s, loss, lr=lrs[arm])
                    job += 1
        return study_of(root, n_boot=50)

    st = ladder(tmp_path / "per_arm", {"layernorm": 2.4e-2, "rmsnorm": 6e-3})
    assert [a.arm for a in st.arms] == ["norm.name=layernorm", "norm.name=rmsnorm"] and not st.lr_selected
    assert all(r.lr is None for a in st.arms for r in a.rungs)
    assert not [w for w in st.warnings if w.code == S.W_LR_AT_EDGE]
    # the same losses with one LR for both arms: the LR plays no part in the fits
    same = ladder(tmp_path / "one_lr", {"layernorm": 3e-3, "rmsnorm": 3e-3})
    (m,) = [m for m in st.multipliers if m.at == "largest"]
    (m_same,) = [m for m in same.multipliers if m.at == "largest"]
    assert (m.cm, m.low, m.high) == pytest.approx((m_same.cm, m_same.low, m_same.high), rel=1e-9)
    assert 1.2 < m.cm < 1.8


def test_an_lr_mult_ladder_takes_each_optimizers_cells_at_their_best_lr(tmp_path):
    """Issue 26.5 (ladder.lr=grid over lr_mult, as ladder_optimizer): two optimizers, each on its own grid (x1, x2
    of its reference LR), are the arms (lr_mult is no arm), each (arm, rung) is fitted at its better LR, and the
    compute-multiplier claim counts stalled seeds only among the runs the fit used: a stalled run at an LR that
    lost does not make it inconclusive, and its "decided at" says each cell was taken at its best LR."""
    from dataclasses import replace

    from analysis.compute.claims import NOTE_CELL_BEST_LR, WHY_STALLED, Inputs, evaluate_claims
    from analysis.present.sections.claims import CELL_BEST_LR_TEXT, decided_at_text, reason_text, seeds_text
    from lm_ablate.claim_spec import parse_claims

    refs, mults = {"adamw": 3e-3, "muon": 2e-2}, {"adamw": 1.0, "muon": 1.5}
    job, unigram = 0, 3.31
    for opt, ref in refs.items():
        for k in range(4):
            n = n_params(k)
            for mult in ("x1", "x2"):
                worse = (mult == "x2") != (opt == "muon" and k == 2)  # x1 wins but in one cell
                for seed in range(2):
                    loss = law(compute(k), mults[opt]) * (1.1 if worse else 1.0) * (1 + 0.001 * seed)
                    if opt == "adamw" and k == 1 and seed == 0 and worse:
                        loss = 3.30  # on the unigram plateau, at the LR that lost
                    cfg = {"model": {"name": "ladder", "d_model": 32 * (k + 1), "n_layers": 2 + k, "n_heads": 4},
                           "optim": {"name": opt, "lr": ref * float(mult[1:])}, "choices": {"lr_mult": mult},
                           "train": {"max_tokens": 20 * n}, "seed": seed, "study": "ladder",
                           "ladder": {"name": "cpu", "rung": k, "tokens_per_param": 20, "lr": "grid"}}  # fmt: skip
                    summary = {M.STATUS: M.STATUS_COMPLETED, M.SEED: seed, M.FINAL_VAL_LOSS: loss, M.BEST_VAL_LOSS: loss,
                               M.PARAMS_NON_EMBEDDING: n, M.PARAMS_TOTAL: n + 4096, "flops_per_token": 6.0 * n,
                               M.TOTAL_TOKENS: 20 * n, M.STEPS: 100, M.UNIGRAM_LOSS: unigram}  # fmt: skip
                    rows = [
                        {M.STEP: 0, M.VAL_LOSS: 5.5},
                        {M.STEP: 50, M.VAL_LOSS: 3.4},
                        {M.STEP: 100, M.VAL_LOSS: loss},
                    ]
                    write_run(tmp_path / str(job), cfg, rows, summary)
                    job += 1
    rs = load_runs(tmp_path)
    assert sum(Inputs(rs).stalled.values()) == 1  # judged from its curve: within 2% of the unigram loss
    st = S.scaling_study(rs, n_boot=50)
    assert st is not None and st.arm_keys == ["optim.name"] and st.lr_selected
    assert [a.arm for a in st.arms] == ["optim.name=adamw", "optim.name=muon"]
    assert [r.lr for r in st.arms[0].rungs] == [3e-3] * 4 and [r.lr for r in st.arms[1].rungs] == [
        2e-2,
        2e-2,
        4e-2,
        2e-2,
    ]
    assert st.arms[1].rungs[0].lr_grid == [2e-2, 4e-2]
    raw = {"id": "m", "source": "Liu et al. 2025", "statement": "s", "axis": "optim", "arm": "muon",
           "baseline": "adamw", "metric": "compute_multiplier", "expect": "higher"}  # fmt: skip
    (res,) = evaluate_claims(rs, parse_claims([raw]), scaling=st).results
    assert res.arm_stalled == (0, 8) and res.baseline_stalled == (0, 8)  # 4 rungs x 2 seeds at each one's best LR
    assert res.verdict == "held" and res.effect.estimate == pytest.approx(1.5, rel=0.02)
    assert NOTE_CELL_BEST_LR in res.effect.notes and decided_at_text(res) == CELL_BEST_LR_TEXT
    # with stalled runs among those fitted, the reason counts fitted runs (rungs x budgets x seeds), and no
    # per-seed list is printed (a multiplier has no per-seed values)
    stalled = replace(res, baseline_stalled=(1, 8), why=WHY_STALLED, verdict="inconclusive")
    assert reason_text(stalled) == "1 of 8 fitted runs of adamw stalled" and seeds_text(stalled) == ""


def test_baseline_option_picks_the_arm(noisy, tmp_path):
    root = write_ladder(tmp_path, sigma=0.005)
    st = study_of(root, baseline="norm.name=rmsnorm", n_boot=50)
    assert st.baseline == "norm.name=rmsnorm" and st.arms[0].is_baseline
    assert st.multipliers[0].cm == pytest.approx(1 / noisy.multipliers[0].cm, rel=0.05)
    with pytest.raises(S.AnalysisError, match="no run of the scaling study"):
        S.scaling_study(load_runs(root), baseline="norm.name=batchnorm", n_boot=10)


# --- the report -----------------------------------------------------------------------------------------
def test_report_has_scaling_section_figures_and_tables(tmp_path):
    root = write_ladder(tmp_path / "runs", sigma=0.005)
    # never fitted, each named in a warning: diverged, no FLOPs/token in the summary, an unreadable config
    write_one(root, 99, "rmsnorm", 4, 3, 9.0, status=M.STATUS_DIVERGED)
    write_one(root, 98, "rmsnorm", 4, 4, 2.0)
    summary = json.loads((root / "98" / M.SUMMARY_FILE).read_text())
    (root / "98" / M.SUMMARY_FILE).write_text(json.dumps({k: v for k, v in summary.items() if k != "flops_per_token"}))
    write_one(root, 97, "rmsnorm", 4, 5, 2.0)
    (root / "97" / M.CONFIG_FILE).write_text("norm: [unclosed\n")
    out = build_report([root], tmp_path / "report", workers=1)
    md = (out.parent / "report.md").read_text()
    section = md[md.index("## Scaling") : md.index("## Diverged")]
    assert "norm.name=rmsnorm" in section and "no evidence of a difference" in section
    assert "1 run(s) did not complete and are never fitted: 99 (diverged)" in section
    assert "have no flops_per_token × tokens in their record and are not fitted: 98." in section
    assert "have no readable config and cannot be placed on a rung or an arm: 97." in section
    for name in ("scaling_loss-vs-compute.png", "scaling_compute-multiplier.png"):
        assert f"]({name})" in section and (out.parent / name).stat().st_size > 10_000
    html = out.read_text()
    assert "<h2>Scaling</h2>" in html and html.count('src="data:image/png;base64,') >= 2
    table = pd.read_csv(out.parent / "scaling.csv")
    assert list(table["arm"]) == ["norm.name=layernorm", "norm.name=rmsnorm"]
    assert {"E", "E_low", "alpha_high", "held_out_rel_error", "cm_largest", "cm_100x_high"} <= set(table.columns)
    assert (out.parent / "scaling.parquet").is_file() and len(pd.read_csv(out.parent / "scaling_rungs.csv")) == 10


def _cut_edges(fig) -> list[str]:
    """The edges of a figure past which something drawn reaches (cut off in the PNG): the tight box of every
    artist drawn (titles, labels, tick labels, legend) against the figure's own box."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    drawn = fig.get_tightbbox(canvas.get_renderer())
    width, height = fig.get_size_inches()
    edges = {"left": drawn.x0 < -0.01, "bottom": drawn.y0 < -0.01, "right": drawn.x1 > width + 0.01,
             "top": drawn.y1 > height + 0.01}  # fmt: skip
    return [edge for edge, cut in edges.items() if cut]


def test_scaling_figures_keep_every_label_inside(noisy, monkeypatch):
    """Issue 21.4: the multiplier figure's y label (it names the baseline) was cut at the top of the image."""
    from dataclasses import replace

    from analysis.present.figures import scaling as scaling_plots

    drawn = []
    monkeypatch.setattr(scaling_plots, "png_bytes", lambda fig: drawn.append(fig) or b"")
    long_baseline = "activation.name=gelu, model.parametrization=sp, norm.placement=pre, optim.name=adamw"
    figures = scaling_plots.scaling_figures(replace(noisy, baseline=long_baseline))
    assert [f.name for f in figures] == ["scaling_loss-vs-compute", "scaling_compute-multiplier"]
    assert [_cut_edges(fig) for fig in drawn] == [[], []]


def test_no_scaling_section_without_size(tmp_path):
    for job, (arm, s) in enumerate((a, s) for a in ARMS for s in range(2)):
        write_one(tmp_path / "runs", job, arm, 2, s, 2.0 + 0.01 * s)
    assert S.scaling_study(load_runs(tmp_path / "runs")) is None
    out = build_report([tmp_path / "runs"], tmp_path / "report", workers=1)
    assert "## Scaling" not in (out.parent / "report.md").read_text()
    assert not (out.parent / "scaling.csv").exists()


def test_a_tuned_key_is_picked_per_cell_with_the_lr_not_compared(tmp_path):
    """ladder.tune (ladder_optimizer: μP's output multiplier tuned at rung 0 does not transfer along the ladder):
    a key the runs name there and vary within every arm is no arm; each (arm, rung) cell is fitted at the setting
    of that key and the LR with the lowest mean loss, which may differ from rung to rung; the LR grid and its edge
    are those of the chosen setting. The same runs without ladder.tune compare the key as an arm (4 arms), and the
    report's --tune (tune=) refits them as if they had named it."""
    from analysis.compute.claims import NOTE_CELL_BEST_LR, evaluate_claims
    from lm_ablate.claim_spec import parse_claims

    refs, mults = {"adamw": 3e-3, "muon": 2e-2}, {"adamw": 1.0, "muon": 1.5}
    # the planted best cell (a_out, LR multiple) per arm and rung: muon's a_out 8 wins at the small rungs only
    best = {("adamw", k): (8.0, 2) for k in range(4)} | {("muon", k): (8.0 if k < 2 else 1.0, 1) for k in range(4)}

    def write(root: Path, tune: list[str] | None) -> None:
        job = 0
        for opt, ref in refs.items():
            for k in range(4):
                n = n_params(k)
                for a_out in (1.0, 8.0):
                    for x in (1, 2):
                        penalty = 1.0 + 0.04 * (a_out != best[opt, k][0]) + 0.06 * (x != best[opt, k][1])
                        for seed in range(2):
                            loss = law(compute(k), mults[opt]) * penalty * (1 + 0.001 * seed)
                            ladder = {"name": "cpu", "rung": k, "tokens_per_param": 20, "lr": "mup"}
                            cfg = {"model": {"name": "ladder", "d_model": 32 * (k + 1), "n_layers": 2 + k, "n_heads": 4,
                                             "mup_output_mult": a_out},
                                   "optim": {"name": opt, "lr": ref * x}, "train": {"max_tokens": 20 * n},
                                   "seed": seed, "study": "ladder",
                                   "ladder": ladder | ({"tune": tune} if tune is not None else {})}  # fmt: skip
                            summary = {M.STATUS: M.STATUS_COMPLETED, M.SEED: seed, M.FINAL_VAL_LOSS: loss,
                                       M.BEST_VAL_LOSS: loss, M.PARAMS_NON_EMBEDDING: n, M.PARAMS_TOTAL: n + 4096,
                                       "flops_per_token": 6.0 * n, M.TOTAL_TOKENS: 20 * n, M.STEPS: 100}  # fmt: skip
                            rows = [{M.STEP: 0, M.VAL_LOSS: 5.5}, {M.STEP: 100, M.VAL_LOSS: loss}]
                            write_run(root / str(job), cfg, rows, summary)
                            job += 1

    write(tmp_path / "tuned", ["model.mup_output_mult"])
    st = S.scaling_study(load_runs(tmp_path / "tuned"), n_boot=50)
    assert st is not None and st.arm_keys == ["optim.name"] and st.tuned == ["model.mup_output_mult"]
    for a in st.arms:
        opt = a.arm.split("=")[1]
        for r in a.rungs:
            a_out, x = best[opt, r.rung]
            assert (r.setting, r.lr) == ({"model.mup_output_mult": a_out}, refs[opt] * x), (a.arm, r.rung)
            assert r.lr_grid == [refs[opt], 2 * refs[opt]] and len(r.run_ids) == 2 and r.n_runs == 8
    assert sum(w.code == S.W_LR_AT_EDGE for w in st.warnings) == 8  # a 2-LR grid: every best is at an end
    rows = st.rung_table
    assert list(rows["tuned.model.mup_output_mult"]) == [best[o, k][0] for o in refs for k in range(4)]
    (m,) = [m for m in st.multipliers if m.at == "largest"]
    assert m.cm == pytest.approx(1.5, rel=0.02)  # the planted multiplier, each cell at its best
    raw = {"id": "m", "source": "s", "statement": "s", "axis": "optim", "arm": "muon", "baseline": "adamw",
           "metric": "compute_multiplier", "expect": "higher"}  # fmt: skip
    results = evaluate_claims(load_runs(tmp_path / "tuned"), parse_claims([raw]), scaling=st).results
    (res,) = results
    assert res.verdict == "held" and res.effect.estimate == pytest.approx(1.5, rel=0.02)  # one context: a_out pooled
    assert NOTE_CELL_BEST_LR in res.effect.notes
    text = render_markdown(scaling_blocks(st))
    assert "model.mup_output_mult (ladder.tune) varies within the arms" in text
    # the same runs, no ladder.tune recorded: the key is compared (4 arms), unless the report names it (--tune)
    write(tmp_path / "plain", None)
    plain = S.scaling_study(load_runs(tmp_path / "plain"), n_boot=50)
    assert plain is not None and plain.tuned == [] and len(plain.arms) == 4
    assert set(plain.arm_keys) == {"optim.name", "model.mup_output_mult"}
    again = S.scaling_study(load_runs(tmp_path / "plain"), n_boot=50, tune=["model.mup_output_mult"])
    assert again.tuned == st.tuned and "--tune" in again.set_at_report
    assert [(r.setting, r.lr) for a in again.arms for r in a.rungs] == [
        (r.setting, r.lr) for a in st.arms for r in a.rungs
    ]


# --- issue 46.13: the rules of the held-out check agree, rungs are rungs, an estimate outside its interval ------
@pytest.mark.slow
def test_three_rungs_with_budgets_are_held_out_checked_by_the_forms_rule_and_counted_as_rungs(tmp_path):
    """3 rungs x 3 budgets: without the largest rung 6 cells are left for 3 parameters, so each arm's own fit is
    checked (it said "no held-out check (needs 4 rungs)" beside a forms table with held-out errors), and predicts
    the cell it holds out as the per_arm form does (the same law, fitted by analysis/compute/scaling_forms.py). The fit table's "rungs" is 3,
    not 9 cells. With one budget, 2 cells are left: no check in either, and the warning says why."""
    from test_scaling_forms import write_nd_ladder

    from analysis.present.document import Table

    st = study_of(write_nd_ladder(tmp_path / "b3", budgets=(0.5, 1.0, 2.0), rungs=3), n_boot=20)
    per_arm = st.forms["per_arm"]
    for k, a in enumerate(st.arms):
        assert a.held_out is not None and a.held_out.rung == 2
        (cell,) = [c for c in per_arm.held_out if c.arm == k and c.budget == 2.0]  # the cell it predicts
        assert (a.held_out.observed, a.held_out.predicted) == pytest.approx((cell.observed, cell.predicted), rel=1e-4)
    assert not [w for w in st.warnings if w.code == S.W_HELD_OUT_SKIPPED]
    blocks = scaling_blocks(st)
    fit_table = next(b for b in blocks if isinstance(b, Table) and b.headers[:2] == ["arm", "rungs"])
    assert [row[1] for row in fit_table.rows] == ["3", "3"]
    one = study_of(write_ladder(tmp_path / "b1", sigma=0.005, rungs=3), n_boot=20)
    assert all(a.held_out is None for a in one.arms) and np.isnan(one.forms["per_arm"].held_out_error(0))
    skipped = [w for w in one.warnings if w.code == S.W_HELD_OUT_SKIPPED]
    assert [w.value for w in skipped] == [2, 2]
    assert "without the largest rung it keeps 2 (rung, budget) cell(s), fewer than its 3 parameters" in (
        render_markdown(scaling_blocks(one))
    )


def test_an_estimate_outside_its_own_interval_is_flagged(noisy):
    """A percentile bootstrap interval need not contain the point fit ("0.5755 [0.2705, 0.5738]"): the report
    marks such a number and says what it means, and leaves every number inside its interval unmarked."""
    import copy

    from analysis.present.format import OUTSIDE_MARK, with_interval

    assert with_interval(0.5755, 0.2705, 0.5738) == f"0.5755 [0.2705, 0.5738] {OUTSIDE_MARK}"
    assert with_interval(0.5700, 0.2705, 0.5738) == "0.5700 [0.2705, 0.5738]"
    assert with_interval(0.5738, 0.2705, 0.5738) == "0.5738 [0.2705, 0.5738]"  # an end is inside
    clean = render_markdown(scaling_blocks(noisy))
    assert OUTSIDE_MARK not in clean
    st = copy.deepcopy(noisy)
    a = st.arms[1]
    a.intervals["E"] = (a.fit.E - 0.3, a.fit.E - 0.002)
    text = render_markdown(scaling_blocks(st))
    assert f"{a.fit.E:.4f} [{a.fit.E - 0.3:.4f}, {a.fit.E - 0.002:.4f}] {OUTSIDE_MARK}" in text
    assert text.count(OUTSIDE_MARK) == 2  # the number, and the note that explains the mark
