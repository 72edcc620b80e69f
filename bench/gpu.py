"""GPU train-step throughput of the ``large`` model (GPT-2-small shape) in bf16, eager and compiled, next to
transformers' ``GPT2LMHeadModel`` of the same shape, measured in the same run.

    python bench/gpu.py [--device cuda] [--model large] [--batch 16] [--steps 20] [--rounds 3] [--warmup 3]
                        [--no-compile] [--no-hf] [--dropout P] [--vocab 50257] [--out bench.md]
    python bench/gpu.py --device cpu --model tiny --steps 3 --threads 1   # smoke test of the script (fp32)

Candidates, built from the same seed and measured one after another, each alone on the device (the previous
one is freed first, so its peak memory is its own):

  lm-ablate eager        ``TransformerLM(compose(["model=<model>", "arch=gpt2"]), vocab_size=50257)``
  lm-ablate compiled     the same, forward + loss compiled as one function (``lm_ablate.perf.compile_step``: what
                         ``train.compile=true`` runs)
  transformers eager     ``GPT2LMHeadModel(GPT2Config(n_embd, n_layer, n_head, n_positions = the model's))``, SDPA
  transformers compiled  its forward + loss compiled the same way

One step is the loop's step minus its bookkeeping, identical for all four: zero_grad; forward under bf16 autocast
(CUDA; fp32 on CPU) with fp32 logits; the loop's loss (``Regularizer.loss``: cross-entropy on every position);
backward; ``clip_grad_norm_`` at the preset's 1.0; the loop's AdamW (``OPTIMIZERS``: fused on CUDA, weight decay
on matrices only); and, like the loop, the loss and gradient norm read back with ``.item()``. Random tokens.
Both models keep GPT-2's dropout 0.1 (embeddings, attention, residuals) unless ``--dropout``.

Figures: step time = median over ``--rounds`` blocks of ``--steps`` steps (after ``--warmup`` steps; CUDA is
synchronized around each block); tokens/s = batch x context / step time; MFU = FLOPs/token (``model_cost``:
6 N_matmul + 12 L H d_head T, PaLM appendix B; the same for both models, which have the same shape and parameter
count, checked) x tokens/s / the measured bf16 matmul peak (``lm_ablate.perf.measured_peak_flops``, the loop's
``perf/mfu`` denominator); peak memory = ``torch.cuda.max_memory_allocated`` over the candidate's life; compile
time = first step minus a warm step (cold only on a machine's first run: inductor caches compiled code on disk).
Target: lm-ablate compiled >= 40% MFU on an H100/H200-class GPU.

Second table (``--parallel-shapes``, default ``large,1b`` on CUDA): the loop's own strategies
(lm_ablate/sharding.py) over a process group of one rank (NCCL; gloo on CPU): ``ddp`` (DDP, bf16 autocast),
``fsdp`` (FSDP2 per block and root, bf16 MixedPrecisionPolicy) and ``fsdp + full AC`` (every block recomputed in
backward), eager, the default architecture at ``model=large`` and at the GPU ladder's 1B rung (``ladder=gpu
ladder.rung=5``: d 2048, 20 layers, 16 heads, context 1024), ``--parallel-batch`` sequences per step. Each row:
tokens/s, MFU, peak memory and lm_ablate.perf.memory_estimate's figure for it (the number ``python -m
lm_ablate.cost`` prints). Over one rank FSDP shards nothing: what it saves against DDP is DDP's gradient buckets
and autocast's cached bf16 weights; activation checkpointing saves the activations. ``--memory-cap-gib C`` caps
the process (``torch.cuda.set_per_process_memory_fraction``) as a C-GiB GPU would, and a candidate that runs out
says so: the 1B target is a cap at which DDP does not fit and fsdp (+ AC) does.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _util import header, loadavg, median, spread

TARGET_MFU = 0.40


def flops_str(value: float) -> str:
    return f"{value / 1e12:.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.0f} GFLOP/s"


CANDIDATES = ("lm-ablate eager", "lm-ablate compiled", "transformers eager", "transformers compiled")


class Candidate:
    """A model, the callable that returns the loss of a batch (eager or compiled), its optimizer; the batch."""

    def __init__(self, module, loss_fn, optimizer, grad_clip: float, device: torch.device):
        self.module, self.loss_fn, self.opt, self.grad_clip, self.device = module, loss_fn, optimizer, grad_clip, device
        self.x = self.y = None
        self.flops_per_token: float | None = None  # model_cost, on the lm-ablate side

    def step(self) -> tuple[float, float]:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.x, self.y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        values = loss.item(), norm.item()  # the loop reads both every step (logging, divergence check)
        self.opt.step()
        return values

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, steps: int) -> float:
        """Seconds per step over ``steps`` steps."""
        self.sync()
        tic = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.sync()
        return (time.perf_counter() - tic) / steps


def config(a: argparse.Namespace):
    from lm_ablate.config import compose

    overrides = [f"model={a.model}", "arch=gpt2", "tracking=none"]
    if a.dropout is not None:
        overrides.append(f"regularization.dropout={a.dropout}")
    return compose(overrides)


def build(name: str, a: argparse.Namespace, device: torch.device) -> Candidate:
    from lm_ablate.catalog import load_all
    from lm_ablate.model import TransformerLM, model_cost
    from lm_ablate.perf import compile_step
    from lm_ablate.registry import OPTIMIZERS, REGULARIZERS

    load_all()
    cfg = config(a)
    regularizer = REGULARIZERS.build(cfg.regularization)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else nullcontext
    torch.manual_seed(0)
    if name.startswith("lm-ablate"):
        module = TransformerLM(cfg, a.vocab).to(device).train()
        forward = module
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        m, p = cfg.model, cfg.regularization.dropout
        hf_config = GPT2Config(
            n_embd=m.d_model,
            n_layer=m.n_layers,
            n_head=m.n_heads,
            n_positions=m.context,
            vocab_size=a.vocab,
            bos_token_id=a.vocab - 1,
            eos_token_id=a.vocab - 1,
            embd_pdrop=p,
            attn_pdrop=p,
            resid_pdrop=p,
        )
        module = GPT2LMHeadModel._from_config(hf_config, attn_implementation="sdpa").to(device).train()
        forward = lambda idx: module(input_ids=idx).logits.float()  # fp32 logits, as TransformerLM returns them

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast():
            logits = forward(x)
        return regularizer.loss(logits, y)[0]

    if name.endswith("compiled"):
        loss_fn = compile_step(loss_fn)
    optimizer = OPTIMIZERS.build(cfg.optim, regularizer.param_groups(module), device)
    c = Candidate(module, loss_fn, optimizer, regularizer.grad_clip, device)
    if isinstance(module, TransformerLM):
        c.flops_per_token = model_cost(module, cfg).flops_per_token
    return c


def measure(name: str, a: argparse.Namespace, device: torch.device, x, y) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    c = build(name, a, device)
    c.x, c.y = x, y
    params = sum(p.numel() for p in c.module.parameters())
    c.sync()
    tic = time.perf_counter()
    loss, _ = c.step()  # a compiled candidate compiles here (forward and backward graphs)
    c.sync()
    first = time.perf_counter() - tic
    warm = [c.timed(1) for _ in range(max(1, a.warmup - 1))]
    seconds = [c.timed(a.steps) for _ in range(a.rounds)]
    out = {
        "name": name,
        "params": params,
        "flops_per_token": c.flops_per_token,
        "step_s": median(seconds),
        "rounds_tok_s": [x.numel() / s for s in seconds],
        "first_loss": loss,
        "compile_s": first - median(warm) if name.endswith("compiled") else None,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    del c
    torch._dynamo.reset()  # compiled code holds the module: drop it before the next candidate
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    print(
        f"   {name}: {out['step_s'] * 1e3:.1f} ms/step (rounds {spread([s * 1e3 for s in seconds])} ms), first step "
        f"{first:.1f} s, initial loss {loss:.3f}",
        flush=True,
    )
    return out


PARALLEL = ("ddp", "fsdp", "fsdp + full AC")
SHAPES = {"tiny": ["model=tiny"], "large": ["model=large"], "1b": ["ladder=gpu", "ladder.rung=5"]}


def parallel_step(strategy, step_model, model, optimizer, regularizer, x, y) -> tuple[float, float]:
    """The loop's step (lm_ablate.train.Trainer.train_step without its bookkeeping), through the strategy."""
    optimizer.zero_grad(set_to_none=True)
    with strategy.autocast()():
        logits = step_model(x)
    loss = regularizer.loss(logits, y)[0]
    loss.backward()
    norm = strategy.clip_grad_norm(model, regularizer.grad_clip)
    values = loss.item(), norm.item()
    optimizer.step()
    return values


def measure_parallel(shape: str, kind: str, a: argparse.Namespace, device: torch.device) -> dict:
    """One row of the second table; ``oom`` set when the candidate does not fit (under --memory-cap-gib)."""
    from lm_ablate.catalog import load_all
    from lm_ablate.config import compose
    from lm_ablate.distributed import Dist
    from lm_ablate.model import TransformerLM, model_cost
    from lm_ablate.perf import memory_estimate
    from lm_ablate.registry import REGULARIZERS
    from lm_ablate.sharding import DDP, FSDP
    from lm_ablate.train import build_optimizer

    load_all()
    overrides = [*SHAPES[shape], "tracking=none", f"train.batch_size={a.parallel_batch}"]
    overrides += ["train.parallel=" + ("ddp" if kind == "ddp" else "fsdp")]
    if kind.endswith("AC"):
        overrides.append("train.activation_checkpointing=full")
    cfg = compose(overrides)
    context = cfg.model.context
    out: dict = {"shape": shape, "name": kind, "context": context, "oom": None}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, a.vocab, (a.parallel_batch, context), generator=gen).to(device) for _ in range(2))
    strategy = (DDP if kind == "ddp" else FSDP)(cfg, Dist(), device)
    regularizer = REGULARIZERS.build(cfg.regularization)
    model = optimizer = step_model = None
    try:
        torch.manual_seed(0)
        model = TransformerLM(cfg, a.vocab).to(device).train()
        cost = model_cost(model, cfg)
        out["flops_per_token"], out["params"] = cost.flops_per_token, cost.params_total
        layout = "fsdp" if strategy.sharded else "one process"
        out["estimate_gib"] = (
            memory_estimate(cfg, a.vocab, device.type, 1, shard=1, params=cost.params_total, parallel=layout).total
            / 2**30
        )
        strategy.prepare(model)
        optimizer = build_optimizer(cfg, model, regularizer, device)
        step_model = strategy.wrap(model)
        for _ in range(max(1, a.warmup)):
            parallel_step(strategy, step_model, model, optimizer, regularizer, x, y)
        seconds = []
        for _ in range(a.rounds):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            tic = time.perf_counter()
            for _ in range(a.parallel_steps):
                parallel_step(strategy, step_model, model, optimizer, regularizer, x, y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append((time.perf_counter() - tic) / a.parallel_steps)
        out["step_s"] = median(seconds)
        out["rounds_tok_s"] = [x.numel() / s for s in seconds]
    except torch.OutOfMemoryError:
        out["oom"] = "does not fit (out of memory" + (
            f" at the {a.memory_cap_gib:g} GiB cap)" if a.memory_cap_gib else ")"
        )
    out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    model = optimizer = step_model = strategy = None  # freed before the next candidate
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    shown = f"{out['step_s'] * 1e3:.1f} ms/step" if out["oom"] is None else out["oom"]
    memory = f", peak {out['peak_gib']:.2f} GiB" if out["peak_gib"] is not None else ""
    print(f"   {shape} {kind}: {shown}{memory}", flush=True)
    return out


def parallel_report(rows: list[dict], peak: float) -> str:
    heads = ["shape", "candidate", "tokens/s", "ms/step", "MFU", "peak mem (GiB)", "estimate (GiB)", "notes"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for r in rows:
        estimate = f"{r['estimate_gib']:.2f}" if r.get("estimate_gib") is not None else "-"
        memory = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "n/a (CPU)"
        if r["oom"] is not None:
            cells = [r["shape"], r["name"], "-", "-", "-", memory, estimate, r["oom"]]
        else:
            rate = r["rounds_tok_s"] and median(r["rounds_tok_s"])
            cells = [r["shape"], r["name"], f"{rate:,.0f}", f"{r['step_s'] * 1e3:.1f}",
                     f"{100 * r['flops_per_token'] * rate / peak:.1f}%", memory, estimate,
                     f"{r['params'] / 1e6:,.0f}M params; tokens/s per round {spread(r['rounds_tok_s'])}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parallel_section(a: argparse.Namespace, device: torch.device, peak: float) -> tuple[str, str] | None:
    """The second table over a one-rank process group, and its RESULT line."""
    import tempfile

    import torch.distributed as dist

    shapes = [s for s in a.parallel_shapes.split(",") if s]
    if not shapes:
        return None
    if device.type == "cuda" and a.memory_cap_gib:
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.memory_cap_gib / total), device)
    with tempfile.TemporaryDirectory() as tmp:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
        try:
            rows = [measure_parallel(shape, kind, a, device) for shape in shapes for kind in PARALLEL]
        finally:
            dist.destroy_process_group()
    if device.type == "cuda" and a.memory_cap_gib:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    table = parallel_report(rows, peak)
    last = {r["name"]: r for r in rows if r["shape"] == shapes[-1]}
    fits = lambda name: last[name]["oom"] is None
    line = f"RESULT gpu parallel ({shapes[-1]}, batch {a.parallel_batch}, {device.type}"
    line += f", cap {a.memory_cap_gib:g} GiB): " if a.memory_cap_gib else "): "

    def ran(name: str) -> str:
        if not fits(name):
            return "out of memory"
        return f"peak {last[name]['peak_gib']:.2f} GiB" if last[name]["peak_gib"] is not None else "ran"

    line += ", ".join(f"{n} {ran(n)}" for n in PARALLEL)
    if a.memory_cap_gib:
        yes = not fits("ddp") and (fits("fsdp") or fits("fsdp + full AC"))
        line += f"; fits where DDP does not: {'yes' if yes else 'no'}"
    elif all(fits(n) and last[n]["peak_gib"] is not None for n in PARALLEL):
        saved = last["ddp"]["peak_gib"] - min(last[n]["peak_gib"] for n in PARALLEL[1:])
        line += f"; fsdp fits in {saved:.2f} GiB less than ddp needs"
    return table, line


def report(results: dict[str, dict], skipped: dict[str, str], flops: float, peak: float, tokens: int) -> str:
    """One markdown table, a row per candidate in ``CANDIDATES`` order (skipped ones say why)."""
    base = results.get("transformers eager")
    heads = [
        "candidate",
        "tokens/s",
        "ms/step",
        "x transformers eager",
        "MFU",
        "peak mem (GiB)",
        "compile (s)",
        "notes",
    ]
    rows = []
    for name in CANDIDATES:
        if name in skipped:
            rows.append([name] + ["-"] * 6 + [skipped[name]])
            continue
        r = results[name]
        rate = tokens / r["step_s"]
        rows.append(
            [
                name,
                f"{rate:,.0f}",
                f"{r['step_s'] * 1e3:.1f}",
                f"{base['step_s'] / r['step_s']:.3f}x" if base else "-",
                f"{100 * flops * rate / peak:.1f}%",
                f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "n/a (CPU)",
                f"{r['compile_s']:.0f}" if r["compile_s"] is not None else "-",
                f"tokens/s per round {spread(r['rounds_tok_s'])}",
            ]
        )
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (cpu: fp32, for a smoke test of the script)")
    p.add_argument("--model", default="large", help="conf/model option (GPT-2 small: large)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: 16 on CUDA, 2 on CPU)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first one compiles)")
    p.add_argument("--vocab", type=int, default=50257, help="GPT-2's 50257; 50304 (a multiple of 64) is faster")
    p.add_argument("--dropout", type=float, default=None, help="both models' dropout (default: GPT-2's 0.1)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--no-hf", dest="hf", action="store_false", help="leave transformers out")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--out", type=Path, default=None, help="also write the setting, table and RESULT line there (.md)")
    p.add_argument(
        "--parallel-shapes",
        default=None,
        help="shapes of the ddp/fsdp table, of: tiny, large, 1b (default: large,1b on CUDA, none on CPU)",
    )
    p.add_argument("--parallel-batch", type=int, default=None, help="sequences per step there (default 8; CPU 2)")
    p.add_argument("--parallel-steps", type=int, default=5, help="timed steps per round there")
    p.add_argument("--memory-cap-gib", type=float, default=None, help="cap the process at this much GPU memory "
                   "for the ddp/fsdp table (a smaller GPU)")  # fmt: skip
    a = p.parse_args(argv)
    if a.out is not None and not a.out.parent.is_dir():
        print(f"bench/gpu.py: --out {a.out}: no folder {a.out.parent}", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py: --device cuda: no CUDA device here (use --device cpu for a smoke test)", file=sys.stderr)
        return 2
    if device.type == "cuda":  # "cuda" means the current device; set_device needs the index
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    cuda = device.type == "cuda"
    a.batch = a.batch or (16 if cuda else 2)
    a.parallel_batch = a.parallel_batch or (8 if cuda else 2)
    if a.parallel_shapes is None:
        a.parallel_shapes = "large,1b" if cuda else ""
    unknown = [s for s in a.parallel_shapes.split(",") if s and s not in SHAPES]
    if unknown:
        print(f"bench/gpu.py: --parallel-shapes {a.parallel_shapes}: unknown {unknown} (allowed: {', '.join(SHAPES)})",
              file=sys.stderr)  # fmt: skip
        return 2
    from lm_ablate.perf import measured_peak_flops

    header(f"bench/gpu.py: train-step tokens/s, MFU and memory, model={a.model} (arch=gpt2) vs GPT2LMHeadModel")
    precision = "bf16 autocast" if cuda else "fp32"
    setting = [f"torch {torch.__version__}"]
    if cuda:
        props = torch.cuda.get_device_properties(device)
        setting.append(
            f"{props.name}, {props.total_memory / 2**30:.0f} GiB, sm {props.major}{props.minor}, CUDA {torch.version.cuda}"
        )
        print(f"   {setting[-1]}")
    peak = measured_peak_flops(device.type, torch.bfloat16 if cuda else torch.float32)
    setting.append(f"measured {'bf16' if cuda else 'fp32'} matmul peak: {flops_str(peak)}")
    print(f"   {setting[-1]}", flush=True)
    cfg = config(a)
    m = cfg.model
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, a.vocab, (a.batch, m.context), generator=gen).to(device) for _ in range(2))
    setting.append(
        f"{m.d_model} wide, {m.n_layers} layers, {m.n_heads} heads, vocab {a.vocab}; {precision}, dropout "
        f"{cfg.regularization.dropout}; batch {a.batch} x {m.context} tokens; {a.rounds} rounds x {a.steps} steps "
        f"after {a.warmup} warm-up steps"
    )
    print(f"   {setting[-1]}", flush=True)

    skipped = {}
    if not a.compile:
        skipped.update({n: "not run (--no-compile)" for n in CANDIDATES if n.endswith("compiled")})
    if not a.hf:
        skipped.update({n: "not run (--no-hf)" for n in CANDIDATES if n.startswith("transformers")})
    results = {name: measure(name, a, device, x, y) for name in CANDIDATES if name not in skipped}
    counts = {r["params"] for r in results.values()}
    if len(counts) > 1:
        raise SystemExit(f"bench/gpu.py: the models differ in size ({sorted(counts)} parameters): not the same shape")
    flops = results["lm-ablate eager"]["flops_per_token"]  # the same shape on both sides (parameter counts checked)
    shape = (
        f"{counts.pop() / 1e6:.2f}M parameters each, {flops / 1e6:.0f} MFLOP/token; MFU against the measured peak "
        f"{flops_str(peak)}"
    )
    table = report(results, skipped, flops, peak, x.numel())
    print(f"\n{shape}\n")
    print(table)
    print(f"\n   load average at end: {loadavg()}")
    ours = results.get("lm-ablate compiled") or results["lm-ablate eager"]
    rate = x.numel() / ours["step_s"]
    mfu = flops * rate / peak
    line = (
        f"RESULT gpu ({a.model}, {precision}, {device.type}): {ours['name']} {rate:,.0f} tokens/s, MFU {100 * mfu:.1f}%"
    )
    if cuda and a.compile:
        line += f" (target >= {TARGET_MFU:.0%}: {'met' if mfu >= TARGET_MFU else 'missed'})"
    if "transformers eager" in results:
        line += f", {results['transformers eager']['step_s'] / ours['step_s']:.2f}x transformers eager"
    print(line)
    section = parallel_section(a, device, peak)
    if section is not None:
        print(f"\n{section[0]}\n\n{section[1]}")
    if a.out is not None:
        title = f"# bench/gpu.py: model={a.model} (arch=gpt2) vs GPT2LMHeadModel, {precision}, {device.type}"
        body = [title, "", *(f"- {s}" for s in setting), f"- {shape}", "", table, "", line, ""]
        if section is not None:
            body += ["## ddp vs fsdp over one rank", "", section[0], "", section[1], ""]
        a.out.write_text("\n".join(body))
        print(f"   written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
