"""The training loop: ``python -m lm_ablate.train [overrides]`` (a Hydra app; ``--multirun`` sweeps).

One function, :func:`train`, read top to bottom: data, model, optimizer, trackers, resume; then for each step
batch -> forward -> loss (+ z-loss) -> backward -> clip -> step -> metrics -> eval -> checkpoint. Every option
it uses was built by its axis registry; the loop never looks at option names.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lm_ablate import checkpoint as ckpt
from lm_ablate import metrics as M
from lm_ablate.config import AXES, CONF_DIR, ConfigError, compose_error_message, to_container, validate
from lm_ablate.data import check_length, get_batch, load_data, val_batches
from lm_ablate.distributed import init_distributed
from lm_ablate.model import TransformerLM, model_cost
from lm_ablate.optim import build_schedule
from lm_ablate.perf import compile_step, measured_peak_flops, peak_memory_mb
from lm_ablate.probes import NO_PROBE, StepProbe
from lm_ablate.registry import OPTIMIZERS, REGULARIZERS, TRACKERS
from lm_ablate.tracking import LocalRecord, RunInfo, Tracker, Trackers, atomic_write_text

# overrides that do not change what is trained: left out of run names
_BOOKKEEPING = (
    "tracking",
    "train.progress",
    "train.device",
    "train.threads",
    "train.resume",
    "data.cache_dir",
    "hydra",
)
# SIGTERM: scancel, preemption; SIGUSR1: a common sbatch --signal choice; SIGUSR2: what submitit (hydra/launcher=slurm)
# asks SLURM to send before the time limit (signal_delay_s), after which its own handler requeues the job.
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


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


@torch.no_grad()
def extrapolate(model: TransformerLM, val_tokens, cfg: DictConfig, device: torch.device, autocast) -> dict[str, float]:
    """Validation loss at k times the training context for each k in ``train.extrapolation`` (the same number
    of tokens per pass: batch size divided by k). NaN where the position scheme cannot encode that length."""
    t, context = cfg.train, cfg.model.context
    out = {}
    for k in t.extrapolation:
        if model.position.max_length is not None and k * context > model.position.max_length:
            out[M.val_loss_at(k)] = float("nan")
            continue
        batches = val_batches(val_tokens, max(1, t.batch_size // k), k * context, t.eval_batches)
        out[M.val_loss_at(k)] = evaluate(model, [(x.to(device), y.to(device)) for x, y in batches], autocast)
    return out


@dataclass
class Progress:
    """What the loop has accumulated; saved in checkpoints so a resumed run continues the same sums."""

    step: int = 0
    val_losses: list[float] = field(default_factory=list)
    recent_losses: list[float] = field(default_factory=list)  # the last 10 train losses (final_train_loss)
    skipped: int = 0
    wall_time_s: float = 0.0  # summed over all sessions of the run
    resumed_from: list[int] = field(default_factory=list)


class Preemption:
    """SIGTERM/SIGUSR1/SIGUSR2 (SLURM preemption or time limit) only set a flag: the loop finishes the step, writes a
    checkpoint and stops; then the signal is re-raised with the previous handler so the scheduler (or
    submitit) sees the job end as it expects and can requeue it. The requeued job resumes automatically."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Preemption:
        for sig in PREEMPT_SIGNALS:
            # not the main thread (e.g. a launcher running jobs in threads): no handler
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def pass_on(self) -> None:
        """Deliver the signal we held back to the handler that was there before us."""
        if self.signum is not None:
            signal.raise_signal(self.signum)


def _trim_metrics(run_dir: Path, last_step: int) -> None:
    """Drop rows logged after the checkpoint we resume from (they will be logged again, identically) and a
    torn last line, so metrics.jsonl ends up with every step exactly once."""
    path = run_dir / M.METRICS_FILE
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get(M.STEP), int) and row[M.STEP] <= last_step:
            kept.append(line)
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _start_over_or_refuse(run_dir: Path) -> None:
    """No checkpoint to resume from. A finished run (completed/diverged) in the directory is never overwritten;
    a run killed before its first checkpoint starts over (its partial rows would be logged again, identically)."""
    summary = run_dir / M.SUMMARY_FILE
    status = None
    if summary.exists():
        try:
            status = json.loads(summary.read_text()).get(M.STATUS)
        except (OSError, ValueError):
            status = "unreadable"
    if status in (M.STATUS_COMPLETED, M.STATUS_DIVERGED, "unreadable"):
        raise ckpt.CheckpointError(
            f"hydra.run.dir={str(run_dir)!r} is invalid: it already holds a finished run (status {status}) and no "
            "checkpoint to resume from; use a new run directory"
        )
    _trim_metrics(run_dir, -1)


def train(
    cfg: DictConfig, run_dir: str | Path, name: str | None = None, on_accept: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Train one run (or continue it from its checkpoint) and write its record into ``run_dir``.
    ``on_accept`` runs (on rank 0) once every check has passed, before anything is written."""
    validate(cfg)
    session_start = time.perf_counter()
    t = cfg.train
    dist_env, device = init_distributed(resolve_device(t.device))
    run_dir = Path(dist_env.broadcast(str(run_dir)))  # under torchrun each rank's Hydra may name its own dir
    if t.threads:
        torch.set_num_threads(t.threads)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else nullcontext
    config = to_container(cfg)
    if t.batch_size % (dist_env.world * t.grad_accum):
        raise ConfigError(
            f"train.batch_size={t.batch_size} is invalid: must be divisible by the number of processes "
            f"({dist_env.world}) x train.grad_accum ({t.grad_accum})"
        )

    resume_from = ckpt.find_resume(run_dir, t.resume)
    saved = ckpt.load(resume_from) if resume_from else None
    if saved is not None:
        diff = ckpt.config_differences(saved["config"], config)
        if diff:
            shown = ", ".join(
                f"{k}: {ckpt.flat_config(saved['config']).get(k)!r} -> {ckpt.flat_config(config).get(k)!r}"
                for k in diff[:3]
            )
            raise ckpt.CheckpointError(
                f"train.resume={str(resume_from)!r} is invalid: the checkpoint is of another config ({shown})"
            )
    elif dist_env.main:
        _start_over_or_refuse(run_dir)

    data = load_data(cfg.data)
    check_length(data, cfg.model.context)
    longest = max(t.extrapolation, default=1) * cfg.model.context
    if len(data.val) < longest + 1:
        raise ConfigError(
            f"train.extrapolation={list(t.extrapolation)} is invalid: the validation split has "
            f"{len(data.val)} tokens, fewer than {longest + 1}"
        )
    if on_accept is not None and dist_env.main:
        on_accept()
    seed_everything(cfg.seed)
    model = TransformerLM(cfg, data.vocab_size).to(device)
    cost = model_cost(model, cfg)
    regularizer = REGULARIZERS.build(cfg.regularization)
    optimizer = OPTIMIZERS.build(cfg.optim, regularizer.param_groups(model), device)
    tokens_per_step = t.batch_size * cfg.model.context  # global, all ranks together
    horizon = t.max_steps if t.max_tokens is None else min(t.max_steps, math.ceil(t.max_tokens / tokens_per_step))
    lr_at = build_schedule(cfg.optim, horizon)
    val = [
        (x.to(device), y.to(device)) for x, y in val_batches(data.val, t.batch_size, cfg.model.context, t.eval_batches)
    ]
    peak = t.peak_flops or measured_peak_flops(device.type, torch.bfloat16 if device.type == "cuda" else torch.float32)
    peak *= dist_env.world

    grad_spikes = M.SpikeDetector(t.spike.window, t.spike.k)
    loss_spikes = M.SpikeDetector(t.spike.window, t.spike.k)
    meter = M.ThroughputMeter()
    progress = Progress()
    summary: dict[str, Any] = {
        M.STATUS: M.STATUS_RUNNING,
        M.RUN_NAME: name or run_name(cfg),
        M.GROUP: cfg.study,
        M.CHOICES: dict(cfg.choices),
        M.SEED: cfg.seed,
        M.PARAMS_TOTAL: cost.params_total,
        M.PARAMS_NON_EMBEDDING: cost.params_non_embedding,
        "flops_per_token": cost.flops_per_token,
        M.PEAK_FLOPS: peak,
        "world_size": dist_env.world,
        M.DIVERGED_AT: None,
        M.ERROR: None,
    }
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        grad_spikes.load_state_dict(saved["grad_spikes"])
        loss_spikes.load_state_dict(saved["loss_spikes"])
        meter = M.ThroughputMeter(**saved["meter"])
        progress = Progress(**saved["progress"])
        progress.resumed_from.append(progress.step)
        summary = {**saved["summary"], M.RUN_NAME: summary[M.RUN_NAME]}
        if dist_env.main:
            _trim_metrics(run_dir, progress.step)
        ckpt.set_rng_state(saved["rng"])

    # what runs the step: DDP when there are several processes; with train.compile the forward AND the loss
    # are compiled as one function (the [tokens, vocab] log-softmax is ~5% of a step; compiling the model alone
    # left it eager: bench/throughput.py). Probes, checkpoints and evaluation use the plain module.
    step_model: torch.nn.Module = model
    if dist_env.active:
        step_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None
        )

    def forward_loss(xm: torch.Tensor, ym: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """logits, then (loss, cross-entropy, z-loss term) of one micro-batch."""
        with autocast():
            logits = step_model(xm)
        return logits, *regularizer.loss(logits, ym)

    if t.compile:
        forward_loss = compile_step(forward_loss)

    tracker = Trackers(LocalRecord(run_dir), TRACKERS.build(cfg.tracking)) if dist_env.main else Tracker()
    info = RunInfo(run_dir, summary[M.RUN_NAME], cfg.study, run_tags(cfg), config, resume_id=summary.get("wandb_id"))
    summary.update(tracker.start(info))
    summary[M.RESUMED_FROM] = progress.resumed_from
    tracker.summary(summary)
    wall_before = progress.wall_time_s

    def snapshot() -> dict[str, Any]:
        progress.wall_time_s = wall_before + time.perf_counter() - session_start
        mean_rate = meter.mean_tokens_per_sec if meter.seconds else None
        summary.update(
            {
                M.FINAL_VAL_LOSS: progress.val_losses[-1] if progress.val_losses else None,
                M.BEST_VAL_LOSS: min((v for v in progress.val_losses if math.isfinite(v)), default=None),
                M.FINAL_TRAIN_LOSS: float(np.mean(progress.recent_losses)) if progress.recent_losses else None,
                M.GRAD_NORM_SPIKES: grad_spikes.count,
                M.LOSS_SPIKES: loss_spikes.count,
                M.SKIPPED_STEPS: progress.skipped,
                M.MEAN_TOKENS_PER_SEC: mean_rate,
                M.MEAN_MFU: cost.flops_per_token * mean_rate / peak if mean_rate else None,
                M.STEPS: progress.step,
                M.TOTAL_TOKENS: progress.step * tokens_per_step,
                M.WALL_TIME_S: progress.wall_time_s,
            }
        )
        return summary

    def save_checkpoint() -> None:
        if not dist_env.main:
            return
        snapshot()
        state = {
            "config": config,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": ckpt.rng_state(),
            "grad_spikes": grad_spikes.state_dict(),
            "loss_spikes": loss_spikes.state_dict(),
            "meter": asdict(meter),
            "progress": asdict(progress),
            "summary": dict(summary),
        }
        ckpt.save(run_dir, progress.step, state, t.keep_checkpoints)

    def budget_spent(step: int) -> str | None:
        if step >= horizon:
            return "max_tokens" if horizon < t.max_steps else "max_steps"
        if t.max_time_s is not None and dist_env.any(meter.seconds >= t.max_time_s, device):
            return "max_time_s"
        return None

    status, stop_reason = M.STATUS_RUNNING, None
    bar = _progress(t, info.name, progress.step, dist_env.main)
    with Preemption() as preemption:
        try:
            if saved is None:
                progress.val_losses.append(evaluate(model, val, autocast))
                tracker.log({M.VAL_LOSS: progress.val_losses[-1], M.TOKENS: 0}, step=0)  # the loss at initialization
            while stop_reason is None:
                step = progress.step + 1
                x, y = get_batch(data.train, t.batch_size, cfg.model.context, cfg.seed, step)
                x, y = dist_env.shard(x).to(device, non_blocking=True), dist_env.shard(y).to(device, non_blocking=True)
                lr = cfg.optim.lr * lr_at(step - 1)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                # probe the first step too: per-layer gradients at initialization (Xiong et al. 2020)
                probing = dist_env.main and t.probe_every > 0 and (step == 1 or step % t.probe_every == 0)
                probe = StepProbe(model, side_pass=t.compile) if probing else NO_PROBE

                tic = time.perf_counter()  # the probes' cost is inside the step time
                optimizer.zero_grad(set_to_none=True)
                ce_sum, z_sum = torch.zeros((), device=device), torch.zeros((), device=device)
                micro = list(zip(x.chunk(t.grad_accum), y.chunk(t.grad_accum)))
                for i, (xm, ym) in enumerate(micro):
                    last = i == len(micro) - 1
                    with nullcontext() if last or not dist_env.active else step_model.no_sync():
                        with probe.watch(xm, autocast):
                            logits, loss, ce, z = forward_loss(xm, ym)
                        probe.logits(logits)
                        (loss / len(micro)).backward()
                    ce_sum, z_sum = ce_sum + ce.detach(), z_sum + z.detach()
                probe.after_backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), regularizer.grad_clip or math.inf)
                ce_value = dist_env.mean(ce_sum / len(micro)).item()
                norm_value = grad_norm.item()
                finite = math.isfinite(ce_value) and math.isfinite(norm_value)
                if finite:
                    optimizer.step()
                seconds = time.perf_counter() - tic
                progress.step = step
                rate = meter.update(tokens_per_step, seconds)

                row: dict[str, float] = dict(probe.stats)
                row.update(
                    {
                        M.TRAIN_LOSS: ce_value,
                        M.GRAD_NORM: norm_value,
                        M.LR: lr,
                        M.TOKENS: step * tokens_per_step,
                        M.TOKENS_PER_SEC: rate,
                        M.STEP_TIME_MS: 1000 * seconds,
                        M.MFU: cost.flops_per_token * rate / peak,
                        M.SPIKE_GRAD_NORM: float(grad_spikes.update(norm_value)),
                        M.SPIKE_GRAD_NORM_COUNT: grad_spikes.count,
                        M.SPIKE_LOSS: float(loss_spikes.update(ce_value)),
                        M.SPIKE_LOSS_COUNT: loss_spikes.count,
                    }
                )
                if cfg.regularization.z_loss:
                    row[M.TRAIN_Z_LOSS] = dist_env.mean(z_sum / len(micro)).item()
                if probing:
                    row[M.PEAK_MEM_MB] = peak_memory_mb(device)
                if finite:
                    progress.recent_losses = (progress.recent_losses + [ce_value])[-10:]
                else:
                    progress.skipped += 1
                    row[M.SKIPPED_STEPS] = progress.skipped
                    if t.divergence == "stop" or progress.skipped > t.max_skipped_steps:
                        status, stop_reason = M.STATUS_DIVERGED, "diverged"
                        summary[M.DIVERGED_AT] = step
                        tracker.log(row, step)
                        break
                stop_reason = budget_spent(step)
                if step % t.eval_every == 0 or stop_reason:
                    progress.val_losses.append(evaluate(model, val, autocast))
                    row[M.VAL_LOSS] = progress.val_losses[-1]
                if stop_reason and t.extrapolation:
                    row.update(extrapolate(model, data.val, cfg, device, autocast))
                    summary["extrapolation"] = {k: row[M.val_loss_at(k)] for k in t.extrapolation}
                if step % t.log_every == 0 or M.VAL_LOSS in row or not finite or probing:
                    tracker.log(row, step)
                if M.VAL_LOSS in row:
                    tracker.summary(snapshot())
                preempted = dist_env.any(preemption.signum is not None, device)
                if stop_reason or (t.checkpoint_every and step % t.checkpoint_every == 0) or preempted:
                    save_checkpoint()
                bar.update(1)
                bar.set_postfix(loss=f"{ce_value:.3f}", tok_s=f"{rate:.0f}", refresh=False)
                if preempted and not stop_reason:
                    status, stop_reason = M.STATUS_PREEMPTED, "preempted"
            if status == M.STATUS_RUNNING:
                status = M.STATUS_COMPLETED
        except BaseException as err:  # record the failure, then let it propagate (Ctrl-C included)
            status = M.STATUS_FAILED
            summary[M.ERROR] = f"{type(err).__name__}: {err}"
            raise
        finally:
            bar.close()
            snapshot()
            summary[M.STATUS] = status
            summary[M.STOP_REASON] = stop_reason
            tracker.summary(summary)
            tracker.finish(status)
            dist_env.close()
    preemption.pass_on()
    return summary


def _progress(t: DictConfig, name: str, initial: int, main: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=t.max_steps,
        initial=initial,
        desc=name[:60],
        disable=not (t.progress and main),
        leave=False,
        mininterval=1.0,
        file=sys.stderr,
    )


_STARTED = False  # set once Hydra has composed the config: later errors are not composition errors


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    global _STARTED
    _STARTED = True
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    OmegaConf.set_struct(cfg, False)
    cfg.choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra") and k != "local"}
    OmegaConf.set_struct(cfg, True)

    def save_hydra_record() -> None:
        """Hydra's own copy (.hydra/), written only once the run is accepted (conf/train.yaml sets
        hydra.output_subdir: null), so a refused launch never rewrites the record of a finished run."""
        folder = out / ".hydra"
        folder.mkdir(parents=True, exist_ok=True)
        plain = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "choices"])
        atomic_write_text(folder / "config.yaml", OmegaConf.to_yaml(plain))
        atomic_write_text(
            folder / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": OmegaConf.to_container(hc)}))
        )
        atomic_write_text(folder / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(hc.overrides.task))))

    try:
        summary = train(cfg, out, name=run_name(cfg, list(hc.overrides.task)), on_accept=save_hydra_record)
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{summary[M.STATUS]}: {summary[M.RUN_NAME]}  val/loss={summary[M.FINAL_VAL_LOSS]}  -> {out}")
    return summary[M.FINAL_VAL_LOSS]  # the objective for optimizing sweepers (Optuna, Nevergrad)


def cli() -> None:
    """``python -m lm_ablate.train``: Hydra's composition errors (unknown option or key, wrong type) become one
    line and exit 2 like every other bad input; HYDRA_FULL_ERROR=1 keeps Hydra's full report."""
    user_full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its multi-line report
    try:
        main()
    except Exception as err:
        line = None if (user_full or _STARTED) else compose_error_message(err)
        if line is None:
            raise
        print(f"lm-ablate: error: {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    # Run the copy that lives in the importable module, not in __main__: parallel launchers (joblib/loky,
    # submitit) pickle the task function, and one from __main__ would be pickled by value.
    from lm_ablate.train import cli as entry

    entry()
