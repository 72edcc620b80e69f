"""Measured gain of candidate speed-ups, applied by monkeypatching in this process only (no source file changes).

    python bench/proposals.py [--quick] [--rounds 10] [--steps 1] [--threads N]

The patches are proposals for lm_ablate/components/ (and one for lm_ablate/optim.py); each is checked to
give the same output as the current code before it is timed. Candidates, interleaved round by round with
the current code (bench/_util.py), on the llama preset at two shapes (the loop's step: forward, loss,
backward, clip, AdamW):

    swiglu-split   components/ffn.py GatedFFN: two F.linear on the row halves of the fused gate_up weight
                   instead of one matmul + chunk; the chunk's halves are strided views, and silu, its
                   backward and the gate * up product run markedly slower on them
    rope-nocat     components/position.py RotaryPosition._rotate_one: with fraction 1 (nothing passes
                   through) skip the slice and the concatenation with an empty tail, a full copy of q and k
                   per layer, forward and backward
    rmsnorm-fn     components/norm.py: RMSNorm as one autograd.Function with a hand-written backward (5 tensor
                   ops forward and backward) instead of torch's nn.RMSNorm, which on CPU runs as a composite of
                   pow / mean / add / rsqrt / mul and differentiates through each (3-5x LayerNorm's time)
    both           swiglu-split + rope-nocat
    all-three      swiglu-split + rope-nocat + rmsnorm-fn
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

from _util import now, set_clock, header, interleave, load_summary, loadavg, median, ratios, spread, table  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from lm_ablate.components.ffn import GatedFFN  # noqa: E402
from lm_ablate.components.position import RotaryPosition  # noqa: E402

ORIGINAL = {"ffn": GatedFFN.forward, "rope": RotaryPosition._rotate_one, "rms": nn.RMSNorm.forward}


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


@contextmanager
def patched(ffn: bool, rope: bool, rms: bool = False):
    GatedFFN.forward = ffn_split_forward if ffn else ORIGINAL["ffn"]
    RotaryPosition._rotate_one = rope_nocat if rope else ORIGINAL["rope"]
    nn.RMSNorm.forward = rmsnorm_fn_forward if rms else ORIGINAL["rms"]
    try:
        yield
    finally:
        GatedFFN.forward, RotaryPosition._rotate_one, nn.RMSNorm.forward = ORIGINAL["ffn"], ORIGINAL["rope"], ORIGINAL["rms"]


class Setup:
    def __init__(self, overrides: list[str], batch: int, vocab: int):
        from lm_ablate.config import compose
        from lm_ablate.model import TransformerLM
        from lm_ablate.registry import REGULARIZERS

        cfg = compose(["tracking=none", "arch=llama"] + overrides)
        torch.manual_seed(0)
        self.model = TransformerLM(cfg, vocab).train()
        self.reg = REGULARIZERS.build(cfg.regularization)
        groups = self.reg.param_groups(self.model)
        kw = dict(lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps)
        self.opt = {False: torch.optim.AdamW(groups, **kw), True: torch.optim.AdamW(groups, fused=True, **kw)}
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randint(0, vocab, (batch, cfg.model.context), generator=gen)
        self.y = torch.randint(0, vocab, (batch, cfg.model.context), generator=gen)
        self.label = (f"arch=llama d_model {cfg.model.d_model}, {cfg.model.n_layers} layers, context {cfg.model.context}, "
                      f"batch {batch}, vocab {vocab}")

    def step(self, fused: bool) -> None:
        opt = self.opt[fused]
        opt.zero_grad(set_to_none=True)
        self.reg.loss(self.model(self.x), self.y)[0].backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.reg.grad_clip or math.inf)
        opt.step()

    def candidate(self, steps: int, ffn=False, rope=False, rms=False, fused=False):
        def run() -> float:
            with patched(ffn, rope, rms):
                tic = now()
                for _ in range(steps):
                    self.step(fused)
                return (now() - tic) / steps

        return run

    def check(self) -> tuple[float, float]:
        """Max |difference| of the patched model against the current one: logits, and parameter gradients."""
        x, y = self.x[:2], self.y[:2]
        self.model.zero_grad(set_to_none=True)
        ref = self.model(x)
        self.reg.loss(ref, y)[0].backward()
        ref_grads = [p.grad.clone() for p in self.model.parameters()]
        self.model.zero_grad(set_to_none=True)
        with patched(True, True, True):
            new = self.model(x)
            self.reg.loss(new, y)[0].backward()
        grad_diff = max((p.grad - g).abs().max().item() for p, g in zip(self.model.parameters(), ref_grads))
        self.model.zero_grad(set_to_none=True)
        return (ref - new).abs().max().item(), grad_diff


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's, one per core)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this thread's CPU time (needs --threads 1): robust to other load on the machine")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    set_clock(a.clock)
    shapes = {"small": ([], 16, 256), "d256": (["model.d_model=256", "model.context=256"], 8, 4096)}
    if a.quick:
        shapes, a.rounds = {"small": shapes["small"]}, 2
    header("bench/proposals.py: candidate speed-ups (monkeypatched) vs the current code")
    results = {}
    for name, (ov, batch, vocab) in shapes.items():
        s = Setup(ov, batch, vocab)
        logit_diff, grad_diff = s.check()
        print(f"\n-- {name}: {s.label}; all patches: logits differ by {logit_diff:.1e}, gradients by {grad_diff:.1e}")
        cands = {"current": s.candidate(a.steps), "swiglu-split": s.candidate(a.steps, ffn=True),
                 "rope-nocat": s.candidate(a.steps, rope=True), "rmsnorm-fn": s.candidate(a.steps, rms=True),
                 "both": s.candidate(a.steps, ffn=True, rope=True),
                 "all-three": s.candidate(a.steps, ffn=True, rope=True, rms=True),
                 "fused-adamw": s.candidate(a.steps, fused=True)}
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
