"""Work out what a set of runs varied, and compare the arms of each varied axis against a baseline: numbers only.

The design is read from the configs, not declared: any config key whose value differs between runs is a
candidate axis. Keys that always change together (``norm.name`` and ``norm.bias`` when RMSNorm has no bias)
describe one intervention, so they are collapsed into one axis rather than reported twice. A bundle group
(``arch=original,llama``, ``variant``, ``experiment``: options that set keys of other groups) is the
intervention when its choice varies: the axis is named by it (``arch``, as the override is typed; in the run
record it is ``choices.arch``), and every key that only changes with it is what it sets. An axis is
compared *within* each context (a combination of the other axes' values), so a 2x2 design of norm x
placement yields "layernorm vs rmsnorm" once under pre-norm and once under post-norm, never pooled across a
confound.

Aggregates use completed runs only: a diverged run has no comparable final loss and fewer steps (so fewer
chances to spike), and a running or killed run is not finished. Such runs are counted and listed per arm.
Rates are the exception: spikes per 1000 steps pool completed and diverged runs (the steps normalise away the
shorter run, and the spikes before a divergence are the interesting ones), and the divergence rate is over
all runs of the arm.

When ``optim.lr`` varies, :func:`lr_sweep` also finds the best learning rate of every arm and its
learning-rate sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.compute.stats import mean_ci, paired, welch
from analysis.sources.load import INIT_VAL_LOSS, AnalysisError, RunSet, downstream_keys
from analysis.sources.values import launch_order, matches_text, override_text, value_order
from lm_ablate import metrics as M
from lm_ablate.claim_spec import per_token_refusal
from lm_ablate.schema import SHAPE_SETS

# bookkeeping that differs between runs without being an intervention; the ladder keys are the report's settings
EXCLUDED_KEYS = frozenset({
    M.SEED, "study", "train.progress", "train.device", "train.threads", "data.cache_dir",
    "ladder.fit", "ladder.fit_budgets", "ladder.tune",
})  # fmt: skip
CHOICES = M.CHOICES + "."  # choices.<group>: the option picked in each config group
EXCLUDED_PREFIXES = (CHOICES, "tracking.")  # a group's choice repeats its <group>.name; bundle groups aside
ALL_RUNS = "all runs"  # context label when there is no other varied axis
AGGREGATED = (
    M.FINAL_VAL_LOSS, M.BEST_VAL_LOSS, M.GRAD_NORM_SPIKES, M.LOSS_SPIKES, M.MEAN_TOKENS_PER_SEC, M.MEAN_MFU,
)  # fmt: skip
ROW_COLUMNS = (
    "run_id", M.STATUS, M.SEED, *AGGREGATED, M.PARAMS_TOTAL, M.PARAMS_NON_EMBEDDING, M.STEPS, M.STALLED,
)  # what _arm_row reads  # fmt: skip
LR_KEY = "optim.lr"
REFUSED = "refused"  # the one line refusing Δ final val loss where an axis's arms differ in tokenizer
CLAIMS_KEY = "claims"  # the study's claims (lm_ablate/claim_spec.py), read by analysis/compute/claims.py
TEST_PAIRED = "paired"  # the `test` column: which test gave delta, its interval and p
TEST_WELCH = "welch"


@dataclass(frozen=True)
class Axis:
    """One intervention: ``name`` is the config key whose values are its arms; ``keys`` all config keys it sets
    (they split runs identically, or follow a bundle choice), ``name`` first. ``own``: keys that differ between
    its arms only because an option leaves them unread (null there; lm_ablate/options.py): the options' own
    keys (norm.bias under norm=layernorm,rmsnorm), not settings that change with it."""

    name: str
    keys: tuple[str, ...]
    own: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """How the axis is shown and typed (``--by``): the key, or the group of a choice (``arch``)."""
        return key_label(self.name)


@dataclass
class Comparison:
    """The arms of one axis, compared within each context. ``table`` has one row per (context, arm)."""

    axis: Axis
    arms: list[str]
    baseline: str
    contexts: list[str]
    table: pd.DataFrame
    assignment: dict[str, tuple[str, str]]  # run_id -> (context, arm), for plots and run listings
    scores: list[str] = field(default_factory=list)  # the downstream/<task>/<kind> metrics the table compares


@dataclass(frozen=True)
class Entangled:
    """An axis that varies only together with other axes: no context holds two of its values, so it is not
    compared on its own. ``others``: the labels of the other axes."""

    axis: Axis
    others: tuple[str, ...]


@dataclass
class ComparisonSet:
    comparisons: list[Comparison]
    varied: list[Axis]  # every automatic axis (compared or not)
    values: dict[str, list[Any]]  # varied key -> its distinct values, sorted
    fixed: dict[str, Any]  # key -> the one value all runs share
    ignored: dict[str, list[Any]]  # varied keys that are bookkeeping, not interventions (seed, devices, ...)
    left_out: list[str]  # runs without a readable config: they cannot be placed in an arm
    entangled: list[Entangled] = field(default_factory=list)  # varied axes not compared on their own

    @property
    def table(self) -> pd.DataFrame:
        frames = [c.table for c in self.comparisons]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def run_label(self, run_id: str, configs: dict[str, dict[str, Any]]) -> str:
        """The run's value on every varied axis ("norm.name=rmsnorm, norm.placement=post")."""
        cfg = configs.get(run_id)
        if cfg is None:
            return "(no config)"
        return ", ".join(f"{ax.label}={override_text(cfg.get(ax.name))}" for ax in self.varied) or ALL_RUNS


def _sorted_values(values: Iterable[Any]) -> list[Any]:
    return sorted(set(values), key=value_order)


@functools.cache
def bundle_groups() -> frozenset[str]:
    """The config groups whose options are bundles of other groups' keys: every file of the group is
    ``# @package _global_`` (conf/arch, conf/experiment, conf/variant, conf/debug, ...). The option chosen in
    such a group is the intervention; a plain group's choice (``choices.norm``) repeats its ``norm.name``."""
    from lm_ablate.config import CONF_DIR

    def bundle(folder: Path) -> bool:
        files = list(folder.glob("*.yaml"))
        return bool(files) and all(f.read_text(encoding="utf-8").startswith("# @package _global_") for f in files)

    return frozenset(folder.name for folder in Path(CONF_DIR).iterdir() if folder.is_dir() and bundle(folder))


def is_bundle_choice(key: str) -> bool:
    return key.startswith(CHOICES) and key[len(CHOICES) :] in bundle_groups()


def is_candidate(key: str) -> bool:
    return is_bundle_choice(key) or (key not in EXCLUDED_KEYS and not key.startswith(EXCLUDED_PREFIXES))


def key_label(key: str) -> str:
    """A config key as an override spells it: ``choices.arch`` -> ``arch`` (``arch=llama``); others as they are."""
    return key[len(CHOICES) :] if key.startswith(CHOICES) else key


def resolve_key(key: str, known: Iterable[str]) -> str:
    """The config key a user means: ``key`` itself, else the choice of the group it names (``arch``)."""
    known = set(known)
    return key if key in known or CHOICES + key not in known else CHOICES + key


def _preferred(keys: Sequence[str]) -> str:
    """Name an axis by the key a reader recognises: a bundle choice (``arch``), ``*.name`` (the option
    chosen), then ``*.placement``."""
    return min(
        keys,
        key=lambda k: (not is_bundle_choice(k), not k.endswith(".name"), not k.endswith(".placement"), len(k), k),
    )


def _partition(run_ids: Sequence[str], configs: dict[str, dict[str, Any]], key: str) -> tuple[int, ...]:
    """Label each run by the first run sharing its value: equal tuples mean keys split runs identically."""
    first: dict[Any, int] = {}
    return tuple(first.setdefault(configs[r][key], len(first)) for r in run_ids)


def _follows(labels: tuple[int, ...], by: tuple[int, ...]) -> bool:
    """Is a key's partition ``labels`` a function of partition ``by`` (one value per value of ``by``)?"""
    return len(set(zip(by, labels))) == len(set(by))


def find_axes(rs: RunSet) -> tuple[list[Axis], dict[str, list[Any]], dict[str, Any], dict[str, list[Any]]]:
    """(axes, varied values, fixed values, ignored varied keys) over runs with a readable config.

    Keys keep the order of the first config (model, norm, position, ...), which is the order a reader expects.
    """
    run_ids = list(rs.configs)
    order: dict[str, int] = {}
    for cfg in rs.configs.values():
        for key in cfg:
            order.setdefault(key, len(order))
    # a study's claims (claim_spec) are what the report tests, not a setting: never an axis nor "held fixed"
    keys = sorted((k for k in order if k != CLAIMS_KEY and not k.startswith(CLAIMS_KEY + ".")), key=order.__getitem__)
    varied: dict[str, list[Any]] = {}
    fixed: dict[str, Any] = {}
    for key in keys:
        values = _sorted_values(rs.configs[r][key] for r in run_ids)
        if len(values) > 1:
            varied[key] = values
        elif values:
            fixed[key] = values[0]
    # a group's choice that repeats its <group>.name (choices.norm) is neither an axis nor bookkeeping
    ignored = {
        k: v
        for k, v in varied.items()
        if not is_candidate(k) and not (k.startswith(CHOICES) and f"{key_label(k)}.name" in varied)
    }
    # the sizes shape=iso solves (model.d_model, ... at a fixed N) follow its request: bookkeeping, not axes
    solved = solved_sizes(rs.configs.values(), varied)
    ignored |= {k: varied[k] for k in solved}
    own = option_keys(rs.configs, varied)
    groups: dict[tuple[int, ...], list[str]] = {}
    for key in varied:
        if is_candidate(key) and key not in own and key not in solved:
            groups.setdefault(_partition(run_ids, rs.configs, key), []).append(key)
    # a bundle (arch=original,gpt2,llama) sets every key that changes only with it, even one that two of its
    # options share (norm.name is layernorm for original and gpt2): those keys are its, not axes of their own
    for partition, members in groups.items():
        if any(is_bundle_choice(k) for k in members):
            for other, keys in groups.items():
                if keys is not members and keys and not any(map(is_bundle_choice, keys)) and _follows(other, partition):
                    members += keys
                    keys.clear()
    # likewise a group's option (optim.name=adafactor) sets its own keys of that group (optim.eps=1e-30,
    # optim.momentum): a <group>.* key that changes only with <group>.name is the option's, not an axis
    for partition, members in groups.items():
        for prefix in [k[: -len("name")] for k in members if k.endswith(".name")]:
            for other, keys in groups.items():
                if (keys is not members and keys and all(k.startswith(prefix) for k in keys)
                        and _follows(other, partition)):  # fmt: skip
                    members += keys
                    keys.clear()
    axes = []
    for members in groups.values():
        if members:
            name = _preferred(members)
            others = sorted((k for k in members if k != name), key=order.__getitem__)
            owned = tuple(k for k in own if set(own[k]) & set(members))
            axes.append(Axis(name, (name, *others), owned))
    return axes, varied, fixed, ignored


def solved_sizes(configs: Iterable[dict[str, Any]], varied: dict[str, list[Any]]) -> list[str]:
    """The varied keys shape=iso set in every run (lm_ablate/schema.py SHAPE_SETS): the solver's answer to the
    swept request (shape.ffn_ratio, shape.n_layers, ...), which splits the runs differently from it where two
    requests solve to one size (GELU at 4 and SwiGLU at 8/3: both d_model 74), so read as axes they would cut a
    basin into one-point contexts. Runs without shape=iso keep their sizes as axes."""
    if not all(cfg.get("shape.name") == "iso" for cfg in configs):
        return []
    return [k for k in SHAPE_SETS if k in varied]


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """A flattened config (dotted keys) as nested mappings, as lm_ablate.options reads a config."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *path, leaf = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[leaf] = value
    return out


def option_keys(configs: dict[str, dict[str, Any]], varied: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Varied keys that differ only because some runs' options leave them unread (lm_ablate.options.unread: null
    on every such run) while every run that reads them has the same value; key -> the selectors that own it
    (``norm.bias`` -> ``norm.name``: null under rmsnorm, true under layernorm). Such a key is not an axis nor a
    key that changes together with one: it is its options' own."""
    from lm_ablate.options import owners, unread

    skipped = {r: {u.key for u in unread(_nested(cfg))} for r, cfg in configs.items()}
    out: dict[str, tuple[str, ...]] = {}
    for key in varied:
        unread_values = [cfg[key] for r, cfg in configs.items() if key in skipped[r]]
        read_values = _sorted_values(cfg[key] for r, cfg in configs.items() if key not in skipped[r])
        if unread_values and all(v is None for v in unread_values) and len(read_values) <= 1:
            node, _, leaf = key.partition(".")
            out[key] = tuple(o.selector for o in owners() if o.node == node and leaf in o.readers)
    return out


def parse_baseline(spec: str | None) -> tuple[str, str] | None:
    if spec is None:
        return None
    key, sep, value = spec.partition("=")
    if not sep or not key.strip():
        raise AnalysisError(f"--baseline must look like KEY=VALUE (e.g. norm.name=layernorm), got {spec!r}")
    return key.strip(), value.strip()


def compare_runs(rs: RunSet, by: Sequence[str] | None = None, baseline: str | None = None) -> ComparisonSet:
    """Compare the arms of every varied axis (or of the ``by`` keys) within each context of the other axes.

    Raises :class:`AnalysisError` for an unknown or constant ``by`` key and for a ``baseline`` (KEY=VALUE)
    that names no compared axis or no arm of it.
    """
    axes, varied, fixed, ignored = find_axes(rs)
    run_ids = list(rs.configs)
    left_out = [r for r in rs.runs["run_id"] if r not in rs.configs]
    entangled: list[Entangled] = []
    if by:
        chosen = [_axis_for_key(key, axes, varied, fixed) for key in by]
    else:
        chosen = []
        for axis in axes:
            if _has_contrast(axis, axes, run_ids, rs):
                chosen.append(axis)
            else:
                entangled.append(Entangled(axis, tuple(a.label for a in axes if a != axis)))
    base = parse_baseline(baseline)
    if base is not None:
        base = (resolve_key(base[0], (k for ax in chosen for k in ax.keys)), base[1])
    if base is not None and not any(base[0] in ax.keys for ax in chosen):
        raise AnalysisError(
            f"--baseline key {key_label(base[0])!r} is not a compared axis; compared: "
            + (", ".join(key_label(k) for ax in chosen for k in ax.keys) or "none")
        )
    comparisons = [_compare_axis(rs, axis, axes, run_ids, base) for axis in chosen]
    return ComparisonSet(comparisons, axes, varied, fixed, ignored, left_out, entangled)


def _axis_for_key(typed: str, axes: list[Axis], varied: dict[str, list[Any]], fixed: dict[str, Any]) -> Axis:
    """The axis ``--by typed`` asks for: a config key, or a group whose choice it compares (``arch``)."""
    key = resolve_key(typed, [*varied, *fixed])
    for axis in axes:
        if key in axis.keys:
            return Axis(key, (key, *(k for k in axis.keys if k != key)))
    if key in varied:  # bookkeeping key the user asked for anyway (e.g. train.device)
        return Axis(key, (key,))
    available = ", ".join(key_label(k) for ax in axes for k in ax.keys) or "none"
    if key in fixed:
        raise AnalysisError(
            f"--by {typed}: does not vary (every run has {override_text(fixed[key])}); keys that vary: {available}"
        )
    raise AnalysisError(f"--by {typed}: unknown config key; keys that vary: {available}")


def _other_axes(axis: Axis, axes: list[Axis]) -> list[Axis]:
    return [a for a in axes if not set(a.keys) & set(axis.keys)]


def _context(cfg: dict[str, Any], others: list[Axis]) -> str:
    return ", ".join(f"{a.label}={override_text(cfg[a.name])}" for a in others) or ALL_RUNS


def _has_contrast(axis: Axis, axes: list[Axis], run_ids: list[str], rs: RunSet) -> bool:
    others = _other_axes(axis, axes)
    seen: dict[str, set[Any]] = {}
    for r in run_ids:
        seen.setdefault(_context(rs.configs[r], others), set()).add(rs.configs[r][axis.name])
    return any(len(v) > 1 for v in seen.values())


def _assign(
    rs: RunSet, axis: Axis, axes: list[Axis], run_ids: list[str]
) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """(run_id -> (context, arm), contexts in the order of the other axes' values)."""
    others = _other_axes(axis, axes)
    assignment = {r: (_context(rs.configs[r], others), override_text(rs.configs[r][axis.name])) for r in run_ids}
    context_order = sorted(
        {(tuple(value_order(rs.configs[r][a.name]) for a in others), assignment[r][0]) for r in run_ids}
    )
    return assignment, list(dict.fromkeys(label for _, label in context_order))


def _compare_axis(
    rs: RunSet, axis: Axis, axes: list[Axis], run_ids: list[str], base: tuple[str, str] | None
) -> Comparison:
    arm_values = _sorted_values(rs.configs[r][axis.name] for r in run_ids)
    arms = [override_text(v) for v in arm_values]
    # default baseline: the arm of the first run launched (a sweep lists its baseline first: pre,post)
    baseline = override_text(rs.configs[min(run_ids, key=launch_order)][axis.name])
    if base is not None and base[0] in axis.keys:
        key, text = base
        hits = _sorted_values(rs.configs[r][axis.name] for r in run_ids if matches_text(rs.configs[r][key], text))
        if not hits:
            shown = ", ".join(_sorted_values(override_text(rs.configs[r][key]) for r in run_ids))
            label = key_label(key)
            raise AnalysisError(f"--baseline {label}={text}: no run has that value; values of {label}: {shown}")
        baseline = override_text(hits[0])
    assignment, contexts = _assign(rs, axis, axes, run_ids)
    members: dict[tuple[str, str], list[str]] = {}
    for r in run_ids:
        members.setdefault(assignment[r], []).append(r)
    scores = [*bpb_metrics(rs), *downstream_metrics(rs)]
    records = {r["run_id"]: r for r in rs.runs[[*ROW_COLUMNS, *scores]].to_dict("records")}
    rows = []
    for context in contexts:
        base_ids = members.get((context, baseline), [])
        base_runs = [records[r] for r in base_ids] if base_ids else None
        for arm in arms:
            if (context, arm) in members:
                runs = [records[r] for r in members[(context, arm)]]
                rows.append(_arm_row(axis, context, arm, arm == baseline, runs, base_runs, scores))
    table = pd.DataFrame(rows)
    in_context: dict[str, list[str]] = {}
    for (context, _), ids in members.items():
        in_context.setdefault(context, []).extend(ids)
    mixed = next(filter(None, (tokenizers_differ(rs.configs[r] for r in ids) for ids in in_context.values())), "")
    if mixed:
        # per-token loss between tokenizers is refused: no Δ, and the one line says what to compare instead
        table[["delta_final_val_loss", "delta_ci_low", "delta_ci_high", "p_value"]] = math.nan
        table[["test", "n_pairs"]] = ["", 0]
        table[REFUSED] = per_token_refusal("final val loss", f"the arms of {axis.label} ({mixed})")
    return Comparison(axis, arms, baseline, contexts, table, assignment, scores)


def tokenizer_of(cfg: dict[str, Any]) -> str:
    """A run's tokenizer as a comparison names it: ``byte``, ``bpe 512`` (the vocabulary it was built with),
    ``pretrained gpt2``; data=tokens: ``tokens <vocabulary>``."""
    kind = cfg.get("data.tokenizer")
    if cfg.get("data.name") == "tokens":
        return f"tokens {cfg.get('model.vocab_size') or cfg.get('data.vocab_size')}"
    if kind == "bpe":
        return f"bpe {cfg.get('model.vocab_size') or cfg.get('data.vocab_size')}"
    if kind == "pretrained":
        return f"pretrained {cfg.get('data.tokenizer_path')}"
    return str(kind)


def tokenizers_differ(configs: Iterable[dict[str, Any]]) -> str:
    """``byte vs bpe 512`` when the runs' tokenizers differ (their per-token losses are not comparable), else ""."""
    seen = list(dict.fromkeys(tokenizer_of(c) for c in configs))
    return " vs ".join(seen) if len(seen) > 1 else ""


def bpb_metrics(rs: RunSet) -> list[str]:
    """[final_val_bpb] when some run recorded val bits per byte (runs made before it existed have none)."""
    if M.FINAL_VAL_BPB in rs.runs.columns and pd.to_numeric(rs.runs[M.FINAL_VAL_BPB], errors="coerce").notna().any():
        return [M.FINAL_VAL_BPB]
    return []


def downstream_metrics(rs: RunSet) -> list[str]:
    """The ``downstream/<task>/<kind>`` columns of the runs table that some run has a value in (task order, then
    acc, acc_norm, bpb): what the comparison tables add beside final val loss."""
    return [k for k in downstream_keys(rs.runs.columns) if pd.to_numeric(rs.runs[k], errors="coerce").notna().any()]


Run = dict[str, Any]  # one row of the runs table, narrowed to ROW_COLUMNS (plain dicts: pandas slicing of a
# wide table per arm cost seconds on a thousand runs)


def _num(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def is_stalled(flag: Any) -> bool:
    """The runs table's ``stalled`` value (analysis.sources.load judges it) as a bool: NaN or None is not."""
    return isinstance(flag, (bool, np.bool_)) and bool(flag)


def loss_cap(row: Any) -> float:
    """What a run that failed to train scores (capped_val_loss, LR sensitivity): ln V, the loss of the uniform
    prediction over the run's vocabulary (``log_vocab``; ``vocab_size`` of records written before it), the
    same for every run of a study with one vocabulary. The step-0 loss is no cap: an init with large logits
    starts far above ln V (~450 nats for no-norm at unit init). A record without its vocabulary falls back to
    its step-0 loss (``init_val_loss``)."""
    for value in (row.get(M.LOG_VOCAB), math.log(v) if (v := _num(row.get(M.VOCAB_SIZE))) > 0 else math.nan):
        if math.isfinite(_num(value)):
            return float(value)
    return _num(row.get(INIT_VAL_LOSS))


def capped_loss(row: Any) -> float:
    """A run's final val loss capped at :func:`loss_cap`; a diverged run (or a non-finite final loss) is the cap."""
    cap, final = loss_cap(row), _num(row.get(M.FINAL_VAL_LOSS))
    if row.get(M.STATUS) == M.STATUS_DIVERGED or not math.isfinite(final):
        return cap
    return min(final, cap) if math.isfinite(cap) else final


def selection_means(finals: dict[float, list[tuple[float, float]]]) -> tuple[dict[float, float], bool]:
    """The means a best LR is picked on, from each LR's runs as (seed, final val loss; NaN unless completed).

    When every LR ran the same seeds: each LR's mean over its completed runs. When they ran different seeds (a
    grid with 3 seeds at its centre and one at its ends, sweeps/norm_placement.yaml): seed-adjusted means, the
    least-squares fit of loss = a[lr] + b[seed] to the completed runs (an unbalanced two-way layout; each LR's
    a[lr] + mean b, its least-squares mean), so LRs are compared like with like: a seed that does well at every
    LR cannot carry the pick to an end it alone ran, nor a poor one away from it. With one seed at the ends this
    compares each end with the centre's run of that seed; LRs that ran the same 3 seeds are compared on all 3.
    Returns (means, adjusted): the plain means (adjusted False) where the seeds are alike, a seed is unknown, or
    the runs do not link every LR to every other through shared seeds."""

    def mean(pairs: list[tuple[float, float]]) -> float:
        values = [v for _, v in pairs if math.isfinite(v)]
        return float(np.mean(values)) if values else math.nan

    plain = {lr: mean(pairs) for lr, pairs in finals.items()}
    ran = [{s for s, _ in pairs} for pairs in finals.values()]
    if not ran or any(not math.isfinite(s) for seeds in ran for s in seeds) or all(r == ran[0] for r in ran):
        return plain, False
    cells = [(lr, s, v) for lr, pairs in finals.items() for s, v in pairs if math.isfinite(v)]
    lrs = list(dict.fromkeys(lr for lr, _, _ in cells))  # any hashable keys (an LR, or a setting with it)
    seeds = sorted({s for _, s, _ in cells})
    if not cells:
        return plain, False
    # columns: one per LR, then one per seed but the first (its effect is 0); full column rank exactly when the
    # runs link every LR and seed through shared seeds, i.e. when the fit is unique
    design = np.zeros((len(cells), len(lrs) + len(seeds) - 1))
    for row, (lr, s, _) in enumerate(cells):
        design[row, lrs.index(lr)] = 1.0
        if seeds.index(s):
            design[row, len(lrs) + seeds.index(s) - 1] = 1.0
    if np.linalg.matrix_rank(design) < design.shape[1]:
        return plain, False
    coef = np.linalg.lstsq(design, np.array([v for _, _, v in cells]), rcond=None)[0]
    seed_mean = float(np.concatenate([[0.0], coef[len(lrs) :]]).mean())
    return {lr: float(coef[lrs.index(lr)]) + seed_mean if lr in lrs else math.nan for lr in finals}, True


def pick_best_lr(means: dict[float, float]) -> tuple[float, bool]:
    """(best LR, at an edge of the grid) of ``{lr: mean final val loss}``: the lowest finite mean (NaN when
    none); an edge when the grid has more than one LR and the best is its smallest or largest. The one rule
    for the LR table, the best-LR comparison and every claim decided at each side's best LR."""
    finite_means = {lr: m for lr, m in means.items() if math.isfinite(m)}
    if not finite_means:
        return math.nan, False
    best = min(finite_means, key=lambda lr: (finite_means[lr], lr))
    return best, len(means) > 1 and best in (min(means), max(means))


def _completed(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r[M.STATUS] == M.STATUS_COMPLETED]


def _seeds(runs: list[Run], key: str = M.FINAL_VAL_LOSS) -> dict[float, float] | None:
    """``key`` (final val loss) by seed, or None when a seed is unknown or repeated (then runs cannot be paired)."""
    seeds = [_num(r[M.SEED]) for r in runs]
    if any(not math.isfinite(s) for s in seeds) or len(set(seeds)) < len(seeds):
        return None
    return {s: _num(r[key]) for s, r in zip(seeds, runs)}


def compare_to_baseline(
    arm: list[Run], base: list[Run], key: str = M.FINAL_VAL_LOSS, confidence: float = 0.95
) -> dict[str, Any]:
    """Δ final val loss (or any per-run value ``key``; arm - baseline) over the runs given, with its
    ``confidence`` interval: the paired t-test on the seeds both ran when they share at least two (seeds that
    only one arm ran are left out of it), else Welch's t-test. The result keeps the final-val-loss column
    names whatever ``key`` is (analysis/compute/claims.py reads other metrics through it)."""
    a, b = _seeds(arm, key), _seeds(base, key)
    shared = sorted(set(a) & set(b)) if a is not None and b is not None else []
    if len(shared) >= 2:
        delta, low, high, p, n = paired([a[s] for s in shared], [b[s] for s in shared], confidence)  # type: ignore[index]
        if n >= 2:
            return {"delta_final_val_loss": delta, "delta_ci_low": low, "delta_ci_high": high,
                    "p_value": p, "test": TEST_PAIRED, "n_pairs": n}  # fmt: skip
    delta, low, high, p = welch([_num(r[key]) for r in arm], [_num(r[key]) for r in base], confidence)
    return {"delta_final_val_loss": delta, "delta_ci_low": low, "delta_ci_high": high, "p_value": p,
            "test": TEST_WELCH if math.isfinite(p) else "", "n_pairs": 0}  # fmt: skip


def score_columns(score: str, done: list[Run], base_done: list[Run] | None) -> dict[str, Any]:
    """A downstream metric of an arm's completed runs, as final val loss is shown: ``<score>_mean``, ``_ci_low``,
    ``_ci_high``, ``_n`` (mean ± Student-t 95% over seeds, :func:`mean_ci`) and, against the baseline's
    completed runs (None: this is the baseline), ``delta_<score>`` = arm − baseline with ``_ci_low``,
    ``_ci_high``, ``_p_value``, ``_test``, ``_n_pairs`` (:func:`compare_to_baseline`: paired t over shared
    seeds when there are two, else Welch); NaN and no test for the baseline."""
    mean, low, high, n = mean_ci([_num(r[score]) for r in done])
    out: dict[str, Any] = {f"{score}_mean": mean, f"{score}_ci_low": low, f"{score}_ci_high": high, f"{score}_n": n}
    delta = f"delta_{score}"
    test: dict[str, Any] = {"delta_final_val_loss": math.nan, "delta_ci_low": math.nan, "delta_ci_high": math.nan,
                            "p_value": math.nan, "test": "", "n_pairs": 0}  # fmt: skip
    if base_done is not None:
        test = compare_to_baseline(done, base_done, score)
    out.update({delta: test["delta_final_val_loss"], f"{delta}_ci_low": test["delta_ci_low"],
                f"{delta}_ci_high": test["delta_ci_high"], f"{delta}_p_value": test["p_value"],
                f"{delta}_test": test["test"], f"{delta}_n_pairs": test["n_pairs"]})  # fmt: skip
    return out


def spike_rate(runs: list[Run], count_key: str) -> float:
    """Spikes per 1000 steps, pooled over the runs given (total spikes / total steps)."""
    pairs = [(_num(r[count_key]), _num(r[M.STEPS])) for r in runs]
    pairs = [(c, s) for c, s in pairs if math.isfinite(c) and math.isfinite(s) and s > 0]
    return 1000 * sum(c for c, _ in pairs) / sum(s for _, s in pairs) if pairs else math.nan


def _arm_row(
    axis: Axis,
    context: str,
    arm: str,
    is_baseline: bool,
    runs: list[Run],
    base: list[Run] | None,
    scores: Sequence[str] = (),
) -> dict[str, Any]:
    done = _completed(runs)
    diverged = [r for r in runs if r[M.STATUS] == M.STATUS_DIVERGED]
    other = [r for r in runs if r[M.STATUS] not in (M.STATUS_COMPLETED, M.STATUS_DIVERGED)]
    stalled = [r for r in done if is_stalled(r.get(M.STALLED))]
    row: dict[str, Any] = {
        "axis": axis.label,
        "context": context,
        "arm": arm,
        "is_baseline": is_baseline,
        "n_runs": len(runs),
        "n_completed": len(done),
        "n_diverged": len(diverged),
        "n_other": len(other),
        "n_stalled": len(stalled),  # completed runs that stalled (lm_ablate/stall.py): in the means, and marked
    }
    for metric in AGGREGATED:
        mean, low, high, n = mean_ci([_num(r[metric]) for r in done])
        row.update({f"{metric}_mean": mean, f"{metric}_ci_low": low, f"{metric}_ci_high": high, f"{metric}_n": n})
    for metric in (M.PARAMS_TOTAL, M.PARAMS_NON_EMBEDDING):  # same model in every seed: any run says
        vals = [v for v in (_num(r[metric]) for r in runs) if math.isfinite(v)]
        row[metric] = float(np.median(vals)) if vals else math.nan
    ended = done + diverged
    row["grad_norm_spikes_per_1k_steps"] = spike_rate(ended, M.GRAD_NORM_SPIKES)
    row["loss_spikes_per_1k_steps"] = spike_rate(ended, M.LOSS_SPIKES)
    row["divergence_rate"] = len(diverged) / len(runs) if runs else math.nan
    test: dict[str, Any] = dict.fromkeys(("delta_final_val_loss", "delta_ci_low", "delta_ci_high", "p_value"), math.nan)
    test.update(test="", n_pairs=0)
    ratio = math.nan
    if base is not None and not is_baseline:
        base_done = _completed(base)
        test = compare_to_baseline(done, base_done)
        base_tps = mean_ci([_num(r[M.MEAN_TOKENS_PER_SEC]) for r in base_done])[0]
        if base_tps and np.isfinite(base_tps):
            ratio = row[f"{M.MEAN_TOKENS_PER_SEC}_mean"] / base_tps
    row.update(test)
    for score in scores:
        row.update(score_columns(score, done, None if base is None or is_baseline else _completed(base)))
    row.update(
        {
            "tokens_per_sec_ratio": ratio,
            "diverged_runs": " ".join(r["run_id"] for r in diverged),
            "stalled_runs": " ".join(r["run_id"] for r in stalled),
            # each completed seed's final val loss, "seed:value", stalled ones marked "*": a cell with stalled
            # seeds is bimodal, and the report shows it seed by seed, not as a mean ± t alone
            "seed_finals": " ".join(
                f"{override_text(r[M.SEED])}:{_num(r[M.FINAL_VAL_LOSS]):.6g}"
                + ("*" if is_stalled(r.get(M.STALLED)) else "")
                for r in done
            ),  # fmt: skip
            "other_runs": " ".join(f"{r['run_id']}({r[M.STATUS]})" for r in other),
            "run_ids": " ".join(r["run_id"] for r in runs),
        }
    )
    return row


# --- learning-rate sweeps -------------------------------------------------------------------------------
@dataclass
class LRSweep:
    """Final loss against learning rate, per arm (an arm: the values of every other varied axis).

    ``points``: one row per (context, lr). ``best``: one row per context with the best learning rate and the
    learning-rate sensitivity. ``assignment``: run_id -> (context, lr as written) for the runs used.
    ``others``: the other varied axes; ``context_values``: context -> {other axis: value as written}.
    ``left_out``: runs whose learning rate is not a positive number.
    """

    axis: Axis
    contexts: list[str]
    lrs: list[float]
    points: pd.DataFrame
    best: pd.DataFrame
    assignment: dict[str, tuple[str, str]]
    others: list[str] = field(default_factory=list)
    context_values: dict[str, dict[str, str]] = field(default_factory=dict)
    left_out: int = 0
    levels: dict[str, float] = field(default_factory=dict)  # the data's unigram_loss / bigram_loss (median of runs)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def lr_sweep(rs: RunSet, key: str = LR_KEY) -> LRSweep | None:
    """Best learning rate and learning-rate sensitivity of every arm, or None when ``key`` does not vary.

    Best LR: the grid value with the lowest mean final val loss over completed runs (:func:`pick_best_lr`; its
    Student-t interval as elsewhere; the diverged and stalled runs at that LR are counted beside it), the means
    seed-adjusted where the LRs ran different seeds (:func:`selection_means`; ``seed_adjusted`` says so).
    ``best_at_edge`` flags a best LR at either end of the grid: the optimum may lie outside it.

    LR sensitivity (Wortsman et al. 2023): E_lr[min(loss(lr), cap) - loss*] over the arm's grid. Here every
    run's final val loss is capped at ln V (:func:`loss_cap`: the uniform prediction's loss, where Wortsman et
    al.'s init loss sits for a standard init; a run without its vocabulary recorded is capped at its step-0
    loss), a diverged run (or a completed one with a non-finite final loss) counts as the cap, loss(lr) is the
    mean of these over the seeds, loss* the lowest loss(lr) of the arm, and the expectation is the plain mean
    over the LRs that have a completed or diverged run. A run without a cap borrows the arm's mean cap. 0 means
    every LR in the grid is as good as the best; it grows as the loss worsens, capped, away from the best LR.
    Runs still running, failed or unreadable are left out.
    """
    axes, _, _, _ = find_axes(rs)
    found = next((a for a in axes if key in a.keys), None)
    if found is None:
        return None
    axis = Axis(key, (key, *(k for k in found.keys if k != key)))
    run_ids = [r for r in rs.configs if _is_number(rs.configs[r][key])]
    if not run_ids:
        return None
    assignment, contexts = _assign(rs, axis, axes, run_ids)
    lrs = sorted({float(rs.configs[r][key]) for r in run_ids})
    # the columns _lr_point reads: selecting rows of the full (wide) table per point cost ~0.1 s on 1000 runs
    wanted = ["run_id", M.STATUS, M.SEED, M.FINAL_VAL_LOSS, M.STALLED, M.LOG_VOCAB, M.VOCAB_SIZE,
              *([INIT_VAL_LOSS] if INIT_VAL_LOSS in rs.runs else [])]  # fmt: skip
    runs = rs.runs[[c for c in wanted if c in rs.runs]].set_index("run_id", drop=False)
    caps = pd.Series({r: loss_cap(row) for r, row in zip(runs.index, runs.to_dict("records"))}, dtype=float)
    points, best = [], []
    for context in contexts:
        members = [r for r in run_ids if assignment[r][0] == context]
        arm_caps = caps.loc[members]
        arm_cap = float(arm_caps.mean()) if arm_caps.notna().any() else math.nan
        rows = [_lr_point(context, lr, [r for r in members if rs.configs[r][key] == lr], runs, caps, arm_cap)
                for lr in lrs]  # fmt: skip
        rows = [row for row in rows if row["n_runs"]]
        points += rows
        finals = {lr: seed_finals(runs.loc[[r for r in members if rs.configs[r][key] == lr]]) for lr in lrs}
        best.append(_lr_best(context, rows, arm_cap, {lr: f for lr, f in finals.items() if f}))
    others = [a.name for a in _other_axes(axis, axes)]
    values = {assignment[r][0]: {a: override_text(rs.configs[r][a]) for a in others} for r in run_ids}
    return LRSweep(axis, contexts, lrs, pd.DataFrame(points), pd.DataFrame(best), assignment, others, values,
                   len(rs.configs) - len(run_ids), data_levels(rs.runs[rs.runs["run_id"].isin(run_ids)]))  # fmt: skip


def data_levels(runs: pd.DataFrame) -> dict[str, float]:
    """{unigram_loss, bigram_loss}: the median over the runs that recorded each (lm_ablate/data/unigram.py),
    left out when none did."""
    out = {}
    for key in (M.UNIGRAM_LOSS, M.BIGRAM_LOSS):
        values = pd.to_numeric(runs[key], errors="coerce").dropna() if key in runs else pd.Series(dtype=float)
        if len(values):
            out[key] = float(values.median())
    return out


def _lr_point(
    context: str, lr: float, members: list[str], runs: pd.DataFrame, caps: pd.Series, arm_cap: float
) -> dict[str, Any]:
    df = runs.loc[members]
    final = pd.to_numeric(df[M.FINAL_VAL_LOSS], errors="coerce")
    completed = (df[M.STATUS] == M.STATUS_COMPLETED) & np.isfinite(final)
    diverged = (df[M.STATUS] == M.STATUS_DIVERGED) | ((df[M.STATUS] == M.STATUS_COMPLETED) & ~completed)
    stalled = completed & df.get(M.STALLED, pd.Series(False, index=df.index)).map(is_stalled)
    mean, low, high, n = mean_ci(final[completed].tolist())
    capped = []
    for r in df.index[completed | diverged]:
        cap = caps.get(r, math.nan)
        cap = arm_cap if not np.isfinite(cap) else float(cap)
        capped.append(cap if diverged[r] else min(float(final[r]), cap))
    return {
        "context": context, "lr": lr, "n_runs": len(df), "n_completed": int(completed.sum()),
        "n_diverged": int(diverged.sum()), "n_stalled": int(stalled.sum()), f"{M.FINAL_VAL_LOSS}_mean": mean,
        f"{M.FINAL_VAL_LOSS}_ci_low": low, f"{M.FINAL_VAL_LOSS}_ci_high": high, f"{M.FINAL_VAL_LOSS}_n": n,
        "capped_loss": float(np.mean(capped)) if capped else math.nan,
        "diverged_runs": " ".join(df.index[diverged]), "stalled_runs": " ".join(df.index[stalled]),
    }  # fmt: skip


def seed_finals(df: pd.DataFrame) -> list[tuple[float, float]]:
    """(seed, final val loss) of each run in ``df``, the loss NaN unless the run completed with a finite one."""
    out = []
    for row in df.to_dict("records"):
        final = _num(row.get(M.FINAL_VAL_LOSS))
        out.append((_num(row.get(M.SEED)), final if row.get(M.STATUS) == M.STATUS_COMPLETED else math.nan))
    return out


def _lr_best(
    context: str, rows: list[dict[str, Any]], arm_cap: float, finals: dict[float, list[tuple[float, float]]]
) -> dict[str, Any]:
    final = f"{M.FINAL_VAL_LOSS}_mean"
    grid = [r["lr"] for r in rows]
    means, adjusted = selection_means(finals)
    best_lr, at_edge = pick_best_lr({r["lr"]: means.get(r["lr"], math.nan) for r in rows})
    top = next((r for r in rows if r["lr"] == best_lr), None)
    capped = np.array([r["capped_loss"] for r in rows], dtype=float)
    capped = capped[np.isfinite(capped)]
    loss_star = float(capped.min()) if len(capped) else math.nan
    return {
        "context": context,
        "n_lrs": len(grid),
        "lr_grid": " ".join(override_text(v) for v in grid),
        "best_lr": top["lr"] if top else math.nan,
        "best_at_edge": bool(top and at_edge),
        "seed_adjusted": bool(top and adjusted),
        f"{M.FINAL_VAL_LOSS}_mean": top[final] if top else math.nan,
        f"{M.FINAL_VAL_LOSS}_ci_low": top[f"{M.FINAL_VAL_LOSS}_ci_low"] if top else math.nan,
        f"{M.FINAL_VAL_LOSS}_ci_high": top[f"{M.FINAL_VAL_LOSS}_ci_high"] if top else math.nan,
        f"{M.FINAL_VAL_LOSS}_n": top[f"{M.FINAL_VAL_LOSS}_n"] if top else 0,
        "n_diverged_at_best": top["n_diverged"] if top else 0,
        "n_stalled_at_best": top["n_stalled"] if top else 0,
        "n_diverged": sum(r["n_diverged"] for r in rows),
        "loss_cap": arm_cap,
        "loss_star": loss_star,
        "lr_sensitivity": float((capped - loss_star).mean()) if len(capped) else math.nan,
    }
