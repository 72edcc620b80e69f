"""Map a function over items in forked worker processes.

Reading a thousand runs and drawing dozens of figures are both CPU-bound Python (the GIL rules out threads).
Forked children inherit the function and the items, so neither has to be picklable (closures over a RunSet
are fine) and nothing large is copied in; only results travel back. Where fork is unavailable (Windows,
macOS's default), with one worker, with fewer than two items, or while this process runs other Python threads
(a fork copies their held locks, e.g. after W&B's client started some, and a child may deadlock on one), the
map runs in this process.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_TASK: tuple[Callable[[Any], Any], Sequence[Any]] | None = None  # set only while a pool is running


def default_workers() -> int:
    """CPUs this process may use (affinity-aware), at most 8: past that, file reads and pickling dominate."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _call(index: int) -> Any:
    assert _TASK is not None
    fn, items = _TASK
    return fn(items[index])


def fork_map(fn: Callable[[T], R], items: Sequence[T], workers: int = 1) -> list[R]:
    """``[fn(x) for x in items]``, in up to ``workers`` forked processes, results in order.

    An exception raised by ``fn`` propagates. If the pool itself breaks (a worker killed, e.g. by the OOM
    killer), the map is redone in this process rather than losing the report.
    """
    global _TASK
    if workers <= 1 or len(items) < 2 or sys.platform != "linux" or _TASK is not None or threading.active_count() > 1:
        return [fn(x) for x in items]
    _TASK = (fn, items)
    # Objects the children inherit (a loaded RunSet: hundreds of thousands) are moved out of the collector's
    # reach, so a child's collections neither walk them nor write to (and so copy) every page that holds
    # one: ~10% of the time to draw a big sweep's figures. Left alone if the caller froze objects itself.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        chunk = max(1, len(items) // (workers * 8))
        with ProcessPoolExecutor(min(workers, len(items)), mp_context=mp.get_context("fork")) as pool:
            return list(pool.map(_call, range(len(items)), chunksize=chunk))
    except BrokenProcessPool:
        return [fn(x) for x in items]
    finally:
        _TASK = None
        if freeze:
            gc.unfreeze()
