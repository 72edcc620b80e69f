"""Config groups, registries and validation, built through Hydra's compose API like a real run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from lm_ablate.config import CONF_DIR, ConfigError, compose, validate
from lm_ablate.model import TransformerLM
from lm_ablate.registry import REGISTRIES, load_all

load_all()


def _options(group: str) -> list[Path]:
    return sorted((CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", sorted(REGISTRIES))
def test_every_option_file_is_named_after_its_registry_key(group):
    files = _options(group)
    assert files, group
    keys = set(REGISTRIES[group].names())
    for f in files:
        assert yaml.safe_load(f.read_text())["name"] == f.stem, f
    assert {f.stem for f in files} == keys  # no yaml without code, no code without yaml


def test_model_sizes_are_named_after_their_files():
    for f in _options("model"):
        assert yaml.safe_load(f.read_text())["name"] == f.stem


@pytest.mark.parametrize("group", sorted(REGISTRIES) + ["model"])
def test_every_option_builds_a_model(group):
    from lm_ablate.model import TransformerLM

    for f in _options(group):
        overrides = [f"{group}={f.stem}"]
        if group != "model":
            overrides.append("model=tiny")
        cfg = compose(overrides)
        assert cfg.choices[group] == f.stem
        if group in ("data", "tracking", "optim"):
            continue  # not part of the model
        model = TransformerLM(cfg, 64).to("cpu").double().float()  # moving/casting works (nn.Module._apply)
        assert sum(p.numel() for p in model.parameters()) > 0
        assert torch.isfinite(model(torch.randint(0, 64, (2, 8)))).all()


def test_defaults_and_choices():
    cfg = compose()
    assert cfg.choices["norm"] == "layernorm" and cfg.norm.placement == "pre"
    validate(cfg)


def test_unknown_key_and_wrong_type_fail_at_compose():
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose(["norm.colour=red"])
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose(["optim.lr=fast"])
    with pytest.raises(ConfigCompositionException, match="rmsnrom"):
        compose(["norm=rmsnrom"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.n_heads=3", "model.n_heads"),
        ("attention.n_kv_heads=3", "attention.n_kv_heads"),
        ("norm.placement=middle", "norm.placement"),
        ("optim.lr=-1", "optim.lr"),
        ("optim.schedule=linear", "optim.schedule"),
        ("regularization.dropout=1.0", "regularization.dropout"),
        ("train.max_steps=0", "train.max_steps"),
        ("data.tokenizer=sentencepiece", "data.tokenizer"),
        ("tracking.mode=sometimes", "tracking.mode"),
        ("seed=-1", "seed"),
    ],
)
def test_bad_values_give_one_line_naming_the_key(override, key):
    cfg = compose([override])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    assert msg.startswith(key + "=") and "\n" not in msg


def test_odd_rope_head_dim_is_rejected():
    cfg = compose(["position=rope", "model.d_model=36", "model.n_heads=4"])
    with pytest.raises(ConfigError, match="model.head_dim"):
        validate(cfg)


def test_cost_command_prints_params_and_flops():
    from lm_ablate.cost import describe
    from lm_ablate.model import model_cost

    text = describe(["arch=llama", "model=tiny"])
    cfg = compose(["arch=llama", "model=tiny"])
    cost = model_cost(TransformerLM(cfg, 256), cfg)
    assert f"{cost.params_total:,}" in text and f"{cost.params_non_embedding:,}" in text
    assert f"{cost.flops_per_token:,.0f}" in text
    # independent count for the tiny llama: FLOPs/token = 6 N_matmul + 12 L H hd T, N_matmul = non-embedding
    m = cfg.model
    assert (
        cost.flops_per_token
        == 6 * cost.params_non_embedding + 12 * m.n_layers * m.n_heads * (m.d_model // m.n_heads) * m.context
    )
