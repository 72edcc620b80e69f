"""Export: an lm-ablate model as the transformers model of the family that computes it, the inverse of
:func:`lm_ablate.hf.from_hf` (the same family tables, run backwards).

For each family (the run's ``arch`` preset's first, then in the order of ``FAMILIES``), the run's config is written as that family's HF config
(``HF_CONFIGS``, the inverse of the import's field table: the docstrings of gpt_like.py and llama_like.py), and
that HF config is translated back by the import's own translation (``gpt_like.OVERRIDES``,
``llama_like.translate``). The first family whose translation gives back every key that changes the forward
pass (:func:`computation`: model, norm, position, activation and attention keys, derived values resolved,
initialisation and dropout left out) is the run's family; when none does, the keys where the closest family
differs are what no family expresses, and the export is refused in one line naming them
(``norm.placement='deepnorm' is invalid: no supported Hugging Face family computes it ...``).

Weights go backwards along the import's maps: llama_like's ``weight_pairs`` split into their HF rows; for the
GPT-style families the inverse of each converter (GPT-2's Conv1D transposed, NeoX / BLOOM per-head qkv rows,
OPT's two offset position rows as zeros, GPT-J's fused input matmul split). :func:`to_hf` returns the HF model
(fp32, eval mode) and checks that its logits equal ours on a fixed batch; lm_ablate/export.py writes it and
checks again after ``from_pretrained``.

    family (model_type)  computes                                  reads from the run's config
    llama                pre RMSNorm, RoPE, gated FFN, GQA         sizes, eps, theta, activation, biases
    qwen3                llama + per-head QK-norm, windows         + qk_norm per_head, window pattern
    mistral              llama + a window on every layer           + attention.window
    gemma2               (1 + w) sandwich RMSNorm, softcaps,       + scale, softcaps, window pattern
                         sqrt(d) embedding scale, tied
    olmo2                reordered RMSNorm, whole QK-norm          sizes, eps, theta
    gpt2                 pre LayerNorm, learned positions, 4d FFN  sizes, eps, activation, scale 1 or 1/sqrt(hd)
    gptj                 parallel block (1 norm), interleaved      + rotary fraction, head bias
                         partial RoPE
    gpt_neox             parallel (2 norms) or serial, partial     + fraction, theta, attention bias
                         half-split RoPE
    opt                  pre or post LayerNorm, learned positions  + final norm, biases, embed_dim projections
                         (offset 2), project_in/out
    bloom                ALiBi, embedding LayerNorm, tied, 4d      sizes, eps
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from lm_ablate.config import ConfigError, compose, head_dim
from lm_ablate.hf import gpt_like, llama_like

ATOL = 1e-5  # fp32 logits: the export must compute the run's logits to this
# keys of these nodes change the forward pass; those below do not (or are resolved into others)
NODES = ("model", "norm", "position", "activation", "attention")
NOT_COMPUTATION = {
    "model.name",
    "model.init_std",
    "model.scaled_residual_init",
    "model.output_init_std",
    "model.vocab_size",  # the embedding's rows say it
    "model.context",  # a learned table's rows say it; rope, alibi and none compute any length alike
    "activation.multiple_of",  # resolved into activation.d_ff
    "attention.name",  # resolved into attention.n_kv_heads
    "norm.deepnorm_beta",  # initialisation
}


# ------------------------------------------------------------------------------------- what a config computes


def _meta_attention(cfg: DictConfig) -> Any:
    from lm_ablate.registry import ATTENTIONS

    with torch.device("meta"):
        return ATTENTIONS.build(cfg.attention, cfg.model, layer=0)


def _d_ff(cfg: DictConfig) -> int:
    from lm_ablate.registry import ACTIVATIONS

    with torch.device("meta"):
        return ACTIVATIONS.build(cfg.activation, cfg.model.d_model).down.in_features


def computation(cfg: DictConfig) -> dict[str, Any]:
    """The keys that decide the forward pass, flat, with derived values resolved (head_dim, d_ff, K/V heads,
    attention scale, final norm, embedding width, the window pattern), so two configs that compute the same
    function compare equal."""
    from lm_ablate.components.placement import needs_final_norm

    out: dict[str, Any] = {}
    for node in NODES:
        for key, value in cfg[node].items():
            if f"{node}.{key}" not in NOT_COMPUTATION:
                out[f"{node}.{key}"] = value
    attn = _meta_attention(cfg)
    m = cfg.model
    out["model.head_dim"] = head_dim(m)
    out["model.embed_dim"] = m.embed_dim or m.d_model
    out["activation.d_ff"] = _d_ff(cfg)
    out["attention.n_kv_heads"] = attn.n_kv_heads
    out["attention.scale"] = attn.scale
    out["norm.final_norm"] = needs_final_norm(cfg.norm)
    if out.get("attention.global_every") == 1:  # every layer global: no window anywhere
        out["attention.window"] = None
    if out.get("attention.window") is None:
        out["attention.global_every"] = 0
    if cfg.position.name == "learned":
        out["model.context"] = m.context
    return out


# biases a family always has (GPT-2's Conv1D, BLOOM's, GPT-J's head): a run without them exports zeros there
ZERO_BIASES = ("attention.bias", "activation.bias", "norm.bias", "model.head_bias")
# the keys a refusal names first: what an option is, then its settings
FIRST = (".name", ".placement", ".block", ".layout", ".parametrization")


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Keys whose values differ (floats to 1e-9 relative), the options' names first. A bias ours lacks and the
    family has is no difference: the export writes zeros there."""

    def same(k: str, a: Any, b: Any) -> bool:
        if k in ZERO_BIASES and not a and b:
            return True
        if isinstance(a, float) or isinstance(b, float):
            return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
        return a == b

    diff = [k for k in set(ours) | set(theirs) if not same(k, ours.get(k), theirs.get(k))]
    return sorted(diff, key=lambda k: (not k.endswith(FIRST), k not in ours, k))


# ------------------------------------------------------------------------------------------- HF configs


def _inverse(table: dict[str, tuple[str, str]]) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for hf_name, ours in table.items():
        out.setdefault(ours, hf_name)
    return out


GATED = _inverse(llama_like.GATED_ACTIVATIONS)  # (swiglu, none) -> silu, ...
UNGATED = _inverse(gpt_like.HF_ACTIVATIONS)  # (gelu, tanh) -> gelu_new, ...


def _act(table: dict[tuple[str, str], str], cfg: DictConfig, fallback: str) -> str:
    """The HF activation name of ours; ``fallback`` where the family has none (the round trip then names it)."""
    return table.get((cfg.activation.name, cfg.activation.approximate or "none"), fallback)


def _layer_types(cfg: DictConfig) -> list[str]:
    from lm_ablate.components.attention import layer_window

    kinds = [layer_window(cfg.attention, i) is not None for i in range(cfg.model.n_layers)]
    return ["sliding_attention" if local else "full_attention" for local in kinds]


def _common(cfg: DictConfig, vocab: int) -> dict[str, Any]:
    """Fields of every family; special token ids are the tokenizer's (lm_ablate/export.py sets them)."""
    return {"vocab_size": vocab, "tie_word_embeddings": bool(cfg.model.tie_embeddings), "bos_token_id": None,
            "eos_token_id": None}  # fmt: skip


def _rate(cfg: DictConfig, site: str) -> float:
    from lm_ablate.components.blocks import site_dropout

    return float(site_dropout(cfg.regularization, site))


def llama_config(model_type: str) -> Callable[[DictConfig, int], Any]:
    def make(cfg: DictConfig, vocab: int) -> Any:
        import transformers as T

        m, a = cfg.model, cfg.attention
        attn = _meta_attention(cfg)
        kw: dict[str, Any] = {
            **_common(cfg, vocab),
            "hidden_size": m.d_model,
            "num_hidden_layers": m.n_layers,
            "num_attention_heads": m.n_heads,
            "num_key_value_heads": attn.n_kv_heads,
            "head_dim": head_dim(m),
            "intermediate_size": _d_ff(cfg),
            "rms_norm_eps": float(cfg.norm.eps if cfg.norm.eps is not None else 1e-6),
            "max_position_embeddings": m.context,
            "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.position.theta or 10000.0)},
            "attention_bias": bool(a.bias),
        }
        act = _act(GATED, cfg, "silu")
        if model_type == "llama":
            cls, kw = T.LlamaConfig, {**kw, "hidden_act": act, "mlp_bias": bool(cfg.activation.bias)}
        elif model_type == "mistral":
            kw.pop("attention_bias")
            cls, kw = T.MistralConfig, {**kw, "hidden_act": act, "sliding_window": a.window}
        elif model_type == "qwen3":
            window = a.window is not None and "sliding_attention" in _layer_types(cfg)
            cls = T.Qwen3Config
            kw |= {"hidden_act": act, "layer_types": _layer_types(cfg), "sliding_window": a.window,
                   "use_sliding_window": window}  # fmt: skip
        elif model_type == "gemma2":
            cls = T.Gemma2Config
            kw |= {
                "hidden_activation": act,
                "query_pre_attn_scalar": round(float(attn.scale) ** -2),  # an int in HF; the round trip checks
                "attn_logit_softcapping": a.softcap,
                "final_logit_softcapping": m.logit_softcap,
                "layer_types": _layer_types(cfg),
                "sliding_window": a.window,
            }
        else:
            cls, kw = T.Olmo2Config, {**kw, "hidden_act": act}
        return cls(**kw)

    return make


def gpt2_config(cfg: DictConfig, vocab: int) -> Any:
    import transformers as T

    m = cfg.model
    scale = _meta_attention(cfg).scale
    return T.GPT2Config(
        **_common(cfg, vocab),
        n_embd=m.d_model,
        n_layer=m.n_layers,
        n_head=m.n_heads,
        n_positions=m.context,
        n_inner=_d_ff(cfg),
        activation_function=_act(UNGATED, cfg, "gelu_new"),
        layer_norm_epsilon=float(cfg.norm.eps or 1e-5),
        scale_attn_weights=scale != 1.0,
        embd_pdrop=_rate(cfg, "embedding_dropout"),
        attn_pdrop=_rate(cfg, "attention_dropout"),
        resid_pdrop=_rate(cfg, "residual_dropout"),
    )


def gptj_config(cfg: DictConfig, vocab: int) -> Any:
    import transformers as T

    m = cfg.model
    return T.GPTJConfig(
        **_common(cfg, vocab),
        n_embd=m.d_model,
        n_layer=m.n_layers,
        n_head=m.n_heads,
        n_positions=m.context,
        n_inner=_d_ff(cfg),
        rotary_dim=round((cfg.position.fraction or 1.0) * head_dim(m)),
        activation_function=_act(UNGATED, cfg, "gelu_new"),
        layer_norm_epsilon=float(cfg.norm.eps or 1e-5),
        embd_pdrop=_rate(cfg, "embedding_dropout"),
        attn_pdrop=_rate(cfg, "attention_dropout"),
        resid_pdrop=_rate(cfg, "residual_dropout"),
    )


def neox_config(cfg: DictConfig, vocab: int) -> Any:
    import transformers as T

    m, p = cfg.model, cfg.position
    rope = {"rope_type": "default", "rope_theta": float(p.theta or 10000.0), "partial_rotary_factor": p.fraction or 1.0}
    return T.GPTNeoXConfig(
        **_common(cfg, vocab),
        hidden_size=m.d_model,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        intermediate_size=_d_ff(cfg),
        max_position_embeddings=m.context,
        hidden_act=_act(UNGATED, cfg, "gelu"),
        layer_norm_eps=float(cfg.norm.eps or 1e-5),
        attention_bias=bool(cfg.attention.bias),
        use_parallel_residual=m.block == "parallel",
        rope_parameters=rope,
        hidden_dropout=_rate(cfg, "residual_dropout"),
        attention_dropout=_rate(cfg, "attention_dropout"),
    )


def opt_config(cfg: DictConfig, vocab: int) -> Any:
    import transformers as T

    from lm_ablate.components.placement import needs_final_norm

    m = cfg.model
    pre = cfg.norm.placement == "pre"
    return T.OPTConfig(
        **_common(cfg, vocab),
        hidden_size=m.d_model,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        ffn_dim=_d_ff(cfg),
        max_position_embeddings=m.context,
        activation_function=_act(UNGATED, cfg, "relu"),
        enable_bias=bool(cfg.attention.bias),
        do_layer_norm_before=pre,
        _remove_final_layer_norm=pre and not needs_final_norm(cfg.norm),
        word_embed_proj_dim=m.embed_dim or m.d_model,
        dropout=_rate(cfg, "residual_dropout"),
        attention_dropout=_rate(cfg, "attention_dropout"),
    )


def bloom_config(cfg: DictConfig, vocab: int) -> Any:
    import transformers as T

    m = cfg.model
    return T.BloomConfig(
        **_common(cfg, vocab),
        hidden_size=m.d_model,
        n_layer=m.n_layers,
        n_head=m.n_heads,
        layer_norm_epsilon=float(cfg.norm.eps or 1e-5),
        hidden_dropout=_rate(cfg, "residual_dropout"),
        attention_dropout=_rate(cfg, "attention_dropout"),
    )


# model_type -> (our config, vocabulary) -> its HF config; the order is the order families are tried in
HF_CONFIGS: dict[str, Callable[[DictConfig, int], Any]] = {
    "llama": llama_config("llama"),
    "qwen3": llama_config("qwen3"),
    "mistral": llama_config("mistral"),
    "gemma2": llama_config("gemma2"),
    "olmo2": llama_config("olmo2"),
    "gpt2": gpt2_config,
    "gptj": gptj_config,
    "gpt_neox": neox_config,
    "opt": opt_config,
    "bloom": bloom_config,
}
FAMILIES = tuple(HF_CONFIGS)
# conf/arch preset -> its family: a run of a preset exports as that family when it computes the run
ARCH_FAMILY = {"neox": "gpt_neox", "opt_postln": "opt", **{t: t for t in FAMILIES}}


def imported(hf_config: Any) -> DictConfig:
    """The config the import (lm_ablate/hf/) builds for ``hf_config``."""
    t = hf_config.model_type
    if t in llama_like.FAMILIES:
        overrides = llama_like.translate(hf_config, llama_like.FAMILIES[t])
    else:
        overrides = gpt_like.OVERRIDES[t](hf_config)
    return compose(overrides, refuse_unread=False)


def family_of(cfg: DictConfig, vocab: int) -> tuple[str, Any]:
    """(model_type, HF config) of the first family that computes ``cfg``; a one-line ConfigError naming the keys
    no family expresses otherwise."""
    ours = computation(cfg)
    closest: tuple[int, str, list[str], dict[str, Any]] | None = None
    preset = ARCH_FAMILY.get(str((cfg.get("choices") or {}).get("arch")))
    order = sorted(FAMILIES, key=lambda t: t != preset)  # the run's arch preset first, then FAMILIES' order
    for model_type in order:
        make = HF_CONFIGS[model_type]
        try:
            hf_config = make(cfg, vocab)
            theirs = computation(imported(hf_config))
        except Exception as e:  # the family cannot even hold these sizes (HF's validation, our composition)
            diff, theirs = [f"({model_type}: {str(e).splitlines()[0]})"], {}
        else:
            diff = differences(ours, theirs)
            if not diff:
                return model_type, hf_config
        if closest is None or len(diff) < closest[0]:
            closest = (len(diff), model_type, diff, theirs)
    assert closest is not None
    _, model_type, diff, theirs = closest
    key = diff[0]
    shown = ", ".join(f"{k}={theirs.get(k)!r}" for k in diff[:4] if k in theirs) or diff[0]
    more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
    raise ConfigError(
        f"{key}={ours.get(key)!r} is invalid: no supported Hugging Face family computes this config (the closest, "
        f"{model_type}, has {shown}{more}); families: {', '.join(FAMILIES)}"
    )


# ---------------------------------------------------------------------------------------------- weights


def _block_norms(block: nn.Module) -> tuple[str, str]:
    return gpt_like.block_norms(block)


def _split_rows(t: Tensor, sizes: list[int]) -> list[Tensor]:
    return list(t.split(sizes, dim=0))


def _qkv_rows(model: Any, i: int) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None, list[int]]:
    """Block ``i``'s [q; k; v] rows and biases and its FFN input rows and bias, fused or not (the inverse of
    gpt_like.input_projections), and the q, k, v widths."""
    block = model.blocks[i]
    attn, ffn = block.attn, block.ffn
    split = list(attn.split)
    fused = getattr(block, "fused", None)
    if fused is not None:
        qkv_w, up_w = fused.weight.split([sum(split), fused.weight.shape[0] - sum(split)])
    else:
        qkv_w, up_w = attn.qkv.weight, ffn.up.weight
    return qkv_w, attn.qkv.bias, up_w, ffn.up.bias, split


def _per_head_back(x: Tensor, heads: int) -> Tensor:
    """Our [q; k; v] rows -> rows stored per head as (q_h, k_h, v_h) (inverse of gpt_like.per_head_qkv)."""
    return x.unflatten(0, (3, heads, -1)).transpose(0, 1).flatten(0, 2)


def _norm(out: dict[str, Tensor], hf: str, module: nn.Module) -> None:
    out[f"{hf}.weight"] = module.weight
    if getattr(module, "bias", None) is not None:
        out[f"{hf}.bias"] = module.bias


def _linear(out: dict[str, Tensor], hf: str, weight: Tensor, bias: Tensor | None, transpose: bool = False) -> None:
    out[f"{hf}.weight"] = weight.t() if transpose else weight
    if bias is not None:
        out[f"{hf}.bias"] = bias


def gpt2_weights(model: Any, cfg: DictConfig) -> dict[str, Tensor]:
    w: dict[str, Tensor] = {
        "transformer.wte.weight": model.embed.weight,
        "transformer.wpe.weight": model.position.table.weight,
    }
    for i, block in enumerate(model.blocks):
        h, (n1, n2) = f"transformer.h.{i}", _block_norms(block)
        qkv_w, qkv_b, up_w, up_b, _ = _qkv_rows(model, i)
        _norm(w, f"{h}.ln_1", block.get_submodule(n1))
        _norm(w, f"{h}.ln_2", block.get_submodule(n2))
        _linear(w, f"{h}.attn.c_attn", qkv_w, qkv_b, transpose=True)
        _linear(w, f"{h}.attn.c_proj", block.attn.out.weight, block.attn.out.bias, transpose=True)
        _linear(w, f"{h}.mlp.c_fc", up_w, up_b, transpose=True)
        _linear(w, f"{h}.mlp.c_proj", block.ffn.down.weight, block.ffn.down.bias, transpose=True)
    _norm(w, "transformer.ln_f", model.final_norm)
    return w


def gptj_weights(model: Any, cfg: DictConfig) -> dict[str, Tensor]:
    w: dict[str, Tensor] = {"transformer.wte.weight": model.embed.weight}
    for i, block in enumerate(model.blocks):
        h = f"transformer.h.{i}"
        qkv_w, _, up_w, up_b, split = _qkv_rows(model, i)
        _norm(w, f"{h}.ln_1", block.get_submodule(_block_norms(block)[0]))
        for name, rows in zip(("q_proj", "k_proj", "v_proj"), _split_rows(qkv_w, split)):
            w[f"{h}.attn.{name}.weight"] = rows
        _linear(w, f"{h}.attn.out_proj", block.attn.out.weight, None)
        _linear(w, f"{h}.mlp.fc_in", up_w, up_b)
        _linear(w, f"{h}.mlp.fc_out", block.ffn.down.weight, block.ffn.down.bias)
    _norm(w, "transformer.ln_f", model.final_norm)
    return w


def neox_weights(model: Any, cfg: DictConfig) -> dict[str, Tensor]:
    heads = cfg.model.n_heads
    w: dict[str, Tensor] = {"gpt_neox.embed_in.weight": model.embed.weight}
    for i, block in enumerate(model.blocks):
        h, (n1, n2) = f"gpt_neox.layers.{i}", _block_norms(block)
        qkv_w, qkv_b, up_w, up_b, _ = _qkv_rows(model, i)
        _norm(w, f"{h}.input_layernorm", block.get_submodule(n1))
        _norm(w, f"{h}.post_attention_layernorm", block.get_submodule(n2))
        qkv_b = None if qkv_b is None else _per_head_back(qkv_b, heads)
        _linear(w, f"{h}.attention.query_key_value", _per_head_back(qkv_w, heads), qkv_b)
        _linear(w, f"{h}.attention.dense", block.attn.out.weight, block.attn.out.bias)
        _linear(w, f"{h}.mlp.dense_h_to_4h", up_w, up_b)
        _linear(w, f"{h}.mlp.dense_4h_to_h", block.ffn.down.weight, block.ffn.down.bias)
    _norm(w, "gpt_neox.final_layer_norm", model.final_norm)
    return w


def opt_weights(model: Any, cfg: DictConfig) -> dict[str, Tensor]:
    d = "model.decoder"
    table = model.position.table.weight
    offset = torch.zeros(gpt_like.OPT_POSITION_OFFSET, table.shape[1], dtype=table.dtype)
    w: dict[str, Tensor] = {f"{d}.embed_tokens.weight": model.embed.weight,
                            f"{d}.embed_positions.weight": torch.cat([offset, table])}  # fmt: skip
    for i, block in enumerate(model.blocks):
        h, (n1, n2) = f"{d}.layers.{i}", _block_norms(block)
        qkv_w, qkv_b, up_w, up_b, split = _qkv_rows(model, i)
        _norm(w, f"{h}.self_attn_layer_norm", block.get_submodule(n1))
        _norm(w, f"{h}.final_layer_norm", block.get_submodule(n2))
        biases = _split_rows(qkv_b, split) if qkv_b is not None else [None] * 3
        for name, rows, bias in zip(("q_proj", "k_proj", "v_proj"), _split_rows(qkv_w, split), biases):
            _linear(w, f"{h}.self_attn.{name}", rows, bias)
        _linear(w, f"{h}.self_attn.out_proj", block.attn.out.weight, block.attn.out.bias)
        _linear(w, f"{h}.fc1", up_w, up_b)
        _linear(w, f"{h}.fc2", block.ffn.down.weight, block.ffn.down.bias)
    if isinstance(model.final_norm, nn.LayerNorm):
        _norm(w, f"{d}.final_layer_norm", model.final_norm)
    if isinstance(model.project_in, nn.Linear):
        w[f"{d}.project_in.weight"] = model.project_in.weight
        w[f"{d}.project_out.weight"] = model.project_out.weight
    return w


def bloom_weights(model: Any, cfg: DictConfig) -> dict[str, Tensor]:
    heads = cfg.model.n_heads
    w: dict[str, Tensor] = {"transformer.word_embeddings.weight": model.embed.weight}
    _norm(w, "transformer.word_embeddings_layernorm", model.embed_norm)
    for i, block in enumerate(model.blocks):
        h, (n1, n2) = f"transformer.h.{i}", _block_norms(block)
        qkv_w, qkv_b, up_w, up_b, _ = _qkv_rows(model, i)
        _norm(w, f"{h}.input_layernorm", block.get_submodule(n1))
        _norm(w, f"{h}.post_attention_layernorm", block.get_submodule(n2))
        _linear(w, f"{h}.self_attention.query_key_value", _per_head_back(qkv_w, heads), _per_head_back(qkv_b, heads))
        _linear(w, f"{h}.self_attention.dense", block.attn.out.weight, block.attn.out.bias)
        _linear(w, f"{h}.mlp.dense_h_to_4h", up_w, up_b)
        _linear(w, f"{h}.mlp.dense_4h_to_h", block.ffn.down.weight, block.ffn.down.bias)
    _norm(w, "transformer.ln_f", model.final_norm)
    return w


def llama_weights(model_type: str) -> Callable[[Any, DictConfig], dict[str, Tensor]]:
    def weights(model: Any, cfg: DictConfig) -> dict[str, Tensor]:
        family = llama_like.FAMILIES[model_type]
        w: dict[str, Tensor] = {}
        for ours, names in llama_like.weight_pairs(model, family):
            sizes = [_hf_rows(model, cfg, n) for n in names]
            for name, rows in zip(names, ours.split(sizes) if len(names) > 1 else [ours]):
                w[name] = rows
        return w

    return weights


def _hf_rows(model: Any, cfg: DictConfig, name: str) -> int:
    """Rows of the HF projection ``name`` in a stacked pair (q/k/v, gate/up)."""
    hd, m = head_dim(cfg.model), cfg.model
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return m.n_heads * hd
    if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
        return _meta_attention(cfg).n_kv_heads * hd
    return _d_ff(cfg)  # gate_proj / up_proj


WEIGHTS: dict[str, Callable[[Any, DictConfig], dict[str, Tensor]]] = {
    **{t: llama_weights(t) for t in llama_like.FAMILIES},
    "gpt2": gpt2_weights,
    "gptj": gptj_weights,
    "gpt_neox": neox_weights,
    "opt": opt_weights,
    "bloom": bloom_weights,
}


def fixed_batch(vocab: int, context: int) -> Tensor:
    """The batch every export is checked on: 2 sequences of min(context, 96) ids, seeded."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (2, min(context, 96)), generator=g)


@torch.no_grad()
def to_hf(model: Any, cfg: DictConfig) -> tuple[Any, str]:
    """(transformers model, model_type) computing ``model`` (fp32, eval mode, eager attention), checked on
    :func:`fixed_batch` to ATOL; a one-line ConfigError when no family computes ``cfg`` or the check fails."""
    import transformers as T

    vocab = int(model.embed.weight.shape[0])
    model_type, hf_config = family_of(cfg, vocab)
    hf_config._attn_implementation = "eager"
    hf_model = T.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    weights = WEIGHTS[model_type](model, cfg)
    params = dict(hf_model.named_parameters())  # a tied head appears once, as the input embedding
    head = hf_model.get_output_embeddings()
    for name, p in params.items():  # the LM head, whatever the family calls it (lm_head, embed_out)
        if p is head.weight:
            weights[name] = model.head.weight
        elif getattr(head, "bias", None) is not None and p is head.bias and model.head.bias is not None:
            weights[name] = model.head.bias
    for name, p in params.items():  # a bias the family always has and the run does not (ZERO_BIASES)
        if name not in weights and name.endswith(".bias"):
            weights[name] = torch.zeros_like(p)
    weights = {k: v.detach().float().contiguous().clone() for k, v in weights.items()}
    missing = sorted(set(params) - set(weights))
    if missing:
        raise ConfigError(f"export to {model_type}: no weight for hf {missing[:3]} (lm_ablate/hf/export.py)")
    for name, p in params.items():
        if p.shape != weights[name].shape:
            raise ConfigError(
                f"export to {model_type}: hf {name} is {tuple(p.shape)}, ours {tuple(weights[name].shape)}"
            )
        p.copy_(weights[name])
    check_logits(model, hf_model, cfg, f"export to {model_type}")
    return hf_model, model_type


@torch.no_grad()
def check_logits(ours: nn.Module, hf_model: nn.Module, cfg: DictConfig, what: str) -> float:
    """The largest |logit difference| on :func:`fixed_batch`, relative to the logits' scale (max |logit|, at
    least 1): fp32 rounding grows with the logits. One-line ConfigError above ATOL."""
    batch = fixed_batch(int(ours.embed.weight.shape[0]), cfg.model.context)
    ours.eval()
    a, b = ours(batch).float(), hf_model(batch).logits.float()
    diff = float((a - b).abs().max()) / max(1.0, float(a.abs().max()))
    if not diff <= ATOL:
        raise ConfigError(f"{what}: its logits differ from the run's by {diff:.2e} of their scale (> {ATOL:g})")
    return diff
