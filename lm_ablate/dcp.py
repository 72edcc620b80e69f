"""Folder checkpoints of fsdp / hsdp runs with torch's Distributed Checkpoint (DCP), and loading either layout
into a model of any layout (the folder's layout and the checks before loading: lm_ablate/checkpoint.py).

    save      ``get_state_dict(model, optimizers)`` (torch.distributed.checkpoint.state_dict: parameter names as
              keys, each rank's shards), ``dcp.save`` of {"model", "optim"} into ``.step_N.partial/``: every rank
              writes its own file; each rank's RNG states beside it; then rank 0 writes ``state.pt`` (the loop's
              state and the manifest of sizes and CRC-32s, computed by the ranks in turn) and renames the folder
              ``step_N``: a kill leaves the previous checkpoint or this one, never half of one
    async     with train.async_checkpoint: ``dcp.async_save`` copies the state to CPU memory and returns; a thread
              writes the files while training goes on, its collectives on a gloo group of their own (on the
              training group they would interleave with FSDP's: gloo fails on the mismatch). At most one is in
              flight: the next checkpoint, and the run's end, first wait for it and finish it (manifest, rename,
              retention). A kill before that leaves the previous checkpoint as the newest.
    load      a folder: ``dcp.load`` into ``get_state_dict`` of the model as it is now (sharded or whole, any
              number of ranks: DCP reshards), then ``set_state_dict``; a file (one process, DDP) into a sharded
              model: ``set_state_dict(..., full_state_dict=True)``, each rank keeping its shards of the whole
              tensors, the optimizer's state keyed by parameter name (the loop's groups carry the names).

Optimizer state before the first step is empty; ``get_state_dict`` fills it (one step with zero gradients at
learning rate 0, torch's ``_init_optim_state``) so that DCP has tensors to load into; the loaded values replace
it. Retention (``train.keep_checkpoints``) counts files and folders alike.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lm_ablate import checkpoint as ckpt
from lm_ablate.distributed import Dist

_WRAPPED = "_checkpoint_wrapped_module."  # torch's checkpoint_wrapper prefix (state dicts and DCP strip it)
# torch/distributed/checkpoint/state_dict_loader.py (torch 2.13) warns on every load without a process group
SINGLE_PROCESS_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"


def optimizers_of(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers of the loop's optimizer (lm_ablate.optim.Combined holds several)."""
    parts = getattr(optimizer, "parts", None)
    return list(parts.values()) if parts is not None else [optimizer]


def _fqn(name: str) -> str:
    return name.replace(_WRAPPED, "")


def named_optimizer_state(optimizer: Any, saved: dict) -> dict:
    """A file checkpoint's optimizer state (``torch.optim`` layout: parameters by position; lm_ablate.optim.Combined:
    {part: that}) in the layout of ``get_state_dict``: parameters by name, every part in one dict."""
    layouts = [saved[name] for name in optimizer.parts] if hasattr(optimizer, "parts") else [saved]
    out: dict[str, Any] = {"state": {}, "param_groups": []}
    for layout in layouts:
        groups = layout["param_groups"]
        if any("param_names" not in g for g in groups):
            raise ckpt.CheckpointError("train.resume is invalid: the checkpoint's optimizer groups have no "
                                       "parameter names (written by another program)")  # fmt: skip
        names = {i: _fqn(n) for g in groups for i, n in zip(g["params"], g["param_names"])}
        out["state"].update({names[i]: value for i, value in layout["state"].items()})
        out["param_groups"] += [dict(g, params=[_fqn(n) for n in g["param_names"]]) for g in groups]
    return out


def load_whole_into(model: nn.Module, optimizer: Any, model_state: dict, optimizer_state: dict) -> None:
    """Whole tensors (a file checkpoint, on every rank) into a sharded model and its optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    named = named_optimizer_state(optimizer, optimizer_state)
    model_state = {_fqn(k): v for k, v in model_state.items()}
    set_state_dict(model, optimizers_of(optimizer), model_state_dict=model_state, optim_state_dict=named,
                   options=StateDictOptions(full_state_dict=True))  # fmt: skip


def load_into(model: nn.Module, optimizer: Any, folder: str | Path) -> None:
    """A folder checkpoint into ``model`` and its optimizer as they are (sharded or not, on any number of ranks)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    parts = optimizers_of(optimizer)
    model_state, optim_state = get_state_dict(model, parts)
    one_process = not (torch.distributed.is_available() and torch.distributed.is_initialized())  # DCP reshards
    try:
        with warnings.catch_warnings():
            if one_process:  # dcp.load warns "torch.distributed is disabled ... assuming ... a single process" even
                # when told so (no_dist=True): that is the intent here, not a problem to report
                warnings.filterwarnings("ignore", SINGLE_PROCESS_WARNING, UserWarning)
            dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder), no_dist=one_process)
    except Exception as err:  # DCP gathers every rank's failure into one long report
        lines = str(err).splitlines() or [type(err).__name__]
        first = re.sub(r"\s+", " ", next((line for line in lines if "Error" in line), lines[0]))[:200]
        raise ckpt.CheckpointError(
            f"train.resume={str(folder)!r} is invalid: DCP could not load it ({first})"
        ) from None
    set_state_dict(model, parts, model_state_dict=model_state, optim_state_dict=optim_state)


@dataclass
class _Pending:
    """A folder checkpoint whose files are (being) written, to be finished (manifest, rename, retention)."""

    future: Any  # DCP's future (async), or None once written
    partial: Path
    final: Path
    state: dict  # rank 0: the loop's state for state.pt
    run_dir: Path
    keep: int


class Checkpointer:
    """Writes the folder checkpoints of one run (module docstring); every rank calls the same methods."""

    def __init__(self, dist: Dist, parallel: str, asynchronous: bool = False):
        self.dist, self.parallel, self.asynchronous = dist, parallel, asynchronous
        self.pending: _Pending | None = None
        self.group = None  # async: the background writer's own process group (every rank makes it, at once)
        if asynchronous and dist.active:
            import torch.distributed

            self.group = torch.distributed.new_group(backend="gloo")

    def save(self, run_dir: Path, step: int, model: nn.Module, optimizer: Any, state: dict, keep: int) -> None:
        """``state``: this rank's RNG under "rng", and (rank 0) everything else the loop saves."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()
        folder = ckpt.checkpoint_dir(run_dir)
        partial = folder / f".step_{step:08d}{ckpt.PARTIAL}"
        if self.dist.main:
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob(f".step_*{ckpt.PARTIAL}"):  # left by a killed run (none is in flight now)
                shutil.rmtree(stale, ignore_errors=True)
            partial.mkdir()
        self.dist.barrier()
        model_state, optim_state = get_state_dict(model, optimizers_of(optimizer))
        content = {"model": model_state, "optim": optim_state}
        if self.asynchronous:
            future = dcp.async_save(content, checkpoint_id=str(partial), process_group=self.group)
        else:
            dcp.save(content, checkpoint_id=str(partial))
            future = None
        rng_path = partial / ckpt.rank_file(self.dist.rank)
        torch.save(state["rng"], rng_path)
        _fsync(rng_path)
        rest = {k: v for k, v in state.items() if k != "rng"}
        self.pending = _Pending(future, partial, folder / f"step_{step:08d}", rest, Path(run_dir), keep)
        if not self.asynchronous:
            self.wait()

    def wait(self) -> None:
        """Finish the checkpoint in flight, if any: its files written on every rank, the manifest (each rank
        sums its share of the files), state.pt and the rename by rank 0, retention."""
        p, self.pending = self.pending, None
        if p is None:
            return
        if p.future is not None:
            p.future.result()
        self.dist.barrier()
        names = sorted(n for n in os.listdir(p.partial) if n != ckpt.STATE_FILE)
        files: dict[str, list[int]] = {}
        for part in self.dist.gather(ckpt.manifest(p.partial, names[self.dist.rank :: self.dist.world])):
            files.update(part)
        if self.dist.main:
            sharded = {"world": self.dist.world, "parallel": self.parallel, "files": files}
            state_path = p.partial / ckpt.STATE_FILE
            torch.save({"format": ckpt.FORMAT, "step": ckpt.checkpoint_step(p.final), "sharded": sharded,
                        **p.state}, state_path)  # fmt: skip
            _fsync(state_path)
            os.replace(p.partial, p.final)
            _fsync(p.final.parent)
            ckpt.prune(p.run_dir, p.keep)
        self.dist.barrier()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
