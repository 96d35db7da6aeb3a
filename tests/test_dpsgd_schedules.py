"""DPSGD's one-worker runs replayed step by step in NumPy: the local-rate schedules (decay, linear annealing, a
resumed segment's clock), Polyak averaging, the wall-clock cadence, the bytes counted, and eq. 13's rescaling.

With one worker and one Hogwild process a run is deterministic, so each test compares ``run_dpsgd``'s parameters
bit for bit with the same float32 operations done here (:func:`_replay`). Split from tests/test_dpsgd.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_dpsgd import LSQ, LSQ_KW

from frugalrl.dpsgd import DPSGDConfig, make_rng, run_dpsgd, scale_learning_rate
from frugalrl.dpsgd.problems import least_squares
from frugalrl.dpsgd.rates import decayed_rate

pytestmark = pytest.mark.timeout(120)

# ------------------------------------------------------------------------------- deterministic runs
def _replay(cfg: DPSGDConfig) -> tuple[np.ndarray, dict[int, float]]:
    """Alg. 1-2 for one worker with one thread, in plain NumPy: final v and the loss every log_every."""
    problem = least_squares(**cfg.problem_kwargs)
    v = problem.init_params()
    rng = make_rng(cfg.seed, 0, 0)
    losses = {}
    beta = np.float32(cfg.average_decay())
    avg = v
    for t in range(1, cfg.global_updates + 1):
        u = v.copy()
        eta = decayed_rate(cfg.eta, t - 1 + cfg.clock_offset, cfg.eta_decay, cfg.eta_offset,  # the version it pulled
                           cfg.run_updates if cfg.eta_anneal else None, cfg.eta_anneal)
        for _ in range(cfg.local_steps):
            u = u - np.float32(eta) * problem.stochastic_grad(u.copy(), rng)
        v = v + np.float32(cfg.rho) * (u - v)
        avg = avg + (np.float32(1) - beta) * (v - avg) if beta else v  # = β v̄ + (1 − β) v, the server's rounding
        if t % cfg.log_every == 0:
            losses[t] = problem.loss(avg)
    return avg, losses


def _one_worker_cfg(codec: str) -> DPSGDConfig:
    return DPSGDConfig(
        problem=LSQ,
        problem_kwargs=LSQ_KW,
        workers=1,
        processes=1,
        local_steps=5,
        master_batch=1,
        rho=0.8,
        eta=0.05,
        global_updates=20,
        log_every=5,
        update_codec=codec,
        seed=7,
    )


@pytest.fixture(scope="module")
def one_worker_runs() -> dict[str, dict]:
    return {codec: run_dpsgd(_one_worker_cfg(codec)) for codec in ("fp32", "bf16", "bf16+zstd")}


def test_one_worker_run_matches_numpy_replay(one_worker_runs):
    cfg = _one_worker_cfg("fp32")
    out = one_worker_runs["fp32"]
    v, losses = _replay(cfg)
    np.testing.assert_array_equal(out["params"], v)  # same float32 operations in the same order
    assert out["global_updates"] == 20 and out["stop_reason"] == "global_updates"
    assert out["pushes"] == out["applied_updates"] == 20 and out["dropped_updates"] == 0
    assert out["gradient_steps"] == 20 * 5
    assert out["staleness"]["histogram"] == {0: 20}
    assert [t for _, t, _ in out["loss_curve"]] == [0, 5, 10, 15, 20]
    for _, t, loss in out["loss_curve"][1:]:
        assert loss == pytest.approx(losses[t], rel=1e-5)


def test_polyak_averaged_run_matches_numpy_replay():
    cfg = replace(_one_worker_cfg("fp32"), average=0.25)  # β = 1 − 1/5
    out = run_dpsgd(cfg)
    v, losses = _replay(cfg)
    np.testing.assert_array_equal(out["params"], v)
    assert not np.array_equal(v, _replay(_one_worker_cfg("fp32"))[0])
    for _, t, loss in out["loss_curve"][1:]:
        assert loss == pytest.approx(losses[t], rel=1e-5)


def test_decaying_local_rate_follows_the_global_clock():
    assert decayed_rate(0.3, 0, 0.7, 10.0) == 0.3 and decayed_rate(0.3, 50, 0.0, 10.0) == 0.3
    assert decayed_rate(0.3, 90, 0.5, 10.0) == pytest.approx(0.3 / 10**0.5)
    cfg = replace(_one_worker_cfg("fp32"), eta_decay=0.5, eta_offset=3.0)
    out = run_dpsgd(cfg)
    v, _ = _replay(cfg)
    np.testing.assert_array_equal(out["params"], v)
    assert not np.array_equal(out["params"], _replay(_one_worker_cfg("fp32"))[0])


def test_linear_annealing_reaches_zero_at_the_horizon():
    """``eta_anneal``: η falls linearly to 0 at ``global_updates`` over the run's last ``eta_anneal`` fraction (1:
    A3C's schedule; 0.25: constant, then a cool-down), on the workers' clock."""
    assert decayed_rate(0.3, 25, 0.0, 10.0, horizon=100) == pytest.approx(0.225)
    assert decayed_rate(0.3, 100, 0.0, 10.0, horizon=100) == 0.0 == decayed_rate(0.3, 150, 0.5, 10.0, horizon=100)
    assert decayed_rate(0.3, 75, 0.0, 10.0, 100, anneal=0.25) == 0.3  # constant until the cool-down
    assert decayed_rate(0.3, 90, 0.0, 10.0, 100, anneal=0.25) == pytest.approx(0.12)
    assert decayed_rate(0.3, 100, 0.0, 10.0, 100, anneal=0.25) == 0.0
    runs = {}
    for anneal in (True, 0.25):
        cfg = replace(_one_worker_cfg("fp32"), eta_anneal=anneal)
        assert cfg.eta_anneal == float(anneal)  # the older switch reads as the whole run
        runs[anneal] = run_dpsgd(cfg)["params"]
        np.testing.assert_array_equal(runs[anneal], _replay(cfg)[0])
    plain = _replay(_one_worker_cfg("fp32"))[0]
    assert not np.array_equal(runs[True], plain) and not np.array_equal(runs[0.25], plain)
    assert not np.array_equal(runs[True], runs[0.25])
    with pytest.raises(ValueError, match="eta_anneal needs global_updates"):
        DPSGDConfig(problem=LSQ, eta_anneal=0.2, global_updates=None, time_limit_s=1.0)


def test_a_resumed_segment_goes_on_along_the_whole_runs_schedules():
    """A resumed run's DPSGD segment (``clock_offset``: the updates made before) anneals η and averages over the
    whole run's clock: its first round runs at the rate the unbroken run had there, not at ``η`` again."""
    whole = replace(_one_worker_cfg("fp32"), eta_anneal=1.0, average=0.25)
    second_half = replace(whole, global_updates=10, clock_offset=10)
    assert second_half.run_updates == whole.run_updates == 20
    assert second_half.average_decay() == whole.average_decay() == pytest.approx(0.8)
    worker_cfg = second_half.worker_config(0, second_half.eta)
    assert decayed_rate(worker_cfg["eta"], 0 + worker_cfg["clock_offset"], 0.0, 10.0, worker_cfg["eta_horizon"],
                        worker_cfg["eta_anneal"]) == pytest.approx(whole.eta / 2)
    out = run_dpsgd(second_half)
    np.testing.assert_array_equal(out["params"], _replay(second_half)[0])
    restarted = _replay(replace(whole, global_updates=10))[0]  # what a resume did before: η from the top over 10
    assert not np.array_equal(out["params"], restarted)
    with pytest.raises(ValueError, match="clock_offset must be an integer >= 0"):
        replace(whole, clock_offset=-1)


def test_wall_clock_cadence_records_once_per_period():
    """``log_every_s``: the first global update after every period is recorded, whatever an update costs."""
    kw = {"n": 400, "dim": 10, "batch_size": 8, "noise": 0.1, "seed": 1}
    out = run_dpsgd(DPSGDConfig(problem=LSQ, problem_kwargs=kw, workers=1, local_steps=5, eta=0.02,
                                global_updates=None, time_limit_s=0.6, log_every=1, log_every_s=0.1))
    times = [t for t, _, _ in out["loss_curve"][1:-1]]  # the last is the final parameters' at the stop
    periods = [int(t // 0.1) for t in times]
    assert len(times) >= 3 and periods == sorted(set(periods))  # at most one record per period
    assert out["global_updates"] > 3 * len(times)  # log_every=1 is overridden by the clock


def test_bytes_are_counted_and_bf16_halves_push_bytes(one_worker_runs):
    fp32, bf16 = one_worker_runs["fp32"], one_worker_runs["bf16"]
    dim = LSQ_KW["dim"]
    for out in (fp32, bf16):
        b = out["bytes"]
        assert b["total"] == sum(b[k] for k in ("weights", "gradients", "control"))
        assert b["down"]["weights"] == 4 * dim * out["pulls"]  # pulls stay fp32
        assert b["up"]["control"] > 0 and b["down"]["control"] > 0
        assert "weights" not in b["up"] and "gradients" not in b["down"]
    assert fp32["bytes"]["up"]["gradients"] == 4 * dim * fp32["pushes"]
    assert bf16["bytes"]["up"]["gradients"] * 2 == fp32["bytes"]["up"]["gradients"]
    # bf16 updates still optimise: within a few percent of the fp32 run.
    assert bf16["final_loss"] == pytest.approx(fp32["final_loss"], rel=0.05)


def test_compressed_bf16_pushes_are_bf16s_values(one_worker_runs):
    """``bf16+zstd`` (HSA2C's default) compresses bf16's bytes losslessly: the same run, exactly."""
    bf16, packed = one_worker_runs["bf16"], one_worker_runs["bf16+zstd"]
    np.testing.assert_array_equal(packed["params"], bf16["params"])
    assert 0 < packed["bytes"]["up"]["gradients"] != bf16["bytes"]["up"]["gradients"]


# ------------------------------------------------------------------------------- eq. 13
def test_scale_learning_rate_eq13():
    assert scale_learning_rate(0.1, (1, 1, 1), (1, 1, 1)) == pytest.approx(0.1)
    assert scale_learning_rate(0.1, (1, 1, 1), (1, 1, 16)) == pytest.approx(0.05)
    assert scale_learning_rate(0.1, (1, 1, 1), (2, 4, 2)) == pytest.approx(0.1 / 16**0.25)
    assert scale_learning_rate(0.2, (4, 2, 8), (1, 1, 1)) == pytest.approx(0.2 * 64**0.25)
    # Going there and back is the identity.
    there = scale_learning_rate(0.3, (2, 3, 4), (5, 6, 7))
    assert scale_learning_rate(there, (5, 6, 7), (2, 3, 4)) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="ref"):
        scale_learning_rate(0.1, (0, 1, 1), (1, 1, 1))
    cfg = DPSGDConfig(
        problem=LSQ, rho=1.0, eta=0.1, processes=2, local_steps=4, master_batch=2, rescale_from=(1, 1, 1)
    )
    assert cfg.effective_rates() == pytest.approx((1.0 / 2, 0.1 / 2))
