"""What an arm costs before it runs: ``python -m lm_ablate.cost [overrides]`` prints parameter counts and
training FLOPs per token (formula in :func:`lm_ablate.model.model_cost`) for the config those overrides give."""

from __future__ import annotations

import sys

from lm_ablate.config import ConfigError, compose, compose_error_message
from lm_ablate.model import TransformerLM, model_cost


def describe(overrides: list[str], vocab_size: int | None = None) -> str:
    cfg = compose(overrides)
    if vocab_size is None:  # byte level is 256; a BPE vocabulary is what the data config asks for
        vocab_size = 256 if cfg.data.tokenizer == "byte" else cfg.data.vocab_size
    cost = model_cost(TransformerLM(cfg, vocab_size), cfg)
    tokens = cfg.train.max_steps * cfg.train.batch_size * cfg.model.context
    arm = " ".join(overrides) or "(defaults)"
    return "\n".join(
        [
            f"config            {arm}",
            f"vocab size        {vocab_size:,}",
            f"params total      {cost.params_total:,}",
            f"params embedding  {cost.params_embedding:,}",
            f"params non-emb.   {cost.params_non_embedding:,}",
            f"FLOPs/token       {cost.flops_per_token:,.0f}  (6N + 12*L*H*hd*T, PaLM app. B)",
            f"run FLOPs         {cost.flops_per_token * tokens:.3e}  ({tokens:,} tokens)",
        ]
    )


if __name__ == "__main__":
    try:
        print(describe(sys.argv[1:]))
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # Hydra's composition errors as one line; anything else is a bug: full traceback
        line = compose_error_message(err)
        if line is None:
            raise
        print(f"lm-ablate: error: {line}", file=sys.stderr)
        sys.exit(2)
