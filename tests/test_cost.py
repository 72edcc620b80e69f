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
