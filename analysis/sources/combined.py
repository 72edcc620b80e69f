"""Runs from run directories, W&B run files and/or a W&B project, as one RunSet: what every command reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from analysis.sources.load import (
    AnalysisError,
    Keep,
    RunSet,
    check_paths,
    find_run_dirs,
    load_run_dirs,
    merge,
    no_runs,
    run_ids,
)
from analysis.sources.wandb_offline import find_offline_runs, load_offline

WANDB_CACHE = "wandb_cache"  # under the output folder: the W&B runs fetched, so --offline rebuilds without network


def load_sources(
    paths: Sequence[str | Path] | str | Path | None,
    out_dir: str | Path,
    wandb: str | None = None,
    group: str | None = None,
    offline: bool = False,
    workers: int = 1,
    keep: Keep | None = None,
) -> RunSet:
    """Runs from the run directories under ``paths``, the W&B runs there that no run record stands for (a
    ``wandb/`` folder, ``offline-run-*`` folders, ``run-*.wandb`` files, or folders holding them:
    :func:`~analysis.sources.wandb_offline.find_offline_runs`) and/or the W&B project ``wandb`` (cached in
    ``out_dir/wandb_cache``), with only the history columns ``keep`` accepts (all when None)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths or [])
    if not paths and not wandb:
        raise AnalysisError(
            "nothing to report on: give run directories or W&B run folders, and/or --wandb ENTITY/PROJECT"
        )
    if (group or offline) and not wandb:
        raise AnalysisError("--group and --offline apply to --wandb, which is not given (W&B offline runs on disk "
                            "need neither: give their folders as paths, e.g. RUN_DIR/wandb)")  # fmt: skip
    sets = []
    if paths:
        check_paths(paths)
        run_dirs, notes = find_run_dirs(paths)
        offline = find_offline_runs(paths)
        if not run_dirs and not offline:
            raise no_runs(paths)
        ids = run_ids([*run_dirs, *(r.location for r in offline)])  # one naming for both: unique across them
        if run_dirs:
            sets.append(load_run_dirs(run_dirs, notes, keep=keep, workers=workers, ids=ids[: len(run_dirs)]))
        if offline:
            sets.append(load_offline(offline, keep=keep, workers=workers, ids=ids[len(run_dirs) :]))
    if wandb:
        from analysis.sources.wandb_api import load_wandb  # the W&B client only when asked for

        cache = Path(out_dir) / WANDB_CACHE
        sets.append(load_wandb(wandb, cache, group=group, offline=offline, keep=keep))
    return sets[0] if len(sets) == 1 else merge(sets)
