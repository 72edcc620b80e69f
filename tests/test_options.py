"""Each option's keys are its own (lm_ablate/options.py): every group x option x key that some option of the
axis reads is walked here. Given on the command line for an option that does not read it, a key is refused in
one line naming the options that do; set by a file (an arch preset, an experiment), it is cleared to null; an
option that reads it keeps it. A name is never contradicted by what is built."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from lm_ablate.checkpoint import config_differences
from lm_ablate.config import ConfigError, compose, to_container, validate
from lm_ablate.options import owners, reading, settle, unread

ROOT = Path(__file__).resolve().parents[1]

# a valid value for each key whose default, where it is read, is null (a null is never refused)
SAMPLE: dict[str, Any] = {
    "norm.deepnorm_alpha": 1.5,
    "norm.deepnorm_beta": 0.5,
    "model.mup_base_width": 32,
    "tracking.entity": "me",
    "tracking.mode": "offline",
    "tracking.tags": ["extra"],
    "ladder.rungs": [{"d_model": d, "n_layers": 1, "n_heads": 2} for d in (16, 24, 32)],
    "ladder.rung": 1,
    "ladder.budgets": [1.0],
    "ladder.budget": 1.0,
    "data.path": "/tmp/corpus.txt",
    "data.vocab_size": 300,
    "data.hf_config": "plain",
    "data.val_split": "validation",
    "data.max_docs": 10,
    "data.max_tokens": 1000,
    "data.streaming": False,
    "data.tokenizer_path": "gpt2",
    "data.tokenizer_sample": 1000,
    "train.shard_size": 2,
    "optim.wd_timescale": 0.2,
}
# what an option needs besides the key to validate (its required keys)
NEEDS: dict[tuple[str, Any], list[str]] = {
    ("model.parametrization", "mup"): ["model.mup_base_width=32"],
    ("data.name", "tokens"): ["data.vocab_size=300"],
    ("data.tokenizer", "pretrained"): ["data.tokenizer_path=gpt2"],
}


def choose(owner: Any, option: Any) -> str:
    if owner.node == "ladder":
        return "ladder=cpu" if option is not None else "seed=0"  # no ladder: the default
    group = owner.selector == f"{owner.node}.name"
    return f"{owner.node}={option}" if group else f"{owner.selector}={option}"


def options_of(owner: Any) -> list[Any]:
    if owner.node == "ladder":
        return [None, "cpu"]
    from lm_ablate.registry import ALL_REGISTRIES

    return next(r for r in ALL_REGISTRIES if r.selector == owner.selector).names()


@functools.cache
def composed(*overrides: str) -> DictConfig:
    return compose(list(overrides))


def sample(key: str) -> Any:
    if key in SAMPLE:
        return SAMPLE[key]
    value = OmegaConf.select(composed(*reading(key)), key)
    assert value is not None, f"{key}: give it a SAMPLE value"
    return value


CASES = [(owner, option, key) for owner in owners() for key in owner.readers for option in options_of(owner)]


def case_id(case: tuple) -> str:
    owner, option, key = case
    return f"{owner.selector}={option}:{key}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_key_is_refused_for_an_option_that_does_not_read_it_and_kept_for_one_that_does(case):
    owner, option, key = case
    dotted = f"{owner.node}.{key}"
    extra = NEEDS.get((owner.selector, option), [])
    # as a sweep arm is checked (lm_ablate/sweep_check.py): the option's composition, then the key as an override
    cfg = copy.deepcopy(composed(choose(owner, option), *extra))
    OmegaConf.update(cfg, dotted, sample(dotted), merge=False)
    readers = owner.readers[key]
    if owner.node == "ladder" and option is not None or option in readers:
        settle(cfg, {dotted})
        validate(cfg)
        assert OmegaConf.select(cfg, dotted) == sample(dotted)
        return
    with pytest.raises(ConfigError) as err:
        settle(cfg, {dotted})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{dotted}="), message
    if owner.node == "ladder":
        assert "no ladder is chosen" in message, message
    else:
        assert f"has no {key} (" in message and all(str(r) in message for r in readers), message


def test_the_issue_examples_are_refused_in_the_format_it_asks_for():
    expected = {
        ("optim=adamw", "optim.momentum=0.9"): "optim.momentum=0.9 is invalid: adamw has no momentum (muon, sgd)",
        ("optim=sgd", "optim.beta2=0.99"): "optim.beta2=0.99 is invalid: sgd has no beta2 (adamw, muon)",
        ("optim=adamw", "optim.ns_steps=3"): "optim.ns_steps=3 is invalid: adamw has no ns_steps (muon)",
        ("norm=rmsnorm", "norm.bias=true"): "norm.bias=True is invalid: rmsnorm has no bias (layernorm)",
        ("attention=mqa", "attention.n_kv_heads=2"): "attention.n_kv_heads=2 is invalid: mqa has no n_kv_heads (gqa)",
        ("attention=mha", "attention.n_kv_heads=1"): "attention.n_kv_heads=1 is invalid: mha has no n_kv_heads (gqa)",
    }
    for overrides, line in expected.items():
        with pytest.raises(ConfigError) as err:
            compose(list(overrides))
        assert str(err.value) == line
    with pytest.raises(ConfigError, match=r"^ladder.rung=7 is invalid: no ladder is chosen"):
        compose(["ladder.rung=7"])


def test_values_a_file_sets_for_another_option_are_cleared_not_refused():
    """arch=llama sets rope's theta 500000 and GQA's 2 K/V heads; swapping the position or attention drops them."""
    llama = compose(["arch=llama", "model=tiny"])
    assert llama.position.theta == 500000.0 and llama.attention.n_kv_heads == 2
    alibi = compose(["arch=llama", "model=tiny", "position=alibi", "attention=mha"])
    validate(alibi)
    assert alibi.position.theta is None and alibi.position.fraction is None and alibi.attention.n_kv_heads is None
    # the default config records null for every key its options do not read
    default = compose([])
    assert default.optim.momentum is None and default.optim.ns_steps is None and default.norm.unit_offset is None
    assert default.position.theta is None and default.ladder.rung is None and default.model.parallel_norms is None
    assert not [item for item in unread(default) if item.value is not None]
    # an option that reads a key keeps the file's value
    assert compose(["optim=sgd"]).optim.momentum == 0.9 and compose(["optim=muon"]).optim.momentum == 0.95


def test_every_group_yaml_sets_only_keys_its_option_reads():
    """conf/<group>/<option>.yaml documents the option: it may not set another option's keys (a sub-option's
    keys, such as the schedule's, stay: the group file sets them for when that sub-option is chosen)."""
    checked = 0
    for owner in owners():
        if owner.selector != f"{owner.node}.name" or owner.node == "ladder":
            continue
        for path in sorted((ROOT / "conf" / owner.node).glob("*.yaml")):
            keys = set(OmegaConf.load(path)) & set(owner.readers)
            wrong = sorted(k for k in keys if path.stem not in owner.readers[k])
            assert not wrong, f"{path.relative_to(ROOT)} sets {wrong}, which {path.stem} does not read"
            checked += 1
    assert checked >= 20


def test_mha_and_mqa_build_what_their_names_say():
    from lm_ablate.model import TransformerLM

    def kv_heads(*overrides: str) -> int:
        model = TransformerLM(compose(["model=tiny", *overrides]), 256)
        return model.blocks[0].attn.n_kv_heads

    n_heads = compose(["model=tiny"]).model.n_heads
    assert kv_heads("attention=mha") == n_heads
    assert kv_heads("attention=mqa") == 1
    assert kv_heads("attention=gqa", "attention.n_kv_heads=1") == 1  # GQA-1 is MQA (Ainslie et al. 2023)
    # a preset's K/V count for GQA does not leak into MQA: PaLM is MQA whatever the gqa file says
    assert kv_heads("arch=palm") == 1
    torch.manual_seed(0)


@pytest.mark.parametrize(
    "overrides, key, why",
    [
        (["regularization=none", "regularization.z_loss=1e-4"], "regularization.z_loss", "has none"),
        (["regularization=none", "regularization.weight_decay=0.1"], "regularization.weight_decay", "has none"),
        (["regularization=standard", "regularization.dropout=0.1"], "regularization.dropout", "has no dropout"),
        (["regularization=zloss", "regularization.residual_dropout=0.1"], "regularization.residual_dropout", "dropout"),
        (["regularization=standard", "regularization.z_loss=1e-4"], "regularization.z_loss", "has no z-loss"),
        (["regularization=dropout", "regularization.dropout=0"], "regularization.dropout", "needs a rate"),
        (["regularization=zloss", "regularization.z_loss=0"], "regularization.z_loss", "needs a coefficient"),
    ],
)
def test_a_regularization_name_is_not_contradicted_by_its_values(overrides, key, why):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides))
    assert str(err.value).startswith(f"{key}=") and why in str(err.value), err.value


def test_regularization_amounts_stay_free_within_a_name():
    for overrides in (
        ["regularization.weight_decay=0", "regularization.grad_clip=0"],
        ["regularization=dropout", "regularization.dropout=0.2", "regularization.attention_dropout=0"],
        ["regularization=zloss", "regularization.z_loss=1e-3", "regularization.weight_decay=0.01"],
    ):
        validate(compose(overrides))


def test_a_record_written_before_options_owned_their_keys_resumes():
    """Old run records hold adamw's unread momentum 0.9 etc.; those keys change nothing, so no difference."""
    now = to_container(compose(["model=tiny"]))
    old = to_container(compose(["model=tiny"]))
    old["optim"] |= {"momentum": 0.9, "ns_steps": 5, "nesterov": False}
    old["position"] |= {"theta": 10000.0}
    assert config_differences(old, now) == []
    old["optim"]["lr"] = 1.0
    assert config_differences(old, now) == ["optim.lr"]


def test_the_cli_and_a_sweep_refuse_before_anything_is_written(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    common = ["debug=smoke", "tracking=none", f"data.cache_dir={cache_dir}"]
    cmd = [sys.executable, "-m", "lm_ablate.train", *common, "optim.momentum=0.9", f"hydra.run.dir={run_dir}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "lm-ablate: error: optim.momentum=0.9 is invalid: adamw has no momentum (muon, sgd)"
    ]
    assert not run_dir.exists()
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "lm_ablate.train", "--multirun", *common, "optim=sgd,adamw", "optim.momentum=0.5"]
    out = subprocess.run(cmd + [f"hydra.sweep.dir={sweep_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "optim=adamw" in out.stderr and "adamw has no momentum (muon, sgd)" in out.stderr, out.stderr
    assert not sweep_dir.exists() or not any(sweep_dir.rglob("summary.json"))
