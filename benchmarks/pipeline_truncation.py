"""Split-model PPO before and after the truncation fix, same seeds, same session: does bootstrapping time limits
change what the pipeline learns on CartPole-v1?

    python benchmarks/pipeline_truncation.py --base ed0e17d --seeds 4 5 6 --cuts dense p0.99

``--base`` is checked out into a temporary git worktree; each (seed, cut) runs there ("before") and in this
checkout ("after"), one after the other, with ``pipeline_suite.py``'s CartPole setting (41k steps, 10 evaluations
of 10 deterministic episodes). Per-run results are cached in ``benchmarks/results/pipeline_truncation/``; the
table is ``benchmarks/results/pipeline_truncation.json``. Besides the final evaluation (one 10-episode check, noisy
on CartPole) it reports the mean of the evaluations of the run's second half. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CACHE = RESULTS / "pipeline_truncation"
ONE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import pipeline_suite as ps
out = ps.run("CartPole-v1", sys.argv[2], int(sys.argv[3]), "position")
json.dump(out, open(sys.argv[4], "w"))
"""


def run(tree: Path, cut: str, seed: int, path: Path) -> None:
    """One pipeline_suite run with the code of ``tree`` (its src/ first on the path, its children's too)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run([sys.executable, "-c", ONE, str(tree / "benchmarks"), cut, str(seed), str(path)], env=env,
                   check=True, cwd=tempfile.gettempdir())


def summarise(out: dict[str, Any]) -> dict[str, Any]:
    evals = [e["mean"] for e in out["eval_history"]]
    return {"final": out["final_return"], "second_half_mean": float(np.mean(evals[len(evals) // 2:])),
            "evals": evals}


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--base", default="ed0e17d", help="the commit before the fix")
    p.add_argument("--seeds", nargs="+", type=int, default=[4, 5, 6])
    p.add_argument("--cuts", nargs="+", default=["dense", "p0.99"], choices=["dense", "p0.9", "p0.99"])
    args = p.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True,
                       capture_output=True)
        try:
            for seed in args.seeds:
                for cut in args.cuts:
                    for version, tree in (("before", base), ("after", ROOT)):
                        path = CACHE / f"{version}-{cut}-s{seed}.json"
                        if not path.exists():
                            run(tree, cut, seed, path)
                        print(version, cut, seed, json.loads(path.read_text())["final_return"], flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    table: dict[str, Any] = {}
    for cut in args.cuts:
        row: dict[str, Any] = {}
        for version in ("before", "after"):
            runs = [summarise(json.loads((CACHE / f"{version}-{cut}-s{s}.json").read_text())) for s in args.seeds]
            row[version] = {
                "final_mean": float(np.mean([r["final"] for r in runs])),
                "final_std": float(np.std([r["final"] for r in runs], ddof=1)),
                "second_half_mean": float(np.mean([r["second_half_mean"] for r in runs])),
                "second_half_std": float(np.std([r["second_half_mean"] for r in runs], ddof=1)),
                "per_seed": runs,
            }
        table[cut] = row
    command = "python benchmarks/pipeline_truncation.py " + " ".join(sys.argv[1:])
    (RESULTS / "pipeline_truncation.json").write_text(json.dumps(
        {"command": command, "base": args.base, "seeds": args.seeds, "std": "sample (ddof=1)", "table": table},
        indent=1))
    for cut, row in table.items():
        print(cut, {v: (round(r["final_mean"], 1), round(r["second_half_mean"], 1)) for v, r in row.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
