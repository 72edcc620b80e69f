"""Security: a checkpoint cannot run code, no credential reaches a run record or report, and every string in the
HTML report is escaped."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from lm_ablate import metrics as M

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = "<script>alert(1)</script>"
SAFE_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "h3",
    "p",
    "ul",
    "li",
    "div",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "figure",
    "img",
    "figcaption",
    "details",
    "summary",
    "code",
}


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


class CreatesMarker:
    """Unpickling this calls open(marker, "w"): the file appears if, and only if, the pickle's code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def malicious_checkpoint(path: Path, marker: Path, kind: str) -> Path:
    state = {"format": 1, "step": 5, "model": CreatesMarker(marker)}
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "torch_zip":
        import torch

        torch.save(state, path)
    else:  # a bare pickle, as an attacker would hand-craft it
        path.write_bytes(pickle.dumps(state, protocol=2))
    return path


@pytest.mark.parametrize("kind", ["torch_zip", "bare_pickle"])
def test_malicious_checkpoint_is_refused_and_never_runs(kind, tmp_path, cache_dir):
    import torch

    # the payload is real: an unsafe load does create its marker
    probe = tmp_path / "probe_marker"
    unsafe = malicious_checkpoint(tmp_path / "probe.pt", probe, kind)
    loaded = torch.load(unsafe, weights_only=False) if kind == "torch_zip" else pickle.loads(unsafe.read_bytes())
    loaded["model"].close()
    assert probe.exists()

    marker = tmp_path / "MARKER"
    run_dir = tmp_path / "run"
    if kind == "torch_zip":  # where train.resume=auto finds it: the newest checkpoint of the run directory
        malicious_checkpoint(run_dir / "checkpoints" / "step_00000005.pt", marker, kind)
        extra = []
    else:
        extra = [f"train.resume={malicious_checkpoint(tmp_path / 'evil.pt', marker, kind)}"]
    out = cli("-m", "lm_ablate.train", "debug=smoke", f"data.cache_dir={cache_dir}", f"hydra.run.dir={run_dir}", *extra)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert lines[0].startswith("lm-ablate: error: train.resume=") and "unreadable checkpoint" in lines[0]
    if kind == "torch_zip":
        assert "it would import io.open" in lines[0] and "could run code" in lines[0]
    assert "weights_only` set to `False`" not in out.stderr  # never advise the unsafe load
    assert not marker.exists()
    assert not (run_dir / M.SUMMARY_FILE).exists() and not (run_dir / M.METRICS_FILE).exists()


def test_no_secret_in_run_record_or_report(tmp_path, cache_dir):
    secrets = {
        "WANDB_API_KEY": f"wandbsecret{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}",  # 40 hex after the prefix
        "HF_TOKEN": f"hf_secret{uuid.uuid4().hex}",
    }
    home = tmp_path / "home"
    home.mkdir()
    env = {**secrets, "HOME": str(home), "WANDB_CONFIG_DIR": str(home / "wandb_config"), "WANDB_MODE": "offline"}
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR", "WANDB_DIR"):
        env[var] = ""  # unset below: W&B then keeps its caches under the run directory, where we look
    env = {k: v for k, v in {**os.environ, **env}.items() if v != ""}
    run_dir, report = tmp_path / "run", tmp_path / "report"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_ablate.train",
            "debug=smoke",
            "train.max_steps=3",
            "tracking=wandb",
            "tracking.mode=offline",
            f"data.cache_dir={cache_dir}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rep = subprocess.run(
        [sys.executable, "-m", "analysis.report", str(run_dir), "--out", str(report)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0, rep.stderr[-2000:]

    files = [p for root in (run_dir, report, home) for p in root.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"config.yaml", "hydra.yaml", "overrides.yaml", M.SUMMARY_FILE, "report.html"} <= names
    assert any(p.suffix == ".wandb" and p.stat().st_size > 0 for p in files), sorted(names)  # the binary is covered
    for path in files:
        blob = path.read_bytes()
        for name, secret in secrets.items():
            assert secret.encode() not in blob, f"{name} written to {path}"
    for stream in (out.stdout, out.stderr, rep.stdout, rep.stderr):
        assert not any(secret in stream for secret in secrets.values())


def test_report_escapes_every_string(tmp_path, cache_dir):
    run_a = tmp_path / "runs" / "a"
    out = cli(
        "-m",
        "lm_ablate.train",
        "debug=smoke",
        "train.max_steps=2",
        f"data.cache_dir={cache_dir}",
        f"hydra.run.dir={run_a}",
        f"study='{PAYLOAD}'",
        "tracking=wandb",  # (disabled) tags are wandb's key (lm_ablate/options.py)
        "tracking.mode=disabled",
        f"tracking.tags=['{PAYLOAD}']",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # a second arm whose config value, run name and error message carry markup too
    run_b = shutil.copytree(run_a, tmp_path / "runs" / "b", ignore=shutil.ignore_patterns("checkpoints"))
    cfg = yaml.safe_load((run_b / M.CONFIG_FILE).read_text())
    cfg["optim"]["schedule"] = '"><img src=x onerror=alert(2)>'
    (run_b / M.CONFIG_FILE).write_text(yaml.safe_dump(cfg))
    summary = json.loads((run_b / M.SUMMARY_FILE).read_text())
    summary.update({M.STATUS: M.STATUS_FAILED, M.ERROR: f"RuntimeError: {PAYLOAD}", M.RUN_NAME: f"x{PAYLOAD}"})
    (run_b / M.SUMMARY_FILE).write_text(json.dumps(summary))

    rep = cli("-m", "analysis.report", str(tmp_path / "runs"), "--out", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stderr[-2000:]
    for name in ("report.html", "report.md"):
        text = (tmp_path / "report" / name).read_text()
        assert "<script" not in text.lower() and "<img src=x" not in text.lower(), name
        assert not re.search(r"<[a-z][^>]*\son\w+\s*=", text, re.I), name  # no event-handler attribute in any tag
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text, name
        assert "&lt;img src=x onerror=alert(2)&gt;" in text, name
    html = (tmp_path / "report" / "report.html").read_text()
    tags = set(re.findall(r"</?([a-zA-Z][a-zA-Z0-9]*)", html))
    assert tags <= SAFE_TAGS, tags - SAFE_TAGS  # only the renderer's own markup
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # title, study, run names, error, held-fixed tags
