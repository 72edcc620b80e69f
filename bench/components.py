"""Step-time cost of single architecture switches, at two model shapes.

    python bench/components.py [--quick] [--rounds 8] [--steps 2] [--shapes small,d256] [--threads 1 --clock cpu]

Each variant is the default config (LayerNorm pre-norm, learned positions, GELU FFN 4d, MHA through SDPA,
serial block) with one switch flipped, built by ``lm_ablate.config.compose`` like a real run. A step is the
loop's step: zero_grad, forward, the regularizer's loss, backward, gradient clipping at 1, AdamW from
``lm_ablate.optim`` with the regularizer's parameter groups (fp32, CPU). All variants of a shape are
interleaved round by round (bench/_util.py); the ratio is the median over rounds of
step time(variant) / step time(baseline) measured in the same round.

    rmsnorm        norm=rmsnorm (torch's nn.RMSNorm) instead of nn.LayerNorm
    parallel       model.block=parallel (one shared norm; qkv and FFN input projections fused into one matmul)
    gqa / mqa      attention=gqa (2 of 4 kv heads) / attention=mqa (1): smaller qkv matmul, fewer parameters
    explicit attn  CausalSelfAttention.force_explicit: the written-out softmax(q k^T + mask) v path (the path
                   a softcap needs) instead of F.scaled_dot_product_attention

Shapes: ``small`` is the default model (d 128, 4 layers, 4 heads, context 128, batch 16, byte vocab 256);
``d256`` is d 256, 4 layers, 4 heads, context 256, batch 8, vocab 4096 (bench/throughput.py's shape).
The params and FLOPs columns say what a switch changes in the model itself (model_cost), so a time
ratio can be read against the work ratio.
"""

from __future__ import annotations

import argparse
import math
import sys
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
VARIANTS = {  # name -> (overrides, force_explicit)
    "baseline (layernorm, serial, mha, sdpa)": ([], False),
    "rmsnorm": (["norm=rmsnorm"], False),
    "parallel block": (["model.block=parallel"], False),
    "gqa (2 kv heads)": (["attention=gqa"], False),
    "mqa (1 kv head)": (["attention=mqa"], False),
    "explicit attention": ([], True),
}


class Step:
    """The loop's train step for one variant; ``__call__`` runs ``steps`` steps and returns s/step."""

    def __init__(self, overrides: list[str], explicit: bool, batch: int, vocab: int, steps: int):
        from lm_ablate.components.attention import CausalSelfAttention
        from lm_ablate.config import compose
        from lm_ablate.model import TransformerLM, model_cost
        from lm_ablate.registry import OPTIMIZERS, REGULARIZERS

        cfg = compose(["tracking=none"] + overrides)
        torch.manual_seed(0)
        self.model = TransformerLM(cfg, vocab)
        for m in self.model.modules():
            if isinstance(m, CausalSelfAttention):
                m.force_explicit = explicit
        self.cost = model_cost(self.model, cfg)
        self.reg = REGULARIZERS.build(cfg.regularization)
        self.opt = OPTIMIZERS.build(cfg.optim, self.reg.param_groups(self.model), torch.device("cpu"))
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randint(0, vocab, (batch, cfg.model.context), generator=gen)
        self.y = torch.randint(0, vocab, (batch, cfg.model.context), generator=gen)
        self.steps = steps
        self.model.train()

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss, _, _ = self.reg.loss(self.model(self.x), self.y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.reg.grad_clip or math.inf)
        self.opt.step()

    def __call__(self) -> float:
        tic = now()
        for _ in range(self.steps):
            self.step()
        return (now() - tic) / self.steps


def run_shape(name: str, a: argparse.Namespace) -> dict[str, float]:
    shape = SHAPES[name]
    steps = {
        v: Step(shape["overrides"] + ov, explicit, shape["batch"], shape["vocab"], a.steps)
        for v, (ov, explicit) in VARIANTS.items()
    }
    base_name = next(iter(VARIANTS))
    base = steps[base_name]
    m = base.model
    print(
        f"\n-- shape {name}: d_model {m.embed.weight.shape[1]}, {len(m.blocks)} layers, context {m.context}, "
        f"batch {shape['batch']}, vocab {shape['vocab']} (load {loadavg()})"
    )
    for s in steps.values():  # warm-up
        s.step()
    figures, loads = interleave(steps, a.rounds)
    out, rows = {}, []
    for v, times in figures.items():
        r = ratios(figures[base_name], times)
        out[v] = median(r)
        c = steps[v].cost
        rows.append(
            [
                v,
                f"{1e3 * median(times):.0f}",
                f"{median(r):.3f}",
                spread(r),
                f"{c.params_total / base.cost.params_total:.3f}",
                f"{c.flops_per_token / base.cost.flops_per_token:.3f}",
            ]
        )
    print(table(["variant", "ms/step", "x baseline time", "range", "params x", "FLOPs/token x"], rows))
    print(f"   {load_summary(loads)}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_round_args(p, "variant")
    a = p.parse_args(argv)
    apply_round_args(a)
    header("bench/components.py: step time of one switch vs the default config (fp32, CPU)")
    print(f"   {a.rounds} rounds x {a.steps} steps per variant, interleaved; clock: {a.clock}")
    results = {s: run_shape(s, a) for s in a.shapes.split(",")}
    print(f"\n   load average at end: {loadavg()}")
    parts = [
        f"{s}: " + ", ".join(f"{v.split(' (')[0]} {r:.2f}" for v, r in res.items() if not v.startswith("baseline"))
        for s, res in results.items()
    ]
    print("RESULT components (step time x baseline): " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
