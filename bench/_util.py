"""Shared helpers of the benchmarks in bench/ (not a benchmark itself).

Every benchmark compares candidates measured in the same process and the same minutes: the machine may be
shared, so candidates are interleaved (round r runs each candidate once, in an order rotated every round),
each candidate's figure is the median over rounds, and a ratio is the median of the per-round ratios (both
candidates of a round saw about the same load). The load average is printed with every result.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter  # what every benchmark times with; set_clock("cpu") switches all of them


def set_clock(name: str) -> None:
    """``wall``: elapsed time (default). ``cpu``: CPU time of the calling thread, only meaningful with one
    intra-op thread (``torch.set_num_threads(1)``: ops and autograd's CPU backward then run on this thread).
    CPU time leaves out the time the thread waited for a core, so on a shared machine it measures the code,
    not the neighbours; it still includes their effect on caches and memory bandwidth."""
    import torch

    global clock
    if name == "cpu" and torch.get_num_threads() != 1:
        raise SystemExit("--clock cpu needs --threads 1 (other threads' work is not on this thread's clock)")
    clock = CLOCKS[name]


def add_timing_args(p) -> None:
    """--threads and --clock, the options every timing benchmark shares (apply them with apply_timing_args)."""
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's, one per core)")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: this thread's CPU time (needs --threads 1): robust to other load on the machine",
    )


def apply_timing_args(a) -> None:
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    set_clock(a.clock)


def add_round_args(p, unit: str) -> None:
    """--quick, --shapes, --rounds, --steps plus the timing options, for the interleaved per-shape benchmarks
    (components.py, optimizers.py); ``unit`` names what is timed ("variant", "candidate")."""
    p.add_argument("--quick", action="store_true", help="smoke test: small shape, 2 rounds of 1 step")
    p.add_argument("--shapes", default="small,d256")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help=f"steps per {unit} per round")
    add_timing_args(p)


def apply_round_args(a) -> None:
    if a.quick:
        a.shapes, a.rounds, a.steps = "small", 2, 1
    apply_timing_args(a)


def now() -> float:
    return clock()


def loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def environment() -> str:
    import torch

    return (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs "
        f"({torch.backends.cpu.get_cpu_capability()}), python {platform.python_version()}"
    )


def header(title: str) -> None:
    print(f"== {title}")
    print(f"   {environment()}")
    print(f"   load average (1/5/15 min) at start: {loadavg()}", flush=True)
    warn_if_loaded()


def warn_if_loaded() -> None:
    """With more runnable processes than cores, a multi-threaded op waits at its barrier for whichever of
    its threads was descheduled: timings then measure the scheduler as much as the code, and they punish
    code with many small ops the most. One thread per process is far more stable in that situation."""
    import torch

    threads, cpus, load = torch.get_num_threads(), os.cpu_count() or 1, os.getloadavg()[0]
    if threads > 1 and load > 1.25 * cpus:  # this benchmark itself keeps about `threads` cores busy
        print(
            f"   WARNING: load average {load:.1f} on {cpus} CPUs with {threads} threads per op: timings include waits "
            "for descheduled threads; see bench/README.md (--threads 1 gives load-robust ratios)",
            flush=True,
        )


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    """min-max of the rounds, as a quick look at the noise."""
    return f"{min(values):.4g}-{max(values):.4g}" if values else "-"


def interleave(
    candidates: dict[str, Callable[[], float]], rounds: int, verbose: bool = True
) -> tuple[dict[str, list[float]], list[tuple[float, float, float]]]:
    """Call each candidate once per round, rotating the order (A B C, B C A, ...); each call returns its
    figure for that round. Returns the figures per candidate and the load average after each round."""
    names = list(candidates)
    figures: dict[str, list[float]] = {name: [] for name in names}
    loads = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            figures[name].append(candidates[name]())
        loads.append(os.getloadavg())
        if verbose:
            shown = "  ".join(f"{n}={figures[n][-1]:.4g}" for n in names)
            print(f"   round {r + 1}/{rounds}: {shown}  (load {loads[-1][0]:.2f})", flush=True)
    return figures, loads


def ratios(a: list[float], b: list[float]) -> list[float]:
    """Per-round b / a."""
    return [y / x for x, y in zip(a, b)]


def load_summary(loads: list[tuple[float, float, float]]) -> str:
    ones = [row[0] for row in loads]
    return f"1-min load average during the rounds: median {median(ones):.2f}, range {min(ones):.2f}-{max(ones):.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def matmul_gflops(n: int = 1024, seconds: float = 0.3) -> float:
    """Best fp32 GFLOP/s of n x n matmuls over ~seconds: lm_ablate.perf.measured_peak_flops' method, but not
    cached, so it can be measured again in every round (MFU against the peak of the same minute)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    best, deadline = 0.0, time.perf_counter() + seconds
    for i in range(1000):
        tic = now()
        a @ b
        best = max(best, 2 * n**3 / (now() - tic))
        if i >= 2 and time.perf_counter() > deadline:
            break
    return best / 1e9
