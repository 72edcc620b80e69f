"""What a run does around its steps: refusing a step that cannot fit in memory, turning an allocation failure
into one line, and probes whose memory stays bounded at any context."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, compose
from lm_ablate.perf import step_memory_bytes

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("device_type, bytes_per_value", [("cpu", 4), ("cuda", 2)])
def test_step_memory_estimate_is_korthikanti_et_al(device_type, bytes_per_value):
    """Korthikanti et al. 2022, sec. 4.1: activations per layer s*b*h*(34 + 5*a*s/h) bytes at 16 bits (the 5as/h
    term only where the scores are stored), plus fp32 logits with log-softmax and gradient, plus 16 bytes per
    parameter (fp32 weight, gradient, two Adam moments) for ~12 L d^2 + 2 V d parameters."""
    s, b, h, a, L, V = 64, 8, 48, 4, 3, 256
    base = ["model=tiny", f"model.context={s}", f"train.batch_size={b}", f"model.d_model={h}", f"model.n_heads={a}"]
    base.append(f"model.n_layers={L}")
    scale = bytes_per_value / 2
    params = 16 * (12 * L * h * h + 2 * V * h)
    logits = 3 * b * s * V * 4
    sdpa = compose(base)  # fused attention: no stored scores
    assert step_memory_bytes(sdpa, V, device_type) == L * s * b * h * 34 * scale + logits + params
    capped = compose([*base, "attention.softcap=30"])  # the written-out path stores scores and probabilities
    expected = L * s * b * h * (34 + 5 * a * s / h) * scale + logits + params
    assert step_memory_bytes(capped, V, device_type) == pytest.approx(expected)
    # the micro-batch is what is live at once: grad accumulation and data parallelism divide it
    accum = compose([*base, "train.grad_accum=2"])
    assert step_memory_bytes(accum, V, device_type) == pytest.approx(
        L * s * (b // 2) * h * 34 * scale + 3 * (b // 2) * s * V * 4 + params
    )
    assert step_memory_bytes(sdpa, V, device_type, world=2) == step_memory_bytes(accum, V, device_type)


def test_a_step_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, cache_dir):
    """Issue: ``debug=smoke model.context=100000`` ran 86 s and died in a 96-line out-of-memory traceback. A
    step far beyond any machine's memory (terabytes) now fails at start with one line naming the keys."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "lm_ablate.train", "debug=smoke", "model.context=100000", "train.batch_size=4096"]
    cmd += [f"hydra.run.dir={run_dir}", f"data.cache_dir={cache_dir}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith("lm-ablate: error: model.context=100000 is invalid: one training step needs")
    assert "train.batch_size=4096" in lines[0] and "available" in lines[0]
    assert not run_dir.exists()


def test_an_allocation_failure_in_a_step_is_one_line_and_recorded(tmp_path, cache_dir, monkeypatch):
    from lm_ablate.train import Trainer, train

    def fail(self, step, probe):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: 1 TB")

    monkeypatch.setattr(Trainer, "train_step", fail)
    with pytest.raises(ConfigError) as err:
        train(compose(["debug=smoke", f"data.cache_dir={cache_dir}"]), tmp_path / "run")
    assert str(err.value).startswith("model.context=32 is invalid: a training step ran out of cpu memory")
    assert "\n" not in str(err.value)
    summary = M.from_json(__import__("json").loads((tmp_path / "run" / M.SUMMARY_FILE).read_text()))
    assert summary[M.STATUS] == M.STATUS_FAILED and "ran out of cpu memory" in summary[M.ERROR]

    def other(self, step, probe):  # any other error is not disguised as a memory problem
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(Trainer, "train_step", other)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        train(compose(["debug=smoke", f"data.cache_dir={cache_dir}"]), tmp_path / "other")


@pytest.mark.parametrize("window", [None, 5])
def test_max_attention_logit_is_computed_in_bounded_blocks(window):
    """The probe's max logit used to build a T x T mask and H x T x T scores per sequence (80 GB at T = 1e5).
    In query blocks it gives exactly the max of the full masked score matrix, computed here at once."""
    from lm_ablate.components.attention import CausalSelfAttention

    cfg = compose(["model=tiny", "attention=gqa", "attention.n_kv_heads=1"])
    cfg.attention.window = window
    attn = CausalSelfAttention(cfg.attention, cfg.model)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 2, 40, 16, generator=g), torch.randn(3, 1, 40, 16, generator=g)
    i, j = torch.arange(40)[:, None], torch.arange(40)
    seen = (j <= i) & ((i - j < window) if window else True)
    full = (q @ k.repeat_interleave(2, dim=1).transpose(-2, -1) * attn.scale).masked_fill(~seen, float("-inf"))
    whole = attn.max_logit(q, k)
    attn.max_logit_scores = 2 * 40 * 7  # 7 query rows per block: blocks of one sequence, ragged last block
    blocks = attn.max_logit(q, k)
    assert whole.item() == pytest.approx(full.amax().item(), rel=1e-6)  # matmul shapes differ: rounding
    assert blocks.item() == pytest.approx(full.amax().item(), rel=1e-6)
    # the largest score sits in the last, ragged block of the last sequence: found there
    q[2, 1, 37] = 100 * k[2, 0, 34]
    assert attn.max_logit(q, k).item() == pytest.approx((q[2, 1, 37] @ k[2, 0, 34]).item() * attn.scale, rel=1e-5)


def test_a_key_the_schema_gained_later_counts_as_its_default_on_resume():
    """A checkpoint written before a key existed (model.parametrization, ladder.*) resumes when the key is at its
    default; at another value it is another config."""
    from lm_ablate.checkpoint import config_differences
    from lm_ablate.config import to_container

    now = to_container(compose(["debug=smoke"]))
    later = ("parametrization", "mup_output_mult", "mup_attn_mult")  # keys the schema gained after the record
    older = {**now, "model": {k: v for k, v in now["model"].items() if k not in later}}
    older.pop("ladder")
    assert config_differences(older, now) == []
    mup = to_container(compose(["debug=smoke", "model.parametrization=mup", "model.mup_base_width=32"]))
    assert config_differences(older, mup) == ["model.mup_base_width", "model.parametrization"]
