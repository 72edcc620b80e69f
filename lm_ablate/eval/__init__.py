"""Downstream evaluation: tasks as data (conf/eval/, lm_ablate/eval/tasks.py), tasks built from the bundled
corpus (embedded.py), one scorer (scorer.py) and its place in the training loop (loop.py). The metric names
are lm_ablate/metrics.py's ``downstream/<task>/<kind>``; docs/evaluation.md is the user's page."""

from __future__ import annotations

from lm_ablate.eval.loop import Downstream
from lm_ablate.eval.scorer import Encoded, Example, encode_example, loglikelihoods, score
from lm_ablate.eval.tasks import FORMATS, Task, load_task, load_tasks

__all__ = [
    "FORMATS",
    "Downstream",
    "Encoded",
    "Example",
    "Task",
    "encode_example",
    "load_task",
    "load_tasks",
    "loglikelihoods",
    "score",
]
