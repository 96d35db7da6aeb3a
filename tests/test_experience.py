"""The experience core (frugalrl.experience): one contract over its two groups, checked against Gymnasium.

``EnvGroup`` (k single envs, what workers, HSA2C and pipeline stage 0 step) and ``VectorGroup`` (any Gymnasium
vector env, what ``collect_rollout`` steps) must give the same steps and fragments as Gymnasium's own
SyncVectorEnv for both autoreset modes: rewards, flags, which envs only reset, final observations, episode
statistics.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frugalrl.experience import (
    NEXT_STEP,
    SAME_STEP,
    EnvGroup,
    NonFiniteExperience,
    VectorGroup,
    collect_fragment,
)

MODES = (NEXT_STEP, SAME_STEP)


def groups(env_id: str, k: int, mode: str, seed: int) -> tuple[EnvGroup, VectorGroup]:
    """The same k envs, seeded alike, as an EnvGroup and as a VectorGroup over SyncVectorEnv."""
    mine = EnvGroup([gym.make(env_id) for _ in range(k)], autoreset=mode)  # type: ignore[arg-type]
    mine.reset_all(seed)
    vec = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(k)],
                                   autoreset_mode=gym.vector.AutoresetMode(mode))
    return mine, VectorGroup(vec, seed=seed)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**16), horizon=st.integers(1, 12))
def test_env_group_steps_as_a_gymnasium_vector_env(mode, seed, horizon):
    """Random actions, short time limits (so both truncations and CartPole's terminations happen): every step of
    the two groups agrees field by field, and with Gymnasium's observations."""
    gym.register("ShortCartPole-v1", "gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=horizon)
    try:
        mine, ref = groups("ShortCartPole-v1", 3, mode, seed)
        rng = np.random.default_rng(seed)
        for _ in range(40):
            actions = rng.integers(0, 2, 3)
            a, b = mine.step(actions), ref.step(actions)
            assert np.array_equal(mine.obs, ref.obs)
            for name in ("rewards", "terminations", "truncations"):
                assert np.array_equal(getattr(a, name), getattr(b, name)), name
            assert (a.reset_only, a.ended, a.episode_returns, a.episode_lengths) == (
                b.reset_only, b.ended, b.episode_returns, b.episode_lengths)
            assert all(np.array_equal(x, y) for x, y in zip(a.final_obs, b.final_obs, strict=True))
        mine.close()
        ref.vec.close()
    finally:
        gym.registry.pop("ShortCartPole-v1")


@pytest.mark.parametrize("mode", MODES)
def test_fragments_agree_and_keep_every_final_observation(mode):
    """``collect_fragment`` over either group: the same fragment; a NEXT_STEP group is still stepped same-step
    (a fragment has no reset-only steps) and its VectorGroup marks those steps invalid instead."""
    mine, ref = groups("Pendulum-v1", 2, mode, seed=3)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-3, 3, (450, 2, 1)).astype(np.float32)  # beyond the bounds: clipped to ±2
    it = iter(range(450))

    def policy(obs):
        return actions[next(it)], None

    a = collect_fragment(mine, policy, 450)
    it = iter(range(450))
    b = collect_fragment(ref, policy, 450)
    assert a.valid is None and len(a.episode_returns) == 4  # Pendulum truncates at 200: envs 0 and 1, twice
    assert a.final_idx.tolist() == [[199, 0], [199, 1], [399, 0], [399, 1]] and not a.terminations.any()
    assert len(a.truncated_final_obs()) == 4
    if mode == SAME_STEP:
        for name in ("obs", "actions", "rewards", "terminations", "truncations", "next_obs", "final_idx", "final_obs"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert a.episode_returns == b.episode_returns and a.episode_lengths == b.episode_lengths == [200] * 4
    else:  # Gymnasium's next step only resets: an invalid step after each episode end, the next end one step later
        assert b.valid is not None and np.argwhere(~b.valid).tolist() == [[200, 0], [200, 1], [401, 0], [401, 1]]
        assert b.final_idx.tolist() == [[199, 0], [199, 1], [400, 0], [400, 1]]


def test_non_finite_observation_names_the_env():
    """The check runs once per step; the error names the env that produced the NaN, not its neighbour."""
    from envs_for_tests import CounterEnv, NaNObsEnv

    group = EnvGroup([CounterEnv(), NaNObsEnv(nan_after=2)], where=lambda i: f"env {i} (test)")
    group.reset_all(0)
    group.step([0, 0])
    with pytest.raises(NonFiniteExperience, match=r"non-finite observation \(NaN or inf\) from env 1 \(test\)"):
        group.step([0, 0])
    unchecked = EnvGroup([NaNObsEnv(nan_after=1)], check_finite=False)
    unchecked.reset_all(0)
    assert np.isnan(unchecked.step([0]).rewards).sum() == 0 and np.isnan(unchecked.obs).any()
