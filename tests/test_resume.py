"""Exact resume: a run killed (kill -9) or preempted (SIGTERM) at any point and started again continues to the
same curve, bit for bit on CPU, with every step recorded exactly once."""

from __future__ import annotations

import contextlib
import json
import math
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
        row = M.from_json(json.loads(line))
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


def newest_checkpoint_step(run_dir: Path) -> int | None:
    """The step a resume must start from: the newest complete checkpoint on disk (None: there is none)."""
    found = list_checkpoints(run_dir)
    return int(found[-1].stem.split("_")[1]) if found else None


def kill_9_then_resume(run_dir: Path, cache_dir: str, kill_after_rows: int, *extra: str) -> tuple[int, int | None]:
    """Start a run, SIGKILL it once ``kill_after_rows`` rows are logged, run the same command again. Returns the
    last step logged before the kill and the step of the newest checkpoint on disk at that moment."""
    proc = start(run_dir, cache_dir, *extra)
    wait_for_rows(proc, run_dir, kill_after_rows)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = rows(run_dir)[-1][M.STEP]
    newest = newest_checkpoint_step(run_dir)
    assert newest is None or 0 < newest <= killed_at
    out = subprocess.run(command(run_dir, cache_dir, *extra), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return killed_at, newest


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_rows", [3, 37, 118, 230])
def test_kill_9_then_resume_is_bit_identical(tmp_path, cache_dir, reference, kill_after_rows):
    run_dir = tmp_path / "run"
    killed_at, newest = kill_9_then_resume(run_dir, cache_dir, kill_after_rows)
    assert 0 < killed_at < STEPS
    resumed = rows(run_dir)
    assert [r[M.STEP] for r in resumed] == list(range(STEPS + 1))  # every step once, none missing
    assert resumed == reference  # losses, grad norms, spikes, val losses: identical floats
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.STATUS] == M.STATUS_COMPLETED and summary[M.STEPS] == STEPS
    # resumed from the newest checkpoint on disk at the kill (written every 25 steps), or started over without one
    on_schedule = {killed_at // 25 * 25 or None}
    if killed_at % 25 == 0:  # killed between logging the step and writing its checkpoint
        on_schedule.add(killed_at - 25 or None)
    assert newest in on_schedule
    assert summary[M.RESUMED_FROM] == ([] if newest is None else [newest])
    assert len(list_checkpoints(run_dir)) == 1


def _spike_flags(values: list[float], window: int, k: float) -> list[bool]:
    """The detector's rule written out: x_t > mean + k * std (population std) of the previous ``window``
    values, only once the window is full; every value enters the window."""
    flags = []
    for t, x in enumerate(values):
        prev = values[max(0, t - window) : t]
        if len(prev) < window:
            flags.append(False)
            continue
        mean = sum(prev) / window
        std = math.sqrt(sum((v - mean) ** 2 for v in prev) / window)
        flags.append(x > mean + k * std)
    return flags


SPIKY = ("train.max_steps=80", "train.spike.window=5", "train.spike.k=0.5")  # spikes in both signals by step 50


@pytest.mark.slow
def test_kill_9_then_resume_restores_the_spike_detectors(tmp_path, cache_dir):
    """A run whose detectors have counted loss and grad-norm spikes (and hold a full window) before the kill:
    the resumed run flags the same steps and keeps counting from the same totals."""
    ref_dir = tmp_path / "reference"
    out = subprocess.run(command(ref_dir, cache_dir, *SPIKY), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    reference = rows(ref_dir)
    train_rows = reference[1:]  # row 0 is the evaluation at initialization
    assert [r[M.STEP] for r in train_rows] == list(range(1, 81))
    # the flags follow the written-out rule (so a detector with another std or threshold fails here)
    for value, flag in ((M.TRAIN_LOSS, M.SPIKE_LOSS), (M.GRAD_NORM, M.SPIKE_GRAD_NORM)):
        expected = _spike_flags([r[value] for r in train_rows], window=5, k=0.5)
        assert [bool(r[flag]) for r in train_rows] == expected, flag

    run_dir = tmp_path / "run"
    killed_at, newest = kill_9_then_resume(run_dir, cache_dir, 66, *SPIKY)
    assert newest in (50, 75) and killed_at >= newest
    at_checkpoint = reference[newest]
    assert at_checkpoint[M.SPIKE_LOSS_COUNT] > 0 and at_checkpoint[M.SPIKE_GRAD_NORM_COUNT] > 0
    after = [r for r in reference if r[M.STEP] > newest]
    assert any(r[M.SPIKE_LOSS] or r[M.SPIKE_GRAD_NORM] for r in after)  # flags after the resume are compared too
    resumed = rows(run_dir)
    keys = (M.SPIKE_LOSS, M.SPIKE_LOSS_COUNT, M.SPIKE_GRAD_NORM, M.SPIKE_GRAD_NORM_COUNT)
    assert [[r.get(k) for k in keys] for r in resumed] == [[r.get(k) for k in keys] for r in reference]
    assert resumed == reference
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.RESUMED_FROM] == [newest]
    assert summary[M.LOSS_SPIKES] == reference[-1][M.SPIKE_LOSS_COUNT]
    assert summary[M.GRAD_NORM_SPIKES] == reference[-1][M.SPIKE_GRAD_NORM_COUNT]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])  # preemption; submitit's time-limit signal
def test_preemption_signal_checkpoints_then_resumes(tmp_path, cache_dir, reference, sig):
    run_dir = tmp_path / "run"
    proc = start(run_dir, cache_dir)
    wait_for_rows(proc, run_dir, 60)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -sig  # the signal is passed on after the checkpoint (requeue logic)
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.STATUS] == M.STATUS_PREEMPTED
    stopped = summary[M.STEPS]
    # one line says so, as for Ctrl-C (issue 21.12: it used to exit 143 silently)
    said = [line for line in err.splitlines() if line.startswith("lm-ablate: ")]
    assert said == [f"lm-ablate: preempted by {sig.name} at step {stopped}: checkpoint written to {run_dir} "
                    "(the same command, or the requeued job, resumes it)"], err  # fmt: skip
    assert int(list_checkpoints(run_dir)[-1].stem.split("_")[1]) == stopped  # checkpoint at the stop step
    out = subprocess.run(command(run_dir, cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert rows(run_dir) == reference
    assert json.loads((run_dir / M.SUMMARY_FILE).read_text())[M.RESUMED_FROM] == [stopped]


def _run(run_dir: Path, cache_dir: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(run_dir, cache_dir, "train.max_steps=30", *extra), cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory, byte for byte (what "changes nothing" is checked against)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def one_error_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith("lm-ablate: error: ")
    return lines[0]


def set_status(run_dir: Path, status: str) -> None:
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    (run_dir / M.SUMMARY_FILE).write_text(json.dumps({**summary, M.STATUS: status}))


@pytest.mark.parametrize(
    "budget", ["train.max_steps=30", "train.max_tokens=7000", "train.max_time_s=0.05"], ids=["steps", "tokens", "time"]
)
def test_a_finished_run_is_never_changed(tmp_path, cache_dir, budget):
    """The same command again (a re-launched sweep, a SLURM requeue after the job finished) reports the run as
    recorded and changes nothing; another config, or another budget, is refused in one line."""
    run_dir = tmp_path / "run"
    first = _run(run_dir, cache_dir, "train.max_steps=400", budget)  # the budget's key wins over max_steps=30
    assert first.returncode == 0, first.stderr[-2000:]
    before = snapshot(run_dir)
    summary = json.loads(before[M.SUMMARY_FILE])
    assert summary[M.STATUS] == M.STATUS_COMPLETED and summary[M.STOP_REASON] == budget.split("=")[0][len("train.") :]
    again = _run(run_dir, cache_dir, "train.max_steps=400", budget)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "recorded earlier, unchanged" in again.stdout
    assert snapshot(run_dir) == before
    other = one_error_line(_run(run_dir, cache_dir, "train.max_steps=400", budget, "model.d_model=48"))
    assert "hydra.run.dir=" in other and "finished run" in other and "model.d_model: 32 -> 48" in other
    key, value = budget.split("=")
    longer = one_error_line(_run(run_dir, cache_dir, "train.max_steps=400", f"{key}={float(value) * 2:g}"))
    assert f"{key}: " in longer
    assert snapshot(run_dir) == before


def test_killed_after_the_last_checkpoint_finishes_without_training(tmp_path, cache_dir):
    """Killed between the final checkpoint and the final summary: the restart records the end, trains nothing."""
    run_dir = tmp_path / "run"
    assert _run(run_dir, cache_dir).returncode == 0
    done = rows(run_dir)
    set_status(run_dir, M.STATUS_RUNNING)
    out = _run(run_dir, cache_dir)
    assert out.returncode == 0, out.stderr[-2000:]
    assert rows(run_dir) == done  # no step 31, nothing logged twice
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.STATUS] == M.STATUS_COMPLETED and summary[M.STEPS] == 30


def preempted_at_20(run_dir: Path, cache_dir: str) -> list[dict]:
    """A 30-step run made to look preempted after step 20: checkpoints at 10 and 20 only, status preempted.
    Returns the uninterrupted run's rows."""
    assert _run(run_dir, cache_dir, "train.checkpoint_every=10", "train.keep_checkpoints=3").returncode == 0
    done = rows(run_dir)
    list_checkpoints(run_dir)[-1].unlink()
    set_status(run_dir, M.STATUS_PREEMPTED)
    return done


def test_resume_guards(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    done = preempted_at_20(run_dir, cache_dir)
    before = snapshot(run_dir)
    keep = ("train.checkpoint_every=10", "train.keep_checkpoints=3")
    # another config into the same run directory
    other = one_error_line(_run(run_dir, cache_dir, *keep, "model.d_model=48"))
    assert "train.resume=" in other and "model.d_model: 32 -> 48" in other
    # another horizon: the LR schedule would be two schedules spliced together (issue: 2.65e-3 -> 1.19e-3)
    spliced = one_error_line(_run(run_dir, cache_dir, *keep, "train.max_steps=60"))
    assert "train.resume=" in spliced and "train.max_steps: 30 -> 60" in spliced
    # a truncated checkpoint
    newest = list_checkpoints(run_dir)[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    broken = one_error_line(_run(run_dir, cache_dir, *keep))
    assert "unreadable checkpoint" in broken
    newest.write_bytes(data)
    assert snapshot(run_dir) == before  # nothing recorded was lost or changed
    # the same config continues from step 20 to the very same curve
    out = _run(run_dir, cache_dir, *keep)
    assert out.returncode == 0, out.stderr[-2000:]
    assert rows(run_dir) == done
    assert json.loads((run_dir / M.SUMMARY_FILE).read_text())[M.RESUMED_FROM] == [20]


def test_resume_from_explicit_checkpoint_into_a_new_dir(tmp_path, cache_dir):
    first = tmp_path / "first"
    done = preempted_at_20(first, cache_dir)
    ckpt = list_checkpoints(first)[-1]
    keep = ("train.checkpoint_every=10", "train.keep_checkpoints=3")
    longer = one_error_line(_run(tmp_path / "longer", cache_dir, *keep, "train.max_steps=40", f"train.resume={ckpt}"))
    assert "train.max_steps: 30 -> 40" in longer and not (tmp_path / "longer" / M.SUMMARY_FILE).exists()
    second = _run(tmp_path / "second", cache_dir, *keep, f"train.resume={ckpt}")
    assert second.returncode == 0, second.stderr[-2000:]
    summary = json.loads((tmp_path / "second" / M.SUMMARY_FILE).read_text())
    assert summary[M.STEPS] == 30 and summary[M.RESUMED_FROM] == [20]
    assert rows(tmp_path / "second") == done[21:]  # steps 21..30, the same floats


@pytest.mark.slow
def test_ctrl_c_checkpoints_then_resumes(tmp_path, cache_dir, reference):
    """Ctrl-C is not a failure: one line, a checkpoint at the step it stopped, status interrupted, exit 130;
    the same command continues to the uninterrupted curve."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, cache_dir)
    wait_for_rows(proc, run_dir, 60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert len(err.strip().splitlines()) == 1 and "interrupted at step" in err and "Traceback" not in err
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.STATUS] == M.STATUS_INTERRUPTED and summary[M.ERROR] is None
    stopped = summary[M.STEPS]
    assert int(list_checkpoints(run_dir)[-1].stem.split("_")[1]) == stopped
    out = subprocess.run(command(run_dir, cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert rows(run_dir) == reference
    assert json.loads((run_dir / M.SUMMARY_FILE).read_text())[M.RESUMED_FROM] == [stopped]


def test_checkpoints_load_weights_only(tmp_path, cache_dir):
    import torch

    assert _run(tmp_path / "r", cache_dir).returncode == 0
    state = torch.load(list_checkpoints(tmp_path / "r")[-1], weights_only=True)
    assert state["step"] == 30 and "optimizer" in state and "rng" in state
    assert not any(os.fspath(p).endswith(".tmp") for p in (tmp_path / "r" / "checkpoints").iterdir())


# --- under torchrun: FSDP2 over 2 gloo processes, DCP folder checkpoints ------------------------------------
FSDP_STEPS = 40


def fsdp_command(run_dir: Path, cache_dir: str, *extra: str) -> list[str]:
    """2 CPU processes (gloo), the model sharded (train.parallel=fsdp), a checkpoint every 10 steps."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
    single = command(run_dir, cache_dir, f"train.max_steps={FSDP_STEPS}", "train.checkpoint_every=10",
                     "train.eval_every=20", "train.probe_every=10", "train.parallel=fsdp", *extra)  # fmt: skip
    return [*torchrun, *single[2:]]  # "lm_ablate.train" and its overrides


FSDP_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _descendants(pid: int) -> list[int]:
    """The processes started below ``pid`` (torchrun's workers run in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory, cache_dir) -> list[dict]:
    run_dir = tmp_path_factory.mktemp("fsdp_reference")
    out = subprocess.run(fsdp_command(run_dir, cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=FSDP_ENV)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return rows(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_9_under_fsdp_then_resume_is_bit_identical(tmp_path, cache_dir, fsdp_reference, mode):
    """The whole job killed (torchrun and both ranks, SIGKILL: a node lost) mid-run, then the same command: the
    ranks load their shards of the newest complete folder checkpoint and continue to the uninterrupted curve bit
    for bit. With train.async_checkpoint the checkpoint being written in the background at the kill is not one:
    the previous one is the newest, and the resume is just as exact."""
    run_dir = tmp_path / "run"
    extra = ["train.async_checkpoint=true"] if mode == "async" else []
    proc = subprocess.Popen(fsdp_command(run_dir, cache_dir, *extra), cwd=ROOT, env=FSDP_ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    wait_for_rows(proc, run_dir, 25)
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate()
    killed_at = rows(run_dir)[-1][M.STEP]
    newest = newest_checkpoint_step(run_dir)
    assert newest is not None and 0 < newest <= killed_at < FSDP_STEPS
    assert all(c.is_dir() for c in list_checkpoints(run_dir))  # DCP folders, each complete
    out = subprocess.run(fsdp_command(run_dir, cache_dir, *extra), cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=FSDP_ENV)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = rows(run_dir)
    assert [r[M.STEP] for r in resumed] == list(range(FSDP_STEPS + 1))
    assert resumed == fsdp_reference
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.STATUS] == M.STATUS_COMPLETED and summary[M.RESUMED_FROM] == [newest]
    assert not list((run_dir / "checkpoints").glob(".*"))  # no partial folder left behind
