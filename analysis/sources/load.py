"""Find run records on disk and load them into one table, without ever crashing on a damaged run.

A sweep is only useful if a report can be made from whatever it left behind: runs killed mid-write, runs that
never started, half-written JSON lines. So every reader here degrades: what cannot be read becomes a status
(``incomplete``, ``corrupt``) and a line in :attr:`RunSet.problems`, and the rest of the run is still used.

Reading is also built to scale to sweeps of a thousand long runs: metrics.jsonl goes through msgspec (typed
rows holding only the columns asked for; strict JSON), then pyarrow's JSON reader (C++, NaN/Infinity aware)
for a file msgspec rejects, with a Python line-by-line reader as the fallback for any file both reject;
config.yaml goes through libyaml, and runs are read in forked worker processes. Callers that need only some
metrics pass ``keep`` so the history of a big sweep fits in memory.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from omegaconf import DictConfig, OmegaConf

from analysis.parallel import fork_map
from lm_ablate import metrics as M
from lm_ablate import stall

STATUS_INCOMPLETE = "incomplete"  # no summary.json: killed before the loop wrote one (values from metrics)
STATUS_CORRUPT = "corrupt"  # summary.json or config.yaml exists but cannot be parsed
RUN_FILES = (M.CONFIG_FILE, M.SUMMARY_FILE, M.METRICS_FILE)
SKIP_DIRS = {".hydra", "wandb", "__pycache__"}
WANDB_FILE = re.compile(r"run-[A-Za-z0-9_-]+\.wandb")  # a W&B run's transaction log (analysis.sources.wandb_offline)
SUMMARY_KEYS = (
    M.RUN_NAME, M.GROUP, M.CHOICES, M.SEED, M.FINAL_VAL_LOSS, M.BEST_VAL_LOSS, M.FINAL_TRAIN_LOSS,
    M.GRAD_NORM_SPIKES, M.LOSS_SPIKES, M.MEAN_TOKENS_PER_SEC, M.MEAN_MFU, M.PARAMS_TOTAL,
    M.PARAMS_NON_EMBEDDING, M.STEPS, M.TOTAL_TOKENS, M.WALL_TIME_S, M.DIVERGED_AT, M.SKIPPED_STEPS,
    M.STOP_REASON, M.ERROR, M.FLOPS_PER_TOKEN, M.VOCAB_SIZE, M.LOG_VOCAB, M.UNIGRAM_LOSS, M.BIGRAM_LOSS,
    M.STALLED, M.STALL_REASON, M.FINAL_VAL_BPB,
)  # fmt: skip
TEXT_SUMMARY_KEYS = (M.RUN_NAME, M.GROUP, M.CHOICES, M.STOP_REASON, M.ERROR, M.STALL_REASON)
# judged here by lm_ablate.stall from the history (the recorded flag only where no val/loss curve was read)
JUDGED_KEYS = (M.STALLED,)
NUMERIC_SUMMARY_KEYS = tuple(k for k in SUMMARY_KEYS if k not in TEXT_SUMMARY_KEYS + JUDGED_KEYS)
# downstream/<task>/<kind> (lm_ablate.metrics.downstream): every one a run's summary holds is a numeric column
DOWNSTREAM_KEY = re.compile(r"^downstream/([A-Za-z0-9_.-]+)/(" + "|".join(M.DOWNSTREAM_KINDS) + r")$")
# history frame attr: first step that logged a non-finite train loss or grad norm (None if none)
NONFINITE_STEP = "first_nonfinite_step"
MISSING_VALUE = "(missing)"  # stands for a config key that one run has and another lacks (schema drift)

# Run-level values taken from the history (columns of RunSet.runs):
INIT_VAL_LOSS = "init_val_loss"  # the first val/loss row: the loop evaluates at step 0, before any update
FIRST_PROBE_PREFIX = "first_probe/"  # + layer/<i>/grad_norm: the first probe row (gradients at init)
FIRST_PROBE_STEP = "first_probe_step"
# Extrapolation losses (val/loss@<k>x) of the final row that has them are copied under their own names.
EXTRAPOLATION_KEY = re.compile(r"^val/loss@(\d+(?:\.\d+)?)x$")
LAYER_KEY = re.compile(r"^layer/(\d+)/(.+)$")
# Derived history column: max over layers of layer/<i>/max_attn_logit (so per-layer columns can be dropped).
MAX_ATTN_LOGIT_ALL = "max_attn_logit/max_over_layers"
# Always read (even when ``keep`` drops them afterwards): divergence detection and summarize_history use them.
BASE_COLUMNS = (
    M.TRAIN_LOSS, M.VAL_LOSS, M.GRAD_NORM, M.SPIKE_GRAD_NORM, M.SPIKE_GRAD_NORM_COUNT, M.SPIKE_LOSS,
    M.SPIKE_LOSS_COUNT, M.TOKENS, M.TOKENS_PER_SEC,
)  # fmt: skip
HEAD_LINES = 256  # lines read for the first probe row and the column names (probe_every up to ~250)
TAIL_LINES = 64  # lines searched backwards for the final evaluation row (extrapolation losses)
PARALLEL_MIN_RUNS = 48  # below this, forking workers costs more than it saves

Keep = Callable[[str], bool]


class AnalysisError(Exception):
    """A bad input to the analysis (no runs, unknown key); its message is one line, fit for a CLI error."""


@dataclass
class RunSet:
    """Everything loaded from a set of runs (run directories, or a W&B project via analysis.sources.wandb_api).

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


@dataclass
class RunRecord:
    """One run as any source reads it, before the runs are assembled into a :class:`RunSet`."""

    run_id: str
    location: str  # run directory, or the W&B run path
    name: str
    status: str
    values: dict[str, Any]  # SUMMARY_KEYS (from the summary, else recomputed from the history)
    config: dict[str, Any] | None  # flattened
    history: pd.DataFrame
    extras: dict[str, float]  # run-level values from the history (INIT_VAL_LOSS, first probe, extrapolation)
    problems: list[str] = field(default_factory=list)


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
            if not is_wandb_file(root):  # a W&B run file is read by analysis.sources.wandb_offline
                notes.append(f"{raw}: not a directory (skipped)")
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            if is_wandb_run_folder(filenames):  # W&B's own files/config.yaml is no run record
                dirnames[:] = []
            elif is_run_dir(here, filenames):
                found.setdefault(here.resolve(), None)
                dirnames[:] = []
            else:
                dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
    return sorted(found, key=natural_key), notes


def is_run_dir(path: Path, filenames: list[str]) -> bool:
    """Whether ``path`` (holding ``filenames``) is a run directory: one of the run files, or Hydra's config."""
    return any(f in filenames for f in RUN_FILES) or (path / ".hydra" / M.CONFIG_FILE).is_file()


def is_wandb_file(path: Path) -> bool:
    """A W&B run's transaction log, ``run-<id>.wandb`` (written online and offline alike)."""
    return bool(WANDB_FILE.fullmatch(path.name)) and path.is_file()


def is_wandb_run_folder(filenames: list[str]) -> bool:
    """A W&B run folder (``offline-run-<time>-<id>``, ``run-<time>-<id>``): it holds a ``run-<id>.wandb``."""
    return any(WANDB_FILE.fullmatch(f) for f in filenames)


def natural_key(path: Path) -> list[Any]:
    """Sort ``2/`` before ``10/`` (Hydra numbers multirun jobs without padding)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.parts]


# --- metrics.jsonl --------------------------------------------------------------------------------------
def read_metrics(
    path: Path, run_id: str, problems: list[str], keep: Keep | None = None
) -> tuple[pd.DataFrame, dict[str, float]]:
    """metrics.jsonl as a step-indexed frame, plus the run-level values found in it (:func:`history_extras`).

    Garbled lines are skipped and noted; duplicate steps keep the last row written (a resumed run re-logs
    steps, and the later row is the one the run continued from). ``keep`` selects the columns returned
    (all when None).
    """
    _, hist, extras = _read_history(path, run_id, problems, keep, need_base=False)
    return hist, extras


def _read_history(
    path: Path, run_id: str, problems: list[str], keep: Keep | None, need_base: bool
) -> tuple[pd.DataFrame | None, pd.DataFrame, dict[str, float]]:
    """(frame with the base columns for summarize_history, or None unless ``need_base``; the frame with the
    columns ``keep`` selects; run-level values). The fast reader is tried first; whatever it rejects is read
    line by line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        problems.append(f"{run_id}: cannot read {M.METRICS_FILE}: {exc}")
        return _empty_history(), _empty_history(), {}
    fast = _read_metrics_fast(data, run_id, problems, keep, need_base)
    if fast is not None:
        full, columns, steps, nonfinite, extras = fast
        if need_base or keep is None:
            full = _frame(columns, steps, nonfinite)
            return full, finish_history(full, keep), extras
        _derive(columns)
        kept = _frame({k: v for k, v in columns.items() if keep(k)}, steps, nonfinite)
        return None, kept, extras
    hist = _read_metrics_lines(data.decode("utf-8", errors="replace"), run_id, problems)
    return hist, finish_history(hist, keep), frame_extras(hist)


def _frame(columns: dict[str, np.ndarray], steps: np.ndarray, nonfinite: int | None) -> pd.DataFrame:
    df = pd.DataFrame(columns, index=pd.Index(steps, name=M.STEP), copy=False)
    df.attrs[NONFINITE_STEP] = nonfinite
    return df


def _read_metrics_lines(text: str, run_id: str, problems: list[str]) -> pd.DataFrame:
    """The careful reader: json.loads line by line, so one bad line costs only that line."""
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    nonfinite: int | None = None
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = M.from_json(json.loads(line))  # "NaN"/"Infinity" strings back to floats
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
    _note_bad_lines(bad, len(lines), run_id, problems)
    if not rows:
        return _empty_history()
    df = pd.DataFrame(rows)
    df = df[~df[M.STEP].duplicated(keep="last")].set_index(M.STEP).sort_index(kind="stable")
    df = df.apply(pd.to_numeric, errors="coerce").astype(float)
    df.attrs[NONFINITE_STEP] = nonfinite
    return df


def _note_bad_lines(bad: list[int], n_lines: int, run_id: str, problems: list[str]) -> None:
    if not bad:
        return
    if bad == [n_lines]:
        what = "its last line (truncated write)"
    elif len(bad) == 1:
        what = f"unreadable line {bad[0]}"
    else:
        what = f"{len(bad)} unreadable lines: {_ranges(bad)}"
    problems.append(f"{run_id}: {M.METRICS_FILE}: skipped {what}")


FastRead = tuple[None, dict[str, np.ndarray], np.ndarray, "int | None", dict[str, float]]
# (step of every row, columns, index of the first row with a logged non-finite loss or grad norm), rows in
# file order; a column's NaN is a row that did not log it (or logged null, or NaN itself)
Decoded = tuple[np.ndarray, dict[str, np.ndarray], "int | None"]


def _read_metrics_fast(
    data: bytes, run_id: str, problems: list[str], keep: Keep | None, need_base: bool = True
) -> FastRead | None:
    """A whole-file reader: (None, columns, steps, first non-finite step, run-level values), with steps unique
    and sorted; None when the file needs the careful reader.

    With ``keep``, only val/loss, the base columns if ``need_base``, the per-layer attention logits and the
    kept columns seen in the first lines are converted, by msgspec into typed rows (5000 of the loop's rows,
    1.9 MB: ~3 ms against pyarrow's ~7.5 ms); a file msgspec rejects (NaN/Infinity from a diverged run, a
    value of another type) goes to pyarrow's JSON reader, which also reads every column when ``keep`` is None.
    A last line cut short by a kill (the usual damage in a live sweep) is dropped here, as the careful reader
    would. The first probe row is taken from the first lines and extrapolation losses from the last ones,
    which is where the loop logs them.
    """
    if not data or data.isspace():
        return None, {}, np.array([], dtype=np.int64), None, {}
    bad: list[int] = []
    cut = data.rfind(b"\n") + 1
    if cut < len(data):  # unterminated last line: keep it only if it parses
        try:
            json.loads(data[cut:])
        except ValueError:
            bad = [data.count(b"\n") + 1]
            data = data[:cut]
    head = _parse_lines(data, HEAD_LINES, from_end=False)
    tail = _parse_lines(data, TAIL_LINES, from_end=True)
    if head is None or tail is None:
        return None
    if keep is None:
        decoded = _decode_arrow(data, None)
    else:
        names = [M.STEP, *(BASE_COLUMNS if need_base else (M.VAL_LOSS,))]
        names += [k for k in dict.fromkeys(k for row in head for k in row)
                  if k not in names and (keep(k) or _is_attn_logit(k))]  # fmt: skip
        # a diverged run's last rows hold NaN/Infinity, which msgspec would reject only after reading the rest
        strict = not any(_nonfinite(v) for row in tail for v in row.values())
        typed = _decode_typed(data, names, also=(M.TRAIN_LOSS, M.GRAD_NORM)) if strict else None
        decoded = typed or _decode_arrow(data, names)
    if decoded is None:
        return None
    steps, columns, first_nonfinite = decoded
    if not np.isfinite(steps).all() or (steps != np.round(steps)).any():
        return None
    nonfinite = int(steps[first_nonfinite]) if first_nonfinite is not None else None
    _note_bad_lines(bad, bad[0] if bad else 0, run_id, problems)
    if len(steps) > 1 and not (np.diff(steps) > 0).all():  # resumed run: keep the last row of each step
        _, last_from_end = np.unique(steps[::-1], return_index=True)
        order = len(steps) - 1 - last_from_end  # ascending steps, each at its last occurrence
        steps = steps[order]
        columns = {name: values[order] for name, values in columns.items()}
    val = columns.get(M.VAL_LOSS)
    extras = history_extras(
        val[~np.isnan(val)] if val is not None else None,
        next((r for r in head if any(_is_layer_grad(k) for k in r)), None),
        next((r for r in reversed(tail) if any(_is_extrapolation(k) for k in r)), None),
    )
    return None, columns, steps.astype(np.int64), nonfinite, extras


@functools.lru_cache(maxsize=16)
def _row_decoder(names: tuple[str, ...]) -> Any:
    """A msgspec decoder of JSON rows into structs holding just ``names`` (float, null, or NaN when absent);
    other keys are skipped unparsed."""
    import msgspec

    fields = [(f"f{i}", float | None, math.nan) for i in range(len(names))]
    row = msgspec.defstruct("Row", fields, rename={f"f{i}": n for i, n in enumerate(names)}, gc=False)
    return msgspec.json.Decoder(row)


def _decode_typed(data: bytes, names: list[str], also: Sequence[str] = ()) -> Decoded | None:
    """``names`` (float columns, ``names[0]`` the step) of every row, or None if msgspec rejects the file.

    Strict JSON only: NaN, Infinity and numbers out of a double's range are errors, so every NaN in the
    result is a row that did not log the key, and no row logged a non-finite value. Keys in ``also`` are
    parsed (so rejected like ``names`` when out of range) but not returned: with the loss and the grad norm
    there, a file whose loss pyarrow cannot read (1e999) reaches the careful reader, which counts it as a
    non-finite step, exactly as when pyarrow read every file; msgspec skips other keys without parsing them.
    """
    try:
        import msgspec
    except ImportError:  # an optional speed-up: pyarrow reads the same files
        return None
    if not hasattr(msgspec.json.Decoder, "decode_lines"):  # msgspec < 0.18
        return None
    parsed = (*names, *(k for k in also if k not in names))
    try:  # blank lines are skipped and rows are split at "}{" as pyarrow does; any other fault fails the file
        rows = _row_decoder(parsed).decode_lines(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not rows:
        return None
    try:  # row-major in one pass (~1.6x faster than a pass per column)
        flat = itertools.chain.from_iterable(map(msgspec.structs.astuple, rows))
        table = np.fromiter(flat, float, len(rows) * len(parsed)).reshape(len(rows), len(parsed))
    except TypeError:  # a null is None, which np.array reads as NaN
        table = np.array([msgspec.structs.astuple(r) for r in rows], dtype=float)
    # a column no row logged is left out, as pyarrow's path leaves out an all-null one
    columns = {name: np.ascontiguousarray(table[:, i]) for i, name in enumerate(names)}
    steps = columns.pop(names[0])
    return steps, {name: v for name, v in columns.items() if not np.isnan(v).all()}, None


def _decode_arrow(data: bytes, names: list[str] | None) -> Decoded | None:
    """pyarrow's JSON reader: ``names`` as float columns (or every column, types inferred, when None), or None
    if pyarrow rejects the file or a row has no step. NaN and Infinity are read as values."""
    import pyarrow as pa
    import pyarrow.json as pj

    parse_options = None
    if names is not None:
        schema = pa.schema([(n, pa.float64()) for n in names])
        parse_options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=parse_options,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError):
        return None
    if M.STEP not in table.column_names or table.num_rows == 0:
        return None
    step_col = table.column(M.STEP)
    if step_col.null_count or not (pa.types.is_integer(step_col.type) or pa.types.is_floating(step_col.type)):
        return None
    steps = step_col.to_numpy().astype(float)
    # first row (in file order, as the careful reader) with a logged, non-null, non-finite loss or grad norm
    hits = [i for i in (_first_nonfinite_row(table, n) for n in (M.TRAIN_LOSS, M.GRAD_NORM)) if i is not None]
    columns: dict[str, np.ndarray] = {}
    for name in table.column_names:
        col = table.column(name)
        if name == M.STEP or (parse_options is not None and col.null_count == table.num_rows):
            continue
        if pa.types.is_floating(col.type) or pa.types.is_integer(col.type) or pa.types.is_null(col.type):
            columns[name] = col.to_numpy(zero_copy_only=False).astype(float, copy=False)
        else:  # bool, text, nested: what the careful reader's to_numeric would make of it
            values = pd.Series(col.to_pylist(), dtype=object)
            columns[name] = pd.to_numeric(values, errors="coerce").to_numpy(float)
    return steps, columns, min(hits) if hits else None


def _first_nonfinite_row(table: Any, name: str) -> int | None:
    import pyarrow as pa

    if name not in table.column_names or not pa.types.is_floating(table.column(name).type):
        return None
    col = table.column(name)
    values = col.to_numpy(zero_copy_only=False)
    hits = np.flatnonzero(~np.isfinite(values) & ~col.is_null().to_numpy(zero_copy_only=False))
    return int(hits[0]) if len(hits) else None


def _parse_lines(data: bytes, limit: int, from_end: bool) -> list[dict[str, Any]] | None:
    """Rows from the start of the file up to the first probe row, or from the end back to the last row with
    an evaluation (extrapolation losses are logged with it), at most ``limit`` lines, in file order; numeric
    values only. None if a line in that range is not a valid row (the careful reader then reports it)."""
    rows = []
    window = 1 << 18  # bytes looked at: `limit` rows of up to 1 KB; the loop's first probe is at step 1
    cut = len(data) > window
    if from_end:
        parts = data[-window:].rsplit(b"\n", limit)
        lines = reversed(parts[1:] if cut or len(parts) > limit else parts)  # parts[0]: the rest, or cut
    else:
        parts = data[:window].split(b"\n", limit)
        lines = iter(parts[:-1] if cut or len(parts) > limit else parts)
    for line in lines:
        if not line.strip():
            continue
        try:
            row = M.from_json(json.loads(line))  # "NaN"/"Infinity" strings back to floats
            step = row[M.STEP]
            if isinstance(step, bool) or not float(step).is_integer():
                return None
        except (ValueError, KeyError, TypeError):
            return None
        row = {k: v for k, v in row.items() if isinstance(v, (int, float))}
        row[M.STEP] = int(step)
        rows.append(row)
        if from_end and (M.VAL_LOSS in row or any(_is_extrapolation(k) for k in row)):
            break
        if not from_end and any(k.startswith(M.LAYER_PREFIX) for k in row):
            break
    return rows[::-1] if from_end else rows


def _is_attn_logit(name: str) -> bool:
    m = LAYER_KEY.match(name)
    return m is not None and m.group(2) == M.MAX_ATTN_LOGIT


def _is_layer_grad(name: str) -> bool:
    m = LAYER_KEY.match(name)
    return m is not None and m.group(2) == M.GRAD_NORM_LAYER


def _is_extrapolation(name: str) -> bool:
    return EXTRAPOLATION_KEY.match(name) is not None


def _row_where(hist: pd.DataFrame, pick: Callable[[str], bool], last: bool = False) -> dict[str, Any] | None:
    """The first (or last) row of ``hist`` with a value in any column ``pick`` accepts, as a dict."""
    cols = [c for c in hist.columns if pick(str(c))]
    if not cols:
        return None
    present = np.flatnonzero(hist[cols].notna().to_numpy().any(axis=1))
    if not len(present):
        return None
    i = present[-1] if last else present[0]
    return {M.STEP: int(hist.index[i]), **{c: float(hist[c].iloc[i]) for c in cols}}


def frame_extras(hist: pd.DataFrame) -> dict[str, float]:
    """:func:`history_extras` of a whole history frame (careful reader, W&B)."""
    return history_extras(hist, _row_where(hist, _is_layer_grad), _row_where(hist, _is_extrapolation, True))


def history_extras(
    val: np.ndarray | pd.DataFrame | None, probe_row: dict[str, Any] | None, final_row: dict[str, Any] | None
) -> dict[str, float]:
    """Run-level values read off the history: ``INIT_VAL_LOSS`` (the first logged ``val/loss``: ``val`` is
    those values in step order, or the history frame), the first probe row's per-layer gradient norms, and
    the ``val/loss@<k>x`` losses of the last row that has them (the final evaluation). NaN values are left
    out."""
    if isinstance(val, pd.DataFrame):
        val = val[M.VAL_LOSS].dropna().to_numpy() if M.VAL_LOSS in val.columns else None
    out: dict[str, float] = {}
    if val is not None and len(val):
        out[INIT_VAL_LOSS] = float(val[0])
    if probe_row is not None:
        grads = {k: v for k, v in probe_row.items() if _is_layer_grad(k) and _finite_number(v)}
        if grads:
            out[FIRST_PROBE_STEP] = float(probe_row[M.STEP])
            out.update({FIRST_PROBE_PREFIX + k: float(v) for k, v in grads.items()})
    if final_row is not None:
        out.update({k: float(v) for k, v in final_row.items() if _is_extrapolation(k) and _finite_number(v)})
    return out


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _derive(columns: dict[str, Any]) -> None:
    """Add ``MAX_ATTN_LOGIT_ALL`` (max over the per-layer attention logits; NaN where no layer logged)."""
    attn = [c for c in columns if _is_attn_logit(str(c))]
    if attn:
        stacked = np.vstack([np.asarray(columns[c], dtype=float) for c in attn])
        columns[MAX_ATTN_LOGIT_ALL] = np.fmax.reduce(stacked, axis=0)


def finish_history(hist: pd.DataFrame, keep: Keep | None) -> pd.DataFrame:
    """Add the derived ``MAX_ATTN_LOGIT_ALL`` column, then keep only the columns ``keep`` accepts."""
    attn = [c for c in hist.columns if _is_attn_logit(str(c))]
    attrs = dict(hist.attrs)
    if attn:
        hist = hist.copy()
        hist[MAX_ATTN_LOGIT_ALL] = np.fmax.reduce(hist[attn].to_numpy().T, axis=0)
    if keep is not None:
        hist = hist[[c for c in hist.columns if keep(str(c))]]
    hist.attrs.update(attrs)
    return hist


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


# --- config.yaml and summary.json ----------------------------------------------------------------------
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
            problems.append(f"{run_id}: config taken from .hydra/{M.CONFIG_FILE} (no readable {M.CONFIG_FILE})")
            return flatten(cfg), corrupt
    if not corrupt:
        problems.append(f"{run_id}: no {M.CONFIG_FILE}; run left out of comparisons")
    else:
        problems[-1] += "; run left out of comparisons"
    return None, corrupt


_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it


class _FastYamlLoader(_SafeLoader):  # type: ignore[misc,valid-type]
    """libyaml's parser with OmegaConf's scalar rules (``1e-5`` is a float, timestamps stay text, duplicate
    keys are an error), so reading a config is ~20x faster than OmegaConf.load yet gives the same values."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [k.value for k, _ in node.value if k.tag == yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG]
        if len(keys) != len(set(keys)):
            raise yaml.constructor.ConstructorError(None, None, "duplicate key", node.start_mark)
        return super().construct_mapping(node, deep=deep)


_FastYamlLoader.add_implicit_resolver(  # OmegaConf's float pattern (omegaconf._utils.get_yaml_loader)
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
        |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)
_FastYamlLoader.yaml_implicit_resolvers = {
    key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in _FastYamlLoader.yaml_implicit_resolvers.items()
}


def _has_interpolation(tree: Any) -> bool:
    if isinstance(tree, dict):
        return any(_has_interpolation(v) for v in tree.values())
    if isinstance(tree, list):
        return any(_has_interpolation(v) for v in tree)
    return isinstance(tree, str) and "${" in tree


def _load_yaml(path: Path, must_resolve: bool = False) -> dict[str, Any] | None:
    """OmegaConf's scalar rules, not PyYAML's, so ``1e-5`` is read as the float Hydra meant, not a string.

    config.yaml is already resolved by the loop, so a leftover interpolation is kept as text. Hydra's copy is
    not: an interpolation it cannot resolve here would read as a value differing from the other runs' (a
    spurious axis), so with ``must_resolve`` such a file is rejected instead. Files without interpolations
    (every config.yaml the loop writes) take the libyaml path; the rest go through OmegaConf itself.
    """
    try:
        with path.open("rb") as f:
            fast = yaml.load(f, Loader=_FastYamlLoader)  # a SafeLoader subclass
        fast = {} if fast is None else fast  # an empty file: OmegaConf reads an empty config
    except Exception:
        fast = None
    if isinstance(fast, dict) and not _has_interpolation(fast):
        return fast
    if fast is not None and not isinstance(fast, dict):
        return None
    try:
        node = OmegaConf.load(path)
        if not isinstance(node, DictConfig):
            return None
        try:
            out = OmegaConf.to_container(node, resolve=True)
        except Exception:
            if must_resolve:
                return None
            out = OmegaConf.to_container(node, resolve=False)
        return out if isinstance(out, dict) else None
    except Exception:
        return None


def read_summary(path: Path, run_id: str, problems: list[str]) -> tuple[dict[str, Any] | None, str]:
    """(summary, status). Missing → (None, incomplete); unparseable or not an object → (None, corrupt). The
    problem line it adds does not name the status: an unreadable config.yaml can still change it."""
    if not path.is_file():
        problems.append(f"{run_id}: no {M.SUMMARY_FILE} (killed early?)")
        return None, STATUS_INCOMPLETE
    try:
        data = M.from_json(json.loads(path.read_text(encoding="utf-8")))  # "NaN"/"Infinity" back to floats
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
    except (OSError, ValueError, TypeError) as exc:
        problems.append(f"{run_id}: {M.SUMMARY_FILE} is unreadable ({one_line(exc)})")
        return None, STATUS_CORRUPT
    status = data.get(M.STATUS)
    if status not in M.STATUSES:
        problems.append(f"{run_id}: {M.SUMMARY_FILE} has unknown status {status!r}")
        return data, STATUS_CORRUPT
    return data, str(status)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def downstream_keys(names: Iterable[Any]) -> list[str]:
    """The ``downstream/<task>/<kind>`` names among ``names``, by task, then kind in DOWNSTREAM_KINDS order."""
    found = {str(n): DOWNSTREAM_KEY.match(str(n)) for n in names}
    hits = [(m.group(1), M.DOWNSTREAM_KINDS.index(m.group(2)), n) for n, m in found.items() if m]
    return [n for _, _, n in sorted(hits)]


def summary_values(summary: dict[str, Any] | None, hist: pd.DataFrame, name: str) -> dict[str, Any]:
    """SUMMARY_KEYS for one run, and the summary's downstream/<task>/<kind> values: the summary's where it has
    them, else recomputed from the history (no downstream values then)."""
    values: dict[str, Any] = dict.fromkeys(SUMMARY_KEYS, math.nan)
    values[M.RUN_NAME] = name
    values[M.ERROR] = None
    values[M.STOP_REASON] = None
    if summary is None:
        values.update(summarize_history(hist))
    else:
        values.update({k: summary[k] for k in SUMMARY_KEYS if k in summary and summary[k] is not None})
        values.update({k: summary[k] for k in downstream_keys(summary) if summary[k] is not None})
    if isinstance(values[M.CHOICES], dict):
        values[M.CHOICES] = json.dumps(values[M.CHOICES], sort_keys=True)
    return values


def read_run_dir(run_dir: Path, run_id: str, keep: Keep | None = None) -> RunRecord:
    """Everything one run directory holds, as a :class:`RunRecord` (never raises for a damaged run)."""
    summary_problems: list[str] = []
    metrics_problems: list[str] = []
    config_problems: list[str] = []
    hist, extras = _empty_history(), {}
    summary, status = read_summary(run_dir / M.SUMMARY_FILE, run_id, summary_problems)
    full = None
    if (run_dir / M.METRICS_FILE).is_file():
        full, hist, extras = _read_history(run_dir / M.METRICS_FILE, run_id, metrics_problems, keep, summary is None)
    if not len(hist.index) and not metrics_problems:
        metrics_problems.append(no_history(run_dir, run_id))
    cfg, cfg_corrupt = read_config(run_dir, run_id, config_problems)
    if cfg_corrupt:
        status = STATUS_CORRUPT
    # the problem that decided an incomplete or corrupt status names it, once (an unreadable config.yaml
    # makes a run corrupt whatever its summary said)
    deciding = config_problems if cfg_corrupt else summary_problems
    if status in (STATUS_INCOMPLETE, STATUS_CORRUPT) and deciding:
        head, sep, tail = deciding[0].partition("; run left out")
        deciding[0] = f"{head}; status {status}{sep}{tail}"
    values = summary_values(summary, full if full is not None else hist, run_dir.name)
    problems = summary_problems + metrics_problems + config_problems
    return RunRecord(run_id, str(run_dir), run_dir.name, status, values, cfg, hist, extras, problems)


def no_history(run_dir: Path, run_id: str) -> str:
    """The problem line of a run whose metrics.jsonl is missing or holds no row: what the report lacks for it,
    and where its history may still be (a W&B run file under the run's wandb/)."""
    what = f"{M.METRICS_FILE} is empty" if (run_dir / M.METRICS_FILE).exists() else f"no {M.METRICS_FILE}"
    line = (f"{run_id}: {what}: no curves for this run, and no value read from the history "
            f"({INIT_VAL_LOSS}, first-probe gradients, extrapolation losses)")  # fmt: skip
    wandb_dir = run_dir / "wandb"
    try:
        logged = wandb_dir.is_dir() and any(
            is_wandb_run_folder(os.listdir(d)) for d in wandb_dir.iterdir() if d.is_dir()
        )
    except OSError:  # a folder that cannot be listed holds no hint
        logged = False
    if logged:
        line += f"; its W&B run holds them: python -m analysis.report {wandb_dir} --out DIR"
    return line


def load_runs(paths: Iterable[str | Path] | str | Path, keep: Keep | None = None, workers: int = 1) -> RunSet:
    """Load every run at or below ``paths``. Raises :class:`AnalysisError` when a path is not a directory or
    no run is found.

    ``keep`` selects history columns (all when None; runs without a summary are still summarised from the
    full set). ``workers`` > 1 reads runs in that many forked processes once there are enough runs to pay
    for them.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    check_paths(paths)
    run_dirs, problems = find_run_dirs(paths)
    if not run_dirs:
        raise no_runs(paths)
    return load_run_dirs(run_dirs, problems, keep, workers)


def check_paths(paths: Sequence[str | Path]) -> None:
    """Raise :class:`AnalysisError` (one line) for a path that is neither a folder nor a W&B run file: a
    mistyped path is bad input, not an empty sweep."""
    for raw in paths:
        root = Path(raw).expanduser()
        if not root.is_dir() and not is_wandb_file(root):
            what = "not a directory" if root.exists() else "no such directory"
            raise AnalysisError(f"{raw}: {what}; give run directories, multirun roots, folders holding them, "
                                "or W&B run folders (wandb/, offline-run-*)")  # fmt: skip


def no_runs(paths: Sequence[str | Path]) -> AnalysisError:
    return AnalysisError("no runs found under: " + ", ".join(str(p) for p in paths)
                         + " (no run record, no W&B run file run-*.wandb)")  # fmt: skip


def run_ids(locations: Sequence[Path]) -> list[str]:
    """Each run's id: its folder relative to the common ancestor of all (unique across several sweeps), or its
    name when it is the only one."""
    base = Path(os.path.commonpath([str(d) for d in locations]))
    return [d.relative_to(base).as_posix() if d != base else d.name for d in locations]


def load_run_dirs(
    run_dirs: Sequence[Path],
    problems: list[str],
    keep: Keep | None = None,
    workers: int = 1,
    ids: Sequence[str] | None = None,
) -> RunSet:
    """The runs of ``run_dirs`` (found by :func:`find_run_dirs`, with its notes in ``problems``), with the run
    ids ``ids`` (default: :func:`run_ids`)."""
    jobs = list(zip(run_dirs, ids or run_ids(run_dirs)))
    records = fork_map(
        lambda job: read_run_dir(job[0], job[1], keep),
        jobs,
        workers=workers if len(jobs) >= PARALLEL_MIN_RUNS else 1,
    )
    return assemble(records, problems)


def assemble(records: Sequence[RunRecord], problems: list[str] | None = None) -> RunSet:
    """One :class:`RunSet` from the runs of any source; config keys missing from a run read MISSING_VALUE."""
    problems = list(problems or [])
    rows: list[dict[str, Any]] = []
    history: dict[str, pd.DataFrame] = {}
    configs: dict[str, dict[str, Any]] = {}
    for rec in records:
        problems += rec.problems
        history[rec.run_id] = rec.history
        row: dict[str, Any] = {"run_id": rec.run_id, "run_dir": rec.location, M.STATUS: rec.status}
        row.update(rec.values)
        row.update(rec.extras)
        if rec.config is not None:
            configs[rec.run_id] = rec.config
            # config seed wins over the summary's: it is what the run was started with
            row.update({k: v for k, v in rec.config.items() if k not in ("run_id", "run_dir", M.STATUS)})
        rows.append(row)
    runs = pd.DataFrame.from_records(rows)
    scores = downstream_keys(runs.columns)  # a run without one reads NaN there
    lead = ["run_id", "run_dir", M.STATUS, *SUMMARY_KEYS, *scores]
    runs = runs[lead + sorted(c for c in runs.columns if c not in lead)]
    for key in (*NUMERIC_SUMMARY_KEYS, *scores):  # a hand-edited or half-migrated summary may hold strings: NaN
        runs[key] = pd.to_numeric(runs[key], errors="coerce")
    _fill_missing_keys(configs)
    _judge_stalls(runs, history, configs)
    return RunSet(runs=runs, history=history, configs=configs, problems=problems)


# --- stalled runs ---------------------------------------------------------------------------------------
NOT_DATA_KEYS = ("data.cache_dir", "data.num_proc")  # where the tokens are cached, not which tokens


def _data_identity(cfg: dict[str, Any] | None) -> str | None:
    """The run's data settings (every ``data.*`` key but the cache's), or None without a config."""
    if cfg is None:
        return None
    return json.dumps({k: str(v) for k, v in sorted(cfg.items()) if k.startswith("data.") and k not in NOT_DATA_KEYS})


def _judge_stalls(runs: pd.DataFrame, history: dict[str, pd.DataFrame], configs: dict[str, dict[str, Any]]) -> None:
    """Columns ``stalled`` (bool) and ``stall_reason`` of every run, by the loop's own rule (lm_ablate/stall.py)
    from its val/loss curve, so records written before the loop recorded the flag are judged alike; only a
    completed run can be stalled (a diverged one counts as diverged). A run whose summary lacks
    ``unigram_loss`` takes that of the runs with the same data settings (same tokens, same level); a run
    without any val/loss curve keeps the flag it recorded. ``log_vocab`` is filled from ``vocab_size``."""
    ids = runs["run_id"].tolist()
    level: dict[str, float] = {}
    for r, u in zip(ids, runs[M.UNIGRAM_LOSS]):
        key = _data_identity(configs.get(r))
        if key is not None and math.isfinite(u):
            level.setdefault(key, float(u))
    unigram = [u if math.isfinite(u) else level.get(_data_identity(configs.get(r)) or "", math.nan)
               for r, u in zip(ids, runs[M.UNIGRAM_LOSS])]  # fmt: skip
    runs[M.UNIGRAM_LOSS] = unigram
    vocab = pd.to_numeric(runs[M.VOCAB_SIZE], errors="coerce")
    runs[M.LOG_VOCAB] = runs[M.LOG_VOCAB].where(runs[M.LOG_VOCAB].notna(), np.log(vocab.where(vocab > 0)))
    flags, reasons = [], []
    for r, status, u, recorded, why in zip(ids, runs[M.STATUS], unigram, runs[M.STALLED], runs[M.STALL_REASON]):
        hist = history.get(r)
        if status != M.STATUS_COMPLETED:
            found = None
        elif hist is not None and M.VAL_LOSS in hist.columns and hist[M.VAL_LOSS].notna().any():
            steps, losses = stall.evaluations(hist.index, hist[M.VAL_LOSS])
            found = stall.reason(losses, u, steps)
        else:
            flagged = isinstance(recorded, (bool, np.bool_)) and bool(recorded)
            found = (why if isinstance(why, str) else stall.UNIGRAM) if flagged else None
        flags.append(found is not None)
        reasons.append(found)
    runs[M.STALLED] = pd.Series(flags, index=runs.index, dtype=bool)
    runs[M.STALL_REASON] = reasons


def merge(sets: Sequence[RunSet]) -> RunSet:
    """Runs of several sources in one set; a run id seen before is prefixed with its source's index."""
    records: list[RunRecord] = []
    seen: set[str] = set()
    problems: list[str] = []
    for i, rs in enumerate(sets):
        problems += rs.problems
        for row in rs.runs.to_dict("records"):
            run_id = row["run_id"] if row["run_id"] not in seen else f"{i}:{row['run_id']}"
            seen.add(run_id)
            values = {k: row.get(k) for k in (*SUMMARY_KEYS, *downstream_keys(row))}
            extras = {k: v for k, v in row.items() if _is_extra(k)}
            cfg = rs.configs.get(row["run_id"])
            cfg = None if cfg is None else {k: v for k, v in cfg.items() if v != MISSING_VALUE}
            name, status = str(row[M.RUN_NAME]), row[M.STATUS]
            history = rs.history[row["run_id"]]
            records.append(RunRecord(run_id, row["run_dir"], name, status, values, cfg, history, extras))
    return assemble(records, problems)


def _is_extra(key: str) -> bool:
    return (
        key in (INIT_VAL_LOSS, FIRST_PROBE_STEP)
        or key.startswith(FIRST_PROBE_PREFIX)
        or bool(EXTRAPOLATION_KEY.match(key))
    )


def _fill_missing_keys(configs: dict[str, dict[str, Any]]) -> None:
    """Give every config every key, so a key present in only some runs reads as a difference between them. A
    key of today's config schema that an older run lacks counts as the schema's default (adding a key to the
    schema changes no old run's meaning); any other missing key is MISSING_VALUE."""
    keys = {k for cfg in configs.values() for k in cfg}
    if not any(keys - cfg.keys() for cfg in configs.values()):
        return
    from lm_ablate.checkpoint import schema_defaults

    defaults = {k: _leaf(v) for k, v in schema_defaults().items() if v != "???"}
    for cfg in configs.values():
        for key in keys - cfg.keys():
            # a group that did not exist yet had no choice: choices.<group> null, as for a group left at null
            cfg[key] = None if key.startswith(f"{M.CHOICES}.") else defaults.get(key, MISSING_VALUE)
