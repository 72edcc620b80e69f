"""scripts/gallery.py: the command each study runs with, the time record it keeps, and the claims table rows."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import statistics
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def gallery(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gallery_script", ROOT / "scripts" / "gallery.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RUNS", tmp_path / "runs")
    return module


def test_run_passes_threads_and_records_time_threads_and_load(gallery, monkeypatch):
    calls = []
    exits = iter([0, 3])
    monkeypatch.setattr(gallery.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or next(exits))
    assert gallery.run(["norm_2x2", "position"], threads=1) == 3
    assert [c[3] for c in calls] == ["norm_2x2", "position"]
    assert all(c[-1] == "train.threads=1" for c in calls)
    assert calls[0][4:8] == ["--out", str(gallery.RUNS / "norm_2x2"), "--launcher", "basic"]
    recorded = gallery.times()
    assert recorded["norm_2x2"]["rc"] == "0" and recorded["position"]["rc"] == "3"
    assert recorded["position"]["threads"] == "1"
    assert len(recorded["position"]["load"].split()) == 3  # the three load averages, spaces kept
    assert len(recorded["position"]["load_start"].split(",")) == 3  # and when the study started

    calls.clear()
    monkeypatch.setattr(gallery.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    gallery.run(["position"])  # without --threads: the study's own thread count, and the last line wins
    assert not any(a.startswith("train.threads") for a in calls[0])
    assert gallery.times()["position"] == {**gallery.times()["position"], "rc": "0", "threads": "default"}
    calls.clear()
    gallery.run(["position"], launcher="joblib")  # two runs side by side: said in the threads column
    assert calls[0][6:8] == ["--launcher", "joblib"] and gallery.times()["position"]["threads"].endswith("x2")


def test_a_study_continued_adds_its_parts_times(gallery, monkeypatch):
    """A study whose folder already holds runs (resumed, or extended with more jobs) is marked continued=1, and
    its wall time is the sum of its parts, with the first part's load at start."""
    monkeypatch.setattr(gallery.subprocess, "call", lambda cmd, **kw: 0)
    gallery.RUNS.mkdir(parents=True)
    (gallery.RUNS / "times.txt").write_text("position rc=0 seconds=600 threads=1 load_start=1,1,1 load=2 2 2\n")
    monkeypatch.setattr(gallery, "has_runs", lambda study: True)
    gallery.run(["position"], threads=1)
    assert "continued=1" in (gallery.RUNS / "times.txt").read_text().splitlines()[-1]
    t = gallery.times()["position"]
    assert t["parts"] == "2" and t["load_start"] == "1,1,1" and 600 <= float(t["seconds"]) < 610
    monkeypatch.setattr(gallery, "has_runs", lambda study: False)
    gallery.run(["position"], threads=1)  # a fresh folder: its own time again
    assert "parts" not in gallery.times()["position"] and float(gallery.times()["position"]["seconds"]) < 10


def test_times_reads_lines_written_before_threads_were_recorded(gallery):
    gallery.RUNS.mkdir(parents=True)
    (gallery.RUNS / "times.txt").write_text("norm_2x2 rc=0 seconds=263 load=2.99 3.07 2.85\n")
    assert gallery.times() == {"norm_2x2": {"rc": "0", "seconds": "263", "load": "2.99 3.07 2.85"}}


def _claim(**kw):
    row = dict(claim_id="c", claim_verdict="held", verdict="held", statement="a | b", metric="final_val_loss",
               expect="lower", source="Paper 2020", context="", estimate=-0.05, low95=-0.08, high95=-0.02,
               null=0, notes="", why="")  # fmt: skip
    return {**row, **kw}


def test_claim_rows_show_the_effect_interval_and_each_context(gallery):
    one = gallery.claim_rows("s", pd.DataFrame([_claim()]))
    assert one == [
        "| [s](s/report.md) | **held** | a / b (final_val_loss, expect lower) | Paper 2020 | -0.0500 [-0.0800, "
        "-0.0200] | earlier rule: one LR for both sides, stalls not checked | `python -m lm_ablate.study s` |"
    ]
    ratio = gallery.claim_rows("s", pd.DataFrame([_claim(null=1, estimate=1.418, low95=1.25, high95=1.685,
                                                        notes="beyond_validated_range")]))  # fmt: skip
    assert "1.42x [1.25x, 1.69x] (beyond validated range)" in ratio[0]
    unbounded = gallery.claim_rows("s", pd.DataFrame([_claim(null=1, estimate=1.647, low95=0.676, high95=math.inf)]))
    assert "| 1.65x [0.676x, ∞] |" in unbounded[0]  # as the Scaling table shows it (issue 21.4)
    missing = gallery.claim_rows("s", pd.DataFrame([_claim(estimate=math.nan, why="no runs")]))
    assert "| – (no runs) |" in missing[0]
    two = gallery.claim_rows(
        "s",
        pd.DataFrame([_claim(context="lr=0.01", claim_verdict="mixed"),
                      _claim(context="lr=0.003", verdict="contradicted", estimate=0.1, low95=0.05, high95=0.2,
                             claim_verdict="mixed")]),
    )  # fmt: skip
    assert len(two) == 1 and "**mixed**" in two[0]
    assert "lr=0.01: held, -0.0500 [-0.0800, -0.0200]<br>lr=0.003: contradicted, +0.1000 [+0.0500, +0.2000]" in two[0]


def test_shrink_figures_brings_a_folder_under_the_limit_and_leaves_small_folders_alone(gallery, tmp_path, monkeypatch):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = tmp_path / "figs"
    folder.mkdir()
    names = ["fig01_a.png", "fig02_b.png", "fig03_c.png", "lr_optim.lr_lr-sweep_1.png"]
    for name in names:  # noisy RGB: large as PNG, like a dense line plot
        Image.fromarray(rng.integers(0, 255, (200, 300, 3), dtype=np.uint8)).save(folder / name)
    size = sum(p.stat().st_size for p in folder.glob("*.png"))
    monkeypatch.setattr(gallery, "FOLDER_LIMIT", size)
    before = {p: p.read_bytes() for p in folder.glob("*.png")}
    gallery.shrink_figures(folder)
    assert {p: p.read_bytes() for p in folder.glob("*.png")} == before  # at the limit: untouched

    monkeypatch.setattr(gallery, "FOLDER_LIMIT", size // 4)
    gallery.shrink_figures(folder)
    assert sum(p.stat().st_size for p in folder.glob("*.png")) <= size // 4
    widths = {}
    for p in folder.glob("*.png"):
        with Image.open(p) as im:
            assert im.mode == "P"  # a palette image
            widths[p.name] = im.width
    assert widths["lr_optim.lr_lr-sweep_1.png"] == 300  # a summary figure keeps its pixel size
    assert all(165 <= widths[n] < 300 for n in names[:3])  # the per-axis panels shrink, to 55% at most


@pytest.fixture
def committed(gallery, tmp_path, monkeypatch):
    """results/ as committed (README.md and every claims.csv) in a scratch folder, and no runs at all."""
    import shutil

    results = tmp_path / "results"
    for path in [ROOT / "results" / "README.md", *(ROOT / "results").glob("*/claims.csv")]:
        (results / path.relative_to(ROOT / "results")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, results / path.relative_to(ROOT / "results"))
    monkeypatch.setattr(gallery, "RESULTS", results)
    return results


def test_build_without_runs_refuses_and_leaves_the_committed_results(gallery, committed, capsys):
    """Issue 21.5: in a fresh clone ``build`` replaced results/README.md by an empty table (exit 0)."""
    before = {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()}
    assert gallery.build(gallery.STUDIES) == 2
    err = capsys.readouterr().err
    assert err.startswith("lm-ablate: error: no runs under ") and err.count("\n") == 1
    assert {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()} == before


def test_build_of_one_study_keeps_every_other_studys_rows(gallery, committed, monkeypatch, capsys):
    monkeypatch.setattr(gallery, "has_runs", lambda study: study == "norm_2x2")
    monkeypatch.setattr(gallery, "build_study", lambda study: committed / study)
    assert gallery.build(["norm_2x2"]) == 0  # the README in this code's format, nothing changed
    assert not (committed / "verdict_changes.csv").exists()
    readme = (committed / "README.md").read_text()
    claims = pd.read_csv(committed / "norm_2x2" / "claims.csv")

    def rebuilt(study):  # what a rebuild from runs would leave: here one verdict changed
        assert study == "norm_2x2"
        changed = claims.copy()
        changed.loc[changed["claim_id"] == "rmsnorm_faster", ["verdict", "claim_verdict"]] = "held"
        changed.to_csv(committed / study / "claims.csv", index=False)
        return committed / study

    monkeypatch.setattr(gallery, "build_study", rebuilt)
    assert gallery.build(["norm_2x2"]) == 0
    after = (committed / "README.md").read_text()

    def claims_table(text):  # from the count line to the wall-time section
        start = re.search(r"^\*\*\d+ claims\*\*", text, re.M).start()
        return text[start : text.index("## Wall time")].splitlines()

    def counts(line):
        return {v: int(n) for v, n in re.findall(r"(\w+): (\d+)", line)}

    tables = [claims_table(text) for text in (readme, after)]
    changed = [(a, b) for a, b in zip(*tables) if a != b]
    assert len(tables[0]) == len(tables[1]) and len(changed) == 2
    old = claims.loc[claims["claim_id"] == "rmsnorm_faster", "claim_verdict"].iloc[0]
    want = counts(changed[0][0])
    want[old] -= 1
    want["held"] = want.get("held", 0) + 1
    assert counts(changed[0][1]) == {v: n for v, n in want.items() if n}
    assert "RMSNorm trains faster" in changed[1][1] and "| **held** |" in changed[1][1]
    times = after.split("## Wall time")[1].split("## Verdicts changed")[0]
    assert "| norm_2x2 | " in times  # its time row kept: no new time was recorded
    header = next(line for line in times.splitlines() if line.startswith("| study |"))
    assert all(row.count("|") == header.count("|") for row in times.splitlines() if row.startswith("| "))
    # the change is logged (results/verdict_changes.csv) and listed after the tables, with the effect now
    log = pd.read_csv(committed / "verdict_changes.csv")
    assert log[["study", "claim_id", "before", "after"]].values.tolist() == [
        ["norm_2x2", "rmsnorm_faster", old, "held"]
    ]
    assert (
        f"| [norm_2x2](norm_2x2/report.md) | rmsnorm_faster | {old} | **held** |"
        in after.split("## Verdicts changed")[1]
    )
    # a rebuild that changes nothing logs nothing more
    monkeypatch.setattr(gallery, "build_study", lambda study: committed / study)
    assert gallery.build(["norm_2x2"]) == 0
    assert len(pd.read_csv(committed / "verdict_changes.csv")) == 1


def test_decided_column_says_which_rule_decided_the_claim(gallery):
    """A claims.csv from before the fair-verdict rule has no stall columns; after it, arm_lr says whether the LR
    was chosen per side."""
    old = pd.DataFrame({"claim_id": ["a"], "claim_verdict": ["held"]})
    assert gallery.decided_text(old).startswith("earlier rule")
    tuned = old.assign(arm_stalled=[0], arm_lr=[6e-3])
    assert gallery.decided_text(tuned) == "each side at its best LR; stalls checked"
    assert gallery.decided_text(tuned.assign(arm_lr=[math.nan])) == "one setting; stalls checked"


def test_a_ladder_claim_decided_per_cell_says_so_and_keeps_the_note_out_of_the_effect(gallery):
    """Issue 26.5: a compute multiplier fitted at each (arm, rung, budget)'s best LR is decided "per cell"."""
    row = {"claim_id": "m", "claim_verdict": "held", "arm_stalled": 0, "arm_lr": math.nan, "null": 1,
           "estimate": 1.4, "low95": 1.2, "high95": 1.7, "why": "",
           "notes": "beyond_validated_range each_cell_at_its_best_lr"}  # fmt: skip
    claims = pd.DataFrame([row])
    assert gallery.decided_text(claims) == "each (arm, rung, budget) at its best LR; stalls checked"
    assert gallery.effect_text(claims.iloc[0]) == "1.4x [1.2x, 1.7x] (beyond validated range)"


def test_forms_lines_put_every_fit_form_side_by_side(gallery, tmp_path, monkeypatch):
    """Issue 26.7: the README's ladder section, one row per (study, form, arm against the baseline)."""
    monkeypatch.setattr(gallery, "RESULTS", tmp_path)
    (tmp_path / "ladder_x").mkdir()
    base = {"n_params": 4, "skipped": "", "score": 0.012, "cm_largest": math.nan}
    rows = [
        {**base, "form": "per_arm", "chosen": False, "arm": "activation.name=gelu", "is_baseline": True, "fit_E": 0.0},
        {**base, "form": "per_arm", "chosen": False, "arm": "activation.name=swiglu", "is_baseline": False,
         "fit_E": 0.1, "cm_largest": 1.3, "cm_largest_low": 1.1, "cm_largest_high": 1.6, "cm_10x": 1.5,
         "cm_10x_low": 0.9, "cm_10x_high": math.inf, "cm_10x_beyond_validated": True},
        {**base, "form": "shared_e", "chosen": True, "arm": "activation.name=gelu", "is_baseline": True, "fit_E": 1.2},
        {**base, "form": "shared_e", "chosen": True, "arm": "activation.name=swiglu", "is_baseline": False,
         "fit_E": 1.2, "cm_largest": 1.4, "cm_largest_low": 1.2, "cm_largest_high": 1.7},
        {**base, "form": "nd_per_arm", "chosen": False, "arm": "activation.name=gelu", "is_baseline": True,
         "skipped": "one budget per rung"},
        {**base, "form": "nd_per_arm", "chosen": False, "arm": "activation.name=swiglu", "is_baseline": False,
         "skipped": "one budget per rung"},
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "ladder_x" / "scaling_forms.csv", index=False)
    lines = gallery.forms_lines(["norm_2x2", "ladder_x"])
    table = [line for line in lines if line.startswith("| [ladder_x]")]
    assert table == [
        "| [ladder_x](ladder_x/report.md) | per_arm | 4 | 1.2% | swiglu vs gelu: 1.3x [1.1x, 1.6x] | "
        "1.5x [0.9x, ∞] ⚠ | E: gelu 0, swiglu 0.1 |",
        "| [ladder_x](ladder_x/report.md) | **shared_e** (chosen) | 4 | 1.2% | swiglu vs gelu: 1.4x [1.2x, 1.7x] | – | "
        "E: gelu 1.2, swiglu 1.2 |",
        "| [ladder_x](ladder_x/report.md) | nd_per_arm | – | – | – | – | not fitted: one budget per rung |",
    ]
    assert gallery.forms_lines(["norm_2x2"]) == []
    # a fit window (ladder.fit_budgets): the declared fits' rows first, then the chosen form on every budget, named
    window = [{**r, "fit_budgets": "0.25 0.5 1"} for r in rows]
    check = [{**r, "fit_budgets": "0.125 0.25 0.5 1", "chosen": False, "score": 0.035} for r in rows[2:4]]
    pd.DataFrame(window + check).to_csv(tmp_path / "ladder_x" / "scaling_forms.csv", index=False)
    table = [line for line in gallery.forms_lines(["ladder_x"]) if line.startswith("| [ladder_x]")]
    assert len(table) == 4 and table[1].startswith("| [ladder_x](ladder_x/report.md) | **shared_e** (chosen) | 4 |")
    assert table[3] == ("| [ladder_x](ladder_x/report.md) | shared_e on budgets 0.125, 0.25, 0.5, 1 (window check) | "
                        "4 | 3.5% | swiglu vs gelu: 1.4x [1.2x, 1.7x] | – | E: gelu 1.2, swiglu 1.2 |")  # fmt: skip


@pytest.mark.parametrize("study", sorted(p.name for p in (ROOT / "results").iterdir() if (p / "report.md").is_file()))
def test_each_committed_figure_is_one_its_report_shows(study):
    """results/<study> holds exactly the figures its report.md shows: a figure left from an earlier build (a study
    whose axes or pages changed) would sit beside the report without being its data."""
    folder = ROOT / "results" / study
    shown = set(re.findall(r"\]\(([^)\s]+\.png)\)", (folder / "report.md").read_text()))
    assert {p.name for p in folder.glob("*.png")} == shown


# --- runs.csv and the check that reruns a committed run (issue 46.10) ------------------------------------------
HERE = {"torch_version": "2.13.0+cpu", "cpu_capability": "AVX2", "cpu_model": "AMD EPYC", "threads": 1, "device": "cpu",
        "cuda_version": None, "cudnn_version": None, "gpu_name": None}  # fmt: skip


def _record(folder: Path, summary: dict, config: dict, overrides: list[str] | None) -> None:
    """A run folder as the loop leaves it (no metrics.jsonl: the analysis then reads the recorded stall flag)."""
    import yaml

    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    if overrides is not None:
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))


def test_runs_csv_has_each_runs_values_and_provenance_and_leaves_unrecorded_fields_empty(gallery, tmp_path):
    base = {"status": "completed", "steps": 100, "stalled": False, "unigram_loss": 3.31}
    config = {"seed": 0, "norm": {"name": "rmsnorm"}, "train": {"threads": None, "device": "auto"}}
    runs = tmp_path / "study"
    _record(runs / "0", {**base, "run_name": "norm=rmsnorm,seed=0", "seed": 0, "final_val_loss": 2.7276120185852051,
                         "final_val_bpb": 3.9, "downstream/order/acc": 0.66, **HERE},
            config, ["norm=rmsnorm", "seed=0", "tracking=none", "train.threads=1", "train.progress=false"])  # fmt: skip
    # recorded before provenance: nothing of it known, except what its config fixed
    _record(runs / "1", {**base, "run_name": "norm=rmsnorm,seed=1", "seed": 1, "final_val_loss": 2.8},
            {**config, "seed": 1}, ["norm=rmsnorm", "seed=1"])  # fmt: skip
    _record(runs / "2", {**base, "run_name": "norm=rmsnorm,seed=2", "seed": 2, "final_val_loss": 3.30, "stalled": True},
            {**config, "seed": 2, "train": {"threads": 1, "device": "cpu"}}, ["norm=rmsnorm", "seed=2"])  # fmt: skip
    # a ladder's decay branch: trained inside its parent's process, so no command of its own
    _record(runs / "0~budget0.5", {**base, "run_name": "norm=rmsnorm,seed=0,ladder.budget=0.5", "seed": 0,
                                   "final_val_loss": 2.9, **HERE}, config, None)  # fmt: skip
    gallery.RESULTS = tmp_path / "results"
    (gallery.RESULTS / "study").mkdir(parents=True)
    gallery.runs_table([runs]).to_csv(gallery.RESULTS / "study" / "runs.csv", index=False)
    table = gallery.read_runs("study").set_index("run_id")
    assert list(table.columns[:4]) == ["run", "arm", "norm", "seed"]
    new, old, fixed, branch = (table.loc[i] for i in ("0", "1", "2", "0~budget0.5"))
    assert new["final_val_loss"] == 2.7276120185852051  # every digit survives the CSV
    assert new["arm"] == "norm=rmsnorm" and new["norm"] == "rmsnorm" and new["seed"] == 0
    assert new["downstream/order/acc"] == 0.66 and new["final_val_bpb"] == 3.9 and new["steps"] == 100
    assert {k: new[k] for k in ("torch_version", "cpu_capability", "cpu_model", "threads", "device")} == {
        "torch_version": "2.13.0+cpu", "cpu_capability": "AVX2", "cpu_model": "AMD EPYC", "threads": 1,
        "device": "cpu"}  # fmt: skip
    assert json.loads(new["overrides"]) == ["norm=rmsnorm", "seed=0"]  # what the check sets itself is left out
    # not recorded: empty, not guessed; a config's explicit train.threads and train.device were recorded
    assert old[["torch_version", "cpu_capability", "cpu_model", "threads", "device", "final_val_bpb"]].isna().all()
    assert fixed[["torch_version", "cpu_capability", "cpu_model"]].isna().all()
    assert fixed["threads"] == 1 and fixed["device"] == "cpu" and bool(fixed["stalled"]) and not bool(old["stalled"])
    assert pd.isna(branch["overrides"]) and branch["run"] == "norm=rmsnorm,seed=0,ladder.budget=0.5"
    assert gallery.seed_spread(gallery.read_runs("study"), "norm=rmsnorm") == pytest.approx(
        (statistics.stdev([2.7276120185852051, 2.8, 3.30]), 3)  # the completed seeds of the arm, branch apart
    )
    assert gallery.check("study", "norm=rmsnorm,seed=0,ladder.budget=0.5") == 2  # refused: no command of its own
    assert gallery.check("study", "seed=9") == 2  # no such run


def _row(**kw) -> pd.Series:
    return pd.Series({"run": "norm=rmsnorm,seed=0", "arm": "norm=rmsnorm", "final_val_loss": 2.7276, **HERE, **kw})


def test_check_line_equal_digits_or_the_difference_against_the_seed_spread(gallery):
    spread = (0.08, 3)
    line, rc = gallery.compare(_row(), {**HERE, "final_val_loss": 2.7276}, spread)
    assert rc == 0 and line.startswith("equal digits: final val loss 2.7276 recorded and rerun on a matching machine")
    # the same machine, other digits: not reproducible
    line, rc = gallery.compare(_row(), {**HERE, "final_val_loss": 2.7276 + 0.004}, spread)
    assert rc == 1 and line.startswith(
        "DIFFERENT digits on a matching machine (torch 2.13.0+cpu, AVX2 kernels on AMD EPYC, 1 thread, cpu)"
    )
    assert "difference +0.004000, 0.05x the arm's seed spread (std 0.0800 over 3 seeds)" in line
    # the case: recorded with AVX-512 kernels, rerun with AVX2
    line, rc = gallery.compare(_row(cpu_capability="AVX512"), {**HERE, "final_val_loss": 2.7402}, spread)
    assert rc == 0 and line == (
        "different digits, as expected when the machine differs: cpu_capability AVX512 -> AVX2: recorded 2.727600, "
        "rerun 2.740200: difference +0.012600, 0.16x the arm's seed spread (std 0.0800 over 3 seeds)"
    )
    old = _row(torch_version=math.nan, cpu_capability=math.nan, cpu_model=math.nan, threads=math.nan, device=math.nan)
    line, rc = gallery.compare(old, {**HERE, "final_val_loss": 2.7547}, (math.nan, 1))
    assert rc == 0 and "did not record torch_version, cpu_capability, cpu_model, threads, device" in line
    assert "no seed spread to compare with (1 completed seed of this arm)" in line
    line, rc = gallery.compare(_row(provenance_earlier='[{"threads": 2}]'), {**HERE, "final_val_loss": 2.7}, spread)
    assert rc == 0 and "resumed on another machine" in line


TINY_STUDY = """defaults:
  - train
  - override debug: smoke
  - _self_
train:
  max_steps: 6
  eval_every: 3
hydra:
  mode: MULTIRUN
  sweeper:
    params:
      seed: 0,1
"""


@pytest.mark.slow
def test_check_reruns_a_committed_run_and_finds_its_digits(gallery, tmp_path, monkeypatch, capsys, cache_dir):
    """End to end: a tiny study trained as the gallery trains it, its runs.csv, then ``check``: equal digits;
    a tampered value in runs.csv: the difference, against the seed spread, exit 1 (same machine)."""
    import subprocess
    import sys

    monkeypatch.setenv("LM_ABLATE_CACHE", cache_dir)
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "tiny.yaml").write_text(TINY_STUDY)
    runs = tmp_path / "runs" / "tiny"
    subprocess.run([sys.executable, "-m", "lm_ablate.train", "--config-dir", str(sweeps), "--config-name", "tiny",
                    f"hydra.sweep.dir={runs}", "hydra.sweep.subdir=${hydra:job.num}", "tracking=none",
                    "train.threads=1"], cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    monkeypatch.setattr(gallery, "SWEEPS", sweeps)
    monkeypatch.setattr(gallery, "RESULTS", tmp_path / "results")
    (gallery.RESULTS / "tiny").mkdir(parents=True)
    csv = gallery.RESULTS / "tiny" / "runs.csv"
    gallery.runs_table([runs]).to_csv(csv, index=False)
    capsys.readouterr()
    assert gallery.main(["check", "tiny", "--run", "seed=1"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("check tiny seed=1: equal digits: final val loss ") and "on a matching machine" in line
    table = pd.read_csv(csv)
    table.loc[table["run"] == "seed=1", "final_val_loss"] += 0.001
    table.to_csv(csv, index=False)
    assert gallery.main(["check", "tiny", "--run", "seed=1"]) == 1
    std = statistics.stdev(table["final_val_loss"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("check tiny seed=1: DIFFERENT digits on a matching machine")
    assert f"difference -0.001000, {0.001 / std:.2f}x the arm's seed spread (std {std:.4f} over 2 seeds)" in line
