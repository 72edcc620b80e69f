"""Find run records on disk and load them into one table, without ever crashing on a damaged run.

A sweep is only useful if a report can be made from whatever it left behind: runs killed mid-write, runs that
never started, half-written JSON lines. So every reader here degrades: what cannot be read becomes a status
(``incomplete``, ``corrupt``) and a line in :attr:`RunSet.problems`, and the rest of the run is still used.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lm_ablate import metrics as M

STATUS_INCOMPLETE = "incomplete"  # no summary.json: killed before the loop wrote one (values from metrics)
STATUS_CORRUPT = "corrupt"  # summary.json or config.yaml exists but cannot be parsed
RUN_FILES = (M.CONFIG_FILE, M.SUMMARY_FILE, M.METRICS_FILE)
SKIP_DIRS = {".hydra", "wandb", "__pycache__"}
SUMMARY_KEYS = (
    M.RUN_NAME, M.GROUP, M.CHOICES, M.SEED, M.FINAL_VAL_LOSS, M.BEST_VAL_LOSS, M.FINAL_TRAIN_LOSS,
    M.GRAD_NORM_SPIKES, M.LOSS_SPIKES, M.MEAN_TOKENS_PER_SEC, M.PARAMS_TOTAL, M.PARAMS_NON_EMBEDDING, M.STEPS,
    M.TOTAL_TOKENS, M.WALL_TIME_S, M.DIVERGED_AT, M.ERROR,
)  # fmt: skip
NUMERIC_SUMMARY_KEYS = tuple(k for k in SUMMARY_KEYS if k not in (M.RUN_NAME, M.GROUP, M.CHOICES, M.ERROR))
# history frame attr: first step that logged a non-finite train loss or grad norm (None if none)
NONFINITE_STEP = "first_nonfinite_step"
MISSING_VALUE = "(missing)"  # stands for a config key that one run has and another lacks (schema drift)


class AnalysisError(Exception):
    """A bad input to the analysis (no runs, unknown key); its message is one line, fit for a CLI error."""


@dataclass
class RunSet:
    """Everything loaded from a set of run directories.

    ``runs``: one row per run, keyed by ``run_id`` (path relative to the common ancestor of all runs, so ids
    stay unique across several sweeps). ``configs``: the flattened config of every run whose config could be
    read; comparisons use these raw values rather than the DataFrame because pandas would turn ``None`` (a
    meaningful config value such as ``activation.d_ff: null``) into NaN. ``history``: metrics per run,
    indexed by step. ``problems``: one human-readable line per thing that could not be read.
    """

    runs: pd.DataFrame
    history: dict[str, pd.DataFrame]
    configs: dict[str, dict[str, Any]]
    problems: list[str] = field(default_factory=list)

    @property
    def config_keys(self) -> list[str]:
        return sorted({k for cfg in self.configs.values() for k in cfg})


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys; lists become JSON strings so every value is hashable and CSV-friendly."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.update(flatten(value, name))
            else:
                out[name] = _leaf(value)
    else:
        out[prefix or "value"] = _leaf(tree)
    return out


def _leaf(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return value


def find_run_dirs(paths: Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    """Run directories at or below each path, deduplicated, in a stable order; plus notes on bad paths.

    A run directory holds one of the run files, or only Hydra's ``.hydra/config.yaml`` (a run killed
    before the loop wrote anything still shows up as a run that never finished). The search does not
    descend into a run directory, nor into ``.hydra``/``wandb``/hidden folders, whose YAML files are not
    run records.
    """
    found: dict[Path, None] = {}
    notes: list[str] = []
    for raw in paths:
        root = Path(raw).expanduser()
        if not root.is_dir():
            notes.append(f"{raw}: not a directory (skipped)")
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            if _is_run_dir(here, filenames):
                found.setdefault(here.resolve(), None)
                dirnames[:] = []
                continue
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
    return sorted(found, key=_natural_key), notes


def _is_run_dir(path: Path, filenames: list[str]) -> bool:
    return any(f in filenames for f in RUN_FILES) or (path / ".hydra" / M.CONFIG_FILE).is_file()


def _natural_key(path: Path) -> list[Any]:
    """Sort ``2/`` before ``10/`` (Hydra numbers multirun jobs without padding)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.parts]


def read_metrics(path: Path, run_id: str, problems: list[str]) -> pd.DataFrame:
    """metrics.jsonl as a step-indexed frame. Garbled lines are skipped and noted; duplicate steps keep the
    last row written (a resumed run re-logs steps, and the later row is the one the run continued from)."""
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    nonfinite: int | None = None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        problems.append(f"{run_id}: cannot read {M.METRICS_FILE}: {exc}")
        return _empty_history()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = row[M.STEP]
            if not isinstance(row, dict) or isinstance(step, bool) or not float(step).is_integer():
                raise ValueError
        except (ValueError, KeyError, TypeError):
            bad.append(lineno)
            continue
        row[M.STEP] = int(step)
        rows.append(row)
        if nonfinite is None and any(_nonfinite(row.get(k)) for k in (M.TRAIN_LOSS, M.GRAD_NORM)):
            nonfinite = int(step)
    if bad:
        last = len(lines)
        where = "its last line (truncated write)" if bad == [last] else f"{len(bad)} line(s): {_ranges(bad)}"
        problems.append(f"{run_id}: {M.METRICS_FILE}: skipped {where}, unreadable")
    if not rows:
        return _empty_history()
    df = pd.DataFrame(rows)
    df = df[~df[M.STEP].duplicated(keep="last")].set_index(M.STEP).sort_index(kind="stable")
    df = df.apply(pd.to_numeric, errors="coerce").astype(float)
    df.attrs[NONFINITE_STEP] = nonfinite
    return df


def _nonfinite(value: Any) -> bool:
    """A logged NaN/inf (not an absent key, which pandas would also show as NaN): the sign of divergence."""
    return isinstance(value, float) and not math.isfinite(value)


def _empty_history() -> pd.DataFrame:
    return pd.DataFrame(index=pd.Index([], name=M.STEP, dtype=int))


def _ranges(numbers: list[int], limit: int = 5) -> str:
    shown = ", ".join(str(n) for n in numbers[:limit])
    return shown + (", ..." if len(numbers) > limit else "")


def summarize_history(hist: pd.DataFrame) -> dict[str, Any]:
    """Summary fields recomputed from metrics, for runs whose summary.json is missing or unreadable."""

    def col(name: str) -> pd.Series:
        return hist[name].dropna() if name in hist.columns else pd.Series(dtype=float)

    def last_finite(name: str) -> float:
        s = col(name)
        s = s[np.isfinite(s)]
        return float(s.iloc[-1]) if len(s) else math.nan

    val = col(M.VAL_LOSS)
    finite_val = val[np.isfinite(val)]
    out: dict[str, Any] = {
        M.FINAL_VAL_LOSS: last_finite(M.VAL_LOSS),
        M.BEST_VAL_LOSS: float(finite_val.min()) if len(finite_val) else math.nan,
        M.FINAL_TRAIN_LOSS: last_finite(M.TRAIN_LOSS),
        M.GRAD_NORM_SPIKES: _count(col(M.SPIKE_GRAD_NORM_COUNT), col(M.SPIKE_GRAD_NORM)),
        M.LOSS_SPIKES: _count(col(M.SPIKE_LOSS_COUNT), col(M.SPIKE_LOSS)),
        M.STEPS: int(hist.index.max()) if len(hist) else math.nan,
        M.TOTAL_TOKENS: last_finite(M.TOKENS),
    }
    tps = col(M.TOKENS_PER_SEC)
    tps = tps[np.isfinite(tps)]
    out[M.MEAN_TOKENS_PER_SEC] = float(tps.mean()) if len(tps) else math.nan
    if hist.attrs.get(NONFINITE_STEP) is not None:
        out[M.DIVERGED_AT] = hist.attrs[NONFINITE_STEP]
    return out


def _count(running: pd.Series, flags: pd.Series) -> float:
    if len(running):
        return float(running.iloc[-1])
    return float((flags == 1).sum()) if len(flags) else math.nan


def read_config(run_dir: Path, run_id: str, problems: list[str]) -> tuple[dict[str, Any] | None, bool]:
    """Flattened config, and whether config.yaml was present but unreadable (which makes the run corrupt).

    Falls back to Hydra's ``.hydra/config.yaml`` (composed but without ``choices``) so a run that died before
    writing its own config can still be placed in its arm.
    """
    corrupt = False
    path = run_dir / M.CONFIG_FILE
    if path.is_file():
        cfg = _load_yaml(path)
        if cfg is not None:
            return flatten(cfg), False
        problems.append(f"{run_id}: {M.CONFIG_FILE} is unreadable")
        corrupt = True
    hydra = run_dir / ".hydra" / M.CONFIG_FILE
    if hydra.is_file():
        cfg = _load_yaml(hydra, must_resolve=True)
        if cfg is not None:
            problems.append(
                f"{run_id}: config taken from .hydra/{M.CONFIG_FILE} (no readable {M.CONFIG_FILE})"
            )
            return flatten(cfg), corrupt
    if not corrupt:
        problems.append(f"{run_id}: no {M.CONFIG_FILE}; run left out of comparisons")
    else:
        problems[-1] += "; run left out of comparisons"
    return None, corrupt


def _load_yaml(path: Path, must_resolve: bool = False) -> dict[str, Any] | None:
    """OmegaConf's loader, not PyYAML's, so ``1e-5`` is read as the float Hydra meant, not a string.

    config.yaml is already resolved by the loop, so a leftover interpolation is kept as text. Hydra's copy is
    not: an interpolation it cannot resolve here would read as a value differing from the other runs' (a
    spurious axis), so with ``must_resolve`` such a file is rejected instead.
    """
    try:
        node = OmegaConf.load(path)
        if not isinstance(node, DictConfig):
            return None
        try:
            out = OmegaConf.to_container(node, resolve=True)
        except Exception:  # noqa: BLE001 - any resolver/interpolation error means "cannot resolve here"
            if must_resolve:
                return None
            out = OmegaConf.to_container(node, resolve=False)
        return out if isinstance(out, dict) else None
    except Exception:  # noqa: BLE001 - YAML, OmegaConf and decode errors all mean "unreadable"
        return None


def read_summary(path: Path, run_id: str, problems: list[str]) -> tuple[dict[str, Any] | None, str]:
    """(summary, status). Missing → (None, incomplete); unparseable or not an object → (None, corrupt)."""
    if not path.is_file():
        problems.append(f"{run_id}: no {M.SUMMARY_FILE} (killed early?); status {STATUS_INCOMPLETE}")
        return None, STATUS_INCOMPLETE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
    except (OSError, ValueError, TypeError) as exc:
        problems.append(
            f"{run_id}: {M.SUMMARY_FILE} is unreadable ({_one_line(exc)}); status {STATUS_CORRUPT}"
        )
        return None, STATUS_CORRUPT
    status = data.get(M.STATUS)
    if status not in M.STATUSES:
        problems.append(f"{run_id}: {M.SUMMARY_FILE} has unknown status {status!r}; status {STATUS_CORRUPT}")
        return data, STATUS_CORRUPT
    return data, str(status)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def load_runs(paths: Iterable[str | Path]) -> RunSet:
    """Load every run at or below ``paths``. Raises :class:`AnalysisError` only when no run is found."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    run_dirs, problems = find_run_dirs(paths)
    if not run_dirs:
        raise AnalysisError("no runs found under: " + ", ".join(str(p) for p in paths))
    base = Path(os.path.commonpath([str(d) for d in run_dirs]))
    records: list[dict[str, Any]] = []
    history: dict[str, pd.DataFrame] = {}
    configs: dict[str, dict[str, Any]] = {}
    for run_dir in run_dirs:
        run_id = run_dir.relative_to(base).as_posix() if run_dir != base else run_dir.name
        hist = (
            read_metrics(run_dir / M.METRICS_FILE, run_id, problems)
            if (run_dir / M.METRICS_FILE).is_file()
            else _empty_history()
        )
        history[run_id] = hist
        summary, status = read_summary(run_dir / M.SUMMARY_FILE, run_id, problems)
        cfg, cfg_corrupt = read_config(run_dir, run_id, problems)
        if cfg_corrupt:
            status = STATUS_CORRUPT
        record: dict[str, Any] = {"run_id": run_id, "run_dir": str(run_dir), M.STATUS: status}
        values = {k: math.nan for k in SUMMARY_KEYS}
        values[M.RUN_NAME] = run_dir.name
        values[M.ERROR] = None
        if summary is None:
            values.update(summarize_history(hist))
        else:
            values.update({k: summary[k] for k in SUMMARY_KEYS if k in summary and summary[k] is not None})
        if isinstance(values[M.CHOICES], dict):
            values[M.CHOICES] = json.dumps(values[M.CHOICES], sort_keys=True)
        record.update(values)
        if cfg is not None:
            configs[run_id] = cfg
            # config seed wins over the summary's: it is what the run was started with
            record.update({k: v for k, v in cfg.items() if k not in ("run_id", "run_dir", M.STATUS)})
        records.append(record)
    runs = pd.DataFrame.from_records(records)
    lead = ["run_id", "run_dir", M.STATUS, *SUMMARY_KEYS]
    runs = runs[lead + sorted(c for c in runs.columns if c not in lead)]
    for key in NUMERIC_SUMMARY_KEYS:  # a hand-edited or half-migrated summary may hold strings: read as NaN
        runs[key] = pd.to_numeric(runs[key], errors="coerce")
    _fill_missing_keys(configs)
    return RunSet(runs=runs, history=history, configs=configs, problems=problems)


def _fill_missing_keys(configs: dict[str, dict[str, Any]]) -> None:
    """Give every config every key, so a key present in only some runs reads as a difference between them."""
    keys = {k for cfg in configs.values() for k in cfg}
    for cfg in configs.values():
        for key in keys - cfg.keys():
            cfg[key] = MISSING_VALUE
