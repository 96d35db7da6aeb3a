"""Overhead of the Ray backend against the local one, measured in one run.

Both backends run ``ClusterEnv.rollout(agent, T)`` (worker-side inference) with the same workers, envs
per worker, agent and fragment length. Both envs are built and warmed up first; then the timed
repeats alternate between them (in a rotating order) so that both see the same background load.
Rates are env steps per second, medians over the repeats; the ratio is local / ray (how many times
slower Ray is; the issue's target is <= 1.5). Bytes by kind are checked to be equal (same logical
messages on both transports). Example::

    python benchmarks/ray_overhead.py --env CartPole-v1 --workers 2 --envs-per-worker 8 --steps 128
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import ray
import torch

from frugalrl import ClusterEnv, make_agent

TARGET_SLOWDOWN = 1.5
BACKENDS = ("local", "ray")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=8)
    parser.add_argument("--steps", type=int, default=128, help="T of each rollout fragment")
    parser.add_argument("--rollouts", type=int, default=5, help="rollouts per timed repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ray-num-cpus", type=float, default=1.0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "ray_overhead.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)

    ray.init(num_cpus=max(os.cpu_count() or 1, int(args.workers * args.ray_num_cpus + 0.999)),
             include_dashboard=False, log_to_driver=False, configure_logging=False)
    envs = {
        b: ClusterEnv(args.env, args.workers, args.envs_per_worker, backend=b, seed=0, ray_num_cpus=args.ray_num_cpus)
        for b in BACKENDS
    }
    torch.manual_seed(0)
    agent = make_agent(envs["local"].single_observation_space, envs["local"].single_action_space)
    for env in envs.values():  # warm-up: weights sent, buffers grown, Ray's object paths exercised
        for _ in range(3):
            env.rollout(agent, args.steps)
    steps_per_repeat = args.rollouts * args.steps * args.workers * args.envs_per_worker
    rates: dict[str, list[float]] = {b: [] for b in BACKENDS}
    for r in range(args.repeats):
        order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
        for b in order:
            t0 = time.perf_counter()
            for _ in range(args.rollouts):
                envs[b].rollout(agent, args.steps)
            rates[b].append(steps_per_repeat / (time.perf_counter() - t0))
    bytes_ = {b: envs[b].stats()["bytes"] for b in BACKENDS}
    for env in envs.values():
        env.close()
    ray.shutdown()

    med = {b: statistics.median(v) for b, v in rates.items()}
    slowdown = med["local"] / med["ray"]
    per_repeat = [lo / ra for lo, ra in zip(rates["local"], rates["ray"], strict=True)]
    same_bytes = all(bytes_["local"][k] == bytes_["ray"][k] for k in ("observations", "actions", "rewards",
                                                                       "behaviour", "weights", "control", "total"))
    print(f"{args.env}: {args.workers} workers x {args.envs_per_worker} envs, rollout T={args.steps}, "
          f"{args.rollouts} rollouts x {args.repeats} repeats, ray_num_cpus={args.ray_num_cpus}")
    print(f"{'backend':<8} {'median steps/s':>15} {'min':>10} {'max':>10}")
    for b in BACKENDS:
        print(f"{b:<8} {med[b]:>15,.0f} {min(rates[b]):>10,.0f} {max(rates[b]):>10,.0f}")
    verdict = "meets" if slowdown <= TARGET_SLOWDOWN else "MISSES"
    print(f"ray is {slowdown:.2f}x slower than local (median ratio; per repeat "
          f"{min(per_repeat):.2f}-{max(per_repeat):.2f}); target <= {TARGET_SLOWDOWN}: {verdict}")
    print(f"same bytes by kind on both backends: {same_bytes}")

    result = {
        "config": vars(args) | {"out": None},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "ray": ray.__version__},
        "steps_per_s": {b: {"median": med[b], "all": rates[b]} for b in BACKENDS},
        "slowdown_ray_vs_local": slowdown,
        "slowdown_per_repeat": per_repeat,
        "target_slowdown": TARGET_SLOWDOWN,
        "meets_target": slowdown <= TARGET_SLOWDOWN,
        "same_bytes": same_bytes,
        "bytes": bytes_,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
