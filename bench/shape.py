"""How long the shape solver (``shape=iso``, lm_ablate/shape.py) takes to answer. Target: milliseconds (issue 47).

    python bench/shape.py [--quick] [--rounds 7] [--threads 1 --clock cpu]

Each round times, interleaved (rotated order), for the default options and for ``arch=llama`` (SwiGLU, RoPE's
even head dims, RMSNorm), the ffn_ratio study's requests (N = 4e5, 4 layers, ratios 1 ... 32):

    cold     the first request of a process: the Counter built (16 blocks at {1, 2}^4, 3-4 tiny whole models on
             the CPU), the candidates searched, the pick validated
    warm     a request not seen before, the model's options already counted: every further arm of a sweep
    cached   a request seen before: an arm that differs only in its seed or LR
    validate one ``lm_ablate.config.validate`` of the same config: the reference, what every arm already costs

Figures are milliseconds per request (the median over rounds), and the median per-round ratio to validate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import add_timing_args, apply_timing_args, header, interleave, load_summary, median, now, spread, table

RATIOS = (1, 2, 4, 8, 16, 32)
OPTIONS = {"default": [], "llama": ["arch=llama"]}
BASE = ["tracking=none", "shape=iso", "shape.target_params=4e5", "shape.n_layers=4"]


class Cases:
    """The timed requests of one option set: the study's arms, composed once (their sizes solved), re-solved with
    the solver's caches emptied as each case says."""

    def __init__(self, cfgs: list) -> None:
        from lm_ablate import shape
        from lm_ablate.validation import validate

        self.cfgs, self.shape, self.validate, self.turn = cfgs, shape, validate, 0

    def next(self):
        self.turn += 1
        return self.cfgs[self.turn % len(self.cfgs)]

    @staticmethod
    def timed(fn) -> float:
        tic = now()
        fn()
        return 1000 * (now() - tic)

    def cold(self) -> float:
        cfg = self.next()
        self.shape._COUNTERS.clear()
        self.shape._SOLVED.clear()
        return self.timed(lambda: self.shape.solve(cfg))

    def warm(self) -> float:
        cfg = self.next()
        self.shape.solve(cfg)  # the options' Counter is built (and kept) ...
        self.shape._SOLVED.clear()  # ... the request is not
        return self.timed(lambda: self.shape.solve(cfg))

    def cached(self) -> float:
        self.shape.solve(self.cfgs[0])
        return self.timed(lambda: self.shape.solve(self.cfgs[0]))

    def reference(self) -> float:
        return self.timed(lambda: self.validate(self.cfgs[0]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke test: 2 rounds")
    p.add_argument("--rounds", type=int, default=7)
    add_timing_args(p)
    a = p.parse_args()
    apply_timing_args(a)
    rounds = 2 if a.quick else a.rounds

    from lm_ablate.config import ConfigError, compose

    header("shape solver: milliseconds per request (lm_ablate/shape.py)")
    rows, results = [], []
    for name, options in OPTIONS.items():
        cfgs = []
        for r in RATIOS:
            try:
                cfgs.append(compose([*BASE, *options, f"shape.ffn_ratio={r}"]))
            except ConfigError as err:  # no integer shape within 2% (RoPE's even head dims): not timed
                print(f"   {name} ratio {r}: {err}")
        c = Cases(cfgs)
        print(f"-- {name} ({' '.join(options) or 'defaults'}), {len(cfgs)} requests", flush=True)
        figures, loads = interleave({"cold": c.cold, "warm": c.warm, "cached": c.cached, "validate": c.reference},
                                    rounds)  # fmt: skip
        ref = figures["validate"]
        for case in ("cold", "warm", "cached", "validate"):
            per_round = [x / r for x, r in zip(figures[case], ref)]
            rows.append(
                [name, case, f"{median(figures[case]):.1f}", spread(figures[case]), f"{median(per_round):.2f}x"]
            )
        results.append(f"{name}: cold {median(figures['cold']):.0f} ms, warm {median(figures['warm']):.0f} ms, "
                       f"cached {median(figures['cached']):.1f} ms (validate {median(figures['validate']):.0f} ms)")  # fmt: skip
        print(f"   {load_summary(loads)}")
    print(table(["options", "request", "ms (median)", "range", "x validate"], rows))
    print("RESULT " + "; ".join(results))


if __name__ == "__main__":
    main()
