"""What a run prints while it trains and when it ends (issue 46, items 12 and 17): the downstream evaluation says
when it starts and what it scored, the last line carries the final downstream scores beside the validation loss,
and the step bar counts to the run's last step (a ladder's token budget, not its train.max_steps of 10^9)."""

from __future__ import annotations

import re

import pytest

from lm_ablate import metrics as M
from lm_ablate.config import compose
from lm_ablate.train import Trainer, _said, train

pytestmark = pytest.mark.usefixtures("one_thread")


def scores_in(text: str) -> dict[str, float]:
    """``task kind=value`` pairs of a printed line, as metric names."""
    out = {}
    for chunk in text.split(", "):
        task, *pairs = chunk.split()
        for pair in pairs:
            kind, _, value = pair.partition("=")
            out[M.downstream(task, kind)] = float(value)
    return out


def test_the_downstream_evaluation_says_when_it_runs_and_the_last_line_has_its_scores(tmp_path, cache_dir, capsys):
    cfg = compose(["debug=smoke", "eval=quick", "eval.max_examples=20", "model.context=128", "train.max_steps=3",
                   f"data.cache_dir={cache_dir}"])  # fmt: skip
    summary = train(cfg, tmp_path / "run")
    err = capsys.readouterr().err.splitlines()
    start = [line for line in err if "downstream evaluation of" in line]
    done = [line for line in err if "downstream evaluation done in" in line]
    assert start == ["lm-ablate: step 3: downstream evaluation of 1 task (20 examples)..."], err
    assert len(done) == 1 and done[0].startswith("lm-ablate: step 3: downstream evaluation done in "), err
    printed = scores_in(done[0].split(" s: ", 1)[1])
    recorded = {k: v for k, v in summary.items() if k.startswith("downstream/shakespeare_order/")}
    assert set(printed) == set(recorded) == {M.downstream("shakespeare_order", k) for k in M.DOWNSTREAM_KINDS}
    assert all(printed[k] == pytest.approx(recorded[k], rel=1e-3) for k in recorded)

    _said(summary, tmp_path / "run")
    (last,) = capsys.readouterr().out.splitlines()
    match = re.fullmatch(r"completed: (.+)  val/loss=(\S+)  downstream: (.+)  -> (.+)", last)
    assert match, last
    assert float(match.group(2)) == summary[M.FINAL_VAL_LOSS] and match.group(4) == str(tmp_path / "run")
    assert scores_in(match.group(3)) == printed


def test_a_run_without_tasks_prints_no_downstream(tmp_path, capsys):
    _said({M.STATUS: "completed", M.RUN_NAME: "x", M.FINAL_VAL_LOSS: 2.5}, tmp_path)
    assert capsys.readouterr().out == f"completed: x  val/loss=2.5  -> {tmp_path}\n"


def test_the_step_bar_of_a_ladder_run_counts_to_its_budget(tmp_path, cache_dir, monkeypatch):
    """ladder=cpu sets train.max_steps=10^9 and lets the token budget end each rung: rung 0 (40,680 parameters) at
    0.1 tokens per parameter is ceil(4,068 / (4 x 128)) = 8 steps, and the bar's total must say 8."""
    import tqdm.auto

    totals = []

    class Recording(tqdm.auto.tqdm):
        def __init__(self, *args, **kwargs):
            totals.append(kwargs.get("total"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    cfg = compose(["ladder=cpu", "tracking=none", "ladder.tokens_per_param=0.1", "train.batch_size=4", "train.eval_batches=2",
                   f"data.cache_dir={cache_dir}"])  # fmt: skip
    trainer = Trainer(cfg, tmp_path / "run")
    assert cfg.train.max_steps == 10**9 and trainer.horizon == 8
    summary = trainer.run()
    assert summary[M.STEPS] == 8 and totals == [8]


def test_resuming_a_folder_checkpoint_in_one_process_warns_nothing(tmp_path):
    """A folder (DCP) checkpoint of an fsdp run, resumed by one process (no process group): torch's dcp.load
    printed "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a
    single process" on every resume; that is the intent, so it is silenced there, and the weights and optimizer
    state loaded are the ones saved."""
    import warnings

    import torch
    import torch.distributed as dist

    from lm_ablate import checkpoint as ckpt
    from lm_ablate.distributed import Dist
    from lm_ablate.registry import REGULARIZERS
    from lm_ablate.sharding import FSDP, OneProcess
    from lm_ablate.train import build_optimizer

    cpu = torch.device("cpu")
    cfg = compose(["model=tiny", "train.parallel=fsdp"])
    reg = REGULARIZERS.build(cfg.regularization)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:  # the checkpoint, as a sharded run writes it (one rank of a group)
        torch.manual_seed(0)
        from lm_ablate.model import TransformerLM

        model = TransformerLM(cfg, 64)
        strategy = FSDP(cfg, Dist(), cpu)
        strategy.prepare(model)
        opt = build_optimizer(cfg, model, reg, cpu)
        for _ in range(2):
            opt.zero_grad()
            reg.loss(model(torch.randint(0, 64, (4, 32))), torch.randint(0, 64, (4, 32)))[0].backward()
            opt.step()
        saved = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
        state = {"config": {"train": {}}, "rng": ckpt.rng_state(), "progress": {"step": 2}}
        strategy.save_checkpoint(tmp_path / "run", 2, model, opt, state, keep=1)
        strategy.close()
    finally:
        dist.destroy_process_group()
    (folder,) = ckpt.list_checkpoints(tmp_path / "run")

    torch.manual_seed(1)
    plain = TransformerLM(cfg, 64)
    plain_opt = build_optimizer(cfg, plain, reg, cpu)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        OneProcess(cfg, Dist(), cpu).restore(plain, plain_opt, ckpt.load(folder))
    assert [str(w.message) for w in caught if "torch.distributed" in str(w.message)] == []
    assert dict(plain.named_parameters()).keys() == saved.keys()
    assert all(torch.equal(p, saved[n]) for n, p in plain.named_parameters())
    assert all(s["step"] == 2 for s in plain_opt.state_dict()["state"].values())
