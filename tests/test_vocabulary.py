"""The vocabulary a run trains with is the one it records (issue 21.2): ``model.vocab_size`` in config.yaml and
``vocab_size`` in summary.json, set by the run from its data; ``python -m lm_ablate.cost`` gives the same number
(lm_ablate.data.vocabulary), and records written before the key existed still resume and stay unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, compose, to_container
from lm_ablate.cost import NOT_TRAINED, describe
from lm_ablate.data import shakespeare_works, vocabulary
from lm_ablate.train import train

pytestmark = pytest.mark.usefixtures("one_thread")
SMOKE = ["debug=smoke", "train.max_steps=2", "train.threads=1"]


def small_corpus(tmp_path: Path) -> Path:
    """Two short works (~190 KB), paragraphs as documents: far fewer distinct merges than 10^8 tokens."""
    path = tmp_path / "small.txt"
    works = shakespeare_works()
    path.write_text(works["macbeth"] + "\n\n" + works["sonnets"])
    return path


def recorded(run: Path) -> tuple[dict, dict]:
    return OmegaConf.to_container(OmegaConf.load(run / M.CONFIG_FILE)), json.loads((run / M.SUMMARY_FILE).read_text())


def test_a_bpe_that_stops_short_is_recorded_at_its_size_and_cost_agrees(tmp_path, capsys):
    cache = tmp_path / "cache"
    arm = [*SMOKE, "data=hf", f"data.path={small_corpus(tmp_path)}", "data.tokenizer=bpe"]
    arm += ["data.vocab_size=100000000", f"data.cache_dir={cache}"]
    before = describe(arm)  # nothing trained yet: the request, marked as a bound
    assert f"vocab size        100,000,000  ({NOT_TRAINED})" in before
    assert not cache.exists()  # counting wrote nothing

    summary = train(compose(arm), tmp_path / "run")
    config, on_disk = recorded(tmp_path / "run")
    (trained,) = (cache / "tokenizers").glob("*.json")
    tok = json.loads(trained.read_text())
    size = max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])]) + 1  # read from the file
    assert 257 < size < 100_000_000
    assert config["model"]["vocab_size"] == size and on_disk[M.VOCAB_SIZE] == size == summary[M.VOCAB_SIZE]
    assert config["data"]["vocab_size"] == 100_000_000  # the request stays what it was
    d = config["model"]["d_model"]
    assert on_disk[M.PARAMS_TOTAL] - on_disk[M.PARAMS_NON_EMBEDDING] == size * d + config["model"]["context"] * d
    note = f"lm-ablate: data.vocab_size=100000000: BPE on this corpus stops at {size:,} tokens; the run uses {size:,}"
    assert note + " (model.vocab_size)" in capsys.readouterr().err.splitlines()

    after = describe(arm)  # trained: its size, and the counts of the model the run built
    assert f"vocab size        {size:,}\n" in after and NOT_TRAINED not in after
    assert f"params total      {on_disk[M.PARAMS_TOTAL]:,}\n" in after
    assert f"FLOPs/token       {on_disk[M.FLOPS_PER_TOKEN]:,.0f} " in after


@pytest.mark.parametrize(
    "arm, size",
    [
        ([], 256),  # bytes
        (["data.tokenizer=bpe", "data.vocab_size=300"], 300),  # a BPE the corpus can fill
    ],
)
def test_every_tokenizer_records_its_vocabulary(tmp_path, cache_dir, arm, size):
    cfg = compose([*SMOKE, f"data.cache_dir={cache_dir}", *arm])
    assert cfg.model.vocab_size is None
    summary = train(cfg, tmp_path / "run")
    config, _ = recorded(tmp_path / "run")
    assert summary[M.VOCAB_SIZE] == config["model"]["vocab_size"] == size == vocabulary(cfg.data).size
    assert not vocabulary(cfg.data).upper_bound


def test_pretokenized_and_pretrained_vocabularies(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    ids = tmp_path / "ids"
    ids.mkdir()
    np.arange(1000, dtype=np.uint16).tofile(ids / "train.bin")
    np.arange(500, dtype=np.uint16).tofile(ids / "val.bin")
    assert vocabulary(compose(["data=tokens", f"data.path={ids}", "data.vocab_size=1234"]).data).size == 1234
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"], show_progress=False)
    tok.train_from_iterator(["to be or not to be, that is the question"] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = compose(["data.tokenizer=pretrained", f"data.tokenizer_path={tmp_path / 'tokenizer.json'}"])
    assert vocabulary(cfg.data).size == tok.get_vocab_size() < 300  # not data.vocab_size's 4096


def test_a_hand_given_vocab_size_is_refused(tmp_path, cache_dir):
    cfg = compose([*SMOKE, f"data.cache_dir={cache_dir}", "model.vocab_size=300"])
    with pytest.raises(ConfigError, match=r"^model\.vocab_size=300 is invalid: the data give 256 tokens"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_records_without_the_key_resume_and_a_finished_one_stays_unchanged(tmp_path, cache_dir):
    """A run recorded before model.vocab_size existed is the same config as today's (the key is derived), so
    starting it again changes nothing; the same config object (which now holds the key) is unchanged too."""
    from lm_ablate.checkpoint import config_differences

    cfg = compose([*SMOKE, f"data.cache_dir={cache_dir}"])
    run = tmp_path / "run"
    train(cfg, run)
    config_path = run / M.CONFIG_FILE
    old = OmegaConf.load(config_path)
    del old.model["vocab_size"]  # as written before the key existed
    OmegaConf.save(old, config_path)
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for again in (compose([*SMOKE, f"data.cache_dir={cache_dir}"]), cfg):
        assert train(again, run)[M.STATUS] == M.STATUS_COMPLETED
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files
    now = to_container(cfg)
    older = {**now, "model": {k: v for k, v in now["model"].items() if k != "vocab_size"}}
    assert config_differences(older, now) == [] == config_differences(now, older)
    other = {**now, "model": {**now["model"], "vocab_size": 300}}
    assert config_differences(now, other) == ["model.vocab_size"]
