"""Benchmark: PPO through ClusterEnv (local backend, AAPS δ=0.05) on LunarLander-v3, 3 seeds, 1M steps.

Target (issue 2): evaluation mean ≥ 200 within 1M steps, for every seed; wall time reported.

    python benchmarks/ppo_lunarlander.py                # 3 seeds × 1M steps (~5 min a seed on 2 cores)
    python benchmarks/ppo_lunarlander.py --steps 200000 --seeds 1   # a quick look

Writes benchmarks/results/ppo_lunarlander.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _ppo_runs import LUNAR, RESULTS, run_or_load, time_to_target  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--sync", default="aaps")
    p.add_argument("--kl-threshold", type=float, default=0.05)
    p.add_argument("--target", type=float, default=200.0)
    p.add_argument("--force", action="store_true", help="retrain even if a cached summary exists")
    args = p.parse_args()

    rows = []
    for seed in args.seeds:
        cfg = replace(LUNAR, seed=seed, total_timesteps=args.steps, sync=args.sync, kl_threshold=args.kl_threshold)
        s = run_or_load(cfg, RESULTS / "ppo_runs", force=args.force)
        step, secs = time_to_target(s, args.target)
        rows.append({
            "seed": seed,
            "eval_return_mean": s["eval_return_mean"],
            "eval_return_std": s["eval_return_std"],
            "best_eval": max(e["mean"] for e in s["eval_history"]),
            "steps_to_target": step,
            "seconds_to_target": secs,
            "env_steps": s["env_steps"],
            "wall_seconds": s["wall_seconds"],
            "weight_syncs": s["weight_syncs"]["total"],
            "bytes_total": s["bytes"]["total"],
        })
    finals = [r["eval_return_mean"] for r in rows]
    out = {
        "command": "python " + " ".join(sys.argv),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version()},
        "target": args.target,
        "rows": rows,
        "final_eval_mean_over_seeds": float(np.mean(finals)),
        "all_seeds_reached_target": all(r["steps_to_target"] is not None for r in rows),
    }
    (RESULTS / "ppo_lunarlander.json").write_text(json.dumps(out, indent=2))
    t = f"{args.target:g}"
    print(f"\n| seed | final eval | best eval | steps to ≥{t} | s to ≥{t} | wall s | syncs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['eval_return_mean']:.1f} ± {r['eval_return_std']:.1f} | {r['best_eval']:.1f} | "
              f"{r['steps_to_target']} | {r['seconds_to_target']} | {r['wall_seconds']:.0f} | {r['weight_syncs']} |")


if __name__ == "__main__":
    main()
