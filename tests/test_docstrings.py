"""Docstrings say what and why in a few lines; measurements and their history live in the docs (issue 46).

Docstrings are the API reference, and a config field's docstring is also its CLI ``--help`` and its row of the
generated config reference, so an experiment's figures there go stale where users read them. The rules:

1. a module docstring says what the module is and why in at most 25 lines;
2. no docstring reads like a lab notebook (dates, result files, seed counts, sessions): the figures belong in
   docs/benchmarks.md, which a docstring may point to ("why: docs/benchmarks.md#some-anchor");
3. no docstring grows into a chapter (at most 40 lines);
4. every ``docs/<page>.md#<anchor>`` a docstring points to exists.

Pure ``ast`` over ``src/frugalrl``: nothing is imported.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "frugalrl"
DOCS = ROOT / "docs"

MAX_MODULE_LINES = 25
MAX_LINES = 40


LAB_NOTEBOOK = re.compile(
    "|".join([
        r"\b20\d\d-\d\d\b",  # a date: "the default until 2026-11-27"
        r"benchmarks/results/",  # a result file
        r"\b(?:\d+|one|two|three|four|five|ten) seeds?\b(?! documents?)",  # "3 seeds", "one seed of three"
        r"\bseeds? \d+\b",  # "seed 1"
        r"\b(?:this|last|previous|earlier|first|second|third|\w+th) session\b",
        r"\b(?:we|I) (?:measured|tried|found|ran)\b",
        r"\bsettled on\b",
        r"\bthe default (?:until|since|before)\b",
    ]),
    re.IGNORECASE,
)
DOCS_POINTER = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        out.append((rel, ast.parse(path.read_text(), filename=str(path))))
    return out


MODULES = _modules()


def _is_str(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _docstrings(tree: ast.Module) -> Iterator[tuple[str, ast.Expr]]:
    """(name, string node) of every docstring: modules, classes, functions and attributes (a string right after
    an assignment, which :func:`frugalrl.config.field_docs` turns into CLI help)."""
    stack: list[tuple[str, ast.AST]] = [("<module>", tree)]
    while stack:
        name, node = stack.pop()
        body = getattr(node, "body", [])
        if body and _is_str(body[0]):
            yield name, body[0]
        for prev, stmt in zip(body, body[1:], strict=False):
            if isinstance(prev, (ast.Assign, ast.AnnAssign)) and _is_str(stmt):
                target = prev.targets[0] if isinstance(prev, ast.Assign) else prev.target
                yield f"{name}.{ast.unparse(target)}", stmt
        for child in body:
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                stack.append((child.name if name == "<module>" else f"{name}.{child.name}", child))


def _text(node: ast.Expr) -> str:
    assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    return node.value.value


def _lines(node: ast.Expr) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def _slug(title: str) -> str:
    """Python-Markdown's heading id (mkdocs' ``toc`` extension)."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    found = set(re.findall(r'id="([\w-]+)"', text)) | set(re.findall(r"\{#([\w-]+)\}", text))
    for m in re.finditer(r"^#{1,6} (.+?)\s*$", text, re.M):
        if "{#" not in m.group(1):
            found.add(_slug(m.group(1)))
    return found


def test_module_docstrings_say_what_and_why_in_a_few_lines():
    long = [
        f"{rel}: {_lines(node)} lines"
        for rel, tree in MODULES
        for name, node in _docstrings(tree) if name == "<module>" and _lines(node) > MAX_MODULE_LINES
    ]
    assert not long, f"module docstrings over {MAX_MODULE_LINES} lines (move the detail into docs/): {long}"


def test_no_docstring_reads_like_a_lab_notebook():
    found = [
        f"{rel}:{node.lineno} {name}: {m.group(0)!r}"
        for rel, tree in MODULES
        for name, node in _docstrings(tree)
        for m in LAB_NOTEBOOK.finditer(_text(node))
    ]
    assert not found, (
        "measurements or their history in docstrings (move them to docs/benchmarks.md and point there): "
        f"{found}"
    )


def test_no_docstring_is_a_chapter():
    long = [
        f"{rel}:{node.lineno} {name}: {_lines(node)} lines"
        for rel, tree in MODULES
        for name, node in _docstrings(tree) if _lines(node) > MAX_LINES
    ]
    assert not long, f"docstrings over {MAX_LINES} lines: {long}"


def test_docs_pointers_in_docstrings_exist():
    anchors: dict[str, set[str]] = {}
    missing = []
    for rel, tree in MODULES:
        for name, node in _docstrings(tree):
            for m in DOCS_POINTER.finditer(_text(node)):
                page, anchor = DOCS / m.group(1), m.group(2)
                if not page.exists():
                    missing.append(f"{rel} {name}: {m.group(0)} (no such page)")
                    continue
                if anchor and anchor not in anchors.setdefault(page.name, _anchors(page)):
                    missing.append(f"{rel} {name}: {m.group(0)} (no such anchor)")
    assert not missing, f"docstrings point to docs that do not exist: {missing}"


def test_the_rules_catch_lab_notebook_text():
    for text in ("the default until 2026-11-27", "(benchmarks/results/x.json)", "3 seeds", "on one seed of three",
                 "seed 2: 552 or 577", "the last session", "Settled on CartPole-v1"):
        assert LAB_NOTEBOOK.search(text), text
    for text in ("env ``j`` is reset with ``seed + j``", "one seed document per topic", "seeds of :meth:`seed`",
                 "the KL is measured on the states", "an ``InferenceSession``", "float32's maximum"):
        assert not LAB_NOTEBOOK.search(text), text
    assert _slug("Test hosts: emulated machines and links") == "test-hosts-emulated-machines-and-links"
