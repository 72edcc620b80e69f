"""Every numeric key of the schema has a domain, and a value outside it fails at start with one line naming the
key, the value and what is allowed, instead of training into NaN (``position.theta=0``) or a traceback
(``model.init_std=-0.02``).

``BAD`` holds, for every int/float key of the schema dataclasses, values outside its domain; a walk of the
dataclasses makes sure no numeric key is missing from it (or from the explicit lists below it), so a key added
without a domain check makes this file fail. Non-finite floats (nan, inf) are refused for every float key."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from lm_ablate.config import Config, ConfigError, compose, validate
from lm_ablate.options import reading
from lm_ablate.validation import SHAPE_REQUEST as SHAPE_KEYS

ROOT = Path(__file__).resolve().parents[1]

# key -> values outside its domain, for the default config with an option that reads the key (base_for;
# model=small: d_model 128, 4 heads, 4 layers; train.batch_size 16; position.num_buckets 32)
BAD: dict[str, list[Any]] = {
    "model.d_model": [0, -128],
    "model.n_layers": [0],
    "model.n_heads": [0, 3],  # 3 does not divide d_model 128
    "model.head_dim": [0],
    "model.context": [0],
    "model.init_std": [-0.02, 0.0],  # 0 zeroes every matrix and embedding: nothing could train
    "model.output_init_std": [-0.02],  # 0 is allowed: a zero head
    "model.logit_softcap": [0.0, -30.0],
    "model.parallel_norms": [0, 3],
    "model.embed_dim": [0, -1],
    "model.mup_base_width": [0],
    "model.mup_output_mult": [0.0, -1.0],
    "model.mup_attn_mult": [0.0],
    "norm.eps": [0.0, -1e-5],
    "norm.deepnorm_alpha": [0.0],
    "norm.deepnorm_beta": [-1.0],
    "position.theta": [0.0, -10.0],
    "position.fraction": [0.0, 1.5],
    "position.num_buckets": [1],
    "position.max_distance": [16],  # must exceed num_buckets // 2 = 16
    "activation.d_ff": [0],
    "activation.multiple_of": [0],
    "attention.n_kv_heads": [0, 3],  # 3 does not divide n_heads 4
    "attention.qk_norm_eps": [0.0],
    "attention.softcap": [0.0],
    "attention.scale": [-1.0],
    "attention.window": [0],
    "attention.global_every": [-1, 5],  # 5 > n_layers with a window: no global layer (set with window below)
    "regularization.dropout": [-0.1, 1.0],
    "regularization.embedding_dropout": [1.0],
    "regularization.attention_dropout": [-0.5],
    "regularization.residual_dropout": [1.5],
    "regularization.weight_decay": [-0.1],
    "regularization.grad_clip": [-1.0],
    "regularization.z_loss": [-1e-4],
    "optim.lr": [0.0, -3e-3],
    "optim.beta1": [1.0, -0.1],
    "optim.beta2": [1.0],
    "optim.eps": [0.0, -1e-8],
    "optim.warmup_steps": [-1],
    "optim.min_lr_ratio": [-0.1, 1.5],
    "optim.decay_fraction": [0.0, 1.5],
    "optim.momentum": [-0.1, 1.0],
    "optim.ns_steps": [0, 100],
    "optim.muon_lr_scale": [0.0],
    "optim.beta2_decay": [0.5],
    "optim.eps2": [-1e-3],
    "optim.clip_threshold": [0.0],
    "train.max_steps": [0],
    "train.batch_size": [0],
    "train.eval_every": [0],
    "train.eval_batches": [0],
    "train.log_every": [0],
    "train.threads": [0, -1],
    "train.max_skipped_steps": [-1],
    "train.max_tokens": [0],
    "train.max_time_s": [0.0],
    "train.grad_accum": [0, 3],  # 3 does not divide batch_size 16
    "train.probe_every": [-1],
    "train.peak_flops": [0.0],
    "train.extrapolation": [[0]],
    "train.checkpoint_every": [-1],
    "train.keep_checkpoints": [0],
    "train.spike.window": [1],
    "train.spike.k": [0.0, -6.0],
    "train.shard_size": [0],
    "train.ac_every": [0, 5],  # 5 > n_layers 4: no block would be recomputed
    "seed": [-1, 2**64],
    "data.num_proc": [0],
    "data.tokenizer_sample": [0],
    "data.max_tokens": [0],
    "ladder.rung": [-1, 3],
    "ladder.tokens_per_param": [0.0, -20.0],
    "ladder.budget": [0.0, 3.0],  # 3 is not one of ladder.budgets [1, 2] (set below)
    "eval.every": [0],
    "eval.max_examples": [0],
    "eval.batch_tokens": [0],
    "shape.target_params": [0.0, -4e5],
    "shape.ffn_ratio": [0.0, -1.0],
    "shape.aspect": [0.0],
    "shape.attn_ratio": [0.0, -2.0],
    "shape.head_dim": [0],
    "shape.n_heads": [0],
    "shape.head_dim_target": [0],
    "shape.d_model": [0],
    "shape.n_layers": [0],
    "shape.d_ff_multiple": [0],
    "shape.tolerance": [0.0, 1.0],
    "optim.wd_timescale": [0.0, -0.3],
    "train.max_bytes": [0, -1],
    "train.val_bpb_bytes": [-1],  # 0 turns val bits per byte off
}
# other keys a case needs so that its own check is reached
LADDER = {"ladder.rungs": [{"d_model": 16, "n_layers": 1, "n_heads": 2}] * 3}  # with ladder=cpu (base_for)
SHAPE_ISO = {"shape.name": "iso", "shape.target_params": 4e5}
WITH: dict[str, dict[str, Any]] = {
    "attention.global_every": {"attention.window": 8},
    "ladder.rung": LADDER,
    "ladder.tokens_per_param": LADDER,
    "ladder.budget": LADDER | {"ladder.budgets": [1.0, 2.0]},
    "model.mup_output_mult": {"model.mup_base_width": 32},
    "model.mup_attn_mult": {"model.mup_base_width": 32},
    # shape=iso reads the shape keys (lm_ablate/shape.py); validation checks their domains, the solver the rest
    **{f"shape.{k}": SHAPE_ISO for k in SHAPE_KEYS if k != "target_params"},
    "shape.target_params": {"shape.name": "iso", "shape.n_layers": 4},
}

# numeric keys whose domain depends on the data source or tokenizer, so lm_ablate/data.py checks them where the
# source is known (still before the run writes anything); test_data_keys_are_checked_by_the_data_code below
DATA_CODE: dict[str, Any] = {
    "data.vocab_size": 256,  # bpe: 257..2**32 (256 byte symbols + merges); the byte tokenizer ignores it
    "data.val_fraction": 1.0,  # hf without a validation split: (0, 1)
    "data.max_docs": 0,  # hf: a positive integer or null
}

# numeric keys any value of which is valid (name each with its reason)
UNRESTRICTED: dict[str, str] = {
    "model.vocab_size": "not the user's: the run sets it from its data; the CLI refuses any value (check_vocab_key)",
}


def numeric_keys(cls: type = Config, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> annotation of every int/float field (optional or list of them) of the schema dataclasses."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out |= numeric_keys(kind, f"{prefix}{f.name}.")
            continue
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        inner = args[0] if typing.get_origin(kind) in (typing.Union, list) and len(args) == 1 else kind
        if inner in (int, float):  # bool is its own annotation, not int
            out[f"{prefix}{f.name}"] = kind
    return out


@functools.cache
def _base(overrides: tuple[str, ...]) -> DictConfig:
    return compose(list(overrides))  # valid but for mup's base width (each test sets the key it refuses)


def base_for(key: str) -> DictConfig:
    """The default config with an option that reads ``key`` (a key only some options read is null otherwise:
    lm_ablate/options.py), e.g. optim=muon for optim.ns_steps."""
    return _base(tuple(reading(key)))


def with_values(base: DictConfig, values: dict[str, Any]) -> DictConfig:
    cfg = copy.deepcopy(base)
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def refused(cfg: DictConfig) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("key, value", [(k, v) for k, values in BAD.items() for v in values])
def test_value_outside_the_domain_fails_validation_naming_the_key(key, value):
    message = refused(with_values(base_for(key), WITH.get(key, {}) | {key: value}))
    assert message.startswith(f"{key}={value!r} is invalid: "), message


def test_every_numeric_key_has_a_domain():
    keys = numeric_keys()
    listed = [*BAD, *DATA_CODE, *UNRESTRICTED]
    assert len(listed) == len(set(listed)), "a key is listed twice"
    missing = sorted(set(keys) - set(listed))
    assert not missing, f"numeric keys with no domain check: add them to BAD (and to validate): {missing}"
    assert not set(listed) - set(keys), f"listed keys that are not in the schema: {sorted(set(listed) - set(keys))}"


FLOAT_KEYS = [k for k, kind in numeric_keys().items() if float in (kind, *typing.get_args(kind))]


# keys for which +inf is a value: optim.wd_timescale=inf is no weight decay (lambda = 0; lm_ablate/optim.py)
INF_IS_A_VALUE = {"optim.wd_timescale"}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_non_finite_float_fails_validation(key, value):
    if value == math.inf and key in INF_IS_A_VALUE:
        cfg = with_values(base_for(key), {key: value, "regularization.weight_decay": None})
        validate(cfg)  # accepted
        return
    message = refused(with_values(base_for(key), {key: value}))
    assert message.startswith(f"{key}={value!r} is invalid: must be a finite number"), message


def test_data_keys_are_checked_by_the_data_code(tmp_path):
    from lm_ablate.catalog import load_all
    from lm_ablate.config import DataConfig
    from lm_ablate.data import DataError
    from lm_ablate.registry import DATASETS, TOKENIZERS

    load_all()
    for key, value in DATA_CODE.items():
        name = key.split(".")[1]
        cfg = OmegaConf.structured(DataConfig(name="hf", path=str(tmp_path / "x.txt"), tokenizer="bpe"))
        cfg[name] = value
        with pytest.raises(DataError, match=rf"^{key}={value!r} is invalid: "):
            if key == "data.vocab_size":
                TOKENIZERS.get("bpe")(cfg, None, tmp_path)  # refused before the training text is read
            else:
                DATASETS.build(cfg)


def test_cli_refuses_a_zero_rope_base_before_writing_anything(tmp_path, cache_dir):
    """``position.theta=0`` used to train into NaN and end as ``diverged``, as if the architecture were unstable."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "lm_ablate.train", "debug=smoke", "position=rope", "position.theta=0"]
    cmd += ["tracking=none", f"hydra.run.dir={run_dir}", f"data.cache_dir={cache_dir}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "lm-ablate: error: position.theta=0.0 is invalid: must be > 0 (the base of the rope angles p * theta^(-2i/r))"
    ]
    # a refused launch leaves nothing: not even the folder Hydra made for it (or an empty job log)
    assert not run_dir.exists()
