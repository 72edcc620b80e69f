"""Model ladders (group ``ladder``): one ablation at several model sizes, each trained for a budget in
proportion to its size, so that an effect can be read as a compute multiplier across scale
(``analysis/scaling.py``; the approach of OLMo's ladders and Hoffmann et al. 2022).

    rung r      model.d_model, model.n_layers, model.n_heads (and model.head_dim if given) = ladder.rungs[r]
    budget      train.max_tokens = ceil(ladder.tokens_per_param x b x N_r), b = ladder.budget (null: the
                largest of ladder.budgets, else 1), N_r = the rung's parameters as built, by ladder.params:
                non_embedding (default: an untied LM head counts, it is a matmul; a tied one is the embedding)
                or total (embeddings too); lm_ablate.model.model_cost
                Hoffmann et al. 2022 ("Chinchilla"): ~20 tokens per parameter is compute-optimal
    budgets     ladder.budgets = [0.5, 1, 2, 4]: one run per rung trains the largest, and a decay branch from
                it gives each smaller budget its own record (WSD-S; lm_ablate/budgets.py)
    LR rule     fixed   optim.lr at every rung
    (ladder.lr) grid    the sweep also varies optim.lr; the analysis keeps each (arm, rung)'s best LR
                mup     model.parametrization=mup with base width = rung 0's d_model: optim.lr tuned once at
                        rung 0 transfers to every rung (Yang et al. 2022; lm_ablate/parametrization.py)

A ladder study sweeps ``ladder.rung`` (and its arms and seeds). The shape and the μP rule are applied when the
config is composed (:func:`apply_rung`, from ``config.job_config`` and the training CLI), so validation, the
sweep check and ``python -m lm_ablate.cost`` see the rung's model; the budget needs the vocabulary (the untied
head's size), so the loop sets it once the data are loaded (:func:`token_budget`). The run record holds both.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from lm_ablate.budgets import budget_of, budget_tokens, plan
from lm_ablate.data import vocabulary
from lm_ablate.errors import ConfigError, bad
from lm_ablate.model import ModelCost, TransformerLM, model_cost
from lm_ablate.validation import SHAPE_KEYS, validate
from lm_ablate.validation import check_ladder as check_ladder_keys


def apply_rung(cfg: DictConfig) -> None:
    """Give ``cfg`` its rung's shape (and, with ``ladder.lr=mup``, the μP parametrization based at rung 0).
    Changes ``cfg``; nothing without a ladder. The ladder's keys are checked first."""
    if cfg.ladder.name is None:
        return
    check_ladder_keys(cfg)
    rung = cfg.ladder.rungs[cfg.ladder.rung]
    with open_dict(cfg):
        for key in SHAPE_KEYS:
            if key in rung:
                cfg.model[key] = rung[key]
        if cfg.ladder.lr == "mup":
            cfg.model.parametrization = "mup"
            cfg.model.mup_base_width = cfg.ladder.rungs[0]["d_model"]


def check_budget_keys(cfg: Any) -> None:
    """A ladder sets train.max_tokens itself: a value given by hand would be silently replaced, so refuse it."""
    if cfg.ladder.name is not None and cfg.train.max_tokens is not None:
        raise bad("train.max_tokens", cfg.train.max_tokens,
                  "a ladder sets it (ladder.tokens_per_param x non-embedding parameters); leave it null")  # fmt: skip


def params_of(cfg: Any, cost: ModelCost) -> int:
    """The N a budget is a multiple of (ladder.params: non_embedding or total)."""
    return cost.params_total if cfg.ladder.params == "total" else cost.params_non_embedding


def budget_params(cfg: DictConfig, vocab_size: int) -> int:
    """N (ladder.params) of the model ``cfg`` describes, counted on a model built on the meta device (no memory,
    no RNG)."""
    with torch.device("meta"):
        model = TransformerLM(cfg, vocab_size)
    return params_of(cfg, model_cost(model, cfg))


def token_budget(cfg: DictConfig, n_params: int) -> int:
    """train.max_tokens of this rung: ceil(tokens_per_param x budget x N) (N: :func:`params_of`)."""
    return budget_tokens(cfg.ladder, n_params)


def set_budget(cfg: DictConfig, vocab_size: int) -> int:
    """Set train.max_tokens of a ladder run (checked: :func:`check_budget`); returns the N it is a multiple of."""
    n = budget_params(cfg, vocab_size)
    budget = token_budget(cfg, n)
    check_budget(cfg, budget)
    with open_dict(cfg):
        cfg.train.max_tokens = budget
    return n


def check_budget(cfg: DictConfig, budget: int) -> None:
    """One step at least, and a train.max_steps that does not cut the budget short (one line each)."""
    t = cfg.train
    tokens_per_step = t.batch_size * cfg.model.context
    steps = math.ceil(budget / tokens_per_step)
    times = (
        f"{cfg.ladder.tokens_per_param:g} x {budget_of_text(cfg)}its {cfg.ladder.params.replace('_', '-')} parameters"
    )
    rung = f"rung {cfg.ladder.rung} ({budget} tokens = {times})"
    if budget < tokens_per_step:
        raise bad("ladder.tokens_per_param", cfg.ladder.tokens_per_param,
                  f"gives {rung} less than one step of {tokens_per_step} tokens")  # fmt: skip
    if t.max_steps < steps:
        raise bad("train.max_steps", t.max_steps,
                  f"stops {rung} before the {steps} steps of its budget: raise it (ladder yamls set 10^9)")  # fmt: skip


def budget_of_text(cfg: Any) -> str:
    b = budget_of(cfg.ladder)
    return "" if b == 1 else f"{b:g} x "


def rung_sizes(cfg: DictConfig, vocab_size: int) -> list[int]:
    """N (ladder.params) of every rung of the ladder (the other keys of ``cfg`` as they are)."""
    sizes = []
    for i in range(len(cfg.ladder.rungs)):
        other = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        OmegaConf.set_struct(other, True)
        other.ladder.rung = i
        apply_rung(other)
        try:
            validate(other)
        except ConfigError as err:  # say which rung's shape it is
            raise bad(f"ladder.rungs[{i}]", dict(cfg.ladder.rungs[i]), f"its model does not validate: {err}") from None
        sizes.append(budget_params(other, vocab_size))
    return sizes


def check_ladder(cfg: DictConfig, vocab_size: int) -> None:
    """Before any job starts: rungs strictly increasing in parameters (ladder.params), every rung's budget at
    least one step, and its decay branches possible (one line naming the key)."""
    sizes = rung_sizes(cfg, vocab_size)
    for i in range(1, len(sizes)):
        if sizes[i] <= sizes[i - 1]:
            raise bad(f"ladder.rungs[{i}]", dict(cfg.ladder.rungs[i]),
                      f"has {sizes[i]} {cfg.ladder.params} parameters, not more than rung {i - 1}'s {sizes[i - 1]}: "
                      "rungs must increase in size")  # fmt: skip
    n = sizes[cfg.ladder.rung]
    check_budget(cfg, token_budget(cfg, n))
    plan(cfg, n)


def vocab_size_of(data: Any) -> int:
    """The vocabulary a data config will give, without tokenizing (:func:`lm_ablate.data.vocabulary`; for a BPE
    not trained yet on the corpus, the requested size: an upper bound)."""
    return vocabulary(data).size
