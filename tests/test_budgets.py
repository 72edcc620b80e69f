"""WSD-S budgets (lm_ablate/budgets.py): one run per rung trains the largest budget and branches a decay at each
smaller one; each branch is its own record, equal number for number to a run of that budget alone, resumable
from any interruption to the same records, never changed once finished; bad budgets are one line."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
import yaml

from lm_ablate import budgets as B
from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, compose
from lm_ablate.ladder import apply_rung, check_ladder
from lm_ablate.train import Interrupted, Trainer, train

pytestmark = pytest.mark.usefixtures("one_thread")
RUNGS = "ladder.rungs=[{d_model:16,n_layers:1,n_heads:2},{d_model:24,n_layers:1,n_heads:2},{d_model:32,n_layers:2,n_heads:2}]"
BASE = ["ladder=cpu", RUNGS, "ladder.rung=2", "ladder.tokens_per_param=0.5", "model.context=32", "train.batch_size=8",
        "tracking=none", "train.progress=false", "train.eval_batches=2", "train.eval_every=1000",
        "optim.schedule=wsd", "optim.warmup_steps=2", "train.checkpoint_every=7"]  # fmt: skip
BUDGETS = "ladder.budgets=[0.25,0.5,1]"
SAME = (M.TRAIN_LOSS, M.LR, M.GRAD_NORM, M.VAL_LOSS, M.TOKENS)  # per-step values that must agree exactly


def cfg_of(cache_dir: str, *extra: str):
    return compose([*BASE, f"data.cache_dir={cache_dir}", *extra])


def rows(run: Path) -> list[dict]:
    return [{k: r.get(k) for k in (M.STEP, *SAME)} for r in map(json.loads, (run / M.METRICS_FILE).open())]


def record(run: Path) -> tuple:
    """What a run computed: config, every step's numbers, final losses (not timings)."""
    s = json.loads((run / M.SUMMARY_FILE).read_text())
    kept = (M.STATUS, M.STEPS, M.TOTAL_TOKENS, M.FINAL_VAL_LOSS, M.BEST_VAL_LOSS, M.FINAL_TRAIN_LOSS)
    return yaml.safe_load((run / M.CONFIG_FILE).read_text()), rows(run), {k: s[k] for k in kept}


@pytest.fixture(scope="module")
def branched(tmp_path_factory, cache_dir) -> Path:
    root = tmp_path_factory.mktemp("branched")
    train(cfg_of(cache_dir, BUDGETS), root / "run", "run")
    return root


def test_each_branch_is_the_run_of_its_budget_alone(branched, tmp_path, cache_dir):
    parent = branched / "run"
    assert sorted(p.name for p in branched.iterdir()) == ["run", "run.budget=0.25", "run.budget=0.5"]
    n = json.loads((parent / M.SUMMARY_FILE).read_text())[M.PARAMS_NON_EMBEDDING]
    for b in (0.25, 0.5):
        branch = B.branch_dir(parent, b)
        alone = tmp_path / f"alone{b}"
        train(cfg_of(cache_dir, BUDGETS, f"ladder.budget={b}"), alone)
        assert record(branch) == record(alone)  # the same config, every step's numbers, the same final loss
        cfg, steps, final = record(branch)
        tokens = math.ceil(0.5 * b * n)
        assert cfg["ladder"]["budget"] == b and cfg["train"]["max_tokens"] == tokens
        s = math.ceil(tokens / (8 * 32))
        assert final[M.STEPS] == s and [r[M.STEP] for r in steps][-1] == s
        summary = json.loads((branch / M.SUMMARY_FILE).read_text())
        start = s - max(1, round(0.2 * s))
        assert summary[B.BRANCH_OF] == str(parent) and summary[B.BRANCH_STEP] == start
        assert summary[M.RESUMED_FROM] == [start]
        assert steps[-1][M.LR] == pytest.approx(3e-3 * 0.1)  # decayed to min_lr_ratio at its own end
        # the shared steps are the parent's, the branch's own ones are not
        shared = {r[M.STEP]: r for r in rows(parent) if r[M.STEP] <= start}
        assert all(r == shared[r[M.STEP]] for r in steps if r[M.STEP] <= start)
        assert steps[-1][M.LR] != next(r for r in rows(parent) if r[M.STEP] == s)[M.LR]
    # the parent is the run of the largest budget, unchanged by its branches
    plain = tmp_path / "plain"
    train(cfg_of(cache_dir), plain)
    assert record(parent)[1:] == record(plain)[1:]


def test_interrupted_parent_or_branch_resumes_to_the_same_records(branched, tmp_path, cache_dir, monkeypatch):
    """Ctrl-C after a branch point, inside a branch, and between a branch point's checkpoint and its branch's
    start: the same command continues each time, and the records are those of the uninterrupted run."""
    expected = {p.name: record(p) for p in branched.iterdir()}
    n = json.loads((branched / "run" / M.SUMMARY_FILE).read_text())[M.PARAMS_NON_EMBEDDING]
    small, middle = B.plan(cfg_of(cache_dir, BUDGETS), n)
    assert 2 < small.start < middle.start < middle.steps
    step_of = Trainer.train_step

    def interrupt_at(budget: float | None, at: int):
        def step(self, s, probe):
            row = step_of(self, s, probe)
            if self.cfg.ladder.budget == budget and s == at:
                signal.raise_signal(signal.SIGINT)  # the loop checkpoints this step and stops
            return row

        return step

    run = tmp_path / "run"
    for budget, at in ((None, middle.start + 1), (0.5, middle.start + 2)):
        monkeypatch.setattr(Trainer, "train_step", interrupt_at(budget, at))
        with pytest.raises(Interrupted):
            train(cfg_of(cache_dir, BUDGETS), run, "run")
    monkeypatch.setattr(Trainer, "train_step", step_of)
    train(cfg_of(cache_dir, BUDGETS), run, "run")
    assert {p.name: record(p) for p in tmp_path.iterdir()} == expected

    # killed between the parent's checkpoint at a branch point and that branch's start
    fork_of, killed = B.Forks.fork, []

    def killed_once(self, step):
        if step == middle.start and not killed:
            killed.append(step)
            raise KeyboardInterrupt
        return fork_of(self, step)

    monkeypatch.setattr(B.Forks, "fork", killed_once)
    again = tmp_path / "again"
    with pytest.raises(Interrupted):
        train(cfg_of(cache_dir, BUDGETS), again / "run", "run")
    assert killed and not B.started(B.branch_dir(again / "run", 0.5))
    train(cfg_of(cache_dir, BUDGETS), again / "run", "run")
    assert {p.name: record(p) for p in again.iterdir()} == expected


def test_a_finished_branch_is_never_changed(branched, cache_dir):
    before = {p: p.read_bytes() for p in branched.rglob("*") if p.is_file()}
    train(cfg_of(cache_dir, BUDGETS), branched / "run", "run")
    assert {p: p.read_bytes() for p in branched.rglob("*") if p.is_file()} == before


def test_a_branch_start_of_another_config_is_refused(branched, tmp_path, cache_dir):
    """A decay branch whose stable phase is not its parent's (here: another peak LR) does not resume."""
    import shutil

    from lm_ablate import checkpoint as ckpt

    branch = tmp_path / "run.budget=0.5"
    shutil.copytree(B.branch_dir(branched / "run", 0.5) / "checkpoints", branch / "checkpoints")
    (path,) = ckpt.list_checkpoints(branch)
    state = ckpt.load(path)
    state["config"]["optim"]["lr"] = 1e-3
    ckpt.save(branch, state.pop("step"), {k: v for k, v in state.items() if k != "format"}, keep=1)
    with pytest.raises(ConfigError) as err:
        Trainer(B.branch_config(cfg_of(cache_dir, BUDGETS), 0.5), branch)
    assert "checkpoint is of another config" in str(err.value) and "optim.lr" in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "starts", "words"),
    [
        (["ladder.budgets=[1,0.5]"], "ladder.budgets=", "increase strictly"),
        (["ladder.budgets=[0.5,0.5]"], "ladder.budgets=", "increase strictly"),
        (["ladder.budgets=[0,1]"], "ladder.budgets=", "positive"),
        (["ladder.budgets=[0.5,1]", "ladder.budget=0.3"], "ladder.budget=", "one of ladder.budgets"),
        (["ladder.budgets=[0.5,1]", "optim.schedule=cosine"], "optim.schedule=", "allowed: wsd"),
        (["ladder.budgets=[0.1,1]", "optim.warmup_steps=10"], "ladder.budgets=", "inside the warm-up"),
        (["ladder.budgets=[0.999,1]"], "ladder.budgets=", "the same"),
        (["ladder.params=all"], "ladder.params=", "non_embedding, total"),
        (["ladder.fit=best"], "ladder.fit=", "shared_e"),
        (["ladder.budgets=[0.5,1]", "ladder.fit_budgets=[2]"], "ladder.fit_budgets=", "subset of ladder.budgets"),
        (["ladder.budgets=[0.5,1]", "ladder.fit_budgets=[]"], "ladder.fit_budgets=", "non-empty subset"),
        (["ladder.fit_budgets=[0.5]"], "ladder.fit_budgets=", "ladder.budgets [1.0]"),
        (["ladder.tune=[optim.lr]"], "ladder.tune=", "model.mup_output_mult, model.mup_attn_mult"),
        (["ladder.tune=[model.d_model]"], "ladder.tune=", "the LR is ladder.lr's"),
        (["ladder.tune=[model.init_std,model.init_std]"], "ladder.tune=", "distinct keys"),
    ],
)
def test_bad_budgets_fail_in_one_line_naming_the_key(overrides, starts, words):
    with pytest.raises(ConfigError) as err:
        cfg = compose([*BASE, *overrides])
        apply_rung(cfg)
        check_ladder(cfg, 256)
    text = str(err.value)
    assert text.startswith(starts) and words in text and "\n" not in text, text


def test_a_stable_phase_that_differs_is_refused_by_the_plan(cache_dir):
    """The plan compares the two LR schedules step by step: a schedule whose early steps depend on the horizon
    (cosine) cannot branch, whatever validation said."""
    cfg = cfg_of(cache_dir, BUDGETS)
    cfg.optim.schedule = "cosine"
    with pytest.raises(ConfigError) as err:
        B.plan(cfg, 20_000)
    assert str(err.value).startswith("optim.schedule='cosine' is invalid") and "differs" in str(err.value)


def test_total_params_set_the_budget(cache_dir, tmp_path):
    """ladder.params=total: the budget is a multiple of every parameter, embeddings included."""
    summary = train(cfg_of(cache_dir, "ladder.params=total"), tmp_path / "run")
    recorded = yaml.safe_load((tmp_path / "run" / M.CONFIG_FILE).read_text())
    assert recorded["train"]["max_tokens"] == math.ceil(0.5 * summary[M.PARAMS_TOTAL])
    assert summary[M.PARAMS_TOTAL] > summary[M.PARAMS_NON_EMBEDDING]
