"""No import cycle among the kit's modules.

Every import of a ``kvref`` module by another counts: at module level, inside
a function (a "lazy" import that only hides a cycle from Python) and under
``if TYPE_CHECKING:`` (one that hides it from the interpreter but not from
the reader or mypy). ``from package import name`` counts as an import of
``package.name`` when that is a module. The graph is read with :mod:`ast`;
nothing is imported. A cycle is reported with the modules on it and the
imports that close it.
"""

from __future__ import annotations

import ast
from pathlib import Path

KIT = Path(__file__).resolve().parents[2] / "kit"


def kit_modules() -> dict[str, Path]:
    """Every module of ``kvref`` by dotted name (a package by its name)."""
    found = {}
    for path in sorted((KIT / "kvref").rglob("*.py")):
        parts = list(path.relative_to(KIT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kit modules ``name`` imports, anywhere in its source."""
    out: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                out.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module)
    return {m for m in out if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    """The walk finds an import inside a function and one under TYPE_CHECKING."""
    modules = kit_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert "kvref.adapters.vllm" in graph["kvref.check"]  # imported inside a function
    assert "kvref.adapters.vllm.lineage" in graph["kvref"]  # kvref/__init__.py: under TYPE_CHECKING
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(planted) == [["a", "b", "c"]]


def test_the_kit_has_no_import_cycle() -> None:
    modules = kit_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    found = cycles(graph)
    described = [
        " <-> ".join(component) + ": "
        + "; ".join(f"{a} imports {sorted(graph[a] & set(component))}" for a in component)
        for component in found
    ]  # fmt: skip
    assert not found, "import cycles in the kit:\n" + "\n".join(described)
