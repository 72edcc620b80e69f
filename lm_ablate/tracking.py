"""Where metrics go: the local run record (always) and one tracker from the ``tracking`` group.

Every tracker has the same four calls, and ``none`` is a real object whose calls do nothing, so the loop
never branches on logging. Only rank 0 builds trackers.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_ablate import metrics as M
from lm_ablate.registry import TRACKERS
from lm_ablate.schema import TrackingConfig


@dataclass
class RunInfo:
    run_dir: Path
    name: str  # e.g. "norm=rmsnorm,norm.placement=post,seed=1" (the overrides that define the arm)
    group: str  # the study: W&B group, report title
    tags: list[str]  # "<group>=<option>" for each axis
    config: dict = field(default_factory=dict)  # resolved, nested
    resume_id: str | None = None  # W&B run id of the interrupted run this one continues


class Tracker:
    """No-op base: subclasses override what they need."""

    def start(self, info: RunInfo) -> dict[str, Any]:
        """Begin the run; returns facts worth recording in the summary (e.g. the W&B run id)."""
        return {}

    def log(self, row: dict[str, float], step: int) -> None:
        pass

    def summary(self, values: dict[str, Any]) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


@TRACKERS.register("none")
def no_tracker(cfg: TrackingConfig) -> Tracker:
    return Tracker()


def _json_safe(value: Any) -> Any:
    return float(value) if isinstance(value, float) and math.isfinite(value) else value


def atomic_write_text(path: Path, text: str) -> None:
    """Write then rename, so a reader (or a kill) never sees a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LocalRecord(Tracker):
    """config.yaml, metrics.jsonl (one flushed line per logged step) and summary.json (atomic) in the run dir."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.values: dict[str, Any] = {}
        self._metrics = None

    def start(self, info: RunInfo) -> dict[str, Any]:
        from omegaconf import OmegaConf

        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.run_dir / M.CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.create(info.config)))
        self._metrics = open(self.run_dir / M.METRICS_FILE, "a")  # noqa: SIM115 (closed in finish)
        return {}

    def log(self, row: dict[str, float], step: int) -> None:
        self._metrics.write(json.dumps(M.to_json({M.STEP: step, **row}), allow_nan=False) + "\n")
        self._metrics.flush()

    def summary(self, values: dict[str, Any]) -> None:
        self.values.update(values)
        text = json.dumps(M.to_json(self.values), indent=2, default=str, allow_nan=False)
        atomic_write_text(self.run_dir / M.SUMMARY_FILE, text + "\n")

    def finish(self, status: str) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


def _has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        rc = netrc.netrc()
    except (OSError, netrc.NetrcParseError):
        return False
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].split("/")[0]
    return rc.authenticators(host) is not None


class WandbTracker(Tracker):
    """Weights & Biases. Mode: tracking.mode, else $WANDB_MODE, else online; online without credentials falls
    back to offline (sync later with `wandb sync <run_dir>/wandb/offline-run-*`). Files go under the run dir."""

    def __init__(self, cfg: TrackingConfig):
        self.cfg = cfg
        self.run = None

    def start(self, info: RunInfo) -> dict[str, Any]:
        import wandb

        mode = self.cfg.mode or os.environ.get("WANDB_MODE") or "online"
        if mode == "online" and not _has_wandb_key():
            print("lm-ablate: no W&B credentials found; logging offline (wandb sync later)", file=sys.stderr)
            mode = "offline"
        wandb_dir = info.run_dir / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            if var not in _USER_ENV:
                os.environ[var] = str(wandb_dir / ".cache")
        self.run = wandb.init(
            project=self.cfg.project,
            entity=self.cfg.entity,
            group=info.group,
            name=info.name,
            tags=sorted(set(info.tags) | set(self.cfg.tags))[:64],
            config=info.config,
            dir=str(info.run_dir),
            mode=mode,
            id=info.resume_id,
            resume="allow" if info.resume_id else None,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, save_code=False),
        )
        return {"wandb_id": self.run.id, "wandb_mode": mode}

    def log(self, row: dict[str, float], step: int) -> None:
        self.run.log(row, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update({k: _json_safe(v) for k, v in values.items() if not isinstance(v, dict)})

    def finish(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status != M.STATUS_FAILED else 1)
            self.run = None


_USER_ENV = {k for k in os.environ if k.startswith("WANDB_")}  # the user's own settings are never overridden


@TRACKERS.register("wandb", reads=("project", "entity", "mode", "tags"))
def wandb_tracker(cfg: TrackingConfig) -> Tracker:
    return WandbTracker(cfg)


class Trackers(Tracker):
    """Fans every call out to several trackers (the local record first)."""

    def __init__(self, *trackers: Tracker):
        self.trackers = trackers

    def start(self, info: RunInfo) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        for t in self.trackers:
            facts.update(t.start(info))
        return facts

    def log(self, row: dict[str, float], step: int) -> None:
        for t in self.trackers:
            t.log(row, step)

    def summary(self, values: dict[str, Any]) -> None:
        for t in self.trackers:
            t.summary(values)

    def finish(self, status: str) -> None:
        for t in self.trackers:
            t.finish(status)
