"""What validation bits per byte adds to a default run's evaluation time (issue 47: < 5%).

    python bench/val_bpb.py [--repeats 5] [--threads 1] [overrides ...]

A default run (``python -m lm_ablate.train``: model=small, 200 steps, train.eval_every=50, train.eval_batches=8,
batch 16 x 128) evaluates its validation loss 5 times (steps 0, 50, 100, 150, 200) and val/bpb once, at the end,
over train.val_bpb_bytes of held-out text. Both are timed here in one process on the same model, alternately,
``--repeats`` times (median of each): share = bpb / (5 x one validation pass). Time to build the held-out
windows (read from the token cache's held-out file, tokenized) is timed too and counted in the share.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import loadavg

TARGET = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args, overrides = parser.parse_known_args()
    import torch

    from lm_ablate.config import compose
    from lm_ablate.data import load_data, val_batches
    from lm_ablate.eval.bpb import bits_per_byte, held_out_text
    from lm_ablate.model import TransformerLM
    from lm_ablate.train import evaluate

    torch.set_num_threads(args.threads)
    cfg = compose(["tracking=none", *overrides])
    t = cfg.train
    data = load_data(cfg.data)
    tic = time.perf_counter()
    text = held_out_text(cfg, data)
    setup = time.perf_counter() - tic
    torch.manual_seed(0)
    model = TransformerLM(cfg, data.vocab_size)
    batches = val_batches(data.val, t.batch_size, cfg.model.context, t.eval_batches)
    passes = t.max_steps // t.eval_every + (t.max_steps % t.eval_every != 0) + 1  # step 0 ... the end
    no_autocast = contextlib.nullcontext
    evaluate(model, batches, no_autocast)  # warm-up
    bits_per_byte(model, text, no_autocast)
    val_s, bpb_s = [], []
    for _ in range(args.repeats):
        tic = time.perf_counter()
        evaluate(model, batches, no_autocast)
        val_s.append(time.perf_counter() - tic)
        tic = time.perf_counter()
        bits_per_byte(model, text, no_autocast)
        bpb_s.append(time.perf_counter() - tic)
    val, bpb = statistics.median(val_s), statistics.median(bpb_s)
    share = (bpb + setup) / (passes * val)
    print(f"load before: {loadavg()}  threads {args.threads}  overrides {overrides or 'none'}")
    print(f"validation pass: {val * 1e3:.1f} ms ({t.eval_batches} x {t.batch_size} x {cfg.model.context} tokens), "
          f"{passes} passes per run = {passes * val * 1e3:.0f} ms")  # fmt: skip
    print(f"val/bpb: {bpb * 1e3:.1f} ms ({text.n_bytes} bytes, {text.n_tokens} tokens, {len(text.x)} windows) "
          f"+ set-up {setup * 1e3:.1f} ms")  # fmt: skip
    print(
        f"share of the run's evaluation time: {share:.1%} (target < {TARGET:.0%}): {'ok' if share < TARGET else 'OVER'}"
    )
    print(f"load after: {loadavg()}")


if __name__ == "__main__":
    main()
