"""Cost of the stability probes (``train.probe_every``) in the real training loop.

    python bench/overhead.py [--quick] [--steps 200] [--repeats 4] [--threads N]

Runs ``lm_ablate.train.train()`` on the default config (``small`` model, Shakespeare bytes, default eval and
checkpoint settings, ``tracking=none``, no progress bar) with probes on (``train.probe_every=10``, the
default) and off (``0``), alternately (on, off, off, on, ...), in one process, and compares:

* mean tokens/s from each run's ``summary.json`` (what the loop reports). The step timer covers the whole
  probe work (observers in the training forward, ``grad_stats`` after backward), so this is the headline;
* the wall time of the whole ``train()`` call (eval, checkpoint and start-up included, equal on both sides);
* inside each probed run, from its own metrics.jsonl: (mean step time of probe steps - mean of the other
  steps) x probe steps / all step time. Both sides come from the same run and the same minutes, so this one
  is the least sensitive to other load on the machine.

Target: probes on <= 5% slower.
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


def in_run_share(run_dir: Path) -> float:
    """The probe steps' extra step time as a share of all step time, from one probed run's metrics rows."""
    import json

    from lm_ablate import metrics as M

    rows = [json.loads(line) for line in (run_dir / M.METRICS_FILE).read_text().splitlines()]
    steps = [r for r in rows if M.STEP_TIME_MS in r and r[M.STEP] > 1]  # step 1 is the first, cold one
    probed = [r[M.STEP_TIME_MS] for r in steps if M.LOGITS_MAX_ABS in r]
    plain = [r[M.STEP_TIME_MS] for r in steps if M.LOGITS_MAX_ABS not in r]
    extra = (median(probed) - median(plain)) * len(probed)
    return extra / (median(plain) * len(steps))


def one_run(probe_every: int, a: argparse.Namespace, root: Path, i: int) -> dict:
    from lm_ablate.config import compose
    from lm_ablate.train import train

    overrides = [
        "tracking=none",
        "train.progress=false",
        f"train.probe_every={probe_every}",
        f"train.max_steps={a.steps}",
        f"data.cache_dir={REPO / '.cache' / 'lm_ablate'}",
    ] + a.overrides
    if a.threads:
        overrides.append(f"train.threads={a.threads}")
    run_dir = root / f"run{i}_probe{probe_every}"
    tic = time.perf_counter()
    summary = train(compose(overrides), run_dir)
    wall = time.perf_counter() - tic
    out = {
        "tok_s": summary["mean_tokens_per_sec"],
        "wall": wall,
        "share": in_run_share(run_dir) if probe_every else None,
    }
    share = f"  probe steps' extra time {100 * out['share']:.1f}% of step time" if probe_every else ""
    print(
        f"   probe_every={probe_every:<2}  {out['tok_s']:.0f} tok/s  wall {wall:.1f} s{share}  (load {loadavg()})",
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: model=tiny, 30 steps, one pair, no warm-up run")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=4, help="pairs (on, off) of runs")
    p.add_argument("--probe-every", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="train.threads (default: torch's, one per core)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for both arms, e.g. model=tiny")
    a = p.parse_args(argv)
    if a.quick:
        a.steps, a.repeats, a.overrides = 30, 1, ["model=tiny"] + a.overrides
    header("bench/overhead.py: stability probes on vs off through lm_ablate.train.train()")
    print(
        f"   default config + tracking=none {' '.join(a.overrides)}, {a.steps} steps per run, "
        f"{a.repeats} (on, off) pairs, interleaved"
    )
    import os

    root = Path(tempfile.mkdtemp(prefix="lm_ablate_bench_overhead_"))
    on, off, loads = [], [], []
    try:
        if not a.quick:  # warm-up: imports, data cache, allocator, the peak-FLOP/s probe (cached per process)
            one_run(0, argparse.Namespace(**{**vars(a), "steps": 5}), root, -1)
        for r in range(a.repeats):
            order = (a.probe_every, 0) if r % 2 == 0 else (0, a.probe_every)
            for pe in order:
                (on if pe else off).append(one_run(pe, a, root, r))
            loads.append(os.getloadavg())
    finally:
        shutil.rmtree(root, ignore_errors=True)

    tok_ratio = ratios([x["tok_s"] for x in on], [x["tok_s"] for x in off])  # off / on tokens/s: > 1 = probes cost
    wall_ratio = ratios([x["wall"] for x in off], [x["wall"] for x in on])
    share = [x["share"] for x in on]
    rows = [
        [
            "mean tokens/s (summary): off / on",
            f"{median(tok_ratio):.3f}",
            spread(tok_ratio),
            f"{100 * (median(tok_ratio) - 1):+.1f}%",
        ],
        [
            "train() wall time: on / off",
            f"{median(wall_ratio):.3f}",
            spread(wall_ratio),
            f"{100 * (median(wall_ratio) - 1):+.1f}%",
        ],
        [
            "probe steps' extra time / step time (in the probed run)",
            f"{1 + median(share):.3f}",
            spread([1 + v for v in share]),
            f"{100 * median(share):+.1f}%",
        ],
    ]
    print()
    print(table(["measure (probes on vs off)", "median ratio", "range", "slower by"], rows))
    print(
        f"   tokens/s on: {median([x['tok_s'] for x in on]):.0f} (median), off: {median([x['tok_s'] for x in off]):.0f}"
    )
    print(f"   {load_summary(loads)}; load average at end: {loadavg()}")
    total = median(tok_ratio) - 1
    verdict = "meets" if total <= TARGET else "MISSES"
    print(
        f"RESULT overhead (probe_every={a.probe_every} vs 0): {100 * total:+.1f}% tokens/s -> {verdict} the <= 5% target "
        f"(in-run probe-step share {100 * median(share):+.1f}%; whole-run wall {100 * (median(wall_ratio) - 1):+.1f}%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
