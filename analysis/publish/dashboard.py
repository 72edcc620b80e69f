"""Build a W&B workspace that lays a project's runs out along the compared axes.

Usage::

    python -m analysis.wandb_dashboard --project ENTITY/PROJECT --by norm.placement [--by KEY ...]
        [--group G] [--name NAME] [--dry-run]

One section per ``--by`` key, whose line plots (train/val loss, grad norm, tokens/s, max |logit|) group the
runs by that config key: mean line with a min–max band over the runs sharing a value, as in the report. The
runs table itself is left ungrouped: W&B panels follow the table's grouping when it has one, which would
override the per-section grouping. ``--group`` shows only the runs of one W&B group (the loop logs a study as
a group). ``--dry-run`` prints the workspace as JSON instead of saving it.

The workspace is described first as a plain dict (:func:`workspace_spec`) and then turned into
``wandb_workspaces`` objects (:func:`build_workspace`; ``pip install 'lm-ablate[dashboards]'``), so the
layout can be checked, and printed, without that package or the network.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from analysis.cli import Parser, error
from lm_ablate import metrics as M

PANEL_METRICS = (M.TRAIN_LOSS, M.VAL_LOSS, M.GRAD_NORM, M.TOKENS_PER_SEC, M.LOGITS_MAX_ABS)
LOG_Y = frozenset({M.GRAD_NORM})  # spans decades; spikes would flatten a linear axis


def parse_project(spec: str) -> tuple[str, str]:
    """(entity, project) of ``ENTITY/PROJECT``; ValueError (one line, naming --project) for anything else."""
    entity, sep, project = spec.strip().partition("/")
    if not sep or not entity or not project or "/" in project:
        raise ValueError(f"--project must look like ENTITY/PROJECT, got {spec!r}")
    return entity, project


def workspace_spec(project: str, by: Sequence[str], group: str | None = None, name: str | None = None) -> dict:
    """The workspace as plain data: ``{"entity", "project", "name", "group", "keys", "sections": [{"name",
    "groupby", "panels": [{"title", "metric", "groupby", "log_y"}]}]}``: a section per key."""
    entity, proj = parse_project(project)
    keys = list(dict.fromkeys(k.strip() for k in by if k.strip()))
    if not keys:
        raise ValueError("give at least one --by config key, e.g. --by norm.placement")

    def section(key: str) -> dict[str, Any]:
        panels = [{"title": f"{m} by {key}", "metric": m, "groupby": key, "log_y": m in LOG_Y} for m in PANEL_METRICS]
        return {"name": f"by {key}", "groupby": key, "panels": panels}

    sections = [section(key) for key in keys]
    default_name = "lm-ablate: " + ", ".join(keys) + (f" ({group})" if group else "")  # W&B rejects "×"
    return {
        "entity": entity,
        "project": proj,
        "name": name or default_name,
        "group": group,
        "keys": keys,
        "sections": sections,
    }


def build_workspace(spec: dict) -> Any:
    """The ``wandb_workspaces.workspaces.Workspace`` for a :func:`workspace_spec` (not saved)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = []
    for sec in spec["sections"]:
        panels = [
            wr.LinePlot(
                title=p["title"],
                y=[p["metric"]],
                groupby=wr.Config(p["groupby"]),
                groupby_aggfunc="mean",
                groupby_rangefunc="minmax",
                log_y=p["log_y"] or None,
            )
            for p in sec["panels"]
        ]
        sections.append(ws.Section(name=sec["name"], panels=panels, is_open=True))
    filters = f"Metric('Group') == {spec['group']!r}" if spec["group"] else ""
    return ws.Workspace(
        entity=spec["entity"],
        project=spec["project"],
        name=spec["name"],
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis="Step", max_runs=1000),
        runset_settings=ws.RunsetSettings(filters=filters),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m analysis.wandb_dashboard",
        description="Create a W&B workspace with panels grouped by the compared config keys.",
    )
    parser.add_argument("--project", required=True, metavar="ENTITY/PROJECT")
    parser.add_argument("--by", action="append", required=True, metavar="KEY",
                        help="config key to group by, e.g. norm.placement (repeatable)")  # fmt: skip
    parser.add_argument("--group", help="only the runs of this W&B group (a study)")
    parser.add_argument("--name", help="workspace name (default: from the keys)")
    parser.add_argument("--dry-run", action="store_true", help="print the workspace as JSON; save nothing")
    args = parser.parse_args(argv)
    try:
        spec = workspace_spec(args.project, args.by, args.group, args.name)
    except ValueError as exc:
        return error(exc)
    try:
        workspace = build_workspace(spec)
    except ValueError as exc:  # pydantic's ValidationError (e.g. an emoji in --name) is a ValueError
        return error(exc, 300)
    except ImportError:
        if args.dry_run:
            print(json.dumps(spec, indent=2))
            return 0
        return error("wandb-workspaces is not installed: pip install 'lm-ablate[dashboards]' (or --dry-run to "
                     "print the layout)")  # fmt: skip
    if args.dry_run:
        print(json.dumps(workspace._to_model().model_dump(by_alias=True, exclude_none=True), indent=2))
        return 0
    try:
        workspace.save()
    except Exception as exc:
        error(f"saving the workspace failed: {exc}", 300)
        return 1
    print(workspace.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
