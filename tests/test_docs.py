"""The documentation holds together: every relative link and image in README.md, docs/*.md and bench/README.md
resolves (a ``#anchor`` to a heading of its target, by GitHub's slug rule), and what the pages name exists —
``python -m`` modules, studies, config groups and options, config keys, launchers, repository paths, the
Hugging Face families. The README stays the short front door: the two quickstart commands and a map of docs/."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, ROOT / "bench" / "README.md", *sorted(DOCS.glob("*.md"))]
IDS = [str(p.relative_to(ROOT)) for p in PAGES]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
HTML_ANCHOR = re.compile(r"<a\b[^>]*?\b(?:id|name)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (whose brackets are not links)."""
    return CODE_SPAN.sub(" ", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): the rendered text, lower-cased, without anything that is
    not a letter, a digit, ``_``, ``-`` or a space, each space a ``-``. Code spans count as their text, links as
    their label; ``*`` emphasis goes with the punctuation (``_`` emphasis is not used in these pages)."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (a repeated one gets -1, -2, ...) and HTML ids."""
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    for _, heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    body = prose(text)
    return LINK.findall(body) + HTML_REF.findall(body)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """'target: why' for every relative link or image of ``page`` that does not resolve inside ``root``."""
    problems = []
    for target in links(page.read_text()):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # http(s), mailto: not this test's business
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(root):
            problems.append(f"{target}: outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor:
            if dest.suffix != ".md" or dest.is_dir():
                problems.append(f"{target}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(dest.read_text()):
                problems.append(f"{target}: {dest.relative_to(root)} has no heading with that anchor")
    return problems


# --- the link checker itself --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Weights & Biases", "weights--biases"),
        ("Model ladders: does an effect survive scale?", "model-ladders-does-an-effect-survive-scale"),
        ("GPU: `gpu.py` (and `scripts/gpu_check.sh`)", "gpu-gpupy-and-scriptsgpu_checksh"),
        ("4. `components.py`", "4-componentspy"),
        ("μP", "μp"),
        ("Results, round 2 (after the changes of 2026-11-29, second session)",
         "results-round-2-after-the-changes-of-2026-11-29-second-session"),
        ("Set-up **and** [tests](x.md)", "set-up-and-tests"),
    ],
)  # fmt: skip
def test_slug_follows_githubs_rule(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_link_checker_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text("# lm-ablate\n\n## Quickstart\n")
    (tmp_path / "results" / "README.md").write_text("# Results\n")
    (tmp_path.parent / "outside.md").write_text("# Outside\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Title\n\n## Same\n\n## Same\n\n[ok](#same-1) [ok](../README.md#quickstart) ![ok](../results/README.md)\n"
        "[bad](#same-2) [bad](nowhere.md) [bad](../README.md#no-such-heading) ![bad](missing.png)\n"
        "`[code](not-a-link.md)` [web](https://example.com/x.md) [bad](../../outside.md)\n\n"
        "```\n[fenced](not-a-link.md)\n```\n"
    )
    found = [f.split(":")[0] for f in broken_links(page, root=tmp_path)]
    assert found == ["#same-2", "nowhere.md", "../README.md#no-such-heading", "missing.png", "../../outside.md"]


# --- links -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_readme_maps_every_docs_page() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README.read_text())}
    assert [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked] == []


# --- what the pages name exists ----------------------------------------------------------------------------

# `python -m X`, `torchrun --opt=v -m X`; the module may start the next line of a wrapped paragraph
MODULE = re.compile(r"\b(?:python3?|torchrun(?:[ \t]+--?[\w-]+(?:=\S+)?)*)[ \t]+-m\s+([A-Za-z_][\w.]*)")
STUDY = re.compile(r"-m lm_ablate\.study[ \t]+([a-z][a-z0-9_]*)(?![\w.=])")
LAUNCHER = re.compile(r"--launcher[ \t]+([a-z]\w*)")
PATH = re.compile(r"(?<![\w./<-])((?:conf|sweeps|bench|scripts|lm_ablate|analysis|tests|results|docs|\.ci)/[\w./-]*)")
GROUP_DIRS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "hydra")
# group=option[,option...] (a multirun list ends where a `key=` begins: norm=rmsnorm,norm.placement=post)
OPTION = re.compile(rf"(?<![\w./-])[+~]?({'|'.join(GROUP_DIRS)}|hydra/launcher)=([\w.-]+(?:,[\w.-]+)*)(?![\w.=-])")
# a config key such as train.spike.window (not a glob like regularization.decay_*)
KEY = re.compile(
    r"(?<![\w./-])((?:model|norm|position|activation|attention|regularization|data|optim|tracking|train"
    r"|ladder)(?:\.[a-z_][a-z0-9_]*)+)(?![\w*])"
)
FILE_SUFFIXES = {"py", "yaml", "md", "txt", "json", "jsonl", "csv", "parquet", "pt", "npy", "bin", "html", "png"}


def mentions(pattern: re.Pattern[str]) -> Iterator[tuple[str, str]]:
    for page in PAGES:
        for match in pattern.finditer(page.read_text()):
            yield str(page.relative_to(ROOT)), match.group(1)


def test_named_modules_exist() -> None:
    def missing(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ModuleNotFoundError:
            return True

    assert sorted({(page, m) for page, m in mentions(MODULE) if missing(m)}) == []


def test_named_studies_and_launchers_exist() -> None:
    from lm_ablate.study import LAUNCHERS, studies

    assert sorted({(p, s) for p, s in mentions(STUDY) if s not in studies()}) == []
    assert sorted({(p, x) for p, x in mentions(LAUNCHER) if x not in LAUNCHERS}) == []


def test_named_paths_exist() -> None:
    bad = set()
    for page, path in mentions(PATH):
        path = path.rstrip(".,;:")
        if not (ROOT / path).exists():
            bad.add((page, path))
    assert sorted(bad) == []


def test_named_config_options_exist() -> None:
    launchers = {p.stem for p in (ROOT / "conf" / "hydra" / "launcher").glob("*.yaml")} | {"basic"}
    if importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None:
        launchers.add("joblib")
    bad = set()
    for page, text in ((str(p.relative_to(ROOT)), p.read_text()) for p in PAGES):
        for group, values in OPTION.findall(text):
            for value in values.rstrip(".").split(","):
                if not value.strip("."):
                    continue  # `model=...`: a placeholder
                known = (
                    value in launchers
                    if group == "hydra/launcher"
                    else (ROOT / "conf" / group / f"{value}.yaml").exists()
                )
                if not known:
                    bad.add((page, f"{group}={value}"))
    assert sorted(bad) == []


@cache
def schema() -> DictConfig:
    from lm_ablate.config import Config

    return OmegaConf.structured(Config)


def test_named_config_keys_exist() -> None:
    bad = set()
    for page, key in mentions(KEY):
        if key.rsplit(".", 1)[-1] in FILE_SUFFIXES:
            continue  # a file name (model.py), not a key
        node: object = schema()
        for part in key.split("."):
            if not isinstance(node, DictConfig) or part not in node.keys():  # noqa: SIM118 (MISSING values)
                bad.add((page, key))
                break
            node = node._get_node(part)
    assert sorted(bad) == []


def test_huggingface_page_lists_every_family() -> None:
    from lm_ablate.hf import supported

    page = (DOCS / "huggingface.md").read_text()
    assert [f for f in supported() if f"| `{f}` |" not in page] == []


# --- the front door ----------------------------------------------------------------------------------------


def test_readme_is_short_with_the_two_quickstart_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 200
    quickstart = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", quickstart, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["bash scripts/study.sh", "bash scripts/test.sh"]
    assert "`bash scripts/study.sh train.threads=1`" in quickstart  # the choice on a busy machine
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()  # what CI runs is the README's command


def test_study_list_shows_runs_arms_and_the_measured_time(tmp_path, monkeypatch, capsys) -> None:
    """``python -m lm_ablate.study --list`` printed bare names. Now each study's runs and branch records agree with
    the "runs" column of docs/studies.md's table (written by hand from the runs), its arms are its jobs without
    the seed, and its time is results/README.md's wall-time row (gallery.py writes it), "not measured" without one."""
    import yaml

    from lm_ablate import study

    table = (DOCS / "studies.md").read_text().split("| study | arms", 1)[1].split("\n\n", 1)[0]
    documented = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        documented[cells[0].split()[0].strip("`")] = cells[2]  # "112 (+336 branch records)", "113 (+339)"
    assert set(documented) == set(study.studies())
    readme = (ROOT / "results" / "README.md").read_text().split("## Wall time of each study", 1)[1]
    measured = dict(re.findall(r"^\| (\w+) \| ([\d.]+ min[^|]*?) \|", readme, re.M))
    assert "norm_2x2" in measured

    assert study.main(["--list"]) == 0
    blocks = {
        b.split(":")[0].removesuffix(" (default)"): b for b in capsys.readouterr().out.split("\n") if b[:1].strip()
    }
    for name in study.studies():
        head = blocks[name]
        runs, branches = re.match(r"(\d+)(?: \(\+(\d+)(?: branch records)?\))?", documented[name]).groups()
        assert f": {runs} runs" in head and (branches is None or f"(+{branches} branch records)" in head), (name, head)
        sweeper = yaml.safe_load((ROOT / "sweeps" / f"{name}.yaml").read_text())["hydra"]["sweeper"]
        assert f"{len(study.study_plan(name).arms)} arms" in head and ("grids" in sweeper or "params" in sweeper)
        assert (f"measured {measured[name].strip()}, " in head) if name in measured else "not measured" in head, head
    arms = study.study_plan("norm_2x2").arms  # written out: {layernorm, rmsnorm} x {pre, post}
    assert sorted((a["norm"], a["norm.placement"]) for a in arms) == [
        ("layernorm", "post"), ("layernorm", "pre"), ("rmsnorm", "post"), ("rmsnorm", "pre")]  # fmt: skip

    (tmp_path / "README.md").write_text("# Results gallery\n")  # a fresh results/ without the table
    monkeypatch.setattr(study, "RESULTS_README", tmp_path / "README.md")
    assert study.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "norm_2x2 (default): 12 runs, 4 arms; not measured" in out and "min" not in out


def config_table() -> dict[str, str]:
    """docs/configuration.md's group table: group -> its row."""
    text = (DOCS / "configuration.md").read_text()
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_]+)` \|.*$", text, re.M)}


def test_every_config_group_and_option_has_a_row_in_configuration_md() -> None:
    """docs/configuration.md's table lists every group of conf/ with each of its options (experiment: one file per
    study, not listed one by one), so a new group or option cannot go undocumented (the ladder row lacked
    cpu_mup, the eval group had no row)."""
    rows = config_table()
    groups = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "hydra")
    assert [g for g in groups if g not in rows] == []
    for group in groups:
        if group == "experiment":
            continue
        options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
        cells = rows[group].split(" | ")
        missing = [o for o in options if f"`{o}`" not in cells[1]]
        assert not missing, f"docs/configuration.md: the {group} row lacks {missing}"


def _keys(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for key in node:
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            out += _keys(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def test_every_train_and_ladder_key_is_in_configuration_md() -> None:
    """Every key of the schema's train (distributed training's and ``progress`` were missing) and ladder nodes is
    named in docs/configuration.md (spike's as spike.window / spike.k)."""
    text = (DOCS / "configuration.md").read_text()
    spans = {m.group(2).split(":")[0].strip() for m in CODE_SPAN.finditer(text)}
    missing = [f"train.{k}" for k in _keys(schema().train) if k not in spans]
    missing += [f"ladder.{k}" for k in _keys(schema().ladder) if k != "name" and k not in spans]
    assert missing == [], f"not in docs/configuration.md: {missing}"


def test_setup_extras_are_the_ones_the_docs_name() -> None:
    """README.md and docs/testing.md say which extras scripts/setup.sh installs (they said .[test]; it is .[test,eval])."""
    installed = re.findall(r'pip install -q -e "(\.\[[a-z,]+\])"', (ROOT / "scripts" / "setup.sh").read_text())
    assert len(installed) == 1
    for page in (README, DOCS / "testing.md"):
        named = set(re.findall(r'pip\s+install -e "(\.\[[a-z,]+\])"', page.read_text()))
        assert named == {installed[0]}, (page.name, named)
