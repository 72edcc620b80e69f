"""analysis/ along any axis: LR sweeps (best LR, LR sensitivity), paired tests, spike and divergence rates,
the W&B source and its Parquet cache, the new figures, W&B dashboards, the fast readers, and the report as a
browser renders it.

The LR sweep is synthetic: norm.placement (pre, post) x optim.lr (1e-3, 1e-2, 1e-1) x seeds 0-1, with final
and initial losses chosen here so that LR sensitivity can be worked out by hand (below, in the test), one
diverged run, one completed run that ended worse than at init, and one run still running.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from reference_stats import expected_ci
from scipy import stats as st

from analysis.compute.compare import compare_runs, compare_to_baseline, lr_sweep
from analysis.compute.stats import paired
from analysis.report import build_report
from analysis.report import main as report_main
from analysis.sources import load as L
from analysis.sources.combined import load_sources
from analysis.sources.load import load_runs
from lm_ablate import metrics as M

ROOT = Path(__file__).resolve().parent.parent

LRS = (1e-3, 1e-2, 1e-1)
STEPS = 40
N_LAYERS = 3
# (placement, lr) -> final val loss of seeds 0 and 1; None: the run diverged
FINALS = {
    ("post", 1e-3): [3.0, 3.2],
    ("post", 1e-2): [2.5, 2.7],
    ("post", 1e-1): [10.6, None],  # seed 0 ends above its init loss (10.0): capped at 10.0
    ("pre", 1e-3): [3.1, 3.3],
    ("pre", 1e-2): [2.9, 3.0],
    ("pre", 1e-1): [2.4, 2.6],
}
GRAD_SPIKES = {("post", 1e-1): [2, 1]}  # grad-norm spikes of seeds 0 and 1 (else 0)
DIVERGE_AT = 25
XSS = "<img src=x onerror=alert(1)>"


def _spikes(placement: str, lr: float, seed: int) -> int:
    counts = GRAD_SPIKES.get((placement, lr), [])
    return counts[seed] if seed < len(counts) else 0


def init_loss(seed: int) -> float:
    return 10.0 + 0.1 * seed


def config(placement: str, lr: float, seed: int) -> dict:
    return {
        "model": {"name": "tiny", "d_model": 32, "n_layers": N_LAYERS, "context": 16},
        "norm": {"name": "rmsnorm", "placement": placement},
        "optim": {"name": "adamw", "lr": lr},
        "train": {"max_steps": STEPS, "probe_every": 10, "device": "cpu"},
        "seed": seed,
        "study": "lr" + XSS,
    }


def metrics_rows(placement: str, lr: float, seed: int, final: float | None, probes: bool = True) -> list[dict]:
    """The loop's rows: val/loss at step 0 (init) and at the end (with extrapolation), probes at step 1 and
    every 10 steps; a diverged run ends in a NaN loss at DIVERGE_AT."""
    rows: list[dict] = [{M.STEP: 0, M.VAL_LOSS: init_loss(seed), M.TOKENS: 0}]
    spikes = _spikes(placement, lr, seed)
    for step in range(1, STEPS + 1):
        end = final if final is not None else 5.0
        row = {
            M.STEP: step, M.TRAIN_LOSS: end + 5 * math.exp(-step / 8), M.GRAD_NORM: 1.0 + 0.01 * step,
            M.SPIKE_GRAD_NORM: float(step <= spikes), M.SPIKE_GRAD_NORM_COUNT: min(step, spikes),
        }  # fmt: skip
        if probes and (step == 1 or step % 10 == 0):
            for i in range(N_LAYERS):
                grow = (1 + i) if placement == "post" else 1.0
                row[M.layer_metric(i, M.GRAD_NORM_LAYER)] = 0.1 * grow + 0.001 * seed
                row[M.layer_metric(i, M.MAX_ATTN_LOGIT)] = 2.0 + i + lr * step
            row[M.LOGITS_MAX_ABS] = 5.0 + lr * step
            row[M.LOGITS_MEAN_LOG_Z] = 3.0 + lr * step
        if final is None and step == DIVERGE_AT:
            row[M.TRAIN_LOSS], row[M.GRAD_NORM] = math.nan, math.inf
            rows.append(row)
            break
        if step == STEPS:
            row[M.VAL_LOSS] = final
            for k in (2, 4):
                row[M.val_loss_at(k)] = final + 0.1 * k * (2 if placement == "post" else 1)
        rows.append(row)
    return rows


def write(run_dir: Path, cfg: dict | None, rows: list[dict], summary: dict | None) -> None:
    run_dir.mkdir(parents=True)
    if cfg is not None:
        (run_dir / M.CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    (run_dir / M.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (run_dir / M.SUMMARY_FILE).write_text(json.dumps(summary))


def summary(placement: str, lr: float, seed: int, final: float | None, status: str, steps: int) -> dict:
    spikes = _spikes(placement, lr, seed)
    return {
        M.STATUS: status, M.RUN_NAME: f"{placement}-{lr}-s{seed}", M.SEED: seed,
        M.FINAL_VAL_LOSS: final if final is not None else init_loss(seed), M.BEST_VAL_LOSS: final,
        M.GRAD_NORM_SPIKES: spikes, M.LOSS_SPIKES: 0, M.MEAN_TOKENS_PER_SEC: 1000.0 + seed,
        M.PARAMS_TOTAL: 1000, M.PARAMS_NON_EMBEDDING: 800, M.STEPS: steps, M.STOP_REASON: "max_steps",
        M.DIVERGED_AT: DIVERGE_AT if final is None else None,
    }  # fmt: skip


@pytest.fixture(scope="module")
def lr_sweep_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lr") / "multirun"
    job = 0
    for (placement, lr), finals in FINALS.items():
        for seed, final in enumerate(finals):
            status = M.STATUS_COMPLETED if final is not None else M.STATUS_DIVERGED
            rows = metrics_rows(placement, lr, seed, final)
            write(root / str(job), config(placement, lr, seed), rows,
                  summary(placement, lr, seed, final, status, rows[-1][M.STEP]))  # fmt: skip
            job += 1
    # still running (pre, 1e-2, seed 2): counted, never in a mean or in the sensitivity
    rows = metrics_rows("pre", 1e-2, 2, 0.5)[:20]
    write(root / str(job), config("pre", 1e-2, 2), rows, summary("pre", 1e-2, 2, 0.5, M.STATUS_RUNNING, 19))
    return root


@pytest.fixture(scope="module")
def lr_report(lr_sweep_dir, tmp_path_factory) -> Path:
    return build_report([lr_sweep_dir], tmp_path_factory.mktemp("lr_report"))


# --- LR sweeps ------------------------------------------------------------------------------------------
def test_lr_sensitivity_and_best_lr_by_hand(lr_sweep_dir):
    sweep = lr_sweep(load_runs([lr_sweep_dir]))
    assert sweep is not None and sweep.lrs == list(LRS)
    best = sweep.best.set_index("context")
    # post: loss(lr) = mean over seeds of min(final, init), a diverged run counting as its init loss
    post = {1e-3: (3.0 + 3.2) / 2, 1e-2: (2.5 + 2.7) / 2, 1e-1: (min(10.6, 10.0) + 10.1) / 2}
    star = min(post.values())  # 2.6, at 1e-2
    row = best.loc["norm.placement=post"]
    assert row["lr_sensitivity"] == pytest.approx(sum(v - star for v in post.values()) / 3)  # (0.5 + 0 + 7.45)/3
    assert row["loss_star"] == pytest.approx(2.6)
    assert row["best_lr"] == 1e-2 and not row["best_at_edge"]
    mean, low, high = expected_ci([2.5, 2.7])
    assert (
        row["final_val_loss_mean"],
        row["final_val_loss_ci_low"],
        row["final_val_loss_ci_high"],
    ) == pytest.approx((mean, low, high))
    assert (row["n_diverged"], row["n_diverged_at_best"], row["final_val_loss_n"]) == (1, 0, 2)
    # pre: the running run (pre, 1e-2, seed 2, loss 0.5) would make 1e-2 the best if it were counted
    pre = {1e-3: 3.2, 1e-2: 2.95, 1e-1: 2.5}
    row = best.loc["norm.placement=pre"]
    assert row["lr_sensitivity"] == pytest.approx(sum(v - 2.5 for v in pre.values()) / 3)
    assert row["best_lr"] == 1e-1 and row["best_at_edge"]
    # no vocabulary in these records: the cap falls back to each run's step-0 loss
    assert row["loss_cap"] == pytest.approx(np.mean([10.0, 10.1] * 3 + [10.2]))
    points = sweep.points.set_index(["context", "lr"])
    assert points.loc[("norm.placement=post", 1e-1), "n_diverged"] == 1
    assert points.loc[("norm.placement=post", 1e-1), "final_val_loss_mean"] == pytest.approx(10.6)
    assert points.loc[("norm.placement=pre", 1e-2), "n_runs"] == 3


def test_no_lr_sweep_without_lr_axis(lr_sweep_dir, tmp_path):
    for i, src in enumerate(sorted(lr_sweep_dir.iterdir(), key=lambda p: int(p.name))[:4]):
        shutil.copytree(src, tmp_path / str(i))  # post at 1e-3 and 1e-2: lr varies
    assert lr_sweep(load_runs([tmp_path])) is not None
    shutil.rmtree(tmp_path / "2")
    shutil.rmtree(tmp_path / "3")
    assert lr_sweep(load_runs([tmp_path])) is None


def test_lr_figure_draws_the_datas_unigram_and_bigram_levels(lr_sweep_dir, tmp_path, monkeypatch):
    """Issue 23.6: the LR figure shows the data's reference levels (the median of what the runs recorded), so a
    sweep that ends at the bigram level is seen to; records without them draw none."""
    from analysis.present.figures import lr as figure

    for i, src in enumerate(sorted(lr_sweep_dir.iterdir(), key=lambda p: int(p.name))[:4]):
        shutil.copytree(src, tmp_path / str(i))
        path = tmp_path / str(i) / M.SUMMARY_FILE
        levels = {M.UNIGRAM_LOSS: 3.31 + 0.01 * (i == 3), **({M.BIGRAM_LOSS: 2.51} if i else {})}
        path.write_text(json.dumps({**json.loads(path.read_text()), **levels}))
    drawn = []
    monkeypatch.setattr(figure, "png_bytes", lambda fig: drawn.append(fig) or b"")

    def flat_lines(fig) -> set[float]:
        return {round(float(line.get_ydata()[0]), 4) for ax in fig.axes for line in ax.get_lines()
                if list(line.get_xdata()) == [0, 1]}  # fmt: skip

    sweep = lr_sweep(load_runs([tmp_path]))
    assert sweep.levels == {M.UNIGRAM_LOSS: 3.31, M.BIGRAM_LOSS: 2.51}
    (fig,) = figure.lr_figures(sweep)
    assert flat_lines(drawn[-1]) == {3.31, 2.51}
    assert "unigram level (dotted, 3.31) and bigram level (dashed, 2.51)" in fig.caption
    (fig,) = figure.lr_figures(lr_sweep(load_runs([lr_sweep_dir])))
    assert flat_lines(drawn[-1]) == set() and "bigram" not in fig.caption
    # a level far above every loss would squash the curves: not drawn (the caption still gives it)
    far = dataclasses.replace(sweep, levels={M.UNIGRAM_LOSS: 40.0, M.BIGRAM_LOSS: 2.51})
    (fig,) = figure.lr_figures(far)
    assert flat_lines(drawn[-1]) == {2.51} and "unigram level (dotted, 40.00)" in fig.caption


def test_runs_without_a_numeric_lr_are_counted_and_said(lr_sweep_dir, tmp_path):
    """compute/ counts the runs it leaves out (LRSweep.left_out); the LR section words it."""
    from analysis.present.sections.lr import lr_blocks

    for i, src in enumerate(sorted(lr_sweep_dir.iterdir(), key=lambda p: int(p.name))[:4]):
        shutil.copytree(src, tmp_path / str(i))
    cfg = OmegaConf.load(tmp_path / "0" / M.CONFIG_FILE)
    cfg.optim.lr = None  # a run whose LR is no number (written by hand, or a resolver that failed)
    (tmp_path / "0" / M.CONFIG_FILE).write_text(OmegaConf.to_yaml(cfg))
    rs = load_runs([tmp_path])
    sweep = lr_sweep(rs)
    assert sweep.left_out == 1 and sorted(sweep.assignment) == ["1", "2", "3"]
    said = [b.items for b in lr_blocks(sweep, []) if type(b).__name__ == "Bullets"]
    assert said == [["1 run(s) without a positive numeric optim.lr left out"]]


# --- tests against a baseline, rates --------------------------------------------------------------------
def test_paired_matches_ttest_rel():
    a, b = [3.0, 3.1, 3.25, 2.9], [3.2, 3.15, 3.4, 3.05]
    d, low, high, p, n = paired(a, b)
    diff = np.array(a) - np.array(b)
    half = st.t.ppf(0.975, 3) * diff.std(ddof=1) / 2
    assert n == 4 and p == pytest.approx(st.ttest_rel(a, b).pvalue)
    assert (d, low, high) == pytest.approx((diff.mean(), diff.mean() - half, diff.mean() + half))
    assert paired([1.0, float("nan"), 2.0], [0.5, 1.0, 1.0])[4] == 2  # a pair with a NaN is dropped
    assert paired([1.0, 2.0], [0.0, 1.0])[1:4] == (1.0, 1.0, 0.0)  # constant difference: collapsed


def test_compare_to_baseline_pairs_by_seed_else_welch():
    def runs(seeds, losses):
        return [{M.SEED: s, M.FINAL_VAL_LOSS: v} for s, v in zip(seeds, losses)]

    a, b = [3.0, 3.1, 3.25], [3.2, 3.15, 3.4]
    got = compare_to_baseline(runs([2, 0, 1], [a[2], a[0], a[1]]), runs([0, 1, 2, 7], b + [9.0]))
    assert got["test"] == "paired" and got["n_pairs"] == 3  # seed 7 has no partner: left out
    assert got["p_value"] == pytest.approx(st.ttest_rel(a, b).pvalue)
    welch = compare_to_baseline(runs([0, 1, 2], a), runs([3, 4, 5], b))
    assert welch["test"] == "welch" and welch["p_value"] == pytest.approx(st.ttest_ind(a, b, equal_var=False).pvalue)
    assert compare_to_baseline(runs([0, 0, 1], a), runs([0, 1, 2], b))["test"] == "welch"  # repeated seed


def test_spike_and_divergence_rates(lr_sweep_dir):
    (comp,) = compare_runs(load_runs([lr_sweep_dir]), by=["norm.placement"]).comparisons
    t = comp.table.set_index(["context", "arm"])
    post = t.loc[("optim.lr=0.1", "post")]
    # seed 0 completed 40 steps with 2 spikes, seed 1 diverged at step 25 after 1 spike: pooled per 1k steps
    assert post["grad_norm_spikes_per_1k_steps"] == pytest.approx(1000 * 3 / (40 + 25))
    assert post["divergence_rate"] == pytest.approx(0.5) and post["loss_spikes_per_1k_steps"] == 0
    pre = t.loc[("optim.lr=0.01", "pre")]
    assert pre["divergence_rate"] == 0 and pre["n_runs"] == 3 and pre["n_other"] == 1
    assert pre["grad_norm_spikes_per_1k_steps"] == 0  # the running run is not pooled
    assert post["test"] == "" and t.loc[("optim.lr=0.001", "pre"), "test"] == "paired"


# --- report: sections, figures, tables ------------------------------------------------------------------
NEW_FIGURES = ("init-grad-norm", "attn-logit", "logit-growth", "extrapolation")


def test_report_has_lr_section_new_figures_and_parquet(lr_report):
    out = lr_report.parent
    html = lr_report.read_text()
    assert "<h2>Learning rate (optim.lr)</h2>" in html and "grid edge" in html
    assert "paired t (2 seeds)" in html and "spikes / 1k steps" in html
    names = [p.name for p in out.glob("*.png")]
    assert any("lr-sweep" in n for n in names)
    for kind in NEW_FIGURES:
        assert sum(kind in n for n in names) == 2, kind  # one per comparison (norm.placement, optim.lr)
    assert html.count('src="data:image/png;base64,') == len(names)
    for stem in ("runs", "comparisons", "lr_sweep", "lr_points"):
        csv, parquet = pd.read_csv(out / f"{stem}.csv"), pd.read_parquet(out / f"{stem}.parquet")
        assert len(csv) == len(parquet) > 0 and list(csv.columns) == list(parquet.columns)
    runs = pd.read_parquet(out / "runs.parquet").set_index("run_id")
    assert runs.loc["0", L.INIT_VAL_LOSS] == pytest.approx(10.0)
    assert runs.loc["0", "val/loss@4x"] == pytest.approx(3.0 + 0.8)
    assert runs.loc["0", L.FIRST_PROBE_PREFIX + M.layer_metric(2, M.GRAD_NORM_LAYER)] == pytest.approx(0.3)
    assert runs.loc["0", L.FIRST_PROBE_STEP] == 1
    assert XSS not in html and XSS not in (out / "report.md").read_text()


def test_figure_titles_are_words_not_metric_keys(lr_report):
    """Issue 21.4: titles read ``optim/grad_norm by norm.name``; the logged keys belong in captions and axes."""
    md = (lr_report.parent / "report.md").read_text()
    titles = re.findall(r"^!\[(.*?)\]\(", md, re.M)
    assert len(titles) == len(list(lr_report.parent.glob("*.png"))) >= 8
    keys = {M.VAL_LOSS, M.TRAIN_LOSS, M.GRAD_NORM, M.LOGITS_MAX_ABS, M.LOGITS_MEAN_LOG_Z}
    assert [t for t in titles if any(k in t for k in keys)] == []
    assert {"validation loss by norm.placement", "gradient norm by optim.lr"} <= set(titles)


def test_new_figures_skipped_cleanly_without_their_data(lr_sweep_dir, tmp_path):
    from analysis.present.figures import curves as P

    for i, src in enumerate(sorted(lr_sweep_dir.iterdir(), key=lambda p: int(p.name))[:8]):
        cfg = OmegaConf.to_container(OmegaConf.load(src / M.CONFIG_FILE))
        placement, lr, seed = cfg["norm"]["placement"], cfg["optim"]["lr"], cfg["seed"]
        rows = list(metrics_rows(placement, lr, seed, 3.0, probes=False))
        for r in rows:  # a loop without extrapolation
            r.pop(M.val_loss_at(2), None), r.pop(M.val_loss_at(4), None)
        write(
            tmp_path / "runs" / str(i),
            cfg,
            rows,
            summary(placement, lr, seed, 3.0, M.STATUS_COMPLETED, STEPS),
        )
    rs = load_runs([tmp_path / "runs"])
    comp = compare_runs(rs, by=["norm.placement"]).comparisons[0]
    for fn in (
        P.init_grad_figures,
        P.attention_logit_figures,
        P.logit_growth_figures,
        P.extrapolation_figures,
    ):
        assert fn(rs, comp) == []
    assert P.loss_figures(rs, comp) and P.grad_norm_figures(rs, comp)


def test_grad_norm_figure_draws_every_run_thinned_with_its_spikes(tmp_path, monkeypatch):
    """One LineCollection per arm and line style still draws every run (each line thinned to the highest point
    of every few steps, so a one-step spike stays visible), marks every flagged spike and every divergence."""
    from matplotlib.collections import LineCollection

    from analysis.present.figures import curves as P

    steps = 3000  # > MAX_POINTS // 3: lines are thinned
    runs = [("pre", 0, None), ("pre", 1, None), ("post", 0, None), ("post", 1, 2000)]  # post seed 1 diverges
    for i, (placement, seed, diverge_at) in enumerate(runs):
        rows = [{M.STEP: 0, M.VAL_LOSS: 10.0}]
        for s in range(1, steps + 1):
            spike = s == 1234 + i
            rows.append({M.STEP: s, M.TRAIN_LOSS: 3.0, M.GRAD_NORM: 50.0 if spike else 1.0 + 1e-4 * s + 0.1 * i,
                         M.SPIKE_GRAD_NORM: float(spike)})  # fmt: skip
            if s == diverge_at:
                rows[-1][M.GRAD_NORM] = math.inf
                break
        status = M.STATUS_DIVERGED if diverge_at else M.STATUS_COMPLETED
        write(tmp_path / str(i), config(placement, 1e-2, seed), rows,
              summary(placement, 1e-2, seed, 3.0, status, rows[-1][M.STEP]))  # fmt: skip
    rs = load_runs([tmp_path])
    comp = compare_runs(rs, by=["norm.placement"]).comparisons[0]
    drawn = []
    monkeypatch.setattr(P, "png_bytes", lambda fig: drawn.append(fig) or b"")
    assert len(P.grad_norm_figures(rs, comp)) == 1
    (ax,) = drawn[0].axes[:1]
    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    segments = [s for c in lines for s in c.get_segments()]
    assert len(segments) == len(runs)  # every run, in 3 collections: pre solid, post solid, post dashed
    assert len(lines) == 3 and sum(c.get_linestyle()[0][1] is not None for c in lines) == 1
    assert all(len(s) <= P.MAX_POINTS // 3 + 3 for s in segments)
    assert sorted(float(s[:, 1].max()) for s in segments) == [50.0] * len(runs)  # the spike survives thinning
    points = {m: sum(len(ln.get_xdata()) for ln in ax.get_lines() if ln.get_marker() == m) for m in "^X"}
    assert points == {"^": len(runs), "X": 1}
    assert ax.get_yscale() == "log" and ax.get_ylim()[1] > 50.0 and ax.get_xlim()[1] >= steps


def test_png_is_the_savefig_image(tmp_path):
    """png_bytes encodes the pixels savefig would (RGB when opaque, RGBA when not), just faster."""
    import io

    from PIL import Image

    from analysis.present import style as P

    for transparent in (False, True):
        fig, axes = P.panel_grid(2, ["a", "b"], 1)
        axes[0].plot([0, 1], [1, 2], label="x")
        axes[1].set_yscale("log")
        axes[1].plot([1, 10], [1, 100])
        P.arm_legend(fig, ["a", "b"], [])
        if transparent:
            fig.patch.set_alpha(0.0)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=P.DPI)
        want = Image.open(buf)
        got = Image.open(io.BytesIO(P.png_bytes(fig)))
        assert got.mode == ("RGBA" if transparent else "RGB") and got.size == want.size
        assert np.array_equal(np.asarray(got), np.asarray(want.convert(got.mode)))


def test_log_axes_build_only_the_ticks_they_draw(monkeypatch):
    """_InView drops a log locator's locations outside the view before matplotlib builds ticks for them: the
    same image, from fewer tick objects."""
    import io

    from PIL import Image

    from analysis.present import style as P

    def draw() -> tuple[np.ndarray, int]:
        fig, (ax,) = P.panel_grid(1, ["a"], 0)
        ax.plot([1, 5000], [0.45, 12.0])
        ax.set_yscale("log")
        P.plain_log_ticks(ax)
        ax.set_xscale("log")
        P.log_ticks_in_view(ax.xaxis)
        png = P.png_bytes(fig)
        ticks = sum(len(a.get_major_ticks()) + len(a.get_minor_ticks()) for a in (ax.xaxis, ax.yaxis))
        return np.asarray(Image.open(io.BytesIO(png))), ticks

    image, ticks = draw()
    monkeypatch.setattr(P, "log_ticks_in_view", lambda axis: None)
    want, all_ticks = draw()
    assert np.array_equal(image, want) and ticks < 0.8 * all_ticks


def test_pinned_titles_are_where_matplotlib_places_them(monkeypatch):
    """style_axes pins a panel's title at the top, where matplotlib's placement puts it too, except over an
    offset text, which is left to matplotlib: the same image either way."""
    import io

    from PIL import Image

    from analysis.present import style as P

    def draw(ys: list[float]) -> tuple[np.ndarray, str]:
        fig, (ax,) = P.panel_grid(1, ["a"], 0)
        ax.plot([0, 1], ys)
        P.style_axes(ax, "model.d_model=64, norm.name=layernorm, norm.placement=post", "step", "loss")
        offset = P._offset_text(ax.yaxis)
        return np.asarray(Image.open(io.BytesIO(P.png_bytes(fig)))), offset

    pinned = {}
    for case, ys in {"plain": [3.0, 3.5], "offset": [1000.001, 1000.003]}.items():
        pinned[case] = draw(ys)
        with monkeypatch.context() as m:  # never pinned: matplotlib places every title
            m.setattr(P, "_offset_text", lambda axis: "x")
            placed, _ = draw(ys)
        assert np.array_equal(pinned[case][0], placed), case
    assert pinned["plain"][1] == "" and pinned["offset"][1] != ""


def test_mean_band_over_the_steps_every_run_logged():
    from analysis.present.figures import curves as P

    a = pd.Series([1.0, 2.0, 3.0], index=[0, 10, 20])
    steps, mean, low, high = P._mean_band([a, pd.Series([3.0, 4.0, 7.0], index=[0, 10, 20])])
    assert list(steps) == [0, 10, 20] and list(mean) == [2.0, 3.0, 5.0] and list(high) == [3.0, 4.0, 7.0]
    steps, mean, low, high = P._mean_band([a, pd.Series([3.0, math.inf, 5.0], index=[0, 10, 20])])
    assert list(steps) == [0, 20] and list(mean) == [2.0, 4.0] and list(low) == [1.0, 3.0]
    assert P._mean_band([a, pd.Series([1.0], index=[5])]) is None and P._mean_band([]) is None


def test_fork_map_freezes_inherited_objects_only_while_it_maps():
    import gc
    import threading

    from analysis.parallel import fork_map

    before = gc.get_freeze_count()
    forks = sys.platform == "linux" and threading.active_count() == 1  # else fork_map maps in this process
    got = fork_map(lambda x: (2 * x, gc.get_freeze_count() > 0), [1, 2, 3], workers=2)
    assert [g[0] for g in got] == [2, 4, 6] and all(g[1] for g in got) == (forks or before > 0)
    assert gc.get_freeze_count() == before
    gc.freeze()  # the caller's own freeze is left as it is
    try:
        frozen = gc.get_freeze_count()
        assert fork_map(lambda x: x, [1, 2], workers=2) == [1, 2] and gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


# --- readers --------------------------------------------------------------------------------------------
def test_fast_metrics_reader_matches_careful_reader(tmp_path):
    rows = metrics_rows("post", 1e-1, 1, None)  # diverged: NaN and Infinity
    rows.insert(5, {M.STEP: 3, M.TRAIN_LOSS: 99.0})  # a resumed run re-logs step 3: the later row wins
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 99, "train/lo'  # killed mid-write
    data = text.encode()
    problems_fast: list[str] = []
    fast = L._read_metrics_fast(data, "r", problems_fast, None, True)
    assert fast is not None
    _, columns, steps, nonfinite, extras = fast
    got = L._frame(columns, steps, nonfinite)
    problems_slow: list[str] = []
    want = L._read_metrics_lines(text, "r", problems_slow)
    pd.testing.assert_frame_equal(got[sorted(got.columns)], want[sorted(want.columns)])
    assert got.attrs == want.attrs == {L.NONFINITE_STEP: DIVERGE_AT}
    assert problems_fast == problems_slow and "its last line (truncated write)" in problems_fast[0]
    assert extras == L.frame_extras(want) and extras[L.FIRST_PROBE_STEP] == 1
    assert got.loc[3, M.TRAIN_LOSS] == 99.0
    # a file the fast reader cannot take goes to the careful one, whatever is wrong with it
    assert L._read_metrics_fast(b'{"step": 1}\n[1]\n{"step": 2}\n', "r", [], None, True) is None
    assert L._read_metrics_fast(b'{"step": 1.5}\n', "r", [], None, True) is None
    # through read_metrics, with and without a column selection
    (tmp_path / "m.jsonl").write_text(text)
    kept, _ = L.read_metrics(tmp_path / "m.jsonl", "r", [], keep=lambda c: c == M.TRAIN_LOSS)
    assert list(kept.columns) == [M.TRAIN_LOSS] and kept.attrs[L.NONFINITE_STEP] == DIVERGE_AT


def _read_both_ways(path: Path, keep, need_base: bool, monkeypatch) -> dict:
    """_read_history as it is, and with msgspec's typed reader switched off (pyarrow, else the careful one)."""
    out = {}
    for way in ("typed", "arrow"):
        with monkeypatch.context() as m:
            if way == "arrow":
                m.setattr(L, "_decode_typed", lambda *a, **kw: None)
            problems: list[str] = []
            full, kept, extras = L._read_history(path, "r", problems, keep, need_base)
            out[way] = (full, kept, extras, problems)
    return out


def test_typed_reader_gives_what_pyarrow_gives_and_declines_what_it_cannot_read(tmp_path, monkeypatch):
    """msgspec's typed rows are a faster route to the same history: same frames, attrs, run-level values and
    problems as before, on clean files and damaged ones (what msgspec rejects goes on to pyarrow, then to
    the careful reader, as before)."""
    pytest.importorskip("msgspec")
    clean = [json.dumps(r) for r in metrics_rows("pre", 1e-2, 0, 2.5)]
    resumed = [*clean[:6], json.dumps({M.STEP: 3, M.TRAIN_LOSS: 99.0, M.GRAD_NORM: None}), *clean[6:]]
    resumed[8] = resumed[8].replace(f'"{M.STEP}": 7,', f'"{M.STEP}": 7, "{M.LOGITS_MAX_ABS}": 4,')  # an int
    diverged = [json.dumps(r) for r in metrics_rows("post", 1e-1, 1, None)]  # NaN and Infinity
    huge_tps = f'{{"{M.STEP}": 5, "{M.TOKENS_PER_SEC}": 1e999}}'
    variants = {
        "clean": (clean, True),
        "resumed, null, int": (resumed, True),
        "truncated last line": ([*clean, '{"step": 99, "train/lo'], True),
        "diverged": (diverged, False),
        "out of range": ([*clean[:5], f'{{"{M.STEP}": 5, "{M.TRAIN_LOSS}": 1e999}}', *clean[6:]], False),
        "blank line": ([*clean[:5], "", *clean[5:]], True),
        "two rows on a line": ([*clean[:5], clean[5] + " " + clean[6], *clean[7:]], True),
        "text value": ([*clean[:5], f'{{"{M.STEP}": 5, "{M.TRAIN_LOSS}": "oops"}}', *clean[6:]], False),
        "duplicate key": ([*clean[:5], f'{{"{M.STEP}": 5, "{M.TRAIN_LOSS}": 1, "{M.TRAIN_LOSS}": 2}}'], True),
        "no step": ([*clean[:5], f'{{"{M.TRAIN_LOSS}": 1.0}}', *clean[6:]], True),
        # beyond a double's range in a column not read: pyarrow rejects the whole file (the careful reader
        # then reads it), msgspec skips the value
        "out of range, unread": ([*clean[:5], huge_tps, *clean[6:]], "no base"),
    }
    # True/False: msgspec reads the file or declines it; "no base": reads it unless the base columns are read
    typed_used: list = []
    real = L._decode_typed

    def spy(*args, **kwargs):
        typed_used.append(real(*args, **kwargs))
        return typed_used[-1]

    monkeypatch.setattr(L, "_decode_typed", spy)
    keeps = {"report": lambda c: c in (M.TRAIN_LOSS, M.GRAD_NORM, M.LOGITS_MAX_ABS, L.MAX_ATTN_LOGIT_ALL),
             "val only": lambda c: c == M.VAL_LOSS}  # fmt: skip
    for i, (name, (lines, rule)) in enumerate(variants.items()):
        path = tmp_path / f"{i}.jsonl"
        path.write_text("\n".join(lines) + ("" if name == "truncated last line" else "\n"))
        for keep_name, keep in keeps.items():
            for need_base in (False, True):
                typed_used.clear()
                got = _read_both_ways(path, keep, need_base, monkeypatch)
                where = (name, keep_name, need_base)
                read_typed = bool(typed_used) and typed_used[0] is not None  # NaN in the last rows: not tried
                assert read_typed == (not need_base if rule == "no base" else rule), where
                (full_t, kept_t, *rest_t), (full_a, kept_a, *rest_a) = got.values()  # rest: extras, problems
                pd.testing.assert_frame_equal(kept_t, kept_a, check_exact=True, obj=str(where))
                assert kept_t.attrs == kept_a.attrs and rest_t == rest_a, where
                if need_base:  # the whole frame, for runs without a summary: what it is used for is the same
                    summaries = [pd.Series(L.summarize_history(f), dtype=float) for f in (full_t, full_a)]
                    pd.testing.assert_series_equal(*summaries, check_exact=True, obj=str(where))
    # the clean file as msgspec reads it is the careful reader's too
    typed_used.clear()
    got = L._read_history(tmp_path / "0.jsonl", "r", [], keeps["report"], True)[0]
    want = L._read_metrics_lines("\n".join(clean), "r", [])
    assert typed_used[0] is not None and len(got.columns) == 10
    pd.testing.assert_frame_equal(got, want[list(got.columns)], check_exact=True)


def test_fast_yaml_matches_omegaconf():
    conf = Path(__file__).resolve().parents[1] / "conf"
    files = [p for p in conf.rglob("*.yaml") if "${" not in p.read_text()]
    assert files
    for path in files:
        want = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        if isinstance(want, dict):
            assert L._load_yaml(path) == want, path


def test_parallel_loading_matches_sequential(lr_sweep_dir, monkeypatch):
    one = load_runs([lr_sweep_dir], keep=lambda c: c == M.VAL_LOSS, workers=1)
    monkeypatch.setattr(L, "PARALLEL_MIN_RUNS", 1)
    two = load_runs([lr_sweep_dir], keep=lambda c: c == M.VAL_LOSS, workers=2)
    pd.testing.assert_frame_equal(one.runs, two.runs)
    assert one.problems == two.problems and one.history.keys() == two.history.keys()
    for r in one.history:
        pd.testing.assert_frame_equal(one.history[r], two.history[r])


# --- W&B source -----------------------------------------------------------------------------------------
class FakeRun:
    """The attributes of wandb.apis.public.Run that the source reads."""

    def __init__(self, run_id, group, state, config, summary, rows):
        self.id, self.name, self.group, self.state = run_id, f"name-{run_id}", group, state
        self.url = f"https://wandb.ai/ent/proj/runs/{run_id}"
        self.config, self.summary, self.rows, self.scans = config, summary, rows, 0

    def scan_history(self, page_size=1000, **_):
        self.scans += 1
        return iter(self.rows)


class FakeApi:
    def __init__(self, runs):
        self._runs = runs

    def runs(self, path, filters=None, **_):
        assert path == "ent/proj"
        return [r for r in self._runs if not filters or r.group == filters["group"]]


def wandb_rows(rows: list[dict]) -> list[dict]:
    """Our rows as W&B history: _step, bookkeeping, NaN as W&B's strings, a histogram that must be dropped."""
    out = []
    for r in rows:
        row = {"_step": r[M.STEP], "_runtime": 0.1 * r[M.STEP], "_timestamp": 1.7e9 + r[M.STEP]}
        for k, v in r.items():
            if k != M.STEP:
                row[k] = (
                    ("NaN" if math.isnan(v) else "Infinity") if isinstance(v, float) and not math.isfinite(v) else v
                )
        row["weights"] = {"_type": "histogram", "values": [1, 2]}
        out.append(row)
    return out


def fake_project() -> list[FakeRun]:
    runs = []
    for i, ((placement, lr), finals) in enumerate(FINALS.items()):
        for seed, final in enumerate(finals):
            status = M.STATUS_COMPLETED if final is not None else M.STATUS_DIVERGED
            rows = metrics_rows(placement, lr, seed, final)
            cfg = config(placement, lr, seed)
            cfg["_wandb"] = {"cli_version": "0.31.0"}
            cfg["optim"] = {"value": cfg["optim"], "desc": None}  # the API's wrapped form
            summ = summary(placement, lr, seed, final, status, rows[-1][M.STEP])
            summ.update({"_step": rows[-1][M.STEP], "_runtime": 4.0, M.VAL_LOSS: final})
            runs.append(FakeRun(f"r{i}{seed}", "study", "finished", cfg, summ, wandb_rows(rows)))
    # written by something else (no summary keys of ours), crashed: status from the state, values from history
    rows = metrics_rows("pre", 1e-3, 5, 3.5)
    runs.append(FakeRun("other", "study", "crashed", config("pre", 1e-3, 5), {"_step": STEPS}, wandb_rows(rows)))
    runs.append(FakeRun("live", "study", "running", config("pre", 1e-2, 6),
                        {M.STATUS: M.STATUS_RUNNING, "_step": 10}, wandb_rows(rows[:11])))  # fmt: skip
    runs.append(FakeRun("elsewhere", "another", "finished", config("pre", 1e-2, 7), {}, []))
    return runs


def test_wandb_source_cache_and_offline(lr_sweep_dir, tmp_path, monkeypatch):
    import wandb

    from analysis.sources.wandb_api import RUNS_FILE, load_wandb

    project = fake_project()
    monkeypatch.setattr(wandb, "Api", lambda *a, **k: FakeApi(project))
    out = tmp_path / "out"
    report = build_report(None, out, wandb="ent/proj", group="study", workers=1)
    cache = out / "wandb_cache" / "ent_proj"
    assert (cache / RUNS_FILE).is_file() and len(list((cache / "history").glob("*.parquet"))) == 14
    runs = pd.read_csv(out / "runs.csv").set_index("run_id")
    assert len(runs) == 14 and "elsewhere" not in runs.index  # another group
    assert runs.loc["r21", M.STATUS] == M.STATUS_DIVERGED and runs.loc["other", M.STATUS] == M.STATUS_FAILED
    assert runs.loc["live", M.STATUS] == M.STATUS_RUNNING
    assert runs.loc["other", M.FINAL_VAL_LOSS] == pytest.approx(3.5)  # from the history: no summary of ours
    assert runs.loc["other", M.STEPS] == STEPS and runs.loc["r00", "optim.lr"] == pytest.approx(1e-3)
    assert runs.loc["r00", L.INIT_VAL_LOSS] == pytest.approx(10.0) and "_wandb.cli_version" not in runs.columns
    assert runs.loc["r00", "run_dir"] == "https://wandb.ai/ent/proj/runs/r00"
    html = report.read_text()
    assert "<h2>Learning rate (optim.lr)</h2>" in html and "max attention logit by norm.placement" in html
    rs = load_wandb("ent/proj", out / "wandb_cache", group="study", offline=True)
    hist = rs.history["r21"]  # post, 1e-1, seed 1: diverged
    assert hist.attrs[L.NONFINITE_STEP] == DIVERGE_AT and "weights" not in hist.columns
    assert math.isinf(hist.loc[DIVERGE_AT, M.GRAD_NORM]) and hist.index[0] == 0
    # a second fetch downloads only what may have changed (the running run)
    scans = {r.id: r.scans for r in project}
    load_wandb("ent/proj", out / "wandb_cache", group="study")
    assert {r.id: r.scans - scans[r.id] for r in project if r.group == "study" and r.scans != scans[r.id]} == {
        "live": 1
    }

    # run directories and a W&B project in one report: ids kept apart, configs merged
    both = load_sources([lr_sweep_dir], out, wandb="ent/proj", group="study", offline=True)
    assert len(both.runs) == 13 + 14 and both.runs["run_id"].is_unique and len(both.configs) == 27
    assert lr_sweep(both).best["n_lrs"].tolist() == [3, 3]

    # --offline: no API at all, same tables
    def no_network(*a, **k):
        raise AssertionError("--offline must not call wandb.Api")

    monkeypatch.setattr(wandb, "Api", no_network)
    assert (
        report_main(["--wandb", "ent/proj", "--group", "study", "--offline", "--out", str(out), "--workers", "1"]) == 0
    )
    pd.testing.assert_frame_equal(pd.read_csv(out / "runs.csv").set_index("run_id"), runs)
    # no cache: a one-line error, no traceback
    assert report_main(["--wandb", "ent/other", "--offline", "--out", str(tmp_path / "x")]) == 2


def test_wandb_fetch_failure_falls_back_to_cache_and_damage_is_a_problem(tmp_path, monkeypatch):
    import wandb

    from analysis.sources.load import AnalysisError
    from analysis.sources.wandb_api import load_wandb

    monkeypatch.setattr(wandb, "Api", lambda *a, **k: FakeApi(fake_project()))
    load_wandb("ent/proj", tmp_path, group="study")
    (tmp_path / "ent_proj" / "history" / "r00.parquet").write_bytes(b"garbage")

    class Down:
        def runs(self, *a, **k):
            raise ConnectionError("no route to host")

    monkeypatch.setattr(wandb, "Api", lambda *a, **k: Down())
    rs = load_wandb("ent/proj", tmp_path, group="study")
    assert any("fetch of ent/proj failed" in p for p in rs.problems)
    assert any(p.startswith("r00: cached W&B history unreadable") for p in rs.problems)
    assert rs.history["r00"].empty and len(rs.runs) == 14
    with pytest.raises(AnalysisError, match="no cache"):
        load_wandb("ent/nothing", tmp_path)
    with pytest.raises(AnalysisError, match="ENTITY/PROJECT"):
        load_wandb("just-a-name", tmp_path)


# --- W&B dashboard --------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # wandb-workspaces' pydantic v1-style validators
def test_dashboard_spec_and_workspace(capsys):
    from analysis.publish.dashboard import PANEL_METRICS, build_workspace, main, workspace_spec

    spec = workspace_spec("ent/proj", ["norm.placement", "norm.name"], group="study")
    assert [s["name"] for s in spec["sections"]] == ["by norm.placement", "by norm.name"]
    for sec in spec["sections"]:
        assert [p["metric"] for p in sec["panels"]] == list(PANEL_METRICS)
        assert {p["groupby"] for p in sec["panels"]} == {sec["groupby"]}
    pytest.importorskip("wandb_workspaces", reason="wandb-workspaces not installed (pip install '.[dashboards]')")
    workspace = build_workspace(spec)  # built, never saved
    assert (workspace.entity, workspace.project) == ("ent", "proj")
    assert [s.name for s in workspace.sections] == ["by norm.placement", "by norm.name"]
    for section, key in zip(workspace.sections, ("norm.placement", "norm.name")):
        assert [p.y for p in section.panels] == [[m] for m in PANEL_METRICS]
        assert all(p.groupby.name == key and p.groupby_aggfunc == "mean" for p in section.panels)
    model = workspace._to_model().model_dump(by_alias=True, exclude_none=True)  # what save() would send
    sections = model["spec"]["section"]["panelBankConfig"]["sections"]
    assert [p["config"]["groupBy"] for p in sections[0]["panels"]] == ["norm.value.placement"] * len(PANEL_METRICS)
    (runset,) = model["spec"]["section"]["runSets"]
    assert runset["filters"]["filters"] == [
        {"key": {"section": "run", "name": "group"}, "op": "=", "value": "study", "disabled": False}
    ]
    assert main(["--project", "ent/proj", "--by", "norm.placement", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["project"] == "proj"
    assert main(["--project", "no-slash", "--by", "x", "--dry-run"]) == 2


# --- the report in a browser ----------------------------------------------------------------------------
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0",
]  # fmt: skip


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


# Appended to a copy of the report: every table cell whose text reaches outside the cell's own box (text
# drawn over its neighbours), as [column header, cell text, cell left, right, text left, right] in CSS pixels.
LAYOUT_PROBE = """<script>
(() => {
  const out = [];
  for (const cell of document.querySelectorAll('td, th')) {
    const box = cell.getBoundingClientRect();
    const range = document.createRange();
    range.selectNodeContents(cell);
    for (const r of range.getClientRects()) {
      if (r.width > 0 && (r.right > box.right + 1 || r.left < box.left - 1)) {
        const header = cell.closest('table').rows[0].cells[cell.cellIndex];
        out.push([header ? header.textContent : '', cell.textContent.slice(0, 100), box.left, box.right,
                  r.left, r.right].map((v) => (typeof v === 'number' ? Math.round(v) : v)));
        break;
      }
    }
  }
  const pre = document.createElement('pre');
  pre.id = 'layout-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def _browse(browser: str, page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile{len(list(tmp_path.glob('profile*')))}"
    return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def cells_outside_their_columns(browser: str, report: Path, tmp_path: Path, width: int = 1280) -> list[list]:
    """The table cells whose text the browser draws outside the cell (over the next column), at ``width``."""
    return _probed(browser, report, tmp_path, LAYOUT_PROBE, "layout-probe", width, 2000)


def _probed(
    browser: str, report: Path, tmp_path: Path, probe: str, probe_id: str, width: int, height: int
) -> dict | list:
    """What ``probe`` (a script that writes JSON into <pre id=probe_id>) measured on ``report`` in a ``width`` x
    ``height`` window."""
    import html

    page = tmp_path / f"{probe_id}_{report.parent.name}.html"
    page.write_text(report.read_text().replace("</body>", probe + "\n</body>"))
    done = _browse(browser, page, tmp_path, f"--window-size={width},{height}", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(rf'<pre id="{probe_id}">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))


def test_report_renders_in_headless_chromium(lr_report, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary (Debian: apt-get install -y chromium): browser rendering not checked")
    dom = _browse(browser, lr_report, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    assert "<h2>Learning rate (optim.lr)</h2>" in dom.stdout and "<h2>How to read this</h2>" in dom.stdout
    assert dom.stdout.count("<table>") == lr_report.read_text().count("<table>") >= 6
    assert dom.stdout.count("<img ") == len(list(lr_report.parent.glob("*.png")))
    shot = tmp_path / "shot.png"
    done = _browse(browser, lr_report, tmp_path, "--window-size=1280,2000", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (2000, 1280)
    assert pixels.std() > 0.05 and (pixels.mean(axis=2) < 0.5).mean() > 0.005  # not blank: text and figures
    assert cells_outside_their_columns(browser, lr_report, tmp_path) == []


@pytest.fixture(scope="module")
def claims_report(tmp_path_factory) -> Path:
    """The default study's shape and claims (conf/experiment/norm_2x2.yaml): an "equal within a margin" claim
    whose effect cell holds both intervals, claim texts with & and ' in them, and its downstream scores (acc_norm
    unlike acc: three scores, which made the comparison table run off the page, issue 46.11)."""
    import yaml

    claims = yaml.safe_load((ROOT / "conf" / "experiment" / "norm_2x2.yaml").read_text())["claims"]
    finals = {("layernorm", "pre"): [2.75, 2.77, 2.79], ("rmsnorm", "pre"): [2.78, 2.85, 2.82],
              ("layernorm", "post"): [3.30, 3.30, 3.31], ("rmsnorm", "post"): [3.30, 3.29, 3.30]}  # fmt: skip
    root = tmp_path_factory.mktemp("claims") / "multirun"
    for job, ((norm, placement), values) in enumerate(finals.items()):
        for seed, final in enumerate(values):
            cfg = {"model": {"name": "small", "n_layers": 6}, "norm": {"name": norm, "placement": placement},
                   "optim": {"name": "adamw", "lr": 1e-2, "warmup_steps": 0}, "seed": seed, "study": "norm_2x2",
                   "choices": {"norm": norm}, "claims": claims}  # fmt: skip
            rows = [{M.STEP: s, M.VAL_LOSS: v, M.TRAIN_LOSS: v, M.GRAD_NORM: 1.0} for s, v in
                    ((0, 5.5), (50, final + 0.3), (100, final))]  # fmt: skip
            tps = 1000.0 + 30 * seed + 40 * (norm == "rmsnorm")
            acc = (0.70 if placement == "pre" else 0.25) + 0.01 * seed  # eval=quick's word-order task
            scores = {M.downstream(ORDER_TASK, "acc"): acc, M.downstream(ORDER_TASK, "acc_norm"): acc + 0.002,
                      M.downstream(ORDER_TASK, "bpb"): 1.5 * final}  # fmt: skip
            write(root / f"{job * 3 + seed}", cfg, rows, {
                M.STATUS: M.STATUS_COMPLETED, M.SEED: seed, M.FINAL_VAL_LOSS: final, M.BEST_VAL_LOSS: final,
                M.MEAN_TOKENS_PER_SEC: tps, M.STEPS: 100, M.GRAD_NORM_SPIKES: 0, M.LOSS_SPIKES: 0, **scores})  # fmt: skip
    return build_report([root], tmp_path_factory.mktemp("claims_report"), workers=1)


ORDER_TASK = "shakespeare_order"


def test_every_table_cell_stays_inside_its_column(claims_report, tmp_path):
    """Issue 21.4: the effect cell of an "equal within a margin" claim (both intervals) was drawn over the test
    and verdict columns (white-space:nowrap in a cell capped at 32em)."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary (Debian: apt-get install -y chromium): browser layout not checked")
    assert "; 90% CI [" in claims_report.read_text()  # the long cell is there
    for width in (1280, 800):
        assert cells_outside_their_columns(browser, claims_report, tmp_path, width) == [], width
    # a right-aligned (one-line) cell longer than a column may be widens its column rather than spilling over
    from analysis.present.document import Table, render_html

    wide = (tmp_path / "wide") / "report.html"
    wide.parent.mkdir()
    number = "+0.0467 [-0.0250, +0.1184]; 90% CI [-0.0020, +0.0953] " * 2
    wide.write_text(render_html([Table(["text", "number", "next"], [["a " * 80, number, "b"]], frozenset({1}))], "t"))
    assert cells_outside_their_columns(browser, wide, tmp_path) == []


# Appended to a copy of the report: what the first screen shows (before any <details> is opened: the first
# table's header and where it ends, in CSS pixels from the top), then, with every <details> open, each table wider
# than the page (its box, or its scroll box, reaching past the body's content box) as [first header, width, body].
PAGE_PROBE = """<script>
(() => {
  const first = document.querySelector('table');
  const out = {height: window.innerHeight, width: window.innerWidth,
               first: first ? [...first.rows[0].cells].map((c) => c.textContent) : [],
               first_bottom: first ? first.getBoundingClientRect().bottom : null, wide: []};
  for (const d of document.querySelectorAll('details')) d.open = true;
  const body = document.body.getBoundingClientRect();
  const right = body.right - parseFloat(getComputedStyle(document.body).paddingRight);
  for (const table of document.querySelectorAll('table')) {
    const box = table.getBoundingClientRect();
    const scroll = table.parentElement;
    if (box.right > right + 1 || scroll.scrollWidth > scroll.clientWidth + 1) {
      out.wide.push([table.rows[0].cells[0].textContent, Math.round(box.width), Math.round(right - body.left)]);
    }
  }
  const pre = document.createElement('pre');
  pre.id = 'page-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def page_layout(browser: str, report: Path, tmp_path: Path, width: int = 1400, height: int = 900) -> dict:
    """The first screen and the tables wider than the page, as PAGE_PROBE measures them in a ``width`` x
    ``height`` window."""
    return _probed(browser, report, tmp_path, PAGE_PROBE, "page-probe", width, height)


def test_the_answer_is_on_the_first_screen_and_every_table_fits_the_page(claims_report, tmp_path):
    """Issue 46.11: at 1400 x 900 the claims table (verdict first, one row per claim) ends on the first screen, and
    no table, those in folded <details> included, is wider than the page (the comparison table had 23 columns)."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary (Debian: apt-get install -y chromium): browser layout not checked")
    layout = page_layout(browser, claims_report, tmp_path)
    # headless Chromium keeps room for a window's bars: a 900-pixel window shows ~760 pixels of page
    assert layout["width"] == 1400 and 700 <= layout["height"] <= 900
    assert layout["first"] == ["verdict", "effect [95% CI]", "claim"]
    assert layout["first_bottom"] <= layout["height"], layout
    assert layout["wide"] == []
    html = claims_report.read_text()
    assert html.count("<tr>") - html.count("<tr><th>") >= 4  # the tables hold rows (a blank page fits anything)
    # the check can fail: the old 23-column table, at this width, ran off the page
    from analysis.present.document import Table, render_html

    wide = tmp_path / "wide" / "report.html"
    wide.parent.mkdir()
    cells = ["+0.0467 [-0.0250, +0.1184]"] * 23
    wide.write_text(render_html([Table([f"column {i}" for i in range(23)], [cells], frozenset(range(23)))], "t"))
    (too_wide,) = page_layout(browser, wide, tmp_path)["wide"]
    assert too_wide[0] == "column 0" and too_wide[1] > too_wide[2]


def test_hidden_lines_follow_the_rule_written_out():
    """A line is hidden when one drawn after it covers its x range and stays within 1% of the panel's y span at each
    of its points (interpolated); the first line drawn is the one hidden, never the last."""
    from analysis.present.style import HIDDEN_FRACTION, hidden_lines

    x = np.arange(0.0, 101.0, 10.0)
    base = 3.0 - np.log1p(x) / 10
    span = 1.0
    near = base + 0.9 * HIDDEN_FRACTION * span
    far = base.copy()
    far[5] += 1.1 * HIDDEN_FRACTION * span  # one point off by more than a line's width: both lines show
    assert hidden_lines([("a", x, base), ("b", x, near)], span) == [("a", "b")]
    assert hidden_lines([("a", x, base), ("b", x, far)], span) == []
    assert hidden_lines([("a", x, base), ("b", x[:6], base[:6])], span) == []  # b does not cover all of a
    assert hidden_lines([("a", x[:6], base[:6]), ("b", x, base)], span) == [("a", "b")]
    line, coarse = 3.0 - x / 100, x[::2]  # the later line interpolated at the hidden line's points
    assert hidden_lines([("a", x, line), ("b", coarse, 3.0 - coarse / 100)], span) == [("a", "b")]
    assert hidden_lines([("a", x, base + 5), ("b", x, base + 5)], 2.0, log=True) == [("a", "b")]


def test_a_curve_hidden_under_another_is_said_in_the_caption(tmp_path):
    """Issue 46.11: two arms with the same mean val loss curve draw one line; the caption names the one under, and
    says nothing once the curves part."""
    from analysis.present.figures.curves import loss_figures

    def figure(shift: float) -> tuple[str, list[str]]:
        root = tmp_path / f"shift{shift}"
        for job, (placement, seed) in enumerate((p, s) for p in ("pre", "post") for s in (0, 1)):
            rows = [{M.STEP: step, M.VAL_LOSS: 3.0 - step / 100 + 0.01 * seed + (shift if placement == "post" else 0)}
                    for step in (0, 50, 100)]  # fmt: skip
            write(root / str(job), config(placement, 1e-3, seed), rows,
                  {M.STATUS: M.STATUS_COMPLETED, M.SEED: seed, M.FINAL_VAL_LOSS: rows[-1][M.VAL_LOSS]})  # fmt: skip
        rs = load_runs([root])
        (comp,) = [c for c in compare_runs(rs).comparisons if c.axis.name == "norm.placement"]
        (fig,) = loss_figures(rs, comp)
        return fig.caption, comp.arms

    caption, (first, second) = figure(0.0)  # drawn in this order: the first is the one under
    assert f"within 1% of the panel's height at every point): {first} lies under {second}." in caption
    assert "Hidden lines" not in figure(0.2)[0]


# --- the report as a Markdown renderer reads it ---------------------------------------------------------
MARKDOWN_TEXTS = [
    "Zhang & Sennrich 2019's report", "p < 0.001; CM > 1; a<b", XSS, "<script>alert(1)</script>", "<!-- c -->",
    "&amp; and &#x27; as typed, &", "a | b", "*bold* **x**", "_it_ snake_case_key __init__", "`code`",
    "~~strike~~ ~x~", "[link](javascript:alert(1))", "![img](x.png)", "[-0.0412, +0.1321]", "# no heading",
    "> no quote", "- no list", "+ no", "1. no list", "2) no", "---", "back\\slash \\*", "-0.0412", "<http://x.y>",
    "x_", "_", "a\\",
]  # fmt: skip


def test_markdown_renders_every_text_as_written():
    """Issue 21.4: report.md was HTML-escaped (&#x27;, &amp;, &gt; in the file). Every block's text, rendered by a
    CommonMark parser (GFM tables), must read back exactly as written: nothing interpreted, nothing shown twice
    escaped."""
    import html

    markdown_it = pytest.importorskip("markdown_it")
    from analysis.present.document import Bullets, Details, Fig, Heading, Para, Table, render_markdown
    from analysis.present.style import PlotFigure

    md = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"])

    def shown(text: str) -> str:  # how markdown-it writes plain text into HTML
        return html.escape(text, quote=False).replace('"', "&quot;")

    for text in MARKDOWN_TEXTS:
        assert md.render(render_markdown([Para(text)])) == f"<p>{shown(text)}</p>\n", text
        assert md.render(render_markdown([Heading(2, text)])) == f"<h2>{shown(text)}</h2>\n", text
        assert md.render(render_markdown([Bullets([text])])) == f"<ul>\n<li>{shown(text)}</li>\n</ul>\n", text
        cells = re.findall(r"<t[hd]>(.*?)</t[hd]>", md.render(render_markdown([Table(["h", text], [[text, "x"]])])))
        assert cells == [shown("h"), shown(text), shown(text), "x"], text
        details = md.render(render_markdown([Details(text, [])]))
        assert details == f"<p><strong>{shown(text)}</strong></p>\n", text
        figure = md.render(render_markdown([Fig(PlotFigure("n", text, text, b""), "f.png")]))
        assert figure == f'<p><img src="f.png" alt="{shown(text)}" /></p>\n<p><em>{shown(text)}</em></p>\n', text
    assert "\\" not in render_markdown([Table(["effect"], [["rmsnorm − layernorm = -0.0412 [-0.0412, +0.1321]"]])])


def test_report_md_holds_text_not_html_entities(claims_report):
    md = (claims_report.parent / "report.md").read_text()
    assert "Zhang & Sennrich 2019" in md and "the report's statistics" in md
    assert not re.search(r"&(?:amp|lt|gt|quot|#x27|#39);", md), re.findall(r".{30}&[#\w]+;.{10}", md)[:3]


def test_cli_rejects_bad_source_combinations(tmp_path):
    done = subprocess.run([sys.executable, "-m", "analysis.report", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and "nothing to report on" in done.stderr and "Traceback" not in done.stderr
    assert report_main([str(tmp_path), "--offline", "--out", str(tmp_path / "o")]) == 2
    assert re.search(r"--wandb", done.stderr)


def test_odd_records_never_crash_the_report(lr_sweep_dir, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(lr_sweep_dir / "0", root / "ok0")
    shutil.copytree(lr_sweep_dir / "6", root / "ok1")  # pre, 1e-3
    odd = {
        "text_values": [{M.STEP: 0, M.VAL_LOSS: 10.0}, {M.STEP: 5, M.VAL_LOSS: 3.0, "val/loss@2x": "oops",
                        M.layer_metric(0, M.GRAD_NORM_LAYER): [1, 2], M.TRAIN_LOSS: True}],
        "init_only": [{M.STEP: 0, M.VAL_LOSS: 10.0}],
        "empty": [],
        "nan_probes": [{M.STEP: 1, M.layer_metric(0, M.MAX_ATTN_LOGIT): math.nan, M.LOGITS_MAX_ABS: math.inf}],
    }  # fmt: skip
    for i, (name, rows) in enumerate(odd.items()):
        write(root / name, config("pre" if i % 2 else "post", 1e-2, 3 + i), rows, None)
    out = tmp_path / "rep"
    assert report_main([str(root), "--out", str(out), "--workers", "1"]) == 0
    runs = pd.read_parquet(out / "runs.parquet").set_index("run_id")
    assert runs.loc["empty", M.STATUS] == L.STATUS_INCOMPLETE and math.isnan(runs.loc["empty", L.INIT_VAL_LOSS])
    assert runs.loc["text_values", L.INIT_VAL_LOSS] == 10.0 and "val/loss@2x" in runs.columns


# --- a bundle choice (arch, variant, experiment) is the intervention ------------------------------------
def composed_record(overrides: list[str], seed: int) -> dict:
    """The config a run of ``python -m lm_ablate.train <overrides> seed=<seed>`` records (choices included)."""
    from lm_ablate.config import compose

    return OmegaConf.to_container(compose([*overrides, "model=tiny", f"seed={seed}"]), resolve=True)


ARCH_FINALS = {"original": [3.30, 3.42, 3.38], "gpt2": [3.10, 3.05, 3.20], "llama": [2.90, 3.00, 2.96]}


def arch_sweep(root: Path, archs: tuple[str, ...], extra: dict[str, tuple[str, ...]] | None = None) -> Path:
    """``--multirun arch=<archs> [key=values ...] seed=0,1,2`` as Hydra numbers its jobs (last key fastest)."""
    import itertools

    extra = extra or {}
    grid = itertools.product(archs, *extra.values(), range(3))
    for job, (arch, *values, seed) in enumerate(grid):
        overrides = [f"arch={arch}", *(f"{k}={v}" for k, v in zip(extra, values))]
        final = ARCH_FINALS[arch][seed]
        rows = [{M.STEP: 0, M.VAL_LOSS: 5.5}, {M.STEP: STEPS, M.VAL_LOSS: final, M.TRAIN_LOSS: final}]
        record = {**summary("pre", 1e-3, seed, final, M.STATUS_COMPLETED, STEPS), M.RUN_NAME: " ".join(overrides)}
        write(root / str(job), composed_record(overrides, seed), rows, record)
    return root


def test_arch_sweep_is_compared_along_arch(tmp_path):
    """``--multirun arch=original,llama seed=0,1,2``: one section, "arch: llama vs original", which sets the
    keys the presets differ in; choices.arch is neither bookkeeping nor left out of the varied keys."""
    rs = load_runs([arch_sweep(tmp_path / "runs", ("original", "llama"))])
    cs = compare_runs(rs)
    assert [(c.axis.label, c.axis.name) for c in cs.comparisons] == [("arch", "choices.arch")]
    comp = cs.comparisons[0]
    assert comp.arms == ["llama", "original"] and comp.baseline == "original"  # job 0 is original
    sets = set(comp.axis.keys)
    assert {"norm.name", "norm.placement", "position.name", "activation.name", "attention.name"} <= sets
    assert not any(k.startswith("choices.") for k in cs.ignored)  # choices.norm repeats norm.name: not listed
    assert [a.label for a in cs.varied] == ["arch"] and not cs.entangled
    llama = comp.table.set_index("arm").loc["llama"]
    diffs = np.subtract(ARCH_FINALS["llama"], ARCH_FINALS["original"])  # paired by seed, written out here
    assert llama["delta_final_val_loss"] == pytest.approx(diffs.mean())
    half = st.t.ppf(0.975, 2) * diffs.std(ddof=1) / math.sqrt(3)
    assert llama["delta_ci_high"] - llama["delta_ci_low"] == pytest.approx(2 * half)
    # what the reader sees
    out = tmp_path / "rep"
    assert report_main([str(tmp_path / "runs"), "--out", str(out), "--workers", "1"]) == 0
    md = (out / "report.md").read_text()
    assert "## 1. arch: llama vs original" in md and "## 2." not in md
    assert re.search(r"Arms: values of arch \(which also sets [^)]*norm\.name[^)]*\); baseline: original", md)
    assert "Varied: arch = llama, original (changes together with" in md
    assert "- Also differs, bookkeeping rather than an intervention (not compared): seed (0, 1, 2).\n" in md


def test_arch_options_sharing_a_norm_are_still_one_axis(tmp_path):
    """original and gpt2 both use LayerNorm, llama RMSNorm: norm.name splits the runs differently from arch
    but only changes with it, so it is one of the keys arch sets, not an axis compared within arch."""
    cs = compare_runs(load_runs([arch_sweep(tmp_path, ("original", "gpt2", "llama"))]))
    assert [c.axis.label for c in cs.comparisons] == ["arch"] and not cs.entangled
    comp = cs.comparisons[0]
    assert "norm.name" in comp.axis.keys and comp.contexts == ["all runs"]
    assert comp.arms == ["gpt2", "llama", "original"]


def test_arch_crossed_with_a_key_it_does_not_fix(tmp_path):
    """The command line wins over a preset: norm.placement=pre,post varies within each arch, so it stays an
    axis of its own and arch is compared within each placement."""
    cs = compare_runs(load_runs([arch_sweep(tmp_path, ("original", "llama"), {"norm.placement": ("pre", "post")})]))
    by_name = {c.axis.label: c for c in cs.comparisons}
    assert set(by_name) == {"arch", "norm.placement"}
    assert "norm.placement" not in by_name["arch"].axis.keys and "norm.name" in by_name["arch"].axis.keys
    assert by_name["arch"].contexts == ["norm.placement=post", "norm.placement=pre"]
    assert by_name["norm.placement"].contexts == ["arch=llama", "arch=original"]


def test_by_and_baseline_accept_the_group_name(tmp_path):
    rs = load_runs([arch_sweep(tmp_path, ("original", "llama"))])
    by_group = compare_runs(rs, by=["arch"], baseline="arch=llama").comparisons[0]
    by_key = compare_runs(rs, by=["choices.arch"], baseline="choices.arch=llama").comparisons[0]
    for comp in (by_group, by_key):
        assert comp.axis.label == "arch" and comp.axis.name == "choices.arch" and comp.baseline == "llama"
    pd.testing.assert_frame_equal(by_group.table, by_key.table)
    by_norm = compare_runs(rs, by=["norm.name"]).comparisons[0]  # a key arch sets is still a valid --by
    assert by_norm.axis.name == "norm.name" and by_norm.arms == ["layernorm", "rmsnorm"]
    with pytest.raises(L.AnalysisError, match=r"--by archh: unknown config key; keys that vary: arch, "):
        compare_runs(rs, by=["archh"])
    with pytest.raises(L.AnalysisError, match=r"--by variant: does not vary \(every run has null\)"):
        compare_runs(rs, by=["variant"])
    with pytest.raises(L.AnalysisError, match=r"--baseline arch=gpt2: no run has that value; values of arch: "):
        compare_runs(rs, by=["arch"], baseline="arch=gpt2")


def test_variant_bundles_are_one_axis_with_the_keys_they_set(tmp_path):
    """The attention study's list of arms (variant=base,qk_norm,softcap): one axis named variant, compared
    within each attention option, instead of one section per key a variant happens to set."""
    root = tmp_path / "runs"
    for job, (attention, variant, seed) in enumerate(
        (a, v, s) for a in ("mha", "gqa") for v in ("base", "qk_norm", "softcap") for s in range(2)
    ):
        final = 3.0 + 0.1 * seed + (0.05 if variant == "base" else 0.0)
        rows = [{M.STEP: 0, M.VAL_LOSS: 5.5}, {M.STEP: STEPS, M.VAL_LOSS: final}]
        cfg = composed_record([f"attention={attention}", f"variant={variant}"], seed)
        write(root / str(job), cfg, rows, summary("pre", 1e-3, seed, final, M.STATUS_COMPLETED, STEPS))
    cs = compare_runs(load_runs([root]))
    assert [c.axis.label for c in cs.comparisons] == ["attention.name", "variant"]
    variant = cs.comparisons[1]
    assert {"attention.qk_norm", "attention.softcap"} <= set(variant.axis.keys)
    assert variant.baseline == "base" and variant.contexts == ["attention.name=gqa", "attention.name=mha"]
    rows = variant.table.set_index(["context", "arm"])
    assert rows.loc[("attention.name=mha", "qk_norm"), "delta_final_val_loss"] == pytest.approx(-0.05)


def test_bundle_groups_are_the_global_package_groups():
    """The groups whose choice names an axis are the bundles of other groups' keys, not the axis groups."""
    from analysis.compute.compare import bundle_groups

    assert {"arch", "experiment", "variant", "debug"} <= bundle_groups()
    assert not {"model", "norm", "position", "activation", "attention", "optim", "data", "tracking"} & bundle_groups()


def test_a_key_an_older_run_lacks_reads_as_the_schema_default():
    """Runs recorded before the schema gained model.parametrization and ladder.* compare with newer runs at the
    defaults as one arm (they split into "(missing)" and "sp" arms before); an unknown key stays missing."""
    from analysis.sources.load import MISSING_VALUE, _fill_missing_keys

    configs = {
        "old": {"norm.name": "layernorm"},
        "new": {"norm.name": "layernorm", "model.parametrization": "sp", "ladder.name": None, "extra.key": 1,
                "choices.ladder": None},
    }  # fmt: skip
    _fill_missing_keys(configs)
    assert configs["old"]["model.parametrization"] == "sp" and configs["old"]["ladder.name"] is None
    assert configs["old"]["choices.ladder"] is None
    assert configs["old"]["extra.key"] == MISSING_VALUE


def test_keys_an_option_sets_in_its_own_group_belong_to_that_option():
    """optim=adafactor sets optim.eps and optim=sgd optim.momentum: one optim.name axis with those keys, not
    confounded axes of their own; optim.lr, crossed with the optimizer, stays an axis."""
    import pandas as pd

    from analysis.compute.compare import find_axes
    from analysis.sources.load import RunSet

    opts = {"adamw": (1e-8, 0.0), "adafactor": (1e-30, 0.0), "sgd": (1e-8, 0.9)}
    configs = {
        f"{name}-{lr}": {"optim.name": name, "optim.eps": eps, "optim.momentum": mom, "optim.lr": lr, "seed": 0}
        for name, (eps, mom) in opts.items()
        for lr in (1e-3, 1e-2)
    }
    axes, *_ = find_axes(RunSet(pd.DataFrame(index=list(configs)), {}, configs))
    assert {a.name: set(a.keys) for a in axes} == {
        "optim.name": {"optim.name", "optim.eps", "optim.momentum"},
        "optim.lr": {"optim.lr"},
    }
    # a key of another group that happens to follow the optimizer is still its own axis
    for cfg in configs.values():
        cfg["norm.eps"] = 1e-5 if cfg["optim.name"] == "sgd" else 1e-6
    axes, *_ = find_axes(RunSet(pd.DataFrame(index=list(configs)), {}, configs))
    assert {"optim.name", "optim.lr"} <= {a.name for a in axes} and not any(
        "norm.eps" in a.keys and a.name == "optim.name" for a in axes
    )
