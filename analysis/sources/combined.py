"""Runs from run directories and/or a W&B project, as one RunSet: what every command reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from analysis.sources.load import AnalysisError, Keep, RunSet, load_runs, merge

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
    """Runs from the run directories under ``paths`` and/or the W&B project ``wandb`` (cached in
    ``out_dir/wandb_cache``), with only the history columns ``keep`` accepts (all when None)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths or [])
    if not paths and not wandb:
        raise AnalysisError("nothing to report on: give run directories and/or --wandb ENTITY/PROJECT")
    if (group or offline) and not wandb:
        raise AnalysisError("--group and --offline apply to --wandb, which is not given")
    sets = []
    if paths:
        sets.append(load_runs(paths, keep=keep, workers=workers))
    if wandb:
        from analysis.sources.wandb_api import load_wandb  # the W&B client only when asked for

        cache = Path(out_dir) / WANDB_CACHE
        sets.append(load_wandb(wandb, cache, group=group, offline=offline, keep=keep))
    return sets[0] if len(sets) == 1 else merge(sets)
