"""analysis/: loading damaged sweeps, finding the design, the numbers in the tables, and the report files.

The sweep is synthetic: a 2x2 design (norm.name x norm.placement, norm.bias changing with norm.name), three
completed seeds per cell with final validation losses chosen here, plus one extra run per cell that is broken
in a different way (diverged, no summary, corrupt summary, still running) and whose value would move the
mean if it were wrongly averaged. Expected statistics are recomputed from the textbook formulas with numpy and
scipy's t distribution, independently of analysis.compute.stats.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from reference_stats import expected_ci, expected_paired, expected_welch
from scipy import stats as st

from analysis.compute.compare import compare_runs
from analysis.compute.stats import mean_ci, welch
from analysis.report import build_report
from analysis.sources.load import AnalysisError, load_runs
from lm_ablate import metrics as M

XSS = "<script>alert(1)</script>"
STUDY = "norms" + XSS
STEPS = 60
FINALS = {  # (norm.name, placement) -> final val loss of seeds 0, 1, 2
    ("layernorm", "pre"): [3.00, 3.10, 3.20],
    ("rmsnorm", "pre"): [2.90, 2.95, 3.05],
    ("layernorm", "post"): [3.30, 3.35, 3.50],
    ("rmsnorm", "post"): [3.20, 3.40, 3.45],
}
TPS = {"layernorm": 5000.0, "rmsnorm": 5500.0}
# the fourth seed of each cell is broken: how, and the final val loss it claims (never to be averaged)
BROKEN = {
    ("layernorm", "pre"): "no_summary",
    ("rmsnorm", "pre"): "running",
    ("layernorm", "post"): "corrupt_summary",
    ("rmsnorm", "post"): "diverged",
}


def make_config(name: str, placement: str, seed: int) -> dict:
    return {
        "model": {
            "name": "tiny",
            "d_model": 64,
            "n_layers": 2,
            "n_heads": 4,
            "head_dim": None,
            "context": 64,
        },
        "norm": {
            "name": name,
            "placement": placement,
            "eps": 1e-5,
            "bias": name == "layernorm",
            "final_norm": None,
        },
        "position": {"name": "rope", "theta": 10000.0},
        "activation": {"name": "gelu", "d_ff": None, "multiple_of": 8, "bias": False},
        "attention": {"name": "mha", "n_kv_heads": None, "bias": False},
        "regularization": {
            "name": "standard",
            "dropout": 0.0,
            "weight_decay": 0.1,
            "grad_clip": 1.0,
            "z_loss": 0.0,
        },
        "data": {
            "name": "shakespeare",
            "tokenizer": "byte",
            "val_works": ["hamlet"],
            "cache_dir": f"/c/{seed}",
        },
        "optim": {"name": "adamw", "lr": 3e-3, "warmup_steps": 10, "schedule": "cosine", "min_lr_ratio": 0.1},
        "tracking": {"name": "none", "project": "lm-ablate", "tags": [f"s{seed}"]},
        "train": {
            "max_steps": STEPS,
            "batch_size": 8,
            "eval_every": 20,
            "device": "cpu",
            "progress": False,
            "spike": {"window": 10, "k": 6.0},
        },
        "seed": seed,
        "study": STUDY,
        "choices": {"norm": name, "placement": placement, "model": "tiny"},
    }


def make_metrics(final_val: float, seed: int, tps: float, diverge_at: int | None = None) -> list[dict]:
    rows = []
    for step in range(STEPS):
        loss = final_val + 2.0 * math.exp(-step / 15) + 0.01 * seed
        grad = 1.0 + 0.1 * math.sin(step + seed)
        spike = int(step == 40 and seed == 1)
        row = {
            M.STEP: step, M.TRAIN_LOSS: loss, M.GRAD_NORM: grad * (8 if spike else 1), M.LR: 3e-3,
            M.TOKENS: (step + 1) * 512, M.TOKENS_PER_SEC: tps, M.STEP_TIME_MS: 512 / tps * 1000,
            M.SPIKE_GRAD_NORM: float(spike), M.SPIKE_GRAD_NORM_COUNT: int(step >= 40 and seed == 1),
            M.SPIKE_LOSS: 0.0, M.SPIKE_LOSS_COUNT: 0,
        }  # fmt: skip
        if diverge_at is not None and step >= diverge_at:
            row[M.TRAIN_LOSS] = math.nan
            row[M.GRAD_NORM] = math.inf
            rows.append(row)
            break
        if step % 20 == 0 or step == STEPS - 1:
            row[M.VAL_LOSS] = final_val + 2.0 * math.exp(-step / 15)
        rows.append(row)
    return rows


def make_summary(run_name: str, name: str, placement: str, seed: int, final_val: float, status: str) -> dict:
    return {
        M.STATUS: status, M.RUN_NAME: run_name, M.GROUP: STUDY, M.CHOICES: {"norm": name}, M.SEED: seed,
        M.FINAL_VAL_LOSS: final_val, M.BEST_VAL_LOSS: final_val - 0.01, M.FINAL_TRAIN_LOSS: final_val - 0.1,
        M.GRAD_NORM_SPIKES: seed, M.LOSS_SPIKES: 0, M.MEAN_TOKENS_PER_SEC: TPS[name] + 10 * seed,
        M.PARAMS_TOTAL: 100_000 if name == "layernorm" else 99_000, M.PARAMS_NON_EMBEDDING: 80_000,
        M.STEPS: STEPS, M.TOTAL_TOKENS: STEPS * 512, M.WALL_TIME_S: 12.0, M.DIVERGED_AT: None, M.ERROR: None,
    }  # fmt: skip


def write_run(run_dir: Path, config: dict | None, rows: list[dict], summary: dict | str | None, tail: str = "") -> None:
    """Write a run record exactly as the loop does: YAML config, JSON lines (NaN/Infinity), JSON summary."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("hydra_junk: ${hydra:runtime.cwd}\n")
    if config is not None:
        (run_dir / M.CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    (run_dir / M.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    if isinstance(summary, dict):
        (run_dir / M.SUMMARY_FILE).write_text(json.dumps(summary))
    elif isinstance(summary, str):
        (run_dir / M.SUMMARY_FILE).write_text(summary)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Hydra-multirun-shaped root: numbered run dirs plus multirun.yaml. Returns the root."""
    root = tmp_path_factory.mktemp("sweep") / "multirun"
    root.mkdir()
    (root / "multirun.yaml").write_text("hydra: {mode: MULTIRUN}\n")
    job = 0
    for (name, placement), finals in FINALS.items():
        for seed in range(4):
            run_dir = root / str(job)
            job += 1
            cfg = make_config(name, placement, seed)
            run_name = f"{name}-{placement}-s{seed}"
            if seed < 3:
                tps = TPS[name] + 10 * seed
                tail = '{"step": 60, "train/lo' if (name, placement, seed) == ("layernorm", "pre", 0) else ""
                summary = make_summary(run_name, name, placement, seed, finals[seed], M.STATUS_COMPLETED)
                write_run(run_dir, cfg, make_metrics(finals[seed], seed, tps), summary, tail)
                continue
            kind = BROKEN[(name, placement)]
            rows = make_metrics(1.0, seed, TPS[name], diverge_at=30 if kind == "diverged" else None)
            if kind == "no_summary":
                write_run(run_dir, cfg, rows[:25], None)
            elif kind == "corrupt_summary":
                write_run(run_dir, cfg, rows, '{"status": "compl')
            elif kind == "running":
                write_run(run_dir, cfg, rows[:45], make_summary(run_name, name, placement, seed, 1.0, "running"))
            else:
                summary = make_summary(run_name + XSS, name, placement, seed, 9.0, M.STATUS_DIVERGED)
                summary.update({M.DIVERGED_AT: 30, M.ERROR: "non-finite loss " + XSS})
                write_run(run_dir, cfg, rows, summary)
    # a completed run whose config is garbage: kept as corrupt, left out of comparisons
    write_run(
        root / "broken",
        None,
        make_metrics(3.0, 0, 5000.0),
        make_summary("b", "rmsnorm", "pre", 0, 3.0, "completed"),
    )
    (root / "broken" / M.CONFIG_FILE).write_text("norm: [unclosed\n  : :\n")
    return root


N_RUNS = 17


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory) -> Path:
    return build_report([sweep], tmp_path_factory.mktemp("report"))


# --- stats ----------------------------------------------------------------------------------------------
def test_mean_ci_matches_t_interval_and_edge_cases():
    x = [3.0, 3.1, 3.25]
    mean, low, high, n = mean_ci(x)
    assert n == 3 and np.allclose((mean, low, high), expected_ci(x))
    assert np.allclose((low, high), st.t.interval(0.95, 2, loc=np.mean(x), scale=st.sem(x)))
    m1 = mean_ci([2.0])
    assert m1[0] == 2.0 and math.isnan(m1[1]) and math.isnan(m1[2]) and m1[3] == 1
    assert all(math.isnan(v) for v in mean_ci([])[:3]) and mean_ci([])[3] == 0
    assert mean_ci([1.0, float("nan"), 3.0])[3] == 2


def test_welch_matches_formula():
    a, b = [2.9, 2.95, 3.05, 3.0], [3.0, 3.1, 3.2]
    assert np.allclose(welch(a, b), expected_welch(a, b))
    d, low, _, p = welch([1.0], [2.0, 3.0])
    assert d == -1.5 and math.isnan(low) and math.isnan(p)
    assert welch([1.0, 1.0], [1.0, 1.0]) == (0.0, 0.0, 0.0, 1.0)


# --- loading --------------------------------------------------------------------------------------------
def test_load_statuses_and_problems(sweep):
    rs = load_runs([sweep])
    assert len(rs.runs) == N_RUNS and rs.runs["run_id"].is_unique
    status = dict(zip(rs.runs["run_id"], rs.runs[M.STATUS]))
    assert sorted(status.values()).count(M.STATUS_COMPLETED) == 12
    assert status["3"] == "incomplete"  # layernorm/pre seed 3: no summary.json
    assert status["7"] == M.STATUS_RUNNING
    assert status["11"] == "corrupt"  # corrupt summary.json
    assert status["15"] == M.STATUS_DIVERGED
    assert status["broken"] == "corrupt"  # unreadable config.yaml
    assert "broken" not in rs.configs
    problems = "\n".join(rs.problems)
    assert "0: metrics.jsonl: skipped its last line (truncated write)" in rs.problems  # not also "unreadable"
    assert re.search(r"\b3: no summary\.json", problems)
    assert re.search(r"\b11: summary\.json is unreadable", problems)
    assert re.search(r"broken: config\.yaml is unreadable", problems)
    # the incomplete run gets its values from metrics: last val loss logged (step 20 of 25 rows)
    inc = rs.runs.set_index("run_id").loc["3"]
    assert inc[M.FINAL_VAL_LOSS] == pytest.approx(1.0 + 2.0 * math.exp(-20 / 15))
    assert inc[M.STEPS] == 24
    # the truncated line is skipped; history is by step
    hist = rs.history["0"]
    assert list(hist.index) == list(range(STEPS)) and hist[M.VAL_LOSS].notna().sum() == 4
    # the config is flattened to dotted keys, seed from config
    row = rs.runs.set_index("run_id").loc["5"]
    assert row["norm.name"] == "rmsnorm" and row["norm.placement"] == "pre" and row["seed"] == 1
    assert row["optim.lr"] == pytest.approx(3e-3) and row["train.spike.window"] == 10


def test_metrics_duplicates_keep_last_and_nan(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    lines = [{"step": 2, "train/loss": 1.0}, {"step": 1, "train/loss": 5.0}, {"step": 2, "train/loss": 7.0},
             {"step": 3, "train/loss": float("nan")}]  # fmt: skip
    (run / M.METRICS_FILE).write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n[1]\n")
    rs = load_runs([run])
    hist = rs.history["r"]
    assert list(hist.index) == [1, 2, 3] and hist.loc[2, M.TRAIN_LOSS] == 7.0 and math.isnan(hist.loc[3, M.TRAIN_LOSS])
    assert rs.runs[M.STATUS].tolist() == ["incomplete"] and rs.runs[M.DIVERGED_AT].tolist() == [3]
    assert "r: metrics.jsonl: skipped 2 unreadable lines: 5, 6" in rs.problems


def test_a_run_has_one_status_in_problems_and_runs(tmp_path):
    """Issue 21.12: a run without summary.json whose config.yaml is unreadable was "incomplete" in the Problems
    list and "corrupt" in the runs table. The line that decides the status states it, once."""
    for name, config in (("garbled", "norm: [unclosed\n  : :\n"), ("killed", "norm: {name: rmsnorm}\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / M.CONFIG_FILE).write_text(config)
        (tmp_path / name / M.METRICS_FILE).write_text(json.dumps({"step": 1, "train/loss": 5.0}) + "\n")
    rs = load_runs([tmp_path])
    status = dict(zip(rs.runs["run_id"], rs.runs[M.STATUS]))
    assert status == {"garbled": "corrupt", "killed": "incomplete"}
    for run_id, run_status in status.items():
        lines = [p for p in rs.problems if p.startswith(f"{run_id}: ")]
        said = [s for p in lines for s in re.findall(r"status (\w+)", p)]
        assert said == [run_status], lines
    assert "garbled: config.yaml is unreadable; status corrupt; run left out of comparisons" in rs.problems


def test_no_runs_is_one_line_error(tmp_path):
    (tmp_path / "empty" / ".hydra").mkdir(parents=True)
    with pytest.raises(AnalysisError) as err:
        load_runs([tmp_path / "empty"])
    assert str(err.value).startswith("no runs found under:") and "\n" not in str(err.value)


# --- comparisons ----------------------------------------------------------------------------------------
def test_axes_found_and_collapsed(sweep):
    cs = compare_runs(load_runs([sweep]))
    assert [c.axis.name for c in cs.comparisons] == ["norm.name", "norm.placement"]
    assert set(cs.comparisons[0].axis.keys) == {"norm.name", "norm.bias"}
    assert "seed" in cs.ignored and "data.cache_dir" in cs.ignored
    assert cs.fixed["optim.lr"] == pytest.approx(3e-3) and "choices.norm" not in {a.name for a in cs.varied}
    assert cs.left_out == ["broken"]


def test_table_numbers(sweep):
    cs = compare_runs(load_runs([sweep]))
    t = cs.comparisons[0].table.set_index(["context", "arm"])
    assert cs.comparisons[0].baseline == "layernorm"
    for (name, placement), finals in FINALS.items():
        row = t.loc[(f"norm.placement={placement}", name)]
        assert (row["n_runs"], row["n_completed"]) == (4, 3)
        mean, low, high = expected_ci(finals)
        assert row[f"{M.FINAL_VAL_LOSS}_mean"] == pytest.approx(mean)
        assert row[f"{M.FINAL_VAL_LOSS}_ci_low"] == pytest.approx(low)
        assert row[f"{M.FINAL_VAL_LOSS}_ci_high"] == pytest.approx(high)
        assert row[f"{M.GRAD_NORM_SPIKES}_mean"] == pytest.approx(1.0)
        assert row[f"{M.MEAN_TOKENS_PER_SEC}_mean"] == pytest.approx(TPS[name] + 10)
        if name == "rmsnorm":  # both arms completed seeds 0-2: the paired t-test by seed is used
            d, lo, hi, p = expected_paired(finals, FINALS[("layernorm", placement)])
            got = [row[k] for k in ("delta_final_val_loss", "delta_ci_low", "delta_ci_high", "p_value")]
            assert got == pytest.approx([d, lo, hi, p])
            assert (row["test"], row["n_pairs"]) == ("paired", 3)
            assert row["tokens_per_sec_ratio"] == pytest.approx((TPS["rmsnorm"] + 10) / (TPS["layernorm"] + 10))
        else:
            assert row["is_baseline"] and math.isnan(row["delta_final_val_loss"])
    diverged = t.loc[("norm.placement=post", "rmsnorm")]
    assert diverged["n_diverged"] == 1 and diverged["diverged_runs"] == "15"
    assert t.loc[("norm.placement=pre", "layernorm"), "n_other"] == 1  # the incomplete run
    placement = cs.comparisons[1].table.set_index(["context", "arm"])
    assert placement.loc[("norm.name=rmsnorm", "post"), f"{M.FINAL_VAL_LOSS}_mean"] == pytest.approx(
        np.mean(FINALS[("rmsnorm", "post")])
    )


def test_by_and_baseline(sweep):
    rs = load_runs([sweep])
    cs = compare_runs(rs, by=["norm.bias"], baseline="norm.name=rmsnorm")
    (comp,) = cs.comparisons
    assert comp.axis.name == "norm.bias" and comp.baseline == "false"
    row = comp.table.set_index(["context", "arm"]).loc[("norm.placement=pre", "true")]
    d = expected_welch(FINALS[("layernorm", "pre")], FINALS[("rmsnorm", "pre")])[0]
    assert row["delta_final_val_loss"] == pytest.approx(d)
    with pytest.raises(AnalysisError, match=r"--by nope: unknown config key; keys that vary: norm\.name"):
        compare_runs(rs, by=["nope"])
    with pytest.raises(AnalysisError, match="does not vary"):
        compare_runs(rs, by=["optim.lr"])
    with pytest.raises(AnalysisError, match="values of norm.name: layernorm, rmsnorm"):
        compare_runs(rs, baseline="norm.name=batchnorm")


# --- report ---------------------------------------------------------------------------------------------
def test_report_files(report):
    out = report.parent
    assert report.name == "report.html" and report.is_absolute()
    for name in ("report.md", "runs.csv", "comparisons.csv"):
        assert (out / name).is_file()
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == N_RUNS and runs["run_id"].astype(str).is_unique
    comparisons = pd.read_csv(out / "comparisons.csv")
    assert set(comparisons["axis"]) == {"norm.name", "norm.placement"} and len(comparisons) == 8
    md = (out / "report.md").read_text()
    pngs = re.findall(r"\]\(([^)]+\.png)\)", md)
    assert len(pngs) == 6 and all((out / p).is_file() for p in pngs)
    assert (out / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert XSS not in md


def test_report_html_self_contained_and_escaped(report):
    text = report.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", text, re.IGNORECASE)
    assert "<link" not in text and "<script" not in text.lower()
    assert text.count('src="data:image/png;base64,') == 6
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    for section in ("Summary", "Diverged and failed runs", "Problems", "How to read this"):
        assert f"<h2>{section}</h2>" in text
    failed = text.split("<h2>Diverged and failed runs</h2>")[1].split("<h2>")[0]
    for run_id, status in (("15", "diverged"), ("3", "incomplete"), ("7", "running"), ("11", "corrupt")):
        assert f"<td>{run_id}</td>" in failed and f"<td>{status}</td>" in failed
    assert "norm.name=rmsnorm, norm.placement=post" in failed and "non-finite loss" in failed


def test_cli(sweep, tmp_path):
    out = tmp_path / "cli"
    done = subprocess.run(
        [sys.executable, "-m", "analysis.report", str(sweep), "--out", str(out), "--by", "norm.placement",
         "--title", "T"], check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str((out / "report.html").resolve())
    (tmp_path / "empty").mkdir()
    # issue 21.12: every command says "lm-ablate: error:", and a missing path is not an empty one
    for args, said in (
        ([str(tmp_path / "nothing"), "--out", str(out)], f"{tmp_path / 'nothing'}: no such directory; give run "),
        ([str(tmp_path / "empty"), "--out", str(out)], f"no runs found under: {tmp_path / 'empty'}"),
        ([str(sweep)], "the following arguments are required: --out (see python -m analysis.report --help)"),
    ):
        bad = subprocess.run([sys.executable, "-m", "analysis.report", *args], check=False, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert bad.returncode == 2 and bad.stderr.startswith("lm-ablate: error: " + said), bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and not bad.stdout


def test_run_killed_before_start_uses_hydra_config(tmp_path):
    """Only Hydra's .hydra/config.yaml exists: still a run (incomplete), placed by that config."""
    for i, name in enumerate(("layernorm", "rmsnorm")):
        cfg = make_config(name, "pre", 0)
        write_run(
            tmp_path / str(i),
            cfg,
            make_metrics(3.0, 0, 5000.0),
            make_summary("r", name, "pre", 0, 3.0, "completed"),
        )
    killed = tmp_path / "2" / ".hydra"
    killed.mkdir(parents=True)
    hydra_cfg = {k: v for k, v in make_config("rmsnorm", "pre", 1).items() if k != "choices"}
    (killed / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(hydra_cfg)))
    rs = load_runs([tmp_path])
    assert rs.runs.set_index("run_id").loc["2", M.STATUS] == "incomplete"
    (comp,) = compare_runs(rs).comparisons
    row = comp.table.set_index("arm").loc["rmsnorm"]
    assert (row["n_runs"], row["n_completed"], row["n_other"]) == (2, 1, 1)


def test_many_contexts_wrap_onto_several_figures(tmp_path):
    from analysis.present.figures.curves import MAX_PANELS, loss_figures

    for i in range(2 * 7):
        name, width = ("layernorm", "rmsnorm")[i % 2], 32 * (1 + i // 2)
        cfg = make_config(name, "pre", 0)
        cfg["model"]["d_model"] = width
        write_run(
            tmp_path / str(i),
            cfg,
            make_metrics(3.0, 0, 5000.0),
            make_summary("r", name, "pre", 0, 3.0, "completed"),
        )
    cs = compare_runs(load_runs([tmp_path]), by=["norm.name"])
    figs = loss_figures(load_runs([tmp_path]), cs.comparisons[0])
    assert len(cs.comparisons[0].contexts) == 7 > MAX_PANELS and len(figs) == 2
    assert figs[0].title.endswith("(1/2)") and figs[0].name != figs[1].name


def test_ema_is_debiased_and_skips_nonfinite():
    from analysis.present.figures.curves import ema

    beta, m, want = 0.9, 0.0, []
    for i, x in enumerate([1.0, 2.0, 4.0, 8.0]):
        m = beta * m + (1 - beta) * x
        want.append(m / (1 - beta ** (i + 1)))
    got = ema(pd.Series([1.0, 2.0, math.nan, 4.0, math.inf, 8.0]), beta)
    assert list(got.index) == [0, 1, 3, 5] and np.allclose(got, want)
