"""The model of the docs' generated tables: a :class:`Num` (a number shown, its format and its JSON sources), a
:class:`Table` of cells, and a :class:`Source` (one ``benchmarks/results`` file) that makes numbers.

``docs/gen_tables.py`` (the renderers, the markers, the README headline) and ``docs/tables_dpsgd.py`` build
their tables from these; ``tests/test_docs.py`` re-reads each number's sources with its own JSON walk.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_URL = "results"  # where the site holds copies of benchmarks/results/* (docs/hooks.py adds them)
DASH = "—"

Key = str | int
Pointer = tuple[Key, ...]


# ------------------------------------------------------------------------------------------------ numbers
def walk(data: Any, path: Pointer) -> Any:
    """``data[k0][k1]...``."""
    for k in path:
        data = data[k]
    return data


def combine(op: str, values: Sequence[Any]) -> float | None:
    """What ``op`` makes of the values at a number's sources (None: nothing to show)."""
    if op == "value":
        (v,) = values
        return None if v is None else float(v)
    present = [float(v) for v in values if v is not None]
    if op == "mean":
        return sum(present) / len(present) if present else None
    if op == "mean_abs":
        return sum(abs(x) for x in present) / len(present) if present else None
    if op == "std":  # sample standard deviation (ddof = 1) over seeds: the claims protocol's; 0 for one value
        if not present:
            return None
        m = sum(present) / len(present)
        return math.sqrt(sum((x - m) ** 2 for x in present) / (len(present) - 1)) if len(present) > 1 else 0.0
    if op == "ratio":
        a, b = values
        return None if a is None or b is None or b == 0 else float(a) / float(b)
    if op == "sum":
        return sum(present)
    if op == "count":
        return float(len(present))
    raise ValueError(f"unknown op {op!r}")


def fmt_number(x: float, spec: str) -> str:
    """``format(x, spec)``; integer specs (``d``) round first (JSON numbers arrive as floats too)."""
    return format(round(x), spec) if spec.endswith("d") else format(x, spec)


@dataclass(frozen=True)
class Num:
    """One number a table shows: ``value`` (before ``scale``), formatted with ``fmt``, and its sources."""

    value: float | None
    fmt: str
    sources: tuple[tuple[str, Pointer], ...]  # (JSON file name under benchmarks/results, key path)
    op: str = "value"
    scale: float = 1.0
    prefix: str = ""
    suffix: str = ""

    def text(self) -> str:
        """As shown."""
        if self.value is None:
            return DASH
        return f"{self.prefix}{fmt_number(self.value * self.scale, self.fmt)}{self.suffix}"


Part = str | Num
Cell = list[Part]


def cell_text(cell: Cell) -> str:
    return "".join(p if isinstance(p, str) else p.text() for p in cell).replace("|", "\\|")


@dataclass
class Table:
    """A generated table: a header, rows of cells, the JSON files it read and the commands that wrote them."""

    header: list[str]
    rows: list[list[Cell]]
    sources: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    title: str = ""
    align: str = ""  # one of "l" / "r" per column; default: all left

    def numbers(self) -> list[Num]:
        """Every number in the table."""
        return [p for row in self.rows for c in row for p in c if isinstance(p, Num)]

    def markdown(self) -> str:
        """The table, its title above and its sources below."""
        align = self.align or "l" * len(self.header)
        lines = [f"**{self.title}**", ""] if self.title else []
        lines += ["| " + " | ".join(self.header) + " |",
                  "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(f"row of {len(row)} cells under {len(self.header)} columns: {self.header}")
            lines.append("| " + " | ".join(cell_text(c) for c in row) + " |")
        foot = []
        if self.sources:
            foot.append("Data: " + ", ".join(f"[`{s}`]({RESULTS_URL}/{s})" for s in self.sources))
        if self.commands:
            foot.append("written by " + "; ".join(f"`{c}`" for c in dict.fromkeys(self.commands)))
        if foot:
            lines += ["", "<small>" + ", ".join(foot) + ".</small>"]
        return "\n".join(lines)


class Source:
    """One JSON file of ``benchmarks/results``, and the :class:`Num` factories that read it."""

    _cache: dict[str, tuple[float, Any]] = {}  # file name → (modification time, data)

    def __init__(self, name: str) -> None:
        self.name = name if name.endswith(".json") else name + ".json"
        path = RESULTS / self.name
        if not path.is_file():
            raise FileNotFoundError(f"benchmark results {path} not found")
        mtime = path.stat().st_mtime
        cached = Source._cache.get(self.name)
        if cached is None or cached[0] != mtime:
            cached = Source._cache[self.name] = (mtime, json.loads(path.read_text()))
        self.data = cached[1]

    def __call__(self, *path: Key) -> Any:
        """The raw value at ``path`` (for labels and control flow, not for numbers shown)."""
        return walk(self.data, path)

    def get(self, *path: Key, default: Any = None) -> Any:
        try:
            return walk(self.data, path)
        except (KeyError, IndexError, TypeError):
            return default

    def num(self, *path: Key, fmt: str = ".1f", scale: float = 1.0, prefix: str = "", suffix: str = "") -> Num:
        """The number at ``path``."""
        return Num(combine("value", [walk(self.data, path)]), fmt, ((self.name, path),), "value", scale,
                   prefix, suffix)

    def agg(self, op: str, paths: Sequence[Pointer], fmt: str = ".1f", scale: float = 1.0, prefix: str = "",
            suffix: str = "") -> Num:
        """``op`` (mean, mean_abs, std, ratio, sum, count) of the numbers at ``paths``."""
        return pooled(op, [(self, p) for p in paths], fmt, scale, prefix, suffix)

    def command(self) -> str:
        c = self.data.get("command") if isinstance(self.data, dict) else None
        if isinstance(c, str):
            return c
        machine = self.data.get("machine") if isinstance(self.data, dict) else None
        return machine.get("command", "") if isinstance(machine, dict) else ""


def cross(a: Source, pa: Pointer, b: Source, pb: Pointer, fmt: str, prefix: str = "", suffix: str = "") -> Num:
    """``a[pa] / b[pb]`` across two files."""
    return pooled("ratio", [(a, pa), (b, pb)], fmt, prefix=prefix, suffix=suffix)


def pooled(op: str, parts: Sequence[tuple[Source, Pointer]], fmt: str = ".1f", scale: float = 1.0, prefix: str = "",
           suffix: str = "") -> Num:
    """``op`` (mean, mean_abs, std, ratio, sum, count) of the numbers at ``(source, path)`` pairs, from one file or
    several."""
    values = [walk(src.data, path) for src, path in parts]
    return Num(combine(op, values), fmt, tuple((src.name, tuple(path)) for src, path in parts), op, scale, prefix,
               suffix)


def pm(src: Source, mean: Pointer, std: Pointer, fmt: str = ".1f") -> Cell:
    """``mean ± std``."""
    return [src.num(*mean, fmt=fmt), " ± ", src.num(*std, fmt=fmt)]


def mean_std(src: Source, paths: Sequence[Pointer], fmt: str = ".1f") -> Cell:
    """Mean ± sample std (ddof = 1) of the numbers at ``paths`` (the mean alone for one path)."""
    if len(paths) == 1:
        return [src.num(*paths[0], fmt=fmt)]
    return [src.agg("mean", paths, fmt), " ± ", src.agg("std", paths, fmt)]


def join(nums: Sequence[Num], sep: str = ", ") -> Cell:
    out: Cell = []
    for i, n in enumerate(nums):
        if i:
            out.append(sep)
        out.append(n)
    return out


def opt(s: Source, path: Pointer, fmt: str) -> Num:
    """The number at ``path``, or a dash where the JSON has none."""
    if s.get(*path) is None:
        parent, key = path[:-1], path[-1]
        if key not in s(*parent):
            return Num(None, fmt, ())
    return s.num(*path, fmt=fmt)
