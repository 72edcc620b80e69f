"""Run by tests/test_fsdp.py under ``torchrun --nproc_per_node=2`` (gloo): for each optimizer, steps of the
model sharded the loop's way (``lm_ablate.sharding.FSDP``: fully_shard per block and the root, the global clip,
the sharded per-layer norms) next to the same steps of a plain copy of the model on the whole batch (the
independent reference: one process, no DTensor anywhere). Rank 0 writes the largest differences as JSON.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/fsdp_worker.py OUT.json

For Muon it also takes the first update of every hidden matrix three ways: sharded, plain (torch's bf16
Newton-Schulz) and plain with the iteration in fp32 (written out below), so the sharded error can be set against
the bf16 rounding torch's Muon has anyway.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from torch.distributed.tensor import DTensor

from lm_ablate.catalog import load_all
from lm_ablate.config import compose
from lm_ablate.distributed import init_distributed
from lm_ablate.model import TransformerLM
from lm_ablate.optim import is_hidden_matrix
from lm_ablate.probes import grad_stats
from lm_ablate.registry import REGULARIZERS
from lm_ablate.sharding import FSDP, sharded_grad_stats
from lm_ablate.train import build_optimizer

CASES = {
    "adamw": [],
    "sgd": ["optim=sgd"],
    "muon": ["optim=muon"],
    "adamw_mup": ["model.parametrization=mup", "model.mup_base_width=16"],  # μP's per-group LR scales
}
VOCAB, STEPS = 64, 5


def whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def ns_fp32(grad: torch.Tensor, ns_coefficients, ns_steps: int, eps: float) -> torch.Tensor:
    """Jordan et al.'s quintic Newton-Schulz iteration (what torch.optim.Muon computes) in fp32, not bf16."""
    a, b, c = ns_coefficients
    x = grad.float()
    tall = grad.size(0) > grad.size(1)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def run_case(overrides: list[str], d, device) -> dict[str, float]:
    cfg = compose(["model=tiny", "tracking=none", "train.parallel=fsdp", *overrides])
    reg = REGULARIZERS.build(cfg.regularization)
    torch.manual_seed(0)
    plain = TransformerLM(cfg, VOCAB)
    fp32 = copy.deepcopy(plain)
    sharded = copy.deepcopy(plain)
    strategy = FSDP(cfg, d, device)
    strategy.prepare(sharded)
    opt_plain, opt_sharded = (build_optimizer(cfg, m, reg, device) for m in (plain, sharded))
    opt_fp32 = build_optimizer(cfg, fp32, reg, device)
    gen = torch.Generator().manual_seed(1)
    worst = dict.fromkeys(("loss", "grad_norm", "param", "probe_norms"), 0.0)
    muon = cfg.optim.name == "muon"
    for step in range(STEPS):
        x, y = (torch.randint(0, VOCAB, (8, cfg.model.context), generator=gen) for _ in range(2))
        before = {n: whole(p) for n, p in plain.named_parameters()}
        opt_plain.zero_grad(set_to_none=True)
        loss_p = reg.loss(plain(x), y)[0]
        loss_p.backward()
        probe_p = grad_stats(plain)
        norm_p = torch.nn.utils.clip_grad_norm_(plain.parameters(), reg.grad_clip)
        opt_plain.step()

        opt_sharded.zero_grad(set_to_none=True)
        loss_s = reg.loss(sharded(d.shard(x)), d.shard(y))[0]
        loss_s.backward()
        probe_s = sharded_grad_stats(sharded)
        norm_s = strategy.clip_grad_norm(sharded, reg.grad_clip)
        opt_sharded.step()
        loss_s = d.mean(loss_s)

        if muon and step == 0:  # the first update, three ways (module docstring)
            import torch.optim._muon as torch_muon

            opt_fp32.zero_grad(set_to_none=True)
            reg.loss(fp32(x), y)[0].backward()
            torch.nn.utils.clip_grad_norm_(fp32.parameters(), reg.grad_clip)
            bf16_ns, torch_muon._zeropower_via_newtonschulz = torch_muon._zeropower_via_newtonschulz, ns_fp32
            try:
                opt_fp32.step()
            finally:
                torch_muon._zeropower_via_newtonschulz = bf16_ns
            ups = {"sharded": [], "plain": [], "fp32": []}
            for (name, p), (_, q), (_, r) in zip(
                plain.named_parameters(), sharded.named_parameters(), fp32.named_parameters()
            ):
                if is_hidden_matrix(name, p.shape):
                    ups["plain"].append((whole(p) - before[name]).flatten())
                    ups["sharded"].append((whole(q) - before[name]).flatten())
                    ups["fp32"].append((whole(r) - before[name]).flatten())
            u = {k: torch.cat(v) for k, v in ups.items()}
            scale = u["fp32"].norm().item()
            worst["update_sharded_vs_fp32"] = (u["sharded"] - u["fp32"]).norm().item() / scale
            worst["update_plain_vs_fp32"] = (u["plain"] - u["fp32"]).norm().item() / scale
            worst["update_sharded_vs_plain"] = (u["sharded"] - u["plain"]).norm().item() / scale

        worst["loss"] = max(worst["loss"], abs(loss_p.item() - loss_s.item()))
        worst["grad_norm"] = max(worst["grad_norm"], abs(norm_p.item() - norm_s.item()))
        worst["probe_norms"] = max(worst["probe_norms"], *(abs(probe_p[k] - probe_s[k]) for k in probe_p))
        assert set(probe_p) == set(probe_s)
    for (_, p), (_, q) in zip(plain.named_parameters(), sharded.named_parameters()):
        worst["param"] = max(worst["param"], (whole(p) - whole(q)).abs().max().item())
    worst["sharded"] = float(all(isinstance(p, DTensor) for p in sharded.parameters()))
    return worst


def main() -> None:
    load_all()
    torch.set_num_threads(1)
    d, device = init_distributed(torch.device("cpu"))
    results = {name: run_case(overrides, d, device) for name, overrides in CASES.items()}
    if d.main:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)
    d.close()


if __name__ == "__main__":
    main()
