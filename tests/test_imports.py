"""No import cycles inside frugalrl, counting the imports inside functions too.

The graph is built by parsing every module under ``src/frugalrl`` with :mod:`ast` (nothing is
imported). Every ``import`` statement counts, wherever it is (module level, inside a function or a
class), except under ``if TYPE_CHECKING:``. ``from frugalrl.x import y`` is an edge to
``frugalrl.x.y`` when that is a module, else to ``frugalrl.x``. Only written imports are edges: the
implicit import of the packages enclosing a module (Python runs ``frugalrl/compress/__init__.py``
before ``frugalrl.compress.chain``) is not, or every re-exporting ``__init__`` would be in a cycle; an
explicit ``from frugalrl.compress import X`` inside ``frugalrl.compress.chain`` is an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import frugalrl

PACKAGE = "frugalrl"
ROOT = Path(frugalrl.__file__).resolve().parent

# Cycles other branches of the issue-12 refactor remove; each entry is the exact set of modules of one
# strongly connected component, with the change that removes it. Empty once those branches are merged.
KNOWN_CYCLES: dict[frozenset[str], str] = {}
"""Cycles tolerated for a while, each with the reason (none today: keep it that way)."""


def module_names() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``, skipping the bodies of ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                found += _imports(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append(child)
        found += _imports(child)
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the nearest enclosing package module; None outside frugalrl."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the frugalrl modules it imports (anywhere in the file)."""
    modules = module_names()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_package = path.name == "__init__.py"
        package = mod if is_package else mod.rpartition(".")[0]
        for stmt in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(stmt, ast.Import):
                targets = [alias.name for alias in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (stmt.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in stmt.names]
            for target in targets:
                if not (target == PACKAGE or target.startswith(PACKAGE + ".")):
                    continue
                resolved = _resolve(target, modules)
                if resolved is None:
                    continue
                if resolved == mod:
                    graph[mod].add(mod)  # a self-import
                    continue
                graph[mod].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, and self-imports (Tarjan)."""
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
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_sees_lazy_imports_and_skips_type_checking() -> None:
    src = """
from typing import TYPE_CHECKING
import os
if TYPE_CHECKING:
    import frugalrl.a
else:
    import frugalrl.b
def f():
    from frugalrl import c
    class K:
        def g(self):
            import frugalrl.d.e
"""
    names = sorted(
        a.name if isinstance(s, ast.Import) else f"{s.module}.{a.name}"
        for s in _imports(ast.parse(src))
        for a in s.names
    )
    assert names == ["frugalrl.b", "frugalrl.c", "frugalrl.d.e", "os", "typing.TYPE_CHECKING"]


def test_cycle_finder() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(g) == [["a", "b", "c"], ["d"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_resolves_from_imports_to_modules() -> None:
    graph = import_graph()
    assert "frugalrl.compress.chain" in graph
    # `from frugalrl.wire.message import encode_state_dict` is an edge to the module, not the package.
    assert "frugalrl.wire.message" in graph["frugalrl.compress.chain"]
    assert "frugalrl.wire" not in graph["frugalrl.compress.chain"]
    # `from frugalrl import dists` is an edge to the module frugalrl.dists.
    assert "frugalrl.dists" in graph["frugalrl.compress.chain"]
    # Lazy imports inside functions count; the stages import the shared base, not the chain.
    assert "frugalrl.compress.prune" in graph["frugalrl.compress.chain"]
    for stage in ("prune", "distill", "quantize", "export"):
        assert "frugalrl.compress.base" in graph[f"frugalrl.compress.{stage}"]
        assert "frugalrl.compress.chain" not in graph[f"frugalrl.compress.{stage}"]


def test_no_import_cycles() -> None:
    found = [c for c in cycles(import_graph()) if frozenset(c) not in KNOWN_CYCLES]
    assert not found, "import cycles in frugalrl (modules importing each other, lazily or not): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_known_cycles_still_exist() -> None:
    """An entry of KNOWN_CYCLES whose cycle is gone must be deleted (so it cannot hide a new one)."""
    found = {frozenset(c) for c in cycles(import_graph())}
    stale = [f"{' <-> '.join(sorted(c))} ({why})" for c, why in KNOWN_CYCLES.items() if c not in found]
    assert not stale, "delete these entries of KNOWN_CYCLES in tests/test_imports.py: " + "; ".join(stale)
