"""lm-evaluation-harness on a run (lm_ablate/evaluate.py): a task defined in a local YAML over a local JSONL file
(lm-eval's ``dataset_path: json`` + ``data_files``), offline, scored by lm-eval through ``AblateLM`` and
checked against log-likelihoods computed here by brute force; the rolling and generation requests; bad
input in one line."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lm_ablate import checkpoint as ckpt
from lm_ablate import metrics as M
from lm_ablate.config import ConfigError, compose, to_container
from lm_ablate.data.tokenizers import ByteTokenizer
from lm_ablate.model import TransformerLM

pytest.importorskip("lm_eval")  # the eval extra (CI installs it); without it: the one-line refusal below
pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]

ROWS = [
    {"context": "The king", "choices": ["is dead", "dead is the", "of"], "gold": 0},
    {"context": "To be, or not to", "choices": ["be", "me", "the"], "gold": 0},
    {"context": "Good", "choices": ["morrow", "xqz"], "gold": 1},
    {"context": "Enter", "choices": ["HAMLET", "a", "the ghost", "Q"], "gold": 2},
]
DOCS_DATA = "/data/tiny.jsonl"  # the data file the YAML of docs/evaluation.md names; the tests write their own


def docs_task_yaml() -> str:
    """The lm-eval task YAML that docs/evaluation.md shows (the tests run exactly what the page says)."""
    page = (ROOT / "docs" / "evaluation.md").read_text()
    found = re.search(r"```yaml\n(task: tiny_mc\n.*?)```", page, re.S)
    assert found and DOCS_DATA in found.group(1), "docs/evaluation.md lost its tiny_mc task YAML"
    return found.group(1)


def make_run(tmp_path: Path) -> tuple[Path, TransformerLM]:
    cfg = compose(["model=tiny", "model.context=32"])
    cfg.model.vocab_size = 256
    torch.manual_seed(0)
    model = TransformerLM(cfg, 256)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    run = tmp_path / "run"
    ckpt.save(run, 5, {"config": to_container(cfg), "model": model.state_dict()}, keep=1)
    return run, model.eval()


def brute_ll(model: nn.Module, context: str, continuation: str) -> float:
    ids = list((context + continuation).encode())
    n = len(continuation.encode())
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).double(), -1)[0]
    return sum(float(logp[k - 1, ids[k]]) for k in range(len(ids) - n, len(ids)))


def task_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "tasks"
    folder.mkdir()
    data = folder / "tiny.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (folder / "tiny_mc.yaml").write_text(docs_task_yaml().replace(DOCS_DATA, str(data)))
    return folder


@pytest.mark.slow
def test_a_local_yaml_task_scores_what_the_brute_force_scores(tmp_path):
    from lm_ablate.evaluate import evaluate

    run, model = make_run(tmp_path)
    folder = task_folder(tmp_path)
    with pytest.raises(ConfigError, match=r"^--tasks='no_such_task' is invalid: lm-eval knows no task 'no_such_task'"):
        evaluate(run, ["no_such_task"], include=[str(folder)])
    assert not (run / M.LM_EVAL_FILE).exists()
    record = evaluate(run, ["tiny_mc"], include=[str(folder)])
    acc, acc_norm = [], []
    for row in ROWS:  # lm-eval: continuation " " + choice; acc_norm divides by len(choice)
        ll = [brute_ll(model, row["context"], " " + c) for c in row["choices"]]
        norm = [x / len(c) for x, c in zip(ll, row["choices"])]
        acc.append(max(range(len(ll)), key=ll.__getitem__) == row["gold"])
        acc_norm.append(max(range(len(ll)), key=norm.__getitem__) == row["gold"])
    assert record["tasks"]["tiny_mc"]["acc"] == pytest.approx(sum(acc) / len(acc))
    assert record["tasks"]["tiny_mc"]["acc_norm"] == pytest.approx(sum(acc_norm) / len(acc_norm))
    on_disk = json.loads((run / M.LM_EVAL_FILE).read_text())
    assert on_disk["step"] == 5 and on_disk["tasks"] == record["tasks"] and "tiny_mc" in on_disk["results"]
    assert record["evaluated"] == ["tiny_mc"] and "evaluated" not in on_disk  # this call's tasks, lm-eval's names


def test_the_docs_task_yaml_loads_in_lm_eval_without_warnings(tmp_path):
    """No "aggregation is not" / "higher_is_better is not" defined warnings (four, before the keys were there)."""
    from lm_eval.tasks import TaskManager, get_task_dict

    heard: list[str] = []

    class Ear(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            heard.append(record.getMessage())

    ear = Ear(level=logging.WARNING)
    logger = logging.getLogger("lm_eval")
    logger.addHandler(ear)
    try:
        tasks = get_task_dict(
            ["tiny_mc"], TaskManager(include_path=[str(task_folder(tmp_path))], include_defaults=False)
        )
    finally:
        logger.removeHandler(ear)
    task = tasks["tiny_mc"]
    assert task.aggregation().keys() == task.higher_is_better().keys() == {"acc", "acc_norm"}
    assert all(task.higher_is_better().values()) and len(list(task.test_docs())) == len(ROWS)
    assert not [m for m in heard if "aggregation" in m or "higher_is_better" in m], heard


def test_rolling_and_generation_requests():
    from lm_ablate.evaluate import make_lm

    torch.manual_seed(0)
    model = TransformerLM(compose(["model=tiny", "model.context=32"]), 256).eval()
    lm = make_lm(model, ByteTokenizer(), 32)

    class Request:
        def __init__(self, *args):
            self.args = args

    text = "Once more unto the breach"  # shorter than the context: log p(text | "\n")
    (rolled,) = lm.loglikelihood_rolling([Request(text)])
    assert rolled == pytest.approx(brute_ll(model, "\n", text), abs=1e-4)
    ((ll, _),) = lm.loglikelihood([Request("Once more", " unto")])
    assert ll == pytest.approx(brute_ll(model, "Once more", " unto"), abs=1e-5)

    class Next(nn.Module):  # greedy decoding writes the byte after the last one: "a" -> "bcd..."
        def forward(self, x):
            return nn.functional.one_hot((x + 1) % 256, 256).float()

    gen = make_lm(Next(), ByteTokenizer(), 32)
    assert gen.generate_until([Request("xa", {"until": ["e"], "max_gen_toks": 10})]) == ["bcd"]
    assert gen.generate_until([Request("xa", {"until": [], "max_gen_toks": 3})]) == ["bcd"]


def test_without_lm_eval_the_command_is_one_line(tmp_path, monkeypatch):
    from lm_ablate.evaluate import evaluate

    run, _ = make_run(tmp_path)
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ConfigError, match=r'^lm-eval is not installed: .*pip install -e "\.\[eval\]"$'):
        evaluate(run, ["hellaswag"])
    done = subprocess.run([sys.executable, "-m", "lm_ablate.evaluate", str(tmp_path / "none"), "--tasks", "x"],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert (
        done.returncode == 2
        and done.stderr == f"lm-ablate: error: RUN_DIR={str(tmp_path / 'none')!r} is invalid: no such run directory\n"
    )


def test_the_command_prints_each_task_of_this_call_once(tmp_path, monkeypatch, capsys):
    """A task whose name prefixes another's (tiny_mc, tiny_mc2) is printed once, and names the file holds from an
    earlier call (tiny_mc_old) are not printed: what lm-eval scored in this call, in its order."""
    import lm_ablate.evaluate as E

    record = {
        "tasks": {"tiny_mc": {"acc": 0.5}, "tiny_mc2": {"acc": 0.25}, "tiny_mc_old": {"acc": 1.0}},
        "evaluated": ["tiny_mc", "tiny_mc2"],
    }
    monkeypatch.setattr(E, "evaluate", lambda *args: record)
    E.main([str(tmp_path), "--tasks", "tiny_mc,tiny_mc2"])
    assert capsys.readouterr().out.splitlines() == [
        "tiny_mc: acc=0.5000",
        "tiny_mc2: acc=0.2500",
        f"-> {tmp_path / M.LM_EVAL_FILE}",
    ]
