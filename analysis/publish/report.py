"""Publish a study's findings as a W&B Report: the Findings and the Claims as text with their numbers, then
panel grids of the compared metrics grouped by each compared axis.

Usage::

    python -m analysis.wandb_report --project ENTITY/PROJECT --group STUDY [RUN_DIR ...]
        [--cache DIR] [--offline] [--title T] [--dry-run]

The runs are read as the HTML report reads them (analysis.sources.combined.load_sources): from the run
directories when given, else from the W&B project's group (cached as Parquet under ``--cache``, so
``--offline`` works without a network). The numbers and sentences are the HTML report's (analysis.compute.claims,
analysis.present.sections.claims); the panels show the project's runs of that group live.

The report is described first as plain data (:func:`report_spec`) and then turned into a
``wandb_workspaces.reports.v2.Report`` (:func:`build_report_object`; ``pip install 'lm-ablate[dashboards]'``),
so the layout can be checked and printed (``--dry-run``) without that package or a server. The panel grids
reuse the workspace builder's panel conventions (analysis/publish/dashboard.py): mean line with a min-max band
over the runs sharing a value.

Layout:

* H1 title, the study's description;
* "Findings": the HTML report's list (each claim's verdict with its numbers, the largest effects on final
  val loss, a warning when tokens/s is not to be trusted);
* "Claims": one bullet per claim and context: expectation, effect with its 95% interval, test, verdict;
* per compared axis, "<axis>": a panel grid whose run set is the group's runs grouped by that axis and the
  other varied axes (so arms are only compared within a context, as in the HTML report), with line plots of
  val/train loss and the gradient norm, plus the metrics the axis's claims compare (tokens/s, attention
  logits, spike counts, extrapolation losses, final loss against the LR).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.cli import Parser, error
from analysis.compute.claims import ClaimSet, evaluate_claims, largest_effects, unsteady_speed
from analysis.compute.compare import ComparisonSet, compare_runs
from analysis.compute.scaling import scaling_study
from analysis.present.report import report_columns
from analysis.present.sections.claims import (
    VERDICT_TEXT,
    effect_text,
    expectation_text,
    findings,
    source_short,
    speed_warning,
    test_text,
)
from analysis.publish.dashboard import LOG_Y, parse_project
from analysis.sources.combined import load_sources
from analysis.sources.load import AnalysisError, RunSet
from lm_ablate import metrics as M

BASE_PANELS = (M.VAL_LOSS, M.TRAIN_LOSS, M.GRAD_NORM)
DEFAULT_CACHE = ".cache/lm_ablate/wandb_report"


def _claim_panels(claims: ClaimSet | None, axis_label: str, n_layers: int) -> list[dict[str, Any]]:
    """Panels for the metrics the axis's claims compare (beyond the base loss and grad-norm lines)."""
    if claims is None:
        return []
    metrics = {r.claim.metric_name: r.claim for r in claims.results if r.axis == axis_label}
    panels: list[dict[str, Any]] = []
    for metric, claim in metrics.items():
        if metric == "tokens_per_sec":
            panels.append({"kind": "line", "title": M.TOKENS_PER_SEC, "y": [M.TOKENS_PER_SEC]})
        elif metric == "max_attn_logit":
            ys = [f"{M.LAYER_PREFIX}{i}/{M.MAX_ATTN_LOGIT}" for i in range(n_layers)]
            panels.append({"kind": "line", "title": "max attention logit per layer", "y": ys, "log_y": True})
        elif metric.endswith("spike_rate"):
            count = M.SPIKE_GRAD_NORM_COUNT if metric.startswith("grad") else M.SPIKE_LOSS_COUNT
            panels.append({"kind": "line", "title": count, "y": [count]})
        elif metric in ("val_loss_at_context", "extrapolation_gap"):
            k = int(float(claim.at)) if claim.at is not None else 4
            keys = [M.VAL_LOSS, M.VAL_LOSS_AT.format(k=k)]
            panels.append({"kind": "bar", "title": f"final val loss at 1x and {k}x context", "metrics": keys})
        elif claim.metric == "downstream":  # metric: downstream/<task>/<kind>, the recorded name
            panels.append({"kind": "bar", "title": f"{metric} (last evaluation)", "metrics": [metric]})
        elif metric == "lr_sensitivity":
            panels.append({"kind": "scatter", "title": f"final {M.VAL_LOSS} vs optim.lr", "x": "optim.lr",
                           "y": M.VAL_LOSS, "log_x": True})  # fmt: skip
    return panels


def report_spec(
    project: str,
    rs: RunSet,
    cs: ComparisonSet,
    claims: ClaimSet | None,
    group: str | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """The report as plain data: ``{"entity", "project", "title", "description", "group", "blocks": [...]}``
    with blocks ``{"type": "h1"|"h2"|"p", "text"}``, ``{"type": "list", "items"}`` and ``{"type": "panels",
    "axis", "groupby": [config keys], "panels": [{"kind": "line"|"bar"|"scatter", ...}]}``."""
    entity, proj = parse_project(project)
    study = group or ", ".join(sorted({str(v) for v in rs.runs.get("study", []) if v == v})) or proj
    baselines = {comp.axis.label: comp.baseline for comp in cs.comparisons}
    items = findings(claims, largest_effects(cs), baselines)
    warning = speed_warning(unsteady_speed(rs, cs))
    items += [warning] if warning else []
    blocks: list[dict[str, Any]] = [{"type": "h1", "text": "Findings"}, {"type": "list", "items": items}]
    if claims is not None and claims.results:
        lines = []
        for r in claims.results:
            c = r.claim
            context = "" if r.context == "all runs" else f" [{r.context}]"
            test = test_text(r.effect)
            lines.append(
                f"{c.id} ({source_short(c)}){context}: expected {expectation_text(c)}; "
                f"{effect_text(r.effect, c)}" + (f" ({test})" if test else "") + f": {VERDICT_TEXT[r.verdict]}."
            )
        blocks += [
            {"type": "h1", "text": "Claims"},
            {"type": "p", "text": "Each claim of the study, decided from its runs: held when the 95% interval of "
             "arm − baseline (arm / baseline for ratios) lies on the expected side of 0 (1), contradicted when "
             "it lies on the other side, 'equal' by two one-sided tests at the margin; inconclusive otherwise."},
            {"type": "list", "items": lines},
        ]  # fmt: skip
    n_layers = int(max([cfg.get("model.n_layers", 0) for cfg in rs.configs.values()] or [0]) or 0)
    for comp in cs.comparisons:
        others = [a for a in cs.varied if not set(a.keys) & set(comp.axis.keys)]
        panels = [{"kind": "line", "title": f"{m} by {comp.axis.label}", "y": [m], "log_y": m in LOG_Y}
                  for m in BASE_PANELS]  # fmt: skip
        panels += _claim_panels(claims, comp.axis.label, n_layers)
        blocks.append({"type": "h2", "text": f"{comp.axis.label}: " + " vs ".join(comp.arms)})
        blocks.append({"type": "panels", "axis": comp.axis.name, "groupby": [comp.axis.name, *(a.name for a in others)],
                       "panels": panels})  # fmt: skip
    return {
        "entity": entity,
        "project": proj,
        "title": title or f"lm-ablate: {study}",
        "description": f"Claims and findings of the {study} study (lm-ablate), with its runs' panels.",
        "group": group,
        "blocks": blocks,
    }


def build_report_object(spec: dict[str, Any]) -> Any:
    """The ``wandb_workspaces.reports.v2.Report`` for a :func:`report_spec` (not saved)."""
    import wandb_workspaces.reports.v2 as wr

    filters = f"Metric('Group') == {spec['group']!r}" if spec["group"] else ""
    blocks: list[Any] = []
    for b in spec["blocks"]:
        if b["type"] == "h1":
            blocks.append(wr.H1(b["text"]))
        elif b["type"] == "h2":
            blocks.append(wr.H2(b["text"]))
        elif b["type"] == "p":
            blocks.append(wr.P(b["text"]))
        elif b["type"] == "list":
            blocks.append(wr.UnorderedList(items=list(b["items"])))
        elif b["type"] == "panels":
            runset = wr.Runset(entity=spec["entity"], project=spec["project"], name=b["axis"], filters=filters,
                               groupby=[f"config.{k}" for k in b["groupby"]])  # fmt: skip
            blocks.append(wr.PanelGrid(runsets=[runset], panels=[_panel(wr, p) for p in b["panels"]]))
        else:
            raise ValueError(f"unknown block type {b['type']!r}")
    return wr.Report(project=spec["project"], entity=spec["entity"], title=spec["title"],
                     description=spec["description"], blocks=blocks, width="fluid")  # fmt: skip


def _panel(wr: Any, p: dict[str, Any]) -> Any:
    if p["kind"] == "line":
        return wr.LinePlot(title=p["title"], y=list(p["y"]), groupby_aggfunc="mean", groupby_rangefunc="minmax",
                           log_y=p.get("log_y") or None)  # fmt: skip
    if p["kind"] == "bar":
        return wr.BarPlot(title=p["title"], metrics=list(p["metrics"]), groupby_aggfunc="mean",
                          groupby_rangefunc="minmax")  # fmt: skip
    if p["kind"] == "scatter":
        return wr.ScatterPlot(title=p["title"], x=wr.Config(p["x"]), y=wr.SummaryMetric(p["y"]),
                              log_x=p.get("log_x") or None)  # fmt: skip
    raise ValueError(f"unknown panel kind {p['kind']!r}")


def collect(
    project: str, paths: Sequence[str], group: str | None, cache: str, offline: bool
) -> tuple[RunSet, ComparisonSet, ClaimSet]:
    """Runs (the run directories ``paths``, else the W&B group), their comparisons and claims, as the HTML report
    computes them."""
    if paths:  # the run records themselves; --group still names the W&B runs the panels show
        rs = load_sources(paths, cache, keep=report_columns)
    else:
        rs = load_sources(None, cache, wandb=project, group=group, offline=offline, keep=report_columns)
    cs = compare_runs(rs)
    return rs, cs, evaluate_claims(rs, scaling=scaling_study(rs))


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m analysis.wandb_report",
        description="Publish a study's Findings and Claims, with panels grouped by its compared axes, as a W&B Report.",
    )
    parser.add_argument("paths", nargs="*", help="run directories (default: the runs of --group in --project)")
    parser.add_argument("--project", required=True, metavar="ENTITY/PROJECT")
    parser.add_argument("--group", help="the study's W&B group (the loop logs a study as a group)")
    parser.add_argument("--cache", default=DEFAULT_CACHE, help=f"where W&B runs are cached (default {DEFAULT_CACHE})")
    parser.add_argument("--offline", action="store_true", help="read W&B runs from the cache only (no network)")
    parser.add_argument("--title", help="report title (default: lm-ablate: <study>)")
    parser.add_argument("--dry-run", action="store_true", help="print the report as JSON; publish nothing")
    args = parser.parse_args(argv)
    try:
        parse_project(args.project)
        rs, cs, claims = collect(args.project, args.paths, args.group, str(Path(args.cache)), args.offline)
        spec = report_spec(args.project, rs, cs, claims, args.group, args.title)
    except (AnalysisError, ValueError) as exc:
        return error(exc)
    if args.dry_run:
        print(json.dumps(spec, indent=2, ensure_ascii=False))
        return 0
    try:
        report = build_report_object(spec)
    except ImportError:
        return error("wandb-workspaces is not installed: pip install 'lm-ablate[dashboards]' (or --dry-run to "
                     "print the report)")  # fmt: skip
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        return error(exc, 300)
    try:
        report.save()
    except Exception as exc:
        error(f"saving the report failed: {exc}", 300)
        return 1
    print(report.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
