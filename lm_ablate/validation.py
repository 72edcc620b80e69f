"""Cross-field validation: the rules a config's types cannot express, one function per group, each raising
:class:`ConfigError` with one line naming the key, the value and what is allowed.

It sits above the components it asks (registries, the block and parametrization tables, the data package's
key checks, each option's own keys: lm_ablate/options.py) and below composition (lm_ablate/config.py), the
ladder and the loop, which call :func:`validate`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lm_ablate.catalog import load_all
from lm_ablate.claim_spec import parse_claims
from lm_ablate.components.attention import QK_NORMS
from lm_ablate.components.blocks import BLOCKS
from lm_ablate.components.position import ROPE_LAYOUTS
from lm_ablate.data import check_config as check_data
from lm_ablate.errors import ConfigError, bad
from lm_ablate.options import check as check_options
from lm_ablate.options import check_identity
from lm_ablate.parametrization import PARAMETRIZATIONS
from lm_ablate.registry import PLACEMENTS, REGISTRIES, SCHEDULES, TOKENIZERS
from lm_ablate.schema import Config, head_dim
from lm_ablate.sharding import check as check_parallel

__all__ = ["ConfigError", "positive", "validate"]


def positive(section: str, node: Any, keys: tuple[str, ...]) -> None:
    for key in keys:
        if node[key] < 1:
            raise bad(f"{section}.{key}", node[key], "must be a positive integer")


def validate(cfg: DictConfig | Config) -> None:
    """Cross-field checks that the schema's types cannot express. Raises ConfigError (one line).
    One function per group below; each names the keys it rejects."""
    load_all()
    if isinstance(cfg, DictConfig):
        _known_keys(cfg, _schema())
    for group, registry in REGISTRIES.items():
        registry.check(f"{group}.name", cfg[group].name)
    PLACEMENTS.check("norm.placement", cfg.norm.placement)
    SCHEDULES.check("optim.schedule", cfg.optim.schedule)
    TOKENIZERS.check("data.tokenizer", cfg.data.tokenizer)
    BLOCKS.check("model.block", cfg.model.block)
    check_options(cfg)  # each option's keys are its own (lm_ablate/options.py)
    check_data(cfg.data)  # data keys' domains live with the data package
    for key, value in _floats(cfg):
        if not math.isfinite(value) and not (key == "optim.wd_timescale" and value == math.inf):  # inf: no decay
            raise bad(key, value, "must be a finite number")
    for check in (
        _model,
        _norm,
        _position,
        _activation,
        _attention,
        _regularization,
        _optim,
        _train,
        _eval,
        check_ladder,
        check_shape,
    ):
        check(cfg)
    check_identity(cfg)  # a name its keys contradict (MQA with 2 K/V heads, ...)
    if not 0 <= cfg.seed < 2**64:
        raise bad("seed", cfg.seed, "must be in [0, 2**64) (torch.manual_seed's range)")
    if cfg.tracking.mode not in (None, "online", "offline", "disabled"):
        raise bad("tracking.mode", cfg.tracking.mode, "allowed: online, offline, disabled, null")
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
    if r.weight_decay is None and cfg.optim.get("wd_timescale") is None:
        raise bad("regularization.weight_decay", None, "must be >= 0 (null only where optim.wd_timescale sets it)")
    for key in ("weight_decay", "grad_clip", "z_loss"):
        if r[key] is not None and r[key] < 0:
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
    if given("wd_timescale"):  # lm_ablate/optim.py: lambda = 1 / (lr x tau/T x steps)
        if not o.wd_timescale > 0:
            raise bad("optim.wd_timescale", o.wd_timescale, "must be > 0 (tau/T, a fraction of the run, e.g. 0.2; "
                      "inf = no decay) or null (regularization.weight_decay)")  # fmt: skip
        if cfg.regularization.weight_decay is not None:
            raise bad("optim.wd_timescale", o.wd_timescale, f"regularization.weight_decay="
                      f"{cfg.regularization.weight_decay!r} is set too: give one of them")  # fmt: skip


def _train(cfg: DictConfig) -> None:
    t = cfg.train
    positive("train", t, ("max_steps", "batch_size", "eval_every", "eval_batches", "log_every"))
    if t.divergence not in ("stop", "skip"):
        raise bad("train.divergence", t.divergence, "allowed: stop, skip")
    positive("train", t, ("grad_accum",))
    if t.batch_size % t.grad_accum:
        raise bad("train.grad_accum", t.grad_accum, f"must divide train.batch_size={t.batch_size}")
    for key in ("max_tokens", "max_time_s", "peak_flops", "max_bytes"):
        if t[key] is not None and t[key] <= 0:
            raise bad(f"train.{key}", t[key], "must be > 0 or null")
    _text_budget(cfg)
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
    if t.shard_size is not None and t.shard_size < 1:
        raise bad("train.shard_size", t.shard_size, "must be a positive integer or null (LOCAL_WORLD_SIZE)")
    if t.ac_every is not None and not 1 <= t.ac_every <= cfg.model.n_layers:
        raise bad("train.ac_every", t.ac_every, f"must be in [1, model.n_layers={cfg.model.n_layers}] (block i is "
                  "recomputed iff (i + 1) % ac_every == 0)")  # fmt: skip
    check_parallel(cfg)  # train.parallel, train.activation_checkpointing (lm_ablate/sharding.py)


def _text_budget(cfg: DictConfig) -> None:
    """train.max_bytes is the run's budget: no second one (train.max_tokens, a ladder's), no text-less data; and
    train.val_bpb_bytes >= 0. (A train.max_steps that would cut it short is refused once bytes/token is known.)"""
    t = cfg.train
    if t.val_bpb_bytes < 0:
        raise bad("train.val_bpb_bytes", t.val_bpb_bytes, "must be >= 0 (bytes of held-out text; 0 = no val/bpb)")
    if t.max_bytes is None:
        return
    if t.max_tokens is not None:
        raise bad("train.max_bytes", t.max_bytes, f"train.max_tokens={t.max_tokens} is set too: give one budget "
                  "(max_bytes: the same text for every tokenizer)")  # fmt: skip
    if cfg.ladder.name is not None:
        raise bad("train.max_bytes", t.max_bytes, f"ladder={cfg.ladder.name} sets the budget in tokens "
                  "(ladder.tokens_per_param); leave it null")  # fmt: skip
    if cfg.data.name == "tokens":
        raise bad("train.max_bytes", t.max_bytes, "data=tokens holds token ids, not text: use train.max_tokens")


SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "head_dim")  # what a ladder rung may set, as model.<key>
REQUIRED = ("d_model", "n_layers", "n_heads")
LR_RULES = ("fixed", "grid", "mup")
PARAM_COUNTS = ("non_embedding", "total")  # ladder.params: the N a budget is a multiple of
# ladder.fit: the scaling fit forms (analysis/compute/scaling_forms.py); auto = chosen by held-out error
# ladder.tune: the base hyperparameters μP leaves to the proxy model (Yang et al. 2022, Tensor Programs V, Table
# 10, with the LR), which a ladder may tune per cell where one value tuned at rung 0 does not transfer
TUNABLE = ("model.mup_output_mult", "model.mup_attn_mult", "model.init_std")
FIT_FORMS = ("auto", "per_arm", "shared_e", "shared_e_alpha", "nd_per_arm", "nd_shared_e", "nd_shared_exponents")
MIN_RUNGS = 3  # a fit of L(C) = E + A C^-alpha has 3 parameters; a held-out check (largest rung left out) needs 4


def _eval(cfg: DictConfig) -> None:
    """The eval group's numbers (the tasks themselves are checked where they are read: lm_ablate/eval/tasks.py)."""
    e = cfg.eval
    if e.every is not None and e.every < 1:
        raise bad("eval.every", e.every, "a positive number of steps, or null (only at the end)")
    if e.max_examples is not None and e.max_examples < 1:
        raise bad("eval.max_examples", e.max_examples, "a positive number of examples per task, or null")
    if e.batch_tokens < 1:
        raise bad("eval.batch_tokens", e.batch_tokens, "a positive number of tokens per forward pass")


def check_sizes(cfg: DictConfig) -> None:
    """Only the rules a model's sizes must meet (d_model, n_layers, heads, head_dim with the options chosen): what
    the shape solver (lm_ablate/shape.py) asks of each candidate before it validates the one it picks."""
    _model(cfg)
    _position(cfg)
    _attention(cfg)


SHAPE_OPTIONS = ("none", "iso")
SHAPE_REQUEST = ("target_params", "ffn_ratio", "aspect", "attn_ratio", "head_dim", "n_heads", "head_dim_target",
                 "d_model", "n_layers", "d_ff_multiple", "tolerance")  # fmt: skip
SHAPE_PINS = ("d_model", "n_layers", "aspect")  # what fixes width and depth besides N (one or two of them)


def check_shape(cfg: Any) -> None:
    """The shape group's keys (lm_ablate/shape.py): their domains, and no dimension fixed two ways. Whether integers
    meet the target is the solver's to say (it runs where the ladder's rung is applied)."""
    s = getattr(cfg, "shape", None)
    if s is None:
        return  # a record written before the shape group existed
    given = {k: s[k] if isinstance(s, DictConfig) else getattr(s, k) for k in SHAPE_REQUEST}
    given = {k: v for k, v in given.items() if v is not None}
    if s.name not in SHAPE_OPTIONS:
        raise bad("shape.name", s.name, f"allowed: {', '.join(SHAPE_OPTIONS)}")
    if s.name == "none":
        for key, value in given.items():
            raise bad(f"shape.{key}", value, "shape=none reads no shape keys: choose shape=iso (conf/shape/iso.yaml)")
        return
    if cfg.ladder.name is not None:
        raise bad("shape", "iso", f"ladder={cfg.ladder.name} sets the model's sizes by its rungs: choose one of them")
    if "target_params" not in given:
        raise bad("shape.target_params", None, "shape=iso needs the non-embedding parameter count to solve for")
    for key in ("target_params", "ffn_ratio", "aspect", "attn_ratio"):
        if key in given and not given[key] > 0:
            raise bad(f"shape.{key}", given[key], "must be > 0")
    for key in ("head_dim", "n_heads", "head_dim_target", "d_model", "n_layers", "d_ff_multiple"):
        if key in given and given[key] < 1:
            raise bad(f"shape.{key}", given[key], "must be a positive integer or null")
    if "tolerance" in given and not 0 < given["tolerance"] < 1:
        raise bad("shape.tolerance", given["tolerance"], "must be in (0, 1) (0.02: within 2% of the target)")
    if "head_dim" in given and "n_heads" in given:
        raise bad("shape.n_heads", given["n_heads"], "shape.head_dim already fixes the heads: give one of the two")
    pins = [k for k in SHAPE_PINS if k in given]
    what = ", ".join(f"shape.{k}={given[k]}" for k in pins)
    if not pins:
        raise bad("shape.target_params", given["target_params"], "shape=iso needs what it holds besides N: one or "
                  "two of shape.d_model, shape.n_layers, shape.aspect")  # fmt: skip
    if len(pins) == 3:
        raise bad("shape.aspect", given["aspect"], "shape.d_model and shape.n_layers already fix d_model / n_layers")
    if len(pins) == 2 and "ffn_ratio" in given:
        raise bad("shape.ffn_ratio", given["ffn_ratio"], f"{what} pin d_model and n_layers, so d_ff is what meets "
                  "shape.target_params: leave ffn_ratio null, or pin one of them only")  # fmt: skip


def check_ladder(cfg: Any) -> None:
    """The ladder's own keys (one line naming the key); sizes are checked as model.* once applied."""
    lad = cfg.ladder
    if lad.name is None:
        return
    rungs = list(lad.rungs)
    if len(rungs) < MIN_RUNGS:
        raise bad("ladder.rungs", rungs, f"a ladder needs at least {MIN_RUNGS} rungs (shapes of increasing size: "
                  "its fit L = E + A C^-alpha has 3 parameters)")  # fmt: skip
    for i, rung in enumerate(rungs):
        unknown = sorted(set(rung) - set(SHAPE_KEYS))
        if unknown:
            raise bad(f"ladder.rungs[{i}]", dict(rung), f"unknown keys {unknown}; allowed: {', '.join(SHAPE_KEYS)}")
        missing = [k for k in REQUIRED if k not in rung]
        if missing:
            raise bad(f"ladder.rungs[{i}]", dict(rung), f"missing {missing}: each rung gives {', '.join(REQUIRED)}")
        for key, value in rung.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(f"ladder.rungs[{i}].{key}", value, "must be a positive integer")
    if not 0 <= lad.rung < len(rungs):
        raise bad("ladder.rung", lad.rung, f"must index ladder.rungs: 0..{len(rungs) - 1}")
    if not lad.tokens_per_param > 0:
        raise bad("ladder.tokens_per_param", lad.tokens_per_param, "must be > 0 (Hoffmann et al. 2022: 20)")
    if lad.lr not in LR_RULES:
        raise bad("ladder.lr", lad.lr, f"allowed: {', '.join(LR_RULES)}")
    if lad.params not in PARAM_COUNTS:
        raise bad("ladder.params", lad.params, f"allowed: {', '.join(PARAM_COUNTS)}")
    if lad.fit not in FIT_FORMS:
        raise bad("ladder.fit", lad.fit, f"allowed: {', '.join(FIT_FORMS)}")
    tune = list(getattr(lad, "tune", None) or [])
    if any(key not in TUNABLE for key in tune) or len(set(tune)) < len(tune):
        raise bad("ladder.tune", tune, f"allowed: a list of distinct keys among {', '.join(TUNABLE)} (the LR is "
                  "ladder.lr's), or []")  # fmt: skip
    check_budgets(cfg)


def check_budgets(cfg: Any) -> None:
    """ladder.budgets increasing and positive, ladder.budget one of them, and WSD when a run branches (its
    stable phase must be every shorter budget's; lm_ablate/budgets.py checks the branch points per rung)."""
    lad = cfg.ladder
    budgets = None if lad.budgets is None else list(lad.budgets)
    if budgets is not None:
        if not budgets or any(isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 0 for b in budgets):
            raise bad("ladder.budgets", budgets, "must be a list of positive numbers (multiples of "
                      "ladder.tokens_per_param x N), e.g. [0.5, 1, 2, 4]")  # fmt: skip
        if any(b <= a for a, b in zip(budgets, budgets[1:])):
            raise bad("ladder.budgets", budgets, "must increase strictly, e.g. [0.5, 1, 2, 4]")
    if lad.budget is not None:
        if not lad.budget > 0:
            raise bad("ladder.budget", lad.budget, "must be > 0 (a multiple of ladder.tokens_per_param x N)")
        if budgets is not None and lad.budget not in budgets:
            raise bad("ladder.budget", lad.budget, f"must be one of ladder.budgets {budgets} (or null: the largest, "
                      "with a decay branch at each of the others)")  # fmt: skip
    fit = None if getattr(lad, "fit_budgets", None) is None else list(lad.fit_budgets)
    if fit is not None:
        trained = budgets if budgets is not None else [1.0]
        if not fit or any(isinstance(b, bool) or b not in trained for b in fit):
            raise bad("ladder.fit_budgets", fit, f"allowed: a non-empty subset of ladder.budgets {trained} (the "
                      "budgets whose cells the scaling fits use), or null: every budget")  # fmt: skip
    branches = budgets is not None and len(budgets) > 1 and lad.budget is None
    if branches and cfg.optim.get("wd_timescale") is not None:
        raise bad("optim.wd_timescale", cfg.optim.wd_timescale, f"ladder.budgets {budgets} branches shorter budgets "
                  "from the largest's run, and tau/T gives each budget its own lambda (its stable phase would differ): "
                  "set regularization.weight_decay, or one ladder.budget per run")  # fmt: skip
    if branches and cfg.optim.schedule != "wsd":
        raise bad("optim.schedule", cfg.optim.schedule, f"ladder.budgets {budgets} branches a decay from the "
                  "largest budget's run, so its stable phase must be every shorter budget's: allowed: wsd")  # fmt: skip
