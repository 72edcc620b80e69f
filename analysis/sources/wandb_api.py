"""Runs of a W&B project as a :class:`~analysis.sources.load.RunSet`, cached locally as Parquet.

The loop logs the same names to W&B as to metrics.jsonl (config: the resolved nested config; summary: our
summary keys; history: our metric names at ``_step`` = our step), so a W&B run converts to the shape a run
directory gives: config flattened to dotted keys, summary keys taken as they are (with W&B's own fields
filling in where ours are missing), history indexed by step.

Every fetch is written to ``<cache_dir>/runs.parquet`` (one row per run: metadata, config and summary as
JSON) plus ``<cache_dir>/history/<run id>.parquet``, so a report can be rebuilt offline (``offline=True``
reads only the cache) and a later fetch downloads again only the histories of runs that changed. A failed
fetch falls back to the cache when there is one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.sources.load import (
    BASE_COLUMNS,
    EXTRAPOLATION_KEY,
    LAYER_KEY,
    NONFINITE_STEP,
    STATUS_INCOMPLETE,
    AnalysisError,
    Keep,
    RunRecord,
    RunSet,
    assemble,
    finish_history,
    flatten,
    frame_extras,
    one_line,
    summary_values,
)
from lm_ablate import metrics as M

RUNS_FILE = "runs.parquet"
HISTORY_DIR = "history"
W_STEP = "_step"
STATE_TO_STATUS = {  # W&B run state -> our status, for runs whose summary has none (or a stale "running")
    "finished": M.STATUS_COMPLETED,
    "running": M.STATUS_RUNNING,
    "pending": M.STATUS_RUNNING,
    "crashed": M.STATUS_FAILED,
    "failed": M.STATUS_FAILED,
    "killed": M.STATUS_FAILED,
    "preempted": M.STATUS_PREEMPTED,
    "preempting": M.STATUS_PREEMPTED,
}
# W&B's own summary fields that stand in for ours when a run's summary lacks them
W_SUMMARY = {M.STEPS: W_STEP, M.WALL_TIME_S: "_runtime"}


def parse_project(spec: str) -> tuple[str, str]:
    entity, sep, project = spec.strip().partition("/")
    if not sep or not entity or not project or "/" in project:
        raise AnalysisError(f"--wandb must look like ENTITY/PROJECT, got {spec!r}")
    return entity, project


def cache_dir_for(root: str | Path, entity: str, project: str) -> Path:
    """``<root>/<entity>_<project>`` with anything but [A-Za-z0-9._-] replaced, so it is one path segment."""
    return Path(root) / re.sub(r"[^A-Za-z0-9._-]+", "-", f"{entity}_{project}")


def _number(value: Any) -> float | None:
    """A history/summary value as a float (NaN and ±Infinity included, also as W&B's strings), or None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip() in ("NaN", "nan", "Infinity", "-Infinity", "inf", "-inf"):
        return float(value.strip())
    return None


def history_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """W&B history rows (dicts with ``_step``) as our step-indexed float frame.

    W&B's bookkeeping (``_runtime``, ``_timestamp``, ...) and non-numeric values (media, histograms) are
    dropped; a row without a step is skipped; repeated steps keep the last row. The first step that logged a
    non-finite train loss or grad norm is kept in ``attrs``, as the local reader does.
    """
    out: list[dict[str, float]] = []
    nonfinite: int | None = None
    for row in rows:
        step = _number(row.get(W_STEP))
        if step is None or not math.isfinite(step) or not step.is_integer():
            continue
        values: dict[str, float] = {M.STEP: int(step)}
        for key, raw in row.items():
            if key.startswith("_"):
                continue
            value = _number(raw)
            if value is not None:
                values[key] = value
        out.append(values)
        if nonfinite is None and any(k in values and not math.isfinite(values[k]) for k in (M.TRAIN_LOSS, M.GRAD_NORM)):
            nonfinite = int(step)
    if not out:
        df = pd.DataFrame(index=pd.Index([], name=M.STEP, dtype=int))
    else:
        df = pd.DataFrame(out)
        df = df[~df[M.STEP].duplicated(keep="last")].set_index(M.STEP).sort_index(kind="stable").astype(float)
    df.attrs[NONFINITE_STEP] = nonfinite
    return df


def _history_rows(run: Any) -> Iterable[dict[str, Any]]:
    """Every history row: ``scan_history`` (unsampled), or ``history(pandas=False)`` on older clients."""
    if hasattr(run, "scan_history"):
        return run.scan_history(page_size=10_000)
    return run.history(samples=10**9, pandas=False)


def _summary(run: Any) -> dict[str, Any]:
    raw = getattr(run, "summary_metrics", None)
    if not isinstance(raw, dict):
        summary = run.summary
        raw = getattr(summary, "_json_dict", None) or dict(summary)
    return {k: v for k, v in raw.items() if not str(k).startswith("_") or k in ("_step", "_runtime")}


def _config(run: Any) -> dict[str, Any]:
    raw = run.config or {}
    if isinstance(raw, str):
        raw = json.loads(raw)
    return {k: (v["value"] if isinstance(v, dict) and set(v) <= {"value", "desc"} and "value" in v else v)
            for k, v in raw.items() if not str(k).startswith("_")}  # fmt: skip


def _json(value: Any) -> str:
    """JSON with NaN/Infinity kept (Python's json reads them back), anything else as text."""
    return json.dumps(value, default=str, allow_nan=True)


def _version(run_row: dict[str, Any]) -> str:
    """What must match for a cached history to be reused: a finished run whose step count, runtime and
    state have not changed has not changed."""
    summary = run_row["summary"]
    return f"{run_row['state']}|{summary.get('_step')}|{summary.get('_runtime')}"


def fetch(
    entity: str, project: str, cache: Path, group: str | None = None, api: Any = None
) -> tuple[pd.DataFrame, list[str]]:
    """Download the project's runs (of ``group``) into ``cache``; returns the cache's runs table and notes.

    Runs already in the cache with the same version (state, last step, runtime) and not running keep their
    cached history; runs fetched now replace their cached rows; other cached runs (say of another group) stay.
    """
    import wandb

    api = api or wandb.Api(timeout=60)
    filters = {"group": group} if group else None
    cached = _read_runs_table(cache) if (cache / RUNS_FILE).is_file() else pd.DataFrame()
    old = {r["run_id"]: r for r in cached.to_dict("records")} if len(cached) else {}
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    (cache / HISTORY_DIR).mkdir(parents=True, exist_ok=True)
    try:  # lazy=False: config and summary come with the listing, not one request per run (wandb >= 0.2x)
        listing = api.runs(f"{entity}/{project}", filters=filters, lazy=False)
    except TypeError:
        listing = api.runs(f"{entity}/{project}", filters=filters)
    for run in listing:
        try:
            rows.append(_fetch_run(run, cache, old, notes))
        except Exception as exc:
            notes.append(f"{getattr(run, 'id', '?')}: W&B run not read ({one_line(exc)}); left out")
    fetched = pd.DataFrame(rows, columns=["run_id", "name", "group", "state", "url", "version", "config_json",
                                          "summary_json"])  # fmt: skip
    keep_old = cached[~cached["run_id"].isin(fetched["run_id"])] if len(cached) else cached
    table = pd.concat([keep_old, fetched], ignore_index=True) if len(keep_old) else fetched
    tmp = cache / f".{RUNS_FILE}.tmp"
    table.to_parquet(tmp, index=False)
    tmp.replace(cache / RUNS_FILE)  # a fetch killed mid-write leaves the previous cache, not half a file
    return table, notes


def _fetch_run(run: Any, cache: Path, old: dict[str, dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    """One run's row of the runs table; its history is downloaded into the cache unless the cached copy is of
    the same version (and the run is not running)."""
    summary = _summary(run)
    row = {
        "run_id": str(run.id),
        "name": str(getattr(run, "name", "") or run.id),
        "group": str(getattr(run, "group", "") or ""),
        "state": str(getattr(run, "state", "") or ""),
        "url": str(getattr(run, "url", "") or ""),
        "summary": summary,
    }
    row["version"] = _version(row)
    history_file = cache / HISTORY_DIR / f"{_safe(row['run_id'])}.parquet"
    prior = old.get(row["run_id"])
    fresh = prior and prior["version"] == row["version"] and row["state"] != "running" and history_file.is_file()
    if not fresh:
        try:
            hist = history_frame(_history_rows(run))
        except Exception as exc:
            notes.append(f"{row['run_id']}: W&B history not downloaded ({one_line(exc)}); history empty")
            hist = history_frame([])
            row["version"] = ""  # fetch again next time
        _write_history(hist, history_file)
    row.pop("summary")
    return {**row, "config_json": _json(_config(run)), "summary_json": _json(summary)}


def _safe(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run_id)


def _write_history(hist: pd.DataFrame, path: Path) -> None:
    """Parquet with the step as a column and the non-finite step as file metadata (pandas attrs are lost)."""
    frame = hist.reset_index()
    frame.attrs = {}
    nonfinite = hist.attrs.get(NONFINITE_STEP)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"lm_ablate_nonfinite_step"] = json.dumps(nonfinite).encode()
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table.replace_schema_metadata(meta), tmp)
    tmp.replace(path)


def _read_history(path: Path, keep: Keep | None) -> pd.DataFrame:
    schema = pq.read_schema(path)
    names = [n for n in schema.names if n == M.STEP or keep is None or _needed(n, keep)]
    table = pq.read_table(path, columns=names)
    meta = table.schema.metadata or {}
    df = table.to_pandas().set_index(M.STEP)
    df.index = df.index.astype(np.int64)
    df = df.astype(float)
    df.attrs[NONFINITE_STEP] = json.loads(meta.get(b"lm_ablate_nonfinite_step", b"null"))
    return df


def _needed(name: str, keep: Keep) -> bool:
    """Columns read from the cache: what ``keep`` asks for, what summaries and run-level values need."""
    layer = LAYER_KEY.match(name)
    return (
        keep(name)
        or name in BASE_COLUMNS
        or bool(EXTRAPOLATION_KEY.match(name))
        or (layer is not None and layer.group(2) in (M.GRAD_NORM_LAYER, M.MAX_ATTN_LOGIT))
    )


def _read_runs_table(cache: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(cache / RUNS_FILE)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise AnalysisError(f"W&B cache {cache / RUNS_FILE} is unreadable ({one_line(exc)})") from exc


def _status(summary: dict[str, Any], state: str) -> str:
    """Our status from the summary, unless W&B knows the run ended and the summary still says running."""
    ours = summary.get(M.STATUS)
    from_state = STATE_TO_STATUS.get(state.lower())
    if ours in M.STATUSES and not (ours == M.STATUS_RUNNING and from_state not in (None, M.STATUS_RUNNING)):
        return str(ours)
    return from_state or STATUS_INCOMPLETE


@dataclass
class WandbRun:
    """One W&B run as read from the API cache or a run file: its metadata, config and summary as W&B holds them
    (nested, W&B's own ``_`` keys in the summary included), and its history frame (:func:`history_frame`)."""

    run_id: str
    location: str  # the run's URL, W&B path or folder
    name: str
    group: str
    state: str  # W&B's run state (finished, crashed, ...), "" when unknown
    config: dict[str, Any] | None
    summary: dict[str, Any]
    history: pd.DataFrame


def wandb_record(run: WandbRun, keep: Keep | None, problems: list[str]) -> RunRecord:
    """The :class:`RunRecord` of a W&B run: the summary keys as in summary.json where our tracker logged them
    (W&B drops a dict value, so ``choices`` comes from the config, where the run's config.yaml has it too),
    else recomputed from the history with W&B's step count and runtime; the status from the summary and the
    W&B state; the config flattened."""
    config = run.config or None
    if config is None:
        problems.append(f"{run.run_id}: no W&B config; run left out of comparisons")
    hist, summary = run.history, run.summary
    extras = frame_extras(hist)
    ours = {k: v for k, v in summary.items() if not str(k).startswith("_")}
    if _has_ours(ours):  # logged by our tracker: the same keys as summary.json
        if ours.get(M.CHOICES) is None and config and isinstance(config.get(M.CHOICES), dict):
            ours[M.CHOICES] = config[M.CHOICES]
        values = summary_values(ours, hist, run.name)
    else:  # some other writer: recompute from the history, with W&B's step count and runtime
        values = summary_values(None, hist, run.name)
        values.update({k: float(summary[w]) for k, w in W_SUMMARY.items() if _number(summary.get(w)) is not None})
    values[M.RUN_NAME] = ours.get(M.RUN_NAME) or run.name
    values[M.GROUP] = ours.get(M.GROUP) or run.group or None
    status = _status(summary, run.state)
    flat = flatten(config) if config else None
    kept = finish_history(hist, keep)
    return RunRecord(run.run_id, run.location, run.name, status, values, flat, kept, extras, problems)


def records_from_cache(
    cache: Path, table: pd.DataFrame, entity: str, project: str, group: str | None, keep: Keep | None
) -> list[RunRecord]:
    """One :class:`RunRecord` per cached run (of ``group``); damaged entries become problems, not errors."""
    if group:
        table = table[table["group"] == group]
    records = []
    for row in table.to_dict("records"):
        run_id = str(row["run_id"])
        problems: list[str] = []
        try:
            summary = json.loads(row["summary_json"])
        except (TypeError, ValueError):
            summary = {}
            problems.append(f"{run_id}: cached W&B summary unreadable")
        try:
            config = json.loads(row["config_json"]) or None
        except (TypeError, ValueError):
            config = None
        path = cache / HISTORY_DIR / f"{_safe(run_id)}.parquet"
        try:
            hist = _read_history(path, keep)
        except Exception as exc:
            problems.append(f"{run_id}: cached W&B history unreadable ({one_line(exc)}); history empty")
            hist = history_frame([])
        location = row.get("url") or f"wandb:{entity}/{project}/{run_id}"
        name, group_name, state = str(row["name"]), str(row["group"] or ""), str(row["state"])
        run = WandbRun(run_id, location, name, group_name, state, config, summary, hist)
        records.append(wandb_record(run, keep, problems))
    return records


def _has_ours(summary: dict[str, Any]) -> bool:
    return M.FINAL_VAL_LOSS in summary or M.STATUS in summary


def load_wandb(
    project: str,
    cache_root: str | Path,
    group: str | None = None,
    offline: bool = False,
    keep: Keep | None = None,
    api: Any = None,
) -> RunSet:
    """The runs of ``project`` ("entity/project"), fetched into ``<cache_root>/<entity>_<project>`` unless
    ``offline``. Raises :class:`AnalysisError` when there is nothing to report from."""
    entity, name = parse_project(project)
    cache = cache_dir_for(cache_root, entity, name)
    problems: list[str] = []
    if offline:
        if not (cache / RUNS_FILE).is_file():
            raise AnalysisError(f"--offline: no W&B cache at {cache}; run once without --offline to fetch it")
        table = _read_runs_table(cache)
    else:
        try:
            table, problems = fetch(entity, name, cache, group, api)
        except AnalysisError:
            raise
        except Exception as exc:
            if not (cache / RUNS_FILE).is_file():
                raise AnalysisError(
                    f"W&B fetch of {project} failed ({one_line(exc)}) and no cache at {cache}"
                ) from None
            problems.append(f"W&B fetch of {project} failed ({one_line(exc)}); report built from the cache")
            table = _read_runs_table(cache)
    records = records_from_cache(cache, table, entity, name, group, keep)
    if not records:
        where = f"{project}" + (f" (group {group})" if group else "")
        raise AnalysisError(f"no runs found in W&B project {where}" + (" cache" if offline else ""))
    return assemble(records, problems)
