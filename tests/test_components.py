"""Each component against an independent reference (torch built-ins or the paper's formula written here),
plus proof that each switch changes the computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from lm_ablate.components.attention import CausalSelfAttention
from lm_ablate.components.ffn import hidden_width
from lm_ablate.components.placement import build_residual
from lm_ablate.components.position import NoPosition, RotaryPosition, sinusoid_table
from lm_ablate.config import ActivationConfig, AttentionConfig, ModelConfig, NormConfig, PositionConfig
from lm_ablate.registry import ACTIVATIONS, NORMS

torch.manual_seed(0)


def _randomize(module: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    return module


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_formula(bias):
    norm = _randomize(NORMS.build(OmegaConf.structured(NormConfig(name="layernorm", bias=bias, eps=1e-5)), 16))
    x = torch.randn(3, 5, 16) * 4 + 2
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    expected = (x - mu) / torch.sqrt(var + 1e-5) * norm.weight + (norm.bias if bias else 0)
    torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm(x), F.layer_norm(x, (16,), norm.weight, norm.bias, 1e-5))
    assert (norm.bias is not None) == bias


def test_rmsnorm_matches_formula_and_differs_from_layernorm():
    cfg = OmegaConf.structured(NormConfig(name="rmsnorm", eps=1e-6))
    norm = _randomize(NORMS.build(cfg, 16))
    x = torch.randn(3, 5, 16) + 1.5
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-6)
    ln = NORMS.build(OmegaConf.structured(NormConfig(name="layernorm", eps=1e-6, bias=False)), 16)
    ln.weight.data.copy_(norm.weight.data)
    assert not torch.allclose(ln(x), norm(x), atol=1e-3)  # centring matters for a non-zero-mean input


def test_pre_and_post_placement_follow_their_equations():
    cfg = OmegaConf.structured(NormConfig(name="layernorm"))
    x = torch.randn(2, 4, 8) * 3 + 1
    f = torch.nn.Linear(8, 8)
    pre = _randomize(build_residual(OmegaConf.merge(cfg, {"placement": "pre"}), 8, 0.0))
    post = _randomize(build_residual(OmegaConf.merge(cfg, {"placement": "post"}), 8, 0.0))
    torch.testing.assert_close(pre(x, f), x + f(pre.norm(x)))
    out = post(x, f)
    torch.testing.assert_close(out, post.norm(x + f(x)))
    assert not torch.allclose(pre(x, f), post(x, f))
    # post really normalizes *after* the residual add: with unit gain and zero bias the output rows are
    # standardized, which is false for the pre-norm output
    post.norm.reset_parameters()
    out = post(x, f)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 4), atol=1e-3, rtol=0)
    assert pre(x, f).var(-1, unbiased=False).sub(1).abs().max() > 0.1


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "reordered", "deepnorm", "rezero", "none"])
def test_residual_dropout_sits_on_the_branch_output(placement):
    """Every placement's equation (components/placement.py) with the residual dropout D on the sublayer's
    output, before it joins the stream; the same seed gives D the same mask in the module and here.
    DeepNorm's alpha = (2N)^(1/4) (Wang et al. 2022) scales the stream, not the branch."""
    cfg = OmegaConf.structured(NormConfig(name="layernorm", placement=placement))
    res = _randomize(build_residual(cfg, 8, 0.5, n_layers=6)).train()
    x = torch.randn(2, 4, 8) * 3 + 1
    f = _randomize(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8)))
    alpha = (2 * 6) ** 0.25

    def ln(t, norm):
        return F.layer_norm(t, (8,), norm.weight, norm.bias, 1e-5)

    def D(t):
        torch.manual_seed(7)
        return F.dropout(t, 0.5, training=True)

    expected = {
        "pre": lambda: x + D(f(ln(x, res.norm))),
        "post": lambda: ln(x + D(f(x)), res.norm),
        "sandwich": lambda: x + D(ln(f(ln(x, res.norm)), res.post_norm)),
        "reordered": lambda: x + D(ln(f(x), res.norm)),
        "deepnorm": lambda: ln(alpha * x + D(f(x)), res.norm),
        "rezero": lambda: x + res.alpha * D(f(x)),
        "none": lambda: x + D(f(x)),
    }[placement]()
    torch.manual_seed(7)
    out = res(x, f)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, res.eval()(x, f), atol=1e-3)  # the dropout did act


def _attention(n_heads=4, n_kv=None, d=32, context=16):
    model = OmegaConf.structured(ModelConfig(name="t", d_model=d, n_heads=n_heads, context=context))
    cfg = OmegaConf.structured(AttentionConfig(name="mha", n_kv_heads=n_kv))
    return CausalSelfAttention(cfg, model).eval(), model


def _reference_attention(attn: CausalSelfAttention, x, position=None):
    """softmax(q k^T / sqrt(d) + causal) v written out, K/V heads repeated for their query groups."""
    B, T, _ = x.shape
    H, Hkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w_q, w_k, w_v = attn.qkv.weight.split(attn.split, dim=0)
    q = (x @ w_q.T).view(B, T, H, hd).transpose(1, 2)
    k = (x @ w_k.T).view(B, T, Hkv, hd).transpose(1, 2)
    v = (x @ w_v.T).view(B, T, Hkv, hd).transpose(1, 2)
    if position is not None:
        q, k = position.rotate(q, k)
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = scores.softmax(-1) @ v
    return y.transpose(1, 2).reshape(B, T, H * hd) @ attn.out.weight.T


@pytest.mark.parametrize("n_kv", [None, 2, 1])
def test_attention_matches_explicit_softmax(n_kv):
    attn, model = _attention(n_kv=n_kv)
    x = torch.randn(2, 16, 32)
    torch.testing.assert_close(attn(x, NoPosition(None, model)), _reference_attention(attn, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("explicit", [False, True])  # SDPA with enable_gqa, and the written-out path
def test_gqa_with_all_kv_heads_is_mha_and_fewer_heads_change_output(explicit):
    torch.manual_seed(1)
    mha, model = _attention(n_kv=None)
    x = torch.randn(2, 16, 32)
    pos = NoPosition(None, model)
    y_mha = mha(x, pos)
    w_q, w_k, w_v = mha.qkv.weight.detach().split(mha.split, dim=0)

    def heads(w: torch.Tensor) -> torch.Tensor:  # [head, head_dim, d_model]: 4 heads of 8 dims
        return w.view(4, 8, 32)

    for n_kv in (4, 2, 1):
        attn, _ = _attention(n_kv=n_kv)
        attn.force_explicit = explicit
        assert attn.qkv.weight.shape[0] == 32 + 2 * n_kv * 8  # K/V projections shrink with the heads
        # K/V head g is MHA's head g * group; query head h reads K/V head h // group (Ainslie et al. 2023)
        group = 4 // n_kv
        kept = torch.arange(0, 4, group)
        with torch.no_grad():
            kv = [heads(w)[kept].reshape(-1, 32) for w in (w_k, w_v)]
            attn.qkv.weight.copy_(torch.cat([w_q, *kv]))
            attn.out.weight.copy_(mha.out.weight)
        # the same as MHA whose K/V heads are those kept heads, each repeated for its group of queries
        shared, _ = _attention(n_kv=None)
        with torch.no_grad():
            repeated = [heads(w)[kept.repeat_interleave(group)].reshape(-1, 32) for w in (w_k, w_v)]
            shared.qkv.weight.copy_(torch.cat([w_q, *repeated]))
            shared.out.weight.copy_(mha.out.weight)
        y = attn(x, pos)
        torch.testing.assert_close(y, shared(x, pos), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(y, _reference_attention(attn, x), atol=1e-5, rtol=1e-5)
        if n_kv == 4:  # all K/V heads: MHA itself
            torch.testing.assert_close(y, y_mha, atol=1e-6, rtol=1e-6)
        else:  # fewer K/V heads, same queries: queries of a group now read their group's keys and values
            assert not torch.allclose(y, y_mha, atol=1e-3)
            assert sum(p.numel() for p in attn.parameters()) < sum(p.numel() for p in mha.parameters())


@pytest.mark.parametrize("position", ["none", "rope"])
def test_attention_is_causal(position):
    attn, model = _attention()
    pos = RotaryPosition(PositionConfig(name="rope"), model) if position == "rope" else NoPosition(None, model)
    x = torch.randn(1, 16, 32)
    y = attn(x, pos)
    x2 = x.clone()
    x2[:, 9:] = torch.randn(1, 7, 32)  # change the future of position 8
    y2 = attn(x2, pos)
    torch.testing.assert_close(y[:, :9], y2[:, :9])
    assert not torch.allclose(y[:, 9:], y2[:, 9:])


def test_rope_matches_complex_rotation_and_depends_only_on_offset():
    model = OmegaConf.structured(ModelConfig(name="t", d_model=32, n_heads=2, context=64))
    rope = RotaryPosition(OmegaConf.structured(PositionConfig(name="rope", theta=10000.0)), model)
    hd, T = 16, 40
    q = torch.randn(1, 1, T, hd)
    k = torch.randn(1, 1, T, hd)
    rq, rk = rope.rotate(q, k)
    # independent formula: pair (x_i, x_{i+hd/2}) as a complex number times exp(i * p * theta^(-2i/hd))
    freqs = 10000.0 ** (-torch.arange(0, hd, 2).float() / hd)
    angle = torch.arange(T).float()[:, None] * freqs
    zq = torch.complex(q[..., : hd // 2], q[..., hd // 2 :]) * torch.polar(torch.ones_like(angle), angle)
    torch.testing.assert_close(rq, torch.cat([zq.real, zq.imag], dim=-1), atol=1e-5, rtol=1e-5)
    # the score between a query at p and a key at p - 3 is the same for every p (same q and k vectors)
    qv, kv = torch.randn(hd), torch.randn(hd)
    rq, rk = rope.rotate(qv.expand(1, 1, T, hd), kv.expand(1, 1, T, hd))
    scores = torch.stack([rq[0, 0, p] @ rk[0, 0, p - 3] for p in range(3, T)])
    torch.testing.assert_close(scores, scores[0].expand_as(scores), atol=1e-4, rtol=1e-4)


def test_sinusoidal_table_matches_paper():
    table = sinusoid_table(50, 16)
    p, i = 7, 3
    assert table[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 16)), abs=1e-6)


def _ffn(name, d=48, **kw):
    return ACTIVATIONS.build(OmegaConf.structured(ActivationConfig(name=name, **kw)), d)


@pytest.mark.parametrize(
    "name, act", [("relu", torch.relu), ("gelu", lambda t: 0.5 * t * (1 + torch.erf(t / math.sqrt(2))))]
)
def test_ungated_ffn_matches_formula(name, act):
    ffn = _ffn(name, bias=True)
    x = torch.randn(2, 3, 48)
    expected = act(x @ ffn.up.weight.T + ffn.up.bias) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), expected, atol=1e-5, rtol=1e-5)
    assert ffn.up.weight.shape == (4 * 48, 48)


def test_swiglu_matches_formula():
    ffn = _ffn("swiglu")
    x = torch.randn(2, 3, 48)
    w_gate, w_up = ffn.gate_up.weight.chunk(2, dim=0)
    expected = (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ ffn.down.weight.T
    torch.testing.assert_close(ffn(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d, multiple_of", [(64, 2), (128, 8), (200, 8), (512, 16), (768, 256)])
def test_auto_d_ff_matches_ungated_parameter_count(d, multiple_of):
    gated = sum(p.numel() for p in _ffn("swiglu", d=d, multiple_of=multiple_of).parameters())
    ungated = sum(p.numel() for p in _ffn("gelu", d=d).parameters())
    assert abs(gated - ungated) / ungated < 0.01
    assert 0 <= gated - ungated < 3 * d * multiple_of  # only the rounding up adds weights
    assert hidden_width(ActivationConfig(name="swiglu", multiple_of=8), d, gated=True) % 8 == 0
    assert hidden_width(ActivationConfig(name="swiglu", d_ff=100), d, gated=True) == 100


def test_activation_switch_changes_output():
    torch.manual_seed(0)
    relu, gelu = _ffn("relu"), _ffn("gelu")
    gelu.load_state_dict(relu.state_dict())
    x = torch.randn(2, 3, 48)
    assert not torch.allclose(relu(x), gelu(x))
