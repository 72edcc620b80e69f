"""Test-wide environment: no network, nothing written to the home directory, one token cache per session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_SANDBOX = Path(tempfile.mkdtemp(prefix="lm_ablate_tests_"))
# set before anything imports datasets / huggingface_hub / wandb (they read these at import time)
os.environ.update(
    {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(_SANDBOX / "hf"),
        "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled"),
        "WANDB_DIR": str(_SANDBOX / "wandb"),
        "WANDB_CACHE_DIR": str(_SANDBOX / "wandb" / "cache"),
        "WANDB_CONFIG_DIR": str(_SANDBOX / "wandb" / "config"),
        "WANDB_DATA_DIR": str(_SANDBOX / "wandb" / "data"),
        "WANDB_SILENT": "true",
        "MPLBACKEND": "Agg",
    }
)


@pytest.fixture(scope="session")
def cache_dir() -> str:
    """Token cache shared by every test run in this session (the corpus is tokenized once)."""
    path = _SANDBOX / "token_cache"
    path.mkdir(exist_ok=True)
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls: one intra-op thread per test worker avoids OpenMP spin-waits on a shared 2-core machine
    (hundreds of times faster there under load); restored afterwards. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
