"""What the analysis commands share with every lm-ablate command: bad input is one line on stderr,
``lm-ablate: error: ...``, and exit status 2 (argparse's own errors included: no usage block above them)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

ERROR_PREFIX = "lm-ablate: error: "
BAD_INPUT = 2


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` with its whitespace collapsed (an exception's message may span lines), cut at ``limit``."""
    line = " ".join(str(text).split())
    return line[:limit] if limit else line


def error(message: object, limit: int | None = None) -> int:
    """Print ``lm-ablate: error: <message>`` as one line and return the bad-input exit status."""
    print(ERROR_PREFIX + one_line(message, limit), file=sys.stderr)
    return BAD_INPUT


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors (a missing ``--out``, an unknown option) are one ``lm-ablate: error:``
    line pointing at ``--help``, rather than the usage block and ``prog: error:``."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"{ERROR_PREFIX}{one_line(message)} (see {self.prog} --help)\n")
