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
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2 as pb

__all__ = ["find_run_files", "iter_records", "read_history", "read_run"]

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


def read_run(path: str | Path, sep: str = "/") -> dict[str, Any]:
    """Metadata, config, summary and history of one offline run.

    Returns ``{"id", "name", "project", "group", "job_type", "tags", "config", "summary", "history"}``.
    ``config`` is the plain nested dict the user passed (0.31 stores each top-level key's value
    directly as JSON, with no ``{"value", "desc"}`` wrapper); ``summary`` is the final nested
    summary. SDK-internal ``_wandb`` entries are dropped from both.
    """
    meta: dict[str, Any] = {"id": "", "name": "", "project": "", "group": "", "job_type": "", "tags": []}
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for record in iter_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
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
