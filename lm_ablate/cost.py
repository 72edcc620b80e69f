"""What an arm costs before it runs: ``python -m lm_ablate.cost [overrides] [--world N]`` prints parameter counts,
training FLOPs per token (formula in :func:`lm_ablate.model.model_cost`) and the memory of one training step on
one rank (:func:`lm_ablate.perf.memory_estimate`) for the config those overrides give, run on ``--world`` ranks
under its ``train.parallel`` (``--world`` is an argument of this command, not a config key: the number of
processes torchrun would start; ``--gpus-per-node`` is hsdp's default shard size, LOCAL_WORLD_SIZE at run time):

    python -m lm_ablate.cost ladder=gpu ladder.rung=5 train.parallel=fsdp --world 8

The model is built on the meta device (:func:`arm_cost`): every parameter has its shape and no memory, so a
billion-parameter rung or a 100M-token vocabulary is counted as fast as a tiny model, by the same code the run
builds its model with. The vocabulary is the one the run will train with (:func:`lm_ablate.data.vocabulary`).
"""

from __future__ import annotations

import argparse
import re
import sys

import torch
from omegaconf import DictConfig

from lm_ablate.config import ConfigError, bad, compose, compose_error_message
from lm_ablate.data import Vocabulary, check_vocab_key, vocabulary
from lm_ablate.ladder import params_of, token_budget
from lm_ablate.model import ModelCost, TransformerLM, model_cost
from lm_ablate.perf import memory_estimate
from lm_ablate.shape import apply_shape

NOT_TRAINED = "an upper bound: the BPE is not trained yet for this corpus, and stops short when merges run out"


def arm_cost(cfg: DictConfig, vocab_size: int) -> ModelCost:
    """:func:`model_cost` of the model ``cfg`` describes, built on the meta device: no memory, no RNG draw."""
    with torch.device("meta"):
        model = TransformerLM(cfg, vocab_size)
    return model_cost(model, cfg)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def memory_lines(cfg: DictConfig, cost: ModelCost, vocab: int, world: int, device: str, per_node: int) -> list[str]:
    """The estimate of one rank's peak memory in a step, by part (lm_ablate/perf.py; exact parameter count)."""
    t = cfg.train
    if t.batch_size % (world * t.grad_accum):
        raise bad("train.batch_size", t.batch_size, f"must be divisible by the number of processes ({world}) x "
                  f"train.grad_accum ({t.grad_accum})")  # fmt: skip
    shard = None
    if world > 1 and t.parallel == "hsdp":
        shard = t.shard_size or min(world, per_node)
        if world % shard:
            raise bad("train.shard_size", t.shard_size, f"must divide the number of processes ({world})"
                      + ("" if t.shard_size else f" (null: --gpus-per-node={per_node})"))  # fmt: skip
    est = memory_estimate(cfg, vocab, device, world, shard=shard, params=cost.params_total)
    how = "one process" if world == 1 else f"train.parallel={est.parallel}, {world} ranks"
    if world == 1 and t.parallel != "ddp":
        how += f" (train.parallel={t.parallel} shards only with --world >= 2)"
    elif est.shard > 1:
        how += f", each copy sharded over {est.shard}"
    micro = t.batch_size // (world * t.grad_accum)
    lines = [
        f"memory per rank   {_gib(est.total)} on {device}, estimated ({how})",
        f"  states          {_gib(est.states)}  (weights, gradients, AdamW moments: 16 B x {est.params:,}"
        + (f" / {est.shard})" if est.shard > 1 else ")"),
    ]
    if est.working:
        lines.append(f"  FSDP gathered   {_gib(est.working)}  (two blocks' weights, one block's gradients, the root "
                     "whole)")  # fmt: skip
    lines += [
        f"  activations     {_gib(est.activations)}  (micro-batch {micro} x {cfg.model.context} tokens; "
        f"{est.checkpointed} of {cfg.model.n_layers} blocks recomputed: train.activation_checkpointing="
        f"{t.activation_checkpointing})",
        f"  logits          {_gib(est.logits)}  (fp32, with log-softmax and gradient)",
    ]
    return lines


def describe(
    overrides: list[str], vocab_size: int | None = None, world: int = 1, device: str | None = None, per_node: int = 8
) -> str:
    cfg = compose(overrides)
    check_vocab_key(cfg)
    vocab = vocabulary(cfg.data) if vocab_size is None else Vocabulary(vocab_size)
    shape = apply_shape(cfg, vocab=vocab.size)  # shape=iso: solved for this vocabulary (compose's, or the one given)
    cost = arm_cost(cfg, vocab.size)
    if shape is not None:
        shape.check(cost)
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
            *(shape.lines(cost) if shape is not None else []),
            f"run FLOPs         {cost.flops_per_token * tokens:.3e}  ({tokens:,} tokens)",
            *memory_lines(cfg, cost, vocab.size, world, device or _device(cfg), per_node),
        ]
    )


def _device(cfg: DictConfig) -> str:
    """The device the estimate is for: cpu when the config says so, else cuda (bf16 activations)."""
    return "cpu" if cfg.train.device == "cpu" else "cuda"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lm_ablate.cost",
        description="Parameter counts, training FLOPs per token and the per-rank memory of a step of the arm that "
        "Hydra overrides give, before it runs (nothing is trained, allocated or written).",
        epilog="examples: python -m lm_ablate.cost arch=llama model=medium; "
        "python -m lm_ablate.cost ladder=gpu ladder.rung=5 train.parallel=fsdp --world 8",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m lm_ablate.train")
    parser.add_argument("--world", type=int, default=1, help="ranks the run has (torchrun's processes; default 1)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="device of the memory estimate (default: cpu if train.device=cpu, else cuda)")  # fmt: skip
    parser.add_argument("--gpus-per-node", type=int, default=8, help="hsdp's shard size when train.shard_size is null")
    # overrides before, between and after the options, as the examples write them (parse_known_args stops
    # collecting the positional overrides at the first option)
    args, unknown = parser.parse_known_intermixed_args(argv)
    if unknown:  # a Hydra override may start with ~ or +, never with -
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    given = next((o for o in args.overrides if re.fullmatch(r"\+*world=.*", o)), None)
    for key, value in (("--world", args.world), ("--gpus-per-node", args.gpus_per_node)):
        if value < 1:
            print(f"lm-ablate: error: {key}={value} is invalid: must be a positive integer", file=sys.stderr)
            return 2
    if given is not None:
        print(f"lm-ablate: error: {given} is invalid: world is not a config key; the number of ranks is an argument "
              f"of this command: --world {given.split('=', 1)[1]}", file=sys.stderr)  # fmt: skip
        return 2
    try:
        print(describe(args.overrides, world=args.world, device=args.device, per_node=args.gpus_per_node))
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
