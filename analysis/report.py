"""Build the ablation report: one self-contained HTML file, the same in Markdown, and the tables as CSV and
Parquet. The pipeline's top: runs from the sources, numbers and verdicts from compute/, the document from
present/, and the files.

Usage::

    python -m analysis.report [PATH ...] [--wandb ENTITY/PROJECT [--group G] [--offline]] --out DIR
                              [--by KEY ...] [--baseline KEY=VALUE] [--title T] [--workers N]
                              [--fit FORM] [--fit-budgets B[,B ...]]

Runs come from run directories (PATHs), W&B run files on disk (PATHs too: a run's ``wandb/`` folder, its
``offline-run-*`` folders, ``run-*.wandb`` files, or folders holding them; read without W&B's service or network
by analysis/sources/wandb_offline.py), a W&B project (``--wandb``; cached under DIR/wandb_cache so ``--offline``
rebuilds without the network), or several at once. ``--fit`` and ``--fit-budgets`` refit a ladder's recorded
runs with another form or only some of its budgets (over the runs' ``ladder.fit``, ``ladder.fit_budgets``; the
report says so); nothing is trained again and no run record changes.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.cli import Parser, error
from analysis.compute.claims import annotate_comparisons, evaluate_claims
from analysis.compute.compare import compare_runs, lr_sweep
from analysis.compute.scaling import scaling_study
from analysis.parallel import default_workers
from analysis.present.document import figures_in, render_html, render_markdown
from analysis.present.report import build_blocks, default_title, report_columns
from analysis.sources.combined import load_sources
from analysis.sources.load import AnalysisError
from lm_ablate.sweep_check import unwritable
from lm_ablate.validation import FIT_FORMS, TUNABLE

__all__ = ["AnalysisError", "build_report", "main"]  # what lm_ablate.study and scripts/gallery.py call


def write_table(df: pd.DataFrame, out: Path, stem: str) -> None:
    """``stem``.csv and ``stem``.parquet. Parquet needs one type per column: a column mixing types (a config
    key that is a number in one run and text in another) is written as text there."""
    df.to_csv(out / f"{stem}.csv", index=False)
    import pyarrow as pa

    frame = df.copy()
    for col in frame.columns:
        if frame[col].dtype == object:
            try:
                pa.array(frame[col], from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                frame[col] = frame[col].map(_text_or_null)
    frame.to_parquet(out / f"{stem}.parquet", index=False)


def _text_or_null(v: Any) -> Any:
    return v if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def check_out_dir(path: str | Path, flag: str = "--out") -> None:
    """Raise :class:`AnalysisError` (one line naming ``flag``, the path and why) unless ``path`` is a folder this
    process can create and write into; checked before any work, and nothing is left behind."""
    why = unwritable(path)
    if why is not None:
        raise AnalysisError(
            f"{flag} {path}: cannot create or write into this folder ({why}); allowed: a writable folder"
        )


def build_report(
    paths: Sequence[str | Path] | str | Path | None,
    out_dir: str | Path,
    by: Sequence[str] | None = None,
    baseline: str | None = None,
    title: str | None = None,
    smoothing: float = 0.9,
    wandb: str | None = None,
    group: str | None = None,
    offline: bool = False,
    workers: int | None = None,
    fit: str | None = None,
    fit_budgets: Sequence[float] | None = None,
    tune: Sequence[str] | None = None,
) -> Path:
    """Load the runs under ``paths`` (and/or of the W&B project ``wandb``), compare them and write
    report.html, report.md (with its PNGs), runs.csv/.parquet, comparisons.csv/.parquet and, when the
    learning rate varies, lr_sweep.csv/.parquet and lr_points.csv/.parquet, and when the runs' study declares
    claims, claims.csv/.parquet (comparisons.csv then names the claims each row decided) into ``out_dir``.
    Returns the path of report.html.

    ``baseline`` is ``"KEY=VALUE"``. ``workers``: processes for loading and drawing (default: the CPUs this
    process may use, at most 8). ``fit``, ``fit_budgets``, ``tune``: the scaling fit's form, budgets and the keys
    tuned per cell, over what the runs recorded (analysis/compute/scaling.py). Raises :class:`AnalysisError` (one
    line) for no runs or a bad key.
    """
    workers = default_workers() if workers is None else max(1, workers)
    if fit is not None and fit not in FIT_FORMS:
        raise AnalysisError(f"--fit={fit} is invalid: allowed: {', '.join(FIT_FORMS)}")
    if tune is not None and (not tune or any(k not in TUNABLE for k in tune)):
        raise AnalysisError(f"--tune={','.join(tune)} is invalid: allowed: keys among {', '.join(TUNABLE)}")
    check_out_dir(out_dir)
    rs = load_sources(paths, out_dir, wandb, group, offline, workers, keep=report_columns)
    cs = compare_runs(rs, by=by, baseline=baseline)
    sweep = lr_sweep(rs)
    scaling = scaling_study(rs, baseline, fit=fit, fit_budgets=fit_budgets, tune=tune)
    if scaling is None and (fit is not None or fit_budgets or tune is not None):
        flag = "--fit" if fit is not None else "--fit-budgets" if fit_budgets else "--tune"
        raise AnalysisError(f"{flag} is invalid for these runs: it refits a ladder, and they do not vary model size; "
                            "allowed: runs of a ladder study (ladder.rung swept)")  # fmt: skip
    claims = evaluate_claims(rs, scaling=scaling)
    title = title or default_title(rs)
    blocks = build_blocks(rs, cs, title, smoothing, sweep, workers, scaling=scaling, claims=claims)
    out = Path(out_dir)
    try:  # checked at the start; the folder can still vanish or the disk fill up while the report is drawn
        out.mkdir(parents=True, exist_ok=True)
        for fig in figures_in(blocks):
            (out / fig.file_name).write_bytes(fig.figure.png)
        (out / "report.md").write_text(render_markdown(blocks), encoding="utf-8")
        write_table(rs.runs, out, "runs")
        write_table(annotate_comparisons(cs.table, claims), out, "comparisons")
        if claims.results:
            write_table(claims.table, out, "claims")
        if sweep is not None:
            write_table(sweep.best, out, "lr_sweep")
            write_table(sweep.points, out, "lr_points")
        if scaling is not None:
            write_table(scaling.table, out, "scaling")
            write_table(scaling.rung_table, out, "scaling_rungs")
            write_table(scaling.forms_table, out, "scaling_forms")  # every form side by side
            write_table(scaling.ranking_table, out, "scaling_ranking")  # the single-rung ranking
        path = out / "report.html"
        path.write_text(render_html(blocks, title), encoding="utf-8")
    except OSError as err:
        raise AnalysisError(
            f"--out {out_dir}: cannot write the report: {err.strerror or err} ({err.filename})"
        ) from None
    return path.resolve()


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m analysis.report",
        description="Compare lm-ablate runs: tables with 95% CIs, curves, and a self-contained HTML report.",
    )
    parser.add_argument("paths", nargs="*", help="run directories, multirun roots, or folders holding them; also "
                        "W&B runs on disk (a run's wandb/ folder, offline-run-* folders, run-*.wandb files, or "
                        "folders holding them), read where no run record stands for them")  # fmt: skip
    parser.add_argument("--out", required=True, help="directory to write report.html, report.md and CSVs into")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also (or only) report on this W&B project")
    parser.add_argument("--group", help="with --wandb: only the runs of this W&B group")
    parser.add_argument("--offline", action="store_true",
                        help="with --wandb: use only the cache in OUT/wandb_cache (no network); W&B offline "
                        "runs (wandb/offline-run-*) are PATHs instead")  # fmt: skip
    parser.add_argument("--by", action="append", metavar="KEY", help="config key to compare (repeatable)")
    parser.add_argument("--baseline", metavar="KEY=VALUE", help="baseline arm, e.g. norm.name=layernorm")
    parser.add_argument("--title", help="report title (default: from the study name)")
    parser.add_argument("--workers", type=int, help="processes for loading and drawing (default: CPUs, max 8)")
    parser.add_argument("--fit", metavar="FORM", help=f"a ladder's scaling fit form: {', '.join(FIT_FORMS)} "
                        "(default: the runs' ladder.fit)")  # fmt: skip
    parser.add_argument("--fit-budgets", metavar="B[,B...]", help="fit only the cells of these budgets, e.g. 1 "
                        "(default: the runs' ladder.fit_budgets, else every budget)")  # fmt: skip
    parser.add_argument("--tune", metavar="KEY[,KEY...]", help="keys each ladder cell takes its best value of, "
                        f"with the LR, among {', '.join(TUNABLE)} (default: the runs' ladder.tune)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        path = build_report(
            args.paths, args.out, by=args.by, baseline=args.baseline, title=args.title, wandb=args.wandb,
            group=args.group, offline=args.offline, workers=args.workers, fit=args.fit,
            fit_budgets=_budget_list(args.fit_budgets), tune=args.tune.split(",") if args.tune else None,
        )  # fmt: skip
    except AnalysisError as exc:
        return error(exc)
    print(path)  # last line of stdout, so scripts can take it with `tail -n1`
    return 0


def _budget_list(text: str | None) -> list[float] | None:
    """--fit-budgets "0.5,1" -> [0.5, 1.0]; one line for anything but positive numbers."""
    if text is None:
        return None
    try:
        out = [float(b) for b in text.split(",")]
    except ValueError:
        out = []
    if not out or not all(math.isfinite(b) and b > 0 for b in out):
        raise AnalysisError(f"--fit-budgets {text} is invalid: allowed: budgets the runs trained, comma-separated, "
                            "e.g. 1 or 0.5,1")  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main())
