"""Run a study (a sweep file in ``sweeps/``) and build its report, in one command.

    python -m lm_ablate.study                       # the default study (norm_2x2)
    python -m lm_ablate.study train.max_steps=400   # the default study with an override
    python -m lm_ablate.study pre_vs_post_norm --launcher joblib train.max_steps=400
    python -m lm_ablate.study parallel_vs_serial --out runs/pvs   # or hydra.sweep.dir=runs/pvs
    python -m lm_ablate.study --list

The sweep runs as ``python -m lm_ablate.train --config-dir sweeps --config-name <study>`` in a child process
(Hydra owns that process), then ``analysis.report`` reads the multirun directory (``--out``, or a
``hydra.sweep.dir=`` override, which is the same thing) and writes the report into its ``report/`` folder.
The last line printed is the path of report.html. Bad input (an unknown study, an output folder that cannot be
made, SLURM off a cluster) is one line and exit status 2 before anything is created.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from lm_ablate.config import ConfigError, bad, compose_error_message

EXIT_INTERRUPTED = 130  # what lm_ablate.train exits with after a Ctrl-C (its run is checkpointed, status interrupted)
SWEEPS_DIR = Path(__file__).resolve().parent.parent / "sweeps"
DEFAULT_STUDY = "norm_2x2"
LAUNCHERS = {"basic": "basic", "joblib": "local_parallel", "slurm": "slurm"}
SWEEP_DIR = "hydra.sweep.dir"


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


def is_override(arg: str) -> bool:
    """A Hydra override (``key=value``, ``+key=value``, ``~key``), as opposed to a study name."""
    return "=" in arg or arg.startswith(("~", "+"))


def sweep_dir_override(overrides: list[str]) -> tuple[str | None, list[str]]:
    """(the folder a ``hydra.sweep.dir=`` override names, the other overrides). The last one wins, as in Hydra.
    The study reads its runs back from that folder, so it must be one plain path: a sweep over folders or an
    interpolation (``${now:...}``, resolved only inside the sweep) raises :class:`ConfigError`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    folder, rest = None, []
    for line in overrides:
        key = line.partition("=")[0].lstrip("+~")
        if key != SWEEP_DIR:
            rest.append(line)
            continue
        try:
            override = OverridesParser.create().parse_override(line)
        except Exception as err:  # Hydra's syntax errors as one line; anything else is a bug
            message = compose_error_message(err)
            if message is None:
                raise
            raise ConfigError(message) from None
        value = None if override.is_delete() or override.is_sweep_override() else override.value()
        if value is None or isinstance(value, (dict, list)) or not str(value) or "${" in str(value):
            why = "the study reads its runs back from this folder, so it must be one plain path"
            raise bad(SWEEP_DIR, line.partition("=")[2], f"{why}; allowed: a folder (or --out FOLDER)")
        folder = str(value)
    return folder, rest


def output_folder(study: str, out: Path | None, sweep_dir: str | None) -> Path:
    """The multirun folder: ``--out``, else ``hydra.sweep.dir=``, else multirun/<study>/<time>. Raises
    :class:`ConfigError` when both are given and differ, or when the folder cannot be made or written."""
    if out is not None and sweep_dir is not None and out.resolve() != Path(sweep_dir).resolve():
        raise bad(SWEEP_DIR, sweep_dir, f"--out names another folder ({out}); allowed: one of them, or both equal")
    flag, folder = ("--out", out) if out is not None else (SWEEP_DIR, sweep_dir)
    if folder is None:
        return (Path("multirun") / study / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    from lm_ablate.sweep_check import unwritable

    why = unwritable(folder)
    if why is not None:
        raise bad(flag, str(folder), f"cannot create or write into this folder ({why}); allowed: a writable folder")
    return Path(folder).resolve()


def check_launcher(launcher: str) -> None:
    """Raise :class:`ConfigError` when the launcher cannot run on this machine (SLURM off a cluster)."""
    if launcher != "slurm":
        return
    from lm_ablate.sweep_check import slurm_missing

    why = slurm_missing()
    if why is not None:
        allowed = ", ".join(name for name in sorted(LAUNCHERS) if name != "slurm")
        raise bad("--launcher", launcher, f"{why}; allowed here: {allowed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lm_ablate.study", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "study",
        nargs="?",
        default=DEFAULT_STUDY,
        help=f"sweep file in sweeps/ (default {DEFAULT_STUDY}; an argument with = is an override, not a study)",
    )
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS), default="basic")
    parser.add_argument(
        "--out", type=Path, help=f"multirun directory (default multirun/<study>/<time>; {SWEEP_DIR}=DIR does the same)"
    )
    parser.add_argument("--list", action="store_true", help="list the studies and exit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every run, e.g. train.max_steps=400")
    args, extra = parser.parse_known_args(argv)
    overrides = [a for a in args.overrides + extra if a != "--"]
    if is_override(args.study):  # `python -m lm_ablate.study model=tiny`: the default study, overridden
        overrides.insert(0, args.study)
        args.study = DEFAULT_STUDY
    unknown = [a for a in overrides if a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.list:
        print("\n".join(studies()))
        return 0
    try:
        if args.study not in studies():
            raise bad("study", args.study, f"allowed: {', '.join(studies())}")
        check_launcher(args.launcher)
        sweep_dir, overrides = sweep_dir_override(overrides)
        out = output_folder(args.study, args.out, sweep_dir)
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    returncode = run_sweep(sweep_command(args.study, out, args.launcher, overrides))
    minutes = (time.perf_counter() - started) / 60
    if returncode == EXIT_INTERRUPTED:
        resume = " ".join(["python -m lm_ablate.study", args.study, f"--out {out}", *overrides])
        print(f"lm-ablate: interrupted after {minutes:.1f} min; to continue: {resume}", file=sys.stderr)
        return returncode
    if returncode and not any(out.glob("**/summary.json")):
        # refused before any run started (a bad study file or override): the sweep's one-line error above is
        # the answer; a report would only list never-started job directories
        return returncode
    print(f"lm-ablate: sweep {args.study} finished in {minutes:.1f} min (exit {returncode}); building the report")

    from analysis.report import AnalysisError, build_report

    try:
        report = build_report([out], out / "report", title=args.study)
    except AnalysisError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        return 2
    print(report)
    return returncode


def run_sweep(cmd: list[str]) -> int:
    """The sweep's exit status. On Ctrl-C the terminal sends SIGINT to the sweep as well: it finishes its step,
    writes a checkpoint and exits 130; we wait for that instead of killing it (subprocess.run would kill it
    0.25 s later, before its checkpoint), and a second Ctrl-C reaches it the same way and stops it at once."""
    proc = subprocess.Popen(cmd)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue


if __name__ == "__main__":
    sys.exit(main())
