"""Split-model PPO with no flags but the env, the budget and the seed: what a new user's first run gets.

    python benchmarks/pipeline_defaults.py                               # CartPole-v1, 200k steps, seeds 101-103
    python benchmarks/pipeline_defaults.py --seeds 1 2 3 --out pipeline_defaults_tune -- --learning-rate 2.5e-3

Each run is ``frugalrl train pipeline-ppo --env ENV --total-timesteps STEPS --seed S`` (both stages on this
machine, gloo over loopback) with progress bar, TensorBoard and plots off, and any flags given after ``--``.
Reported per seed: the final evaluation (10 deterministic episodes through the pipeline), the wall time of the
command, env steps per second of training, and the training bytes per env step. Results:
``benchmarks/results/<out>.json``; per-run caches in ``benchmarks/results/pipeline_defaults/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
CACHE = RESULTS / "pipeline_defaults"


def run(env: str, steps: int, seed: int, flags: list[str], name: str) -> dict[str, Any]:
    """One CLI run; its summary's figures."""
    cmd = [sys.executable, "-m", "frugalrl.cli", "train", "pipeline-ppo", "--env", env, "--total-timesteps", str(steps),
           "--seed", str(seed), *flags, "--no-progress", "--no-tensorboard", "--no-plots",
           "--run-dir", str(CACHE / "runs"), "--run-name", name]
    shutil.rmtree(CACHE / "runs" / name, ignore_errors=True)  # a rerun's: frugalrl never writes over a run
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    s = json.loads((CACHE / "runs" / name / "summary.json").read_text())
    return {"env": env, "seed": seed, "flags": flags, "eval_return": s["eval_return_mean"],
            "eval_return_std": s["eval_return_std"], "train_return_last100": s["train_return_mean_last100"],
            "env_steps": s["env_steps"], "wall_seconds": wall, "train_seconds": s["train_seconds"],
            "steps_per_second": s["env_steps"] / s["train_seconds"], "bytes": s["bytes"]["total"],
            "bytes_per_env_step": s["bytes"]["total"] / s["env_steps"],
            "rollout_seconds": s["details"]["rollout_seconds"], "update_seconds": s["details"]["update_seconds"]}


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--seeds", nargs="+", type=int, default=[101, 102, 103])
    p.add_argument("--out", default="pipeline_defaults")
    p.add_argument("flags", nargs="*", help="more `frugalrl train pipeline-ppo` flags (after --)")
    args = p.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in args.seeds:
        name = f"{args.out}-{args.env.split(':')[-1]}-{args.steps}-s{seed}"
        path = CACHE / f"{name}.json"
        if not path.exists():
            path.write_text(json.dumps(run(args.env, args.steps, seed, args.flags, name), indent=1))
        r = json.loads(path.read_text())
        runs.append(r)
        print(f"seed {seed}: eval {r['eval_return']:.1f}, {r['wall_seconds']:.0f} s, {r['steps_per_second']:.0f} "
              f"steps/s, {r['bytes_per_env_step']:.0f} B/step", flush=True)
    command = " ".join(["python benchmarks/pipeline_defaults.py", *sys.argv[1:]])
    keys = ("eval_return", "wall_seconds", "steps_per_second", "bytes_per_env_step")
    summary = {k: float(np.mean([r[k] for r in runs])) for k in keys}
    out = {"command": command, "env": args.env, "steps": args.steps, "seeds": args.seeds, "flags": args.flags,
           "mean": summary, "min_eval_return": min(r["eval_return"] for r in runs), "runs": runs}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
