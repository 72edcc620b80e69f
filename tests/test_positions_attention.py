"""Position schemes and attention variants against independent references (HF transformers' implementations
or the papers' formulas written out here), proof that each switch changes the computation, causality of
every scheme and window pattern, and the invariants they promise."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from omegaconf import OmegaConf

from lm_ablate.catalog import load_all
from lm_ablate.components.attention import CausalSelfAttention, layer_window
from lm_ablate.components.position import PositionScheme, t5_bucket
from lm_ablate.config import AttentionConfig, ConfigError, ModelConfig, PositionConfig, compose, validate
from lm_ablate.registry import POSITIONS

load_all()
POSITION_NAMES = ["none", "sinusoidal", "learned", "rope", "alibi", "t5"]


def _model(d=32, n_heads=4, head_dim=None, context=32) -> ModelConfig:
    model = ModelConfig(name="t", d_model=d, n_heads=n_heads, head_dim=head_dim, context=context)
    return OmegaConf.structured(model)


def _position(name: str, model: ModelConfig, **kw) -> PositionScheme:
    scheme = POSITIONS.build(OmegaConf.structured(PositionConfig(name=name, **kw)), model)
    with torch.no_grad():  # a learned table at torch's N(0, 1) init: big enough to matter
        for p in scheme.parameters():
            p.normal_()
    return scheme


def _attention(model: ModelConfig, layer: int = 0, seed: int = 0, **kw) -> CausalSelfAttention:
    torch.manual_seed(seed)
    attn = CausalSelfAttention(OmegaConf.structured(AttentionConfig(name="mha", **kw)), model, layer=layer)
    with torch.no_grad():  # norm gains away from 1, so a norm that ignores its gain would show
        for name, p in attn.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return attn.eval()


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _reference(attn, x, position, bias=None, window=None, softcap=None, scale=None, qk_norm="none", eps=1e-6):
    """softmax(cap(scale * q k^T) + bias + mask) v written out with loops for the mask; K/V heads repeated."""
    B, T, _ = x.shape
    H, Hkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w_q, w_k, w_v = attn.qkv.weight.split(attn.split, dim=0)
    b_q, b_k, b_v = attn.qkv.bias.split(attn.split) if attn.qkv.bias is not None else (0, 0, 0)
    q, k, v = x @ w_q.T + b_q, x @ w_k.T + b_k, x @ w_v.T + b_v
    if qk_norm == "whole":  # OLMo 2: over the whole projection
        q, k = _rms(q, attn.q_norm.weight, eps), _rms(k, attn.k_norm.weight, eps)
    q, k, v = q.view(B, T, H, hd), k.view(B, T, Hkv, hd), v.view(B, T, Hkv, hd)
    if qk_norm == "per_head":  # Qwen 3: over each head's dims, one gain shared by the heads
        q, k = _rms(q, attn.q_norm.norm.weight, eps), _rms(k, attn.k_norm.norm.weight, eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = position.rotate(q, k)
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(hd))
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    hidden = [[j > i or (window is not None and i - j >= window) for j in range(T)] for i in range(T)]
    y = scores.masked_fill(torch.tensor(hidden), float("-inf")).softmax(-1) @ v
    out = y.transpose(1, 2).reshape(B, T, H * hd) @ attn.out.weight.T
    return out + attn.out.bias if attn.out.bias is not None else out


# ---------------------------------------------------------------------------------------------- RoPE


def _hf_cos_sin(dim: int, T: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim)
    config.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    rotary = LlamaRotaryEmbedding(config)
    return rotary(torch.zeros(1, T, dim), torch.arange(T)[None])


def test_rope_half_matches_hf_llama():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rope = _position("rope", _model(d=64, n_heads=4, context=64), theta=500.0)
    q, k = torch.randn(2, 4, 40, 16), torch.randn(2, 4, 40, 16)
    cos, sin = _hf_cos_sin(16, 40, theta=500.0)
    for ours, theirs in zip(rope.rotate(q, k), apply_rotary_pos_emb(q, k, cos, sin)):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_partial_rope_matches_hf_gpt_neox_and_leaves_the_rest():
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    rope = _position("rope", _model(d=64, n_heads=4), fraction=0.5)  # head_dim 16, 8 rotated dims
    rotary = GPTNeoXRotaryEmbedding(GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rotary_pct=0.5))
    assert rotary.inv_freq.numel() == 4  # the reference rotates 8 dims with frequencies over those 8
    q, k = torch.randn(2, 4, 24, 16), torch.randn(2, 4, 24, 16)
    cos, sin = rotary(q, torch.arange(24)[None])
    rq, rk = rope.rotate(q, k)
    for ours, theirs in zip((rq, rk), apply_rotary_pos_emb(q, k, cos, sin)):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert torch.equal(rq[..., 8:], q[..., 8:]) and torch.equal(rk[..., 8:], k[..., 8:])
    assert not torch.allclose(rq[..., 1:, :8], q[..., 1:, :8])


def test_rope_interleaved_matches_complex_formula():
    """Su et al. 2021, eq. (34): (x_{2i} + i x_{2i+1}) * exp(i p theta_i), theta_i = base^(-2i/d)."""
    rope = _position("rope", _model(d=32, n_heads=2, context=64), layout="interleaved")
    hd, T = 16, 40
    q = torch.randn(1, 2, T, hd)
    rq, _ = rope.rotate(q, q)
    angle = torch.arange(T).double()[:, None] * 10000.0 ** (-torch.arange(0, hd, 2).double() / hd)
    z = torch.view_as_complex(q.double().unflatten(-1, (hd // 2, 2)).contiguous())  # x_{2i} + i x_{2i+1}
    z = z * torch.polar(torch.ones_like(angle), angle)
    torch.testing.assert_close(rq, torch.view_as_real(z).flatten(-2).float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_scores_depend_only_on_offset(layout, fraction):
    rope = _position("rope", _model(d=32, n_heads=2, context=64), layout=layout, fraction=fraction)
    hd, T = 16, 40
    qv, kv = torch.randn(hd), torch.randn(hd)
    rq, rk = rope.rotate(qv.expand(1, 1, T, hd), kv.expand(1, 1, T, hd))
    for offset in (0, 3, 17):
        scores = torch.stack([rq[0, 0, p] @ rk[0, 0, p - offset] for p in range(offset, T)])
        torch.testing.assert_close(scores, scores[0].expand_as(scores), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(rq[0, 0, 5] @ rk[0, 0, 2], rq[0, 0, 5] @ rk[0, 0, 1])  # offsets do matter


def test_rope_layouts_and_fractions_differ():
    model = _model(d=32, n_heads=2)
    q = torch.randn(1, 2, 16, 16)
    half, _ = _position("rope", model).rotate(q, q)
    inter, _ = _position("rope", model, layout="interleaved").rotate(q, q)
    partial, _ = _position("rope", model, fraction=0.5).rotate(q, q)
    assert not torch.allclose(half, inter) and not torch.allclose(half, partial)
    torch.testing.assert_close(half[..., 0, :], inter[..., 0, :])  # position 0: both are the identity


# ---------------------------------------------------------------------------------------------- ALiBi


@pytest.mark.parametrize(
    "n_heads, expected",
    [
        (8, [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]),
        (4, [1 / 4, 1 / 16, 1 / 64, 1 / 256]),
        # 12 = 8 + 4: the 8-head slopes, then every other slope of 16 heads (2^-0.5, 2^-1, 2^-1.5, ...)
        (12, [2**-1, 2**-2, 2**-3, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8, 2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]),
    ],
)
def test_alibi_slopes_and_bias_match_paper(n_heads, expected):
    """Press et al. 2022: head h adds -m_h (i - j) to the logit of query i and key j. For future keys (j > i)
    the scheme's formula gives +m_h (j - i); the causal mask hides them, so they get probability 0."""
    model = _model(d=8 * n_heads, n_heads=n_heads)
    alibi = _position("alibi", model)
    torch.testing.assert_close(alibi.slopes, torch.tensor(expected))
    if n_heads in (4, 8):  # a power of two: the geometric sequence 2^(-8 h / n), h = 1..n
        assert expected == [2 ** (-8 * h / n_heads) for h in range(1, n_heads + 1)]
    cpu = torch.device("cpu")
    bias = alibi.score_bias(6, 6, cpu, torch.float32)
    assert bias.shape == (n_heads, 6, 6)
    for h, i, j in [(0, 5, 2), (n_heads - 1, 4, 0), (1, 1, 3), (n_heads - 1, 0, 5), (n_heads // 2, 2, 4)]:
        assert i != j and bias[h, i, j].item() == pytest.approx(-expected[h] * (i - j))  # past and future keys
    written = [[[-expected[h] * (i - j) for j in range(6)] for i in range(6)] for h in range(n_heads)]
    torch.testing.assert_close(bias, torch.tensor(written))
    # 2 queries over 6 keys (generation with a cache): the queries are positions 4 and 5
    last = alibi.score_bias(2, 6, cpu, torch.float32)
    torch.testing.assert_close(last, torch.tensor(written)[:, 4:])
    # in attention: probabilities are softmax_j(scale q_i.k_j - m_h (i - j)) over j <= i, exactly 0 for j > i;
    # read them out of both paths by attending to one-hot values (v_j = e_j)
    attn = _attention(model)
    q, k = torch.randn(1, n_heads, 6, 8), torch.randn(1, n_heads, 6, 8)
    v = torch.eye(6).expand(1, n_heads, 6, 6)
    want = torch.zeros(n_heads, 6, 6)
    for h in range(n_heads):
        for i in range(6):
            logits = torch.stack([q[0, h, i] @ k[0, h, j] / math.sqrt(8) - expected[h] * (i - j) for j in range(i + 1)])
            want[h, i, : i + 1] = logits.softmax(0)
    for explicit in (False, True):
        attn.force_explicit = explicit
        probs = attn.attend(q, k, v, attn.mask(6, 6, bias, cpu, torch.float32), 0.0)[0]
        torch.testing.assert_close(probs, want, atol=1e-6, rtol=1e-5)
        assert (probs.triu(1) == 0).all()  # future keys: exactly zero, despite their positive bias


# ---------------------------------------------------------------------------------------------- T5


def _t5_bucket_written_out(d: int, num_buckets: int, max_distance: int) -> int:
    """Raffel et al. 2020 / Mesh TF, unidirectional: exact below num_buckets/2, log-spaced to max_distance."""
    exact = num_buckets // 2
    if d < exact:
        return d
    spread = math.log(d / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    return min(num_buckets - 1, exact + int(spread))


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (2, 5), (16, 300)])
def test_t5_buckets_match_hf_and_formula(num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    i, j = torch.arange(400)[:, None], torch.arange(400)[None]
    ours = t5_bucket(i - j, num_buckets, max_distance)
    hf = T5Attention._relative_position_bucket(j - i, False, num_buckets, max_distance)  # unidirectional
    assert torch.equal(ours, hf)
    written = [_t5_bucket_written_out(d, num_buckets, max_distance) for d in range(400)]
    assert ours[399].flip(0).tolist() == written  # row 399 holds distances 399 .. 0
    assert (ours[torch.triu_indices(400, 400, 1).unbind()] == 0).all()  # future keys: bucket of distance 0


def test_t5_bias_is_one_learned_table_shared_by_all_layers():
    t5 = _position("t5", _model(), num_buckets=8, max_distance=16)
    bias = t5.score_bias(10, 10, torch.device("cpu"), torch.float32)
    buckets = t5_bucket(torch.arange(10)[:, None] - torch.arange(10), 8, 16)
    torch.testing.assert_close(bias, t5.table.weight[buckets].permute(2, 0, 1))
    cfg = compose(["model=tiny", "position=t5"])
    from lm_ablate.model import TransformerLM

    model = TransformerLM(cfg, 64)
    tables = [name for name, _ in model.named_parameters() if "table" in name]
    assert tables == ["position.table.weight"]  # one table, in the model's scheme, none in the blocks
    model(torch.randint(0, 64, (2, 16))).sum().backward()
    assert model.position.table.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- attention

# (attention kwargs, position name, position kwargs); every variant is checked against _reference
VARIANTS = {
    "plain": ({}, "none", {}),
    "rope_gqa_bias": ({"n_kv_heads": 2, "bias": True}, "rope", {}),
    "window": ({"window": 3}, "none", {}),
    "alibi": ({}, "alibi", {}),
    "t5_window": ({"window": 5}, "t5", {"num_buckets": 8, "max_distance": 12}),
    "softcap": ({"softcap": 2.0}, "rope", {"layout": "interleaved"}),
    "softcap_alibi_window": ({"softcap": 1.5, "window": 4, "n_kv_heads": 1}, "alibi", {}),
    "qk_per_head": ({"qk_norm": "per_head", "n_kv_heads": 2}, "rope", {}),
    "qk_whole": ({"qk_norm": "whole", "n_kv_heads": 2, "qk_norm_eps": 1e-3}, "rope", {"fraction": 0.5}),
    "scale": ({"scale": 0.9}, "none", {}),
}


def _variant(key: str, head_dim=None):
    kw, pos_name, pos_kw = VARIANTS[key]
    model = _model(head_dim=head_dim)
    return _attention(model, **kw), _position(pos_name, model, **pos_kw), kw


def _bias_for(position: PositionScheme, T: int):
    return position.score_bias(T, T, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("key", sorted(VARIANTS))
@pytest.mark.parametrize("head_dim", [None, 12])  # 12 * 4 heads != d_model = 32
def test_attention_matches_explicit_reference(key, head_dim):
    attn, pos, kw = _variant(key, head_dim)
    x = torch.randn(2, 12, 32)
    keys = ("window", "softcap", "scale", "qk_norm")
    options = {k: kw[k] for k in keys if k in kw}
    ref = _reference(attn, x, pos, bias=_bias_for(pos, 12), eps=kw.get("qk_norm_eps", 1e-6), **options)
    torch.testing.assert_close(attn(x, pos), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", [k for k in sorted(VARIANTS) if "softcap" not in VARIANTS[k][0]])
def test_sdpa_path_equals_explicit_path_with_gradients(key):
    attn, pos, _ = _variant(key)
    explicit = copy.deepcopy(attn)
    explicit.force_explicit = True
    assert not attn.explicit and explicit.explicit
    x, w = torch.randn(2, 12, 32), torch.randn(2, 12, 32)
    outputs, grads = [], []
    for module in (attn, explicit):
        pos.zero_grad()
        y = module(x, pos)
        (y * w).sum().backward()
        outputs.append(y.detach())
        grads.append([p.grad.clone() for p in (*module.parameters(), *pos.parameters())])
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    for g_sdpa, g_explicit in zip(*grads, strict=True):  # t5: the table's gradient flows through the mask
        torch.testing.assert_close(g_sdpa, g_explicit, atol=1e-4, rtol=1e-4)


def test_qk_norm_per_head_matches_hf_qwen3_attention():
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    config = Qwen3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    _check_against_hf(Qwen3Attention(config, 0).eval(), "per_head", head_dim=12)


def test_qk_norm_whole_matches_hf_olmo2_attention():
    from transformers import Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention

    config = Olmo2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    _check_against_hf(Olmo2Attention(config, 0).eval(), "whole", head_dim=None)


def _check_against_hf(hf: torch.nn.Module, qk_norm: str, head_dim):
    """HF attention with RoPE (half layout) and a causal mask vs ours with the same weights."""
    model = _model(head_dim=head_dim)
    ours = _attention(model, n_kv_heads=2, qk_norm=qk_norm)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        hf.q_norm.weight.add_(1.0)
        hf.k_norm.weight.add_(1.0)
        ours.qkv.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        ours.out.weight.copy_(hf.o_proj.weight)
        next(ours.q_norm.parameters()).copy_(hf.q_norm.weight)  # each norm has its gain as only parameter
        next(ours.k_norm.parameters()).copy_(hf.k_norm.weight)
    T, hd = 10, ours.head_dim
    x = torch.randn(2, T, 32)
    causal = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y_hf, _ = hf(x, position_embeddings=_hf_cos_sin(hd, T), attention_mask=causal[None, None])
    torch.testing.assert_close(ours(x, _position("rope", model)), y_hf, atol=1e-5, rtol=1e-5)


def test_dropout_applies_on_both_paths():
    """Probability dropout is unbiased: the mean of many draws is the eval output; a single draw is not."""
    for kw in ({}, {"softcap": 3.0}, {"window": 3}):
        attn, pos = _attention(_model(), **kw), _position("alibi", _model())
        attn.dropout = 0.5
        x = torch.randn(1, 8, 32).expand(8000, 8, 32)  # 8000 independent draws of the same sequence
        expected = attn(x[:1], pos)
        draws = attn.train()(x, pos)
        assert not torch.allclose(draws[:1], expected, atol=1e-3)
        torch.testing.assert_close(draws.mean(0, keepdim=True), expected, atol=0.03, rtol=0)  # 1 draw: ~0.7


def test_window_larger_than_context_is_full_attention():
    model = _model()
    full, wide, narrow = _attention(model), _attention(model, window=50), _attention(model, window=11)
    x = torch.randn(2, 12, 32)
    for name in ("none", "rope", "alibi"):
        pos = _position(name, model)
        y = full(x, pos)
        torch.testing.assert_close(wide(x, pos), y, atol=1e-5, rtol=1e-5)
        # window 11 of 12 tokens: only the last query loses a key (key 0)
        torch.testing.assert_close(narrow(x, pos)[:, :11], y[:, :11], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(narrow(x, pos)[:, 11], y[:, 11])


@pytest.mark.parametrize(
    "a, b",
    [
        ({}, {"window": 3}),
        ({}, {"softcap": 1.0}),
        ({}, {"qk_norm": "per_head"}),
        ({}, {"qk_norm": "whole"}),
        ({"qk_norm": "per_head"}, {"qk_norm": "whole"}),
        ({}, {"scale": 1.0}),
    ],
)
def test_attention_switches_change_output(a, b):
    model = _model()
    attn_a, attn_b = _attention(model, **a), _attention(model, **b)  # same seed: same projections
    assert torch.equal(attn_a.qkv.weight, attn_b.qkv.weight)
    x = torch.randn(2, 12, 32) * 3
    pos = _position("none", model)
    assert not torch.allclose(attn_a(x, pos), attn_b(x, pos), atol=1e-4)


@pytest.mark.parametrize("name", ["rope", "alibi", "t5"])
def test_position_switches_change_output(name):
    model = _model()
    attn, x = _attention(model), torch.randn(2, 12, 32)
    assert not torch.allclose(attn(x, _position(name, model)), attn(x, _position("none", model)), atol=1e-4)


# ---------------------------------------------------------------------------------------------- causality


@pytest.mark.parametrize("name", POSITION_NAMES)
@pytest.mark.parametrize("kw", [{}, {"window": 3}, {"softcap": 2.0, "window": 4, "qk_norm": "whole"}])
def test_attention_is_causal(name, kw):
    model = _model()
    attn, pos = _attention(model, **kw), _position(name, model)
    x = torch.randn(1, 16, 32)  # (learned / sinusoidal act on the embeddings: see the full-model test)
    x2 = x.clone()
    x2[:, 9:] = torch.randn(1, 7, 32)  # change the future of position 8
    y, y2 = attn(x, pos), attn(x2, pos)
    torch.testing.assert_close(y[:, :9], y2[:, :9])
    assert not torch.allclose(y[:, 9:], y2[:, 9:])


# full; all local; mixed (tiny has 2 layers: local, global)
WINDOW_PATTERNS = [{}, {"window": 3, "global_every": 0}, {"window": 3, "global_every": 2}]


@pytest.mark.parametrize("name", POSITION_NAMES)
def test_full_model_is_causal(name):
    from lm_ablate.model import TransformerLM

    base = compose(["model=tiny", f"position={name}"])
    idx = torch.randint(0, 64, (2, 24))
    idx2 = idx.clone()
    idx2[:, 11:] = (idx[:, 11:] + 1 + torch.randint(0, 62, (2, 13))) % 64  # every later token changed
    for pattern in WINDOW_PATTERNS:
        torch.manual_seed(0)
        model = TransformerLM(OmegaConf.merge(base, {"attention": pattern}), 64).eval()
        y, y2 = model(idx), model(idx2)
        torch.testing.assert_close(y[:, :11], y2[:, :11])
        assert not torch.allclose(y[:, 11:], y2[:, 11:])


def test_window_limits_what_a_query_sees():
    """With window 3 and one layer, output at position p ignores tokens before p - 2."""
    model = _model()
    attn, pos = _attention(model, window=3), _position("none", model)
    x = torch.randn(1, 12, 32)
    x2 = x.clone()
    x2[:, :5] = torch.randn(1, 5, 32)
    y, y2 = attn(x, pos), attn(x2, pos)
    torch.testing.assert_close(y[:, 7:], y2[:, 7:])  # 7 - 3 < j: j >= 5
    assert not torch.allclose(y[:, 6], y2[:, 6])


# ---------------------------------------------------------------------------------------------- config


def test_layer_pattern():
    cfg = OmegaConf.structured(AttentionConfig(name="mha", window=8))

    def windows(every: int) -> list:
        return [layer_window(OmegaConf.merge(cfg, {"global_every": every}), layer) for layer in range(6)]

    assert windows(0) == [8] * 6  # Mistral: all local
    assert windows(2) == [8, None, 8, None, 8, None]  # Gemma 2: local, global, ...
    assert windows(6) == [8] * 5 + [None]  # Gemma 3: five local, one global
    assert windows(1) == [None] * 6
    no_window = OmegaConf.merge(cfg, {"window": None, "global_every": 2})
    assert [layer_window(no_window, layer) for layer in range(4)] == [None] * 4


def test_model_builds_the_layer_pattern():
    from lm_ablate.model import TransformerLM

    cfg = compose(["model=tiny", "model.n_layers=4", "attention.window=5", "attention.global_every=2"])
    model = TransformerLM(cfg, 64)
    windows = [m.window for m in model.modules() if isinstance(m, CausalSelfAttention)]
    assert windows == [5, None, 5, None]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["position=rope", "position.fraction=0.3"], "position.fraction"),  # 4.8 dims of 16
        (["position=rope", "position.fraction=0.0"], "position.fraction"),
        (["position=rope", "position.fraction=1.5"], "position.fraction"),
        (["position=rope", "model.d_model=36", "model.n_heads=4"], "model.head_dim"),
        (["position=rope", "position.layout=spiral"], "position.layout"),
        (["position=t5", "position.num_buckets=0"], "position.num_buckets"),
        (["position=t5", "position.max_distance=0"], "position.max_distance"),
        (["attention.window=0"], "attention.window"),
        (["attention.softcap=0"], "attention.softcap"),
        (["attention.scale=-1"], "attention.scale"),
        (["attention.qk_norm=layer"], "attention.qk_norm"),
        (["attention.qk_norm=whole", "attention.qk_norm_eps=0"], "attention.qk_norm_eps"),
        (["attention=gqa", "attention.n_kv_heads=3"], "attention.n_kv_heads"),
        (["attention.global_every=-1"], "attention.global_every"),
        (["attention.window=8", "attention.global_every=3"], "attention.global_every"),  # tiny: 2 layers
    ],
)
def test_bad_values_give_one_line_naming_the_key(overrides, key):
    cfg = compose(["model=tiny", *overrides])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    assert msg.startswith(key + "=") and "\n" not in msg


def test_good_patterns_validate():
    for overrides in (
        ["attention.window=8", "attention.global_every=2"],
        ["attention.window=8", "attention.global_every=0"],
        ["position=rope", "position.fraction=0.5", "position.layout=interleaved"],
        ["position=rope", "position.fraction=0.125"],  # 16 * 0.125 = 2 rotated dims: one pair
        ["position=t5", "position.num_buckets=2", "position.max_distance=2"],
    ):
        validate(compose(["model=tiny", *overrides]))
