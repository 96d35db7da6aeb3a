"""Gymnasium's ``call`` / ``get_attr`` / ``set_attr`` on ClusterEnv's remote envs, and Gymnasium's vector wrappers on
top of a ClusterEnv: what a drop-in for AsyncVectorEnv must answer."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from frugalrl import ClusterEnv

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_call_get_attr_and_set_attr_reach_the_remote_envs(backend):
    env = ClusterEnv("envs_for_tests:CounterEnv", 2, 2, backend=backend, env_kwargs={"horizon": 50})
    try:
        env.reset(seed=0)
        assert env.get_attr("horizon") == (50, 50, 50, 50)
        env.set_attr("horizon", [3, 4, 5, 6])
        env.set_attr("horizon", 9, envs=[1])
        assert env.get_attr("horizon") == (3, 9, 5, 6)
        zeros = np.zeros(4, dtype=np.int64)
        for _ in range(3):
            *_, truncated, _ = env.step(zeros)
        assert truncated.tolist() == [True, False, False, False]  # the horizons set remotely are the envs' own
        observations = env.call("_obs")  # a method; its arrays come back as arrays
        assert [o.shape for o in observations] == [(2,)] * 4 and observations[1][0] == 3.0
        assert env.call("_obs", envs=[2])[0][0] == 3.0
        assert env.get_attr("observation_space") == (env.single_observation_space,) * 4  # answered by the head
        with pytest.raises(RuntimeError, match="'np_random' of env 0 is a Generator, which cannot travel back"):
            env.get_attr("np_random")
        with pytest.raises(ValueError, match="arguments must be JSON values"):
            env.call("_obs", object())
    finally:
        env.close()


def test_gymnasium_vector_wrappers_work_on_a_cluster_env():
    env = gym.wrappers.vector.NormalizeObservation(
        gym.wrappers.vector.RecordEpisodeStatistics(ClusterEnv("CartPole-v1", 2, 2, backend="serial", seed=1,
                                                               episode_statistics=False)))
    try:
        env.reset(seed=1)
        episodes = 0
        for _ in range(100):
            obs, _, terminated, truncated, info = env.step(env.action_space.sample())
            assert np.isfinite(obs).all()
            if "episode" in info:
                episodes += int(info["_episode"].sum())
        assert episodes > 0
    finally:
        env.close()
