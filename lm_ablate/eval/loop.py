"""Downstream evaluation inside the training loop (``eval`` group, conf/eval/): the tasks are loaded and
tokenized once when the run starts, among its checks (bad input is one line before anything is written);
every ``eval.every`` steps and at the end the model scores them (lm_ablate/eval/scorer.py) and the row gets

    downstream/<task>/acc, downstream/<task>/acc_norm, downstream/<task>/bpb    (lm_ablate/metrics.py)
    perf/downstream_s                                                          seconds of that evaluation

in metrics.jsonl and W&B; summary.json holds the last value of each under the same name, plus
``downstream_eval_s`` (mean seconds per evaluation), ``downstream_evals`` and ``downstream_examples``.
Under torchrun every rank scores every example (the same numbers; a sharded model's forward needs all ranks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from lm_ablate import metrics as M
from lm_ablate.errors import bad
from lm_ablate.eval.embedded import WORKS
from lm_ablate.eval.scorer import Encoded, encode_example, score
from lm_ablate.eval.tasks import EMBEDDED, load_tasks


def check_embedded(cfg: Any) -> None:
    """An embedded task scores the held-out works: refuse a run that trains on any of them."""
    uses = [t.name for t in cfg.eval.tasks if t.format in EMBEDDED]
    if uses and cfg.data.name == "shakespeare":
        trained = sorted(set(WORKS) - set(cfg.data.val_works))
        if trained:
            why = f"{uses[0]} scores lines of {', '.join(WORKS)}, and this run trains on {', '.join(trained)}"
            raise bad("data.val_works", list(cfg.data.val_works), f"{why}; hold them out or drop the task")


class Downstream:
    """The run's downstream tasks, encoded with its tokenizer; :meth:`due` says when, :meth:`evaluate` scores."""

    def __init__(self, cfg: Any, tokenizer: Any, device: torch.device, autocast: Callable = nullcontext):
        e = cfg.eval
        self.every, self.batch_tokens = e.every, e.batch_tokens
        self.device, self.autocast = device, autocast
        self.tasks: list[tuple[str, list[Encoded]]] = []
        if not e.tasks:
            return
        check_embedded(cfg)
        from lm_ablate.data.pretokenized import IdsTokenizer

        if isinstance(tokenizer, IdsTokenizer):
            raise bad("eval.name", e.name, "data=tokens has no tokenizer to encode task text: set "
                      "data.tokenizer=pretrained data.tokenizer_path=... (the ids' tokenizer)")  # fmt: skip
        context = cfg.model.context
        for i, task in enumerate(load_tasks(e, cfg.data.cache_dir)):
            encoded = [
                encode_example(
                    tokenizer.encode, ex, context, f"eval.tasks.{i} ({task.name}) example {k}", tokenizer.decode
                )
                for k, ex in enumerate(task.examples)
            ]
            self.tasks.append((task.name, encoded))

    def __bool__(self) -> bool:
        return bool(self.tasks)

    def due(self, step: int, final: bool) -> bool:
        return bool(self.tasks) and (final or (self.every is not None and step % self.every == 0))

    def evaluate(self, model: torch.nn.Module) -> dict[str, float | None]:
        """Every task's metrics now, and the seconds they took (``perf/downstream_s``)."""
        tic = time.perf_counter()
        row: dict[str, float | None] = {}
        for name, examples in self.tasks:
            scores = score(model, examples, self.batch_tokens, self.device, self.autocast)
            for kind in M.DOWNSTREAM_KINDS:
                if scores[kind] is not None:
                    row[M.downstream(name, kind)] = scores[kind]
        row[M.DOWNSTREAM_SECONDS] = time.perf_counter() - tic
        return row

    def summarize(self, summary: dict[str, Any], row: dict[str, Any]) -> None:
        """The summary's downstream keys after an evaluation whose metrics are ``row``."""
        n = summary.get(M.DOWNSTREAM_EVALS) or 0
        mean = summary.get(M.DOWNSTREAM_EVAL_S) or 0.0
        summary[M.DOWNSTREAM_EVAL_S] = (mean * n + row[M.DOWNSTREAM_SECONDS]) / (n + 1)
        summary[M.DOWNSTREAM_EVALS] = n + 1
        summary[M.DOWNSTREAM_EXAMPLES] = {name: len(examples) for name, examples in self.tasks}
        summary.update({k: v for k, v in row.items() if k.startswith("downstream/")})
