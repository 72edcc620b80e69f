"""Export (lm_ablate/export.py, lm_ablate/hf/export.py): for every supported family, a run of its arch preset
(tiny, random weights, norm gains included) is written as a transformers folder whose
``AutoModelForCausalLM.from_pretrained`` logits equal the run's (fp32, < 1e-5), and importing that folder back
with ``from_hf`` gives the same logits and the same computation; configs no family computes are refused in one
line naming the keys; nothing is left behind by a refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lm_ablate import checkpoint as ckpt
from lm_ablate.config import ConfigError, compose, to_container
from lm_ablate.export import export
from lm_ablate.hf import from_hf
from lm_ablate.hf.export import FAMILIES, computation, differences, fixed_batch
from lm_ablate.model import TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
VOCAB = 256  # the bundled corpus, byte-level: the runs below record it as model.vocab_size

# arch preset (or plain overrides) -> the family it must export as
CASES = {
    "arch=llama": "llama",
    "arch=mistral attention.window=8": "mistral",
    "arch=qwen3": "qwen3",
    "arch=gemma2 attention.window=8": "gemma2",
    "arch=olmo2": "olmo2",
    "arch=gpt2": "gpt2",
    "arch=gptj": "gptj",
    "arch=neox": "gpt_neox",
    "arch=neox model.block=serial": "gpt_neox",
    "arch=opt_postln": "opt",
    "arch=opt_postln norm.placement=pre": "opt",
    "arch=bloom": "bloom",
    "seed=0": "gpt2",  # the default arm: GPT-2 untied, its biases zero
    "norm.placement=post": "opt",  # the default study's post-LN arm
}


def make_run(tmp_path: Path, overrides: str, step: int = 7) -> tuple[Path, TransformerLM]:
    """A run directory as the loop leaves it (config + checkpoint), with random weights."""
    cfg = compose(["model=tiny", "model.context=40", "model.n_layers=3", *overrides.split()])
    cfg.model.vocab_size = VOCAB
    torch.manual_seed(0)
    model = TransformerLM(cfg, VOCAB)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name and not name.endswith("bias"):
                p.uniform_(0.5, 1.5)  # norm gains away from their init: a misplaced norm cannot hide
            else:
                p.normal_(0.0, 0.1)
    run = tmp_path / "run"
    ckpt.save(run, step, {"config": to_container(cfg), "model": model.state_dict()}, keep=2)
    return run, model.eval()


def logits(model, batch):
    with torch.no_grad():
        out = model(batch)
    return (out.logits if hasattr(out, "logits") else out).float()


def test_every_family_has_a_case():
    assert sorted(set(CASES.values())) == sorted(FAMILIES)


@pytest.mark.parametrize("overrides", sorted(CASES))
def test_export_loads_with_from_pretrained_and_imports_back(tmp_path, overrides):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, ours = make_run(tmp_path, overrides)
    out = tmp_path / "hf"
    record = export(run, out)
    assert record["model_type"] == CASES[overrides] and record["step"] == 7
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    assert hf.config.model_type == CASES[overrides]
    batch = fixed_batch(VOCAB, 40)
    assert (logits(hf, batch) - logits(ours, batch)).abs().max() < 1e-5
    back, cfg = from_hf(hf)  # the round trip: the import computes the run's function again
    assert (logits(back, batch) - logits(ours, batch)).abs().max() < 1e-5
    assert differences(computation(compose(["model=tiny", "model.context=40", "model.n_layers=3",
                                            *overrides.split()])), computation(cfg)) in ([], ["model.context"])  # fmt: skip
    tok = AutoTokenizer.from_pretrained(out)  # byte-level runs get a tokenizer whose ids are the UTF-8 bytes
    assert tok("héllo", add_special_tokens=False)["input_ids"] == list("héllo".encode())


def test_the_exported_tokenizer_knows_the_context_and_a_byte_export_has_bos_and_eos(tmp_path):
    """model_max_length is model.context (it was 1e30); a byte export's BOS and EOS are the newline byte that
    begins every document of a byte-level run (lm-eval's hf model needs them); special-token text stays text."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    run, _ = make_run(tmp_path, "seed=0")
    export(run, tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.model_max_length == 40
    assert tok("x" * 100, truncation=True)["input_ids"] == [ord("x")] * 40
    assert tok.bos_token_id == tok.eos_token_id == 10 == tok.convert_tokens_to_ids(tok.eos_token)
    assert tok.decode([tok.eos_token_id]) == "\n"
    text = "<|endoftext|> \u010a\n"  # a literal EOS name and the newline byte's symbol Ċ: their UTF-8 bytes
    assert tok(text, add_special_tokens=False)["input_ids"] == list(text.encode())
    config = AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.bos_token_id == 10 and config.eos_token_id is None  # generate() runs to max_new_tokens
    assert GenerationConfig.from_pretrained(tmp_path / "hf").eos_token_id is None


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        ("norm.placement=deepnorm", "norm.placement='deepnorm' is invalid: no supported Hugging Face family computes"),
        ("norm=rmsnorm", "norm.name='rmsnorm' is invalid: no supported Hugging Face family computes"),
        ("position=t5", "position.name='t5' is invalid: no supported Hugging Face family"),
        ("arch=palm", "activation.name='swiglu' is invalid: no supported Hugging Face family"),
        ("model.parametrization=mup model.mup_base_width=16", "model.parametrization='mup' is invalid: no supported"),
    ],
)
def test_a_config_no_family_computes_is_refused_in_one_line_and_nothing_is_written(tmp_path, overrides, line):
    run, _ = make_run(tmp_path, overrides)
    with pytest.raises(ConfigError) as err:
        export(run, tmp_path / "hf")
    assert str(err.value).startswith(line) and "\n" not in str(err.value), str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no folder, no temporary one


def test_bad_arguments_are_one_line_each(tmp_path):
    run, _ = make_run(tmp_path, "seed=0")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    cases = {
        (str(run), str(tmp_path / "full"), None): "--out=",
        (str(tmp_path / "nothing"), str(tmp_path / "hf"), None): "RUN_DIR=",
        (str(run), str(tmp_path / "hf"), 3): "--step=3 is invalid: the run kept checkpoints at steps 7",
        (str(run), str(tmp_path / "no" / "such" / "hf"), None): "--out=",
    }
    for (r, o, step), start in cases.items():
        with pytest.raises(ConfigError) as err:
            export(r, o, step)
        assert str(err.value).startswith(start) and "\n" not in str(err.value), str(err.value)
    assert (tmp_path / "full" / "x").read_text() == "mine" and not (tmp_path / "hf").exists()
    (tmp_path / "empty").mkdir()
    assert export(run, tmp_path / "empty")["model_type"] == "gpt2"  # an empty folder is fine


def test_without_transformers_export_is_one_line(tmp_path, monkeypatch):
    run, _ = make_run(tmp_path, "seed=0")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match=r'^transformers is not installed: .*pip install -e "\.\[eval\]"$'):
        export(run, tmp_path / "hf")


def test_the_command_says_one_line(tmp_path):
    run, _ = make_run(tmp_path, "norm.placement=deepnorm")
    done = subprocess.run([sys.executable, "-m", "lm_ablate.export", str(run), "--out", str(tmp_path / "hf")],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr.startswith("lm-ablate: error: norm.placement='deepnorm' is invalid")
        and done.stderr.count("\n") == 1
    )
