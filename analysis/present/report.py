"""The report as one document: the study's claims and their verdicts, the Summary opening with the Findings,
the LR section, one section per compared axis, the Scaling section, the run listings and how to read it all;
its figures drawn in parallel first. analysis/report.py computes what it shows and writes the files."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from analysis.compute.basin import basins as find_basins
from analysis.compute.best_lr import compare_at_best_lr
from analysis.compute.claims import ClaimSet, largest_effects, unsteady_speed
from analysis.compute.compare import ComparisonSet, LRSweep
from analysis.compute.scaling import ScalingStudy
from analysis.parallel import fork_map
from analysis.present.document import Block, Heading, Para
from analysis.present.figures.basin import basin_figures
from analysis.present.figures.curves import comparison_figure_jobs
from analysis.present.figures.heatmap import heatmap_figures
from analysis.present.figures.lr import lr_figures
from analysis.present.sections.basin import basin_blocks
from analysis.present.sections.claims import claims_blocks, findings, speed_warning
from analysis.present.sections.comparisons import HOW_TO_READ, comparison_blocks
from analysis.present.sections.lr import lr_blocks
from analysis.present.sections.runs import failed_blocks, problem_blocks, runs_blocks
from analysis.present.sections.scaling import scaling_blocks
from analysis.present.sections.summary import summary_blocks
from analysis.present.style import MAX_PANELS, PlotFigure
from analysis.sources.load import MAX_ATTN_LOGIT_ALL, RunSet
from lm_ablate import metrics as M

MAX_PAGES = 2  # figure pages per kind and comparison (12 contexts): more would bury the report
FIGURE_BUDGET = 40  # figures in a report; above it, one page per kind and comparison (6 contexts)
FIGURE_KINDS = 7  # per comparison: see analysis.present.figures.curves.comparison_figure_jobs
# history columns the report draws (everything else is dropped while loading, so big sweeps fit in memory)
REPORT_COLUMNS = frozenset(
    {M.VAL_LOSS, M.TRAIN_LOSS, M.GRAD_NORM, M.SPIKE_GRAD_NORM, M.LOGITS_MAX_ABS, M.LOGITS_MEAN_LOG_Z,
     MAX_ATTN_LOGIT_ALL}
)  # fmt: skip


def report_columns(name: str) -> bool:
    """The ``keep`` of a source: is ``name`` a history column the report draws?"""
    return name in REPORT_COLUMNS


def _figure_job_list(rs: RunSet, cs: ComparisonSet, sweep: LRSweep | None, smoothing: float,
                     max_pages: int | None) -> list[tuple[int, Any]]:  # fmt: skip
    """(section index, job) for every figure: 0 is the LR section, i the i-th comparison."""
    jobs: list[tuple[int, Any]] = []
    if sweep is not None:
        jobs.append((0, lambda: lr_figures(sweep, max_pages)))
    for i, comp in enumerate(cs.comparisons, 1):
        jobs += [(i, job) for job in comparison_figure_jobs(rs, comp, smoothing, max_pages)]
        jobs.append((i, lambda comp=comp: heatmap_figures(rs, comp)))
    return jobs


def build_blocks(
    rs: RunSet,
    cs: ComparisonSet,
    title: str,
    smoothing: float = 0.9,
    sweep: LRSweep | None = None,
    workers: int = 1,
    max_pages: int | None = MAX_PAGES,
    scaling: ScalingStudy | None = None,
    claims: ClaimSet | None = None,
) -> list[Block]:
    """The report as blocks: the study's claims and their verdicts first (when it declares any: one row per
    claim, the rules folded), then the summary opening with the Findings (the largest effects; each claim's
    sentence too when there is no claims table), the sections, and the run listings. Figures are drawn first, in
    ``workers`` forked processes. A big sweep (more than FIGURE_BUDGET figures at ``max_pages``) gets one page
    per figure kind: each figure costs ~0.5 s to draw, and the tables hold every context anyway."""
    if max_pages and max_pages > 1:
        pages = sum(min(max_pages, math.ceil(len(c.contexts) / MAX_PANELS)) for c in cs.comparisons)
        if pages * FIGURE_KINDS > FIGURE_BUDGET:
            max_pages = 1
    jobs = _figure_job_list(rs, cs, sweep, smoothing, max_pages)
    sizes = scaling.size_keys if scaling is not None else ()
    basins = find_basins(rs, cs, sizes)  # every numeric axis at its best LRs (Kaplan et al. 2020, Fig. 5)
    basin_section = len(cs.comparisons) + 1
    if basins:
        jobs.append((basin_section, lambda: basin_figures(basins, max_pages)))
    drawn = fork_map(lambda job: job[1](), jobs, workers=workers)
    figures: dict[int, list[PlotFigure]] = {}
    for (section, _), figs in zip(jobs, drawn):
        figures.setdefault(section, []).extend(figs)
    blocks: list[Block] = [Heading(1, title)]
    answered = claims is not None and bool(claims.results)
    if answered:  # the answer first: one row per claim, so the Findings below hold only the largest effects
        blocks += claims_blocks(claims)
    baselines = {comp.axis.label: comp.baseline for comp in cs.comparisons}
    warning = speed_warning(unsteady_speed(rs, cs))
    size_keys = frozenset(scaling.size_keys) if scaling is not None else frozenset()
    notes = [warning] if warning else []
    items = findings(None if answered else claims, largest_effects(cs), baselines)
    blocks += summary_blocks(rs, cs, items, notes, size_keys)
    if sweep is not None:
        blocks += lr_blocks(sweep, figures.get(0, []), compare_at_best_lr(rs, sweep=sweep))
    for i, comp in enumerate(cs.comparisons, 1):
        blocks += comparison_blocks(comp, i, figures.get(i, []))
    blocks += basin_blocks(basins, figures.get(basin_section, []))
    if scaling is not None:
        blocks += scaling_blocks(scaling, dict(zip(rs.runs["run_id"], rs.runs[M.STATUS])))
    blocks += failed_blocks(rs, cs) + runs_blocks(rs, cs) + problem_blocks(rs)
    blocks += [Heading(2, "How to read this"), Para(HOW_TO_READ)]
    return blocks


def default_title(rs: RunSet) -> str:
    studies = sorted({str(v) for v in rs.runs.get("study", pd.Series(dtype=object)).dropna()})
    return "Ablation report: " + ", ".join(studies) if studies else "Ablation report"
