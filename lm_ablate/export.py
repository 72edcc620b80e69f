"""``python -m lm_ablate.export RUN_DIR --out HF_DIR [--step N]``: a run's checkpoint as a Hugging Face
transformers folder (config.json, model.safetensors, the tokenizer), loadable with
``AutoModelForCausalLM.from_pretrained(HF_DIR)`` and ``AutoTokenizer.from_pretrained(HF_DIR)``.

The family is the one that computes the run's config (lm_ablate/hf/export.py: every config one of the
supported families expresses; anything else is refused in one line naming the keys). Checks, in order, each
refusing in one line with nothing left behind: HF_DIR is new or an empty folder; the run has the checkpoint;
a family computes the config; the in-memory transformers model gives the run's logits on a fixed batch; the
folder is written under a temporary name beside HF_DIR, loaded back with ``from_pretrained`` (fp32, eager
attention) and its logits checked again, and its tokenizer must encode a sample text to the run's ids; only
then is it renamed to HF_DIR. A failed check deletes the temporary folder.

Tokenizer: the run's BPE or pretrained ``tokenizer.json`` (with its EOS as BOS and EOS); for byte-level runs a
byte-level ``tokenizer.json`` whose ids are the UTF-8 bytes (no merges), so the exported folder is complete
either way. What the tokenizer files say, for every run (``tokenizer_config.json``):

  * ``model_max_length`` = ``model.context``: the positions the model was trained on (lm-eval's hf model
    truncates to it; ``tokenizer(..., truncation=True)`` cuts there). ``model.generate`` is not bounded by it:
    keep prompt + ``max_new_tokens`` within the context (a learned position table has no row past it);
  * ``split_special_tokens``: special-token text in a document (a literal ``<|endoftext|>``) is encoded as
    text, as the run's own tokenizer does (lm_ablate/data/tokenizers.py), never as the special id;
  * BOS and EOS: the run's EOS (its document separator); a byte-level run has no special token, and its
    documents are joined by ``"\\n\\n"``, so every document starts right after the newline byte (id 10): that
    byte is its BOS and EOS (``Ċ`` in the byte-level alphabet), which lm-eval's hf model needs as the context
    of an empty-context request (its ``prefix_token_id``: the same id ``python -m lm_ablate.evaluate`` uses),
    as padding, and as the end of a generation. So lm-eval's generations from a byte export stop at a
    newline, and ``decode(ids, skip_special_tokens=True)`` drops newlines. The model's own config gets
    ``bos_token_id`` 10 and no ``eos_token_id`` (``model.generate`` runs to ``max_new_tokens``).

``data=tokens`` without ``data.tokenizer_path`` has no tokenizer to write: the folder holds the model only.
``lm_ablate_export.json`` records the run, step, family and the measured logit difference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from lm_ablate.errors import ConfigError, bad

EXPORT_RECORD = "lm_ablate_export.json"
# the check of a written tokenizer: newlines, non-ASCII, and special-token text (a literal <|endoftext|>, and Ċ:
# the byte-level symbol of the newline byte, a byte export's EOS) that must be encoded as text
SAMPLE_TEXT = "To be, or not to be: that is the question.\nÉtude — 1,234 résumés! <|endoftext|> Ċ\n\n"
NEWLINE = 10  # the byte that begins every document of a byte-level run (documents joined by "\n\n")


def check_out(out: Path) -> None:
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise bad("--out", str(out), "exists and is not an empty folder; allowed: a new path or an empty folder")
    if not out.parent.exists():
        raise bad("--out", str(out), f"its parent {str(out.parent)!r} does not exist")


def require_transformers() -> None:
    try:
        import safetensors  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError(
            'transformers is not installed: export writes a transformers folder; pip install -e ".[eval]"'
        ) from None


def byte_tokenizer() -> Any:
    """A ``tokenizers`` byte-level tokenizer whose ids are the UTF-8 bytes: the 256 byte symbols of GPT-2's
    byte-to-unicode table as the vocabulary, no merges, no regex split."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of bytes to printable characters (what ByteLevel pre-tokenizers emit)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def hf_tokenizer(cfg: Any) -> tuple[Any | None, Any]:
    """(transformers fast tokenizer or None, the run's own tokenizer), as the module docstring says."""
    from transformers import PreTrainedTokenizerFast

    from lm_ablate.data.pretokenized import IdsTokenizer
    from lm_ablate.data.tokenizers import ByteTokenizer
    from lm_ablate.eval.run import run_tokenizer

    ours = run_tokenizer(cfg)
    if isinstance(ours, IdsTokenizer):
        return None, ours
    common = {"model_max_length": int(cfg.model.context), "split_special_tokens": True}
    if isinstance(ours, ByteTokenizer):
        newline = _bytes_to_unicode()[NEWLINE]
        tok = PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(), eos_token=newline, bos_token=newline, **common)
        return tok, ours
    return PreTrainedTokenizerFast(tokenizer_object=ours.tok, eos_token=ours.eos, bos_token=ours.eos, **common), ours


def check_tokenizer(folder: Path, ours: Any) -> None:
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(folder))
    got = theirs(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    want = [int(i) for i in ours.encode(SAMPLE_TEXT)]
    if got != want:
        raise ConfigError(f"export: the written tokenizer encodes a sample differently from the run's ({got[:8]} "
                          f"vs {want[:8]})")  # fmt: skip


def export(run_dir: str | Path, out: str | Path, step: int | None = None) -> dict[str, Any]:
    """Write ``run_dir``'s checkpoint (``step``, else the newest) as a transformers folder at ``out``; returns
    the export record. Bad input or a failed check: one-line ConfigError, nothing written."""
    import torch

    from lm_ablate.data.tokenizers import ByteTokenizer
    from lm_ablate.eval.run import load_run
    from lm_ablate.hf.export import check_logits, to_hf

    out = Path(out).expanduser().absolute()
    check_out(out)
    require_transformers()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line of output, not transformers' bars
    hf_logging.set_verbosity_error()
    run = load_run(run_dir, step)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    hf_model, model_type = to_hf(run.model, run.cfg)
    tokenizer, ours = hf_tokenizer(run.cfg)
    eos = getattr(ours, "eos_id", None)
    hf_model.config.eos_token_id = eos
    hf_model.config.bos_token_id = NEWLINE if isinstance(ours, ByteTokenizer) else eos
    hf_model.generation_config.eos_token_id = eos
    hf_model.generation_config.bos_token_id = hf_model.config.bos_token_id
    tmp = out.parent / f".{out.name}.export-{os.getpid()}"
    try:
        hf_model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch.float32, attn_implementation="eager")
        diff = check_logits(run.model, loaded.eval(), run.cfg, f"export to {model_type} (loaded back)")
        if tokenizer is not None:
            check_tokenizer(tmp, ours)
        record = {
            "run_dir": str(Path(run_dir).expanduser().absolute()),
            "checkpoint": str(run.path),
            "step": run.step,
            "model_type": model_type,
            "tokenizer": None if tokenizer is None else type(ours).__name__,
            "max_logit_difference": diff,  # relative to the logits' scale, fixed batch, fp32
        }
        (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lm_ablate.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (config.yaml, checkpoints/)")
    parser.add_argument("--out", required=True, metavar="HF_DIR", help="the folder to write (new or empty)")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    args = parser.parse_args(argv)
    try:
        record = export(args.run_dir, args.out, args.step)
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"exported {args.run_dir} (step {record['step']}) as {record['model_type']} to {args.out}: logits within "
          f"{record['max_logit_difference']:.1e} of the run's")  # fmt: skip


if __name__ == "__main__":
    main()
