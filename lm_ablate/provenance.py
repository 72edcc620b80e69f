"""What decides a run's digits besides its config, recorded in every run's summary.json.

A run is deterministic for a given config on one machine: the same command gives the same digits. Across
machines it is not, because the floating-point sums inside the kernels are ordered differently by

* the torch version (``torch_version``): kernels change between releases;
* the CPU kernels ATen dispatches to (``cpu_capability``, ``torch.backends.cpu.get_cpu_capability()``:
  ``DEFAULT``, ``AVX2``, ``AVX512``, ...; ``ATEN_CPU_CAPABILITY=avx2`` forces a lower one), which vectorise
  reductions at different widths;
* the CPU itself (``cpu_model``, /proc/cpuinfo's model name): the matmul libraries torch calls (MKL, oneDNN)
  choose their kernels by the CPU's instruction sets, whatever ATen's capability says;
* the number of intra-op threads (``threads``, ``torch.get_num_threads()``): a reduction split over more threads
  adds its partial sums in another order;
* the device (``device``) and, on CUDA, the CUDA and cuDNN versions and the GPU (``cuda_version``,
  ``cudnn_version``, ``gpu_name``).

Measured (docs/running.md, "What reproducible means here"): the default study's LayerNorm pre-norm run, seed 0,
1 thread, ends at val loss 2.7276 with AVX-512 kernels, 2.7402 with ATEN_CPU_CAPABILITY=avx2 on that machine,
2.7788 with the DEFAULT kernels, and 2.7682 on a machine whose CPU has AVX2 and no AVX-512; rounding differences
of 1e-7 grow to 0.01-0.05 nats over 150 steps at lr 1e-2 without warm-up.

:func:`stamp` puts this session's values into the summary; a resumed run whose earlier session ran elsewhere
keeps that session's values under ``provenance_earlier``. :func:`differences` compares two records.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from lm_ablate import metrics as M

CORE = (M.TORCH_VERSION, M.CPU_CAPABILITY, M.CPU_MODEL, M.THREADS, M.DEVICE)  # compared on every device
CPUINFO = Path("/proc/cpuinfo")


def cpu_model() -> str | None:
    """The CPU's model name: the first ``model name`` of /proc/cpuinfo (Linux x86), else what ``platform`` says
    (None when nothing does)."""
    try:
        for line in CPUINFO.read_text(errors="replace").splitlines():
            key, _, name = line.partition(":")
            if key.strip() == "model name" and name.strip():
                return name.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


CUDA_ONLY = (M.CUDA_VERSION, M.CUDNN_VERSION, M.GPU_NAME)  # compared when the run was on CUDA


def provenance(device: torch.device | str) -> dict[str, Any]:
    """This process's values of :data:`lm_ablate.metrics.PROVENANCE` for a run on ``device`` (call it after
    ``torch.set_num_threads``); the CUDA fields are None off CUDA."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    return {
        M.TORCH_VERSION: str(torch.__version__),  # a TorchVersion would not unpickle under weights_only
        M.CPU_CAPABILITY: torch.backends.cpu.get_cpu_capability(),
        M.CPU_MODEL: cpu_model(),
        M.THREADS: torch.get_num_threads(),
        M.DEVICE: device.type,
        M.CUDA_VERSION: torch.version.cuda if cuda else None,
        M.CUDNN_VERSION: torch.backends.cudnn.version() if cuda else None,
        M.GPU_NAME: torch.cuda.get_device_name(device) if cuda else None,
    }


def stamp(summary: dict[str, Any], device: torch.device | str) -> None:
    """Write this session's provenance into ``summary``. A summary restored from a checkpoint that holds other
    values (resumed on another machine, or with another thread count) keeps them, in order, under
    ``provenance_earlier``: such a run's digits are those of no single machine."""
    now = provenance(device)
    before = {k: summary[k] for k in M.PROVENANCE if k in summary}
    if before and before != now:
        summary[M.PROVENANCE_EARLIER] = [*summary.get(M.PROVENANCE_EARLIER, []), before]
    summary.update(now)


def value(x: Any) -> Any:
    """A recorded value in one form whether it comes from JSON or a CSV cell: None for missing (None, NaN, ""),
    an int for an integral number (a thread count read back as 1.0), else the value as a string."""
    if x is None or (isinstance(x, float) and math.isnan(x)) or (isinstance(x, str) and not x.strip()):
        return None
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, float)) and float(x).is_integer():
        return int(x)
    return str(x)


def compared_keys(recorded: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys that decide a run's digits: the CUDA ones only for a run recorded on CUDA."""
    return CORE + (CUDA_ONLY if value(recorded.get(M.DEVICE)) == "cuda" else ())


def differences(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> tuple[dict[str, tuple[Any, Any]], list[str]]:
    """(key -> (recorded, here) for each key whose values differ, the keys ``recorded`` lacks): two runs of the
    same config give the same digits when the first is empty and so is the second."""
    missing = [k for k in compared_keys(recorded) if value(recorded.get(k)) is None]
    differ = {
        k: (value(recorded.get(k)), value(here.get(k)))
        for k in compared_keys(recorded)
        if k not in missing and value(recorded.get(k)) != value(here.get(k))
    }
    return differ, missing
