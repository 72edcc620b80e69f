"""Checkpoints that make a resumed run bit-identical to an uninterrupted one (on CPU).

A checkpoint holds everything the next step depends on: model and optimizer state, the step (which is also
the data position: batches are a pure function of (seed, step)), every RNG state (python, numpy, torch CPU
and CUDA: dropout draws from them), the spike detectors, the throughput meter and the running summary.
Files are written to a temporary name and renamed, so a kill leaves either the old or the new checkpoint,
never half of one; the last ``keep`` are kept. Loading uses ``torch.load(weights_only=True)``: a checkpoint
cannot run code.
"""

from __future__ import annotations

import os
import random
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lm_ablate.errors import ConfigError

FORMAT = 1
DIR_NAME = "checkpoints"
_NAME = re.compile(r"^step_(\d{8})\.pt$")

# config sections that may differ between the interrupted and the resumed run (they do not change the math).
# Not the budgets: train.max_steps / max_tokens / max_time_s set the LR schedule's horizon, and two horizons
# spliced into one run would be two schedules.
RESUME_MAY_DIFFER = (
    "tracking",
    "train.progress",
    "train.device",
    "train.threads",
    "train.resume",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "data.cache_dir",
    "data.num_proc",
    "choices.debug",
    "study",
    "claims",
    "ladder.fit",  # which scaling fit the report's claims use: analysis only
)


# keys a run sets from what it loads (model.vocab_size: its tokenizer's). A record written before such a key
# existed lacks it and agrees with whatever the run derives now.
DERIVED = ("model.vocab_size",)


class CheckpointError(ConfigError):
    """An unusable checkpoint or a resume that would mix two different runs; one line."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / DIR_NAME


def list_checkpoints(run_dir: Path) -> list[Path]:
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name))


def rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),  # plain types only
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_to_tuple(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_tuple(x: Any) -> Any:
    """weights_only loading turns tuples into lists; the RNG setters want the original tuples back."""
    return tuple(_to_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def save(run_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:08d}.pt"
    tmp = folder / f".{path.name}.tmp{os.getpid()}"
    torch.save({"format": FORMAT, "step": step, **state}, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


ALLOWED = "allowed: auto, never, or a checkpoint file (or run directory) written by lm-ablate"


def _unreadable(err: Exception) -> str:
    """Why torch.load refused a file, in a few words. torch's own text is long, multi-line, has terminal colour
    codes and suggests ``weights_only=False``, which is exactly what must not be done with an unknown file."""
    text = str(err)
    if "Weights only load failed" in text:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        if found:
            return (
                f"it would import {found.group(1)} while unpickling, and a checkpoint may hold only tensors and "
                "plain containers (loading refused: it could run code)"
            )
        return "not a torch checkpoint of tensors and plain containers (corrupt, or not written by torch.save)"
    if isinstance(err, (EOFError, RuntimeError)) or "zip archive" in text:
        first = re.sub(r"\x1b\[[0-9;]*m", "", text).strip().split(". ")[0].splitlines()
        return f"truncated or corrupt file ({first[0][:160] if first else 'it ends early'})"
    return f"{type(err).__name__}: {' '.join(text.split())[:160]}"


def load(path: Path) -> dict[str, Any]:
    """torch.load(weights_only=True): tensors and plain containers only, no code runs."""
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": noise before our one-line error
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated file, wrong format, unpickling refused
        raise CheckpointError(
            f"train.resume={str(path)!r} is invalid: unreadable checkpoint: {_unreadable(err)}; {ALLOWED}"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"train.resume={str(path)!r} is invalid: not an lm-ablate checkpoint of format {FORMAT}; {ALLOWED}"
        )
    return state


def flat_config(cfg: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, name + "."))
        else:
            out[name] = value
    return out


def schema_defaults() -> dict[str, Any]:
    """Every key of the config schema with its default, flat (``model.parametrization: "sp"``, ...)."""
    from omegaconf import OmegaConf

    from lm_ablate.schema import Config

    return flat_config(OmegaConf.to_container(OmegaConf.structured(Config), resolve=False))


def config_differences(saved: dict, current: dict) -> list[str]:
    """Keys whose values differ between two resolved configs, ignoring the keys that may change on resume. A key
    one of them lacks (a checkpoint written before the schema gained it) counts as the schema's default, so an
    older run resumes when the new key is at its default: adding a key changes no old run's meaning (a DERIVED
    key it lacks takes the other side's value)."""
    a, b = flat_config(saved), flat_config(current)
    defaults = schema_defaults()
    for k in DERIVED:  # lacking on one side: that side agrees with the other
        if k not in a or k not in b:
            a[k] = b[k] = a.get(k, b.get(k))
    from lm_ablate.options import unread

    # a key the current options do not read changes nothing: null now, a value in a record written before
    # options owned their keys (lm_ablate/options.py)
    ignored = {item.key for item in unread(current)}
    keys = sorted((set(a) | set(b)) - ignored)
    value = lambda side, k: side[k] if k in side else defaults.get(k)
    return [k for k in keys if value(a, k) != value(b, k) and not k.startswith(RESUME_MAY_DIFFER)]


def describe_differences(saved: dict, current: dict, keys: list[str], limit: int = 3) -> str:
    """``key: old -> new`` for the first ``limit`` differing keys, for one-line errors."""
    a, b = flat_config(saved), flat_config(current)
    shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:limit])
    return shown + (f", and {len(keys) - limit} more" if len(keys) > limit else "")


def find_resume(run_dir: Path, resume: str) -> Path | None:
    """Which checkpoint to continue from: ``auto`` = the newest in the run dir (None if there is none),
    ``never`` = none, anything else = a checkpoint file or a run directory holding checkpoints."""
    if resume == "never":
        return None
    if resume == "auto":
        found = list_checkpoints(run_dir)
        return found[-1] if found else None
    path = Path(resume).expanduser()
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise CheckpointError(f"train.resume={resume!r} is invalid: no checkpoint in that directory")
        return found[-1]
    if not path.is_file():
        raise CheckpointError(
            f"train.resume={resume!r} is invalid: no such file (allowed: auto, never, a checkpoint path)"
        )
    return path
