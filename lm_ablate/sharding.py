"""How the ranks under torchrun share a run (``train.parallel``), activation checkpointing
(``train.activation_checkpointing``), and the parts of a step that must see every shard. All of it is torch's:

    ddp    torch.nn.parallel.DistributedDataParallel: every rank holds the whole model, gradients are all-reduced
    fsdp   FSDP2 (``torch.distributed.fsdp.fully_shard``) on each block, then on the root, over a 1-D mesh of all
           ranks: parameters, gradients and optimizer state are sharded (each rank 1/world), a block's parameters
           are all-gathered for its forward and backward, its gradients reduce-scattered
    hsdp   the same over a 2-D mesh (``init_device_mesh``, dims ``replicate`` x ``shard``): sharded within
           ``train.shard_size`` ranks (default LOCAL_WORLD_SIZE, one node), replicated across
    one process: none of them (a train.parallel other than ddp says so once)

Under fsdp/hsdp, as in torchtitan and OLMo-core:

* mixed precision on CUDA is FSDP2's policy (``MixedPrecisionPolicy``: bf16 parameters for compute, gradients
  reduced in fp32) instead of autocast; on CPU everything stays fp32;
* ``train.compile`` compiles each block (:func:`lm_ablate.perf.compile_blocks`), not the whole step;
* gradient clipping and the grad-norm metric are global: ``get_total_norm`` over the sharded (DTensor) gradients,
  its ``full_tensor()``, then ``clip_grads_with_norm_`` (torchtitan's way); the per-layer probe norms likewise;
* gradient accumulation: gradients are reduce-scattered after each micro-batch (sharded sums, as OLMo-core),
  parameters are not resharded after a micro-batch's backward but the last (``set_reshard_after_backward``), so the
  next forward needs no all-gather; hsdp all-reduces across replicas on the last micro-batch only;
* every rank probes (its side of the collectives), rank 0 logs; evaluation runs on every rank;
* checkpoints are DCP folders written by every rank (lm_ablate/dcp.py); a file checkpoint (one process, DDP)
  loads into the shards and a folder loads into a one-process or DDP run: the layouts and world sizes mix.

Activation checkpointing wraps blocks in torch's ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``,
RNG state preserved, so dropout masks are the same when recomputed): ``full`` every block, ``selective`` block i iff
(i + 1) % ``train.ac_every`` == 0. It is applied before compile and sharding (torchtitan's order). Names of
parameters gain ``_checkpoint_wrapped_module.`` (state dicts and DCP strip it).

Optimizers on sharded parameters: AdamW and SGD are elementwise (exact up to float order). torch's Muon runs its
Newton-Schulz iteration on the DTensor, whose matmuls DTensor computes globally (all-gathers and partial sums), so
it orthogonalizes the whole matrix as one process does, in bf16 with partial sums added in another order
(tests/test_fsdp.py states the tolerance). torch's Adafactor does not run on DTensors (an in-place pow_ on a partial
norm, torch 2.13): refused in one line (:data:`UNSHARDABLE`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from lm_ablate import metrics as M
from lm_ablate.distributed import Dist, shard_degree
from lm_ablate.errors import bad
from lm_ablate.perf import compile_blocks, compile_step
from lm_ablate.probes import StepProbe
from lm_ablate.registry import Registry

PARALLEL: Registry = Registry("train.parallel")
CHECKPOINTING: Registry = Registry("train.activation_checkpointing")

# optimizers that cannot update sharded (DTensor) parameters, and why (validation refuses them under fsdp/hsdp)
UNSHARDABLE = {
    "adafactor": "torch.optim.Adafactor does not run on FSDP2's sharded (DTensor) parameters (an in-place pow_ on "
    "a partial norm in torch 2.13); use train.parallel=ddp, or optim=adamw, muon or sgd",
}


# --- activation checkpointing -----------------------------------------------------------------------------
@CHECKPOINTING.register("none")
def no_blocks(t: Any, n_layers: int) -> list[int]:
    return []


@CHECKPOINTING.register("full")
def every_block(t: Any, n_layers: int) -> list[int]:
    return list(range(n_layers))


@CHECKPOINTING.register("selective", reads=("ac_every",))
def every_kth_block(t: Any, n_layers: int) -> list[int]:
    """Block i iff (i + 1) % ac_every == 0 (torchtitan's selective layer policy): the k-th, 2k-th, ... block."""
    return [i for i in range(n_layers) if (i + 1) % t.ac_every == 0]


def checkpointable(block_class: type) -> bool:
    """Whether a block kind (``BLOCKS`` entry) can be recomputed in backward: any whose forward is a function of
    its inputs, parameters and the RNG; a kind that is not sets ``checkpointable = False`` (and says why in
    ``checkpoint_refusal``)."""
    return getattr(block_class, "checkpointable", True)


def apply_activation_checkpointing(model: nn.Module, t: Any) -> list[int]:
    """Wrap the blocks train.activation_checkpointing names in torch's checkpoint_wrapper; returns their indices."""
    chosen = CHECKPOINTING.get(t.activation_checkpointing)(t, len(model.blocks))
    if chosen:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i in chosen:
            model.blocks[i] = checkpoint_wrapper(model.blocks[i], preserve_rng_state=True)
    return chosen


# --- global norms over shards -----------------------------------------------------------------------------
def total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``tensors`` together, global over shards: a DTensor's norm is completed with
    ``full_tensor()`` (its partial sums reduced), a plain tensor's is its own."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.get_total_norm(tensors, norm_type=2.0)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_sharded(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Pre-clip global gradient norm; gradients scaled to at most ``max_norm`` (torch's own clip functions)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = total_norm([p.grad for p in params])
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


@torch.no_grad()
def sharded_grad_stats(model: nn.Module) -> dict[str, float]:
    """lm_ablate.probes.grad_stats for sharded blocks: each block's gradient and parameter L2 norm, global."""
    stats: dict[str, float] = {}
    for i, block in enumerate(model.blocks):
        params = list(block.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            stats[M.layer_metric(i, M.GRAD_NORM_LAYER)] = total_norm(grads).item()
        stats[M.layer_metric(i, M.PARAM_NORM)] = total_norm([p.detach() for p in params]).item()
    return stats


class ShardedProbe(StepProbe):
    """The probes of one step when the blocks are sharded: run on every rank (the side pass and the norms are
    collectives); the side pass of a compiled run runs the compiled blocks eagerly (``set_stance``), so probing
    recompiles nothing."""

    def watch(self, x: torch.Tensor, autocast) -> contextlib.AbstractContextManager:
        if not self.side_pass:
            return super().watch(x, autocast)
        with torch.compiler.set_stance("force_eager"):
            return super().watch(x, autocast)

    def after_backward(self) -> None:
        self.stats.update(sharded_grad_stats(self.model))


# --- the strategies ---------------------------------------------------------------------------------------
class OneProcess:
    """One process: the model as built (activation checkpointing aside); bf16 autocast on CUDA."""

    name = "one process"
    sharded = False

    def __init__(self, cfg: Any, dist: Dist, device: torch.device):
        self.cfg, self.dist, self.device = cfg, dist, device

    def autocast(self) -> Callable[[], contextlib.AbstractContextManager]:
        if self.device.type == "cuda":
            return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext

    def prepare(self, model: nn.Module) -> nn.Module:
        """Before the optimizer is built: activation checkpointing (and, sharded, per-block compile and FSDP2)."""
        apply_activation_checkpointing(model, self.cfg.train)
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        """What runs the step's forward (after the checkpoint is restored)."""
        return model

    def compile_step(self, fn: Callable) -> Callable:
        """train.compile: the step's forward + loss as one compiled function (lm_ablate/perf.py)."""
        return compile_step(fn)

    def accumulating(self, step_model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """Context of one micro-batch's forward and backward (``last``: the step's last micro-batch)."""
        return nullcontext()

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def probes_here(self) -> bool:
        """Whether this rank runs the probes of a probe step (rank 0; every rank when sharded)."""
        return self.dist.main

    def probe(self, model: nn.Module, side_pass: bool) -> StepProbe:
        return StepProbe(model, side_pass=side_pass)

    def save_checkpoint(self, run_dir, step: int, model: nn.Module, optimizer: Any, state: dict, keep: int) -> None:
        """Rank 0 writes one file with everything (lm_ablate/checkpoint.py); the caller calls it on rank 0 only."""
        from lm_ablate import checkpoint as ckpt

        ckpt.save(run_dir, step, {**state, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, keep)

    def restore(self, model: nn.Module, optimizer: Any, saved: dict) -> None:
        """Model and optimizer from a checkpoint of either layout (a folder: DCP reads its shards whole)."""
        if "dcp" in saved:
            from lm_ablate import dcp

            dcp.load_into(model, optimizer, saved["dcp"])
        else:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])

    def close(self, finished: bool = True) -> None:
        """At the run's end: nothing to wait for (see :class:`FSDP`)."""


@PARALLEL.register("ddp")
class DDP(OneProcess):
    """Every rank holds the whole model; DDP all-reduces the gradients (no_sync on all micro-batches but the
    last)."""

    name = "ddp"

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    def accumulating(self, step_model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        return nullcontext() if last else step_model.no_sync()


@PARALLEL.register("fsdp")
class FSDP(OneProcess):
    """FSDP2 over all ranks (module docstring)."""

    name = "fsdp"
    sharded = True

    def __init__(self, cfg: Any, dist: Dist, device: torch.device):
        super().__init__(cfg, dist, device)
        self.mesh = self.build_mesh()
        self.checkpointer = None

    def build_mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.dist.world,), mesh_dim_names=("shard",))

    def autocast(self) -> Callable[[], contextlib.AbstractContextManager]:
        return nullcontext  # mixed precision is FSDP2's policy (prepare)

    def prepare(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        apply_activation_checkpointing(model, self.cfg.train)
        if self.cfg.train.compile:
            compile_blocks(model)
        policy = MixedPrecisionPolicy()
        if self.device.type == "cuda":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=self.mesh, mp_policy=policy)
        fully_shard(model, mesh=self.mesh, mp_policy=policy)  # the rest: embeddings, positions, final norm, head
        return model

    def compile_step(self, fn: Callable) -> Callable:
        return fn  # the blocks are compiled (prepare)

    @contextlib.contextmanager
    def accumulating(self, step_model: nn.Module, last: bool) -> Iterator[None]:
        step_model.set_is_last_backward(last)
        step_model.set_reshard_after_backward(last)
        yield

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        return clip_sharded(model, max_norm)

    def probes_here(self) -> bool:
        return True

    def probe(self, model: nn.Module, side_pass: bool) -> StepProbe:
        return ShardedProbe(model, side_pass=side_pass)

    def save_checkpoint(self, run_dir, step: int, model: nn.Module, optimizer: Any, state: dict, keep: int) -> None:
        """Every rank writes its shards (DCP), in the background with train.async_checkpoint (lm_ablate/dcp.py)."""
        from lm_ablate import dcp

        if self.checkpointer is None:
            self.checkpointer = dcp.Checkpointer(self.dist, self.name, asynchronous=self.cfg.train.async_checkpoint)
        self.checkpointer.save(run_dir, step, model, optimizer, state, keep)

    def restore(self, model: nn.Module, optimizer: Any, saved: dict) -> None:
        from lm_ablate import dcp

        if "dcp" in saved:
            dcp.load_into(model, optimizer, saved["dcp"])
        else:  # a file checkpoint (one process, DDP): its whole tensors, each rank keeping its shards
            dcp.load_whole_into(model, optimizer, saved["model"], saved["optimizer"])

    def close(self, finished: bool = True) -> None:
        """Waits for a checkpoint still being written in the background (not after a failure: the other ranks
        may not reach the collectives that complete it)."""
        if self.checkpointer is not None and finished:
            self.checkpointer.wait()


@PARALLEL.register("hsdp", reads=("shard_size",))
class HSDP(FSDP):
    """FSDP2 over a 2-D mesh: sharded within train.shard_size ranks, replicated across (module docstring)."""

    name = "hsdp"

    def build_mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        t, world = self.cfg.train, self.dist.world
        shard = shard_degree("hsdp", t.shard_size, world)
        if shard < 1 or world % shard:
            given = "" if t.shard_size is not None else f" (null: LOCAL_WORLD_SIZE={shard})"
            raise bad("train.shard_size", t.shard_size, f"must divide the number of processes ({world}){given}")
        return init_device_mesh(self.device.type, (world // shard, shard), mesh_dim_names=("replicate", "shard"))

    @contextlib.contextmanager
    def accumulating(self, step_model: nn.Module, last: bool) -> Iterator[None]:
        step_model.set_requires_all_reduce(last)  # across replicas: once, after the last micro-batch
        with super().accumulating(step_model, last):
            yield


def plan(cfg: Any, dist: Dist, device: torch.device) -> OneProcess:
    """The strategy of this run (before anything is written: a bad combination is one line). One process ignores
    train.parallel, saying so once when it asked for sharding."""
    t = cfg.train
    if not dist.active:
        if t.async_checkpoint:
            raise bad("train.async_checkpoint", t.async_checkpoint, "needs train.parallel=fsdp or hsdp under "
                      "torchrun with 2 or more processes (DCP folder checkpoints); one process writes one file")  # fmt: skip
        if t.parallel != "ddp":
            print(f"lm-ablate: train.parallel={t.parallel} shards over the processes torchrun starts; this is one "
                  "process, so the model is not sharded (checkpoints are one file)", file=sys.stderr, flush=True)  # fmt: skip
        return OneProcess(cfg, dist, device)
    if t.async_checkpoint:
        if not PARALLEL.get(t.parallel).sharded:
            raise bad("train.async_checkpoint", t.async_checkpoint, f"needs train.parallel=fsdp or hsdp (DCP folder "
                      f"checkpoints); train.parallel={t.parallel} checkpoints are one file written by rank 0")  # fmt: skip
        import torch.distributed.checkpoint as dcp

        if not hasattr(dcp, "async_save"):
            raise bad("train.async_checkpoint", True, f"torch {torch.__version__} has no DCP async_save (2.4+)")
    return PARALLEL.get(t.parallel)(cfg, dist, device)


def check(cfg: Any) -> None:
    """The config-level checks (lm_ablate/validation.py): the options exist, the optimizer can update shards, the
    block kind can be recomputed."""
    t = cfg.train
    PARALLEL.check("train.parallel", t.parallel)
    CHECKPOINTING.check("train.activation_checkpointing", t.activation_checkpointing)
    if t.parallel in ("fsdp", "hsdp") and cfg.optim.name in UNSHARDABLE:
        raise bad("optim.name", cfg.optim.name, f"cannot run under train.parallel={t.parallel}: "
                  + UNSHARDABLE[cfg.optim.name])  # fmt: skip
    budgets = cfg.ladder.get("budgets") if hasattr(cfg.ladder, "get") else getattr(cfg.ladder, "budgets", None)
    if t.parallel in ("fsdp", "hsdp") and budgets is not None and len(budgets) > 1 and cfg.ladder.budget is None:
        raise bad("ladder.budgets", list(budgets), f"branches start from a copy of a one-file checkpoint "
                  f"(lm_ablate/budgets.py); train.parallel={t.parallel} writes folder checkpoints: train each budget "
                  "as its own run (ladder.budget), or use train.parallel=ddp")  # fmt: skip
    if t.activation_checkpointing != "none":
        from lm_ablate.components.blocks import BLOCKS

        kind = BLOCKS.get(cfg.model.block)
        if not checkpointable(kind):
            why = getattr(kind, "checkpoint_refusal", "its forward is not a function of its inputs and the RNG")
            raise bad("train.activation_checkpointing", t.activation_checkpointing,
                      f"model.block={cfg.model.block} cannot be recomputed in backward ({why}); allowed: none")  # fmt: skip
