"""Step time of Muon, Adafactor and SGD against AdamW at the llama preset, measured in the same run.

    python bench/optimizers.py [--quick] [--rounds 8] [--steps 2] [--shapes small,d256] [--threads 1 --clock cpu]

Each candidate is ``arch=llama`` with ``optim=<name>`` (the files in conf/optim/), built like a real run by
``lm_ablate.config.compose``: same model and weights (seed 0), the regularizer's parameter groups, the
optimizer from ``lm_ablate.optim``. A step is the loop's step: zero_grad, forward, loss, backward, gradient
clipping at 1, optimizer step (fp32, CPU). Candidates are interleaved round by round (bench/_util.py); the
ratio is the median over rounds of step time(candidate) / step time(adamw) in the same round. The optimizer
step alone is timed too (``opt ms``: its share of the step).

One extra candidate answers a design question rather than measuring a choice: ``muon, fp32 NS`` runs torch's
Muon with its Newton-Schulz iteration in fp32 instead of bf16 (torch casts to bf16 on every device). On a CPU
without native bf16 matmuls fp32 would be the faster path; on one with AVX-512 BF16 (this machine) bf16 is
faster, and lm_ablate.optim keeps torch's bf16 everywhere. The patched function is torch's own iteration with
one cast changed, so both candidates do the same work.

Shapes: ``small`` is the default model (d 128, 4 layers, 4 heads, context 128, batch 16, byte vocab 256);
``d256`` is d 256, 4 layers, context 256, batch 8, vocab 4096 (bench/throughput.py's shape).
"""

from __future__ import annotations

import argparse
import math
import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _util import (
    add_round_args,
    apply_round_args,
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

SHAPES = {
    "small": {"overrides": [], "batch": 16, "vocab": 256},
    "d256": {"overrides": ["model.d_model=256", "model.context=256"], "batch": 8, "vocab": 4096},
}
CANDIDATES = {  # name -> (optim option, Newton-Schulz dtype override)
    "adamw": ("adamw", None),
    "muon": ("muon", None),
    "muon, fp32 NS": ("muon", torch.float32),
    "adafactor": ("adafactor", None),
    "sgd": ("sgd", None),
}


@contextmanager
def newton_schulz_dtype(dtype: torch.dtype | None):
    """Within the block, torch's Muon runs its Newton-Schulz iteration in ``dtype`` (None: unchanged, bf16)."""
    import torch.optim._muon as muon_module

    original = muon_module._zeropower_via_newtonschulz
    if dtype is None:
        yield
        return

    def patched(grad, ns_coefficients, ns_steps, eps):
        a, b, c = ns_coefficients
        x = grad.to(dtype)
        tall = grad.size(0) > grad.size(1)
        if tall:
            x = x.T
        x = x / x.norm().clamp(min=eps)
        for _ in range(ns_steps):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        return x.T if tall else x

    muon_module._zeropower_via_newtonschulz = patched
    try:
        yield
    finally:
        muon_module._zeropower_via_newtonschulz = original


class Step:
    """The loop's train step with one optimizer; ``__call__`` runs ``steps`` steps and returns s/step."""

    def __init__(self, optim: str, ns_dtype: torch.dtype | None, shape: dict, steps: int):
        from lm_ablate.config import compose
        from lm_ablate.model import TransformerLM
        from lm_ablate.registry import OPTIMIZERS, REGULARIZERS

        cfg = compose(["tracking=none", "arch=llama", f"optim={optim}"] + shape["overrides"])
        torch.manual_seed(0)
        self.model = TransformerLM(cfg, shape["vocab"])
        self.reg = REGULARIZERS.build(cfg.regularization)
        self.opt = OPTIMIZERS.build(cfg.optim, self.reg.param_groups(self.model), torch.device("cpu"))
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randint(0, shape["vocab"], (shape["batch"], cfg.model.context), generator=gen)
        self.y = torch.randint(0, shape["vocab"], (shape["batch"], cfg.model.context), generator=gen)
        self.ns_dtype, self.steps = ns_dtype, steps
        self.opt_seconds: list[float] = []  # optimizer.step time of each call (mean over its steps)
        self.model.train()

    def step(self) -> float:
        self.opt.zero_grad(set_to_none=True)
        loss, _, _ = self.reg.loss(self.model(self.x), self.y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.reg.grad_clip or math.inf)
        tic = now()
        with newton_schulz_dtype(self.ns_dtype):
            self.opt.step()
        return now() - tic

    def __call__(self) -> float:
        tic, in_opt = now(), 0.0
        for _ in range(self.steps):
            in_opt += self.step()
        self.opt_seconds.append(in_opt / self.steps)
        return (now() - tic) / self.steps


def run_shape(name: str, a: argparse.Namespace) -> dict[str, float]:
    shape = SHAPES[name]
    steps = {c: Step(optim, dtype, shape, a.steps) for c, (optim, dtype) in CANDIDATES.items()}
    base = steps["adamw"]
    m = base.model
    print(
        f"\n-- shape {name}: llama preset, d_model {m.embed.weight.shape[1]}, {len(m.blocks)} layers, context "
        f"{m.context}, batch {shape['batch']}, vocab {shape['vocab']} (load {loadavg()})"
    )
    for s in steps.values():  # warm-up (also creates the optimizer states)
        s.step()
        s.opt_seconds.clear()
    figures, loads = interleave(steps, a.rounds)
    out, rows = {}, []
    for c, times in figures.items():
        r = ratios(figures["adamw"], times)
        out[c] = median(r)
        opt_ms = 1e3 * median(steps[c].opt_seconds)
        opt_ratio = ratios(base.opt_seconds, steps[c].opt_seconds)
        rows.append(
            [
                c,
                f"{1e3 * median(times):.1f}",
                f"{median(r):.3f}",
                spread(r),
                f"{opt_ms:.2f}",
                f"{median(opt_ratio):.2f}",
            ]
        )
    print(table(["optimizer", "ms/step", "x adamw step", "range", "opt ms", "opt x adamw"], rows))
    print(f"   {load_summary(loads)}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_round_args(p, "candidate")
    a = p.parse_args(argv)
    apply_round_args(a)
    header("bench/optimizers.py: step time of each optimizer vs AdamW at the llama preset (fp32, CPU)")
    print(f"   {a.rounds} rounds x {a.steps} steps per candidate, interleaved; clock: {a.clock}")
    results = {s: run_shape(s, a) for s in a.shapes.split(",")}
    print(f"\n   load average at end: {loadavg()}")
    parts = [f"{s}: " + ", ".join(f"{c} {r:.2f}" for c, r in res.items() if c != "adamw") for s, res in results.items()]
    print("RESULT optimizers (step time x adamw): " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
