"""Optimizers (``optim=adamw|muon|adafactor|sgd``): two steps from known gradients equal each update rule
written out here in float64 (the papers' formulas, as torch implements them), Muon's split of the parameters,
the combined optimizer's interface to the loop, decay groups, state dicts, and bad settings."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from lm_ablate.config import CONF_DIR, ConfigError, OptimConfig, RegularizationConfig, compose, validate
from lm_ablate.model import TransformerLM
from lm_ablate.optim import Combined, is_hidden_matrix
from lm_ablate.registry import OPTIMIZERS
from lm_ablate.regularization import Regularizer

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
NS = (3.4445, -4.7750, 2.0315)  # Jordan's quintic coefficients
NAMES = ("adamw", "muon", "adafactor", "sgd")


def config(name: str, **kw) -> OptimConfig:
    """The yaml's values (conf/optim/<name>.yaml) with ``kw`` on top."""
    cfg = compose([f"optim={name}"]).optim
    return OptimConfig(**{**{k: cfg[k] for k in cfg}, **kw})


def toy_groups(seed: int = 0) -> list[dict]:
    """Two hidden matrices (tall, wide), an embedding and a norm gain, in a decay and a no-decay group."""
    gen = torch.Generator().manual_seed(seed)
    t = {
        "blocks.0.attn.qkv.weight": torch.randn(12, 8, generator=gen),
        "blocks.0.ffn.down.weight": torch.randn(8, 12, generator=gen),
        "embed.weight": torch.randn(16, 8, generator=gen),
        "final_norm.weight": 1 + 0.1 * torch.randn(8, generator=gen),
    }
    p = {k: nn.Parameter(v) for k, v in t.items()}
    decay = ["blocks.0.attn.qkv.weight", "blocks.0.ffn.down.weight"]
    rest = ["embed.weight", "final_norm.weight"]
    return [
        {"params": [p[n] for n in decay], "param_names": decay, "weight_decay": 0.1},
        {"params": [p[n] for n in rest], "param_names": rest, "weight_decay": 0.0},
    ]


def named(groups: list[dict]) -> dict[str, nn.Parameter]:
    return {n: p for g in groups for n, p in zip(g["param_names"], g["params"])}


def grads(groups: list[dict], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + seed)
    return {n: torch.randn(p.shape, generator=gen) for n, p in named(groups).items()}


def run_steps(cfg: OptimConfig, n_steps: int = 2):
    """Build the optimizer on fresh toy groups, take ``n_steps`` steps from known gradients. Returns the
    initial values, the gradients of each step and the parameters after."""
    groups = toy_groups()
    params = named(groups)
    start = {n: p.detach().double().clone() for n, p in params.items()}
    opt = OPTIMIZERS.build(cfg, groups, CPU)
    seen = []
    for step in range(n_steps):
        g = grads(groups, step)
        for n, p in params.items():
            p.grad = g[n].clone()
        opt.step()
        seen.append({n: v.double() for n, v in g.items()})
    return start, seen, {n: p.detach().double() for n, p in params.items()}, opt


# --- each update rule, written out ------------------------------------------------------------------------
def adamw_rule(p, gs, lr, wd, b1, b2, eps):
    """Loshchilov & Hutter 2019, Algorithm 2 with bias correction (Kingma & Ba 2015)."""
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(gs, start=1):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
    return p


def sgd_rule(p, gs, lr, wd, mu, nesterov):
    """Heavy ball / Nesterov as torch writes them: b_1 = g_1, b_t = mu b_{t-1} + g_t; L2 decay in g."""
    b = None
    for g in gs:
        g = g + wd * p
        b = g if b is None else mu * b + g
        p = p - lr * (g + mu * b if nesterov else b)
    return p


def newton_schulz(u, steps=5):
    """The quintic iteration X <- a X + (b A + c A^2) X with A = X X^T, from X = u / ||u||_F, on the wide side."""
    a, b, c = NS
    tall = u.shape[0] > u.shape[1]
    x = u.T if tall else u
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def muon_rule(p, gs, lr, wd, mu, nesterov, adjust):
    """Jordan et al. 2024 with torch's EMA buffer: b <- mu b + (1 - mu) g, u = (1 - mu) g + mu b (Nesterov);
    p <- p (1 - lr wd) - lr s NS(u), s = sqrt(max(1, A/B)) (original) or 0.2 sqrt(max(A, B)) (Liu et al.)."""
    rows, cols = p.shape
    s = math.sqrt(max(1, rows / cols)) if adjust == "original" else 0.2 * math.sqrt(max(rows, cols))
    b = torch.zeros_like(p)
    for g in gs:
        b = mu * b + (1 - mu) * g
        u = (1 - mu) * g + mu * b if nesterov else b
        p = p * (1 - lr * wd) - lr * s * newton_schulz(u)
    return p


def adafactor_rule(p, gs, rho, wd, decay, eps1, eps2, d):
    """Shazeer & Stern 2018, Algorithm 4 without momentum (beta1 = 0), as torch implements it: row/column
    means of g^2 for a matrix (full g^2 for a vector), 1 - beta2_t = t^decay, relative step
    alpha_t = max(eps2, RMS(p_{t-1})) min(rho, 1/sqrt(t)), update clipping at d, decoupled decay rho wd."""
    r = c = v = None
    for t, g in enumerate(gs, start=1):
        w = t**decay
        alpha = max(eps2, p.pow(2).mean().sqrt().item()) * min(rho, 1 / math.sqrt(t))
        p = p * (1 - rho * wd)
        if p.ndim == 2:
            r = (1 - w) * (0 if r is None else r) + w * (g * g).mean(dim=1, keepdim=True)
            c = (1 - w) * (0 if c is None else c) + w * (g * g).mean(dim=0, keepdim=True)
            v_hat = r @ c / r.mean().clamp(min=eps1)
        else:
            v = (1 - w) * (0 if v is None else v) + w * g * g
            v_hat = v
        u = g / v_hat.clamp(min=eps1 * eps1).sqrt()
        p = p - alpha * u / max(1.0, u.pow(2).mean().sqrt().item() / d)
    return p


def test_adamw_matches_its_rule():
    cfg = config("adamw", lr=0.01)
    start, seen, after, _ = run_steps(cfg)
    for n, p in after.items():
        wd = 0.1 if "blocks" in n else 0.0
        want = adamw_rule(start[n], [s[n] for s in seen], 0.01, wd, cfg.beta1, cfg.beta2, cfg.eps)
        torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_matches_its_rule(nesterov):
    cfg = config("sgd", lr=0.05, momentum=0.8, nesterov=nesterov)
    start, seen, after, _ = run_steps(cfg, n_steps=3)
    for n, p in after.items():
        wd = 0.1 if "blocks" in n else 0.0
        want = sgd_rule(start[n], [s[n] for s in seen], 0.05, wd, 0.8, nesterov)
        torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6)
        other = sgd_rule(start[n], [s[n] for s in seen], 0.05, wd, 0.8, not nesterov)
        assert (other - p).abs().max() > 1e-3  # the switch changes the computation


def test_adafactor_matches_its_rule():
    cfg = config("adafactor", lr=0.02, eps2=1e-3, clip_threshold=1.0)
    start, seen, after, _ = run_steps(cfg, n_steps=3)
    for n, p in after.items():
        wd = 0.1 if "blocks" in n else 0.0
        want = adafactor_rule(start[n], [s[n] for s in seen], 0.02, wd, -0.8, cfg.eps, 1e-3, 1.0)
        torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6)
    # clipping is active in these steps: a threshold that never clips gives another result
    _, _, unclipped, _ = run_steps(config("adafactor", lr=0.02, clip_threshold=1e6), n_steps=3)
    assert (unclipped["embed.weight"] - after["embed.weight"]).abs().max() > 1e-5


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_matches_its_rule(adjust, nesterov):
    """torch orthogonalizes in bf16 (relative error ~2% against float64 here): the matrices are compared in
    Frobenius norm at 5%; each alternative (the other adjust_lr_fn, the other momentum form) is > 15% away.
    The AdamW part (embedding, gain) is exact."""
    cfg = config("muon", lr=0.02, adjust_lr_fn=adjust, nesterov=nesterov, momentum=0.6)
    start, seen, after, opt = run_steps(cfg, n_steps=3)
    assert opt.assignment == {
        "muon": ["blocks.0.attn.qkv.weight", "blocks.0.ffn.down.weight"],
        "adamw": ["embed.weight", "final_norm.weight"],
    }
    for n in opt.assignment["muon"]:
        gs = [s[n] for s in seen]
        moved = after[n] - start[n]

        def gap(adjust_fn, nest, mu=0.6, n=n, gs=gs, moved=moved):
            want = muon_rule(start[n], gs, 0.02, 0.1, mu, nest, adjust_fn) - start[n]
            return ((moved - want).norm() / want.norm()).item()

        assert gap(adjust, nesterov) < 0.05
        other = "original" if adjust == "match_rms_adamw" else "match_rms_adamw"
        assert min(gap(other, nesterov), gap(adjust, not nesterov), gap(adjust, nesterov, mu=0.95)) > 0.15
    for n in opt.assignment["adamw"]:
        want = adamw_rule(start[n], [s[n] for s in seen], 0.02, 0.0, cfg.beta1, cfg.beta2, cfg.eps)
        torch.testing.assert_close(after[n], want, rtol=1e-5, atol=1e-6)


def test_newton_schulz_written_here_is_torchs_in_float64():
    """The iteration the test writes out is torch's (_zeropower_via_newtonschulz casts to bf16: run in float64
    by comparing at bf16 tolerance on many shapes; and it does approximately orthogonalize)."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    gen = torch.Generator().manual_seed(0)
    for shape in [(12, 8), (8, 12), (32, 32), (96, 32)]:
        g = torch.randn(shape, generator=gen)
        ours = newton_schulz(g.double())
        theirs = _zeropower_via_newtonschulz(g, NS, 5, 1e-7).double()
        assert ((ours - theirs).norm() / ours.norm()) < 0.04
        sv = torch.linalg.svdvals(ours)
        assert sv.min() > 0.5 and sv.max() < 1.5  # Jordan: singular values end in about [0.7, 1.2]


# --- Muon's split of the parameters -----------------------------------------------------------------------
def roles_by_module(model: TransformerLM) -> dict[str, str]:
    """An independent reading of the rule from module types: the weight of every nn.Linear except the LM head
    is a hidden matrix; embeddings (token, position tables), the head, norms, biases and scalars are not."""
    hidden = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear) and m is not model.head}
    return {n: "muon" if id(p) in hidden else "adamw" for n, p in model.named_parameters()}


ARCHES = [
    [],
    ["arch=llama"],
    ["arch=gpt2"],
    ["arch=palm"],  # parallel block, fused input projection, tied head
    ["arch=gptj"],  # fused parallel input, head bias
    ["arch=neox"],
    ["arch=bloom"],  # embedding norm
    ["arch=olmo2"],  # QK-norm gains
    ["arch=gemma2"],
    ["position=t5"],  # a 2-D bias table that is an embedding
    ["model.embed_dim=16"],  # project_in / project_out
    ["model.tie_embeddings=true"],
    ["norm.placement=rezero"],  # scalar gates
]


@pytest.mark.parametrize("overrides", ARCHES, ids=lambda o: ",".join(o) or "default")
def test_split_rule_matches_module_roles(overrides):
    cfg = compose(["model=tiny", "optim=muon", *overrides])
    model = TransformerLM(cfg, 64)
    groups = Regularizer(cfg.regularization).param_groups(model)
    opt = OPTIMIZERS.build(cfg.optim, groups, CPU)
    want = roles_by_module(model)
    got = {n: part for part, names in opt.assignment.items() for n in names}
    assert got == want
    assert sorted(n for names in opt.assignment.values() for n in names) == sorted(want)  # each name once
    assert all(is_hidden_matrix(n, p.shape) == (want[n] == "muon") for n, p in model.named_parameters())


def test_muon_without_a_hidden_matrix_fails_in_one_line():
    groups = [g for g in toy_groups() if g["weight_decay"] == 0.0]  # embedding and a gain only
    with pytest.raises(ConfigError) as err:
        OPTIMIZERS.build(config("muon"), groups, CPU)
    assert "\n" not in str(err.value) and str(err.value).startswith("optim.name='muon' is invalid")


# --- the interface the loop uses ---------------------------------------------------------------------------
def test_combined_groups_are_shared_and_keep_lr_scale():
    groups = toy_groups()
    groups[0]["lr_scale"], groups[1]["lr_scale"] = 0.5, 0.25  # as a parametrization (mup) would set them
    opt = OPTIMIZERS.build(config("muon", lr=0.02, muon_lr_scale=2.0), groups, CPU)
    assert isinstance(opt, Combined)
    flat = opt.param_groups
    assert [g["lr_scale"] for g in flat] == [1.0, 0.25]  # muon: 0.5 x muon_lr_scale 2; adamw: kept
    assert [g["lr"] for g in flat] == [0.02, 0.005]  # built at optim.lr x lr_scale
    for group in flat:  # the loop's update reaches the torch optimizers
        group["lr"] = 0.1 * group.get("lr_scale", 1.0)
    assert [g["lr"] for g in opt.parts["muon"].param_groups] == [0.1]
    assert [g["lr"] for g in opt.parts["adamw"].param_groups] == [0.025]
    for group in flat:  # lr 0 everywhere: nothing moves (decay is lr x wd too)
        group["lr"] = 0.0
    before = {n: p.detach().clone() for n, p in named(groups).items()}
    for p in named(groups).values():
        p.grad = torch.ones_like(p)
    opt.step()
    assert all(torch.equal(before[n], p) for n, p in named(groups).items())
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in named(groups).values())


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_is_exact(name):
    """Two steps, save (torch.save / torch.load(weights_only=True)), load into a fresh optimizer on a copy of
    the parameters, step both with the same gradients: identical parameters, bit for bit."""
    cfg = config(name, lr=0.01)
    a_groups = toy_groups()
    a = OPTIMIZERS.build(cfg, a_groups, CPU)
    for step in range(2):
        for n, p in named(a_groups).items():
            p.grad = grads(a_groups, step)[n]
        a.step()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b_groups = toy_groups(seed=99)
    with torch.no_grad():
        for n, p in named(b_groups).items():
            p.copy_(named(a_groups)[n])
    b = OPTIMIZERS.build(cfg, b_groups, CPU)
    b.load_state_dict(torch.load(buf, weights_only=True))
    for opt, groups in ((a, a_groups), (b, b_groups)):
        for n, p in named(groups).items():
            p.grad = grads(groups, 5)[n]
        opt.step()
    assert all(torch.equal(named(a_groups)[n], p) for n, p in named(b_groups).items())
    assert a.assignment == b.assignment and set(a.assignment) == ({"muon", "adamw"} if name == "muon" else {name})


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("emb, norms", [(False, False), (True, True)])
def test_decay_groups_apply_to_every_optimizer(name, emb, norms):
    """Zero gradients, one step: the regularizer's decayed parameters shrink by exactly 1 - lr x wd (decoupled:
    adamw, muon, adafactor; SGD's L2 step lr (0 + wd p) is the same on a first step), the rest stay put."""
    model = TransformerLM(compose(["model=tiny", "position=learned", "activation.bias=true"]), 64)
    reg = Regularizer(RegularizationConfig(name="standard", decay_embeddings=emb, decay_norms_and_biases=norms))
    groups = reg.param_groups(model)
    decayed = set(groups[0]["param_names"])
    assert ("embed.weight" in decayed) == emb and ("final_norm.weight" in decayed) == norms
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = OPTIMIZERS.build(config(name, lr=0.01), groups, CPU)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 1 - 0.01 * 0.1 if n in decayed else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, rtol=1e-6, atol=0)


def test_param_names_are_the_models():
    model = TransformerLM(compose(["model=tiny", "model.tie_embeddings=true"]), 64)
    groups = Regularizer(RegularizationConfig(name="standard")).param_groups(model)
    names = [n for g in groups for n in g["param_names"]]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert "head.weight" not in names  # tied: the embedding's tensor, listed once
    by_name = dict(model.named_parameters())
    assert all(by_name[n] is p for g in groups for n, p in zip(g["param_names"], g["params"]))


@pytest.mark.parametrize("name", [p.stem for p in sorted((CONF_DIR / "optim").glob("*.yaml"))])
def test_every_optim_yaml_builds_and_trains(name):
    """Each file of conf/optim builds and lowers the loss of a tiny model on a fixed batch in 5 steps."""
    cfg = compose(["model=tiny", "arch=llama", f"optim={name}"])
    torch.manual_seed(0)
    model = TransformerLM(cfg, 64)
    opt = OPTIMIZERS.build(cfg.optim, Regularizer(cfg.regularization).param_groups(model), CPU)
    x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert sorted(n for names in opt.assignment.values() for n in names) == sorted(
        n for n, _ in model.named_parameters()
    )


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["optim=sgd", "optim.momentum=1.0"], "optim.momentum"),
        (["optim=muon", "optim.momentum=-0.1"], "optim.momentum"),
        (["optim=sgd", "optim.momentum=0", "optim.nesterov=true"], "optim.nesterov"),
        (["optim=muon", "optim.adjust_lr_fn=spectral"], "optim.adjust_lr_fn"),
        (["optim=muon", "optim.ns_steps=0"], "optim.ns_steps"),
        (["optim=muon", "optim.muon_lr_scale=0"], "optim.muon_lr_scale"),
        (["optim=adafactor", "optim.beta2_decay=0.5"], "optim.beta2_decay"),
        (["optim=adafactor", "optim.eps2=-1"], "optim.eps2"),
        (["optim=adafactor", "optim.clip_threshold=0"], "optim.clip_threshold"),
    ],
)
def test_bad_settings_fail_in_one_line(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides))
    assert str(err.value).startswith(f"{key}=") and "\n" not in str(err.value)


def test_optim_yamls_are_the_registry():
    assert sorted(p.stem for p in Path(CONF_DIR, "optim").glob("*.yaml")) == sorted(NAMES) == OPTIMIZERS.names()


@pytest.mark.parametrize("name", NAMES)
def test_lr_mult_scales_each_optimizers_own_reference(name):
    """lr_mult=xK: optim.lr = K x the lr written in conf/optim/<name>.yaml (the optimizer study's grids)."""
    reference = float(OmegaConf.load(CONF_DIR / "optim" / f"{name}.yaml").lr)
    for k in (0.25, 0.5, 1, 2, 4):
        cfg = compose([f"optim={name}", f"lr_mult=x{k}", "experiment=optimizer"])
        assert cfg.optim.lr == k * reference and cfg.choices["lr_mult"] == f"x{k}"
    assert compose([f"optim={name}", "lr_mult=x2", "optim.lr=0.123"]).optim.lr == 0.123  # the command line wins
    assert compose([f"optim={name}"]).optim.lr == reference


def test_optimizer_study_arms():
    """Every arm of sweeps/optimizer.yaml composes, validates and gets its own optimizer's grid."""
    import yaml

    spec = yaml.safe_load((CONF_DIR.parent / "sweeps" / "optimizer.yaml").read_text())["hydra"]["sweeper"]["params"]
    grids = {}
    for name in str(spec["optim"]).split(","):
        for mult in str(spec["lr_mult"]).split(","):
            cfg = compose(["experiment=optimizer", f"optim={name}", f"lr_mult={mult}"])
            validate(cfg)
            grids.setdefault(name, []).append(cfg.optim.lr)
    assert len(str(spec["seed"]).split(",")) >= 3 and set(grids) == set(NAMES)
    assert min(grids["sgd"]) > max(grids["adamw"])  # SGD's grid lies above AdamW's
