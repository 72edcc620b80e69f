"""model.parametrization (lm_ablate/parametrization.py): sp is the code as it was, mup follows Tensor Programs V
(Yang et al. 2022) Table 3's Adam column in Table 8's multiplier form, and the coordinate check holds.

References are independent of the code under test: the init rule as it was before parametrizations existed
and the forward pass as it was are written out here; Table 3's factors are written out here as numbers."""

from __future__ import annotations

import copy
import functools
import math
import re
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from torch import nn

from lm_ablate import coord_check
from lm_ablate.config import ConfigError, compose
from lm_ablate.coord_check import coord_data, growth, spread
from lm_ablate.model import Columns, TransformerLM, softcap
from lm_ablate.optim import build_schedule
from lm_ablate.parametrization import lr_multipliers, optimizer_groups, parameter_classes, set_lr
from lm_ablate.registry import OPTIMIZERS, REGULARIZERS

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
V = 64  # vocabulary of the test models
SP_VARIANTS = [
    [],
    ["arch=gemma2"],  # tied head, sqrt(d) embedding scale, both softcaps, sandwich norms, GQA, windows
    ["model.block=parallel", "activation=swiglu"],  # the fused input matmul, a gated FFN
    ["norm.placement=deepnorm", "position=t5"],  # a placement's own branch init, a learned bucket table
    ["model.head_bias=true", "model.output_init_std=0.05", "attention.bias=true", "activation.bias=true"],
]
IDS = [" ".join(v) or "default" for v in SP_VARIANTS]


@functools.cache
def config(*overrides: str) -> DictConfig:
    return compose(["model=tiny", "model.n_heads=4", *overrides])


def build(*overrides: str, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(config(*overrides), V)


def tokens(seed: int = 0, batch: int = 3, length: int = 16) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------ the code before parametrizations


@torch.no_grad()
def init_before(model: TransformerLM, std: float, n_layers: int | None, output_std: float | None) -> None:
    """TransformerLM.init_weights as it was: N(0, std) for every matrix and embedding, std / sqrt(2L) for the
    sublayer output projections, zero biases, ``output_std`` for the head, then each placement's branch init."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            scale = 1 / math.sqrt(2 * n_layers) if n_layers and getattr(module, "is_residual_out", False) else 1
            nn.init.normal_(module.weight, std=std * scale)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        if isinstance(module, (nn.Linear, Columns)) and module.bias is not None:
            nn.init.zeros_(module.bias)
    if output_std is not None:
        nn.init.normal_(model.head.weight, std=output_std)
    for block in model.blocks:
        block.init_branches()


def forward_before(model: TransformerLM, idx: torch.Tensor) -> torch.Tensor:
    """TransformerLM.forward as it was: no multiplier between the final norm and the head."""
    x = model.project_in(model.embed(idx)) * model.embed_scale
    x = model.embed_drop(model.position.embed(model.embed_norm(x)))
    for block in model.blocks:
        x = block(x, model.position)
    return softcap(model.head(model.project_out(model.final_norm(x))).float(), model.logit_softcap)


def built_before(model: TransformerLM, cfg: DictConfig, rng_before_init: torch.Tensor) -> TransformerLM:
    """The model the code before parametrizations built from the same seed: the constructed modules (same
    RNG draws) re-initialised by ``init_before`` from the RNG state init_weights started from, the head untied
    while it runs (as it was), attention scales and the embedding scale by the rules as they were."""
    m = cfg.model
    ref = copy.deepcopy(model)
    if m.tie_embeddings:
        ref.head.weight = nn.Parameter(torch.empty_like(ref.embed.weight))
    torch.set_rng_state(rng_before_init)
    init_before(ref, m.init_std, m.n_layers if m.scaled_residual_init else None, m.output_init_std)
    if m.tie_embeddings:
        ref.head.weight = ref.embed.weight
    for block in ref.blocks:
        block.attn.scale = cfg.attention.scale or block.attn.head_dim**-0.5
    ref.embed_scale = math.sqrt(m.d_model) if m.embed_scale else 1.0
    return ref


def train_steps(model: TransformerLM, cfg: DictConfig, steps: int, grouped: bool, forward=None) -> list[float]:
    """``steps`` AdamW steps on fixed random batches (warmup + cosine from optim.py). grouped: the groups
    and per-group LR of lm_ablate.parametrization; else the regularizer's groups with one lr, as before."""
    regularizer = REGULARIZERS.build(cfg.regularization)
    groups = regularizer.param_groups(model)
    if grouped:
        groups = optimizer_groups(cfg, model, groups)
    optimizer = OPTIMIZERS.build(cfg.optim, groups, torch.device("cpu"))
    at = build_schedule(cfg.optim, steps)
    losses = []
    for step in range(steps):
        x = tokens(100 + step)
        lr = cfg.optim.lr * at(step)
        if grouped:
            set_lr(optimizer, lr)
        else:
            for group in optimizer.param_groups:
                group["lr"] = lr
        logits = (forward or type(model).__call__)(model, x[:, :-1])
        loss, _, _ = regularizer.loss(logits, x[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), regularizer.grad_clip)
        optimizer.step()
        losses.append(loss.item())
    return losses


def assert_same_parameters(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("overrides", SP_VARIANTS, ids=IDS)
def test_sp_is_the_code_before_parametrizations(overrides, monkeypatch):
    """sp (the default): the same seed gives bit-identical parameters, logits and a 5-step curve as the init,
    forward and single-LR optimizer written out above."""
    cfg = config(*overrides, "optim.warmup_steps=2")
    assert cfg.model.parametrization == "sp"
    states = []
    real_init = TransformerLM.init_weights

    def spy(self, *args, **kwargs):
        states.append(torch.get_rng_state())
        return real_init(self, *args, **kwargs)

    monkeypatch.setattr(TransformerLM, "init_weights", spy)
    torch.manual_seed(0)
    model = TransformerLM(cfg, V)
    ref = built_before(model, cfg, states[0])
    assert_same_parameters(model, ref)
    x = tokens()
    assert torch.equal(model(x), forward_before(ref, x))
    curve = train_steps(model, cfg, 5, grouped=True)
    assert curve == train_steps(ref, cfg, 5, grouped=False, forward=forward_before)
    assert_same_parameters(model, ref)


# ------------------------------------------------------------------------------------ mup at its base width


@pytest.mark.parametrize("overrides", SP_VARIANTS, ids=IDS)
def test_mup_at_its_base_width_is_sp_with_attention_scale_1_over_head_dim(overrides):
    """At d_model == mup_base_width every mup factor is 1 but the attention scale: sp with
    attention.scale = 1/head_dim gives bit-identical parameters, logits and a 5-step curve."""
    d, hd = 32, 32 // 4
    mup = build(*overrides, "model.parametrization=mup", f"model.mup_base_width={d}")
    sp = build(*overrides, f"attention.scale={1 / hd}")
    assert_same_parameters(mup, sp)
    x = tokens()
    assert torch.equal(mup(x), sp(x))
    assert not torch.equal(mup(x), build(*overrides)(x))  # the attention scale alone changes the computation
    cfg_mup = config(*overrides, "model.parametrization=mup", f"model.mup_base_width={d}")
    cfg_sp = config(*overrides, f"attention.scale={1 / hd}")
    assert train_steps(mup, cfg_mup, 5, grouped=True) == train_steps(sp, cfg_sp, 5, grouped=True)


# ------------------------------------------------------------------------------ mup against Table 3 / 8

B, W = 32, 128  # base width and width: m = 4
M = W / B
# parameter name -> class, written out per our module names (the classes of the table in parametrization.py)
CLASS_OF = [
    (r"^embed\.weight$", "input"),
    (r"^position\.table\.weight$", "input"),  # learned positions [context, d]; t5 buckets [buckets, heads]
    (r"\.(qkv|out|up|gate_up|down|fused)\.weight$", "hidden"),
    (r"^head\.weight$", "output"),
    (r"(norm\.weight|norm\.bias|\.bias|\.alpha)$", "vector"),
]
# Table 3, Adam column (Table 8's multiplier form for the output), relative to the base: m = W / B
INIT_GAIN = {"input": 1.0, "hidden": M**-0.5, "output": 1.0, "vector": 1.0}
LR_SCALE = {"input": 1.0, "hidden": 1 / M, "output": 1.0, "vector": 1.0}


def expected_class(name: str) -> str:
    return next(cls for pattern, cls in CLASS_OF if re.search(pattern, name))


MUP = ("model.parametrization=mup", f"model.mup_base_width={B}", f"model.d_model={W}")


@pytest.mark.parametrize("overrides", SP_VARIANTS, ids=IDS)
def test_mup_init_is_table_3_per_parameter_class(overrides):
    """Same seed, same width: every mup parameter is the sp one times its class's init gain (hidden m^-1/2,
    others 1); the hidden std itself is init_std * m^-1/2 (/ sqrt(2L) on out and down) by measurement."""
    sp = build(*overrides, f"model.d_model={W}")
    mup = build(*overrides, *MUP)
    classes = parameter_classes(mup)
    assert classes == {name: expected_class(name) for name, _ in mup.named_parameters()}
    sp_params = dict(sp.named_parameters())
    for name, p in mup.named_parameters():
        torch.testing.assert_close(p, sp_params[name] * INIT_GAIN[classes[name]], rtol=1e-6, atol=0)
    if overrides:
        return
    std, two_l = 0.02, 2 * len(mup.blocks)
    qkv, out = mup.blocks[0].attn.qkv.weight, mup.blocks[0].attn.out.weight
    assert qkv.std().item() == pytest.approx(std * M**-0.5, rel=0.05)
    assert out.std().item() == pytest.approx(std * M**-0.5 / math.sqrt(two_l), rel=0.05)
    assert mup.embed.weight.std().item() == pytest.approx(std, rel=0.05)
    assert mup.head.weight.std().item() == pytest.approx(std, rel=0.05)


@pytest.mark.parametrize("overrides", SP_VARIANTS, ids=IDS)
def test_mup_lr_and_weight_decay_per_group(overrides):
    """Every group holds one LR multiplier: hidden 1/m, every other class 1; a hidden group's weight decay
    is wd * m so AdamW's per-step decay lr * wd is the base's. param_names stay aligned with params."""
    cfg = config(*overrides, *MUP)
    model = build(*overrides, *MUP)
    wd = cfg.regularization.weight_decay
    before = REGULARIZERS.build(cfg.regularization).param_groups(model)
    decayed = {id(p) for p in before[0]["params"]}
    groups = optimizer_groups(cfg, model, before)
    names = {id(p): n for n, p in model.named_parameters()}
    seen = []
    for group in groups:
        assert group["param_names"] == [names[id(p)] for p in group["params"]]
        for name, p in zip(group["param_names"], group["params"]):
            cls = expected_class(name)
            assert group["lr_scale"] == LR_SCALE[cls], name
            base_wd = wd if id(p) in decayed else 0.0
            assert group["weight_decay"] == pytest.approx(base_wd * (M if cls == "hidden" else 1.0)), name
            seen.append(name)
    assert sorted(seen) == sorted(names.values())
    assert lr_multipliers(cfg) == LR_SCALE
    assert set(lr_multipliers(config(*overrides)).values()) == {1.0}
    assert optimizer_groups(config(*overrides), model, before) is before  # sp: untouched


def test_mup_lr_reaches_the_optimizer():
    """One AdamW step from zero moments moves each entry by lr * g / (|g| + eps) ~ lr: hidden entries by
    lr / m, embedding and head entries by lr (weight decay off to see the update alone)."""
    cfg = config(*MUP, "regularization.weight_decay=0", "regularization.grad_clip=0")
    model = build(*MUP)
    regularizer = REGULARIZERS.build(cfg.regularization)
    groups = optimizer_groups(cfg, model, regularizer.param_groups(model))
    optimizer = OPTIMIZERS.build(cfg.optim, groups, torch.device("cpu"))
    lr = 1e-3
    set_lr(optimizer, lr)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = tokens()
    regularizer.loss(model(x[:, :-1]), x[:, 1:])[0].backward()
    optimizer.step()
    for name, p in model.named_parameters():
        step = (p.detach() - before[name]).abs().max().item()
        assert step == pytest.approx(lr * LR_SCALE[expected_class(name)], rel=1e-3), name


@pytest.mark.parametrize("bias, mult", [(False, 1.0), (True, 1.0), (False, 2.5), (True, 0.25)])
def test_mup_logits_are_the_head_of_the_final_state_over_m(bias, mult):
    """logits = W_out (a_out h / m) + b (Table 8's 1/fan_in output multiplier, times the base output multiplier
    model.mup_output_mult = a_out, microsoft/mup's MuReadout output_mult; a head bias is not scaled): the mup
    model's logits from those of an sp model holding the same weights, whose head reads h itself."""
    extra = ("model.head_bias=true",) if bias else ()
    mup = build(*extra, *MUP, *([f"model.mup_output_mult={mult}"] if mult != 1.0 else []))
    sp = build(*extra, f"model.d_model={W}", f"attention.scale={1 / (W // 4)}")
    sp.load_state_dict(mup.state_dict())
    if bias:
        with torch.no_grad():
            mup.head.bias.normal_()
            sp.head.bias.copy_(mup.head.bias)
    x = tokens()
    b = mup.head.bias if bias else 0.0
    torch.testing.assert_close(mup(x), (sp(x) - b) * mult / M + b, rtol=1e-5, atol=1e-6)
    assert mup.output_multiplier == pytest.approx(mult / M) and sp.output_multiplier == 1.0


@pytest.mark.parametrize("width, mult", [(32, 1.0), (64, 1.0), (128, 1.0), (32, 4.0), (128, 0.5)])
def test_mup_attention_scale_is_1_over_head_dim(width, mult):
    """a_attn q.k / head_dim (TP V section 4; a_attn = model.mup_attn_mult, the base attention multiplier of
    microsoft/mutransformers' attn_mult), head_dim = width / n_heads: the module's attention output against the
    softmax written out here with that scale."""
    extra = [f"model.mup_attn_mult={mult}"] if mult != 1.0 else []
    model = build("model.parametrization=mup", "model.mup_base_width=32", f"model.d_model={width}", *extra)
    hd = width // 4
    attn = model.blocks[0].attn
    assert attn.scale == pytest.approx(mult / hd)
    h = torch.randn(2, 16, width)
    q, k, v = attn.project(h, model.position)
    T = q.shape[-2]
    mask = torch.full((T, T), float("-inf")).triu(1)

    def attention(scale: float) -> torch.Tensor:
        probs = (q @ k.transpose(-2, -1) * scale + mask).softmax(-1)
        return attn.out((probs @ v).transpose(1, 2).reshape(2, T, width))

    torch.testing.assert_close(attn(h, model.position), attention(mult / hd), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(attn(h, model.position), attention(hd**-0.5), rtol=1e-3, atol=1e-5)


def test_mup_embed_scale_is_frozen_at_the_base_width():
    """model.embed_scale multiplies by sqrt(base width) under mup (an input multiplier must not grow with
    width), sqrt(d_model) under sp."""
    assert build("model.embed_scale=true", *MUP).embed_scale == math.sqrt(B)
    assert build("model.embed_scale=true", f"model.d_model={W}").embed_scale == math.sqrt(W)


# ------------------------------------------------------------------------------------------ mup with Muon

# the hidden class's LR multiplier under mup with Muon, per shape factor s(shape) of torch.optim.Muon: the update
# lr s O has spectral norm lr s (O orthogonal), which the spectral condition (Yang, Simon & Bernstein 2023) wants
# constant in width: original s = sqrt(max(1, rows/cols)) is constant, match_rms_adamw s = 0.2 sqrt(max(rows,
# cols)) grows as sqrt(m), so its LR takes m^-1/2
MUON_HIDDEN_LR = {"original": 1.0, "match_rms_adamw": M**-0.5}


@pytest.mark.parametrize("fn", sorted(MUON_HIDDEN_LR))
@pytest.mark.parametrize("overrides", SP_VARIANTS, ids=IDS)
def test_mup_muon_lr_and_weight_decay_per_group(overrides, fn):
    """Muon's part holds exactly the hidden class, at its multiplier (above) and weight decay wd / multiplier
    (lr * wd the base's); AdamW's part holds the other classes at 1, as under Adam."""
    muon = (*MUP, "optim=muon", f"optim.adjust_lr_fn={fn}")
    cfg, model = config(*overrides, *muon), build(*overrides, *muon)
    wd = cfg.regularization.weight_decay
    before = REGULARIZERS.build(cfg.regularization).param_groups(model)
    decayed = {id(p) for p in before[0]["params"]}
    optimizer = OPTIMIZERS.build(cfg.optim, optimizer_groups(cfg, model, before), torch.device("cpu"))
    expected = dict(LR_SCALE, hidden=MUON_HIDDEN_LR[fn])
    seen = []
    for part, opt in optimizer.parts.items():
        for group in opt.param_groups:
            for name, p in zip(group["param_names"], group["params"]):
                cls = expected_class(name)
                assert (cls == "hidden") == (part == "muon"), (part, name)
                assert group["lr_scale"] == pytest.approx(expected[cls]), name
                base_wd = wd if id(p) in decayed else 0.0
                assert group["weight_decay"] == pytest.approx(base_wd / expected[cls]), name
                seen.append(name)
    assert sorted(seen) == sorted(n for n, _ in model.named_parameters())
    assert lr_multipliers(cfg) == pytest.approx(expected)


def one_step_spectral_norms(width: int, *overrides: str) -> dict[str, float]:
    """Block matrix -> ||dW||_2 / sqrt(fan_out / fan_in) of one Muon step at lr 1e-2 (no decay, no clipping)."""
    cfg = compose(["model=tiny", "model.n_heads=2", f"model.d_model={width}", "optim=muon",
                   "regularization.weight_decay=0", "regularization.grad_clip=0", *overrides])  # fmt: skip
    torch.manual_seed(0)
    model = TransformerLM(cfg, V)
    regularizer = REGULARIZERS.build(cfg.regularization)
    optimizer = OPTIMIZERS.build(
        cfg.optim, optimizer_groups(cfg, model, regularizer.param_groups(model)), torch.device("cpu")
    )
    set_lr(optimizer, 1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = tokens()
    regularizer.loss(model(x[:, :-1]), x[:, 1:])[0].backward()
    optimizer.step()
    out = {}
    for name, p in model.named_parameters():
        if expected_class(name) == "hidden":
            d = p.detach() - before[name]
            out[name] = torch.linalg.matrix_norm(d, ord=2).item() / math.sqrt(d.shape[0] / d.shape[1])
    return out


@pytest.mark.parametrize("fn", sorted(MUON_HIDDEN_LR))
def test_mup_muon_update_meets_the_spectral_condition(fn):
    """Measured with torch.linalg.matrix_norm: under mup one Muon step moves every hidden matrix by a spectral
    norm / sqrt(fan_out / fan_in) the same at widths 32..256 within 10% (measured <= 6%); under sp with
    match_rms_adamw it grows like sqrt(m) (measured 2.8-3.0x over 8x in width)."""
    widths = (32, 64, 128, 256)
    mup = [one_step_spectral_norms(w, "model.parametrization=mup", "model.mup_base_width=32",
                                   f"optim.adjust_lr_fn={fn}") for w in widths]  # fmt: skip
    for name in mup[0]:
        ratios = [norms[name] / mup[0][name] for norms in mup]
        assert max(ratios) / min(ratios) < 1.1, (name, ratios)
    if fn == "match_rms_adamw":
        sp = [one_step_spectral_norms(w, "optim.adjust_lr_fn=match_rms_adamw") for w in (32, 256)]
        assert all(sp[1][name] / sp[0][name] > 2.5 for name in sp[0]), sp


# ---------------------------------------------------------------------------------- coordinate check

WIDTHS = (32, 64, 128, 256)  # 8x


@pytest.fixture(scope="module")
def coords(cache_dir):
    """model=tiny (2 layers, 2 heads: head_dim 16..128), batch 4 x 32 tokens, 3 AdamW steps at lr 3e-3."""
    overrides = ["model=tiny", "train.batch_size=4", "tracking=none", f"data.cache_dir={cache_dir}"]
    return coord_data(overrides, WIDTHS, steps=3)


def test_coord_check_mup_is_flat_in_width(coords):
    """After 3 steps every layer's RMS (embedding, each attention / FFN output, each block's stream, the
    logits) varies by at most 2x across 32..256 (measured: 1.4x at most). At init the logits shrink like
    m^-1/2 (init W_out constant, h / m summed over m times more coordinates): 1/sqrt(8), measured 0.34."""
    after = spread(coords, "mup", 3)
    assert max(after.values()) <= 2.0, after
    assert growth(coords, "mup", 0)["logits"] == pytest.approx(8**-0.5, rel=0.15)


def test_coord_check_sp_grows_with_width(coords):
    """Under sp the same 3 steps leave the hidden activations far larger at width 256 than at 32 (measured:
    block outputs 18x and 27x, attention / FFN outputs 12-44x, logits 6.6x)."""
    g = growth(coords, "sp", 3)
    assert min(g["block0"], g["block1"]) > 8, g
    assert g["logits"] > 3, g


@pytest.fixture(scope="module")
def muon_coords(cache_dir):
    """As ``coords`` with Muon (conf/optim/muon.yaml: match_rms_adamw, lr 2e-2) instead of AdamW."""
    overrides = ["model=tiny", "train.batch_size=4", "tracking=none", f"data.cache_dir={cache_dir}", "optim=muon"]
    return coord_data(overrides, WIDTHS, steps=3)


def test_coord_check_mup_with_muon_is_flat_in_width(muon_coords):
    """mup with Muon: after 3 steps every layer's RMS varies by at most 1.5x across 32..256 (measured 1.37x;
    Adam's 1/m hidden rule gives 1.99x, shrinking updates, and no width factor 3.3x, growing ones); sp grows
    (attention / FFN outputs 6.8-13x, logits 3.2x)."""
    after = spread(muon_coords, "mup", 3)
    assert max(after.values()) <= 1.5, after
    g = growth(muon_coords, "sp", 3)
    assert min(g[f"block{i}.{part}"] for i in (0, 1) for part in ("attn", "ffn")) > 4, g
    assert g["logits"] > 2, g


def test_coord_check_cli_writes_plots(cache_dir, tmp_path, capsys):
    argv = ["--widths", "16,32", "--steps", "1", "--out", str(tmp_path), "model=tiny", "train.batch_size=2"]
    assert coord_check.main([*argv, "model.context=8", "tracking=none", f"data.cache_dir={cache_dir}"]) == 0
    assert (tmp_path / "coord_check_sp.png").stat().st_size > 1000
    assert (tmp_path / "coord_check_mup.png").stat().st_size > 1000
    rows = (tmp_path / "coord_check.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 2 * 8  # header; sp, mup x 2 widths x steps 0, 1 x 8 layers
    assert "mup: step 1, widths 16..32" in capsys.readouterr().out


def test_coord_check_bad_input_is_one_line(capsys):
    assert coord_check.main(["--widths", "16,32", "model.parametrization=mup", "optim=sgd"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lm-ablate: error: optim.name='sgd' is invalid") and "\n" not in err


# ------------------------------------------------------------------- every preset; undefined combinations


ARCHS = sorted(p.stem for p in (ROOT / "conf" / "arch").glob("*.yaml"))
PLACEMENTS = ["pre", "post", "sandwich", "reordered", "deepnorm", "rezero", "none"]


@pytest.mark.parametrize(
    "overrides",
    [[f"arch={a}"] for a in ARCHS] + [[f"norm.placement={p}"] for p in PLACEMENTS] + [["position=t5"]],
    ids=lambda o: o[0],
)
def test_mup_builds_and_trains_with_every_preset(overrides):
    """Every parameter of every preset has a class (a matrix without one would raise), and a step trains."""
    cfg = config(*overrides, "model.parametrization=mup", "model.mup_base_width=16")
    model = build(*overrides, "model.parametrization=mup", "model.mup_base_width=16")
    assert set(parameter_classes(model).values()) <= {"input", "hidden", "output", "vector"}
    losses = train_steps(model, cfg, 2, grouped=True)
    assert all(math.isfinite(v) for v in losses)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model.parametrization=abc"], "model.parametrization='abc' is invalid: allowed: mup, sp"),
        (["model.parametrization=mup"], "model.mup_base_width=None is invalid: must be set"),
        (["model.parametrization=mup", "model.mup_base_width=0"], "model.mup_base_width=0 is invalid"),
        (["model.parametrization=mup", "model.mup_base_width=16", "optim=sgd"], "optim.name='sgd' is invalid"),
        (["model.parametrization=mup", "model.mup_base_width=16", "optim=adafactor"], "optim.name='adafactor'"),
        (["model.parametrization=mup", "model.mup_base_width=16", "attention.scale=0.1"], "attention.scale=0.1"),
        (
            ["model.parametrization=mup", "model.mup_base_width=16", "model.mup_output_mult=0"],
            "model.mup_output_mult=0.0 is invalid: must be a positive number",
        ),
        (
            ["model.parametrization=mup", "model.mup_base_width=16", "model.mup_attn_mult=-1"],
            "model.mup_attn_mult=-1.0 is invalid: must be a positive number",
        ),
        (
            ["model.mup_output_mult=2"],
            "model.mup_output_mult=2.0 is invalid: model.parametrization=sp has no mup_output_mult (mup)",
        ),
        (
            ["model.mup_attn_mult=2"],
            "model.mup_attn_mult=2.0 is invalid: model.parametrization=sp has no mup_attn_mult (mup)",
        ),
        (["model.parametrization=mup", "model.mup_base_width=16", "model.embed_dim=16"], "model.embed_dim=16"),
    ],
)
def test_undefined_combinations_are_refused_with_one_line(overrides, key):
    with pytest.raises(ConfigError) as err:
        TransformerLM(compose(["model=tiny", *overrides]), V)
    message = str(err.value)
    assert message.startswith(key) and "\n" not in message


def test_lr_transfer_study_arms_build():
    """Each swept value of the lr_transfer study composes, validates and builds (d_model and lr included)."""
    import yaml

    spec = yaml.safe_load((ROOT / "sweeps" / "lr_transfer.yaml").read_text())
    params = {k: str(v).split(",") for k, v in spec["hydra"]["sweeper"]["params"].items()}
    assert len(params["model.d_model"]) >= 4 and max(map(int, params["model.d_model"])) >= 8 * min(
        map(int, params["model.d_model"])
    )
    assert set(params["model.parametrization"]) == {"sp", "mup"} and len(params["seed"]) >= 2
    for width in params["model.d_model"]:
        for name in params["model.parametrization"]:
            cfg = compose(["experiment=lr_transfer", f"model.d_model={width}", f"model.parametrization={name}"])
            assert cfg.study == "lr_transfer" and cfg.model.mup_base_width == (
                min(map(int, params["model.d_model"])) if cfg.model.parametrization == "mup" else None
            )  # sp has no base width (lm_ablate/options.py)
            TransformerLM(cfg, V)
