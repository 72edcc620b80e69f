"""Exact resume: a run killed (kill -9) or preempted (SIGTERM) at any point and started again continues to the
same curve, bit for bit on CPU, with every step recorded exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lm_ablate import metrics as M
from lm_ablate.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TIMING = (M.TOKENS_PER_SEC, M.STEP_TIME_MS, M.MFU, M.PEAK_MEM_MB)  # measurements of the machine, not the run
STEPS = 240


def command(run_dir: Path, cache_dir: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lm_ablate.train",
        "model=tiny",
        "tracking=none",
        "regularization=dropout",
        f"train.max_steps={STEPS}",
        "train.batch_size=8",
        "train.eval_every=40",
        "train.checkpoint_every=25",
        "train.progress=false",
        "train.threads=1",
        f"data.cache_dir={cache_dir}",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def rows(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / M.METRICS_FILE).read_text().splitlines():
        row = json.loads(line)
        out.append({k: v for k, v in row.items() if k not in TIMING})
    return out


def start(run_dir: Path, cache_dir: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        command(run_dir, cache_dir, *extra), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_rows(proc: subprocess.Popen, run_dir: Path, n: int, timeout: float = 120) -> None:
    path = run_dir / M.METRICS_FILE
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"run ended before {n} rows: {proc.stderr.read()[-2000:]}")
        time.sleep(0.005)
    pytest.fail("timed out waiting for rows")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir) -> list[dict]:
    run_dir = tmp_path_factory.mktemp("reference")
    out = subprocess.run(command(run_dir, cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return rows(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_rows", [3, 37, 118, 230])
def test_kill_9_then_resume_is_bit_identical(tmp_path, cache_dir, reference, kill_after_rows):
    run_dir = tmp_path / "run"
    proc = start(run_dir, cache_dir)
    wait_for_rows(proc, run_dir, kill_after_rows)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(rows(run_dir)) - 1
    assert 0 < killed_at < STEPS
    out = subprocess.run(command(run_dir, cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    resumed = rows(run_dir)
    assert [r[M.STEP] for r in resumed] == list(range(STEPS + 1))  # every step once, none missing
    assert resumed == reference  # losses, grad norms, spikes, val losses: identical floats
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.STATUS] == M.STATUS_COMPLETED and summary[M.STEPS] == STEPS
    assert summary[M.RESUMED_FROM] == ([] if killed_at < 25 else [summary[M.RESUMED_FROM][0]])
    assert len(list_checkpoints(run_dir)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])  # preemption; submitit's time-limit signal
def test_preemption_signal_checkpoints_then_resumes(tmp_path, cache_dir, reference, sig):
    run_dir = tmp_path / "run"
    proc = start(run_dir, cache_dir)
    wait_for_rows(proc, run_dir, 60)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode == -sig  # the signal is passed on after the checkpoint (requeue logic)
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.STATUS] == M.STATUS_PREEMPTED
    stopped = summary[M.STEPS]
    assert int(list_checkpoints(run_dir)[-1].stem.split("_")[1]) == stopped  # checkpoint at the stop step
    out = subprocess.run(command(run_dir, cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert rows(run_dir) == reference
    assert json.loads((run_dir / M.SUMMARY_FILE).read_text())[M.RESUMED_FROM] == [stopped]


def _run(run_dir: Path, cache_dir: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(run_dir, cache_dir, "train.max_steps=30", *extra), cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_resume_guards(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    assert _run(run_dir, cache_dir).returncode == 0
    before = (run_dir / M.METRICS_FILE).read_text()
    # another config into the same run directory
    other = _run(run_dir, cache_dir, "model.d_model=48")
    assert other.returncode == 2
    assert (
        other.stderr.strip().startswith("lm-ablate: error: train.resume=") and "model.d_model: 32 -> 48" in other.stderr
    )
    assert len(other.stderr.strip().splitlines()) == 1
    # a run directory with a record but no checkpoint
    for ckpt in list_checkpoints(run_dir):
        ckpt.rename(ckpt.with_suffix(".bak"))
    fresh = _run(run_dir, cache_dir)
    assert fresh.returncode == 2 and "already holds a finished run" in fresh.stderr
    # a truncated checkpoint
    for bak in (run_dir / "checkpoints").glob("*.bak"):
        data = bak.read_bytes()
        bak.with_suffix(".pt").write_bytes(data[: len(data) // 2])
    broken = _run(run_dir, cache_dir)
    assert broken.returncode == 2 and "unreadable checkpoint" in broken.stderr
    assert len(broken.stderr.strip().splitlines()) == 1
    assert (run_dir / M.METRICS_FILE).read_text() == before  # nothing recorded was lost or changed


def test_resume_from_explicit_checkpoint_into_a_new_dir(tmp_path, cache_dir):
    first = tmp_path / "first"
    assert _run(first, cache_dir).returncode == 0
    ckpt = list_checkpoints(first)[-1]
    longer = _run(tmp_path / "second", cache_dir, "train.max_steps=40", f"train.resume={ckpt}")
    assert longer.returncode == 0, longer.stderr[-2000:]
    summary = json.loads((tmp_path / "second" / M.SUMMARY_FILE).read_text())
    assert summary[M.STEPS] == 40 and summary[M.RESUMED_FROM] == [30]
    assert [r[M.STEP] for r in rows(tmp_path / "second")] == list(range(31, 41))


def test_checkpoints_load_weights_only(tmp_path, cache_dir):
    import torch

    assert _run(tmp_path / "r", cache_dir).returncode == 0
    state = torch.load(list_checkpoints(tmp_path / "r")[-1], weights_only=True)
    assert state["step"] == 30 and "optimizer" in state and "rng" in state
    assert not any(os.fspath(p).endswith(".tmp") for p in (tmp_path / "r" / "checkpoints").iterdir())
