"""Read W&B offline runs (``run-<id>.wandb``) without the W&B service or network.

wandb 0.31 ships no reader for these files. Its Go core (``core/internal/stream/store.go``,
``core/pkg/leveldb/record.go``) writes them as a LevelDB-style log:

* a 7-byte file header ``b":W&B"``, uint16 ``0xBEE1`` (little-endian), uint8 version ``0``. The
  header occupies the first 7 bytes of block 0, so block boundaries fall at file offsets that are
  multiples of 32 KiB;
* 32 KiB blocks of chunks, each with a 7-byte header: uint32 checksum (little-endian), uint16 payload
  length, uint8 type (FULL=1, FIRST=2, MIDDLE=3, LAST=4). The checksum is the plain IEEE CRC-32
  (``zlib.crc32``, unmasked: W&B opens the store with ``CRCAlgoIEEE``, not LevelDB's masked CRC-32C)
  of the type byte followed by the payload;
* chunks never cross a block boundary; when fewer than 7 bytes remain in a block they are zeros;
* each record (one chunk, or FIRST + MIDDLE* + LAST) is a serialized
  ``wandb.proto.wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.parallel import fork_map
from analysis.sources.load import (
    PARALLEL_MIN_RUNS,
    STATUS_CORRUPT,
    WANDB_FILE,
    Keep,
    RunRecord,
    RunSet,
    assemble,
    is_run_dir,
    is_wandb_file,
    is_wandb_run_folder,
    natural_key,
    run_ids,
)
from analysis.sources.wandb_api import WandbRun, history_frame, wandb_record

if TYPE_CHECKING:  # the protobuf module takes ~1 s to import: only when a file is read
    from wandb.proto import wandb_internal_pb2 as pb

__all__ = ["OfflineRun", "find_offline_runs", "find_run_files", "iter_records", "load_offline", "read_history",
           "read_run"]  # fmt: skip

_FILE_HEADER = struct.Struct("<4sHB")
_FILE_HEADER_VALUE = (b":W&B", 0xBEE1, 0)
_CHUNK_HEADER = struct.Struct("<IHB")
_BLOCK_SIZE = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_INTERNAL_KEY = "_wandb"  # SDK telemetry stored in config and summary, not user data


def iter_records(path: str | Path) -> Iterator[pb.Record]:
    """Yield the ``Record`` protobufs of a ``.wandb`` file in write order.

    Raises ``ValueError`` (naming the file and byte offset) on a bad file header, a checksum
    mismatch, a chunk that overflows its block, or out-of-order chunk types. A record cut short by
    the end of the file (a run still being written, or killed mid-write) ends iteration quietly.
    """
    path = Path(path)
    with path.open("rb") as f:
        header = f.read(_FILE_HEADER.size)
        if len(header) < _FILE_HEADER.size or _FILE_HEADER.unpack(header) != _FILE_HEADER_VALUE:
            raise ValueError(f"{path}: not a W&B transaction log (file header {header!r} at offset 0)")

        block = header + f.read(_BLOCK_SIZE - len(header))
        block_offset, pos = 0, len(header)
        parts: list[bytes] = []  # payloads of an unfinished FIRST/MIDDLE... record
        record_offset = 0

        while block:
            while pos + _CHUNK_HEADER.size <= len(block):
                offset = block_offset + pos
                crc, length, kind = _CHUNK_HEADER.unpack_from(block, pos)
                if crc == length == kind == 0 and not parts and not any(block[pos:]):
                    break  # zero-filled block tail (pre-allocated file); the Go reader skips it too
                end = pos + _CHUNK_HEADER.size + length
                if end > len(block):
                    if len(block) < _BLOCK_SIZE and end <= _BLOCK_SIZE:
                        return  # last chunk cut off by end of file
                    raise ValueError(f"{path}: corrupt chunk at offset {offset}: length {length} overflows its block")
                if zlib.crc32(block[pos + _CHUNK_HEADER.size - 1 : end]) != crc:
                    raise ValueError(f"{path}: checksum mismatch in chunk at offset {offset}")
                data = block[pos + _CHUNK_HEADER.size : end]
                pos = end

                if kind in (_FULL, _FIRST):
                    if parts:
                        raise ValueError(
                            f"{path}: record at offset {record_offset} is unterminated "
                            f"(new record starts at offset {offset})"
                        )
                    record_offset = offset
                    if kind == _FIRST:
                        parts.append(data)
                        continue
                elif kind in (_MIDDLE, _LAST):
                    if not parts:
                        raise ValueError(f"{path}: continuation chunk without first chunk at offset {offset}")
                    parts.append(data)
                    if kind == _MIDDLE:
                        continue
                    data, parts = b"".join(parts), []
                else:
                    raise ValueError(f"{path}: unknown chunk type {kind} at offset {offset}")
                yield _parse_record(data, path, record_offset)

            if len(block) < _BLOCK_SIZE:
                return  # final, short block: any bytes left are a truncated chunk header
            if any(block[pos:]):
                raise ValueError(f"{path}: non-zero block padding at offset {block_offset + pos}")
            block_offset += _BLOCK_SIZE
            block, pos = f.read(_BLOCK_SIZE), 0


def _parse_record(data: bytes, path: Path, offset: int) -> pb.Record:
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    record = pb.Record()
    try:
        record.ParseFromString(data)
    except DecodeError as e:
        raise ValueError(f"{path}: undecodable record at offset {offset}: {e}") from e
    return record


def _item_key(item: pb.HistoryItem | pb.ConfigItem | pb.SummaryItem) -> list[str]:
    return [item.key] if item.key else list(item.nested_key)


def _history_value(item: pb.HistoryItem) -> Any:
    if item.value_json:
        return json.loads(item.value_json)
    # Typed form (``x_history_value_encoding="json,typed"``); 0.31 always writes value_json as well.
    kind = item.WhichOneof("value")
    if kind == "none":
        return None
    if kind == "json":
        return json.loads(item.json)
    if kind is None:
        raise ValueError(f"history item {_item_key(item)} has no value")
    return getattr(item, kind)


def _history_row(history: pb.HistoryRecord, sep: str) -> dict[str, Any]:
    row = {sep.join(_item_key(item)): _history_value(item) for item in history.item}
    row.setdefault("_step", history.step.num)
    return row


def _apply(
    target: dict[str, Any],
    updates: Iterable[pb.ConfigItem | pb.SummaryItem],
    removes: Iterable[pb.ConfigItem | pb.SummaryItem] = (),
) -> None:
    """Apply W&B config/summary items (``key`` or ``nested_key`` path -> ``value_json``) in place."""
    for item in updates:
        *parents, leaf = _item_key(item)
        node = target
        for name in parents:
            if not isinstance(node.get(name), dict):
                node[name] = {}
            node = node[name]
        node[leaf] = json.loads(item.value_json)
    for item in removes:
        *parents, leaf = _item_key(item)
        node: Any = target
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)


def read_history(path: str | Path, sep: str = "/") -> list[dict[str, Any]]:
    """One dict per history record: metric name -> decoded value, including ``_step``,
    ``_timestamp`` and ``_runtime``. Keys of nested logged dicts are joined with ``sep``
    (``wandb.log({"a": {"b": 1}})`` -> ``"a/b"``; W&B's own API uses ``"."``)."""
    return [_history_row(r.history, sep) for r in iter_records(path) if r.HasField("history")]


def _records(path: str | Path, problems: list[str] | None) -> Iterator[pb.Record]:
    """:func:`iter_records`; with ``problems``, a damaged or unreadable file ends the records there and adds
    its one-line reason to ``problems`` instead of raising."""
    if problems is None:
        yield from iter_records(path)
        return
    try:
        yield from iter_records(path)
    except (ValueError, OSError) as exc:
        problems.append(" ".join(str(exc).split()))


def read_run(path: str | Path, sep: str = "/", problems: list[str] | None = None) -> dict[str, Any]:
    """Metadata, config, summary and history of one offline run.

    Returns ``{"id", "name", "project", "group", "job_type", "tags", "exit_code", "config", "summary",
    "history"}``. ``config`` is the plain nested dict the user passed (0.31 stores each top-level key's value
    directly as JSON, with no ``{"value", "desc"}`` wrapper); ``summary`` is the final nested
    summary. SDK-internal ``_wandb`` entries are dropped from both. ``exit_code`` is the one ``wandb.finish``
    recorded, None when the run did not finish (still running, or killed). A damaged file raises
    ``ValueError``, or with a ``problems`` list, gives what was read before the damage and says why there.
    """
    meta: dict[str, Any] = {"id": "", "name": "", "project": "", "group": "", "job_type": "", "tags": [],
                            "exit_code": None}  # fmt: skip
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for record in _records(path, problems):
        kind = record.WhichOneof("record_type")
        if kind == "exit":
            meta["exit_code"] = record.exit.exit_code
        elif kind == "history":
            history.append(_history_row(record.history, sep))
        elif kind == "summary":
            _apply(summary, record.summary.update, record.summary.remove)
        elif kind == "config":
            _apply(config, record.config.update, record.config.remove)
        elif kind == "run":  # the first holds init args; later ones (name/tag edits) resend everything
            run = record.run
            fields = {
                "id": run.run_id,
                "name": run.display_name,
                "project": run.project,
                "group": run.run_group,
                "job_type": run.job_type,
            }
            meta.update({k: v for k, v in fields.items() if v})
            meta["tags"] = list(run.tags)
            _apply(config, run.config.update, run.config.remove)
            _apply(summary, run.summary.update, run.summary.remove)
    config.pop(_INTERNAL_KEY, None)
    summary.pop(_INTERNAL_KEY, None)
    return {**meta, "config": config, "summary": summary, "history": history}


def find_run_files(root: str | Path) -> list[Path]:
    """All ``run-*.wandb`` files under ``root`` (recursively), sorted."""
    return sorted(p for p in Path(root).rglob("run-*.wandb") if p.is_file())


# --- runs for the report -------------------------------------------------------------------------------
# not entered: W&B's link to its newest run folder (a real copy once copied without links), Python's cache
NOT_RUNS = ("latest-run", "__pycache__")
RUN_FOLDER = re.compile(r"(?:offline-)?run-(\d{8}_\d{6})-(.+)")  # W&B's run folder: ...run-<written at>-<id>
STATE_FINISHED, STATE_FAILED = "finished", "failed"  # W&B's run states (wandb_api.STATE_TO_STATUS)


@dataclass
class OfflineRun:
    """One W&B run found on disk: the folder it is named by, and its run files in the order written (a run
    resumed under the same W&B id has one file per segment, each in a run folder of its own)."""

    location: Path
    files: list[Path] = field(default_factory=list)


def find_offline_runs(paths: Iterable[str | Path]) -> list[OfflineRun]:
    """The W&B runs at or below ``paths`` that no run record stands for: ``run-<id>.wandb`` files (given, or in
    W&B run folders found by walking down), outside every run directory found on the way (a run directory's
    ``wandb/`` holds the same run as its record, which is read instead). Hidden folders and W&B's
    ``latest-run`` (a second path to a run folder) are not entered.

    Files of one W&B id in sibling run folders are one run. It is named by the folder that holds its
    ``wandb/`` (the lm-ablate run directory) when that ``wandb/`` holds no other run, else by its run folder.
    """
    found: dict[Path, None] = {}
    for raw in paths:
        root = Path(raw).expanduser()
        if is_wandb_file(root):
            found.setdefault(root.resolve(), None)
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            if is_wandb_run_folder(filenames):
                found.update(dict.fromkeys((here / f).resolve() for f in sorted(filenames) if WANDB_FILE.fullmatch(f)))
                dirnames[:] = []
            elif is_run_dir(here, filenames):
                dirnames[:] = []
            else:
                dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in NOT_RUNS)
    groups: dict[tuple[Path, str], list[Path]] = {}
    for path in found:
        groups.setdefault((path.parent.parent, path.stem.removeprefix("run-")), []).append(path)
    runs = []
    for (home, _), files in groups.items():
        files.sort(key=_written_order)
        own = home.name == "wandb" and len(_run_ids_in(home)) == 1
        runs.append(OfflineRun(home.parent if own else files[-1].parent, files))
    return sorted(runs, key=lambda r: natural_key(r.location))


def _written_order(path: Path) -> tuple[str, str]:
    folder = RUN_FOLDER.fullmatch(path.parent.name)
    return (folder.group(1) if folder else "", str(path))


def _run_ids_in(wandb_dir: Path) -> set[str]:
    """The W&B ids of the run folders in ``wandb_dir`` (on disk, whichever were asked for)."""
    try:
        names = os.listdir(wandb_dir)
    except OSError:
        return set()
    return {m.group(2) for m in map(RUN_FOLDER.fullmatch, names) if m}


def load_offline(
    runs: Sequence[OfflineRun], keep: Keep | None = None, workers: int = 1, ids: Sequence[str] | None = None
) -> RunSet:
    """The runs of ``runs`` (:func:`find_offline_runs`) as a :class:`RunSet`, read as a W&B project's runs
    are (analysis.sources.wandb_api), so a run logged by our tracker gives what its run record gives. ``ids``:
    the run ids (default: each location relative to their common folder, as for run directories)."""
    jobs = list(zip(runs, ids or run_ids([r.location for r in runs])))
    records = fork_map(
        lambda job: offline_record(job[0], job[1], keep),
        jobs,
        workers=workers if len(jobs) >= PARALLEL_MIN_RUNS else 1,
    )
    return assemble(records)


def offline_record(run: OfflineRun, run_id: str, keep: Keep | None = None) -> RunRecord:
    """One run's :class:`RunRecord` from its run files (never raises for a damaged file: what was read before
    the damage is used, and the run is ``corrupt``). The status comes from the summary and, where it has
    none, from the exit ``wandb.finish`` recorded: 0 finished, else failed, none incomplete."""
    damage: list[str] = []
    meta: dict[str, Any] = {}
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for path in run.files:  # a resumed segment's values replace the earlier ones; a re-logged step keeps the last
        part = read_run(path, problems=damage)
        meta.update({k: v for k, v in part.items() if k not in ("config", "summary", "history") and v})
        meta["exit_code"] = part["exit_code"]
        config.update(part["config"])
        summary.update(part["summary"])
        rows += part["history"]
    code = meta["exit_code"]
    state = "" if code is None else STATE_FINISHED if code == 0 else STATE_FAILED
    name = meta.get("name") or meta.get("id") or run.location.name
    wandb_run = WandbRun(run_id, str(run.location), name, meta.get("group", ""), state, config, summary,
                         history_frame(rows))  # fmt: skip
    problems = [f"{run_id}: W&B run file {p}; the records before it are used; status {STATUS_CORRUPT}" for p in damage]
    record = wandb_record(wandb_run, keep, problems)
    if damage:
        record.status = STATUS_CORRUPT
    return record
