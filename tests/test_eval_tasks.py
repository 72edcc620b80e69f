"""Downstream tasks as data (lm_ablate/eval/tasks.py): each hub format read from local rows with the hub
dataset's own fields, through both readers (a .jsonl file, and a dataset folder read by
``datasets.load_dataset`` exactly as a hub name is); the OLMES-style strings written out; the task sets of
conf/eval/ compose; bad input is one line naming the key, the file and line, and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lm_ablate.config import CONF_DIR, ConfigError, compose
from lm_ablate.eval.scorer import Example
from lm_ablate.eval.tasks import FORMATS, load_task, load_tasks
from lm_ablate.schema import EvalTaskConfig

# format -> (a row with the hub dataset's fields, the example it must become)
ROWS = {
    "arc": (
        {"id": "q1", "question": "Which is a gas?", "answerKey": "B",
         "choices": {"text": ["rock", "steam", "ice"], "label": ["A", "B", "C"]}},
        Example(("Question: Which is a gas?\nAnswer:",) * 3, (" rock", " steam", " ice"), 1),
    ),
    "openbookqa": (
        {"id": "7", "question_stem": "The sun is", "answerKey": "D",
         "choices": {"text": ["cold", "small", "wet", "hot"], "label": ["A", "B", "C", "D"]}},
        Example(("Question: The sun is\nAnswer:",) * 4, (" cold", " small", " wet", " hot"), 3),
    ),
    "csqa": (
        {"id": "x", "question": "Where do fish live?", "question_concept": "fish", "answerKey": "A",
         "choices": {"label": ["A", "B"], "text": ["water", "desert"]}},
        Example(("Question: Where do fish live?\nAnswer:",) * 2, (" water", " desert"), 0),
    ),
    "piqa": (
        {"goal": "Dry wet hands", "sol1": "use a towel", "sol2": "use water", "label": 0},
        Example(("Question: Dry wet hands\nAnswer:",) * 2, (" use a towel", " use water"), 0),
    ),
    "siqa": (
        {"context": "Kai lent Ash a pen.", "question": "How does Ash feel?", "answerA": "grateful",
         "answerB": "angry", "answerC": "bored", "label": "1"},
        Example(("Question: Kai lent Ash a pen. How does Ash feel?\nAnswer:",) * 3,
                (" grateful", " angry", " bored"), 0),
    ),
    "hellaswag": (
        {"ind": 4, "activity_label": "Baking", "ctx_a": "A man mixes flour.", "ctx_b": "then he",
         "ctx": "A man mixes flour. then he", "label": "2",
         "endings": ["sings [title] loudly.", "runs.", "bakes bread.", "sleeps."]},
        Example(("Baking: A man mixes flour. Then he",) * 4,
                (" sings. loudly.", " runs.", " bakes bread.", " sleeps."), 2),
    ),
    "winogrande": (
        {"sentence": "Ann gave Bea a gift because _ was kind.", "option1": "Ann", "option2": "Bea", "answer": "1"},
        Example(("Ann gave Bea a gift because Ann", "Ann gave Bea a gift because Bea"),
                (" was kind.", " was kind."), 0),
    ),
    "lambada": (
        {"text": "He opened the door and saw his old friend Tom"},
        Example(("He opened the door and saw his old friend",), (" Tom",), 0),
    ),
    "mc": (
        {"context": "2 + 2 =", "choices": [" 4", " 5"], "gold": 0},
        Example(("2 + 2 =",) * 2, (" 4", " 5"), 0),
    ),
}  # fmt: skip


def spec(**kw) -> EvalTaskConfig:
    return OmegaConf.structured(EvalTaskConfig(**kw))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_format_has_a_case_here():
    assert sorted(ROWS) == sorted(FORMATS)


@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_a_hub_row_becomes_the_olmes_style_example_from_a_jsonl_file(tmp_path, fmt):
    row, expected = ROWS[fmt]
    path = write_jsonl(tmp_path / f"{fmt}.jsonl", [row, row])
    task = load_task(spec(name=fmt, format=fmt, path=str(path)), 0)
    assert task.examples == (expected, expected)


def test_a_dataset_folder_is_read_by_datasets_as_a_hub_name_is(tmp_path):
    folder = tmp_path / "arc_local"
    folder.mkdir()
    row, expected = ROWS["arc"]
    write_jsonl(folder / "test.jsonl", [row] * 3)
    task = load_task(spec(name="arc", format="arc", path=str(folder), split="test"), 0, 2, str(tmp_path / "cache"))
    assert task.examples == (expected, expected)  # eval.max_examples: the first N
    assert (tmp_path / "cache" / "datasets").is_dir()  # cached under data.cache_dir/datasets


def test_a_hub_name_that_cannot_be_reached_is_one_line(tmp_path):
    # tests run with HF_DATASETS_OFFLINE=1 (conftest): what a user without a network sees
    with pytest.raises(ConfigError) as err:
        load_task(spec(name="arc", format="arc", path="allenai/ai2_arc", subset="ARC-Easy", split="test"), 0,
                  cache_dir=str(tmp_path))  # fmt: skip
    line = str(err.value)
    assert (
        line.startswith("eval.tasks.0.path='allenai/ai2_arc' is invalid: the Hugging Face hub cannot be reached ")
        and "not in the cache" in line
        and "\n" not in line
    )


@pytest.mark.parametrize(
    ("fmt", "row", "expected"),
    [
        ("arc", {"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}}, "missing field 'answerKey'"),
        ("arc", {"question": "q", "answerKey": "C", "choices": {"text": ["a", "b"], "label": ["A", "B"]}},
         "answerKey='C' is not one of the labels ['A', 'B']"),
        ("piqa", {"goal": "g", "sol1": "a", "sol2": "b", "label": 2}, "gold index label=2 is out of range for 2 choices"),
        ("mc", {"context": "c", "choices": ["a", "b"], "gold": -1}, "gold index gold=-1 is out of range for 2 choices"),
        ("siqa", {"context": "c", "question": "q", "answerA": "a", "answerB": "b", "label": "1"},
         "missing field 'answerC'"),
        ("winogrande", {"sentence": "no blank", "option1": "a", "option2": "b", "answer": "1"},
         "field 'sentence' must hold one blank '_', holds 0"),
    ],
)  # fmt: skip
def test_a_bad_row_is_one_line_naming_file_line_and_field(tmp_path, fmt, row, expected):
    good = ROWS[fmt][0]
    path = write_jsonl(tmp_path / "t.jsonl", [good, row])
    with pytest.raises(ConfigError) as err:
        load_task(spec(name="t", format=fmt, path=str(path)), 2)
    assert str(err.value) == f"eval.tasks.2.path={str(path)!r} is invalid: {path}:2: {expected} (format {fmt})"


def test_bad_task_specs_are_one_line_each(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [ROWS["mc"][0]])
    cases = {
        spec(name="t", format="nope", path=str(path)): "eval.tasks.0.format='nope' is invalid: allowed: arc, ",
        spec(name="t", format="mc"): "eval.tasks.0.path=None is invalid: format mc reads rows",
        spec(name="t", format="mc", path=str(tmp_path / "missing.jsonl")): "eval.tasks.0.path=",
        spec(name="a b", format="mc", path=str(path)): "eval.tasks.0.name='a b' is invalid: letters, digits",
        spec(name="t", format="shakespeare_order", path=str(path)): "eval.tasks.0.path=",
        spec(name="t", format="mc", path=str(write_jsonl(tmp_path / "e.jsonl", []))): "eval.tasks.0.path=",
    }
    for task, start in cases.items():
        with pytest.raises(ConfigError) as err:
            load_task(task, 0)
        assert str(err.value).startswith(start) and "\n" not in str(err.value), str(err.value)
    (tmp_path / "broken.jsonl").write_text('{"context": "c"\n')
    with pytest.raises(ConfigError, match=r"line 1 is not JSON"):
        load_task(spec(name="t", format="mc", path=str(tmp_path / "broken.jsonl")), 0)


def test_task_sets_compose_and_their_names_are_unique():
    for f in sorted((CONF_DIR / "eval").glob("*.yaml")):
        cfg = compose([f"eval={f.stem}"])
        assert cfg.eval.name == f.stem
        names = [t.name for t in cfg.eval.tasks]
        assert len(names) == len(set(names))
        assert all(t.format in FORMATS or t.format.startswith("shakespeare_") for t in cfg.eval.tasks)
    assert compose([]).eval.name == "none" and not compose([]).eval.tasks  # the default: no downstream tasks
    olmes = {t.name for t in compose(["eval=olmes"]).eval.tasks}
    assert olmes == {"arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "openbookqa", "csqa", "siqa",
                     "lambada"}  # fmt: skip
    twice = compose(["eval=shakespeare"]).eval
    twice.tasks[1].name = twice.tasks[0].name
    with pytest.raises(ConfigError, match=r"^eval.tasks=\[.*\] is invalid: task names must be unique"):
        load_tasks(twice)
