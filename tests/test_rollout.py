"""collect_rollout: head-side rollouts from any Gymnasium vector env (ClusterEnv included)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from frugalrl import ClusterEnv, collect_rollout, make_agent

pytestmark = pytest.mark.timeout(60)

N = 3


def _agent(envs, seed=0):
    torch.manual_seed(seed)
    return make_agent(envs.single_observation_space, envs.single_action_space, hidden=(16, 16))


def _sync(env_id, mode):
    return SyncVectorEnv([lambda: gym.make(env_id) for _ in range(N)], autoreset_mode=mode)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_structure_on_sync_vector_env(mode):
    envs = _sync("CartPole-v1", mode)
    agent = _agent(envs)
    state = {"seed": 0}
    T = 120
    ro = collect_rollout(envs, agent, T, state)
    assert ro.obs.shape == (T, N, 4) and ro.actions.shape == (T, N) and ro.dist_params.shape == (T, N, 2)
    assert ro.rewards.dtype == np.float32 and ro.next_obs.shape == (N, 4)
    done = ro.terminations | ro.truncations
    assert sorted(map(tuple, ro.final_idx.tolist())) == sorted(map(tuple, np.argwhere(done).tolist()))
    assert len(ro.final_idx) >= 3
    for (t, j), fo in zip(ro.final_idx, ro.final_obs, strict=True):
        assert abs(fo[0]) > 2.4 or abs(fo[2]) > 0.2094 or ro.truncations[t, j]
    if mode == AutoresetMode.NEXT_STEP:
        # The step after an episode ends only resets the env: it is marked invalid, and only it.
        assert ro.valid is not None
        expected = np.ones((T, N), bool)
        expected[1:][done[:-1]] = False
        np.testing.assert_array_equal(ro.valid, expected)
        assert (ro.rewards[~ro.valid] == 0).all()
    else:
        assert ro.valid is None
    # CartPole pays 1 per (valid) step: returns equal lengths.
    np.testing.assert_array_equal(ro.episode_returns, ro.episode_lengths)
    assert len(ro.episode_returns) == int(done.sum())
    # The next call continues where this one stopped.
    ro2 = collect_rollout(envs, agent, 5, state)
    np.testing.assert_array_equal(ro2.obs[0], ro.next_obs)
    envs.close()


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_cluster_env_is_a_drop_in_for_collect_rollout(mode):
    """Head-side inference over ClusterEnv gives exactly what it gives over SyncVectorEnv."""
    cluster = ClusterEnv("CartPole-v1", N, 1, backend="serial", seed=0, autoreset_mode=mode)
    ref = _sync("CartPole-v1", AutoresetMode(mode))
    agent = _agent(ref, seed=1)
    a = collect_rollout(cluster, agent, 80, {"seed": 4})
    b = collect_rollout(ref, agent, 80, {"seed": 4})
    for name in ("obs", "actions", "rewards", "terminations", "truncations", "dist_params", "final_idx",
                 "final_obs", "next_obs"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert (a.valid is None) == (b.valid is None)
    assert a.episode_returns == b.episode_returns
    cluster.close()


def test_box_actions_are_clipped_for_the_env_and_kept_raw_in_the_batch():
    envs = _sync("Pendulum-v1", AutoresetMode.NEXT_STEP)
    agent = _agent(envs, seed=2)
    with torch.no_grad():
        agent.log_std.fill_(1.5)  # wide: many samples fall outside [-2, 2]
    ro = collect_rollout(envs, agent, 50, {"seed": 1})
    assert ro.actions.shape == (50, N, 1) and ro.actions.dtype == np.float32
    assert (np.abs(ro.actions) > 2).any()  # the batch keeps what the policy sampled
    logp = ro.behaviour_log_prob()
    assert logp.shape == (50, N) and torch.isfinite(logp).all()
    envs.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_rollouts_ahead_hand_out_each_rollout_once_in_order(overlap):
    """With overlap the next rollout runs on a thread between take() and take(); without, take() runs it: the
    same rollouts either way, each with the arguments it was started with."""
    import threading

    from frugalrl.rollout import RolloutsAhead

    threads: list[str] = []

    def rollout(actor: int) -> int:
        threads.append(threading.current_thread().name)
        return actor * 10

    ahead = RolloutsAhead(rollout, overlap)
    ahead.start(1)
    taken = []
    for actor in (2, 3, 4):
        taken.append(ahead.take(actor - 1))
        ahead.start(actor)
    taken.append(ahead.take(4))
    ahead.close()
    assert taken == [10, 20, 30, 40] and len(threads) == 4
    assert all(name != threading.main_thread().name for name in threads) == overlap


def test_rollouts_ahead_close_waits_and_keeps_the_loops_own_error():
    from frugalrl.rollout import RolloutsAhead

    def failing() -> None:
        raise RuntimeError("a worker died")

    ahead = RolloutsAhead(failing, overlap=True)
    ahead.start()
    ahead.close()  # the rollout's error is not raised here; the loop that stopped raises its own
    assert ahead.pool is None and ahead.pending is None
    with pytest.raises(RuntimeError, match="a worker died"):
        RolloutsAhead(failing, overlap=True).take()  # taken, an error is the caller's
