"""Downstream tasks as data: a task set is one yaml in conf/eval/ listing tasks (``eval.tasks``), each a
``format`` (how one row of its data becomes an :class:`~lm_ablate.eval.scorer.Example`) and where its rows
come from.

Rows: ``path`` a local ``.jsonl`` (one JSON object a line) or ``.json`` (a list of objects) file is read
directly (errors name the line); any other ``path`` — a hub dataset (``allenai/ai2_arc``) or a local dataset
folder — is read with ``datasets.load_dataset(path, subset, split=split)``, cached under
``$LM_ABLATE_CACHE/datasets`` (``data.cache_dir``). Either way the rows have the hub dataset's own fields,
so a file saved from the hub (``Dataset.to_json``) is read exactly as the hub is. The embedded formats need
no path (lm_ablate/eval/embedded.py).

The formats, OLMES-style cloze formulations (Gu et al. 2024, "OLMES: A Standard for Language Model
Evaluations", §3 and appendix; the lm-evaluation-harness task of the same data for the fields). Every
continuation starts with a space; acc_norm divides by its characters (lm_ablate/eval/scorer.py):

    format      fields read                            context -> continuation (per choice)        OLMES norm.
    arc         question, choices.text/label,          "Question: {question}\\nAnswer:"             ARC-E char,
                answerKey                              -> " {choice}"                              ARC-C pmi
    openbookqa  question_stem, choices.text/label,     "Question: {question_stem}\\nAnswer:"        pmi
                answerKey                              -> " {choice}"
    csqa        question, choices.text/label,          "Question: {question}\\nAnswer:"             pmi
                answerKey                              -> " {choice}"
    piqa        goal, sol1, sol2, label (0/1)          "Question: {goal}\\nAnswer:" -> " {sol}"      char
    siqa        context, question, answerA/B/C,        "Question: {context} {question}\\nAnswer:"   char
                label ("1".."3")                       -> " {answer}"
    hellaswag   activity_label, ctx_a, ctx_b,          "{activity_label}: {ctx_a} {Ctx_b}"          char
                endings, label                         -> " {ending}"  (WikiHow's [title] and
                                                       [bracket] artifacts removed, as lm-eval)
    winogrande  sentence, option1, option2,            partial scoring: the sentence up to "_"     none
                answer ("1"/"2")                       with the option filled in -> the rest
                                                       (the same continuation for both choices)
    lambada     text                                   the text up to its last word -> " {word}"   (acc: greedy
                                                       (one choice: acc = last-word accuracy)       last word)
    mc          context, choices, gold (int)           {context} -> {choice} as given (generic)
    shakespeare_order, shakespeare_next_line           built from the bundled corpus (embedded.py)

"OLMES norm." is the normalisation OLMES recommends per task; every task here reports both acc (none) and
acc_norm (per character). OLMES's PMI (dividing by the unconditional likelihood of the answer) costs a second
pass per choice and is not computed; nor are OLMES's curated 5-shot prompts (zero-shot here: in-loop
evaluation of small models). Rows are taken in the data's order; ``eval.max_examples`` keeps the first N.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_ablate.errors import ConfigError, bad
from lm_ablate.eval.scorer import Example

Row = dict[str, Any]


class RowError(Exception):
    """A row that does not fit its format: the message says which field and why (the caller adds where)."""


def field_of(row: Row, name: str) -> Any:
    """``row[name]``, dotted names reach into nested objects (``choices.text``)."""
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            raise RowError(f"missing field {name!r}")
        value = value[part]
    return value


def gold_index(value: Any, n: int, field: str, labels: Sequence[Any] | None = None, offset: int = 0) -> int:
    """The gold choice from a label (``labels.index``) or an integer-like value minus ``offset``; in range."""
    if labels is not None:
        labels = [str(x).strip() for x in labels]
        if str(value).strip() not in labels:
            raise RowError(f"{field}={value!r} is not one of the labels {labels}")
        return labels.index(str(value).strip())
    try:
        index = int(value) - offset
    except (TypeError, ValueError):
        raise RowError(f"{field}={value!r} is not an integer") from None
    if not 0 <= index < n:
        raise RowError(f"gold index {field}={value!r} is out of range for {n} choices")
    return index


def choices_list(row: Row, name: str) -> list[str]:
    value = field_of(row, name)
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(v, str) for v in value):
        raise RowError(f"field {name!r} must be a list of at least two strings")
    return value


def question(prompt: str, choices: Sequence[str], gold: int) -> Example:
    """One context shared by every choice, each continuation " {choice}"."""
    return Example((prompt,) * len(choices), tuple(f" {c}" for c in choices), gold)


def labelled(question_field: str) -> Callable[[Row], Example]:
    """ARC, OpenBookQA, CommonsenseQA: choices.text / choices.label and the gold's label in answerKey."""

    def convert(row: Row) -> Example:
        texts = choices_list(row, "choices.text")
        labels = field_of(row, "choices.label")
        if not isinstance(labels, list) or len(labels) != len(texts):
            raise RowError("field 'choices.label' must list one label per choice")
        gold = gold_index(field_of(row, "answerKey"), len(texts), "answerKey", labels)
        return question(f"Question: {str(field_of(row, question_field)).strip()}\nAnswer:", texts, gold)

    return convert


def piqa(row: Row) -> Example:
    sols = [str(field_of(row, "sol1")), str(field_of(row, "sol2"))]
    return question(f"Question: {field_of(row, 'goal')}\nAnswer:", sols, gold_index(field_of(row, "label"), 2, "label"))


def siqa(row: Row) -> Example:
    answers = [str(field_of(row, f"answer{x}")) for x in "ABC"]
    prompt = f"Question: {field_of(row, 'context')} {field_of(row, 'question')}\nAnswer:"
    return question(prompt, answers, gold_index(field_of(row, "label"), 3, "label", offset=1))


def wikihow_clean(text: str) -> str:
    """HellaSwag's WikiHow artifacts: " [title]" becomes a sentence end, other [brackets] go, double spaces too."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(row: Row) -> Example:
    ctx_b = str(field_of(row, "ctx_b"))
    ctx = f"{field_of(row, 'ctx_a')} {ctx_b.capitalize()}"  # str.capitalize, as lm-eval and OLMES
    endings = [wikihow_clean(e) for e in choices_list(row, "endings")]
    gold = gold_index(field_of(row, "label"), len(endings), "label")
    return question(wikihow_clean(f"{field_of(row, 'activity_label')}: {ctx}"), endings, gold)


def winogrande(row: Row) -> Example:
    sentence = str(field_of(row, "sentence"))
    if sentence.count("_") != 1:
        raise RowError(f"field 'sentence' must hold one blank '_', holds {sentence.count('_')}")
    before, after = sentence.split("_")
    options = [str(field_of(row, "option1")), str(field_of(row, "option2"))]
    gold = gold_index(field_of(row, "answer"), 2, "answer", offset=1)
    rest = " " + after.strip()
    return Example(tuple(before + o for o in options), (rest, rest), gold)


def lambada(row: Row) -> Example:
    text = str(field_of(row, "text")).strip()
    head, _, word = text.rpartition(" ")
    if not head or not word:
        raise RowError("field 'text' needs a context and a last word")
    return Example((head,), (f" {word}",), 0)


def generic(row: Row) -> Example:
    contexts = field_of(row, "context")
    choices = choices_list(row, "choices")
    if not isinstance(contexts, str):
        raise RowError("field 'context' must be a string")
    gold = field_of(row, "gold")
    if not isinstance(gold, int) or isinstance(gold, bool):
        raise RowError(f"gold={gold!r} is not an integer")
    return Example((contexts,) * len(choices), tuple(choices), gold_index(gold, len(choices), "gold"))


# format -> row converter (rows from a file or a dataset)
FORMATS: dict[str, Callable[[Row], Example]] = {
    "arc": labelled("question"),
    "openbookqa": labelled("question_stem"),
    "csqa": labelled("question"),
    "piqa": piqa,
    "siqa": siqa,
    "hellaswag": hellaswag,
    "winogrande": winogrande,
    "lambada": lambada,
    "mc": generic,
}
EMBEDDED = ("shakespeare_order", "shakespeare_next_line")  # built, not read (embedded.py)


@dataclass(frozen=True)
class Task:
    name: str
    format: str
    examples: tuple[Example, ...]


def read_rows(path: Path, where: str) -> list[tuple[str, Row]]:
    """(location, row) of a local .jsonl / .json file, location = ``file:line`` (jsonl) or ``file[i]``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise bad(f"{where}.path", str(path), f"cannot read it ({e.strerror or e})") from None
    rows: list[tuple[str, Any]] = []
    try:
        if path.suffix == ".json":
            loaded = json.loads(text)
            if not isinstance(loaded, list):
                raise bad(f"{where}.path", str(path), "a .json task file holds a list of row objects")
            rows = [(f"{path}[{i}]", r) for i, r in enumerate(loaded)]
        else:
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    loc = f"{path}:{number}"
                    try:
                        rows.append((loc, json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise bad(f"{where}.path", str(path), f"line {number} is not JSON ({e.msg})") from None
    except json.JSONDecodeError as e:
        raise bad(f"{where}.path", str(path), f"not JSON ({e.msg})") from None
    for loc, row in rows:
        if not isinstance(row, dict):
            raise bad(f"{where}.path", str(path), f"{loc}: a row must be a JSON object")
    return rows


def hub_rows(spec: Any, where: str, cache_dir: str | None) -> list[tuple[str, Row]]:
    """Rows of a hub dataset (or a local dataset folder) through ``datasets.load_dataset``."""
    import datasets

    from lm_ablate.data.hub import HubUnreachable, load_from_hub

    if not spec.split:
        raise bad(f"{where}.split", spec.split, "a dataset needs the split to score (validation, test)")
    cache = str(Path(cache_dir) / "datasets") if cache_dir else None
    local = Path(spec.path).expanduser().exists()  # a dataset folder: no hub to ask
    try:
        load = datasets.load_dataset if local else load_from_hub  # hub: one request, not five retries
        data = load(spec.path, spec.subset, split=spec.split, cache_dir=cache)
    except HubUnreachable as e:
        why = f"{e}; offline, a local .jsonl or dataset folder with the hub's fields works"
        raise bad(f"{where}.path", spec.path, why) from None
    except Exception as e:  # unknown name, unknown split: datasets' own first line
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = lines[0] if lines else type(e).__name__
        raise bad(f"{where}.path", spec.path, f"datasets cannot load it [{why}]") from None
    return [(f"{spec.path}[{spec.split}][{i}]", dict(row)) for i, row in enumerate(data)]


def load_task(spec: Any, index: int, max_examples: int | None = None, cache_dir: str | None = None) -> Task:
    """Task ``spec`` (an ``eval.tasks`` entry, position ``index``) with its examples (the first
    ``max_examples``). Bad input — an unknown format, an unreadable file, a row with a missing field or a gold
    index out of range — is one ConfigError line naming the key, the file and line, and the field."""
    where = f"eval.tasks.{index}"
    if not spec.name or not re.fullmatch(r"[A-Za-z0-9_.-]+", str(spec.name)):
        raise bad(f"{where}.name", spec.name, "letters, digits, '_', '-', '.' (it names downstream/<name>/...)")
    if spec.format in EMBEDDED:
        if spec.path is not None:
            raise bad(f"{where}.path", spec.path, f"format {spec.format} is built from the bundled corpus: no path")
        from lm_ablate.eval.embedded import build

        examples = build(spec.format, max_examples)
        return Task(spec.name, spec.format, tuple(examples))
    if spec.format not in FORMATS:
        raise bad(f"{where}.format", spec.format, "allowed: " + ", ".join([*FORMATS, *EMBEDDED]))
    if not spec.path:
        raise bad(f"{where}.path", spec.path, f"format {spec.format} reads rows: a hub dataset, a folder or a .jsonl")
    path = Path(spec.path).expanduser()
    if path.suffix in (".jsonl", ".json"):
        rows = read_rows(path, where)
    else:
        rows = hub_rows(spec, where, cache_dir)
    if not rows:
        raise bad(f"{where}.path", spec.path, "holds no rows")
    convert = FORMATS[spec.format]
    examples = []
    for loc, row in rows[:max_examples] if max_examples else rows:
        try:
            examples.append(convert(row))
        except RowError as e:
            raise ConfigError(f"{where}.path={spec.path!r} is invalid: {loc}: {e} (format {spec.format})") from None
    return Task(spec.name, spec.format, tuple(examples))


def load_tasks(eval_cfg: Any, cache_dir: str | None = None) -> list[Task]:
    """Every task of ``eval_cfg`` (the ``eval`` node), names unique."""
    if eval_cfg.max_examples is not None and eval_cfg.max_examples < 1:
        raise bad("eval.max_examples", eval_cfg.max_examples, "a positive number of examples per task, or null")
    names = [t.name for t in eval_cfg.tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise bad("eval.tasks", names, f"task names must be unique ({', '.join(twice)} twice)")
    return [load_task(t, i, eval_cfg.max_examples, cache_dir) for i, t in enumerate(eval_cfg.tasks)]
