"""The report's Summary: its Findings first (given), then what was run, what varied and what was held fixed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from analysis.compute.compare import ComparisonSet, Entangled
from analysis.present.document import Block, Bullets, Details, Heading, Table
from analysis.present.sections.comparisons import keys_text
from analysis.sources.load import RunSet
from analysis.sources.values import override_text
from lm_ablate import metrics as M


def _status_counts(rs: RunSet) -> str:
    counts = rs.runs[M.STATUS].value_counts()
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def summary_blocks(
    rs: RunSet,
    cs: ComparisonSet,
    findings: Sequence[str] = (),
    warnings: Sequence[str] = (),
    size_keys: frozenset[str] = frozenset(),
) -> list[Block]:
    """The Summary: the Findings first (claim verdicts and the largest effects, with their numbers), then what
    was run, what varied and what was held fixed, and ``warnings``."""
    studies = sorted({str(v) for v in rs.runs.get("study", pd.Series(dtype=object)).dropna()})
    out: list[Block] = [Heading(2, "Summary")]
    if findings:
        out += [Heading(3, "Findings"), Bullets(list(findings)), Heading(3, "Runs")]
    items = [f"Runs: {len(rs.runs)} ({_status_counts(rs)})."]
    if studies:
        items.append("Study: " + ", ".join(studies) + ".")
    # model size (the rungs of a ladder) is the Scaling section's dimension, not an axis compared here
    size_axes = [axis for axis in cs.varied if size_keys and set(axis.keys) <= size_keys]
    if size_axes:
        shown = "; ".join(f"{a.label} = {', '.join(override_text(v) for v in cs.values[a.name])}" for a in size_axes)
        items.append(f"Model size varies (the rungs; compared across sizes in the Scaling section): {shown}.")
    if cs.varied:
        for axis in cs.varied:
            if axis in size_axes:
                continue
            values = ", ".join(override_text(v) for v in cs.values[axis.name])
            parts = [f"changes together with {keys_text(axis.keys[1:])}"] if len(axis.keys) > 1 else []
            parts += [f"its options' own keys, null where unread: {keys_text(axis.own)}"] if axis.own else []
            along = f" ({'; '.join(parts)})" if parts else ""
            items.append(f"Varied: {axis.label} = {values}{along}.")
    else:
        items.append("Varied: no config key differs between the runs, so there is nothing to compare.")
    if cs.ignored:
        items.append(
            "Also differs, bookkeeping rather than an intervention (not compared): "
            + "; ".join(f"{k} ({_few(v)})" for k, v in cs.ignored.items())
            + "."
        )
    if cs.left_out:
        items.append("Left out of comparisons (no readable config): " + ", ".join(cs.left_out) + ".")
    compared = {k for comp in cs.comparisons for k in comp.axis.keys}
    uncompared = [axis.label for axis in cs.varied if not set(axis.keys) & compared and axis not in size_axes]
    if len(studies) > 1 or uncompared:
        parts = [f"they come from {len(studies)} studies ({', '.join(studies)})"] if len(studies) > 1 else []
        parts += ["also varied but not compared: " + ", ".join(uncompared)] if uncompared else []
        items.append(
            "Warning: the runs differ in more than the compared axes: "
            + "; ".join(parts)
            + ". Each comparison holds the other varied keys fixed within a context; nothing is pooled across them."
        )
    size_labels = {a.label for a in size_axes}
    items += [entangled_text(e) for e in cs.entangled if e.axis.label not in size_labels]
    items += warnings
    out.append(Bullets(items))
    if cs.fixed:
        rows = [[key, override_text(value)] for key, value in cs.fixed.items()]
        out.append(Details(f"Held fixed: {len(cs.fixed)} config keys", [Table(["key", "value"], rows)]))
    return out


def entangled_text(e: Entangled) -> str:
    return (f"{e.axis.label} varies only together with other axes ({', '.join(e.others)}): no context holds two "
            "of its values, so it is not compared on its own")  # fmt: skip


def _few(values: list[Any], limit: int = 5) -> str:
    shown = ", ".join(override_text(v) for v in values[:limit])
    return shown + (f", … {len(values)} values" if len(values) > limit else "")
