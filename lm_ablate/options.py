"""Each option's keys are its own: a key that the chosen option does not read cannot be set on its behalf.

Every registry option declares the keys of its node it reads beyond those every option of the axis reads
(``@OPTIMIZERS.register("sgd", reads=("momentum", "nesterov"))``, lm_ablate/registry.py); the ladder's keys are
read only when a ladder is chosen. For a composed config, each such key the chosen option does not read is

    given on the command line or as a sweep parameter   refused in one line, naming the options that read it
                                                        (``optim.momentum=0.9 is invalid: adamw has no
                                                        momentum (muon, sgd)``)
    set by a file (an arch preset, an experiment, ...)  cleared to null: the preset's value is for another
                                                        option (``arch=llama position=alibi`` drops rope's theta)

so the run record holds null for every key the run did not read, and no arm carries a value that changed
nothing. A key the chosen option reads may not be null unless null is its schema default (its documented
"auto" value). The rule for names: where a key would contradict what an option's name says (MQA with two K/V
heads, "none" regularization with weight decay), the key is not the option's (``mha`` and ``mqa`` fix their
K/V heads, gqa reads them) or the option refuses it (:func:`check_identity`); the name always says what is
built.

:func:`settle` applies the rule (called once per run, after every override); :func:`check` is the guard
``validate`` runs on any config (and :func:`check_identity` once the values' domains are checked);
:func:`explicit_keys` reads the keys an override list sets.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lm_ablate.errors import ConfigError, bad

# read only with a ladder (ladder.name set)
LADDER_KEYS = ("rung", "rungs", "tokens_per_param", "lr", "params", "budgets", "budget", "fit")


@dataclass(frozen=True)
class Owner:
    """Keys of ``node`` that only some values of ``selector`` read: ``readers[key]`` = those values."""

    node: str
    selector: str
    readers: dict[str, tuple[Any, ...]]

    def label(self, option: Any) -> str:
        """How an option is named in messages: ``adamw`` for a group, ``optim.schedule=cosine`` for a sub-option."""
        if option is None:
            return f"{self.selector}=null"
        return str(option) if self.selector == f"{self.node}.name" else f"{self.selector}={option}"


@functools.lru_cache(maxsize=1)
def owners() -> tuple[Owner, ...]:
    """Every option-specific key, by the registry (or the ladder) that owns it."""
    from lm_ablate.catalog import load_all
    from lm_ablate.registry import ALL_REGISTRIES

    load_all()
    found = [
        Owner(r.node, r.selector, {k: tuple(v) for k, v in r.owned().items()}) for r in ALL_REGISTRIES if r.owned()
    ]
    found.append(Owner("ladder", "ladder.name", dict.fromkeys(LADDER_KEYS, ("<a ladder>",))))
    return tuple(found)


def _reads(owner: Owner, option: Any, key: str) -> bool:
    if owner.node == "ladder":
        return option is not None
    return option in owner.readers[key]


@dataclass(frozen=True)
class Unread:
    key: str  # dotted
    value: Any
    why: str  # "adamw has no momentum (muon, sgd)"


def unread(cfg: Any) -> Iterator[Unread]:
    """Every option-specific key the chosen options do not read, with its value (null or not)."""
    for owner in owners():
        node = _select(cfg, owner.node)
        if node is None:
            continue
        option = _select(cfg, owner.selector)
        for key, options in owner.readers.items():
            if key not in node or _reads(owner, option, key):
                continue
            # a key two axes own (data.vocab_size: data=tokens and data.tokenizer=bpe) is read if either reads it
            others = [o for o in owners() if o is not owner and o.node == owner.node and key in o.readers]
            if any(_reads(o, _select(cfg, o.selector), key) for o in others):
                continue
            readers = ", ".join(str(o) for o in options)
            also = "".join(f"; {o.selector}: {', '.join(map(str, o.readers[key]))}" for o in others)
            why = f"{owner.label(option)} has no {key} ({readers}{also})"
            if owner.node == "ladder":
                why = "no ladder is chosen (ladder=null); it is read with ladder=<name> (conf/ladder/)"
            yield Unread(f"{owner.node}.{key}", _value(node, key), why)


def reading(key: str) -> list[str]:
    """Overrides under which the dotted ``key`` is read (the first option of each axis that owns it); [] for a
    key every option reads. For tests and messages: ``reading("optim.momentum") == ["optim=muon"]``."""
    node, _, leaf = key.partition(".")
    for owner in owners():
        if owner.node == node and leaf in owner.readers:
            if owner.node == "ladder":
                return ["ladder=cpu"]
            option = owner.readers[leaf][0]
            group = owner.selector == f"{owner.node}.name"
            return [f"{owner.node}={option}" if group else f"{owner.selector}={option}"]
    return []


def settle(cfg: DictConfig, explicit: Iterable[str] = ()) -> None:
    """Clear each key the run's options do not read (module docstring); refuse one that was given explicitly
    (``explicit``: dotted keys set by overrides). Changes ``cfg``. Call once, after every override is applied."""
    given = set(explicit)
    for item in list(unread(cfg)):
        if item.value is None:
            continue
        if item.key in given:
            raise bad(item.key, item.value, item.why)
        OmegaConf.update(cfg, item.key, None, merge=False, force_add=False)
    from lm_ablate.optim import settle_weight_decay  # the timescale derives lambda (lm_ablate/optim.py)

    settle_weight_decay(cfg, given)


def check(cfg: Any) -> None:
    """Refuse a config in which a key its options do not read holds a value, or a key they read is null where
    null means nothing (:func:`settle` leaves neither)."""
    for item in unread(cfg):
        if item.value is not None:
            raise bad(item.key, item.value, item.why)
    defaults = _schema_defaults()
    for owner in owners():
        node = _select(cfg, owner.node)
        option = _select(cfg, owner.selector)
        for key in owner.readers:
            dotted = f"{owner.node}.{key}"
            null = node is not None and _reads(owner, option, key) and _value(node, key, raw=True) is None
            if null and defaults.get(dotted) is not None:  # null is not this key's documented "auto"
                raise bad(dotted, None, f"{owner.label(option)} reads it: give a value (default {defaults[dotted]!r})")


def check_identity(cfg: Any) -> None:
    """Keys that would make an option something its name denies (module docstring). Regularization options are
    recipes of the same four mechanisms; each name says which are on: ``none`` none of them, ``standard``
    decay and clipping (amounts free) without dropout or z-loss, ``dropout`` / ``zloss`` the standard recipe
    plus that one."""
    r = cfg.regularization
    get = lambda key: getattr(r, key)
    rates = {k: get(k) if get(k) is not None else r.dropout for k in DROPOUT_SITES}
    dropout_on = any(v > 0 for v in rates.values())
    if r.name == "none":
        for key in ("dropout", "weight_decay", "grad_clip", "z_loss", *DROPOUT_SITES):
            if get(key):
                raise bad(f"regularization.{key}", get(key), "regularization=none has none: must be 0 (or choose "
                          "standard, dropout, zloss)")  # fmt: skip
    elif r.name != "dropout" and dropout_on:
        key = next(k for k, v in rates.items() if v > 0)
        key = "dropout" if r.dropout > 0 else key
        raise bad(
            f"regularization.{key}", get(key), f"regularization={r.name} has no dropout: use regularization=dropout"
        )
    elif r.name == "dropout" and not dropout_on:
        raise bad("regularization.dropout", r.dropout, "regularization=dropout needs a rate > 0 at some site")
    if r.name != "none" and r.name != "zloss" and r.z_loss:
        raise bad("regularization.z_loss", r.z_loss, f"regularization={r.name} has no z-loss: use regularization=zloss")
    if r.name == "zloss" and not r.z_loss:
        raise bad("regularization.z_loss", r.z_loss, "regularization=zloss needs a coefficient > 0 (PaLM: 1e-4)")


DROPOUT_SITES = ("embedding_dropout", "attention_dropout", "residual_dropout")


def explicit_keys(overrides: Sequence[Any]) -> set[str]:
    """The dotted keys an override list sets (``optim.momentum=0.9``, ``+data.x=1``), not its group choices
    (``optim=sgd``) or deletions. Takes strings or Hydra's parsed ``Override`` objects."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = [o for o in overrides if not isinstance(o, str)]
    lines = [o for o in overrides if isinstance(o, str)]
    if lines:
        parsed += OverridesParser.create().parse_overrides(lines)
    keys = set()
    for o in parsed:
        key = o.key_or_group
        if "." in key and "/" not in key and not o.is_delete():
            keys.add(key.split("@")[0])
    return keys


@functools.lru_cache(maxsize=1)
def _schema_defaults() -> dict[str, Any]:
    from lm_ablate.schema import Config

    out = {}
    for group in dataclasses.fields(Config):
        if dataclasses.is_dataclass(group.default_factory):  # type: ignore[arg-type]
            node = group.default_factory()  # type: ignore[misc]
            for f in dataclasses.fields(node):
                out[f"{group.name}.{f.name}"] = getattr(node, f.name)
    return out


def _select(cfg: Any, dotted: str) -> Any:
    if isinstance(cfg, DictConfig):
        return OmegaConf.select(cfg, dotted, default=None)
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            return None
    return node


def _value(node: Any, key: str, raw: bool = False) -> Any:
    """The value of ``node.key``; unless ``raw``, an empty list (the default of list keys) counts as unset."""
    value = node.get(key) if isinstance(node, (dict, DictConfig)) else getattr(node, key, None)
    return None if not raw and isinstance(value, (list, ListConfig)) and len(value) == 0 else value


__all__ = ["ConfigError", "check", "explicit_keys", "owners", "reading", "settle", "unread"]
