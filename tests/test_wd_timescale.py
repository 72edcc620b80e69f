"""Weight decay as a timescale (``optim.wd_timescale``, lm_ablate/optim.py): lambda = 1 / (eta_peak x tau/T x T)
(Wang & Aitchison 2024) with T the run's own step count, in the optimizer's groups and in the run record; both
lambda and tau/T recorded for every run; the bad inputs refused in one line."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, compose, validate
from lm_ablate.train import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
SMOKE = ["debug=smoke", "train.checkpoint_every=0", "train.probe_every=0"]


def trainer(tmp_path, cache_dir, *overrides: str, name: str = "run") -> Trainer:
    cfg = compose([*SMOKE, f"data.cache_dir={cache_dir}", *overrides])
    return Trainer(cfg, tmp_path / name)


def decays(t: Trainer) -> list[tuple[float, float]]:
    """(lr, weight_decay) of every optimizer group that decays."""
    return [(g["lr"], g["weight_decay"]) for g in t.optimizer.param_groups if g["weight_decay"]]


def test_lambda_is_the_formula_written_out_and_is_the_optimizers(tmp_path, cache_dir):
    t = trainer(tmp_path, cache_dir, "optim.lr=3e-3", "train.max_steps=20", "optim.wd_timescale=0.2")
    expected = 1.0 / (3e-3 * 0.2 * 20)  # 1 / (eta_peak x tau/T x T) = 83.33...
    assert t.weight_decay == pytest.approx(expected, rel=1e-12)
    assert decays(t) == [(3e-3, pytest.approx(expected, rel=1e-12))]
    assert any(g["weight_decay"] == 0.0 for g in t.optimizer.param_groups)  # norms, biases, embeddings: never
    assert t.summary[M.WEIGHT_DECAY] == t.weight_decay and t.summary[M.WD_TIMESCALE] == 0.2
    assert t.config["regularization"]["weight_decay"] is None  # the record: derived, not given
    assert t.config["optim"]["wd_timescale"] == 0.2


def test_the_run_length_is_the_schedules_own(tmp_path, cache_dir):
    """T is the step the LR schedule ends at: train.max_tokens (a ladder's budget sets it) shortens it."""
    tokens_per_step = 4 * 32  # debug=smoke's batch 4 x model=tiny's context
    t = trainer(tmp_path, cache_dir, "optim.wd_timescale=0.5", "train.max_steps=200",
                f"train.max_tokens={7 * tokens_per_step + 1}")  # fmt: skip
    assert t.cfg.model.context == 32 and t.horizon == 8
    assert t.weight_decay == pytest.approx(1.0 / (t.cfg.optim.lr * 0.5 * 8), rel=1e-12)


def test_mup_keeps_every_groups_timescale(tmp_path, cache_dir):
    """Under muP the hidden groups' LR is scaled by 1/m and their decay by m: lr x lambda, so tau, is the base's."""
    t = trainer(tmp_path, cache_dir, "model.parametrization=mup", "model.mup_base_width=16", "optim.lr=1e-2",
                "optim.wd_timescale=0.25")  # fmt: skip
    groups = decays(t)
    assert len({lr for lr, _ in groups}) == 2  # the hidden matrices at 1/m the LR: a split that matters
    for lr, wd in groups:
        assert lr * wd == pytest.approx(1.0 / (0.25 * 20), rel=1e-12)


@pytest.mark.parametrize("optim", ["muon", "adafactor"])
def test_every_decoupled_optimizer_takes_it(tmp_path, cache_dir, optim):
    t = trainer(tmp_path, cache_dir, f"optim={optim}", "optim.wd_timescale=0.3", name=optim)
    expected = 1.0 / (t.cfg.optim.lr * 0.3 * 20)
    groups = decays(t)
    assert groups and all(wd == pytest.approx(expected, rel=1e-12) for _, wd in groups)


def test_lambda_given_records_its_timescale_and_zero_is_infinite(tmp_path, cache_dir):
    t = trainer(tmp_path, cache_dir, "optim.lr=2e-3", "regularization.weight_decay=0.05")
    assert t.summary[M.WEIGHT_DECAY] == 0.05
    assert t.summary[M.WD_TIMESCALE] == pytest.approx(1.0 / (2e-3 * 0.05 * 20), rel=1e-12)  # 500 runs
    assert t.config["optim"]["wd_timescale"] is None
    summary = trainer(tmp_path, cache_dir, "regularization.weight_decay=0", name="none").run()
    assert summary[M.WEIGHT_DECAY] == 0.0 and summary[M.WD_TIMESCALE] == math.inf
    text = (tmp_path / "none" / M.SUMMARY_FILE).read_text()
    assert json.loads(text)[M.WD_TIMESCALE] == "Infinity"  # strict JSON (docs/resume.md)
    assert M.from_json(json.loads(text))[M.WD_TIMESCALE] == math.inf


def final_weights(t: Trainer) -> dict[str, torch.Tensor]:
    t.run()
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}


@pytest.mark.slow
def test_the_switch_changes_training_and_the_same_lambda_trains_the_same(tmp_path, cache_dir):
    """tau/T = 0.05 decays hard (lambda = 333): other weights than the default lambda = 0.1. The tau/T that gives
    lambda = 0.1 back trains the same weights as lambda = 0.1 given (to float rounding of lambda)."""
    lr, steps = 3e-3, 20
    given = final_weights(trainer(tmp_path, cache_dir, f"optim.lr={lr}", name="given"))
    strong = final_weights(trainer(tmp_path, cache_dir, f"optim.lr={lr}", "optim.wd_timescale=0.05", name="strong"))
    same_tau = 1.0 / (lr * 0.1 * steps)
    same = final_weights(trainer(tmp_path, cache_dir, f"optim.lr={lr}", f"optim.wd_timescale={same_tau!r}", name="s"))
    hidden = "blocks.0.attn.qkv.weight"
    assert (given[hidden] - strong[hidden]).abs().max() > 1e-3
    assert strong[hidden].norm() < given[hidden].norm()  # the stronger decay shrinks the matrices
    for name in given:
        torch.testing.assert_close(same[name], given[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["optim.wd_timescale=0.2", "regularization.weight_decay=0.05"], "regularization.weight_decay=0.05 is set too"),
        (["optim.wd_timescale=0.2", "regularization.weight_decay=0.1"], "is set too"),  # explicit, though the default
        (["optim.wd_timescale=0"], "must be > 0"),
        (["optim.wd_timescale=-0.1"], "must be > 0"),
        (["optim=sgd", "optim.wd_timescale=0.2"], "sgd has no wd_timescale (adafactor, adamw, muon)"),
        (["regularization=none", "optim.wd_timescale=0.2"], "regularization=none has no weight decay"),
        (["ladder=cpu", "ladder.rung=0", "ladder.budgets=[0.5,1]", "optim.schedule=wsd", "optim.wd_timescale=0.2"],
         "tau/T gives each budget its own lambda"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(overrides, says):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides))
    message = str(err.value)
    assert message.startswith("optim.wd_timescale=") and says in message and "\n" not in message


def test_a_file_that_sets_lambda_counts_as_set():
    """An experiment or preset that sets lambda (a value other than the regularization option's own) and a
    timescale on the command line: refused, as on the command line."""
    from lm_ablate.options import settle

    cfg = compose(["optim.wd_timescale=0.2"])
    cfg.regularization.weight_decay = 0.3  # as a file would have set it before the overrides' timescale
    with pytest.raises(ConfigError, match=r"regularization.weight_decay=0.3 is set too"):
        settle(cfg)
    ok = compose(["optim.wd_timescale=inf"])  # tau/T = inf: no decay
    validate(ok)
    assert ok.regularization.weight_decay is None
