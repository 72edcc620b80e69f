"""The training loop: ``python -m lm_ablate.train [overrides]`` (a Hydra app; ``--multirun`` sweeps).

One function, :func:`train`, read top to bottom: data, model, optimizer, trackers; then for each step
batch -> forward -> loss (+ z-loss) -> backward -> clip -> step -> metrics -> eval. Every option it uses
was built by its axis registry; the loop never looks at option names.
"""

from __future__ import annotations

import math
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lm_ablate import metrics as M
from lm_ablate.config import AXES, CONF_DIR, ConfigError, to_container, validate
from lm_ablate.data import check_length, get_batch, load_data, val_batches
from lm_ablate.model import TransformerLM, model_cost
from lm_ablate.optim import build_schedule
from lm_ablate.registry import OPTIMIZERS, REGULARIZERS, TRACKERS
from lm_ablate.tracking import LocalRecord, RunInfo, Trackers

# overrides that do not change what is trained: left out of run names
_BOOKKEEPING = ("tracking", "train.progress", "train.device", "train.threads", "data.cache_dir", "hydra")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} is invalid: CUDA is not available here (use auto or cpu)")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_name(cfg: DictConfig, overrides: list[str] | None = None) -> str:
    """The arm: the overrides that define it (sweep parameters included), else the axis choices."""
    if overrides:
        kept = [o for o in overrides if not o.lstrip("+~").startswith(_BOOKKEEPING)]
        if kept:
            return ",".join(kept)
    parts = [f"{axis}={cfg.choices[axis]}" for axis in AXES if cfg.choices.get(axis)]
    return ",".join(parts + [f"seed={cfg.seed}"])


def run_tags(cfg: DictConfig) -> list[str]:
    """One tag per axis value, so a W&B dashboard can filter runs without any set-up."""
    tags = [f"{group}={option}" for group, option in cfg.choices.items() if option and group in AXES + ("model",)]
    return tags + [f"norm.placement={cfg.norm.placement}", f"seed={cfg.seed}"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list, autocast) -> float:
    """Mean cross-entropy over the fixed validation batches (the same tokens for every run)."""
    model.eval()
    total = 0.0
    for x, y in batches:
        with autocast():
            logits = model(x)
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    model.train()
    return total / len(batches)


def train(cfg: DictConfig, run_dir: str | Path, name: str | None = None) -> dict[str, Any]:
    """Train one run and write its record into ``run_dir``. Returns the summary."""
    validate(cfg)
    started = time.perf_counter()
    run_dir = Path(run_dir)
    t = cfg.train
    device = resolve_device(t.device)
    if t.threads:
        torch.set_num_threads(t.threads)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else nullcontext

    data = load_data(cfg.data)
    check_length(data, cfg.model.context)
    seed_everything(cfg.seed)
    model = TransformerLM(cfg, data.vocab_size).to(device)
    cost = model_cost(model, cfg)
    regularizer = REGULARIZERS.build(cfg.regularization)
    optimizer = OPTIMIZERS.build(cfg.optim, regularizer.param_groups(model), device)
    lr_at = build_schedule(cfg.optim, t.max_steps)
    val = [(x.to(device), y.to(device)) for x, y in val_batches(data.val, t.batch_size, cfg.model.context, t.eval_batches)]

    tracker = Trackers(LocalRecord(run_dir), TRACKERS.build(cfg.tracking))
    info = RunInfo(run_dir, name or run_name(cfg), cfg.study, run_tags(cfg), to_container(cfg))
    summary: dict[str, Any] = {
        M.STATUS: M.STATUS_RUNNING,
        M.RUN_NAME: info.name,
        M.GROUP: info.group,
        M.CHOICES: dict(cfg.choices),
        M.SEED: cfg.seed,
        M.PARAMS_TOTAL: cost.params_total,
        M.PARAMS_NON_EMBEDDING: cost.params_non_embedding,
        "flops_per_token": cost.flops_per_token,
        M.DIVERGED_AT: None,
        M.ERROR: None,
    }
    summary.update(tracker.start(info))
    tracker.summary(summary)

    grad_spikes = M.SpikeDetector(t.spike.window, t.spike.k)
    loss_spikes = M.SpikeDetector(t.spike.window, t.spike.k)
    meter = M.ThroughputMeter()
    tokens_per_step = t.batch_size * cfg.model.context
    val_losses: list[float] = []
    recent_losses: list[float] = []
    status, step = M.STATUS_RUNNING, 0
    bar = _progress(t, info.name)
    try:
        val_losses.append(evaluate(model, val, autocast))
        tracker.log({M.VAL_LOSS: val_losses[-1], M.TOKENS: 0}, step=0)  # the loss at initialization
        for step in range(1, t.max_steps + 1):
            x, y = (b.to(device, non_blocking=True) for b in get_batch(data.train, t.batch_size, cfg.model.context, cfg.seed, step))
            lr = cfg.optim.lr * lr_at(step - 1)
            for group in optimizer.param_groups:
                group["lr"] = lr

            tic = time.perf_counter()
            with autocast():
                logits = model(x)
            loss, ce, z = regularizer.loss(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), regularizer.grad_clip or math.inf)
            ce_value, norm_value = ce.item(), grad_norm.item()
            finite = math.isfinite(ce_value) and math.isfinite(norm_value)
            if finite:
                optimizer.step()
            seconds = time.perf_counter() - tic

            row = {
                M.TRAIN_LOSS: ce_value,
                M.GRAD_NORM: norm_value,
                M.LR: lr,
                M.TOKENS: step * tokens_per_step,
                M.TOKENS_PER_SEC: meter.update(tokens_per_step, seconds),
                M.STEP_TIME_MS: 1000 * seconds,
                M.SPIKE_GRAD_NORM: float(grad_spikes.update(norm_value)),
                M.SPIKE_GRAD_NORM_COUNT: grad_spikes.count,
                M.SPIKE_LOSS: float(loss_spikes.update(ce_value)),
                M.SPIKE_LOSS_COUNT: loss_spikes.count,
            }
            if cfg.regularization.z_loss:
                row[M.TRAIN_Z_LOSS] = z.item()
            recent_losses = (recent_losses + [ce_value])[-10:]
            if not finite:
                status = M.STATUS_DIVERGED
                summary[M.DIVERGED_AT] = step
                tracker.log(row, step)
                break
            if step % t.eval_every == 0 or step == t.max_steps:
                val_losses.append(evaluate(model, val, autocast))
                row[M.VAL_LOSS] = val_losses[-1]
            if step % t.log_every == 0 or M.VAL_LOSS in row:
                tracker.log(row, step)
            if M.VAL_LOSS in row:
                tracker.summary(_progress_summary(summary, val_losses, grad_spikes, loss_spikes, meter, step, started))
            bar.update(1)
            bar.set_postfix(loss=f"{ce_value:.3f}", tok_s=f"{row[M.TOKENS_PER_SEC]:.0f}", refresh=False)
        else:
            status = M.STATUS_COMPLETED
    except BaseException as err:  # record the failure, then let it propagate (Ctrl-C included)
        status = M.STATUS_FAILED
        summary[M.ERROR] = f"{type(err).__name__}: {err}"
        raise
    finally:
        bar.close()
        summary.update(_progress_summary(summary, val_losses, grad_spikes, loss_spikes, meter, step, started))
        summary[M.STATUS] = status
        summary[M.FINAL_TRAIN_LOSS] = float(np.mean(recent_losses)) if recent_losses else None
        tracker.summary(summary)
        tracker.finish(status)
    return summary


def _progress_summary(summary, val_losses, grad_spikes, loss_spikes, meter, step, started) -> dict[str, Any]:
    finite = [v for v in val_losses if math.isfinite(v)]
    summary.update(
        {
            M.FINAL_VAL_LOSS: val_losses[-1] if val_losses else None,
            M.BEST_VAL_LOSS: min(finite) if finite else None,
            M.GRAD_NORM_SPIKES: grad_spikes.count,
            M.LOSS_SPIKES: loss_spikes.count,
            M.MEAN_TOKENS_PER_SEC: meter.mean_tokens_per_sec if meter.seconds else None,
            M.STEPS: step,
            M.TOTAL_TOKENS: meter.tokens,
            M.WALL_TIME_S: time.perf_counter() - started,
        }
    )
    return summary


def _progress(t: DictConfig, name: str):
    from tqdm.auto import tqdm

    return tqdm(total=t.max_steps, desc=name[:60], disable=not t.progress, leave=False, mininterval=1.0, file=sys.stderr)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    OmegaConf.set_struct(cfg, False)
    cfg.choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra") and k != "local"}
    OmegaConf.set_struct(cfg, True)
    try:
        summary = train(cfg, hc.runtime.output_dir, name=run_name(cfg, list(hc.overrides.task)))
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{summary[M.STATUS]}: {summary[M.RUN_NAME]}  val/loss={summary[M.FINAL_VAL_LOSS]}  -> {hc.runtime.output_dir}")
    return summary[M.FINAL_VAL_LOSS]  # the objective for optimizing sweepers (Optuna, Nevergrad)


if __name__ == "__main__":
    # Run the copy of main() that lives in the importable module, not in __main__: parallel launchers
    # (joblib/loky, submitit) pickle the task function, and one from __main__ would be pickled by value.
    from lm_ablate.train import main as task

    task()
