"""Checkpoints of envs whose reset depends on more than Gymnasium's ``np_random``: MinAtar's games (generators of
their own, the last action carried into the next episode), Atari (ALE's emulator and its sticky-action generator),
and an env of a user's that says what its reset depends on (``get_reset_state`` / ``set_reset_state``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from frugalrl import ClusterEnv

pytestmark = pytest.mark.timeout(120)


class OwnGenerator(gym.Env):
    """A walk whose start and steps draw from a generator of its own, which carries over between episodes."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, hooks: bool = True) -> None:
        self.random = np.random.default_rng(0)
        self.x = np.zeros(2)
        self.t = 0
        if not hooks:
            self.get_reset_state = None  # type: ignore[assignment]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.random = np.random.default_rng(seed)
        self.x, self.t = self.random.normal(size=2), 0
        return self.x.copy(), {}

    def step(self, action):
        self.x = self.x + self.random.normal(size=2) + action
        self.t += 1
        return self.x.copy(), float(self.x[0]), False, self.t >= 7, {}

    def get_reset_state(self):
        return self.random.bit_generator.state

    def set_reset_state(self, state):
        self.random.bit_generator.state = state


def _continue_exactly(env_id, kwargs, steps, expect_inexact=()):
    first, second = (ClusterEnv(env_id, 2, 2 if not isinstance(env_id, list) else 1, seed=11, replayable=True,
                                **kwargs) for _ in range(2))
    n = first.single_action_space.n
    rng = np.random.default_rng(0)
    try:
        first.reset(seed=11)
        ended = 0
        for _ in range(steps):
            _, _, term, trunc, _ = first.step(rng.integers(0, n, first.num_envs))
            ended += int(np.sum(term | trunc))
        assert ended >= 4  # episodes began unseeded, after others
        assert second.load_state_dict(first.state_dict()) == list(expect_inexact)
        if expect_inexact:
            return
        for _ in range(60):
            actions = rng.integers(0, n, first.num_envs)
            for a, b in zip(first.step(actions)[:4], second.step(actions)[:4], strict=True):
                np.testing.assert_array_equal(a, b)
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("game", ["Breakout", "Seaquest"])
def test_minatar_games_continue_exactly(game):
    pytest.importorskip("minatar")
    _continue_exactly(f"MinAtar/{game}-v1", {"backend": "serial"}, 150)


def test_atari_continues_exactly_across_processes():
    """Snapshots from worker processes (ALE's state travels as text in the message's JSON, never as a pickle)."""
    pytest.importorskip("ale_py")
    _continue_exactly("frugalrl.envs.atari:make_atari", {"backend": "local", "inline_workers": 0, "env_kwargs":
                      {"env_id": "ALE/Breakout-v5", "max_episode_steps": 60}}, 200)


def _normalised_cartpole():
    env = gym.wrappers.NormalizeObservation(gym.make("CartPole-v1"))
    return gym.wrappers.NormalizeReward(gym.wrappers.TransformObservation(env, lambda o: o * 2.0, None))


def test_running_statistics_of_gymnasiums_normalising_wrappers():
    """CleanRL's continuous-control envs normalise inside each env: the statistics every episode began with are
    put back, so that the replay, and the run after it, see the very same normalised observations and rewards."""
    _continue_exactly([_normalised_cartpole] * 4, {"backend": "local", "inline_workers": 1}, 100)


def test_an_env_that_says_what_its_reset_depends_on(caplog):
    _continue_exactly(OwnGenerator, {"backend": "serial"}, 30)
    with caplog.at_level("WARNING", logger="frugalrl"):  # without the hooks: new episodes, and a warning that says why
        _continue_exactly(lambda: OwnGenerator(hooks=False), {"backend": "serial"}, 30, expect_inexact=range(4))
    assert "get_reset_state" in caplog.text
