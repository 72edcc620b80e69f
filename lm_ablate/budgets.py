"""Several token budgets from one run per rung (WSD-S; issue 26): a decay branch for each smaller budget.

``ladder.budgets = [b_1 < ... < b_m]`` are multiples of ``ladder.tokens_per_param`` x N (N: ``ladder.params``).
The run of a rung (``ladder.budget`` null) trains the largest budget b_m under the WSD schedule (warm-up, the
peak, a linear decay over the last ``optim.decay_fraction`` of the steps: lm_ablate/optim.py). A run of a
smaller budget b_j alone would share its first s_j steps with it, where s_j is the step its own decay starts::

    S_j = ceil(ceil(tokens_per_param x b_j x N) / tokens per step)        steps of budget b_j
    s_j = S_j - max(1, round(decay_fraction x S_j))                       its last step at the peak LR

so the parent's state after step s_j (model, optimizer, RNG, sums: a checkpoint) is exactly the state a run of
b_j alone has there. At s_j the parent writes a checkpoint and the start of a **branch**: a run record of its
own, ``<run_dir>.budget=<b_j>/`` beside the parent's, whose config is the parent's with ``ladder.budget = b_j``
and its own ``train.max_tokens`` (the config ``ladder.budget=b_j`` gives a run of that budget alone), and whose
``checkpoints/`` holds the parent's state at s_j under that config. Once the parent has finished, each branch
resumes from it like any interrupted run and decays from s_j to S_j. A branch therefore is what a separate run
of its budget would be, number for number (tests/test_budgets.py compares them), and it is resumable and never
changed once finished, as every run is.

Cost: S_m + sum_j (S_j - s_j) steps instead of sum_j S_j: with budgets [0.5, 1, 2, 4] and a decay fraction of
0.2, 4.7 runs of budget 1 instead of 7.5.

Refused in one line (before anything is written): a schedule other than WSD when a run branches (its stable
phase would not be a shorter budget's, so a branch would not be that budget's run), a branch whose decay would
start inside the warm-up, two budgets that give a rung the same number of steps, and a branch whose start
checkpoint is of another config (a stable phase that differs from its parent's).

Where a branch lives: beside its parent, because the run loader (analysis/sources/load.py) does not look inside a
run directory. Its summary.json has ``branch_of`` (the parent's directory) and ``branch_step`` (s_j). A parent
that diverges before s_j leaves that budget without a record (a run of b_j alone would have diverged at the same
step); W&B keys of the parent's summary are not carried over, so a branch is a W&B run of its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from lm_ablate import checkpoint as ckpt
from lm_ablate import metrics as M
from lm_ablate.errors import bad
from lm_ablate.optim import build_schedule
from lm_ablate.tracking import atomic_write_text

BRANCH_MARK = ".budget="  # <run_dir>.budget=<b>: the record of the branch of budget b
BRANCH_OF = "branch_of"  # summary.json: the parent's run directory
BRANCH_STEP = "branch_step"  # summary.json: the parent's step the branch starts from
CARRIED_NOT = ("wandb_",)  # summary keys of the parent a branch does not take (its tracker run is its own)


def budget_of(ladder: Any) -> float:
    """The budget (a multiple of tokens_per_param x N) a run of this ladder config trains."""
    if ladder.budget is not None:
        return float(ladder.budget)
    return float(max(ladder.budgets)) if ladder.budgets else 1.0


def budget_tokens(ladder: Any, n_params: int, budget: float | None = None) -> int:
    """ceil(tokens_per_param x budget x N)."""
    return math.ceil(ladder.tokens_per_param * (budget_of(ladder) if budget is None else budget) * n_params)


def branch_budgets(ladder: Any) -> list[float]:
    """The budgets a run branches to: every one but the largest, when ladder.budget is null."""
    if ladder.name is None or ladder.budget is not None or not ladder.budgets or len(ladder.budgets) < 2:
        return []
    return [float(b) for b in list(ladder.budgets)[:-1]]


def branch_dir(run_dir: Path, budget: float) -> Path:
    run_dir = Path(run_dir)
    return run_dir.parent / f"{run_dir.name}{BRANCH_MARK}{budget:g}"


def steps_of(cfg: Any, tokens: int) -> int:
    """Steps of a run of ``tokens`` tokens (the loop's horizon: ceil(tokens / tokens per step))."""
    return min(cfg.train.max_steps, math.ceil(tokens / (cfg.train.batch_size * cfg.model.context)))


def decay_start(cfg: Any, steps: int) -> int:
    """Steps at the peak LR (warm-up included) before WSD's decay starts, in a run of ``steps`` steps."""
    return steps - max(1, round(cfg.optim.decay_fraction * steps))


@dataclass(frozen=True)
class Branch:
    budget: float
    tokens: int  # its train.max_tokens
    steps: int  # S_j
    start: int  # s_j: the parent's step it continues from
    dir: Path | None = None


def plan(cfg: Any, n_params: int, run_dir: Path | None = None) -> list[Branch]:
    """The branches of this rung's run (none without ladder.budgets); one line for a budget that cannot branch."""
    budgets = branch_budgets(cfg.ladder)
    if not budgets:
        return []
    where = f"rung {cfg.ladder.rung} (N = {n_params:,} {cfg.ladder.params} parameters)"
    parent = steps_of(cfg, budget_tokens(cfg.ladder, n_params))
    lr_parent = build_schedule(cfg.optim, parent)
    out: list[Branch] = []
    steps_at = [steps_of(cfg, budget_tokens(cfg.ladder, n_params, b)) for b in list(cfg.ladder.budgets)]
    per_step = cfg.train.batch_size * cfg.model.context
    for i, b in enumerate(budgets):
        tokens = budget_tokens(cfg.ladder, n_params, b)
        steps = steps_at[i]
        start = decay_start(cfg, steps)
        if tokens < per_step:  # the largest budget's own check is lm_ablate.ladder.check_budget's
            raise bad("ladder.budgets", list(cfg.ladder.budgets), f"budget {b:g} gives {where} {tokens:,} tokens, "
                      f"less than one step of {per_step:,} tokens: raise the smallest budget")  # fmt: skip
        if start < 1:
            raise bad("ladder.budgets", list(cfg.ladder.budgets), f"budget {b:g} gives {where} {steps} steps, all "
                      f"of them its decay (optim.decay_fraction={cfg.optim.decay_fraction:g}): no step at the peak LR "
                      "to branch from; raise the smallest budget")  # fmt: skip
        if steps >= steps_at[i + 1]:
            raise bad("ladder.budgets", list(cfg.ladder.budgets), f"give {where} the same {steps} steps at "
                      f"budgets {b:g} and {cfg.ladder.budgets[i + 1]:g}: use budgets further apart")  # fmt: skip
        if start < cfg.optim.warmup_steps:
            raise bad("ladder.budgets", list(cfg.ladder.budgets), f"budget {b:g} gives {where} {steps} steps whose "
                      f"decay would start at step {start}, inside the warm-up of optim.warmup_steps="
                      f"{cfg.optim.warmup_steps}: raise the smallest budget or shorten the warm-up")  # fmt: skip
        lr_branch = build_schedule(cfg.optim, steps)
        differs = next((i for i in range(start) if lr_branch(i) != lr_parent(i)), None)
        if differs is not None:  # not a WSD stable phase: the branch would not be this budget's own run
            raise bad("optim.schedule", cfg.optim.schedule, f"the LR of budget {b:g}'s run differs from the "
                      f"largest budget's at step {differs + 1}, before its decay: a branch would not be that "
                      "budget's run; allowed: wsd")  # fmt: skip
        out.append(Branch(b, tokens, steps, start, branch_dir(run_dir, b) if run_dir is not None else None))
    return out


def branch_config(cfg: DictConfig, budget: float, tokens: int | None = None) -> DictConfig:
    """The parent's config with ``ladder.budget`` = ``budget`` and ``train.max_tokens`` its tokens (None: let
    the loop set it, as for any ladder run)."""
    out = cfg.copy()
    with open_dict(out):
        out.ladder.budget = float(budget)
        out.train.max_tokens = tokens
    return out


class Forks:
    """The parent's side: at each branch point, after the checkpoint of that step, the branch's start.

    ``config``: the parent's recorded config (a dict); ``n_params``: N of its budget (None: no ladder)."""

    def __init__(self, cfg: DictConfig, run_dir: Path, config: dict[str, Any], n_params: int | None,
                 main: bool = True) -> None:  # fmt: skip
        self.run_dir, self.main = Path(run_dir), main
        self.branches = plan(cfg, n_params, self.run_dir) if n_params is not None else []
        self.at = {b.start: b for b in self.branches}
        self.configs = {
            b.budget: {**config, "ladder": {**config["ladder"], "budget": b.budget},
                       "train": {**config["train"], "max_tokens": b.tokens}}
            for b in self.branches
        }  # fmt: skip

    def due(self, step: int) -> bool:
        """Is ``step`` a branch point (the parent checkpoints it, then :meth:`fork`)?"""
        return step in self.at

    def catch_up(self, step: int) -> None:
        """A session that resumed at a branch point whose branch was not started (killed between the checkpoint and
        the branch): start it now, from that checkpoint."""
        if self.main and step in self.at and not started(self.at[step].dir):
            self.fork(step)

    def fork(self, step: int) -> None:
        """Write the branch's start from the parent's newest checkpoint (the one of ``step``; rank 0 only)."""
        if not self.main:
            return
        branch = self.at[step]
        path = ckpt.find_resume(self.run_dir, "auto")
        state = ckpt.load(path) if path is not None else None
        if state is None or state["step"] != step:
            found = None if state is None else state["step"]
            raise ckpt.CheckpointError(f"ladder.budgets={[b.budget for b in self.branches]} is invalid here: the "
                                       f"branch of budget {branch.budget:g} starts at step {step}, but the "
                                       f"newest checkpoint of {self.run_dir} is at step {found}")  # fmt: skip
        if finished(branch.dir):
            return  # a finished record is never changed
        state.pop("format", None)
        state.pop("step", None)
        state["config"] = self.configs[branch.budget]
        summary = {k: v for k, v in state["summary"].items() if not k.startswith(CARRIED_NOT)}
        state["summary"] = {**summary, BRANCH_OF: str(self.run_dir), BRANCH_STEP: step}
        assert branch.dir is not None
        metrics = self.run_dir / M.METRICS_FILE
        branch.dir.mkdir(parents=True, exist_ok=True)
        if metrics.exists():  # the shared steps (the branch's resume keeps those up to ``step``)
            atomic_write_text(branch.dir / M.METRICS_FILE, metrics.read_text())
        ckpt.save(branch.dir, step, state, keep=1)


def started(folder: Path | None) -> bool:
    return folder is not None and (bool(ckpt.list_checkpoints(folder)) or (folder / M.SUMMARY_FILE).exists())


def finished(folder: Path | None) -> bool:
    path = None if folder is None else folder / M.SUMMARY_FILE
    if path is None or not path.exists():
        return False
    try:
        return json.loads(path.read_text()).get(M.STATUS) in (M.STATUS_COMPLETED, M.STATUS_DIVERGED)
    except (OSError, ValueError, AttributeError):
        return False


def train_branches(
    cfg: DictConfig, run_dir: Path, name: str | None, parent: dict[str, Any],
    train: Callable[[DictConfig, Path, str | None], dict[str, Any]],
    report: Callable[[dict[str, Any], Path], None] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Once the parent has finished (completed or diverged): train every branch that has a start, smallest
    budget first (``train``: lm_ablate.train.train); returns their summaries."""
    if parent.get(M.STATUS) not in (M.STATUS_COMPLETED, M.STATUS_DIVERGED):
        return []
    out = []
    for b in branch_budgets(cfg.ladder):
        folder = branch_dir(run_dir, b)
        if not started(folder):  # the parent diverged before this branch point
            continue
        label = f"{name},ladder.budget={b:g}" if name else None
        summary = train(branch_config(cfg, b), folder, label)
        if report is not None:
            report(summary, folder)
        out.append(summary)
    return out
