"""What a worker process costs before it does any work: start-up time and memory, per env.

For each env, ``--repeats`` times: build a ClusterEnv of ``--workers`` worker processes (``inline_workers=0``) and
reset it (the start-up time, the head's own imports done beforehand), step it 20 times with head-chosen actions
(the drop-in path), read each worker's resident memory (``VmRSS``) and whether it has mapped libtorch, then send it
a policy (a 4-step ``rollout``, timed) and read them again; then SIGKILL one worker and time the next rollout, which
replaces it, sends it the weights and runs. Run it at two commits to compare (``PYTHONPATH``)::

    python benchmarks/worker_footprint.py --envs CartPole-v1 LunarLander-v3 --out worker_footprint
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _commit import measured_commit

from frugalrl import ClusterEnv, make_agent

RESULTS = Path(__file__).parent / "results"


def _workers(env: ClusterEnv) -> dict[str, Any]:
    rss, torch_loaded = [], []
    for pid in env.backend.worker_pids().values():
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        rss += [int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS")]
        torch_loaded.append("libtorch" in Path(f"/proc/{pid}/maps").read_text())
    return {"rss_mb": round(statistics.mean(rss), 1), "torch_loaded": all(torch_loaded)}


def _agent(env: ClusterEnv, kind: str) -> torch.nn.Module:
    """``make_agent``'s MLP, or (``onnx``) it exported as AcceRL's static-graph actor."""
    agent = make_agent(env.single_observation_space, env.single_action_space)
    if kind == "mlp":
        return agent
    from frugalrl.compress import OnnxPolicy, export_onnx

    probe = torch.zeros((4, *env.single_observation_space.shape))
    return OnnxPolicy.from_bytes(export_onnx(agent, probe), agent.dist_kind)


def measure(env_id: str, workers: int, repeats: int, backend: str = "local", kind: str = "mlp") -> dict[str, Any]:
    """Start-up seconds (median of ``repeats``) and worker memory with head-side inference, then with a policy;
    the first rollout's seconds (the workers build the policy) and a rollout's after a worker was killed."""
    starts, firsts, recoveries, stepping, acting = [], [], [], {}, {}
    for _ in range(repeats):
        t = time.perf_counter()
        where = {"inline_workers": 0} if backend == "local" else {"ray_num_cpus": 0}
        env = ClusterEnv(env_id, num_workers=workers, envs_per_worker=2, seed=1, backend=backend, **where)
        try:
            env.reset(seed=1)
            starts.append(time.perf_counter() - t)
            env.action_space.seed(1)
            for _ in range(20):
                env.step(env.action_space.sample())
            stepping = _workers(env)
            torch.manual_seed(0)
            agent = _agent(env, kind)
            t = time.perf_counter()
            env.rollout(agent, 4)
            firsts.append(time.perf_counter() - t)
            acting = _workers(env)
            os.kill(env.backend.worker_pids()[0], signal.SIGKILL)
            time.sleep(0.2)  # dead before the next request: the rollout replaces it, syncs it and runs
            t = time.perf_counter()
            env.rollout(agent, 4)
            recoveries.append(time.perf_counter() - t)
        finally:
            env.close()
    return {"env": env_id, "backend": backend, "agent": kind, "workers": workers, "startup_s": round(statistics.median(starts), 3),
            "startup_s_all": [round(s, 3) for s in starts], "stepping": stepping, "with_policy": acting,
            "first_rollout_s": round(statistics.median(firsts), 3),
            "rollout_after_a_kill_s": round(statistics.median(recoveries), 3)}


def measure_sb3(env_id: str, workers: int, repeats: int) -> dict[str, Any]:
    """Start-up seconds (median) and worker memory of ``make_sb3_vec_env`` (SB3's recipe: Monitor on every env)
    stepped 20 times by the head, as SB3's algorithms step it."""
    from frugalrl.integrations.sb3 import make_sb3_vec_env

    starts, stepping = [], {}
    for _ in range(repeats):
        t = time.perf_counter()
        venv = make_sb3_vec_env(env_id, workers, backend="local", n_envs=2 * workers, seed=1,
                                vec_env_kwargs={"inline_workers": 0})
        try:
            venv.reset()
            starts.append(time.perf_counter() - t)
            for _ in range(20):
                venv.step(np.array([venv.action_space.sample() for _ in range(venv.num_envs)]))
            stepping = _workers(venv.cluster)
        finally:
            venv.close()
    return {"env": env_id, "backend": "local", "adapter": "sb3", "workers": workers,
            "startup_s": round(statistics.median(starts), 3), "startup_s_all": [round(s, 3) for s in starts],
            "stepping": stepping}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v3"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", choices=["local", "ray"], default="local",
                    help="ray: a local Ray instance, started before the clock (its actors are the workers)")
    ap.add_argument("--agent", choices=["mlp", "onnx"], default="mlp",
                    help="onnx: the MLP exported as AcceRL's ONNX actor (OnnxPolicy)")
    ap.add_argument("--sb3", action="store_true", help="measure make_sb3_vec_env's workers (SB3's recipe) instead")
    ap.add_argument("--out", default="worker_footprint")
    args = ap.parse_args()
    if args.backend == "ray":
        import ray

        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    commit = measured_commit()  # the checkout measured (another one's on PYTHONPATH for "before")
    rows = []
    for env_id in args.envs:
        if args.sb3:
            row = measure_sb3(env_id, args.workers, args.repeats)
            print(f"{env_id} (make_sb3_vec_env): start-up {row['startup_s']:.2f} s; worker {row['stepping']['rss_mb']} "
                  f"MB stepping (torch {row['stepping']['torch_loaded']})")
            rows.append(row)
            continue
        row = measure(env_id, args.workers, args.repeats, args.backend, args.agent)
        print(f"{env_id}: start-up {row['startup_s']:.2f} s; worker {row['stepping']['rss_mb']} MB stepping "
              f"(torch {row['stepping']['torch_loaded']}), {row['with_policy']['rss_mb']} MB with a policy "
              f"(torch {row['with_policy']['torch_loaded']}); first rollout {row['first_rollout_s']:.2f} s, "
              f"after a kill {row['rollout_after_a_kill_s']:.2f} s")
        rows.append(row)
    out = {"command": "python benchmarks/worker_footprint.py " + " ".join(
        ["--envs", *args.envs, "--workers", str(args.workers), "--repeats", str(args.repeats),
         *(["--backend", args.backend] if args.backend != "local" else []), *(["--sb3"] if args.sb3 else []),
         *(["--agent", args.agent] if args.agent != "mlp" else [])]),
        "date": time.strftime("%Y-%m-%d"), "commit": commit, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / (args.out + '.json')}")


if __name__ == "__main__":
    main()
