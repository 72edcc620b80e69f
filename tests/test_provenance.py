"""What decides a run's digits (lm_ablate/provenance.py) is in every run record, read from torch (issue 46.10)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

import pytest
import torch

from lm_ablate import metrics as M
from lm_ablate import provenance
from lm_ablate.config import compose
from lm_ablate.train import train


def test_provenance_is_torchs_own_answer_and_follows_the_thread_count():
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert provenance.provenance("cpu") == {
                "torch_version": torch.__version__,
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "cpu_model": provenance.cpu_model(),
                "threads": n,
                "device": "cpu",
                "cuda_version": None,
                "cudnn_version": None,
                "gpu_name": None,
            }
    finally:
        torch.set_num_threads(before)
    assert tuple(provenance.provenance("cpu")) == M.PROVENANCE


def test_on_cuda_the_gpu_and_its_libraries_are_recorded(monkeypatch):
    """Without a GPU torch's answers are stood in for, to check each lands in its field; the next test reads them
    from a real GPU."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    got = provenance.provenance("cuda")
    assert (got["device"], got["cuda_version"], got["cudnn_version"], got["gpu_name"]) == (
        "cuda", "12.8", 91002, "NVIDIA H100 80GB HBM3")  # fmt: skip
    assert provenance.differences(got, {**got, "gpu_name": "NVIDIA A100"})[0] == {
        "gpu_name": ("NVIDIA H100 80GB HBM3", "NVIDIA A100")
    }


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="needs lscpu")
def test_cpu_model_is_the_one_lscpu_names():
    out = subprocess.run(["lscpu"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}).stdout
    names = [line.partition(":")[2].strip() for line in out.splitlines() if line.startswith("Model name:")]
    assert provenance.cpu_model() == names[0]


def test_cpu_model_without_proc_cpuinfo_is_what_platform_says(monkeypatch, tmp_path):
    monkeypatch.setattr(provenance, "CPUINFO", tmp_path / "missing")
    assert provenance.cpu_model() == (platform.processor() or platform.machine() or None)
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\n")
    monkeypatch.setattr(provenance, "CPUINFO", tmp_path / "cpuinfo")
    assert provenance.cpu_model() == "Intel(R) Xeon(R) Platinum 8480+"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_record_names_it():
    got = provenance.provenance("cuda")
    assert got["gpu_name"] == torch.cuda.get_device_name() and got["cuda_version"] == torch.version.cuda
    assert got["cudnn_version"] == torch.backends.cudnn.version() and got["device"] == "cuda"


@pytest.mark.slow  # a fresh interpreter imports torch: ~2 s alone, ~9 s on a loaded machine
def test_cpu_capability_is_the_kernels_aten_runs():
    """ATEN_CPU_CAPABILITY=default makes ATen dispatch to its unvectorised kernels (the issue's 2.7788 run): the
    record says so, whatever the machine could do."""
    code = "from lm_ablate.provenance import provenance; print(provenance('cpu')['cpu_capability'])"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "DEFAULT" != torch.backends.cpu.get_cpu_capability()


@pytest.mark.slow
def test_run_record_holds_the_provenance(tmp_path, cache_dir):
    before = torch.get_num_threads()
    try:
        cfg = compose(["debug=smoke", "train.max_steps=2", "train.threads=1", f"data.cache_dir={cache_dir}"])
        summary = train(cfg, tmp_path / "run")
    finally:
        torch.set_num_threads(before)
    saved = json.loads((tmp_path / "run" / M.SUMMARY_FILE).read_text())
    assert saved == json.loads(json.dumps(summary))
    assert saved["torch_version"] == torch.__version__
    assert saved["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert saved["threads"] == 1 and saved["device"] == "cpu" and saved["gpu_name"] is None
    assert M.PROVENANCE_EARLIER not in saved


def test_a_session_elsewhere_is_kept_in_order():
    """A run resumed with another thread count (or on another machine) keeps each earlier session's values."""
    summary: dict = {}
    provenance.stamp(summary, "cpu")
    first = {k: summary[k] for k in M.PROVENANCE}
    provenance.stamp(summary, "cpu")  # resumed on the same machine: nothing to keep
    assert M.PROVENANCE_EARLIER not in summary
    summary.update({"cpu_capability": "AVX512", "threads": 7})  # as a checkpoint from elsewhere would hold
    provenance.stamp(summary, "cpu")
    assert summary[M.PROVENANCE_EARLIER] == [{**first, "cpu_capability": "AVX512", "threads": 7}]
    assert {k: summary[k] for k in M.PROVENANCE} == first


@pytest.mark.parametrize(
    ("recorded", "differ", "missing"),
    [
        ({}, {}, ["torch_version", "cpu_capability", "cpu_model", "threads", "device"]),  # a run from before the fields
        # a CSV's 1.0 is 1 thread
        ({"threads": 1.0, "device": "cpu", "cpu_model": "AMD EPYC"}, {}, ["torch_version", "cpu_capability"]),
        ({"threads": 2}, {"threads": (2, 1)}, ["torch_version", "cpu_capability", "cpu_model", "device"]),
        ({"cpu_capability": "AVX512", "gpu_name": "H100"}, {"cpu_capability": ("AVX512", "AVX2")},
         ["torch_version", "cpu_model", "threads", "device"]),  # a GPU name counts only for a run on CUDA
        ({"device": "cuda", "gpu_name": "H100"}, {"device": ("cuda", "cpu"), "gpu_name": ("H100", None)},
         ["torch_version", "cpu_capability", "cpu_model", "threads", "cuda_version", "cudnn_version"]),
    ],
)  # fmt: skip
def test_differences_name_each_field_that_differs_or_was_not_recorded(recorded, differ, missing):
    here = {
        "torch_version": "2.13.0+cpu",
        "cpu_capability": "AVX2",
        "cpu_model": "AMD EPYC",
        "threads": 1,
        "device": "cpu",
    }
    assert provenance.differences(recorded, here) == (differ, missing)
    assert provenance.differences(here, here) == ({}, [])
