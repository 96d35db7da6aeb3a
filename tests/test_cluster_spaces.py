"""ClusterEnv with any Gymnasium space (step(actions)), partial resets, "Disabled" autoreset and step_async/step_wait,
each against SyncVectorEnv on the same env functions (Gymnasium's own tests: benchmarks/gymnasium_peer.py)."""

from __future__ import annotations

import copy
import multiprocessing
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Sequence, Text, Tuple
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from frugalrl import ClusterEnv

pytestmark = pytest.mark.timeout(60)

SPACES = [
    Dict(a=Discrete(3), b=Tuple((Box(-1, 1, (2,)), MultiBinary(3)))),
    Tuple((MultiDiscrete([2, 3]), Text(4), Sequence(Discrete(4)))),
    MultiDiscrete([[2, 3], [4, 5]]),
]


class SpaceEnv(gym.Env):
    """Observations and actions of ``space``: a seeded sample each step, the action checked and echoed."""

    def __init__(self, space: gym.Space, slow: float = 0.0) -> None:
        self.observation_space, self.action_space = copy.deepcopy(space), copy.deepcopy(space)  # a generator each
        self.slow = slow

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(1 << 30)))
        self.t = 0
        return self.observation_space.sample(), {"t": 0}

    def step(self, action):
        assert action in self.action_space, action
        time.sleep(self.slow)
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t % 3 == 0, False, {"t": self.t}


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("space", SPACES, ids=str)
def test_any_space_steps_as_sync_vector_env(space, mode):
    fns = [lambda: SpaceEnv(space) for _ in range(4)]
    ref, env = SyncVectorEnv(fns, autoreset_mode=mode), ClusterEnv(fns, 2, backend="serial", autoreset_mode=mode,
                                                                  episode_statistics=False)
    try:
        assert env.observation_space == ref.observation_space and env.action_space == ref.action_space
        assert data_equivalence(env.reset(seed=3), ref.reset(seed=3))
        ref.action_space.seed(0)
        for _ in range(5):
            actions = ref.action_space.sample()
            assert data_equivalence(env.step(actions), ref.step(actions))
    finally:
        env.close()


def test_partial_reset_and_disabled_autoreset_on_worker_processes():
    fns = [lambda: gym.make("CartPole-v1") for _ in range(3)]
    env = ClusterEnv(fns, 3, autoreset_mode="Disabled")
    try:
        first, _ = env.reset(seed=[0, 1, 2])
        for _ in range(3):
            stepped, *_ = env.step(np.zeros(3, dtype=np.int64))
        again, _ = env.reset(seed=[0, 1, 0], options={"reset_mask": np.array([True, True, False])})
        np.testing.assert_array_equal(again[:2], first[:2])
        np.testing.assert_array_equal(again[2], stepped[2])
        assert env.np_random_seed == (0, 1, 2)
        with pytest.raises(ValueError, match=r"must have shape `\(3,\)`, got \(1,\)"):
            env.reset(options={"reset_mask": np.array([True])})
        with pytest.raises(TypeError, match="must have `dtype=np.bool_`"):
            env.reset(options={"reset_mask": np.array([1, 1, 0])})
    finally:
        env.close()


def test_step_async_and_wait_with_a_timeout():
    env = ClusterEnv([lambda: SpaceEnv(Discrete(2), slow=0.3)], 1, backend="serial")
    try:
        with pytest.raises(NoAsyncCallError, match="without any prior call to `reset_async`"):
            env.reset_wait()
        env.reset_async(seed=0)
        with pytest.raises(AlreadyPendingCallError, match="while waiting for a pending call to `reset`"):
            env.step_async(np.array([0]))
        env.reset_wait()
        env.step_async(np.array([1]))
        with pytest.raises(multiprocessing.TimeoutError):
            env.step_wait(timeout=0.05)
        obs, *_ = env.step(np.array([0]))  # waits for the step that timed out first
        assert obs.shape == (1,)
        env.step_async(np.array([0]))
        with pytest.warns(UserWarning, match="Calling `close` while waiting for a pending call to `step`"):
            env.close()
        with pytest.raises(ClosedEnvironmentError):
            env.reset()
    finally:
        env.close()


class MissionEnv(gym.Env):
    """A position each step and, with ``mission``, a 12-letter string drawn at each reset (minigrid's way)."""

    def __init__(self, mission: bool) -> None:
        parts = {"pos": Box(-1, 1, (2,))} | ({"mission": Text(12, min_length=12)} if mission else {})
        self.observation_space, self.action_space = Dict(parts), Discrete(2)

    def _obs(self):
        return {"pos": self.np_random.uniform(-1, 1, 2).astype(np.float32)} | (
            {"mission": self.mission} if "mission" in self.observation_space.spaces else {})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(1 << 30)))
        self.mission, self.t = self.observation_space["mission"].sample() if "mission" in \
            self.observation_space.spaces else "", 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, self.t == 50, {}


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_a_string_that_stays_through_an_episode_crosses_in_a_numbered_header(backend):
    """Text values travel in the message header: a mission drawn at reset crosses in full with the first replies of
    its episode, then inside a numbered header. Beside the same env without it, 100 steps (two 50-step episodes)
    cost less than a quarter of what sending the strings at every step would (1,146 B against 6,000 here)."""
    steps, sent = 100, []
    for mission in (False, True):
        env = ClusterEnv([lambda mission=mission: MissionEnv(mission) for _ in range(4)], 2, backend=backend,
                         episode_statistics=False)
        try:
            env.reset(seed=0)
            before = dict(env.stats()["bytes"]["up"])
            for _ in range(steps):
                obs, *_ = env.step(np.zeros(4, dtype=np.int64))
            sent.append(sum(v - before.get(k, 0) for k, v in env.stats()["bytes"]["up"].items()))
        finally:
            env.close()
    assert all(len(m) == 12 for m in obs["mission"])
    every_step = steps * 4 * len('"abcdefghijkl",')  # the strings in JSON, every step and env
    assert 0 < sent[1] - sent[0] < every_step / 4, (sent, every_step)


class OddSpace(gym.Space):
    """A custom space: its values could be anything."""


def test_custom_spaces_and_mismatched_envs_are_refused():
    with pytest.raises(ValueError, match="only Gymnasium's own spaces and custom spaces of strings"):
        ClusterEnv([lambda: SpaceEnv(OddSpace())], 1, backend="serial")
    with pytest.raises(RuntimeError, match="observation spaces are not equivalent"):
        ClusterEnv([lambda: SpaceEnv(Discrete(2)), lambda: SpaceEnv(Discrete(3))], 2, backend="serial")
