"""Regularization (axis ``regularization``): dropout sites, weight-decay groups, z-loss, gradient clipping.

Dropout is placed by the model (embeddings, attention probabilities, each residual branch); this module owns
what the loop needs: which parameters are decayed, the loss with its z-loss term, and the clip threshold.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lm_ablate.registry import REGULARIZERS
from lm_ablate.schema import RegularizationConfig


@REGULARIZERS.register("standard", "none", "dropout", "zloss")
class Regularizer:
    """The options differ only in their values (see conf/regularization/*.yaml); one class serves all."""

    def __init__(self, cfg: RegularizationConfig):
        self.cfg = cfg

    def param_groups(self, model: nn.Module) -> list[dict]:
        """Two optimizer groups, decayed and not. Decayed by default: matrices (ndim >= 2) except embedding tables.
        Never decayed by default: norm gains, biases, embeddings (decaying a gain pulls it towards 0, not 1).
        Each group also lists its parameters' names as ``model.named_parameters()`` gives them ("param_names",
        which torch's optimizers keep): optimizers that split parameters by role (Muon) and the run record's
        ``optimizer_params`` read them. A tied head is the embedding's tensor, listed once, as ``embed.weight``."""
        embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        decay, no_decay = ([], []), ([], [])  # (params, names)
        for name, p in model.named_parameters():  # each tensor once, under its first name
            if not p.requires_grad:
                continue
            is_embedding = id(p) in embedding_ids
            if is_embedding:
                wanted = self.cfg.decay_embeddings
            elif p.ndim >= 2:
                wanted = True
            else:
                wanted = self.cfg.decay_norms_and_biases
            params, names = decay if wanted else no_decay
            params.append(p)
            names.append(name)
        return [
            {"params": decay[0], "param_names": decay[1], "weight_decay": self.cfg.weight_decay},
            {"params": no_decay[0], "param_names": no_decay[1], "weight_decay": 0.0},
        ]

    def loss(self, logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Returns (total, cross-entropy, z-loss term). z-loss = coef * mean(log Z)^2 with log Z the
        log-partition of the output softmax (PaLM, Chowdhery et al. 2022); it keeps log Z near 0."""
        flat = logits.reshape(-1, logits.shape[-1])
        ce = F.cross_entropy(flat, targets.reshape(-1))
        if self.cfg.z_loss == 0:
            return ce, ce, torch.zeros((), device=ce.device)
        z = self.cfg.z_loss * torch.logsumexp(flat, dim=-1).pow(2).mean()
        return ce + z, ce, z

    @property
    def grad_clip(self) -> float:
        return self.cfg.grad_clip
