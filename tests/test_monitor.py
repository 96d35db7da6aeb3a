"""Tests for frugalrl.monitor: indicators, strategies, the Monitor and the alpha-mix actor."""

from __future__ import annotations

import copy
import json
import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

from frugalrl import dists
from frugalrl.monitor import (
    AlphaMix,
    CompressionGuard,
    MixPolicy,
    Monitor,
    PrecisionLadder,
    RewardGap,
    SparsitySchedule,
    kl_indicators,
    parse_monitor,
)
from frugalrl.nets import MLPActorCritic, action_desc, build_policy


@pytest.fixture(scope="module")
def cartpole_obs() -> torch.Tensor:
    """256 CartPole-v1 states visited by a random policy."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    states = []
    for _ in range(256):
        states.append(obs)
        obs, _, term, trunc, _ = env.step(int(rng.integers(2)))
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    return torch.as_tensor(np.stack(states), dtype=torch.float32)


def make_net(seed: int, hidden: tuple[int, ...] = (64, 64)) -> MLPActorCritic:
    """A CartPole actor-critic with deterministic initial weights."""
    torch.manual_seed(seed)
    return MLPActorCritic(4, action_desc(gym.spaces.Discrete(2)), hidden)


def perturbed(learner: MLPActorCritic, scale: float, seed: int = 1) -> MLPActorCritic:
    """Copy of ``learner`` whose policy-head weights get Gaussian noise of std ``scale``."""
    actor = copy.deepcopy(learner)
    head = actor.actor[-1]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.add_(scale * torch.randn(head.weight.shape, generator=g))
    return actor


def test_kl_indicators_match_direct_computation(cartpole_obs: torch.Tensor) -> None:
    learner = make_net(0)
    actor = perturbed(learner, 0.5)
    ind = kl_indicators(learner, actor, cartpole_obs)
    with torch.no_grad():
        p = learner.dist_params(cartpole_obs)
        q = actor.dist_params(cartpole_obs)
    logp, logq = torch.log_softmax(p, -1), torch.log_softmax(q, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1).double()
    ent = -(logq.exp() * logq).sum(-1).double()
    assert set(ind) == {"kl_mean", "kl_max", "kl_var", "entropy"}
    assert ind["kl_mean"] == pytest.approx(float(kl.mean()), rel=1e-5)
    assert ind["kl_max"] == pytest.approx(float(kl.max()), rel=1e-5)
    assert ind["kl_var"] == pytest.approx(float(np.var(kl.numpy())), rel=1e-4)
    assert ind["entropy"] == pytest.approx(float(ent.mean()), rel=1e-5)
    assert ind["kl_max"] > ind["kl_mean"] > 0
    # Identical networks: zero KL; numpy observations accepted.
    same = kl_indicators(learner, copy.deepcopy(learner), cartpole_obs.numpy())
    assert same["kl_max"] == pytest.approx(0.0, abs=1e-6)


def test_kl_indicators_gaussian_and_kind_mismatch(cartpole_obs: torch.Tensor) -> None:
    torch.manual_seed(0)
    box = action_desc(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    learner = MLPActorCritic(4, box)
    actor = copy.deepcopy(learner)
    with torch.no_grad():
        actor.log_std.add_(0.3)
    ind = kl_indicators(learner, actor, cartpole_obs)
    with torch.no_grad():
        expected = dists.kl("gaussian", learner.dist_params(cartpole_obs), actor.dist_params(cartpole_obs))
    assert ind["kl_mean"] == pytest.approx(float(expected.mean()), rel=1e-5)
    with pytest.raises(ValueError, match="KL is undefined"):
        kl_indicators(learner, make_net(0), cartpole_obs)


def test_reward_gap_moving_average() -> None:
    gap = RewardGap(window=3)
    assert gap.gap(100.0) is None
    gap.add([10.0, 20.0])
    assert gap.gap(100.0) is None  # not enough episodes yet
    gap.add([30.0])
    assert gap.gap(100.0) == pytest.approx(80.0)
    assert gap.gap(None) is None
    gap.add([60.0])  # window drops the oldest
    assert gap.moving_average == pytest.approx(110.0 / 3)
    with pytest.raises(ValueError):
        RewardGap(window=0)


def test_precision_ladder_switches_when_kl_max_crosses_epsilon(cartpole_obs: torch.Tensor) -> None:
    learner = make_net(0)
    scales = [0.0, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0]
    kl_max = [kl_indicators(learner, perturbed(learner, s), cartpole_obs)["kl_max"] for s in scales]
    assert kl_max == sorted(kl_max)  # divergence grows with the perturbation
    epsilon = (kl_max[3] + kl_max[4]) / 2  # crossed between scale 1.0 and 3.0
    ladder = PrecisionLadder(epsilon)
    assert ladder.setting() == {"precision": "int8"}
    changes = [ladder.update({"kl_max": k}, step) for step, k in enumerate(kl_max)]
    assert changes[:4] == [None] * 4
    assert changes[4] == {"precision": "fp16"}
    assert changes[5] == {"precision": "fp32"}
    assert changes[6] is None  # top rung: stays
    assert ladder.current == "fp32" and ladder.at_top


def test_precision_ladder_patience_and_reset() -> None:
    ladder = PrecisionLadder(14.0, patience=2)
    assert ladder.update({"kl_max": 15.0}, 0) is None
    assert ladder.update({"kl_max": 13.0}, 1) is None  # streak broken
    assert ladder.update({"kl_max": 15.0}, 2) is None
    assert ladder.update({"kl_max": 16.0}, 3) == {"precision": "fp16"}
    assert ladder.update({"kl_max": 16.0}, 4) is None  # patience counts again from the switch
    assert ladder.update({"kl_max": 16.0}, 5) == {"precision": "fp32"}
    assert ladder.update({"kl_max": 99.0}, 6) is None
    assert ladder.update({"kl_max": 99.0}, 7) is None
    assert ladder.update({}, 8) is None
    with pytest.raises(ValueError):
        PrecisionLadder(1.0, current="int4")
    with pytest.raises(ValueError):
        PrecisionLadder(1.0, patience=0)


def test_alpha_mix_is_linear_between_thresholds() -> None:
    mix = AlphaMix(kl_low=0.1, kl_high=0.5, tolerance=0.0)
    assert mix.target(0.0) == 1.0 and mix.target(0.1) == 1.0
    assert mix.target(0.5) == 0.0 and mix.target(3.0) == 0.0
    for kl in np.linspace(0.1, 0.5, 9):
        assert mix.target(float(kl)) == pytest.approx((0.5 - kl) / 0.4)
    assert mix.update({"kl_mean": 0.05}, 0) is None  # already 1
    assert mix.update({"kl_mean": 0.3}, 1) == {"alpha": pytest.approx(0.5)}
    assert mix.update({"kl_mean": 0.9}, 2) == {"alpha": 0.0}
    assert mix.update({"kl_mean": 0.0}, 3) == {"alpha": 1.0}
    with pytest.raises(ValueError):
        AlphaMix(kl_low=0.5, kl_high=0.5)


def test_alpha_mix_tolerance() -> None:
    mix = AlphaMix(kl_low=0.0, kl_high=1.0, tolerance=0.1)
    assert mix.update({"kl_mean": 0.05}, 0) is None  # 0.95: moved 0.05 only
    assert mix.update({"kl_mean": 0.2}, 1) == {"alpha": pytest.approx(0.8)}
    assert mix.update({"kl_mean": 0.25}, 2) is None
    assert mix.alpha == pytest.approx(0.8)
    assert mix.update({"kl_mean": 0.97}, 3) == {"alpha": pytest.approx(0.03)}
    assert mix.update({"kl_mean": 1.5}, 4) == {"alpha": 0.0}  # an end is always reached


def test_sparsity_schedule_gap_and_steps() -> None:
    s = SparsitySchedule(initial=0.5, conservative=0.2, gap_threshold=10.0)
    assert s.setting() == {"sparsity": 0.5}
    assert s.update({"reward_gap": None}, 0) is None
    assert s.update({"reward_gap": 9.0}, 1) is None
    assert s.update({"reward_gap": 10.0}, 2) is None  # not above the threshold
    assert s.update({"reward_gap": 10.5}, 3) == {"sparsity": 0.2}
    assert s.update({"reward_gap": 1.0}, 4) is None  # latched

    sched = SparsitySchedule(initial=0.5, conservative=0.2, schedule=[(100, 0.7), (50, 0.6)])
    got = {step: sched.update({"reward_gap": 0.0}, step) for step in (0, 49, 50, 99, 100, 200)}
    assert got == {0: None, 49: None, 50: {"sparsity": 0.6}, 99: None, 100: {"sparsity": 0.7}, 200: None}
    assert sched.update({"reward_gap": 12.0}, 201) == {"sparsity": 0.2}

    free = SparsitySchedule(latch=False)
    assert free.update({"reward_gap": 11.0}, 0) == {"sparsity": 0.2}
    assert free.update({"reward_gap": 5.0}, 1) == {"sparsity": 0.5}
    with pytest.raises(ValueError):
        SparsitySchedule(initial=1.0)


def test_monitor_logs_every_change(cartpole_obs: torch.Tensor, caplog: pytest.LogCaptureFixture) -> None:
    learner = make_net(0)
    monitor = Monitor(
        [
            PrecisionLadder(epsilon=0.05),
            AlphaMix(kl_low=0.001, kl_high=0.1),
            SparsitySchedule(gap_threshold=10.0),
        ],
        every=10,
        reward_window=2,
    )
    caplog.set_level(logging.INFO, logger="frugalrl.monitor")
    # Step 0: identical actor, no returns yet: nothing changes.
    assert monitor.observe(0, learner, copy.deepcopy(learner), cartpole_obs, reference_return=200.0) == {}
    assert monitor.history[0]["reward_gap"] is None and monitor.history[0]["kl_max"] == pytest.approx(
        0, abs=1e-6
    )
    # Step 5: not due (every=10); the returns still count.
    assert monitor.observe(5, learner, perturbed(learner, 30.0), cartpole_obs, episode_returns=[20.0]) == {}
    assert len(monitor.history) == 1
    # Step 10: a far actor and a large reward gap: all three strategies change.
    changes = monitor.observe(
        10, learner, perturbed(learner, 30.0), cartpole_obs, episode_returns=[30.0], reference_return=200.0
    )
    assert changes == {"precision": "fp16", "alpha": 0.0, "sparsity": 0.2}
    assert monitor.history[-1]["reward_gap"] == pytest.approx(175.0)
    assert [e["step"] for e in monitor.events] == [10, 10, 10]
    assert [e["change"] for e in monitor.events] == [{"precision": "fp16"}, {"alpha": 0.0}, {"sparsity": 0.2}]
    assert monitor.events[0]["indicators"]["kl_max"] > 0.05
    assert monitor.events[2]["indicators"] == {"reward_gap": pytest.approx(175.0)}
    records = [r for r in caplog.records if r.name == "frugalrl.monitor"]
    assert len(records) == len(monitor.events) == 3
    assert "precision" in records[0].getMessage() and "sparsity" in records[2].getMessage()
    assert monitor.settings() == {"precision": "fp16", "alpha": 0.0, "sparsity": 0.2}
    record = json.loads(json.dumps(monitor.to_json()))
    assert len(record["history"]) == 2 and len(record["events"]) == 3


def test_mix_policy_extremes_and_rate(cartpole_obs: torch.Tensor) -> None:
    small, large = make_net(1, (16,)), make_net(2)
    mix = MixPolicy(small, large, alpha=1.0, seed=3)
    with torch.no_grad():
        p_small, p_large = small.dist_params(cartpole_obs), large.dist_params(cartpole_obs)
        assert torch.equal(mix.dist_params(cartpole_obs), p_small)
        assert torch.equal(mix.value(cartpole_obs), large.value(cartpole_obs))
        mix.set_alpha(0.0)
        assert all(torch.equal(mix.dist_params(cartpole_obs), p_large) for _ in range(20))
        mix.set_alpha(0.3)
        # the same 4-state batch through each network: a matmul's rounding may depend on the batch size
        q_small, q_large = small.dist_params(cartpole_obs[:4]), large.dist_params(cartpole_obs[:4])
        n, picks = 2000, 0
        for _ in range(n):
            out = mix.dist_params(cartpole_obs[:4])
            is_small = torch.equal(out, q_small)
            assert is_small or torch.equal(out, q_large)
            assert is_small == (mix.last_choice == "small")
            picks += is_small
    assert picks / n == pytest.approx(0.3, abs=0.04)
    with pytest.raises(ValueError):
        mix.set_alpha(1.5)


def test_mix_policy_set_alpha_in_place_and_kind_check() -> None:
    mix = MixPolicy(make_net(1, (16,)), make_net(2), alpha=0.5)
    buf = mix.alpha
    version = buf._version
    mix.set_alpha(0.25)
    assert mix.alpha is buf and buf._version > version and float(buf) == 0.25
    assert mix.spec.kwargs["alpha"] == 0.25
    box = action_desc(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    with pytest.raises(ValueError, match="distribution kind"):
        MixPolicy(make_net(1), MLPActorCritic(4, box))


def test_mix_policy_spec_roundtrip(cartpole_obs: torch.Tensor) -> None:
    mix = MixPolicy(make_net(1, (16,)).spec.to_json(), make_net(2), alpha=0.4)  # a spec or a module
    with torch.no_grad():
        mix.small.actor[-1].weight.mul_(50.0)  # trained-looking weights, not the default init
    spec = mix.spec
    assert spec.factory == "frugalrl.monitor:MixPolicy"
    assert set(spec.kwargs) == {"small", "large", "alpha"}
    clone = build_policy(json.loads(json.dumps(spec.to_json())))
    assert isinstance(clone, MixPolicy) and clone.dist_kind == "categorical"
    clone.set_alpha(0.9)
    clone.load_state_dict(mix.state_dict())
    assert float(clone.alpha) == pytest.approx(0.4)
    with torch.no_grad():
        for _ in range(30):  # same seed: same choices, same outputs
            assert torch.equal(mix.dist_params(cartpole_obs), clone.dist_params(cartpole_obs))
            assert mix.last_choice == clone.last_choice
        assert torch.equal(mix.value(cartpole_obs), clone.value(cartpole_obs))


def test_reward_gap_in_standard_errors() -> None:
    gap = RewardGap(window=4)
    gap.add([10.0, 12.0, 8.0, 10.0])  # mean 10, variance 2
    assert gap.z_score(20.0, None, 10) is None and gap.z_score(20.0, 3.0, 0) is None
    se = np.sqrt(3.0**2 / 10 + 2.0 / 4)
    assert gap.z_score(20.0, 3.0, 10) == pytest.approx(10.0 / se)
    flat = RewardGap(window=2)
    flat.add([500.0, 500.0])
    assert flat.z_score(500.0, 0.0, 10) == 0.0  # two constant, equal returns: no gap, finite


def _gap(reference: float, actors: float, z: float) -> dict[str, float]:
    return {"reference_return": reference, "reward_mean": actors, "reward_gap": reference - actors, "reward_gap_z": z}


def test_compression_guard_backs_off_step_by_step_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Two significant gaps in a row: sparsity to conservative, then precision up the ladder, then a last note."""
    guard = CompressionGuard(z=3.0, patience=2, precision="int8", sparsity=0.5)
    caplog.set_level(logging.WARNING, logger="frugalrl.monitor")
    assert guard.update(_gap(-100, -300, 5.0), 1) is None  # one failing check: not yet
    assert guard.update({"reward_gap": None}, 2) is None  # no fresh gap: the streak stays
    assert guard.update(_gap(-100, -300, 5.0), 3) == {"sparsity": 0.2}
    assert guard.update(_gap(-100, -300, 5.0), 4) is None
    assert guard.update(_gap(-100, -300, 1.0), 5) is None  # not significant: the streak restarts
    assert guard.update(_gap(-100, -300, 5.0), 6) is None
    assert guard.update(_gap(-100, -300, 5.0), 7) == {"precision": "fp16"}
    guard.update(_gap(-100, -300, 5.0), 8)
    assert guard.update(_gap(-100, -300, 5.0), 9) == {"precision": "fp32"}
    guard.update(_gap(-100, -300, 5.0), 10)
    assert guard.update(_gap(-100, -300, 5.0), 11) is None and guard.exhausted
    notes = guard.notes()
    assert [n["step"] for n in notes] == [3, 7, 9, 11]
    assert "backing the compression off" in notes[0]["message"] and "another reason" in notes[-1]["message"]
    assert sum("compressed actors score" in r.getMessage() for r in caplog.records) == 4
    assert guard.setting() == {"sparsity": 0.2, "precision": "fp32"}


def test_compression_guard_ignores_small_gaps_and_lossless_compression() -> None:
    """A gap of many standard errors but a few percent of the return's scale (CartPole's 500 vs 490) is noise; a
    big gap with a compression that hardly changes the policy (int8: KL to its snapshot 1e-4) is the actors'
    lag behind a fast learner, not the compression's fault."""
    guard = CompressionGuard(patience=1, precision="int8")
    assert guard.update(_gap(500, 490, 50.0), 1) is None
    assert guard.update({**_gap(400, 200, 8.0), "compression_kl": 1e-4}, 2) is None
    assert guard.update({**_gap(400, 200, 8.0), "compression_kl": 0.2}, 3) == {"precision": "fp16"}


def test_parse_monitor_auto_and_guard() -> None:
    auto = parse_monitor("auto", precision="int8", sparsity=0.5, compressing=True)
    (guard,) = auto.strategies
    assert isinstance(guard, CompressionGuard) and guard.setting() == {"sparsity": 0.5, "precision": "int8"}
    assert parse_monitor("auto", compressing=False).strategies == []
    custom = parse_monitor("guard:2:3,ladder:0.1", precision="fp16").strategies
    assert isinstance(custom[0], CompressionGuard) and (custom[0].z, custom[0].patience) == (2.0, 3)
    assert isinstance(custom[1], PrecisionLadder)
    with pytest.raises(ValueError, match="guard"):
        parse_monitor("guard:1:2:3")


def test_monitor_z_indicator_and_notes(cartpole_obs: torch.Tensor) -> None:
    """The Monitor passes the reference's spread to the strategies and collects the guard's notes."""
    agent = MLPActorCritic(4, action_desc(gym.spaces.Discrete(2)))
    monitor = Monitor([CompressionGuard(patience=1, precision="int8")], reward_window=5)
    change = monitor.observe(100, agent, agent, cartpole_obs, [20.0, 22.0, 18.0, 20.0, 21.0],
                             reference_return=200.0, reference_std=10.0, reference_episodes=10)
    assert change == {"precision": "fp16"}
    assert monitor.latest()["reward_gap_z"] > 3
    assert [n["step"] for n in monitor.notes()] == [100] and monitor.to_json()["notes"] == monitor.notes()
