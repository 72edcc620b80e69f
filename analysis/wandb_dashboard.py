"""``python -m analysis.wandb_dashboard``: a W&B workspace along the compared axes (analysis/publish/dashboard.py)."""

from __future__ import annotations

import sys

from analysis.publish.dashboard import main

if __name__ == "__main__":
    sys.exit(main())
