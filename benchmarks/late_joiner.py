"""What one round of an HSA2C worker that joins a run in progress does to a trained policy.

A replacement worker, and every worker of a resumed run, starts with fresh RMSProp statistics and a fresh reward
scaler, and the server applies its first round to the policy everyone pulls. For each ``--seeds`` seed: a
"steady" A2C process runs 30 rounds of ``local_steps`` steps from the trained weights ``v`` (its statistics warm,
the rounds not kept), then one more round, ``v + Δ``, is scored; a new process (told the same global update, as
a late joiner is) runs its first round from ``v``, scored alike. Scores are greedy returns on ``--episodes``
fixed-seed episodes. Run it at two commits to compare (``PYTHONPATH``); without ``--checkpoint`` it first
trains HSA2C with its defaults (``--train-steps``) for the policy::

    python benchmarks/late_joiner.py --label after --out late_joiner
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _commit import measured_commit

from frugalrl.algos.hsa2c import A2CProblem, HSA2CConfig, train

RESULTS = Path(__file__).parent / "results"
WARM_ROUNDS, GLOBAL_UPDATE = 30, 400


def _trained(env: str, steps: int, seed: int) -> str:
    run_dir = tempfile.mkdtemp(prefix="late_joiner_")
    cfg = HSA2CConfig(env=env, total_timesteps=steps, seed=seed, run_dir=run_dir, run_name="run", progress=False,
                      tensorboard=False, plots=False)
    train(cfg)
    return str(Path(run_dir) / "run" / "checkpoints" / "latest.pt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="LunarLander-v3")
    ap.add_argument("--checkpoint", help="an HSA2C run's checkpoint (latest.pt) of --env; default: train one")
    ap.add_argument("--train-steps", type=int, default=1_000_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--label", required=True, help="this side's key in the JSON (e.g. before, after)")
    ap.add_argument("--out", default="late_joiner")
    args = ap.parse_args()
    torch.set_num_threads(1)
    checkpoint = args.checkpoint or _trained(args.env, args.train_steps, 1)
    cfg = HSA2CConfig(env=args.env, seed=1, total_timesteps=args.train_steps)
    state = torch.load(checkpoint, weights_only=False)["parts"]["agent"]

    def problem() -> A2CProblem:
        p = A2CProblem(cfg)
        p.agent.load_state_dict(state)
        return p

    scorer = problem()
    v = scorer.flat()

    def one_round(p: A2CProblem, rng: np.random.Generator) -> np.ndarray:
        p.set_rate(cfg.eta)
        p.set_version(GLOBAL_UPDATE)
        u = v.copy()
        for _ in range(cfg.local_steps):
            u -= cfg.eta * p.stochastic_grad(u, rng)
        return u

    def score(params: np.ndarray) -> float:
        scorer.load(params)
        return float(scorer.evaluate(args.episodes))

    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        steady = problem()
        for _ in range(WARM_ROUNDS):
            one_round(steady, rng)
        u_steady = one_round(steady, rng)
        u_joiner = one_round(problem(), rng)
        n = scorer.n_params
        rows.append({"seed": seed, "steady": score(u_steady), "joiner": score(u_joiner),
                     "steady_norm": float(np.linalg.norm((u_steady - v)[:n])),
                     "joiner_norm": float(np.linalg.norm((u_joiner - v)[:n]))})
        print(f"seed {seed}: after a steady worker's round {rows[-1]['steady']:.1f}, after a joiner's first round "
              f"{rows[-1]['joiner']:.1f} (|Δ| {rows[-1]['steady_norm']:.3f} and {rows[-1]['joiner_norm']:.3f})")
    side = {"commit": measured_commit(), "trained": score(v), "rows": rows}
    for key in ("steady", "joiner"):
        values = [r[key] for r in rows]
        side[key] = {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    print(f"trained {side['trained']:.1f}; steady {side['steady']['mean']:.1f} ± {side['steady']['std']:.1f}, "
          f"joiner {side['joiner']['mean']:.1f} ± {side['joiner']['std']:.1f}")
    out = RESULTS / f"{args.out}.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data.update({"env": args.env, "checkpoint": checkpoint, "episodes": args.episodes, "seeds": args.seeds,
                 "command": f"python benchmarks/late_joiner.py --label {args.label} --out {args.out}"})
    data.setdefault("sides", {})[args.label] = side
    out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
