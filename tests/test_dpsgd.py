"""DPSGD (the DPSGD paper): the server's update, Hogwild shared memory, convergence, errors (one-worker runs
replayed in NumPy, rate schedules, bytes and eq. 13: tests/test_dpsgd_schedules.py).

Runs are tiny (a few hundred parameters at most, a second or two each) so that the whole file stays
well under a minute on a loaded two-core machine. Worker processes import this module to build the
faulty test problems below (the tests directory is on their import path). What every transport must do
alike (the same run and bytes, dead or hung workers, clean closing) is tests/test_transport_contract.py,
which builds its problems from this module too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from frugalrl.dpsgd import (
    DPSGDConfig,
    ParameterServer,
    SharedVector,
    apply_update,
    run_dpsgd,
)
from frugalrl.dpsgd.problems import LeastSquares, least_squares, logistic_regression
from frugalrl.process import child_env
from frugalrl.wire.message import Message

pytestmark = pytest.mark.timeout(120)

LSQ = "frugalrl.dpsgd.problems:least_squares"
LSQ_KW = {"n": 300, "dim": 8, "batch_size": 4, "seed": 3}
DETECT_S = 20.0  # "within seconds" on a loaded two-core machine


# ------------------------------------------------------------------------------- test problems
class ConstantPull(LeastSquares):
    """Gradient ``-1`` everywhere: every Hogwild step adds ``η`` to every element of ``u``."""

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Minus ones."""
        return -np.ones_like(params)


def constant_pull(**kwargs) -> ConstantPull:
    """Factory of :class:`ConstantPull`."""
    return ConstantPull(**kwargs)


class Clocked(LeastSquares):
    """Least squares that checks its clock: a round (at most ``B`` = 2 gradients) must begin with ``set_version``
    of the global update after the last one told (one worker pulls ``first``, ``first`` + 1, ...), else a gradient
    raises, which fails the run."""

    def __init__(self, first: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.next_version = first
        self.since = 0  # gradients since the last set_version (the server's check takes one before any round)

    def set_version(self, version: int) -> None:
        if version != self.next_version:
            raise RuntimeError(f"told global update {version}, expected {self.next_version}")
        self.next_version, self.since = version + 1, 0

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        self.since += 1
        if self.since > 2:
            raise RuntimeError("a round began without set_version")
        return super().stochastic_grad(params, rng)


def clocked(**kwargs) -> Clocked:
    """Factory of :class:`Clocked`."""
    return Clocked(**kwargs)


class Faulty(LeastSquares):
    """Least squares whose gradient goes wrong after ``after`` calls, in worker processes only."""

    def __init__(self, fault: str, after: int, parent_pid: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fault, self.after, self.parent_pid, self.calls = fault, after, parent_pid, 0

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The true gradient, until the fault."""
        grad = super().stochastic_grad(params, rng)
        if os.getpid() == self.parent_pid and self.fault != "shape":
            return grad
        self.calls += 1
        if self.calls <= self.after:
            return grad
        if self.fault == "nan":
            return np.full_like(grad, np.nan)
        if self.fault == "die":
            os._exit(3)
        if self.fault == "hang":
            time.sleep(600)
        return np.zeros(grad.size + 1, dtype=np.float32)  # "shape"


def faulty(**kwargs) -> Faulty:
    """Factory of :class:`Faulty`."""
    return Faulty(**kwargs)


def fails_in_worker(head_pid: int, **kwargs) -> LeastSquares:
    """Least squares in the head, a ValueError in a worker."""
    if os.getpid() != head_pid:
        raise ValueError("this problem refuses to start in a worker")
    return least_squares(**kwargs)


def hogwild_pids() -> set[int]:
    """Running Hogwild helper processes (of any run)."""
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if b"hogwild_entry" in f.read():
                        out.add(int(name))
            except OSError:
                pass
    return out


# ------------------------------------------------------------------------------- the server
def test_apply_update_is_alg1_formula():
    rng = np.random.default_rng(0)
    v = rng.standard_normal(50).astype(np.float32)
    ws = [rng.standard_normal(50).astype(np.float32) for _ in range(3)]
    out = apply_update(v, ws, 0.7)
    assert out.dtype == np.float32
    expected = v.astype(np.float64) + 0.7 * np.sum(np.array(ws, dtype=np.float64), axis=0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(v, apply_update(v, [np.zeros(50, np.float32)], 0.7))


def test_server_master_momentum_replays_sgd_with_momentum():
    rng = np.random.default_rng(2)
    v0 = rng.standard_normal(8).astype(np.float32)
    server = ParameterServer(v0, rho=0.3, momentum=0.5, master_batch=2, workers=2, global_updates=10)
    v, m = v0.astype(np.float64), np.zeros(8)
    for t in range(4):
        ws = [rng.standard_normal(8).astype(np.float32) for _ in range(2)]
        for w in range(2):
            server.push(w, ws[w], t)
        m = 0.5 * m + ws[0] + ws[1]
        v = v + 0.3 * m
        np.testing.assert_allclose(server.v, v, rtol=1e-5, atol=1e-6)
    assert server.version == 4
    with pytest.raises(ValueError, match="velocity"):
        apply_update(v0, [v0], 0.3, momentum=0.5)


def test_server_polyak_average_is_recorded_and_returned_while_workers_pull_v():
    """``average_decay`` β: the server keeps ``v̄ ← β v̄ + (1 − β) v``; pulls get ``v``, the recorded
    parameters and the result are ``v̄``; ``DPSGDConfig.average`` sets β from the run's length."""
    rng = np.random.default_rng(3)
    v0 = rng.standard_normal(8).astype(np.float32)
    server = ParameterServer(v0, rho=1.0, master_batch=1, workers=1, global_updates=10, log_every=1,
                             average_decay=0.75)
    v, avg = v0.astype(np.float64), v0.astype(np.float64)
    for t in range(5):
        w = rng.standard_normal(8).astype(np.float32)
        server.push(0, w, t)
        v, avg = v + w, 0.75 * avg + 0.25 * (v + w)
        np.testing.assert_allclose(server.pull(0)[1], v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(server.result()[1], avg, rtol=1e-5, atol=1e-5)
    recorded = server.drain_snapshots()
    assert [u for _, u, _ in recorded] == [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(recorded[-1][2], server.result()[1])
    assert not np.allclose(server.result()[1], server.snapshot()[1])
    with pytest.raises(ValueError, match="average_decay"):
        ParameterServer(v0, rho=1.0, master_batch=1, workers=1, average_decay=1.0)
    assert DPSGDConfig(problem=LSQ, average=0.05, global_updates=400).average_decay() == pytest.approx(0.95)
    assert DPSGDConfig(problem=LSQ).average_decay() == 0.0
    with pytest.raises(ValueError, match="average needs global_updates"):
        DPSGDConfig(problem=LSQ, average=0.05, global_updates=None, time_limit_s=1.0)
    with pytest.raises(ValueError, match=r"average must be a fraction"):
        DPSGDConfig(problem=LSQ, average=2.0)


def test_momentum_is_validated():
    with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\)"):
        DPSGDConfig(problem=LSQ, momentum=1.0)
    with pytest.raises(ValueError, match="momentum needs update_format='dense'"):
        DPSGDConfig(problem=LSQ, momentum=0.5, update_format="columns")


def test_server_applies_master_batch_atomically_and_measures_staleness():
    rng = np.random.default_rng(1)
    v0 = rng.standard_normal(6).astype(np.float32)
    server = ParameterServer(v0, rho=0.5, master_batch=3, workers=3, global_updates=10)
    pulls = [server.pull(w) for w in range(3)]
    assert all(p[0] == 0 for p in pulls)
    ws = [rng.standard_normal(6).astype(np.float32) for _ in range(3)]
    server.push(0, ws[0], 0)
    server.push(1, ws[1], 0)
    assert server.version == 0 and np.array_equal(server.v, v0), "applied before M updates arrived"
    # The third update arrives through the message protocol; the reply is the next pull.
    reply = server.handle(2, Message("push", {"version": 0, "steps": 4}, {"grad/w": ws[2]}))
    assert reply.op == "params" and reply.meta["version"] == 1
    np.testing.assert_allclose(server.v, v0 + 0.5 * (ws[0] + ws[1] + ws[2]), rtol=1e-6)
    np.testing.assert_array_equal(reply.arrays["w/v"], server.v)
    assert server.staleness_stats()["histogram"] == {0: 3}

    # M = 1: worker 1 pulled before worker 0's update was applied, so its update is one step stale.
    server = ParameterServer(v0, rho=1.0, master_batch=1, workers=2, global_updates=2)
    (s0, _), (s1, _) = server.pull(0), server.pull(1)
    server.push(0, ws[0], s0)
    server.push(1, ws[1], s1)
    stats = server.staleness_stats()
    assert stats["histogram"] == {0: 1, 1: 1} and stats["max"] == 1 and stats["mean"] == 0.5
    assert server.stopped and server.stop_reason == "global_updates" and server.pull(0) is None
    server.push(0, ws[2], 2)  # arrives after the stop: dropped, not applied
    assert server.version == 2 and server.dropped_updates == 1


def test_synchronous_server_waits_for_every_worker():
    v0 = np.zeros(4, dtype=np.float32)
    server = ParameterServer(v0, rho=1.0, master_batch=2, workers=2, synchronous=True, global_updates=5)
    server.pull(0), server.pull(1)
    server.push(0, np.ones(4, np.float32), 0)
    got = []
    t = threading.Thread(target=lambda: got.append(server.pull(0)))
    t.start()
    time.sleep(0.3)
    assert not got, "worker 0 pulled again before worker 1 pushed"
    with pytest.raises(RuntimeError, match="out of turn"):
        server.push(0, np.ones(4, np.float32), 0)
    server.push(1, np.ones(4, np.float32), 0)
    t.join(5)
    assert got and got[0][0] == 1
    np.testing.assert_array_equal(got[0][1], np.full(4, 2.0, np.float32))


# ------------------------------------------------------------------------------- Hogwild sharing
def test_shared_vector_is_shared_between_processes():
    vec = SharedVector.create(10)
    code = (
        "import sys; from frugalrl.dpsgd.worker import SharedVector; "
        "a = SharedVector.attach(int(sys.argv[1]), 10).array; a[int(sys.argv[2]):int(sys.argv[3])] = float(sys.argv[4])"
    )
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(vec.fd), lo, hi, val], pass_fds=(vec.fd,), env=child_env()
            )
            for lo, hi, val in (("0", "5", "1.5"), ("5", "10", "-2.0"))
        ]
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
        np.testing.assert_array_equal(vec.array, [1.5] * 5 + [-2.0] * 5)
    finally:
        vec.close()


def test_hogwild_processes_update_one_shared_u():
    # Two Hogwild processes take B steps of +η each on the same u: the pushed update holds both
    # processes' steps (2B, less any update lost to a lock-free race), not only the worker's own B.
    b = 25
    cfg = DPSGDConfig(
        problem="test_dpsgd:constant_pull",
        problem_kwargs={"n": 10, "dim": 4},
        workers=1,
        processes=2,
        local_steps=b,
        master_batch=1,
        rho=1.0,
        eta=1.0,
        global_updates=1,
    )
    out = run_dpsgd(cfg)
    assert out["gradient_steps"] == 2 * b
    assert np.all(out["params"] > b) and np.all(out["params"] <= 2 * b)


def test_every_hogwild_process_is_told_the_global_update_it_pulled():
    """``set_version`` reaches the worker's own process and its helper each round, with the version pulled (the
    clock HSA2C's entropy schedule runs on), on the whole run's clock: a resumed segment's counts on from the
    updates made before it (``clock_offset``)."""
    cfg = DPSGDConfig(problem="test_dpsgd:clocked", problem_kwargs=LSQ_KW, workers=1, processes=2, local_steps=2,
                      eta=0.01, global_updates=6)
    out = run_dpsgd(cfg)
    assert out["global_updates"] == 6 and out["gradient_steps"] == 6 * 2 * 2
    resumed = replace(cfg, problem_kwargs={**LSQ_KW, "first": 6}, global_updates=3, clock_offset=6)
    assert run_dpsgd(resumed)["global_updates"] == 3


# ------------------------------------------------------------------------------- convergence
def test_convex_problem_converges_with_two_workers_two_processes():
    kw = {"n": 400, "dim": 10, "batch_size": 8, "noise": 0.1, "seed": 1}
    cfg = DPSGDConfig(
        problem=LSQ,
        problem_kwargs=kw,
        workers=2,
        processes=2,
        local_steps=5,
        master_batch=2,
        rho=1.0,
        eta=0.02,
        global_updates=60,
        time_limit_s=30.0,
        log_every=20,
    )
    out = run_dpsgd(cfg)
    problem = least_squares(**kw)
    initial = out["loss_curve"][0][2]
    assert out["global_updates"] == 60
    assert out["final_loss"] - problem.optimal_loss < 1e-3 * (initial - problem.optimal_loss)
    assert np.linalg.norm(out["params"] - problem.optimum) < 0.05 * np.linalg.norm(problem.optimum)
    assert out["staleness"]["count"] == 2 * 60 and out["staleness"]["max"] >= 0
    assert out["updates_per_second"] > 0 and out["wall_time_s"] > 0
    assert set(out["bytes"]["per_worker"]) == {"0", "1"}


def test_synchronous_baseline_has_no_staleness():
    kw = {"n": 400, "dim": 6, "l2": 0.05, "batch_size": 16, "seed": 2}
    cfg = DPSGDConfig(
        problem="frugalrl.dpsgd.problems:logistic_regression",
        problem_kwargs=kw,
        workers=2,
        processes=1,
        local_steps=4,
        rho=1.0,
        eta=0.5,
        global_updates=40,
        log_every=0,
    ).as_synchronous_baseline()
    assert (cfg.synchronous, cfg.local_steps, cfg.master_batch) == (True, 1, 2)
    out = run_dpsgd(cfg)
    problem = logistic_regression(**kw)
    assert out["staleness"]["histogram"] == {0: 80}
    assert out["applied_updates"] == 80 and out["dropped_updates"] == 0
    initial = out["loss_curve"][0][2]
    assert out["final_loss"] - problem.optimal_loss < 0.2 * (initial - problem.optimal_loss)


def test_target_loss_stops_the_run_and_deferred_eval_keeps_the_curve():
    kw = {"n": 400, "dim": 10, "batch_size": 8, "noise": 0.1, "seed": 1}
    problem = least_squares(**kw)
    base = DPSGDConfig(problem=LSQ, problem_kwargs=kw, workers=1, local_steps=5, eta=0.02,
                       global_updates=400, log_every=2)
    start = problem.loss(problem.init_params())
    target = problem.optimal_loss + 0.1 * (start - problem.optimal_loss)
    out = run_dpsgd(replace(base, target_loss=target))
    assert out["stop_reason"] == "target_loss" and out["global_updates"] < 400
    reached = out["target"]
    assert reached["loss"] <= target and reached["global_update"] % 2 == 0 and reached["seconds"] > 0
    # The run's result is the parameters that met the target, not those of the updates applied after it.
    assert out["params_version"] == reached["global_update"] <= out["global_updates"]
    assert out["final_loss"] == reached["loss"] == pytest.approx(problem.loss(out["params"]))
    # Deferred: the same losses, computed after the run, which does not stop at the target.
    out = run_dpsgd(replace(base, target_loss=target, deferred_eval=True, global_updates=40))
    assert out["stop_reason"] == "global_updates" and out["target"]["loss"] <= target
    assert [u for _, u, _ in out["loss_curve"]] == list(range(0, 41, 2))
    # A target the starting point already meets: nothing runs.
    out = run_dpsgd(replace(base, target_loss=start + 1.0))
    assert out["target"] == {"seconds": 0.0, "global_update": 0, "loss": start}
    assert out["global_updates"] == 0


class _SlowLoss(LeastSquares):
    """Least squares whose server-side loss takes 50 ms, as an HSA2C evaluation does (10 episodes): the server
    takes several snapshots while one loss is computed."""

    def loss(self, params: np.ndarray) -> float:
        time.sleep(0.05)
        return super().loss(params)


def test_a_target_stop_keeps_the_first_parameters_that_met_it():
    """The run's result is the first recorded parameters that met the target, however many snapshots the server
    took meanwhile (a full-suite run of HSA2C on CartPole evaluated the later ones too and returned those)."""
    kw = {"n": 400, "dim": 10, "batch_size": 8, "noise": 0.1, "seed": 1}
    problem = _SlowLoss(**kw)
    start = problem.loss(problem.init_params())
    target = problem.optimal_loss + 0.5 * (start - problem.optimal_loss)
    cfg = DPSGDConfig(problem=LSQ, problem_kwargs=kw, workers=2, local_steps=1, eta=0.02,
                      global_updates=10**6, time_limit_s=60, log_every=1, target_loss=target)
    out = run_dpsgd(cfg, problem)
    reached = out["target"]
    assert out["stop_reason"] == "target_loss" and reached["loss"] <= target
    assert out["loss_curve"][-1][1] == reached["global_update"] == out["params_version"], out["loss_curve"]
    assert out["final_loss"] == reached["loss"] == pytest.approx(problem.loss(out["params"]))
    assert out["global_updates"] > reached["global_update"]  # the server went on while the loss was computed


# ------------------------------------------------------------------------------- clear errors
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workers", 0),
        ("processes", -1),
        ("local_steps", 1.5),
        ("master_batch", True),
        ("rho", 0.0),
        ("eta", float("nan")),
        ("global_updates", 0),
        ("time_limit_s", -1.0),
        ("update_codec", "int8"),
        ("pull_codec", "zip"),
        ("seed", -3),
        ("log_every", -1),
        ("transport", "mpi"),
        ("target_loss", float("inf")),
        ("deferred_eval", 1),
        ("eta_anneal", 1.5),
        ("eta_anneal", "yes"),
        ("log_every_s", 0.0),
        ("ray_address", ""),
        ("eta_decay", 1.5),
        ("eta_offset", 0),
        ("rescale_from", (1, 2)),
        ("problem", "no_colon"),
        ("problem_kwargs", {"x": object()}),
        ("worker_timeout_s", 0),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DPSGDConfig(**{"problem": LSQ, field: value})


def test_config_cross_checks():
    with pytest.raises(ValueError, match="master_batch"):
        DPSGDConfig(problem=LSQ, workers=3, master_batch=2, synchronous=True)
    with pytest.raises(ValueError, match="global_updates"):
        DPSGDConfig(problem=LSQ, global_updates=None, time_limit_s=None)
    assert (
        DPSGDConfig(problem=least_squares).problem == LSQ
    )  # a module-level function is turned into its path
    cfg = DPSGDConfig(problem=LSQ)
    cfg.workers = 0  # validated again when run
    with pytest.raises(ValueError, match="workers"):
        run_dpsgd(cfg)


def test_bad_problems_are_named():
    with pytest.raises(ValueError, match="no_such_module_xyz.*cannot be imported"):
        run_dpsgd(DPSGDConfig(problem="no_such_module_xyz:make"))
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        run_dpsgd(DPSGDConfig(problem="frugalrl.dpsgd.problems:nope"))
    with pytest.raises(ValueError, match="could not be built"):
        run_dpsgd(DPSGDConfig(problem=LSQ, problem_kwargs={"bogus": 1}))
    kwargs = {"fault": "shape", "after": 0, "parent_pid": os.getpid(), **LSQ_KW}
    with pytest.raises(ValueError, match=r"test_dpsgd:faulty.*shape \(9,\), expected \(8,\)"):
        run_dpsgd(DPSGDConfig(problem="test_dpsgd:faulty", problem_kwargs=kwargs))


def test_nan_gradient_in_a_worker_is_reported_with_the_problem():
    kwargs = {"fault": "nan", "after": 30, "parent_pid": os.getpid(), **LSQ_KW}
    cfg = DPSGDConfig(problem="test_dpsgd:faulty", problem_kwargs=kwargs, workers=1, processes=2, local_steps=5)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"worker 0: .*test_dpsgd:faulty.*non-finite"):
        run_dpsgd(cfg)
    assert time.monotonic() - start < DETECT_S
