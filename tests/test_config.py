"""Config groups, registries and validation, built through Hydra's compose API like a real run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from lm_ablate.catalog import load_all
from lm_ablate.config import CONF_DIR, ConfigError, compose, validate
from lm_ablate.model import TransformerLM
from lm_ablate.registry import REGISTRIES

load_all()


def _options(group: str) -> list[Path]:
    """The option files of a group; none at all means a wrong path or a moved folder, not a pass."""
    files = sorted((CONF_DIR / group).glob("*.yaml"))
    assert files, f"no option files in {CONF_DIR / group}"
    return files


@pytest.mark.parametrize("group", sorted(REGISTRIES))
def test_every_option_file_is_named_after_its_registry_key(group):
    files = _options(group)
    assert files, group
    keys = set(REGISTRIES[group].names())
    for f in files:
        assert yaml.safe_load(f.read_text())["name"] == f.stem, f
    assert {f.stem for f in files} == keys  # no yaml without code, no code without yaml


def test_model_sizes_are_named_after_their_files():
    files = _options("model")
    assert {f.stem for f in files} >= {"tiny", "small", "medium", "large"}
    for f in files:
        assert yaml.safe_load(f.read_text())["name"] == f.stem, f


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
        ("attention=gqa attention.n_kv_heads=3", "attention.n_kv_heads"),
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
    cfg = compose(override.split())
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    assert msg.startswith(key + "=") and "\n" not in msg


def test_odd_rope_head_dim_is_rejected():
    cfg = compose(["position=rope", "model.d_model=36", "model.n_heads=4"])
    with pytest.raises(ConfigError, match="model.head_dim"):
        validate(cfg)


def _llama_counts(cfg) -> tuple[int, int, int]:
    """(embedding, non-embedding, matmul) parameters of a LLaMA-style model, written out from its config: per
    layer q/k/v/out without bias (n_kv_heads K/V heads), SwiGLU gate+up and down with d_ff = 8d/3 rounded up
    to a multiple of 8, two RMSNorm gains; a final RMSNorm; an untied head (matmul, not embedding); RoPE has
    no parameters."""
    m, V = cfg.model, 256
    d, H, hd, kv = m.d_model, m.n_heads, m.d_model // m.n_heads, cfg.attention.n_kv_heads
    d_ff = 8 * math.ceil(8 * d / 3 / 8)
    layer = d * (H + 2 * kv) * hd + H * hd * d + d * 2 * d_ff + d_ff * d + 2 * d
    non_embedding = m.n_layers * layer + d + V * d
    return V * d, non_embedding, non_embedding


def _gpt2_counts(cfg) -> tuple[int, int, int]:
    """GPT-2 (Radford et al. 2019) written out: per layer two LayerNorms (gain and bias), q/k/v and out with
    biases, a 4d GELU FFN with biases; a final LayerNorm; token and position tables are the embedding, the
    tied head adds the token table's V x d to the matmul parameters."""
    m, V = cfg.model, 256
    d = m.d_model
    layer = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    non_embedding = m.n_layers * layer + 2 * d
    return V * d + m.context * d, non_embedding, non_embedding + V * d


@pytest.mark.parametrize("arch, counts", [("llama", _llama_counts), ("gpt2", _gpt2_counts)])
def test_cost_command_prints_params_and_flops(arch, counts):
    from lm_ablate.cost import describe
    from lm_ablate.model import model_cost

    overrides = [f"arch={arch}", "model=tiny"]
    text = describe(overrides)
    cfg = compose(overrides)
    cost = model_cost(TransformerLM(cfg, 256), cfg)
    embedding, non_embedding, matmul = counts(cfg)
    # parameter counts from the architecture, not from the model under test: FLOPs/token = 6 N_matmul
    # + 12 L H hd T (PaLM, Chowdhery et al. 2022, app. B)
    assert (cost.params_embedding, cost.params_non_embedding) == (embedding, non_embedding)
    assert cost.params_total == embedding + non_embedding
    m = cfg.model
    flops = 6 * matmul + 12 * m.n_layers * m.n_heads * (m.d_model // m.n_heads) * m.context
    assert cost.flops_per_token == flops
    for line in (f"params total      {embedding + non_embedding:,}", f"params embedding  {embedding:,}",
                 f"params non-emb.   {non_embedding:,}", f"FLOPs/token       {flops:,.0f}"):  # fmt: skip
        assert line in text, line
