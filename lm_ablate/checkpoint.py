"""Checkpoints that make a resumed run bit-identical to an uninterrupted one (on CPU).

A checkpoint holds everything the next step depends on: model and optimizer state, the step (which is also
the data position: batches are a pure function of (seed, step)), every RNG state (python, numpy, torch CPU
and CUDA: dropout draws from them), the spike detectors, the throughput meter and the running summary.
Files are written to a temporary name and renamed, so a kill leaves either the old or the new checkpoint,
never half of one; the last ``keep`` are kept. Loading uses ``torch.load(weights_only=True)``: a checkpoint
cannot run code.

Two layouts, one per kind of run (``train.parallel``, lm_ablate/sharding.py):

    checkpoints/step_00000040.pt     one process or DDP: one file, written by rank 0 (``torch.save``)
    checkpoints/step_00000040/       fsdp / hsdp: a folder, written by every rank (lm_ablate/dcp.py)
        .metadata, __<r>_0.distcp      Distributed Checkpoint (DCP) of the model and the optimizer, each rank its
                                       shards; DCP reads it back on any number of ranks (resharding)
        rank_00000.pt, ...             each rank's RNG states
        state.pt                       rank 0: config, step, detectors, meter, progress, summary, and the manifest
                                       (size and CRC-32 of every other file), written last

A folder is written as ``.step_00000040.partial`` and renamed once complete. Before anything is loaded (and
before the run writes anything) :func:`load` checks it: the manifest (a corrupt or missing shard is one line),
DCP's ``.metadata`` read by an unpickler that admits only DCP's own metadata classes (DCP itself reads it with
``pickle``), and every non-tensor item through ``torch.load(weights_only=True)`` (DCP loads them with
``weights_only=False``), so a folder checkpoint cannot run code either.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import shutil
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lm_ablate.errors import ConfigError

FORMAT = 1
DIR_NAME = "checkpoints"
_NAME = re.compile(r"^step_(\d{8})(\.pt)?$")  # a file (one process, DDP) or a folder (fsdp, hsdp)
STATE_FILE = "state.pt"  # a folder checkpoint's own state and manifest (rank 0)
PARTIAL = ".partial"  # suffix of a folder checkpoint being written

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
    # how the ranks share the work: the same math (tests/test_fsdp.py); a checkpoint of either layout resumes
    # under each, on another number of ranks too
    "train.parallel",
    "train.shard_size",
    "train.activation_checkpointing",
    "train.ac_every",
    "train.async_checkpoint",
)


# keys a run sets from what it loads (model.vocab_size: its tokenizer's). A record written before such a key
# existed lacks it and agrees with whatever the run derives now.
DERIVED = ("model.vocab_size",)


class CheckpointError(ConfigError):
    """An unusable checkpoint or a resume that would mix two different runs; one line."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / DIR_NAME


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first: files (one process, DDP) and folders (fsdp, hsdp)."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if (m := _NAME.match(p.name)) and (p.is_dir() == (m.group(2) is None))]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint (file or folder) was written at."""
    return int(_NAME.match(Path(path).name).group(1))


def is_folder_checkpoint(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / STATE_FILE).is_file()


def remove_checkpoint(path: Path) -> None:
    if Path(path).is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (files and folders alike)."""
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        remove_checkpoint(old)


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
    prune(run_dir, keep)
    return path


ALLOWED = "allowed: auto, never, or a checkpoint file (or run directory) written by lm-ablate"


def _unreadable(err: Exception) -> str:
    """Why torch.load refused a file, in a few words. torch's own text is long, multi-line, has terminal colour
    codes and suggests ``weights_only=False``, which is exactly what must not be done with an unknown file."""
    text = str(err)
    if "Weights only load failed" in text:
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", text)
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


def load(path: Path, dist: Any = None) -> dict[str, Any]:
    """torch.load(weights_only=True): tensors and plain containers only, no code runs. A folder checkpoint is
    checked first (:func:`load_folder`); ``dist`` (lm_ablate.distributed.Dist) shares that work among the ranks."""
    if Path(path).is_dir():
        return load_folder(Path(path), dist)
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
    if path.is_dir() and (is_folder_checkpoint(path) or _NAME.match(path.name)):
        return path  # a folder checkpoint itself (load says what is wrong with it, if anything)
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


# --- folder checkpoints (fsdp / hsdp): the checks before anything is loaded -----------------------------------


def _refused(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"train.resume={str(path)!r} is invalid: {why}; {ALLOWED}")


def crc32(path: Path, chunk: int = 1 << 24) -> int:
    value = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            value = zlib.crc32(block, value)
    return value


def manifest(folder: Path, names: list[str]) -> dict[str, list[int]]:
    """name -> [size, CRC-32] of each of ``names`` in ``folder``."""
    return {name: [(folder / name).stat().st_size, crc32(folder / name)] for name in names}


def _weights_only(folder: Path, what: str, path: Path, data: bytes | None = None) -> Any:
    """``path`` (or ``data``, a slice of it) loaded with torch.load(weights_only=True); one line naming
    ``folder`` if it is not plain data."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data) if data is not None else path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise _refused(folder, f"unreadable {what}: {_unreadable(err)}") from None


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` is a pickle; this admits only the globals such a file names (DCP's metadata classes,
    torch dtypes and sizes, paths), so reading it cannot run code."""

    ALLOWED = {
        "torch.distributed.checkpoint.metadata": {
            "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
            "ChunkStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
        },
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "torch": {"Size"},
        "collections": {"OrderedDict"},
        "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    }  # fmt: skip

    def find_class(self, module: str, name: str) -> Any:
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if not (is_dtype or name in self.ALLOWED.get(module, ())):
            raise pickle.UnpicklingError(f"{module}.{name}")
        return super().find_class(module, name)


def read_dcp_metadata(folder: Path) -> Any:
    """DCP's metadata of a folder checkpoint, read without running code (:class:`_MetadataUnpickler`)."""
    import torch.distributed.checkpoint.filesystem
    import torch.distributed.checkpoint.metadata  # noqa: F401

    try:
        with open(folder / ".metadata", "rb") as f:
            return _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as err:
        raise _refused(folder, f"its DCP .metadata would import {err} while unpickling (loading refused: it "
                       "could run code)") from None  # fmt: skip
    except Exception as err:
        raise _refused(folder, f"unreadable DCP .metadata ({type(err).__name__}: {str(err)[:120]})") from None


def check_dcp_items(folder: Path, metadata: Any) -> None:
    """Every file DCP would read is a plain name in the folder, untransformed, and every non-tensor item loads
    with ``torch.load(weights_only=True)``."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    for index, info in metadata.storage_data.items():
        name = str(info.relative_path)
        if Path(name).name != name or name.startswith("."):
            raise _refused(folder, f"its DCP metadata points outside the folder ({name!r})")
        if getattr(info, "transform_descriptors", None):
            raise _refused(folder, f"{name}: written with DCP transforms {list(info.transform_descriptors)}, "
                           "which lm-ablate does not write")  # fmt: skip
        if isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            with open(folder / name, "rb") as f:
                f.seek(info.offset)
                _weights_only(folder, f"item {index.fqn} of {name}", folder / name, f.read(info.length))


def load_folder(folder: Path, dist: Any = None) -> dict[str, Any]:
    """A folder checkpoint's state (as :func:`load` returns a file's, without the model and optimizer, which
    lm_ablate/dcp.py loads into the sharded model) with this rank's RNG states and ``"dcp"``: the folder.
    Checked first: the manifest's sizes everywhere, the CRC-32s split among the ranks (``dist``), the metadata
    and the non-tensor items; any damage is one line, on every rank."""
    state_path = folder / STATE_FILE
    if not state_path.is_file():
        raise _refused(folder, f"not a checkpoint: no {STATE_FILE} in this folder")
    state = _weights_only(folder, STATE_FILE, state_path)
    if not isinstance(state, dict) or state.get("format") != FORMAT or "sharded" not in state:
        raise _refused(folder, f"not an lm-ablate folder checkpoint of format {FORMAT}")
    files: dict[str, list[int]] = state["sharded"]["files"]
    rank, world = (dist.rank, dist.world) if dist is not None else (0, 1)
    problem = None
    for name, (size, _) in sorted(files.items()):
        if not (folder / name).is_file():
            problem = f"damaged checkpoint: {name} is missing"
        elif (folder / name).stat().st_size != size:
            problem = f"damaged checkpoint: {name} has {(folder / name).stat().st_size} bytes, written with {size}"
        if problem:
            break
    if problem is None:
        for name, (_, crc) in sorted(files.items())[rank::world]:
            if crc32(folder / name) != crc:
                problem = f"damaged checkpoint: {name} does not match its CRC-32 (corrupt shard)"
                break
    if dist is not None:
        problem = next((p for p in dist.gather(problem) if p), None)
    if problem:
        raise _refused(folder, problem)
    metadata = read_dcp_metadata(folder)
    missing = sorted({str(i.relative_path) for i in metadata.storage_data.values()} - set(files))
    if missing:
        raise _refused(folder, f"damaged checkpoint: DCP reads {missing[0]}, which its manifest does not list")
    check_dcp_items(folder, metadata)
    own = folder / rank_file(rank)
    state["rng"] = _weights_only(folder, "RNG state", own if own.is_file() else folder / rank_file(0))
    state["dcp"] = str(folder)
    return state


def rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.pt"
