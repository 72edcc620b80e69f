"""Claims as data: what a study expects, declared in its experiment file and checked by the analysis.

A study states the literature's claims it tests under the top-level key ``claims`` of its experiment file
(``conf/experiment/<study>.yaml``), so every run's config.yaml carries them and the report reads them back from
the run records. One claim::

    claims:
      - id: post_fails_at_high_lr           # unique within the study: [A-Za-z0-9_.-]
        source: Xiong et al. 2020 (arXiv:2002.04745)
        statement: Without warmup, post-LN fails to train at a high LR where pre-LN trains.
        axis: norm.placement                 # the compared config key (or a group/bundle: activation, variant)
        arm: post                            # the value the claim is about ...
        baseline: pre                        # ... against this one
        context: {optim.lr: 1.0e-2}          # optional: only where these other keys have these values
        metric: final_val_loss               # see METRICS
        expect: higher                       # lower | higher | equal (then margin: the equivalence margin)

The analysis (``analysis/claims.py``) computes ``metric(arm) - metric(baseline)`` (or ``arm / baseline`` for a
ratio metric) with its 95% and 90% intervals in every context of the other varied axes that ``context`` allows
and decides each: **held** (lower: the 95% interval lies below the null value; higher: above it; equal: the
90% interval lies inside null ± margin, i.e. both one-sided tests at 5% pass, TOST; for a ratio metric the
band is [1/(1 + margin), 1 + margin]), **contradicted** (lower: the 95% interval lies above the null; higher:
below it; equal: the 95% interval lies entirely outside the band), **inconclusive** otherwise, **untested** when the runs hold no value for the arm or the
baseline there. The null value is 0 for a difference and 1 for a ratio.

This module is the schema and its checks: :func:`parse_claims` (fields, types, names; called by
:func:`lm_ablate.config.validate` for every run) and :func:`check_claims_against_arms` (the claim refers to keys
and values the sweep has; called by ``lm_ablate.sweep_check`` before any job starts). Both raise
:class:`ConfigError` with one line, ``claims[<id>].<field>=<value> is invalid: ...``.

METRICS lists what a claim may compare; each name has one function in ``analysis.claims.METRIC_FUNCTIONS``
(a test checks the two tables agree): adding a metric is an entry here and a function there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lm_ablate.errors import bad

LOWER, HIGHER, EQUAL = "lower", "higher", "equal"
DIRECTIONS = (LOWER, HIGHER, EQUAL)
LR_KEY = "optim.lr"
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
FIELDS = ("id", "source", "statement", "axis", "arm", "baseline", "context", "metric", "expect", "margin", "at")
REQUIRED = ("id", "source", "statement", "axis", "arm", "baseline", "metric", "expect")


@dataclass(frozen=True)
class MetricSpec:
    """What a claim metric compares. ``ratio``: compared as arm / baseline (null 1, tested on logs) rather than
    arm - baseline (null 0). ``pools``: config keys the metric aggregates over, so they are not a context (LR
    sensitivity is one number per LR grid). ``at``: what the claim's ``at`` field means for it, if anything."""

    what: str
    ratio: bool = False
    pools: tuple[str, ...] = ()
    at: str = ""


METRICS: dict[str, MetricSpec] = {
    "final_val_loss": MetricSpec("final validation loss of completed runs (nats/token)"),
    "best_val_loss": MetricSpec("lowest validation loss of completed runs"),
    "capped_val_loss": MetricSpec(
        "final validation loss capped at the run's loss at step 0; a diverged run counts as its step-0 loss "
        "(the per-run quantity of LR sensitivity: a run that fails to train scores as untrained)"
    ),
    "val_loss_at_context": MetricSpec(
        "validation loss at k times the training context (val/loss@<k>x)", at="k (default 4)"
    ),
    "extrapolation_gap": MetricSpec(
        "validation loss at k times the training context minus at 1x (how much a run loses past its context)",
        at="k (default 4)",
    ),
    "grad_norm_spike_rate": MetricSpec("gradient-norm spikes per 1000 steps (completed and diverged runs)"),
    "loss_spike_rate": MetricSpec("loss spikes per 1000 steps (completed and diverged runs)"),
    "tokens_per_sec": MetricSpec("training tokens/s of completed runs, as a ratio arm / baseline", ratio=True),
    "max_attn_logit": MetricSpec(
        "largest pre-softmax attention logit over all layers and probe steps (completed and diverged runs), "
        "as a ratio arm / baseline",
        ratio=True,
    ),
    "init_grad_growth": MetricSpec(
        "gradient norm of the last block over that of the first block at the first probe (initialization), "
        "as a ratio of these ratios arm / baseline",
        ratio=True,
    ),
    "lr_sensitivity": MetricSpec(
        "LR sensitivity E_lr[min(loss(lr), loss_init) - loss*] over the arm's LR grid (Wortsman et al. 2023), "
        "computed per seed",
        pools=(LR_KEY,),
    ),
    "final_val_loss_at_best_lr": MetricSpec(
        "final validation loss of each side at its own best LR (the LR of its grid with the lowest mean over "
        "seeds; analysis/best_lr.py): arms tuned alike (Wen et al. 2025)",
        pools=(LR_KEY, "choices.lr_mult"),
    ),
    "best_lr_spread": MetricSpec(
        "how far the best LR moves across model widths: max / min over model.d_model of the LR with the lowest "
        "mean capped loss, as a ratio arm / baseline (bootstrap over seeds)",
        ratio=True,
        pools=(LR_KEY, "model.d_model"),
    ),
    "widest_val_loss_at_best_lr": MetricSpec(
        "final validation loss at the widest model.d_model the runs have, each side at its own best LR there (the "
        "LR with the lowest mean over completed seeds), arm - baseline: mu-transferred vs tuned at full width",
        pools=(LR_KEY, "model.d_model"),
    ),
    "compute_multiplier": MetricSpec(
        "compute multiplier CM = L_base^-1(L_arm(C)) / C of a scaling study (> 1: the arm needs less compute)",
        ratio=True,
        pools=(LR_KEY,),
        at="largest (default), 10x or 100x the largest rung's compute",
    ),
}


@dataclass(frozen=True)
class Claim:
    id: str
    source: str
    statement: str
    axis: str
    arm: Any
    baseline: Any
    metric: str
    expect: str
    context: tuple[tuple[str, Any], ...] = ()
    margin: float | None = None
    at: Any = None

    @property
    def spec(self) -> MetricSpec:
        return METRICS[self.metric]

    @property
    def null(self) -> float:
        """The metric's value of "no effect": 0 for a difference, 1 for a ratio."""
        return 1.0 if self.spec.ratio else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = {
            "id": self.id, "source": self.source, "statement": self.statement, "axis": self.axis,
            "arm": self.arm, "baseline": self.baseline, "context": dict(self.context), "metric": self.metric,
            "expect": self.expect,
        }  # fmt: skip
        if self.margin is not None:
            out["margin"] = self.margin
        if self.at is not None:
            out["at"] = self.at
        return out


def _where(index: int, raw: Any) -> str:
    """How an error names a claim: ``claims[<id>]``, or ``claims[<index>]`` before its id is known."""
    cid = raw.get("id") if isinstance(raw, Mapping) else None
    return f"claims[{cid}]" if isinstance(cid, str) and cid else f"claims[{index}]"


def _text(where: str, raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or not value.strip():
        raise bad(f"{where}.{name}", value, "must be a non-empty string")
    return value.strip()


def _scalar(where: str, name: str, value: Any) -> Any:
    if isinstance(value, (Mapping, list, tuple)):
        raise bad(f"{where}.{name}", value, "must be one value (a string, number, true/false or null)")
    if isinstance(value, float) and not math.isfinite(value):
        raise bad(f"{where}.{name}", value, "must be a finite number")
    return value


def parse_claim(index: int, raw: Any) -> Claim:
    where = _where(index, raw)
    if not isinstance(raw, Mapping):
        raise bad(where, raw, "a claim is a mapping with the fields " + ", ".join(FIELDS))
    unknown = [k for k in raw if k not in FIELDS]
    if unknown:
        raise bad(f"{where}.{unknown[0]}", raw[unknown[0]], "unknown field; fields: " + ", ".join(FIELDS))
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise bad(f"{where}.{missing[0]}", None, "required field is missing; required: " + ", ".join(REQUIRED))
    cid = _text(where, raw, "id")
    if not ID_PATTERN.match(cid):
        raise bad(f"{where}.id", cid, "allowed: letters, digits, '_', '.', '-'")
    metric = raw["metric"]
    if metric not in METRICS:
        raise bad(f"{where}.metric", metric, "allowed: " + ", ".join(METRICS))
    expect = raw["expect"]
    if expect not in DIRECTIONS:
        raise bad(f"{where}.expect", expect, "allowed: " + ", ".join(DIRECTIONS))
    margin = raw.get("margin")
    if expect == EQUAL:
        ok = isinstance(margin, (int, float)) and not isinstance(margin, bool) and math.isfinite(margin) and margin > 0
        if not ok:
            raise bad(f"{where}.margin", margin, "expect: equal needs a margin > 0 (the equivalence margin)")
        margin = float(margin)
    elif margin is not None:
        raise bad(f"{where}.margin", margin, f"only expect: {EQUAL} takes a margin")
    axis = _text(where, raw, "axis")
    arm = _scalar(where, "arm", raw["arm"])
    baseline = _scalar(where, "baseline", raw["baseline"])
    if same_value(arm, baseline):
        raise bad(f"{where}.arm", arm, "must differ from the baseline")
    context = raw.get("context") or {}
    if not isinstance(context, Mapping):
        raise bad(f"{where}.context", context, "must be a mapping of config keys to values, e.g. {optim.lr: 0.01}")
    pairs = []
    for key, value in context.items():
        if not isinstance(key, str) or not key:
            raise bad(f"{where}.context", key, "keys must be config keys, e.g. optim.lr")
        if key == axis:
            raise bad(f"{where}.context.{key}", value, "the compared axis cannot also be a context key")
        if key in METRICS[metric].pools:
            raise bad(f"{where}.context.{key}", value, f"{metric} aggregates over {key}, so it cannot be a context")
        pairs.append((key, _scalar(where, f"context.{key}", value)))
    at = _scalar(where, "at", raw.get("at"))
    if at is not None and not METRICS[metric].at:
        raise bad(f"{where}.at", at, f"{metric} takes no 'at'")
    return Claim(
        id=cid, source=_text(where, raw, "source"), statement=_text(where, raw, "statement"), axis=axis, arm=arm,
        baseline=baseline, metric=metric, expect=expect, context=tuple(pairs), margin=margin, at=at,
    )  # fmt: skip


def parse_claims(raw: Any) -> list[Claim]:
    """The claims of a config's ``claims`` value (a list of mappings, or None / empty). Raises ConfigError."""
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):
        raise bad("claims", raw, "must be a list of claims (mappings)")
    claims = [parse_claim(i, item) for i, item in enumerate(raw)]
    seen: set[str] = set()
    for claim in claims:
        if claim.id in seen:
            raise bad(f"claims[{claim.id}].id", claim.id, "ids must be unique within a study")
        seen.add(claim.id)
    return claims


# --- values and keys ------------------------------------------------------------------------------------
def same_value(a: Any, b: Any) -> bool:
    """Do a claim's value and a config value agree? Numbers numerically (1e-2 == 0.01), booleans and null by
    their YAML spelling, other values as text (case-blind)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return spelled(a) == spelled(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    return str(a).strip().lower() == str(b).strip().lower()


def spelled(value: Any) -> str:
    """A value as YAML and Hydra overrides write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{dotted.key: value}``; lists are leaves."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def resolve_key(key: str, known: Iterable[str]) -> str | None:
    """The config key a claim's ``axis`` or context key means, or None: the key itself; a group name typed as
    an override (``activation``) is that group's ``activation.name``; a bundle group (``variant``, ``arch``,
    whose options set other groups' keys) is its choice, ``choices.variant``."""
    known = set(known)
    if key in known:
        return key
    if f"{key}.name" in known:
        return f"{key}.name"
    if f"choices.{key}" in known:
        return f"choices.{key}"
    return None


def check_claims_against_arms(claims: Sequence[Claim], arms: Sequence[Mapping[str, Any]]) -> None:
    """Every claim refers to what the sweep runs: its axis varies across ``arms`` (flattened configs, one per
    arm), its arm and baseline are values of that axis, each context key is a config key with the given value
    in some arm, and some arm has the arm value in that context and some the baseline value. Raises
    ConfigError (one line) for the first claim that does not."""
    if not claims or not arms:
        return
    known = set().union(*(a.keys() for a in arms))
    for claim in claims:
        where = f"claims[{claim.id}]"
        key = resolve_key(claim.axis, known)
        if key is None:
            raise bad(f"{where}.axis", claim.axis, "not a config key of this sweep (e.g. norm.placement, activation)")
        values = _distinct(a.get(key) for a in arms)
        if len(values) < 2:
            raise bad(f"{where}.axis", claim.axis, f"does not vary in this sweep (every arm has {_show(values)})")
        for name in ("arm", "baseline"):
            value = getattr(claim, name)
            if not any(same_value(value, v) for v in values):
                raise bad(
                    f"{where}.{name}", value, f"not a value of {claim.axis} in this sweep; values: {_show(values)}"
                )
        matched = list(arms)
        for ckey, cvalue in claim.context:
            resolved = resolve_key(ckey, known)
            if resolved is None:
                raise bad(f"{where}.context.{ckey}", cvalue, "not a config key of this sweep")
            cvalues = _distinct(a.get(resolved) for a in arms)
            if not any(same_value(cvalue, v) for v in cvalues):
                raise bad(f"{where}.context.{ckey}", cvalue, f"no arm has this value; values: {_show(cvalues)}")
            matched = [a for a in matched if same_value(cvalue, a.get(resolved))]
        for name in ("arm", "baseline"):
            value = getattr(claim, name)
            if not any(same_value(value, a.get(key)) for a in matched):
                where_ctx = ", ".join(f"{k}={spelled(v)}" for k, v in claim.context)
                raise bad(
                    f"{where}.{name}", value, f"no arm of this sweep has {claim.axis}={spelled(value)} with {where_ctx}"
                )


def _distinct(values: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not any(same_value(v, seen) and type(v) is type(seen) for seen in out):
            out.append(v)
    return out


def _show(values: Sequence[Any], limit: int = 8) -> str:
    shown = ", ".join(spelled(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} values)" if len(values) > limit else "")
