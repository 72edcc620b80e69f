"""The ground floor: the one error type of bad input and its one-line format. Imports nothing of ours."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A bad configuration value; its message is one line naming key, value and what is allowed."""


def bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is invalid: {allowed}")
