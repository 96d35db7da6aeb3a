"""Split-model PPO on CarRacing-v3: return and wire bytes for dense vs sparse cut gradients, 3 seeds.

    python benchmarks/pipeline_carracing.py                         # dense, p=0.9, p=0.99; seeds 1 2 3
    python benchmarks/pipeline_carracing.py --total-timesteps 409600 --num-envs 8 --num-steps 512 \\
        --update-epochs 10 --num-minibatches 32 --warmup-timesteps 30000   # the paper's budget (hours)

Every variant runs the same steps with the same seeds; only the cut-gradient codec differs. Variants:
``dense`` (fp32 gradients), ``p0.9`` / ``p0.99`` (the paper's TopPercentile with its accumulator,
``auto`` index encoding, bf16 values, dense warm start), and optionally ``p0.9-none`` (no error
feedback) and ``p0.99-sa`` (p=0.99 plus lossless sparse activations: only the non-zero ReLU features).
Activations travel bf16 in every variant. Two runs go at a time (each is two processes).
The return of a run is the mean of its last 10 training episodes (the paper plots training returns).
Results: ``benchmarks/results/pipeline_carracing.json`` and ``.png`` (return curves).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from frugalrl.pipeline import PipelinePPOConfig, train
from frugalrl.presets import make_config

RESULTS = Path(__file__).parent / "results"
VARIANTS = {
    "dense": {"cut": "dense"},
    "p0.9": {"cut": "topk", "cut_percentile": 0.9},
    "p0.99": {"cut": "topk", "cut_percentile": 0.99},
    "p0.9-none": {"cut": "topk", "cut_percentile": 0.9, "cut_accumulate": "none"},
    "p0.99-none": {"cut": "topk", "cut_percentile": 0.99, "cut_accumulate": "none"},
    "p0.99-sa": {"cut": "topk", "cut_percentile": 0.99, "activations_sparse": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="dense,p0.9,p0.99")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--total-timesteps", type=int, default=20_480)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=256)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--num-minibatches", type=int, default=8)
    parser.add_argument("--warmup-timesteps", type=int, default=2048)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--out", default="pipeline_carracing")
    parser.add_argument("--merge", action="store_true", help="add these variants to an existing results file")
    args = parser.parse_args()

    # The CarRacing preset (the paper's settings: heads of 512, lr not annealed ...), then these flags.
    base: PipelinePPOConfig = make_config(
        "pipeline-ppo", PipelinePPOConfig.env, total_timesteps=args.total_timesteps, num_envs=args.num_envs,
        num_steps=args.num_steps, update_epochs=args.update_epochs, num_minibatches=args.num_minibatches,
        warmup_timesteps=args.warmup_timesteps, learning_rate=args.learning_rate,
        run_dir=str(RESULTS / "runs"), progress=False, tensorboard=False, plots=False)
    jobs = [(v, int(s)) for s in args.seeds.split(",") for v in args.variants.split(",")]
    results: dict[str, dict[int, dict]] = {v: {} for v in args.variants.split(",")}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not jobs:
                    return
                variant, seed = jobs.pop(0)
            cfg = replace(base, seed=seed, run_name=f"carracing-{variant}-t{args.total_timesteps}-s{seed}",
                          **VARIANTS[variant])
            shutil.rmtree(RESULTS / "runs" / cfg.run_name, ignore_errors=True)  # frugalrl never writes over a run
            t0 = time.monotonic()
            summary = train(cfg)
            print(f"{variant:10s} seed {seed}: return {summary['eval_return_mean']:8.1f}  "
                  f"bytes {summary['bytes']['total'] / 1e6:9.1f} MB  gradients {summary['bytes']['gradients'] / 1e6:8.1f} MB"
                  f"  {time.monotonic() - t0:6.0f} s", flush=True)
            with lock:
                results[variant][seed] = summary

    threads = [threading.Thread(target=worker) for _ in range(args.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    path = RESULTS / f"{args.out}.json"
    if args.merge and path.exists():
        for variant, runs in json.loads(path.read_text())["runs"].items():
            if variant not in results:
                results[variant] = {int(seed): r for seed, r in runs.items()}
    table = {}
    dense = results.get("dense", {})
    for variant, runs in results.items():
        rets = [r["eval_return_mean"] for r in runs.values()]
        row = {
            "return_mean": float(np.mean(rets)), "return_per_seed": rets,
            "total_bytes": float(np.mean([r["bytes"]["total"] for r in runs.values()])),
            "gradient_bytes": float(np.mean([r["bytes"]["gradients"] for r in runs.values()])),
            "activation_bytes": float(np.mean([r["bytes"]["activations"] for r in runs.values()])),
            "iteration_seconds_median": float(np.median([np.median(r["details"]["iteration_seconds"]) for r in runs.values()])),
        }
        if dense:
            d_total = np.mean([r["bytes"]["total"] for r in dense.values()])
            d_grad = np.mean([r["bytes"]["gradients"] for r in dense.values()])
            row["total_vs_dense"] = row["total_bytes"] / d_total
            row["gradients_vs_dense"] = row["gradient_bytes"] / d_grad
        table[variant] = row
    print(f"\n{'variant':12s} {'return':>16s} {'total MB':>10s} {'grad MB':>9s} {'total/dense':>11s} {'grad/dense':>10s}")
    for v, row in table.items():
        print(f"{v:12s} {row['return_mean']:8.1f} ± {np.std(row['return_per_seed'], ddof=1) if len(row['return_per_seed']) > 1 else 0.0:5.1f} "
              f"{row['total_bytes'] / 1e6:10.1f} {row['gradient_bytes'] / 1e6:9.1f} "
              f"{row.get('total_vs_dense', float('nan')):11.3f} {row.get('gradients_vs_dense', float('nan')):10.4f}")
    out = {
        "command": "python benchmarks/pipeline_carracing.py " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                                        for k, v in vars(args).items()),
        "machine": platform.processor() or platform.machine(),
        "config": asdict(base),
        "table": table,
        "runs": {v: {str(s): {**{k: r[k] for k in ("eval_return_mean", "bytes", "wall_seconds", "episodes")},
                              **{k: r["details"][k] for k in ("return_curve", "iteration_seconds")}}
                     for s, r in runs.items()} for v, runs in results.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    _plot(results, RESULTS / f"{args.out}.png")


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (variant, runs), color in zip(results.items(), ("k", "tab:blue", "tab:orange", "tab:green", "tab:red"),
                                      strict=False):
        for i, r in enumerate(runs.values()):
            curve = np.asarray(r["details"]["return_curve"])
            if len(curve):
                ax.plot(curve[:, 0], curve[:, 2], color=color, alpha=0.7, label=variant if i == 0 else None)
    ax.set_xlabel("env steps")
    ax.set_ylabel("training episode return")
    ax.set_title("Split-model PPO on CarRacing-v3: dense vs sparse cut gradients")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
