"""The configuration API, one import for users, notebooks, tests and the commands on top: the schemas
(lm_ablate/schema.py), the error type (lm_ablate/errors.py), validation (lm_ablate/validation.py) and, here,
composition: :func:`compose` builds the config a command line would run, :func:`job_config` finishes one
Hydra composed, :func:`compose_error_message` turns Hydra's errors into one line.

Floors: errors and schema at the bottom (imported by every component, importing nothing of ours), then the
components and their registries, then options and validation, then the ladder and this module. Modules inside
the package import the floor they need, never this one from below (tests/test_imports.py walks the graph).
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lm_ablate.errors import ConfigError, bad
from lm_ablate.ladder import apply_rung
from lm_ablate.options import explicit_keys, settle
from lm_ablate.schema import (
    AXES,
    CONF_DIR,
    GROUPS,
    ActivationConfig,
    AttentionConfig,
    Config,
    DataConfig,
    LadderConfig,
    ModelConfig,
    NormConfig,
    OptimConfig,
    PositionConfig,
    RegularizationConfig,
    SpikeConfig,
    TrackingConfig,
    TrainConfig,
    head_dim,
    to_container,
)
from lm_ablate.shape import apply_shape
from lm_ablate.validation import validate

__all__ = [
    "AXES",
    "CONF_DIR",
    "GROUPS",
    "ActivationConfig",
    "AttentionConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "LadderConfig",
    "ModelConfig",
    "NormConfig",
    "OptimConfig",
    "PositionConfig",
    "RegularizationConfig",
    "SpikeConfig",
    "TrackingConfig",
    "TrainConfig",
    "bad",
    "compose",
    "compose_error_message",
    "head_dim",
    "job_config",
    "to_container",
    "validate",
]


def compose(
    overrides: list[str] | tuple[str, ...] = (), config_name: str = "train", refuse_unread: bool = True
) -> DictConfig:
    """The config ``python -m lm_ablate.train <overrides>`` would run, built without starting a run
    (tests, notebooks, ``python -m lm_ablate.cost``). ``choices`` is filled as in a real run, and a shape=iso
    request is solved (its sizes written into model.* and activation.d_ff). A key the chosen
    options do not read is refused when the overrides set it, as on the command line; ``refuse_unread=False``
    treats the overrides as a file would be (the key is cleared): for translations that write every field
    they map, such as an HF config's (lm_ablate/hf/)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)
    cfg = job_config(cfg)
    explicit = explicit_keys(overrides) if refuse_unread else set()
    settle(cfg, explicit)  # keys the chosen options do not read
    apply_shape(cfg, explicit)  # shape=iso: the sizes solved from its ratios (lm_ablate/shape.py)
    return cfg


def job_config(cfg: DictConfig, rung: bool = True) -> DictConfig:
    """A config composed with its ``hydra`` node (Hydra's compose, ``load_sweep_config``) as the task function
    sees it: the ``hydra`` node dropped, ``choices`` filled from ``hydra.runtime.choices``. Changes ``cfg``.
    ``rung=False`` leaves the ladder's rung unapplied, for a composition that value overrides still change (the
    sweep check's cached base: ``ladder.lr=fixed`` given after it must not find μP already switched on)."""
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra") and k != "local"}
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    cfg.choices = choices
    OmegaConf.set_struct(cfg, True)
    if rung:
        apply_rung(cfg)  # a ladder run's shape (lm_ablate/ladder.py)
    return cfg


def compose_error_message(err: BaseException) -> str | None:
    """One line, in :func:`lm_ablate.config.bad`'s format, for an error Hydra or OmegaConf raised while composing
    the config (unknown group option, unknown key, wrong type, override syntax); None for any other error.
    Hydra's own report is several lines plus a hint about HYDRA_FULL_ERROR."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if not isinstance(err, (HydraException, OmegaConfBaseException)):
        return None
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, option = err.missing_cfg_file.rpartition("/")
        return f"{group}={option!r} is invalid: no such option; allowed: {', '.join(err.options)}"
    if isinstance(err, OverrideParseException):
        return f"cannot parse the overrides: {_first(str(err))} (syntax: key=value, group=option, +key=value)"
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    if isinstance(cause, OmegaConfBaseException) and key:
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            typed = re.search(r"use \+(\S+)", str(err))
            parent = key.rpartition(".")[0]
            node = OmegaConf.select(OmegaConf.structured(Config), parent) if parent else OmegaConf.structured(Config)
            keys = ", ".join(str(k) for k in node) if isinstance(node, DictConfig) else "see --cfg job"
            shown = typed.group(1) if typed else key
            return f"{shown} is invalid: unknown key; keys of {parent or 'the config'}: {keys}"
        why = _first(cause.msg or str(cause))
        kind = re.search(r"could not be converted to (\w+)", why)
        if kind:
            why = f"must be {'an' if kind.group(1)[0] in 'AEIOU' else 'a'} {kind.group(1).lower()}"
        elif "is not a valid bool" in why:
            why = "must be true or false"
        elif "is not Optional" in why:
            why = "must not be null"
        elif "is not a ListConfig" in why:  # OmegaConf: "str is not a ListConfig, list or tuple"
            why = _list_form(key)
        return f"{key}={'null' if cause.value is None else repr(cause.value)} is invalid: {why}"
    return _first(str(err))


def _list_form(key: str) -> str:
    """What a list-typed key takes, from the schema's annotation: ``must be a list of numbers, e.g.
    ladder.budgets=[0.5,1,2]`` (a Hydra override writes a list in brackets)."""
    import dataclasses
    import typing

    hint: Any = Config
    for part in key.split("."):
        fields = {f.name: f for f in dataclasses.fields(hint)} if dataclasses.is_dataclass(hint) else {}
        if part not in fields:
            return "must be a list, written [a,b,...]"
        hint = typing.get_type_hints(hint)[part]
    if typing.get_origin(hint) is typing.Union:  # Optional[list[X]]: list[X]
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    element = (typing.get_args(hint) or (Any,))[0]
    if typing.get_origin(element) is dict or dataclasses.is_dataclass(element):
        kind, example = "mappings", "[{key:value,...}]"
    else:
        kinds = {int: ("integers", "[2,4]"), float: ("numbers", "[0.5,1,2]"), str: ("strings", "[a,b]")}
        kind, example = kinds.get(element, ("values", "[a,b]"))
    return f"must be a list of {kind} in brackets, e.g. {key}={example} ([] for none)"


def _first(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "invalid configuration"
