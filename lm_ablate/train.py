"""The training loop: ``python -m lm_ablate.train [overrides]`` (a Hydra app; ``--multirun`` sweeps).

:class:`Trainer` is one run. Its constructor checks everything (config, resume, data, memory) before anything
is written, then builds model, optimizer and trackers; :meth:`Trainer.run` is the algorithm::

    for step = s0 + 1, ...:
        batch(seed, step) -> forward -> loss (+ z-loss) -> backward -> clip -> update     train_step
        metrics row, spike detectors                                                     record
        every eval_every and at the end: validation loss                                 evaluate
        every checkpoint_every, at the end and on a signal: model, optimizer, RNG, ...    save_checkpoint
    summary, status, trackers closed                                                     finish

Every option it uses was built by its axis registry; the loop never looks at option names. Stopping: a budget
(``train.max_steps | max_tokens | max_time_s``), divergence, a scheduler's signal (SIGTERM/SIGUSR1/SIGUSR2:
status ``preempted``, the signal passed on so the job is requeued) or Ctrl-C (status ``interrupted``, exit 130);
the last two write a checkpoint first, and starting the same command again continues bit-identically.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lm_ablate import checkpoint as ckpt
from lm_ablate import metrics as M
from lm_ablate import provenance, stall
from lm_ablate.budgets import Forks, train_branches
from lm_ablate.config import AXES, CONF_DIR, ConfigError, compose_error_message, to_container, validate
from lm_ablate.data import check_length, check_vocab_key, get_batch, load_data, record_vocabulary, val_batches
from lm_ablate.data.common import cache_root
from lm_ablate.data.unigram import data_levels
from lm_ablate.distributed import init_distributed
from lm_ablate.eval import Downstream
from lm_ablate.eval.bpb import bits_per_byte, held_out_text, text_budget
from lm_ablate.ladder import apply_rung, check_budget_keys, set_budget
from lm_ablate.model import TransformerLM, model_cost
from lm_ablate.optim import build_schedule, resolve_weight_decay, with_weight_decay
from lm_ablate.options import explicit_keys, settle
from lm_ablate.parametrization import optimizer_groups, set_lr
from lm_ablate.perf import check_step_memory, measured_peak_flops, out_of_memory, peak_memory_mb
from lm_ablate.probes import NO_PROBE, StepProbe
from lm_ablate.registry import OPTIMIZERS, REGULARIZERS, TRACKERS
from lm_ablate.shape import apply_shape
from lm_ablate.sharding import plan as plan_parallel
from lm_ablate.tracking import LocalRecord, RunInfo, Tracker, Trackers, atomic_write_text

# overrides that do not change what is trained: left out of run names
_BOOKKEEPING = (
    "tracking",
    "train.progress",
    "train.device",
    "train.threads",
    "train.resume",
    "train.parallel",  # how the ranks share the work (lm_ablate/sharding.py), not what is trained
    "train.shard_size",
    "train.activation_checkpointing",
    "train.ac_every",
    "train.async_checkpoint",
    "data.cache_dir",
    "data.num_proc",
    "hydra",
    "claims",
)
# SIGTERM: scancel, preemption; SIGUSR1: a common sbatch --signal choice; SIGUSR2: what submitit (hydra/launcher=slurm)
# asks SLURM to send before the time limit (signal_delay_s), after which its own handler requeues the job.
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd program
# steps of each session left out of the mean tokens/s: the first step pays for lazy initialisation, and with
# train.compile for the compilation (recorded separately as compile_time_s)
COLD_STEPS = 1


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
    return ",".join([*parts, f"seed={cfg.seed}"])


def run_tags(cfg: DictConfig) -> list[str]:
    """One tag per axis value, so a W&B dashboard can filter runs without any set-up."""
    tags = [f"{group}={option}" for group, option in cfg.choices.items() if option and group in (*AXES, "model")]
    return [*tags, f"norm.placement={cfg.norm.placement}", f"seed={cfg.seed}"]


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
def extrapolate(model: TransformerLM, val_tokens, cfg: DictConfig, device: torch.device, autocast) -> dict[str, Any]:
    """Validation loss at k times the training context for each k in ``train.extrapolation`` (the same number
    of tokens per pass: batch size divided by k). None (JSON null) where the position scheme cannot encode
    that length (a learned table ends at model.context)."""
    t, context = cfg.train, cfg.model.context
    out: dict[str, Any] = {}
    for k in t.extrapolation:
        if model.position.max_length is not None and k * context > model.position.max_length:
            out[M.val_loss_at(k)] = None
            continue
        batches = val_batches(val_tokens, max(1, t.batch_size // k), k * context, t.eval_batches)
        out[M.val_loss_at(k)] = evaluate(model, [(x.to(device), y.to(device)) for x, y in batches], autocast)
    return out


@dataclass
class Progress:
    """What the loop has accumulated; saved in checkpoints so a resumed run continues the same sums."""

    step: int = 0
    val_losses: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)  # the step of each val loss (the stall rule's flat test)
    recent_losses: list[float] = field(default_factory=list)  # the last 10 train losses (final_train_loss)
    skipped: int = 0
    wall_time_s: float = 0.0  # summed over all sessions of the run
    resumed_from: list[int] = field(default_factory=list)
    cold_steps: int = 0  # steps left out of the mean tokens/s (COLD_STEPS per session)
    cold_seconds: float = 0.0  # their step time


class StopSignals:
    """Signals only set a flag: the loop finishes the step, writes a checkpoint and stops.

    * SIGTERM / SIGUSR1 / SIGUSR2 (SLURM preemption or time limit): status ``preempted``; afterwards the signal is
      re-raised with the previous handler, so the scheduler (or submitit) sees the job end as it expects and
      requeues it. The requeued job resumes automatically.
    * SIGINT (Ctrl-C): status ``interrupted``; the command exits with 130 after one line. A second Ctrl-C stops
      at once (KeyboardInterrupt), without waiting for the step."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in (*PREEMPT_SIGNALS, signal.SIGINT):
            # not the main thread (e.g. a launcher running jobs in threads): no handler
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def status(self) -> str:
        return M.STATUS_INTERRUPTED if self.signum == signal.SIGINT else M.STATUS_PREEMPTED

    def pass_on(self) -> None:
        """Deliver a scheduler's signal we held back to the handler that was there before us."""
        if self.signum is not None and self.signum != signal.SIGINT:
            signal.raise_signal(self.signum)


class Interrupted(Exception):
    """Raised by :func:`train` after a Ctrl-C once the run is recorded as interrupted (the CLI exits 130)."""

    def __init__(self, summary: dict[str, Any]):
        super().__init__("interrupted")
        self.summary = summary


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


def _recorded_status(run_dir: Path) -> tuple[str | None, dict[str, Any]]:
    """(status, summary) of the run recorded in ``run_dir``; ("unreadable", {}) for a damaged summary.json."""
    path = run_dir / M.SUMMARY_FILE
    if not path.exists():
        return None, {}
    try:
        summary = json.loads(path.read_text())
        return summary.get(M.STATUS), summary
    except (OSError, ValueError, AttributeError):
        return "unreadable", {}


def _recorded_config(run_dir: Path) -> dict | None:
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(run_dir / M.CONFIG_FILE), resolve=True)
    except Exception:  # missing or damaged: treated as unknown
        return None
    return loaded if isinstance(loaded, dict) else None


class AlreadyFinished(Exception):
    """The run directory holds a finished run of this very config: nothing to do, nothing is changed."""

    def __init__(self, summary: dict[str, Any]):
        super().__init__("already finished")
        self.summary = summary


def check_finished(run_dir: Path, config: dict) -> None:
    """A finished run (completed or diverged) is never trained further nor rewritten.

    Same config again (a re-launched sweep, a SLURM requeue after the job finished): raise AlreadyFinished,
    which the CLI reports in one line with exit 0, changing nothing. Another config: one-line ConfigError."""
    status, summary = _recorded_status(run_dir)
    if status not in (M.STATUS_COMPLETED, M.STATUS_DIVERGED, "unreadable"):
        return
    where = f"hydra.run.dir={str(run_dir)!r} is invalid"
    if status == "unreadable":
        raise ckpt.CheckpointError(f"{where}: its {M.SUMMARY_FILE} is unreadable; use a new run directory")
    recorded = _recorded_config(run_dir)
    diff = ckpt.config_differences(recorded, config) if recorded is not None else ["config.yaml"]
    if diff:
        raise ckpt.CheckpointError(
            f"{where}: it holds a finished run (status {status}, {summary.get(M.STEPS)} steps) of another config "
            f"({ckpt.describe_differences(recorded or {}, config, diff)}); use a new run directory"
        )
    raise AlreadyFinished(summary)


class Trainer:
    """One run, from a config to its record in ``run_dir`` (see the module docstring for the algorithm).

    ``on_accept`` runs (on rank 0) once every check has passed, before anything is written."""

    def __init__(self, cfg: DictConfig, run_dir: str | Path, name: str | None = None,
                 on_accept: Callable[[], None] | None = None):  # fmt: skip
        apply_rung(cfg)  # a ladder's shape (already applied when composed; applying it again changes nothing)
        validate(cfg)
        self.session_start = time.perf_counter()
        self.cfg, t = cfg, cfg.train
        self.dist, self.device = init_distributed(resolve_device(t.device), cpu_collectives=t.async_checkpoint)
        self.parallel = plan_parallel(cfg, self.dist, self.device)  # one process, ddp, fsdp or hsdp
        # under torchrun each rank's Hydra may name its own dir: rank 0's wins
        self.run_dir = run_dir = Path(self.dist.broadcast(str(run_dir)))
        if t.threads:
            torch.set_num_threads(t.threads)
        self.autocast = self.parallel.autocast()  # bf16 on CUDA (fsdp/hsdp: FSDP2's mixed-precision policy)
        if t.batch_size % (self.dist.world * t.grad_accum):
            raise ConfigError(f"train.batch_size={t.batch_size} is invalid: must be divisible by the number of "
                              f"processes ({self.dist.world}) x train.grad_accum ({t.grad_accum})")  # fmt: skip

        # --- checks: nothing is written before all of them pass -------------------------------------------
        self.data = load_data(cfg.data)
        vocab_note = record_vocabulary(cfg, self.data.vocab_size)  # model.vocab_size, in the config recorded below
        self.shape = apply_shape(cfg, vocab=self.data.vocab_size)  # shape=iso: solved again for this vocabulary
        # the rung's budget: tokens_per_param x budget x N (N needs the vocabulary)
        n_budget = set_budget(cfg, self.data.vocab_size) if cfg.ladder.name is not None else None
        self.config = to_container(cfg)
        check_finished(run_dir, self.config)  # every rank reads it, so all of them stop alike
        resume_from = ckpt.find_resume(run_dir, t.resume)
        saved = ckpt.load(resume_from, self.dist) if resume_from else None
        if saved is not None:
            diff = ckpt.config_differences(saved["config"], self.config)
            if diff:
                shown = ckpt.describe_differences(saved["config"], self.config, diff)
                raise ckpt.CheckpointError(
                    f"train.resume={str(resume_from)!r} is invalid: the checkpoint is of another config ({shown})"
                )
        self.forks = Forks(cfg, run_dir, self.config, n_budget, self.dist.main)  # ladder.budgets' decay branches
        check_length(self.data, cfg.model.context)
        longest = max(t.extrapolation, default=1) * cfg.model.context
        if len(self.data.val) < longest + 1:
            raise ConfigError(f"train.extrapolation={list(t.extrapolation)} is invalid: the validation split has "
                              f"{len(self.data.val)} tokens, fewer than {longest + 1}")  # fmt: skip
        check_step_memory(cfg, self.data.vocab_size, self.device, self.dist.world)
        self.downstream = Downstream(cfg, self.data.tokenizer, self.device, self.autocast)  # tasks read, encoded
        self.tokens_per_step = t.batch_size * cfg.model.context  # global, all ranks together
        tokens_cap = math.inf if t.max_tokens is None else math.ceil(t.max_tokens / self.tokens_per_step)
        # train.max_bytes: the steps that read that much text at the data's bytes/token (one line if max_steps cuts it)
        self.text_budget = text_budget(cfg, self.data, self.tokens_per_step)
        bytes_cap = math.inf if self.text_budget is None else self.text_budget.steps
        self.horizon = min(t.max_steps, tokens_cap, bytes_cap)  # the step the LR schedule ends at
        self.bpb_text = held_out_text(cfg, self.data)  # val/bpb's windows (None: data=tokens, val_bpb_bytes=0)
        self.weight_decay, self.wd_timescale = resolve_weight_decay(cfg, self.horizon)  # lambda and tau/T (optim.py)
        if saved is not None and saved["step"] > self.horizon:
            raise ckpt.CheckpointError(f"train.resume={str(resume_from)!r} is invalid: the checkpoint is at step "
                                       f"{saved['step']}, past this run's last step ({self.horizon})")  # fmt: skip
        if vocab_note and self.dist.main:
            print(f"lm-ablate: {vocab_note}", file=sys.stderr)
        if on_accept is not None and self.dist.main:
            on_accept()
        if saved is None and self.dist.main:
            _trim_metrics(run_dir, -1)  # a run killed before its first checkpoint starts over

        # --- build ------------------------------------------------------------------------------------------
        seed_everything(cfg.seed)
        self.model = model = TransformerLM(cfg, self.data.vocab_size).to(self.device)
        self.cost = model_cost(model, cfg)
        if self.shape is not None:
            self.shape.check(self.cost)  # the solver's count is the built model's
        self.parallel.prepare(model)  # activation checkpointing; fsdp/hsdp: shards (the optimizer holds them)
        self.regularizer = REGULARIZERS.build(with_weight_decay(cfg.regularization, self.weight_decay))
        self.optimizer = build_optimizer(cfg, model, self.regularizer, self.device)
        self.lr_at = build_schedule(cfg.optim, self.horizon)
        self.val = [
            (x.to(self.device), y.to(self.device))
            for x, y in val_batches(self.data.val, t.batch_size, cfg.model.context, t.eval_batches)
        ]
        self.bpb_text = self.bpb_text and self.bpb_text.to(self.device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.peak = (t.peak_flops or measured_peak_flops(self.device.type, dtype)) * self.dist.world
        self.grad_spikes = M.SpikeDetector(t.spike.window, t.spike.k)
        self.loss_spikes = M.SpikeDetector(t.spike.window, t.spike.k)
        self.meter = M.ThroughputMeter()
        self.progress = Progress()
        # the data's reference levels, for the stall rule and the analysis's cap (lm_ablate/stall.py)
        levels = data_levels(self.data, cache_root(cfg.data)) if self.dist.main else {}
        self.levels = {M.LOG_VOCAB: math.log(self.data.vocab_size), M.UNIGRAM_LOSS: levels.get("unigram_loss"),
                       M.BIGRAM_LOSS: levels.get("bigram_loss")}  # fmt: skip
        self.summary: dict[str, Any] = {
            M.STATUS: M.STATUS_RUNNING,
            M.RUN_NAME: name or run_name(cfg),
            M.GROUP: cfg.study,
            M.CHOICES: dict(cfg.choices),
            M.SEED: cfg.seed,
            M.PARAMS_TOTAL: self.cost.params_total,
            M.PARAMS_NON_EMBEDDING: self.cost.params_non_embedding,
            M.VOCAB_SIZE: self.data.vocab_size,
            **self.levels,
            M.FLOPS_PER_TOKEN: self.cost.flops_per_token,
            **({M.SHAPE: self.shape.record(self.cost)} if self.shape is not None else {}),
            M.PEAK_FLOPS: self.peak,
            M.FINAL_VAL_BPB: None,
            **self.bpb_record(),
            "world_size": self.dist.world,
            M.OPTIMIZER_PARAMS: getattr(self.optimizer, "assignment", None),
            M.WEIGHT_DECAY: self.weight_decay,
            M.WD_TIMESCALE: self.wd_timescale,
            M.DIVERGED_AT: None,
            M.ERROR: None,
        }
        self.fresh = saved is None
        if saved is not None:
            self._restore(saved)
        provenance.stamp(self.summary, self.device)  # what decides the digits: torch, CPU kernels, threads, device

        # what runs the step: DDP when there are several processes (fsdp/hsdp: the sharded model itself); with
        # train.compile the forward AND the loss are compiled as one function (the [tokens, vocab] log-softmax is
        # ~5% of a step; compiling the model alone left it eager: bench/throughput.py; fsdp/hsdp compile each
        # block instead). Probes, checkpoints and evaluation use the plain module.
        self.step_model: torch.nn.Module = self.parallel.wrap(model)
        self.forward_loss = self.parallel.compile_step(self._forward_loss) if t.compile else self._forward_loss

        self.tracker = Trackers(LocalRecord(run_dir), TRACKERS.build(cfg.tracking)) if self.dist.main else Tracker()
        self.info = RunInfo(run_dir, self.summary[M.RUN_NAME], cfg.study, run_tags(cfg), self.config,
                            resume_id=self.summary.get("wandb_id"))  # fmt: skip
        self.summary.update(self.tracker.start(self.info))
        self.summary[M.RESUMED_FROM] = self.progress.resumed_from
        self.tracker.summary(self.summary)
        self.wall_before = self.progress.wall_time_s
        self.session_steps = 0

    def _restore(self, saved: dict[str, Any]) -> None:
        """The state of the checkpoint we resume from: model, optimizer, detectors, sums, summary, RNG."""
        self.parallel.restore(self.model, self.optimizer, saved)  # either layout, into any (lm_ablate/sharding.py)
        self.grad_spikes.load_state_dict(saved["grad_spikes"])
        self.loss_spikes.load_state_dict(saved["loss_spikes"])
        self.meter = M.ThroughputMeter(**saved["meter"])
        self.progress = Progress(**saved["progress"])
        self.progress.resumed_from.append(self.progress.step)
        self.summary = {**saved["summary"], M.RUN_NAME: self.summary[M.RUN_NAME]}
        self.summary.update({"world_size": self.dist.world, M.PEAK_FLOPS: self.peak})  # this session's (resharded)
        if self.dist.main:
            _trim_metrics(self.run_dir, self.progress.step)
        ckpt.set_rng_state(saved["rng"])

    # --- the parts of a step -----------------------------------------------------------------------------
    def _forward_loss(self, xm: torch.Tensor, ym: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """logits, then (loss, cross-entropy, z-loss term) of one micro-batch."""
        with self.autocast():
            logits = self.step_model(xm)
        return logits, *self.regularizer.loss(logits, ym)

    def train_step(self, step: int, probe: StepProbe) -> dict[str, float]:
        """One optimizer step on the batch of ``step``; returns its metrics row (loss, grad norm, lr, speed)."""
        t, model, optimizer = self.cfg.train, self.model, self.optimizer
        x, y = get_batch(self.data.train, t.batch_size, self.cfg.model.context, self.cfg.seed, step)
        x = self.dist.shard(x).to(self.device, non_blocking=True)
        y = self.dist.shard(y).to(self.device, non_blocking=True)
        lr = self.cfg.optim.lr * self.lr_at(step - 1)
        set_lr(optimizer, lr)  # each group's lr: lr x its lr_scale (μP, Muon's AdamW part)

        tic = time.perf_counter()  # the probes' cost is inside the step time
        optimizer.zero_grad(set_to_none=True)
        ce_sum = torch.zeros((), device=self.device)
        z_sum = torch.zeros((), device=self.device)
        micro = list(zip(x.chunk(t.grad_accum), y.chunk(t.grad_accum)))
        for i, (xm, ym) in enumerate(micro):
            last = i == len(micro) - 1
            with self.parallel.accumulating(self.step_model, last):  # DDP's no_sync, FSDP2's reshard settings
                with probe.watch(xm, self.autocast):
                    logits, loss, ce, z = self.forward_loss(xm, ym)
                probe.logits(logits)
                (loss / len(micro)).backward()
            ce_sum, z_sum = ce_sum + ce.detach(), z_sum + z.detach()
        probe.after_backward()
        grad_norm = self.parallel.clip_grad_norm(model, self.regularizer.grad_clip or math.inf)  # global, pre-clip
        ce_value = self.dist.mean(ce_sum / len(micro)).item()
        norm_value = grad_norm.item()
        finite = math.isfinite(ce_value) and math.isfinite(norm_value)
        if finite:
            optimizer.step()
        seconds = time.perf_counter() - tic

        self.session_steps += 1
        if self.session_steps <= COLD_STEPS:  # lazy initialisation / compilation: not in the mean tokens/s
            p = self.progress
            p.cold_steps, p.cold_seconds = p.cold_steps + 1, p.cold_seconds + seconds
            if p.cold_steps == 1:  # the run's very first step (a resumed session's is not recorded)
                self.summary[M.FIRST_STEP_S] = seconds
            rate = self.tokens_per_step / max(seconds, 1e-12)
        else:
            rate = self.meter.update(self.tokens_per_step, seconds)
        row: dict[str, float] = dict(probe.stats)
        row.update({
            M.TRAIN_LOSS: ce_value,
            M.GRAD_NORM: norm_value,
            M.LR: lr,
            M.TOKENS: step * self.tokens_per_step,
            M.TOKENS_PER_SEC: rate,
            M.STEP_TIME_MS: 1000 * seconds,
            M.MFU: self.cost.flops_per_token * rate / self.peak,
        })  # fmt: skip
        if self.cfg.regularization.z_loss:
            row[M.TRAIN_Z_LOSS] = self.dist.mean(z_sum / len(micro)).item()
        return row

    def record(self, row: dict[str, float]) -> bool:
        """Spike detectors and running sums from a step's row; False when the step was not finite."""
        ce_value, norm_value = row[M.TRAIN_LOSS], row[M.GRAD_NORM]
        row[M.SPIKE_GRAD_NORM] = float(self.grad_spikes.update(norm_value))
        row[M.SPIKE_GRAD_NORM_COUNT] = self.grad_spikes.count
        row[M.SPIKE_LOSS] = float(self.loss_spikes.update(ce_value))
        row[M.SPIKE_LOSS_COUNT] = self.loss_spikes.count
        if math.isfinite(ce_value) and math.isfinite(norm_value):
            self.progress.recent_losses = [*self.progress.recent_losses, ce_value][-10:]
            return True
        self.progress.skipped += 1
        row[M.SKIPPED_STEPS] = self.progress.skipped
        return False

    def evaluate(self) -> float:
        """Validation loss now (fixed batches), appended to the run's list."""
        self.progress.val_losses.append(evaluate(self.model, self.val, self.autocast))
        self.progress.val_steps.append(self.progress.step)
        return self.progress.val_losses[-1]

    def val_bpb(self) -> float:
        """Bits per byte over the held-out text (lm_ablate/eval/bpb.py), the same text for every tokenizer."""
        return bits_per_byte(self.model, self.bpb_text, self.autocast)

    def bpb_record(self) -> dict[str, Any]:
        """What the summary says of val/bpb's text and of a text budget (lm_ablate/metrics.py)."""
        b, out = self.bpb_text, {}
        if b is None:
            none = "train.val_bpb_bytes=0" if self.cfg.train.val_bpb_bytes == 0 else M.NO_BPB_TEXT
            out[M.VAL_BPB_NOTE] = f"no val/bpb: {none}"
        else:
            out.update({M.VAL_BPB_BYTES: b.n_bytes, M.VAL_BPB_TOKENS: b.n_tokens})
        if self.text_budget is not None:
            out[M.TRAIN_BYTES_PER_TOKEN] = self.text_budget.bytes_per_token
        return out

    def evaluate_downstream(self, step: int, row: dict[str, Any], say: Callable[..., None] | None) -> None:
        """eval.tasks scored now into ``row`` and the summary; ``say`` (rank 0: the bar's write, which keeps the bar
        below the text) gets a line when the evaluation starts and one with its scores when it ends."""
        if say is not None:
            n = sum(len(examples) for _, examples in self.downstream.tasks)
            k = len(self.downstream.tasks)
            say(f"lm-ablate: step {step}: downstream evaluation of {k} task{'s' if k > 1 else ''} "
                f"({n:,} examples)...", file=sys.stderr)  # fmt: skip
        row.update(self.downstream.evaluate(self.model))
        self.downstream.summarize(self.summary, row)
        if say is not None:
            say(f"lm-ablate: step {step}: downstream evaluation done in {row[M.DOWNSTREAM_SECONDS]:.1f} s: "
                f"{downstream_scores(row)}", file=sys.stderr)  # fmt: skip

    def budget_spent(self, step: int) -> str | None:
        """Which budget ends the run at ``step``, if any: max_steps, max_tokens, max_bytes or max_time_s."""
        t = self.cfg.train
        if step >= self.horizon:
            if self.text_budget is not None and self.horizon == self.text_budget.steps:
                return "max_bytes"
            return "max_tokens" if self.horizon < t.max_steps else "max_steps"
        spent = self.meter.seconds + self.progress.cold_seconds  # every step's time, cold ones included
        if t.max_time_s is not None and self.dist.any(spent >= t.max_time_s, self.device):
            return "max_time_s"
        return None

    def snapshot(self) -> dict[str, Any]:
        """The summary with everything accumulated so far."""
        p = self.progress
        p.wall_time_s = self.wall_before + time.perf_counter() - self.session_start
        rate = self.meter.mean_tokens_per_sec if self.meter.seconds else None
        if rate is None and p.cold_seconds:  # every step so far was a cold one: their rate is all there is
            rate = p.cold_steps * self.tokens_per_step / p.cold_seconds
        if self.cfg.train.compile and self.meter.seconds and self.summary.get(M.FIRST_STEP_S) is not None:
            typical = self.meter.seconds * self.tokens_per_step / self.meter.tokens  # a warm step's time
            self.summary[M.COMPILE_TIME_S] = max(0.0, self.summary[M.FIRST_STEP_S] - typical)
        self.summary.update({
            M.FINAL_VAL_LOSS: p.val_losses[-1] if p.val_losses else None,
            M.BEST_VAL_LOSS: min((v for v in p.val_losses if math.isfinite(v)), default=None),
            M.FINAL_TRAIN_LOSS: float(np.mean(p.recent_losses)) if p.recent_losses else None,
            M.GRAD_NORM_SPIKES: self.grad_spikes.count,
            M.LOSS_SPIKES: self.loss_spikes.count,
            M.SKIPPED_STEPS: p.skipped,
            M.MEAN_TOKENS_PER_SEC: rate,
            M.THROUGHPUT_COLD_STEPS: p.cold_steps,
            M.MEAN_MFU: self.cost.flops_per_token * rate / self.peak if rate else None,
            M.STEPS: p.step,
            M.TOTAL_TOKENS: p.step * self.tokens_per_step,
            M.TRAIN_FLOPS: self.cost.flops_per_token * p.step * self.tokens_per_step,
            M.WALL_TIME_S: p.wall_time_s,
            **self.levels,  # a run resumed from a record written before they were kept gets them too
        })  # fmt: skip
        if self.text_budget is not None:
            self.summary[M.TRAIN_BYTES] = p.step * self.tokens_per_step * self.text_budget.bytes_per_token
        # [0] is the loss at step 0; a diverged run is diverged, not stalled
        diverged = self.summary.get(M.DIVERGED_AT) is not None
        why = None if diverged else stall.reason(p.val_losses[1:], self.levels[M.UNIGRAM_LOSS], p.val_steps[1:])
        self.summary.update({M.STALLED: why is not None, M.STALL_REASON: why, M.STALL_RULE: stall.RULE})
        return self.summary

    def save_checkpoint(self) -> None:
        """Everything the next step depends on (rank 0 writes; the others hold the same state; fsdp/hsdp: every
        rank writes its shards and RNG, lm_ablate/dcp.py). Model and optimizer: the strategy's (sharding.py)."""
        if not (self.dist.main or self.parallel.sharded):
            return
        self.snapshot()
        state = {
            "config": self.config,
            "rng": ckpt.rng_state(),
            "grad_spikes": self.grad_spikes.state_dict(),
            "loss_spikes": self.loss_spikes.state_dict(),
            "meter": asdict(self.meter),
            "progress": asdict(self.progress),
            "summary": dict(self.summary),
        }
        keep = self.cfg.train.keep_checkpoints
        self.parallel.save_checkpoint(self.run_dir, self.progress.step, self.model, self.optimizer, state, keep)

    def finish(self, status: str, stop_reason: str | None) -> dict[str, Any]:
        """The final summary, written by every tracker; the trackers are closed."""
        self.parallel.close(finished=status != M.STATUS_FAILED)  # a checkpoint still written in the background
        self.snapshot()
        self.summary[M.STATUS] = status
        self.summary[M.STOP_REASON] = stop_reason
        self.tracker.summary(self.summary)
        self.tracker.finish(status)
        self.dist.close()
        return self.summary

    # --- the loop ----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train until a budget, divergence or a signal stops the run; returns the final summary."""
        t, cfg, p = self.cfg.train, self.cfg, self.progress
        status, stop_reason = M.STATUS_RUNNING, None
        bar = _progress(t, self.info.name, p.step, self.horizon, self.dist.main)  # a ladder's: its budget's steps
        with StopSignals() as signals:
            try:
                if self.fresh:
                    self.tracker.log({M.VAL_LOSS: self.evaluate(), M.TOKENS: 0}, step=0)  # the loss at init
                else:  # killed after the last step's checkpoint but before the summary said so: nothing to train
                    stop_reason = self.budget_spent(p.step)
                    self.forks.catch_up(p.step)  # killed between a branch point's checkpoint and its branch
                while stop_reason is None:
                    step = p.step + 1
                    # probe the first step too: per-layer gradients at initialization (Xiong et al. 2020)
                    due = t.probe_every > 0 and (step == 1 or step % t.probe_every == 0)
                    probing = due and self.parallel.probes_here()  # rank 0 (fsdp/hsdp: every rank, collectives)
                    probe = self.parallel.probe(self.model, side_pass=t.compile) if probing else NO_PROBE
                    try:
                        row = self.train_step(step, probe)
                    except RuntimeError as err:
                        oom = out_of_memory(err, cfg, self.device)
                        if oom is None:
                            raise
                        raise ConfigError(oom) from None
                    p.step = step
                    if probing:
                        row[M.PEAK_MEM_MB] = peak_memory_mb(self.device)
                    finite = self.record(row)
                    if not finite and (t.divergence == "stop" or p.skipped > t.max_skipped_steps):
                        status, stop_reason = M.STATUS_DIVERGED, "diverged"
                        self.summary[M.DIVERGED_AT] = step
                        self.tracker.log(row, step)
                        break
                    stop_reason = self.budget_spent(step)
                    if step % t.eval_every == 0 or stop_reason:
                        row[M.VAL_LOSS] = self.evaluate()
                    if stop_reason and self.bpb_text is not None:  # at the end only: bench/val_bpb.py
                        row[M.VAL_BPB] = self.summary[M.FINAL_VAL_BPB] = self.val_bpb()
                    if self.downstream.due(step, final=bool(stop_reason)):  # eval.tasks (lm_ablate/eval/)
                        self.evaluate_downstream(step, row, bar.write if self.dist.main else None)
                    if stop_reason and t.extrapolation:
                        row.update(extrapolate(self.model, self.data.val, cfg, self.device, self.autocast))
                        self.summary["extrapolation"] = {k: row[M.val_loss_at(k)] for k in t.extrapolation}
                    evaluated = M.VAL_LOSS in row or M.DOWNSTREAM_SECONDS in row
                    if step % t.log_every == 0 or evaluated or not finite or probing:
                        self.tracker.log(row, step)
                    if evaluated:
                        self.tracker.summary(self.snapshot())
                    signalled = self.dist.any(signals.signum is not None, self.device)
                    fork = self.forks.due(step)  # a WSD-S branch point: checkpoint, then the branch's start
                    if stop_reason or (t.checkpoint_every and step % t.checkpoint_every == 0) or signalled or fork:
                        self.save_checkpoint()
                    if fork:
                        self.forks.fork(step)
                    bar.update(1)
                    bar.set_postfix(
                        loss=f"{row[M.TRAIN_LOSS]:.3f}", tok_s=f"{row[M.TOKENS_PER_SEC]:.0f}", refresh=False
                    )
                    if signalled and not stop_reason:
                        status, stop_reason = signals.status, signals.status
                if status == M.STATUS_RUNNING:
                    status = M.STATUS_COMPLETED
            except KeyboardInterrupt:  # a second Ctrl-C: stop now, no checkpoint of this step
                status, stop_reason = M.STATUS_INTERRUPTED, M.STATUS_INTERRUPTED
            except BaseException as err:  # record the failure, then let it propagate
                status = M.STATUS_FAILED
                self.summary[M.ERROR] = f"{type(err).__name__}: {err}"
                raise
            finally:
                bar.close()
                summary = self.finish(status, stop_reason)
        if status == M.STATUS_PREEMPTED and self.dist.main:  # one line, as for Ctrl-C, before the signal goes on
            name = signal.Signals(signals.signum).name if signals.signum else "a signal"
            print(f"lm-ablate: preempted by {name} at step {p.step}: checkpoint written to {self.run_dir} "
                  "(the same command, or the requeued job, resumes it)", file=sys.stderr, flush=True)  # fmt: skip
        signals.pass_on()
        if status == M.STATUS_INTERRUPTED:
            raise Interrupted(summary)
        return summary


def build_optimizer(cfg: DictConfig, model: torch.nn.Module, regularizer: Any, device: torch.device):
    """Parameter groups (weight decay from the regularizer; per-group ``lr_scale`` from the parametrization,
    where it sets one), then the ``optim`` option's optimizer over them."""
    groups = optimizer_groups(cfg, model, regularizer.param_groups(model))
    return OPTIMIZERS.build(cfg.optim, groups, device)


def train(
    cfg: DictConfig, run_dir: str | Path, name: str | None = None, on_accept: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Train one run (or continue it from its checkpoint) and write its record into ``run_dir``; returns the
    final summary. A finished run of the same config is returned as recorded, unchanged."""
    try:
        summary = Trainer(cfg, run_dir, name, on_accept).run()
    except AlreadyFinished as done:
        summary = done.summary
    train_branches(cfg, Path(run_dir), name, summary, train)  # ladder.budgets: a decay branch per smaller budget
    return summary


def _progress(t: DictConfig, name: str, initial: int, total: int, main: bool):
    """The step bar out of the run's last step (``total``: the horizon, which a token budget sets: a ladder's
    train.max_steps is 10^9)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=name[:60], disable=not (t.progress and main), leave=False,
                mininterval=1.0, file=sys.stderr)  # fmt: skip


_STARTED = False  # set once Hydra has composed the config: later errors are not composition errors


def _remove_if_new_and_empty(folder: Path, started: float, within: Path) -> None:
    """A refused launch changes nothing: remove the run folder Hydra made for it, then its parents inside
    ``within`` (outputs/<study>/ under the launch directory), each only while it is empty and was modified
    since this process started (an older empty folder is the user's and stays)."""
    folder, within = folder.resolve(), within.resolve()
    while True:
        try:
            if any(folder.iterdir()) or folder.stat().st_mtime < started:
                return
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
        if folder == within or within not in folder.parents:
            return


def _is_main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _error_line(line: str) -> None:
    """Bad input is one line: under torchrun every rank finds it, rank 0 says it (each exits 2)."""
    if _is_main_rank():
        print(f"lm-ablate: error: {line}", file=sys.stderr)


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
        hydra_node = OmegaConf.create({"hydra": OmegaConf.to_container(hc)})
        atomic_write_text(folder / "hydra.yaml", OmegaConf.to_yaml(hydra_node))
        atomic_write_text(folder / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(hc.overrides.task))))

    name = run_name(cfg, list(hc.overrides.task))
    summary = None
    try:
        apply_rung(cfg)  # before settle, as config.compose does: ladder.lr=mup turns on the keys mup reads
        settle(cfg, explicit_keys(hc.overrides.task))  # keys the chosen options do not read (lm_ablate/options.py)
        check_budget_keys(cfg)
        check_vocab_key(cfg)
        apply_shape(cfg, explicit_keys(hc.overrides.task))  # shape=iso: sizes solved from ratios (lm_ablate/shape.py)
        trainer = Trainer(cfg, out, name=name, on_accept=save_hydra_record)
    except AlreadyFinished as done:
        summary = s = done.summary
        if _is_main_rank():
            print(f"{s.get(M.STATUS)} (recorded earlier, unchanged): {s.get(M.RUN_NAME)}  "
                  f"val/loss={s.get(M.FINAL_VAL_LOSS)}{_downstream_said(s)}  -> {out}")  # fmt: skip
    except ConfigError as err:
        _error_line(str(err))
        _remove_if_new_and_empty(out, _LAUNCHED, Path.cwd())
        sys.exit(2)
    try:
        if summary is None:
            summary = trainer.run()
            _said(summary, out)
        train_branches(cfg, out, name, summary, train, _said)  # ladder.budgets: a decay branch per smaller budget
    except Interrupted as stop:
        print(f"lm-ablate: interrupted at step {stop.summary[M.STEPS]}: {out} (the same command resumes it)",
              file=sys.stderr)  # fmt: skip
        sys.exit(EXIT_INTERRUPTED)
    except ConfigError as err:  # found while training (out of memory): one line, recorded as failed
        _error_line(str(err))
        sys.exit(2)
    return summary.get(M.FINAL_VAL_LOSS)  # the objective for optimizing sweepers (Optuna, Nevergrad)


def _said(summary: dict[str, Any], out: Path) -> None:
    """The run's last line: status, name, final validation loss and, with eval.tasks, the final downstream scores."""
    if _is_main_rank():
        print(f"{summary[M.STATUS]}: {summary[M.RUN_NAME]}  val/loss={summary[M.FINAL_VAL_LOSS]}"
              f"{_downstream_said(summary)}  -> {out}")  # fmt: skip


def downstream_scores(values: dict[str, Any]) -> str:
    """``task acc=0.412 acc_norm=0.398 bpb=1.234, ...`` from the ``downstream/<task>/<kind>`` entries of a row or
    summary, in their order (4 significant digits)."""
    tasks: dict[str, list[str]] = {}
    for key, value in values.items():
        head, _, rest = key.partition("/")
        task, _, kind = rest.rpartition("/")
        if head == "downstream" and task and kind in M.DOWNSTREAM_KINDS and isinstance(value, (int, float)):
            tasks.setdefault(task, []).append(f"{kind}={value:.4g}")
    return ", ".join(f"{task} {' '.join(kinds)}" for task, kinds in tasks.items())


def _downstream_said(summary: dict[str, Any]) -> str:
    scores = downstream_scores(summary)
    return f"  downstream: {scores}" if scores else ""


_LAUNCHED = time.time()


def _run_dir_error(err: BaseException) -> str | None:
    """Hydra creates the run folder before the run starts: a folder that cannot be made is one line too."""
    if not isinstance(err, OSError) or err.filename is None:
        return None
    why = err.strerror or type(err).__name__
    return (f"hydra.run.dir={str(err.filename)!r} is invalid: cannot create the run folder there ({why}); "
            "allowed: a writable folder")  # fmt: skip


def cli() -> None:
    """``python -m lm_ablate.train``: Hydra's composition errors (unknown option or key, wrong type) become one
    line and exit 2 like every other bad input; HYDRA_FULL_ERROR=1 keeps Hydra's full report. A Ctrl-C outside a
    run's steps (while tokenizing, say) is one line and exit 130 too."""
    user_full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its multi-line report
    try:
        main()
    except KeyboardInterrupt:
        print("lm-ablate: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:
        line = None if (user_full or _STARTED) else compose_error_message(err) or _run_dir_error(err)
        if line is None:
            raise
        _error_line(line)
        sys.exit(2)


if __name__ == "__main__":
    # Run the copy that lives in the importable module, not in __main__: parallel launchers (joblib/loky,
    # submitit) pickle the task function, and one from __main__ would be pickled by value.
    from lm_ablate.train import cli as entry

    entry()
