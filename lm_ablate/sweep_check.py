"""Validate every arm of a ``--multirun`` sweep before any job is launched.

``conf/train.yaml`` registers :class:`ValidateSweep` under ``hydra.callbacks``. In MULTIRUN mode Hydra calls its
``on_multirun_start`` after composing the sweep's master config and before the sweeper and launcher exist (so
before the sweep directory, any job directory or run record is created, whichever launcher is configured). It
expands the arms exactly as Hydra's basic sweeper does (``hydra.sweeper.params``, then the command line's
overrides, as a cartesian product), or as lm-ablate's ``hydra/sweeper=grids`` does (that product with each of
``hydra.sweeper.grids``, their union: hydra_plugins/lm_ablate_grids/grids_sweeper.py), composes each arm with
Hydra's own config loader and runs
:func:`lm_ablate.config.validate` on it: composition only, no model, no data, no device. If any arm is bad it
prints one line per distinct error (naming the arm, or how many arms share it and the first and last) and
exits with status 2, and nothing runs. Another sweeper (Optuna, Nevergrad)
chooses its arms as it goes: then its arms are not checked here and each job validates itself as before.
Whatever the sweeper, two things about this machine are checked too, so a sweep that cannot start says why in
one line instead of a traceback after its folder was made: the sweep directory can be created and written
(:func:`unwritable`), and a SLURM launcher has ``sbatch`` and ``srun`` to call (:func:`slurm_missing`).
Checks that depend on the machine a job runs on (``train.device``, data files, resume) stay in the job.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from lm_ablate.claim_spec import check_claims_against_arms, flatten, parse_claims
from lm_ablate.config import ConfigError, bad, compose_error_message, job_config, validate
from lm_ablate.data import check_vocab_key
from lm_ablate.ladder import apply_rung, check_budget_keys, check_ladder, vocab_size_of
from lm_ablate.options import explicit_keys, settle
from lm_ablate.shape import apply_shape
from lm_ablate.validation import MIN_RUNGS

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
GRIDS_SWEEPER = "hydra_plugins.lm_ablate_grids.grids_sweeper.GridsSweeper"
GRID_SWEEPERS = (BASIC_SWEEPER, GRIDS_SWEEPER)  # sweepers whose every arm is known before the sweep starts
SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
# submitit's SlurmExecutor refuses to start without srun on PATH (its `affinity`, "Could not detect srun") and
# submits every job with sbatch
SLURM_COMMANDS = ("sbatch", "srun")
OTHER_LAUNCHERS = "basic (the default), joblib, local_parallel"


def slurm_missing() -> str | None:
    """Why submitit cannot submit to SLURM from this machine (a command it calls is not on PATH), or None."""
    missing = [name for name in SLURM_COMMANDS if shutil.which(name) is None]
    if not missing:
        return None
    return f"no {' or '.join(missing)} on PATH, so this is not a SLURM login node (submitit calls sbatch and srun)"


def unwritable(path: str | Path) -> str | None:
    """Why ``path`` is not a folder this process can create and write into (``"No such file or directory:
    /proc/x"``), or None. Probes by making the missing folders and a temporary folder inside them, then removes
    all it made: nothing is left behind either way."""
    target = Path(path).absolute()
    made: list[Path] = []
    try:
        missing = []
        for folder in (target, *target.parents):
            if folder.is_dir():
                break
            if folder.exists():  # a file or a device where a folder should be
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
            missing.append(folder)
        for folder in reversed(missing):  # topmost first: the error names the folder that could not be made
            folder.mkdir()
            made.append(folder)
        os.rmdir(tempfile.mkdtemp(dir=target, prefix=".write_probe_"))
    except OSError as err:
        why = err.strerror or type(err).__name__
        return f"{why}: {err.filename}" if err.filename and Path(err.filename) != target else why
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def _config_loader() -> Any:
    from hydra.core.global_hydra import GlobalHydra

    return GlobalHydra.instance().config_loader()


def _unresolved(node: Any) -> list[str]:
    """Override strings as typed: ``hydra.sweep.subdir=${hydra:job.num}`` must not be resolved here."""
    return list(OmegaConf.to_container(node, resolve=False))


def sweep_arms(config: DictConfig, command_line: bool = True) -> list[list[str]]:
    """The overrides of every job the sweeper will launch, in launch order (as ``BasicSweeper.sweep``, or the
    grids sweeper's union of products); without ``command_line``, the arms of the sweep file's own
    ``hydra.sweeper.params`` and ``grids`` alone (none without them)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra_plugins.lm_ablate_grids.grids_sweeper import job_overrides

    params = config.hydra.sweeper.get("params") or {}
    grids = config.hydra.sweeper.get("grids") if config.hydra.sweeper.get("_target_") == GRIDS_SWEEPER else None
    if not command_line and not params and not grids:
        return []
    task = _unresolved(config.hydra.overrides.task) if command_line else []
    return job_overrides(params, grids, task, OverridesParser.create(config_loader=_config_loader()))


def arm_labels(arms: list[list[str]]) -> list[str]:
    """Each arm named by the overrides that vary across the sweep (all of its overrides when none vary); arms
    of different grids may set different keys."""
    by_key = [{line.partition("=")[0]: line for line in arm} for arm in arms]
    keys = list(dict.fromkeys(key for arm in by_key for key in arm))
    varying = [k for k in keys if len({arm.get(k) for arm in by_key}) > 1]
    return [
        " ".join(arm[k] for k in varying if k in arm) if varying else " ".join(arm.values()) or "(no overrides)"
        for arm in by_key
    ]


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
        self.ladder_rungs: dict[str, set[int]] = {}  # ladder name -> rungs the valid arms train
        self.ladder_checked: dict[str, str | None] = {}  # a ladder's size checks, once per ladder and arm config
        self.ladder_lrs: dict[tuple[str, str], set[float]] = {}  # (ladder, optimizer) -> LRs of its ladder.lr=grid arms
        self.claim_arms: dict[str, list[dict[str, Any]]] = {}  # an arm's claims (JSON) -> the valid arms' configs
        self.record_claims = False  # set by claim_errors while it checks the sweep file's own arms

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
                # the rung is applied per arm, after its value overrides, as the job applies it
                self.composed[key] = job_config(self.loader.load_sweep_config(self.config, list(groups)), rung=False)
            except Exception as err:  # a composition error is this set's answer; others propagate
                line = str(err) if isinstance(err, ConfigError) else compose_error_message(err)
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
            cfg = copy.deepcopy(base)  # the cached composition stays as composed: settle and a rung change cfg
            if values:
                self.apply(values, cfg)
            apply_rung(cfg)  # before settle, as the job (lm_ablate/train.py): ladder.lr=mup turns on mup's keys
            explicit = explicit_keys(values if self.repo is not None else overrides)
            settle(cfg, explicit)
            check_budget_keys(cfg)
            check_vocab_key(cfg)
            apply_shape(cfg, explicit)  # shape=iso: the arm's sizes, solved (one line if no integer shape fits)
            validate(cfg)
            self._record_claims(cfg)
            if cfg.ladder.name is not None:
                return self._ladder_error(cfg)
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

    def _record_claims(self, cfg: DictConfig) -> None:
        """Keep a valid arm's flattened config under its study's claims, for :func:`claim_errors`."""
        if self.record_claims and cfg.get("claims"):
            flat = flatten(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
            self.claim_arms.setdefault(json.dumps(flat["claims"], sort_keys=True, default=str), []).append(flat)

    def _ladder_error(self, cfg: DictConfig) -> str | None:
        """Rungs increasing in size and a budget of at least one step, checked on meta-device models (once per
        distinct shape and budget: seeds and LRs share it); the rung is recorded for the sweep-wide check that a ladder study has >= MIN_RUNGS rungs."""
        self.ladder_rungs.setdefault(str(cfg.ladder.name), set()).add(int(cfg.ladder.rung))
        if cfg.ladder.lr == "grid":
            self.ladder_lrs.setdefault((str(cfg.ladder.name), str(cfg.optim.name)), set()).add(float(cfg.optim.lr))
        vocab = vocab_size_of(cfg.data)
        if vocab is None:  # a pretrained tokenizer: only loading it tells its size; the job checks its own budget
            return None
        key = OmegaConf.to_yaml(_without_lr_and_seed(cfg))  # the checks read neither: one per shape and budget
        if key not in self.ladder_checked:
            try:
                check_ladder(cfg, vocab)
                self.ladder_checked[key] = None
            except ConfigError as err:
                self.ladder_checked[key] = str(err)
        return self.ladder_checked[key]


def _without_lr_and_seed(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` with ``seed`` and ``optim.lr`` set to one value for all: a ladder's size and budget checks
    read neither (their messages name neither), so an LR grid x seeds sweep checks each rung once."""
    out = copy.deepcopy(cfg)
    with open_dict(out):
        out.seed = 0
        out.optim.lr = 1.0
    return out


def sweep_errors(config: DictConfig) -> list[str]:
    """``<arm>: <error>`` for every bad arm of the sweep, arms with the same error on one line (``<n> of <N>
    arms (<first>, ..., <last>): <error>``); empty when every arm is valid."""
    try:
        arms = sweep_arms(config)
    except ConfigError as err:  # hydra.sweeper.grids is no list of {key: values} mappings
        return [str(err)]
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
    for name, rungs in checker.ladder_rungs.items():  # L(C) = E + A C^-alpha has 3 parameters: 3 rungs at least
        if len(rungs) < MIN_RUNGS:
            why = (f"a ladder study must sweep ladder.rung over at least {MIN_RUNGS} rungs of ladder={name} (the "
                   f"fit L = E + A C^-alpha has 3 parameters; this sweep trains {sorted(rungs)})")  # fmt: skip
            by_error.setdefault(str(bad("ladder.rung", sorted(rungs), why)), []).append("every arm")
        elif len(rungs) < MIN_RUNGS + 1 and not by_error:
            print(f"lm-ablate: warning: ladder={name} sweeps {len(rungs)} rungs: the fit has no held-out check (it "
                  f"leaves the largest rung out and needs {MIN_RUNGS + 1} rungs for that)", file=sys.stderr)  # fmt: skip
    single: dict[str, list[str]] = {}  # ladder.lr=grid: each (arm, rung) is fitted at its best LR of a grid
    for (name, optimizer), lrs in checker.ladder_lrs.items():
        if len(lrs) < 2:
            single.setdefault(name, []).append(f"the {optimizer} arms train one optim.lr ({min(lrs):g})")
    for name, which in single.items():
        why = (f"ladder={name} fits each (arm, rung) at its best LR of the sweep's grid, but {', '.join(which)}: "
               "sweep optim.lr (or lr_mult) over 2 values at least, or set ladder.lr=fixed")  # fmt: skip
        by_error.setdefault(str(bad("ladder.lr", "grid", why)), []).append("every arm")
    lines = [
        f"{labels[0]}: {error}"
        if len(labels) == 1
        else f"{len(labels)} of {len(arms)} arms ({labels[0]}, ..., {labels[-1]}): {error}"
        for error, labels in by_error.items()
    ]
    return lines or claim_errors(config, checker)


def claim_errors(config: DictConfig, checker: ArmChecker) -> list[str]:
    """One line per study claim (``claims`` in the arms' configs, lm_ablate/claim_spec.py) that refers to a key
    the study does not vary or to a value none of its arms has. The reference is the study's design, the arms
    of the sweep file's own ``hydra.sweeper.params``: narrowing a study on the command line (``optim.lr=3e-3``)
    leaves some claims without runs (reported as untested), and an ad-hoc ``--multirun experiment=<study> ...``
    without a sweep file has no design to check them against; a typo in a claim fails here, before any job."""
    declared = sweep_arms(config, command_line=False)
    checker.claim_arms, checker.record_claims = {}, True
    try:
        for arm in declared:
            checker.error(arm)  # records the arm's config if it is valid
    finally:
        checker.record_claims = False
    errors = []
    for raw, flats in checker.claim_arms.items():
        try:
            check_claims_against_arms(parse_claims(json.loads(raw)), flats)
        except ConfigError as err:
            errors.append(str(err))
    return errors


def machine_errors(config: DictConfig) -> list[str]:
    """One line per reason this machine cannot start the sweep: its directory cannot be made or written, or
    its launcher is SLURM's and there is no SLURM to submit to."""
    errors = []
    try:
        sweep_dir = OmegaConf.select(config, "hydra.sweep.dir")
    except Exception as err:  # an interpolation only a job could resolve: Hydra reports it as before
        if compose_error_message(err) is None:
            raise
        sweep_dir = None
    why = None if sweep_dir is None else unwritable(str(sweep_dir))
    if why is not None:
        errors.append(
            str(
                bad(
                    "hydra.sweep.dir",
                    str(sweep_dir),
                    f"cannot create or write into this folder ({why}); allowed: a writable folder",
                )
            )
        )
    if OmegaConf.select(config, "hydra.launcher._target_") == SLURM_LAUNCHER:
        why = slurm_missing()
        if why is not None:
            choice = OmegaConf.select(config, "hydra.runtime.choices.hydra/launcher") or "slurm"
            errors.append(str(bad("hydra/launcher", choice, f"{why}; allowed here: {OTHER_LAUNCHERS}")))
    return errors


class ValidateSweep(Callback):
    """Hydra callback (``hydra.callbacks.validate_sweep`` in conf/train.yaml): refuse a sweep with a bad arm,
    or one this machine cannot start, before launching any job. Remove it for one sweep with
    ``~hydra.callbacks.validate_sweep``."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        errors = []
        if OmegaConf.select(config, "hydra.sweeper._target_") in GRID_SWEEPERS:
            # (an optimizing sweeper picks its arms as it goes: each of its jobs validates itself)
            started = time.perf_counter()
            errors = sweep_errors(config)
            log.debug(f"validated the sweep's arms in {time.perf_counter() - started:.2f} s")
        errors += machine_errors(config)
        if errors:
            for line in errors:
                print(f"lm-ablate: error: {line}", file=sys.stderr)
            sys.exit(2)  # SystemExit passes through Hydra's callback wrapper (which only warns on Exception)
