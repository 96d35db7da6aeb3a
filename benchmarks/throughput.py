"""Throughput of ClusterEnv against Gymnasium's vector envs, measured in one run.

For each environment id this script measures env steps per second of

  sync          ``SyncVectorEnv`` in this process with ``envs_per_worker`` envs, random actions
                (the env-only rate of one process);
  sync+infer    the same ``SyncVectorEnv`` with the policy run every step (``make_agent`` +
                ``dists.sample``, one torch thread, results kept in preallocated buffers as a
                rollout does): one process doing the same work as one worker, the baseline of
                parallel efficiency;
  worker        (information) the same work done by one in-process ``EnvWorker`` (the serial
                backend's rollout), i.e. the worker's own loop without any transport;
  async         ``AsyncVectorEnv`` with ``workers`` processes (one env each), random actions;
  head-side     ``ClusterEnv`` (local backend) ``step(actions)`` with ``workers × envs_per_worker``
                envs, random actions chosen by the head;
  rollout       ``ClusterEnv.rollout(agent, T)``: worker-side inference, same total envs.

and the ratios the issue sets targets for:

  head-side / async                                   target >= 2
  rollout / (workers × sync+infer) = parallel eff.    target >= 0.8
  rollout / (workers × sync)       (information: against the env-only rate)
  rollout / (workers × worker)     (information: against the worker's own in-process loop)

Every rate is the median over ``--repeats`` timed repeats after a warm-up. Process counts match:
``async`` and ClusterEnv both use ``workers`` processes besides this one (the head). Example::

    python benchmarks/throughput.py --envs CartPole-v1 LunarLander-v3 --workers 2 --envs-per-worker 8
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from frugalrl import ClusterEnv, dists, make_agent

TARGET_HEAD_VS_ASYNC = 2.0
TARGET_EFFICIENCY = 0.8


# ---------------------------------------------------------------------------- helpers
def random_actions(space: gym.Space, steps: int, n: int, seed: int) -> np.ndarray:
    """A (steps, n, ...) table of random actions, drawn once so that every method gets the same ones."""
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return (space.start + rng.integers(0, space.n, size=(steps, n))).astype(np.int64)
    if isinstance(space, gym.spaces.Box):
        low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)
        return rng.uniform(low, high, size=(steps, n, *space.shape)).astype(space.dtype)
    raise TypeError(f"unsupported action space {space}")


def measure(run: Callable[[int], int], steps: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Call ``run(steps)`` (which returns env steps done) after a warm-up; median rate over repeats."""
    run(warmup)
    rates, seconds = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = run(steps)
        dt = time.perf_counter() - t0
        rates.append(done / dt)
        seconds.append(dt)
    return {
        "steps_per_s": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "rates": [round(r, 1) for r in rates],
        "seconds": [round(s, 4) for s in seconds],
    }


# ---------------------------------------------------------------------------- the methods
def bench_sync(env_id: str, k: int, steps: int, repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    envs = gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id) for _ in range(k)])
    envs.reset(seed=seed)
    actions = random_actions(envs.single_action_space, max(steps, warmup), k, seed)

    def run(n: int) -> int:
        for t in range(n):
            envs.step(actions[t])
        return n * k

    try:
        return measure(run, steps, repeats, warmup)
    finally:
        envs.close()


def bench_sync_infer(env_id: str, k: int, steps: int, repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    """One process, the same envs, the same work as a worker's rollout: infer, sample, step, record."""
    envs = gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id) for _ in range(k)])
    space = envs.single_action_space
    box = isinstance(space, gym.spaces.Box)
    agent = make_agent(envs.single_observation_space, space)
    agent.eval()
    generator = torch.Generator().manual_seed(seed)
    state = {"obs": envs.reset(seed=seed)[0]}
    n_params = agent.dist_params(torch.zeros(1, *envs.single_observation_space.shape)).shape[-1]
    cap = max(steps, warmup)
    obs_buf = np.empty((cap, k, *envs.single_observation_space.shape), envs.single_observation_space.dtype)
    act_buf = np.empty((cap, k, *space.shape), np.float32 if box else np.int64)
    par_buf = np.empty((cap, k, n_params), np.float32)
    rew_buf = np.empty((cap, k), np.float32)
    done_buf = np.empty((cap, k), bool)

    def run(n: int) -> int:
        obs = state["obs"]
        for t in range(n):
            obs_buf[t] = obs
            with torch.inference_mode():
                params = agent.dist_params(torch.from_numpy(obs))
                action = dists.sample(agent.dist_kind, params, generator).numpy()
            act_buf[t] = action
            par_buf[t] = params.numpy()
            if box:
                action = np.clip(action, space.low, space.high)
            obs, r, te, tr, _ = envs.step(action)
            rew_buf[t] = r
            done_buf[t] = te | tr
        state["obs"] = obs
        return n * k

    try:
        return measure(run, steps, repeats, warmup)
    finally:
        envs.close()


def bench_worker_loop(
    env_id: str, k: int, steps: int, repeats: int, warmup: int, seed: int, rollout_len: int
) -> dict[str, Any]:
    """The worker's own rollout loop in this process (serial backend, one worker): no transport."""
    env = ClusterEnv(env_id, num_workers=1, envs_per_worker=k, backend="serial", seed=seed)
    torch.set_num_threads(1)  # the serial backend runs torch here: keep one thread, as a worker does
    agent = make_agent(env.single_observation_space, env.single_action_space)
    env.reset(seed=seed)

    def run(n: int) -> int:
        rounds = max(1, -(-n // rollout_len))
        for _ in range(rounds):
            env.rollout(agent, rollout_len)
        return rounds * rollout_len * k

    try:
        return measure(run, steps, repeats, warmup)
    finally:
        env.close()


def bench_async(env_id: str, workers: int, steps: int, repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    envs = gym.vector.AsyncVectorEnv([functools.partial(gym.make, env_id) for _ in range(workers)])
    envs.reset(seed=seed)
    actions = random_actions(envs.single_action_space, max(steps, warmup), workers, seed)

    def run(n: int) -> int:
        for t in range(n):
            envs.step(actions[t])
        return n * workers

    try:
        return measure(run, steps, repeats, warmup)
    finally:
        envs.close()


def bench_head(env_id: str, workers: int, k: int, steps: int, repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    env = ClusterEnv(env_id, num_workers=workers, envs_per_worker=k, backend="local", seed=seed)
    n_envs = workers * k
    env.reset(seed=seed)
    actions = random_actions(env.single_action_space, max(steps, warmup), n_envs, seed)

    def run(n: int) -> int:
        for t in range(n):
            env.step(actions[t])
        return n * n_envs

    try:
        return measure(run, steps, repeats, warmup)
    finally:
        env.close()


def bench_rollout(
    env_id: str, workers: int, k: int, steps: int, repeats: int, warmup: int, seed: int, rollout_len: int
) -> dict[str, Any]:
    env = ClusterEnv(env_id, num_workers=workers, envs_per_worker=k, backend="local", seed=seed)
    n_envs = workers * k
    agent = make_agent(env.single_observation_space, env.single_action_space)
    env.reset(seed=seed)

    def run(n: int) -> int:
        rounds = max(1, -(-n // rollout_len))
        for _ in range(rounds):
            env.rollout(agent, rollout_len)
        return rounds * rollout_len * n_envs

    try:
        return measure(run, steps, repeats, warmup)
    finally:
        env.close()


# ---------------------------------------------------------------------------- reporting
def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads_head": torch.get_num_threads(),
        "gymnasium": gym.__version__,
        "numpy": np.__version__,
        "git_commit": commit,
        "loadavg_at_start": load,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def print_table(results: dict[str, Any], args: argparse.Namespace) -> None:
    W, k = args.workers, args.envs_per_worker
    rows = [
        ("sync", f"SyncVectorEnv, 1 proc, {k} envs, random actions"),
        ("sync_infer", f"SyncVectorEnv, 1 proc, {k} envs, + policy every step"),
        ("worker_loop", f"EnvWorker rollout in-process, {k} envs (info)"),
        ("async", f"AsyncVectorEnv, {W} procs x 1 env, random actions"),
        ("head_side", f"ClusterEnv local step(), {W} procs x {k} envs"),
        ("rollout", f"ClusterEnv local rollout(T={args.rollout_len}), {W} x {k}"),
    ]
    for env_id, res in results.items():
        print(f"\n== {env_id} ==")
        print(f"  {'method':<52} {'steps/s':>12} {'min':>10} {'max':>10}")
        for key, label in rows:
            if key in res["methods"]:
                m = res["methods"][key]
                print(f"  {label:<52} {fmt_rate(m['steps_per_s']):>12} {fmt_rate(m['min']):>10} {fmt_rate(m['max']):>10}")
        r = res["ratios"]
        print(f"  {'head-side / async':<52} {r['head_vs_async']:>12.2f}   target >= {TARGET_HEAD_VS_ASYNC}"
              f"  {'OK' if r['head_vs_async'] >= TARGET_HEAD_VS_ASYNC else 'MISS'}")
        print(f"  {'parallel efficiency: rollout / (W x sync+infer)':<52} {r['efficiency']:>12.2f}   target >= "
              f"{TARGET_EFFICIENCY}  {'OK' if r['efficiency'] >= TARGET_EFFICIENCY else 'MISS'}")
        print(f"  {'  rollout / (W x sync env-only)   (info)':<52} {r['efficiency_vs_env_only']:>12.2f}")
        if "efficiency_vs_worker_loop" in r:
            print(f"  {'  rollout / (W x in-process worker loop)   (info)':<52} {r['efficiency_vs_worker_loop']:>12.2f}")
        print(f"  {'  async / (W x sync env-only)   (info)':<52} {r['async_efficiency_vs_env_only']:>12.2f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v3"], help="Gymnasium ids")
    p.add_argument("--workers", type=int, default=2, help="worker processes (ClusterEnv and AsyncVectorEnv)")
    p.add_argument("--envs-per-worker", type=int, default=8, help="envs per ClusterEnv worker (and in SyncVectorEnv)")
    p.add_argument("--steps", type=int, default=2000, help="vector steps per timed repeat")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported")
    p.add_argument("--warmup", type=int, default=None, help="vector steps before timing (default: steps // 5)")
    p.add_argument("--rollout-len", type=int, default=256, help="T of each ClusterEnv.rollout call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-worker-loop", action="store_true", help="skip the in-process EnvWorker measurement")
    p.add_argument("--out", default="benchmarks/results/throughput.json", help="JSON output path")
    args = p.parse_args(argv)
    if args.workers < 1 or args.envs_per_worker < 1 or args.steps < 1 or args.repeats < 1:
        p.error("--workers, --envs-per-worker, --steps and --repeats must be positive")
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 5)
    torch.set_num_threads(1)  # the head, like every worker, uses one torch thread

    W, k = args.workers, args.envs_per_worker
    info = machine_info()
    print(f"throughput: {info['command']}")
    print(f"  {info['nproc']} CPUs ({info['cpu']}), torch {info['torch']}, gymnasium {info['gymnasium']}, "
          f"load {info['loadavg_at_start']}")
    t_start = time.perf_counter()
    results: dict[str, Any] = {}
    for env_id in args.envs:
        common = {"steps": args.steps, "repeats": args.repeats, "warmup": warmup, "seed": args.seed}
        m: dict[str, Any] = {}
        m["sync"] = bench_sync(env_id, k, **common)
        m["sync_infer"] = bench_sync_infer(env_id, k, **common)
        if not args.skip_worker_loop:
            m["worker_loop"] = bench_worker_loop(env_id, k, rollout_len=args.rollout_len, **common)
        m["async"] = bench_async(env_id, W, **common)
        m["head_side"] = bench_head(env_id, W, k, **common)
        m["rollout"] = bench_rollout(env_id, W, k, rollout_len=args.rollout_len, **common)
        rate = {name: v["steps_per_s"] for name, v in m.items()}
        ratios = {
            "head_vs_async": rate["head_side"] / rate["async"],
            "efficiency": rate["rollout"] / (W * rate["sync_infer"]),
            "efficiency_vs_env_only": rate["rollout"] / (W * rate["sync"]),
            "async_efficiency_vs_env_only": rate["async"] / (W * rate["sync"]),
        }
        if "worker_loop" in rate:
            ratios["efficiency_vs_worker_loop"] = rate["rollout"] / (W * rate["worker_loop"])
        results[env_id] = {
            "methods": m,
            "ratios": {key: round(v, 4) for key, v in ratios.items()},
            "targets_met": {
                "head_vs_async": ratios["head_vs_async"] >= TARGET_HEAD_VS_ASYNC,
                "efficiency": ratios["efficiency"] >= TARGET_EFFICIENCY,
            },
        }
        print(f"  {env_id} done ({time.perf_counter() - t_start:.0f} s)", flush=True)

    print_table(results, args)
    out = {
        "benchmark": "throughput",
        "config": {
            "envs": args.envs, "workers": W, "envs_per_worker": k, "steps": args.steps,
            "repeats": args.repeats, "warmup": warmup, "rollout_len": args.rollout_len, "seed": args.seed,
        },
        "targets": {"head_vs_async": TARGET_HEAD_VS_ASYNC, "efficiency": TARGET_EFFICIENCY},
        "machine": info,
        "results": results,
        "wall_seconds": round(time.perf_counter() - t_start, 1),
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {path} ({out['wall_seconds']} s)")
    return out


if __name__ == "__main__":
    main()
