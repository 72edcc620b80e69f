"""The results gallery: every study at full size, its report under results/<study>/, and one table of claims.

    python scripts/gallery.py run [STUDY ...]   # train the studies (default: all) into runs/gallery/<study>
    python scripts/gallery.py build             # rebuild results/ from runs/gallery/: each report's markdown,
                                                # figures and tables, runs.csv, and results/README.md
    python scripts/gallery.py check STUDY [--run NAME]   # rerun one committed run, compare its final val loss

``run`` calls ``python -m lm_ablate.study STUDY --out runs/gallery/STUDY tracking=none train.progress=false`` one
study after the other and appends each one's wall time, thread count and load average to runs/gallery/times.txt
(time it on an otherwise idle machine; ``--launcher joblib`` trains two runs of one study side by side, one core
each; ``--threads 1`` adds ``train.threads=1``, for two ``run`` commands side by
side, one core each). ``build`` only reads the run records, so the reports can be rebuilt with newer
analysis code without training again; a study without runs keeps its committed folder and rows, and with no runs
at all ``build`` refuses (exit 2) and writes nothing. Figures are re-encoded with a 256-, 128- or 64-colour palette (and
then scaled down) when a study's folder would pass FOLDER_LIMIT.

``build`` also writes results/<study>/runs.csv, one row per run: its name, arm (each override key a column), seed,
status, stalled, steps, final val loss and downstream scores, what decides its digits (lm_ablate/provenance.py:
torch version, CPU capability and model, threads, device; empty where a run recorded before them did not say) and the
overrides that make its command. ``check`` reruns one of those runs (``--run NAME``; default: the first completed
one) from that command, into a temporary folder with tracking=none, and prints one line: equal digits, or the
difference against the arm's seed spread (std over its seeds in runs.csv) with what differs between the machines.
Exit 1 only when the digits differ although everything recorded matches (docs/running.md, "What reproducible
means here").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from analysis.compute.claims import NOTE_CELL_BEST_LR
from lm_ablate import metrics as M
from lm_ablate import provenance

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "gallery"
RESULTS = ROOT / "results"
SWEEPS = ROOT / "sweeps"
FOLDER_LIMIT = 1_500_000  # bytes of figures per study
STUDIES = [
    "norm_2x2", "pre_vs_post_norm", "prepost_map", "rmsnorm_vs_layernorm", "norm_placement", "position",
    "activation", "attention", "regularization", "lr_sensitivity", "parallel_vs_serial", "optimizer",
    "lr_transfer_base", "lr_transfer", "ladder_activation_base", "ladder_activation", "ladder_arch_base", "ladder_arch",
    "ladder_optimizer_base", "ladder_optimizer", "ffn_ratio", "weight_decay", "heads", "aspect", "vocab",
]  # fmt: skip
# studies whose sweep was trained in parts kept in folders of their own: the report reads them beside runs/gallery/
# <study> (ladder_optimizer: its a_out-1 grids were trained on 2026-12-04 as the study's design then; a fresh
# `python -m lm_ablate.study ladder_optimizer` trains every line into one folder)
PARTS = {"ladder_optimizer": ("ladder_optimizer_a1",)}
# report options over what those runs recorded: the a_out-1 runs predate ladder.fit_budgets and ladder.tune, and
# the a_out-tuned ones were launched before ladder.tune existed, so the build sets both (the report says so)
BUILD_OPTIONS = {"ladder_optimizer": {"fit_budgets": (0.25, 0.5, 1.0), "tune": ("model.mup_output_mult",)}}
KEPT = ("report.md", "claims.csv", "comparisons.csv", "scaling.csv", "scaling_forms.csv", "lr_sweep.csv")


def run(studies: list[str], threads: int | None = None, launcher: str = "basic") -> int:
    RUNS.mkdir(parents=True, exist_ok=True)
    worst = 0
    for study in studies:
        started, load_start = time.time(), _load().replace(" ", ",")
        continued = has_runs(study)  # its folder holds runs already: this part adds to the time of the ones before
        with open(RUNS / f"{study}.log", "a") as log:  # a study run again continues its finished runs' log
            cmd = [sys.executable, "-m", "lm_ablate.study", study, "--out", str(RUNS / study), "--launcher", launcher,
                   "tracking=none", "train.progress=false"]  # fmt: skip
            cmd += [f"train.threads={threads}"] if threads else []
            rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        with open(RUNS / "times.txt", "a") as f:
            # joblib: two jobs side by side, each with half the cores unless told (lm_ablate/study.py): "1x2"
            used = (
                f"{threads or max(1, (os.cpu_count() or 2) // 2)}x2" if launcher == "joblib" else threads or "default"
            )
            f.write(f"{study} rc={rc} seconds={time.time() - started:.0f} threads={used} "
                    f"load_start={load_start}{' continued=1' if continued else ''} load={_load()}\n")  # fmt: skip
        worst = max(worst, rc)
    return worst


def _load() -> str:
    """The 1, 5 and 15-minute load averages, space-separated ("?" where /proc/loadavg is missing)."""
    path = Path("/proc/loadavg")
    return " ".join(path.read_text().split()[:3]) if path.exists() else "?"


def times() -> dict[str, dict[str, str]]:
    """study -> the fields of its last line in runs/gallery/times.txt (rc, seconds, threads, load). A line marked
    ``continued=1`` (the study's folder held runs when it started: resumed after an interruption, or extended with
    more jobs) adds its seconds to the line before it, keeps that line's load at start, and counts ``parts``."""
    out: dict[str, dict[str, str]] = {}
    path = RUNS / "times.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        head, _, load = line.partition(" load=")
        study, *fields = head.split()
        row = {**dict(f.split("=", 1) for f in fields if "=" in f), "load": load or "?"}
        before = out.get(study)
        if row.pop("continued", None) == "1" and before is not None:
            row["seconds"] = f"{float(before['seconds']) + float(row['seconds']):.0f}"
            row["parts"] = str(int(before.get("parts", "1")) + 1)
            if "load_start" in before:
                row["load_start"] = before["load_start"]
        out[study] = row
    return out


def shrink_figures(folder: Path) -> None:
    """Re-encode the PNGs with a palette of 256, then 128, then 64 colours, and last the per-axis panels at
    85%, 70% and 55% of their pixel size, until the folder's figures fit FOLDER_LIMIT."""
    from PIL import Image

    pngs = sorted(folder.glob("*.png"))
    originals = {p: p.read_bytes() for p in pngs}
    for colors, scale in ((256, 1.0), (128, 1.0), (64, 1.0), (64, 0.85), (64, 0.7), (64, 0.55)):
        if sum(p.stat().st_size for p in pngs) <= FOLDER_LIMIT:
            return
        for p in pngs:
            p.write_bytes(originals[p])
            with Image.open(p) as im:
                im = im.convert("RGB")
                if scale < 1.0 and p.name.startswith("fig") and "heatmap" not in p.name:  # the summary figures
                    # (LR sweep, scaling, heatmap) keep their size; the per-axis metric panels shrink
                    im = im.resize((round(im.width * scale), round(im.height * scale)), Image.Resampling.LANCZOS)
                im.quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(p, optimize=True)


def has_runs(study: str) -> bool:
    return any((RUNS / study).glob("*/summary.json"))


def build_study(study: str) -> Path:
    """Rebuild the report of runs/gallery/<study> and copy what results/ keeps into results/<study>."""
    from analysis.report import build_report

    runs = RUNS / study
    report = runs / "report"
    parts = [RUNS / part for part in PARTS.get(study, ())]
    build_report([runs, *parts], report, title=study, **BUILD_OPTIONS.get(study, {}))
    target = RESULTS / study
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in KEPT:
        if (report / name).exists():
            shutil.copy2(report / name, target / name)
    shown = set(re.findall(r"\]\(([^)/]+\.png)\)", (report / "report.md").read_text()))
    for png in report.glob("*.png"):  # only the figures this report shows: an earlier build's extra pages stay out
        if png.name in shown:
            shutil.copy2(png, target / png.name)
    shrink_figures(target)
    runs_table([runs, *parts]).to_csv(target / RUNS_CSV, index=False)
    return target


# --- results/<study>/runs.csv and the check that reruns one of its runs ------------------------------------
RUNS_CSV = "runs.csv"
# overrides the check sets itself (or that name this machine's folders), left out of a run's recorded command
NOT_COMMAND = ("tracking", "train.progress", "train.threads", "train.device", "train.resume", "hydra", "data.cache_dir",
               "data.num_proc")  # fmt: skip


def recorded_overrides(run_dir: Path) -> list[str] | None:
    """The run's command-line overrides (Hydra's .hydra/overrides.yaml) without NOT_COMMAND's; None where the run
    has none (a ladder's decay branch, trained inside its parent's process)."""
    import yaml

    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    lines = yaml.safe_load(path.read_text()) or []
    return [o for o in map(str, lines) if not o.lstrip("+~").partition("=")[0].startswith(NOT_COMMAND)]


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def runs_table(folders: list[Path]) -> pd.DataFrame:
    """One row per run under ``folders``: run, arm (its overrides but the seed, one column per key too), seed,
    status, stalled (judged as the report judges it), steps, final val loss and bits per byte (empty before runs
    recorded it), downstream scores, the provenance
    fields (empty where the run did not record them: a config's explicit train.threads and train.device count as
    recorded) and ``overrides``, the JSON list the check reruns it from."""
    from analysis.sources.load import downstream_keys, load_runs

    runset = load_runs([f for f in folders if f.is_dir()], keep=lambda column: False)
    runs = runset.runs
    rows, keys = [], []
    for _, r in runs.iterrows():
        run_dir = Path(r["run_dir"])
        try:
            summary = M.from_json(json.loads((run_dir / M.SUMMARY_FILE).read_text()))
        except (OSError, ValueError):
            summary = {}
        overrides = recorded_overrides(run_dir)
        arm = [o for o in overrides or [] if _key(o) != M.SEED]
        keys += [_key(o) for o in arm if _key(o) not in keys]
        recorded = {k: summary.get(k) for k in M.PROVENANCE}
        if recorded[M.TORCH_VERSION] is None:  # a run from before provenance was recorded: what its config fixed
            threads, device = r.get("train.threads"), r.get("train.device")
            recorded[M.THREADS] = provenance.value(threads)
            recorded[M.DEVICE] = device if device in ("cpu", "cuda", "mps") else None
        earlier = summary.get(M.PROVENANCE_EARLIER)
        rows.append({
            "run": r[M.RUN_NAME], "arm": ",".join(arm), **{_key(o): o.partition("=")[2] for o in arm},
            M.SEED: r[M.SEED], M.STATUS: r[M.STATUS], M.STALLED: r[M.STALLED], M.STEPS: r[M.STEPS],
            M.FINAL_VAL_LOSS: r[M.FINAL_VAL_LOSS], M.FINAL_VAL_BPB: summary.get(M.FINAL_VAL_BPB),
            **{k: r[k] for k in downstream_keys(runs.columns)},
            **{k: provenance.value(v) for k, v in recorded.items()},
            M.PROVENANCE_EARLIER: json.dumps(earlier) if earlier else None,
            "overrides": json.dumps(overrides) if overrides is not None else None, "run_id": r["run_id"],
        })  # fmt: skip
    lead = ["run", "arm", *keys, M.SEED]
    table = pd.DataFrame.from_records(rows)
    return table[lead + [c for c in table.columns if c not in lead]]


def read_runs(study: str) -> pd.DataFrame:
    """results/<study>/runs.csv (to_csv writes each float's shortest round-trip repr and pandas 3 reads it back
    exactly: equal digits are equal floats)."""
    return pd.read_csv(RESULTS / study / RUNS_CSV, dtype={"run": str, "arm": str})


def pick_run(table: pd.DataFrame, name: str | None) -> pd.Series:
    """The row of run ``name`` (its name or run_id), else the first completed run with a recorded command."""
    if name is None:
        ok = table[(table[M.STATUS] == M.STATUS_COMPLETED) & table["overrides"].notna()]
        if ok.empty:
            raise ValueError("no completed run with a recorded command in runs.csv")
        return ok.iloc[0]
    hit = table[(table["run"] == name) | (table["run_id"].astype(str) == name)]
    if hit.empty:
        shown = ", ".join(table["run"].astype(str).head(4))
        raise ValueError(f"--run={name!r} is invalid: no such run in runs.csv; allowed: a run name ({shown}, ...)")
    return hit.iloc[0]


def seed_spread(table: pd.DataFrame, arm: str) -> tuple[float, int]:
    """(sample standard deviation, n) of the final val loss over the completed seeds of ``arm``."""
    same = table[(table["arm"].fillna("") == arm) & (table[M.STATUS] == M.STATUS_COMPLETED)]
    values = pd.to_numeric(same[M.FINAL_VAL_LOSS], errors="coerce").dropna()
    return (float(values.std(ddof=1)) if len(values) > 1 else math.nan), len(values)


def machine_text(fields: dict) -> str:
    """e.g. "torch 2.13.0+cpu, AVX2 kernels on AMD EPYC, 1 thread, cpu" (with the GPU and CUDA version on CUDA)."""
    value = {k: provenance.value(fields.get(k)) for k in M.PROVENANCE}
    threads = value[M.THREADS]
    parts = [f"torch {value[M.TORCH_VERSION] or '?'}",
             f"{value[M.CPU_CAPABILITY] or '?'} kernels on {value[M.CPU_MODEL] or '?'}",
             f"{threads if threads is not None else '?'} thread{'' if threads == 1 else 's'}",
             value[M.DEVICE] or "?"]  # fmt: skip
    if value[M.DEVICE] == "cuda":
        parts += [f"{value[M.GPU_NAME]}, CUDA {value[M.CUDA_VERSION]}, cuDNN {value[M.CUDNN_VERSION]}"]
    return ", ".join(parts)


def compare(row: pd.Series, rerun: dict, spread: tuple[float, int]) -> tuple[str, int]:
    """(the check's one line, exit status) for a committed run's row and its rerun's summary. Equal digits: the
    final val losses are the same float. Exit 1 only when they differ while every recorded provenance field
    matches this machine's: that run is not reproducible, whatever the seed spread."""
    recorded, now = float(row[M.FINAL_VAL_LOSS]), float(rerun.get(M.FINAL_VAL_LOSS, math.nan))
    differ, missing = provenance.differences(row.to_dict(), rerun)
    same = recorded == now or (math.isnan(recorded) and math.isnan(now))
    earlier = isinstance(row.get(M.PROVENANCE_EARLIER), str)
    if differ:
        why = "the machine differs: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in differ.items())
    elif missing:
        why = f"the committed run did not record {', '.join(missing)} (recorded before lm_ablate/provenance.py)"
    elif earlier:
        why = f"the committed run was resumed on another machine ({M.PROVENANCE_EARLIER} in runs.csv)"
    else:
        why = ""
    if same:
        where = (
            f"on a matching machine ({machine_text(rerun)})" if not why else f"({machine_text(rerun)}), though {why}"
        )
        return f"equal digits: final val loss {recorded!r} recorded and rerun {where}", 0
    std, n = spread
    d = now - recorded
    plural = "s" if n != 1 else ""
    against = (f"{abs(d) / std:.2f}x the arm's seed spread (std {std:.4f} over {n} seeds)" if std > 0
               else f"no seed spread to compare with ({n} completed seed{plural} of this arm)")  # fmt: skip
    numbers = f"recorded {recorded:.6f}, rerun {now:.6f}: difference {d:+.6f}, {against}"
    if not why:
        return f"DIFFERENT digits on a matching machine ({machine_text(rerun)}): {numbers}", 1
    return f"different digits, as expected when {why}: {numbers}", 0


def check(study: str, name: str | None = None) -> int:
    """Rerun one run of results/<study>/runs.csv (see the module docstring) and print the comparison."""
    table = read_runs(study)
    try:
        row = pick_run(table, name)
    except ValueError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        return 2
    if not isinstance(row["overrides"], str):
        print(f"lm-ablate: error: run {row['run']} has no recorded command (a ladder's decay branch is trained by "
              "the run it branches from: check that run)", file=sys.stderr)  # fmt: skip
        return 2
    threads, device = provenance.value(row.get(M.THREADS)), provenance.value(row.get(M.DEVICE))
    with tempfile.TemporaryDirectory(prefix=f"check_{study}_") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "lm_ablate.train", "--config-dir", str(SWEEPS), "--config-name", study,
               "hydra.mode=RUN", f"hydra.run.dir={out}", *json.loads(row["overrides"]), "tracking=none",
               "train.progress=false"]  # fmt: skip
        cmd += [f"train.threads={threads}"] if threads is not None else []
        cmd += ["train.device=cpu"] if device == "cpu" else []
        print(f"check: {study}: rerunning {row['run']}: python {' '.join(cmd[1:])}", file=sys.stderr)
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            print(f"lm-ablate: error: the rerun of {row['run']} failed (exit {done.returncode}): {last}",
                  file=sys.stderr)  # fmt: skip
            return done.returncode
        rerun = M.from_json(json.loads((out / M.SUMMARY_FILE).read_text()))
    line, rc = compare(row, rerun, seed_spread(table, row["arm"] if isinstance(row["arm"], str) else ""))
    print(f"check {study} {row['run']}: {line}")
    return rc


def _number(x: float, ratio: bool) -> str:
    if x == math.inf:
        return "∞"  # a compute multiplier's bootstrap can reach it (the Scaling table shows it so)
    if not math.isfinite(x):
        return "–"
    return f"{x:.3g}x" if ratio else f"{x:+.4f}"


def effect_text(row: pd.Series) -> str:
    ratio = row["null"] == 1
    est = _number(row["estimate"], ratio)
    if est == "–":
        return f"– ({row['why']})" if isinstance(row["why"], str) and row["why"] else "–"
    lo, hi = _number(row["low95"], ratio), _number(row["high95"], ratio)
    listed = str(row["notes"]).split() if isinstance(row.get("notes"), str) else []
    notes = ", ".join(n.replace("_", " ") for n in listed if n != NOTE_CELL_BEST_LR)  # "decided" says that one
    return est + (f" [{lo}, {hi}]" if lo != "–" and hi != "–" else "") + (f" ({notes})" if notes else "")


def decided_text(group: pd.DataFrame) -> str:
    """How a claim was decided, read off its claims.csv rows: each side at its own best LR (the fair-verdict rule,
    issue 23: analysis/compute/claims.py), at the study's one setting, or by the analysis before that rule (a
    claims.csv without the stall columns: a report built from its runs again brings it up to date)."""
    if "arm_stalled" not in group.columns:
        return "earlier rule: one LR for both sides, stalls not checked"
    lrs = pd.to_numeric(group.get("arm_lr", pd.Series(dtype=float)), errors="coerce")
    if group.get("notes", pd.Series(dtype=str)).astype(str).str.contains(NOTE_CELL_BEST_LR).any():
        return "each (arm, rung, budget) at its best LR; stalls checked"
    return "each side at its best LR; stalls checked" if lrs.notna().any() else "one setting; stalls checked"


def claim_rows(study: str, claims: pd.DataFrame) -> list[str]:
    rows = []
    for _, group in claims.groupby("claim_id", sort=False):
        first = group.iloc[0]
        verdict = first["claim_verdict"]
        if len(group) == 1:
            effect = effect_text(first)
        else:  # one claim judged in several contexts: each context's verdict and effect
            effect = "<br>".join(f"{r['context']}: {r['verdict']}, {effect_text(r)}" for _, r in group.iterrows())
        statement = str(first["statement"]).replace("|", "/")
        rows.append(
            f"| [{study}]({study}/report.md) | **{verdict}** | {statement} ({first['metric']}, expect "
            f"{first['expect']}) | {first['source']} | {effect} | {decided_text(group)} | "
            f"`python -m lm_ablate.study {study}` |"
        )
    return rows


CHANGES = "verdict_changes.csv"  # results/: every verdict a rebuild changed (study, claim, before, after, when)
CHANGE_COLUMNS = ["study", "claim_id", "before", "after", "effect_after", "date"]


def verdicts_of(path: Path) -> dict[str, str]:
    """claim id -> its verdict as a whole, from a claims.csv ({} when there is none)."""
    if not path.exists():
        return {}
    claims = pd.read_csv(path)
    return {c: str(g["claim_verdict"].iloc[0]) for c, g in claims.groupby("claim_id", sort=False)}


def record_changes(study: str, before: dict[str, str]) -> None:
    """Append to results/verdict_changes.csv each claim of ``study`` whose verdict this rebuild changed (a claim
    new to the study counts as changed from "–")."""
    path = RESULTS / study / "claims.csv"
    if not path.exists():
        return
    claims = pd.read_csv(path)
    rows = []
    for claim_id, group in claims.groupby("claim_id", sort=False):
        after = str(group["claim_verdict"].iloc[0])
        if before.get(claim_id) != after:
            effect = "<br>".join(f"{r['context']}: {effect_text(r)}" if len(group) > 1 else effect_text(r)
                                 for _, r in group.iterrows())  # fmt: skip
            rows.append([study, claim_id, before.get(claim_id, "–"), after, effect, time.strftime("%Y-%m-%d")])
    if rows:
        log = RESULTS / CHANGES
        old = pd.read_csv(log) if log.exists() else pd.DataFrame(columns=CHANGE_COLUMNS)
        pd.concat([old, pd.DataFrame(rows, columns=CHANGE_COLUMNS)]).to_csv(log, index=False)


def change_lines() -> list[str]:
    """The README's table of results/verdict_changes.csv, newest first."""
    log = RESULTS / CHANGES
    if not log.exists():
        return []
    changes = pd.read_csv(log).iloc[::-1]
    return [
        "## Verdicts changed by a rebuild",
        "",
        f"Every verdict a `gallery.py build` changed, newest first ({CHANGES}): new runs or a new decision rule.",
        "Why each changed: [docs/studies.md](../docs/studies.md#fair-verdicts).",
        "",
        "| date | study | claim | before | after | effect now [95% CI] |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['date']} | [{r['study']}]({r['study']}/report.md) | {r['claim_id']} | {r['before']} | "
            f"**{r['after']}** | {r['effect_after']} |"
            for _, r in changes.iterrows()
        ),  # fmt: skip
        "",
    ]


def _cm_text(row: pd.Series, at: str) -> str:
    cm, lo, hi = (row.get(f"cm_{at}{end}", math.nan) for end in ("", "_low", "_high"))
    if not isinstance(cm, (int, float)) or not math.isfinite(cm):
        return "–"
    beyond = " ⚠" if row.get(f"cm_{at}_beyond_validated") is True else ""
    return f"{_number(cm, True)} [{_number(lo, True)}, {_number(hi, True)}]{beyond}"


def forms_lines(shown: list[str]) -> list[str]:
    """The README's ladder section: every scaling fit form of each ladder study side by side (its
    scaling_forms.csv), the one its claims use in bold."""
    rows = []
    for study in shown:
        path = RESULTS / study / "scaling_forms.csv"
        if not path.exists():
            continue
        forms = pd.read_csv(path)
        if "fit_budgets" not in forms:  # a table written before the fit window's check (one row per form and arm)
            forms["fit_budgets"] = ""
        forms["fit_budgets"] = forms["fit_budgets"].fillna("").astype(str)
        window = forms["fit_budgets"].iloc[0] if len(forms) else ""  # the declared fits' budgets come first
        for (form, budgets), group in forms.groupby(["form", "fit_budgets"], sort=False):
            arms = group[~group["is_baseline"].astype(bool)]
            base = group[group["is_baseline"].astype(bool)]
            chosen = bool(group["chosen"].iloc[0])
            name = f"**{form}** (chosen)" if chosen else str(form)
            if budgets != window:  # the fit window's check: the chosen form on every budget, which no claim reads
                name = f"{form} on budgets {budgets.replace(' ', ', ')} (window check)"
            skipped = group["skipped"].iloc[0]
            if isinstance(skipped, str) and skipped:
                rows.append(f"| [{study}]({study}/report.md) | {name} | – | – | – | – | not fitted: {skipped} |")
                continue
            es = ", ".join(f"{r['arm'].split('=')[-1]} {r['fit_E']:.3g}" for _, r in group.iterrows()
                           if isinstance(r.get("fit_E"), float) and math.isfinite(r["fit_E"]))  # fmt: skip
            score = group["score"].iloc[0]
            score_text = f"{100 * score:.1f}%" if isinstance(score, float) and math.isfinite(score) else "–"
            for _, arm in arms.iterrows():
                versus = f"{arm['arm'].split('=')[-1]} vs {base['arm'].iloc[0].split('=')[-1]}" if len(base) else ""
                rows.append(f"| [{study}]({study}/report.md) | {name} | {int(group['n_params'].iloc[0])} | "
                            f"{score_text} | {versus}: {_cm_text(arm, 'largest')} | {_cm_text(arm, '10x')} | "
                            f"E: {es or '–'} |")  # fmt: skip
    if not rows:
        return []
    return [
        "## Ladders: every fit form side by side",
        "",
        "Each ladder study's losses fitted in every form (analysis/compute/scaling_forms.py: per_arm, shared_e,",
        "shared_e_alpha and, with several token budgets per rung, the L(N, D) forms), from its scaling_forms.csv.",
        "Held-out error: the worst relative error over arms of the largest rung (and each budget) left out and",
        "predicted; the claims use the chosen form (bold: the shared-E form unless its held-out error is above the",
        "goal while another's is within it). Compute multipliers with their 95% bootstrap intervals; ⚠: beyond",
        "the range the held-out check validated. Where a study's fits read a window of its budgets",
        "(ladder.fit_budgets), a last row fits the chosen form on every budget: the window's check, which no claim",
        "reads (a claim it would decide otherwise carries the note fit window decides).",
        "",
        "| study | form | parameters | held-out error | CM at the largest rung [95% CI] | CM at 10x [95% CI] | fits |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def committed_times() -> dict[str, str]:
    """study -> its row of the wall-time table in the results/README.md on disk (kept for studies not rebuilt)."""
    path = RESULTS / "README.md"
    text = path.read_text() if path.exists() else ""
    rows = text.split("## Wall time of each study", 1)[1].splitlines() if "## Wall time" in text else []
    first_cell = {row.split("|")[1].strip(): row for row in rows if row.startswith("| ")}
    return {study: row for study, row in first_cell.items() if study in STUDIES}


def build(studies: list[str]) -> int:
    """Rebuild results/<study> for each of ``studies`` that has runs, then results/README.md over every study in
    results/: claims from each results/<study>/claims.csv, wall times from runs/gallery/times.txt for the studies
    rebuilt now and from the README before for the others. Refused in one line, with nothing written, when none
    of ``studies`` has runs (a fresh clone): the committed results are never replaced by an empty table."""
    ready = [s for s in studies if has_runs(s)]
    if not ready:
        print(f"lm-ablate: error: no runs under {RUNS} for {', '.join(studies)}: nothing to rebuild, results/ left "
              "as committed (python scripts/gallery.py run trains them)", file=sys.stderr)  # fmt: skip
        return 2
    timing, kept_times = times(), committed_times()
    RESULTS.mkdir(exist_ok=True)
    for study in studies:
        if study not in ready:
            print(f"gallery: {study}: no runs under {RUNS / study}; results/{study} kept as it is", file=sys.stderr)
            continue
        before = verdicts_of(RESULTS / study / "claims.csv")
        target = build_study(study)
        record_changes(study, before)
        size = sum(p.stat().st_size for p in target.glob("*.png"))
        print(f"gallery: {study}: {target} ({size / 1e6:.2f} MB of figures)")
    shown = [s for s in STUDIES if (RESULTS / s).is_dir()]
    table = []
    for study in shown:
        if (RESULTS / study / "claims.csv").exists():
            table += claim_rows(study, pd.read_csv(RESULTS / study / "claims.csv"))
    verdicts = [line.split("**")[1] for line in table]
    counts = ", ".join(f"{v}: {verdicts.count(v)}" for v in dict.fromkeys(sorted(verdicts)))
    timed = []
    for s in shown:
        if s in ready and s in timing:
            t = timing[s]
            exit_note = "" if t.get("rc") == "0" else f" (exit {t.get('rc')})"
            start = t.get("load_start", "?").replace(",", " ")
            parts = f" ({t['parts']} parts)" if "parts" in t else ""
            timed.append(f"| {s} | {float(t['seconds']) / 60:.1f} min{parts}{exit_note} | {t.get('threads', 'default')} | "
                         f"{start} | {t['load']} |")  # fmt: skip
        elif s in kept_times:
            cells = [c.strip() for c in kept_times[s].strip().strip("|").split("|")]
            if len(cells) == 4:  # a row written before the load at start was recorded
                cells.insert(3, "–")
            timed.append("| " + " | ".join(cells) + " |")
    text = "\n".join(
        [
            "# Results gallery",
            "",
            "Every study run at its full size (3 seeds; 2 for lr_transfer) on the 2-core CPU machine, with",
            "`python scripts/gallery.py run` (`python -m lm_ablate.study STUDY tracking=none` per study; times below),",
            "and its report rebuilt with `python scripts/gallery.py build`. Each folder holds the report's markdown,",
            "figures and tables (claims.csv, comparisons.csv; runs.csv: each run's final values and the torch version,",
            "CPU, threads and device that decided its digits, [what reproducible means",
            "here](../docs/running.md#what-reproducible-means-here); `python scripts/gallery.py check STUDY` reruns",
            "one). Every verdict below is computed from the runs by",
            "`analysis/compute/claims.py` (held: the 95% interval of arm − baseline excludes 0 in the expected direction;",
            "equal: the 90% interval lies inside ±margin, TOST; contradicted: the interval excludes 0 the other way;",
            "mixed: the contexts disagree). Ratio metrics (tokens/s, attention logit, compute multiplier) are",
            "arm / baseline. These are ~1M-parameter models on 5 MB of Shakespeare: a claim made at scale may not",
            "reproduce here, and when it does not the table says so. Decided: each side at its own best LR of the",
            "study's grid with stalled seeds making a claim inconclusive (the fair-verdict rule), at the study's one",
            "setting (a claim about a fixed regime), or by the earlier rule (a report not yet rebuilt from new runs).",
            "",
            f"**{len(table)} claims**: {counts}.",
            "",
            "| study | verdict | claim (metric, expected) | source | effect [95% CI] | decided | command |",
            "|---|---|---|---|---|---|---|",
            *table,
            "",
            *forms_lines(shown),
            "## Wall time of each study",
            "",
            "On the 2-core machine, measured by `scripts/gallery.py run`. `train.threads` 1: two studies ran side by",
            "side, one core each (`--threads 1`); default: one study alone on both cores. Load: the 1, 5 and 15-minute",
            "load averages when the study started and when it ended (other people's jobs share the machine: a load",
            "above 2 means they took cores too). A study continued (resumed after an interruption, or extended with more",
            "jobs) adds the time of each part.",
            "",
            "| study | wall time | train.threads | load at start | load at end |",
            "|---|---|---|---|---|",
            *timed,
            "",
            *change_lines(),
        ]
    )
    (RESULTS / "README.md").write_text(text)
    print(RESULTS / "README.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gallery.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "build", "check"))
    parser.add_argument("studies", nargs="*", help=f"default: all ({', '.join(STUDIES)}); check: one study")
    parser.add_argument("--run", help="check: the run to rerun (its name in runs.csv; default: the first completed)")
    parser.add_argument("--threads", type=int, help="run: train.threads for every run (1 when two run side by side)")
    parser.add_argument("--launcher", choices=("basic", "joblib"), default="basic",
                        help="run: joblib trains two runs of a study side by side, one core each")  # fmt: skip
    args = parser.parse_intermixed_args(argv)
    if args.action == "check":
        checkable = sorted(
            p.parent.name for p in RESULTS.glob(f"*/{RUNS_CSV}") if (SWEEPS / f"{p.parent.name}.yaml").is_file()
        )
        if len(args.studies) != 1 or args.studies[0] not in checkable:
            allowed = ", ".join(checkable) or "none yet (build writes them)"
            parser.error(f"check needs one study with a results/<study>/{RUNS_CSV} and a sweep, got "
                         f"{' '.join(args.studies) or 'none'}; allowed: {allowed}")  # fmt: skip
        os.chdir(ROOT)
        return check(args.studies[0], args.run)
    studies = args.studies or STUDIES
    unknown = sorted(set(studies) - set(STUDIES))
    if unknown:
        parser.error(f"unknown studies {unknown}; allowed: {', '.join(STUDIES)}")
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    return run(studies, args.threads, args.launcher) if args.action == "run" else build(studies)


if __name__ == "__main__":
    sys.exit(main())
