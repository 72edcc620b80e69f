"""In-loop downstream evaluation's share of a default-study run (issue 25: < 10%).

    python bench/eval.py [--quick] [--eval quick] [--seeds 0] [--threads 1] [overrides ...]

Runs the default study's arms ({LayerNorm, RMSNorm} x {pre, post}, conf/experiment/norm_2x2.yaml: 150 steps,
6 layers, lr 1e-2) the way a user runs them, ``python -m lm_ablate.train experiment=norm_2x2 eval=<set>``,
each as its own process, and gives two shares per run:

* wall: what the run recorded about itself, ``downstream_eval_s / wall_time_s`` (its downstream evaluations
  against the whole run: data, model, steps, validation, checkpoints, downstream). Both in one run, but on a
  shared machine the load during the evaluation (at the end) is not the load during the steps.
* CPU: the run process's CPU time (``getrusage(RUSAGE_CHILDREN)``, user + system) against the CPU time of the
  same evaluation repeated here on the run's final checkpoint (``Downstream.evaluate``, this thread's clock,
  the same number of threads). CPU time leaves out the waits for a core, so this share does not move with
  the neighbours' load; with ``train.threads=1`` it is the work itself.

Also printed: each arm's final validation loss and downstream numbers, so the table shows whether the task
separates the arms. ``--quick``: 20 steps, 50 examples (a smoke test of this script).

Target: share < 0.10 with eval=quick (500 items of the word-order task).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import REPO, loadavg

TARGET = 0.10
ARMS = [("layernorm", "pre"), ("layernorm", "post"), ("rmsnorm", "pre"), ("rmsnorm", "post")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--eval", default="quick", help="the task set (conf/eval/)")
    p.add_argument("--seeds", default="0")
    p.add_argument("--threads", type=int, default=1, help="train.threads of each run (1: robust to other load)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    extra = ["train.max_steps=20", "eval.max_examples=50"] if a.quick else []
    print(f"== downstream evaluation's share of a default-study run (eval={a.eval}, train.threads={a.threads})")
    print(f"   load average (1/5/15 min) at start: {loadavg()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_eval_") as tmp:
        for seed in a.seeds.split(","):
            for norm, placement in ARMS:
                out = Path(tmp) / f"{norm}_{placement}_{seed}"
                cmd = [sys.executable, "-m", "lm_ablate.train", "experiment=norm_2x2", f"norm={norm}",
                       f"norm.placement={placement}", f"seed={seed}", f"eval={a.eval}", "tracking=none",
                       f"train.threads={a.threads}", "train.progress=false", f"hydra.run.dir={out}", *extra,
                       *a.overrides]  # fmt: skip
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                run_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                s = json.loads((out / "summary.json").read_text())
                metrics = {k.split("/", 1)[1]: v for k, v in s.items() if k.startswith("downstream/")}
                eval_cpu = evaluation_cpu(out, a.threads)
                share = s["downstream_eval_s"] / s["wall_time_s"]
                rows.append((f"{norm} {placement} s{seed}", s["final_val_loss"], metrics, s["downstream_eval_s"],
                             s["wall_time_s"], share, eval_cpu, run_cpu, eval_cpu / run_cpu))  # fmt: skip
                print(f"   {rows[-1][0]}: share wall {share:.3f}, CPU {eval_cpu / run_cpu:.3f}  (load {loadavg()})",
                      flush=True)  # fmt: skip
    kinds = sorted({k for r in rows for k in r[2]})
    print()
    print("| arm | val loss | " + " | ".join(kinds) + " | downstream s | run wall s | wall share | downstream CPU s "
          "| run CPU s | CPU share |")  # fmt: skip
    print("|---|---|" + "---|" * len(kinds) + "---|---|---|---|---|---|")
    for name, val, metrics, ds, wall, share, ecpu, rcpu, cshare in rows:
        cells = " | ".join(f"{metrics.get(k, float('nan')):.3f}" for k in kinds)
        print(f"| {name} | {val:.4f} | {cells} | {ds:.1f} | {wall:.1f} | {share:.1%} | {ecpu:.1f} | {rcpu:.1f} "
              f"| {cshare:.1%} |")  # fmt: skip
    worst_cpu, worst_wall = max(r[8] for r in rows), max(r[5] for r in rows)
    print(f"\nload average at end: {loadavg()}")
    print(f"RESULT largest CPU share {worst_cpu:.1%}, largest wall share {worst_wall:.1%} (target < {TARGET:.0%}): "
          f"{'met' if worst_cpu < TARGET else 'NOT met'}")  # fmt: skip


def evaluation_cpu(run_dir: Path, threads: int) -> float:
    """CPU seconds (this thread) of the run's downstream evaluation, repeated on its final checkpoint."""
    import torch

    from lm_ablate.eval.loop import Downstream
    from lm_ablate.eval.run import load_run, run_tokenizer

    torch.set_num_threads(threads)
    run = load_run(run_dir)
    downstream = Downstream(run.cfg, run_tokenizer(run.cfg), torch.device("cpu"))
    tic = time.thread_time() if threads == 1 else time.process_time()
    downstream.evaluate(run.model)
    return (time.thread_time() if threads == 1 else time.process_time()) - tic


if __name__ == "__main__":
    main()
