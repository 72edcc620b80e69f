"""LLaMA-like HF import and arch presets: each family's converted model reproduces transformers' own logits,
and each ``arch=<name>`` preset is an ordinary, overridable, trainable arm.

The HF models are tiny and random, built from config objects (no download) with every weight randomized, norm
gains included, so a wrong (1 + w) gain, norm position, window pattern or softcap cannot hide behind an
identity init.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers as T

import lm_ablate.hf.llama_like  # noqa: F401  (registers the converters; from_hf also needs the GPT half)
from lm_ablate.config import ConfigError, compose, validate
from lm_ablate.hf import CONVERTERS
from lm_ablate.model import TransformerLM

ATOL = 1e-5
VOCAB, SEQ, WINDOW = 128, 48, 8  # SEQ > WINDOW: the sliding window changes the logits
COMMON = dict(
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=160,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    attn_implementation="eager",
)
# model_type -> (config class, model class, what this test sets beyond COMMON)
FAMILIES: dict[str, tuple[type, type, dict[str, Any]]] = {
    "llama": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        dict(attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5, rope_parameters=dict(rope_theta=5e5)),
    ),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, dict(sliding_window=WINDOW)),
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, dict(head_dim=16, tie_word_embeddings=True)),
    "gemma2": (
        T.Gemma2Config,
        T.Gemma2ForCausalLM,
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,  # != head_dim, so the scale matters
            sliding_window=WINDOW,  # layer_types default: local, global, local
            attn_logit_softcapping=5.0,  # small caps, so both are active at these logit sizes
            final_logit_softcapping=3.0,
        ),
    ),
    "olmo2": (
        T.Olmo2Config,
        T.Olmo2ForCausalLM,
        dict(num_key_value_heads=4, rms_norm_eps=1e-6, eos_token_id=None, pad_token_id=None),
    ),
}
ARCHS = sorted(FAMILIES)  # one preset per family, same names


pytestmark = pytest.mark.usefixtures("one_thread")


def hf_model(model_type: str, **overrides: Any) -> torch.nn.Module:
    config_cls, model_cls, settings = FAMILIES[model_type]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**COMMON, **settings, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)  # logits of a few units: the softcaps and windows act
    return model


def convert(model: torch.nn.Module) -> tuple[TransformerLM, Any]:
    return CONVERTERS.get(model.config.model_type)(model)


def tokens(batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def assert_same_logits(hf: torch.nn.Module, ours: TransformerLM) -> None:
    x = tokens()
    expected, got = hf(x).logits, ours(x)
    assert expected.abs().max() > 1.0  # not a near-zero comparison
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_type", ARCHS)
def test_converted_model_reproduces_hf_logits(model_type):
    hf = hf_model(model_type)
    ours, cfg = convert(hf)
    assert not ours.training and cfg.choices["arch"] == model_type
    assert_same_logits(hf, ours)
    n = lambda m: sum(p.numel() for p in m.parameters())
    assert n(ours) == n(hf)


@pytest.mark.parametrize("model_type, local", [("mistral", [0, 1, 2]), ("gemma2", [0, 2])])
def test_sliding_window_is_converted_and_matters(model_type, local):
    hf = hf_model(model_type)
    ours, cfg = convert(hf)
    assert cfg.attention.window == WINDOW < SEQ
    assert [i for i, b in enumerate(ours.blocks) if b.attn.window is not None] == local
    with torch.no_grad():
        reference = ours(tokens())
        ours.blocks[0].attn.window = None
        assert (ours(tokens()) - reference).abs().max() > 1e-2


def test_gemma2_settings():
    _, cfg = convert(hf_model("gemma2"))
    assert cfg.attention.scale == pytest.approx(24**-0.5)
    assert (cfg.attention.softcap, cfg.model.logit_softcap, cfg.attention.global_every) == (5.0, 3.0, 2)
    assert cfg.norm.unit_offset and cfg.model.embed_scale and cfg.model.tie_embeddings
    assert (cfg.choices["activation"], cfg.activation.approximate) == ("geglu", "tanh")


def test_qwen3_all_local_layers_convert():
    hf = hf_model("qwen3", use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0)
    ours, cfg = convert(hf)
    assert (cfg.attention.window, cfg.attention.global_every) == (WINDOW, 0)
    assert_same_logits(hf, ours)


@pytest.mark.parametrize(
    "model_type, overrides, field",
    [
        # full, local, local: no global_every gives it
        ("qwen3", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1), "layer_types"),
        ("llama", dict(rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1e4)), "rope_type"),
        ("llama", dict(hidden_act="gelu_fast"), "hidden_act"),
        ("gemma2", dict(hidden_activation="sigmoid"), "hidden_activation"),
        ("gemma2", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ],
)
def test_unrepresentable_config_names_the_hf_field(model_type, overrides, field):
    with pytest.raises(ValueError, match=field):
        convert(hf_model(model_type, **overrides))


def test_from_hf_dispatches_to_the_family():
    pytest.importorskip("lm_ablate.hf.gpt_like")  # from_hf imports both halves
    from lm_ablate.hf import from_hf, supported

    assert set(ARCHS) <= set(supported())
    hf = hf_model("olmo2")
    ours, _ = from_hf(hf)
    assert_same_logits(hf, ours)


# --- presets ---------------------------------------------------------------------------------------------

# what each family fixes (spot checks); sizes are not among them
FIXED: dict[str, dict[str, Any]] = {
    "llama": {
        "norm.name": "rmsnorm",
        "norm.placement": "pre",
        "position.name": "rope",
        "activation.name": "swiglu",
        "attention.n_kv_heads": 2,
        "attention.qk_norm": "none",
        "model.tie_embeddings": False,
        "position.theta": 5e5,
    },
    "mistral": {
        "norm.placement": "pre",
        "attention.window": 64,
        "attention.global_every": 0,
        "attention.n_kv_heads": 2,
        "position.theta": 1e4,
    },
    "qwen3": {
        "attention.qk_norm": "per_head",
        "position.theta": 1e6,
        "model.tie_embeddings": True,
        "attention.bias": False,
        "norm.eps": 1e-6,
    },
    "gemma2": {
        "norm.placement": "sandwich",
        "norm.unit_offset": True,
        "activation.name": "geglu",
        "activation.approximate": "tanh",
        "model.embed_scale": True,
        "model.tie_embeddings": True,
        "attention.softcap": 50.0,
        "model.logit_softcap": 30.0,
        "attention.window": 64,
        "attention.global_every": 2,
    },
    "olmo2": {
        "norm.placement": "reordered",
        "attention.qk_norm": "whole",
        "attention.n_kv_heads": None,
        "position.theta": 5e5,
    },
}
SIZES = ("model.d_model", "model.n_layers", "model.n_heads", "model.head_dim", "model.context", "activation.d_ff")


def get(cfg: Any, key: str) -> Any:
    section, name = key.split(".")
    return cfg[section][name]


@pytest.mark.parametrize("arch", ARCHS)
def test_preset_sets_what_the_family_fixes_and_keeps_the_sizes(arch):
    cfg, plain = compose([f"arch={arch}"]), compose()
    validate(cfg)
    assert cfg.choices["arch"] == arch
    for key, value in FIXED[arch].items():
        assert get(cfg, key) == value, key
    for key in SIZES:
        assert get(cfg, key) == get(plain, key), key


@pytest.mark.parametrize("arch", ARCHS)
def test_preset_builds_and_trains(arch):
    cfg = compose([f"arch={arch}", "model=tiny"])
    torch.manual_seed(0)
    model = TransformerLM(cfg, 64).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    x = torch.randint(0, 64, (4, cfg.model.context + 1), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(5):
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_a_key_override_beats_the_preset():
    cfg = compose(["arch=llama", "norm.placement=post"])
    validate(cfg)
    assert (cfg.choices["norm"], cfg.norm.placement, cfg.norm.eps) == ("rmsnorm", "post", 1e-5)
    assert TransformerLM(cfg, 64).final_norm.__class__ is torch.nn.Identity  # post-norm's default


@pytest.mark.parametrize("order", [["arch=llama", "norm=layernorm"], ["norm=layernorm", "arch=llama"]])
def test_a_command_line_group_beats_the_presets_group(order):
    """Hydra applies command-line group choices after every defaults list's ``override /group:``, wherever
    they stand on the line; the preset's own keys are still merged on top of the chosen file."""
    cfg = compose(order)
    assert (cfg.choices["norm"], cfg.norm.name, cfg.norm.bias) == ("layernorm", "layernorm", True)
    assert cfg.norm.eps == 1e-5 and cfg.choices["activation"] == "swiglu"  # the rest of the preset stays
    model = TransformerLM(cfg, 64)
    assert isinstance(model.blocks[0].attn_residual.norm, torch.nn.LayerNorm)


def test_experiment_after_the_preset_wins():
    cfg = compose(["arch=llama", "experiment=pre_vs_post_norm"])
    assert (cfg.choices["norm"], cfg.choices["position"], cfg.model.n_layers) == ("layernorm", "learned", 6)
    assert cfg.choices["attention"] == "gqa"  # what the experiment does not set stays the preset's


def test_gemma2_with_layernorm_drops_the_presets_rmsnorm_key():
    """The preset's unit_offset is RMSNorm's: with norm=layernorm it is cleared (lm_ablate/options.py), and
    asked for on the command line it is refused, naming the option that reads it."""
    cfg = compose(["arch=gemma2", "norm=layernorm"])
    validate(cfg)
    assert cfg.norm.unit_offset is None and cfg.norm.bias is True
    with pytest.raises(
        ConfigError, match=r"^norm\.unit_offset=True is invalid: layernorm has no unit_offset \(rmsnorm\)$"
    ):
        compose(["arch=gemma2", "norm=layernorm", "norm.unit_offset=true"])
