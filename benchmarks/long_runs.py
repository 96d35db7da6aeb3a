"""Long runs without faults: what a days-long run accumulates, measured in minutes.

Each ``--runs`` entry (``ALGO:ENV`` or ``ALGO:ENV:INLINE``, INLINE the ``--inline-workers`` value) runs ``frugalrl
train`` with an endless budget for ``--minutes``, then SIGTERM (the run checkpoints and writes its summary), while
every process's resident memory is sampled four times a second (the soak's watch, no kills). Reported per process
(head, workers): memory a third into its life, peak, end, and the growth per minute between; per run: env steps,
updates and the metrics rows it wrote. Then the last run's ``metrics.jsonl`` is repeated to ``--metrics-rows`` rows
(a days-long run's file) and two things a run does with it are timed in a fresh process each, with its peak memory:
cutting it to a checkpoint's step (a resume) and drawing the end-of-run plots; ``--before-src`` times them with another
checkout's ``src`` too (the parent of a change). Example::

    python benchmarks/long_runs.py --runs ppo:LunarLander-v3 ppo:CartPole-v1:0 impala:CartPole-v1:0 --minutes 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from soak import RESULTS, Watch, memory_summary, train  # noqa: E402

CHILD = """
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
if sys.argv[1] == "resume":  # what a resumed run does to its directory first
    from frugalrl.runs import RunDirectory
    RunDirectory(sys.argv[2], {}, tensorboard=False, resume_step=int(sys.argv[3])).close()
else:
    from frugalrl.plots import make_plots
    make_plots(sys.argv[2], Path(sys.argv[2]) / "plots")
print(json.dumps({"seconds": round(time.perf_counter() - t0, 2),
                  "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def long_run(spec: str, minutes: float, root: Path) -> dict[str, Any]:
    algo, env, *inline = spec.split(":", 2)
    name = spec.replace(":", "-").replace("/", "_")
    args = [algo, "--env", env, "--total-timesteps", str(10**10), "--run-dir", str(root), "--run-name", name,
            "--no-progress", "--no-plots", "--no-tensorboard", *(["--inline-workers", inline[0]] if inline else [])]
    watch = Watch(0, random.Random(0))
    code, wall = train(args, watch, stop_after=minutes * 60, sig=signal.SIGTERM)
    watch.close()
    summary = json.loads((root / name / "summary.json").read_text())
    with open(root / name / "metrics.jsonl") as f:
        rows = sum(1 for _ in f)
    return {"run": spec, "exit_code": code, "wall_seconds": round(wall, 1), "env_steps": summary["env_steps"],
            "updates": summary["updates"], "metrics_rows": rows,
            "memory": {k: memory_summary(s) for k, s in watch.memory.items() if len(s) >= 20},
            "run_dir": str(root / name)}


def metrics_costs(run_dir: Path, rows: int, root: Path, before_src: str | None) -> dict[str, Any]:
    """The run's metrics repeated to ``rows`` rows (steps continuing), then a resume's cut and the plots (also with
    the frugalrl of ``before_src``, another checkout's ``src``, on a copy of the same file)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    big = root / "big"
    big.mkdir()
    for name in ("config.json", "summary.json"):
        (big / name).write_bytes((run_dir / name).read_bytes())
    step = 0
    with open(big / "metrics.jsonl", "w") as f:
        for i in range(rows):
            row = json.loads(lines[i % len(lines)])
            step += 256
            row["step"] = step
            f.write(json.dumps(row) + "\n")
    out: dict[str, Any] = {"rows": rows, "file_mb": round((big / "metrics.jsonl").stat().st_size / 1e6, 1)}
    for side, src in (("now", None), ("before", before_src)):
        if side == "before" and src is None:
            continue
        env = {**os.environ, **({"PYTHONPATH": os.path.abspath(src)} if src else {})}
        results: dict[str, Any] = {}
        for what, extra in (("plots", []), ("resume", [str(step * 4 // 5)])):
            shutil.copyfile(big / "metrics.jsonl", big / "metrics.copy")  # the resume cuts the file in place
            done = subprocess.run([sys.executable, "-c", CHILD, what, str(big), *extra], capture_output=True,
                                  text=True, check=True, env=env)
            results[what] = json.loads(done.stdout.strip().splitlines()[-1])
            os.replace(big / "metrics.copy", big / "metrics.jsonl")
        out[side] = results
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", default=["ppo:LunarLander-v3", "ppo:CartPole-v1:0", "impala:CartPole-v1:0"])
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--metrics-rows", type=int, default=500_000)
    ap.add_argument("--before-src", help="also time the metrics costs with another checkout's src (the change's parent)")
    ap.add_argument("--out", default="long_runs")
    args = ap.parse_args()
    out: dict[str, Any] = {"command": "python benchmarks/long_runs.py " + " ".join(sys.argv[1:]),
                           "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.runs:
            row = long_run(spec, args.minutes, Path(tmp))
            out["runs"].append({k: v for k, v in row.items() if k != "run_dir"})
            print(json.dumps({k: v for k, v in row.items() if k != "run_dir"}), flush=True)
        out["metrics"] = metrics_costs(Path(row["run_dir"]), args.metrics_rows, Path(tmp), args.before_src)
        print(json.dumps(out["metrics"]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
