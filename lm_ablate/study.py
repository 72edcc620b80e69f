"""Run a study (a sweep file in ``sweeps/``) and build its report, in one command.

    python -m lm_ablate.study                       # the default study (norm_2x2)
    python -m lm_ablate.study pre_vs_post_norm --launcher joblib train.max_steps=400
    python -m lm_ablate.study --list

The sweep runs as ``python -m lm_ablate.train --config-dir sweeps --config-name <study>`` in a child process
(Hydra owns that process), then ``analysis.report`` reads the multirun directory. The last line printed is
the path of report.html.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

SWEEPS_DIR = Path(__file__).resolve().parent.parent / "sweeps"
DEFAULT_STUDY = "norm_2x2"
LAUNCHERS = {"basic": "basic", "joblib": "local_parallel", "slurm": "slurm"}


def studies() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def sweep_command(study: str, out: Path, launcher: str, overrides: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "lm_ablate.train", "--config-dir", str(SWEEPS_DIR), "--config-name", study]
    cmd += [f"hydra.sweep.dir={out}", "hydra.sweep.subdir=${hydra:job.num}"]
    if launcher != "basic":
        cmd.append(f"hydra/launcher={LAUNCHERS[launcher]}")
        if launcher == "joblib":  # each parallel job gets its share of the cores
            n_jobs = 2
            cmd.append(f"train.threads={max(1, (os.cpu_count() or 2) // n_jobs)}")
    return cmd + overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lm_ablate.study", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "study", nargs="?", default=DEFAULT_STUDY, help=f"sweep file in sweeps/ (default {DEFAULT_STUDY})"
    )
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS), default="basic")
    parser.add_argument("--out", type=Path, help="multirun directory (default multirun/<study>/<time>)")
    parser.add_argument("--list", action="store_true", help="list the studies and exit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every run, e.g. train.max_steps=400")
    args, extra = parser.parse_known_args(argv)
    overrides = [a for a in args.overrides + extra if a != "--"]
    unknown = [a for a in overrides if a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.list:
        print("\n".join(studies()))
        return 0
    if args.study not in studies():
        print(f"lm-ablate: error: study={args.study!r} is invalid: allowed: {', '.join(studies())}", file=sys.stderr)
        return 2
    out = (args.out or Path("multirun") / args.study / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    started = time.perf_counter()
    sweep = subprocess.run(sweep_command(args.study, out, args.launcher, overrides))
    minutes = (time.perf_counter() - started) / 60
    if sweep.returncode and not any(out.glob("**/summary.json")):
        # refused before any run started (a bad study file or override): the sweep's one-line error above is
        # the answer; a report would only list never-started job directories
        return sweep.returncode
    print(f"lm-ablate: sweep {args.study} finished in {minutes:.1f} min (exit {sweep.returncode}); building the report")

    from analysis.report import AnalysisError, build_report

    try:
        report = build_report([out], out / "report", title=args.study)
    except AnalysisError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        return 2
    print(report)
    return sweep.returncode


if __name__ == "__main__":
    sys.exit(main())
