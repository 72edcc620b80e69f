"""The report's run listings: diverged and failed runs, every run, and what could not be read."""

from __future__ import annotations

from analysis.compute.compare import ComparisonSet, is_stalled
from analysis.present.document import Block, Bullets, Heading, Para, Table
from analysis.present.format import STALL_WORDS, count, num
from analysis.sources.load import RunSet
from analysis.sources.values import override_text
from lm_ablate import metrics as M


def failed_blocks(rs: RunSet, cs: ComparisonSet) -> list[Block]:
    out: list[Block] = [Heading(2, "Diverged and failed runs")]
    bad = rs.runs[rs.runs[M.STATUS] != M.STATUS_COMPLETED]
    if bad.empty:
        return out + [Para("None: every run completed.")]
    rows = [
        [
            r["run_id"],
            cs.run_label(r["run_id"], rs.configs),
            str(r[M.STATUS]),
            count(r[M.DIVERGED_AT]),
            count(r[M.STEPS]),
            " ".join(str(r[M.ERROR]).split()) if isinstance(r[M.ERROR], str) else "",
        ]
        for _, r in bad.iterrows()
    ]
    return out + [Table(["run", "arm config", "status", "diverged at step", "steps", "error"], rows, frozenset({3, 4}))]


def runs_blocks(rs: RunSet, cs: ComparisonSet) -> list[Block]:
    rows = [
        [
            r["run_id"],
            str(r[M.RUN_NAME]),
            cs.run_label(r["run_id"], rs.configs),
            override_text(rs.configs.get(r["run_id"], {}).get(M.SEED, r[M.SEED])),
            str(r[M.STATUS]) + (f", stalled ({r[M.STALL_REASON]})" if is_stalled(r.get(M.STALLED)) else ""),
            num(r[M.FINAL_VAL_LOSS]),
            num(r[M.BEST_VAL_LOSS]),
            count(r[M.STEPS]),
            count(r[M.GRAD_NORM_SPIKES]),
            count(r[M.LOSS_SPIKES]),
        ]
        for _, r in rs.runs.iterrows()
    ]
    headers = [
        "run",
        "name",
        "config",
        "seed",
        "status",
        "final val",
        "best val",
        "steps",
        "gn spikes",
        "loss spikes",
    ]
    return [
        Heading(2, "All runs"),
        Para(
            "Final and best validation loss as each run recorded them (for unfinished runs: the last evaluation). "
            f"Stalled: {STALL_WORDS}."
        ),
        Table(headers, rows, frozenset(range(5, 10))),
    ]


def problem_blocks(rs: RunSet) -> list[Block]:
    out: list[Block] = [Heading(2, "Problems")]
    return out + ([Bullets(list(rs.problems))] if rs.problems else [Para("None: every run record was readable.")])
