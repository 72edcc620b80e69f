"""Iso-parameter shapes (shape=iso, lm_ablate/shape.py): the solver's count is the built model's (torch's own
``numel`` over many configurations), the pick is the one a brute force over every integer shape makes with the
parameter formula written out here, each ratio is achieved as closely as integers allow, bad requests are one line
(before a sweep writes anything), and the switch changes the model while N stays put."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, compose
from lm_ablate.cost import main as cost_main
from lm_ablate.model import TransformerLM
from lm_ablate.shape import Counter, apply_shape, solve

ROOT = Path(__file__).resolve().parents[1]
V = 256  # the bundled corpus's byte vocabulary
pytestmark = pytest.mark.usefixtures("one_thread")


def iso(*overrides: str) -> list[str]:
    return ["shape=iso", "tracking=none", *overrides]


def non_embedding(model: TransformerLM) -> int:
    """torch's count, independent of lm_ablate's cost code: every unique parameter but the token table and a
    learned position table (t5's bucket table is a position embedding too)."""
    embedding = {id(model.embed.weight)} | {id(p) for p in model.position.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


def sized(cfg, d: int, L: int, H: int, h: int, F: int):
    with open_dict(cfg):
        cfg.model.update(d_model=d, n_layers=L, n_heads=H, head_dim=h)
        cfg.activation.d_ff = F
    return cfg


OPTIONS = [
    pytest.param([], id="default"),
    pytest.param(["norm=rmsnorm", "norm.placement=sandwich"], id="rmsnorm-sandwich"),
    pytest.param(["norm=none"], id="no-norm"),
    pytest.param(["norm.placement=rezero"], id="rezero"),
    pytest.param(["norm.placement=post", "norm.final_norm=true"], id="post-final"),
    pytest.param(["activation=swiglu"], id="swiglu"),
    pytest.param(["activation=relu2", "activation.bias=true"], id="relu2-bias"),
    pytest.param(["attention=gqa", "attention.n_kv_heads=2", "attention.bias=true"], id="gqa-bias"),
    pytest.param(["attention=mqa", "attention.qk_norm=per_head"], id="mqa-qknorm-head"),
    pytest.param(["attention.qk_norm=whole"], id="qknorm-whole"),
    pytest.param(["position=rope"], id="rope"),
    pytest.param(["position=t5"], id="t5"),
    pytest.param(["model.tie_embeddings=true", "model.head_bias=true"], id="tied-head-bias"),
    pytest.param(["model.block=parallel"], id="parallel-fused"),
    pytest.param(["model.block=parallel", "model.parallel_norms=2"], id="parallel-2-norms"),
    pytest.param(["model.embed_norm=true", "model.embed_dim=48"], id="embed-norm-projected"),
    pytest.param(["arch=llama"], id="llama"),
    pytest.param(["arch=gemma2"], id="gemma2"),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_the_count_is_the_built_models_at_any_sizes(options):
    """The solver's count function against torch's count of the model built at sizes it never probed (the block
    polynomial is read at {1, 2}^4, the rest at two small widths), vocabularies too."""
    cfg = compose(["tracking=none", "model=tiny", *options])
    count = Counter(cfg, (2 * (cfg.attention.n_kv_heads or 1), 16))
    for d, L, H, h, F, vocab in [(96, 3, 6, 16, 200, 256), (60, 2, 2, 30, 61, 1000), (128, 2, 4, 32, 512, 77)]:
        model = TransformerLM(sized(cfg, d, L, H, h, F), vocab)
        assert count(d, L, H, h, F, vocab) == non_embedding(model), (d, L, H, h, F, vocab)


REQUESTS = [
    ("shape.n_layers=4", "shape.ffn_ratio=8"),
    ("shape.aspect=32",),
    ("shape.d_model=128", "shape.n_layers=3", "shape.head_dim=16"),
    ("shape.n_layers=2", "shape.n_heads=4"),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: " ".join(r))
@pytest.mark.parametrize("options", [p for p in OPTIONS if p.id in ("default", "gqa-bias", "tied-head-bias")])
def test_solved_shape_is_built_with_its_count_within_2_percent(options, request_):
    cfg = compose(iso("shape.target_params=4e5", *options, *request_))
    solution = solve(cfg, V)
    model = TransformerLM(cfg, V)
    n = non_embedding(model)
    assert n == solution.params_non_embedding
    assert abs(n / 4e5 - 1) <= 0.02
    m = cfg.model
    assert (m.d_model, m.n_layers, m.n_heads) == (solution.d_model, solution.n_layers, solution.n_heads)
    assert model.blocks[0].ffn.down.in_features == solution.d_ff


# --- the pick, against a brute force with the formula written out (defaults: pre-LN with biases, GELU, learned
# positions, MHA without biases, untied head, byte vocabulary) -------------------------------------------------------


def formula(d: int, L: int, F: int, A: int | None = None) -> int:
    """Non-embedding N of the default model: per block qkv 3dA + out Ad + up dF + down Fd + two LayerNorms 4d; a
    final LayerNorm 2d; the untied head Vd (Kaplan's 2 d L (2 d_attn + d_ff) plus norms and head)."""
    A = d if A is None else A
    return L * (4 * d * A + 2 * d * F + 4 * d) + 2 * d + V * d


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def brute_force_ffn(T: float, L: int, r: float, target_h: int = 32) -> tuple[int, int, int]:
    """(d, h, F): every width, d_ff the nearest integer to r d, every head dim dividing d; among N within 2%, the
    head dim closest to 32 (in log), then N closest."""
    best = None
    for d in range(1, 1000):
        F = max(1, math.floor(r * d + 0.5))
        n = formula(d, L, F)
        if abs(n / T - 1) > 0.02:
            continue
        for h in divisors(d):
            key = (round(abs(math.log(h / target_h)), 9), abs(n / T - 1))
            if best is None or key < best[0]:
                best = (key, (d, h, F))
    assert best is not None
    return best[1]


@pytest.mark.parametrize("ratio", [1, 3, 7.5, 32])
def test_ffn_ratio_pick_is_the_brute_forces(ratio):
    """d_ff / d_model is the ratio to the nearest integer, and the shape is the brute force's. At ratio 3 the width
    nearest the target (97) has no head dim near 32, 96 has (the head rule decides); at 7.5 the width is odd
    (7.5 x 71 = 532.5: the nearest integer, not the floor)."""
    cfg = compose(iso("shape.target_params=4e5", "shape.n_layers=4", f"shape.ffn_ratio={ratio}"))
    m = cfg.model
    h = m.head_dim or m.d_model // m.n_heads
    assert (m.d_model, h, cfg.activation.d_ff) == brute_force_ffn(4e5, 4, ratio)
    assert cfg.activation.d_ff == math.floor(ratio * m.d_model + 0.5)  # the ratio, achieved to the integer


def test_aspect_pick_is_the_depth_whose_width_at_the_target_is_closest():
    """shape.aspect: at each depth the least width reaching N (the formula), the depth whose d / L is nearest the
    asked aspect in log; then widths within 2% by head dim."""
    T, a = 4e5, 32
    roots = {L: next(d for d in range(1, 2000) if formula(d, L, 4 * d) >= T) for L in range(1, 30)}
    L = min(roots, key=lambda k: abs(math.log(roots[k] / k / a)))
    cfg = compose(iso(f"shape.target_params={T:g}", f"shape.aspect={a}"))
    assert cfg.model.n_layers == L
    assert abs(formula(cfg.model.d_model, L, 4 * cfg.model.d_model) / T - 1) <= 0.02
    assert cfg.activation.d_ff is None  # the activation's own rule (4d): the record says so as a plain run does


@pytest.mark.parametrize("head_dim", [8, 32, 128])
def test_held_width_and_depth_solve_d_ff(head_dim):
    """The heads study: d_model and n_layers held, the head dim exact, d_ff solved for N: the integer whose N
    is nearest the target (ungated: N grows by 2 d L per unit of d_ff; here d_ff = 100.75 would meet it exactly)."""
    T, d, L = 400384, 128, 4
    cfg = compose(iso(f"shape.target_params={T:g}", f"shape.d_model={d}", f"shape.n_layers={L}",
                      f"shape.head_dim={head_dim}"))  # fmt: skip
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads) == (d, L, d // head_dim)
    F = cfg.activation.d_ff
    assert F == 101 and abs(formula(d, L, F) - T) <= min(abs(formula(d, L, F + k) - T) for k in (-1, 1))


def test_attn_ratio_two_is_paid_by_d_ff():
    """rho = 2 at fixed d, L and N: attention takes 4 d (2d) = 8 d^2 per layer instead of 4 d^2, and d_ff shrinks
    by what keeps N: 4 d^2 L / (2 d L) = 2d fewer."""
    T, d, L = 4e5, 96, 4
    base = compose(iso(f"shape.target_params={T:g}", f"shape.d_model={d}", f"shape.n_layers={L}"))
    wide = compose(iso(f"shape.target_params={T:g}", f"shape.d_model={d}", f"shape.n_layers={L}",
                       "shape.attn_ratio=2"))  # fmt: skip
    assert wide.model.n_heads * wide.model.head_dim == 2 * d
    F1, F2 = base.activation.d_ff, wide.activation.d_ff
    assert abs(formula(d, L, F2, A=2 * d) - T) <= 2 * d * L  # within one unit of d_ff
    assert abs(F1 - F2 - 2 * d) <= 1


def test_glu_rule_counts_three_matrices():
    """At the same held d_model and n_layers, a gated FFN meets N with 2/3 of the ungated d_ff (3 d F vs 2 d F)."""
    held = ("shape.target_params=4e5", "shape.d_model=120", "shape.n_layers=4")
    gelu = compose(iso(*held)).activation.d_ff
    swiglu = compose(iso(*held, "activation=swiglu")).activation.d_ff
    assert swiglu == pytest.approx(2 * gelu / 3, abs=1)


def test_the_switch_changes_the_model_at_equal_n():
    """ffn_ratio 1 and 8 at the same N and depth: different widths and d_ff, N within 2% of each other."""
    one, eight = (compose(iso("shape.target_params=4e5", "shape.n_layers=4", f"shape.ffn_ratio={r}")) for r in (1, 8))
    assert (one.model.d_model, one.activation.d_ff) != (eight.model.d_model, eight.activation.d_ff)
    assert one.activation.d_ff / one.model.d_model == pytest.approx(1, abs=0.01)
    assert eight.activation.d_ff / eight.model.d_model == pytest.approx(8, abs=0.01)
    n1, n8 = (non_embedding(TransformerLM(c, V)) for c in (one, eight))
    assert abs(n1 / n8 - 1) <= 0.04 and all(abs(n / 4e5 - 1) <= 0.02 for n in (n1, n8))
    plain = compose(["tracking=none"])  # shape=none: the model group's sizes, untouched
    assert (plain.model.d_model, plain.model.n_layers, plain.activation.d_ff) == (128, 4, None)


def test_option_files_are_the_codes():
    """conf/shape/: one file per option the validation allows; iso.yaml writes out every key, with the values
    the solver takes for null (lm_ablate.shape.DEFAULTS)."""
    import yaml

    from lm_ablate.shape import DEFAULTS
    from lm_ablate.validation import SHAPE_OPTIONS, SHAPE_REQUEST

    files = {f.stem: yaml.safe_load(f.read_text()) for f in (ROOT / "conf" / "shape").glob("*.yaml")}
    assert sorted(files) == sorted(SHAPE_OPTIONS) and all(v["name"] == k for k, v in files.items())
    assert set(files["iso"]) == {"name", *SHAPE_REQUEST}
    assert {k: files["iso"][k] for k in DEFAULTS} == DEFAULTS


def test_applying_again_changes_nothing_and_leaves_the_random_state():
    cfg = compose(iso("shape.target_params=3e5", "shape.aspect=20", "model=tiny"))
    before = dict(cfg.model), cfg.activation.d_ff
    state = torch.get_rng_state()
    from lm_ablate import shape

    shape._COUNTERS.clear()
    shape._SOLVED.clear()
    apply_shape(cfg)  # solved from scratch: probes built, cfg already holds the sizes
    assert torch.equal(torch.get_rng_state(), state)
    assert (dict(cfg.model), cfg.activation.d_ff) == before


# --- bad requests: one line each -------------------------------------------------------------------------------------


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        compose(iso(*overrides))
    line = str(err.value)
    assert "\n" not in line
    return line


def test_no_integer_shape_within_2_percent_names_the_nearest_which_then_solves():
    """rope needs an even head dim: at 4 layers and ratio 8, the widths within 2% (69) have none."""
    ask = ("shape.n_layers=4", "shape.ffn_ratio=8", "position=rope")
    line = refused("shape.target_params=4e5", *ask)
    assert line.startswith("shape.target_params=400000 is invalid: no integer shape of shape=iso ")
    assert "within 2% of it; nearest feasible: shape.target_params=" in line
    nearest = int(line.split("nearest feasible: shape.target_params=")[1].split(" ")[0])
    cfg = compose(iso(f"shape.target_params={nearest}", *ask))
    assert non_embedding(TransformerLM(cfg, V)) == nearest
    assert f"d_model={cfg.model.d_model} n_layers=4" in line


@pytest.mark.parametrize(
    "overrides, expect",
    [
        (("shape.target_params=2e4", "shape.d_model=256"), "(it would take fewer than 1 layer)"),
        (("shape.target_params=4e5", "shape.aspect=5000"), "shape.aspect=5000 is invalid: at shape.target_params"),
        (("shape.target_params=4e5", "shape.d_model=64", "shape.aspect=128"), "fewer than 1: allowed: <= 64"),
        (
            ("shape.target_params=4e5", "shape.d_model=128", "shape.n_layers=4", "shape.head_dim=48"),
            "shape.head_dim=48 is invalid: must divide attn_ratio x d_model = 128 (whole heads)",
        ),
        (
            ("shape.target_params=4e5", "shape.d_model=100", "shape.n_layers=4", "shape.attn_ratio=0.333"),
            "shape.attn_ratio=0.333 is invalid: attn_ratio x shape.d_model=100 must be a whole number",
        ),
        (
            ("shape.target_params=4e5", "shape.n_layers=4", "shape.ffn_ratio=0"),
            "shape.ffn_ratio=0.0 is invalid: must be > 0",
        ),
        (
            ("shape.target_params=4e5", "shape.n_layers=4", "shape.aspect=-3"),
            "shape.aspect=-3.0 is invalid: must be > 0",
        ),
        (("shape.target_params=-1", "shape.n_layers=4"), "shape.target_params=-1.0 is invalid: must be > 0"),
        (("shape.n_layers=4",), "shape.target_params=None is invalid: shape=iso needs"),
        (("shape.target_params=4e5",), "needs what it holds besides N: one or two of"),
        (
            ("shape.target_params=4e5", "shape.n_layers=4", "activation.d_ff=512"),
            "activation.d_ff=512 is invalid: shape=iso sets it: hold it with shape.ffn_ratio",
        ),
        (
            ("shape.target_params=4e5", "shape.ffn_ratio=4", "model.n_layers=6"),
            "model.n_layers=6 is invalid: shape=iso sets it: hold it with shape.n_layers",
        ),
        (
            ("shape.target_params=4e5", "shape.d_model=128", "shape.n_layers=4", "shape.ffn_ratio=4"),
            "shape.ffn_ratio=4.0 is invalid: shape.d_model=128, shape.n_layers=4 pin d_model and n_layers",
        ),
        (
            ("shape.target_params=4e5", "shape.d_model=128", "shape.n_layers=4", "shape.aspect=32"),
            "shape.aspect=32.0 is invalid: shape.d_model and shape.n_layers already fix",
        ),
        (
            ("shape.target_params=4e5", "shape.n_layers=4", "shape.head_dim=16", "shape.n_heads=4"),
            "shape.n_heads=4 is invalid: shape.head_dim already fixes the heads",
        ),
        (
            ("shape.target_params=4e5", "shape.n_layers=4", "shape.head_dim=16", "shape.head_dim_target=64"),
            "shape.head_dim_target=64 is invalid: shape.head_dim holds the heads exactly",
        ),
        (("shape.target_params=4e5", "shape.n_layers=4", "ladder=cpu"), "shape='iso' is invalid: ladder=cpu sets"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_bad_requests_are_one_line(overrides, expect):
    assert expect in refused(*overrides)


def test_shape_keys_without_shape_iso_are_refused():
    with pytest.raises(ConfigError, match=r"^shape.ffn_ratio=4.0 is invalid: shape=none reads no shape keys"):
        compose(["tracking=none", "shape.ffn_ratio=4"])


def test_cost_prints_the_solved_shape_and_one_line_when_infeasible(capsys):
    ask = ["shape=iso", "shape.target_params=4e5", "shape.n_layers=4", "shape.ffn_ratio=8"]
    assert cost_main(ask) == 0
    out = capsys.readouterr().out
    cfg = compose(iso(*ask[1:]))
    n = non_embedding(TransformerLM(cfg, V))
    d, F = cfg.model.d_model, cfg.activation.d_ff
    assert f"  target N        400,000 non-embedding; achieved {n:,} ({n / 4e5 - 1:+.2%}), total " in out
    assert f"  solved          d_model {d}, n_layers 4, n_heads {cfg.model.n_heads}" in out
    assert f"d_ff {F}\n" in out and f"d_ff/d_model {F / d:.3g}, " in out
    assert cost_main([*ask, "position=rope"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("lm-ablate: error: shape.target_params=400000 is invalid: no integer")


@pytest.mark.slow
def test_a_sweep_with_an_infeasible_arm_refuses_before_writing(tmp_path, cache_dir):
    """--multirun: every arm solved by the sweep check before any job; the bad arm named in one line."""
    sweep = tmp_path / "sweep"
    out = subprocess.run(
        [sys.executable, "-m", "lm_ablate.train", "--multirun", "debug=smoke", "shape=iso", "shape.target_params=4e5",
         "shape.d_model=128", "shape.n_layers=4", "shape.head_dim=16,48", f"data.cache_dir={cache_dir}",
         f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines == ["lm-ablate: error: shape.head_dim=48: shape.head_dim=48 is invalid: must divide attn_ratio x "
                     "d_model = 128 (whole heads): allowed: 1, 2, 4, 8, 16, 32, 64, 128"], out.stderr[-3000:]  # fmt: skip
    assert not sweep.exists()


@pytest.mark.slow
def test_run_record_holds_the_solved_shape(tmp_path, cache_dir):
    """config.yaml holds the solved sizes; summary.json the target, achieved counts and FLOPs/token."""
    from lm_ablate.train import train

    cfg = compose(iso("debug=smoke", "train.max_steps=2", "train.eval_every=2", "train.probe_every=0",
                      f"data.cache_dir={cache_dir}", "shape.target_params=2e4", "shape.n_layers=2",
                      "shape.ffn_ratio=2"))  # fmt: skip
    summary = train(cfg, tmp_path / "run")
    record = json.loads((tmp_path / "run" / M.SUMMARY_FILE).read_text())[M.SHAPE]
    assert record == summary[M.SHAPE]
    model = TransformerLM(cfg, V)
    n = non_embedding(model)
    assert record["target_params"] == 2e4 and record["params_non_embedding"] == n
    assert record["params_total"] == sum(p.numel() for p in model.parameters()) == summary[M.PARAMS_TOTAL]
    assert record["relative_error"] == pytest.approx(n / 2e4 - 1) and abs(record["relative_error"]) <= 0.02
    assert record["flops_per_token"] == summary[M.FLOPS_PER_TOKEN]
    assert record["ffn_ratio"] == pytest.approx(2, abs=0.05)
    import yaml

    saved = yaml.safe_load((tmp_path / "run" / M.CONFIG_FILE).read_text())
    assert saved["model"]["d_model"] == record["d_model"] and saved["activation"]["d_ff"] == record["d_ff"]
    assert saved["shape"]["ffn_ratio"] == 2
