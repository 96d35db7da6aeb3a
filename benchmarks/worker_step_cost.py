"""A worker's time per rollout step against its number of envs: the part that does not grow with them.

One :class:`frugalrl.envs.worker.EnvWorker` in this process (BLAS and torch on one thread, as in a worker process)
with ``k`` envs, the default agent's weights loaded, answers ``rollout`` requests of ``--num-steps`` steps and
encodes each reply, as a worker does; the median seconds per step, per ``k``, fitted by least squares to
``a + b·k``. ``a`` is what a step costs whatever the envs (the policy call, the loop, the reply's fixed part),
``b`` what each env adds. ``frugalrl scale-model --step-cost`` reads the JSON to scale a worker's compute when its
envs change. Writes ``results/worker_step_cost.json``.
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

from frugalrl import make_agent  # noqa: E402
from frugalrl.envs.spec import to_env_spec  # noqa: E402
from frugalrl.envs.worker import EnvWorker  # noqa: E402
from frugalrl.nets import acting_state  # noqa: E402
from frugalrl.wire.delta import full_message, to_words  # noqa: E402
from frugalrl.wire.message import Message, encode_message  # noqa: E402


def time_worker(env: str, k: int, num_steps: int, repeats: int, seed: int) -> float:
    """Median seconds per step of ``repeats`` rollouts of ``num_steps`` by a worker of ``k`` envs, reply encoded."""
    worker = EnvWorker(0, to_env_spec(env, None), k, seed=seed)
    try:
        worker.handle(Message("reset", {"seed": seed}))
        agent = make_agent(worker.obs_space, worker.act_space)
        state = {name: t.detach().numpy() for name, t in acting_state(agent).items()}
        words = to_words(state, "fp32", getattr(agent, "exact_tensors", ()))
        weights = full_message(words, {"version": 0, "codec": "fp32", "spec": agent.spec.to_json()})
        loaded = worker.handle(weights)
        if loaded.op != "ok":
            raise RuntimeError(f"the worker refused the weights: {loaded.meta}")
        times = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            reply = worker.handle(Message("rollout", {"num_steps": num_steps}))
            encode_message(reply)
            if i:  # the first warms up
                times.append(time.perf_counter() - t0)
            if reply.op != "rollout":
                raise RuntimeError(f"rollout failed: {reply.meta}")
        return statistics.median(times) / num_steps
    finally:
        worker.close()


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
