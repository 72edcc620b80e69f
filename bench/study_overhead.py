"""Wall time of a whole study against the pure training-step time of its runs, with the overhead broken down.

    python bench/study_overhead.py [--quick] [--study norm_2x2] [--plain] [overrides ...]
    (default overrides: seed=0, i.e. norm_2x2's 4 arms at one seed, its full 150 steps each)

The study runs the way a user runs it: ``lm_ablate.study.main`` with the basic launcher and the default eval,
logging, checkpoint and tracking settings (W&B, which falls back to offline without credentials), as a child
process of this script, and is timed from outside, process start and exit included. Step time is what the
runs' ``summary.json`` report: tokens / mean_tokens_per_sec (the loop times zero_grad .. optimizer step,
the stability probes included: they observe the training forward).

To say where the rest goes, the study process is this script (``--as-study``), which runs
``lm_ablate.study.main`` unchanged except that the sweep child is also this script (``--as-train``), which
wraps a few functions of the loop with timers before calling ``lm_ablate.train.main`` (Hydra, the sweep and
every run as usual): interpreter start, imports, Hydra's sweep machinery, and in each ``train()`` the data
load, model build, peak-FLOP/s probe, evaluations, batches, checkpoints, W&B and the local
run record; then the process exit and the report. The timers cost microseconds per call. ``--plain`` runs
``python -m lm_ablate.study`` itself instead (the headline ratio only, no breakdown).

Target: wall time <= 1.15 x the summed step time.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import REPO, header, loadavg, table

TARGET = 1.15
LAUNCH_ENV = "LM_ABLATE_BENCH_LAUNCH_T"  # time.time() just before a child process is started
DEFAULT_OVERRIDES = ["seed=0"]


# ----------------------------------------------------------------------------------------------- timers
class Timings:
    def __init__(self) -> None:
        self.process: dict[str, float] = {}
        self.runs: list[dict[str, float]] = []
        self.current: dict[str, float] | None = None

    def add(self, key: str, seconds: float) -> None:
        target = self.current if self.current is not None else self.process
        target[key] = target.get(key, 0.0) + seconds
        target[key + "#n"] = target.get(key + "#n", 0) + 1


TIMINGS = Timings()


def wrap(owner, name: str, key: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        tic = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMINGS.add(key, time.perf_counter() - tic)

    setattr(owner, name, timed)


def as_train(timings_path: str, args: list[str]) -> None:
    """The sweep child: lm_ablate.train.main with timers around the parts of a run."""
    started = time.time()
    TIMINGS.process["interpreter_start"] = started - float(os.environ.get(LAUNCH_ENV, started))

    def dump() -> None:
        TIMINGS.process["end_time"] = time.time()
        Path(timings_path).write_text(json.dumps({"process": TIMINGS.process, "runs": TIMINGS.runs}))

    atexit.register(dump)  # registered first, so it runs after W&B's own exit handlers
    tic = time.perf_counter()
    import lm_ablate.checkpoint as ckpt
    import lm_ablate.train as loop
    from lm_ablate import tracking

    TIMINGS.process["imports"] = time.perf_counter() - tic
    for name, key in (
        ("load_data", "data load"),
        ("TransformerLM", "model build"),
        ("measured_peak_flops", "peak FLOP/s probe"),
        ("evaluate", "evaluation"),
        ("get_batch", "batches"),
    ):
        wrap(loop, name, key)
    wrap(ckpt, "save", "checkpoints")
    for cls, label in ((tracking.WandbTracker, "W&B"), (tracking.LocalRecord, "local run record")):
        for method in ("start", "log", "summary", "finish"):
            wrap(cls, method, f"{label} {method}")
    original_train = loop.train

    def timed_train(cfg, run_dir, *args, **kwargs):
        TIMINGS.current = {"run_dir": str(run_dir)}
        tic = time.perf_counter()
        try:
            return original_train(cfg, run_dir, *args, **kwargs)
        finally:
            TIMINGS.current["train()"] = time.perf_counter() - tic
            TIMINGS.runs.append(TIMINGS.current)
            TIMINGS.current = None

    loop.train = timed_train
    sys.argv = ["lm_ablate.train"] + args
    tic = time.perf_counter()
    entry = getattr(loop, "cli", loop.main)  # what `python -m lm_ablate.train` calls
    try:
        entry()
    finally:
        TIMINGS.process["hydra main"] = time.perf_counter() - tic


def as_study(timings_path: str, args: list[str]) -> int:
    """The study process: lm_ablate.study.main, its sweep child replaced by ``--as-train``, report timed."""
    started = time.time()
    process: dict[str, float] = {"interpreter_start": started - float(os.environ.get(LAUNCH_ENV, started))}
    tic = time.perf_counter()
    from lm_ablate import study

    process["imports"] = time.perf_counter() - tic
    child_timings = timings_path + ".train.json"
    plain_command = study.sweep_command
    study.sweep_command = lambda *a, **k: (
        [sys.executable, __file__, "--as-train", child_timings, "--"] + plain_command(*a, **k)[3:]
    )
    plain_run = subprocess.run

    def timed_run(*a, **k):
        os.environ[LAUNCH_ENV] = repr(time.time())
        try:
            return plain_run(*a, **k)
        finally:
            process["sweep returned"] = time.time()

    subprocess.run = timed_run
    tic = time.perf_counter()
    from analysis import report

    process["imports"] += time.perf_counter() - tic

    plain_report = report.build_report

    def timed_report(*a, **k):
        tic = time.perf_counter()
        try:
            return plain_report(*a, **k)
        finally:
            process["report"] = time.perf_counter() - tic

    report.build_report = timed_report
    try:
        return study.main(args)
    finally:
        process["end_time"] = time.time()
        Path(timings_path).write_text(json.dumps(process))


# ----------------------------------------------------------------------------------------------- driver
def summaries(out: Path) -> list[dict]:
    found = []
    for path in sorted(out.glob("*/summary.json"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0):
        s = json.loads(path.read_text())
        s["_dir"] = str(path.parent)
        found.append(s)
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: model=tiny, one arm, 20 steps")
    p.add_argument("--study", default="norm_2x2")
    p.add_argument("--plain", action="store_true", help="run `python -m lm_ablate.study` itself: headline only")
    p.add_argument("--keep", type=Path, help="keep the multirun directory here (default: a temporary one, removed)")
    a, overrides = p.parse_known_args(argv)
    overrides = overrides or list(DEFAULT_OVERRIDES)
    if a.quick:
        overrides = [
            "seed=0",
            "norm=layernorm",
            "norm.placement=pre",
            "model=tiny",
            "train.max_steps=20",
            "train.eval_every=10",
            "train.checkpoint_every=10",
        ]
    header("bench/study_overhead.py: study wall time vs summed training-step time")
    tmp = Path(tempfile.mkdtemp(prefix="lm_ablate_bench_study_"))  # timings, and the multirun unless --keep
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    out = (a.keep or tmp / "multirun").resolve()
    timings_path = str(tmp / "study_timings.json")
    args = [a.study, "--out", str(out)] + overrides
    if a.plain:
        cmd = [sys.executable, "-m", "lm_ablate.study"] + args
    else:
        cmd = [sys.executable, __file__, "--as-study", timings_path, "--"] + args
    print(
        f"   study: python -m lm_ablate.study {' '.join(args)}  (basic launcher{', instrumented' if not a.plain else ''})",
        flush=True,
    )
    env = dict(os.environ)
    env[LAUNCH_ENV] = repr(time.time())
    load_start = os.getloadavg()
    t0 = time.time()
    done = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    t_end = time.time()
    total = t_end - t0
    load_end = os.getloadavg()
    if done.returncode != 0:
        print(done.stdout[-4000:])
        raise SystemExit(f"the study failed (exit {done.returncode})")
    runs = summaries(out)
    step_s = [s["tokens"] / s["mean_tokens_per_sec"] for s in runs]
    steps = sum(step_s)
    ratio = total / steps
    print(
        f"   {len(runs)} runs, {sum(s['steps'] for s in runs)} steps; statuses: {sorted({s['status'] for s in runs})}"
    )
    print(f"   load average (1 min) at start {load_start[0]:.2f}, at end {load_end[0]:.2f}")

    rows = [
        ["study wall time (outside)", f"{total:.1f}", "100.0%"],
        ["training steps (summaries)", f"{steps:.1f}", f"{100 * steps / total:.1f}%"],
    ]
    if not a.plain:
        parent = json.loads(Path(timings_path).read_text())
        child = json.loads(Path(timings_path + ".train.json").read_text())
        cp, child_runs = child["process"], child["runs"]
        trains = sum(r["train()"] for r in child_runs)
        keys = [
            "data load",
            "model build",
            "peak FLOP/s probe",
            "evaluation",
            "batches",
            "checkpoints",
            "W&B start",
            "W&B log",
            "W&B summary",
            "W&B finish",
            "local run record start",
            "local run record log",
            "local run record summary",
            "local run record finish",
        ]
        inside = {k: sum(r.get(k, 0.0) for r in child_runs) for k in keys}
        counts = {k: sum(r.get(k + "#n", 0) for r in child_runs) for k in keys}
        other_in_train = trains - steps - sum(inside.values())
        parts = [
            ("study process: interpreter start", parent["interpreter_start"]),
            ("study process: imports (lm_ablate.study, analysis.report)", parent["imports"]),
            ("sweep process: interpreter start", cp["interpreter_start"]),
            ("sweep process: imports (torch, hydra, lm_ablate)", cp["imports"]),
            ("sweep process: Hydra (compose, sweep, job dirs, logs)", cp["hydra main"] - trains),
        ]
        parts += [(f"in train(): {k} ({counts[k]} calls)", inside[k]) for k in keys if counts[k]]
        parts += [
            ("in train(): other (loop bookkeeping, val batches, metrics rows, .item())", other_in_train),
            ("sweep process: exit (atexit handlers, W&B teardown)", parent["sweep returned"] - cp["end_time"]),
            ("report (analysis.report.build_report)", parent.get("report", 0.0)),
        ]
        accounted = steps + sum(v for _, v in parts)
        parts.append(("unaccounted (study process exit, gaps)", total - accounted))
        rows += [[name, f"{v:.1f}", f"{100 * v / total:.1f}%"] for name, v in parts]
        note = f"   (the stability probes are inside the step time; train() calls took {trains:.1f} s in all)"
    print(table(["where the study's wall time goes", "seconds", "share"], rows))
    if not a.plain:
        print(note)
    per_run = [
        [
            Path(s["_dir"]).name,
            s["run_name"][:48],
            s["status"],
            f"{st:.1f}",
            f"{s['wall_time_s']:.1f}",
            f"{s['mean_tokens_per_sec']:.0f}",
        ]
        for s, st in zip(runs, step_s)
    ]
    print(table(["run", "name", "status", "step s", "summary wall_time_s", "tokens/s"], per_run))
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(f"   load average at end: {loadavg()}")
    print(
        f"RESULT study_overhead: wall {total:.1f} s / summed step time {steps:.1f} s = {ratio:.2f}x "
        f"-> {verdict} the <= {TARGET}x target"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] in ("--as-train", "--as-study"):
        mode, path, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
        rest = rest[1:] if rest[:1] == ["--"] else rest
        if mode == "--as-train":
            as_train(path, rest)
            sys.exit(0)
        sys.exit(as_study(path, rest))
    sys.exit(main())
