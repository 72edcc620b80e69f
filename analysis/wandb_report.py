"""``python -m analysis.wandb_report``: the study's findings as a W&B Report (analysis/publish/report.py)."""

from __future__ import annotations

import sys

from analysis.publish.report import main

if __name__ == "__main__":
    sys.exit(main())
