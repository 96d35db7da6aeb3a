"""Fingerprints of short training runs, to check that a refactor left the numbers unchanged.

Each run is a real ``frugalrl train`` command (small budgets, fixed seeds); its fingerprint is a sha256 of the final
weights in ``checkpoints/latest.pt``. ClusterEnv's Gymnasium ``step`` is fingerprinted too, over 300 random-action
steps in both autoreset modes. Run it from two trees and compare::

    PYTHONPATH=/path/to/old/src python benchmarks/exactness.py --out old.json
    PYTHONPATH=src python benchmarks/exactness.py --out new.json --compare old.json

The asynchronous paths (HSA2C with several workers, IMPALA with a compressor) are timing-dependent and left out;
HSA2C runs here with one worker of one process, synchronously.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

RUNS: dict[str, list[str]] = {
    "ppo CartPole": ["ppo", "--env", "CartPole-v1", "--total-timesteps", "8192", "--seed", "3"],
    "ppo Pendulum": ["ppo", "--env", "Pendulum-v1", "--total-timesteps", "8192", "--seed", "3"],
    "ppo CartPole, plain vector env": ["ppo", "--env", "CartPole-v1", "--total-timesteps", "8192", "--seed", "4",
                                       "--vector-env", "gym"],
    "impala CartPole": ["impala", "--env", "CartPole-v1", "--total-timesteps", "8192", "--seed", "3", "--compress",
                        "none"],
    "hsa2c CartPole": ["hsa2c", "--env", "CartPole-v1", "--total-timesteps", "8000", "--seed", "3", "--workers", "1",
                       "--processes", "1", "--synchronous"],
    "hsa2c Pendulum": ["hsa2c", "--env", "Pendulum-v1", "--total-timesteps", "8000", "--seed", "3", "--workers", "1",
                       "--processes", "1", "--synchronous"],
    "pipeline-ppo CartPole": ["pipeline-ppo", "--env", "CartPole-v1", "--total-timesteps", "8192", "--seed", "3"],
    "pipeline-ppo Pendulum": ["pipeline-ppo", "--env", "Pendulum-v1", "--total-timesteps", "8192", "--seed", "3"],
}


def digest(x: Any, h: Any) -> None:
    """Feed tensors, arrays and nested containers into the hash ``h`` in a fixed order."""
    if isinstance(x, torch.Tensor):
        h.update(x.detach().contiguous().numpy().tobytes())
    elif isinstance(x, np.ndarray):
        h.update(np.ascontiguousarray(x).tobytes())
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            h.update(str(k).encode())
            digest(x[k], h)
    elif isinstance(x, list | tuple):
        for v in x:
            digest(v, h)
    else:
        h.update(repr(x).encode())


def train_fingerprint(args: list[str], run_dir: Path) -> str:
    """Train as ``frugalrl train ARGS`` would and hash the final weights."""
    subprocess.run([sys.executable, "-m", "frugalrl.cli", "train", *args, "--run-dir", str(run_dir), "--run-name",
                    "run", "--no-progress", "--no-plots", "--no-tensorboard"], check=True, capture_output=True)
    parts = torch.load(run_dir / "run" / "checkpoints" / "latest.pt", weights_only=False)["parts"]
    h = hashlib.sha256()
    digest(parts.get("agent", parts.get("encoder")), h)
    return h.hexdigest()[:12]


def step_fingerprint(env: str, mode: str) -> str:
    """Hash every array ClusterEnv's Gymnasium ``step`` returns over 300 random-action steps."""
    from frugalrl import ClusterEnv

    h = hashlib.sha256()
    cluster = ClusterEnv(env, num_workers=2, envs_per_worker=2, backend="local", autoreset_mode=mode)
    try:
        cluster.reset(seed=1)
        rng = np.random.default_rng(0)
        for _ in range(300):
            a = rng.integers(0, 2, 4) if env.startswith("CartPole") else rng.uniform(-2, 2, (4, 1)).astype(np.float32)
            obs, r, te, tr, info = cluster.step(a)
            digest([obs, r, te, tr], h)
            digest({k: v for k, v in info.items() if isinstance(v, np.ndarray) and v.dtype != object}, h)
    finally:
        cluster.close()
    return h.hexdigest()[:12]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write the fingerprints to")
    ap.add_argument("--compare", help="a JSON this script wrote from another tree: print which fingerprints differ")
    args = ap.parse_args()
    prints: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, cmd) in enumerate(RUNS.items()):
            prints[name] = train_fingerprint(cmd, Path(tmp) / str(i))
            print(f"{name}: {prints[name]}", flush=True)
    for mode in ("NextStep", "SameStep"):
        for env in ("CartPole-v1", "Pendulum-v1"):
            name = f"ClusterEnv.step {env} {mode}"
            prints[name] = step_fingerprint(env, mode)
            print(f"{name}: {prints[name]}", flush=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "fingerprints": prints}, indent=1))
    if args.compare:
        old = json.loads(Path(args.compare).read_text())["fingerprints"]
        for name, value in prints.items():
            print(f"{'same' if old.get(name) == value else 'DIFFERS':8s} {name}")


if __name__ == "__main__":
    main()
