"""The drop-in path's speed on one machine: ClusterEnv against Gymnasium's vector envs, same loop, same run.

Each method steps ``--num-envs`` envs with a 64×64 MLP policy (one torch thread, ``inference_mode``) and reports
env steps per second:

  sync      ``SyncVectorEnv`` of all the envs; the policy runs on the batch every step (the reference)
  async     ``AsyncVectorEnv`` of ``W`` processes with ``num_envs / W`` envs each (a sub-env that steps k envs),
            policy in this process: the same process layout as ClusterEnv's
  step      ``ClusterEnv.step(actions)`` (``W`` workers), policy in this process: the drop-in path
  pool      ``ClusterEnv.send`` / ``recv`` (EnvPool's API, batches of at least half the workers' envs): the
            policy runs on the envs that are back while the other workers step theirs
  rollout   ``ClusterEnv.rollout(agent, T)``: the policy runs on the workers (DETACH)
  floor     not a library: the least any design with worker processes does here, written for this benchmark
            (``FloorEnv``): this process steps k envs in a SyncVectorEnv while ``W - 1`` processes step theirs,
            actions and results as raw bytes on a pipe, every process busy-polling for up to 1 ms before it
            blocks (blocking at once where processes outnumber cores); no checks, infos, episode statistics,
            byte counts or failure handling. What ``step`` could reach at best on this machine.

The methods are built once, warmed up, then timed in ``--repeats`` rounds in a rotating order so that all of them
see the same background load; rates are medians and ratios are against ``sync`` of the same round. With
``--cleanrl`` it also times ``examples/ppo_clusterenv.py`` (CleanRL's ppo.py loop) on SyncVectorEnv and on
ClusterEnv, back to back, and compares returns and wall time. Example::

    python benchmarks/dropin_speed.py --envs CartPole-v1 LunarLander-v3 HalfCheetah-v5 --workers 2 4 --cleanrl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from _commit import measured_commit

from frugalrl import ClusterEnv, dists, make_agent

RESULTS = Path(__file__).parent / "results"
TARGETS = {"CartPole-v1": {"step": 1.0}, "LunarLander-v3": {"step": 1.3, "rollout": 1.85}}


class KEnvs(gym.Env):
    """``k`` envs behind one ``gym.Env`` (observations and actions stacked; each env resets itself when done):
    lets AsyncVectorEnv run ``k`` envs per process, as a ClusterEnv worker does."""

    def __init__(self, env_id: str, k: int) -> None:
        self.envs = [gym.make(env_id) for _ in range(k)]
        one_obs, one_act = self.envs[0].observation_space, self.envs[0].action_space
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (k, *one_obs.shape), np.float32)
        if isinstance(one_act, gym.spaces.Discrete):
            self.action_space: gym.Space = gym.spaces.MultiDiscrete([one_act.n] * k)
        else:
            self.action_space = gym.spaces.Box(np.stack([one_act.low] * k), np.stack([one_act.high] * k))

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        obs = [e.reset(seed=None if seed is None else seed + i)[0] for i, e in enumerate(self.envs)]
        return np.stack(obs).astype(np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, total = [], 0.0
        for env, a in zip(self.envs, action, strict=True):
            o, r, term, trunc, _ = env.step(a)
            if term or trunc:
                o, _ = env.reset()
            obs.append(o)
            total += float(r)
        return np.stack(obs).astype(np.float32), total, False, False, {}


def _wait(conn: Any, spin: bool) -> None:
    """Until ``conn`` has a message: busy-poll for up to 1 ms (if ``spin``), then block."""
    if spin:
        until = time.perf_counter() + 1e-3
        while time.perf_counter() < until:
            if conn.poll(0):
                return
    conn.poll(None)


def _floor_worker(conn: Any, env_id: str, k: int, seed: int, act_dtype: str, act_shape: tuple[int, ...],
                  spin: bool) -> None:
    """A FloorEnv process: steps its k envs on each action block it gets, answers with raw bytes."""
    env = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * k)
    obs, _ = env.reset(seed=seed)
    conn.send_bytes(np.asarray(obs, np.float32).tobytes())
    while True:
        _wait(conn, spin)
        data = conn.recv_bytes()
        if not data:
            break
        obs, r, te, tr, _ = env.step(np.frombuffer(data, act_dtype).reshape(k, *act_shape))
        conn.send_bytes(np.asarray(obs, np.float32).tobytes() + np.asarray(r, np.float64).tobytes()
                        + np.asarray(te, bool).tobytes() + np.asarray(tr, bool).tobytes())
    env.close()


class FloorEnv:
    """The ``floor`` method: this process steps the first k envs while ``W - 1`` processes step the others."""

    def __init__(self, env_id: str, workers: int, k: int) -> None:
        import multiprocessing as mp

        self.k = k
        self.env = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * k)
        space = self.env.single_action_space
        self.act_dtype = np.dtype(np.int64 if isinstance(space, gym.spaces.Discrete) else space.dtype)
        self.obs_shape = self.env.single_observation_space.shape
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        self.spin = workers <= (os.cpu_count() or 1)  # spinning only pays where every process has a core
        for w in range(1, workers):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_floor_worker, daemon=True,
                               args=(theirs, env_id, k, w * k, self.act_dtype.str, space.shape, self.spin))
            proc.start()
            self.conns.append(mine)
            self.procs.append(proc)

    def reset(self, *, seed: int = 0) -> tuple[np.ndarray, dict]:
        obs, _ = self.env.reset(seed=seed)
        rest = [np.frombuffer(c.recv_bytes(), np.float32).reshape(self.k, *self.obs_shape) for c in self.conns]
        return np.concatenate([np.asarray(obs, np.float32), *rest]), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        k, acts = self.k, np.asarray(actions, self.act_dtype)
        for i, c in enumerate(self.conns, 1):
            c.send_bytes(acts[i * k : (i + 1) * k].tobytes())
        obs, r, te, tr, _ = self.env.step(acts[:k])
        parts = [(np.asarray(obs, np.float32), r, te, tr)]
        n_obs = k * int(np.prod(self.obs_shape)) * 4
        for c in self.conns:
            _wait(c, self.spin)
            data = c.recv_bytes()
            parts.append((np.frombuffer(data, np.float32, n_obs // 4).reshape(k, *self.obs_shape),
                          np.frombuffer(data, np.float64, k, n_obs), np.frombuffer(data, bool, k, n_obs + 8 * k),
                          np.frombuffer(data, bool, k, n_obs + 9 * k)))
        return tuple(np.concatenate(p) for p in zip(*parts, strict=True)) + ({},)  # type: ignore[return-value]

    def close(self) -> None:
        for c in self.conns:
            c.send_bytes(b"")
        for p in self.procs:
            p.join(timeout=5)
        self.env.close()


def _policy(agent: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        params = agent.dist_params(torch.as_tensor(obs, dtype=torch.float32))
        return dists.sample(agent.dist_kind, params).numpy()


class Method:
    """One way of stepping the envs: built once, timed in several rounds."""

    def __init__(self, name: str, env_id: str, workers: int, num_envs: int, agent: torch.nn.Module) -> None:
        self.name, self.env_id, self.W, self.n, self.agent = name, env_id, workers, num_envs, agent
        self.k = num_envs // workers
        self.rates: list[float] = []
        self.env: Any = None
        self.obs: Any = None
        self._build()

    def _build(self) -> None:
        env_id, k = self.env_id, self.k
        if self.name == "sync":
            self.env = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * self.n)
        elif self.name == "async":
            self.env = gym.vector.AsyncVectorEnv([lambda: KEnvs(env_id, k)] * self.W, shared_memory=True)
        elif self.name == "floor":
            self.env = FloorEnv(env_id, self.W, k)
        else:
            self.env = ClusterEnv(env_id, num_workers=self.W, envs_per_worker=k, backend="local", seed=0)
        if self.name == "pool":
            self.env.async_reset(seed=0)
        elif self.name != "rollout":
            self.obs, _ = self.env.reset(seed=0)

    def run(self, steps: int) -> int:
        """``steps`` vector steps (env steps: ``steps × num_envs``); returns the env steps done."""
        env, agent = self.env, self.agent
        if self.name == "rollout":
            T = 64
            for _ in range(max(1, steps // T)):
                env.rollout(agent, T)
            return max(1, steps // T) * T * self.n
        if self.name == "pool":  # EnvPool's batch: half the envs (half the workers) per recv
            done = 0
            while done < steps * self.n:
                obs, _, _, _, info = env.recv(min_workers=max(1, self.W // 2))
                env.send(_policy(agent, obs), info["env_id"])
                done += len(obs)
            return done
        obs = self.obs
        for _ in range(steps):
            if self.name == "async":  # (W, k, ...) observations: one policy call on all of them
                act = _policy(agent, obs.reshape(self.n, *obs.shape[2:]))
                obs, *_ = env.step(act.reshape(self.W, self.k, *act.shape[1:]))
            else:
                obs, *_ = env.step(_policy(agent, obs))
        self.obs = obs
        return steps * self.n

    def timed(self, steps: int) -> float:
        t0 = time.perf_counter()
        done = self.run(steps)
        rate = done / (time.perf_counter() - t0)
        self.rates.append(rate)
        return rate

    def close(self) -> None:
        if self.name == "pool":
            while self.env._in_flight:
                self.env.recv()
        self.env.close()


def bench(env_id: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    probe = gym.make(env_id)
    torch.manual_seed(0)
    agent = make_agent(probe.observation_space, probe.action_space, hidden=(64, 64))
    probe.close()
    methods = [Method(name, env_id, workers, args.num_envs, agent) for name in args.methods]
    for m in methods:
        m.run(args.warmup)
    rounds: list[dict[str, float]] = []
    for r in range(args.repeats):
        order = methods[r % len(methods):] + methods[: r % len(methods)]
        rounds.append({m.name: m.timed(args.steps) for m in order})
    for m in methods:
        m.close()
    median = {name: statistics.median(rd[name] for rd in rounds) for name in args.methods}
    ratios = {name: statistics.median(rd[name] / rd["sync"] for rd in rounds) for name in args.methods if name != "sync"}
    row = {"env": env_id, "workers": workers, "envs_per_worker": args.num_envs // workers,
           "steps_per_s": {k: round(v) for k, v in median.items()},
           "vs_sync": {k: round(v, 3) for k, v in ratios.items()},
           "rounds": [{k: round(v) for k, v in rd.items()} for rd in rounds]}
    targets = TARGETS.get(env_id, {}) if workers == 2 else {}
    if targets:
        row["targets"] = {k: {"target": t, "met": ratios.get(k, 0.0) >= t} for k, t in targets.items()}
    return row


def cleanrl(args: argparse.Namespace) -> dict[str, Any]:
    """examples/ppo_clusterenv.py (CleanRL's ppo.py loop) on SyncVectorEnv, then on ClusterEnv, same seed."""
    script = Path(__file__).resolve().parent.parent / "examples" / "ppo_clusterenv.py"
    out: dict[str, Any] = {"env": "CartPole-v1", "num_envs": 4, "workers": 2, "total_timesteps": args.cleanrl_steps}
    for name, extra in (("sync", ["--sync-vector-env"]), ("clusterenv", [])):
        cmd = [sys.executable, str(script), "--env-id", "CartPole-v1", "--num-envs", "4", "--workers", "2",
               "--total-timesteps", str(args.cleanrl_steps), "--seed", "1", *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        returns = re.findall(r"return\(last 20\)\s+(-?[\d.]+)", proc.stdout)
        out[name] = {"wall_s": round(wall, 2), "last_return": float(returns[-1]) if returns else None}
    out["time_ratio"] = round(out["clusterenv"]["wall_s"] / out["sync"]["wall_s"], 3)
    out["target"] = {"time_ratio_at_most": 1.0, "met": out["time_ratio"] <= 1.0}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v3", "HalfCheetah-v5"])
    ap.add_argument("--workers", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--methods", nargs="+", default=["sync", "async", "step", "pool", "rollout", "floor"])
    ap.add_argument("--steps", type=int, default=1500, help="vector steps per timed round")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cleanrl", action="store_true", help="also time CleanRL's ppo.py loop (examples/)")
    ap.add_argument("--cleanrl-steps", type=int, default=100_000)
    ap.add_argument("--out", default="dropin_speed")
    args = ap.parse_args(argv)
    if "sync" not in args.methods:
        args.methods.insert(0, "sync")
    torch.set_num_threads(1)
    started = time.time()
    rows = []
    for env_id in args.envs:
        for w in args.workers:
            row = bench(env_id, w, args)
            rows.append(row)
            print(env_id, f"W={w}", row["steps_per_s"], "vs sync", row["vs_sync"], flush=True)
    result: dict[str, Any] = {
        "command": "python benchmarks/dropin_speed.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": measured_commit(),  # of the frugalrl imported (PYTHONPATH may point elsewhere)
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_start": os.getloadavg()},
        "torch_threads": 1, "rows": rows,
    }
    if args.cleanrl:
        result["cleanrl_ppo"] = cleanrl(args)
        print("cleanrl ppo.py", result["cleanrl_ppo"], flush=True)
    result["machine"]["load_avg_end"] = os.getloadavg()
    result["seconds"] = round(time.time() - started, 1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
