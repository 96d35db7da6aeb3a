"""An endless task for the truncation tests (importable by worker processes): one constant observation, reward 1
every step, never terminated, truncated by a time limit. Its true value is 1 / (1 - γ) at every step; a learner
that treats the time limit as a termination learns less (the mean discounted sum to the limit)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Endless(gym.Env):
    """Observation ``[1.0]``, Discrete(2) actions (both alike), reward 1; only ``TimeLimit`` ends an episode."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-2.0, 2.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.ones(1, dtype=np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.ones(1, dtype=np.float32), 1.0, False, False, {}


def make_endless(horizon: int = 3) -> gym.Env:
    """:class:`Endless` truncated after ``horizon`` steps."""
    return gym.wrappers.TimeLimit(Endless(), max_episode_steps=horizon)
