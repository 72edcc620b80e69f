"""Structured-config schemas: one flat dataclass per axis, registered in Hydra's ConfigStore.

``conf/train.yaml`` starts its defaults list with ``schema`` (the :class:`Config` below), so every group file
is merged into a typed node: an unknown key or a wrong type fails at start with Hydra's message naming the
key. Cross-field rules that types cannot express live in :func:`validate`, which raises :class:`ConfigError`
with one line naming the key, the value and what is allowed. A key only some options of its axis read (say
``optim.momentum``: muon, sgd) is Optional: null where the chosen option does not read it
(lm_ablate/options.py), its default where it does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from lm_ablate.errors import ConfigError, bad  # noqa: F401 (re-exported: the schema's users import them here)


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
    mup_base_width: Optional[int] = None  # mup: the d_model at which mup's multipliers are 1; ignored by sp
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
    multiple_of: Optional[int] = (
        8  # the derived gated d_ff is rounded up to a multiple of this (hardware-friendly shapes)
    )
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
    weight_decay: float = 0.1  # decoupled (AdamW); applied to matrices only unless the flags below say otherwise
    decay_embeddings: bool = False  # also decay token/position embedding tables
    decay_norms_and_biases: bool = False  # also decay norm gains and biases (rarely wanted)
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping (the norm is logged before clipping)
    z_loss: float = 0.0  # coefficient of mean(log Z)^2 added to the loss (PaLM uses 1e-4)


@dataclass
class DataConfig:
    name: str = MISSING  # shakespeare | hf | tokens (ids tokenized elsewhere: nanoGPT .bin, OLMo .npy)
    tokenizer: str = "byte"  # byte (256 symbols) | bpe (trained on the training split, cached) | pretrained
    vocab_size: int = 4096  # bpe: vocabulary size; tokens: size of the ids' vocabulary (byte, pretrained: ignored)
    tokenizer_path: Optional[str] = None  # pretrained: tokenizer.json, a folder, or a hub name (gpt2, ...)
    tokenizer_sample: Optional[int] = None  # bpe: train on the first N bytes of training text; None = all of it
    num_proc: Optional[int] = None  # processes that tokenize; None = the CPU cores this process may use
    val_works: list[str] = field(default_factory=list)  # shakespeare: works held out for validation
    path: Optional[str] = None  # hf: hub dataset name, or local .txt/.jsonl/.json/.parquet file(s) or folder;
    # tokens: a folder, file or glob of .bin / .npy token files
    hf_config: Optional[str] = None  # hf: dataset configuration name
    text_field: str = "text"  # hf: column holding the text
    train_split: str = "train"  # hf: split to train on; tokens: files named train* are the training shards
    val_split: Optional[str] = None  # hf, tokens: validation split; None = hold out val_fraction of docs/shards
    val_fraction: float = 0.05  # hf, tokens: share of documents (shards) held out when there is no validation split
    max_docs: Optional[int] = None  # hf: use only the first N documents (quick runs on big sets)
    streaming: bool = False  # hf: stream the hub dataset instead of downloading it (needs max_tokens)
    max_tokens: Optional[int] = None  # hf: stop after N training tokens (a named val split: val_fraction x N)
    dtype: str = "uint16"  # tokens: uint16 | uint32, the ids' type in headerless files (.npy headers say their own)
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
    momentum: Optional[float] = (
        0.9  # sgd: heavy-ball coefficient; muon: EMA coefficient of its buffer (0.95 in muon.yaml)
    )
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
    max_time_s: Optional[float] = None  # also stop after this much training time (equal-wall-time comparisons)
    grad_accum: int = 1  # micro-batches per optimizer step (batch_size is the global batch and must divide)
    compile: bool = False  # torch.compile the forward + loss (probes, eval and checkpoints use the plain module)
    probe_every: int = 10  # steps between stability probes (per-layer stats, logit growth); 0 = off
    peak_flops: Optional[float] = None  # FLOP/s that MFU is measured against; None = a short matmul probe
    extrapolation: list[int] = field(default_factory=list)  # at the end, val loss at k x context for each k
    checkpoint_every: int = 100  # steps between checkpoints (one is also written at the end); 0 = only at the end
    keep_checkpoints: int = 1  # how many of the newest checkpoints to keep
    resume: str = "auto"  # auto: continue from the run dir's newest checkpoint | never | a checkpoint path


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
    lr: Optional[str] = (
        "fixed"  # per-rung LR rule: fixed (optim.lr everywhere) | grid (the sweep crosses optim.lr) | mup
    )


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


def positive(section: str, node: Any, keys: tuple[str, ...]) -> None:
    for key in keys:
        if node[key] < 1:
            raise bad(f"{section}.{key}", node[key], "must be a positive integer")


def validate(cfg: DictConfig | Config) -> None:
    """Cross-field checks that the schema's types cannot express. Raises ConfigError (one line).
    One function per group below; each names the keys it rejects."""
    from lm_ablate.registry import PLACEMENTS, REGISTRIES, SCHEDULES, TOKENIZERS, load_all

    load_all()
    if isinstance(cfg, DictConfig):
        _known_keys(cfg, _schema())
    for group, registry in REGISTRIES.items():
        registry.check(f"{group}.name", cfg[group].name)
    PLACEMENTS.check("norm.placement", cfg.norm.placement)
    SCHEDULES.check("optim.schedule", cfg.optim.schedule)
    TOKENIZERS.check("data.tokenizer", cfg.data.tokenizer)
    from lm_ablate.model import BLOCKS
    from lm_ablate.options import check as check_options  # each option's keys are its own (lm_ablate/options.py)

    BLOCKS.check("model.block", cfg.model.block)
    check_options(cfg)
    from lm_ablate.data import check_config as check_data  # data keys' domains live with the data package

    check_data(cfg.data)
    for key, value in _floats(cfg):
        if not math.isfinite(value):
            raise bad(key, value, "must be a finite number")
    for check in (_model, _norm, _position, _activation, _attention, _regularization, _optim, _train):
        check(cfg)
    from lm_ablate.options import check_identity  # a name its keys contradict (MQA with 2 K/V heads, ...)

    check_identity(cfg)
    from lm_ablate.ladder import check_config as check_ladder  # the ladder's own keys (not its sizes)

    check_ladder(cfg)
    if not 0 <= cfg.seed < 2**64:
        raise bad("seed", cfg.seed, "must be in [0, 2**64) (torch.manual_seed's range)")
    if cfg.tracking.mode not in (None, "online", "offline", "disabled"):
        raise bad("tracking.mode", cfg.tracking.mode, "allowed: online, offline, disabled, null")
    from lm_ablate.claim_spec import parse_claims

    claims = cfg.get("claims") if isinstance(cfg, DictConfig) else cfg.claims
    parse_claims(OmegaConf.to_container(claims, resolve=True) if isinstance(claims, ListConfig) else claims)


def _floats(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every float in a config, nested groups included."""
    for key, value in node.items():
        if isinstance(value, float):
            yield f"{prefix}{key}", value
        elif isinstance(value, DictConfig):
            yield from _floats(value, f"{prefix}{key}.")


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The schema as a read-only config, built once (building it costs more than the rest of validate)."""
    schema = OmegaConf.structured(Config)
    OmegaConf.set_readonly(schema, True)
    return schema


def _known_keys(node: DictConfig, schema: DictConfig, prefix: str = "") -> None:
    """Hydra's ``+key=value`` adds a key even to a typed node; reject any key the schema does not have."""
    for key in node:
        name = f"{prefix}{key}"
        if key not in schema.keys():  # noqa: SIM118 (`in` is False for a MISSING value in OmegaConf)
            where = prefix.rstrip(".") or "the config"
            raise bad(name, node[key], f"unknown key; keys of {where}: " + ", ".join(str(k) for k in schema.keys()))  # noqa: SIM118
        child, ref = node._get_node(key), schema._get_node(key)
        if (
            isinstance(child, DictConfig)
            and isinstance(ref, DictConfig)
            and dataclasses.is_dataclass(OmegaConf.get_type(ref))
        ):
            _known_keys(child, ref, name + ".")


def _model(cfg: DictConfig) -> None:
    m = cfg.model
    positive("model", m, ("d_model", "n_layers", "n_heads", "context"))
    if m.head_dim is None and m.d_model % m.n_heads:
        raise bad("model.n_heads", m.n_heads, f"must divide model.d_model={m.d_model} (or set model.head_dim)")
    if m.head_dim is not None and m.head_dim < 1:
        raise bad("model.head_dim", m.head_dim, "must be a positive integer or null")
    if m.embed_dim is not None and m.embed_dim < 1:
        raise bad("model.embed_dim", m.embed_dim, "must be a positive integer or null (= model.d_model)")
    from lm_ablate.model import BLOCKS  # blocks live with the model, which imports this module

    BLOCKS.check("model.block", m.block)
    if m.parallel_norms not in (None, 1, 2):
        raise bad("model.parallel_norms", m.parallel_norms, "allowed: 1 (one shared norm), 2 (one per sublayer)")
    placements = BLOCKS.get(m.block).placements
    if placements is not None and cfg.norm.placement not in placements:
        got = f"got norm.placement={cfg.norm.placement!r}"
        raise bad("model.block", m.block, f"needs norm.placement in ({', '.join(placements)}), {got}")
    if not m.init_std > 0:  # 0 zeroes every matrix and embedding: no gradient could ever leave that point
        raise bad("model.init_std", m.init_std, "must be > 0")
    if m.logit_softcap is not None and m.logit_softcap <= 0:
        raise bad("model.logit_softcap", m.logit_softcap, "must be > 0 or null (off)")
    if m.output_init_std is not None and m.output_init_std < 0:
        raise bad("model.output_init_std", m.output_init_std, "must be >= 0 or null (= model.init_std)")
    if m.output_init_std is not None and m.tie_embeddings:
        raise bad("model.output_init_std", m.output_init_std, "must be null with model.tie_embeddings=true")
    from lm_ablate.parametrization import PARAMETRIZATIONS

    PARAMETRIZATIONS.check("model.parametrization", m.parametrization)
    if m.mup_base_width is not None and m.mup_base_width < 1:
        raise bad("model.mup_base_width", m.mup_base_width, "must be a positive integer or null")
    PARAMETRIZATIONS.get(m.parametrization).check(cfg)  # each refuses the combinations it does not define


def _norm(cfg: DictConfig) -> None:
    n = cfg.norm
    if n.eps is not None and n.eps <= 0:
        raise bad("norm.eps", n.eps, "must be > 0")
    for key in ("deepnorm_alpha", "deepnorm_beta"):
        if n[key] is not None and n[key] <= 0:
            raise bad(f"norm.{key}", n[key], "must be > 0 or null (the DeepNet formula)")


def _position(cfg: DictConfig) -> None:
    from lm_ablate.components.position import ROPE_LAYOUTS

    p, hd = cfg.position, head_dim(cfg.model)
    if p.layout is not None:
        ROPE_LAYOUTS.check("position.layout", p.layout)
    if p.theta is not None and not p.theta > 0:
        raise bad("position.theta", p.theta, "must be > 0 (the base of the rope angles p * theta^(-2i/r))")
    if p.fraction is not None:
        if not 0 < p.fraction <= 1:
            raise bad("position.fraction", p.fraction, "must be in (0, 1]")
        dims = p.fraction * hd  # rotated dims per head: whole pairs, at least one
        if abs(dims - round(dims)) > 1e-6 or round(dims) % 2 or round(dims) < 2:
            key, value = ("model.head_dim", hd) if p.fraction == 1 else ("position.fraction", p.fraction)
            raise bad(key, value, f"rope rotates fraction * model.head_dim = {dims:g} dims: need even >= 2")
    if p.num_buckets is not None and p.num_buckets < 2:
        raise bad("position.num_buckets", p.num_buckets, "must be >= 2 (the first half are exact distances)")
    if p.max_distance is not None and p.num_buckets is not None and p.max_distance <= p.num_buckets // 2:
        exact = p.num_buckets // 2
        raise bad("position.max_distance", p.max_distance, f"must be > position.num_buckets // 2 = {exact}")


def _activation(cfg: DictConfig) -> None:
    if cfg.activation.d_ff is not None and cfg.activation.d_ff < 1:
        raise bad("activation.d_ff", cfg.activation.d_ff, "must be a positive integer or null (auto)")
    if cfg.activation.multiple_of is not None and cfg.activation.multiple_of < 1:
        raise bad("activation.multiple_of", cfg.activation.multiple_of, "must be a positive integer")
    if cfg.activation.approximate is not None and cfg.activation.approximate not in ("none", "tanh"):
        raise bad("activation.approximate", cfg.activation.approximate, "allowed: none, tanh")


def _attention(cfg: DictConfig) -> None:
    from lm_ablate.components.attention import QK_NORMS

    a, n_heads = cfg.attention, cfg.model.n_heads
    if a.n_kv_heads is not None and (a.n_kv_heads < 1 or n_heads % a.n_kv_heads):
        raise bad("attention.n_kv_heads", a.n_kv_heads, f"must be >= 1 and divide model.n_heads={n_heads}")
    QK_NORMS.check("attention.qk_norm", a.qk_norm)
    if a.qk_norm_eps is not None and not a.qk_norm_eps > 0:
        raise bad("attention.qk_norm_eps", a.qk_norm_eps, "must be > 0")
    for key in ("softcap", "scale"):
        if a[key] is not None and not a[key] > 0:
            raise bad(f"attention.{key}", a[key], "must be > 0 or null")
    if a.window is not None and a.window < 1:
        raise bad("attention.window", a.window, "must be a positive integer or null (full attention)")
    if a.global_every < 0:
        raise bad("attention.global_every", a.global_every, "must be >= 0 (0 = every layer local)")
    if a.global_every and a.window is None:  # nothing to alternate with: it would change nothing
        raise bad("attention.global_every", a.global_every, "needs attention.window (which layers are local)")
    n_layers = cfg.model.n_layers
    if a.window is not None and a.global_every > n_layers:  # asked for global layers, but none would be
        raise bad(
            "attention.global_every",
            a.global_every,
            f"leaves no global layer among model.n_layers={n_layers}: must be <= {n_layers} (0 = all local)",
        )


def _regularization(cfg: DictConfig) -> None:
    r = cfg.regularization
    if not 0.0 <= r.dropout < 1.0:
        raise bad("regularization.dropout", r.dropout, "must be in [0, 1)")
    for key in ("embedding_dropout", "attention_dropout", "residual_dropout"):
        if r[key] is not None and not 0.0 <= r[key] < 1.0:
            raise bad(f"regularization.{key}", r[key], "must be in [0, 1) or null (= regularization.dropout)")
    for key in ("weight_decay", "grad_clip", "z_loss"):
        if r[key] < 0:
            raise bad(f"regularization.{key}", r[key], "must be >= 0")


def _optim(cfg: DictConfig) -> None:
    o = cfg.optim
    given = lambda key: o[key] is not None
    if not o.lr > 0:
        raise bad("optim.lr", o.lr, "must be > 0")
    if given("eps") and not o.eps > 0:  # AdamW divides by sqrt(v) + eps (adafactor floors sqrt(v) at it)
        raise bad("optim.eps", o.eps, "must be > 0")
    if o.warmup_steps < 0:
        raise bad("optim.warmup_steps", o.warmup_steps, "must be >= 0")
    if given("min_lr_ratio") and not 0.0 <= o.min_lr_ratio <= 1.0:
        raise bad("optim.min_lr_ratio", o.min_lr_ratio, "must be in [0, 1]")
    for key in ("beta1", "beta2"):
        if given(key) and not 0.0 <= o[key] < 1.0:
            raise bad(f"optim.{key}", o[key], "must be in [0, 1)")
    if given("decay_fraction") and not 0.0 < o.decay_fraction <= 1.0:
        raise bad("optim.decay_fraction", o.decay_fraction, "must be in (0, 1]")
    if given("momentum") and not 0.0 <= o.momentum < 1.0:
        raise bad("optim.momentum", o.momentum, "must be in [0, 1)")
    if o.nesterov and not o.momentum:
        raise bad("optim.nesterov", o.nesterov, "needs optim.momentum > 0")
    if given("adjust_lr_fn") and o.adjust_lr_fn not in ("original", "match_rms_adamw"):
        raise bad("optim.adjust_lr_fn", o.adjust_lr_fn, "allowed: original, match_rms_adamw")
    if given("ns_steps") and not 1 <= o.ns_steps < 100:
        raise bad("optim.ns_steps", o.ns_steps, "must be in [1, 100)")
    if given("muon_lr_scale") and not o.muon_lr_scale > 0:
        raise bad("optim.muon_lr_scale", o.muon_lr_scale, "must be > 0")
    if given("beta2_decay") and o.beta2_decay > 0:
        raise bad("optim.beta2_decay", o.beta2_decay, "must be <= 0 (1 - beta2_t = t^beta2_decay)")
    if given("eps2") and o.eps2 < 0:
        raise bad("optim.eps2", o.eps2, "must be >= 0")
    if given("clip_threshold") and not o.clip_threshold > 0:
        raise bad("optim.clip_threshold", o.clip_threshold, "must be > 0")


def _train(cfg: DictConfig) -> None:
    t = cfg.train
    positive("train", t, ("max_steps", "batch_size", "eval_every", "eval_batches", "log_every"))
    if t.divergence not in ("stop", "skip"):
        raise bad("train.divergence", t.divergence, "allowed: stop, skip")
    positive("train", t, ("grad_accum",))
    if t.batch_size % t.grad_accum:
        raise bad("train.grad_accum", t.grad_accum, f"must divide train.batch_size={t.batch_size}")
    for key in ("max_tokens", "max_time_s", "peak_flops"):
        if t[key] is not None and t[key] <= 0:
            raise bad(f"train.{key}", t[key], "must be > 0 or null")
    if any(k < 1 for k in t.extrapolation):
        raise bad("train.extrapolation", list(t.extrapolation), "every factor must be an integer >= 1")
    for key in ("checkpoint_every", "max_skipped_steps", "probe_every"):
        if t[key] < 0:
            raise bad(f"train.{key}", t[key], "must be >= 0")
    if t.keep_checkpoints < 1:
        raise bad("train.keep_checkpoints", t.keep_checkpoints, "must be >= 1")
    if t.threads is not None and t.threads < 1:
        raise bad("train.threads", t.threads, "must be a positive integer or null (torch's default)")
    if t.spike.window < 2:
        raise bad("train.spike.window", t.spike.window, "must be >= 2 (a standard deviation needs two values)")
    if not t.spike.k > 0:
        raise bad("train.spike.k", t.spike.k, "must be > 0")


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]


CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose(
    overrides: list[str] | tuple[str, ...] = (), config_name: str = "train", refuse_unread: bool = True
) -> DictConfig:
    """The config ``python -m lm_ablate.train <overrides>`` would run, built without starting a run
    (tests, notebooks, ``python -m lm_ablate.cost``). ``choices`` is filled as in a real run. A key the chosen
    options do not read is refused when the overrides set it, as on the command line; ``refuse_unread=False``
    treats the overrides as a file would be (the key is cleared): for translations that write every field
    they map, such as an HF config's (lm_ablate/hf/)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from lm_ablate.options import explicit_keys, settle

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)
    cfg = job_config(cfg)
    settle(cfg, explicit_keys(overrides) if refuse_unread else ())  # keys the chosen options do not read
    return cfg


def job_config(cfg: DictConfig) -> DictConfig:
    """A config composed with its ``hydra`` node (Hydra's compose, ``load_sweep_config``) as the task function
    sees it: the ``hydra`` node dropped, ``choices`` filled from ``hydra.runtime.choices``. Changes ``cfg``."""
    from lm_ablate.ladder import apply_rung

    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra") and k != "local"}
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    cfg.choices = choices
    OmegaConf.set_struct(cfg, True)
    apply_rung(cfg)  # a ladder run's shape (lm_ablate/ladder.py)
    return cfg


def compose_error_message(err: BaseException) -> str | None:
    """One line, in :func:`lm_ablate.config.bad`'s format, for an error Hydra or OmegaConf raised while composing
    the config (unknown group option, unknown key, wrong type, override syntax); None for any other error.
    Hydra's own report is several lines plus a hint about HYDRA_FULL_ERROR."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if not isinstance(err, (HydraException, OmegaConfBaseException)):
        return None
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, option = err.missing_cfg_file.rpartition("/")
        return f"{group}={option!r} is invalid: no such option; allowed: {', '.join(err.options)}"
    if isinstance(err, OverrideParseException):
        return f"cannot parse the overrides: {_first(str(err))} (syntax: key=value, group=option, +key=value)"
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    if isinstance(cause, OmegaConfBaseException) and key:
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            typed = re.search(r"use \+(\S+)", str(err))
            parent = key.rpartition(".")[0]
            node = OmegaConf.select(OmegaConf.structured(Config), parent) if parent else OmegaConf.structured(Config)
            keys = ", ".join(str(k) for k in node) if isinstance(node, DictConfig) else "see --cfg job"
            shown = typed.group(1) if typed else key
            return f"{shown} is invalid: unknown key; keys of {parent or 'the config'}: {keys}"
        why = _first(cause.msg or str(cause))
        kind = re.search(r"could not be converted to (\w+)", why)
        if kind:
            why = f"must be {'an' if kind.group(1)[0] in 'AEIOU' else 'a'} {kind.group(1).lower()}"
        elif "is not a valid bool" in why:
            why = "must be true or false"
        elif "is not Optional" in why:
            why = "must not be null"
        return f"{key}={'null' if cause.value is None else repr(cause.value)} is invalid: {why}"
    return _first(str(err))


def _first(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "invalid configuration"
