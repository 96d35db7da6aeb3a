"""The contract of a DPSGD transport, one suite run over every transport (local processes, Ray actors).

Every transport must give a deterministic run's parameters and byte counts exactly, converge and count
its bytes by kind, fail a worker whose problem cannot be built with a ValueError naming it, replace a worker
that dies or hangs, fail the run with a DPSGDError naming one that keeps failing, and close without leaving a process behind (the
workers nor their Hogwild helpers). The problems come from tests/test_dpsgd.py and the NumPy replay from
tests/test_dpsgd_schedules.py, which worker processes and actors import (the tests directory travels on their
import path).
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import pid_alive, pid_exists, wait_dead
from test_dpsgd import LSQ, LSQ_KW, hogwild_pids
from test_dpsgd_schedules import _one_worker_cfg, _replay

from frugalrl.dpsgd import TRANSPORTS, DPSGDConfig, DPSGDError, ParameterServer, run_dpsgd
from frugalrl.dpsgd.config import TRANSPORT_NAMES
from frugalrl.dpsgd.problems import least_squares
from frugalrl.wire.meter import ByteMeter

pytestmark = pytest.mark.timeout(120)

HAVE_RAY = importlib.util.find_spec("ray") is not None
RAY = pytest.param("ray", marks=pytest.mark.skipif(not HAVE_RAY, reason="transport='ray' needs Ray"))
ALL = ["local", RAY]
KW = {"n": 400, "dim": 10, "batch_size": 8, "noise": 0.1, "seed": 1}
DETECT_S = 20.0


@pytest.fixture
def transport(request):
    """The transport under test; Ray's tests share one local Ray instance per module."""
    if request.param == "ray":
        request.getfixturevalue("ray_8cpus")
    return request.param


def test_every_transport_name_has_a_transport():
    assert tuple(TRANSPORTS) == TRANSPORT_NAMES


# ---------------------------------------------------------------------------------------------- results
def _deterministic_cfg(transport: str) -> DPSGDConfig:
    """One worker, one Hogwild process, synchronous: every float32 operation in a fixed order."""
    return replace(_one_worker_cfg("fp32"), synchronous=True, transport=transport)


@pytest.fixture(scope="module")
def local_deterministic_run() -> dict[str, Any]:
    return run_dpsgd(_deterministic_cfg("local"))


@pytest.mark.parametrize("transport", ALL, indirect=True)
def test_deterministic_run_gives_the_same_parameters_and_bytes(transport, local_deterministic_run):
    cfg = _deterministic_cfg(transport)
    out = local_deterministic_run if transport == "local" else run_dpsgd(cfg)
    v, losses = _replay(cfg)
    np.testing.assert_array_equal(out["params"], v)  # the NumPy replay's float32 operations, exactly
    assert [t for _, t, _ in out["loss_curve"]] == [0, 5, 10, 15, 20]
    for _, t, loss in out["loss_curve"][1:]:
        assert loss == pytest.approx(losses[t], rel=1e-5)
    assert out["pulls"] == out["pushes"] == 20 and out["stop_reason"] == "global_updates"
    # The same messages, byte for byte: config and ready, pulls, pushes and the stop.
    assert out["bytes"] == local_deterministic_run["bytes"]
    assert out["bytes"]["messages"] == 2 + 2 * 21


_converged: dict[str, dict[str, Any]] = {}


def _converge_run(transport: str) -> dict[str, Any]:
    """Two workers of two Hogwild processes on least squares (run once per transport and module)."""
    if transport not in _converged:
        cfg = DPSGDConfig(problem=LSQ, problem_kwargs=KW, workers=2, processes=2, local_steps=5, master_batch=2,
                          rho=1.0, eta=0.02, global_updates=50, time_limit_s=60.0, log_every=10, transport=transport)
        _converged[transport] = run_dpsgd(cfg)
    return _converged[transport]


@pytest.mark.parametrize("transport", ALL, indirect=True)
def test_run_converges_and_counts_bytes(transport):
    before = hogwild_pids()
    out = _converge_run(transport)
    problem = least_squares(**KW)
    initial = out["loss_curve"][0][2]
    assert out["global_updates"] == 50 and out["stop_reason"] == "global_updates"
    assert out["final_loss"] - problem.optimal_loss < 1e-3 * (initial - problem.optimal_loss)
    assert np.linalg.norm(out["params"] - problem.optimum) < 0.05 * np.linalg.norm(problem.optimum)
    assert [t for _, t, _ in out["loss_curve"]] == [0, 10, 20, 30, 40, 50]
    assert out["gradient_steps"] == out["pushes"] * 5 * 2
    b = out["bytes"]
    assert 0 < b["down"]["weights"] <= 4 * KW["dim"] * out["pulls"]  # a full copy or a smaller delta each
    assert b["up"]["gradients"] == 4 * KW["dim"] * out["pushes"] > 0
    assert b["up"]["control"] > 0 and b["down"]["control"] > 0
    assert b["total"] == sum(b[k] for k in ("weights", "gradients", "control"))
    assert set(b["per_worker"]) == {"0", "1"}
    if transport != "local":  # the same messages cost the same control bytes on every transport
        local = _converge_run("local")
        per_message = {t: o["bytes"]["control"] / (o["pulls"] + o["pushes"]) for t, o in (("local", local), (transport, out))}
        assert per_message[transport] == pytest.approx(per_message["local"], abs=2.0)
    deadline = time.monotonic() + 5.0
    while hogwild_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not hogwild_pids() - before, "Hogwild helpers left behind"


# ---------------------------------------------------------------------------------------------- failures
@pytest.mark.parametrize("transport", ALL, indirect=True)
def test_problem_that_fails_in_a_worker_is_a_value_error_naming_it(transport):
    cfg = DPSGDConfig(
        problem="test_dpsgd:fails_in_worker",
        problem_kwargs={"head_pid": os.getpid(), "dim": 4},
        workers=2,
        transport=transport,
    )
    with pytest.raises(ValueError, match=r"worker 0 could not start: .*refuses to start in a worker"):
        run_dpsgd(cfg)


FAULTS = [
    # (transport, fault, the error, seconds the Hogwild helpers may outlive the run, config). Every transport
    # replaces a worker that fails (below): here its workers fail at once, every time, and the rule gives up.
    # processes=1 for "die" on Ray: the actor's own process computes, so os._exit kills the actor.
    pytest.param("local", "die", r"worker \d: failed 2 times in a row .*died.*exit code", 5.0,
                 {"workers": 2, "processes": 2}, id="local-die"),
    pytest.param(RAY.values[0], "die", r"worker \d: failed 2 times in a row .*Ray actor \(pid \d+\) died", 5.0,
                 {"workers": 2, "processes": 1}, marks=RAY.marks, id="ray-die"),
    pytest.param("local", "hang", r"worker 0: failed 2 times in a row .*no message for 1 s", 0.0,
                 {"workers": 1, "processes": 2, "worker_timeout_s": 1.0}, id="local-hang"),
    pytest.param(RAY.values[0], "hang", r"worker 0: failed 2 times in a row .*no message for 1 s", 5.0,
                 {"workers": 1, "processes": 2, "worker_timeout_s": 1.0}, marks=RAY.marks, id="ray-hang"),
]


@pytest.mark.parametrize(("transport", "fault", "match", "grace_s", "cfg_kw"), FAULTS, indirect=["transport"])
def test_worker_that_keeps_dying_or_hanging_fails_the_run_naming_it(transport, fault, match, grace_s, cfg_kw):
    """A worker that turns ``fault`` before its first push, and each replacement too, fails the run with ``match``
    once the crash-loop rule gives up (one try here), within seconds; no Hogwild helper outlives it by more than
    ``grace_s`` seconds."""
    before = hogwild_pids()
    kwargs = {"fault": fault, "after": 0, "parent_pid": os.getpid(), **LSQ_KW}
    cfg = DPSGDConfig(problem="test_dpsgd:faulty", problem_kwargs=kwargs, local_steps=5, global_updates=10_000,
                      transport=transport, time_limit_s=60.0, crash_loop_tries=1, **cfg_kw)
    start = time.monotonic()
    with pytest.raises(DPSGDError, match=match):
        run_dpsgd(cfg)
    assert time.monotonic() - start < DETECT_S
    deadline = time.monotonic() + grace_s
    while hogwild_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not hogwild_pids() - before, "Hogwild helpers left behind"


REPLACED = [
    pytest.param("local", "die", 2, id="local-die"),
    pytest.param("local", "hang", 2, id="local-hang"),
    pytest.param(RAY.values[0], "die", 1, marks=RAY.marks, id="ray-die"),  # Ray's hang: the test above (~20 s here)
]


@pytest.mark.parametrize(("transport", "fault", "processes"), REPLACED, indirect=["transport"])
def test_a_worker_that_fails_after_pushing_is_replaced(transport, fault, processes):
    """A worker that dies or hangs after 30 gradients (it pushed updates) is replaced by a new one, again and
    again (each one pushes first), and the run reaches its budget; no Hogwild helper
    is left behind."""
    before = hogwild_pids()
    kwargs = {"fault": fault, "after": 30, "parent_pid": os.getpid(), **LSQ_KW}
    cfg = DPSGDConfig(problem="test_dpsgd:faulty", problem_kwargs=kwargs, local_steps=5, global_updates=40,
                      workers=1, processes=processes, worker_timeout_s=1.0, transport=transport)
    result = run_dpsgd(cfg)
    assert result["global_updates"] == 40 and len(result["restart_events"]) >= 1
    assert all(e["worker"] == 0 for e in result["restart_events"])
    deadline = time.monotonic() + 5.0
    while hogwild_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not hogwild_pids() - before, "Hogwild helpers left behind"


@pytest.mark.parametrize("transport", ALL, indirect=True)
def test_an_error_of_the_head_itself_fails_the_run_naming_it(transport, monkeypatch):
    """An error no one planned for in the head's thread serving a worker (here the server's, a TypeError) fails the
    run naming the worker, instead of leaving it a worker short (or, synchronous, waiting for it forever)."""
    handle, calls = ParameterServer.handle, []

    def broken(self, w, msg):
        calls.append(msg.op)
        if len(calls) == 6:
            raise TypeError("a bug in the head")
        return handle(self, w, msg)

    monkeypatch.setattr(ParameterServer, "handle", broken)
    cfg = DPSGDConfig(problem=LSQ, problem_kwargs=LSQ_KW, workers=2, processes=1, synchronous=True, master_batch=2,
                      global_updates=10_000, transport=transport, time_limit_s=60.0)
    start = time.monotonic()
    with pytest.raises(DPSGDError, match=r"worker \d: the head's thread serving it failed: TypeError: a bug"):
        run_dpsgd(cfg)
    assert time.monotonic() - start < DETECT_S


# ---------------------------------------------------------------------------------------------- closing
@pytest.mark.parametrize("transport", ALL, indirect=True)
def test_close_is_idempotent_and_leaves_no_process(transport):
    """A started transport, closed before it serves: its workers and their helpers are gone."""
    cfg = DPSGDConfig(problem=LSQ, problem_kwargs=LSQ_KW, workers=2, processes=2, transport=transport)
    server = ParameterServer(least_squares(**LSQ_KW).init_params(), rho=1.0, master_batch=1, workers=2,
                             global_updates=10)
    configs = [cfg.worker_config(w, cfg.eta) for w in range(cfg.workers)]
    before = hogwild_pids()
    link = TRANSPORTS[transport](server, ByteMeter(), configs, 60.0, 60.0)
    try:
        link.start()
        pids = list(link.worker_pids().values())
        helpers = hogwild_pids() - before
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        assert len(helpers) == 2  # one per worker: p = 2 counts the worker itself
    finally:
        link.close()
    link.close()  # idempotent
    for pid in [*pids, *helpers]:
        assert wait_dead(pid, timeout=10.0), f"process {pid} survives close()"
    if transport == "local":
        assert not any(pid_exists(p) for p in pids), "worker processes were not reaped"
