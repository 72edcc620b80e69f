"""Throughput: how ``train.compile`` compiles the step; the peak that MFU is measured against; peak memory, and
the estimate of a step's memory on one rank (parallelism and activation checkpointing included).

MFU (model FLOPs utilisation, Chowdhery et al. 2022) = FLOPs/token (lm_ablate.model.model_cost) x tokens/s
divided by the peak. Without ``train.peak_flops`` the peak is *measured*: the best of a few large square
matmuls in the training dtype on the training device, so MFU says how close the step gets to what this
machine's matmul unit actually delivers (not to a datasheet number).
"""

from __future__ import annotations

import functools
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@functools.cache
def measured_peak_flops(
    device_type: str, dtype: torch.dtype = torch.float32, n: int = 1024, seconds: float = 0.3
) -> float:
    """Best FLOP/s of n x n matmuls over ~``seconds`` (cached per process: a sweep measures once)."""
    device = torch.device(device_type)
    if device.type == "cuda":
        n = max(n, 8192)
    gen = torch.Generator(device).manual_seed(0)  # its own generator: measuring must not move the run's RNG
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    best = 0.0
    deadline = time.perf_counter() + seconds
    for i in range(1000):
        if device.type == "cuda":
            torch.cuda.synchronize()
        tic = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 / (time.perf_counter() - tic))
        if i >= 2 and time.perf_counter() > deadline:
            break
    return best


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: max memory allocated by tensors; CPU: the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def compile_step(fn):
    """``torch.compile`` of the step's forward + loss, with inductor drawing dropout masks through torch's own
    RNG ops (``fallback_random``) instead of its generated Philox code: on CPU the generated code made a
    GPT-2-style model (dropout 0.1) *slower* compiled than eager (3.3k vs 3.6k tokens/s); with the fallback
    it is 1.10x eager (4.1k), the compile is faster (16 s vs 25 s), and the masks come from the same RNG
    stream as in eager mode."""
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True
    return torch.compile(fn)


def compile_blocks(model: torch.nn.Module) -> None:
    """``train.compile`` under fsdp/hsdp: each block compiled in place (``nn.Module.compile``, names unchanged),
    as torchtitan does (the blocks share one code, so one graph is compiled; FSDP2's hooks stay outside it). The
    same inductor setting as :func:`compile_step`: dropout masks from torch's RNG."""
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True
    for block in model.blocks:
        block.compile()


# --- memory of a training step -------------------------------------------------------------------------
# Activation memory of one transformer layer in training (Korthikanti et al. 2022, "Reducing Activation
# Recomputation in Large Transformer Models", section 4.1, no parallelism): s*b*h*(34 + 5*a*s/h) bytes with
# 16-bit activations and 1-byte dropout masks, s = sequence length, b = micro-batch, h = d_model, a = heads.
# The 5*a*s/h part is the materialised attention scores (QK^T, softmax, dropout mask); fused SDPA kernels (flash /
# memory-efficient, and PyTorch's CPU flash kernel) do not store them. In fp32 every activation is twice the size.
ACTIVATION_BYTES_PER_TOKEN_16BIT = 34  # x d_model, per layer
SCORE_BYTES_16BIT = 5  # x heads x T, per token and layer, when the scores are materialised
BYTES_PER_PARAM = 16  # fp32 weight, gradient and two Adam moments
# the block input a checkpointed block keeps for its recomputation: the residual stream, fp32 (autocast keeps the
# stream in fp32; bf16 under FSDP's mixed-precision policy, counted as fp32 here: an upper bound)
CHECKPOINTED_BYTES_PER_TOKEN = 4  # x d_model, per checkpointed layer


@dataclass(frozen=True)
class MemoryEstimate:
    """One rank's peak memory in a training step, by part (bytes)."""

    parallel: str  # one process | ddp | fsdp | hsdp
    world: int  # ranks
    shard: int  # ranks one copy of the parameters, gradients and optimizer state is sharded over
    params: int  # parameters counted (~12 L d^2 + 2 V d unless given)
    states: float  # parameters, gradients, AdamW's two moments: 16 B/param, divided by ``shard``
    working: float  # sharded: the unsharded parameters and gradients FSDP2 gathers (two blocks, the root)
    activations: float  # one micro-batch's (Korthikanti et al. 2022), less what checkpointed blocks recompute
    logits: float  # fp32 logits, their log-softmax and gradient
    checkpointed: int  # blocks recomputed in backward (train.activation_checkpointing)

    @property
    def total(self) -> float:
        return self.states + self.working + self.activations + self.logits


def checkpointed_blocks(t, n_layers: int) -> int:
    """How many blocks train.activation_checkpointing recomputes (lm_ablate/sharding.py: full = all, selective =
    block i iff (i + 1) % ac_every == 0)."""
    kind = getattr(t, "activation_checkpointing", "none")
    if kind == "full":
        return n_layers
    if kind == "selective":
        return n_layers // t.ac_every
    return 0


def memory_estimate(
    cfg,
    vocab_size: int,
    device_type: str,
    world: int = 1,
    shard: int | None = None,
    params: int | None = None,
    parallel: str | None = None,
) -> MemoryEstimate:
    """Estimated peak memory of one training step on one rank of ``world``: parameters with gradients and
    optimizer state (16 B/param; sharded over ``shard`` ranks under fsdp/hsdp, default: all of them for fsdp,
    train.shard_size or LOCAL_WORLD_SIZE for hsdp; FSDP2 then also holds the unsharded parameters of the block it
    runs and the next one it prefetches, one block's unsharded gradients before the reduce-scatter, and the
    root's embedding and head whole), the activations of one micro-batch (Korthikanti et al. 2022, above; a
    checkpointed block keeps only its input, and one block is live again while recomputed), and the fp32 logits
    with their log-softmax and gradient (3 x B x T x vocab x 4 bytes). ``params`` = the exact count (lm_ablate.cost);
    else ~12 L d^2 + 2 V d. ``parallel`` forces the layout (bench/gpu.py: fsdp over one rank). DDP's gradient
    buckets (4 B/param) and autocast's bf16 weight copies are not counted."""
    from lm_ablate.distributed import shard_degree

    m, t = cfg.model, cfg.train
    if parallel is None:
        parallel = getattr(t, "parallel", "ddp") if world > 1 else "one process"
    if shard is None:
        shard = shard_degree(parallel, getattr(t, "shard_size", None), world)
    b = max(1, t.batch_size // (world * t.grad_accum))
    T, d, L, H = m.context, m.d_model, m.n_layers, m.n_heads
    scale = 1 if device_type == "cuda" else 2  # bf16 autocast on CUDA, fp32 on CPU
    per_layer = T * b * d * ACTIVATION_BYTES_PER_TOKEN_16BIT * scale
    if cfg.attention.softcap is not None:  # the written-out attention path stores its scores
        per_layer += T * b * H * T * SCORE_BYTES_16BIT * scale
    if cfg.attention.window is not None or cfg.position.name in ("alibi", "t5"):  # an additive [H,] T x T mask
        per_layer += T * T * 4 * (H if cfg.position.name in ("alibi", "t5") else 1)
    n_ac = checkpointed_blocks(t, L)
    activations = (L - n_ac) * per_layer + n_ac * T * b * d * CHECKPOINTED_BYTES_PER_TOKEN + (per_layer if n_ac else 0)
    logits = 3 * b * T * vocab_size * 4
    block, root = 12 * d * d, 2 * vocab_size * d
    count = params if params is not None else L * block + root
    states = count * BYTES_PER_PARAM / shard
    working = 0.0
    if parallel in ("fsdp", "hsdp"):
        param_bytes = 2 if device_type == "cuda" else 4  # bf16 under the mixed-precision policy on CUDA
        working = 2 * block * param_bytes + block * 4 + root * (param_bytes + 4)
    return MemoryEstimate(parallel, world, shard, count, states, working, activations, logits, n_ac)


def step_memory_bytes(cfg, vocab_size: int, device_type: str, world: int = 1) -> float:
    """Estimated peak memory of one training step on one process (:func:`memory_estimate`'s total)."""
    return memory_estimate(cfg, vocab_size, device_type, world).total


def available_memory_bytes(device: torch.device) -> float | None:
    """Free memory for a new process's tensors: CUDA's free memory, or Linux's MemAvailable capped by the
    cgroup limit; None where neither can be read."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        meminfo = dict(line.split(":", 1) for line in lines if ":" in line)
        free = float(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free = min(free, float(limit))
    except (OSError, ValueError):
        pass
    return free


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_step_memory(cfg, vocab_size: int, device: torch.device, world: int = 1) -> None:
    """Fail at start, in one line naming model.context and train.batch_size, when one step clearly cannot fit:
    the estimate of :func:`step_memory_bytes` exceeds the memory available now."""
    from lm_ablate.errors import bad

    need, free = step_memory_bytes(cfg, vocab_size, device.type, world), available_memory_bytes(device)
    if free is None or need <= free:
        return
    t = cfg.train
    more = "" if world <= 1 else f" on each of {world} ranks (train.parallel={t.parallel})"
    raise bad("model.context", cfg.model.context,
              f"one training step needs an estimated {_gib(need)}{more} at train.batch_size={t.batch_size} "
              f"(train.grad_accum={t.grad_accum}) and {_gib(free)} is available: lower model.context or "
              "train.batch_size, raise train.grad_accum, or shard (train.parallel=fsdp, "
              "train.activation_checkpointing=full)")  # fmt: skip


def out_of_memory(err: BaseException, cfg, device: torch.device) -> str | None:
    """One line for an allocation failure during a step (CUDA's OutOfMemoryError, the CPU allocator's
    RuntimeError); None for any other error."""
    text = str(err)
    if not (isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text):
        return None
    t = cfg.train
    return (f"model.context={cfg.model.context!r} is invalid: a training step ran out of {device.type} memory at "
            f"train.batch_size={t.batch_size} (train.grad_accum={t.grad_accum}); lower model.context or "
            "train.batch_size, or raise train.grad_accum")  # fmt: skip
