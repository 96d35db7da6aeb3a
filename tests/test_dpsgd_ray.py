"""DPSGD on Ray: converges like the local transport and counts the same bytes; failures are clear errors.

One local Ray instance serves the whole module (starting Ray takes seconds). The worker actors
import this module (the tests directory travels on their import path) to build the faulty problems.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np
import pytest
from test_dpsgd import LSQ, hogwild_pids

ray = pytest.importorskip("ray", reason="backend='ray' needs Ray (pip install 'frugalrl[ray]')")

from frugalrl.dpsgd import DPSGDConfig, DPSGDError, run_dpsgd  # noqa: E402
from frugalrl.dpsgd.problems import least_squares  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("ray_8cpus")]

KW = {"n": 400, "dim": 10, "batch_size": 8, "noise": 0.1, "seed": 1}
DETECT_S = 20.0


def fails_in_worker(head_pid: int, **kwargs):
    """Least squares in the head, a ValueError in a worker."""
    if os.getpid() != head_pid:
        raise ValueError("this problem refuses to start in a worker")
    return least_squares(**kwargs)


def test_ray_run_converges_like_local_and_counts_bytes():
    cfg = DPSGDConfig(
        problem=LSQ,
        problem_kwargs=KW,
        workers=2,
        threads=2,
        local_steps=5,
        master_batch=2,
        rho=1.0,
        eta=0.02,
        global_updates=50,
        time_limit_s=60.0,
        log_every=10,
    )
    before = hogwild_pids()
    problem = least_squares(**KW)
    runs = {backend: run_dpsgd(replace(cfg, backend=backend)) for backend in ("local", "ray")}
    for backend, out in runs.items():
        initial = out["loss_curve"][0][2]
        assert out["global_updates"] == 50 and out["stop_reason"] == "global_updates", backend
        assert out["final_loss"] - problem.optimal_loss < 1e-3 * (initial - problem.optimal_loss), backend
        error = np.linalg.norm(out["params"] - problem.optimum)
        assert error < 0.05 * np.linalg.norm(problem.optimum), backend
        assert [t for _, t, _ in out["loss_curve"]] == [0, 10, 20, 30, 40, 50], backend
        assert out["gradient_steps"] == out["pushes"] * 5 * 2, backend
        b = out["bytes"]
        assert b["down"]["weights"] == 4 * KW["dim"] * out["pulls"] > 0, backend
        assert b["up"]["gradients"] == 4 * KW["dim"] * out["pushes"] > 0, backend
        assert b["up"]["control"] > 0 and b["down"]["control"] > 0, backend
        assert b["total"] == sum(b[k] for k in ("weights", "gradients", "control")), backend
        assert set(b["per_worker"]) == {"0", "1"}, backend
    # The same messages cost the same control bytes on both transports (to a few digits of the pids in ``ready``).
    per_message = {k: out["bytes"]["control"] / (out["pulls"] + out["pushes"]) for k, out in runs.items()}
    assert per_message["ray"] == pytest.approx(per_message["local"], abs=2.0)
    deadline = time.monotonic() + 5.0
    while hogwild_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not hogwild_pids() - before, "Hogwild helpers left behind"


@pytest.mark.parametrize(
    "fault, match, cfg_kw",
    [
        # threads=1: the actor's own process computes, so os._exit kills the actor.
        ("die", r"worker \d: Ray actor \(pid \d+\) died", {"workers": 2, "threads": 1, "time_limit_s": 60.0}),
        ("hang", r"worker 0: no message for 1 s", {"workers": 1, "threads": 2, "worker_timeout_s": 1.0}),
    ],
)
def test_dead_or_silent_actor_fails_the_run(fault, match, cfg_kw):
    before = hogwild_pids()
    kwargs = {"fault": fault, "after": 30, "parent_pid": os.getpid(), "n": 300, "dim": 8, "batch_size": 4}
    cfg = DPSGDConfig(
        problem="test_dpsgd:faulty",
        problem_kwargs=kwargs,
        local_steps=5,
        global_updates=10_000,
        backend="ray",
        **cfg_kw,
    )
    start = time.monotonic()
    with pytest.raises(DPSGDError, match=match):
        run_dpsgd(cfg)
    assert time.monotonic() - start < DETECT_S
    deadline = time.monotonic() + 5.0
    while hogwild_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not hogwild_pids() - before, "Hogwild helpers left behind"


def test_problem_that_fails_in_an_actor_is_a_clear_error_at_start():
    cfg = DPSGDConfig(
        problem="test_dpsgd_ray:fails_in_worker",
        problem_kwargs={"head_pid": os.getpid(), "dim": 4},
        workers=2,
        backend="ray",
    )
    with pytest.raises(ValueError, match=r"worker 0 could not start: .*refuses to start in a worker"):
        run_dpsgd(cfg)
