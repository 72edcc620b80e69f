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

A claim on a downstream task (the ``eval`` group, docs/evaluation.md) names it with ``metric: downstream`` and
two more fields, both required there and refused elsewhere: ``task`` (a task name of the runs' ``eval.tasks``)
and ``kind`` (acc | acc_norm | bpb)::

        metric: downstream                   # each completed run's downstream/<task>/<kind> (summary.json)
        task: shakespeare_order
        kind: acc                            # acc, acc_norm: higher is better; bpb: lower is better
        expect: lower                        # the claim's own direction, as for any metric

It is compared run by run like ``final_val_loss`` (paired by seed), at each side's best LR when the LR varies
and the context does not pin it, and stalled seeds make it inconclusive, as below.

The analysis (``analysis/claims.py``) computes ``metric(arm) - metric(baseline)`` (or ``arm / baseline`` for a
ratio metric) with its 95% and 90% intervals in every context of the other varied axes that ``context`` allows
and decides each: **held** (lower: the 95% interval lies below the null value; higher: above it; equal: the
90% interval lies inside null ± margin, i.e. both one-sided tests at 5% pass, TOST; for a ratio metric the
band is [1/(1 + margin), 1 + margin]), **contradicted** (lower: the 95% interval lies above the null; higher:
below it; equal: the 95% interval lies entirely outside the band), **inconclusive** otherwise, **untested** when the runs hold no value for the arm or the
baseline there. The null value is 0 for a difference and 1 for a ratio.

Fair verdicts (issue 23): when the runs vary ``optim.lr`` and the claim's ``context`` does not pin it, each side
is taken at its own best LR in each context (the LR with the lowest mean final validation loss over its completed
seeds; seed-adjusted where its LRs ran different seeds) and the claim is decided there: best
against best, not at a shared LR. A claim about a fixed regime ("post-LN without warmup at a high LR") says so
by pinning the keys in its ``context`` (``context: {optim.lr: 1.0e-2, optim.warmup_steps: 0}``) and is decided
at that setting. When a side has stalled
seeds (lm_ablate/stall.py) among the runs it is decided on, the verdict is **inconclusive** ("k of n seeds
stalled") unless the metric is about failing to train (``MetricSpec.failures``: capped_val_loss, lr_sensitivity,
best_lr_spread) or the claim says it is (``counts_failures: true``: "post-norm trains worse, or not at all", on
any metric), where a stalled run is a data point, or the metric is read at initialization (``MetricSpec.at_init``:
init_grad_growth, the first probe's gradients), before anything a later stall could change.

This module is the schema and its checks: :func:`parse_claims` (fields, types, names; called by
:func:`lm_ablate.config.validate` for every run) and :func:`check_claims_against_arms` (the claim refers to keys
and values the sweep has; called by ``lm_ablate.sweep_check`` before any job starts). Both raise
:class:`ConfigError` with one line, ``claims[<id>].<field>=<value> is invalid: ...``.

A **basin claim** is about every value of a numeric axis at once (Kaplan et al. 2020, Fig. 5: d_ff / d_model,
aspect ratio, head dim at a fixed parameter count), each value at its own best LR, its metric relative to the best
value's in % (analysis/compute/basin.py). It has no arm or baseline; ``margin`` is in percent and ``over`` the
axis values it speaks of (inclusive; null for an open end)::

      - id: ffn_ratio_basin
        source: Kaplan et al. 2020, Fig. 5
        statement: At a fixed parameter count the loss is within 2% of the best over d_ff/d_model 1 to 8.
        axis: model.ffn_ratio
        metric: relative_val_loss            # or relative_val_bpb (bits per byte: across tokenizers)
        expect: within                       # within m% of the best at every value in over
        margin: 2                            # m, in percent
        over: [1, 8]                         # [a, b]
      - ...
        expect: worse                        # worse by at least m% at every value in over
        margin: 4
        over: [20, null]                     # beyond c: [c, null]; below c: [null, c]

METRICS lists what a claim may compare; each name has one function in ``analysis.claims.METRIC_FUNCTIONS``
(a test checks the two tables agree): adding a metric is an entry here and a function there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lm_ablate import metrics as M
from lm_ablate.errors import bad

LOWER, HIGHER, EQUAL = "lower", "higher", "equal"
WITHIN, WORSE = "within", "worse"  # basin claims (metrics with MetricSpec.basin)
DIRECTIONS = (LOWER, HIGHER, EQUAL, WITHIN, WORSE)
LR_KEY = "optim.lr"
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
FIELDS = (
    "id", "source", "statement", "axis", "arm", "baseline", "context", "metric", "expect", "margin", "at", "task",
    "kind", "counts_failures", "over",
)  # fmt: skip
REQUIRED = ("id", "source", "statement", "axis", "arm", "baseline", "metric", "expect")
SIDES = ("arm", "baseline")  # required except in a basin claim, which refuses them
METRIC_FIELDS = ("task", "kind")  # fields only a metric that needs them takes (MetricSpec.needs)
TASK_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")  # as lm_ablate/eval/tasks.py allows a task name


@dataclass(frozen=True)
class MetricSpec:
    """What a claim metric compares. ``ratio``: compared as arm / baseline (null 1, tested on logs) rather than
    arm - baseline (null 0). ``pools``: config keys the metric aggregates over, so they are not a context (LR
    sensitivity is one number per LR grid). ``at``: what the claim's ``at`` field means for it, if anything.
    ``failures``: the metric is about runs that fail to train (a stalled or diverged run is a data point of it,
    scored at the cap), so stalled seeds do not make its verdict inconclusive. ``at_best_lr``: the metric pools
    the LR and takes each side at its own best LR (every metric that does not pool the LR is decided so too
    when the runs vary it and the claim's context does not pin it; analysis/compute/claims.py). ``needs``: the
    claim fields of METRIC_FIELDS the metric requires (``downstream``: task and kind); no other metric takes them.
    ``at_init``: read at initialization (the first probe, before an update moves the weights), so a run's later
    stall cannot change it and stalled seeds do not make its verdict inconclusive either."""

    what: str
    ratio: bool = False
    pools: tuple[str, ...] = ()
    at: str = ""
    failures: bool = False
    at_best_lr: bool = False
    needs: tuple[str, ...] = ()
    at_init: bool = False
    basin: bool = False  # every value of a numeric axis relative to the best one (expect within | worse; over)


METRICS: dict[str, MetricSpec] = {
    "final_val_loss": MetricSpec("final validation loss of completed runs (nats/token)"),
    "best_val_loss": MetricSpec("lowest validation loss of completed runs"),
    "capped_val_loss": MetricSpec(
        "final validation loss capped at ln V (the uniform prediction's loss over the run's vocabulary); a "
        "diverged run counts as ln V (the per-run quantity of LR sensitivity: a run that fails to train scores "
        "as untrained); a run without its vocabulary recorded is capped at its step-0 loss",
        failures=True,
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
        at_init=True,
    ),
    "lr_sensitivity": MetricSpec(
        "LR sensitivity E_lr[min(loss(lr), ln V) - loss*] over the arm's LR grid (Wortsman et al. 2023), "
        "computed per seed",
        pools=(LR_KEY,),
        failures=True,
    ),
    "final_val_loss_at_best_lr": MetricSpec(
        "final validation loss of each side at its own best LR (the LR of its grid with the lowest mean over "
        "seeds; analysis/best_lr.py): arms tuned alike (Wen et al. 2025)",
        pools=(LR_KEY, "choices.lr_mult"),
        at_best_lr=True,
    ),
    "best_lr_spread": MetricSpec(
        "how far the best LR moves across model widths: max / min over model.d_model of the LR with the lowest "
        "mean capped loss, as a ratio arm / baseline (bootstrap over seeds)",
        ratio=True,
        pools=(LR_KEY, "model.d_model"),
        failures=True,
    ),
    "widest_val_loss_at_best_lr": MetricSpec(
        "final validation loss at the widest model.d_model the runs have, each side at its own best LR there (the "
        "LR with the lowest mean over completed seeds), arm - baseline: mu-transferred vs tuned at full width",
        pools=(LR_KEY, "model.d_model"),
        at_best_lr=True,
    ),
    "final_val_bpb": MetricSpec(
        "bits per byte over the held-out text at the end (val/bpb, summary final_val_bpb; lm_ablate/eval/bpb.py): "
        "the same text for every tokenizer, so arms with different tokenizers compare on it (runs made before it "
        "existed have none: untested)"
    ),
    "relative_val_loss": MetricSpec(
        "final validation loss of each value of a numeric axis at its own best LR, relative to the best value's, "
        "in % (Kaplan et al. 2020, Fig. 5; analysis/compute/basin.py)",
        pools=(LR_KEY, "choices.lr_mult"),
        at_best_lr=True,
        basin=True,
    ),
    "relative_val_bpb": MetricSpec(
        "final validation bits per byte of each value of a numeric axis at its own best LR, relative to the best "
        "value's, in % (a basin across tokenizers: vocabulary size)",
        pools=(LR_KEY, "choices.lr_mult"),
        at_best_lr=True,
        basin=True,
    ),
    "downstream": MetricSpec(
        "a downstream task's score at the run's last evaluation, downstream/<task>/<kind> in summary.json "
        "(completed runs; acc and acc_norm: fraction right, higher is better; bpb: bits per byte of the gold "
        "continuation, lower is better)",
        needs=("task", "kind"),
    ),
    "compute_multiplier": MetricSpec(
        "compute multiplier CM = L_base^-1(L_arm(C)) / C of a scaling study (> 1: the arm needs less compute)",
        ratio=True,
        pools=(LR_KEY,),
        at="largest (default), 10x or 100x the largest rung's compute",
    ),
}


# metrics per token of the run's own tokenizer: meaningless between arms with different tokenizers (their tokens
# differ), refused there in one line that names final_val_bpb (here for an axis that is a tokenizer key; the
# analysis refuses any claim whose arm and baseline runs differ in tokenizer)
PER_TOKEN_METRICS = frozenset({
    "final_val_loss", "best_val_loss", "capped_val_loss", "val_loss_at_context", "extrapolation_gap",
    "lr_sensitivity", "final_val_loss_at_best_lr", "widest_val_loss_at_best_lr", "compute_multiplier",
})  # fmt: skip
TOKENIZER_KEYS = ("data.tokenizer", "data.vocab_size", "data.tokenizer_path", "model.vocab_size")


def per_token_refusal(what: str, tokenizers: str) -> str:
    """The one line that refuses a per-token comparison across tokenizers (``what``: the metric compared)."""
    return (f"{what} is loss per token, and the tokens differ between {tokenizers}: compare bits per byte over the "
            "same text instead (claim metric final_val_bpb; val/bpb)")  # fmt: skip


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
    task: str | None = None  # metric downstream: the task and the kind it scores
    kind: str | None = None
    # the claim is about failing to train ("... worse, or not at all"): stalled seeds are data points of it, as
    # for a metric about failures (MetricSpec.failures), instead of making it inconclusive
    counts_failures: bool = False
    over: tuple[float | None, float | None] | None = None  # a basin claim's axis values (an end None: open)

    @property
    def spec(self) -> MetricSpec:
        return METRICS[self.metric]

    @property
    def metric_name(self) -> str:
        """The metric as tables name it: the recorded ``downstream/<task>/<kind>`` for a downstream claim, else
        ``metric``."""
        return M.downstream(self.task, self.kind) if self.task is not None and self.kind is not None else self.metric

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
        for name in METRIC_FIELDS:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.counts_failures:
            out["counts_failures"] = True
        if self.over is not None:
            out["over"] = list(self.over)
        return out

    @property
    def stalls_are_data(self) -> bool:
        """Stalled seeds do not withhold this claim's verdict: its metric or the claim itself is about failing to
        train (a stalled run is a data point), or the metric is read at initialization, before any stall."""
        return self.spec.failures or self.spec.at_init or self.counts_failures


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
    if isinstance(value, float) and math.isnan(value):  # .inf is a value (optim.wd_timescale: no decay)
        raise bad(f"{where}.{name}", value, "must be a number, not nan")
    return value


def parse_claim(index: int, raw: Any) -> Claim:
    where = _where(index, raw)
    if not isinstance(raw, Mapping):
        raise bad(where, raw, "a claim is a mapping with the fields " + ", ".join(FIELDS))
    unknown = [k for k in raw if k not in FIELDS]
    if unknown:
        raise bad(f"{where}.{unknown[0]}", raw[unknown[0]], "unknown field; fields: " + ", ".join(FIELDS))
    basin = isinstance(raw.get("metric"), str) and raw["metric"] in METRICS and METRICS[raw["metric"]].basin
    missing = [k for k in REQUIRED if k not in raw and not (basin and k in SIDES)]
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
    if basin or expect in (WITHIN, WORSE):
        return _basin_claim(where, raw, cid, metric, expect)
    if "over" in raw:
        raise bad(f"{where}.over", raw["over"], f"only a basin claim (metric {_basin_metrics()}) takes over")
    margin = raw.get("margin")
    if expect == EQUAL:
        ok = isinstance(margin, (int, float)) and not isinstance(margin, bool) and math.isfinite(margin) and margin > 0
        if not ok:
            raise bad(f"{where}.margin", margin, "expect: equal needs a margin > 0 (the equivalence margin)")
        margin = float(margin)
    elif margin is not None:
        raise bad(f"{where}.margin", margin, f"only expect: {EQUAL} takes a margin")
    axis = _text(where, raw, "axis")
    if metric in PER_TOKEN_METRICS and axis in TOKENIZER_KEYS:
        raise bad(f"{where}.metric", metric, per_token_refusal(metric, f"the arms of {axis}"))
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
    task, kind = _metric_fields(where, raw, metric)
    counts_failures = raw.get("counts_failures", False)
    if not isinstance(counts_failures, bool):
        raise bad(f"{where}.counts_failures", counts_failures, "must be true or false (stalled seeds are data points "
                  "of a claim about failing to train)")  # fmt: skip
    return Claim(
        id=cid, source=_text(where, raw, "source"), statement=_text(where, raw, "statement"), axis=axis, arm=arm,
        baseline=baseline, metric=metric, expect=expect, context=tuple(pairs), margin=margin, at=at, task=task,
        kind=kind, counts_failures=counts_failures,
    )  # fmt: skip


def _basin_metrics() -> str:
    return " | ".join(m for m, spec in METRICS.items() if spec.basin)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _basin_claim(where: str, raw: Mapping[str, Any], cid: str, metric: str, expect: str) -> Claim:
    """A basin claim (module docstring): metric a basin metric, expect within | worse, margin > 0 (percent), over
    [a, b] (within: both ends; worse: at least one, the other null for an open end), no arm or baseline."""
    if not METRICS[metric].basin:
        raise bad(f"{where}.expect", expect, f"expect: {expect} is for a basin metric ({_basin_metrics()}); "
                  f"{metric} allows: {LOWER}, {HIGHER}, {EQUAL}")  # fmt: skip
    if expect not in (WITHIN, WORSE):
        raise bad(f"{where}.expect", expect, f"metric {metric} allows: {WITHIN}, {WORSE}")
    for side in SIDES:
        if side in raw:
            raise bad(f"{where}.{side}", raw[side], "a basin claim speaks of every axis value in over: no arm or "
                      "baseline")  # fmt: skip
    margin = raw.get("margin")
    if not (_number(margin) and margin > 0):
        raise bad(f"{where}.margin", margin, f"expect: {expect} needs a margin > 0, in percent (within 2% of the "
                  "best: margin: 2)")  # fmt: skip
    over = raw.get("over")
    shape = "[a, b] (within: both ends; worse: one may be null, [c, null] is beyond c)"
    if not isinstance(over, (list, tuple)) or len(over) != 2:
        raise bad(f"{where}.over", over, f"expect: {expect} needs over: {shape}")
    ends = [None if v is None else v for v in over]
    if any(v is not None and not _number(v) for v in ends) or all(v is None for v in ends):
        raise bad(f"{where}.over", list(over), f"must be {shape}, finite numbers")
    if expect == WITHIN and None in ends:
        raise bad(f"{where}.over", list(over), "expect: within needs both ends, [a, b]")
    if None not in ends and not ends[0] < ends[1]:
        raise bad(f"{where}.over", list(over), "must be [a, b] with a < b")
    context = raw.get("context") or {}
    if not isinstance(context, Mapping):
        raise bad(f"{where}.context", context, "must be a mapping of config keys to values, e.g. {optim.lr: 0.01}")
    axis = _text(where, raw, "axis")
    pairs = []
    for key, value in context.items():
        if key == axis or key in METRICS[metric].pools:
            raise bad(f"{where}.context.{key}", value, f"{metric} reads every value of {key}: it cannot be a context")
        pairs.append((str(key), _scalar(where, f"context.{key}", value)))
    for name in ("at", *METRIC_FIELDS):
        if name in raw:
            raise bad(f"{where}.{name}", raw[name], f"{metric} takes no {name}")
    counts_failures = raw.get("counts_failures", False)
    if not isinstance(counts_failures, bool):
        raise bad(f"{where}.counts_failures", counts_failures, "must be true or false")
    low, high = (None if v is None else float(v) for v in ends)
    return Claim(
        id=cid, source=_text(where, raw, "source"), statement=_text(where, raw, "statement"), axis=axis, arm=None,
        baseline=None, metric=metric, expect=expect, context=tuple(pairs), margin=float(margin),
        counts_failures=counts_failures, over=(low, high),
    )  # fmt: skip


_FIELD_HINT = {"task": "a name of eval.tasks, e.g. task: shakespeare_order",
               "kind": "allowed kinds: " + ", ".join(M.DOWNSTREAM_KINDS)}  # fmt: skip


def _metric_fields(where: str, raw: Mapping[str, Any], metric: str) -> tuple[str | None, str | None]:
    """(task, kind) of a claim: required by a metric whose ``needs`` names them (``downstream``), refused by any
    other; the task a name as eval.tasks spells it, the kind one of lm_ablate.metrics.DOWNSTREAM_KINDS."""
    needs = METRICS[metric].needs
    for name in METRIC_FIELDS:
        if name in needs and raw.get(name) is None:
            raise bad(f"{where}.{name}", None, f"metric {metric} needs a {name} ({_FIELD_HINT[name]})")
        if name not in needs and name in raw:
            takers = ", ".join(m for m, spec in METRICS.items() if name in spec.needs)
            raise bad(f"{where}.{name}", raw[name], f"only metric {takers} takes a {name}")
    if not needs:
        return None, None
    task, kind = raw["task"], raw["kind"]
    if not isinstance(task, str) or not TASK_PATTERN.match(task):
        raise bad(f"{where}.task", task, "must be a task name of eval.tasks (letters, digits, '_', '-', '.')")
    if kind not in M.DOWNSTREAM_KINDS:
        raise bad(f"{where}.kind", kind, "allowed kinds: " + ", ".join(M.DOWNSTREAM_KINDS))
    return task, kind


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
        if claim.over is not None:
            _check_basin(claim, where, values)
            continue
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
        if claim.task is not None:
            tasks = _distinct(t for a in arms for t in task_names(a.get("eval.tasks")))
            if claim.task not in tasks:
                raise bad(
                    f"{where}.task",
                    claim.task,
                    f"no arm of this sweep evaluates it; eval.tasks: {_show(tasks) or 'none'}",
                )


def in_over(over: tuple[float | None, float | None], x: float) -> bool:
    """Is axis value ``x`` inside a basin claim's ``over`` (inclusive; a None end is open)?"""
    low, high = over
    return (low is None or x >= low or math.isclose(x, low)) and (high is None or x <= high or math.isclose(x, high))


def _check_basin(claim: Claim, where: str, values: Sequence[Any]) -> None:
    """A basin claim's axis has numbers for values (null, an option's own rule such as shape.ffn_ratio's, is no
    point of it), and some of them lie in its ``over``."""
    if any(not (v is None or _number(v) or v == math.inf) for v in values):
        raise bad(f"{where}.axis", claim.axis, f"a basin needs a numeric axis; values: {_show(values)}")
    assert claim.over is not None
    if not any(in_over(claim.over, float(v)) for v in values if v is not None):
        raise bad(f"{where}.over", list(claim.over), f"no value of {claim.axis} in this sweep lies there; values: "
                  f"{_show(values)}")  # fmt: skip


def task_names(tasks: Any) -> list[str]:
    """The names in an arm's ``eval.tasks`` (a list of task mappings; None or anything else: none)."""
    if not isinstance(tasks, (list, tuple)):
        return []
    return [str(t["name"]) for t in tasks if isinstance(t, Mapping) and t.get("name") is not None]


def _distinct(values: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not any(same_value(v, seen) and type(v) is type(seen) for seen in out):
            out.append(v)
    return out


def _show(values: Sequence[Any], limit: int = 8) -> str:
    shown = ", ".join(spelled(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} values)" if len(values) > limit else "")
