"""AcceRL training with and without a compressed actor policy: wall time to a target return, 3 seeds.

    python benchmarks/accerl_training.py                       # CartPole-v1, target 475, seeds 1 2 3
    python benchmarks/accerl_training.py --env LunarLander-v3 --target 200 --total-timesteps 1500000
    python benchmarks/accerl_training.py --compress int8,onnx --out accerl_cartpole

Each run is ``frugalrl train impala`` in a fresh interpreter (one at a time, so runs do not share
CPUs). Wall time to target is the training time (evaluations excluded) at the first evaluation whose
mean return reaches the target. The compressed runs use the same learner, correctors and budget;
only the actors' policy differs. Results go to ``benchmarks/results/<out>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from _ppo_runs import config_flags

from frugalrl.algos.impala import IMPALAConfig

RESULTS = Path(__file__).parent / "results"


def run(cfg: IMPALAConfig, cache: Path, force: bool) -> dict:
    """Train ``cfg`` unless its summary is cached; return the summary."""
    cache.mkdir(parents=True, exist_ok=True)
    tag = cfg.compress.replace(":", "").replace(",", "-") or "none"
    name = f"{cfg.env}-{tag}-t{cfg.total_timesteps}-s{cfg.seed}"
    path = cache / f"{name}.json"
    if path.exists() and not force:
        return json.loads(path.read_text())
    cfg = replace(cfg, run_dir=str(RESULTS / "runs"), run_name=name)
    shutil.rmtree(RESULTS / "runs" / name, ignore_errors=True)  # a rerun's: frugalrl never writes over a run
    t0 = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] training {name} ...", flush=True)
    subprocess.run([sys.executable, "-m", "frugalrl.cli", "train", "impala", *config_flags(cfg)], check=True,
                   stdout=subprocess.DEVNULL)
    summary = json.loads((Path(cfg.run_dir) / name / "summary.json").read_text())
    summary["config"] = asdict(cfg)
    path.write_text(json.dumps(summary, indent=2))
    print(f"[{time.strftime('%H:%M:%S')}] {name}: eval {summary['eval_return_mean']:.1f}, "
          f"train {summary['train_seconds']:.0f} s (total {time.time() - t0:.0f} s)", flush=True)
    return summary


def time_to_target(summary: dict, target: float) -> tuple[int | None, float | None]:
    """(env steps, training seconds) at the first evaluation reaching ``target``; None if never."""
    for e in summary["eval_history"]:
        if e["mean"] >= target:
            return e["step"], e["seconds"]
    return None, None


def main() -> None:
    """Run the comparison and print a table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--total-timesteps", type=int, default=300_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--compress", default="int8,onnx", help="the compressed variant's chain")
    p.add_argument("--extra", default="{}", help="JSON of further IMPALAConfig fields for both variants")
    p.add_argument("--out", default="accerl_training")
    p.add_argument("--force", action="store_true")
    args = p.parse_args()

    settings = dict(env=args.env, total_timesteps=args.total_timesteps, eval_every=10, eval_episodes=10,
                    target_return=args.target, progress=False, tensorboard=False, plots=False,
                    sync="every", weights_codec="fp32")  # the defaults these results were measured with
    settings.update(json.loads(args.extra))
    base = IMPALAConfig(**settings)
    cache = RESULTS / "runs_cache" / args.out
    rows = []
    for compress in ("", args.compress):
        for seed in args.seeds:
            s = run(replace(base, compress=compress, seed=seed), cache, args.force)
            steps, seconds = time_to_target(s, args.target)
            rows.append({
                "compress": compress or "none", "seed": seed, "steps_to_target": steps, "seconds_to_target": seconds,
                "final_return": s["eval_return_mean"], "train_seconds": s["train_seconds"],
                "sps": s["steps_per_second"], "weight_bytes": s["bytes"]["weights"], "total_bytes": s["bytes"]["total"],
                "syncs": s["weight_syncs"]["total"], "compress_builds": s["details"]["compress_builds"],
                "compress_seconds": s["details"]["compress_seconds"],
            })
    print(f"\n{args.env}, target {args.target}, {args.total_timesteps} steps max\n")
    print("| actors | seed | steps to target | s to target | final return | steps/s | weight MB | builds |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['compress']} | {r['seed']} | {r['steps_to_target']} | {r['seconds_to_target']} | "
              f"{r['final_return']:.1f} | {r['sps']:.0f} | {r['weight_bytes'] / 1e6:.2f} | {r['compress_builds']} |")
    agg = {}
    for variant in ("none", args.compress):
        sel = [r for r in rows if r["compress"] == variant]
        reached = [r["seconds_to_target"] for r in sel if r["seconds_to_target"] is not None]
        agg[variant] = {
            "reached": f"{len(reached)}/{len(sel)}",
            "median_seconds_to_target": float(np.median(reached)) if reached else None,
            "mean_final_return": float(np.mean([r["final_return"] for r in sel])),
            "median_sps": float(np.median([r["sps"] for r in sel])),
        }
        print(f"{variant}: reached {agg[variant]['reached']}, median s to target "
              f"{agg[variant]['median_seconds_to_target']}, mean final {agg[variant]['mean_final_return']:.1f}, "
              f"median steps/s {agg[variant]['median_sps']:.0f}")
    a, b = agg["none"], agg[args.compress]
    if a["median_seconds_to_target"] and b["median_seconds_to_target"]:
        print(f"time ratio compressed/none: {b['median_seconds_to_target'] / a['median_seconds_to_target']:.2f}")
    out = {"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
           "config": asdict(base), "rows": rows, "aggregate": agg}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
