"""Stability signals, cheap enough to leave on (every ``train.probe_every`` steps).

The literature ties training instability to a few growing quantities: attention logits (Dehghani et al.
2023; Wortsman et al. 2023 — the reason for QK-norm), output logits / log Z (PaLM's z-loss), the residual
stream and per-layer gradients (Xiong et al. 2020 for post-LN). At a probe step we measure:

* while the step's own training forward runs (on its first micro-batch; dropout included, as trained):
  the residual-stream RMS after each block, the max pre-softmax attention logit of each layer (from the q
  and k the attention just computed, so it works whatever kernel, SDPA or flash, consumes them), and the
  output logits' max |logit| and mean log Z. Observers only read detached tensors under no_grad and draw no
  random numbers, so probes on or off give the same training curve; the extra work is one q.k^T per layer
  (no second forward pass: bench/overhead.py);
* after backward, before clipping: each block's gradient norm and parameter norm.

A compiled step (``train.compile``) cannot be observed from inside without a recompilation, so there the
same observers watch a side forward of the plain module in eval mode (no dropout), on the same micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import Tensor, nn

from lm_ablate import metrics as M


def _norm(tensors: list[Tensor]) -> float:
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors])).item()


@contextmanager
def observed(model: nn.Module, stats: dict[str, float]) -> Iterator[None]:
    """While active, each forward of ``model`` writes its residual RMS per block and max attention logit per
    layer into ``stats``."""

    def after_block(module: nn.Module, inputs: tuple, output: Tensor, i: int) -> None:
        stats[M.layer_metric(i, M.RESIDUAL_RMS)] = output.detach().float().pow(2).mean().sqrt().item()

    def qk(i: int) -> Callable[[Tensor, Tensor], None]:
        attn = model.blocks[i].attn
        return lambda q, k: stats.__setitem__(M.layer_metric(i, M.MAX_ATTN_LOGIT), attn.max_logit(q, k).item())

    hooks = [
        block.register_forward_hook(lambda m, a, o, i=i: after_block(m, a, o, i))
        for i, block in enumerate(model.blocks)
    ]
    for i, block in enumerate(model.blocks):
        block.attn.qk_observer = qk(i)
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for block in model.blocks:
            block.attn.qk_observer = None


@torch.no_grad()
def logit_stats(logits: Tensor) -> dict[str, float]:
    logits = logits.detach().float()
    return {
        M.LOGITS_MAX_ABS: logits.abs().max().item(),
        M.LOGITS_MEAN_LOG_Z: torch.logsumexp(logits, dim=-1).mean().item(),
    }


@torch.no_grad()
def forward_stats(model: nn.Module, x: Tensor, autocast) -> dict[str, float]:
    """The forward statistics from a side pass of ``model`` in eval mode on batch ``x``."""
    stats: dict[str, float] = {}
    was_training = model.training
    model.eval()
    try:
        with observed(model, stats), autocast():
            logits = model(x)
    finally:
        model.train(was_training)
    return stats | logit_stats(logits)


@torch.no_grad()
def grad_stats(model: nn.Module) -> dict[str, float]:
    """Gradient and parameter L2 norm of each block (call after backward, before clipping)."""
    stats: dict[str, float] = {}
    for i, block in enumerate(model.blocks):
        params = list(block.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            stats[M.layer_metric(i, M.GRAD_NORM_LAYER)] = _norm(grads)
        stats[M.layer_metric(i, M.PARAM_NORM)] = _norm(params)
    return stats


class StepProbe:
    """The probes of one training step; the loop calls the same four methods whether it probes or not
    (``NO_PROBE`` does nothing), so it never branches on probing."""

    def __init__(self, model: nn.Module, side_pass: bool):
        self.model, self.side_pass = model, side_pass
        self.stats: dict[str, float] = {}
        self._first = True

    def watch(self, x: Tensor, autocast) -> AbstractContextManager:
        """Context for one micro-batch's training forward: observes the first one (or, with ``side_pass``,
        runs the side forward on it)."""
        first, self._first = self._first, False
        if not first:
            return nullcontext()
        if self.side_pass:
            self.stats.update(forward_stats(self.model, x, autocast))
            return nullcontext()
        return observed(self.model, self.stats)

    def logits(self, logits: Tensor) -> None:
        """The training forward's logits of the micro-batch just watched."""
        if not self.side_pass and M.LOGITS_MAX_ABS not in self.stats:
            self.stats.update(logit_stats(logits))

    def after_backward(self) -> None:
        self.stats.update(grad_stats(self.model))


class _NoProbe(StepProbe):
    def __init__(self) -> None:
        self.stats = {}

    def watch(self, x: Tensor, autocast) -> AbstractContextManager:
        return nullcontext()

    def logits(self, logits: Tensor) -> None:
        pass

    def after_backward(self) -> None:
        pass


NO_PROBE = _NoProbe()
