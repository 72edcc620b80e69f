"""The CUDA paths of the loop, each against a reference: bf16 autocast, fused AdamW, the fused SDPA kernels,
``train.compile``, checkpoint resume and DDP over NCCL. ``pytest -m gpu tests/test_gpu.py``; ``bash
scripts/gpu_check.sh`` runs these and then ``bench/gpu.py``.

The device is ``LM_ABLATE_TEST_DEVICE``: ``cuda`` (the default; without a CUDA device every ``gpu`` test is
skipped) or ``cpu``, which runs the same checks wherever their logic does not need CUDA (compile vs eager,
bit-identical resume, DDP over gloo, SDPA's CPU flash kernel and math path, fused vs foreach AdamW), so that they
are not dead code between GPU sessions. The bf16 checks need CUDA: the loop autocasts to bf16 only there.

Tolerances. fp32 (CPU): 1e-5 absolute on losses and gradient norms, as the other loop tests. bf16 (CUDA): a
training curve is compared with a relative tolerance of 2% per step (bf16 keeps 8 significant bits: a relative
rounding error of up to 2^-8 = 0.4% per operation); attention outputs and gradients with a relative Frobenius error of 2e-2
against the fp32 equation. Bit-identical comparisons run with ``torch.use_deterministic_algorithms(True)``:
without it some CUDA backward kernels (SDPA's, cuDNN's) add in a run-dependent order, and no two runs of the
same command would be equal, resumed or not.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from lm_ablate import metrics as M
from lm_ablate.catalog import load_all
from lm_ablate.checkpoint import list_checkpoints
from lm_ablate.config import bad, compose
from lm_ablate.model import TransformerLM
from lm_ablate.registry import OPTIMIZERS, REGULARIZERS
from lm_ablate.train import train

load_all()

# cuBLAS is deterministic only with a fixed workspace; read when CUDA starts, so set before any test runs
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

DEVICE = os.environ.get("LM_ABLATE_TEST_DEVICE", "cuda")
if DEVICE not in ("cuda", "cpu"):
    raise bad("LM_ABLATE_TEST_DEVICE", DEVICE, "allowed: cuda (default), cpu")
CUDA = DEVICE == "cuda"
ROOT = Path(__file__).resolve().parents[1]
TIMING = (M.TOKENS_PER_SEC, M.STEP_TIME_MS, M.MFU, M.PEAK_MEM_MB)  # measurements of the machine, not the run
FP32_ABS = 1e-5
BF16_REL = 2e-2

_no_device = pytest.mark.skipif(
    CUDA and not torch.cuda.is_available(),
    reason="no CUDA device (LM_ABLATE_TEST_DEVICE=cpu runs the checks that do not need one)",
)
_cuda_only = pytest.mark.skipif(not CUDA, reason="bf16 autocast: the loop uses it on CUDA only")


def on_device(test):
    """A ``gpu`` test: runs on LM_ABLATE_TEST_DEVICE, skipped when that is cuda and there is none."""
    return pytest.mark.gpu(_no_device(pytest.mark.usefixtures("one_thread")(test)))


def run(tmp_path: Path, cache_dir: str, name: str, *overrides: str, device: str = DEVICE) -> dict:
    """A smoke-sized run of the real loop, in this process."""
    base = ["debug=smoke", "train.peak_flops=1e12", f"train.device={device}", f"data.cache_dir={cache_dir}"]
    return train(compose([*base, *overrides]), tmp_path / name)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / M.METRICS_FILE).read_text().splitlines()]


def untimed(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows(run_dir)]


def curve(run_dir: Path, key: str = M.TRAIN_LOSS) -> list[float]:
    return [r[key] for r in rows(run_dir) if key in r]


def assert_curves_match(a: list[float], b: list[float]) -> None:
    """The same curve up to float rounding of the device's training precision (see the module docstring)."""
    assert len(a) == len(b) and a
    if CUDA:
        assert a == pytest.approx(b, rel=BF16_REL)
    else:
        assert a == pytest.approx(b, abs=FP32_ABS)


@pytest.fixture
def deterministic():
    """Deterministic kernels (flash / memory-efficient SDPA take their deterministic backward, cuDNN attention
    is not chosen, an op without one raises), restored afterwards."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# --------------------------------------------------------------------------------------------- bf16 autocast


@on_device
@_cuda_only
def test_bf16_autocast_tracks_the_fp32_curve(tmp_path, cache_dir):
    """100 steps on CUDA (the loop autocasts to bf16 there) against the same run in fp32 on the CPU: same init (the
    model is built on the CPU, then moved), same batches, no dropout. Stated tolerance: every train loss within 0.05
    of fp32's and 0.01 on average, final val loss within 1%. That is ~30x what bf16 autocast moved this curve in a
    CPU emulation (``torch.autocast("cpu", torch.bfloat16)``: max 1.6e-3, mean 5e-4); and bf16 must move it by
    more than 1e-4 somewhere, or autocast was not on."""
    common = ["train.max_steps=100", "train.eval_every=25", "train.batch_size=16", "train.probe_every=0"]
    bf16 = run(tmp_path, cache_dir, "bf16", *common)
    fp32 = run(tmp_path, cache_dir, "fp32", *common, "train.threads=1", device="cpu")
    a, b = curve(tmp_path / "bf16"), curve(tmp_path / "fp32")
    assert len(a) == len(b) == 100
    diff = [abs(x - y) for x, y in zip(a, b)]
    assert max(diff) <= 0.05 and statistics.mean(diff) <= 0.01, (max(diff), statistics.mean(diff))
    assert max(diff) > 1e-4  # the switch changed the computation
    val_bf16, val_fp32 = bf16[M.FINAL_VAL_LOSS], fp32[M.FINAL_VAL_LOSS]
    assert abs(val_bf16 - val_fp32) <= 0.01 * val_fp32, (val_bf16, val_fp32)


# ------------------------------------------------------------------------------------------------ fused AdamW


@on_device
def test_fused_adamw_matches_foreach_and_the_update_rule():
    """The loop's AdamW (fused on CUDA) and an explicitly fused one against the foreach implementation over 5
    steps of the same gradients, both weight-decay groups; step 1 also against AdamW written out (Loshchilov &
    Hutter 2019, Alg. 2): from zero moments the bias-corrected m / sqrt(v) is g / |g|, so
    p1 = p0 (1 - lr wd) - lr g / (|g| + eps)."""
    device = torch.device(DEVICE)
    cfg = compose(["model=tiny", "regularization=standard"])
    torch.manual_seed(0)
    model = TransformerLM(cfg, 64).to(device)
    reg = REGULARIZERS.build(cfg.regularization)
    o = cfg.optim
    models = {name: copy.deepcopy(model) for name in ("loop", "fused", "foreach")}
    opts = {
        "loop": OPTIMIZERS.build(o, reg.param_groups(models["loop"]), device),
        "fused": torch.optim.AdamW(
            reg.param_groups(models["fused"]), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=True
        ),
        "foreach": torch.optim.AdamW(
            reg.param_groups(models["foreach"]), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, foreach=True
        ),
    }
    assert opts["loop"].defaults["fused"] is (True if CUDA else None)  # fused exactly where the loop says
    decay = {id(p): g["weight_decay"] for g in opts["foreach"].param_groups for p in g["params"]}
    assert sorted(set(decay.values())) == [0.0, cfg.regularization.weight_decay]
    gen = torch.Generator().manual_seed(1)
    before = [p.detach().clone() for p in models["foreach"].parameters()]
    for step in range(5):
        grads = [torch.randn(p.shape, generator=gen).to(device) for p in model.parameters()]
        for m in models.values():
            for p, g in zip(m.parameters(), grads):
                p.grad = g.clone()
        for opt in opts.values():
            opt.step()
        if step == 0:
            for p0, p, g in zip(before, models["foreach"].parameters(), grads):
                expected = p0 * (1 - o.lr * decay[id(p)]) - o.lr * g / (g.abs() + o.eps)
                torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-7)
    reference = list(models["foreach"].parameters())
    for name in ("loop", "fused"):
        for p, q in zip(models[name].parameters(), reference):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n} vs foreach: {m}")
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(opts[name].state[p][key], opts["foreach"].state[q][key], rtol=1e-5, atol=0)


# ---------------------------------------------------------------------------------------------- SDPA kernels

FLASH, EFFICIENT, CUDNN = "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"
# Every attention variant whose forward is one F.scaled_dot_product_attention call (a softcap is not: it runs the
# written-out equation), on a 64-wide, 4-head, 64-token model (head_dim 16: every fused kernel takes it).
VARIANTS = {
    "causal": [],  # is_causal=True, no mask
    "gqa": ["attention=gqa"],  # is_causal=True, enable_gqa (2 K/V heads)
    "window": ["attention.window=16"],  # a [T, T] float mask
    "gqa_window": ["attention=gqa", "attention.window=16"],  # Mistral
    "alibi": ["position=alibi"],  # a [H, T, T] float bias + mask
    "t5": ["position=t5"],  # a [H, T, T] learned bias (it needs a gradient) + mask
}
# Which fused kernels take each variant's call (torch 2.13: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
# and sdp_utils_cpp.cpp). The math kernel takes everything and is always tested.
#   CUDA flash: no attn_mask at all -> the is_causal variants (GQA natively).
#   CUDA memory-efficient: any additive float mask, [T, T] or [H, T, T], with its gradient -> the MHA variants;
#     enable_gqa only in recent torch (pytorch#191085, 2026): GQA variants are tested where it takes them.
#   CUDA cuDNN: depends on the cuDNN version and GPU (recent torch tries it first on sm90/sm100 with cuDNN > 9.15);
#     2-D / 4-D masks only, so never ALiBi / T5's [H, T, T]; tested wherever it takes the call.
#   CPU flash: 2-D or 4-D masks that need no gradient -> causal, gqa, window, gqa_window; not ALiBi / T5.
#   CPU has no memory-efficient or cuDNN kernel.
KERNELS = {  # must take the call: a "No available kernel" here is a failure (the table, or torch, is wrong)
    "cuda": {
        "causal": (FLASH, EFFICIENT),
        "gqa": (FLASH,),
        "window": (EFFICIENT,),
        "gqa_window": (),
        "alibi": (EFFICIENT,),
        "t5": (EFFICIENT,),
    },
    "cpu": {"causal": (FLASH,), "gqa": (FLASH,), "window": (FLASH,), "gqa_window": (FLASH,), "alibi": (), "t5": ()},
}
MAYBE = {  # version- or hardware-dependent: tested where torch takes the call, skipped (with the reason) elsewhere
    "cuda": {v: (EFFICIENT, CUDNN) if v.startswith("gqa") else (CUDNN,) for v in VARIANTS},
    "cpu": dict.fromkeys(VARIANTS, ()),
}
WHY_NOT = {
    ("cuda", FLASH): "flash attention takes no attn_mask (window and bias variants)",
    ("cpu", FLASH): "CPU flash takes 2-D / 4-D masks without gradient; ALiBi / T5 pass a [H, T, T] bias",
    ("cpu", EFFICIENT): "no memory-efficient attention kernel on CPU",
    ("cpu", CUDNN): "no cuDNN attention on CPU",
}


def _attention_case(variant: str):
    cfg = compose(["model=tiny", "model.d_model=64", "model.n_heads=4", "model.context=64", *VARIANTS[variant]])
    torch.manual_seed(0)
    model = TransformerLM(cfg, 64).to(DEVICE).eval()
    with torch.no_grad():  # T5's table starts at zero; any bias should be visible in the output
        for p in model.position.parameters():
            p.normal_()
    attn = model.blocks[0].attn
    assert not attn.explicit  # this variant goes through SDPA
    x = torch.randn(4, 64, 64, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(1))
    g = torch.randn(4, 64, 64, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(2))
    return model, attn, x, g


def _forward_backward(model, attn, x, g, autocast) -> list[torch.Tensor]:
    """Attention output, and the gradients of its input, its parameters and the position scheme's (T5's bias)."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    with autocast():
        y = attn(x, model.position)
    (y.float() * g).sum().backward()
    params = [p for p in [*attn.parameters(), *model.position.parameters()] if p.grad is not None]
    return [y.detach().float(), x.grad.float(), *(p.grad.float() for p in params)]


@on_device
@pytest.mark.parametrize("kernel", ["MATH", FLASH, EFFICIENT, CUDNN])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sdpa_kernels_match_the_written_out_attention(variant, kernel):
    """Each SDPA kernel that takes the variant's call (forced with ``sdpa_kernel``: it runs or raises) against the
    same layer's written-out equation (``force_explicit``: softmax(q k^T s + bias + mask) v with repeated K/V heads)
    in fp32: output and every gradient, relative Frobenius error <= 2e-2 at the training precision (bf16 autocast
    on CUDA), 1e-5 in fp32 (CPU)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    maybe = kernel in MAYBE[DEVICE][variant]
    if kernel != "MATH" and kernel not in KERNELS[DEVICE][variant] and not maybe:
        pytest.skip(WHY_NOT.get((DEVICE, kernel), f"{kernel} does not take the {variant} call"))
    model, attn, x, g = _attention_case(variant)
    attn.force_explicit = True
    reference = _forward_backward(model, attn, x, g, nullcontext)
    attn.force_explicit = False
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if CUDA else nullcontext
    try:
        with sdpa_kernel([getattr(SDPBackend, kernel)]):
            got = _forward_backward(model, attn, x, g, autocast)
    except RuntimeError as err:
        if maybe and "No available kernel" in str(err):
            pytest.skip(f"{kernel} does not take the {variant} call with this torch / GPU / cuDNN version")
        raise
    assert len(got) == len(reference)
    tol = BF16_REL if CUDA else FP32_ABS
    for i, (a, b) in enumerate(zip(got, reference)):
        error = ((a - b).norm() / b.norm()).item()
        assert error <= tol, (
            f"{variant}/{kernel}: tensor {i} (0 = output, 1 = input grad, then params) off by {error:.2e}"
        )


# ------------------------------------------------------------------------------------------------ compile


@on_device
def test_compile_matches_eager(tmp_path, cache_dir):
    """``train.compile=true`` on the device against eager: the same curve (training precision), the step really
    compiled (dynamo captured graphs), and probes still observed (the side pass of the plain module)."""
    from torch._dynamo.utils import counters

    common = ["train.max_steps=8", "train.probe_every=4"]
    run(tmp_path, cache_dir, "eager", *common)
    counters.clear()
    run(tmp_path, cache_dir, "compiled", *common, "train.compile=true")
    assert counters["stats"]["unique_graphs"] >= 1
    for key in (M.TRAIN_LOSS, M.GRAD_NORM, M.VAL_LOSS):
        assert_curves_match(curve(tmp_path / "compiled", key), curve(tmp_path / "eager", key))
    assert any(M.layer_metric(0, M.MAX_ATTN_LOGIT) in r for r in rows(tmp_path / "compiled"))


# ------------------------------------------------------------------------------------------------- resume


@on_device
def test_checkpoint_resumes_bit_identically(tmp_path, cache_dir, deterministic):
    """A checkpoint written on the device, resumed on the device (in a new directory, ``train.resume=<file>``),
    gives every later row bit for bit: model, optimizer and RNG states (the device's included: dropout masks come
    from it) all restored."""
    common = [
        "train.max_steps=12",
        "train.checkpoint_every=4",
        "train.keep_checkpoints=3",
        "train.probe_every=5",
        "train.eval_every=6",
        "regularization=dropout",
    ]
    run(tmp_path, cache_dir, "whole", *common)
    checkpoint = next(c for c in list_checkpoints(tmp_path / "whole") if c.stem == "step_00000004")
    state = torch.load(checkpoint, weights_only=True, map_location="cpu")
    assert ("cuda" in state["rng"]) is CUDA
    run(tmp_path, cache_dir, "resumed", *common, f"train.resume={checkpoint}")
    resumed = untimed(tmp_path / "resumed")
    assert [r[M.STEP] for r in resumed] == list(range(5, 13))
    assert resumed == [r for r in untimed(tmp_path / "whole") if r[M.STEP] > 4]


# ---------------------------------------------------------------------------------------------------- DDP


@on_device
def test_ddp_on_every_device_matches_one_process(tmp_path, cache_dir):
    """The real loop under ``torchrun --standalone`` on every visible GPU (NCCL; 2 processes and gloo on CPU)
    against one plain process, same global batch: the same curve (training precision), only rank 0 logs. With one
    GPU, torchrun starts one process and the loop does not wrap DDP (world size 1): the next test covers that."""
    n = torch.cuda.device_count() if CUDA else 2
    common = [
        "debug=smoke",
        "train.max_steps=12",
        f"train.batch_size={4 * n}",
        "train.probe_every=4",
        "train.threads=1",
        "train.peak_flops=1e12",
        f"train.device={DEVICE}",
        f"data.cache_dir={cache_dir}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = {
        "one": [sys.executable, "-m", "lm_ablate.train"],
        "ddp": [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
        + ["-m", "lm_ablate.train"],
    }
    for name, command in launch.items():
        out = subprocess.run(
            [*command, *common, f"hydra.run.dir={tmp_path / name}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    a, b = rows(tmp_path / "one"), rows(tmp_path / "ddp")
    assert [r[M.STEP] for r in a] == [r[M.STEP] for r in b]  # ranks > 0 logged nothing
    for key in (M.TRAIN_LOSS, M.GRAD_NORM, M.VAL_LOSS):
        assert_curves_match(curve(tmp_path / "ddp", key), curve(tmp_path / "one", key))
    assert json.loads((tmp_path / "ddp" / M.SUMMARY_FILE).read_text())["world_size"] == n


@on_device
def test_ddp_over_a_one_rank_process_group_is_exact(tmp_path, deterministic):
    """DDP as the loop wraps the model (``device_ids`` on CUDA) over an NCCL group of one rank (gloo on CPU): the
    all-reduce runs (seen by the profiler) and three training steps give bit-identical parameters to the plain
    module's, so DDP itself adds nothing to the update when there is nothing to average."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import ProfilerActivity, profile

    backend = "nccl" if CUDA else "gloo"
    device = torch.device("cuda", torch.cuda.current_device()) if CUDA else torch.device("cpu")
    cfg = compose(["model=tiny"])
    reg = REGULARIZERS.build(cfg.regularization)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if CUDA else nullcontext
    dist.init_process_group(backend, store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = TransformerLM(cfg, 64).to(device)
        inner = copy.deepcopy(plain)
        wrapped = DistributedDataParallel(inner, device_ids=[device] if CUDA else None)
        sides = {
            "plain": (plain, OPTIMIZERS.build(cfg.optim, reg.param_groups(plain), device)),
            "ddp": (wrapped, OPTIMIZERS.build(cfg.optim, reg.param_groups(inner), device)),
        }
        gen = torch.Generator().manual_seed(1)
        events: set[str] = set()
        for _ in range(3):
            x, y = (torch.randint(0, 64, (4, 32), generator=gen).to(device) for _ in range(2))
            for name, (module, opt) in sides.items():
                opt.zero_grad(set_to_none=True)
                with profile(activities=[ProfilerActivity.CPU]) if name == "ddp" else nullcontext() as prof:
                    with autocast():
                        logits = module(x)
                    reg.loss(logits, y)[0].backward()
                if prof is not None:
                    events |= {e.name for e in prof.events()}
                opt.step()
    finally:
        dist.destroy_process_group()
    assert f"{backend}:all_reduce" in events
    for p, q in zip(plain.parameters(), inner.parameters()):
        assert torch.equal(p, q)


# ------------------------------------------------------------------------------------------- FSDP2 (sharding)


@on_device
def test_fsdp_on_every_device_matches_ddp(tmp_path, cache_dir):
    """The real loop under ``torchrun --standalone`` on every visible GPU with train.parallel=fsdp (NCCL, FSDP2's
    bf16 mixed-precision policy) against the same command with ddp (bf16 autocast): the same curve within the bf16
    tolerance (2% per step; fp32 and 1e-5 on 2 CPU processes). One GPU: torchrun starts one process, which does
    not shard; the next test shards over a one-rank group instead."""
    n = torch.cuda.device_count() if CUDA else 2
    if n < 2:
        pytest.skip("one GPU: test_fsdp_over_one_rank_follows_ddp shards over a one-rank group instead")
    common = ["debug=smoke", "train.max_steps=12", f"train.batch_size={4 * n}", "train.probe_every=4",
              "train.threads=1", "train.peak_flops=1e12", f"train.device={DEVICE}", f"data.cache_dir={cache_dir}"]  # fmt: skip
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", "-m"]
    for name in ("ddp", "fsdp"):
        out = subprocess.run(
            [*launch, "lm_ablate.train", *common, f"train.parallel={name}", f"hydra.run.dir={tmp_path / name}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    for key in (M.TRAIN_LOSS, M.GRAD_NORM, M.VAL_LOSS):
        assert_curves_match(curve(tmp_path / "fsdp", key), curve(tmp_path / "ddp", key))
    assert all(c.is_dir() for c in list_checkpoints(tmp_path / "fsdp"))  # DCP folders


@pytest.fixture
def one_rank(tmp_path):
    """A process group of one rank on the device (NCCL on CUDA, gloo on CPU): the loop's strategies run as they do
    under torchrun."""
    import torch.distributed as dist

    dist.init_process_group("nccl" if CUDA else "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)  # fmt: skip
    try:
        yield torch.device("cuda", torch.cuda.current_device()) if CUDA else torch.device("cpu")
    finally:
        dist.destroy_process_group()


def strategy_curve(kind, device, cache_dir, steps, *, folder=None, save_at=None, resume=None, extra=()):
    """``steps`` of the loop's step through a strategy of lm_ablate/sharding.py (``kind``: ddp | fsdp | plain) on
    real batches; optionally a folder checkpoint at ``save_at`` into ``folder``, or a start from ``resume``.
    Returns the train losses."""
    from lm_ablate.data import get_batch, load_data
    from lm_ablate.distributed import Dist
    from lm_ablate.sharding import DDP, FSDP, OneProcess
    from lm_ablate.train import build_optimizer

    cfg = compose(["debug=smoke", "train.batch_size=16", f"train.parallel={'fsdp' if kind == 'fsdp' else 'ddp'}",
                   f"data.cache_dir={cache_dir}", *extra])  # fmt: skip
    data = load_data(cfg.data)
    strategy = {"ddp": DDP, "fsdp": FSDP, "plain": OneProcess}[kind](cfg, Dist(), device)
    if kind == "plain":
        strategy.autocast = lambda: nullcontext  # fp32: no autocast
    reg = REGULARIZERS.build(cfg.regularization)
    torch.manual_seed(0)
    model = TransformerLM(cfg, data.vocab_size).to(device)
    strategy.prepare(model)
    opt = build_optimizer(cfg, model, reg, device)
    first = 1
    if resume is not None:
        saved = __import__("lm_ablate.checkpoint", fromlist=["load"]).load(resume)
        strategy.restore(model, opt, saved)
        first = saved["step"] + 1
    step_model = strategy.wrap(model)
    losses = []
    for step in range(first, steps + 1):
        x, y = (t.to(device) for t in get_batch(data.train, 16, cfg.model.context, cfg.seed, step))
        opt.zero_grad(set_to_none=True)
        with strategy.autocast()():
            logits = step_model(x)
        loss = reg.loss(logits, y)[0]
        loss.backward()
        strategy.clip_grad_norm(model, reg.grad_clip)
        opt.step()
        losses.append(loss.item())
        if step == save_at:
            from lm_ablate.checkpoint import rng_state

            state = {"config": {"train": {}}, "rng": rng_state(), "progress": {}}
            strategy.save_checkpoint(folder, step, model, opt, state, keep=1)
    return losses


@on_device
def test_fsdp_over_one_rank_follows_ddp_and_resumes_bit_identically(tmp_path, cache_dir, one_rank, deterministic):
    """Sharding over one rank (the one-GPU case of bench/gpu.py): the loop's FSDP strategy (bf16 policy on CUDA)
    follows its DDP strategy (bf16 autocast) within the bf16 tolerance over 20 steps (fp32 on CPU: 1e-5); a folder
    checkpoint written at step 10 on the device resumes there bit for bit."""
    ddp = strategy_curve("ddp", one_rank, cache_dir, 20)
    fsdp = strategy_curve("fsdp", one_rank, cache_dir, 20, folder=tmp_path / "run", save_at=10)
    assert_curves_match(fsdp, ddp)
    (folder,) = list_checkpoints(tmp_path / "run")
    resumed = strategy_curve("fsdp", one_rank, cache_dir, 20, resume=folder)
    assert resumed == fsdp[10:]


@on_device
@_cuda_only
def test_bf16_mixed_precision_policy_tracks_the_fp32_curve(cache_dir, one_rank):
    """FSDP2's policy (bf16 parameters for compute, fp32 gradient reduction), 100 steps on the GPU, against the same
    model in fp32 (no autocast, no policy) on the GPU: the tolerance of test_bf16_autocast_tracks_the_fp32_curve
    (every loss within 0.05, 0.01 on average), and the policy must move the curve by more than 1e-4 somewhere."""
    policy = strategy_curve("fsdp", one_rank, cache_dir, 100)
    fp32 = strategy_curve("plain", one_rank, cache_dir, 100)
    diff = [abs(x - y) for x, y in zip(policy, fp32)]
    assert len(diff) == 100
    assert max(diff) <= 0.05 and statistics.mean(diff) <= 0.01, (max(diff), statistics.mean(diff))
    assert max(diff) > 1e-4  # the policy changed the computation


# -------------------------------------------------------------------------------- bench/gpu.py (CPU, not gpu)


def test_gpu_benchmark_prints_its_table_on_cpu(capsys, one_thread, tmp_path):
    """bench/gpu.py's code path on the CPU (fp32, the tiny shape, one step): one markdown table with a row per
    candidate, the skipped ones saying why, and figures that agree with each other; ``--out`` writes the same table
    and RESULT line to a file (what scripts/gpu_check.sh brings back), and a missing folder is refused."""
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--device", "cpu", "--model", "tiny", "--batch", "2", "--steps", "1", "--rounds", "1", "--warmup", "1"]
    assert bench.main([*args, "--no-compile", "--out", str(tmp_path / "nowhere" / "bench.md")]) == 2
    assert "--out" in capsys.readouterr().err
    assert bench.main([*args, "--no-compile", "--out", str(tmp_path / "bench.md")]) == 0
    out = capsys.readouterr().out
    written = (tmp_path / "bench.md").read_text().splitlines()
    table = [line for line in out.splitlines() if line.startswith("| ")]
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert [line for line in written if line.startswith("| ")] == table
    assert [line for line in written if line.startswith("RESULT ")] == results and len(results) == 1
    assert written[0].startswith("# bench/gpu.py: model=tiny") and any(line.startswith("- torch ") for line in written)
    assert table[0].startswith("| candidate | tokens/s | ms/step | x transformers eager | MFU")
    cells = {line.split(" | ")[0].removeprefix("| "): line.strip("| ").split(" | ") for line in table[1:]}
    assert list(cells) == list(bench.CANDIDATES)
    for name in ("lm-ablate compiled", "transformers compiled"):
        assert cells[name][-1] == "not run (--no-compile)"
    for name in ("lm-ablate eager", "transformers eager"):
        tokens_s, ms = float(cells[name][1].replace(",", "")), float(cells[name][2])
        assert tokens_s == pytest.approx(2 * 32 / (ms / 1e3), rel=0.01)  # batch 2 x context 32
    assert cells["transformers eager"][3] == "1.000x"
    assert [line for line in out.splitlines() if line.startswith("RESULT gpu (tiny, fp32, cpu)")]


def test_gpu_benchmark_parallel_table_on_cpu(capsys, one_thread):
    """bench/gpu.py's second table (the loop's ddp and fsdp strategies over a one-rank gloo group) on the CPU: one
    row per strategy, tokens/s consistent with ms/step (batch 2 x context 32), and the memory estimate printed."""
    spec = importlib.util.spec_from_file_location("bench_gpu_parallel", ROOT / "bench" / "gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--device", "cpu", "--model", "tiny", "--batch", "2", "--steps", "1", "--rounds", "1", "--warmup", "1",
            "--no-compile", "--no-hf", "--parallel-shapes", "tiny", "--parallel-steps", "1"]  # fmt: skip
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| tiny | ")]
    assert [r[1] for r in rows] == list(bench.PARALLEL)
    for r in rows:
        assert float(r[2].replace(",", "")) == pytest.approx(2 * 32 / (float(r[3]) / 1e3), rel=0.01)
        assert float(r[6]) > 0  # lm_ablate.perf.memory_estimate's figure
    assert "RESULT gpu parallel (tiny, batch 2, cpu): ddp ran, fsdp ran, fsdp + full AC ran" in out
