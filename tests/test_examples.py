"""Every script in examples/ runs to the end (exit status 0) at a tiny budget.

Each example is found by globbing examples/*.py, so a new one is covered as soon as it exists: it must
get an entry in ``SMALL_BUDGET`` (the command-line flags that make it finish in seconds), or the test
fails and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT_S = 90  # per example; each takes a few seconds on a quiet 2-core machine

#: Flags giving each example a budget of seconds (every example has one).
SMALL_BUDGET: dict[str, list[str]] = {
    "ppo_clusterenv.py": ["--total-timesteps", "512", "--num-envs", "4", "--num-steps", "64"],
    "sb3_ppo_clusterenv.py": [  # a few hundred steps through env wrappers, VecFrameStack and VecNormalize
        "--total-timesteps", "256", "--n-envs", "4", "--eval-episodes", "2", "--hyperparams",
        '{"n_steps": 32, "batch_size": 64, "n_epochs": 2, "normalize": true, "frame_stack": 2, '
        '"env_wrapper": [{"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 20}}]}'],
    "accerl_compressed_actors.py": ["--updates", "10"],
}

pytestmark = pytest.mark.timeout(TIMEOUT_S + 30)


def test_examples_are_found():
    assert {"ppo_clusterenv.py", "sb3_ppo_clusterenv.py"} <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path):
    if path.name not in SMALL_BUDGET:
        pytest.fail(f"examples/{path.name} has no entry in SMALL_BUDGET (tests/test_examples.py): add the flags "
                    "that make it finish in seconds")
    args = SMALL_BUDGET[path.name]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run([sys.executable, str(path), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"examples/{path.name} {' '.join(args)} ran past {TIMEOUT_S} s; output so far:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, f"examples/{path.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"examples/{path.name} printed nothing"
