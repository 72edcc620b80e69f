"""Model ladders (lm_ablate/ladder.py): each rung trains its shape for tokens_per_param x its non-embedding
parameters; bad ladders are refused before any job starts; a ladder study runs end to end into a Scaling
section."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from torch import nn

from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, compose
from lm_ablate.ladder import apply_rung, check_ladder
from lm_ablate.model import TransformerLM
from lm_ablate.train import train

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
# a ladder small enough to train in seconds: 3 rungs, 0.5 tokens per parameter
TINY_RUNGS = "ladder.rungs=[{d_model:16,n_layers:1,n_heads:2},{d_model:24,n_layers:1,n_heads:2},{d_model:32,n_layers:2,n_heads:2}]"
TINY = ["ladder=cpu", TINY_RUNGS, "ladder.tokens_per_param=0.5", "model.context=32", "train.batch_size=8",
        "tracking=none", "train.progress=false", "train.eval_batches=2", "train.eval_every=1000"]  # fmt: skip


def independent_non_embedding(d_model: int, n_layers: int, n_heads: int, vocab: int = 256) -> int:
    """Non-embedding parameters counted from the module tree: everything but nn.Embedding tables (an untied head
    is a matmul and counts)."""
    cfg = compose(["model=tiny", f"model.d_model={d_model}", f"model.n_layers={n_layers}", f"model.n_heads={n_heads}"])
    model = TransformerLM(cfg, vocab)
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


@pytest.mark.parametrize("rung", [0, 2])
def test_each_rung_trains_its_shape_for_tokens_per_param_times_its_size(rung, tmp_path, cache_dir):
    cfg = compose([*TINY, f"ladder.rung={rung}", f"data.cache_dir={cache_dir}"])
    shape = yaml.safe_load(TINY_RUNGS.split("=", 1)[1].replace(":", ": ").replace(",", ", "))[rung]
    assert {k: cfg.model[k] for k in shape} == shape  # the rung's shape is the model's
    summary = train(cfg, tmp_path / "run")
    n = independent_non_embedding(**shape)
    assert summary[M.PARAMS_NON_EMBEDDING] == n
    recorded = yaml.safe_load((tmp_path / "run" / M.CONFIG_FILE).read_text())
    assert recorded["train"]["max_tokens"] == math.ceil(0.5 * n)
    assert recorded["model"]["d_model"] == shape["d_model"] and recorded["ladder"]["rung"] == rung
    assert summary[M.STOP_REASON] == "max_tokens" and summary[M.STEPS] == math.ceil(0.5 * n / (8 * 32))
    rows = [json.loads(line) for line in (tmp_path / "run" / M.METRICS_FILE).read_text().splitlines()]
    assert rows[-1][M.LR] == pytest.approx(3e-3 * 0.1)  # the LR schedule ends exactly at the rung's budget
    # a requeued or re-launched rung computes the same budget, so it is the recorded run: nothing changes
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    again = train(compose([*TINY, f"ladder.rung={rung}", f"data.cache_dir={cache_dir}"]), tmp_path / "run")
    assert again[M.STEPS] == summary[M.STEPS]
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


def test_mup_rule_bases_every_rung_at_rung_0():
    cfg = compose([*TINY, "ladder.lr=mup", "ladder.rung=2"])
    assert cfg.model.parametrization == "mup" and cfg.model.mup_base_width == 16 and cfg.model.d_model == 32
    plain = compose([*TINY, "ladder.rung=2"])
    assert plain.model.parametrization == "sp"


def test_a_mup_ladder_run_trains_from_the_command_line(tmp_path, cache_dir):
    """ladder.lr=mup through ``python -m lm_ablate.train`` (issue 26: the training command cleared the keys mup
    reads before the ladder turned mup on, so every mup ladder run, conf/ladder/gpu.yaml's default, was refused
    with "model.mup_output_mult=None is invalid"): it trains, under mup based at rung 0, with the multipliers
    given on the command line."""
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "lm_ablate.train", *TINY, "ladder.lr=mup", "ladder.rung=1", "model.mup_output_mult=2",
         f"data.cache_dir={cache_dir}", "train.threads=1", f"hydra.run.dir={run}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    model = OmegaConf.load(run / M.CONFIG_FILE).model
    assert (model.parametrization, model.mup_base_width, model.d_model) == ("mup", 16, 24)
    assert (model.mup_output_mult, model.mup_attn_mult) == (2.0, 1.0)
    assert json.loads((run / M.SUMMARY_FILE).read_text())[M.STATUS] == M.STATUS_COMPLETED


@pytest.mark.parametrize(
    "overrides, starts",
    [
        (["ladder.rungs=[{d_model:16,n_layers:1,n_heads:2}]"], "ladder.rungs="),  # one rung
        (
            ["ladder.rungs=[{d_model:16,n_layers:1,n_heads:2},{d_model:24,n_layers:1,n_heads:2}]"],
            "ladder.rungs=",
        ),  # two
        (
            [
                "ladder.rungs=[{d_model:32,n_layers:1,n_heads:2},{d_model:24,n_layers:1,n_heads:2},{d_model:40,n_layers:1,n_heads:2}]"
            ],
            "ladder.rungs[1]=",
        ),
        (
            [
                "ladder.rungs=[{d_model:16,n_layers:1,n_heads:2},{d_model:25,n_layers:1,n_heads:2},{d_model:32,n_layers:1,n_heads:2}]"
            ],
            "ladder.rungs[1]=",
        ),
        (
            [
                "ladder.rungs=[{d_model:16,n_layers:1,n_heads:2},{width:24,n_layers:1,n_heads:2},{d_model:32,n_layers:1,n_heads:2}]"
            ],
            "ladder.rungs[1]=",
        ),
        (["ladder.rung=3"], "ladder.rung="),
        (["ladder.lr=sometimes"], "ladder.lr="),
        (["ladder.tokens_per_param=0"], "ladder.tokens_per_param="),
        (["ladder.tokens_per_param=0.001"], "ladder.tokens_per_param="),  # less than one step
        (["train.max_steps=3"], "train.max_steps="),  # would cut the budget short
    ],
)
def test_bad_ladders_fail_in_one_line_naming_the_key(overrides, starts):
    with pytest.raises(ConfigError) as err:
        cfg = compose([*TINY, *overrides])
        apply_rung(cfg)
        check_ladder(cfg, 256)
    assert str(err.value).startswith(starts) and "\n" not in str(err.value)


def sweep_check(study: str, overrides: list[str]) -> list[str]:
    """lm_ablate.sweep_check's lines for ``study`` with ``overrides``, composed in this process (as the CLI)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from lm_ablate.config import CONF_DIR
    from lm_ablate.study import SWEEPS_DIR
    from lm_ablate.sweep_check import sweep_errors

    overrides = [f"hydra.searchpath=[file://{CONF_DIR}]", "hydra.sweep.dir=/nonexistent", *overrides]
    with initialize_config_dir(str(SWEEPS_DIR), version_base="1.3"):
        master = GlobalHydra.instance().hydra.compose_config(study, overrides, RunMode.MULTIRUN)
        return sweep_errors(master)


def test_a_ladder_sweep_is_refused_before_any_job_starts(tmp_path):
    """One or two rungs (a fit of E + A C^-alpha has three parameters: issue 21 found a 2-rung study that trained
    and then could not be fitted), a hand-set train.max_tokens (it would be replaced), or ladder.lr=grid with one
    LR (nothing to choose from): one line, nothing created (the command once; the checks it runs in-process)."""
    out = subprocess.run(
        [sys.executable, "-m", "lm_ablate.train", "--config-dir", str(ROOT / "sweeps"), "--config-name",
         "ladder_activation", f"hydra.sweep.dir={tmp_path / 'sweep'}", "ladder.rung=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "at least 3 rungs" in lines[0], out.stderr[-2000:]
    assert not (tmp_path / "sweep").exists()
    cases = (
        (["ladder.rung=0,1"], "at least 3 rungs"),
        (["train.max_tokens=5000"], "a ladder sets it"),
        (
            ["optim.lr=3e-3", "ladder.lr=grid", "model.mup_output_mult=null"],  # grid trains SP: no μP multiplier
            "ladder.lr='grid' is invalid: ladder=cpu_mup fits each (arm, rung) at its best LR",
        ),
    )
    for extra, words in cases:
        (line,) = sweep_check("ladder_activation", extra)
        assert words in line and "\n" not in line, line
    # the optimizer study as a grid ladder: lr_mult gives each optimizer one LR: refused; two multipliers are each
    # optimizer's own grid (train.max_steps as a ladder yaml sets it)
    grid = ["ladder=cpu", "ladder.lr=grid", "ladder.rung=0,1,2", "train.max_steps=1000000000", "optim=adamw,muon"]
    (line,) = sweep_check("optimizer", [*grid, "lr_mult=x1"])
    assert "the adamw arms train one optim.lr (0.003), the muon arms train one optim.lr (0.02): sweep" in line
    assert sweep_check("optimizer", [*grid, "lr_mult=x1,x2"]) == []


@pytest.mark.slow
def test_a_ladder_study_runs_and_reports_compute_multipliers(tmp_path, cache_dir):
    """2 arms x 4 tiny rungs x 2 seeds through the study command: the report has the Scaling section with a fit
    per arm, the multiplier of the second arm, and the held-out rung. (ladder.lr=fixed trains SP, which has no μP
    output multiplier: the sweep's per-arm model.mup_output_mult is cleared with it, or it is refused in one line.)"""
    rungs = ("ladder.rungs=[{d_model:16,n_layers:1,n_heads:2},{d_model:24,n_layers:1,n_heads:2},"
             "{d_model:32,n_layers:1,n_heads:2},{d_model:32,n_layers:2,n_heads:2}]")  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "lm_ablate.study", "ladder_activation", "--out", str(tmp_path / "ladder"), rungs,
         "ladder.rung=0,1,2,3", "seed=0,1", "ladder.lr=fixed", "model.mup_output_mult=null", "optim.lr=1e-2", "ladder.budgets=null", "ladder.fit_budgets=null",
         "ladder.tokens_per_param=4", "eval.max_examples=40", "train.batch_size=4",
         "train.eval_batches=2", "tracking=none", "train.progress=false", "train.threads=1",
         f"data.cache_dir={cache_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = (tmp_path / "ladder" / "report" / "report.md").read_text()
    assert "Scaling" in report
    # the rungs are the Scaling section's dimension: named once in the summary, not warned about as uncompared
    assert "Model size varies (the rungs" in report and "also varied but not compared" not in report
    assert "Task prediction in two steps" in report  # the study's eval=quick: compute -> task BPB -> accuracy
    scaling = (tmp_path / "ladder" / "report" / "scaling.csv").read_text()
    assert "swiglu" in scaling and "gelu" in scaling
    summaries = sorted((tmp_path / "ladder").glob("*/summary.json"))
    assert len(summaries) == 16 and all(json.loads(p.read_text())[M.STATUS] == M.STATUS_COMPLETED for p in summaries)


def test_the_sweep_check_applies_the_ladder_lr_rule_the_job_runs():
    """ladder.lr=mup switches μP on when a job's config is made, after every override: the sweep check applies the
    rung after each arm's overrides as the job does, so a sweep given ladder.lr=fixed (SP) is checked as SP. Its
    per-arm μP output multiplier (sweeps/ladder_activation.yaml) is refused before any job starts (each job would
    refuse it), and accepted once cleared; without the override the μP arms pass."""
    errors = sweep_check("ladder_activation", ["ladder.lr=fixed", "optim.lr=1e-2"])
    assert errors and all("model.mup_output_mult=" in e and "model.parametrization=sp" in e for e in errors), errors
    assert sweep_check("ladder_activation", ["ladder.lr=fixed", "optim.lr=1e-2", "model.mup_output_mult=null"]) == []
    assert sweep_check("ladder_activation", []) == []


def test_a_three_rung_ladder_sweep_is_accepted_with_a_warning_about_the_held_out_check(capsys):
    for rungs, warned in (("0,1,2", True), ("0,1,2,3", False)):
        assert sweep_check("ladder_activation", [f"ladder.rung={rungs}"]) == []
        err = capsys.readouterr().err
        assert ("no held-out check" in err) == warned, err
