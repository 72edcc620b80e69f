"""Round-trip a real offline W&B run through analysis.sources.wandb_offline (no network, nothing in $HOME)."""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wandb
from wandb.proto import wandb_internal_pb2 as pb

from analysis.sources.wandb_offline import find_run_files, iter_records, read_history, read_run

STEPS = 50
CONFIG = {"norm": {"name": "rmsnorm", "placement": "pre"}, "optim": {"lr": 0.003}}
BLOB = "x" * 100_000  # a >32 KiB summary value, so one record spans FIRST/MIDDLE/LAST chunks
HOME_WANDB_PATHS = [Path.home() / p for p in (".config/wandb", ".cache/wandb", ".local/share/wandb", ".netrc")]


def _metrics(step: int) -> dict[str, float]:
    return {
        "train/loss": 10.0 * math.exp(-step / 7) + 1 / 3,
        "optim/grad_norm": step * 0.1,
        "perf/tokens_per_sec": 1e5 + math.pi * step,
    }


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wandb")
    home_before = {p: p.exists() for p in HOME_WANDB_PATHS}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            (root / var).mkdir()
            mp.setenv(var, str(root / var))
        run = wandb.init(
            project="p",
            group="g",
            name="n",
            tags=["norm=rmsnorm"],
            config=CONFIG,
            settings=wandb.Settings(console="off", x_disable_stats=True, disable_git=True, save_code=False),
        )
        for step in range(STEPS):
            run.log(_metrics(step), step=step)
        run.summary["blob"] = BLOB
        run.finish()
        wandb.teardown()  # stop the service so these env vars do not outlive the fixture
    for p, existed in home_before.items():
        assert p.exists() == existed, f"W&B wrote to {p}"
    (path,) = find_run_files(root)
    assert path.is_relative_to(root / "WANDB_DIR")
    return path


def _chunks(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(offset, payload length, type) of every chunk, independently of the module under test."""
    pos = 7
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        yield pos, length, kind
        pos += 7 + length


def _sets_blob(record: Any) -> bool:
    return record.HasField("summary") and any("blob" in (u.key, *u.nested_key) for u in record.summary.update)


def test_read_run_round_trip(run_file: Path) -> None:
    run = read_run(run_file)
    assert (run["name"], run["group"], run["tags"], run["project"]) == ("n", "g", ["norm=rmsnorm"], "p")
    assert run["id"] and run_file.name == f"run-{run['id']}.wandb"
    assert run["config"] == CONFIG
    logged = [{**_metrics(step), "_step": step} for step in range(STEPS)]
    assert [{k: row[k] for k in logged[0]} for row in run["history"]] == logged  # exact floats
    assert all({"_timestamp", "_runtime"} <= row.keys() for row in run["history"])
    assert run["history"] == read_history(run_file)
    assert {k: run["summary"][k] for k in logged[-1]} == logged[-1]
    assert run["summary"]["blob"] == BLOB
    assert {kind for _, _, kind in _chunks(run_file.read_bytes())} == {1, 2, 3, 4}


@pytest.mark.parametrize("which", [0, 60])
def test_corrupt_payload_byte(run_file: Path, tmp_path: Path, which: int) -> None:
    data = bytearray(run_file.read_bytes())
    offset, length, _ = [c for c in _chunks(bytes(data)) if c[1] >= 2][which]
    data[offset + 7 + length // 2] ^= 0x40
    bad = tmp_path / run_file.name
    bad.write_bytes(data)
    with pytest.raises(ValueError, match=rf"{bad.name}: checksum mismatch in chunk at offset {offset}\b"):
        list(iter_records(bad))


def test_bad_file_header(run_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b":W&B\xe1\xbe\x01" + run_file.read_bytes()[7:])
    with pytest.raises(ValueError, match="offset 0"):
        list(iter_records(bad))


@pytest.mark.parametrize("cut", ["last_payload", "last_header", "middle_chunk"])
def test_truncated_tail_is_tolerated(run_file: Path, tmp_path: Path, cut: str) -> None:
    data = run_file.read_bytes()
    full = list(iter_records(run_file))
    chunks = list(_chunks(data))
    if cut == "middle_chunk":  # inside the multi-chunk summary record: everything before it survives
        offset, length, _ = next(c for c in chunks if c[2] == 3)
        expected = full[: next(i for i, r in enumerate(full) if _sets_blob(r))]
    else:
        offset, length, kind = chunks[-1]
        assert kind == 1
        expected = full[:-1]
    end = offset + 7 + length // 2 if cut != "last_header" else offset + 3
    short = tmp_path / run_file.name
    short.write_bytes(data[:end])
    assert list(iter_records(short)) == expected


def test_typed_history_values(tmp_path: Path) -> None:
    """Items written with x_history_value_encoding="typed" carry a oneof instead of value_json."""
    record = pb.Record()
    items = record.history.item
    items.add(key="f").number = 0.1
    items.add(key="i").integer = 2**53 + 1
    items.add(nested_key=["a", "b"]).text = "t"
    items.add(key="j").json = "[1, 2]"
    items.add(key="v", value_json="NaN")
    record.history.step.num = 7
    payload = record.SerializeToString()
    data = b":W&B\xe1\xbe\x00" + struct.pack("<IHB", zlib.crc32(b"\x01" + payload), len(payload), 1) + payload
    path = tmp_path / "run-typed.wandb"
    path.write_bytes(data)
    (row,) = read_history(path)
    assert math.isnan(row.pop("v"))
    assert row == {"f": 0.1, "i": 2**53 + 1, "a/b": "t", "j": [1, 2], "_step": 7}
