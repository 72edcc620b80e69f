"""Metric names, the run-record layout, and the metric processors the loop feeds.

Every name that the training loop logs and that ``analysis/`` reads is defined here once. Names are
'/'-namespaced so W&B groups them into panels (``train/``, ``val/``, ``optim/``, ``perf/``, ``spike/``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# --- per-step metrics (metrics.jsonl rows and W&B history) --------------------------------------------
STEP = "step"
TRAIN_LOSS = "train/loss"  # cross-entropy only, so arms with and without z-loss compare on the same quantity
TRAIN_Z_LOSS = "train/z_loss"  # coef * mean(log Z)^2, logged when regularization.z_loss > 0
VAL_LOSS = "val/loss"  # mean cross-entropy over the held-out split (nats/token)
# at the end: bits per byte over the held-out text, the same text for every tokenizer (lm_ablate/eval/bpb.py); the
# metric to compare arms with different tokenizers on (their per-token losses are losses of different tokens)
VAL_BPB = "val/bpb"
VAL_LOSS_AT = "val/loss@{k}x"  # at the end: val loss at k times the training context (length extrapolation)


def val_loss_at(k: int) -> str:
    return VAL_LOSS_AT.format(k=k)


GRAD_NORM = "optim/grad_norm"  # global L2 norm of the gradient *before* clipping
LR = "optim/lr"
TOKENS = "perf/tokens"  # tokens consumed so far (x-axis for equal-token comparisons)
TOKENS_PER_SEC = "perf/tokens_per_sec"
STEP_TIME_MS = "perf/step_time_ms"
MFU = "perf/mfu"  # model FLOPs utilisation against train.peak_flops or the measured matmul peak
PEAK_MEM_MB = "perf/peak_mem_mb"  # CUDA max allocated, or the process's peak RSS on CPU
SPIKE_GRAD_NORM = "spike/grad_norm"  # 1.0 on a step whose grad norm is a spike, else 0.0
SPIKE_GRAD_NORM_COUNT = "spike/grad_norm_count"  # running count
SPIKE_LOSS = "spike/loss"
SPIKE_LOSS_COUNT = "spike/loss_count"

# stability probes (every train.probe_every steps; lm_ablate/probes.py)
LOGITS_MAX_ABS = "logits/max_abs"  # max |output logit| on the step's batch
LOGITS_MEAN_LOG_Z = "logits/mean_log_z"  # mean log-partition of the output softmax (what z-loss pushes to 0)
RESIDUAL_RMS = "residual_rms"  # per layer: RMS of the residual stream after the block
MAX_ATTN_LOGIT = "max_attn_logit"  # per layer: max pre-softmax attention logit (scaled q.k, before softcap)
GRAD_NORM_LAYER = "grad_norm"  # per layer: L2 norm of the block's gradient, before clipping
PARAM_NORM = "param_norm"  # per layer: L2 norm of the block's parameters
LAYER_PREFIX = "layer/"


def layer_metric(layer: int, name: str) -> str:
    """Per-layer metric name, e.g. ``layer/3/grad_norm``."""
    return f"{LAYER_PREFIX}{layer}/{name}"


# downstream evaluation (eval.tasks, lm_ablate/eval/): every eval.every steps and at the end, in metrics.jsonl rows
# and, the last values, under the same names in summary.json
DOWNSTREAM = "downstream/{task}/{kind}"
DOWNSTREAM_KINDS = ("acc", "acc_norm", "bpb")  # lm_ablate/eval/scorer.py; one-choice tasks (lambada): no acc_norm
DOWNSTREAM_SECONDS = "perf/downstream_s"  # wall seconds of that step's downstream evaluation, all tasks


def downstream(task: str, kind: str) -> str:
    """Downstream metric name, e.g. ``downstream/shakespeare_order/acc``."""
    return DOWNSTREAM.format(task=task, kind=kind)


# lm-evaluation-harness results of a finished run (python -m lm_ablate.evaluate), beside its record
LM_EVAL_FILE = "lm_eval.json"  # {"tasks": {task: {metric: value}}, "step": N, ...}
LM_EVAL = "lm_eval/{task}/{metric}"


def lm_eval_metric(task: str, metric: str) -> str:
    """Name of an lm-eval result, e.g. ``lm_eval/hellaswag/acc_norm`` (metric without lm-eval's ``,none``)."""
    return LM_EVAL.format(task=task, metric=metric)


# --- run record files (in the Hydra output directory of each run) --------------------------------------
CONFIG_FILE = "config.yaml"  # resolved config, plus `choices` (the option picked in each group)
METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step: {"step": int, <metric name>: float, ...}
SUMMARY_FILE = "summary.json"  # written atomically at start, at each eval and at the end

# --- summary.json keys ---------------------------------------------------------------------------------
STATUS = "status"
STATUS_RUNNING = "running"
STATUS_COMPLETED = "completed"
STATUS_DIVERGED = "diverged"
STATUS_FAILED = "failed"
STATUS_PREEMPTED = "preempted"  # stopped by SIGTERM/SIGUSR1 after writing a checkpoint; resumes on restart
STATUS_INTERRUPTED = "interrupted"  # stopped by Ctrl-C (after a checkpoint); the same command resumes it
STATUSES = (STATUS_RUNNING, STATUS_COMPLETED, STATUS_DIVERGED, STATUS_FAILED, STATUS_PREEMPTED, STATUS_INTERRUPTED)
RUN_NAME = "run_name"
GROUP = "group"
CHOICES = "choices"  # {group: option} from Hydra's runtime choices
SEED = "seed"
FINAL_VAL_LOSS = "final_val_loss"
FINAL_VAL_BPB = "final_val_bpb"  # val/bpb at the end; absent in runs made before it existed, null for data=tokens
VAL_BPB_BYTES = "val_bpb_bytes"  # UTF-8 bytes of the held-out text val/bpb is over (its denominator / ln 2)
VAL_BPB_TOKENS = "val_bpb_tokens"  # the tokens the run's tokenizer makes of that text (each one predicted once)
VAL_BPB_NOTE = "val_bpb_note"  # why a run has no val/bpb (data=tokens: no text; train.val_bpb_bytes=0: off)
NO_BPB_TEXT = "data=tokens holds token ids, not text"
NO_BPB_RECORDED = "not recorded (run predates val bits per byte)"  # what analysis says of an old run's val/bpb
TRAIN_BYTES_PER_TOKEN = "train_bytes_per_token"  # train.max_bytes: UTF-8 bytes of training text per token
TRAIN_BYTES = "train_bytes"  # train.max_bytes: tokens seen x train_bytes_per_token (the text read, expected)
TRAIN_FLOPS = "train_flops"  # flops_per_token x tokens seen: the run's training compute C
BEST_VAL_LOSS = "best_val_loss"
FINAL_TRAIN_LOSS = "final_train_loss"
GRAD_NORM_SPIKES = "grad_norm_spikes"
LOSS_SPIKES = "loss_spikes"
MEAN_TOKENS_PER_SEC = "mean_tokens_per_sec"  # training step only, the first step of each session left out
THROUGHPUT_COLD_STEPS = "throughput_cold_steps"  # how many steps that leaves out (one per session)
FIRST_STEP_S = "first_step_s"  # wall time of the run's first step (lazy initialisation; compilation too)
COMPILE_TIME_S = "compile_time_s"  # train.compile: the first step's time minus a warm step's (cold compile)
FLOPS_PER_TOKEN = "flops_per_token"  # training FLOPs per token (lm_ablate.model.model_cost)
SHAPE = "shape"  # shape=iso: {target_params, params_non_embedding, params_total, relative_error, d_model, n_layers,
# n_heads, head_dim, d_ff, ffn_ratio, aspect, attn_ratio, flops_per_token} (lm_ablate/shape.py); absent otherwise
OPTIMIZER_PARAMS = "optimizer_params"  # {optimizer: [parameter names]}: which parameters each one updates
MEAN_MFU = "mean_mfu"
PEAK_FLOPS = "peak_flops"
STOP_REASON = "stop_reason"  # max_steps | max_tokens | max_time_s | diverged | preempted
PARAMS_TOTAL = "params_total"
PARAMS_NON_EMBEDDING = "params_non_embedding"
VOCAB_SIZE = "vocab_size"  # the vocabulary the model is built with (model.vocab_size: the tokenizer's)
LOG_VOCAB = "log_vocab"  # ln(vocab_size): the loss of the uniform prediction (the cap of capped_val_loss)
UNIGRAM_LOSS = "unigram_loss"  # val cross-entropy under the train split's unigram distribution (data/unigram.py)
BIGRAM_LOSS = "bigram_loss"  # ... under its bigram distribution (data/unigram.py; null for a vocabulary > 4096)
STALLED = "stalled"  # true when the run sits on the unigram plateau or stopped learning (lm_ablate/stall.py)
STALL_REASON = "stall_reason"  # which part of the rule: "unigram" | "flat" | null
STALL_RULE = "stall_rule"  # the rule in words, with its thresholds (lm_ablate.stall.RULE)
STEPS = "steps"
TOTAL_TOKENS = "tokens"
WALL_TIME_S = "wall_time_s"
DIVERGED_AT = "diverged_at_step"
SKIPPED_STEPS = "skipped_steps"  # updates dropped for a non-finite loss/grad norm (train.divergence=skip)
RESUMED_FROM = "resumed_from_step"  # steps of each resume, in order
ERROR = "error"
WEIGHT_DECAY = "weight_decay"  # the run's lambda: regularization.weight_decay, or derived from optim.wd_timescale
WD_TIMESCALE = "wd_timescale"  # tau/T = 1 / (optim.lr x lambda x steps) (Wang & Aitchison 2024); Infinity for lambda 0
DOWNSTREAM_EVAL_S = "downstream_eval_s"  # mean wall seconds of one downstream evaluation (all tasks)
DOWNSTREAM_EVALS = "downstream_evals"  # how many downstream evaluations the run made
DOWNSTREAM_EXAMPLES = "downstream_examples"  # {task: examples scored per evaluation}
# what decides a run's digits besides its config (lm_ablate/provenance.py): this session's values
TORCH_VERSION = "torch_version"  # torch.__version__
CPU_CAPABILITY = "cpu_capability"  # torch.backends.cpu.get_cpu_capability(): the kernels ATen dispatches to
CPU_MODEL = "cpu_model"  # /proc/cpuinfo's model name: matmul libraries (MKL, oneDNN) pick their kernels by the CPU
THREADS = "threads"  # torch.get_num_threads() while training
DEVICE = "device"  # cpu | cuda | mps
CUDA_VERSION = "cuda_version"  # torch.version.cuda (null on CPU)
CUDNN_VERSION = "cudnn_version"  # torch.backends.cudnn.version() (null on CPU)
GPU_NAME = "gpu_name"  # torch.cuda.get_device_name (null on CPU)
PROVENANCE = (TORCH_VERSION, CPU_CAPABILITY, CPU_MODEL, THREADS, DEVICE, CUDA_VERSION, CUDNN_VERSION, GPU_NAME)
PROVENANCE_EARLIER = "provenance_earlier"  # a resumed run's earlier sessions whose provenance differed, in order

# --- JSON of the run record ------------------------------------------------------------------------------
# Run records are strict JSON (jq, JavaScript and Go read them): a non-finite float is written as one of these
# strings (JavaScript's own spellings); a value that does not exist (val loss past a learned position table) is
# null. Readers turn the strings back into floats with ``from_json``.
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def to_json(value):
    """``value`` with every non-finite float (in nested dicts and lists too) replaced by its string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def from_json(value):
    """The inverse of :func:`to_json` (strings of NONFINITE back to floats), for readers of run records."""
    if isinstance(value, str):
        return NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


class SpikeDetector:
    """Flags values that jump far above their recent history.

    Definition: with the window holding the previous ``window`` values x_{t-W..t-1}, step t is a spike when

        x_t > mean(window) + k * std(window)          (population std)

    and only once the window is full (the first ``window`` steps are never spikes). Every finite value enters
    the window, spikes included: a lasting shift of level is absorbed after ``window`` steps instead of being
    flagged forever, at the price that a spike raises the threshold for the spikes right after it.
    Non-finite values are never spikes here (divergence is handled by the loop) and do not enter the window.
    OLMo-core uses window 128 and k = 6 for its loss-spike detector; our defaults follow it.
    """

    def __init__(self, window: int = 128, k: float = 6.0):
        if window < 2:
            raise ValueError(f"spike window must be >= 2, got {window}")
        self.window = window
        self.k = k
        self.values: deque[float] = deque(maxlen=window)
        self.count = 0

    def threshold(self) -> float:
        if len(self.values) < self.window:
            return math.inf
        n = len(self.values)
        mean = sum(self.values) / n
        var = sum((v - mean) ** 2 for v in self.values) / n
        return mean + self.k * math.sqrt(var)

    def update(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        spike = value > self.threshold()
        self.count += int(spike)
        self.values.append(value)
        return spike

    def state_dict(self) -> dict:
        return {"window": self.window, "k": self.k, "values": list(self.values), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.window, self.k = int(state["window"]), float(state["k"])
        self.values = deque((float(v) for v in state["values"]), maxlen=self.window)
        self.count = int(state["count"])


@dataclass
class ThroughputMeter:
    """Tokens/s of the training step (forward, backward, optimizer), excluding evaluation and logging."""

    tokens: int = 0
    seconds: float = 0.0

    def update(self, tokens: int, seconds: float) -> float:
        self.tokens += tokens
        self.seconds += seconds
        return tokens / max(seconds, 1e-12)

    @property
    def mean_tokens_per_sec(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")
