"""How a config value is spelled, ordered and matched, and how run ids are ordered: the one spelling that
context labels, ``--baseline``, the CSV tables and the report share (the spelling of a Hydra override)."""

from __future__ import annotations

import math
import re
from typing import Any

from analysis.sources.load import MISSING_VALUE


def override_text(value: Any) -> str:
    """Config value as written in YAML/Hydra overrides, so ``--baseline`` and the report use one spelling."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def value_order(value: Any) -> tuple[int, Any]:
    """Sort key: numbers numerically (lr 3e-4 < 1e-3), then booleans, then strings; null and missing last."""
    if value is MISSING_VALUE or value == MISSING_VALUE:
        return (4, "")
    if value is None:
        return (3, "")
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, (int, float)):
        return (0, value)
    return (2, str(value))


def matches_text(value: Any, text: str) -> bool:
    """Does a config value equal a user-typed string? Numbers compare numerically, true/null case-blind."""
    if override_text(value) == text or override_text(value).lower() == text.strip().lower():
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return value is None and text.strip().lower() in ("none", "~", "")


def launch_order(run_id: str) -> list[tuple[int, Any]]:
    """Sort key: the natural order of run ids, so Hydra's job 10 comes after job 9 (not after job 1)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", run_id) if part]
