"""Gymnasium's own vector-env tests with ClusterEnv standing in for AsyncVectorEnv: how much of a drop-in it is.

Give it a checkout of Farama-Foundation/Gymnasium (its ``tests/`` folder is read, nothing is downloaded); it puts a
``conftest.py`` at the checkout's root that replaces ``gymnasium.vector.AsyncVectorEnv`` with a ClusterEnv of one
local worker per env function (AsyncVectorEnv's signature), runs the vector test files and writes the counts::

    python benchmarks/gymnasium_peer.py --gymnasium /path/to/Gymnasium --out gymnasium_peer

SyncVectorEnv's own tests in those files run too and pass as they do upstream; each failure names what ClusterEnv
does differently (spaces other than Box and Discrete, AsyncVectorEnv's private API, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
FILES = ("test_async_vector_env", "test_autoreset_mode", "test_vector_env_info", "test_observation_mode",
         "test_vector_env", "test_vector_wrapper")
SHIM = '''"""Written by frugalrl's benchmarks/gymnasium_peer.py: ClusterEnv stands in for AsyncVectorEnv."""
import gymnasium.vector
import gymnasium.vector.async_vector_env
from gymnasium.vector import AutoresetMode

from frugalrl import ClusterEnv


class ClusterAsyncVectorEnv(ClusterEnv):
    """AsyncVectorEnv's signature, ClusterEnv's workings: one local worker process per env function."""

    def __init__(self, env_fns, shared_memory=True, copy=True, context=None, daemon=True, worker=None,
                 observation_mode="same", autoreset_mode=AutoresetMode.NEXT_STEP):
        env_fns = list(env_fns)
        super().__init__(env_fns, num_workers=len(env_fns), backend="local", autoreset_mode=autoreset_mode,
                         episode_statistics=False, uplink="none", observation_mode=observation_mode)


gymnasium.vector.AsyncVectorEnv = ClusterAsyncVectorEnv
gymnasium.vector.async_vector_env.AsyncVectorEnv = ClusterAsyncVectorEnv
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gymnasium", required=True, help="a checkout of Farama-Foundation/Gymnasium")
    ap.add_argument("--out", default="gymnasium_peer")
    args = ap.parse_args()
    root = Path(args.gymnasium).resolve()
    (root / "conftest.py").write_text(SHIM)
    rows = {}
    for name in FILES:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", f"tests/vector/{name}.py", "-q", "-p", "no:cacheprovider",
                               "--timeout", "60", "-rf"], cwd=root, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])})
        tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
        counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}
        failing = Counter(re.sub(r"\[.*", "", line.split("::")[-1].split(" ")[0])
                          for line in proc.stdout.splitlines() if line.startswith("FAILED"))
        rows[name] = {**counts, "seconds": round(time.monotonic() - t0, 1), "failing_tests": dict(failing)}
        print(name, counts, flush=True)
    out = {"command": "python benchmarks/gymnasium_peer.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
           "gymnasium_commit": subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                              text=True).stdout.strip() or None,
           "files": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
