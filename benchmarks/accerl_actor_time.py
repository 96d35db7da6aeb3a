"""Actor time with and without a compressed policy: ClusterEnv rollouts only, no learner.

    python benchmarks/accerl_actor_time.py
    python benchmarks/accerl_actor_time.py --envs CartPole-v1 ALE/Pong-v5 --envs-per-worker 1 4 --repeats 5

AcceRL's headline is the actors' time per state. This measures it where actors really run: worker
processes of a local ClusterEnv stepping real envs with worker-side inference, timing
``rollout(actor, T)`` for the learner's fp32 torch network and for each compressed actor (the same
network through the chain). The learner network is a random initialisation whose actor head is
scaled up (so the policy is far from uniform and the KL is meaningful). Ratios are against the fp32
actor in the same run; rounds are interleaved so that all variants see the same background load.
Results: ``benchmarks/results/accerl_actor_time.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from frugalrl import ClusterEnv, make_agent
from frugalrl.compress import parse_chain

RESULTS = Path(__file__).parent / "results"
CHAINS = ["int8,onnx", "prune:0.5,distill,int8,onnx"]


def env_args(name: str) -> tuple[str, dict]:
    """ClusterEnv ``env`` and ``env_kwargs`` for a Gymnasium id or an ``ALE/...`` game."""
    if name.startswith("ALE/"):
        return "frugalrl.envs.atari:make_atari", {"env_id": name}
    return name, {}


def bench(env_name: str, workers: int, k: int, T: int, repeats: int) -> list[dict]:
    """Time rollouts of every actor variant on one env setting."""
    env, kwargs = env_args(env_name)
    envs = ClusterEnv(env, num_workers=workers, envs_per_worker=k, backend="local", seed=0, env_kwargs=kwargs)
    try:
        torch.manual_seed(0)
        learner = make_agent(envs.single_observation_space, envs.single_action_space)
        with torch.no_grad():
            head = learner.actor if hasattr(learner.actor, "weight") else learner.actor[-1]
            head.weight.mul_(100.0)
        envs.reset(seed=0)
        warm = envs.rollout(learner, T)  # also the states the chains calibrate and distill on
        states = torch.as_tensor(warm.obs).reshape(-1, *warm.obs.shape[2:])
        actors = {"torch fp32": learner}
        builds = {}
        for text in CHAINS:
            chain = parse_chain(text)
            t0 = time.perf_counter()
            actors[text] = chain.build(learner, states)
            builds[text] = {"seconds": time.perf_counter() - t0, "reports": [r.to_json() for r in chain.reports]}
        times: dict[str, list[float]] = {name: [] for name in actors}
        for _ in range(repeats):
            for name, actor in actors.items():
                envs.rollout(actor, T)  # first call of a variant sends its weights: not timed
                t0 = time.perf_counter()
                envs.rollout(actor, T)
                times[name].append(time.perf_counter() - t0)
        states_per_rollout = workers * k * T
        base = float(np.median(times["torch fp32"]))
        rows = []
        for name, ts in times.items():
            med = float(np.median(ts))
            rows.append({
                "env": env_name, "workers": workers, "envs_per_worker": k, "num_steps": T, "actor": name,
                "ms_per_state": med / states_per_rollout * 1e3 * workers,  # per worker: workers run in parallel
                "rollout_seconds": med, "speedup": base / med,
                "build_seconds": builds.get(name, {}).get("seconds"),
                "final_report": builds.get(name, {}).get("reports", [None])[-1],
                "rounds": ts,
            })
        return rows
    finally:
        envs.close()


def main() -> None:
    """Run every setting and print a table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v3", "ALE/Pong-v5"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, nargs="+", default=[1, 8])
    p.add_argument("--num-steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="accerl_actor_time")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for env_name in args.envs:
        for k in args.envs_per_worker:
            T = args.num_steps if not env_name.startswith("ALE/") else max(8, args.num_steps // 2)
            rows += bench(env_name, args.workers, k, T, args.repeats)
    print("| env | envs/worker | actor | ms per state (per worker) | speed-up vs torch fp32 | KL vs learner |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        kl = r["final_report"]["kl_mean"] if r["final_report"] else None
        print(f"| {r['env']} | {r['envs_per_worker']} | {r['actor']} | {r['ms_per_state']:.3f} | "
              f"{r['speedup']:.2f}x | {'-' if kl is None else f'{kl:.1e}'} |")
    RESULTS.mkdir(exist_ok=True)
    out = {"command": " ".join(["python", *sys.argv]), "machine": platform.processor() or platform.machine(),
           "rows": rows}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
