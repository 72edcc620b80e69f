"""``hydra/sweeper=grids`` (hydra_plugins/lm_ablate_grids/grids_sweeper.py): a sweep that is the union of several
cartesian products, each arm on its own LR grid (issue 23's norm_placement: 25 runs where one shared grid
that brackets every arm took 90)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from hydra_plugins.lm_ablate_grids.grids_sweeper import job_overrides
from lm_ablate.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_jobs_are_each_grids_product_in_order_later_keys_winning():
    """Written out by hand: params x grid 1, then params x grid 2 (its seed replaces the shared one)."""
    jobs = job_overrides({"seed": "0,1"}, [{"optim.lr": "1e-3,2e-3"}, {"optim.lr": 4e-3, "seed": 0}], [])
    assert jobs == [
        ["seed=0", "optim.lr=0.001"],
        ["seed=0", "optim.lr=0.002"],
        ["seed=1", "optim.lr=0.001"],
        ["seed=1", "optim.lr=0.002"],
        ["seed=0", "optim.lr=0.004"],
    ]
    # the command line replaces a key of params and of every grid alike; a job two grids share runs once
    assert job_overrides({"seed": "0,1"}, [{"optim.lr": "1e-3,2e-3"}, {"optim.lr": 4e-3, "seed": 0}], ["seed=5"]) == [
        ["seed=5", "optim.lr=0.001"],
        ["seed=5", "optim.lr=0.002"],
        ["seed=5", "optim.lr=0.004"],
    ]
    assert job_overrides(None, [{"a": "1,2"}, {"a": "2,3"}], []) == [["a=1"], ["a=2"], ["a=3"]]
    # the same number written two ways is one job (Hydra's parser writes each value out the same)
    assert job_overrides(None, [{"lr": "3.0e-3,6.0e-3"}, {"lr": 6e-3}], []) == [["lr=0.003"], ["lr=0.006"]]


def test_without_grids_it_is_the_basic_sweepers_product():
    lines = ["norm.placement=pre,post", "seed=0,1,2", "optim.lr=1e-3"]
    basic = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(lines), None)[0]
    params = {"norm.placement": "pre,post", "seed": "0,1,2"}
    assert job_overrides(params, None, ["optim.lr=1e-3"]) == [list(job) for job in basic] and len(basic) == 6


@pytest.mark.parametrize("grids", [[], "seed=0,1", [{}], [["seed", "0"]], {"seed": "0,1"}, [{"seed": 0}, "x"]])
def test_grids_that_are_no_list_of_mappings_are_one_line(grids):
    with pytest.raises(ConfigError) as err:
        job_overrides({"seed": "0"}, grids, [])
    line = str(err.value)
    assert line.startswith("hydra.sweeper.grids") and "\n" not in line and "allowed: a non-empty" in line


def sweep_file(folder: Path, grids: list[dict]) -> None:
    spec = {
        "defaults": ["train", {"override hydra/sweeper": "grids"}, "_self_"],
        "hydra": {"mode": "MULTIRUN", "sweeper": {"params": {"seed": "0,1"}, "grids": grids}},
    }
    (folder / "grids.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def run_sweep(folder: Path, cache_dir: str, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lm_ablate.train", "--config-dir", str(folder), "--config-name", "grids",
         f"hydra.sweep.dir={folder / 'sweep'}", "debug=smoke", "tracking=none", "train.max_steps=2",
         "train.eval_every=2", "train.probe_every=0", f"data.cache_dir={cache_dir}", *more],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


# the launcher is the sweep's own choice: jobs in this process, or two joblib worker processes (--launcher joblib)
@pytest.mark.parametrize(
    "launcher", [[], ["hydra/launcher=local_parallel", "train.threads=1"]], ids=["basic", "joblib"]
)
def test_a_grids_sweep_trains_each_job_once_numbered_in_launch_order(tmp_path, cache_dir, launcher):
    """End to end through Hydra: job k's run record holds the seed and LR of the k-th job of the union."""
    sweep_file(tmp_path, [{"optim.lr": 2e-3}, {"optim.lr": "1e-3,4e-3", "seed": 0}])
    out = run_sweep(tmp_path, cache_dir, *launcher)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted((p for p in (tmp_path / "sweep").iterdir() if p.is_dir()), key=lambda p: int(p.name))
    got = []
    for run in runs:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        got.append((cfg["seed"], cfg["optim"]["lr"]))
    assert got == [(0, 2e-3), (1, 2e-3), (0, 1e-3), (0, 4e-3)]


def test_a_bad_arm_in_one_grid_stops_the_sweep_before_anything_is_made(tmp_path, cache_dir):
    """The sweep check expands the same union: an arm only the second grid has is refused, exit 2, one line."""
    sweep_file(tmp_path, [{"norm.placement": "pre"}, {"norm.placement": "prr", "seed": 0}])
    out = run_sweep(tmp_path, cache_dir)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("lm-ablate: error: seed=0 norm.placement=prr: "), lines
    assert not (tmp_path / "sweep").exists()
    sweep_file(tmp_path, [{"norm.placement": "pre"}, {}])  # an empty grid: the grids line, nothing made
    out = run_sweep(tmp_path, cache_dir)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and lines == [
        "lm-ablate: error: hydra.sweeper.grids[1]={} is invalid: allowed: a non-empty mapping of config keys to "
        "sweep values ({key: 'a,b'})"
    ], out.stderr[-3000:]
    assert not (tmp_path / "sweep").exists()
