"""``hydra/sweeper=grids``: Hydra's basic sweeper over a union of grids.

Hydra's basic sweeper runs one cartesian product (``hydra.sweeper.params``). An ablation often wants several:
each arm on its own LR grid (the optima of norm placements span 8x: one shared grid that brackets them all
spends most runs far from any arm's optimum), or three seeds at the LR that decides a claim and one at the
grid's ends that only show it is the best. This sweeper adds ``grids``, a list of further products::

    hydra:
      sweeper:
        params:                      # shared by every grid (a cartesian factor of each)
          seed: 0,1,2
        grids:                       # the jobs: grid 1's product, then grid 2's, ... (duplicates run once)
          - {norm.placement: pre, optim.lr: 6e-3}
          - {norm.placement: "post,deepnorm", optim.lr: 3e-3}
          - {norm.placement: "post,deepnorm", optim.lr: "1.5e-3,6e-3", seed: 0}

A job's overrides are, in order, ``params``, its grid's keys, then the command line's: a later one replaces an
earlier value of the same key (the grid's ``seed: 0`` above replaces the shared ``0,1,2``; ``seed=1`` on the
command line replaces both). Without ``grids`` it is the basic sweeper. Jobs are numbered in that order from 0,
as one sweep (``hydra.sweep.subdir=${hydra:job.num}``), and handed to the configured launcher in batches of
``max_batch_size`` (all at once by default), so joblib and submitit run them as they run any sweep.
``lm_ablate.sweep_check`` expands the same jobs (:func:`job_overrides`) and validates each before any starts.

(Hydra's own plan for zipped sweeps, facebookresearch/hydra#1258 and #2851, is not in 1.3; this is the
"concatenated sweeps" form of #2851.)
"""

# (no ``from __future__ import annotations``: Hydra's plugin scan executes this module outside sys.modules,
# where dataclasses cannot resolve string annotations)
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

# (the error type lives in lm_ablate: Hydra's plugin scan runs this module's code again, which would make a class
# defined here a new class each time, and ``except`` of the earlier one would miss it)
from lm_ablate.errors import ConfigError

GRIDS_KEY = "hydra.sweeper.grids"


@dataclass
class GridsSweeperConf:
    _target_: str = "hydra_plugins.lm_ablate_grids.grids_sweeper.GridsSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None
    grids: list[Any] | None = None


ConfigStore.instance().store(group="hydra/sweeper", name="grids", node=GridsSweeperConf, provider="lm_ablate")


def _pairs(mapping: Any, where: str) -> list[str]:
    if not isinstance(mapping, Mapping) or not mapping:
        raise ConfigError(
            f"{where}={_text(mapping)} is invalid: allowed: a non-empty mapping of config keys to sweep values "
            "({key: 'a,b'})"
        )
    return [f"{key}={_text(value)}" for key, value in mapping.items()]


def _text(value: Any) -> str:
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=False)
    return str(value) if not isinstance(value, (list, tuple, dict)) else repr(value)


def job_overrides(
    params: Mapping[str, Any] | None,
    grids: Sequence[Any] | None,
    arguments: Sequence[str],
    parser: OverridesParser | None = None,
) -> list[list[str]]:
    """The overrides of every job, in launch order: for each grid (one empty grid without ``grids``), the
    cartesian product of ``params``, the grid and ``arguments`` (later keys replace earlier ones), as
    ``BasicSweeper.split_arguments`` builds one product; a job already produced by an earlier grid is dropped."""
    if OmegaConf.is_config(grids):
        grids = OmegaConf.to_container(grids, resolve=False)  # type: ignore[assignment]
    if grids is not None and (not isinstance(grids, Sequence) or isinstance(grids, str) or not grids):
        raise ConfigError(
            f"{GRIDS_KEY}={_text(grids)} is invalid: allowed: a non-empty list of {{key: values}} mappings "
            "(each one cartesian product; the sweep runs their union)"
        )
    parser = parser or OverridesParser.create()
    shared = [f"{key}={_text(value)}" for key, value in (params or {}).items()]
    jobs: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for i, grid in enumerate(grids if grids is not None else [None]):
        lines = shared + ([] if grid is None else _pairs(grid, f"{GRIDS_KEY}[{i}]")) + list(arguments)
        for batch in BasicSweeper.split_arguments(parser.parse_overrides(lines), None):
            for job in batch:
                key = tuple(sorted(job))
                if key not in seen:
                    seen.add(key)
                    jobs.append(list(job))
    return jobs


class GridsSweeper(BasicSweeper):
    """The basic sweeper with ``grids`` (module docstring); launch, batching and the multirun record as its."""

    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        grids: list[Any] | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.grids = grids

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = job_overrides(self.params, self.grids, arguments, parser)
        self.overrides = list(self.split_overrides_to_chunks(jobs, self.max_batch_size))
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns, initial_job_idx = [], 0
        while not self.is_done():
            batch = self.get_job_batch()
            self.validate_batch_is_legal(batch)
            results = self.launcher.launch(batch, initial_job_idx=initial_job_idx)
            for r in results:
                _ = r.return_value  # re-raises a job's exception, as the basic sweeper does
            initial_job_idx += len(batch)
            returns.append(results)
        return returns
