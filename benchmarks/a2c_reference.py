"""HSA2C's A2C against Stable-Baselines3's A2C with rl-baselines3-zoo's hyperparameters, at equal env steps.

    python benchmarks/a2c_reference.py                       # LunarLander-v3, 200k steps (rl-zoo's budget), 3 seeds
    python benchmarks/a2c_reference.py --steps 1000000 --seeds 1 --out a2c_reference_1m

The question is whether frugalrl's A2C learns as much per env step as a reference library. Variants, every one
run for ``--steps`` env steps and scored by frugalrl's evaluation protocol (10 greedy / deterministic episodes on
envs seeded ``EVAL_SEED + seed + i``):

- ``sb3-zoo``: ``stable_baselines3.A2C`` with rl-zoo's ``LunarLander-v2`` entry (``ZOO`` below: 8 envs, 5-step
  rollouts, γ 0.995, linear learning rate from 8.3e-4, entropy 1e-5; SB3's defaults otherwise: RMSprop with
  α 0.99, ε 1e-5, gradient norm 0.5, value coefficient 0.5, separate 64-64 tanh networks, orthogonal init);
- ``a2c-zoo``: frugalrl's A2C (:class:`~frugalrl.algos.hsa2c.A2CProblem`) with the same settings, as one
  DPSGD worker with one process, B = 1 and Alg. 1's plain master step (ρ = 1, no momentum, no averaging, no
  reward scaling), and ``vf_coef`` 1 (frugalrl's value loss is ½ MSE, SB3's MSE): the same algorithm as SB3's
  (``tests/test_a2c_sb3_replay.py`` checks the update is SB3's, weight for weight), so the two differ only by
  their random draws;
- ``hsa2c`` and ``a3c``: ``hsa2c_vs_sync``'s LunarLander runs (2 workers, HSA2C's defaults and the env's
  settings; B = 10 and B = 1), so a gap between these and ``a2c-zoo`` is the cost of those defaults.

Results: ``benchmarks/results/<out>.json`` and ``.md`` (``--out``, default ``a2c_reference``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np
from dpsgd_speedup import _fmt, hsa2c_run, save_results, timed_hsa2c
from hsa2c_vs_sync import ENVS
from learning_suite import evaluate_sb3

from frugalrl.envs.spec import to_env_spec

ENV = "LunarLander-v3"
ZOO: dict[str, Any] = {  # rl-baselines3-zoo hyperparams/a2c.yml, LunarLander-v2 (n_timesteps 2e5)
    "n_envs": 8, "gamma": 0.995, "n_steps": 5, "learning_rate": "lin_0.00083", "ent_coef": 0.00001,
}
VARIANTS = ("sb3-zoo", "a2c-zoo", "hsa2c", "a3c")


def sb3_run(seed: int, steps: int) -> dict[str, Any]:
    """SB3's A2C with ``ZOO``; its final deterministic return on frugalrl's evaluation episodes."""
    import stable_baselines3
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    hp = dict(ZOO)
    start = float(hp.pop("learning_rate")[4:])
    env_spec = to_env_spec(ENV)
    venv = make_vec_env(env_spec.make, n_envs=hp.pop("n_envs"), seed=seed)
    model = A2C("MlpPolicy", venv, seed=seed, device="cpu", learning_rate=lambda progress: progress * start, **hp)
    t0 = time.monotonic()
    model.learn(total_timesteps=steps)
    train_s = time.monotonic() - t0
    final, final_std = evaluate_sb3(model, env_spec, seed, True, None)
    return {"seed": seed, "final_eval_return": final, "final_eval_std": final_std, "env_steps": int(model.num_timesteps),
            "train_s": train_s, "sb3": stable_baselines3.__version__}


def frugal_run(variant: str, seed: int, steps: int, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """frugalrl's A2C as ``variant``; its final greedy return on the same evaluation episodes."""
    spec = ENVS[ENV]
    common = {"total_timesteps": steps, "seed": seed}
    if variant == "a2c-zoo":
        cfg = timed_hsa2c(ENV, 3600.0, 1e9, 1, workers=1, processes=1, local_steps=1, rho=1.0, momentum=0.0,
                          average=0.0, norm_reward=False, envs_per_process=ZOO["n_envs"], k=ZOO["n_steps"],
                          gamma=ZOO["gamma"], ent_coef=ZOO["ent_coef"], eta=float(ZOO["learning_rate"][4:]),
                          eta_anneal=1.0, vf_coef=1.0, **common)  # ½ MSE × 1 = SB3's MSE × 0.5
    else:
        cfg = timed_hsa2c(ENV, 3600.0, 1e9, 1, workers=2, processes=1, local_steps=10 if variant == "hsa2c" else 1,
                          **spec["settings"], **common)
    cfg = replace(cfg, deferred_eval=False, eval_every=10**9, eval_every_s=None, **(settings or {}))
    t0 = time.monotonic()
    rec = hsa2c_run(cfg, 0.0)
    return {"seed": seed, "final_eval_return": rec["final_eval_return"], "env_steps": rec["env_steps"],
            "train_s": rec["env_steps"] / rec["env_steps_per_s"], "wall_s": time.monotonic() - t0,
            "config": {k: getattr(cfg, k) for k in ("workers", "local_steps", "rho", "momentum", "average",
                                                     "norm_reward", "envs_per_process", "k", "gamma", "ent_coef",
                                                     "eta", "eta_anneal", "max_grad_norm", "vf_coef", "hidden")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--settings", default="{}", help="JSON of HSA2CConfig fields over every frugalrl variant")
    ap.add_argument("--out", default="a2c_reference")
    args = ap.parse_args(argv)
    started = time.time()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    settings = json.loads(args.settings)
    for seed in args.seeds:  # seed-major: the variants of one seed back to back
        for v in args.variants:
            r = sb3_run(seed, args.steps) if v == "sb3-zoo" else frugal_run(v, seed, args.steps, settings)
            runs[v].append(r)
            print(f"  {v} seed {seed}: final {r['final_eval_return']:.1f} after {r['env_steps']} steps, "
                  f"{_fmt(r['train_s'])} s", flush=True)
    rows = []
    for v, rs in runs.items():
        finals = [r["final_eval_return"] for r in rs]
        rows.append({"variant": v, "finals": finals, "mean": float(np.mean(finals)), "std": float(np.std(finals)),
                     "train_s_mean": float(np.mean([r["train_s"] for r in rs])), "runs": rs})
    lines = [f"| variant | final return at {args.steps:,} env steps (mean ± std) | per seed | train s (mean) |",
             "|---|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['mean']:.1f} ± {r['std']:.1f} | "
                     f"{' '.join(f'{x:.0f}' for x in r['finals'])} | {r['train_s_mean']:.1f} |")
    md = "\n".join(lines)
    save_results(args.out, f"A2C against SB3 A2C (rl-zoo) on {ENV}", {"env": ENV, "steps": args.steps,
                                                                      "zoo": ZOO, "rows": rows}, md, started)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
