"""What an arm costs before it runs: ``python -m lm_ablate.cost [overrides]`` prints parameter counts and
training FLOPs per token (formula in :func:`lm_ablate.model.model_cost`) for the config those overrides give.

The model is built on the meta device (:func:`arm_cost`): every parameter has its shape and no memory, so a
billion-parameter rung or a 100M-token vocabulary is counted as fast as a tiny model, by the same code the run
builds its model with. The vocabulary is the one the run will train with (:func:`lm_ablate.data.vocabulary`).
"""

from __future__ import annotations

import argparse
import sys

import torch
from omegaconf import DictConfig

from lm_ablate.config import ConfigError, compose, compose_error_message
from lm_ablate.data import Vocabulary, check_vocab_key, vocabulary
from lm_ablate.ladder import params_of, token_budget
from lm_ablate.model import ModelCost, TransformerLM, model_cost

NOT_TRAINED = "an upper bound: the BPE is not trained yet for this corpus, and stops short when merges run out"


def arm_cost(cfg: DictConfig, vocab_size: int) -> ModelCost:
    """:func:`model_cost` of the model ``cfg`` describes, built on the meta device: no memory, no RNG draw."""
    with torch.device("meta"):
        model = TransformerLM(cfg, vocab_size)
    return model_cost(model, cfg)


def describe(overrides: list[str], vocab_size: int | None = None) -> str:
    cfg = compose(overrides)
    check_vocab_key(cfg)
    vocab = vocabulary(cfg.data) if vocab_size is None else Vocabulary(vocab_size)
    cost = arm_cost(cfg, vocab.size)
    tokens = cfg.train.max_steps * cfg.train.batch_size * cfg.model.context
    budget = []
    if cfg.ladder.name is not None:  # a ladder rung trains for tokens_per_param x budget x N (ladder.params)
        tokens = min(tokens, token_budget(cfg, params_of(cfg, cost)))
        budget = [f"ladder            {cfg.ladder.name}, rung {cfg.ladder.rung} of {len(cfg.ladder.rungs)}: "
                  f"{cfg.ladder.tokens_per_param:g} tokens per {cfg.ladder.params.replace('_', '-')} parameter"]  # fmt: skip
    elif cfg.train.max_tokens is not None:
        tokens = min(tokens, cfg.train.max_tokens)
    arm = " ".join(overrides) or "(defaults)"
    return "\n".join(
        [
            *budget,
            f"config            {arm}",
            f"vocab size        {vocab.size:,}" + (f"  ({NOT_TRAINED})" if vocab.upper_bound else ""),
            f"params total      {cost.params_total:,}",
            f"params embedding  {cost.params_embedding:,}",
            f"params non-emb.   {cost.params_non_embedding:,}",
            f"FLOPs/token       {cost.flops_per_token:,.0f}  (6N + 12*L*H*hd*T, PaLM app. B)",
            f"run FLOPs         {cost.flops_per_token * tokens:.3e}  ({tokens:,} tokens)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lm_ablate.cost",
        description="Parameter counts and training FLOPs per token of the arm that Hydra overrides give, "
        "before it runs (nothing is trained, allocated or written).",
        epilog="example: python -m lm_ablate.cost arch=llama model=medium",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m lm_ablate.train")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # a Hydra override may start with ~ or +, never with -
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        print(describe(args.overrides))
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # Hydra's composition errors as one line; anything else is a bug: full traceback
        line = compose_error_message(err)
        if line is None:
            raise
        print(f"lm-ablate: error: {line}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
