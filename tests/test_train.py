"""The loop end to end: it learns, it is reproducible, it records runs, it survives divergence, it sweeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lm_ablate import metrics as M
from lm_ablate.config import compose
from lm_ablate.data import load_data
from lm_ablate.train import train

ROOT = Path(__file__).resolve().parents[1]
TINY = ["debug=smoke", "train.eval_every=20"]


def rows(run_dir: Path) -> list[dict]:
    return [M.from_json(json.loads(line)) for line in (Path(run_dir) / M.METRICS_FILE).read_text().splitlines()]


def curve(run_dir: Path, key: str) -> list[float]:
    return [r[key] for r in rows(run_dir) if key in r]


def run(tmp_path: Path, cache_dir: str, *overrides: str, name: str = "run") -> dict:
    cfg = compose([*TINY, f"data.cache_dir={cache_dir}", *overrides])
    return train(cfg, tmp_path / name)


def test_loss_falls_below_the_unigram_baseline(tmp_path, cache_dir):
    summary = run(tmp_path, cache_dir, "train.max_steps=60", "train.batch_size=8", "optim.lr=1e-2")
    val = curve(tmp_path / "run", M.VAL_LOSS)
    # independent baseline: cross-entropy of the validation bytes under the training unigram distribution
    data = load_data(compose([f"data.cache_dir={cache_dir}"]).data)
    p = np.bincount(data.train, minlength=256) + 1.0
    p /= p.sum()
    unigram = float(-np.log(p[data.val]).mean())
    assert val[0] == pytest.approx(np.log(256), abs=0.1)  # uniform at init
    assert summary[M.STATUS] == M.STATUS_COMPLETED
    assert summary[M.FINAL_VAL_LOSS] == val[-1] < unigram - 0.1 < val[0]


def test_same_seed_same_curve_other_seed_other_curve(tmp_path, cache_dir):
    for name, seed in [("a", 3), ("b", 3), ("c", 4)]:
        run(tmp_path, cache_dir, f"seed={seed}", "regularization=dropout", name=name)
    a, b, c = (curve(tmp_path / n, M.TRAIN_LOSS) for n in "abc")
    assert a == b and len(a) == 20
    assert a != c


def test_run_record(tmp_path, cache_dir):
    summary = run(
        tmp_path, cache_dir, "norm=rmsnorm", "regularization=zloss", "train.log_every=2", "train.probe_every=0"
    )
    run_dir = tmp_path / "run"
    saved = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert saved == json.loads(json.dumps(summary))
    for key in (
        M.STATUS,
        M.FINAL_VAL_LOSS,
        M.BEST_VAL_LOSS,
        M.GRAD_NORM_SPIKES,
        M.LOSS_SPIKES,
        M.MEAN_TOKENS_PER_SEC,
        M.PARAMS_TOTAL,
        M.PARAMS_NON_EMBEDDING,
        M.STEPS,
        M.TOTAL_TOKENS,
        M.WALL_TIME_S,
    ):
        assert saved[key] is not None, key
    assert saved[M.STEPS] == 20 and saved[M.TOTAL_TOKENS] == 20 * 4 * 32
    assert saved[M.PARAMS_NON_EMBEDDING] < saved[M.PARAMS_TOTAL]
    steps = [r[M.STEP] for r in rows(run_dir)]
    assert steps == [0] + list(range(2, 21, 2))  # the init eval, then every 2nd step (evals at 20 fall on it)
    train_row = rows(run_dir)[1]
    for key in (
        M.TRAIN_LOSS,
        M.TRAIN_Z_LOSS,
        M.GRAD_NORM,
        M.LR,
        M.TOKENS_PER_SEC,
        M.STEP_TIME_MS,
        M.SPIKE_GRAD_NORM,
        M.SPIKE_GRAD_NORM_COUNT,
        M.SPIKE_LOSS,
        M.SPIKE_LOSS_COUNT,
    ):
        assert key in train_row, key
    assert train_row[M.TRAIN_Z_LOSS] > 0
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / M.CONFIG_FILE)
    assert cfg.norm.name == "rmsnorm" and cfg.choices.norm == "rmsnorm" and cfg.regularization.z_loss == 1e-4


def test_absurd_lr_ends_diverged(tmp_path, cache_dir):
    summary = run(tmp_path, cache_dir, "optim.lr=1e30")
    assert summary[M.STATUS] == M.STATUS_DIVERGED
    assert summary[M.DIVERGED_AT] == summary[M.STEPS] < 20
    last = rows(tmp_path / "run")[-1]
    assert not (np.isfinite(last[M.TRAIN_LOSS]) and np.isfinite(last[M.GRAD_NORM]))

    # the record stays strict JSON: the non-finite values are the documented strings, not bare NaN/Infinity
    def strict(constant: str) -> None:
        raise AssertionError(f"bare {constant} in a run record")

    raw = [
        json.loads(line, parse_constant=strict) for line in (tmp_path / "run" / M.METRICS_FILE).read_text().splitlines()
    ]
    assert {raw[-1][M.TRAIN_LOSS], raw[-1][M.GRAD_NORM]} & set(M.NONFINITE)
    json.loads((tmp_path / "run" / M.SUMMARY_FILE).read_text(), parse_constant=strict)
    # and the analysis reads them back as the non-finite floats they stand for
    from analysis.sources.load import NONFINITE_STEP, load_runs

    rs = load_runs([tmp_path / "run"])
    (run_id,) = rs.history
    assert rs.history[run_id].attrs[NONFINITE_STEP] == summary[M.DIVERGED_AT]
    assert not np.isfinite(rs.history[run_id][M.GRAD_NORM].iloc[-1]) or not np.isfinite(
        rs.history[run_id][M.TRAIN_LOSS].iloc[-1]
    )


def test_grad_norm_is_logged_before_clipping(tmp_path, cache_dir):
    run(tmp_path, cache_dir, "regularization.grad_clip=1e-3", name="clipped")
    run(tmp_path, cache_dir, "regularization.grad_clip=0", name="free")
    clipped = curve(tmp_path / "clipped", M.GRAD_NORM)
    free = curve(tmp_path / "free", M.GRAD_NORM)
    assert clipped[0] == pytest.approx(free[0], rel=1e-6) and clipped[0] > 1e-2  # same batch, same init
    assert curve(tmp_path / "clipped", M.TRAIN_LOSS)[-1] > curve(tmp_path / "free", M.TRAIN_LOSS)[-1]


def test_wandb_offline_run_holds_the_logged_metrics(tmp_path, cache_dir, monkeypatch):
    import wandb

    from analysis.sources.wandb_offline import find_run_files, read_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    run(tmp_path, cache_dir, "tracking=wandb", "norm=rmsnorm", "study=wb_test")
    wandb.teardown()  # finish() returns before wandb-core has flushed the offline file; teardown waits for it
    files = find_run_files(tmp_path / "run")
    assert len(files) == 1 and str(files[0]).startswith(str(tmp_path / "run" / "wandb"))
    record = read_run(files[0])
    history = [h for h in record["history"] if M.TRAIN_LOSS in h]
    local = [r for r in rows(tmp_path / "run") if M.TRAIN_LOSS in r]
    assert len(history) == len(local) == 20
    for h, r in zip(history, local):
        assert h["_step"] == r[M.STEP]
        for key in (M.TRAIN_LOSS, M.GRAD_NORM, M.TOKENS_PER_SEC):
            assert h[key] == r[key], key
    assert record["group"] == "wb_test"
    assert record["config"]["norm"]["name"] == "rmsnorm"
    assert "norm=rmsnorm" in record["tags"] and "norm.placement=pre" in record["tags"]
    summary = json.loads((tmp_path / "run" / M.SUMMARY_FILE).read_text())
    assert summary["wandb_id"] == record["id"] and summary["wandb_mode"] == "offline"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_bad_override_is_one_line_and_leaves_no_finished_run(tmp_path, cache_dir):
    out = _cli(
        "-m",
        "lm_ablate.train",
        "debug=smoke",
        "model.n_heads=3",
        f"hydra.run.dir={tmp_path / 'r'}",
        f"data.cache_dir={cache_dir}",
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "lm-ablate: error: model.n_heads=3 is invalid: must divide model.d_model=32 (or set model.head_dim)"
    ]
    assert not (tmp_path / "r" / M.SUMMARY_FILE).exists()


@pytest.mark.slow
def test_2x2_multirun_with_divergence_then_report(tmp_path, cache_dir):
    """A 2x2 sweep with 2 seeds gives 8 run records and a report with both comparisons; an extra arm with an
    absurd LR diverges without stopping the sweep."""
    sweep = tmp_path / "sweep"
    out = _cli(
        "-m",
        "lm_ablate.train",
        "--multirun",
        "norm=layernorm,rmsnorm",
        "norm.placement=pre,post",
        "seed=0,1",
        *TINY,
        f"data.cache_dir={cache_dir}",
        f"hydra.sweep.dir={sweep}",
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    diverging = _cli(
        "-m",
        "lm_ablate.train",
        "--multirun",
        "optim.lr=1e30,1e-3",
        *TINY,
        f"data.cache_dir={cache_dir}",
        f"hydra.sweep.dir={tmp_path / 'lr'}",
        cwd=ROOT,
    )
    assert diverging.returncode == 0, diverging.stderr[-2000:]
    statuses = [json.loads((tmp_path / "lr" / str(i) / M.SUMMARY_FILE).read_text())[M.STATUS] for i in range(2)]
    assert statuses == [M.STATUS_DIVERGED, M.STATUS_COMPLETED]

    summaries = sorted(sweep.glob(f"*/{M.SUMMARY_FILE}"))
    assert len(summaries) == 8
    assert {json.loads(s.read_text())[M.STATUS] for s in summaries} == {M.STATUS_COMPLETED}
    report = _cli("-m", "analysis.report", str(sweep), "--out", str(tmp_path / "report"), cwd=ROOT)
    assert report.returncode == 0, report.stderr
    html_path = Path(report.stdout.strip().splitlines()[-1])
    assert html_path == tmp_path / "report" / "report.html"
    html = html_path.read_text()
    for axis in ("norm.name", "norm.placement"):
        assert axis in html
    assert "data:image/png;base64," in html
    csv = (tmp_path / "report" / "runs.csv").read_text().splitlines()
    assert len(csv) == 1 + 8


@pytest.mark.slow
def test_joblib_launcher(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    out = _cli(
        "-m",
        "lm_ablate.train",
        "--multirun",
        "hydra/launcher=local_parallel",
        "norm=layernorm,rmsnorm",
        "train.threads=1",
        *TINY,
        f"data.cache_dir={cache_dir}",
        f"hydra.sweep.dir={sweep}",
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list(sweep.glob(f"*/{M.SUMMARY_FILE}"))) == 2


ARCHS = sorted(p.stem for p in (ROOT / "conf" / "arch").glob("*.yaml"))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_arch_preset_trains_through_the_loop(tmp_path, cache_dir, arch):
    summary = run(tmp_path, cache_dir, f"arch={arch}", "train.max_steps=4", "train.probe_every=2")
    assert summary[M.STATUS] == M.STATUS_COMPLETED and np.isfinite(summary[M.FINAL_VAL_LOSS])
    assert summary[M.CHOICES]["arch"] == arch
    assert any(M.layer_metric(0, M.MAX_ATTN_LOGIT) in r for r in rows(tmp_path / "run"))


def test_arch_presets_cover_the_families():
    assert set(ARCHS) >= {
        "original",
        "gpt2",
        "gptj",
        "neox",
        "opt_postln",
        "bloom",
        "palm",
        "llama",
        "mistral",
        "qwen3",
        "gemma2",
        "olmo2",
    }
