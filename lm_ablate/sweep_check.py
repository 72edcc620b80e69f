"""Validate every arm of a ``--multirun`` sweep before any job is launched.

``conf/train.yaml`` registers :class:`ValidateSweep` under ``hydra.callbacks``. In MULTIRUN mode Hydra calls its
``on_multirun_start`` after composing the sweep's master config and before the sweeper and launcher exist (so
before the sweep directory, any job directory or run record is created, whichever launcher is configured). It
expands the arms exactly as Hydra's basic sweeper does (``hydra.sweeper.params``, then the command line's
overrides, as a cartesian product), composes each arm with Hydra's own config loader and runs
:func:`lm_ablate.config.validate` on it: composition only, no model, no data, no device. If any arm is bad it
prints one line per distinct error (naming the arm, or how many arms share it and the first and last) and
exits with status 2, and nothing runs. Another sweeper (Optuna, Nevergrad)
chooses its arms as it goes: then nothing is checked here and each job validates itself as before.
Checks that depend on the machine a job runs on (``train.device``, data files, resume) stay in the job.
"""

from __future__ import annotations

import copy
import logging
import sys
import time
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lm_ablate.config import ConfigError, compose_error_message, job_config, validate

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def _config_loader() -> Any:
    from hydra.core.global_hydra import GlobalHydra

    return GlobalHydra.instance().config_loader()


def _unresolved(node: Any) -> list[str]:
    """Override strings as typed: ``hydra.sweep.subdir=${hydra:job.num}`` must not be resolved here."""
    return list(OmegaConf.to_container(node, resolve=False))


def sweep_arms(config: DictConfig) -> list[list[str]]:
    """The overrides of every job the basic sweeper will launch, in launch order (as ``BasicSweeper.sweep``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()] + _unresolved(config.hydra.overrides.task)
    overrides = OverridesParser.create(config_loader=_config_loader()).parse_overrides(arguments)
    return [list(arm) for batch in BasicSweeper.split_arguments(overrides, None) for arm in batch]


def arm_labels(arms: list[list[str]]) -> list[str]:
    """Each arm named by the overrides that vary across the sweep (all of its overrides when none vary)."""
    varying = [i for i in range(len(arms[0]) if arms else 0) if len({arm[i] for arm in arms}) > 1]
    return [" ".join(arm[i] for i in varying) if varying else " ".join(arm) or "(no overrides)" for arm in arms]


class ArmChecker:
    """Composes and validates arms of one sweep. Composition is Hydra's, split the way Hydra splits it: the
    group overrides (``norm=rmsnorm``) pick the defaults list, which is composed by the config loader once per
    distinct set of them and cached; the value overrides (``optim.lr=1e-3``, ``+k=v``, ``~k``) are then applied
    to a copy with Hydra's own ``_apply_overrides_to_config``, as its loader applies them after composition. A
    sweep over values (seeds, learning rates) thus costs one composition, not one per arm."""

    def __init__(self, config: DictConfig, loader: Any = None) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.config = config
        self.loader = loader or _config_loader()
        self.parser = OverridesParser.create(config_loader=self.loader)
        # Hydra's internals for the split: the config repository as the loader builds it for this sweep (with
        # any hydra.searchpath), and the function that applies config overrides. Without them (another Hydra
        # version), every arm is composed in full.
        self.apply = getattr(self.loader, "_apply_overrides_to_config", None)
        make_repo = getattr(self.loader, "_parse_overrides_and_create_caching_repo", None)
        self.repo = None
        if self.apply is not None and make_repo is not None:
            _, self.repo = make_repo(config.hydra.job.config_name, _unresolved(config.hydra.overrides.hydra))
        self.composed: dict[tuple[str, ...], DictConfig | str] = {}
        self.parsed: dict[str, Any] = {}

    def _split(self, overrides: list[str]) -> tuple[list[str], list[Any]]:
        if self.repo is None or self.apply is None:
            return list(overrides), []
        groups, values = [], []
        for line in overrides:
            if line not in self.parsed:
                self.parsed[line] = self.parser.parse_overrides([line])[0]
            override = self.parsed[line]
            # as hydra._internal.defaults_list.Overrides: a dict value or a non-group key is a config override
            if isinstance(override.value(), dict) or not self.repo.group_exists(override.key_or_group):
                values.append(override)
            else:
                groups.append(override.input_line)
        return groups, values

    def _compose(self, groups: list[str]) -> DictConfig | str:
        key = tuple(groups)
        if key not in self.composed:
            try:
                self.composed[key] = job_config(self.loader.load_sweep_config(self.config, list(groups)))
            except Exception as err:  # a composition error is this set's answer; others propagate
                line = compose_error_message(err)
                if line is None:
                    raise
                self.composed[key] = line
        return self.composed[key]

    def error(self, overrides: list[str]) -> str | None:
        """The one-line error of one arm (composition or :func:`validate`), or None when it is valid."""
        from omegaconf.errors import InterpolationResolutionError

        try:
            groups, values = self._split(overrides)
            base = self._compose(groups)
            if isinstance(base, str):
                return base
            cfg = copy.deepcopy(base) if values else base  # validate only reads
            if values:
                self.apply(values, cfg)
            validate(cfg)
        except ConfigError as err:
            return str(err)
        except InterpolationResolutionError:
            return None  # may need what only a launched job has (${hydra:job.num}): the job checks it
        except Exception as err:  # composition errors become one line; others propagate
            line = compose_error_message(err)
            if line is None:
                raise
            return line
        return None


def sweep_errors(config: DictConfig) -> list[str]:
    """``<arm>: <error>`` for every bad arm of the sweep, arms with the same error on one line (``<n> of <N>
    arms (<first>, ..., <last>): <error>``); empty when every arm is valid."""
    try:
        arms = sweep_arms(config)
    except Exception as err:  # a sweep the basic sweeper cannot expand (interval(...)): its own one line
        line = compose_error_message(err)
        if line is None:
            raise
        return [line]
    checker = ArmChecker(config)
    by_error: dict[str, list[str]] = {}  # one error shared by many arms (a bad fixed override) is one line
    for label, arm in zip(arm_labels(arms), arms):
        error = checker.error(arm)
        if error is not None:
            by_error.setdefault(error, []).append(label)
    return [
        f"{labels[0]}: {error}"
        if len(labels) == 1
        else f"{len(labels)} of {len(arms)} arms ({labels[0]}, ..., {labels[-1]}): {error}"
        for error, labels in by_error.items()
    ]


class ValidateSweep(Callback):
    """Hydra callback (``hydra.callbacks.validate_sweep`` in conf/train.yaml): refuse a sweep with a bad arm
    before launching any job. Remove it for one sweep with ``~hydra.callbacks.validate_sweep``."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
            return  # an optimizing sweeper picks its arms as it goes: each job validates itself
        started = time.perf_counter()
        errors = sweep_errors(config)
        log.debug(f"validated the sweep's arms in {time.perf_counter() - started:.2f} s")
        if errors:
            for line in errors:
                print(f"lm-ablate: error: {line}", file=sys.stderr)
            sys.exit(2)  # SystemExit passes through Hydra's callback wrapper (which only warns on Exception)
