"""What an arm costs before it runs: ``python -m lm_ablate.cost [overrides]`` prints parameter counts and
training FLOPs per token (formula in :func:`lm_ablate.model.model_cost`) for the config those overrides give."""

from __future__ import annotations

import re
import sys

from lm_ablate.config import Config, ConfigError, compose
from lm_ablate.model import TransformerLM, model_cost


def describe(overrides: list[str], vocab_size: int | None = None) -> str:
    cfg = compose(overrides)
    if vocab_size is None:  # byte level is 256; a BPE vocabulary is what the data config asks for
        vocab_size = 256 if cfg.data.tokenizer == "byte" else cfg.data.vocab_size
    cost = model_cost(TransformerLM(cfg, vocab_size), cfg)
    tokens = cfg.train.max_steps * cfg.train.batch_size * cfg.model.context
    arm = " ".join(overrides) or "(defaults)"
    return "\n".join(
        [
            f"config            {arm}",
            f"vocab size        {vocab_size:,}",
            f"params total      {cost.params_total:,}",
            f"params embedding  {cost.params_embedding:,}",
            f"params non-emb.   {cost.params_non_embedding:,}",
            f"FLOPs/token       {cost.flops_per_token:,.0f}  (6N + 12*L*H*hd*T, PaLM app. B)",
            f"run FLOPs         {cost.flops_per_token * tokens:.3e}  ({tokens:,} tokens)",
        ]
    )


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
        return f"{key}={'null' if cause.value is None else repr(cause.value)} is invalid: {why}"
    return _first(str(err))


def _first(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "invalid configuration"


if __name__ == "__main__":
    try:
        print(describe(sys.argv[1:]))
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # Hydra's composition errors as one line; anything else is a bug: full traceback
        line = compose_error_message(err)
        if line is None:
            raise
        print(f"lm-ablate: error: {line}", file=sys.stderr)
        sys.exit(2)
