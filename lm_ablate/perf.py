"""Throughput: how ``train.compile`` compiles the step; the peak that MFU is measured against; peak memory.

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
