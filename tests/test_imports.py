"""The import graph of lm_ablate/ has floors and no circle (issue 22): every ``import`` counts, those inside
functions too (a lazy import hides a circle, it does not remove it). The ground floor (errors, schema) imports
nothing of ours but errors; lm_ablate/ needs analysis/ only in study.py (the orchestrator on top)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_names(package: str) -> dict[str, Path]:
    names = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``path`` imports anywhere in its body (``from a.b import c`` counts as
    a.b.c when that is a module, else a.b)."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            hit = resolve(target)
            if hit and hit != module:
                found.add(hit)
    return found


def graph(*packages: str) -> dict[str, set[str]]:
    known = {k: v for p in packages for k, v in module_names(p).items()}
    return {m: imports_of(path, m, known) for m, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def describe(edges: dict[str, set[str]], component: list[str]) -> str:
    inside = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(edges[m] & inside))}" for m in component)


def test_the_cycle_finder_finds_a_lazy_circle(tmp_path):
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from lm_ablate.config import compose\n")
    assert imports_of(source, "lm_ablate.lazy", module_names("lm_ablate")) == {"lm_ablate.config"}


@pytest.mark.parametrize("package", ["lm_ablate", "analysis"])
def test_no_import_circle(package):
    edges = graph(package)
    found = cycles(edges)
    assert not found, "import circles: " + " | ".join(describe(edges, c) for c in found)


def test_the_ground_floor_imports_nothing_of_ours():
    edges = graph("lm_ablate")
    assert edges["lm_ablate.errors"] == set()
    assert edges["lm_ablate.schema"] <= {"lm_ablate.errors"}
    assert edges["lm_ablate.registry"] <= {"lm_ablate.errors"}  # free of config (issue 22)
    components = [m for m in edges if m.startswith("lm_ablate.components.")]
    for m in components:  # components ask the schema and the registries, never validation or composition
        assert not edges[m] & {"lm_ablate.config", "lm_ablate.validation", "lm_ablate.options"}, (m, edges[m])


def test_lm_ablate_needs_analysis_only_in_the_study_command():
    edges = graph("lm_ablate", "analysis")
    users = sorted(
        m for m, deps in edges.items() if m.startswith("lm_ablate") and any(d.startswith("analysis") for d in deps)
    )
    assert users == ["lm_ablate.study"], users
