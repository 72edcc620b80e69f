"""analysis/wandb_report.py: the W&B Report a study publishes, checked up to the report object (no server here):
the same Findings and Claims text as the HTML report, and one panel grid per compared axis whose run set is
the study's group, grouped by that axis and the other varied axes."""

from __future__ import annotations

import json

import pytest
from test_claims import map_sweep

from analysis.present.sections.claims import findings
from analysis.publish.report import build_report_object, collect, main, report_spec


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    finals = {}
    for layers in (2, 4):
        for lr in (1e-3, 1e-2):
            finals[("pre", layers, lr)] = [2.50, 2.55, 2.60]
            finals[("post", layers, lr)] = [3.3] * 3 if (layers, lr) == (4, 1e-2) else [2.45, 2.62, 2.66]
    tps = {"pre": [1000.0, 1010.0, 990.0], "post": [900.0, 905.0, 910.0]}
    return map_sweep(tmp_path_factory.mktemp("wb"), finals, tps)


@pytest.fixture(scope="module")
def spec(runs, tmp_path_factory):
    rs, cs, claims = collect("team/proj", [str(runs)], "prepost", str(tmp_path_factory.mktemp("cache")), False)
    return report_spec("team/proj", rs, cs, claims, group="prepost"), (rs, cs, claims)


def test_spec_has_the_reports_findings_claims_and_a_grid_per_axis(spec):
    spec, (rs, cs, claims) = spec
    from analysis.compute.claims import largest_effects

    assert (spec["entity"], spec["project"], spec["group"]) == ("team", "proj", "prepost")
    blocks = spec["blocks"]
    assert blocks[0] == {"type": "h1", "text": "Findings"}
    baselines = {c.axis.label: c.baseline for c in cs.comparisons}
    assert blocks[1]["items"] == findings(claims, largest_effects(cs), baselines)  # the HTML report's list
    assert (
        blocks[2]["text"] == "Claims" and len(blocks[4]["items"]) == len(claims.results) == 6
    )  # optim.lr tuned per side: no context
    (item,) = [
        i
        for i in blocks[4]["items"]
        if i.startswith("post_worse (Xiong et al. 2020) [model.n_layers=4, optim.lr=0.01]: ")
    ]
    assert item.endswith(": held.")
    grids = [b for b in blocks if b["type"] == "panels"]
    assert [g["groupby"] for g in grids] == [
        ["model.n_layers", "norm.placement", "optim.lr"],
        ["norm.placement", "model.n_layers", "optim.lr"],
        ["optim.lr", "model.n_layers", "norm.placement"],
    ]
    placement = next(g for g in grids if g["axis"] == "norm.placement")
    titles = [p["title"] for p in placement["panels"]]
    assert titles[:3] == [
        "val/loss by norm.placement",
        "train/loss by norm.placement",
        "optim/grad_norm by norm.placement",
    ]
    assert "perf/tokens_per_sec" in titles  # the post_slower claim compares tokens/s on this axis
    other = next(g for g in grids if g["axis"] == "optim.lr")
    assert "perf/tokens_per_sec" not in [p["title"] for p in other["panels"]]


def test_report_object_is_built_from_the_spec(spec):
    import wandb_workspaces.reports.v2 as wr

    spec, _ = spec
    report = build_report_object(spec)
    assert isinstance(report, wr.Report) and report.entity == "team" and report.project == "proj"
    kinds = [type(b).__name__ for b in report.blocks]
    assert kinds[:5] == ["H1", "UnorderedList", "H1", "P", "UnorderedList"]
    assert report.blocks[1].items == spec["blocks"][1]["items"]
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    assert len(grids) == 3
    runset = grids[1].runsets[0]
    assert runset.groupby == ["config.norm.placement", "config.model.n_layers", "config.optim.lr"]
    assert runset.filters == "Metric('Group') == 'prepost'" and (runset.entity, runset.project) == ("team", "proj")
    lines = [p for p in grids[1].panels if isinstance(p, wr.LinePlot)]
    assert [p.y for p in lines][:3] == [["val/loss"], ["train/loss"], ["optim/grad_norm"]]
    assert lines[2].log_y is True and lines[0].groupby_rangefunc == "minmax"


def test_cli_dry_run_prints_the_spec_and_bad_input_is_one_line(runs, tmp_path, capsys):
    assert main(["--project", "team/proj", "--group", "prepost", str(runs), "--cache", str(tmp_path), "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["blocks"][0] == {"type": "h1", "text": "Findings"} and printed["title"] == "lm-ablate: prepost"
    assert main(["--project", "noslash", str(runs), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lm-ablate: error: --project must look like ENTITY/PROJECT") and "\n" not in err
    assert main(["--project", "team/proj", str(tmp_path / "nothing"), "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith(f"lm-ablate: error: {tmp_path / 'nothing'}: no such directory")
    (tmp_path / "empty").mkdir()
    assert main(["--project", "team/proj", str(tmp_path / "empty"), "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("lm-ablate: error: no runs found under: ")
    with pytest.raises(SystemExit) as exit_:
        main(["--dry-run"])
    assert exit_.value.code == 2
    required = "the following arguments are required: --project"
    assert capsys.readouterr().err == f"lm-ablate: error: {required} (see python -m analysis.wandb_report --help)\n"
