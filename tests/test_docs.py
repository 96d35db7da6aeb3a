"""The docs: generated tables hold the JSON's numbers, links resolve, the newcomer path works, the site builds.

Every benchmark table in the docs is generated from ``benchmarks/results/*.json`` by ``docs/gen_tables.py``;
here each number it shows is recomputed from its JSON file with this file's own reading of the data.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


hooks = _load("frugalrl_docs_hooks", DOCS / "hooks.py")
gen = hooks.gen


def _markers(kind: str) -> list[tuple[str, str]]:
    """(page, spec) of every ``kind`` marker in the docs' pages."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for m in hooks.MARKER.finditer(page.read_text()):
            if m.group(1) == kind:
                found.append((page.name, m.group(2)))
    return found


BENCH_MARKERS = _markers("bench")
CONFIG_MARKERS = _markers("config")


# ----------------------------------------------------------------------------- the numbers and their JSON
_json_cache: dict[str, Any] = {}


def _json(name: str) -> Any:
    if name not in _json_cache:
        _json_cache[name] = json.loads((RESULTS / name).read_text())
    return _json_cache[name]


def _at(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


def _expected(op: str, values: list[Any]) -> float | None:
    if op == "value":
        return None if values[0] is None else float(values[0])
    if op == "ratio":
        a, b = values
        return None if a is None or b is None or b == 0 else a / b
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    mean = math.fsum(xs) / len(xs)
    if op == "mean":
        return mean
    if op == "mean_abs":
        return math.fsum(abs(x) for x in xs) / len(xs)
    if op == "std":
        return math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    if op == "sum":
        return math.fsum(xs)
    if op == "count":
        return float(len(xs))
    raise AssertionError(f"unknown op {op}")


def _shown(x: float, spec: str) -> str:
    return format(round(x), spec) if spec.endswith("d") else format(x, spec)


def test_the_docs_use_bench_and_config_markers():
    names = {spec.split()[0] for _, spec in BENCH_MARKERS}
    # the headline benchmarks the README used to show, at least
    for name in ("ppo_lunarlander", "aaps", "uplink", "learning_suite_ppo", "learning_suite_impala",
                 "compress_table6", "pipeline_carracing", "pipeline_suite", "dpsgd_speedup", "hsa2c_vs_sync",
                 "lda", "throughput", "headline"):
        assert name in names, name
    assert {spec for _, spec in CONFIG_MARKERS} >= {
        "frugalrl.algos.ppo.PPOConfig", "frugalrl.algos.impala.IMPALAConfig",
        "frugalrl.pipeline.config.PipelinePPOConfig", "frugalrl.algos.hsa2c.HSA2CConfig",
        "frugalrl.dpsgd.config.DPSGDConfig", "frugalrl.dpsgd.lda.LDAConfig",
    }


@pytest.mark.parametrize("page,spec", BENCH_MARKERS, ids=[f"{p}:{s}" for p, s in BENCH_MARKERS])
def test_every_number_of_a_bench_table_is_its_json_value(page, spec):
    tables = gen.bench_tables(spec)
    assert tables
    rendered = gen.render_bench(spec)
    for table in tables:
        md = table.markdown()
        assert md in rendered
        nums = table.numbers()
        if spec.split()[0] not in ("pipeline_table1", "index"):  # formulas; the list of files
            assert any(n.sources for n in nums), f"{spec}: a table with no number from JSON"
        for source in table.sources:
            assert (RESULTS / source).is_file(), source
        for row in table.rows:
            line = "| " + " | ".join(gen.cell_text(c) for c in row) + " |"
            assert line in md
            for cell in row:
                for n in cell:
                    if not isinstance(n, gen.Num) or not n.sources:
                        continue
                    values = [_at(_json(f), tuple(p)) for f, p in n.sources]
                    want = _expected(n.op, values)
                    if want is None:
                        assert n.value is None and n.text() == "—", (spec, n)
                        continue
                    assert n.value == pytest.approx(want, rel=1e-9, abs=1e-12), (spec, n.sources)
                    text = n.prefix + _shown(want * n.scale, n.fmt) + n.suffix
                    assert n.text() == text, (spec, n.sources, n.text(), text)
                    assert text.replace("|", "\\|") in gen.cell_text(cell)


def test_bench_tables_spot_check_against_the_json():
    """A few figures read straight from the JSON, independently of the table code."""
    uplink = _json("uplink.json")
    md = gen.render_bench("uplink")
    for key in uplink["settings"]:
        assert f"| {uplink['settings'][key]['bytes_per_step']['total']:.2f} |" in md
    aaps = _json("aaps_3seeds.json")
    md = gen.render_bench("aaps aaps_3seeds")
    assert f"| {aaps['rows'][1]['weight_bytes_ratio_vs_every']:.1f}× |" in md
    suite = _json("learning_suite.json")["table"]["LunarLander-v3"]["variants"]["frugal-aaps-bf16"]
    md = gen.render_bench("learning_suite_ppo")
    assert f"| {suite['final_return_mean']:.1f} ± {suite['final_return_std']:.1f} |" in md


def test_pages_expand_every_marker():
    for page in sorted(DOCS.glob("*.md")):
        out = hooks.expand(page.read_text())
        assert not hooks.MARKER.search(out), page.name
    with pytest.raises(ValueError, match="unknown bench table"):
        hooks.expand("<!-- bench: no_such_table -->")


# ------------------------------------------------------------------------------------------- config tables
@pytest.mark.parametrize("spec", sorted({s for _, s in CONFIG_MARKERS}))
def test_config_reference_lists_every_cli_flag(spec):
    import dataclasses
    import importlib

    from frugalrl.cli import add_dataclass_args
    from frugalrl.config import is_flag

    module, _, name = spec.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, cls)
    flags = {o for a in parser._actions for o in a.option_strings}
    md = gen.render_config(spec)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-") if is_flag(f) else f"{f.name} (config.json only)"
        assert (flag in flags) == is_flag(f)
        assert f"| `{flag}` |" in md


# ------------------------------------------------------------------------------------------------- README
def _links(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text)]


def test_readme_links_into_docs_and_results_exist():
    text = README.read_text()
    links = [u for u in _links(text) if not u.startswith(("http://", "https://", "#"))]
    assert any(u.startswith("docs/") for u in links)
    for url in links:
        path = (ROOT / url.split("#")[0]).resolve()
        assert path.exists(), f"README links to {url}, which does not exist"
    for page in ("getting-started.md", "clusterenv.md", "accerl.md", "pipeline.md", "dpsgd.md", "multi-node.md",
                 "architecture.md", "benchmarks.md"):
        assert f"docs/{page}" in links, page


def test_readme_is_a_landing_page_with_the_headline_table_of_the_json():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert "make demo" in text and "make test" in text and "make docs" in text
    start, end = text.index(gen.HEAD_START) + len(gen.HEAD_START), text.index(gen.HEAD_END)
    assert text[start:end].strip() == gen.readme_headline().strip(), (
        "the README's headline table differs from the JSON: run `python docs/gen_tables.py --update-readme`")


def test_headline_rows_come_from_one_commit():
    """The README's headline table is one `make headline` on one commit: every row's JSON names the same commit,
    clean code and the full budget (quick runs live in headline/quick/, out of git)."""
    rows = {p.stem: json.loads(p.read_text()) for p in sorted((RESULTS / "headline").glob("*.json"))
            if "-raw" not in p.stem}
    assert {"ppo", "dropin", "hsa2c"} <= set(rows), sorted(rows)
    commits = {r["commit"] for r in rows.values()}
    assert len(commits) == 1, {k: r["commit"] for k, r in rows.items()}
    for key, r in rows.items():
        assert r["budget"] == "full" and not r["dirty"], key
        assert "skipped" in r or ("summary" in r and r["commands"]), key


@pytest.mark.slow
def test_headline_quick_runs_a_row_and_caches_it_by_commit():
    """`benchmarks/headline.py --quick` end to end on its cheapest row: the JSON names the commit, the second call
    reuses it."""
    quick = RESULTS / "headline" / "quick" / "compress.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "headline.py"), "--quick", "--rows", "compress", "--force"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    first = json.loads(quick.read_text())
    assert first["budget"] == "quick" and first["summary"]["speedup_batch1"] > 0
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    assert first["commit"] == head.stdout.strip()
    again = subprocess.run(cmd[:-1], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    # uncommitted code is never reused (it may have changed between the calls): only a clean tree's row is cached
    assert ("cached at" in again.stdout) == (not first["dirty"]), again.stdout[-2000:]


def test_readme_example_is_the_getting_started_one():
    block = re.search(r"```python\n(import frugalrl.*?)```", README.read_text(), re.S)
    assert block is not None
    assert block.group(1) in (DOCS / "getting-started.md").read_text()


def test_architecture_names_existing_modules():
    src = ROOT / "src" / "frugalrl"
    text = (DOCS / "architecture.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| `")]
    assert table
    for line in table:
        for path in re.findall(r"`([\w/]+(?:\.py|/))`", line.split("|")[1]):
            assert (src / path).exists(), f"docs/architecture.md names {path}, which src/frugalrl does not have"


# ------------------------------------------------------------------------------------ the newcomer's path
def test_getting_started_custom_env_by_factory_path(tmp_path, monkeypatch):
    """The getting-started page's ``my_envs.py``, given to ClusterEnv by its factory path."""
    text = (DOCS / "getting-started.md").read_text()
    code = re.search(r"Write `my_envs.py`.*?```python\n(.*?)```", text, re.S)
    assert code is not None
    (tmp_path / "my_envs.py").write_text(code.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "\nfrugalrl train ppo --env my_envs:make_corridor" in text

    from frugalrl import ClusterEnv

    envs = ClusterEnv("my_envs:make_corridor", env_kwargs={"length": 3}, num_workers=1, envs_per_worker=2,
                      backend="serial", seed=1)
    try:
        envs.reset(seed=1)
        for _ in range(4):
            envs.step([1, 1])
        assert envs.single_action_space.n == 2
    finally:
        envs.close()
    sys.modules.pop("my_envs", None)


# -------------------------------------------------------------------------------------------- the site
def test_mkdocs_build_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-4000:]
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    assert (site / "results" / "uplink.json").is_file()
    bench = (site / "benchmarks" / "index.html").read_text()
    assert "bench:" not in bench  # every marker replaced
