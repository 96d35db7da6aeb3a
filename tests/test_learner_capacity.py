"""The learner-capacity benchmark's own accounting (benchmarks/learner_capacity.py): what one row counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "learner_capacity.py"


def _row(setting: str, workers: int, updates: int) -> dict:
    """One row, in a fresh interpreter as the benchmark runs it (it times the head by wrapping its methods)."""
    done = subprocess.run([sys.executable, str(_PATH), "--one", setting, str(workers), "--updates", str(updates)],
                          capture_output=True, text=True, check=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_row_counts_the_bytes_of_its_counted_rollouts_only():
    """Replayed workers cycle through the same few fragments, so bytes per counted env step hardly depend on how many
    rollouts are counted; counting the recording rollout's and the uncounted first iteration's would double them
    at one counted rollout."""
    rows = [_row("every-fp32", 2, updates) for updates in (1, 3)]
    for row, updates in zip(rows, (1, 3), strict=True):
        assert row["env_steps"] == updates * 2 * 8 * 64  # workers × envs × steps per rollout
        assert sum(row["bytes"]["up"].values()) + sum(row["bytes"]["down"].values()) == row["bytes"]["total"]
    one, three = ({d: sum(r["bytes"][d].values()) / r["env_steps"] for d in ("up", "down")} for r in rows)
    assert one == pytest.approx(three, rel=0.02)
    # every-update syncs: one full weights message per worker per counted rollout
    assert rows[1]["bytes"]["down"]["weights"] == 3 * rows[0]["bytes"]["down"]["weights"]


@pytest.mark.slow
def test_the_model_check_splits_an_iteration_into_its_rollout_and_its_update():
    """The model's update and uplink bytes are fitted through the first calibration run, so checked against that
    run they are exact; for any run the iteration's error splits into its rollout's and its update's."""
    sys.path.insert(0, str(_PATH.parent))
    try:
        import learner_capacity as lc
    finally:
        sys.path.remove(str(_PATH.parent))
    rows = [_row("every-fp32", workers, 1) for workers in (2, 4)]
    first = lc.model_check(rows, rows[0], rate=1e9)["model"]
    assert first["update_error"] == pytest.approx(0.0, abs=1e-9)
    assert first["up_bytes_error"] == pytest.approx(0.0, abs=1e-9)
    for row in rows:
        out = lc.model_check(rows, row, rate=1e9)
        check, update = out["model"], out["measured_update_s_per_iter"]
        assert update == pytest.approx(row["update_us_per_step"] * 1e-6 * row["env_steps"])  # one counted iteration
        assert check["update_error"] == pytest.approx(check["update_s"] / update - 1)
        assert check["rollout_error"] == pytest.approx(
            (check["s_per_iter"] - check["update_s"]) / (row["s_per_iter"] - update) - 1)
        assert check["error"] == pytest.approx(check["s_per_iter"] / row["s_per_iter"] - 1)
