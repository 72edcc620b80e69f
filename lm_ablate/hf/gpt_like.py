"""Converters for the GPT-style families of Hugging Face transformers (learned, rotary or ALiBi positions,
LayerNorm, ungated FFNs with biases): each translates the HF config into an lm-ablate config composed from the
matching ``conf/arch`` preset plus the checkpoint's sizes, builds ``TransformerLM`` and copies the weights, so
the result computes the same logits (tests: atol 1e-5 in fp32) and can be trained as an ablation baseline.

Supported ``model_type`` -> preset, and the HF config fields read (every other field either does not change
the computation, or is rejected below with a ValueError naming it):

  gpt2      -> arch=gpt2        n_embd, n_layer, n_head, n_positions, n_inner, activation_function,
                                layer_norm_epsilon, scale_attn_weights (False: attention.scale=1),
                                tie_word_embeddings, embd/attn/resid_pdrop.
                                Rejected: add_cross_attention, scale_attn_by_inverse_layer_idx.
  gptj      -> arch=gptj        n_embd, n_layer, n_head, n_positions, n_inner, rotary_dim (even, <= head_dim;
                                None is rejected), activation_function, layer_norm_epsilon,
                                tie_word_embeddings, embd/attn/resid_pdrop. lm_head's bias -> model.head_bias.
  gpt_neox  -> arch=neox        hidden_size, num_hidden_layers, num_attention_heads, max_position_embeddings,
                                intermediate_size, hidden_act, layer_norm_eps, attention_bias,
                                use_parallel_residual (False: serial pre-LN block), rope_parameters
                                (rope_type "default" only; rope_theta, partial_rotary_factor = rotary_pct),
                                tie_word_embeddings, hidden_dropout, attention_dropout.
  opt       -> arch=opt_postln  hidden_size, num_hidden_layers, num_attention_heads, max_position_embeddings,
                                ffn_dim, activation_function, enable_bias, do_layer_norm_before (True:
                                norm.placement=pre), _remove_final_layer_norm, tie_word_embeddings, dropout,
                                attention_dropout, word_embed_proj_dim (!= hidden_size: model.embed_dim, with
                                OPT-350m's project_in/out). Rejected: layer_norm_elementwise_affine=False,
                                layerdrop > 0.
  bloom     -> arch=bloom       hidden_size, n_layer, n_head, layer_norm_epsilon, tie_word_embeddings,
                                hidden_dropout, attention_dropout. model.context = 2048 (BLOOM's training
                                length; ALiBi has no position table). Rejected:
                                apply_residual_connection_post_layernorm.

Activations (``activation_function`` / ``hidden_act``): relu, gelu (exact), gelu_new and gelu_pytorch_tanh
(tanh form; BLOOM's fixed GELU is the tanh form too), silu / swish. Anything else is a ValueError.

Layout facts the copies rely on: GPT-2's ``Conv1D`` stores [in, out] (transposed here); OPT's learned
positions are offset by 2 (rows 2: are copied); GPT-NeoX and BLOOM store their fused qkv per head as
[heads, 3, head_dim] rows (reordered into our [q; k; v]); GPT-J rotates interleaved pairs of the first
rotary_dim dims, GPT-NeoX half-split pairs; BLOOM's ALiBi slopes are the sequence of ``alibi_slopes`` (also
for head counts that are not powers of two). A parallel block with one shared norm holds [W_qkv; W_up] in
``blocks.i.fused.weight`` while the biases stay in ``attn.qkv.bias`` / ``ffn.up.bias`` (``Columns``).
Weights are copied into an fp32 model whatever the HF dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from lm_ablate.config import compose
from lm_ablate.hf.registry import CONVERTERS
from lm_ablate.model import TransformerLM

Weights = dict[str, Tensor]

# HF activation name -> (activation option, activation.approximate)
HF_ACTIVATIONS: dict[str, tuple[str, str]] = {
    "relu": ("relu", "none"),
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "silu": ("silu", "none"),
    "swish": ("silu", "none"),
}
BLOOM_CONTEXT = 2048  # BLOOM was trained on 2048-token sequences; its config has no position limit
OPT_POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding looks up position + 2 (fairseq's padding legacy)


def unsupported(hf_config: Any, field: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"hf {hf_config.model_type} config.{field}={value!r} is not supported: {allowed}")


def require(hf_config: Any, field: str, wanted: Any, allowed: str) -> None:
    """Raise unless ``hf_config.field`` (absent = ``wanted``) equals ``wanted``."""
    value = getattr(hf_config, field, wanted)
    if value != wanted:
        raise unsupported(hf_config, field, value, allowed)


def activation(hf_config: Any, field: str) -> list[str]:
    name = getattr(hf_config, field)
    if name not in HF_ACTIVATIONS:
        raise unsupported(hf_config, field, name, "allowed: " + ", ".join(HF_ACTIVATIONS))
    option, approximate = HF_ACTIVATIONS[name]
    return [f"activation={option}", f"activation.approximate={approximate}"]


def sizes(hf_config: Any, d: int, layers: int, heads: int, context: int, d_ff: int) -> list[str]:
    """The size overrides; head_dim stays derived (d // heads), which every family here uses."""
    return [
        f"model.name=hf_{hf_config.model_type}",
        f"model.d_model={d}",
        f"model.n_layers={layers}",
        f"model.n_heads={heads}",
        f"model.context={context}",
        f"activation.d_ff={d_ff}",
        f"model.tie_embeddings={bool(hf_config.tie_word_embeddings)}",
    ]


def dropouts(embedding: float, attention: float, residual: float) -> list[str]:
    """The HF rates per site, so fine-tuning the converted model regularizes as the original would; the
    regularization option is the one that says so (dropout, or standard when every rate is 0)."""
    recipe = "dropout" if max(embedding, attention, residual) > 0 else "standard"
    return [
        f"regularization={recipe}",
        f"regularization.embedding_dropout={float(embedding)}",
        f"regularization.attention_dropout={float(attention)}",
        f"regularization.residual_dropout={float(residual)}",
    ]


def rope_fraction(hf_config: Any, field: str, rotary_dims: int | None, hd: int) -> float:
    """``position.fraction`` for ``rotary_dims`` rotated dims per head (checked here to name the HF field)."""
    if rotary_dims is None or not 2 <= rotary_dims <= hd or rotary_dims % 2:
        raise unsupported(hf_config, field, rotary_dims, f"rotated dims: even, in [2, head_dim={hd}]")
    return rotary_dims / hd


def build(overrides: list[str], vocab_size: int) -> tuple[TransformerLM, DictConfig]:
    """The model of a family's overrides (``arch=<preset>`` first: ``OVERRIDES``)."""
    cfg = compose(overrides, refuse_unread=False)  # a value no option reads is dropped
    return TransformerLM(cfg, vocab_size), cfg


# ------------------------------------------------------------------------------------------ weight mapping


def linear(name: str, module: nn.Module, transpose: bool = False) -> Weights:
    """``name.weight`` (and ``name.bias``) of an HF projection; ``transpose`` for GPT-2's [in, out] Conv1D."""
    out = {f"{name}.weight": module.weight.t() if transpose else module.weight}
    if getattr(module, "bias", None) is not None:
        out[f"{name}.bias"] = module.bias
    return out


def norm(name: str, module: nn.Module) -> Weights:
    out = {f"{name}.weight": module.weight}
    if module.bias is not None:
        out[f"{name}.bias"] = module.bias
    return out


def block_norms(block: nn.Module) -> tuple[str, str]:
    """Where a block keeps its two norms: serial in its residuals, parallel as ``norm`` / ``ffn_norm``."""
    if hasattr(block, "attn_residual"):
        return "attn_residual.norm", "ffn_residual.norm"
    return "norm", "ffn_norm"


def input_projections(
    model: TransformerLM, i: int, qkv_w: Tensor, qkv_b: Tensor | None, up_w: Tensor, up_b: Tensor | None
) -> Weights:
    """Attention's [q; k; v] rows and the FFN input rows of block ``i``: one fused matrix when the block
    shares a norm between its sublayers (``fused``), else each in its own Linear; the biases always live
    with the sublayer (``Columns`` keeps them under the same names)."""
    p = f"blocks.{i}."
    if getattr(model.blocks[i], "fused", None) is not None:
        out = {p + "fused.weight": torch.cat([qkv_w, up_w])}
    else:
        out = {p + "attn.qkv.weight": qkv_w, p + "ffn.up.weight": up_w}
    if qkv_b is not None:
        out[p + "attn.qkv.bias"] = qkv_b
    if up_b is not None:
        out[p + "ffn.up.bias"] = up_b
    return out


def per_head_qkv(x: Tensor, n_heads: int) -> Tensor:
    """Rows stored per head as (q_h, k_h, v_h) ([heads, 3, head_dim], GPT-NeoX and BLOOM) -> our [q; k; v]."""
    return x.unflatten(0, (n_heads, 3, -1)).transpose(0, 1).flatten(0, 2)


def head(hf_model: Any) -> Weights:
    """The LM head (its bias too, GPT-J); for a tied model the same tensor as the embedding."""
    return linear("head", hf_model.get_output_embeddings())


@torch.no_grad()
def finish(model: TransformerLM, cfg: DictConfig, weights: Weights) -> tuple[TransformerLM, DictConfig]:
    """Copy ``weights`` (every entry of the state dict, names and shapes checked by load_state_dict)."""
    model.load_state_dict({k: v.detach().float() for k, v in weights.items()}, strict=True)
    return model.eval(), cfg


# ---------------------------------------------------------------------------------------------- families


def gpt2_overrides(c: Any) -> list[str]:
    require(c, "add_cross_attention", False, "decoder-only models only (no cross-attention)")
    require(c, "scale_attn_by_inverse_layer_idx", False, "a per-layer logit scale is not modelled")
    d = c.n_embd
    overrides = sizes(c, d, c.n_layer, c.n_head, c.n_positions, c.n_inner or 4 * d)
    overrides += activation(c, "activation_function") + [f"norm.eps={c.layer_norm_epsilon}"]
    overrides += dropouts(c.embd_pdrop, c.attn_pdrop, c.resid_pdrop)
    if not c.scale_attn_weights:
        overrides.append("attention.scale=1.0")
    return ["arch=gpt2", *overrides]


@CONVERTERS.register("gpt2")
def gpt2(hf_model: Any) -> tuple[TransformerLM, DictConfig]:
    model, cfg = build(gpt2_overrides(hf_model.config), hf_model.config.vocab_size)
    t = hf_model.transformer
    w: Weights = {"embed.weight": t.wte.weight, "position.table.weight": t.wpe.weight}
    for i, h in enumerate(t.h):
        p, (n1, n2) = f"blocks.{i}.", block_norms(model.blocks[i])
        w |= norm(p + n1, h.ln_1) | norm(p + n2, h.ln_2)
        qkv, up = h.attn.c_attn, h.mlp.c_fc
        w |= input_projections(model, i, qkv.weight.t(), qkv.bias, up.weight.t(), up.bias)
        w |= linear(p + "attn.out", h.attn.c_proj, transpose=True)
        w |= linear(p + "ffn.down", h.mlp.c_proj, transpose=True)
    return finish(model, cfg, w | norm("final_norm", t.ln_f) | head(hf_model))


def gptj_overrides(c: Any) -> list[str]:
    d, heads = c.n_embd, c.n_head
    fraction = rope_fraction(c, "rotary_dim", c.rotary_dim, d // heads)
    overrides = sizes(c, d, c.n_layer, heads, c.n_positions, c.n_inner or 4 * d)
    overrides += activation(c, "activation_function") + [f"norm.eps={c.layer_norm_epsilon}"]
    overrides += [f"position.fraction={fraction}"] + dropouts(c.embd_pdrop, c.attn_pdrop, c.resid_pdrop)
    return ["arch=gptj", *overrides]


@CONVERTERS.register("gptj")
def gptj(hf_model: Any) -> tuple[TransformerLM, DictConfig]:
    model, cfg = build(gptj_overrides(hf_model.config), hf_model.config.vocab_size)
    t = hf_model.transformer
    w: Weights = {"embed.weight": t.wte.weight}
    for i, h in enumerate(t.h):
        p, a = f"blocks.{i}.", h.attn
        w |= norm(p + block_norms(model.blocks[i])[0], h.ln_1)
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        w |= input_projections(model, i, qkv, None, h.mlp.fc_in.weight, h.mlp.fc_in.bias)
        w |= linear(p + "attn.out", a.out_proj) | linear(p + "ffn.down", h.mlp.fc_out)
    return finish(model, cfg, w | norm("final_norm", t.ln_f) | head(hf_model))


def gpt_neox_overrides(c: Any) -> list[str]:
    d, heads = c.hidden_size, c.num_attention_heads
    rope = c.rope_parameters
    if rope.get("rope_type", "default") != "default":
        raise unsupported(c, "rope_parameters.rope_type", rope["rope_type"], "allowed: default (no scaling)")
    hd = d // heads
    rotary = int(hd * rope.get("partial_rotary_factor", 1.0))  # as GPTNeoXAttention.rotary_ndims
    fraction = rope_fraction(c, "rope_parameters.partial_rotary_factor", rotary, hd)
    overrides = sizes(c, d, c.num_hidden_layers, heads, c.max_position_embeddings, c.intermediate_size)
    overrides += activation(c, "hidden_act") + [f"norm.eps={c.layer_norm_eps}"]
    overrides += [f"position.fraction={fraction}", f"position.theta={float(rope['rope_theta'])}"]
    overrides += [f"attention.bias={bool(c.attention_bias)}"]
    overrides += dropouts(c.hidden_dropout, c.attention_dropout, c.hidden_dropout)
    if not c.use_parallel_residual:
        overrides.append("model.block=serial")  # x += attn(ln1 x); x += ffn(ln2 x): the pre-LN serial block
    return ["arch=neox", *overrides]


@CONVERTERS.register("gpt_neox")
def gpt_neox(hf_model: Any) -> tuple[TransformerLM, DictConfig]:
    c = hf_model.config
    heads = c.num_attention_heads
    model, cfg = build(gpt_neox_overrides(c), c.vocab_size)
    t = hf_model.gpt_neox
    w: Weights = {"embed.weight": t.embed_in.weight}
    for i, h in enumerate(t.layers):
        p, (n1, n2), a = f"blocks.{i}.", block_norms(model.blocks[i]), h.attention
        w |= norm(p + n1, h.input_layernorm) | norm(p + n2, h.post_attention_layernorm)
        qkv, up = a.query_key_value, h.mlp.dense_h_to_4h
        qkv_b = None if qkv.bias is None else per_head_qkv(qkv.bias, heads)
        w |= input_projections(model, i, per_head_qkv(qkv.weight, heads), qkv_b, up.weight, up.bias)
        w |= linear(p + "attn.out", a.dense) | linear(p + "ffn.down", h.mlp.dense_4h_to_h)
    return finish(model, cfg, w | norm("final_norm", t.final_layer_norm) | head(hf_model))


def opt_overrides(c: Any) -> list[str]:
    d = c.hidden_size
    require(c, "layer_norm_elementwise_affine", True, "LayerNorms without gain and bias are not modelled")
    require(c, "layerdrop", 0.0, "layer dropout is not modelled")
    pre = bool(c.do_layer_norm_before)
    final_norm = pre and not getattr(c, "_remove_final_layer_norm", False)  # post-LN OPT has none
    overrides = sizes(c, d, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings, c.ffn_dim)
    overrides += activation(c, "activation_function") + ["norm.eps=1e-5"]  # OPT's LayerNorms: torch's default
    overrides += [f"norm.placement={'pre' if pre else 'post'}", f"norm.final_norm={final_norm}"]
    overrides += [f"attention.bias={bool(c.enable_bias)}", f"activation.bias={bool(c.enable_bias)}"]
    overrides += dropouts(0.0, c.attention_dropout, c.dropout)  # OPT's decoder drops no embedding
    if c.word_embed_proj_dim != d:  # OPT-350m: 512-wide embeddings and head, project_in / project_out
        overrides.append(f"model.embed_dim={c.word_embed_proj_dim}")
    return ["arch=opt_postln", *overrides]


@CONVERTERS.register("opt")
def opt(hf_model: Any) -> tuple[TransformerLM, DictConfig]:
    c = hf_model.config
    model, cfg = build(opt_overrides(c), c.vocab_size)
    t = hf_model.model.decoder
    table = t.embed_positions.weight[OPT_POSITION_OFFSET : OPT_POSITION_OFFSET + c.max_position_embeddings]
    w: Weights = {"embed.weight": t.embed_tokens.weight, "position.table.weight": table}
    for i, h in enumerate(t.layers):
        p, (n1, n2), a = f"blocks.{i}.", block_norms(model.blocks[i]), h.self_attn
        w |= norm(p + n1, h.self_attn_layer_norm) | norm(p + n2, h.final_layer_norm)
        qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        qkv_b = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
        w |= input_projections(model, i, qkv_w, qkv_b, h.fc1.weight, h.fc1.bias)
        w |= linear(p + "attn.out", a.out_proj) | linear(p + "ffn.down", h.fc2)
    if t.final_layer_norm is not None:
        w |= norm("final_norm", t.final_layer_norm)
    if t.project_in is not None:  # x = project_in(E[idx]) + positions; logits = W project_out(final_norm(h))
        w |= linear("project_in", t.project_in) | linear("project_out", t.project_out)
    return finish(model, cfg, w | head(hf_model))


def bloom_overrides(c: Any) -> list[str]:
    d, heads = c.hidden_size, c.n_head
    require(c, "apply_residual_connection_post_layernorm", False, "the residual is the un-normalized stream")
    overrides = sizes(c, d, c.n_layer, heads, BLOOM_CONTEXT, 4 * d) + [f"norm.eps={c.layer_norm_epsilon}"]
    overrides += dropouts(0.0, c.attention_dropout, c.hidden_dropout)  # BLOOM drops no embedding
    return ["arch=bloom", *overrides]


@CONVERTERS.register("bloom")
def bloom(hf_model: Any) -> tuple[TransformerLM, DictConfig]:
    c = hf_model.config
    heads = c.n_head
    model, cfg = build(bloom_overrides(c), c.vocab_size)
    t = hf_model.transformer
    w: Weights = {"embed.weight": t.word_embeddings.weight} | norm("embed_norm", t.word_embeddings_layernorm)
    for i, h in enumerate(t.h):
        p, (n1, n2), a = f"blocks.{i}.", block_norms(model.blocks[i]), h.self_attention
        w |= norm(p + n1, h.input_layernorm) | norm(p + n2, h.post_attention_layernorm)
        qkv = a.query_key_value
        up = h.mlp.dense_h_to_4h
        w |= input_projections(
            model, i, per_head_qkv(qkv.weight, heads), per_head_qkv(qkv.bias, heads), up.weight, up.bias
        )
        w |= linear(p + "attn.out", a.dense) | linear(p + "ffn.down", h.mlp.dense_4h_to_h)
    return finish(model, cfg, w | norm("final_norm", t.ln_f) | head(hf_model))


# model_type -> the overrides (``arch=<preset>`` first) its HF config translates into; lm_ablate/hf/export.py
# runs them on the config it writes to check that importing it back gives the run's config
OVERRIDES = {
    "gpt2": gpt2_overrides,
    "gptj": gptj_overrides,
    "gpt_neox": gpt_neox_overrides,
    "opt": opt_overrides,
    "bloom": bloom_overrides,
}
