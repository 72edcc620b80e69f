"""Data parallelism under ``torchrun``: the same loop on every rank, gloo on CPU, NCCL on CUDA.

Every rank draws the same global batch (batches are a pure function of (seed, step)) and trains on its own
contiguous slice; the ranks average the gradients (DDP's all-reduce, or FSDP2's reduce-scatter:
lm_ablate/sharding.py decides which, ``train.parallel``), so with equal slices the update equals the one-process
update on the whole batch (up to float summation order). Only rank 0 logs and writes the run record; rank 0 writes
the checkpoints, except under fsdp/hsdp where every rank writes its shards (lm_ablate/dcp.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the global batch (contiguous, equal sizes)."""
        if not self.active:
            return batch
        rows = batch.shape[0] // self.world
        return batch[self.rank * rows : (self.rank + 1) * rows]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        if self.active:
            value = value.detach().clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.world
        return value

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank if it is true on any (e.g. a stop request that only one rank received)."""
        if not self.active:
            return flag
        t = torch.tensor([float(flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj) -> list:
        """Every rank's value of a picklable object, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def broadcast(self, obj):
        """Rank 0's value of a picklable object on every rank (e.g. the run directory)."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.barrier()  # without it a rank can tear the group down while another still uses it (gloo)
            dist.destroy_process_group()


def shard_degree(parallel: str, shard_size: int | None, world: int) -> int:
    """How many ranks one copy of the model is sharded over: fsdp all of them, hsdp ``train.shard_size`` (else
    LOCAL_WORLD_SIZE, the ranks of one node, as torchrun sets it), ddp and one process 1."""
    if world <= 1 or parallel == "ddp":
        return 1
    if parallel == "hsdp":
        return shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return world


def init_distributed(device: torch.device, cpu_collectives: bool = False) -> tuple[Dist, torch.device]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK); one process otherwise.
    ``cpu_collectives`` on CUDA: gloo for CPU tensors next to NCCL (DCP's async save needs it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "gloo"
        if device.type == "cuda":
            backend = "cpu:gloo,cuda:nccl" if cpu_collectives else "nccl"
        dist.init_process_group(backend=backend)
    return Dist(rank, world, local_rank), device
