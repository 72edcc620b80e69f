"""Stability signals, cheap enough to leave on (every ``train.probe_every`` steps).

The literature ties training instability to a few growing quantities: attention logits (Dehghani et al.
2023; Wortsman et al. 2023 — the reason for QK-norm), output logits / log Z (PaLM's z-loss), the residual
stream and per-layer gradients (Xiong et al. 2020 for post-LN). At a probe step we measure:

* a side forward pass in eval mode without gradients on the step's own batch: residual-stream RMS after each
  block, the max pre-softmax attention logit of each layer (computed from the attention's own q/k
  projections, so it works whatever kernel — SDPA, flash, compiled — the training forward uses), and the
  output logits' max |logit| and mean log Z. Eval mode and no_grad draw no random numbers, so probes on or
  off give the same training curve;
* after backward, before clipping: each block's gradient norm and parameter norm.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lm_ablate import metrics as M


def _norm(tensors: list[Tensor]) -> float:
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors])).item()


@torch.no_grad()
def forward_stats(model: nn.Module, x: Tensor, autocast) -> dict[str, float]:
    """Residual RMS per block, max attention logit per layer, output logit stats, on batch ``x``."""
    stats: dict[str, float] = {}
    hooks = []
    for i, block in enumerate(model.blocks):

        def after_block(module, inputs, output, i=i):
            stats[M.layer_metric(i, M.RESIDUAL_RMS)] = output.float().pow(2).mean().sqrt().item()

        def before_attention(module, args, i=i):
            h, position = args
            stats[M.layer_metric(i, M.MAX_ATTN_LOGIT)] = module.max_logit(h, position).item()

        hooks.append(block.register_forward_hook(after_block))
        hooks.append(block.attn.register_forward_pre_hook(before_attention))
    was_training = model.training
    model.eval()
    try:
        with autocast():
            logits = model(x)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    logits = logits.float()
    stats[M.LOGITS_MAX_ABS] = logits.abs().max().item()
    stats[M.LOGITS_MEAN_LOG_Z] = torch.logsumexp(logits, dim=-1).mean().item()
    return stats


@torch.no_grad()
def grad_stats(model: nn.Module) -> dict[str, float]:
    """Gradient and parameter L2 norm of each block (call after backward, before clipping)."""
    stats: dict[str, float] = {}
    for i, block in enumerate(model.blocks):
        params = [p for p in block.parameters()]
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            stats[M.layer_metric(i, M.GRAD_NORM_LAYER)] = _norm(grads)
        stats[M.layer_metric(i, M.PARAM_NORM)] = _norm(params)
    return stats
