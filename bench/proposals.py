"""Measured gain of speed-ups: the ones applied to lm_ablate (against the code they replaced, restored here
by monkeypatching) and the ones still proposed (applied here by monkeypatching). No source file changes.

    python bench/proposals.py [--quick] [--rounds 10] [--steps 1] [--threads 1 --clock cpu]

Each patch is checked to give the same output and gradients as the current code before it is timed.
Candidates run interleaved round by round (bench/_util.py) on the llama preset (and, for the parallel
block, the default config with model.block=parallel) at the two shapes of bench/components.py (the loop's
step: forward, loss, backward, clip, AdamW). A ratio > 1 means the current code is faster.

Applied (each "before: X" candidate restores the previous code of X):

    swiglu-split   components/ffn.py GatedFFN.gate_and_up: two F.linear on the row halves of the stacked
                   gate_up weight; before, one matmul + chunk, whose halves are strided views on which silu,
                   its backward and the gate * up product run markedly slower
    rope-nocat     components/position.py RotaryPosition._rotate_one: with fraction 1 (nothing passes
                   through) no slice and no concatenation with an empty tail (before: a full copy of q and k
                   per layer, forward and backward)
    rmsnorm-fn     components/norm.py: RMSNorm through one autograd.Function with a hand-written backward;
                   before, torch's nn.RMSNorm, which on CPU runs as a composite of pow / mean / add / rsqrt /
                   mul and differentiates through each (3-5x LayerNorm's time)
    parallel-split model.py ParallelBlock: the fused input projection's output split once, each sublayer
                   given its part; before, two ``narrow`` calls on the full output, whose backward each
                   allocate and fill a full-width zero gradient that is then summed

Still proposed (candidate = the change):

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
from _util import (
    add_timing_args,
    apply_timing_args,
    header,
    interleave,
    load_summary,
    loadavg,
    median,
    now,
    ratios,
    spread,
    table,
)

from lm_ablate.components.ffn import GatedFFN
from lm_ablate.components.norm import RMSNorm
from lm_ablate.components.position import RotaryPosition
from lm_ablate.model import ParallelBlock


def chunk_gate_and_up(self, x):
    """Before: one matmul into the stacked output, split into two strided halves."""
    return self.gate_up(x).chunk(2, dim=-1)


def rope_with_cat(self, x, cos, sin):
    """Before: slice the rotated dims and concatenate the (here empty) pass-through dims back."""
    x_rot, x_pass = x[..., : self.dims], x[..., self.dims :]
    x_rot = x_rot * cos.to(x.dtype) + self.layout.partner(x_rot) * sin.to(x.dtype)
    return torch.cat((x_rot, x_pass), dim=-1)


def torch_rmsnorm(self, x):
    """Before: torch's own module."""
    return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


def parallel_narrow_forward(self, x, position):
    """Before: each sublayer narrowed its columns out of the whole fused output."""
    if self.fused is None:
        return x + self.drop(self.attn(self.norm(x), position)) + self.drop(self.ffn(self.ffn_norm(x)))
    h = self.fused(self.norm(x))
    h_attn, h_ffn = h.narrow(-1, 0, self.widths[0]), h.narrow(-1, self.widths[0], self.widths[1])
    return x + self.drop(self.attn(h_attn, position)) + self.drop(self.ffn(h_ffn))


PATCHES = {  # name -> [(owner, attribute, the code before)]
    "swiglu-split": [(GatedFFN, "gate_and_up", chunk_gate_and_up)],
    "rope-nocat": [(RotaryPosition, "_rotate_one", rope_with_cat)],
    "rmsnorm-fn": [(RMSNorm, "forward", torch_rmsnorm)],
    "parallel-split": [(ParallelBlock, "forward", parallel_narrow_forward)],
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
        self.label = (
            f"{' '.join(overrides)}: d_model {cfg.model.d_model}, {cfg.model.n_layers} layers, "
            f"context {cfg.model.context}, batch {batch}, vocab {vocab}"
        )

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


LLAMA_CANDIDATES = {  # name -> (patches restoring the code before, fused AdamW)
    "current": ((), False),
    "before: swiglu-split": (("swiglu-split",), False),
    "before: rope-nocat": (("rope-nocat",), False),
    "before: rmsnorm-fn": (("rmsnorm-fn",), False),
    "before: all three": (("swiglu-split", "rope-nocat", "rmsnorm-fn"), False),
    "proposed: fused-adamw": ((), True),
}
PARALLEL_CANDIDATES = {"current": ((), False), "before: parallel-split": (("parallel-split",), False)}
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
    add_timing_args(p)
    a = p.parse_args(argv)
    apply_timing_args(a)
    setups = SETUPS
    if a.quick:
        setups, a.rounds = {k: v for k, v in SETUPS.items() if "small" in k}, 2
    header("bench/proposals.py: the current code vs the code before each applied speed-up, and proposals")
    print(f"   {a.rounds} rounds x {a.steps} steps per candidate, interleaved; clock: {a.clock}")
    results = {}
    for name, (ov, batch, vocab, candidates) in setups.items():
        s = Setup(ov, batch, vocab)
        every = tuple(sorted({pt for patches, _ in candidates.values() for pt in patches}))
        logit_diff, grad_diff = s.check(every)
        print(
            f"\n-- {name} ({s.label}); with every patch: logits differ by {logit_diff:.1e}, gradients by {grad_diff:.1e}"
        )
        print("   ratio = candidate's step time / the current code's: > 1 for a 'before' row = the gain of the change")
        cands = {c: s.candidate(a.steps, patches, fused) for c, (patches, fused) in candidates.items()}
        for c in cands.values():
            c()
        figures, loads = interleave(cands, a.rounds)
        rows = []
        results[name] = {}
        for c, times in figures.items():
            r = ratios(figures["current"], times)  # candidate / current: > 1 = the current code is faster
            results[name][c] = median(r)
            rows.append([c, f"{1e3 * median(times):.0f}", f"{median(r):.3f}", spread(r)])
        print(table(["candidate", "ms/step", "time x current", "range"], rows))
        print(f"   {load_summary(loads)}")
    print(f"\n   load average at end: {loadavg()}")
    print(
        "RESULT proposals (step time x the current code's): "
        + "; ".join(
            f"{n}: " + ", ".join(f"{c} {v:.3f}x" for c, v in r.items() if c != "current") for n, r in results.items()
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
