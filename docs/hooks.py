"""MkDocs hooks (``hooks:`` in ``mkdocs.yml``): the generated parts of the docs.

* ``on_page_markdown`` replaces ``<!-- bench: NAME [ARG] -->`` with benchmark tables read from
  ``benchmarks/results/*.json`` and ``<!-- config: module.Class -->`` with a config reference generated from the
  dataclass (``docs/gen_tables.py`` does both); an unknown marker fails the build.
* ``on_files`` puts ``benchmarks/results``'s JSON files and figures into the site under ``results/``, so that
  every generated table links to the data it was read from (and ``--strict`` checks those links).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
# a marker is a line of its own (so that a marker quoted inline in the text is left alone)
MARKER = re.compile(r"^[ \t]*<!--\s*(bench|config):\s*(.+?)\s*-->[ \t]*$", re.MULTILINE)
SITE_RESULTS = ("*.json", "*.png", "learning_suite/*.png", "hsa2c_sweep/*.json", "headline/*.json")


def _load_gen_tables() -> ModuleType:
    """``docs/gen_tables.py``, loaded afresh (``mkdocs serve`` reloads this hook on every rebuild)."""
    name = "frugalrl_docs_gen_tables"
    spec = importlib.util.spec_from_file_location(name, HERE / "gen_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_gen_tables()


def expand(markdown: str) -> str:
    """``markdown`` with every marker replaced by what it generates."""

    def one(m: re.Match[str]) -> str:
        kind, spec = m.group(1), m.group(2)
        return gen.render_bench(spec) if kind == "bench" else gen.render_config(spec)

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for pattern in SITE_RESULTS:
        for path in sorted(gen.RESULTS.glob(pattern)):
            uri = f"{gen.RESULTS_URL}/{path.relative_to(gen.RESULTS).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
