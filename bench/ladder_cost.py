"""What a ladder study costs on one core, against the design that tunes nothing per rung, measured in one run.

    python bench/ladder_cost.py ladder_arch [--rungs 0,1,2,3,4] [--quick]

A ladder study's time is the sum of its runs. One **chain** is one arm trained once at every rung (one LR, seed
0, every decay branch of ``ladder.budgets``): each rung a real ``python -m lm_ablate.train`` process with the
study's experiment and the arm's overrides from its sweep file, one intra-op thread, no tracking, timed from
process start to exit (start-up, data, evaluation and the branches included). The arms' chains run side by side,
one process per arm, as a study's two parallel jobs do (so each has one core of the two; run it on an otherwise
idle machine). From the chain times and the sweep (``sweeps/<study>.yaml``, expanded as the grids sweeper does)
the script projects, on one core:

* **as swept**: every run of the sweep, each at its (arm, rung)'s measured time;
* **one LR per arm**: μP's promise (an LR tuned at rung 0 transfers): one chain per arm and seed;
* **3 LRs per arm and rung**: the smallest grid that can bracket a best LR, on the same seeds.

The headline is each design's core-minutes and its ratio to the one-LR design measured in the same run. Nothing
is asserted: the issue's goal (a ladder study in 30 minutes on one core) is judged against these numbers
(bench/README.md, docs/ladders.md "What a fair ladder costs").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import REPO, header, loadavg

NOT_ARM = ("optim.lr", "lr_mult", "seed", "ladder.rung")  # keys a chain fixes itself


def sweep_jobs(study: str) -> list[dict[str, str]]:
    """The study's jobs (key -> value), expanded as its sweeper does (hydra_plugins/lm_ablate_grids)."""
    from hydra_plugins.lm_ablate_grids.grids_sweeper import job_overrides

    sweeper = yaml.safe_load((REPO / "sweeps" / f"{study}.yaml").read_text())["hydra"]["sweeper"]
    return [
        dict(line.split("=", 1) for line in job)
        for job in job_overrides(sweeper.get("params"), sweeper.get("grids"), [])
    ]


def arm_of(job: dict[str, str], tuned: set[str]) -> tuple[tuple[str, str], ...]:
    """A job's arm: its overrides but the LR, the seed, the rung and keys tuned per cell (ladder.tune)."""
    return tuple(sorted((k, v) for k, v in job.items() if k not in NOT_ARM and k not in tuned))


def time_chain(study: str, arm: tuple[tuple[str, str], ...], rungs: list[int], lr: dict[int, str], extra: list[str],
               out: Path) -> dict[int, float]:  # fmt: skip
    """Seconds of each rung's run (process start to exit) of one arm, one after the other."""
    seconds = {}
    for rung in rungs:
        cmd = [sys.executable, "-m", "lm_ablate.train", f"experiment={study}", *(f"{k}={v}" for k, v in arm),
               f"ladder.rung={rung}", f"optim.lr={lr[rung]}", "seed=0", "tracking=none", "train.threads=1",
               "train.progress=false", f"hydra.run.dir={out / f'r{rung}'}", *extra]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, env=os.environ | {"WANDB_MODE": "disabled"}
        )
        seconds[rung] = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"rung {rung} of {dict(arm)} failed:\n{done.stderr[-2000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", help="a ladder study with a sweep file (sweeps/<study>.yaml)")
    p.add_argument("--rungs", default=None, help="comma-separated rungs to time (default: every rung the sweep runs)")
    p.add_argument(
        "--quick", action="store_true", help="rung 0 only, 2 tokens per parameter: a smoke test, numbers mean nothing"
    )
    a = p.parse_args(argv)

    spec = yaml.safe_load((REPO / "conf" / "experiment" / f"{a.study}.yaml").read_text())
    tuned = set((spec.get("ladder") or {}).get("tune") or [])
    jobs = sweep_jobs(a.study)
    if not jobs or any("ladder.rung" not in j for j in jobs):
        raise SystemExit(f"{a.study}: its sweep does not vary ladder.rung: no ladder study")
    runs: dict[tuple, dict[int, int]] = {}
    lrs: dict[tuple, dict[int, list[str]]] = {}
    seeds: dict[tuple, set[str]] = {}
    for j in jobs:
        arm, rung = arm_of(j, tuned), int(j["ladder.rung"])
        runs.setdefault(arm, {}).setdefault(rung, 0)
        runs[arm][rung] += 1
        lrs.setdefault(arm, {}).setdefault(rung, []).append(j.get("optim.lr", str(spec["optim"]["lr"])))
        seeds.setdefault(arm, set()).add(j.get("seed", "0"))
    all_rungs = sorted({r for arm in runs for r in runs[arm]})
    rungs = [0] if a.quick else ([int(r) for r in a.rungs.split(",")] if a.rungs else all_rungs)
    if not set(rungs) <= set(all_rungs):
        raise SystemExit(f"--rungs: {a.rungs} names rungs the sweep does not run; allowed: {all_rungs}")
    extra = ["ladder.tokens_per_param=2", "ladder.budgets=null", "ladder.fit_budgets=null"] if a.quick else []
    # each arm's chain runs every rung at the middle LR of that rung's grid (a run's time hardly depends on it)
    middle = {arm: {r: sorted(set(lrs[arm][r]), key=float)[len(set(lrs[arm][r])) // 2] for r in rungs} for arm in runs}

    header(f"ladder_cost: {a.study}, {len(runs)} arms x rungs {rungs}, one process per arm, 1 thread each")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(runs)) as pool:
        futures = {
            arm: pool.submit(time_chain, a.study, arm, rungs, middle[arm], extra, Path(tmp) / str(i))
            for i, arm in enumerate(runs)
        }
        times = {arm: f.result() for arm, f in futures.items()}
    print(f"load average at end: {loadavg()}\n")

    print("| arm | rung | seconds (one run, 1 thread) | runs in the sweep |")
    print("|---|---:|---:|---:|")
    for arm, t in times.items():
        for r in rungs:
            print(f"| {' '.join(f'{k}={v}' for k, v in arm)} | {r} | {t[r]:.1f} | {runs[arm].get(r, 0)} |")
    chain = {arm: sum(t.values()) for arm, t in times.items()}
    n_seeds = min(len(s) for s in seeds.values())
    base_seeds = 2 if n_seeds >= 2 else 1
    designs = {
        "as swept": sum(runs[arm].get(r, 0) * times[arm][r] for arm in times for r in rungs),
        f"one LR per arm, {base_seeds} seeds": base_seeds * sum(chain.values()),
        f"3 LRs per arm and rung, {base_seeds} seeds": 3 * base_seeds * sum(chain.values()),
    }
    reference = designs[f"one LR per arm, {base_seeds} seeds"]
    print("\n| design | core-minutes | x one LR per arm |")
    print("|---|---:|---:|")
    for name, sec in designs.items():
        print(f"| {name} | {sec / 60:.1f} | {sec / reference:.2f} |")
    print("\nchains (one arm, every rung): " + ", ".join(f"{dict(arm)} {s:.0f} s" for arm, s in chain.items()))
    print(
        "RESULT "
        + "; ".join(f"{name} {sec / 60:.1f} core-min ({sec / reference:.2f}x)" for name, sec in designs.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
