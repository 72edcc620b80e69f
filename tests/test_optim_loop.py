"""Every optimizer inside the real loop: a run killed (kill -9) and started again continues bit for bit with
warmup + WSD schedule, gradient clipping and gradient accumulation on; two DDP processes follow one process;
the run record lists which parameters each optimizer updated."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_resume import ROOT, command, kill_9_then_resume, rows

from lm_ablate import metrics as M

STEPS = 60
LOOP = [  # on top of test_resume's command (model=tiny, dropout, clipping at 1, batch 8)
    f"train.max_steps={STEPS}",
    "train.checkpoint_every=20",
    "train.eval_every=20",
    "train.grad_accum=2",
    "optim.schedule=wsd",
    "optim.warmup_steps=5",
    "optim.decay_fraction=0.3",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adamw", "muon", "adafactor", "sgd"])
def test_kill_9_then_resume_is_bit_identical_with_each_optimizer(tmp_path, cache_dir, name):
    extra = [*LOOP, f"optim={name}"]
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    out = subprocess.run(command(ref_dir, cache_dir, *extra), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    reference = rows(ref_dir)
    killed_at, newest = kill_9_then_resume(run_dir, cache_dir, 33, *extra)  # between checkpoints 20 and 40
    assert 20 <= killed_at < STEPS and newest in (20, 40)
    resumed = rows(run_dir)
    assert [r[M.STEP] for r in resumed] == list(range(STEPS + 1))
    assert resumed == reference  # every loss, grad norm, lr and val loss: identical floats
    lrs = [r[M.LR] for r in reference if M.LR in r]
    assert lrs[0] < lrs[5] and lrs[-1] < lrs[20]  # the schedule ran: warmup, then the decay at the end
    summary = json.loads((run_dir / M.SUMMARY_FILE).read_text())
    assert summary[M.RESUMED_FROM] == [newest]
    parts = summary[M.OPTIMIZER_PARAMS]
    assert set(parts) == ({"muon", "adamw"} if name == "muon" else {name})
    if name == "muon":
        assert "blocks.0.attn.qkv.weight" in parts["muon"] and "embed.weight" in parts["adamw"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["muon", "adafactor", "sgd"])
def test_two_process_ddp_matches_one_process_with_each_optimizer(tmp_path, cache_dir, name):
    """torchrun, 2 CPU processes (gloo), same global batch: the curve of 1 process up to float summation order.
    Muon orthogonalizes in bf16: a last-bit difference of the all-reduced gradient can round the other way in
    bf16, and it compounds with the LR (at lr 3e-3: 1.4e-4 on the loss after 12 steps, 1e-3 at muon.yaml's 2e-2;
    the same 1e-7 perturbation of the gradients moves an fp32 Newton-Schulz by 0): Muon runs at 3e-3 with
    tolerance 5e-4, the others at their yaml's LR with 1e-5. Deterministic: the same all-reduce every run."""
    common = [
        "debug=smoke",
        "train.max_steps=12",
        "train.eval_every=6",
        "train.threads=1",
        f"data.cache_dir={cache_dir}",
        f"optim={name}",
        *(["optim.lr=3e-3"] if name == "muon" else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = {
        "one": [sys.executable, "-m", "lm_ablate.train"],
        "two": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29563"]
        + ["-m", "lm_ablate.train"],
    }
    for tag, prefix in launch.items():
        out = subprocess.run(
            [*prefix, *common, f"hydra.run.dir={tmp_path / tag}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    a, b = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert [r[M.STEP] for r in a] == [r[M.STEP] for r in b]
    tol = 5e-4 if name == "muon" else 1e-5
    for key in (M.TRAIN_LOSS, M.GRAD_NORM, M.VAL_LOSS):
        assert [r.get(key) for r in a] == pytest.approx([r.get(key) for r in b], abs=tol)
    assert a[-1][M.TRAIN_LOSS] < a[1][M.TRAIN_LOSS]  # it trained


def test_bad_optimizer_setting_is_one_line_and_writes_nothing(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        command(run_dir, cache_dir, "optim=sgd", "optim.momentum=1.5"), cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    last = [line for line in out.stderr.splitlines() if line.strip()][-1]
    assert last == "lm-ablate: error: optim.momentum=1.5 is invalid: must be in [0, 1)"
    assert not (run_dir / M.METRICS_FILE).exists() and not list(run_dir.rglob("*.pt"))
