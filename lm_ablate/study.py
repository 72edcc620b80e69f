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
import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lm_ablate.config import ConfigError, bad, compose_error_message

EXIT_INTERRUPTED = 130  # what lm_ablate.train exits with after a Ctrl-C (its run is checkpointed, status interrupted)
SWEEPS_DIR = Path(__file__).resolve().parent.parent / "sweeps"
DEFAULT_STUDY = "norm_2x2"
LAUNCHERS = {"basic": "basic", "joblib": "local_parallel", "slurm": "slurm"}
SWEEP_DIR = "hydra.sweep.dir"


RESULTS_README = SWEEPS_DIR.parent / "results" / "README.md"  # its "Wall time of each study" table (gallery.py)
SEED = "seed"
SHOWN_VALUES = 6  # values of a swept key listed before "... (n values)"


def studies() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class StudyPlan:
    """What ``sweeps/<study>.yaml`` runs: its jobs (overrides, in launch order) and the decay branches each run
    writes beside its record (``ladder.budgets``: lm_ablate/budgets.py)."""

    jobs: list[dict[str, str]]
    branches_per_run: int

    @property
    def arms(self) -> list[dict[str, str]]:
        """The distinct settings apart from the seed (an arm's seeds are its runs)."""
        out: list[dict[str, str]] = []
        for job in self.jobs:
            arm = {k: v for k, v in job.items() if k != SEED}
            if arm not in out:
                out.append(arm)
        return out

    def swept(self) -> dict[str, list[str]]:
        """Each swept key's values over every job, in order of first appearance (the seed last)."""
        values: dict[str, list[str]] = {}
        for job in self.jobs:
            for key, value in job.items():
                if value not in values.setdefault(key, []):
                    values[key].append(value)
        return {k: v for k, v in values.items() if k != SEED} | ({SEED: values[SEED]} if SEED in values else {})


def study_plan(study: str) -> StudyPlan:
    """The jobs of a sweep file as Hydra's basic sweeper (or lm-ablate's grids sweeper) expands them, without
    composing anything (hydra_plugins/lm_ablate_grids.job_overrides, the sweep check's expansion)."""
    import yaml

    from hydra_plugins.lm_ablate_grids.grids_sweeper import job_overrides

    sweep = yaml.safe_load((SWEEPS_DIR / f"{study}.yaml").read_text()) or {}
    sweeper = (sweep.get("hydra") or {}).get("sweeper") or {}
    jobs = [
        dict(line.split("=", 1) for line in job)
        for job in job_overrides(sweeper.get("params"), sweeper.get("grids"), [])
    ]
    ladder = dict((_experiment(sweep) or {}).get("ladder") or {}) | dict(sweep.get("ladder") or {})
    budgets = ladder.get("budgets") or []
    branches = len(budgets) - 1 if len(budgets) > 1 and ladder.get("budget") is None else 0
    return StudyPlan(jobs, branches)


def _experiment(sweep: dict) -> dict | None:
    """The experiment file a sweep selects (``override experiment: NAME`` in its defaults), read as yaml."""
    import yaml

    from lm_ablate.config import CONF_DIR

    for entry in sweep.get("defaults") or []:
        if isinstance(entry, dict) and "override experiment" in entry:
            path = CONF_DIR / "experiment" / f"{entry['override experiment']}.yaml"
            return yaml.safe_load(path.read_text()) if path.is_file() else None
    return None


def measured_times(readme: Path | None = None) -> dict[str, tuple[str, str]]:
    """study -> (wall time, train.threads) from the "Wall time of each study" table of results/README.md, where
    ``python scripts/gallery.py build`` records each study's full run (none for a study never run in full)."""
    readme = readme or RESULTS_README
    text = readme.read_text() if readme.is_file() else ""
    if "## Wall time of each study" not in text:
        return {}
    table = text.split("## Wall time of each study", 1)[1].split("\n## ", 1)[0]
    out = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if row.startswith("| ") and len(cells) >= 3 and cells[0] not in ("study", "---") and "min" in cells[1]:
            out[cells[0]] = (cells[1], cells[2])
    return out


def _threads(value: str) -> str:
    """results/README.md's train.threads column in words: 1, default (both cores) or 1x2 (two 1-thread jobs)."""
    if value == "default":
        return "alone on both cores"
    threads, _, jobs = value.partition("x")
    return f"{jobs} jobs at train.threads={threads}" if jobs else f"train.threads={value}"


def _values(values: list[str]) -> str:
    """Numbers in increasing order (an LR grid, the rungs), anything else as the sweep lists it."""
    with contextlib.suppress(ValueError):
        values = sorted(values, key=float)
    shown = ", ".join(values[:SHOWN_VALUES])
    return shown if len(values) <= SHOWN_VALUES else f"{shown}, ... ({len(values)} values)"


def listing() -> str:
    """``--list``: every study with its runs, arms, what it sweeps and its measured wall time."""
    times = measured_times()
    blocks = []
    for study in studies():
        plan = study_plan(study)
        runs = f"{len(plan.jobs)} runs"
        if plan.branches_per_run:
            runs += f" (+{plan.branches_per_run * len(plan.jobs)} branch records)"
        if study in times:
            wall, threads = times[study]
            measured = f"measured {wall}, {_threads(threads)}"
        else:
            measured = "not measured"
        name = f"{study} (default)" if study == DEFAULT_STUDY else study
        lines = [f"{name}: {runs}, {len(plan.arms)} arms; {measured}"]
        lines += [f"    {key}: {_values(values)}" for key, values in plan.swept().items()]
        blocks.append("\n".join(lines))
    where = f"{RESULTS_README.parent.name}/{RESULTS_README.name}"
    return "\n".join([*blocks, f"(arms: the settings apart from the seed; measured: the full study, from {where})"])


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
    parser.add_argument(
        "--list", action="store_true", help="list the studies (runs, arms, swept values, measured time)"
    )
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
        print(listing())
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
