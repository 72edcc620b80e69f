"""Every study in sweeps/ composes as Hydra will run it, and every arm of it validates and builds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lm_ablate.config import compose
from lm_ablate.model import TransformerLM
from lm_ablate.study import DEFAULT_STUDY, studies

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {
    "norm_2x2",
    "pre_vs_post_norm",
    "rmsnorm_vs_layernorm",
    "norm_placement",
    "position",
    "activation",
    "attention",
    "regularization",
    "lr_sensitivity",
    "parallel_vs_serial",
}


def params(study: str) -> dict[str, list[str]]:
    spec = yaml.safe_load((ROOT / "sweeps" / f"{study}.yaml").read_text())
    return {k: str(v).split(",") for k, v in spec["hydra"]["sweeper"]["params"].items()}


def test_all_studies_exist():
    assert set(studies()) >= REQUIRED and DEFAULT_STUDY in studies()


@pytest.mark.parametrize("study", sorted(REQUIRED))
def test_study_has_three_seeds_and_its_own_experiment(study):
    p = params(study)
    assert len(p["seed"]) >= 3
    experiment = yaml.safe_load((ROOT / "conf" / "experiment" / f"{study}.yaml").read_text())
    assert experiment["study"] == study


@pytest.mark.parametrize("study", sorted(REQUIRED))
def test_every_arm_builds(study):
    """Each value of each swept key, the others at their first value (the arms a sweep can produce)."""
    p = params(study)
    first = {k: v[0] for k, v in p.items()}
    seen = set()
    for key, values in p.items():
        for value in values:
            arm = {**first, key: value}
            overrides = tuple(f"{k}={v}" for k, v in arm.items())
            if overrides in seen:
                continue
            seen.add(overrides)
            cfg = compose([f"experiment={study}", *overrides, "model.d_model=32", "model.n_heads=4"])
            assert cfg.study == study
            model = TransformerLM(cfg, 64)
            assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("study", ["norm_2x2", "attention"])
def test_sweep_file_composes_through_the_cli(study):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_ablate.train",
            "--config-dir",
            "sweeps",
            "--config-name",
            study,
            "--cfg",
            "job",
            "hydra.sweep.dir=/tmp/unused",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"study: {study}" in out.stdout
