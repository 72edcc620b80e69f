"""``python -m lm_ablate.cost``: counted on the meta device, equal to the model the run builds, allocating nothing.

Speed is measured in bench/, not here: what is tested is that the counts are the built model's and that no
weight is allocated (a vocabulary or a rung no machine could hold is counted all the same).
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from lm_ablate.config import compose
from lm_ablate.cost import arm_cost, describe, main
from lm_ablate.model import TransformerLM, model_cost

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
ARCHS = sorted(p.stem for p in (ROOT / "conf" / "arch").glob("*.yaml"))
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("model", MODELS)
def test_meta_count_is_the_built_models_at_every_preset(model, arch):
    cfg = compose([f"model={model}", f"arch={arch}"])
    assert arm_cost(cfg, 1000) == model_cost(TransformerLM(cfg, 1000), cfg)


def test_meta_count_is_the_built_models_at_a_gpu_ladder_rung():
    cfg = compose(["ladder=gpu", "ladder.rung=0", "arch=llama"])
    assert cfg.model.d_model == 384 and cfg.model.n_layers == 12  # the rung's shape, applied at composition
    assert arm_cost(cfg, 50257) == model_cost(TransformerLM(cfg, 50257), cfg)


def test_a_model_no_machine_could_hold_is_counted_without_allocating():
    """Issue 21.3: 100M tokens x d_model 2048 is 800 GB per table; the former command allocated the model (OOM)."""
    vocab = 100_000_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    text = describe(["ladder=gpu", "ladder.rung=5"], vocab_size=vocab)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    cfg = compose(["ladder=gpu", "ladder.rung=5"])
    d, T = cfg.model.d_model, cfg.model.context
    assert (d, cfg.position.name, cfg.model.tie_embeddings) == (2048, "learned", False)
    assert f"vocab size        {vocab:,}\n" in text
    assert f"params embedding  {vocab * d + T * d:,}\n" in text  # token table + learned positions
    assert grown_mb < 200, f"the count allocated {grown_mb:.0f} MB"


def test_a_hand_given_model_vocab_size_is_one_line(capsys):
    assert main(["model=tiny", "model.vocab_size=300"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lm-ablate: error: model.vocab_size=300 is invalid: set by the run")


def test_per_rank_memory_for_a_parallel_choice_and_world_size(capsys):
    """``--world N`` (an argument, not a config key) with the arm's train.parallel: the memory estimate per rank
    (lm_ablate.perf.memory_estimate with the exact parameter count), states divided by the shard degree under
    fsdp/hsdp; ``world=8`` as if it were an override is one line saying so."""
    from lm_ablate.perf import memory_estimate

    arm = ["ladder=gpu", "ladder.rung=5", "data=tokens", "data.vocab_size=50257"]
    assert main([*arm, "train.parallel=fsdp", "--world", "8"]) == 0
    out = capsys.readouterr().out
    cfg = compose([*arm, "train.parallel=fsdp"])
    params = arm_cost(cfg, 50257).params_total
    est = memory_estimate(cfg, 50257, "cuda", 8, params=params)
    gib = lambda n: f"{n / 2**30:,.2f} GiB"
    assert f"memory per rank   {gib(est.total)} on cuda, estimated (train.parallel=fsdp, 8 ranks, each copy " \
           "sharded over 8)\n" in out  # fmt: skip
    assert (
        f"  states          {gib(16 * params / 8)}  (weights, gradients, AdamW moments: 16 B x {params:,} / 8)" in out
    )
    assert main([*arm, "--world", "8"]) == 0  # ddp: every rank holds all of it
    assert f"  states          {gib(16 * params)}  (" in capsys.readouterr().out
    assert main([*arm, "train.parallel=hsdp", "--world", "16"]) == 0  # shard size: --gpus-per-node (8)
    assert "16 ranks, each copy sharded over 8)" in capsys.readouterr().out
    assert main([*arm, "train.parallel=fsdp", "world=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lm-ablate: error: world=8 is invalid: world is not a config key; the number of ranks is an "
                   "argument of this command: --world 8"]  # fmt: skip
    assert main([*arm, "train.parallel=hsdp", "train.shard_size=3", "--world", "8"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lm-ablate: error: train.shard_size=3 is invalid: must divide the number of processes (8)"
    )
