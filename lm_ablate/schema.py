"""Structured-config schemas: one flat dataclass per axis, registered in Hydra's ConfigStore. The ground floor
with lm_ablate/errors.py: every component imports its schema from here, and this imports nothing else of ours.

``conf/train.yaml`` starts its defaults list with ``schema`` (the :class:`Config` below), so every group file
is merged into a typed node: an unknown key or a wrong type fails at start with Hydra's message naming the
key. Cross-field rules that types cannot express live in lm_ablate/validation.py, which raises :class:`ConfigError`
with one line naming the key, the value and what is allowed. A key only some options of its axis read (say
``optim.momentum``: muon, sgd) is Optional: null where the chosen option does not read it
(lm_ablate/options.py), its default where it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from lm_ablate.errors import bad

# what shape=iso sets, and the key that holds it instead (lm_ablate/shape.py); the analysis reads these as solved,
# not as axes of their own (analysis/compute/compare.py solved_sizes)
SHAPE_SETS = {
    "model.d_model": "shape.d_model",
    "model.n_layers": "shape.n_layers",
    "model.n_heads": "shape.n_heads",
    "model.head_dim": "shape.head_dim",
    "activation.d_ff": "shape.ffn_ratio",
}


@dataclass
class ModelConfig:
    name: str = MISSING  # size preset (file name in conf/model/)
    d_model: int = 128  # residual stream width
    n_layers: int = 4  # number of blocks
    n_heads: int = 4  # query heads
    head_dim: Optional[int] = None  # per-head width; None = d_model // n_heads (must then divide)
    context: int = 128  # training sequence length (tokens per sample)
    tie_embeddings: bool = False  # share the token embedding with the output layer (GPT-2, PaLM)
    init_std: float = 0.02  # std of the normal init of every matrix (GPT-2)
    scaled_residual_init: bool = True  # output projections of each sublayer use std / sqrt(2 * n_layers) (GPT-2)
    output_init_std: Optional[float] = None  # std of the untied LM head's init; None = init_std, 0 = zero head
    embed_scale: bool = False  # multiply token embeddings by sqrt(d_model) (Vaswani et al. 2017, Gemma)
    logit_softcap: Optional[float] = None  # logits -> c * tanh(logits / c) with c this value (Gemma 2); None = off
    block: str = "serial"  # serial: x + attn, then + ffn | parallel: x + attn(norm x) + ffn(norm x) (GPT-J, PaLM)
    parallel_norms: Optional[int] = 1  # parallel block: 1 shared input norm (PaLM, fused input matmul) | 2 (GPT-NeoX)
    head_bias: bool = False  # additive bias on the LM head, kept apart from a tied weight (GPT-J's lm_head)
    embed_norm: bool = False  # a norm of the norm group's type right after the token embedding (BLOOM)
    # width of the token embeddings and of the LM head's input; when it differs from d_model, bias-free linears
    # project_in (embed_dim -> d_model, before positions are added) and project_out (d_model -> embed_dim, after
    # the final norm) connect them to the stream (OPT-350m: 512 vs 1024; ALBERT's factorized embedding,
    # Lan et al. 2020). None = d_model (no projection)
    embed_dim: Optional[int] = None
    # how width enters init, LR and the logit / attention multipliers (lm_ablate/parametrization.py): sp (standard)
    # | mup (Yang et al. 2022, for AdamW: optim.lr tuned at mup_base_width transfers to other d_model)
    parametrization: str = "sp"
    mup_base_width: Optional[int] = None  # mup: the d_model at which mup's width factors are 1; ignored by sp
    # mup's base multipliers, tuned at the base width and kept across widths (lm_ablate/parametrization.py):
    mup_output_mult: Optional[float] = 1.0  # logits = W_out (output_mult h / m) + b (microsoft/mup's output_mult)
    mup_attn_mult: Optional[float] = 1.0  # attention scores = attn_mult q.k / head_dim (mutransformers' attn_mult)
    # the vocabulary the run trains with, set by the run from its data before config.yaml is written (256 for bytes,
    # the trained BPE's size, the pretrained tokenizer's, data.vocab_size for tokens); null on the command line
    vocab_size: Optional[int] = None


@dataclass
class NormConfig:
    name: str = MISSING  # layernorm | rmsnorm | none
    placement: str = "pre"  # pre | post | sandwich | reordered | deepnorm | rezero (components/placement.py)
    eps: Optional[float] = 1e-5  # added to the variance inside the square root
    bias: Optional[bool] = True  # LayerNorm's additive bias (ignored by RMSNorm, which has none)
    unit_offset: Optional[bool] = False  # rmsnorm only: gain (1 + w) with w initialised at 0, computed in fp32 (Gemma)
    final_norm: Optional[bool] = None  # norm before the LM head; None = the placement's default (see placement.py)
    deepnorm_alpha: Optional[float] = None  # deepnorm residual scale; None = (2 * n_layers)^(1/4) (Wang et al. 2022)
    deepnorm_beta: Optional[float] = None  # deepnorm init gain of V/out/FFN weights; None = (8 * n_layers)^(-1/4)


@dataclass
class PositionConfig:
    name: str = MISSING  # none | sinusoidal | learned | rope | alibi | t5
    theta: Optional[float] = 10000.0  # rope: base of the angles p * theta^(-2i/r) (Su et al. 2021)
    fraction: Optional[float] = 1.0  # rope: rotate only the first r = fraction * head_dim dims of a head (GPT-J/NeoX)
    layout: Optional[str] = "half"  # rope pairs: half (i, i + r/2) as HF, NeoX | interleaved (2i, 2i+1) as GPT-J
    num_buckets: Optional[int] = 32  # t5: distance buckets, half exact, half log-spaced (Raffel et al. 2020)
    max_distance: Optional[int] = 128  # t5: distances from here on share the last bucket


@dataclass
class ActivationConfig:
    name: str = MISSING  # ungated: relu | gelu | silu | relu2; gated: glu | reglu | geglu | swiglu | bilinear
    d_ff: Optional[int] = None  # hidden width; None = ungated 4*d, gated 8d/3 (the parameters of the ungated 4*d)
    multiple_of: Optional[int] = 8  # gated: the derived d_ff is rounded up to a multiple of this (hardware-friendly)
    bias: bool = False  # biases on the FFN projections
    approximate: Optional[str] = (
        "none"  # GELU form for gelu | geglu: none (exact erf) | tanh (GPT-2); ignored by the others
    )


@dataclass
class AttentionConfig:
    name: str = MISSING  # mha | gqa | mqa
    n_kv_heads: Optional[int] = None  # key/value heads; None = n_heads (MHA), 1 = MQA, in between = GQA
    bias: bool = False  # biases on the q/k/v/out projections
    qk_norm: str = "none"  # RMSNorm of q and k before RoPE: none | per_head (Qwen 3) | whole (OLMo 2)
    qk_norm_eps: Optional[float] = 1e-6  # eps of the QK-norm RMSNorms (Qwen 3 and OLMo 2 use 1e-6)
    softcap: Optional[float] = None  # logit cap c: scores -> c * tanh(scores / c) (Gemma 2: 50); None = off
    scale: Optional[float] = None  # logit scale; None = 1 / sqrt(head_dim)
    window: Optional[int] = None  # local layers: query i sees keys i - window < j <= i; None = all full
    global_every: int = 0  # with window: layer l is global iff (l + 1) % global_every == 0; 0 = all local


@dataclass
class RegularizationConfig:
    name: str = MISSING  # standard | none | dropout | zloss
    dropout: float = 0.0  # default rate of every dropout site below (embeddings, attention probs, residual branches)
    embedding_dropout: Optional[float] = None  # on the (position-added) embeddings; None = dropout
    attention_dropout: Optional[float] = None  # on the attention probabilities; None = dropout
    residual_dropout: Optional[float] = None  # on each sublayer output before it joins the stream; None = dropout
    # decoupled (AdamW); applied to matrices only unless the flags below say otherwise; null: derived from
    # optim.wd_timescale (lambda = 1 / (optim.lr x tau/T x steps), lm_ablate/optim.py)
    weight_decay: Optional[float] = 0.1
    decay_embeddings: bool = False  # also decay token/position embedding tables
    decay_norms_and_biases: bool = False  # also decay norm gains and biases (rarely wanted)
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping (the norm is logged before clipping)
    z_loss: float = 0.0  # coefficient of mean(log Z)^2 added to the loss (PaLM uses 1e-4)


@dataclass
class DataConfig:
    name: str = MISSING  # shakespeare | hf | tokens (ids tokenized elsewhere: nanoGPT .bin, OLMo .npy)
    tokenizer: str = "byte"  # byte (256 symbols) | bpe (trained on the training split, cached) | pretrained
    vocab_size: Optional[int] = (
        4096  # bpe: vocabulary size; tokens: size of the ids' vocabulary (byte, pretrained: ignored)
    )
    tokenizer_path: Optional[str] = None  # pretrained: tokenizer.json, a folder, or a hub name (gpt2, ...)
    tokenizer_sample: Optional[int] = None  # bpe: train on the first N bytes of training text; None = all of it
    num_proc: Optional[int] = None  # processes that tokenize; None = the CPU cores this process may use
    val_works: Optional[list[str]] = field(default_factory=list)  # shakespeare: works held out for validation
    path: Optional[str] = None  # hf: hub dataset name, or local .txt/.jsonl/.json/.parquet file(s) or folder;
    # tokens: a folder, file or glob of .bin / .npy token files
    hf_config: Optional[str] = None  # hf: dataset configuration name
    text_field: Optional[str] = "text"  # hf: column holding the text
    train_split: Optional[str] = "train"  # hf: split to train on; tokens: files named train* are the training shards
    val_split: Optional[str] = None  # hf, tokens: validation split; None = hold out val_fraction of docs/shards
    val_fraction: Optional[float] = (
        0.05  # hf, tokens: share of documents (shards) held out when there is no validation split
    )
    max_docs: Optional[int] = None  # hf: use only the first N documents (quick runs on big sets)
    streaming: Optional[bool] = False  # hf: stream the hub dataset instead of downloading it (needs max_tokens)
    max_tokens: Optional[int] = None  # hf: stop after N training tokens (a named val split: val_fraction x N)
    dtype: Optional[str] = (
        "uint16"  # tokens: uint16 | uint32, the ids' type in headerless files (.npy headers say their own)
    )
    # tokenized memmaps and trained tokenizers, keyed by content hash; $LM_ABLATE_CACHE if set
    cache_dir: str = "${oc.env:LM_ABLATE_CACHE,.cache/lm_ablate}"


@dataclass
class OptimConfig:
    name: str = MISSING  # adamw | muon | adafactor | sgd (update rules: lm_ablate/optim.py)
    lr: float = 3e-3  # peak learning rate (adafactor: the relative step, scaled by each parameter's RMS)
    beta1: Optional[float] = 0.9  # adamw, and muon's AdamW part
    beta2: Optional[float] = 0.95  # 0.95 rather than 0.999 is the usual LM choice (GPT-3, LLaMA)
    eps: Optional[float] = (
        1e-8  # adamw (and muon's AdamW part): added to sqrt(v); adafactor: floor of sqrt(v) (torch's eps1)
    )
    momentum: Optional[float] = 0.9  # sgd: heavy-ball coefficient; muon: EMA of its buffer (0.95 in muon.yaml)
    nesterov: Optional[bool] = False  # sgd and muon: Nesterov momentum (muon.yaml: true, as Jordan et al. 2024)
    adjust_lr_fn: Optional[str] = "match_rms_adamw"  # muon: original (Jordan) | match_rms_adamw (Liu et al. 2025)
    ns_steps: Optional[int] = 5  # muon: Newton-Schulz iterations of the orthogonalization
    muon_lr_scale: Optional[float] = 1.0  # muon: its groups' LR = this x AdamW's; 1 with match_rms_adamw
    beta2_decay: Optional[float] = -0.8  # adafactor: 1 - beta2_t = t^beta2_decay (Shazeer & Stern 2018)
    eps2: Optional[float] = 1e-3  # adafactor: floor of the parameter scale, step = max(eps2, RMS(p)) x lr
    clip_threshold: Optional[float] = 1.0  # adafactor: the update U is divided by max(1, RMS(U) / clip_threshold)
    warmup_steps: int = 0  # linear warmup from 0 to lr; 0 = start at the peak
    schedule: str = "cosine"  # cosine | constant | wsd | inverse_sqrt (after warmup; optim.py)
    min_lr_ratio: Optional[float] = 0.1  # cosine and wsd decay to lr * min_lr_ratio at the last step
    decay_fraction: Optional[float] = 0.2  # wsd: share of the steps spent decaying at the end (Hägele et al. 2024)
    # adamw, muon, adafactor: weight decay as the EMA timescale tau/T, a fraction of the run (Wang & Aitchison 2024);
    # sets lambda = 1 / (lr x tau/T x steps) instead of regularization.weight_decay; null = use that; inf = no decay
    wd_timescale: Optional[float] = None


@dataclass
class TrackingConfig:
    name: str = MISSING  # wandb | none (the local run record is always written)
    project: Optional[str] = "lm-ablate"  # W&B project
    entity: Optional[str] = None  # W&B entity (user or team); None = the default of the logged-in user
    mode: Optional[str] = None  # online | offline | disabled; None = $WANDB_MODE, else online
    tags: Optional[list[str]] = field(default_factory=list)  # extra W&B tags (the axis choices are always added)


@dataclass
class SpikeConfig:
    window: int = 50  # previous steps the rolling mean/std is taken over (OLMo-core: 128; our runs are short)
    k: float = 6.0  # a spike exceeds the rolling mean by more than k rolling standard deviations


@dataclass
class TrainConfig:
    max_steps: int = 200  # optimizer steps
    batch_size: int = 16  # sequences per step
    eval_every: int = 50  # steps between validation passes (and one at the end)
    eval_batches: int = 8  # batches per validation pass (fixed, seeded, the same for every run)
    log_every: int = 1  # steps between metric rows
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: Optional[int] = None  # torch intra-op threads on CPU; None = torch's default
    progress: bool = True  # progress bar with loss and tokens/s
    divergence: str = "stop"  # non-finite loss or grad norm: stop (status diverged) | skip (drop that update)
    max_skipped_steps: int = 20  # with divergence=skip: after this many skipped updates the run is diverged
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    max_tokens: Optional[int] = None  # also stop after this many tokens (equal-token comparisons)
    # stop after this many UTF-8 bytes of training text, whatever the tokenizer (steps from its measured bytes/token):
    # arms with different tokenizers read the same text (a vocabulary study); train.max_steps must not cut it short
    max_bytes: Optional[int] = None
    val_bpb_bytes: int = 3072  # held-out text of val/bpb, scored at the end (lm_ablate/eval/bpb.py); 0 = off
    max_time_s: Optional[float] = None  # also stop after this much training time (equal-wall-time comparisons)
    grad_accum: int = 1  # micro-batches per optimizer step (batch_size is the global batch and must divide)
    compile: bool = False  # torch.compile the forward + loss (probes, eval and checkpoints use the plain module)
    probe_every: int = 10  # steps between stability probes (per-layer stats, logit growth); 0 = off
    peak_flops: Optional[float] = None  # FLOP/s that MFU is measured against; None = a short matmul probe
    extrapolation: list[int] = field(default_factory=list)  # at the end, val loss at k x context for each k
    checkpoint_every: int = 100  # steps between checkpoints (one is also written at the end); 0 = only at the end
    keep_checkpoints: int = 1  # how many of the newest checkpoints to keep
    resume: str = "auto"  # auto: continue from the run dir's newest checkpoint | never | a checkpoint path
    # how the ranks under torchrun share the model (lm_ablate/sharding.py): ddp (each holds all of it) | fsdp (FSDP2:
    # parameters, gradients, optimizer state sharded over the ranks) | hsdp (sharded within train.shard_size ranks,
    # replicated across); one process ignores it
    parallel: str = "ddp"
    shard_size: Optional[int] = None  # hsdp: ranks one copy is sharded over; None = LOCAL_WORLD_SIZE (one node)
    # recompute blocks' activations in backward (torch's checkpoint_wrapper): none | full (every block) | selective
    activation_checkpointing: str = "none"
    ac_every: Optional[int] = 2  # selective: block i is recomputed iff (i + 1) % ac_every == 0
    async_checkpoint: bool = False  # fsdp/hsdp: checkpoints written in the background (DCP async_save)


@dataclass
class LadderConfig:
    """A model ladder (lm_ablate/ladder.py): the sweep varies ``ladder.rung``; each run trains that rung's shape
    for ``tokens_per_param`` x its non-embedding parameters (Hoffmann et al. 2022: 20)."""

    name: Optional[str] = None  # cpu | gpu (conf/ladder/); null = no ladder (the model group's size is used)
    rung: Optional[int] = 0  # index into rungs of the shape this run trains
    rungs: Optional[list[dict[str, int]]] = field(
        default_factory=list
    )  # shapes, smallest first: d_model, n_layers, n_heads, ...
    tokens_per_param: Optional[float] = 20.0  # token budget per non-embedding parameter (sets train.max_tokens)
    lr: Optional[str] = "fixed"  # per-rung LR rule: fixed (optim.lr everywhere) | grid (sweep crosses optim.lr) | mup
    params: Optional[str] = "non_embedding"  # the N of the budget and of L(N, D) fits: non_embedding | total
    budgets: Optional[list[float]] = None  # WSD-S: budgets as multiples of tokens_per_param x N, increasing; one
    # run trains the largest and branches a decay at each smaller one (lm_ablate/budgets.py); null = [1]
    budget: Optional[float] = None  # the one budget this record trains (a branch, or a run of one budget); null =
    # the largest of budgets, with a branch for each of the others
    fit: Optional[str] = "auto"  # the scaling fit the report's claims use (docs/ladders.md): auto | per_arm |
    # shared_e | shared_e_alpha | nd_per_arm | nd_shared_e | nd_shared_exponents
    fit_budgets: Optional[list[float]] = None  # the budgets whose cells the scaling fits use, a subset of budgets
    # (e.g. those past an early plateau); null = every budget. The report's --fit-budgets refits recorded runs
    tune: Optional[list[str]] = field(default_factory=list)  # keys besides optim.lr that the sweep varies within
    # every arm and the report tunes per (arm, rung, budget) cell: each cell is fitted at the setting (these keys
    # and the LR) with the lowest mean final loss; allowed: model.mup_output_mult | mup_attn_mult | init_std


@dataclass
class ShapeConfig:
    """An iso-parameter shape (lm_ablate/shape.py): model.d_model, n_layers, n_heads, head_dim and activation.d_ff
    solved from ratios at a target non-embedding parameter count. ``none``: the model and activation groups'
    sizes as given (every other key null)."""

    name: str = "none"  # none | iso (conf/shape/)
    target_params: Optional[float] = None  # iso: N, non-embedding parameters as the run counts them (model_cost)
    ffn_ratio: Optional[float] = None  # d_ff / d_model (gated too: 8/3 there matches 4 ungated); null = the
    # activation's own rule (4d, gated 8d/3), or d_ff solved for N when d_model and n_layers are both pinned
    aspect: Optional[float] = None  # d_model / n_layers, the closest the integers allow
    attn_ratio: Optional[float] = None  # n_heads x head_dim / d_model (Kaplan's d_attn / d_model); iso: 1
    head_dim: Optional[int] = None  # held exactly (must divide attn_ratio x d_model)
    n_heads: Optional[int] = None  # held exactly (instead of head_dim)
    head_dim_target: Optional[int] = None  # neither held: the head dim is the divisor nearest this; iso: 32
    d_model: Optional[int] = None  # held
    n_layers: Optional[int] = None  # held
    d_ff_multiple: Optional[int] = None  # d_ff is a multiple of this; iso: 1
    tolerance: Optional[float] = None  # |N - target| / target at most this; iso: 0.02


@dataclass
class EvalTaskConfig:
    """One downstream task (lm_ablate/eval/tasks.py): where its rows come from and how they become examples."""

    name: str = MISSING  # the metric prefix: downstream/<name>/{acc,acc_norm,bpb}
    format: str = MISSING  # row -> example: arc | hellaswag | piqa | winogrande | openbookqa | csqa | siqa |
    # lambada | mc (context, choices, gold) | shakespeare_order | shakespeare_next_line (embedded, no path)
    path: Optional[str] = None  # a hub dataset or a local dataset folder (datasets), or a local .jsonl file
    subset: Optional[str] = None  # the hub dataset's configuration (ARC-Easy, winogrande_xl, ...)
    split: Optional[str] = None  # the split to score (validation, test)


@dataclass
class EvalConfig:
    """Downstream evaluation inside the loop (conf/eval/: one file per task set; lm_ablate/eval/)."""

    name: str = "none"  # the task set (file name in conf/eval/); none = no downstream evaluation
    tasks: list[EvalTaskConfig] = field(default_factory=list)
    every: Optional[int] = None  # steps between evaluations (and one at the end); null = only at the end
    max_examples: Optional[int] = None  # the first N examples of each task (fast in-loop subsets); null = all
    batch_tokens: int = 4096  # tokens per forward pass (padding included): bounds memory at batch x length x vocab


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    activation: ActivationConfig = field(default_factory=ActivationConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    regularization: RegularizationConfig = field(default_factory=RegularizationConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ladder: LadderConfig = field(default_factory=LadderConfig)
    shape: ShapeConfig = field(default_factory=ShapeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0  # seeds init, data order and dropout; the same seed gives the same curve
    study: str = "default"  # name of the study: W&B group and report title
    choices: dict[str, Optional[str]] = field(default_factory=dict)  # filled at run time from Hydra
    # the literature's claims the study tests (lm_ablate/claim_spec.py), set by its experiment file; bookkeeping:
    # they change no computation, and the report decides each from the runs (analysis/claims.py)
    claims: list[Any] = field(default_factory=list)


def reference_lr(multiplier: float, _root_: DictConfig) -> float:
    """``${ref_lr:k}`` = k x the reference learning rate of the run's optimizer, the ``lr`` of
    conf/optim/<optim.name>.yaml. A sweep over ``optim`` with ``optim.lr: ${ref_lr:0.5},${ref_lr:1},...`` gives
    every optimizer its own grid around its own reference, no run spent on another optimizer's range
    (sweeps/optimizer.yaml); the run record holds the resolved number."""
    name = _root_.optim.name
    path = CONF_DIR / "optim" / f"{name}.yaml"
    if not path.is_file():
        raise bad("optim.name", name, "${ref_lr:k} reads the lr of conf/optim/<optim.name>.yaml, not found")
    return float(multiplier) * float(OmegaConf.load(path).lr)


def register_configs() -> None:
    ConfigStore.instance().store(name="schema", node=Config)
    if not OmegaConf.has_resolver("ref_lr"):
        OmegaConf.register_new_resolver("ref_lr", reference_lr)


register_configs()

AXES = ("norm", "position", "activation", "attention", "regularization")
GROUPS = ("model",) + AXES + ("data", "optim", "tracking")


def head_dim(model: ModelConfig) -> int:
    return model.head_dim or model.d_model // model.n_heads


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]


CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
