"""Stable-Baselines3's own vector-env tests with frugalrl's adapter standing in for SubprocVecEnv.

Give it a checkout of DLR-RM/stable-baselines3, or its bare git directory (only ``tests/test_vec_envs.py`` is read,
nothing is downloaded). It copies that file into a scratch folder next to a ``conftest.py`` that makes
``SubprocVecEnv`` :class:`frugalrl.integrations.sb3.ClusterSubprocVecEnv` (one local worker process per env
function), runs it against the installed SB3 and writes the counts::

    python benchmarks/sb3_peer.py --sb3 /path/to/stable-baselines3 --out sb3_peer

DummyVecEnv's own tests in the file run too and pass as upstream. With ``--upstream`` the file also runs unchanged
(SB3's real SubprocVecEnv) for comparison. Each expected failure is listed in ``DELIBERATE`` with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
TEST_FILE = "tests/test_vec_envs.py"
SHIM = '''"""Written by frugalrl's benchmarks/sb3_peer.py: frugalrl's adapter stands in for SubprocVecEnv."""
import stable_baselines3.common.env_util
import stable_baselines3.common.vec_env
import stable_baselines3.common.vec_env.subproc_vec_env

from frugalrl.integrations.sb3 import ClusterSubprocVecEnv

for module in (stable_baselines3.common.vec_env, stable_baselines3.common.vec_env.subproc_vec_env,
               stable_baselines3.common.env_util):
    module.SubprocVecEnv = ClusterSubprocVecEnv
'''
DELIBERATE: dict[str, str] = {}
"""Tests expected to fail with the adapter, and why (see docs/getting-started.md#from-stable-baselines3)."""


def read_tests(sb3: Path) -> tuple[str, str | None]:
    """(the text of tests/test_vec_envs.py, the commit) from a checkout or a bare git directory."""
    git = ["git", "-C", str(sb3)] if (sb3 / TEST_FILE).is_file() else ["git", f"--git-dir={sb3}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    if (sb3 / TEST_FILE).is_file():
        return (sb3 / TEST_FILE).read_text(), commit
    shown = subprocess.run([*git, "show", f"HEAD:{TEST_FILE}"], capture_output=True, text=True, check=True)
    return shown.stdout, commit


def run(folder: Path, text: str, shim: bool) -> dict:
    """Run the test file in ``folder`` (with the shim or without); counts, seconds and the failing tests."""
    (folder / "test_vec_envs.py").write_text(text)
    conftest = folder / "conftest.py"
    conftest.unlink(missing_ok=True)
    if shim:
        conftest.write_text(SHIM)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_vec_envs.py", "-q", "-p", "no:cacheprovider",
                           "--timeout", "120", "-rfs", "-W", "ignore::DeprecationWarning"], cwd=folder,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])})
    lines = proc.stdout.strip().splitlines()
    tail = lines[-1] if lines else proc.stderr[-500:]
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}
    failing = sorted(line.split(" ")[1] for line in lines if line.startswith("FAILED"))
    return {**counts, "seconds": round(time.monotonic() - t0, 1), "failing_tests": failing,
            "by_test": dict(Counter(re.sub(r"\[.*", "", name.split("::")[-1]) for name in failing))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sb3", required=True, help="a checkout (or bare git directory) of DLR-RM/stable-baselines3")
    ap.add_argument("--out", default="sb3_peer")
    ap.add_argument("--upstream", action="store_true", help="also run the file with SB3's own SubprocVecEnv")
    args = ap.parse_args()
    import stable_baselines3

    text, commit = read_tests(Path(args.sb3).resolve())
    out: dict = {"command": "python benchmarks/sb3_peer.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
                 "sb3_commit": commit, "sb3_installed": stable_baselines3.__version__, "file": TEST_FILE}
    with tempfile.TemporaryDirectory(prefix="sb3_peer_") as tmp:
        out["adapter"] = run(Path(tmp), text, shim=True)
        print("adapter", {k: v for k, v in out["adapter"].items() if k != "failing_tests"}, flush=True)
        if args.upstream:
            out["upstream"] = run(Path(tmp), text, shim=False)
            print("upstream", {k: v for k, v in out["upstream"].items() if k != "failing_tests"}, flush=True)
    out["deliberate"] = DELIBERATE
    out["unexpected_failures"] = [t for t in out["adapter"]["failing_tests"] if t not in DELIBERATE]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
