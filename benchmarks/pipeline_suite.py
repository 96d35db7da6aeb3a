"""Split-model PPO on the learning suite's vector envs: dense vs sparse cut gradients, and the accumulator question.

    python benchmarks/pipeline_suite.py                      # dense, p=0.9, p=0.99 on every vector env, 3 seeds
    python benchmarks/pipeline_suite.py --study accumulator  # position / sample / none at p=0.99, 3 seeds
    python benchmarks/pipeline_suite.py --report

Both stages run on this machine (two processes, gloo over loopback), with each env's PPO preset
(``frugalrl/presets/ppo.json``: envs, steps, epochs, minibatches, rates, normalisation) and an encoder of the
preset's hidden widths; the heads have one hidden layer of 64 units. Cut gradients: ``dense`` (fp32), or
the top-percentile rule at p = 0.9 / 0.99 (``auto`` index coding, bf16 values, dense during a warm start:
``WARMUP`` steps, else the paper's 30,000) with the accumulator ``--accumulate`` (default: PipelinePPOConfig's).
Where the preset would make a pipeline run too slow here, ``PIPELINE_OVERRIDES`` says what differs. Evaluation: 10
deterministic episodes through the pipeline every tenth of the run and at the end. Budgets are reduced to fit
2 CPUs (``STEPS``). Results: ``benchmarks/results/pipeline_suite.json`` / ``.md``, per-run caches in
``benchmarks/results/pipeline_suite/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np

from frugalrl import presets
from frugalrl.pipeline import PipelinePPOConfig, train

RESULTS = Path(__file__).parent / "results"
CACHE = RESULTS / "pipeline_suite"
STEPS = {"CartPole-v1": 40_960, "MountainCar-v0": 300_000, "LunarLander-v3": 500_000,
         "LunarLanderContinuous-v3": 500_000, "BipedalWalker-v3": 500_000, "HalfCheetah-v5": 200_000,
         "Walker2d-v5": 200_000}
# Where the PPO preset makes a pipeline run too slow here, the fields that differ. A pipeline iteration costs a
# round trip between the stages per env step and per minibatch: CartPole's zoo preset (20 epochs of one
# 256-sample minibatch on 8 × 32 steps) took 7.7 min for 100k steps, so CartPole runs the CI learning test's
# setting (8 × 128 steps, 4 epochs of 4 minibatches, lr 2.5e-3 annealed).
PIPELINE_OVERRIDES: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"num_steps": 128, "num_minibatches": 4, "update_epochs": 4, "learning_rate": 2.5e-3,
                    "anneal_lr": True, "anneal_clip": False, "gamma": 0.99, "gae_lambda": 0.95},
}
# Dense cut gradients during the first WARMUP env steps (the paper: 30,000 of millions); a sixth of the run
# here, so that the sparse phase is most of it.
WARMUP = {"CartPole-v1": 10_240}
CUTS: dict[str, dict[str, Any]] = {
    "dense": {"cut": "dense", "cut_dense_dtype": "fp32"},
    "p0.9": {"cut": "topk", "cut_percentile": 0.9},
    "p0.99": {"cut": "topk", "cut_percentile": 0.99},
}
ACCUMULATORS = ("position", "sample", "none")


def config(env: str, cut: str, seed: int, accumulate: str | None) -> PipelinePPOConfig:
    """The pipeline config for ``env``: its PPO preset's shared fields, the cut variant, this budget."""
    values, _ = presets.resolve("ppo", env)
    names = {f.name for f in fields(PipelinePPOConfig)}
    shared = {k: v for k, v in values.items() if k in names and k != "total_timesteps"}
    shared["num_envs"] = values.get("workers", 2) * values.get("envs_per_worker", 4)
    shared["encoder_hidden"] = values.get("hidden", [64, 64])
    shared.update(PIPELINE_OVERRIDES.get(env, {}))
    if env in WARMUP:
        shared["warmup_timesteps"] = WARMUP[env]
    steps = STEPS[env]
    iterations = steps // (shared["num_envs"] * shared["num_steps"])
    extra = {} if accumulate is None else {"cut_accumulate": accumulate}
    return PipelinePPOConfig(**{**shared, **CUTS[cut], **extra}, env=env, seed=seed, total_timesteps=steps,
                             head_hidden=64, eval_every=max(1, iterations // 10), eval_episodes=10,
                             cut_index="auto", run_dir=str(CACHE / "runs"),
                             run_name=f"{env}-{cut}-{accumulate or 'default'}-s{seed}",
                             progress=False, tensorboard=False, plots=False)


def run(env: str, cut: str, seed: int, accumulate: str | None) -> dict[str, Any]:
    cfg = config(env, cut, seed, accumulate)
    shutil.rmtree(Path(cfg.run_dir) / cfg.run_name, ignore_errors=True)  # a rerun's: frugalrl never writes over a run
    t0 = time.monotonic()
    s = train(cfg)
    return {"env": env, "cut": cut, "accumulate": cfg.cut_accumulate, "seed": seed, "config": asdict(cfg),
            "final_return": s["eval_return_mean"], "final_return_std": s["eval_return_std"],
            "eval_history": s["eval_history"], "train_return_last100": s["train_return_mean_last100"],
            "train_seconds": s["train_seconds"], "wall_seconds": time.monotonic() - t0,
            "bytes": {k: v for k, v in s["bytes"].items() if isinstance(v, int)}, "env_steps": s["env_steps"]}


def table(results: list[dict[str, Any]], study: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for env in STEPS:
        rows: dict[str, Any] = {}
        for r in results:
            if r["env"] != env:
                continue
            name = r["cut"] if study == "cuts" else r["accumulate"]
            rows.setdefault(name, []).append(r)
        if not rows:
            continue
        agg = {name: {"seeds": [r["seed"] for r in rs], "final_return_mean": float(np.mean([r["final_return"] for r in rs])),
                      "final_return_std": float(np.std([r["final_return"] for r in rs], ddof=1)) if len(rs) > 1 else 0.0,
                      "final_return_per_seed": [r["final_return"] for r in rs],
                      "gradient_bytes_mean": float(np.mean([r["bytes"].get("gradients", 0) for r in rs])),
                      "total_bytes_mean": float(np.mean([r["bytes"].get("total", 0) for r in rs])),
                      "train_seconds_mean": float(np.mean([r["train_seconds"] for r in rs]))}
               for name, rs in rows.items()}
        base = agg.get("dense") or agg.get("position")
        for a in agg.values():
            if base is not None:
                a["gradients_vs_base"] = a["gradient_bytes_mean"] / base["gradient_bytes_mean"]
                span = abs(base["final_return_mean"]) or 1.0
                a["return_gap_vs_base"] = (a["final_return_mean"] - base["final_return_mean"]) / span
        out[env] = {"steps": STEPS[env], "variants": agg}
    return out


def markdown(tab: dict[str, Any], command: str, study: str) -> str:
    first = "cut gradients" if study == "cuts" else "accumulator (p = 0.99)"
    lines = [f"`{command}`", "", f"| env (steps) | {first} | final return (mean ± std) | per seed | vs "
             f"{'dense' if study == 'cuts' else 'position'} | gradient MB | × gradients | total MB | train s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for env, entry in tab.items():
        for name, a in entry["variants"].items():
            seeds = ", ".join(f"{v:.0f}" for v in a["final_return_per_seed"])
            lines.append(f"| {env} ({entry['steps'] / 1e3:.0f}k) | {name} | {a['final_return_mean']:.1f} ± "
                         f"{a['final_return_std']:.1f} | {seeds} | {a.get('return_gap_vs_base', 0):+.1%} | "
                         f"{a['gradient_bytes_mean'] / 1e6:.1f} | {a.get('gradients_vs_base', 1):.3f} | "
                         f"{a['total_bytes_mean'] / 1e6:.1f} | {a['train_seconds_mean']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--study", choices=("cuts", "accumulator"), default="cuts")
    p.add_argument("--envs", nargs="+", default=None, choices=list(STEPS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--accumulate", choices=ACCUMULATORS, default=None,
                   help="the accumulator of the sparse variants (default: PipelinePPOConfig's)")
    p.add_argument("--report", action="store_true")
    p.add_argument("--cuts", nargs="+", default=list(CUTS), choices=list(CUTS), help="cut-gradient variants")
    p.add_argument("--steps", type=int, default=None, help="env steps of every run (default: each env's, STEPS)")
    p.add_argument("--out", default=None, help="name of the JSON/MD under benchmarks/results (default: the study's)")
    p.add_argument("--cache", default=None, help="directory of the per-run caches (default: results/pipeline_suite)")
    args = p.parse_args()
    global CACHE
    if args.cache:
        CACHE = Path(args.cache)
    if args.steps:
        STEPS.update({env: args.steps for env in STEPS})
    CACHE.mkdir(parents=True, exist_ok=True)
    envs = args.envs or (list(STEPS) if args.study == "cuts" else ["CartPole-v1", "LunarLander-v3"])
    jobs = ([(env, cut, args.accumulate) for env in envs for cut in args.cuts] if args.study == "cuts"
            else [(env, "p0.99", acc) for env in envs for acc in ACCUMULATORS])
    if not args.report:
        for seed in args.seeds:
            for env, cut, acc in jobs:
                path = CACHE / f"{args.study}-{env}-{cut}-{acc or 'default'}-s{seed}.json"
                if path.exists():
                    continue
                out = run(env, cut, seed, acc)
                path.write_text(json.dumps(out, indent=1))
                print(f"[{time.strftime('%H:%M:%S')}] {env} {cut} {out['accumulate']} seed {seed}: "
                      f"{out['final_return']:.1f} ({out['wall_seconds']:.0f} s)", flush=True)
    results = [json.loads(q.read_text()) for q in sorted(CACHE.glob(f"{args.study}-*.json"))]
    tab = table(results, args.study)
    command = "python benchmarks/pipeline_suite.py " + " ".join(sys.argv[1:])
    stem = args.out or ("pipeline_suite" if args.study == "cuts" else "pipeline_accumulator")
    (RESULTS / f"{stem}.json").parent.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"command": command, "steps": STEPS, "table": tab,
                                                      "runs": results}, indent=1))
    (RESULTS / f"{stem}.md").write_text(markdown(tab, command, args.study))
    print(markdown(tab, command, args.study))
    return 0


if __name__ == "__main__":
    sys.exit(main())
