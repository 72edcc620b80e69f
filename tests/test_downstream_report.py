"""Downstream scores in the analysis (issue 25.5): the runs table reads every downstream/<task>/<kind> of a run's
summary, the comparison tables show them like final val loss (mean ± 95% CI over seeds, Δ vs baseline with its
paired or Welch interval), claims decide on them (``metric: downstream`` with ``task`` and ``kind``), and a run
set without them reports exactly as before. Also: a key an option leaves unread (null) is that option's own, not
a key that changes together with the axis (compare.find_axes).

Expected numbers are written out with scipy (``ttest_rel``'s interval, ``t.interval`` of the mean) on the runs
the rule says to compare; every claim verdict is shown to flip when the data flip.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from scipy import stats as st

from analysis.compute.claims import CONTRADICTED, HELD, INCONCLUSIVE, WHY_STALLED, evaluate_claims
from analysis.compute.compare import compare_runs, find_axes
from analysis.present.document import render_markdown
from analysis.present.sections.summary import summary_blocks
from analysis.sources.load import RunRecord, assemble, load_runs
from lm_ablate import metrics as M
from lm_ablate.claim_spec import check_claims_against_arms, parse_claims
from lm_ablate.config import ConfigError, compose
from tests.test_claims import BASE, claim, flat_arms, run_config, runset, write_run

ROOT = Path(__file__).resolve().parents[1]
TASK = "shakespeare_order"
ACC, NORM, BPB = (M.downstream(TASK, kind) for kind in ("acc", "acc_norm", "bpb"))
# per seed 0, 1, 2: post-norm scores lower word-order accuracy and more bits per byte than pre-norm
SCORES = {
    "pre": {M.FINAL_VAL_LOSS: [2.50, 2.55, 2.60], ACC: [0.70, 0.74, 0.72], BPB: [2.10, 2.05, 2.12]},
    "post": {M.FINAL_VAL_LOSS: [2.45, 2.62, 2.66], ACC: [0.40, 0.47, 0.42], BPB: [2.60, 2.55, 2.70]},
}
CLAIMS = [
    {"id": "post_worse_order_acc", "source": "Xiong et al. 2020", "statement": "Post-LN scores lower.",
     "axis": "norm.placement", "arm": "post", "baseline": "pre", "metric": "downstream", "task": TASK,
     "kind": "acc", "expect": "lower"},
]  # fmt: skip


def downstream_claim(**kw: object) -> object:
    return claim(metric="downstream", task=TASK, kind="acc", **kw)


def scored(scores: dict[str, dict[str, list[float]]], keys: tuple[str, ...] = (ACC, BPB)) -> object:
    """A runset (tests/test_claims.py) of pre and post x 3 seeds with the given per-seed summary values."""
    specs = [((arm,), s, {k: scores[arm][k][s] for k in (M.FINAL_VAL_LOSS, *keys)}) for arm in ("pre", "post")
             for s in range(3)]  # fmt: skip
    return runset(specs)


def write_sweep(root: Path, with_scores: bool) -> Path:
    """Run folders as the loop writes them: pre and post x 3 seeds, acc_norm equal to acc (as in the order task)."""
    job = 0
    for arm, values in SCORES.items():
        for seed in range(3):
            cfg = run_config(arm, seed)
            cfg["claims"] = CLAIMS
            final = values[M.FINAL_VAL_LOSS][seed]
            summary = {M.STATUS: M.STATUS_COMPLETED, M.SEED: seed, M.FINAL_VAL_LOSS: final, M.BEST_VAL_LOSS: final,
                       M.MEAN_TOKENS_PER_SEC: 1000.0, M.STEPS: 100, M.GRAD_NORM_SPIKES: 0, M.LOSS_SPIKES: 0,
                       M.VOCAB_SIZE: 256}  # fmt: skip
            if with_scores:
                summary |= {ACC: values[ACC][seed], NORM: values[ACC][seed], BPB: values[BPB][seed]}
                summary |= {M.DOWNSTREAM_EVALS: 1, M.DOWNSTREAM_EXAMPLES: {TASK: 500}}
            write_run(root / str(job), cfg, summary, [(0, 5.5), (50, final + 0.2), (100, final)], 1000.0)
            job += 1
    return root


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[bool, Path]:
    """The report of the sweep with downstream scores (True) and of the same sweep without them (False)."""
    from analysis.report import build_report

    out = {}
    for with_scores in (True, False):
        runs = write_sweep(tmp_path_factory.mktemp(f"runs_{with_scores}"), with_scores)
        out[with_scores] = build_report([runs], tmp_path_factory.mktemp(f"report_{with_scores}"), workers=1).parent
    return out


# --- the runs table and the comparison row ---------------------------------------------------------------
def test_the_runs_table_reads_every_downstream_score_of_the_summary(tmp_path):
    rs = load_runs(write_sweep(tmp_path, with_scores=True))
    for key in (ACC, NORM, BPB):
        assert rs.runs[key].dtype == float
    post = rs.runs[rs.runs[M.SEED] == 1].set_index("norm.placement")
    assert (post.loc["post", ACC], post.loc["pre", BPB]) == (0.47, 2.05)
    assert M.DOWNSTREAM_EVALS not in rs.runs and M.DOWNSTREAM_EXAMPLES not in rs.runs  # scores only
    # the W&B source reads the same summary keys (what analysis.sources.wandb_api cached)
    from analysis.sources.wandb_api import records_from_cache

    summaries = [{M.STATUS: M.STATUS_COMPLETED, M.FINAL_VAL_LOSS: 2.5, ACC: 0.6, BPB: 2.2}, {M.FINAL_VAL_LOSS: 2.6}]
    table = pd.DataFrame([{"run_id": f"w{i}", "name": f"w{i}", "group": "g", "state": "finished", "url": "",
                           "version": "", "config_json": json.dumps({"seed": i}), "summary_json": json.dumps(summary)}
                          for i, summary in enumerate(summaries)])  # fmt: skip
    wandb = assemble(records_from_cache(tmp_path, table, "e", "p", None, None)).runs.set_index("run_id")
    assert wandb.loc["w0", ACC] == 0.6 and wandb.loc["w0", BPB] == 2.2 and math.isnan(wandb.loc["w1", ACC])
    # a run without a score (eval=none) reads NaN there
    both = runset([(("pre",), 0, {ACC: 0.5}), (("post",), 0, {})]).runs.set_index("run_id")[ACC]
    assert both["0"] == 0.5 and math.isnan(both["1"])


def test_the_comparison_row_is_the_mean_and_paired_t_interval_over_seeds():
    (comp,) = compare_runs(scored(SCORES)).comparisons
    assert comp.scores == [ACC, BPB]
    post = comp.table.set_index("arm").loc["post"]
    for key in (ACC, BPB):
        x, base = np.array(SCORES["post"][key]), np.array(SCORES["pre"][key])
        low, high = st.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=st.sem(x))
        assert (post[f"{key}_mean"], post[f"{key}_ci_low"], post[f"{key}_ci_high"]) == pytest.approx(
            (x.mean(), low, high)
        )
        paired = st.ttest_rel(x, base)
        ci = paired.confidence_interval(0.95)
        delta = (x - base).mean()
        got = [post[f"delta_{key}{s}"] for s in ("", "_ci_low", "_ci_high", "_p_value")]
        assert got == pytest.approx([delta, ci.low, ci.high, paired.pvalue])
        assert (post[f"delta_{key}_test"], post[f"delta_{key}_n_pairs"]) == ("paired", 3)
    base_row = comp.table.set_index("arm").loc["pre"]
    assert math.isnan(base_row[f"delta_{ACC}"]) and base_row[f"delta_{ACC}_test"] == ""


def test_a_seed_without_the_score_leaves_the_pairs_it_has():
    """The test rule is final val loss's: paired over the seeds both arms have a score for (two here), the
    table naming the test where it is not the row's own."""
    scores = {arm: {k: list(v) for k, v in values.items()} for arm, values in SCORES.items()}
    scores["post"][ACC][2] = math.nan
    (comp,) = compare_runs(scored(scores)).comparisons
    post = comp.table.set_index("arm").loc["post"]
    ci = st.ttest_rel([0.40, 0.47], [0.70, 0.74]).confidence_interval(0.95)
    assert (post[f"delta_{ACC}_ci_low"], post[f"delta_{ACC}_ci_high"]) == pytest.approx((ci.low, ci.high))
    assert (post["test"], post["n_pairs"], post[f"delta_{ACC}_n_pairs"]) == ("paired", 3, 2)
    from analysis.present.sections.comparisons import score_delta_text

    assert score_delta_text(post, ACC).endswith(" (paired t (2 seeds))")
    assert not score_delta_text(post, BPB).endswith(")")  # the row's own test: not repeated


# --- claims ----------------------------------------------------------------------------------------------
def test_a_downstream_claim_is_decided_like_final_val_loss_and_follows_the_data():
    (res,) = evaluate_claims(scored(SCORES), [downstream_claim(expect="lower")]).results
    ci = st.ttest_rel(SCORES["post"][ACC], SCORES["pre"][ACC]).confidence_interval(0.95)
    assert (res.effect.low95, res.effect.high95) == pytest.approx((ci.low, ci.high))
    assert res.verdict == HELD and res.effect.test == "paired" and res.effect.n_pairs == 3
    flipped = {"pre": SCORES["post"], "post": SCORES["pre"]}
    assert evaluate_claims(scored(flipped), [downstream_claim(expect="lower")]).results[0].verdict == CONTRADICTED
    # bpb: post spends more bits per byte; the claim's expect says the direction
    bpb = claim(metric="downstream", task=TASK, kind="bpb", expect="higher")
    assert evaluate_claims(scored(SCORES), [bpb]).results[0].verdict == HELD
    assert evaluate_claims(scored(flipped), [bpb]).results[0].verdict == CONTRADICTED
    # a run set without the score: untested, for want of values
    (none,) = evaluate_claims(scored(SCORES, keys=()), [downstream_claim()]).results
    assert (none.verdict, none.why) == ("untested", "no_arm_values")


def test_a_downstream_claim_takes_each_side_at_its_best_lr_and_stalls_make_it_inconclusive():
    """The fair-verdict machinery, unchanged: the LR varies and the claim does not pin it, so each side is taken
    at the LR of its lowest mean final val loss (post 1e-2, pre 1e-3), paired by seed there; stalled seeds there
    make it inconclusive."""
    loss = {"post": {1e-3: 2.9, 1e-2: 2.5}, "pre": {1e-3: 2.4, 1e-2: 2.8}}
    acc = {("post", 1e-3): [0.80, 0.82, 0.81], ("post", 1e-2): [0.50, 0.55, 0.52],
           ("pre", 1e-3): [0.70, 0.74, 0.72], ("pre", 1e-2): [0.90, 0.92, 0.91]}  # fmt: skip

    def grid(stalled: bool) -> object:
        flags = {M.STALLED: True, M.STALL_REASON: "unigram"} if stalled else {}
        specs = [((arm, lr), s, {M.FINAL_VAL_LOSS: loss[arm][lr] + 0.01 * s, ACC: acc[arm, lr][s],
                                 **(flags if (arm, lr) == ("post", 1e-2) and s == 0 else {})})
                 for arm in ("post", "pre") for lr in (1e-3, 1e-2) for s in range(3)]  # fmt: skip
        return runset(specs, ("optim.lr",))

    (res,) = evaluate_claims(grid(stalled=False), [downstream_claim(expect="lower")]).results
    ci = st.ttest_rel(acc["post", 1e-2], acc["pre", 1e-3]).confidence_interval(0.95)
    assert (res.arm_lr.lr, res.baseline_lr.lr) == (1e-2, 1e-3)
    assert (res.effect.low95, res.effect.high95) == pytest.approx((ci.low, ci.high))
    assert res.verdict == HELD  # at a shared LR post would score higher at 1e-3 and lower at 1e-2
    (stalled,) = evaluate_claims(grid(stalled=True), [downstream_claim(expect="lower")]).results
    assert (stalled.verdict, stalled.why, stalled.arm_stalled) == (INCONCLUSIVE, WHY_STALLED, (1, 3))


def test_a_claim_that_counts_failures_says_why_its_stalled_seeds_are_data():
    """Issue 46.14: a downstream claim with counts_failures held on stalled seeds ("held (3 of 3 seeds of post
    stalled)") beside rules that named only capped val loss and LR sensitivity. The rules now list, from the claim
    spec, every metric whose stalled runs are data and the claims of this study that count them, and the row says
    which made the stalled seeds data."""
    from analysis.present.sections.claims import answer_table, claims_blocks, reason_text, stall_rule
    from lm_ablate.claim_spec import METRICS

    stalled = {M.STALLED: True, M.STALL_REASON: "unigram"}
    specs = [(("pre",), s, {M.FINAL_VAL_LOSS: 2.5 + 0.01 * s, ACC: 0.70 + 0.02 * s}) for s in range(3)]
    specs += [(("post",), s, {M.FINAL_VAL_LOSS: 3.30, ACC: 0.25 + 0.01 * s, **stalled}) for s in range(3)]
    counts = downstream_claim(expect="lower", counts_failures=True)
    plain = claim(id="acc_plain", metric="downstream", task=TASK, kind="acc", expect="lower")
    claims = evaluate_claims(runset(specs), [counts, plain])
    held, withheld = claims.results
    assert (held.verdict, withheld.verdict) == (HELD, INCONCLUSIVE) and held.arm_stalled == (3, 3)
    assert reason_text(held) == "3 of 3 seeds of post stalled (data: the claim counts failures)"
    rule = stall_rule(claims)
    for name, spec in METRICS.items():  # every metric the spec says counts stalled runs, and no other
        assert (f"{name}," in rule or f"{name})" in rule) == (spec.failures or spec.at_init), name
    assert rule.endswith(f"; here {counts.id} ({ACC}).")  # the claim that counts them here; the plain one is not
    md = render_markdown(claims_blocks(claims))
    assert rule in md and "counts_failures: true" in md
    assert [row[0] for row in answer_table(claims).rows] == ["held", "inconclusive"]


@pytest.mark.parametrize(
    "change, line",
    [
        ({"kind": "accuracy"}, "claims[x].kind='accuracy' is invalid: allowed kinds: acc, acc_norm, bpb"),
        ({"task": None}, "claims[x].task=None is invalid: metric downstream needs a task (a name of eval.tasks, "
                         "e.g. task: shakespeare_order)"),
        ({"kind": None}, "claims[x].kind=None is invalid: metric downstream needs a kind (allowed kinds: acc, "
                         "acc_norm, bpb)"),
        ({"task": "a b"}, "claims[x].task='a b' is invalid: must be a task name of eval.tasks (letters, digits, "
                          "'_', '-', '.')"),
        ({"metric": "final_val_loss"}, "claims[x].task='shakespeare_order' is invalid: only metric downstream "
                                       "takes a task"),
    ],
)  # fmt: skip
def test_a_bad_downstream_claim_is_one_line(change, line):
    good = {**BASE, "metric": "downstream", "task": TASK, "kind": "acc"}
    assert parse_claims([good])[0].metric_name == ACC
    raw = {k: v for k, v in {**good, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        parse_claims([raw])
    assert str(err.value) == line


def test_a_sweep_that_does_not_evaluate_the_task_is_refused():
    claims = parse_claims([{**BASE, "metric": "downstream", "task": TASK, "kind": "acc"}])
    arms = flat_arms(["pre", "post"], [1e-3])
    with pytest.raises(ConfigError) as err:
        check_claims_against_arms(claims, arms)
    assert str(err.value) == (
        "claims[x].task='shakespeare_order' is invalid: no arm of this sweep evaluates it; eval.tasks: none"
    )
    check_claims_against_arms(claims, [a | {"eval.tasks": [{"name": TASK, "format": TASK}]} for a in arms])


# --- the report ------------------------------------------------------------------------------------------
def _table_header(md: str, start: str = "| context | arm |") -> list[str]:
    line = next(row for row in md.splitlines() if row.startswith(start))
    return [cell.strip() for cell in line.strip("|").split("|")]


def _table_rows(md: str, start: str = "| context | arm |", key: tuple[str, ...] = ("arm",)) -> dict:
    """The first table of report.md whose header starts with ``start``: the cells of ``key`` -> {header: cell}."""
    lines = md.splitlines()
    at = next(i for i, row in enumerate(lines) if row.startswith(start))
    header = _table_header(md, start)
    rows = {}
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        rows[cells[key[0]] if len(key) == 1 else tuple(cells[k] for k in key)] = cells
    return rows


SCORES_TABLE = "| context | arm | score |"


def test_the_report_shows_the_scores_beside_final_val_loss(reports):
    """The scores are a table of their own below the comparison's, a row per (arm, score) (issue 46.11: a column
    pair per score ran the comparison table off the page)."""
    md = (reports[True] / "report.md").read_text()
    assert _table_header(md) == ["context", "arm", "runs", "final val loss (mean ± 95% CI)", "Δ vs baseline [95% CI]",
                                 "p", "test"]  # fmt: skip
    assert _table_header(md, SCORES_TABLE) == ["context", "arm", "score", "mean ± 95% CI", "Δ vs baseline [95% CI]"]
    rows = _table_rows(md, SCORES_TABLE, key=("arm", "score"))
    assert {score for _, score in rows} == {f"{TASK} acc", f"{TASK} bpb"}  # acc_norm equal to acc: left out, said
    assert f"Not shown, equal to acc in every row (comparisons.csv has them): {TASK} acc_norm." in md
    assert md.index("| context | arm | runs |") < md.index(SCORES_TABLE)
    for key, label in ((ACC, "acc"), (BPB, "bpb")):
        d = np.subtract(SCORES["post"][key], SCORES["pre"][key])
        ci = st.ttest_rel(SCORES["post"][key], SCORES["pre"][key]).confidence_interval(0.95)
        assert rows[("post", f"{TASK} {label}")]["Δ vs baseline [95% CI]"] == (
            f"{d.mean():+.4f} [{ci.low:+.4f}, {ci.high:+.4f}]"
        )
        assert rows[("pre (baseline)", f"{TASK} {label}")]["Δ vs baseline [95% CI]"] == "baseline"
        half = st.t.ppf(0.975, 2) * st.sem(SCORES["pre"][key])
        assert rows[("pre (baseline)", f"{TASK} {label}")]["mean ± 95% CI"] == (
            f"{np.mean(SCORES['pre'][key]):.4f} ± {half:.4f}"
        )
    comparisons = pd.read_csv(reports[True] / "comparisons.csv", keep_default_na=False)
    for key in (ACC, NORM, BPB):
        assert {f"{key}_mean", f"{key}_ci_low", f"{key}_ci_high", f"delta_{key}", f"delta_{key}_test"} <= set(
            comparisons.columns
        )
    assert "post_worse_order_acc:held" in set(comparisons["claim_verdicts"].str.split(" ").explode())
    runs = pd.read_csv(reports[True] / "runs.csv")
    assert {ACC, NORM, BPB} <= set(runs.columns)
    claims = pd.read_csv(reports[True] / "claims.csv").set_index("claim_id")
    assert (claims.loc["post_worse_order_acc", "metric"], claims.loc["post_worse_order_acc", "verdict"]) == (
        ACC,
        "held",
    )
    assert f"{TASK} acc: post lower than pre" in md


def test_a_run_set_without_scores_has_none_of_the_columns(reports):
    md = (reports[False] / "report.md").read_text()
    assert "Downstream scores" not in md and SCORES_TABLE not in md
    for table in ("comparisons.csv", "runs.csv"):
        columns = pd.read_csv(reports[False] / table).columns
        assert not [c for c in columns if "downstream/" in c], table
    claims = pd.read_csv(reports[False] / "claims.csv").set_index("claim_id")
    assert claims.loc["post_worse_order_acc", "verdict"] == "untested"


# --- end to end ------------------------------------------------------------------------------------------
def test_training_with_eval_quick_then_the_report_shows_the_scores(tmp_path, cache_dir):
    """Two seeds of pre- and post-norm with eval=quick (8 items; model.context=64: model=tiny's 32 tokens do not
    hold an item), then ``python -m analysis.report`` (its main, in this process)."""
    runs = tmp_path / "runs"
    train = subprocess.run(
        [sys.executable, "-m", "lm_ablate.train", "--multirun", "model=tiny", "model.context=64",
         "train.max_steps=2", "train.eval_every=1", "train.eval_batches=1", "train.threads=1", "tracking=none",
         "eval=quick", "eval.max_examples=8", f"data.cache_dir={cache_dir}", "norm.placement=pre,post", "seed=0,1",
         f"hydra.sweep.dir={runs}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-2000:]
    from analysis.report import main as report_main  # python -m analysis.report, without a second interpreter

    assert report_main([str(runs), "--out", str(tmp_path / "report"), "--workers", "1"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    rows = _table_rows(md, SCORES_TABLE, key=("arm", "score"))
    for score in (f"{TASK} acc", f"{TASK} bpb"):
        post = rows[("post", score)]
        assert post["mean ± 95% CI"] not in ("", "–") and post["Δ vs baseline [95% CI]"] not in ("", "–"), post
    rows = pd.read_csv(tmp_path / "report" / "comparisons.csv")
    assert (rows[f"{ACC}_n"] == 2).all() and rows[f"{ACC}_mean"].between(0, 1).all()
    assert (rows[f"{BPB}_mean"] > 0).all()


# --- keys an option leaves unread ------------------------------------------------------------------------
def test_keys_an_option_leaves_unread_are_its_own_not_an_axis_that_changes_with_it():
    """norm=layernorm,rmsnorm: norm.bias is null under rmsnorm (unread) and true under layernorm, norm.unit_offset
    the other way round; they are the options' own keys. A key both options read with different values
    (norm.eps here) still changes together with the axis."""
    from analysis.sources.load import SUMMARY_KEYS, flatten

    @functools.cache
    def composed(norm: str, *more: str) -> dict:
        cfg = OmegaConf.to_container(compose([f"norm={norm}", *more]), resolve=True)
        return flatten({k: v for k, v in cfg.items() if k != "hydra"})

    def record(i: int, norm: str, *more: str) -> RunRecord:
        values = dict.fromkeys(SUMMARY_KEYS, math.nan) | {M.SEED: i % 2}
        cfg = composed(norm, *more) | {M.SEED: i % 2}
        return RunRecord(str(i), f"/r/{i}", str(i), M.STATUS_COMPLETED, values, cfg, pd.DataFrame(), {})

    rs = assemble([record(i, norm) for i, norm in enumerate(["layernorm", "layernorm", "rmsnorm", "rmsnorm"])])
    assert {rs.configs["0"]["norm.bias"], rs.configs["2"]["norm.bias"]} == {True, None}
    (axis,), _, _, _ = find_axes(rs)
    assert (axis.name, axis.keys, axis.own) == ("norm.name", ("norm.name",), ("norm.bias", "norm.unit_offset"))
    cs = compare_runs(rs)
    text = render_markdown(summary_blocks(rs, cs))
    assert "Varied: norm.name = layernorm, rmsnorm (its options' own keys, null where unread: norm.bias, " in text
    assert "changes together" not in text
    # read by both, different values: a setting that changes with the option
    rs = assemble([record(0, "layernorm"), record(1, "layernorm"), record(2, "rmsnorm", "norm.eps=1e-6"),
                   record(3, "rmsnorm", "norm.eps=1e-6")])  # fmt: skip
    (axis,), _, _, _ = find_axes(rs)
    assert axis.keys == ("norm.name", "norm.eps") and axis.own == ("norm.bias", "norm.unit_offset")
    # an own key that varies among the runs that read it (bias true and false under layernorm) is an axis
    rs = assemble([record(0, "layernorm"), record(1, "layernorm", "norm.bias=false"), record(2, "rmsnorm"),
                   record(3, "rmsnorm")])  # fmt: skip
    assert "norm.bias" in {k for a in find_axes(rs)[0] for k in a.keys}
