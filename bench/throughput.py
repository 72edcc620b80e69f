"""Train-step throughput of lm-ablate against Hugging Face transformers, on the same math.

    python bench/throughput.py [--quick] [--rounds 6] [--steps 2] [--no-compile] [--profile]
                               [--threads 1 --clock cpu] [--families llama,gpt2] [--dropout P]

For each family (llama, gpt2) a transformers model is built from a config object with random weights and
``attn_implementation="sdpa"``; ``lm_ablate.hf.from_hf`` turns it into the lm-ablate model of the same
architecture and weights (the arch preset plus the HF sizes), and the logits of the two are checked to agree.
A step is what the loop does per step minus its bookkeeping: zero_grad, forward, cross-entropy on all
positions, backward, AdamW step (torch's CPU default implementation for both; no clipping). Both models train
(dropout, where the config has it, is on for both: GPT-2's 0.1 on embeddings, attention and residuals).

Candidates, interleaved round by round (see bench/_util.py): lm-ablate eager, transformers eager, and
unless --no-compile: "lm-ablate compiled" = what ``train.compile`` runs (model and cross-entropy compiled
as one function; the optimizer step stays eager), "lm-ablate compiled model only" and "transformers
compiled" (``torch.compile`` of the model, default inductor backend; the loss eager: the same scope on both
sides; every compiled candidate runs with ``lm_ablate.perf.compile_step``'s inductor setting, dropout masks
from torch's RNG ops), plus a 1024^3 fp32 matmul probe each round, the peak MFU is measured against. Cold compile time (first step minus a warm step, with a fresh inductor cache unless
--warm-cache) is reported separately.

MFU = model_cost FLOPs/token (PaLM appendix B) x tokens/s / the matmul peak of the same round.
Targets: lm-ablate eager >= 1.0x transformers eager; lm-ablate compiled >= 1.1x transformers eager;
eager MFU >= 65% at d_model >= 256. When a target is missed (or with --profile) the script profiles one
step of each side: time per phase (forward / backward / optimizer) and the forward+backward time per op
category (torch.profiler self CPU time).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time
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
    matmul_gflops,
    median,
    now,
    ratios,
    spread,
    table,
)

TARGET_EAGER, TARGET_COMPILED, TARGET_MFU = 1.0, 1.1, 0.65
SITES = ("embedding_dropout", "attention_dropout", "residual_dropout")


def build_pair(family: str, a: argparse.Namespace):
    """(hf_model, lm_ablate_model, cfg), both in train mode, same weights."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from lm_ablate.hf import from_hf

    torch.manual_seed(0)
    if family == "llama":
        d_ff = 8 * -(
            -8 * a.d_model // (3 * 8)
        )  # the llama preset's parameter-matched SwiGLU width (8d/3, multiple of 8)
        config = LlamaConfig(
            hidden_size=a.d_model,
            num_hidden_layers=a.layers,
            num_attention_heads=a.heads,
            num_key_value_heads=max(1, a.heads // 2),
            intermediate_size=d_ff,
            vocab_size=a.vocab,
            max_position_embeddings=a.seq,
        )
        hf = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    else:
        drop = {} if a.dropout is None else {"embd_pdrop": a.dropout, "attn_pdrop": a.dropout, "resid_pdrop": a.dropout}
        config = GPT2Config(
            n_embd=a.d_model,
            n_layer=a.layers,
            n_head=a.heads,
            vocab_size=a.vocab,
            n_positions=a.seq,
            bos_token_id=a.vocab - 1,
            eos_token_id=a.vocab - 1,
            **drop,
        )
        hf = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    assert hf.config._attn_implementation == "sdpa", hf.config._attn_implementation
    ours, cfg = from_hf(hf.eval())
    x = torch.randint(0, a.vocab, (2, a.seq))
    with torch.no_grad():
        diff = (hf(input_ids=x).logits - ours(x)).abs().max().item()
    if diff > 1e-3:
        raise SystemExit(f"{family}: converted model disagrees with transformers (max |logit diff| {diff:.2e})")
    return hf.train(), ours.train(), cfg, diff


class Stepper:
    """One side of the comparison: a module, the callable that runs its forward (eager or compiled), its
    own AdamW. ``rate(steps)`` runs ``steps`` train steps and returns tokens/s."""

    def __init__(self, module, forward, optimizer, x, y):
        self.module, self.forward, self.opt, self.x, self.y = module, forward, optimizer, x, y

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        logits = self.forward(self.x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1)).backward()
        self.opt.step()

    def rate(self, steps: int) -> float:
        tic = now()
        for _ in range(steps):
            self.step()
        return steps * self.x.numel() / (now() - tic)


class LossStepper(Stepper):
    """lm-ablate with the model AND the cross-entropy in one compiled function, as ``train.compile`` runs it."""

    def __init__(self, module, optimizer, x, y):
        def loss(x, y):
            logits = module(x)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

        super().__init__(module, None, optimizer, x, y)
        from lm_ablate.perf import compile_step

        self.loss = compile_step(loss)

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.x, self.y).backward()
        self.opt.step()


def hf_forward(model):
    return lambda x: model(input_ids=x).logits


def phases(stepper: Stepper, repeats: int = 3) -> dict[str, float]:
    """Median seconds of forward (with the loss), backward and the optimizer step."""
    out: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    for _ in range(repeats):
        stepper.opt.zero_grad(set_to_none=True)
        t0 = now()
        logits = stepper.forward(stepper.x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), stepper.y.reshape(-1))
        t1 = now()
        loss.backward()
        t2 = now()
        stepper.opt.step()
        t3 = now()
        for key, seconds in zip(out, (t1 - t0, t2 - t1, t3 - t2)):
            out[key].append(seconds)
    return {k: median(v) for k, v in out.items()}


CATEGORIES = (  # (category, substrings of aten op names), first match wins
    ("matmul (mm/addmm/bmm)", ("aten::mm", "aten::addmm", "aten::bmm")),
    ("attention kernel (SDPA)", ("scaled_dot_product", "flash_attention")),
    ("loss (log_softmax, nll)", ("log_softmax", "nll_loss")),
    ("norms", ("layer_norm", "rms_norm", "rsqrt", "aten::pow", "aten::mean", "aten::var")),
    (
        "copies (cat/copy_/clone/contiguous)",
        ("aten::cat", "aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy"),
    ),
    ("fills (zero/fill_/empty)", ("aten::fill_", "aten::zero_", "aten::zeros", "aten::empty")),
    ("embedding", ("embedding", "index_select", "index_add", "aten::index")),
    ("reductions (sum)", ("aten::sum",)),
    (
        "elementwise",
        (
            "aten::mul",
            "aten::add",
            "aten::sub",
            "aten::div",
            "aten::neg",
            "aten::silu",
            "aten::gelu",
            "aten::tanh",
            "aten::sigmoid",
            "aten::native_dropout",
            "aten::bernoulli",
            "aten::cos",
            "aten::sin",
            "aten::where",
            "aten::masked_fill",
            "aten::threshold",
            "_backward",
        ),
    ),
)


def op_profile(stepper: Stepper, steps: int = 2) -> tuple[dict[str, float], dict[str, float], float]:
    """Self CPU seconds per step of forward + loss + backward: by category and by op."""
    from torch.profiler import ProfilerActivity, profile

    def fwd_bwd() -> None:
        stepper.opt.zero_grad(set_to_none=True)
        logits = stepper.forward(stepper.x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), stepper.y.reshape(-1)).backward()

    fwd_bwd()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fwd_bwd()
    by_op: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.self_cpu_time_total > 0:
            by_op[ev.key] = ev.self_cpu_time_total / 1e6 / steps
    by_cat: dict[str, float] = {}
    for op, s in by_op.items():
        cat = next((c for c, keys in CATEGORIES if any(k in op for k in keys)), "other (incl. python/dispatch)")
        by_cat[cat] = by_cat.get(cat, 0.0) + s
    return by_cat, by_op, sum(by_op.values())


def profile_report(family: str, ours: Stepper, hf: Stepper) -> None:
    print(f"\n-- profile: {family} eager, one step (load {loadavg()})")
    ph = {"lm-ablate": phases(ours), "transformers": phases(hf)}
    rows = [[k, f"{1e3 * ph['lm-ablate'][k]:.0f}", f"{1e3 * ph['transformers'][k]:.0f}"] for k in ph["lm-ablate"]]
    print(table(["phase (median of 3)", "lm-ablate ms", "transformers ms"], rows))
    ours_cat, ours_ops, ours_total = op_profile(ours)
    hf_cat, hf_ops, hf_total = op_profile(hf)
    cats = sorted(set(ours_cat) | set(hf_cat), key=lambda c: -ours_cat.get(c, 0))
    rows = [
        [
            c,
            f"{1e3 * ours_cat.get(c, 0):.0f}",
            f"{100 * ours_cat.get(c, 0) / ours_total:.0f}%",
            f"{1e3 * hf_cat.get(c, 0):.0f}",
            f"{100 * hf_cat.get(c, 0) / hf_total:.0f}%",
        ]
        for c in cats
    ]
    rows.append(
        ["total forward+backward (self CPU)", f"{1e3 * ours_total:.0f}", "100%", f"{1e3 * hf_total:.0f}", "100%"]
    )
    print(table(["op category (fwd+bwd, self CPU/step)", "lm-ablate ms", "share", "transformers ms", "share"], rows))
    top = sorted(ours_ops, key=lambda k: -ours_ops[k])[:12]
    rows = [[op[:60], f"{1e3 * ours_ops[op]:.1f}", f"{1e3 * hf_ops.get(op, 0):.1f}"] for op in top]
    print(table(["top ops of lm-ablate (self CPU/step)", "lm-ablate ms", "transformers ms"], rows))


def run_family(family: str, a: argparse.Namespace) -> dict:
    hf, ours, cfg, diff = build_pair(family, a)
    from lm_ablate.model import model_cost, site_dropout

    flops_per_token = model_cost(ours, cfg).flops_per_token
    n_params = sum(p.numel() for p in ours.parameters())
    print(
        f"\n-- {family}: d_model {a.d_model}, {a.layers} layers, {a.heads} heads, vocab {a.vocab}, batch {a.batch} x "
        f"{a.seq} tokens; {n_params / 1e6:.2f}M params, {flops_per_token / 1e6:.1f} MFLOP/token; "
        f"eval logits agree to {diff:.1e}; attention={cfg.attention.name}, activation={cfg.activation.name}, "
        f"dropout (embedding/attention/residual)={'/'.join(str(site_dropout(cfg.regularization, k)) for k in SITES)}"
    )
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
    opt = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    ours_opt, hf_opt = opt(ours), opt(hf)
    steppers = {
        "lm-ablate eager": Stepper(ours, ours, ours_opt, x, y),
        "transformers eager": Stepper(hf, hf_forward(hf), hf_opt, x, y),
    }
    compile_s = {}
    if a.compile:
        steppers["lm-ablate compiled"] = LossStepper(ours, ours_opt, x, y)
        steppers["lm-ablate compiled model only"] = Stepper(ours, torch.compile(ours), ours_opt, x, y)
        steppers["transformers compiled"] = Stepper(hf, hf_forward(torch.compile(hf)), hf_opt, x, y)
    warm = {}
    for name, s in steppers.items():  # warm-up; the first step of a compiled candidate compiles it
        tic = time.perf_counter()
        s.step()
        first = time.perf_counter() - tic
        tic = time.perf_counter()
        s.step()
        warm[name] = time.perf_counter() - tic
        if "compiled" in name:
            compile_s[name] = first - warm[name]
            print(
                f"   {name}: cold compile {compile_s[name]:.1f} s (first step {first:.1f} s, then {warm[name]:.2f} s/step)"
            )
    candidates = {name: (lambda s=s: s.rate(a.steps)) for name, s in steppers.items()}
    candidates["matmul peak GFLOP/s"] = matmul_gflops
    figures, loads = interleave(candidates, a.rounds)
    peaks = figures.pop("matmul peak GFLOP/s")
    base = figures["transformers eager"]
    rows = []
    result = {
        "family": family,
        "compile_s": compile_s,
        "loads": loads,
        "peak_best": max(peaks),
        "peak_median": median(peaks),
    }
    for name, rates in figures.items():
        mfu = [flops_per_token * r / (p * 1e9) for r, p in zip(rates, peaks)]
        vs_hf = ratios(base, rates)
        result[name] = {
            "tok_s": median(rates),
            "vs_hf_eager": median(vs_hf),
            "mfu": median(mfu),
            "mfu_best_peak": flops_per_token * median(rates) / (max(peaks) * 1e9),
        }
        rows.append(
            [
                name,
                f"{median(rates):.0f}",
                spread(rates),
                f"{median(vs_hf):.3f}",
                spread(vs_hf),
                f"{flops_per_token * median(rates) / 1e9:.1f}",
                f"{100 * median(mfu):.1f}%",
                f"{100 * result[name]['mfu_best_peak']:.1f}%",
            ]
        )
    if a.compile:
        vs = ratios(figures["transformers compiled"], figures["lm-ablate compiled model only"])
        result["compiled_vs_compiled"] = median(vs)
    print(
        table(
            [
                "candidate",
                "tokens/s",
                "range",
                "x transformers eager",
                "range",
                "model GFLOP/s",
                "MFU (round peak)",
                "MFU (best peak)",
            ],
            rows,
        )
    )
    print(f"   matmul peak: median {median(peaks):.1f} GFLOP/s over the rounds, best {max(peaks):.1f}")
    if a.compile:
        print(f"   lm-ablate compiled model only / transformers compiled: {result['compiled_vs_compiled']:.3f}x")
    print(f"   {load_summary(loads)}")
    eager = result["lm-ablate eager"]
    missed = eager["vs_hf_eager"] < TARGET_EAGER or (a.d_model >= 256 and eager["mfu"] < TARGET_MFU)
    if a.compile:
        missed |= result["lm-ablate compiled"]["vs_hf_eager"] < TARGET_COMPILED
    if a.profile or (missed and not a.quick):
        profile_report(family, steppers["lm-ablate eager"], steppers["transformers eager"])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test (< 60 s): small shape, 2 rounds, eager only")
    p.add_argument("--families", default="llama,gpt2")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=2, help="train steps per candidate per round")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument(
        "--warm-cache",
        action="store_true",
        help="use inductor's usual on-disk cache (default: a fresh one, so compile times are cold)",
    )
    p.add_argument("--profile", action="store_true", help="profile even when every target is met")
    p.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="gpt2's embd/attn/resid_pdrop (default: GPT2Config's 0.1, what arch=gpt2 also uses)",
    )
    add_timing_args(p)
    a = p.parse_args(argv)
    if a.quick:
        a.batch, a.seq, a.rounds, a.steps, a.compile = 4, 64, 2, 1, False
    apply_timing_args(a)
    if a.compile and not a.warm_cache:  # before inductor is imported: every compile below starts cold
        cache = tempfile.mkdtemp(prefix="lm_ablate_bench_inductor_")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
    header("bench/throughput.py: train-step tokens/s, lm-ablate vs transformers (fp32, CPU)")
    import transformers

    print(
        f"   transformers {transformers.__version__}; {a.rounds} rounds x {a.steps} steps per candidate; clock: {a.clock}"
    )
    results = [run_family(f, a) for f in a.families.split(",")]

    print(
        "\n== summary (targets: eager >= 1.0x transformers eager, compiled >= 1.1x transformers eager, "
        f"eager MFU >= {TARGET_MFU:.0%} at d_model >= 256)"
    )
    rows = []
    for r in results:
        e = r["lm-ablate eager"]
        row = [r["family"], f"{e['vs_hf_eager']:.3f}x", f"{100 * e['mfu']:.1f}%"]
        if a.compile:
            c = r["lm-ablate compiled"]
            row += [
                f"{c['vs_hf_eager']:.3f}x",
                f"{r['compiled_vs_compiled']:.3f}x",
                f"{r['compile_s']['lm-ablate compiled']:.0f} s / {r['compile_s']['transformers compiled']:.0f} s",
            ]
        rows.append(row)
    heads = ["family", "eager vs HF eager", "eager MFU"]
    if a.compile:
        heads += ["compiled vs HF eager", "model-only compiled vs HF compiled", "cold compile ours / HF"]
    print(table(heads, rows))
    print(f"   load average at end: {loadavg()}")
    parts = []
    for r in results:
        s = f"{r['family']} eager {r['lm-ablate eager']['vs_hf_eager']:.2f}x"
        if a.compile:
            s += f", compiled {r['lm-ablate compiled']['vs_hf_eager']:.2f}x"
        s += f", MFU {100 * r['lm-ablate eager']['mfu']:.0f}%"
        parts.append(s)
    print("RESULT throughput (lm-ablate vs transformers eager): " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
