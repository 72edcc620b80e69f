"""Hugging Face import of the LLaMA-like families (transformers ``model_type``): llama, mistral, qwen3,
gemma2, olmo2.

Each converter composes the family's ``arch=<name>`` preset (conf/arch/) plus the HF model's sizes and
settings as overrides, exactly as ``python -m lm_ablate.train arch=<name> ...`` would, builds
``TransformerLM`` and copies the weights; it returns ``(model.eval(), cfg)``. So an imported model is an
ordinary lm-ablate arm: the preset says what the family fixes, the overrides what this checkpoint chose, and
no model code knows the family.

HF config fields read (every family):
    hidden_size -> model.d_model              num_hidden_layers -> model.n_layers
    num_attention_heads -> model.n_heads      head_dim (null: hidden_size / heads) -> model.head_dim
    max_position_embeddings -> model.context  tie_word_embeddings -> model.tie_embeddings
    num_key_value_heads -> attention.n_kv_heads (group mha / gqa / mqa by the ratio)
    intermediate_size -> activation.d_ff      rms_norm_eps -> norm.eps (and attention.qk_norm_eps)
    hidden_act (Gemma 2: hidden_activation) -> activation: silu / swish -> swiglu, gelu -> geglu,
        gelu_pytorch_tanh / gelu_new -> geglu with approximate=tanh, relu -> reglu
    rope_parameters: rope_type must be "default"; rope_theta -> position.theta. (HF's default RoPE rotates
        the whole head and ignores partial_rotary_factor; so do we.)
Per family:
    llama    attention_bias -> attention.bias, mlp_bias -> activation.bias
    mistral  sliding_window -> attention.window on every layer (null: none); layer_types ignored, as by HF
    qwen3    attention_bias; layer_types + sliding_window -> attention.window, global_every (HF derives
             layer_types from use_sliding_window and max_window_layers)
    gemma2   attention_bias; layer_types + sliding_window -> attention.window, global_every;
             query_pre_attn_scalar -> attention.scale = scalar^-1/2; attn_logit_softcapping ->
             attention.softcap; final_logit_softcapping -> model.logit_softcap;
             use_bidirectional_attention must be false
    olmo2    attention_bias
A layer_types list is representable when it follows attention.global_every: layer l (0-based) is global
("full_attention") iff (l + 1) % global_every == 0 (Gemma 2's default local, global, ... is global_every=2).
Anything else (another rope_type, an activation outside the table, an irregular layer_types, bidirectional
attention) raises ValueError naming the HF field. Initialisation keys (init_std ...) and dropout stay
lm-ablate's: they do not change the converted forward pass.

The converted model is fp32 (weights upcast), built on the HF model's device. Its logits equal HF's eager
fp32 forward to < 1e-5 (tests/test_hf_llama.py). In bf16 the two differ by rounding order only, e.g. HF
Gemma rounds its sqrt(d_model) embedding scale to the weight dtype first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from lm_ablate.config import compose
from lm_ablate.hf.registry import CONVERTERS
from lm_ablate.model import TransformerLM

# HF activation name -> (our activation group option, activation.approximate); HF's MLP is always gated here
GATED_ACTIVATIONS: dict[str, tuple[str, str]] = {
    "silu": ("swiglu", "none"),
    "swish": ("swiglu", "none"),
    "gelu": ("geglu", "none"),
    "gelu_pytorch_tanh": ("geglu", "tanh"),
    "gelu_new": ("geglu", "tanh"),
    "relu": ("reglu", "none"),
}

Overrides = dict[str, Any]


@dataclass(frozen=True)
class Family:
    """What differs between the families beyond the preset: where HF's per-layer norms go in our blocks, and
    the family's own config fields (windows, softcaps). ``norms`` maps an HF decoder-layer norm to the path of
    our norm inside a block (names of the placement the preset picks: components/placement.py)."""

    arch: str  # conf/arch/<arch>.yaml
    norms: dict[str, str]
    activation_field: str = "hidden_act"
    extra: Callable[[Any], Overrides] = lambda hf: {}


PRE_NORMS = {"input_layernorm": "attn_residual.norm", "post_attention_layernorm": "ffn_residual.norm"}


def _field(hf: Any, name: str, default: Any = None) -> Any:
    return getattr(hf, name, default)


def _value(v: Any) -> str:
    """A Python value as a Hydra override value (null, true/false, repr of numbers)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return repr(v)


def window_pattern(hf: Any) -> Overrides:
    """attention.window / global_every from HF's per-layer ``layer_types`` and ``sliding_window``.

    Our rule (components/attention.py): layer l is global iff global_every > 0 and
    (l + 1) % global_every == 0. Try every global_every that could give the pattern; if none fits, the pattern
    is not representable."""
    window, types = _field(hf, "sliding_window"), list(_field(hf, "layer_types") or [])
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise ValueError(f"hf layer_types contains {unknown}: allowed: sliding_attention, full_attention")
    local = [t == "sliding_attention" for t in types]
    if window is None or not any(local):
        return {"attention.window": None, "attention.global_every": 0}
    for every in [0, *range(2, len(local) + 1)]:
        if all(is_local == (every == 0 or (i + 1) % every != 0) for i, is_local in enumerate(local)):
            return {"attention.window": int(window), "attention.global_every": every}
    raise ValueError(
        f"hf layer_types={types} is not representable: lm-ablate makes layer l global iff "
        "(l + 1) % attention.global_every == 0 (and every other layer local)"
    )


def gemma2_extra(hf: Any) -> Overrides:
    if _field(hf, "use_bidirectional_attention"):
        raise ValueError("hf use_bidirectional_attention=True is not supported: lm-ablate models are causal")
    return {
        **window_pattern(hf),
        "attention.scale": float(hf.query_pre_attn_scalar) ** -0.5,
        "attention.softcap": _field(hf, "attn_logit_softcapping"),
        "model.logit_softcap": _field(hf, "final_logit_softcapping"),
    }


def mistral_extra(hf: Any) -> Overrides:
    """HF Mistral applies ``sliding_window`` to every layer and ignores ``layer_types``."""
    window = _field(hf, "sliding_window")
    return {"attention.window": None if window is None else int(window), "attention.global_every": 0}


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", PRE_NORMS, extra=lambda hf: {"activation.bias": bool(_field(hf, "mlp_bias"))}),
    "mistral": Family("mistral", PRE_NORMS, extra=mistral_extra),
    "qwen3": Family("qwen3", PRE_NORMS, extra=window_pattern),
    "gemma2": Family(
        "gemma2",
        {
            "input_layernorm": "attn_residual.norm",
            "post_attention_layernorm": "attn_residual.post_norm",
            "pre_feedforward_layernorm": "ffn_residual.norm",
            "post_feedforward_layernorm": "ffn_residual.post_norm",
        },
        activation_field="hidden_activation",
        extra=gemma2_extra,
    ),
    "olmo2": Family(
        "olmo2",
        {"post_attention_layernorm": "attn_residual.norm", "post_feedforward_layernorm": "ffn_residual.norm"},
    ),
}


def translate(hf: Any, family: Family) -> list[str]:
    """The overrides that turn ``arch=<family>`` into this HF config (see the module docstring)."""
    heads, kv_heads = hf.num_attention_heads, hf.num_key_value_heads or hf.num_attention_heads
    act_name = _field(hf, family.activation_field)
    if act_name not in GATED_ACTIVATIONS:
        allowed = ", ".join(GATED_ACTIVATIONS)
        raise ValueError(f"hf {family.activation_field}={act_name!r} is not supported: allowed: {allowed}")
    activation, approximate = GATED_ACTIVATIONS[act_name]
    rope = dict(_field(hf, "rope_parameters") or {})
    if rope.get("rope_type", "default") != "default":
        kind = rope["rope_type"]
        raise ValueError(f"hf rope_parameters['rope_type']={kind!r} is not supported: allowed: default")
    attention = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    eps = float(hf.rms_norm_eps)
    values: Overrides = {
        "model.d_model": hf.hidden_size,
        "model.n_layers": hf.num_hidden_layers,
        "model.n_heads": heads,
        "model.head_dim": _field(hf, "head_dim") or hf.hidden_size // heads,
        "model.context": hf.max_position_embeddings,
        "model.tie_embeddings": bool(hf.tie_word_embeddings),
        "attention.n_kv_heads": kv_heads,
        "attention.bias": bool(_field(hf, "attention_bias", False)),
        "attention.qk_norm_eps": eps,
        "activation.d_ff": hf.intermediate_size,
        "activation.approximate": approximate,
        "norm.eps": eps,
        "position.theta": float(rope.get("rope_theta", 10000.0)),
        **family.extra(hf),
    }
    groups = [f"arch={family.arch}", f"attention={attention}", f"activation={activation}"]
    return groups + [f"{key}={_value(v)}" for key, v in values.items()]


def weight_pairs(model: TransformerLM, family: Family) -> list[tuple[Tensor, tuple[str, ...]]]:
    """Each parameter of ``model`` and the HF parameters whose rows it stacks, in order: qkv = [q; k; v] (the
    order of our split), gate_up = [gate; up] (the order of our chunk). Import copies along these pairs; export
    (lm_ablate/hf/export.py) splits along them."""
    pairs: list[tuple[Tensor, tuple[str, ...]]] = []

    def linear(dst: nn.Linear, *prefixes: str) -> None:
        pairs.append((dst.weight, tuple(f"{p}.weight" for p in prefixes)))
        if dst.bias is not None:
            pairs.append((dst.bias, tuple(f"{p}.bias" for p in prefixes)))

    pairs.append((model.embed.weight, ("model.embed_tokens.weight",)))
    for i, block in enumerate(model.blocks):
        hf_layer = f"model.layers.{i}"
        attn = f"{hf_layer}.self_attn"
        linear(block.attn.qkv, f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj")
        linear(block.attn.out, f"{attn}.o_proj")
        for side in ("q", "k"):  # the norm's one gain, wherever our QK-norm keeps it (whole vs per head)
            gains = list(getattr(block.attn, f"{side}_norm").parameters())  # none without QK-norm
            if gains:
                pairs.append((gains[0], (f"{attn}.{side}_norm.weight",)))
        mlp = f"{hf_layer}.mlp"
        linear(block.ffn.gate_up, f"{mlp}.gate_proj", f"{mlp}.up_proj")
        linear(block.ffn.down, f"{mlp}.down_proj")
        for hf_name, ours in family.norms.items():
            pairs.append((block.get_submodule(ours).weight, (f"{hf_layer}.{hf_name}.weight",)))
    pairs.append((model.final_norm.weight, ("model.norm.weight",)))
    if model.head.weight is not model.embed.weight:
        pairs.append((model.head.weight, ("lm_head.weight",)))
    return pairs


@torch.no_grad()
def copy_weights(model: TransformerLM, hf_model: nn.Module, family: Family) -> None:
    """Copy every HF parameter into ``model`` along :func:`weight_pairs`. Fails if either side has a parameter
    left over, so a config field the translation missed cannot pass silently."""
    source = dict(hf_model.named_parameters())  # a tied head appears once, as model.embed_tokens.weight
    used: set[str] = set()
    filled: set[int] = set()
    for dst, names in weight_pairs(model, family):
        missing = [n for n in names if n not in source]
        if missing:
            raise ValueError(f"hf model has no parameter {missing[0]}: not a *ForCausalLM of this family?")
        src = torch.cat([source[n] for n in names])
        if dst.shape != src.shape:
            hf_names = "+".join(names)
            raise ValueError(f"shape of hf {hf_names} {tuple(src.shape)} != lm-ablate's {tuple(dst.shape)}")
        dst.copy_(src)
        used.update(names)
        filled.add(id(dst))

    left_hf = sorted(set(source) - used)
    left_ours = [name for name, p in model.named_parameters() if id(p) not in filled]
    if left_hf or left_ours:
        unmapped = f"hf {left_hf[:3]}, lm-ablate {left_ours[:3]}"
        raise ValueError(f"weights not mapped: {unmapped} (a config field this converter does not read?)")


def convert(hf_model: Any, family: Family) -> tuple[TransformerLM, DictConfig]:
    cfg = compose(translate(hf_model.config, family), refuse_unread=False)  # a value no option reads is dropped
    with next(hf_model.parameters()).device:  # built where the HF model lives: no move afterwards
        model = TransformerLM(cfg, hf_model.config.vocab_size)
    copy_weights(model, hf_model, family)
    return model.eval(), cfg


def _register(model_type: str) -> None:
    """One converter per model_type (a function, so each lambda keeps its own family)."""
    family = FAMILIES[model_type]
    CONVERTERS.register(model_type)(lambda hf_model: convert(hf_model, family))


for _model_type in FAMILIES:
    _register(_model_type)
