"""Cost of the stability probes (``train.probe_every``) in the real training loop.

    python bench/overhead.py [--quick] [--steps 300] [--repeats 3]

Runs ``lm_ablate.train.train()`` on the default config (``small`` model, Shakespeare bytes, default eval and
checkpoint settings, ``tracking=none``, no progress bar) with probes on (``train.probe_every=10``, the
default) and off (``0``), alternately (on, off, off, on, ...), in one process, and compares:

* mean tokens/s from each run's ``summary.json`` (what the loop reports). Caveat: the loop times only
  zero_grad .. optimizer step, so this figure contains ``grad_stats`` but NOT the probes' side forward pass
  (``forward_stats`` runs before the step timer starts);
* the wall time of the whole ``train()`` call (eval, checkpoint and start-up included, equal on both sides);
* the probes' own time, measured inside the probed runs by wrapping ``forward_stats`` and ``grad_stats``
  (the names ``lm_ablate.train`` calls), relative to the same run's training-step time
  (tokens / mean tokens/s). This one is the least sensitive to other load on the machine.

Target: probes on <= 5% slower. The verdict is on the probes' whole cost: the steps' slowdown (summary
tokens/s) plus the side forward pass (which the summary's tokens/s leaves out).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import REPO, header, load_summary, loadavg, median, ratios, spread, table

TARGET = 0.05


class ProbeTimer:
    """Wraps lm_ablate.train's forward_stats / grad_stats and adds up their wall time."""

    def __init__(self) -> None:
        import lm_ablate.train as loop

        self.loop, self.seconds = loop, {"forward_stats": 0.0, "grad_stats": 0.0}
        for name in self.seconds:
            original = getattr(loop, name)

            def timed(*args, _f=original, _name=name, **kwargs):
                tic = time.perf_counter()
                try:
                    return _f(*args, **kwargs)
                finally:
                    self.seconds[_name] += time.perf_counter() - tic

            setattr(loop, name, timed)

    def reset(self) -> None:
        self.seconds = {k: 0.0 for k in self.seconds}


def one_run(probe_every: int, a: argparse.Namespace, timer: ProbeTimer, root: Path, i: int) -> dict:
    from lm_ablate.config import compose
    from lm_ablate.train import train

    overrides = ["tracking=none", "train.progress=false", f"train.probe_every={probe_every}",
                 f"train.max_steps={a.steps}", f"data.cache_dir={REPO / '.cache' / 'lm_ablate'}"] + a.overrides
    cfg = compose(overrides)
    timer.reset()
    tic = time.perf_counter()
    summary = train(cfg, root / f"run{i}_probe{probe_every}")
    wall = time.perf_counter() - tic
    step_s = summary["tokens"] / summary["mean_tokens_per_sec"]
    out = {"tok_s": summary["mean_tokens_per_sec"], "wall": wall, "step_s": step_s, **timer.seconds}
    print(f"   probe_every={probe_every:<2}  {out['tok_s']:.0f} tok/s  wall {wall:.1f} s  steps {step_s:.1f} s  "
          f"forward_stats {timer.seconds['forward_stats']:.2f} s  grad_stats {timer.seconds['grad_stats']:.2f} s  "
          f"(load {loadavg()})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: model=tiny, 30 steps, one pair, no warm-up run")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=4, help="pairs (on, off) of runs")
    p.add_argument("--probe-every", type=int, default=10)
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for both arms, e.g. model=tiny")
    a = p.parse_args(argv)
    if a.quick:
        a.steps, a.repeats, a.overrides = 30, 1, ["model=tiny"] + a.overrides
    header("bench/overhead.py: stability probes on vs off through lm_ablate.train.train()")
    print(f"   default config + tracking=none {' '.join(a.overrides)}, {a.steps} steps per run, "
          f"{a.repeats} (on, off) pairs, interleaved")
    import os

    timer = ProbeTimer()
    root = Path(tempfile.mkdtemp(prefix="lm_ablate_bench_overhead_"))
    on, off, loads = [], [], []
    try:
        if not a.quick:  # warm-up: imports, data cache, allocator, the peak-FLOP/s probe (cached per process)
            one_run(0, argparse.Namespace(**{**vars(a), "steps": 5}), timer, root, -1)
        for r in range(a.repeats):
            order = (a.probe_every, 0) if r % 2 == 0 else (0, a.probe_every)
            for pe in order:
                (on if pe else off).append(one_run(pe, a, timer, root, r))
            loads.append(os.getloadavg())
    finally:
        shutil.rmtree(root, ignore_errors=True)

    tok_ratio = ratios([x["tok_s"] for x in on], [x["tok_s"] for x in off])  # off / on tokens/s: > 1 = probes cost
    wall_ratio = ratios([x["wall"] for x in off], [x["wall"] for x in on])
    own = [(x["forward_stats"] + x["grad_stats"]) / x["step_s"] for x in on]
    own_fwd = [x["forward_stats"] / x["step_s"] for x in on]
    own_grad = [x["grad_stats"] / x["step_s"] for x in on]
    rows = [
        ["mean tokens/s (summary): off / on", f"{median(tok_ratio):.3f}", spread(tok_ratio),
         f"{100 * (median(tok_ratio) - 1):+.1f}%"],
        ["train() wall time: on / off", f"{median(wall_ratio):.3f}", spread(wall_ratio), f"{100 * (median(wall_ratio) - 1):+.1f}%"],
        ["probe time / step time (in the probed run)", f"{1 + median(own):.3f}", spread([1 + v for v in own]),
         f"{100 * median(own):+.1f}%"],
        ["  of which forward_stats (side forward pass)", "", spread(own_fwd), f"{100 * median(own_fwd):+.1f}%"],
        ["  of which grad_stats (per-block norms)", "", spread(own_grad), f"{100 * median(own_grad):+.1f}%"],
    ]
    print()
    print(table(["measure (probes on vs off)", "median ratio", "range", "slower by"], rows))
    print(f"   tokens/s on: {median([x['tok_s'] for x in on]):.0f} (median), off: {median([x['tok_s'] for x in off]):.0f}")
    print(f"   {load_summary(loads)}; load average at end: {loadavg()}")
    # What probes cost in all = the steps' own slowdown (summary tokens/s: grad_stats plus whatever the side
    # pass leaves behind, e.g. caches and freed memory) + the side forward pass, which the step timer leaves
    # out. The whole-run wall ratio measures the same sum directly, diluted by eval and start-up.
    step_slowdown = median(tok_ratio) - 1
    total = step_slowdown + median(own_fwd)
    verdict = "meets" if total <= TARGET else "MISSES"
    spread_pts = 100 * (max(tok_ratio) - min(tok_ratio))
    print(f"   probes cost in all: {100 * step_slowdown:+.1f}% (steps, summary tokens/s) + {100 * median(own_fwd):.1f}% "
          f"(side forward pass) = {100 * total:+.1f}% of training-step time; whole-run wall {100 * (median(wall_ratio) - 1):+.1f}%"
          f"; spread of the per-pair tokens/s ratios {spread_pts:.1f} points")
    print(f"RESULT overhead (probe_every={a.probe_every} vs 0): {100 * total:+.1f}% in all -> {verdict} the <= 5% target "
          f"(summary tokens/s alone: {100 * step_slowdown:+.1f}%; side forward pass, not in tokens/s: "
          f"{100 * median(own_fwd):+.1f}%; wall {100 * (median(wall_ratio) - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
