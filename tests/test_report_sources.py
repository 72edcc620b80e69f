"""Where a report's runs come from (issue 46, items 8 and 9): W&B runs on disk given as paths to
``python -m analysis.report`` (a run's wandb/ folder, offline-run-* folders, run-*.wandb files, folders holding
them), and a run directory without metrics.jsonl named in Problems."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import pandas as pd
import pytest
from wandb.proto import wandb_internal_pb2 as pb

from analysis.present.document import Bullets, Para
from analysis.present.sections.runs import problem_blocks
from analysis.report import main as report_main
from analysis.sources.combined import load_sources
from analysis.sources.load import AnalysisError, load_runs
from analysis.sources.wandb_offline import find_offline_runs
from lm_ablate import metrics as M

CONFIG = {"norm": {"name": "rmsnorm", "placement": "pre"}, "optim": {"lr": 0.003}, "seed": 0}


# --- W&B run files written record by record (the format: analysis/sources/wandb_offline.py) -----------------
def write_log(path: Path, records: list[pb.Record]) -> Path:
    """A W&B transaction log of ``records``, one FULL chunk each (small files: one 32 KiB block)."""
    data = b":W&B\xe1\xbe\x00"
    for record in records:
        payload = record.SerializeToString()
        data += struct.pack("<IHB", zlib.crc32(b"\x01" + payload), len(payload), 1) + payload
    assert len(data) < 32 * 1024
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def run_record(run_id: str, name: str, config: dict | None) -> pb.Record:
    record = pb.Record()
    record.run.run_id, record.run.display_name, record.run.run_group = run_id, name, "g"
    for key, value in (config or {}).items():
        record.run.config.update.add(key=key, value_json=json.dumps(value))
    return record


def history(step: int, **values: float) -> pb.Record:
    record = pb.Record()
    record.history.step.num = step
    for key, value in values.items():
        record.history.item.add(key=key.replace("__", "/"), value_json=json.dumps(value))
    return record


def summary(**values: object) -> pb.Record:
    record = pb.Record()
    for key, value in values.items():
        record.summary.update.add(key=key, value_json=json.dumps(value))
    return record


def exit_record(code: int) -> pb.Record:
    record = pb.Record()
    record.exit.exit_code = code
    return record


def segment(root: Path, folder: str, records: list[pb.Record]) -> Path:
    run_id = folder.rsplit("-", 1)[1]
    return write_log(root / folder / f"run-{run_id}.wandb", records)


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """sweep/0: killed (no exit record); sweep/1: resumed, two segments whose folder names sort against the
    order written (``offline-run-`` < ``run-``); loose/wandb: two runs of one W&B folder (no lm-ablate run dir);
    recorded/: a run directory whose wandb/ holds the same run as its record."""
    wb0 = tmp_path / "sweep" / "0" / "wandb"
    segment(wb0, "offline-run-20260101_000000-aaa", [
        run_record("aaa", "arm-a", CONFIG), history(0, val__loss=5.5), history(1, train__loss=5.0),
        summary(status=M.STATUS_RUNNING, run_name="arm-a"),
    ])  # fmt: skip
    wb1 = tmp_path / "sweep" / "1" / "wandb"
    segment(wb1, "run-20260101_000000-bbb", [  # first written, though its name sorts last
        run_record("bbb", "arm-b", CONFIG), *(history(s, train__loss=10.0 + s) for s in range(4)),
        summary(status=M.STATUS_RUNNING, run_name="arm-b"),
    ])  # fmt: skip
    segment(wb1, "offline-run-20260101_010000-bbb", [  # resumed from step 1: re-logs steps 2 and 3
        run_record("bbb", "arm-b", CONFIG), *(history(s, train__loss=20.0 + s) for s in range(2, 5)),
        summary(status=M.STATUS_COMPLETED, run_name="arm-b", final_val_loss=3.25), exit_record(0),
    ])  # fmt: skip
    loose = tmp_path / "loose" / "wandb"
    segment(loose, "offline-run-20260102_000000-ccc", [
        run_record("ccc", "other-c", {"x": 1}), history(0, loss=1.0), exit_record(1),
    ])  # fmt: skip
    segment(loose, "offline-run-20260102_000000-ddd", [
        run_record("ddd", "other-d", {"x": 2}), history(0, loss=2.0), history(7, loss=1.5), exit_record(0),
    ])  # fmt: skip
    shutil.copytree(loose / "offline-run-20260102_000000-ddd", loose / "latest-run")  # as `cp -r` leaves W&B's link
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / M.CONFIG_FILE).write_text("norm: {name: layernorm}\n")
    (recorded / M.METRICS_FILE).write_text(json.dumps({"step": 0, "val/loss": 4.0}) + "\n")
    (recorded / M.SUMMARY_FILE).write_text(json.dumps({"status": "completed", "final_val_loss": 4.0}))
    segment(recorded / "wandb", "offline-run-20260103_000000-eee", [run_record("eee", "rec", {"y": 1})])
    return tmp_path


def test_wandb_runs_on_disk_are_found_named_merged_and_given_a_status(layout: Path, tmp_path: Path) -> None:
    rs = load_sources([layout], tmp_path / "out")
    runs = rs.runs.set_index("run_id")
    loose = "loose/wandb/offline-run-20260102_000000-"
    assert sorted(runs.index) == [f"{loose}ccc", f"{loose}ddd", "recorded", "sweep/0", "sweep/1"]
    assert runs.loc["recorded", M.FINAL_VAL_LOSS] == 4.0  # the run record, not its wandb/ (config y: 1)
    assert runs.loc["recorded", "run_dir"] == str(layout / "recorded") and "y" not in runs.columns
    # the resumed run: both segments, in the order written; a re-logged step keeps the later row
    assert rs.history["sweep/1"][M.TRAIN_LOSS].to_dict() == {0: 10.0, 1: 11.0, 2: 22.0, 3: 23.0, 4: 24.0}
    assert runs.loc["sweep/1", M.STATUS] == M.STATUS_COMPLETED and runs.loc["sweep/1", M.FINAL_VAL_LOSS] == 3.25
    assert runs.loc["sweep/1", "run_dir"] == str(layout / "sweep" / "1")
    assert runs.loc["sweep/0", M.STATUS] == M.STATUS_RUNNING  # no exit record: as its summary says
    assert runs.loc["sweep/1", "norm.name"] == "rmsnorm" and runs.loc["sweep/1", M.RUN_NAME] == "arm-b"
    # another writer's runs (no status of ours): the exit code decides; values from the history
    assert runs.loc[f"{loose}ccc", M.STATUS] == M.STATUS_FAILED
    assert runs.loc[f"{loose}ddd", M.STATUS] == M.STATUS_COMPLETED and runs.loc[f"{loose}ddd", M.STEPS] == 7
    assert rs.problems == []
    found = find_offline_runs([layout / "loose"])
    assert [(r.location.name, [f.parent.name for f in r.files]) for r in found] == [
        (f"offline-run-20260102_000000-{i}", [f"offline-run-20260102_000000-{i}"]) for i in ("ccc", "ddd")
    ]  # latest-run is no second segment
    # the same runs from a wandb/ folder, an offline-run folder or a run file given directly
    one = load_sources([layout / "sweep" / "1" / "wandb"], tmp_path / "out")
    assert one.runs["run_id"].tolist() == ["1"] and one.history["1"].equals(rs.history["sweep/1"])
    folder = layout / "loose" / "wandb" / "offline-run-20260102_000000-ddd"
    for given in (folder, folder / "run-ddd.wandb"):
        alone = load_sources([given], tmp_path / "out")
        assert alone.runs["run_id"].tolist() == [folder.name] and alone.runs[M.STEPS].tolist() == [7]


def test_damaged_wandb_file_keeps_what_was_read_and_is_corrupt(layout: Path, tmp_path: Path) -> None:
    path = layout / "loose" / "wandb" / "offline-run-20260102_000000-ddd" / "run-ddd.wandb"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # inside the exit record's payload: checksum mismatch there
    path.write_bytes(bytes(data))
    rs = load_sources([layout / "loose"], tmp_path / "out")
    runs = rs.runs.set_index("run_id")
    assert runs.loc["offline-run-20260102_000000-ddd", M.STATUS] == "corrupt"
    assert rs.history["offline-run-20260102_000000-ddd"]["loss"].to_dict() == {0: 2.0, 7: 1.5}
    (line,) = rs.problems
    assert line.startswith(f"offline-run-20260102_000000-ddd: W&B run file {path}: checksum mismatch in chunk")
    assert line.endswith("; status corrupt")


def test_paths_without_runs_and_misplaced_offline_flag_are_one_line(layout: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match=r"^no runs found under: .*empty \(no run record, no W&B run file"):
        load_sources([tmp_path / "empty"], tmp_path / "out")
    not_a_run = tmp_path / "notes.wandb"
    not_a_run.write_text("x")
    with pytest.raises(AnalysisError, match=r"notes\.wandb: not a directory; give run directories"):
        load_sources([not_a_run], tmp_path / "out")
    with pytest.raises(AnalysisError, match=r"^--group and --offline apply to --wandb.*give their folders as paths"):
        load_sources([layout / "loose"], tmp_path / "out", offline=True)


# --- issue 46.9: a run without metrics.jsonl ----------------------------------------------------------------
def test_run_without_metrics_is_named_in_problems(tmp_path: Path) -> None:
    for name in ("full", "lost", "empty"):
        run = tmp_path / "sweep" / name
        run.mkdir(parents=True)
        (run / M.CONFIG_FILE).write_text("norm: {name: rmsnorm}\n")
        (run / M.SUMMARY_FILE).write_text(json.dumps({"status": "completed", "final_val_loss": 3.0}))
    rows = [{"step": 0, "val/loss": 5.5}, {"step": 10, "val/loss": 3.0}]
    (tmp_path / "sweep" / "full" / M.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "sweep" / "empty" / M.METRICS_FILE).write_text("")
    segment(tmp_path / "sweep" / "lost" / "wandb", "offline-run-20260101_000000-lll", [run_record("lll", "l", {})])
    rs = load_runs([tmp_path / "sweep"])
    assert rs.runs.set_index("run_id")["init_val_loss"].to_dict() == pytest.approx(
        {"full": 5.5, "lost": float("nan"), "empty": float("nan")}, nan_ok=True
    )
    wandb_dir = tmp_path / "sweep" / "lost" / "wandb"
    assert rs.problems == [
        "empty: metrics.jsonl is empty: no curves for this run, and no value read from the history "
        "(init_val_loss, first-probe gradients, extrapolation losses)",
        "lost: no metrics.jsonl: no curves for this run, and no value read from the history (init_val_loss, "
        f"first-probe gradients, extrapolation losses); its W&B run holds them: python -m analysis.report "
        f"{wandb_dir} --out DIR",
    ]
    blocks = problem_blocks(rs)
    assert not any(isinstance(b, Para) and "every run record was readable" in b.text for b in blocks)
    assert [b.items for b in blocks if isinstance(b, Bullets)] == [rs.problems]


# --- end to end: an offline run wandb itself wrote, reported from its wandb/ folder alone --------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, cache_dir: str) -> Path:
    """One tiny training run with tracking=wandb, WANDB_MODE=offline: its run directory."""
    import wandb

    from lm_ablate.config import compose
    from lm_ablate.train import train

    root = tmp_path_factory.mktemp("wandb_report")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        cfg = compose(["debug=smoke", "train.eval_every=10", "train.threads=1", f"data.cache_dir={cache_dir}",
                       "tracking=wandb", "norm=rmsnorm", "study=wb_report"])  # fmt: skip
        train(cfg, root / "run")
        wandb.teardown()  # finish() returns before wandb-core has flushed the offline file; teardown waits for it
    return root / "run"


def report(*args: str) -> None:
    assert report_main([*args, "--workers", "1"]) == 0


@pytest.mark.slow
def test_report_from_a_wandb_offline_folder_equals_the_run_records(trained: Path, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "run"
    shutil.copytree(trained / "wandb", copy / "wandb")  # only the W&B folder: no metrics.jsonl to fall back on
    assert (copy / "wandb" / "latest-run").is_dir()  # W&B's link, copied as a second folder: not a second run
    assert not [p for p in copy.rglob("*") if p.name in (M.METRICS_FILE, M.SUMMARY_FILE, M.CONFIG_FILE)]
    report(str(trained), "--out", str(tmp_path / "local"))
    report(str(copy / "wandb"), "--out", str(tmp_path / "wandb"))
    local, offline = (pd.read_csv(tmp_path / d / "runs.csv") for d in ("local", "wandb"))
    assert offline["run_dir"].tolist() == [str(copy)]
    pd.testing.assert_frame_equal(offline.drop(columns="run_dir"), local.drop(columns="run_dir"))
    assert local.loc[0, M.STATUS] == M.STATUS_COMPLETED and local.loc[0, "init_val_loss"] > 0
    assert local.loc[0, M.CHOICES] == offline.loc[0, M.CHOICES] and "rmsnorm" in local.loc[0, M.CHOICES]
    for table in ("comparisons.csv",):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "wandb" / table), pd.read_csv(tmp_path / "local" / table))
    # every metric of every step, as metrics.jsonl holds it
    want = load_sources([trained], tmp_path / "o").history["run"]
    got = load_sources([copy / "wandb"], tmp_path / "o").history["run"]
    assert len(want) == 21 and want.shape[1] > 10  # steps 0..20; loss, evaluation, probes, throughput
    pd.testing.assert_frame_equal(got[sorted(got.columns)], want[sorted(want.columns)], check_exact=True)
    # the run file itself, given directly
    (wandb_file,) = copy.glob("wandb/offline-run-*/run-*.wandb")
    direct = load_sources([wandb_file], tmp_path / "o")
    assert direct.runs[M.FINAL_VAL_LOSS].tolist() == local[M.FINAL_VAL_LOSS].tolist()
