"""Downstream evaluation in the training loop (lm_ablate/eval/loop.py, the calls in lm_ablate/train.py): the
metrics land in metrics.jsonl every eval.every steps and at the end and, the last values, in summary.json with
the seconds they took; eval=none changes nothing; a bad task is one line before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lm_ablate import metrics as M
from lm_ablate.config import compose
from lm_ablate.train import train

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["debug=smoke", "model.context=128", "train.threads=1", "train.checkpoint_every=0"]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / M.METRICS_FILE).read_text().splitlines()]


@pytest.mark.slow
def test_downstream_metrics_land_in_the_run_record(tmp_path, cache_dir):
    cfg = compose([*SMOKE, "eval=quick", "eval.max_examples=8", "eval.every=10", f"data.cache_dir={cache_dir}"])
    summary = train(cfg, tmp_path / "run")
    acc = M.downstream("shakespeare_order", "acc")
    logged = {r[M.STEP]: r for r in rows(tmp_path / "run") if acc in r}
    assert sorted(logged) == [10, 20]  # every 10 steps; the end (20) once
    last = logged[20]
    for kind in M.DOWNSTREAM_KINDS:
        key = M.downstream("shakespeare_order", kind)
        assert summary[key] == last[key]
        assert 0 <= last[key] <= (1 if kind != "bpb" else 20)
    assert last[M.DOWNSTREAM_SECONDS] > 0 and summary[M.DOWNSTREAM_EVALS] == 2
    assert summary[M.DOWNSTREAM_EVAL_S] > 0 and summary[M.DOWNSTREAM_EXAMPLES] == {"shakespeare_order": 8}
    on_disk = json.loads((tmp_path / "run" / M.SUMMARY_FILE).read_text())
    assert on_disk[acc] == summary[acc]

    plain = train(compose([*SMOKE, f"data.cache_dir={cache_dir}"]), tmp_path / "plain")
    assert not [k for k in plain if "downstream" in k]
    assert not [k for r in rows(tmp_path / "plain") for k in r if "downstream" in k]
    assert plain[M.FINAL_VAL_LOSS] == summary[M.FINAL_VAL_LOSS]  # evaluation changes no training number


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("eval.tasks=[{name:x,format:nope,path:/tmp/x.jsonl}]", "eval.tasks.0.format='nope' is invalid: allowed: arc,"),
        ("eval.every=0", "eval.every=0 is invalid: a positive number of steps, or null"),
        ("model.context=32", "eval.tasks.0 (shakespeare_order) example 0: a continuation of"),
    ],
)
def test_a_bad_eval_config_is_one_line_and_writes_nothing(tmp_path, override, line):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "lm_ablate.train", *SMOKE, "eval=quick", override, f"hydra.run.dir={run}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"lm-ablate: error: {line}") and done.stderr.count("\n") == 1, done.stderr
    assert not run.exists()
