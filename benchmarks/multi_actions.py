"""MultiDiscrete and MultiBinary actions: frugalrl's PPO with no flags against Stable-Baselines3's PPO with its plain
defaults, same task, steps, seeds and evaluation, one after the other.

The task is ``tests/envs_for_tests.py``'s ``MatchEnv``: each step shows a random target (one-hot per sub-action, or
bits) and pays the share of the action's parts that match it, 8 steps an episode (a perfect policy returns 8). No
standard Gymnasium env has these action spaces; this one isolates what the issue is about, the distribution over
a structured action, from everything else. Variants: MultiDiscrete ``[3, 4, 2]`` (random policy: 2.9),
MultiDiscrete ``[6, 6, 6, 6]`` (1.3), MultiBinary ``6`` (4.0).

- ``frugal``: ``frugalrl.algos.ppo.train(make_config("ppo", ...))``, i.e. ``frugalrl train ppo --env
  envs_for_tests:MatchEnv --total-timesteps N --seed S``: the ``discrete`` family's fallback (SB3's PPO
  defaults on 2 workers), AAPS with bf16 delta-coded weights, torch on one thread.
- ``sb3``: ``PPO("MlpPolicy", make_vec_env(MatchEnv, n_envs=1, seed=S), seed=S)``, nothing else set; torch on one
  thread.
- Steps: each side's whole rollouts, the first to reach ``--steps`` or the last below it (frugalrl stops at the
  last whole iteration under the budget: 49,152 of 50,000 with 2 × 1,024-step fragments; SB3 runs past it:
  51,200 with 2,048-step rollouts); each row records its own.
- Evaluation: 10 deterministic episodes after training on a fresh env seeded 10000 + S + i (frugalrl's run
  evaluation; ``_sb3.evaluate_sb3`` for SB3). Wall time with start-up, in this process, one run at a time.

Example::

    python benchmarks/multi_actions.py --steps 50000 --seeds 101 102 103
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _commit import measured_commit

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # envs_for_tests
VARIANTS: dict[str, dict[str, Any]] = {
    "multidiscrete-3-4-2": {},
    "multidiscrete-6x4": {"nvec": [6, 6, 6, 6]},
    "multibinary-6": {"bits": 6},
}


def frugal(kwargs: dict[str, Any], steps: int, seed: int, run_dir: str) -> dict[str, Any]:
    from frugalrl.algos.ppo import train
    from frugalrl.presets import make_config

    t0 = time.perf_counter()
    # make_config applies what the CLI applies with no flags (the env's preset, else its family's fallback)
    out = train(make_config("ppo", "envs_for_tests:MatchEnv", env_kwargs=kwargs, total_timesteps=steps, seed=seed,
                            run_dir=run_dir, progress=False, plots=False, tensorboard=False))
    return {"return": out["eval_return_mean"], "wall_s": round(time.perf_counter() - t0, 2),
            "env_steps": out["env_steps"], "bytes_per_step": out["bytes"]["total"] / out["env_steps"]}


def sb3(kwargs: dict[str, Any], steps: int, seed: int) -> dict[str, Any]:
    from _sb3 import evaluate_sb3
    from envs_for_tests import MatchEnv
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from frugalrl.envs.spec import to_env_spec

    t0 = time.perf_counter()
    model = PPO("MlpPolicy", make_vec_env(MatchEnv, n_envs=1, seed=seed, env_kwargs=kwargs), seed=seed)
    model.learn(steps)
    wall = time.perf_counter() - t0
    mean, _ = evaluate_sb3(model, to_env_spec("envs_for_tests:MatchEnv", kwargs), seed, True, None)
    return {"return": mean, "wall_s": round(wall, 2), "env_steps": int(model.num_timesteps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--sides", nargs="+", default=["frugal", "sb3"], choices=["frugal", "sb3"])
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--seeds", nargs="+", type=int, default=[101, 102, 103])
    ap.add_argument("--run-dir", default="/tmp/frugalrl-multi-actions")
    ap.add_argument("--out", default="multi_actions")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    runs: list[dict[str, Any]] = []
    for variant in args.variants:
        for seed in args.seeds:
            for side in args.sides:
                kwargs = VARIANTS[variant]
                row = (frugal(kwargs, args.steps, seed, args.run_dir) if side == "frugal"
                       else sb3(kwargs, args.steps, seed))
                runs.append({"variant": variant, "side": side, "seed": seed, **row})
                print(json.dumps(runs[-1]), flush=True)
    table: dict[str, dict[str, Any]] = {}
    for variant in args.variants:
        cells = {}
        for side in args.sides:
            got = [r["return"] for r in runs if r["variant"] == variant and r["side"] == side]
            walls = [r["wall_s"] for r in runs if r["variant"] == variant and r["side"] == side]
            cells[side] = {"mean": statistics.mean(got), "std": statistics.stdev(got) if len(got) > 1 else 0.0,
                           "per_seed": got, "wall_s_mean": statistics.mean(walls)}
        if {"frugal", "sb3"} <= set(cells):
            cells["return_vs_sb3"] = cells["frugal"]["mean"] / cells["sb3"]["mean"]
        table[variant] = cells
    out = {"command": "python benchmarks/multi_actions.py " + " ".join(sys.argv[1:]), "commit": measured_commit(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"cpus": os.cpu_count(), "python":
                                                               platform.python_version()},
           "torch_threads": 1, "steps": args.steps, "seeds": args.seeds, "table": table, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
