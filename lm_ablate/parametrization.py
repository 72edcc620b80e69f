"""How width enters the init, the learning rate and two multipliers (``model.parametrization``).

``sp`` is the standard parametrization the rest of the code already implements; ``mup`` is the maximal update
parametrization for Adam (Yang et al. 2022, "Tensor Programs V", Table 3 Adam column, in the equivalent form
of their Table 8 with an output multiplier), relative to a base width b = ``model.mup_base_width``:
width w = ``model.d_model``, m = w / b. Every parameter belongs to one class; sp is the left column, mup
multiplies it as shown (at m = 1 every factor is 1):

    class        members                                         init std (sp)                 mup init  mup Adam LR  mup wd
    input        token embedding E (also a tied readout), the    model.init_std                x 1       x 1          x 1
                 learned position table, T5's bucket table
    hidden       attention qkv and out, FFN up / gate_up /       model.init_std, / sqrt(2 L)   x m^-1/2  x 1/m        x m
                 down, a parallel block's fused input matmul     for out and down (GPT-2),     (var ~ 1/fan_in)
                                                                 x DeepNorm's beta on V/out/FFN
    output       the untied LM head W_out                        model.output_init_std        x 1       x 1          x 1
                                                                 (null: init_std; 0: zero)
    vector-like  norm gains and biases, every linear's bias,     1 / 0 as built                x 1       x 1          x 1
                 the head bias, ReZero's alpha

    multipliers  logits  W_out h + b          ->  W_out (a_out h / m) + b   (Table 8's 1/fan_in: a head bias stays)
                 attention scores  q.k / sqrt(head_dim)  ->  a_attn q.k / head_dim   (TP V's transformer recipe: q
                                  and k become correlated in training, so q.k grows like head_dim; microsoft/mup's
                                  README writes 8/d, which equals 1/sqrt(d) at d = 64)
                 embed_scale  sqrt(d_model)  ->  sqrt(b)   (an input multiplier must not grow with width; equal at m = 1)

Base multipliers (mup only; constant in width, so they are tuned at the base width and transfer with optim.lr;
Yang et al. 2022, section 6 and Table 10, tune exactly these at the proxy model):

    key                    symbol  where                                       source
    model.mup_output_mult  a_out   logits = W_out (a_out h / m) + b            microsoft/mup ``MuReadout(output_mult=)``
                                                                               (forward: output_mult * x / width_mult)
    model.mup_attn_mult    a_attn  scores = a_attn q.k / head_dim              microsoft/mutransformers GPT-2
                                                                               ``attn_mult`` (attn_weights * attn_mult /
                                                                               head_dim; microsoft/mup's examples/
                                                                               Transformer takes sqrt(attn_mult) instead)
    model.init_std         sigma   the input and hidden init std at the base   microsoft/mup examples' ``init_std``
                                   (hidden: sigma m^-1/2 at width w)            (``initializer_range`` in mutransformers)

At 1 (the defaults) the two multipliers change nothing: mup is the table above. sp reads neither key (a value on
the command line under sp is refused: lm_ablate/options.py).

Base point: ``model.init_std`` is the hidden std AT THE BASE WIDTH; at w = b with both multipliers 1, mup equals
sp except the attention scale (sp with ``attention.scale=1/head_dim`` is mup at its base, bit for bit). Depth factors
(GPT-2's 1/sqrt(2L), DeepNorm's alpha and beta) do not depend on width and multiply as they do under sp.

Output layer: the multiplier form, not a zero-initialised readout; ``model.output_init_std=0`` gives the
zero readout as well (Yang et al. recommend either). With tied embeddings the one matrix is input-like for
both of its uses, which Table 8 allows: its output rule (init and Adam LR constant in width) is the input
rule, and the 1/m multiplier on the logits is what makes the readout a readout (microsoft/mup's
MuSharedReadout does the same).

Weight decay (AdamW): torch's AdamW decays p <- p (1 - lr wd). Scaling a hidden group's LR by 1/m would shrink
its decay per step by 1/m, so the decay would fade with width; its weight decay is multiplied by m instead,
keeping lr * wd, the decay per step, that of the base (as microsoft/mup's MuAdam does with its default
decoupled_wd=False; Wang & Aitchison 2024, "How to set AdamW's weight decay as you scale model and dataset
size", argue for a fixed timescale 1 / (lr wd)).

Muon (``optim=muon``): its matrices (:func:`lm_ablate.optim.is_hidden_matrix`) are exactly the hidden class
above, and every other parameter is AdamW's and keeps the rules above. Muon moves a fan_out x fan_in matrix by
lr s(shape) O, O the Newton-Schulz orthogonalization of the momentum, whose singular values are all about 1 at
any width, so the update's spectral norm is lr s(shape). The spectral condition for feature learning (Yang,
Simon & Bernstein 2023, "A spectral condition for feature learning", arXiv:2310.17813, which they show is muP)
asks ||dW||_2 = Theta(sqrt(fan_out / fan_in)): constant in width when every inner width grows with d_model. So
the hidden LR multiplier under mup depends on Muon's shape factor (``optim.adjust_lr_fn``):

    adjust_lr_fn       s(shape)                        grows with width as   mup Muon LR (hidden)   mup wd (hidden)
    original           sqrt(max(1, fan_out / fan_in))  m^0                   x 1                    x 1
    match_rms_adamw    0.2 sqrt(max(fan_out, fan_in))  m^1/2                 x m^-1/2               x m^1/2

The weight decay takes the inverse factor for the reason given above (torch's Muon decays p (1 - lr wd) with the
group's lr, before the shape factor). The init is the Adam column's: a hidden std ~ fan_in^-1/2 gives
||W||_2 = Theta(sqrt(fan_out / fan_in)), the condition's other half. Shah et al. 2025 ("Practical efficiency of
Muon for pretraining", arXiv:2505.02222) report that muP's LR transfer holds with Muon. Checked here as the
coordinate check (``python -m lm_ablate.coord_check optim=muon``) and, in tests/test_mup.py, the spectral norm
of one step's update divided by sqrt(fan_out / fan_in) measured equal across widths. The rule covers the width at
a fixed number of tokens: along a ladder that also trains wider rungs longer, Muon's best LR falls further (4x
from d36 to d84 at 20 tokens per parameter, half of it the horizon alone) while AdamW's stays put (docs/ladders.md).

Width: every inner width must grow in proportion to d_model across the widths compared: n_heads fixed and
head_dim null (head_dim ~ d_model, what ``lr_transfer`` and ``coord_check`` do), or head_dim fixed and n_heads
~ d_model; activation.d_ff null (4d or 8d/3). With head_dim fixed the 1/head_dim vs 1/sqrt(head_dim) choice is
a constant factor and does not matter for transfer. Defined for AdamW and Muon (Table 3 has an SGD column, not
implemented); a fixed-width ``model.embed_dim`` (a projection that is input- or
output-like depending on how it scales) and an explicit ``attention.scale`` are refused under mup.

The loop: ``groups = optimizer_groups(cfg, model, regularizer.param_groups(model))`` splits groups so each
holds one LR multiplier, ``"lr_scale"``; every step ``set_lr(optimizer, scheduled_lr)`` sets each group's lr to
scheduled_lr * lr_scale. ``lr_multipliers(cfg)`` gives the multiplier per class (ladders: tune
``optim.lr`` once at the base width, transfer it to every rung).

Adding a parametrization touches only this file: subclass ``Parametrization``, override what it changes,
register it.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor, nn

from lm_ablate.errors import bad
from lm_ablate.registry import Registry
from lm_ablate.schema import ModelConfig

PARAMETRIZATIONS: Registry = Registry("model.parametrization")

INPUT, HIDDEN, OUTPUT, VECTOR = "input", "hidden", "output", "vector"
CLASSES = (INPUT, HIDDEN, OUTPUT, VECTOR)


def parameter_class(model: nn.Module, name: str, p: Tensor, owner: nn.Module) -> str:
    """The class (table above) of parameter ``name`` of ``model`` held by module ``owner``. A tied LM head is
    the embedding, so it is ``input``. A matrix outside nn.Linear / nn.Embedding has no rule: an error names it
    (a new component says what it is rather than silently getting the hidden rule)."""
    if isinstance(owner, nn.Embedding):
        return INPUT
    if p.ndim < 2:
        return VECTOR
    if p is model.head.weight:
        return OUTPUT
    if isinstance(owner, nn.Linear):
        return HIDDEN
    raise TypeError(f"parameter {name} {tuple(p.shape)} of {type(owner).__name__} has no parametrization class")


def parameter_classes(model: nn.Module) -> dict[str, str]:
    """Name -> class for every parameter of ``model`` (a tied matrix once, under its first name)."""
    owners = dict(model.named_modules())
    classes = {}
    for name, p in model.named_parameters():
        owner = owners[name.rpartition(".")[0]]
        classes[name] = parameter_class(model, name, p, owner)
    return classes


@PARAMETRIZATIONS.register("sp")
class Parametrization:
    """Standard parametrization: nothing depends on width beyond what the modules already do."""

    optimizers: tuple[str, ...] | None = None  # optim.name values it is defined for; None = every one

    def __init__(self, cfg: ModelConfig, optim: Any = None):
        self.cfg = cfg
        self.optim = optim  # the optimizer's config: the LR rules may depend on it (None: init and forward only)

    @classmethod
    def check(cls, cfg: Any) -> None:
        """Refuse, with one line, combinations this parametrization does not define (config validation)."""

    @property
    def width_mult(self) -> float:
        return 1.0

    def init_gain(self, cls: str) -> float:
        """Multiplier of the init std of parameters of class ``cls``."""
        return 1.0

    def lr_scale(self, cls: str) -> float:
        """Multiplier of the scheduled learning rate for class ``cls``."""
        return 1.0

    def weight_decay_scale(self, cls: str) -> float:
        return 1.0

    @property
    def output_multiplier(self) -> float:
        return 1.0

    def attention_scale(self, scale: float | None, head_dim: int) -> float:
        """The attention logit scale; ``scale`` is ``attention.scale`` (None = the default)."""
        return scale if scale is not None else head_dim**-0.5

    @property
    def embed_multiplier(self) -> float:
        """The token-embedding multiplier of ``model.embed_scale`` (Vaswani et al. 2017)."""
        return math.sqrt(self.cfg.d_model)


@PARAMETRIZATIONS.register("mup", reads=("mup_base_width", "mup_output_mult", "mup_attn_mult"))
class MuP(Parametrization):
    """muP for Adam and Muon, relative to ``model.mup_base_width`` (module docstring: the tables and sources)."""

    optimizers = ("adamw", "muon")

    @classmethod
    def check(cls, cfg: Any) -> None:
        m, why = cfg.model, "with model.parametrization=mup"
        if m.mup_base_width is None:
            raise bad("model.mup_base_width", None, f"must be set {why} (the width whose optim.lr transfers)")
        for key in ("mup_output_mult", "mup_attn_mult"):
            value = getattr(m, key)
            if value is None or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise bad(f"model.{key}", value, f"must be a positive number {why} (1 = no multiplier)")
        if cfg.optim.name not in cls.optimizers:
            allowed = ", ".join(cls.optimizers)
            raise bad("optim.name", cfg.optim.name, f"muP's LR rule is defined here for {allowed} only {why}")
        if cfg.attention.scale is not None:
            raise bad("attention.scale", cfg.attention.scale, f"must be null {why} (muP sets 1/head_dim)")
        embed_dim = getattr(m, "embed_dim", None)
        if embed_dim is not None and embed_dim != m.d_model:
            raise bad("model.embed_dim", embed_dim, f"must be null {why} (a fixed-width projection is not defined)")

    @property
    def width_mult(self) -> float:
        return self.cfg.d_model / self.cfg.mup_base_width

    def init_gain(self, cls: str) -> float:
        return self.width_mult**-0.5 if cls == HIDDEN else 1.0

    @property
    def hidden_lr_exponent(self) -> float:
        """k in the hidden class's LR multiplier m^k: -1 for Adam (Table 3), Muon by its shape factor (module
        docstring: 0 with ``adjust_lr_fn=original`` or None, torch's default, -1/2 with ``match_rms_adamw``)."""
        if self.optim is None:
            raise ValueError("mup's hidden LR rule depends on the optimizer: build it with the optim config")
        if self.optim.name == "muon":
            return -0.5 if getattr(self.optim, "adjust_lr_fn", None) == "match_rms_adamw" else 0.0
        return -1.0

    def lr_scale(self, cls: str) -> float:
        return self.width_mult**self.hidden_lr_exponent if cls == HIDDEN else 1.0

    def weight_decay_scale(self, cls: str) -> float:
        return 1.0 / self.lr_scale(cls)  # lr * wd stays the base's (module docstring)

    @property
    def output_multiplier(self) -> float:
        return self.cfg.mup_output_mult / self.width_mult

    def attention_scale(self, scale: float | None, head_dim: int) -> float:
        return self.cfg.mup_attn_mult / head_dim

    @property
    def embed_multiplier(self) -> float:
        return math.sqrt(self.cfg.mup_base_width)


def parametrization(cfg: ModelConfig, optim: Any = None) -> Parametrization:
    """The parametrization ``cfg.parametrization`` of model config ``cfg``; ``optim`` (the optimizer's config)
    is needed for its LR and weight-decay rules only."""
    PARAMETRIZATIONS.check("model.parametrization", cfg.parametrization)
    return PARAMETRIZATIONS.get(cfg.parametrization)(cfg, optim)


def lr_multipliers(cfg: Any) -> dict[str, float]:
    """Class -> multiplier of the scheduled LR at the width of config ``cfg`` (model and optim) (ladders: one
    tuned optim.lr, every rung)."""
    p = parametrization(cfg.model, cfg.optim)
    return {cls: p.lr_scale(cls) for cls in CLASSES}


def scale_init(model: nn.Module, cfg: ModelConfig) -> None:
    """Multiply each parameter by its class's init gain (after the model's own init: every init here is a
    zero-mean normal or a constant, so this is the same as drawing it with the scaled std). sp: nothing."""
    p = parametrization(cfg)
    params = dict(model.named_parameters())
    for name, cls in parameter_classes(model).items():
        gain = p.init_gain(cls)
        if gain != 1.0:
            params[name].data.mul_(gain)


def optimizer_groups(cfg: Any, model: nn.Module, groups: list[dict]) -> list[dict]:
    """The regularizer's optimizer groups split by LR multiplier: each new group keeps its source's settings
    and gets ``lr_scale`` and its weight decay times the class's factor. sp returns ``groups`` unchanged
    (the optimizer state of an existing checkpoint keeps its layout)."""
    p = parametrization(cfg.model, cfg.optim)
    if type(p) is Parametrization:
        return groups
    classes = parameter_classes(model)
    class_of = {id(param): classes[name] for name, param in model.named_parameters()}
    out = []
    for group in groups:
        names = group.get("param_names")
        split: dict[tuple[float, float], dict] = {}
        for i, param in enumerate(group["params"]):
            cls = class_of[id(param)]
            key = (p.lr_scale(cls), p.weight_decay_scale(cls))
            if key not in split:
                new = {k: v for k, v in group.items() if k not in ("params", "param_names")}
                new.update(params=[], lr_scale=key[0], weight_decay=group.get("weight_decay", 0.0) * key[1])
                if names is not None:
                    new["param_names"] = []
                split[key] = new
            split[key]["params"].append(param)
            if names is not None:
                split[key]["param_names"].append(names[i])
        out.extend(split.values())
    return out


def set_lr(optimizer: Any, lr: float) -> None:
    """Every group's lr = the scheduled ``lr`` times its ``lr_scale`` (1 when it has none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
