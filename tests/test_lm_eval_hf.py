"""lm-evaluation-harness's own ``hf`` model (``lm_eval --model hf``: HFLM, transformers' from_pretrained) on a
folder written by ``python -m lm_ablate.export`` of a tiny trained run, against the in-loop scorer
(lm_ablate/eval/scorer.py) on the run's checkpoint: the same items give the same log-likelihood per choice and the
same acc and acc_norm per item (lm-eval's ``log_samples``), for a byte-level run and a BPE run. The items are
embedded-task items whose contexts end in a newline, a blank line or indentation (what lm-eval's
``_encode_pair`` moves to the continuation) and OLMES-style question rows. A byte export runs in lm-eval without
extra arguments (BOS/EOS: the newline byte; issue 46 item 3), and its empty-context and rolling requests agree
with ``python -m lm_ablate.evaluate``'s ``AblateLM``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lm_ablate import checkpoint as ckpt
from lm_ablate.config import compose, to_container
from lm_ablate.eval import embedded
from lm_ablate.eval.scorer import Example, encode_example, loglikelihoods, score

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")  # lm-eval's hf model imports it (the [eval] extra installs it)
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]
CONTEXT = 64
STEPS = 40
TOKENIZERS = {
    "byte": [],
    "bpe": ["data.tokenizer=bpe", "data.vocab_size=400", "data.tokenizer_sample=300000"],
}
QUESTIONS = [  # OLMES-style rows: the continuation starts with a space (lm_ablate/eval/tasks.py)
    Example(("Question: Who is the Prince of Denmark?\nAnswer:",) * 3, (" Hamlet", " Othello", " a king"), 0),
    Example(("Question: What is the question?\nAnswer:",) * 2, (" to be, or not to be", " the sea"), 0),
    Example(("The sentence with Anne",) * 2, (" went home.", " home went."), 0),
]


def items() -> list[Example]:
    """Embedded items whose context ends in "\\n" (most), "\\n\\n", indentation or a space before the newline,
    the item that follows a line of spaces (it reaches back), and the question rows."""
    picked: dict[str, Example] = {}
    for kind in embedded.CONTEXT_BYTES:
        for ex in embedded.build(kind):
            context = ex.contexts[0]
            tail = context[len(context.rstrip()) :]
            picked.setdefault(f"{kind} {tail!r} {len(context) > embedded.CONTEXT_BYTES[kind]}", ex)
    return [*picked.values(), *QUESTIONS]


def trained_run(tmp_path: Path, cache_dir: str, tokenizer: str) -> Path:
    """A tiny GPT-2-style run trained here for STEPS AdamW steps on Hamlet, saved as the loop saves a run."""
    from lm_ablate.data import shakespeare_works
    from lm_ablate.eval.run import run_tokenizer
    from lm_ablate.model import TransformerLM

    cfg = compose(["model=tiny", f"model.context={CONTEXT}", f"data.cache_dir={cache_dir}", *TOKENIZERS[tokenizer]])
    tok = run_tokenizer(cfg)
    cfg.model.vocab_size = tok.vocab_size
    ids = torch.tensor(np.asarray(tok.encode(shakespeare_works()["hamlet"]), dtype=np.int64))
    torch.manual_seed(0)
    model = TransformerLM(cfg, tok.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(STEPS):
        starts = torch.randint(0, len(ids) - CONTEXT - 1, (16,))
        batch = torch.stack([ids[s : s + CONTEXT + 1] for s in starts.tolist()])
        loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    run = tmp_path / f"run_{tokenizer}"
    ckpt.save(run, STEPS, {"config": to_container(cfg), "model": model.state_dict()}, keep=1)
    return run


@pytest.fixture(scope="module")
def exported(tmp_path_factory, cache_dir):
    """tokenizer -> (run folder, its export), each trained and exported once per module."""
    from lm_ablate.export import export

    made: dict[str, tuple[Path, Path]] = {}

    def get(tokenizer: str) -> tuple[Path, Path]:
        if tokenizer not in made:
            tmp = tmp_path_factory.mktemp(tokenizer)
            run = trained_run(tmp, cache_dir, tokenizer)
            export(run, tmp / "hf")
            made[tokenizer] = run, tmp / "hf"
        return made[tokenizer]

    return get


def task_folder(tmp_path: Path, examples: list[Example]) -> Path:
    """A local lm-eval task over the examples: the context and the continuations exactly as the scorer gets
    them (``target_delimiter: ""``: lm-eval's request is (context, choice), and its acc_norm divides by
    len(choice), the scorer's characters)."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    rows = [{"context": ex.contexts[0], "choices": list(ex.continuations), "gold": ex.gold} for ex in examples]
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "items.yaml").write_text(
        "task: ablate_items\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\ntarget_delimiter: ''\n"
        "doc_to_text: context\ndoc_to_choice: choices\ndoc_to_target: gold\nmetric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return folder


@pytest.mark.parametrize("tokenizer", sorted(TOKENIZERS))
def test_lm_eval_hf_on_the_export_scores_what_the_in_loop_scorer_scores(tmp_path, exported, tokenizer):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_ablate.eval.run import load_run, run_tokenizer

    run, hf = exported(tokenizer)
    examples = items()
    assert any(ex.contexts[0].endswith("\n\n") for ex in examples)
    assert any(ex.contexts[0].endswith("\n  ") for ex in examples)
    results = simple_evaluate(
        model="hf",
        model_args={"pretrained": str(hf), "dtype": "float32"},  # nothing else: no prefix_token_id
        tasks=["ablate_items"],
        task_manager=TaskManager(include_path=[str(task_folder(tmp_path, examples))], include_defaults=False),
        device="cpu",
        batch_size=8,
        log_samples=True,
        bootstrap_iters=0,
    )
    samples = sorted(results["samples"]["ablate_items"], key=lambda s: s["doc_id"])
    assert len(samples) == len(examples)

    ours = load_run(run)
    tok = run_tokenizer(ours.cfg)
    for sample, ex in zip(samples, examples):
        enc = encode_example(tok.encode, ex, CONTEXT, "t", tok.decode)
        ll = [x for x, _ in loglikelihoods(ours.model, list(zip(enc.contexts, enc.continuations)))]
        theirs = [float(r[0][0]) for r in sample["resps"]]
        assert theirs == pytest.approx(ll, abs=2e-4), (ex, theirs, ll)
        got = score(ours.model, [enc])
        assert (sample["acc"], sample["acc_norm"]) == (got["acc"], got["acc_norm"]), ex
    means = results["results"]["ablate_items"]
    assert means["acc,none"] == pytest.approx(np.mean([s["acc"] for s in samples]))


def test_a_byte_export_runs_in_lm_eval_as_the_evaluate_command_does(exported):
    """BOS/EOS of a byte export: the newline byte, lm-eval's prefix for an empty context (the id
    ``lm_ablate.evaluate``'s AblateLM uses); empty-context, rolling and generation requests run."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from lm_ablate.data.tokenizers import ByteTokenizer
    from lm_ablate.eval.run import load_run
    from lm_ablate.evaluate import make_lm

    run, folder = exported("byte")
    hf = HFLM(pretrained=str(folder), dtype="float32", device="cpu", batch_size=4)
    assert hf.prefix_token_id == hf.eot_token_id == 10 and hf.max_length == CONTEXT
    ablate = make_lm(load_run(run).model, ByteTokenizer(), CONTEXT)

    def request(kind, *args):
        return Instance(request_type=kind, doc={}, arguments=args, idx=0)

    pairs = [request("loglikelihood", "", "Enter HAMLET"), request("loglikelihood", "", "\nEnter"),
             request("loglikelihood", "ROMEO:\n", "  But soft")]  # fmt: skip
    for (a, ga), (b, gb) in zip(hf.loglikelihood(pairs), ablate.loglikelihood(pairs)):
        assert a == pytest.approx(b, abs=2e-4) and ga == gb
    text = [request("loglikelihood_rolling", "To be, or not to be, that is the question:\n" * 4)]  # > 2 windows
    assert hf.loglikelihood_rolling(text) == pytest.approx(ablate.loglikelihood_rolling(text), abs=1e-3)
    (generated,) = hf.generate_until([request("generate_until", "HAMLET.\n", {"until": ["."], "max_gen_toks": 20})])
    (greedy,) = ablate.generate_until([request("generate_until", "HAMLET.\n", {"until": ["."], "max_gen_toks": 20})])
    assert generated == greedy.split("\n")[0]  # lm-eval also stops at the EOS, a newline
