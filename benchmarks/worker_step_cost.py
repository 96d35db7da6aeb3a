"""A worker's time per rollout step against its number of envs: the part that does not grow with them.

The worker a PPO run's ClusterEnv builds (PPO's uplink settings; BLAS and torch on one thread, as in a worker
process), with ``k`` envs and the default agent's weights, answers the rollout request its head sent, of
``--num-steps`` steps, and encodes each reply; the median seconds per step, per ``k``, fitted by least squares to
``a + b·k`` (a transport's own per-message work, e.g. Ray's, is not in it). ``a`` is what a step costs whatever
the envs (the policy call, the loop, the reply's fixed part), ``b`` what each env adds. ``frugalrl scale-model
--step-cost`` reads the JSON to scale a worker's compute when its envs change. Writes
``results/worker_step_cost.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from _commit import measured_commit  # noqa: E402

from frugalrl import ClusterEnv, make_agent  # noqa: E402
from frugalrl.algos.ppo import PPOConfig  # noqa: E402
from frugalrl.wire.message import Message, encode_message, uncarried  # noqa: E402


def time_worker(env: str, k: int, num_steps: int, repeats: int, seed: int) -> float:
    """Median seconds per step of ``repeats`` rollouts of ``num_steps`` by a worker of ``k`` envs, reply encoded: the
    worker a training run's ClusterEnv builds (PPO's uplink settings), answering the rollout request its head sent."""
    envs = ClusterEnv(env, num_workers=1, envs_per_worker=k, backend="serial", seed=seed,
                      uplink=PPOConfig().uplink_options())
    try:
        sent: list[Message] = []
        request = envs.backend.request
        envs.backend.request = lambda requests: (sent.extend(requests.values()), request(requests))[1]
        agent = make_agent(envs.single_observation_space, envs.single_action_space)
        for _ in range(2):  # the first carries the weights; the second is a plain request, as most are under AAPS
            envs.rollout(agent, num_steps)
        msg = uncarried([m for m in sent if m.op == "rollout"][-1])[0]
        worker = envs.backend.workers[0]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            reply = worker.handle(msg)
            encode_message(reply)
            times.append(time.perf_counter() - t0)
            if reply.op != "rollout":
                raise RuntimeError(f"rollout failed: {reply.meta}")
        return statistics.median(times) / num_steps
    finally:
        envs.close()


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``a + b·k`` through ``(k, seconds)`` points."""
    n = len(points)
    mk = sum(k for k, _ in points) / n
    mt = sum(t for _, t in points) / n
    b = sum((k - mk) * (t - mt) for k, t in points) / sum((k - mk) ** 2 for k, _ in points)
    return mt - b * mk, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="LunarLander-v3")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "worker_step_cost.json"))
    args = parser.parse_args()
    if len(set(args.envs)) < 2:
        sys.exit("--envs needs at least two different counts to fit a + b·k")
    torch.set_num_threads(1)
    points = []
    for k in args.envs:
        points.append((k, time_worker(args.env, k, args.num_steps, args.repeats, args.seed)))
        print(f"{k:3d} envs: {points[-1][1] * 1e6:7.1f} µs per step", flush=True)
    a, b = fit(points)
    if a < 0 or b <= 0:
        sys.exit(f"the fit gives a = {a * 1e6:.1f} µs and b = {b * 1e6:.1f} µs: noise; rerun with more --repeats")
    worst = max(abs(a + b * k - t) / t for k, t in points)
    print(f"a = {a * 1e6:.1f} µs per step, b = {b * 1e6:.1f} µs per env step (largest misfit {worst:.1%})")
    out = {"command": shlex.join(["benchmarks/worker_step_cost.py", *sys.argv[1:]]), "commit": measured_commit(),
           "date": time.strftime("%Y-%m-%d"), "env": args.env, "num_steps": args.num_steps,
           "points": [{"envs": k, "s_per_step": t} for k, t in points],
           "fixed_s_per_step": a, "s_per_env_step": b, "largest_misfit": worst}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
