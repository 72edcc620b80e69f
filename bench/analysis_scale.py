"""How long does ``build_report`` take on a large sweep? (A benchmark, not a test: nothing asserts a time.)

Usage::

    python bench/analysis_scale.py [--runs 1000] [--steps 5000] [--workers 2] [--keep DIR]

Generates a synthetic sweep shaped like the loop's run records -- norm.placement x norm.name x optim.lr x
model.d_model x seeds, 4 layers, a metrics.jsonl row per step with the loop's keys, probes every 10 steps,
an eval every 500 steps plus extrapolation losses at the end -- into a temporary directory, then times
``build_report`` on it and prints the time and its ratio to the 20 s target. A few runs are damaged the way
real sweeps are (diverged with NaN/Infinity rows, still running with a truncated last line), so the slow,
careful reading path is exercised as well as the fast one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lm_ablate import metrics as M

TARGET_S = 20.0
N_LAYERS = 4
PROBE_EVERY = 10
EVAL_EVERY = 500
DESIGN = {
    "norm.placement": ["pre", "post"],
    "norm.name": ["layernorm", "rmsnorm"],
    "optim.lr": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1],
    "model.d_model": [64, 128, 256, 512, 1024],
}


def _config(arm: dict, seed: int, steps: int) -> str:
    """config.yaml text (written directly: OmegaConf would dominate generation time)."""
    return (
        f"model:\n  name: synth\n  d_model: {arm['model.d_model']}\n  n_layers: {N_LAYERS}\n  n_heads: 4\n"
        f"  context: 256\nnorm:\n  name: {arm['norm.name']}\n  placement: {arm['norm.placement']}\n"
        f"  eps: 1.0e-05\n  bias: {str(arm['norm.name'] == 'layernorm').lower()}\n"
        f"optim:\n  name: adamw\n  lr: {arm['optim.lr']!r}\n  warmup_steps: 100\n"
        f"train:\n  max_steps: {steps}\n  batch_size: 32\n  eval_every: {EVAL_EVERY}\n"
        f"  probe_every: {PROBE_EVERY}\n  device: cuda\nseed: {seed}\nstudy: scale\n"
        f"choices:\n  norm: {arm['norm.name']}\n"
    )


def _run(job: tuple[Path, dict, int, int, int]) -> None:
    """Write one run directory: config.yaml, metrics.jsonl, summary.json."""
    run_dir, arm, seed, steps, index = job
    rng = np.random.default_rng(index)
    run_dir.mkdir(parents=True)
    (run_dir / M.CONFIG_FILE).write_text(_config(arm, seed, steps))
    lr, width = arm["optim.lr"], arm["model.d_model"]
    floor = 2.0 + 0.3 * abs(math.log10(lr) + 2.2) + 60 / width + (0.05 if arm["norm.placement"] == "post" else 0)
    t = np.arange(steps + 1)
    loss = floor + 3.5 * np.exp(-t / (steps / 8)) + 0.03 * rng.standard_normal(steps + 1)
    grad = 0.5 + 0.5 * np.exp(-t / 300) + 0.05 * rng.standard_normal(steps + 1) ** 2
    diverge_at = int(rng.integers(steps // 4, steps)) if lr >= 1e-1 and arm["norm.placement"] == "post" else None
    running_until = int(steps * 0.6) if index % 97 == 5 else None
    tps = 2e5 * (1.0 if arm["norm.name"] == "rmsnorm" else 0.95) / (width / 256)
    lines = [json.dumps({M.STEP: 0, M.VAL_LOSS: 10.4 + 0.01 * rng.standard_normal(), M.TOKENS: 0})]
    gn_count = ls_count = 0
    end = steps
    for s in range(1, steps + 1):
        gn_spike = float(rng.random() < 0.002)
        gn_count += int(gn_spike)
        row = {
            M.TRAIN_LOSS: float(loss[s]), M.GRAD_NORM: float(grad[s]) * (10 if gn_spike else 1),
            M.LR: lr, M.TOKENS: s * 8192, M.TOKENS_PER_SEC: tps * (1 + 0.01 * float(rng.standard_normal())),
            M.STEP_TIME_MS: 8192 / tps * 1000, M.MFU: 0.4, M.SPIKE_GRAD_NORM: gn_spike,
            M.SPIKE_GRAD_NORM_COUNT: gn_count, M.SPIKE_LOSS: 0.0, M.SPIKE_LOSS_COUNT: ls_count,
        }  # fmt: skip
        if s % PROBE_EVERY == 0:
            for i in range(N_LAYERS):
                scale = (1 + i) if arm["norm.placement"] == "post" else 1.0
                row[M.layer_metric(i, M.RESIDUAL_RMS)] = float(1 + 0.1 * i + s / steps)
                row[M.layer_metric(i, M.MAX_ATTN_LOGIT)] = float(5 + 20 * lr * s / steps * (1 + i))
                row[M.layer_metric(i, M.GRAD_NORM_LAYER)] = float(0.1 * scale * grad[s])
                row[M.layer_metric(i, M.PARAM_NORM)] = float(10 + i + s / 1000)
            row[M.LOGITS_MAX_ABS] = float(10 + 30 * lr * s / steps)
            row[M.LOGITS_MEAN_LOG_Z] = float(5 + lr * s / steps)
            row[M.PEAK_MEM_MB] = 1234.5
        if diverge_at is not None and s == diverge_at:
            row[M.TRAIN_LOSS], row[M.GRAD_NORM] = float("nan"), float("inf")
            lines.append(json.dumps({M.STEP: s, **row}))
            end = s
            break
        if s % EVAL_EVERY == 0 or s == steps:
            row[M.VAL_LOSS] = float(loss[s] + 0.02)
        if s == steps:
            for k in (2, 4, 8):
                row[f"val/loss@{k}x"] = float(loss[s] + 0.02 + 0.1 * math.log2(k) * (1.5 if width < 256 else 1))
        lines.append(json.dumps({M.STEP: s, **row}))
        if running_until is not None and s == running_until:
            end = s
            break
    text = "\n".join(lines) + "\n"
    if running_until is not None:
        text += f'{{"step": {end + 1}, "train/lo'  # killed mid-write
    (run_dir / M.METRICS_FILE).write_text(text)
    status = M.STATUS_DIVERGED if diverge_at else M.STATUS_RUNNING if running_until else M.STATUS_COMPLETED
    final_val = float(loss[min(end, steps)] + 0.02)
    summary = {
        M.STATUS: status, M.RUN_NAME: run_dir.name, M.GROUP: "scale", M.SEED: seed,
        M.FINAL_VAL_LOSS: final_val, M.BEST_VAL_LOSS: final_val, M.FINAL_TRAIN_LOSS: float(loss[end]),
        M.GRAD_NORM_SPIKES: gn_count, M.LOSS_SPIKES: 0, M.MEAN_TOKENS_PER_SEC: tps, M.MEAN_MFU: 0.4,
        M.PARAMS_TOTAL: 12 * N_LAYERS * width**2, M.PARAMS_NON_EMBEDDING: 12 * N_LAYERS * width**2,
        M.STEPS: end, M.TOTAL_TOKENS: end * 8192, M.WALL_TIME_S: end * 8192 / tps,
        M.DIVERGED_AT: diverge_at, M.ERROR: None,
        M.STOP_REASON: "diverged" if diverge_at else None if running_until else "max_steps",
    }  # fmt: skip
    (run_dir / M.SUMMARY_FILE).write_text(json.dumps(summary))


def generate(root: Path, n_runs: int, n_steps: int, workers: int) -> None:
    """``n_runs`` run directories under ``root``: the design's arms times as many seeds as it takes."""
    arms = [dict(zip(DESIGN, values)) for values in itertools.product(*DESIGN.values())]
    jobs = [(root / str(i), arms[i % len(arms)], i // len(arms), n_steps, i) for i in range(n_runs)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_run, jobs, chunksize=8))


def _cpu_seconds() -> float:
    """CPU time of this process and its finished workers: unlike the wall time, not inflated by waiting for a
    core that other processes hold (it still includes their effect on caches)."""
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def _loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for generation")
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR (reused if it exists) and keep it")
    args = parser.parse_args(argv)

    from analysis.report import build_report

    tmp = None
    if args.keep:
        root = Path(args.keep)
    else:
        tmp = tempfile.mkdtemp(prefix="analysis_scale_")
        root = Path(tmp)
    sweep = root / "sweep"
    try:
        if not sweep.is_dir():
            tic = time.perf_counter()
            generate(sweep, args.runs, args.steps, args.workers)
            size = sum(f.stat().st_size for f in sweep.rglob("*") if f.is_file())
            print(f"generated {args.runs} runs x {args.steps} steps ({size / 2**30:.2f} GiB) "
                  f"in {time.perf_counter() - tic:.1f} s")  # fmt: skip
        load, tic, cpu = _loadavg(), time.perf_counter(), _cpu_seconds()
        build_report([sweep], root / "report")
        elapsed, cpu = time.perf_counter() - tic, _cpu_seconds() - cpu
        print(f"build_report: {elapsed:.1f} s for {args.runs} runs x {args.steps} steps "
              f"({elapsed / TARGET_S:.2f}x the {TARGET_S:.0f} s target); CPU {cpu:.1f} s (with its workers); "
              f"load average {load} -> {_loadavg()}")  # fmt: skip
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
