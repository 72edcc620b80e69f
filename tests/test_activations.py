"""The FFN options (axis ``activation``) against independent references: torch built-ins, the formulas written
here, HuggingFace transformers' activation table (ACT2FN) and its LlamaMLP / GPT2MLP with the same weights;
plus proof that every switch changes the output and that ``d_ff: null`` matches a 4d ungated FFN's size."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor

from lm_ablate.catalog import load_all
from lm_ablate.components.ffn import FFN, GatedFFN
from lm_ablate.config import ActivationConfig, ConfigError, compose, validate
from lm_ablate.registry import ACTIVATIONS

load_all()

D = 48
UNGATED = ["relu", "gelu", "silu", "relu2"]
GATED = ["glu", "reglu", "geglu", "swiglu", "bilinear"]
# (name, approximate): every distinct computation; approximate only matters where GELU is used
VARIANTS = [(n, "none") for n in UNGATED + GATED] + [("gelu", "tanh"), ("geglu", "tanh")]


def erf_gelu(t):  # Hendrycks & Gimpel 2016: x * Phi(x)
    return 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))


def tanh_gelu(t):  # Hendrycks & Gimpel 2016, eq. for the fast approximation (GPT-2's gelu)
    return 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t**3)))


TORCH_TANH_GELU = partial(F.gelu, approximate="tanh")
Ref = Callable | str  # a function, or "hf:<ACT2FN key>"
# variant -> its references: formula written here, torch built-in, HuggingFace ACT2FN entry
REFERENCES: dict[tuple[str, str], list[Ref]] = {
    ("relu", "none"): [lambda t: t.clamp_min(0), F.relu, "hf:relu"],
    ("gelu", "none"): [erf_gelu, F.gelu, "hf:gelu", "hf:gelu_python"],
    ("gelu", "tanh"): [tanh_gelu, TORCH_TANH_GELU, "hf:gelu_new", "hf:gelu_pytorch_tanh"],
    ("silu", "none"): [lambda t: t * torch.sigmoid(t), F.silu, "hf:silu", "hf:swish"],
    ("relu2", "none"): [lambda t: F.relu(t) ** 2, "hf:relu2"],  # So et al. 2021 (Primer)
    ("glu", "none"): [lambda t: 1 / (1 + torch.exp(-t)), torch.sigmoid, "hf:sigmoid"],
    ("reglu", "none"): [lambda t: t.clamp_min(0), F.relu, "hf:relu"],
    ("geglu", "none"): [erf_gelu, F.gelu, "hf:gelu"],
    ("geglu", "tanh"): [tanh_gelu, TORCH_TANH_GELU, "hf:gelu_new", "hf:gelu_pytorch_tanh"],
    ("swiglu", "none"): [lambda t: t * torch.sigmoid(t), F.silu, "hf:silu"],  # Swish with beta = 1
    ("bilinear", "none"): [lambda t: t, "hf:linear"],
}
CASES = [
    pytest.param(n, a, i, id=f"{n}-{a}-" + (ref if isinstance(ref, str) else "formula" if i == 0 else "torch"))
    for (n, a), refs in REFERENCES.items()
    for i, ref in enumerate(refs)
]


def _resolve(ref: Ref) -> Callable:
    if isinstance(ref, str):
        acts = pytest.importorskip("transformers.activations")
        key = ref.removeprefix("hf:")
        if key not in acts.ACT2FN:
            pytest.skip(f"transformers has no ACT2FN[{key!r}]")
        return acts.ACT2FN[key]
    return ref


def _ffn(name: str, d: int = D, **kw) -> torch.nn.Module:
    return ACTIVATIONS.build(OmegaConf.structured(ActivationConfig(name=name, **kw)), d)


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _bias(linear: torch.nn.Linear, chunks: int = 1) -> tuple:
    return linear.bias.chunk(chunks) if linear.bias is not None else (0,) * chunks


def _equation(ffn: torch.nn.Module, x: Tensor, act: Callable, gated: bool) -> Tensor:
    """ungated: W_down act(W_up x + b_up) + b_down
    gated (Shazeer 2020): W_down (act(W_gate x + b_gate) * (W_up x + b_up)) + b_down"""
    if gated:
        (w_gate, w_up), (b_gate, b_up) = ffn.gate_up.weight.chunk(2), _bias(ffn.gate_up, 2)
        hidden = act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)
    else:
        hidden = act(x @ ffn.up.weight.T + _bias(ffn.up)[0])
    return hidden @ ffn.down.weight.T + _bias(ffn.down)[0]


def test_the_options_are_exactly_these():
    assert ACTIVATIONS.names() == sorted(UNGATED + GATED)


@pytest.mark.parametrize("name, approximate, ref", CASES)
def test_ffn_matches_its_equation(name, approximate, ref):
    """The activation on a grid and the whole FFN (biases on) equal the equation with the reference act."""
    torch.manual_seed(0)
    act = _resolve(REFERENCES[name, approximate][ref])
    ffn = _ffn(name, bias=True, approximate=approximate)
    gated = name in GATED
    assert isinstance(ffn, GatedFFN if gated else FFN)
    grid = torch.linspace(-8, 8, 4001)
    torch.testing.assert_close(ffn.act(grid), act(grid), atol=1e-6, rtol=0)
    x = 2 * torch.randn(2, 5, D)
    torch.testing.assert_close(ffn(x), _equation(ffn, x, act, gated), atol=1e-6, rtol=0)


def test_glu_matches_torch_glu():
    """torch's F.glu(a | b) = a * sigmoid(b) (Dauphin et al. 2017): a second reference for the gated path."""
    torch.manual_seed(0)
    ffn = _ffn("glu")
    x = torch.randn(2, 5, D)
    gate, up = (x @ ffn.gate_up.weight.T).chunk(2, dim=-1)
    expected = F.glu(torch.cat([up, gate], -1), dim=-1) @ ffn.down.weight.T
    torch.testing.assert_close(ffn(x), expected, atol=1e-6, rtol=0)


HF_GATED = {  # variant -> LlamaConfig.hidden_act
    ("glu", "none"): "sigmoid",
    ("reglu", "none"): "relu",
    ("geglu", "none"): "gelu",
    ("geglu", "tanh"): "gelu_pytorch_tanh",
    ("swiglu", "none"): "silu",
    ("bilinear", "none"): "linear",
}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("name, approximate", list(HF_GATED))
def test_gated_ffn_matches_transformers_llama_mlp(name, approximate, bias):
    """LlamaMLP computes down(act(gate(x)) * up(x)) with separate matrices; ours stacks gate and up in one."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    torch.manual_seed(0)
    ffn = _ffn(name, d=64, bias=bias, approximate=approximate)
    d_ff = ffn.down.in_features
    config = llama.LlamaConfig(
        hidden_size=64, intermediate_size=d_ff, hidden_act=HF_GATED[name, approximate], mlp_bias=bias
    )
    mlp = llama.LlamaMLP(config)
    with torch.no_grad():
        ffn.gate_up.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        ffn.down.weight.copy_(mlp.down_proj.weight)
        if bias:
            ffn.gate_up.bias.copy_(torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]))
            ffn.down.bias.copy_(mlp.down_proj.bias)
    x = 2 * torch.randn(3, 7, 64)
    torch.testing.assert_close(ffn(x), mlp(x), atol=1e-6, rtol=0)


HF_UNGATED = {  # variant -> GPT2Config.activation_function
    ("relu", "none"): "relu",
    ("gelu", "none"): "gelu",
    ("gelu", "tanh"): "gelu_new",
    ("silu", "none"): "silu",
    ("relu2", "none"): "relu2",
}


@pytest.mark.parametrize("name, approximate", list(HF_UNGATED))
def test_ungated_ffn_matches_transformers_gpt2_mlp(name, approximate):
    """GPT2MLP is c_proj(act(c_fc(x))); its Conv1D stores weights [in, out]: our Linear weights transposed."""
    gpt2 = pytest.importorskip("transformers.models.gpt2.modeling_gpt2")
    if HF_UNGATED[name, approximate] not in pytest.importorskip("transformers.activations").ACT2FN:
        pytest.skip("activation not in this transformers version")
    torch.manual_seed(0)
    ffn = _ffn(name, d=64, bias=True, approximate=approximate)
    config = gpt2.GPT2Config(n_embd=64, activation_function=HF_UNGATED[name, approximate], resid_pdrop=0.0)
    mlp = gpt2.GPT2MLP(4 * 64, config).eval()
    with torch.no_grad():
        mlp.c_fc.weight.copy_(ffn.up.weight.T)
        mlp.c_fc.bias.copy_(ffn.up.bias)
        mlp.c_proj.weight.copy_(ffn.down.weight.T)
        mlp.c_proj.bias.copy_(ffn.down.bias)
    x = 2 * torch.randn(3, 7, 64)
    torch.testing.assert_close(ffn(x), mlp(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["gelu", "geglu"])
def test_gelu_tanh_differs_from_exact_by_a_small_nonzero_amount(name):
    """The tanh form is off by at most ~5e-4 (near |x| = 2.7): close, yet a real, measurable switch."""
    torch.manual_seed(0)
    grid = torch.linspace(-8, 8, 4001)
    exact, tanh = _ffn(name), _ffn(name, approximate="tanh")
    act_gap = (exact.act(grid) - tanh.act(grid)).abs().max().item()
    assert 1e-4 < act_gap < 1e-3
    tanh.load_state_dict(exact.state_dict())
    x = 2 * torch.randn(4, 8, D)
    y_exact, y_tanh = exact(x), tanh(x)
    gap = (y_exact - y_tanh).abs().max().item()
    assert 1e-6 < gap < 1e-3 * y_exact.abs().max().item()


def _load_shared(ffn: torch.nn.Module, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> None:
    """The same weights in every option: an ungated FFN's W_up is the gated options' W_gate."""
    with torch.no_grad():
        if isinstance(ffn, GatedFFN):
            ffn.gate_up.weight.copy_(torch.cat([w_gate, w_up]))
        else:
            ffn.up.weight.copy_(w_gate)
        ffn.down.weight.copy_(w_down)


def test_every_switch_changes_the_output():
    """All pairs of (name, approximate) differ on one input with every weight shared (explicit d_ff, so the
    shapes match); a GELU approximation set on an option without GELU is ignored (no change)."""
    torch.manual_seed(0)
    d_ff = 96
    w_gate, w_up = torch.randn(d_ff, D) / D**0.5, torch.randn(d_ff, D) / D**0.5
    w_down = torch.randn(D, d_ff) / d_ff**0.5
    x = 2 * torch.randn(4, 8, D)
    outputs = {}
    for name, approximate in VARIANTS:
        ffn = _ffn(name, d_ff=d_ff, approximate=approximate)
        _load_shared(ffn, w_gate, w_up, w_down)
        outputs[name, approximate] = ffn(x)
    for a, b in itertools.combinations(outputs, 2):
        assert (outputs[a] - outputs[b]).abs().max() > 1e-4, (a, b)
    for name in ["relu", "silu", "relu2", "glu", "reglu", "swiglu", "bilinear"]:
        ffn = _ffn(name, d_ff=d_ff, approximate="tanh")
        _load_shared(ffn, w_gate, w_up, w_down)
        torch.testing.assert_close(ffn(x), outputs[name, "none"], atol=0, rtol=0)


@pytest.mark.parametrize("name", UNGATED + GATED)
def test_bias_switch_adds_exactly_its_parameters_and_changes_output(name):
    """Biases on up (or gate_up) and down: d_ff + d ungated, 2 * d_ff + d gated."""
    torch.manual_seed(0)
    d_ff = 100
    with_bias, without = _ffn(name, d_ff=d_ff, bias=True), _ffn(name, d_ff=d_ff, bias=False)
    assert _params(with_bias) - _params(without) == (2 if name in GATED else 1) * d_ff + D
    without.load_state_dict(with_bias.state_dict(), strict=False)  # weights shared, biases only in one
    x = torch.randn(2, 3, D)
    assert (with_bias(x) - without(x)).abs().max() > 1e-4


@pytest.mark.parametrize("name", UNGATED + GATED)
def test_explicit_d_ff_is_used_as_given(name):
    """An explicit width is not rounded to multiple_of (100 is not a multiple of 8)."""
    ffn = _ffn(name, d_ff=100, multiple_of=8)
    rows = ffn.gate_up.weight.shape[0] // 2 if name in GATED else ffn.up.weight.shape[0]
    assert rows == 100 and ffn.down.weight.shape == (D, 100)
    assert _params(ffn) == (3 if name in GATED else 2) * D * 100


@pytest.mark.parametrize("d", [128, 256, 512, 768])
@pytest.mark.parametrize("name", UNGATED + GATED)
def test_auto_d_ff_keeps_the_parameters_of_a_4d_ungated_ffn(name, d):
    """Ungated: 2 * d * 4d = 8d^2 exactly. Gated: 3 * d * d_ff with d_ff = 8d/3 rounded up to multiple_of = 8,
    so 0 <= excess < 3 * d * 8, i.e. under 3 / d of 8d^2 in the worst case (2.3% at d = 128; keep
    multiple_of <= d / 40 for a guaranteed 1%); the actual excess at these widths is 0.78% (d = 128, 256),
    0.20% (512) and 0 (768)."""
    baseline = 8 * d * d
    n = _params(_ffn(name, d=d, multiple_of=8))
    if name in UNGATED:
        assert n == baseline
    else:
        assert baseline <= n < baseline + 3 * d * 8
        assert (n - baseline) / baseline < 0.01
        assert _ffn(name, d=d, multiple_of=8).down.in_features % 8 == 0


@pytest.mark.parametrize(
    "override, key",
    [
        ("activation.approximate=fast", "activation.approximate"),
        ("activation.d_ff=0", "activation.d_ff"),
        ("activation.multiple_of=0", "activation.multiple_of"),
    ],
)
def test_bad_activation_values_name_the_key(override, key):
    cfg = compose(["activation=geglu", override])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value).startswith(key + "=")


def test_approximate_reaches_the_model_through_hydra():
    from lm_ablate.model import TransformerLM

    cfg = compose(["model=tiny", "activation=geglu", "activation.approximate=tanh"])
    ffns = [m for m in TransformerLM(cfg, 64).modules() if isinstance(m, GatedFFN)]
    assert ffns and all(f.act.approximate == "tanh" for f in ffns)
