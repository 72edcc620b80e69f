"""Bad input, as a user types it: every case runs the real command line in a subprocess and must end with a
non-zero exit, ONE clear last line on stderr (the key, the value, what is allowed), no traceback, and nothing
that looks like a finished run (no completed summary.json, no checkpoint, no report). Cases that must still
succeed (damaged or mixed run records given to the report) are in their own test at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from lm_ablate import metrics as M
from lm_ablate.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------- fixtures
@dataclass
class Inputs:
    cache: str
    finished: Path  # a completed tiny run: record + checkpoint
    ckpt: Path
    files: Path  # damaged checkpoints and data files
    runs: Path  # two run records differing in norm.name (for report cases)


def edit_run(src: Path, dst: Path, config: dict | None = None) -> Path:
    """Copy a run record (without checkpoints) and change some of its config values."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("checkpoints"))
    if config:
        cfg = yaml.safe_load((dst / M.CONFIG_FILE).read_text())
        for key, value in config.items():
            node = cfg
            *path, last = key.split(".")
            for part in path:
                node = node[part]
            node[last] = value
        (dst / M.CONFIG_FILE).write_text(yaml.safe_dump(cfg))
    return dst


@pytest.fixture(scope="session")
def inputs(tmp_path_factory, cache_dir) -> Inputs:
    from lm_ablate.config import compose
    from lm_ablate.train import train

    root = tmp_path_factory.mktemp("bad_input")
    finished = root / "finished"
    train(compose(["debug=smoke", "train.max_steps=2", f"data.cache_dir={cache_dir}"]), finished)
    ckpt = list_checkpoints(finished)[-1]
    files = root / "files"
    files.mkdir()
    blob = ckpt.read_bytes()
    (files / "truncated.pt").write_bytes(blob[: len(blob) // 3])
    (files / "corrupt.pt").write_bytes(bytes(range(256)) * 20)
    (files / "empty.txt").write_text("")
    (files / "latin1.txt").write_bytes("first paragraph\n\nna\xefve caf\xe9 in Latin-1\n".encode("latin-1"))
    (files / "tiny.txt").write_text("\n\n".join(["word"] * 40))  # 40 documents, 2 held out: 10 val tokens
    runs = root / "runs"
    edit_run(finished, runs / "0")
    edit_run(finished, runs / "1", config={"norm.name": "rmsnorm"})
    return Inputs(cache_dir, finished, ckpt, files, runs)


# ---------------------------------------------------------------------------------------------- catalogue
@dataclass
class Case:
    tool: str  # train | report | study | cost
    args: tuple[str, ...]  # {cache} {ckpt} {files} {runs} {out} {finished_copy} are filled in
    expect: tuple[str, ...]  # substrings of the last stderr line
    no_slurm: bool = False  # run with a PATH holding only Python's folder: no sbatch or srun, as off a cluster


def case(
    id: str, tool: str, args: str | tuple[str, ...], *expect: str, xfail: str | None = None, no_slurm: bool = False
):
    args = tuple(args.split()) if isinstance(args, str) else args
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(Case(tool, args, expect, no_slurm), id=id, marks=marks)


CASES = [
    # --- composition: Hydra's schema (types, keys, group options)
    case("unknown_group_option", "train", "norm=rmsnrom", "norm='rmsnrom'", "allowed: layernorm, none, rmsnorm"),
    case("unknown_key", "train", "model.n_head=4", "model.n_head=4", "unknown key", "n_heads"),
    case("wrong_type", "train", "optim.lr=fast", "optim.lr='fast'", "must be a float"),
    case("not_a_list", "train", "tracking.tags=5", "tracking.tags=5 is invalid: must be a list of strings", "=[a,b]"),
    case(
        "appended_unknown_key",
        "train",
        "+model.n_head=4 train.max_steps=1 train.peak_flops=1e12",
        "model.n_head=4",
        "unknown key",
        "n_heads",
    ),
    # --- cross-field rules (config.validate, train.resolve_device)
    case(
        "heads_not_dividing_d_model",
        "train",
        "model.n_heads=3",
        "model.n_heads=3",
        "must divide model.d_model=32",
        "model.head_dim",
    ),
    case(
        "kv_heads_not_dividing_heads",
        "train",
        "attention=gqa attention.n_kv_heads=3",
        "attention.n_kv_heads=3",
        "divide model.n_heads=2",
    ),
    case("rope_odd_head_dim", "train", "position=rope model.head_dim=7", "model.head_dim=7", "rope", "need even"),
    case("window_zero", "train", "attention.window=0", "attention.window=0", "positive integer or null"),
    case("negative_lr", "train", "optim.lr=-1e-3", "optim.lr=-0.001", "must be > 0"),
    case("dropout_one", "train", "regularization.dropout=1.0", "regularization.dropout=1.0", "[0, 1)"),
    case("zero_steps", "train", "train.max_steps=0", "train.max_steps=0", "positive integer"),
    case(
        "grad_accum_not_dividing", "train", "train.grad_accum=3", "train.grad_accum=3", "must divide train.batch_size=4"
    ),
    case(
        "cuda_without_cuda", "train", "train.device=cuda", "train.device='cuda'", "CUDA is not available", "auto or cpu"
    ),
    case(
        "tracking_key_of_another_option",
        "train",
        "tracking.mode=offline",
        "tracking.mode='offline'",
        "none has no mode (wandb)",
    ),
    case(
        "tracking_mode",
        "train",
        "tracking=wandb tracking.mode=sometimes",
        "tracking.mode='sometimes'",
        "allowed: online, offline, disabled",
    ),
    case(
        "unknown_tokenizer",
        "train",
        "data.tokenizer=sentencepiece",
        "data.tokenizer='sentencepiece'",
        "allowed: bpe, byte",
    ),
    case("d_ff_zero", "train", "activation.d_ff=0", "activation.d_ff=0", "positive integer or null"),
    # --- data
    case(
        "missing_data_file",
        "train",
        "data=hf data.path=/nonexistent.txt",
        "data.path='/nonexistent.txt'",
        "no such file or folder",
    ),
    case("empty_data_file", "train", "data=hf data.path={files}/empty.txt", "data.path=", "empty.txt", "is empty"),
    case(
        "non_utf8_text",
        "train",
        "data=hf data.path={files}/latin1.txt",
        "latin1.txt",
        "not UTF-8 text",
        "bad byte at offset 19",
    ),
    case(
        "corpus_shorter_than_context",
        "train",
        "data=hf data.path={files}/tiny.txt",
        "model.context=32",
        "only 10 tokens",
        "needs context + 1 = 33",
    ),
    case(
        "hub_name_offline",
        "train",
        "data=hf data.path=some/hub-name",
        "data.path='some/hub-name'",
        "could not load from the Hugging Face hub",
        "no local file",
    ),
    case(
        "cache_dir_not_a_folder",
        "train",
        "data.cache_dir=/dev/null/cache",
        "data.cache_dir='/dev/null/cache'",
        "cannot create the token cache",
        "writable folder",
    ),
    # --- checkpoints and resume
    case(
        "corrupt_checkpoint",
        "train",
        "train.resume={files}/corrupt.pt",
        "train.resume=",
        "corrupt.pt",
        "unreadable checkpoint",
        "allowed: auto, never",
    ),
    case(
        "truncated_checkpoint",
        "train",
        "train.resume={files}/truncated.pt",
        "truncated.pt",
        "unreadable checkpoint: truncated or corrupt file",
        "allowed: auto, never",
    ),
    case(
        "missing_checkpoint", "train", "train.resume={files}/nope.pt", "nope.pt", "no such file", "allowed: auto, never"
    ),
    case(
        "checkpoint_of_other_config",
        "train",
        "train.resume={ckpt} model.d_model=64",
        "train.resume=",
        "checkpoint is of another config",
        "model.d_model: 32 -> 64",
    ),
    case(
        "resume_into_run_dir_of_other_config",
        "train",
        "hydra.run.dir={finished_copy} model.d_model=64",
        "holds a finished run",
        "of another config (model.d_model: 32 -> 64",
    ),
    case(
        "run_dir_not_creatable",
        "train",
        "hydra.run.dir=/proc/forbidden/run",
        "hydra.run.dir='/proc/forbidden' is invalid: cannot create the run folder",
        "allowed: a writable folder",
    ),
    case(
        "restart_over_finished_run",
        "train",
        "hydra.run.dir={finished_copy} train.resume=never model.n_layers=3",
        "hydra.run.dir=",
        "holds a finished run",
        "use a new run directory",
    ),
    # --- analysis, study, cost
    case("report_missing_dir", "report", "{out}/missing --out {out}/report", "missing: no such directory"),
    case(
        "report_out_not_creatable",
        "report",
        "{runs} --out /proc/forbidden",
        "--out /proc/forbidden: cannot create or write into this folder",
        "allowed: a writable folder",
    ),
    case(
        "report_out_under_a_file",
        "report",
        "{runs} --out {files}/empty.txt/report",
        "empty.txt/report: cannot create or write into this folder (Not a directory: ",
    ),
    case(
        "report_unknown_by",
        "report",
        "{runs} --out {out}/report --by norm.nmae",
        "--by norm.nmae",
        "unknown config key",
        "keys that vary: norm.name",
    ),
    case(
        "report_bad_baseline",
        "report",
        "{runs} --out {out}/report --baseline norm.name=batchnorm",
        "--baseline norm.name=batchnorm",
        "no run has that value",
        "layernorm, rmsnorm",
    ),
    case("study_unknown", "study", "no_such_study", "study='no_such_study'", "allowed:", "norm_2x2"),
    case(
        "study_bad_override",
        "study",
        "norm_2x2 --out {out}/sweep debug=smoke data.cache_dir={cache} model.n_heads=3",
        "model.n_heads=3",
        "must divide model.d_model",
    ),
    case(
        "default_study_with_overrides_only",  # the default study (norm_2x2, 12 arms) took the overrides
        "study",
        "debug=smoke data.cache_dir={cache} --out {out}/sweep model.n_heads=3",
        "12 of 12 arms (norm=layernorm norm.placement=pre seed=0, ...",
        "model.n_heads=3 is invalid",
    ),
    case(
        "study_out_not_creatable",
        "study",
        "parallel_vs_serial --out /proc/forbidden",
        "--out='/proc/forbidden' is invalid: cannot create or write into this folder",
    ),
    case(
        "study_sweep_dir_not_creatable",
        "study",
        "parallel_vs_serial hydra.sweep.dir={files}/empty.txt/sweep",
        "hydra.sweep.dir=",
        "cannot create or write into this folder (Not a directory: ",
    ),
    case(
        "study_sweep_dir_interpolated",
        "study",
        ("parallel_vs_serial", "hydra.sweep.dir={out}/${{now:%H}}"),
        "hydra.sweep.dir=",
        "must be one plain path",
        "--out",
    ),
    case(
        "study_out_and_sweep_dir_differ",
        "study",
        "parallel_vs_serial --out {out}/a hydra.sweep.dir={out}/b",
        "hydra.sweep.dir=",
        "--out names another folder",
    ),
    case(
        "study_slurm_off_cluster",
        "study",
        "parallel_vs_serial --launcher slurm --out {out}/sweep",
        "--launcher='slurm' is invalid: no sbatch or srun on PATH",
        "allowed here: basic, joblib",
        no_slurm=True,
    ),
    case(
        "multirun_slurm_off_cluster",
        "train",
        "--multirun seed=0,1 hydra/launcher=slurm hydra.sweep.dir={out}/sweep",
        "hydra/launcher='slurm' is invalid: no sbatch or srun on PATH",
        "allowed here: basic (the default), joblib, local_parallel",
        no_slurm=True,
    ),
    case(
        "multirun_sweep_dir_not_creatable",
        "train",
        "--multirun seed=0,1 hydra.sweep.dir=/proc/forbidden",
        "hydra.sweep.dir='/proc/forbidden' is invalid: cannot create or write into this folder",
    ),
    case("cost_unknown_group_option", "cost", "norm=rmsnrom", "norm='rmsnrom'", "allowed: layernorm, none, rmsnorm"),
]


def command(c: Case, inputs: Inputs, tmp_path: Path) -> list[str]:
    fill = {
        "cache": inputs.cache,
        "ckpt": str(inputs.ckpt),
        "files": str(inputs.files),
        "runs": str(inputs.runs),
        "out": str(tmp_path),
        "finished_copy": str(tmp_path / "finished"),
    }
    args = [a.format(**fill) for a in c.args]
    if c.tool == "train":
        base = ["debug=smoke", f"hydra.run.dir={tmp_path / 'run'}"]
        if not any(a.startswith("data.cache_dir=") for a in args):
            base.append(f"data.cache_dir={inputs.cache}")
        flags = [a for a in args if a.startswith("--")]  # Hydra's flags come before the overrides
        return [sys.executable, "-m", "lm_ablate.train", *flags, *base, *(a for a in args if a not in flags)]
    module = {"report": "analysis.report", "study": "lm_ablate.study", "cost": "lm_ablate.cost"}[c.tool]
    return [sys.executable, "-m", module, *args]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the run record under root (Hydra's .hydra/ copy and logs aside)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"
    }


def assert_nothing_finished(tmp_path: Path, before: dict[str, bytes]) -> None:
    after = snapshot(tmp_path)
    changed = [k for k in before if after.get(k) != before[k]]
    assert not changed, f"an existing run record was changed: {changed}"
    for name in set(after) - set(before):
        path = tmp_path / name
        assert path.suffix != ".pt", f"checkpoint written: {name}"
        assert path.name != "report.html", f"report written: {name}"
        if path.name == M.SUMMARY_FILE:
            assert json.loads(path.read_text()).get(M.STATUS) != M.STATUS_COMPLETED, f"completed run: {name}"


def run_cli(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("c", CASES)
def test_bad_input_fails_with_one_clear_line(c: Case, inputs: Inputs, tmp_path: Path) -> None:
    if "train.device=cuda" in c.args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
    if any("{finished_copy}" in a for a in c.args):
        shutil.copytree(inputs.finished, tmp_path / "finished")
    before = snapshot(tmp_path)
    paths_before = set(tmp_path.rglob("*"))
    out = run_cli(command(c, inputs, tmp_path), env={"PATH": str(Path(sys.executable).parent)} if c.no_slurm else None)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode != 0, f"exit 0; stdout: {out.stdout[-1000:]}"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith(("lm-ablate: error: ", "error: ")), out.stderr[-3000:]
    missing = [s for s in c.expect if s not in last]
    assert not missing, f"{missing} not in the last stderr line: {last!r}"
    assert_nothing_finished(tmp_path, before)
    if c.tool in ("report", "study") or "--multirun" in c.args:  # refused before creating anything at all
        assert set(tmp_path.rglob("*")) == paths_before, sorted(set(tmp_path.rglob("*")) - paths_before)


# ------------------------------------------------------------- damaged or mixed records: the report still builds
def _truncated_metrics(inputs: Inputs, root: Path) -> None:
    run = edit_run(inputs.finished, root / "cut")
    text = (run / M.METRICS_FILE).read_text()
    (run / M.METRICS_FILE).write_text(text[: len(text) - 25])  # a torn last line


def _missing_summary(inputs: Inputs, root: Path) -> None:
    edit_run(inputs.finished, root / "0")
    (edit_run(inputs.finished, root / "killed", config={"norm.name": "rmsnorm"}) / M.SUMMARY_FILE).unlink()


def _mixed_studies(inputs: Inputs, root: Path) -> None:
    """Study a compares norms at d_model 32; study b compares placements at d_model 64."""
    edit_run(inputs.finished, root / "a" / "0", config={"study": "a"})
    edit_run(inputs.finished, root / "a" / "1", config={"study": "a", "norm.name": "rmsnorm"})
    edit_run(inputs.finished, root / "b" / "0", config={"study": "b", "model.d_model": 64})
    edit_run(inputs.finished, root / "b" / "1", config={"study": "b", "model.d_model": 64, "norm.placement": "post"})


DAMAGED = [
    pytest.param(
        _truncated_metrics, ["cut: metrics.jsonl: skipped its last line (truncated write)"], id="truncated_metrics"
    ),
    pytest.param(
        _missing_summary,
        ["killed: no summary.json (killed early?); status incomplete", "| killed | ", "| incomplete |"],
        id="missing_summary",
    ),
    # decided: build the report; never pool across the extra axes: the summary names both studies and the size
    # difference, and every comparison is made within a context that fixes model.d_model
    pytest.param(
        _mixed_studies,
        [
            "Study: a, b.",
            "Varied: model.d_model = 32, 64.",
            "study (a, b)",
            "| model.d_model=32, norm.placement=pre | rmsnorm |",
            "| model.d_model=64, norm.name=layernorm | post |",
        ],
        id="mixed_studies",
    ),
]


@pytest.mark.parametrize("make, expect", DAMAGED)
def test_damaged_or_mixed_runs_still_make_a_report(make, expect, inputs: Inputs, tmp_path: Path) -> None:
    make(inputs, tmp_path / "runs")
    out = run_cli([sys.executable, "-m", "analysis.report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(tmp_path / "rep" / "report.html")
    md = (tmp_path / "rep" / "report.md").read_text()
    missing = [s for s in expect if s not in md]
    assert not missing, f"{missing} not in report.md"


def test_mixed_studies_are_flagged_in_the_summary(inputs: Inputs, tmp_path: Path) -> None:
    _mixed_studies(inputs, tmp_path / "runs")
    out = run_cli(
        [
            sys.executable,
            "-m",
            "analysis.report",
            str(tmp_path / "runs"),
            "--out",
            str(tmp_path / "rep"),
            "--by",
            "norm.name",
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = (tmp_path / "rep" / "report.md").read_text().split("## 1.")[0]
    warning = [line for line in summary.splitlines() if "differ in more than the compared" in line]
    assert warning and "2 studies (a, b)" in warning[0] and "model.d_model" in warning[0], summary[:1500]


def test_refused_resume_leaves_hydra_copy_alone(inputs: Inputs, tmp_path: Path) -> None:
    run_dir = shutil.copytree(inputs.finished, tmp_path / "finished")
    hydra_dir = run_dir / ".hydra"
    hydra_dir.mkdir(exist_ok=True)  # the fixture ran train() in-process: give it Hydra's copy as a CLI run has
    (hydra_dir / "overrides.yaml").write_text("- debug=smoke\n")
    before = {p.name: p.read_bytes() for p in hydra_dir.iterdir()}
    out = run_cli(
        [
            sys.executable,
            "-m",
            "lm_ablate.train",
            "debug=smoke",
            f"data.cache_dir={inputs.cache}",
            f"hydra.run.dir={run_dir}",
            "model.d_model=64",
        ]
    )
    assert out.returncode == 2 and "of another config" in out.stderr
    assert {p.name: p.read_bytes() for p in hydra_dir.iterdir()} == before


# ----------------------------------------------------- sweeps: every arm is validated before any job is launched
SWEEP_CASES = [
    # (sweep overrides, the bad arm as labelled, substrings of its error); the bad arm is the last one, so a
    # sweep that stopped at it would have run the good arm before it
    pytest.param(
        ("model.n_heads=2,3",),
        "model.n_heads=3",
        ("model.n_heads=3 is invalid", "must divide model.d_model=32"),
        id="validate",
    ),
    pytest.param(
        ("norm.placement=pre,bogus",),
        "norm.placement=bogus",
        ("norm.placement='bogus' is invalid", "allowed: deepnorm"),
        id="registry",
    ),
    pytest.param(
        ("norm=layernorm,rmsnrom",),
        "norm=rmsnrom",
        ("norm='rmsnrom' is invalid: no such option", "allowed: layernorm, none, rmsnorm"),
        id="unknown_group_option",
    ),
    pytest.param(
        ("model.n_heads=2,3", "hydra/launcher=local_parallel", "train.threads=1"),
        "model.n_heads=3",
        ("model.n_heads=3 is invalid",),
        id="joblib_launcher",
    ),
    pytest.param(
        ("model.n_heads=2,3", "hydra/launcher=slurm"),
        "model.n_heads=3",
        ("model.n_heads=3 is invalid",),
        id="slurm_launcher",
    ),  # on a cluster (sbatch and srun on PATH, stand-ins here that fail if called): refused before submitting
]


def multirun(inputs: Inputs, tmp_path: Path, *overrides: str, env: dict | None = None):
    """``python -m lm_ablate.train --multirun`` on the smoke config, sweep directory ``tmp_path/sweep``."""
    return run_cli([sys.executable, "-m", "lm_ablate.train", "--multirun", "debug=smoke", "tracking=none",
                    "train.max_steps=2", f"data.cache_dir={inputs.cache}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                    *overrides], env=env)  # fmt: skip


def fake_slurm(folder: Path) -> dict:
    """An environment whose PATH has ``sbatch`` and ``srun`` (stand-ins that fail), as on a SLURM login node."""
    folder.mkdir()
    for name in ("sbatch", "srun"):
        (folder / name).write_text("#!/bin/sh\necho called >&2\nexit 1\n")
        (folder / name).chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.parametrize("sweep, arm, expect", SWEEP_CASES)
def test_multirun_with_a_bad_arm_runs_nothing(sweep, arm, expect, inputs: Inputs, tmp_path: Path) -> None:
    env = fake_slurm(tmp_path / "bin") if "hydra/launcher=slurm" in sweep else None
    out = multirun(inputs, tmp_path, *sweep, env=env)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"lm-ablate: error: {arm}: "), out.stderr[-3000:]
    missing = [s for s in expect if s not in lines[0]]
    assert not missing, f"{missing} not in {lines[0]!r}"
    assert "Launching jobs" not in out.stdout + out.stderr
    assert not (tmp_path / "sweep").exists(), "the sweep created its directory (or a job's) before refusing"


def test_study_with_a_bad_swept_override_runs_nothing(inputs: Inputs, tmp_path: Path) -> None:
    """norm_2x2 is 2 norms x 2 placements x 3 seeds; a swept override adds 2 head counts: 24 arms, 12 bad."""
    out = run_cli(
        [
            sys.executable,
            "-m",
            "lm_ablate.study",
            "norm_2x2",
            "--out",
            str(tmp_path / "sweep"),
            "debug=smoke",
            f"data.cache_dir={inputs.cache}",
            "model.n_heads=2,3",
        ]
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [
        "lm-ablate: error: 12 of 24 arms (norm=layernorm norm.placement=pre seed=0 model.n_heads=3, ..., "
        "norm=rmsnorm norm.placement=post seed=2 model.n_heads=3): model.n_heads=3 is invalid: "
        + lines[0].split("model.n_heads=3 is invalid: ", 1)[-1]
    ], out.stderr[-3000:]  # one error shared by 12 arms: one line
    assert "must divide model.d_model" in lines[0]
    assert not (tmp_path / "sweep").exists()
    assert "building the report" not in out.stdout


def test_good_multirun_runs_every_arm(inputs: Inputs, tmp_path: Path) -> None:
    out = multirun(inputs, tmp_path, "train.eval_every=2", "train.probe_every=0", "train.peak_flops=1e12",
                   "norm=layernorm,rmsnorm")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    statuses = [json.loads((tmp_path / "sweep" / str(i) / M.SUMMARY_FILE).read_text())[M.STATUS] for i in range(2)]
    assert statuses == [M.STATUS_COMPLETED] * 2


def test_sweep_check_skips_other_sweepers_and_pickles() -> None:
    """An optimizing sweeper (Optuna) picks its arms as it goes: nothing to expand, each job validates itself.
    Launchers that run jobs elsewhere (joblib, submitit) pickle the callbacks along with the job."""
    import pickle

    from omegaconf import OmegaConf

    from lm_ablate.sweep_check import ValidateSweep

    cfg = OmegaConf.create(
        {
            "hydra": {
                "sweeper": {
                    "_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
                    "params": {"model.n_heads": "choice(2, 3)"},
                }
            }
        }
    )
    assert ValidateSweep().on_multirun_start(cfg) is None  # would need Hydra's loader if it expanded anything
    assert isinstance(pickle.loads(pickle.dumps(ValidateSweep())), ValidateSweep)


@pytest.mark.parametrize(
    "study, extra",
    [
        ("regularization", ()),  # 4 group options x 3 seeds
        (
            "parallel_vs_serial",
            ("arch=llama,gpt2", "norm.eps=1e-6", "+model.foo=1", "++train.batch_size=8"),
        ),
    ],
)
def test_sweep_check_composes_each_arm_as_hydra_does(study: str, extra: tuple[str, ...]) -> None:
    """The check composes once per distinct set of group overrides and applies the value overrides to a copy;
    every arm must come out exactly as Hydra's own composition of that arm (here the groups are found through
    hydra.searchpath, which the loader's default repository does not know)."""
    import copy

    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from lm_ablate.config import CONF_DIR, job_config
    from lm_ablate.study import SWEEPS_DIR
    from lm_ablate.sweep_check import ArmChecker, sweep_arms, sweep_errors

    overrides = [f"hydra.searchpath=[file://{CONF_DIR}]", "hydra.sweep.dir=/nonexistent", *extra]
    with initialize_config_dir(str(SWEEPS_DIR), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        master = hydra.compose_config(study, overrides, run_mode=RunMode.MULTIRUN)
        checker, arms = ArmChecker(master), sweep_arms(master)
        for arm in arms:
            groups, values = checker._split(arm)
            fast = copy.deepcopy(checker._compose(groups))
            checker.apply(values, fast)
            full = job_config(hydra.config_loader.load_sweep_config(master, arm))
            assert OmegaConf.to_container(fast) == OmegaConf.to_container(full), arm
        assert len(checker.composed) < len(arms)
        errors = sweep_errors(master)
    if "+model.foo=1" in extra:  # every arm has the same error: one line for all of them
        assert len(errors) == 1 and errors[0].startswith(f"{len(arms)} of {len(arms)} arms (")
        assert ": model.foo=1 is invalid: unknown key; keys of model" in errors[0]
    else:
        assert errors == []


@pytest.mark.parametrize("module", ["lm_ablate.study", "lm_ablate.cost", "analysis.report", "analysis.wandb_dashboard"])
def test_help_is_printed_as_written(module: str) -> None:
    """``--help`` prints the usage and exits 0 (lm_ablate.cost once took it for a Hydra override), with no
    argparse escaping left in it (analysis.report showed "95%%")."""
    out = run_cli([sys.executable, "-m", module, "--help"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"usage: python -m {module}") and "%%" not in out.stdout and not out.stderr


# ------------------------------------------------------------------------------ a hub that cannot be reached
NO_HUB = {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # discard port


@pytest.mark.parametrize("args", [("data=hf", "data.path=wikitext"), ("eval=olmes",)], ids=["data", "eval"])
def test_an_unreachable_hub_is_one_line_and_writes_nothing(args, inputs: Inputs, tmp_path: Path) -> None:
    """A hub dataset with no network (here: offline mode off, the hub's endpoint a port nothing listens on, so
    the same on a machine with a network) is one line, without huggingface_hub's five retries (~25 s, each line
    twice) and their log lines, which also left Hydra's train.log in the refused run's folder; no token-cache
    path is announced for tokens never written."""
    cache = tmp_path / "cache"
    if "eval=olmes" in args:  # the training data are cached already: only the tasks need the hub
        cache = Path(shutil.copytree(inputs.cache, cache))
    before = {p for p in cache.rglob("*") if p.is_file()}
    run = tmp_path / "run"
    out = run_cli([sys.executable, "-m", "lm_ablate.train", "debug=smoke", f"hydra.run.dir={run}",
                   f"data.cache_dir={cache}", *args], env=NO_HUB)  # fmt: skip
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, lines
    key = "data.path='wikitext'" if "data=hf" in args else "eval.tasks.0.path='allenai/ai2_arc'"
    assert lines[0].startswith(f"lm-ablate: error: {key}") and "hub cannot be reached" in lines[0], lines[0]
    assert "not in the cache" in lines[0]
    assert not run.exists(), sorted(run.rglob("*"))
    assert {p for p in cache.rglob("*") if p.is_file()} == before


def test_the_hub_is_asked_once_and_a_refusal_takes_no_retries(tmp_path, monkeypatch) -> None:
    """lm_ablate.data.hub: one request decides (no back-off), the answer is kept for the process, and a dataset
    that is not in the cache is HubUnreachable at once, without a log line (which would create Hydra's job log)."""
    import logging
    import time

    import datasets
    from huggingface_hub import constants

    import lm_ablate.data.hub as hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    hub._answer.cache_clear()
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        tic = time.perf_counter()
        with pytest.raises(hub.HubUnreachable, match=r"127\.0\.0\.1:9 did not answer.*not in the cache"):
            hub.load_from_hub("someone/some-dataset", cache_dir=str(tmp_path))
        assert time.perf_counter() - tic < hub.HUB_TIMEOUT_S
    finally:
        logging.getLogger().removeHandler(handler)
    assert [r.getMessage() for r in records if r.levelno >= logging.INFO] == []
    assert hub._answer.cache_info().misses == 1
    assert hub.unreachable() is not None and hub._answer.cache_info().hits == 1
    assert constants.HF_HUB_OFFLINE is False and datasets.config.HF_HUB_OFFLINE is False  # set back
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub.unreachable() == "offline mode is set: HF_HUB_OFFLINE or HF_DATASETS_OFFLINE"
    hub._answer.cache_clear()


def test_cost_takes_overrides_after_its_options(capsys) -> None:
    """docs/distributed.md's form, `--world 8` between overrides, was refused (argparse stopped collecting the
    overrides at the first option); overrides anywhere give the same estimate as overrides first."""
    from lm_ablate.cost import main

    assert main(["ladder=gpu", "ladder.rung=5", "--world", "8", "train.parallel=fsdp"]) == 0
    between = capsys.readouterr().out
    assert "train.parallel=fsdp, 8 ranks" in between and "config            ladder=gpu ladder.rung=5 train." in between
    assert main(["ladder=gpu", "ladder.rung=5", "train.parallel=fsdp", "--world", "8"]) == 0
    assert capsys.readouterr().out == between
    with pytest.raises(SystemExit):  # an unknown option is still argparse's error
        main(["model=tiny", "--wrold", "2"])
    assert "unrecognized arguments: --wrold" in capsys.readouterr().err


def _list_keys(schema: type, prefix: str = "") -> list[str]:
    """Every list-typed key of the config schema (lm_ablate/schema.py), dotted."""
    import dataclasses
    import typing

    out = []
    for f in dataclasses.fields(schema):
        hint = typing.get_type_hints(schema)[f.name]
        if typing.get_origin(hint) is typing.Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if dataclasses.is_dataclass(hint):
            out += _list_keys(hint, f"{prefix}{f.name}.")
        elif typing.get_origin(hint) is list:
            out.append(f"{prefix}{f.name}")
    return out


def test_every_list_key_says_its_form_in_one_line() -> None:
    """A list-typed key given a scalar leaked OmegaConf's "str is not a ListConfig, list or tuple": one line naming
    the key, what its entries are (from the schema) and how a list is written."""
    from lm_ablate.config import Config, compose, compose_error_message

    keys = _list_keys(Config)
    assert {"ladder.budgets", "tracking.tags", "train.extrapolation", "ladder.rungs", "eval.tasks"} <= set(keys)
    kinds = {"ladder.budgets": "numbers", "tracking.tags": "strings", "train.extrapolation": "integers",
             "ladder.rungs": "mappings", "eval.tasks": "mappings"}  # fmt: skip
    for key in keys:
        with pytest.raises(Exception) as err:
            compose([f"{key}=abc"])
        line = compose_error_message(err.value)
        assert line is not None and line.startswith(f"{key}='abc' is invalid: must be a list of "), line
        assert "ListConfig" not in line and "\n" not in line and f"e.g. {key}=[" in line
        if key in kinds:
            assert f"a list of {kinds[key]} in brackets" in line, line


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            ["ladder.budgets=[0.0001,1]"],
            "budget 0.0001 gives rung 0 (N = 40,680 non_embedding parameters) 82 tokens, "
            "less than one step of 2,048 tokens: raise the smallest budget",
        ),
        (
            ["ladder.budgets=[0.1,1]", "optim.decay_fraction=1"],
            "budget 0.1 gives rung 0 (N = 40,680 non_embedding "
            "parameters) 40 steps, all of them its decay (optim.decay_fraction=1): no step at the peak LR",
        ),
        (["ladder.budgets=[0.1,1]", "optim.warmup_steps=35"], "inside the warm-up of optim.warmup_steps=35"),
    ],
    ids=["below_one_step", "all_decay", "inside_warmup"],
)
def test_a_branch_budget_below_one_step_has_its_own_message(overrides, words) -> None:
    """docs/ladders.md: a budget of less than one step is refused as such; a smaller budget of ladder.budgets got
    the warm-up message ("shorten the warm-up" of a 0-step warm-up). 40,680: rung 0 of the CPU ladder, bytes;
    82 = ceil(20 x 0.0001 x 40,680); a step is 16 x 128 tokens."""
    from lm_ablate.config import ConfigError, compose
    from lm_ablate.ladder import check_ladder

    cfg = compose(["ladder=cpu", "optim.schedule=wsd", *overrides])
    with pytest.raises(ConfigError) as err:
        check_ladder(cfg, 256)
    line = str(err.value)
    assert line.startswith("ladder.budgets=") and words in line and "\n" not in line, line
    if "warmup_steps" not in " ".join(overrides):
        assert "warm-up" not in line


def _cached_hub_dataset(cache: Path, name: str, texts: list[str], work: Path) -> None:
    """``datasets``' cache of hub dataset ``name`` (``<cache>/<user>___<name>/default/0.0.0/<hash>/``), as a
    download leaves it, made here from a local file by datasets' own json builder (no network)."""
    import datasets

    rows = work / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    datasets.load_dataset("json", data_files={"train": str(rows)}, cache_dir=str(work / "built"))
    (built,) = (p.parent for p in (work / "built").rglob("dataset_info.json"))
    target = cache / name.replace("/", "___") / "default" / "0.0.0" / built.name
    shutil.copytree(built, target)
    for arrow in target.glob("json-*.arrow"):
        arrow.rename(target / arrow.name.replace("json-", f"{name.split('/')[-1]}-"))


def test_a_hub_dataset_in_the_cache_is_read_when_the_hub_does_not_answer(tmp_path, monkeypatch) -> None:
    """The other side of one request: a hub dataset downloaded earlier trains offline, from the datasets cache
    (data.cache_dir/hf), with no retries; the tokens are its rows'."""
    import logging

    import datasets
    from huggingface_hub import constants

    import lm_ablate.data.hub as hub
    from lm_ablate.config import compose
    from lm_ablate.data import load_data

    texts = [f"row {i}: to be or not to be" for i in range(20)]
    _cached_hub_dataset(tmp_path / "cache" / "hf", "someone/tiny", texts, tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    hub._answer.cache_clear()
    requests: list[str] = []  # huggingface_hub's retry warnings ("Retrying in 1s [Retry 1/5]")
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: requests.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("huggingface_hub").addHandler(handler)
    try:
        cfg = compose(
            ["data=hf", "data.path=someone/tiny", f"data.cache_dir={tmp_path / 'cache'}", "data.val_fraction=0.1"]
        )
        data = load_data(cfg.data)
    finally:
        hub._answer.cache_clear()
        logging.getLogger("huggingface_hub").removeHandler(handler)
    assert [m for m in requests if "Retry" in m or "thrown while requesting" in m] == []  # read, not asked
    assert data.meta["train_docs"] + data.meta["val_docs"] == len(texts) and data.meta["val_docs"] == 2
    text = bytes(np.asarray(data.train, np.uint8)).decode() + bytes(np.asarray(data.val, np.uint8)).decode()
    assert all(t in text for t in texts)
