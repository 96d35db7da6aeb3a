"""Benchmark: the AAPS δ sweep of the ClusterEnv paper, on LunarLander-v3 with 4 workers.

δ ∈ {0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 0.8, 1.0} plus EveryUpdate: final return, syncs per worker,
weight bytes. Target (issue 2): at δ=0.05, ≥ 5× fewer weight bytes than EveryUpdate with a final
return within 10%.

    python benchmarks/aaps_sweep.py                      # 1 seed × 1M steps per setting
    python benchmarks/aaps_sweep.py --steps 300000       # shorter
    python benchmarks/aaps_sweep.py --deltas 0.05 --seeds 1 2 3 --out aaps_3seeds   # the target, 3 seeds

Writes benchmarks/results/aaps_sweep.json, a Markdown table, and aaps_sweep.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _ppo_runs import LUNAR, RESULTS, run_or_load  # noqa: E402

DELTAS = [0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 0.8, 1.0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deltas", type=float, nargs="+", default=DELTAS)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--force", action="store_true")
    p.add_argument("--out", default="aaps_sweep", help="name of the JSON/PNG files under benchmarks/results")
    args = p.parse_args()

    settings = [("every", None)] + [("aaps", d) for d in args.deltas]
    table = []
    for sync, delta in settings:
        summaries = []
        for seed in args.seeds:
            cfg = replace(LUNAR, seed=seed, total_timesteps=args.steps, sync=sync, kl_threshold=delta or 0.05)
            summaries.append(run_or_load(cfg, RESULTS / "ppo_runs", force=args.force))
        per_worker = np.mean([s["weight_syncs"]["per_worker"] for s in summaries], axis=0)
        table.append({
            "sync": "EveryUpdate" if sync == "every" else f"AAPS δ={delta:g}",
            "delta": delta,
            "final_eval_return": float(np.mean([s["eval_return_mean"] for s in summaries])),
            "final_train_return": float(np.mean([s["train_return_mean_last100"] for s in summaries])),
            "syncs_per_worker": per_worker.tolist(),
            "syncs_per_worker_mean": float(per_worker.mean()),
            "weight_bytes": float(np.mean([s["bytes"]["weights"] for s in summaries])),
            "total_bytes": float(np.mean([s["bytes"]["total"] for s in summaries])),
            "policy_lag_mean": float(np.mean([s["policy_lag_mean"] for s in summaries])),
            "wall_seconds": float(np.mean([s["wall_seconds"] for s in summaries])),
            "runs": [s["run_dir"] for s in summaries],
        })
    base = table[0]
    for row in table:
        row["weight_bytes_ratio_vs_every"] = base["weight_bytes"] / max(row["weight_bytes"], 1)
        row["return_vs_every"] = row["final_eval_return"] / base["final_eval_return"] if base["final_eval_return"] else None
    out = {"command": "python " + " ".join(sys.argv), "steps": args.steps, "seeds": args.seeds, "rows": table}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2))

    print("\n| sync | final eval return | train return (last 100) | syncs / worker | weight MB | ×fewer weight bytes | lag |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['sync']} | {r['final_eval_return']:.1f} | {r['final_train_return']:.1f} | {r['syncs_per_worker_mean']:.1f} | "
              f"{r['weight_bytes'] / 1e6:.2f} | {r['weight_bytes_ratio_vs_every']:.1f} | {r['policy_lag_mean']:.2f} |")
    _plot(table, RESULTS / f"{args.out}.png")


def _plot(table: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [r["sync"].replace("AAPS ", "") for r in table]
    axes[0].bar(labels, [r["syncs_per_worker_mean"] for r in table])
    axes[0].set_ylabel("weight syncs per worker")
    axes[0].tick_params(axis="x", rotation=45)
    axes[1].bar(labels, [r["final_eval_return"] for r in table], color="tab:green")
    axes[1].set_ylabel("final evaluation return")
    axes[1].tick_params(axis="x", rotation=45)
    fig.suptitle("AAPS sweep on LunarLander-v3 (4 workers)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
