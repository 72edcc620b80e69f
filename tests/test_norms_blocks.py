"""Norms, placements, block kinds, model switches and dropout sites: each against an independent reference
(the equation written here, or HF's Gemma norm), each switch shown to change the computation, every block
variant shown to train and to stay causal. Configs are built with ``compose`` like a real run."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

from lm_ablate.components.placement import build_residual
from lm_ablate.config import ConfigError, NormConfig, compose, validate
from lm_ablate.model import BLOCKS, Columns, TransformerLM, model_cost
from lm_ablate.registry import ACTIVATIONS, ATTENTIONS, NORMS, POSITIONS

V = 64  # vocabulary of the test models
PLACEMENTS = ["pre", "post", "sandwich", "reordered", "deepnorm", "rezero"]
VARIANTS = [[f"norm.placement={p}"] for p in PLACEMENTS] + [
    ["model.block=parallel"],
    ["model.block=parallel", "model.parallel_norms=2"],
]
IDS = [" ".join(v) for v in VARIANTS]


# ---------------------------------------------------------------------------------------------- helpers


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def config(*overrides: str) -> DictConfig:
    """``compose(["model=tiny", *overrides])``, once per test worker (Hydra takes ~0.2 s a call)."""
    return compose(["model=tiny", *overrides])


def build(*overrides: str, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(config(*overrides), V)


@torch.no_grad()
def perturb(module: nn.Module, scale: float = 0.2) -> nn.Module:
    """Move every parameter off its init (as training would): norm gains off 1, biases and gates off 0."""
    for p in module.parameters():
        p.add_(scale * torch.randn_like(p))
    return module


@torch.no_grad()
def copy_shared(src: nn.Module, dst: nn.Module) -> None:
    """Give ``dst`` every parameter of ``src`` with the same name and shape."""
    state = dst.state_dict()
    state.update({k: v for k, v in src.state_dict().items() if k in state and state[k].shape == v.shape})
    dst.load_state_dict(state)


def ln_ref(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + (0 if b is None else b)


def rms_ref(x, gain, eps=1e-5):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def norm_cfg(**kw) -> NormConfig:
    return OmegaConf.structured(NormConfig(**{"name": "layernorm", **kw}))


def tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------ norms


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_formula(bias):
    norm = perturb(NORMS.build(norm_cfg(bias=bias), 16), 1.0)
    x = torch.randn(3, 5, 16) * 4 + 2
    torch.testing.assert_close(norm(x), ln_ref(x, norm.weight, norm.bias), atol=1e-5, rtol=1e-5)
    assert (norm.bias is not None) == bias


def test_rmsnorm_matches_formula():
    norm = perturb(NORMS.build(norm_cfg(name="rmsnorm", eps=1e-6), 16), 1.0)
    x = torch.randn(3, 5, 16) + 1.5
    torch.testing.assert_close(norm(x), rms_ref(x, norm.weight, 1e-6), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("unit_offset", [False, True])
def test_rmsnorm_backward_matches_torch_autograd(unit_offset):
    """The hand-written backward (RMSNormFunction) against autograd through torch's own F.rms_norm, for
    the input and the gain, plus a float64 gradcheck of the function itself."""
    from lm_ablate.components.norm import RMSNormFunction

    norm = perturb(NORMS.build(norm_cfg(name="rmsnorm", unit_offset=unit_offset, eps=1e-6), 16), 1.0)
    x = (torch.randn(3, 5, 16) * 2 + 1).requires_grad_()
    g = torch.randn(3, 5, 16)
    gain = 1 + norm.weight if unit_offset else norm.weight
    grads = torch.autograd.grad((norm(x) * g).sum(), (x, norm.weight))
    expected = torch.autograd.grad((F.rms_norm(x, (16,), gain, 1e-6) * g).sum(), (x, norm.weight))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    x64 = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w64 = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: RMSNormFunction.apply(a, b, 1e-6), (x64, w64))


def test_unit_offset_rmsnorm_matches_formula_and_hf_gemma():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    norm = NORMS.build(norm_cfg(name="rmsnorm", unit_offset=True, eps=1e-6), 16)
    assert torch.equal(norm.weight, torch.zeros(16))  # gain 1 + 0 at init
    x = torch.randn(3, 5, 16) * 3 + 1
    torch.testing.assert_close(norm(x), rms_ref(x, 1.0, 1e-6), atol=1e-6, rtol=1e-5)  # identity gain at init
    perturb(norm, 1.0)
    hf = GemmaRMSNorm(16, eps=1e-6)
    hf.weight.data.copy_(norm.weight.data)
    torch.testing.assert_close(norm(x), rms_ref(x, 1 + norm.weight, 1e-6), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(norm(x), hf(x), atol=1e-6, rtol=0)
    plain = NORMS.build(norm_cfg(name="rmsnorm", eps=1e-6), 16)
    plain.weight.data.copy_(norm.weight.data)
    assert not torch.allclose(plain(x), norm(x), atol=1e-3)  # the switch changes the computation


def test_unit_offset_rmsnorm_computes_in_fp32_under_bf16_autocast():
    """A bf16 input under autocast: statistics and gain in fp32, result cast back to bf16 (as Gemma)."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    norm = perturb(NORMS.build(norm_cfg(name="rmsnorm", unit_offset=True, eps=1e-6), 1024), 1.0)
    hf = GemmaRMSNorm(1024, eps=1e-6)
    hf.weight.data.copy_(norm.weight.data)
    x = (torch.randn(4, 1024) * 3 + 5).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    assert y.dtype == torch.bfloat16 and norm.weight.dtype == torch.float32
    exact = rms_ref(x.double(), 1 + norm.weight.double(), 1e-6)
    assert ((y.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-12).all()  # only bf16's final rounding
    torch.testing.assert_close(y, hf(x))


def test_none_is_identity_without_parameters():
    norm = NORMS.build(norm_cfg(name="none"), 16)
    x = torch.randn(2, 3, 16)
    assert torch.equal(norm(x), x) and not list(norm.parameters())


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_norm_none_model_has_no_norm_parameters(variant):
    model = build("norm=none", *variant)
    with_norms = build("norm=layernorm", *variant)
    assert not any(isinstance(m, (nn.LayerNorm, nn.RMSNorm)) for m in model.modules())
    norm_params = sum(p.numel() for m in with_norms.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters())
    total = sum(p.numel() for p in model.parameters())
    assert total == sum(p.numel() for p in with_norms.parameters()) - norm_params
    for name, p in model.named_parameters():
        assert p.ndim >= 2 or name.endswith("alpha"), name  # matrices, tables and ReZero gates only


# ------------------------------------------------------------------------------------------- placements


def _sublayer() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_placement_follows_its_equation(placement):
    res = perturb(build_residual(norm_cfg(placement=placement), 8, 0.0, n_layers=6), 1.0)
    f = _sublayer()
    x = torch.randn(2, 4, 8) * 3 + 1
    ln = lambda t, n: ln_ref(t, n.weight, n.bias)
    expected = {
        "pre": lambda: x + f(ln(x, res.norm)),
        "post": lambda: ln(x + f(x), res.norm),
        "sandwich": lambda: x + ln(f(ln(x, res.norm)), res.post_norm),
        "reordered": lambda: x + ln(f(x), res.norm),
        "deepnorm": lambda: ln((2 * 6) ** 0.25 * x + f(x), res.norm),
        "rezero": lambda: x + res.alpha * f(x),
    }[placement]()
    torch.testing.assert_close(res(x, f), expected, atol=1e-5, rtol=1e-5)


def test_rezero_is_identity_at_init():
    res = build_residual(norm_cfg(placement="rezero"), 8, 0.0)
    x = torch.randn(2, 4, 8)
    assert torch.equal(res(x, _sublayer()), x) and not any(isinstance(m, nn.LayerNorm) for m in res.modules())
    model = build("norm.placement=rezero")
    h = model.embed(tokens(2, 8)) + model.position.table.weight[:8]
    for block in model.blocks:
        assert torch.equal(block(h, model.position), h)  # every block is the identity at init


@pytest.mark.parametrize("n_layers, alpha, beta", [(6, 1.86120972, 0.37991784), (12, 2.21336384, 0.31947155)])
def test_deepnorm_constants_match_paper(n_layers, alpha, beta):
    """DeepNet decoder-only: alpha = (2N)^(1/4), beta = (8N)^(-1/4) (Wang et al. 2022); overridable."""
    res = build_residual(norm_cfg(placement="deepnorm"), 8, 0.0, n_layers=n_layers)
    assert res.alpha == pytest.approx(alpha) == pytest.approx((2 * n_layers) ** 0.25)
    assert res.beta == pytest.approx(beta) == pytest.approx((8 * n_layers) ** -0.25)
    override = norm_cfg(placement="deepnorm", deepnorm_alpha=3.0, deepnorm_beta=0.5)
    res = build_residual(override, 8, 0.0, n_layers)
    assert (res.alpha, res.beta) == (3.0, 0.5)
    model = build("norm.placement=deepnorm", f"model.n_layers={n_layers}")
    assert model.blocks[-1].ffn_residual.alpha == pytest.approx(alpha)


def test_deepnorm_init_scales_value_output_and_ffn_weights_by_beta():
    deep, pre = build("norm.placement=deepnorm"), build("norm.placement=pre")  # same seed: same normal draws
    beta = (8 * 2) ** -0.25
    for d, p in zip(deep.blocks, pre.blocks):
        q_k = sum(p.attn.split[:2])
        torch.testing.assert_close(d.attn.qkv.weight[:q_k], p.attn.qkv.weight[:q_k])  # Q, K untouched
        torch.testing.assert_close(d.attn.qkv.weight[q_k:], beta * p.attn.qkv.weight[q_k:])  # V
        torch.testing.assert_close(d.attn.out.weight, beta * p.attn.out.weight)
        torch.testing.assert_close(d.ffn.up.weight, beta * p.ffn.up.weight)
        torch.testing.assert_close(d.ffn.down.weight, beta * p.ffn.down.weight)
    torch.testing.assert_close(deep.head.weight, pre.head.weight)


@pytest.mark.parametrize(
    "placement, default", [("pre", True), ("post", False), ("sandwich", True), ("reordered", True),
                           ("deepnorm", False), ("rezero", False)]
)  # fmt: skip
def test_final_norm_default_per_placement_and_override(placement, default):
    def has_final(*o):
        return isinstance(build(f"norm.placement={placement}", *o).final_norm, nn.LayerNorm)

    assert has_final() == default
    assert has_final("norm.final_norm=true") and not has_final("norm.final_norm=false")


# ----------------------------------------------------------------------------------------------- blocks


def _input_projection(sublayer: nn.Module) -> nn.Linear:
    return sublayer.gate_up if hasattr(sublayer, "gate_up") else getattr(sublayer, "qkv", None) or sublayer.up


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("bias", [False, True])
def test_parallel_block_fused_matmul_equals_unfused_equation(activation, bias):
    """x + attn(norm(x)) + ffn(norm(x)) with separately built attention and FFN holding the fused slices."""
    cfg = config("model.block=parallel", "position=rope", f"activation={activation}",
                 f"activation.bias={bias}", f"attention.bias={bias}")  # fmt: skip
    torch.manual_seed(0)
    block = perturb(BLOCKS.get("parallel")(cfg, 0))
    d = cfg.model.d_model
    linears = [m for m in block.modules() if isinstance(m, nn.Linear)]
    consumers = [m for m in linears if not getattr(m, "is_residual_out", False)]
    assert consumers == [block.fused]  # the block's only input matmul
    assert isinstance(block.attn.qkv, Columns) and block.ffn_norm is None
    attn, ffn = ATTENTIONS.build(cfg.attention, cfg.model), ACTIVATIONS.build(cfg.activation, d)
    with torch.no_grad():
        n_qkv = attn.qkv.out_features
        w_qkv, w_in = block.fused.weight.split([n_qkv, block.fused.out_features - n_qkv])
        _input_projection(attn).weight.copy_(w_qkv)
        _input_projection(ffn).weight.copy_(w_in)
        if bias:
            _input_projection(attn).bias.copy_(block.attn.qkv.bias)
            _input_projection(ffn).bias.copy_(_input_projection(block.ffn).bias)
        for ref, fused in ((attn.out, block.attn.out), (ffn.down, block.ffn.down)):
            ref.load_state_dict(fused.state_dict())
    position = POSITIONS.build(cfg.position, cfg.model)
    x = torch.randn(2, 12, d, requires_grad=True)
    h = ln_ref(x, block.norm.weight, block.norm.bias)
    expected = x + attn(h, position) + ffn(h)
    got = block(x, position)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)  # fp32 roundoff of a wider matmul
    (g_got,) = torch.autograd.grad(got.square().sum(), x)
    (g_exp,) = torch.autograd.grad(expected.square().sum(), x)
    torch.testing.assert_close(g_got, g_exp, atol=1e-4, rtol=1e-4)
    assert sum(p.numel() for p in block.parameters()) == sum(
        p.numel() for m in (attn, ffn, block.norm) for p in m.parameters()
    )  # fusing adds or drops no parameter


def test_parallel_block_with_two_norms_follows_neox_equation():
    cfg = config("model.block=parallel", "model.parallel_norms=2")
    torch.manual_seed(0)
    block = perturb(BLOCKS.get("parallel")(cfg, 0))
    assert block.fused is None and isinstance(block.attn.qkv, nn.Linear)
    position = POSITIONS.build(cfg.position, cfg.model)
    x = torch.randn(2, 12, cfg.model.d_model)
    expected = (
        x
        + block.attn(ln_ref(x, block.norm.weight, block.norm.bias), position)
        + block.ffn(ln_ref(x, block.ffn_norm.weight, block.ffn_norm.bias))
    )
    torch.testing.assert_close(block(x, position), expected, atol=1e-5, rtol=1e-4)


def test_parallel_one_norm_model_equals_two_norm_model_with_equal_norms():
    """Model level: the fused shared-norm path computes what two identical norms and unfused matmuls do."""
    one = perturb(build("model.block=parallel"))
    two = build("model.block=parallel", "model.parallel_norms=2")
    copy_shared(one, two)
    with torch.no_grad():
        for b1, b2 in zip(one.blocks, two.blocks):
            b2.ffn_norm.load_state_dict(b1.norm.state_dict())
            b2.attn.qkv.weight.copy_(b1.fused.weight[: b2.attn.qkv.out_features])
            b2.ffn.up.weight.copy_(b1.fused.weight[b2.attn.qkv.out_features :])
    idx = tokens(2, 16)
    torch.testing.assert_close(one(idx), two(idx), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for b2 in two.blocks:
            perturb(b2.ffn_norm)
    assert not torch.allclose(one(idx), two(idx), atol=1e-4)  # two norms are a real switch


# ------------------------------------------------------------------------------------------ model parts


def test_logit_softcap_matches_formula():
    capped, plain = build("model.logit_softcap=0.5"), build()
    copy_shared(perturb(plain), capped)
    idx = tokens(2, 16)
    z = plain(idx)
    assert z.abs().max() > 1  # the cap is active
    torch.testing.assert_close(capped(idx), 0.5 * torch.tanh(z / 0.5))
    assert capped(idx).abs().max() < 0.5


def test_embed_scale_multiplies_token_embeddings_by_sqrt_d():
    model = build("model.embed_scale=true")
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    idx = tokens(2, 8)
    model(idx)
    expected = model.embed(idx) * math.sqrt(32) + model.position.table.weight[:8]
    torch.testing.assert_close(seen[0], expected)


def test_output_init_std():
    zero = build("model.output_init_std=0")
    assert torch.equal(zero.head.weight, torch.zeros_like(zero.head.weight))
    idx = tokens(2, 8)
    loss = F.cross_entropy(zero(idx).flatten(0, 1), tokens(2, 8, seed=2).flatten())
    assert loss.item() == pytest.approx(math.log(V), abs=1e-5)  # uniform predictions at step 0
    wide = build("model.output_init_std=0.5")
    assert wide.head.weight.std().item() == pytest.approx(0.5, rel=0.1)
    assert build().head.weight.std().item() == pytest.approx(0.02, rel=0.1)  # null = model.init_std


def test_tied_embeddings_are_one_parameter_counted_once():
    cfg_t, cfg_u = config("model.tie_embeddings=true"), config()
    tied, untied = TransformerLM(cfg_t, V), TransformerLM(cfg_u, V)
    assert tied.head.weight is tied.embed.weight
    ct, cu = model_cost(tied, cfg_t), model_cost(untied, cfg_u)
    assert ct.params_total == cu.params_total - V * 32
    assert ct.flops_per_token == cu.flops_per_token  # the head matmul is paid either way


@pytest.mark.parametrize(
    "overrides, delta_per_layer",
    [
        (["model.block=parallel", "model.parallel_norms=2"], 0),  # same weights, unfused
        (["model.block=parallel"], -2 * 32),  # one LayerNorm (w, b) fewer per layer; fused = qkv + up
        (["norm.placement=sandwich"], 2 * 2 * 32),  # two more LayerNorms per layer
        (["norm.placement=reordered"], 0),
    ],
)
def test_model_cost_counts_every_variant(overrides, delta_per_layer):
    base_cfg, cfg = config(), config(*overrides)
    base, model = model_cost(TransformerLM(base_cfg, V), base_cfg), model_cost(TransformerLM(cfg, V), cfg)
    assert model.params_total == base.params_total + 2 * delta_per_layer
    assert model.flops_per_token == base.flops_per_token + 6 * 2 * delta_per_layer
    rezero_cfg = config("norm=none", "norm.placement=rezero")
    none_cfg = config("norm=none")
    rezero = model_cost(TransformerLM(rezero_cfg, V), rezero_cfg).params_total
    no_norm = model_cost(TransformerLM(none_cfg, V), none_cfg).params_total
    assert rezero == no_norm + 2 * 2  # two scalar gates per layer


# --------------------------------------------------------------------------------------- dropout sites


def test_dropout_sites_are_wired_and_default_to_dropout():
    sites = ["regularization=dropout", "regularization.dropout=0.1", "regularization.attention_dropout=0.2",
             "regularization.residual_dropout=0.3"]  # fmt: skip
    model = build(*sites)
    assert model.embed_drop.p == 0.1  # null -> regularization.dropout
    block = model.blocks[0]
    assert block.attn.dropout == 0.2
    assert block.attn_residual.drop.p == 0.3 and block.ffn_residual.drop.p == 0.3
    par = build(*sites, "regularization.embedding_dropout=0.0", "model.block=parallel").blocks[0]
    assert par.attn.dropout == 0.2 and par.drop.p == 0.3
    assert build(*sites, "regularization.embedding_dropout=0.0").embed_drop.p == 0.0


@pytest.mark.parametrize("site", ["embedding_dropout", "attention_dropout", "residual_dropout", "dropout"])
def test_each_dropout_site_changes_the_training_forward(site):
    idx = tokens(2, 16)
    off = ["regularization.dropout=0.0"]

    def train_logits(*o):
        model = build(*o).train()
        torch.manual_seed(5)
        return model(idx)

    assert torch.equal(train_logits(*off), build(*off).eval()(idx))
    on = ["regularization=dropout", f"regularization.{site}=0.5"]  # standard has no dropout (options.py)
    assert not torch.allclose(train_logits(*off, *on), train_logits(*off))
    # explicit 0 on every site overrides the default rate
    sites = ("embedding_dropout", "attention_dropout", "residual_dropout")
    zeros = [f"regularization.{s}=0.0" for s in sites]
    assert torch.equal(train_logits("regularization.dropout=0.5", *zeros), train_logits(*off))


# ------------------------------------------------------------------------------ every switch is real


FORWARD_SWITCHES = [  # (baseline, changed): compared with the same weights wherever the names match
    ([], ["norm=rmsnorm"]),
    ([], ["norm=none"]),
    ([], ["norm.bias=false"]),
    (["norm=rmsnorm"], ["norm=rmsnorm", "norm.unit_offset=true"]),
    *[([], [f"norm.placement={p}"]) for p in PLACEMENTS[1:]],
    (["norm.placement=deepnorm"], ["norm.placement=deepnorm", "norm.deepnorm_alpha=1.0"]),
    ([], ["norm.final_norm=false"]),
    (["norm.placement=post"], ["norm.placement=post", "norm.final_norm=true"]),
    ([], ["model.block=parallel", "model.parallel_norms=2"]),  # same parameter names as serial
    ([], ["model.embed_scale=true"]),
    ([], ["model.logit_softcap=1.0"]),
    ([], ["model.tie_embeddings=true"]),
]
INIT_SWITCHES = [  # (baseline, changed): same seed, compared at init
    (["norm.placement=deepnorm"], ["norm.placement=deepnorm", "norm.deepnorm_beta=1.0"]),
    ([], ["model.output_init_std=0.0"]),
    ([], ["model.scaled_residual_init=false"]),
]


@pytest.mark.parametrize("base, changed", FORWARD_SWITCHES, ids=[" ".join(c) for _, c in FORWARD_SWITCHES])
def test_forward_switch_changes_logits_with_the_same_weights(base, changed):
    a = perturb(build(*base))
    b = perturb(build(*changed))
    copy_shared(a, b)
    shared = set(a.state_dict()) & set(b.state_dict())
    assert len(shared) >= 8  # most weights really are shared
    idx = tokens(2, 16)
    assert not torch.allclose(a(idx), b(idx), atol=1e-4)


@pytest.mark.parametrize("base, changed", INIT_SWITCHES, ids=[" ".join(c) for _, c in INIT_SWITCHES])
def test_init_switch_changes_logits(base, changed):
    idx = tokens(2, 16)
    assert not torch.allclose(build(*base)(idx), build(*changed)(idx), atol=1e-5)


# ------------------------------------------------------------------------------- trains and is causal


EXTRA = [
    ["norm=none"],
    ["norm=rmsnorm", "norm.unit_offset=true"],
    ["model.output_init_std=0", "model.logit_softcap=5"],
]


@pytest.mark.parametrize("variant", VARIANTS + EXTRA, ids=[" ".join(v) for v in VARIANTS + EXTRA])
def test_variant_trains(variant):
    model = build(*variant)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    batch = tokens(8, 33, seed=7)
    x, y = batch[:, :-1], batch[:, 1:]
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.85 * losses[0], losses


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_model_is_causal(variant):
    model = perturb(build(*variant, "position=rope"))  # ReZero gates off 0, so attention really mixes
    idx = tokens(1, 24)
    changed = idx.clone()
    changed[:, 13:] = (idx[:, 13:] + 1 + tokens(1, 11, seed=3) % (V - 1)) % V  # every future token differs
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :13], b[:, :13])
    assert not torch.allclose(a[:, 13:], b[:, 13:])


# ------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model.block=parallel", "norm.placement=post"], "model.block"),
        (["model.block=parallel", "norm.placement=deepnorm"], "model.block"),
        (["model.block=parallel", "norm.placement=rezero"], "model.block"),
        (["model.block=diagonal"], "model.block"),
        (["model.parallel_norms=3"], "model.parallel_norms"),
        (["model.logit_softcap=0"], "model.logit_softcap"),
        (["model.logit_softcap=-30"], "model.logit_softcap"),
        (["model.output_init_std=-0.1"], "model.output_init_std"),
        (["model.output_init_std=0", "model.tie_embeddings=true"], "model.output_init_std"),
        (["norm.deepnorm_alpha=0"], "norm.deepnorm_alpha"),
        (["norm.deepnorm_beta=-1"], "norm.deepnorm_beta"),
        (["norm.unit_offset=true"], "norm.unit_offset"),
        (["regularization.embedding_dropout=1.0"], "regularization.embedding_dropout"),
        (["regularization.attention_dropout=-0.1"], "regularization.attention_dropout"),
        (["regularization.residual_dropout=1.5"], "regularization.residual_dropout"),
    ],
)
def test_bad_values_give_one_line_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides))
    msg = str(err.value)
    assert msg.startswith(key + "=") and "\n" not in msg
    if key == "model.block" and "norm.placement" in " ".join(overrides):
        assert "norm.placement=" in msg
