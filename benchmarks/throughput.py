"""Throughput of ClusterEnv against Gymnasium's vector envs, measured in one run.

For each environment id this script measures env steps per second of

  sync          ``SyncVectorEnv`` in this process with ``envs_per_worker`` envs, random actions
                (the env-only rate of one process);
  sync+infer    the same ``SyncVectorEnv`` with the policy run every step (``make_agent`` +
                ``dists.sample``, one torch thread, ``torch.inference_mode``, results kept in
                preallocated buffers as a rollout does): one process doing the same work as one
                worker, the baseline of parallel efficiency;
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

Every method is built and warmed up first; then the timed repeats run the methods back to back,
in a rotating order, so that all of them see the same background load. Rates are medians over
the repeats and the ratios are ratios of medians (the per-repeat ratios are reported too). Each
method also reports the CPU time per env step of all its processes (head and workers, from
/proc), the cores they actually got ("cores" = steps/s × CPU per step) and the CPU that *other*
processes used meanwhile ("bg cores"): on a shared machine the wall-clock ratios are only
meaningful when that is near zero. "CPU per env step" ratios give what the ratios would be if
every process had a core to itself. Process counts match: ``async``
and ClusterEnv both use ``workers`` processes besides this one (the head). Example::

    python benchmarks/throughput.py --envs CartPole-v1 LunarLander-v3 --workers 2 --envs-per-worker 8
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
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


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (0.0 where /proc is unavailable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all cores, from /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / _TICK  # every state but idle and iowait
    except (OSError, ValueError, IndexError):
        return 0.0


class Method:
    """One way of stepping environments: built once, warmed up, then timed in interleaved repeats."""

    key = ""
    label = ""

    def __init__(self, env_id: str, args: argparse.Namespace) -> None:
        self.env_id, self.args = env_id, args
        self.W, self.k = args.workers, args.envs_per_worker
        self.rates: list[float] = []
        self.seconds: list[float] = []
        self.cpu_us: list[float] = []
        self.background: list[float] = []

    def pids(self) -> list[int]:
        """Processes besides this one that do this method's work."""
        return []

    def run(self, steps: int) -> int:
        """Step ``steps`` times; return the env steps done."""
        raise NotImplementedError

    def close(self) -> None:
        """Release everything."""

    def timed(self, steps: int) -> None:
        pids = self.pids()
        cpu0 = time.process_time() + sum(process_cpu(p) for p in pids)
        busy0 = machine_busy()
        t0 = time.perf_counter()
        done = self.run(steps)
        dt = time.perf_counter() - t0
        ours = time.process_time() + sum(process_cpu(p) for p in pids) - cpu0
        self.rates.append(done / dt)
        self.seconds.append(dt)
        self.cpu_us.append(ours / done * 1e6)
        # CPU that other processes on this machine used meanwhile, in cores (tick-granular: approximate).
        self.background.append(max(0.0, (machine_busy() - busy0 - ours) / dt))

    def result(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "steps_per_s": statistics.median(self.rates),
            "min": min(self.rates),
            "max": max(self.rates),
            "rates": [round(r, 1) for r in self.rates],
            "seconds": [round(s, 4) for s in self.seconds],
            "cpu_us_per_env_step": round(statistics.median(self.cpu_us), 2),
            # CPU cores this method's processes actually got: below its process count, the machine was busy.
            "cores_used": round(statistics.median(r * c * 1e-6 for r, c in zip(self.rates, self.cpu_us, strict=True)), 2),
            "background_cpus": round(statistics.median(self.background), 2),
        }


class SyncEnvOnly(Method):
    """``SyncVectorEnv`` in this process with ``envs_per_worker`` envs, random actions."""

    key = "sync"

    def __init__(self, env_id: str, args: argparse.Namespace) -> None:
        super().__init__(env_id, args)
        self.label = f"SyncVectorEnv, 1 proc, {self.k} envs, random actions"
        self.envs = gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id) for _ in range(self.k)])
        self.envs.reset(seed=args.seed)
        self.actions = random_actions(self.envs.single_action_space, 4096, self.k, args.seed)

    def run(self, steps: int) -> int:
        envs, actions = self.envs, self.actions
        for t in range(steps):
            envs.step(actions[t % len(actions)])
        return steps * self.k

    def close(self) -> None:
        self.envs.close()


class SyncWithInference(Method):
    """One process, the same envs, the same work as a worker's rollout: infer, sample, step, record.

    The baseline of parallel efficiency. Inference is done as a worker does it (``make_agent``,
    ``dists.sample`` with a torch generator, one torch thread) under ``torch.inference_mode``, and
    observations, actions, distribution parameters, rewards and done flags go to preallocated buffers.
    """

    key = "sync_infer"

    def __init__(self, env_id: str, args: argparse.Namespace) -> None:
        super().__init__(env_id, args)
        self.label = f"SyncVectorEnv, 1 proc, {self.k} envs, + policy every step"
        self.envs = envs = gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id) for _ in range(self.k)])
        self.space = space = envs.single_action_space
        self.box = isinstance(space, gym.spaces.Box)
        self.agent = make_agent(envs.single_observation_space, space)
        self.agent.eval()
        self.generator = torch.Generator().manual_seed(args.seed)
        self.obs = envs.reset(seed=args.seed)[0]
        with torch.inference_mode():
            n_params = self.agent.dist_params(torch.from_numpy(self.obs)).shape[-1]
        cap, k = args.rollout_len, self.k
        obs_space = envs.single_observation_space
        self.obs_buf = np.empty((cap, k, *obs_space.shape), obs_space.dtype)
        self.act_buf = np.empty((cap, k, *space.shape), np.float32 if self.box else np.int64)
        self.par_buf = np.empty((cap, k, n_params), np.float32)
        self.rew_buf = np.empty((cap, k), np.float32)
        self.done_buf = np.empty((cap, k), bool)

    def run(self, steps: int) -> int:
        envs, agent, gen, space = self.envs, self.agent, self.generator, self.space
        obs_buf, act_buf, par_buf, rew_buf, done_buf = self.obs_buf, self.act_buf, self.par_buf, self.rew_buf, self.done_buf
        cap = len(obs_buf)
        obs = self.obs
        for step in range(steps):
            t = step % cap
            obs_buf[t] = obs
            with torch.inference_mode():
                params = agent.dist_params(torch.from_numpy(obs))
                action = dists.sample(agent.dist_kind, params, gen).numpy()
            act_buf[t] = action
            par_buf[t] = params.numpy()
            if self.box:
                action = np.clip(action, space.low, space.high)
            obs, r, te, tr, _ = envs.step(action)
            rew_buf[t] = r
            done_buf[t] = te | tr
        self.obs = obs
        return steps * self.k

    def close(self) -> None:
        self.envs.close()


class WorkerLoop(Method):
    """(Information) the worker's own rollout loop in this process: serial backend, one worker, no transport."""

    key = "worker_loop"

    def __init__(self, env_id: str, args: argparse.Namespace) -> None:
        super().__init__(env_id, args)
        self.label = f"EnvWorker rollout in-process, {self.k} envs (info)"
        self.env = ClusterEnv(env_id, num_workers=1, envs_per_worker=self.k, backend="serial", seed=args.seed)
        self.agent = make_agent(self.env.single_observation_space, self.env.single_action_space)
        self.env.reset(seed=args.seed)

    def run(self, steps: int) -> int:
        T = self.args.rollout_len
        rounds = max(1, -(-steps // T))
        for _ in range(rounds):
            self.env.rollout(self.agent, T)
        return rounds * T * self.k

    def close(self) -> None:
        self.env.close()


class Async(Method):
    """``AsyncVectorEnv`` with ``workers`` processes (one env each: the same process count), random actions."""

    key = "async"

    def __init__(self, env_id: str, args: argparse.Namespace) -> None:
        super().__init__(env_id, args)
        self.label = f"AsyncVectorEnv, {self.W} procs x 1 env, random actions"
        self.envs = gym.vector.AsyncVectorEnv([functools.partial(gym.make, env_id) for _ in range(self.W)])
        self.envs.reset(seed=args.seed)
        self.actions = random_actions(self.envs.single_action_space, 4096, self.W, args.seed)

    def pids(self) -> list[int]:
        return [p.pid for p in self.envs.processes]

    def run(self, steps: int) -> int:
        envs, actions = self.envs, self.actions
        for t in range(steps):
            envs.step(actions[t % len(actions)])
        return steps * self.W

    def close(self) -> None:
        self.envs.close()


class HeadSide(Method):
    """``ClusterEnv`` (local backend) ``step(actions)``: the head chooses random actions, workers step."""

    key = "head_side"

    def __init__(self, env_id: str, args: argparse.Namespace) -> None:
        super().__init__(env_id, args)
        self.label = f"ClusterEnv local step(), {self.W} procs x {self.k} envs"
        self.env = ClusterEnv(env_id, num_workers=self.W, envs_per_worker=self.k, backend="local", seed=args.seed)
        self.env.reset(seed=args.seed)
        self.actions = random_actions(self.env.single_action_space, 4096, self.W * self.k, args.seed)

    def pids(self) -> list[int]:
        return list(self.env.backend.worker_pids().values())

    def run(self, steps: int) -> int:
        env, actions = self.env, self.actions
        for t in range(steps):
            env.step(actions[t % len(actions)])
        return steps * self.W * self.k

    def close(self) -> None:
        self.env.close()


class WorkerSide(Method):
    """``ClusterEnv.rollout(agent, T)`` (local backend): worker-side inference, whole fragments back."""

    key = "rollout"

    def __init__(self, env_id: str, args: argparse.Namespace) -> None:
        super().__init__(env_id, args)
        self.label = f"ClusterEnv local rollout(T={args.rollout_len}), {self.W} x {self.k}"
        self.env = ClusterEnv(env_id, num_workers=self.W, envs_per_worker=self.k, backend="local", seed=args.seed)
        self.agent = make_agent(self.env.single_observation_space, self.env.single_action_space)
        self.env.reset(seed=args.seed)

    def pids(self) -> list[int]:
        return list(self.env.backend.worker_pids().values())

    def run(self, steps: int) -> int:
        T = self.args.rollout_len
        rounds = max(1, -(-steps // T))
        for _ in range(rounds):
            self.env.rollout(self.agent, T)
        return rounds * T * self.W * self.k

    def close(self) -> None:
        self.env.close()


def bench_env(env_id: str, args: argparse.Namespace, warmup: int) -> dict[str, Any]:
    """Build every method, warm each up, then time them in interleaved repeats (rotating the order)."""
    kinds: list[type[Method]] = [SyncEnvOnly, SyncWithInference, Async, HeadSide, WorkerSide]
    if not args.skip_worker_loop:
        kinds.insert(2, WorkerLoop)
    methods: list[Method] = []
    try:
        for kind in kinds:
            methods.append(kind(env_id, args))
        for m in methods:
            m.run(warmup)
        for r in range(args.repeats):
            shift = r % len(methods)
            for m in methods[shift:] + methods[:shift]:
                m.timed(args.steps)
        return {m.key: m.result() for m in methods}
    finally:
        for m in methods:
            m.close()


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
    from _commit import measured_commit

    commit = measured_commit()
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
    for env_id, res in results.items():
        print(f"\n== {env_id} ==")
        print(f"  {'method':<52} {'steps/s':>10} {'min':>9} {'max':>9} {'CPU us/step':>12} {'cores':>6} {'bg cores':>9}")
        for m in res["methods"].values():
            print(
                f"  {m['label']:<52} {fmt_rate(m['steps_per_s']):>10} {fmt_rate(m['min']):>9} {fmt_rate(m['max']):>9}"
                f" {m['cpu_us_per_env_step']:>12.1f} {m['cores_used']:>6.2f} {m['background_cpus']:>9.2f}"
            )
        lines = [
            ("head-side / async", "head_vs_async", TARGET_HEAD_VS_ASYNC),
            ("parallel efficiency: rollout / (W x sync+infer)", "efficiency", TARGET_EFFICIENCY),
            ("  rollout / (W x sync env-only)   (info)", "efficiency_vs_env_only", None),
            ("  rollout / (W x in-process worker loop)   (info)", "efficiency_vs_worker_loop", None),
            ("  async / (W x sync env-only)   (info)", "async_efficiency_vs_env_only", None),
        ]
        r, paired = res["ratios"], res["paired_ratios"]
        for label, key, target in lines:
            if key not in r:
                continue
            lo, hi = min(paired[key]), max(paired[key])
            verdict = ""
            if target is not None:
                verdict = f"target >= {target}  {'OK' if r[key] >= target else 'MISS'}"
            print(f"  {label:<52} {r[key]:>10.2f}  (per repeat {lo:.2f}-{hi:.2f})  {verdict}")
        c = res["cpu_ratios"]
        print(f"  {'CPU per env step: sync+infer / rollout   (info)':<52} {c['efficiency_cpu']:>10.2f}")
        print(f"  {'CPU per env step: async / head-side   (info)':<52} {c['async_cpu_vs_head_cpu']:>10.2f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v3"], help="Gymnasium ids")
    p.add_argument("--workers", type=int, default=2, help="worker processes (ClusterEnv and AsyncVectorEnv)")
    p.add_argument("--envs-per-worker", type=int, default=8, help="envs per ClusterEnv worker (and in SyncVectorEnv)")
    p.add_argument("--steps", type=int, default=2000, help="vector steps per timed repeat")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (interleaved); medians are reported")
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
        m = bench_env(env_id, args, warmup)

        def ratios_of(rate: dict[str, float]) -> dict[str, float]:
            out = {
                "head_vs_async": rate["head_side"] / rate["async"],
                "efficiency": rate["rollout"] / (W * rate["sync_infer"]),
                "efficiency_vs_env_only": rate["rollout"] / (W * rate["sync"]),
                "async_efficiency_vs_env_only": rate["async"] / (W * rate["sync"]),
            }
            if "worker_loop" in rate:
                out["efficiency_vs_worker_loop"] = rate["rollout"] / (W * rate["worker_loop"])
            return out

        # The reported ratios are ratios of the medians; the same ratios within each repeat (the methods
        # ran back to back, under the same background load) show how much they move.
        ratios = ratios_of({name: v["steps_per_s"] for name, v in m.items()})
        # CPU seconds per env step, all processes of a method together: what the ratios would be if every
        # process had a core to itself (no background load, no oversubscription). Information only.
        cpu = {name: v["cpu_us_per_env_step"] for name, v in m.items()}
        cpu_ratios = {
            "efficiency_cpu": cpu["sync_infer"] / cpu["rollout"],
            "async_cpu_vs_head_cpu": cpu["async"] / cpu["head_side"],
        }
        per_repeat = [ratios_of({name: v["rates"][i] for name, v in m.items()}) for i in range(args.repeats)]
        results[env_id] = {
            "methods": m,
            "ratios": {key: round(v, 4) for key, v in ratios.items()},
            "paired_ratios": {key: [round(p[key], 3) for p in per_repeat] for key in ratios},
            "cpu_ratios": {key: round(v, 4) for key, v in cpu_ratios.items()},
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
        "loadavg_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {path} ({out['wall_seconds']} s)")
    return out


if __name__ == "__main__":
    main()
