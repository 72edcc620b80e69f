"""Measured gain of candidate speed-ups, applied by monkeypatching in this process only (no source file changes).

    python bench/proposals.py [--quick] [--rounds 10] [--steps 1] [--threads 1 --clock cpu]

The patches are proposals for lm_ablate/components/ (and one for lm_ablate/optim.py); each is checked to
give the same output as the current code before it is timed. Candidates, interleaved round by round with
the current code (bench/_util.py), on the llama preset (and, for parallel-split, the default config with
model.block=parallel) at the two shapes of bench/components.py (the loop's step: forward, loss, backward,
clip, AdamW):

    swiglu-split   components/ffn.py GatedFFN: two F.linear on the row halves of the fused gate_up weight
                   instead of one matmul + chunk; the chunk's halves are strided views, and silu, its
                   backward and the gate * up product run markedly slower on them
    rope-nocat     components/position.py RotaryPosition._rotate_one: with fraction 1 (nothing passes
                   through) skip the slice and the concatenation with an empty tail, a full copy of q and k
                   per layer, forward and backward
    rmsnorm-fn     components/norm.py: RMSNorm as one autograd.Function with a hand-written backward (5 tensor
                   ops forward and backward) instead of torch's nn.RMSNorm, which on CPU runs as a composite of
                   pow / mean / add / rsqrt / mul and differentiates through each (3-5x LayerNorm's time)
    all three      swiglu-split + rope-nocat + rmsnorm-fn
    parallel-split model.py ParallelBlock: split the fused input projection's output once and give each
                   sublayer its part (``Columns`` passes an input of its own width through) instead of two
                   ``narrow`` calls on the full output, whose backward each allocate and fill a full-width zero
                   gradient that is then summed (measured on model.block=parallel, the default config)
    fused-adamw    lm_ablate/optim.py: torch.optim.AdamW(fused=True) on CPU too (the fused CPU kernel exists
                   since torch 2.4; the current code asks for it on CUDA only)
"""

from __future__ import annotations

import argparse
import math
import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _util import header, interleave, load_summary, loadavg, median, now, ratios, set_clock, spread, table
from torch import nn

from lm_ablate.components.ffn import GatedFFN
from lm_ablate.components.position import RotaryPosition
from lm_ablate.model import Columns, ParallelBlock

ORIGINAL = {"ffn": GatedFFN.forward, "rope": RotaryPosition._rotate_one, "rms": nn.RMSNorm.forward,
            "parallel": ParallelBlock.forward}


class RMSNormFunction(torch.autograd.Function):
    """y = x * r * w with r = rsqrt(mean(x^2) + eps) over the last dim; saves x * r and r."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))
        xhat = x * r
        ctx.save_for_backward(xhat, r, weight)
        return xhat * weight

    @staticmethod
    def backward(ctx, gy):
        xhat, r, weight = ctx.saved_tensors
        gxhat = gy * weight
        gw = (gy * xhat).reshape(-1, xhat.shape[-1]).sum(0)
        gx = (gxhat - xhat * (gxhat * xhat).mean(-1, keepdim=True)).mul_(r)
        return gx, gw, None


def rmsnorm_fn_forward(self, x):
    """Proposed RMSNorm forward (the plain rmsnorm option; the Gemma unit-offset subclass keeps its own)."""
    if self.weight is None or len(self.normalized_shape) != 1 or x.dtype != self.weight.dtype:
        return ORIGINAL["rms"](self, x)
    eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
    return RMSNormFunction.apply(x, self.weight, eps)


def ffn_split_forward(self, x):
    """Proposed GatedFFN.forward: same weights, two matmuls into contiguous outputs."""
    if not isinstance(self.gate_up, nn.Linear):  # a parallel block's fused Columns: keep the current path
        return ORIGINAL["ffn"](self, x)
    w, b = self.gate_up.weight, self.gate_up.bias
    half = w.shape[0] // 2
    gate = F.linear(x, w[:half], None if b is None else b[:half])
    up = F.linear(x, w[half:], None if b is None else b[half:])
    return self.down(self.act(gate) * up)


def rope_nocat(self, x, cos, sin):
    """Proposed RotaryPosition._rotate_one: no slice + cat when the whole head rotates."""
    if self.dims == x.shape[-1]:
        return x * cos.to(x.dtype) + self.layout.partner(x) * sin.to(x.dtype)
    return ORIGINAL["rope"](self, x, cos, sin)


def parallel_split_forward(self, x, position):
    """Proposed ParallelBlock.forward (model.py): split the fused projection's output ONCE and hand each
    sublayer its own part, instead of each ``Columns`` narrowing the whole output. Backward then assembles
    the fused gradient with one concatenation, where two narrows each allocate a zero tensor of the full
    width, copy into it, and the two are added."""
    if self.fused is None:
        return ORIGINAL["parallel"](self, x, position)
    h = self.fused(self.norm(x))
    attn_width = self.attn.qkv.width
    h_attn, h_ffn = h.split([attn_width, h.shape[-1] - attn_width], dim=-1)
    return x + self.drop(self.attn(h_attn, position)) + self.drop(self.ffn(h_ffn))


def columns_forward(self, h):
    """Proposed Columns.forward: an input already cut to this projection's width passes through."""
    y = h if h.shape[-1] == self.width else h.narrow(-1, self.start, self.width)
    return y if self.bias is None else y + self.bias


PATCHES = {  # name -> [(owner, attribute, proposed)]
    "swiglu-split": [(GatedFFN, "forward", ffn_split_forward)],
    "rope-nocat": [(RotaryPosition, "_rotate_one", rope_nocat)],
    "rmsnorm-fn": [(nn.RMSNorm, "forward", rmsnorm_fn_forward)],
    "parallel-split": [(ParallelBlock, "forward", parallel_split_forward), (Columns, "forward", columns_forward)],
}


@contextmanager
def patched(*names: str):
    saved = [(owner, attr, getattr(owner, attr)) for n in names for owner, attr, _ in PATCHES[n]]
    for n in names:
        for owner, attr, proposed in PATCHES[n]:
            setattr(owner, attr, proposed)
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


class Setup:
    def __init__(self, overrides: list[str], batch: int, vocab: int):
        from lm_ablate.config import compose
        from lm_ablate.model import TransformerLM
        from lm_ablate.registry import REGULARIZERS

        cfg = compose(["tracking=none"] + overrides)
        torch.manual_seed(0)
        self.model = TransformerLM(cfg, vocab).train()
        self.reg = REGULARIZERS.build(cfg.regularization)
        groups = self.reg.param_groups(self.model)
        kw = {"lr": cfg.optim.lr, "betas": (cfg.optim.beta1, cfg.optim.beta2), "eps": cfg.optim.eps}
        self.opt = {False: torch.optim.AdamW(groups, **kw), True: torch.optim.AdamW(groups, fused=True, **kw)}
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randint(0, vocab, (batch, cfg.model.context), generator=gen)
        self.y = torch.randint(0, vocab, (batch, cfg.model.context), generator=gen)
        self.label = (f"{' '.join(overrides)}: d_model {cfg.model.d_model}, {cfg.model.n_layers} layers, "
                      f"context {cfg.model.context}, batch {batch}, vocab {vocab}")

    def step(self, fused: bool) -> None:
        opt = self.opt[fused]
        opt.zero_grad(set_to_none=True)
        self.reg.loss(self.model(self.x), self.y)[0].backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.reg.grad_clip or math.inf)
        opt.step()

    def candidate(self, steps: int, patches: tuple[str, ...] = (), fused: bool = False):
        def run() -> float:
            with patched(*patches):
                tic = now()
                for _ in range(steps):
                    self.step(fused)
                return (now() - tic) / steps

        return run

    def check(self, patches: tuple[str, ...]) -> tuple[float, float]:
        """Max |difference| of the patched model against the current one: logits, and parameter gradients."""
        x, y = self.x[:2], self.y[:2]
        self.model.zero_grad(set_to_none=True)
        ref = self.model(x)
        self.reg.loss(ref, y)[0].backward()
        ref_grads = [p.grad.clone() for p in self.model.parameters()]
        self.model.zero_grad(set_to_none=True)
        with patched(*patches):
            new = self.model(x)
            self.reg.loss(new, y)[0].backward()
        grad_diff = max((p.grad - g).abs().max().item() for p, g in zip(self.model.parameters(), ref_grads))
        self.model.zero_grad(set_to_none=True)
        return (ref - new).abs().max().item(), grad_diff


LLAMA_CANDIDATES = {  # name -> (patches, fused AdamW)
    "current": ((), False),
    "swiglu-split": (("swiglu-split",), False),
    "rope-nocat": (("rope-nocat",), False),
    "rmsnorm-fn": (("rmsnorm-fn",), False),
    "all three": (("swiglu-split", "rope-nocat", "rmsnorm-fn"), False),
    "fused-adamw": ((), True),
}
PARALLEL_CANDIDATES = {"current": ((), False), "parallel-split": (("parallel-split",), False)}
D256 = ["model.d_model=256", "model.context=256"]
SETUPS = {  # name -> (overrides, batch, vocab, candidates)
    "llama small": (["arch=llama"], 16, 256, LLAMA_CANDIDATES),
    "llama d256": (["arch=llama"] + D256, 8, 4096, LLAMA_CANDIDATES),
    "parallel small": (["model.block=parallel"], 16, 256, PARALLEL_CANDIDATES),
    "parallel d256": (["model.block=parallel"] + D256, 8, 4096, PARALLEL_CANDIDATES),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: the small setups, 2 rounds")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's, one per core)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this thread's CPU time (needs --threads 1): robust to other load on the machine")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    set_clock(a.clock)
    setups = SETUPS
    if a.quick:
        setups, a.rounds = {k: v for k, v in SETUPS.items() if "small" in k}, 2
    header("bench/proposals.py: candidate speed-ups (monkeypatched) vs the current code")
    print(f"   {a.rounds} rounds x {a.steps} steps per candidate, interleaved; clock: {a.clock}")
    results = {}
    for name, (ov, batch, vocab, candidates) in setups.items():
        s = Setup(ov, batch, vocab)
        every = tuple(sorted({pt for patches, _ in candidates.values() for pt in patches}))
        logit_diff, grad_diff = s.check(every)
        print(f"\n-- {name} ({s.label}); with every patch: logits differ by {logit_diff:.1e}, gradients by {grad_diff:.1e}")
        cands = {c: s.candidate(a.steps, patches, fused) for c, (patches, fused) in candidates.items()}
        for c in cands.values():
            c()
        figures, loads = interleave(cands, a.rounds)
        rows = []
        results[name] = {}
        for c, times in figures.items():
            r = ratios(times, figures["current"])  # current / candidate: > 1 = the candidate is faster
            results[name][c] = median(r)
            rows.append([c, f"{1e3 * median(times):.0f}", f"{median(r):.3f}", spread(r)])
        print(table(["candidate", "ms/step", "speed-up vs current", "range"], rows))
        print(f"   {load_summary(loads)}")
    print(f"\n   load average at end: {loadavg()}")
    print("RESULT proposals (speed-up of the step): " + "; ".join(
        f"{n}: " + ", ".join(f"{c} {v:.3f}x" for c, v in r.items() if c != "current") for n, r in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
