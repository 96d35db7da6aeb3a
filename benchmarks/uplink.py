"""Benchmark: the lossless experience uplink (issue "The experience uplink: the bytes AAPS left behind").

Two parts, both on LunarLander-v3 with PPO and AAPS (δ = 0.05), the settings of ``make demo`` (2 workers × 8
envs, 128 steps per rollout):

1. **Training runs**, ``--uplink none`` and ``--uplink auto`` (same seed), each through the CLI in a fresh
   interpreter: bytes per env step by kind (from the run's summary: what the byte meter counted) and the
   final evaluation return. The runs are shorter than the demo's 1M steps (``--steps``, 150k by default).
2. **Codec CPU time** on recorded rollouts: a worker (:class:`~frugalrl.envs.worker.EnvWorker`, in this
   process) runs the policy of the ``none`` run's final checkpoint for ``--rollouts`` rollouts; each reply
   is encoded (the worker's side) and decoded (the learner's side) with every uplink option, timed per env
   step, and the decoded arrays are checked bit for bit against the originals.

    python benchmarks/uplink.py                      # ~10 min on 2 cores
    python benchmarks/uplink.py --steps 100000 --force

Writes benchmarks/results/uplink.json and benchmarks/results/uplink.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from frugalrl.wire.lossless import AUTO_CODEC, UPLINK_OPTIONS, uplink_codecs
from frugalrl.wire.message import Message, decode_message, encode_message
from frugalrl.wire.meter import KINDS

RESULTS = Path(__file__).parent / "results"
DEMO_FLAGS = ["--env", "LunarLander-v3", "--workers", "2", "--envs-per-worker", "8", "--num-steps", "128",
              "--num-minibatches", "32", "--update-epochs", "4", "--learning-rate", "5e-4", "--gamma", "0.999",
              "--gae-lambda", "0.98", "--ent-coef", "0.01", "--sync", "aaps", "--kl-threshold", "0.05",
              "--eval-every", "20", "--backend", "local"]


def train(uplink: str, steps: int, seed: int, run_dir: Path, force: bool) -> tuple[dict[str, Any], list[str]]:
    """The summary of a ``frugalrl train ppo`` run with ``--uplink uplink`` (cached in ``run_dir``)."""
    name = f"LunarLander-v3-aaps-uplink-{uplink}-t{steps}-s{seed}"
    command = ["frugalrl", "train", "ppo", *DEMO_FLAGS, "--total-timesteps", str(steps), "--seed", str(seed),
               "--uplink", uplink, "--run-dir", str(run_dir), "--run-name", name, "--no-progress",
               "--no-tensorboard", "--no-plots"]
    summary_path = run_dir / name / "summary.json"
    if force or not summary_path.exists():
        print(f"[{time.strftime('%H:%M:%S')}] {' '.join(command)}", flush=True)
        subprocess.run([sys.executable, "-m", "frugalrl.cli", *command[1:]], check=True, stdout=subprocess.DEVNULL)
    return json.loads(summary_path.read_text()), command


def per_step(summary: dict[str, Any]) -> dict[str, float]:
    """Bytes per env step by kind (and in all, and worker → head only)."""
    b, n = summary["bytes"], summary["env_steps"]
    out = {k: round(b.get(k, 0) / n, 3) for k in KINDS if b.get(k, 0)}
    out["total"] = round(b["total"] / n, 3)
    out["uplink_total"] = round(sum(b["up"].values()) / n, 3)
    return out


def record_rollouts(run_dir: Path, count: int, seed: int) -> list[Message]:
    """``count`` rollout replies (2 workers' worth of 8 envs, 128 steps) of a trained policy, as a worker
    makes them (raw: the options are applied to copies)."""
    from frugalrl.algos import load_policy
    from frugalrl.envs.spec import to_env_spec
    from frugalrl.envs.worker import EnvWorker
    from frugalrl.wire.message import encode_state_dict

    agent, _ = load_policy(run_dir)
    weights = encode_state_dict(agent.state_dict(), "fp32", getattr(agent, "exact_tensors", ()))
    weights.meta = {"version": 0, "spec": agent.spec.to_json()}
    replies = []
    for w in range(2):
        worker = EnvWorker(w, to_env_spec("LunarLander-v3", None), 8, first_env=8 * w, seed=seed)
        worker.handle(Message("reset", {"seed": seed}))
        assert worker.handle(weights).op == "ok"
        for _ in range(count // 2):
            reply = worker.handle(Message("rollout", {"num_steps": 128}))
            assert reply.op == "rollout", reply.meta
            replies.append(reply)
        worker.close()
    return replies


def time_codecs(replies: list[Message], repeats: int) -> dict[str, Any]:
    """Per uplink option: bytes per env step by kind, encode and decode µs per env step (best of ``repeats``),
    the decoded arrays checked bit for bit."""
    steps = sum(r.arrays["rewards"].size for r in replies)
    out: dict[str, Any] = {}
    for option in UPLINK_OPTIONS:
        msgs = [Message(r.op, r.meta, r.arrays, uplink_codecs(option, r.arrays)) for r in replies]
        enc, dec = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            blobs = [encode_message(m) for m in msgs]
            enc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            decoded = [decode_message(b)[0] for b, _ in blobs]
            dec.append(time.perf_counter() - t0)
        for m, d in zip(msgs, decoded, strict=True):
            for name, x in m.arrays.items():
                y = d.arrays[name]
                assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes(), (option, name)
        sizes: dict[str, int] = {}
        for _, s in blobs:
            for k, v in s.items():
                sizes[k] = sizes.get(k, 0) + v
        out[option] = {
            "bytes_per_step": {k: round(v / steps, 3) for k, v in sizes.items()},
            "total_per_step": round(sum(sizes.values()) / steps, 3),
            "encode_us_per_step": round(min(enc) / steps * 1e6, 4),
            "decode_us_per_step": round(min(dec) / steps * 1e6, 4),
            "codecs": msgs[0].codecs,
        }
    return {"env_steps": steps, "messages": len(replies), "options": out}


def markdown(result: dict[str, Any]) -> str:
    runs, micro = result["runs"], result["codec_time"]["options"]
    kinds = [k for k in (*KINDS, "total") if any(k in r["bytes_per_step"] for r in runs.values())]
    lines = [
        "# The lossless experience uplink: LunarLander-v3, PPO + AAPS (δ 0.05)",
        "",
        f"{result['steps']:,} env steps, 1 seed (seed {result['seed']})"
        + ("" if result["steps"] >= 1_000_000 else " (short runs: the demo runs 1M steps)")
        + ", the settings of `make demo` (2 workers × 8 envs, 128-step rollouts, local backend). Bytes per env "
        "step by kind, as the byte meter counted them (`summary.json`); `uplink total`: worker → head only.",
        "",
        "| uplink | " + " | ".join(kinds) + " | uplink total | final eval return | steps/s |",
        "|---|" + "---|" * (len(kinds) + 3),
    ]
    for u, r in runs.items():
        b = r["bytes_per_step"]
        lines.append(f"| {u} | " + " | ".join(f"{b.get(k, 0):.2f}" for k in kinds)
                     + f" | {b['uplink_total']:.2f} | {r['eval_return_mean']:.1f} ± {r['eval_return_std']:.1f}"
                     f" | {r['steps_per_second']:.0f} |")
    none, auto = runs["none"]["bytes_per_step"], runs["auto"]["bytes_per_step"]
    same = runs["none"]["eval_return_mean"] == runs["auto"]["eval_return_mean"]
    lines += ["", f"`auto` moves {auto['total'] / none['total']:.1%} of the bytes of `none` "
              f"({auto['uplink_total'] / none['uplink_total']:.1%} of the uplink)."
              + (" The learner receives the very same arrays, so the two runs train identically (same seed: "
                 "same final return)." if same else ""), "",
              "## Codec CPU time on recorded rollouts",
              "",
              f"{result['codec_time']['messages']} rollout replies of the trained `none` policy "
              f"({result['codec_time']['env_steps']:,} env steps), whole messages encoded (worker) and decoded "
              "(learner) in one thread, best of "
              f"{result['codec_time']['repeats']}; every decoded array checked bit for bit.",
              "",
              "| uplink | bytes / step (uplink) | encode µs / step | decode µs / step | codecs |",
              "|---|---|---|---|---|"]
    for u, r in micro.items():
        codecs = ", ".join(f"{k} {v}" for k, v in r["codecs"].items()) or "raw"
        lines.append(f"| {u} | {r['total_per_step']:.2f} | {r['encode_us_per_step']:.3f} | "
                     f"{r['decode_us_per_step']:.3f} | {codecs} |")
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rollouts", type=int, default=20, help="rollout replies recorded for the codec timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--force", action="store_true", help="retrain even if the run directories exist")
    args = p.parse_args()
    torch.set_num_threads(1)
    run_dir = RESULTS / "runs"
    runs, commands = {}, {}
    for uplink in ("none", "auto"):
        s, commands[uplink] = train(uplink, args.steps, args.seed, run_dir, args.force)
        runs[uplink] = {"bytes_per_step": per_step(s), "bytes": {k: v for k, v in s["bytes"].items()
                                                               if k not in ("per_worker",)},
                        "eval_return_mean": s["eval_return_mean"], "eval_return_std": s["eval_return_std"],
                        "env_steps": s["env_steps"], "steps_per_second": s["steps_per_second"],
                        "weight_syncs": s["weight_syncs"]["total"], "run_dir": s["run_dir"],
                        "command": " ".join(commands[uplink])}
    replies = record_rollouts(Path(runs["none"]["run_dir"]), args.rollouts, args.seed)
    codec_time = time_codecs(replies, args.repeats)
    codec_time["repeats"] = args.repeats
    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
        "steps": args.steps,
        "seed": args.seed,
        "auto_codec": AUTO_CODEC,
        "runs": runs,
        "codec_time": codec_time,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "uplink.json").write_text(json.dumps(result, indent=2))
    (RESULTS / "uplink.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
