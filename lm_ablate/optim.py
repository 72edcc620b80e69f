"""Optimizers (group ``optim``) and learning-rate schedules (``optim.schedule``).

Every optimizer takes the regularizer's parameter groups (``params``, ``param_names``, ``weight_decay``, and
an ``lr_scale`` where a parametrization set one) and keeps every key of them; each step the loop sets
``group["lr"] = optim.lr x schedule(step) x group.get("lr_scale", 1)`` on every group of ``.param_groups``.
With gradient g, momentum buffer b, step size lr and the group's weight decay lambda:

    adamw     (Loshchilov & Hutter 2019)   p <- p (1 - lr lambda) - lr m_hat / (sqrt(v_hat) + eps)       torch.optim.AdamW
    muon      (Jordan et al. 2024;         hidden 2-D matrices (:func:`is_hidden_matrix`):               torch.optim.Muon
               Liu et al. 2025)              b <- mu b + (1 - mu) g;  u = (1 - mu) g + mu b (nesterov) | b
                                             p <- p (1 - lr lambda) - lr s(shape) NS5(u)
                                           every other parameter: AdamW as above                      + torch.optim.AdamW
    adafactor (Shazeer & Stern 2018)       factored second moment (row and column means of g^2),         torch.optim.Adafactor
                                           1 - beta2_t = t^beta2_decay, no first moment, update U clipped
                                           to RMS(U) <= d; relative step: p <- p (1 - lr lambda)
                                           - max(eps2, RMS(p)) min(lr, 1/sqrt(t)) U / max(1, RMS(U)/d)
    sgd       (Polyak 1964; Nesterov       g <- g + lambda p (L2, coupled: torch's SGD);                 torch.optim.SGD
               momentum: Sutskever           b <- mu b + g;  p <- p - lr (g + mu b) (nesterov) | lr b
               et al. 2013)

Weight decay: decoupled p(1 - lr lambda) for adamw, muon and adafactor, L2 through the gradient for sgd (as
torch implements each); the groups decide which parameters decay (``regularization.decay_*``) for all four.
Muon: NS5 is the quintic Newton-Schulz orthogonalization (coefficients 3.4445, -4.7750, 2.0315, ``ns_steps``
iterations on u / ||u||_F) in bf16, as torch computes it on every device (bench/optimizers.py: on this CPU's
AVX-512 BF16 it is faster than fp32); s(shape) = sqrt(max(1, rows / cols)) for ``adjust_lr_fn=original``
(Jordan) or 0.2 sqrt(max(rows, cols)) for ``match_rms_adamw`` (Liu et al.: the update's RMS matches AdamW's
typical 0.2-0.4, so AdamW's LR and weight decay carry over; in this repository's optimizer study Muon still
did best at ~3x AdamW's best LR: conf/optim/muon.yaml). torch's Muon keeps b as an EMA of g (the lerp above), so
``momentum`` is the EMA's coefficient, as in Jordan's code.
Adafactor: ``optim.lr`` is the *relative* step rho (the update is scaled by each parameter's RMS).

Every optimizer records which parameters it updates, ``optimizer.assignment`` = {name: [parameter names]}
(the run record's ``optimizer_params``).

Weight decay as a timescale (``optim.wd_timescale``; Wang & Aitchison 2024, "How to set AdamW's weight decay as
you scale model and dataset size"): decoupled decay makes the weights an exponential moving average of the
updates with timescale tau = 1 / (eta lambda) steps, and what transfers across LRs and run lengths is tau as a
fraction of the run, tau / T. Given tau / T, the run's lambda is

    lambda = 1 / (eta_peak x tau/T x T)        eta_peak = optim.lr, T = the run's steps (the LR schedule's horizon:
                                               train.max_steps, or fewer by train.max_tokens or a ladder's budget)

and given lambda (``regularization.weight_decay``), tau / T = 1 / (eta_peak x lambda x T) (infinite for lambda = 0).
Both are recorded in every run's summary (``weight_decay``, ``wd_timescale``). ``wd_timescale=inf`` is no decay.
Under muP the hidden groups' lr x lambda stays the base's (parametrization.py), so every group has the same tau;
Muon's groups with ``muon_lr_scale`` != 1 decay on tau / muon_lr_scale. Only the decoupled optimizers read it
(adamw, muon, adafactor: their decay is p (1 - lr lambda)); SGD's L2 decay has no such timescale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lm_ablate.errors import ConfigError, bad
from lm_ablate.registry import OPTIMIZERS, SCHEDULES
from lm_ablate.schema import OptimConfig

Schedule = Callable[[int], float]  # step -> multiplier of optim.lr
ADAMW_PART = ("embed", "position", "head")  # roots of the names Muon leaves to AdamW (see is_hidden_matrix)


def _groups(cfg: OptimConfig, groups: Sequence[dict], lr_scale: float = 1.0) -> list[dict]:
    """Copies of the groups (every key kept), each with its initial lr = optim.lr x its lr_scale. ``lr_scale``
    multiplies the group's own (e.g. Muon's LR relative to AdamW's); the key is set only where one applies."""
    out = []
    for group in groups:
        if "param_names" not in group or len(group["param_names"]) != len(group["params"]):
            raise ValueError("every parameter group needs 'param_names' (Regularizer.param_groups adds them)")
        copy = dict(group, params=list(group["params"]), param_names=list(group["param_names"]))
        if lr_scale != 1.0:
            copy["lr_scale"] = group.get("lr_scale", 1.0) * lr_scale
        copy["lr"] = cfg.lr * copy.get("lr_scale", 1.0)
        out.append(copy)
    return out


def _named(optimizer: torch.optim.Optimizer, name: str) -> torch.optim.Optimizer:
    optimizer.assignment = {name: [n for g in optimizer.param_groups for n in g["param_names"]]}  # type: ignore[attr-defined]
    return optimizer


def _adamw(cfg: OptimConfig, groups: list[dict], device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=device.type == "cuda" or None
    )


@OPTIMIZERS.register("adamw", reads=("beta1", "beta2", "eps", "wd_timescale"))
def adamw(cfg: OptimConfig, param_groups: Sequence[dict], device: torch.device) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019). The fused kernel only on CUDA (the CPU default is already vectorized)."""
    return _named(_adamw(cfg, _groups(cfg, param_groups), device), "adamw")


@OPTIMIZERS.register("sgd", reads=("momentum", "nesterov"))
def sgd(cfg: OptimConfig, param_groups: Sequence[dict], device: torch.device) -> torch.optim.Optimizer:
    """SGD with heavy-ball momentum (Polyak 1964), Nesterov's with ``nesterov`` (Sutskever et al. 2013)."""
    return _named(
        torch.optim.SGD(_groups(cfg, param_groups), lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov),
        "sgd",
    )


@OPTIMIZERS.register("adafactor", reads=("eps", "beta2_decay", "eps2", "clip_threshold", "wd_timescale"))
def adafactor(cfg: OptimConfig, param_groups: Sequence[dict], device: torch.device) -> torch.optim.Optimizer:
    """Adafactor (Shazeer & Stern 2018) as torch implements it: factored second moment, no momentum, relative
    step size (``optim.lr`` is rho), update clipping at ``clip_threshold``; ``eps`` floors sqrt(v_hat)."""
    return _named(
        torch.optim.Adafactor(
            _groups(cfg, param_groups),
            lr=cfg.lr,
            beta2_decay=cfg.beta2_decay,
            eps=(cfg.eps, cfg.eps2),
            d=cfg.clip_threshold,
        ),
        "adafactor",
    )


def is_hidden_matrix(name: str, shape: Sequence[int]) -> bool:
    """Muon's parameters: the hidden layers' 2-D weights (Jordan et al. 2024; Liu et al. 2025). The rule, by
    the names of ``TransformerLM.named_parameters()`` and shapes:

        AdamW  the token embedding ``embed.weight``; position tables ``position.*`` (the learned absolute table,
               T5's bucket x head bias table); the LM head ``head.*`` (when tied it *is* ``embed.weight``,
               listed once under that name); every parameter that is not 2-D (norm gains, biases, ReZero's
               scalar gates).
        Muon   every other 2-D weight: attention q/k/v/out, FFN up/gate/down, the parallel block's input
               projection, ``project_in`` / ``project_out`` (embed_dim != d_model).

    Fused matrices are orthogonalized as one matrix, as common Muon implementations do (Jordan's
    modded-nanogpt, Moonlight's Muon): the ``qkv`` projection, the gated FFN's ``gate_up``, and the parallel
    block's ``fused`` input projection, which stacks qkv and the FFN input (the FFN's gate and up too when
    gated). The orthogonalized update of a stack is not the stack of the parts' orthogonalized updates: it
    equalizes the singular values of the whole [rows, d_model] matrix, and ``adjust_lr_fn`` scales it by the
    whole matrix's shape. That is the choice made here, so a block's math is the same with or without fusion
    only up to this coupling; splitting would need per-slice NS (not implemented)."""
    return len(shape) == 2 and name.split(".")[0] not in ADAMW_PART


class Combined:
    """Several torch optimizers stepped as one (Muon on the hidden matrices, AdamW on the rest).

    ``param_groups`` is the flat list of every part's group dicts (the same objects, so setting a group's lr
    takes effect); ``state_dict`` is {part name: that part's state dict} (tensors, numbers, strings, lists,
    dicts only: loadable with ``torch.load(weights_only=True)``)."""

    def __init__(self, parts: dict[str, torch.optim.Optimizer]):
        self.parts = parts
        self.assignment = {name: [n for g in opt.param_groups for n in g["param_names"]] for name, opt in parts.items()}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for opt in self.parts.values() for group in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts.values():
            opt.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        for opt in self.parts.values():
            opt.step()

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.parts.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.parts):
            raise ValueError(f"optimizer state has parts {sorted(state)}, expected {sorted(self.parts)}")
        for name, opt in self.parts.items():
            opt.load_state_dict(state[name])


def split_groups(groups: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Each group cut in two by :func:`is_hidden_matrix`: (hidden-matrix groups, the others), every other key
    (weight_decay, lr_scale, ...) kept on both halves; empty halves dropped."""
    hidden, rest = [], []
    for group in groups:
        flags = [is_hidden_matrix(n, p.shape) for n, p in zip(group["param_names"], group["params"])]
        for wanted, out in ((True, hidden), (False, rest)):
            params = [p for p, f in zip(group["params"], flags) if f == wanted]
            names = [n for n, f in zip(group["param_names"], flags) if f == wanted]
            if params:
                out.append(dict(group, params=params, param_names=names))
    return hidden, rest


# its own keys, then its AdamW part's
MUON_READS = ("momentum", "nesterov", "ns_steps", "adjust_lr_fn", "muon_lr_scale", "beta1", "beta2", "eps")


@OPTIMIZERS.register("muon", reads=(*MUON_READS, "wd_timescale"))
def muon(cfg: OptimConfig, param_groups: Sequence[dict], device: torch.device) -> Combined:
    """Muon on :func:`is_hidden_matrix` parameters, AdamW (beta1, beta2, eps) on the rest; Muon's groups run at
    ``muon_lr_scale`` x the LR of AdamW's (1 with ``match_rms_adamw``)."""
    if not hasattr(torch.optim, "Muon"):  # torch.optim.Muon arrived in PyTorch 2.9 (pytorch/pytorch#160213)
        raise ConfigError(
            f"optim.name='muon' is invalid: needs torch >= 2.9 for torch.optim.Muon, this is {torch.__version__}"
        )
    hidden, rest = split_groups(param_groups)
    if not hidden:
        raise ConfigError(f"optim.name='muon' is invalid: no 2-D hidden matrix to orthogonalize ({_listed(rest)})")
    parts: dict[str, torch.optim.Optimizer] = {
        "muon": torch.optim.Muon(
            _groups(cfg, hidden, cfg.muon_lr_scale),
            lr=cfg.lr,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            ns_steps=cfg.ns_steps,
            adjust_lr_fn=cfg.adjust_lr_fn,
        )
    }
    if rest:
        parts["adamw"] = _adamw(cfg, _groups(cfg, rest), device)
    return Combined(parts)


def _listed(groups: list[dict], shown: int = 4) -> str:
    names = [n for g in groups for n in g["param_names"]]
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return "parameters: " + ", ".join(names[:shown]) + more if names else "no parameters"


def _warmup(cfg: OptimConfig, step: int) -> float | None:
    """Linear warmup: step s (0-based) of the first warmup_steps uses lr * (s + 1) / warmup_steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    return None


@SCHEDULES.register("constant")
def constant(cfg: OptimConfig, max_steps: int) -> Schedule:
    return lambda step: w if (w := _warmup(cfg, step)) is not None else 1.0


@SCHEDULES.register("cosine", reads=("min_lr_ratio",))
def cosine(cfg: OptimConfig, max_steps: int) -> Schedule:
    """After warmup, half a cosine from 1 to min_lr_ratio, reached at the last step."""

    def at(step: int) -> float:
        w = _warmup(cfg, step)
        if w is not None:
            return w
        span = max(1, max_steps - 1 - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return at


@SCHEDULES.register("wsd", reads=("min_lr_ratio", "decay_fraction"))
def warmup_stable_decay(cfg: OptimConfig, max_steps: int) -> Schedule:
    """Warmup, then the peak, then a linear decay to min_lr_ratio over the last decay_fraction of the steps
    (WSD: Hu et al. 2024, MiniCPM; Hägele et al. 2024). A stable phase makes runs of other lengths branches
    of one run, so a budget sweep needs no restart."""
    decay_steps = max(1, round(cfg.decay_fraction * max_steps))
    decay_start = max_steps - decay_steps

    def at(step: int) -> float:
        w = _warmup(cfg, step)
        if w is not None:
            return w
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / decay_steps)
        return 1.0 - (1.0 - cfg.min_lr_ratio) * progress

    return at


@SCHEDULES.register("inverse_sqrt")
def inverse_sqrt(cfg: OptimConfig, max_steps: int) -> Schedule:
    """The original Transformer's rate (Vaswani et al. 2017, eq. 3) normalised to peak at optim.lr: with
    s = step + 1 and w = max(1, warmup_steps), multiplier = min(s / w, sqrt(w / s))."""
    w = max(1, cfg.warmup_steps)
    return lambda step: min((step + 1) / w, math.sqrt(w / (step + 1)))


def build_schedule(cfg: OptimConfig, max_steps: int) -> Schedule:
    return SCHEDULES.get(cfg.schedule)(cfg, max_steps)


# --- weight decay as a timescale (module docstring) -------------------------------------------------------
TIMESCALE_KEY = "optim.wd_timescale"
DECAY_KEY = "regularization.weight_decay"


def weight_decay_of(timescale: float, lr: float, steps: int) -> float:
    """lambda = 1 / (eta_peak x tau/T x T); 0 for tau/T = inf (no decay)."""
    return 0.0 if math.isinf(timescale) else 1.0 / (lr * timescale * steps)


def timescale_of(weight_decay: float, lr: float, steps: int) -> float:
    """tau / T = 1 / (eta_peak x lambda x T); inf for lambda = 0."""
    return math.inf if weight_decay == 0 else 1.0 / (lr * weight_decay * steps)


def resolve_weight_decay(cfg: Any, steps: int) -> tuple[float, float]:
    """(lambda, tau/T) of a run of ``steps`` steps: from ``optim.wd_timescale`` when it is set, else from
    ``regularization.weight_decay``."""
    lr, timescale = cfg.optim.lr, cfg.optim.get("wd_timescale")
    if timescale is not None:
        return weight_decay_of(timescale, lr, steps), float(timescale)
    return float(cfg.regularization.weight_decay), timescale_of(cfg.regularization.weight_decay, lr, steps)


def settle_weight_decay(cfg: Any, explicit: Any = ()) -> None:
    """With ``optim.wd_timescale`` set, lambda is the run's to derive: ``regularization.weight_decay`` becomes null
    (the record's "derived from the timescale"); refused in one line when lambda was set too, on the command line
    (``explicit``: the dotted keys the overrides set) or by a file (a value other than the regularization option's
    own, conf/regularization/<name>.yaml), or when the regularization option has no decay (none). Changes ``cfg``.
    Call after :func:`lm_ablate.options.settle` (which clears the key for an optimizer that does not read it)."""
    from omegaconf import OmegaConf

    from lm_ablate.schema import CONF_DIR

    timescale = OmegaConf.select(cfg, TIMESCALE_KEY, default=None)
    decay = cfg.regularization.weight_decay
    if timescale is None or decay is None:
        return
    name = cfg.regularization.name
    option = CONF_DIR / "regularization" / f"{name}.yaml"
    default = OmegaConf.load(option).get("weight_decay") if option.is_file() else None
    if name == "none":
        raise bad(TIMESCALE_KEY, timescale, "regularization=none has no weight decay (choose standard, dropout, zloss)")
    if DECAY_KEY in set(explicit) or default is None or float(decay) != float(default):
        raise bad(
            TIMESCALE_KEY,
            timescale,
            f"{DECAY_KEY}={decay!r} is set too: give one of them (lambda = 1 / (optim.lr x tau/T x steps))",
        )
    OmegaConf.update(cfg, DECAY_KEY, None, merge=False)


def with_weight_decay(regularization: Any, weight_decay: float) -> Any:
    """A copy of the regularization node whose ``weight_decay`` is the run's lambda (the recorded config keeps
    null where the timescale derived it)."""
    from omegaconf import OmegaConf

    out = regularization.copy()
    OmegaConf.update(out, "weight_decay", weight_decay, merge=False)
    return out
