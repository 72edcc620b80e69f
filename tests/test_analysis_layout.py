"""The shape of analysis/ (issue 22), measured from its source with ``ast``: the pipeline's stages only import
downwards, no import circle anywhere (imports inside functions count), no ``_private`` name taken from another
module, and compute/ free of matplotlib and of present/. lm_ablate/ does not import analysis/, except the study
command's one lazy call."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "analysis"
# a stage may import the stages before it (and the shared modules at the package's top), never one after it
STAGES = ("sources", "compute", "present", "publish")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> list[tuple[str, str, int]]:
    """(module imported, name taken from it or "", line) for every import in the file, at any depth (a lazy
    import inside a function is an import too). ``from analysis.x import y`` imports module analysis.x.y when
    that is a module, else the name y of analysis.x."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub, "", node.lineno) if sub in known else (node.module, alias.name, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    """module -> the analysis modules it imports; importing a.b.c also runs the packages a and a.b."""
    known = set(modules())
    edges: dict[str, set[str]] = {m: set() for m in known}
    for name, path in modules().items():
        for target, _, _ in imports(path, known):
            parts = target.split(".")
            edges[name] |= {p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in known}
        edges[name].discard(name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in STAGES else None


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_analysis():
    assert cycles(graph()) == []


def test_no_private_name_is_imported_from_another_module():
    known = set(modules())
    taken = [
        f"{name}:{line} imports {target}.{what}"
        for name, path in modules().items()
        for target, what, line in imports(path, known)
        if what.startswith("_") and not what.startswith("__") and target.startswith("analysis")
    ]
    assert taken == []


def test_stages_import_only_downwards_and_compute_draws_nothing():
    known = set(modules())
    wrong = []
    for name, path in modules().items():
        here = stage(name)
        for target, _, line in imports(path, known):
            there = stage(target)
            if here and there and STAGES.index(there) > STAGES.index(here):
                wrong.append(f"{name}:{line} ({here}) imports {target} ({there})")
            if here in ("sources", "compute") and target.split(".")[0] in ("matplotlib", "PIL"):
                wrong.append(f"{name}:{line} ({here}) imports {target}")
    assert wrong == []
    assert {stage(m) for m in known} >= set(STAGES)  # the stages are folders


@pytest.mark.parametrize("command", ["analysis.report", "analysis.wandb_report", "analysis.wandb_dashboard"])
def test_commands_keep_their_names(command):
    path = ROOT / Path(*command.split(".")).with_suffix(".py")
    assert path.is_file() and ("def main" in path.read_text() or "import main" in path.read_text())


def test_lm_ablate_does_not_import_analysis_but_the_study_command_lazily():
    found = []
    for path in sorted((ROOT / "lm_ablate").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            named = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            named += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "analysis" or n.startswith("analysis.") for n in named):
                found.append((path.relative_to(ROOT).as_posix(), id(node) in top))
    assert found == [("lm_ablate/study.py", False)]
