"""A worker's actor (numpy, ONNX Runtime) against PyTorch, per network and batch; and rollouts at two commits.

Part 1, ``--inference``: for an MLP (LunarLander's 8 inputs), the MinAtar paper's grid CNN (10×10×4) and the
Nature-CNN (4×84×84 uint8 frames), the time of one action step as a worker takes it (distribution parameters, then
a sampled action) with the torch module (``inference_mode``, its generator) and with the actor a worker runs
instead (the MLP's :class:`~frugalrl.npactor.NumpyActor`, the CNNs' :class:`~frugalrl.onnxactor.OnnxCnnActor`, a
graph built from the weights), all on one thread, for batches of 1, 8 and 16 observations; the median of ``--repeats`` rounds of 200 calls. This is
what ``npactor.runs_in_numpy`` and ``onnxactor.cnn_on_onnxruntime`` decide on.

Part 2, ``--rollout ENV``: seconds for ``--rollouts`` rollouts of 128 steps on a ClusterEnv of 2 workers × 8 envs
(the local backend's default layout, or ``--backend ray``: two Ray actors), the head's own imports and the first
rollout left out; medians of ``--repeats``. Run it at two commits (``PYTHONPATH``) to compare::

    python benchmarks/actor_speed.py --inference --out actor_speed
    python benchmarks/actor_speed.py --rollout MinAtar/Breakout-v1 --out actor_speed_rollout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from _commit import measured_commit
from threadpoolctl import threadpool_limits

from frugalrl import ClusterEnv, dists, make_agent
from frugalrl.nets import acting_state

RESULTS = Path(__file__).parent / "results"
SPACES = {
    "mlp (8 inputs)": gym.spaces.Box(-np.inf, np.inf, (8,), np.float32),
    "grid cnn (10x10x4)": gym.spaces.Box(0, 1, (10, 10, 4), np.float32),
    "nature cnn (4x84x84)": gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
}


def _per_call_us(fn: Any, repeats: int, calls: int = 200) -> float:
    rounds = []
    for _ in range(repeats):
        fn()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t) / calls * 1e6)
    return round(statistics.median(rounds), 1)


def inference(repeats: int) -> list[dict[str, Any]]:
    """Per network and batch: µs per action step with the worker's actor and with torch, one thread each."""
    # Imported here: older commits, which --rollout also measures, have no OnnxCnnActor.
    from frugalrl.npactor import NumpyActor, runs_in_numpy
    from frugalrl.onnxactor import OnnxCnnActor, cnn_on_onnxruntime

    torch.set_num_threads(1)
    rows = []
    with threadpool_limits(1):
        for name, space in SPACES.items():
            torch.manual_seed(0)
            agent = make_agent(space, gym.spaces.Discrete(6))
            spec = agent.spec.to_json()
            state = {k: t.numpy() for k, t in acting_state(agent).items()}
            actor = NumpyActor.from_state(spec, state) if runs_in_numpy(spec) else OnnxCnnActor(spec, state)
            rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
            for batch in (1, 8, 16):
                obs = np.random.default_rng(batch).integers(0, 2, (batch, *space.shape)).astype(space.dtype)

                def worker_step(obs: np.ndarray = obs, actor: Any = actor, rng: Any = rng) -> Any:
                    return actor.sample(actor.params(obs), rng)

                def torch_step(obs: np.ndarray = obs, agent: Any = agent, gen: Any = gen) -> Any:
                    with torch.inference_mode():
                        return dists.sample(agent.dist_kind, agent.dist_params(torch.from_numpy(obs)), gen).numpy()

                worker_us, torch_us = _per_call_us(worker_step, repeats), _per_call_us(torch_step, repeats)
                runs = "numpy" if runs_in_numpy(spec) else "onnxruntime" if cnn_on_onnxruntime(spec) else "torch"
                rows.append({"network": name, "batch": batch, "a_worker_runs": runs, "worker_us": worker_us,
                             "torch_us": torch_us, "worker_over_torch": round(worker_us / torch_us, 3)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def rollout(env_id: str, rollouts: int, repeats: int, backend: str = "local") -> dict[str, Any]:
    """Seconds for ``rollouts`` rollouts of 128 steps, 2 workers × 8 envs (the local backend's default layout, or
    two Ray actors on a private single-machine Ray, its start-up left out)."""
    seconds = []
    for _ in range(repeats):
        env = ClusterEnv(env_id, num_workers=2, envs_per_worker=8, seed=1, backend=backend)
        try:
            env.reset(seed=1)
            torch.manual_seed(0)
            agent = make_agent(env.single_observation_space, env.single_action_space)
            env.rollout(agent, 16)
            t = time.perf_counter()
            for _ in range(rollouts):
                env.rollout(agent, 128)
            seconds.append(time.perf_counter() - t)
        finally:
            env.close()
        print(f"{env_id}: {seconds[-1]:.3f} s", flush=True)
    return {"env": env_id, "backend": backend, "rollouts": rollouts, "steps": rollouts * 128 * 16, "seconds": round(statistics.median(seconds), 3),
            "seconds_all": [round(s, 3) for s in seconds]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inference", action="store_true", help="time workers' actors against torch per network")
    ap.add_argument("--rollout", nargs="*", default=[], metavar="ENV", help="time rollouts on these envs")
    ap.add_argument("--rollouts", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", default="local", choices=["local", "ray"], help="where the rollouts' workers run")
    ap.add_argument("--out", default="actor_speed")
    args = ap.parse_args()
    omp = os.environ.get("OMP_NUM_THREADS")  # the head's torch threads (rollouts leave them as they are)
    command = [*([f"OMP_NUM_THREADS={omp}"] if omp else []), "python benchmarks/actor_speed.py", *sys.argv[1:]]
    out: dict[str, Any] = {"command": " ".join(command), "head_torch_threads": torch.get_num_threads(),
                           "date": time.strftime("%Y-%m-%d"), "commit": measured_commit()}
    if args.inference:
        out["inference"] = inference(args.repeats)
    if args.rollout:
        out["rollout"] = [rollout(e, args.rollouts, args.repeats, args.backend) for e in args.rollout]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
