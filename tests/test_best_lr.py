"""analysis/best_lr.py on a synthetic optimizer study: three optimizers, each on its own LR grid (the grids
share no value, or only some), 3 seeds; the best LR of each arm and the loss difference at each arm's best
against the baseline at its best, worked out by hand here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from scipy import stats as st

from analysis.compute.best_lr import compare_at_best_lr
from analysis.sources.load import AnalysisError, load_runs
from lm_ablate import metrics as M

# optimizer -> (momentum as its yaml sets it, {lr: final val loss of seeds 0, 1, 2}); None = diverged
ARMS = {
    "adamw": (0.9, {7.5e-4: [2.60, 2.62, 2.61], 1.5e-3: [2.50, 2.53, 2.52], 3e-3: [2.45, 2.47, 2.50]}),
    "sgd": (0.9, {0.15: [2.90, 2.95, 2.93], 0.3: [2.70, 2.72, 2.74], 0.6: [2.80, None, 2.85]}),
    "muon": (0.95, {7.5e-4: [2.55, 2.56, 2.54], 1.5e-3: [2.40, 2.42, 2.44], 3e-3: [2.42, 2.44, 2.47]}),
}
INIT = 5.5


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("optimizer") / "multirun"
    job = 0
    for name, (momentum, grid) in ARMS.items():
        for lr, finals in grid.items():
            for seed, final in enumerate(finals):
                run = root / str(job)
                run.mkdir(parents=True)
                cfg = {"optim": {"name": name, "lr": lr, "momentum": momentum}, "seed": seed, "study": "optimizer"}
                (run / M.CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
                end = final if final is not None else math.nan
                rows = [{M.STEP: 0, M.VAL_LOSS: INIT, M.TOKENS: 0}, {M.STEP: 10, M.TRAIN_LOSS: end, M.VAL_LOSS: end}]
                (run / M.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
                status = M.STATUS_COMPLETED if final is not None else M.STATUS_DIVERGED
                summary = {M.STATUS: status, M.SEED: seed, M.FINAL_VAL_LOSS: final, M.STEPS: 10}
                (run / M.SUMMARY_FILE).write_text(json.dumps(summary))
                job += 1
    return root


def mean(x: list[float]) -> float:
    return sum(x) / len(x)


def test_each_arm_at_its_own_best_against_the_baseline_at_its_best(study):
    result = compare_at_best_lr(load_runs([study]))
    t = result.table.set_index("context")
    adamw, sgd, muon = (next(c for c in t.index if name in c) for name in ("adamw", "sgd", "muon"))
    assert result.baseline == adamw and t.index[0] == adamw  # the first run launched
    assert t.loc[adamw, "best_lr"] == 3e-3 and t.loc[sgd, "best_lr"] == 0.3 and t.loc[muon, "best_lr"] == 1.5e-3
    assert t.loc[adamw, "best_at_edge"] and not t.loc[sgd, "best_at_edge"] and not t.loc[muon, "best_at_edge"]
    base = ARMS["adamw"][1][3e-3]
    for context, lr, name in ((sgd, 0.3, "sgd"), (muon, 1.5e-3, "muon")):
        arm = ARMS[name][1][lr]
        d = [a - b for a, b in zip(arm, base)]
        half = st.t.ppf(0.975, 2) * st.tstd(d) / math.sqrt(3)
        row = t.loc[context]
        assert row["test"] == "paired" and row["n_pairs"] == 3
        assert row["delta_final_val_loss"] == pytest.approx(mean(arm) - mean(base))
        assert row["delta_ci_low"] == pytest.approx(mean(d) - half) and row["delta_ci_high"] == pytest.approx(
            mean(d) + half
        )
        assert row[f"{M.FINAL_VAL_LOSS}_mean"] == pytest.approx(mean(arm))
    assert t.loc[muon, "delta_ci_high"] < 0 < t.loc[sgd, "delta_ci_low"]  # muon better, sgd worse, at their bests


def test_baseline_by_value_and_welch_when_seeds_do_not_pair(study, tmp_path):
    result = compare_at_best_lr(load_runs([study]), baseline="optim.name=sgd")
    assert "sgd" in result.baseline and result.table["baseline"].tolist() == [True, False, False]
    with pytest.raises(AnalysisError, match="no arm has that value"):
        compare_at_best_lr(load_runs([study]), baseline="optim.name=lion")
    # drop muon's seed 0 and 1 at its best LR: one shared seed is no pairing -> Welch
    import shutil

    copy = tmp_path / "multirun"
    shutil.copytree(study, copy)
    for run in copy.iterdir():
        cfg = OmegaConf.load(run / M.CONFIG_FILE)
        if cfg.optim.name == "muon" and cfg.optim.lr == 1.5e-3 and cfg.seed < 2:
            shutil.rmtree(run)
    t = compare_at_best_lr(load_runs([copy])).table.set_index("context")
    muon = next(c for c in t.index if "muon" in c)
    assert t.loc[muon, "best_lr"] == 1.5e-3 and t.loc[muon, f"{M.FINAL_VAL_LOSS}_n"] == 1
    assert t.loc[muon, "test"] == "" and math.isnan(t.loc[muon, "delta_ci_low"])  # one run: no interval
    assert t.loc[muon, "delta_final_val_loss"] == pytest.approx(2.44 - mean(ARMS["adamw"][1][3e-3]))


def test_no_comparison_without_an_lr_axis_or_a_second_arm(study, tmp_path):
    import shutil

    one = tmp_path / "one"
    shutil.copytree(study, one)
    for run in one.iterdir():
        if OmegaConf.load(run / M.CONFIG_FILE).optim.name != "adamw":
            shutil.rmtree(run)
    assert compare_at_best_lr(load_runs([one])) is None


def test_the_report_shows_every_arm_at_its_own_best(study, tmp_path):
    from analysis.report import build_report

    build_report([study], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    section = md.split("### Each arm at its own best learning rate", 1)[1].split("\n#", 1)[0]
    best = compare_at_best_lr(load_runs(study))
    for _, row in best.table.iterrows():  # every arm, with the delta the comparison computed
        line = next(line for line in section.splitlines() if line.startswith(f"| {row['context']} |"))
        expected = "baseline" if row["baseline"] else f"{row['delta_final_val_loss']:+.4f}"
        assert expected in line
