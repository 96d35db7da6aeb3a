"""Batched infos: :func:`flat_infos` (one array per key) gives exactly what :func:`add_info` (env by env, as
Gymnasium's ``_add_info``) gives, or declines; and a MuJoCo env's step infos through a ClusterEnv are
SyncVectorEnv's."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frugalrl.infos import add_info, flat_infos

SCALARS = {
    "float": st.floats(allow_nan=False, width=64),
    "int": st.integers(-(2**62), 2**62),
    "bool": st.booleans(),
    "np.float32": st.floats(width=32, allow_nan=False).map(np.float32),
    "np.int32": st.integers(-(2**31), 2**31 - 1).map(np.int32),
    "np.bool_": st.booleans().map(np.bool_),
    "big int": st.integers(2**64, 2**70),
}


def env_by_env(infos: dict[int, dict], k: int) -> dict:
    batched: dict = {}
    for i, info in infos.items():
        add_info(batched, info, i, k, {})
    return batched


def assert_same(ours: dict, ref: dict) -> None:
    assert list(ours) == list(ref)  # the same keys, in the same order (value, then its mask)
    for key, b in ref.items():
        a = ours[key]
        assert a.dtype == b.dtype and a.shape == b.shape, (key, a.dtype, b.dtype)
        np.testing.assert_array_equal(a, b)


@st.composite
def step_infos(draw: st.DrawFn) -> tuple[dict[int, dict], int]:
    """The infos of some of ``k`` envs at one step: mostly the same keys with values of one type per key; sometimes
    a key missing, reordered or of another type in one env."""
    k = draw(st.integers(1, 6))
    envs = sorted(draw(st.sets(st.integers(0, k - 1), min_size=1)))
    keys = draw(st.lists(st.sampled_from(["a", "b", "x_position", "lives", "_x", "y"]), min_size=1, max_size=4,
                         unique=True))
    kinds = {key: draw(st.sampled_from(sorted(SCALARS))) for key in keys}
    infos = {i: {key: draw(SCALARS[kinds[key]]) for key in keys} for i in envs}
    odd = draw(st.sampled_from(["none", "type", "missing", "order"]))
    i = draw(st.sampled_from(envs))
    if odd == "type":
        infos[i][keys[0]] = draw(SCALARS[draw(st.sampled_from(sorted(SCALARS)))])
    elif odd == "missing" and len(keys) > 1:
        del infos[i][keys[-1]]
    elif odd == "order" and len(keys) > 1:
        infos[i] = dict(reversed(list(infos[i].items())))
    return infos, k


@settings(max_examples=300, deadline=None)
@given(step_infos())
def test_flat_infos_is_add_info_env_by_env_or_declines(case):
    infos, k = case
    flat = flat_infos(infos, k)
    if flat is not None:
        assert_same(flat, env_by_env(infos, k))


def test_flat_infos_takes_the_common_case():
    """MuJoCo's and ALE's infos (same keys, floats or ints) are taken; a key's type changing between envs is not."""
    infos = {0: {"x": 1.5, "lives": 3}, 2: {"x": -0.5, "lives": 2}}
    flat = flat_infos(infos, 3)
    assert flat is not None
    assert_same(flat, env_by_env(infos, 3))
    assert flat_infos({0: {"prob": 1}, 1: {"prob": 0.333}}, 2) is None  # FrozenLake's: the first env's dtype rules


def test_mujoco_step_infos_are_syncvectorenvs():
    """HalfCheetah's infos (six floats per step) through ClusterEnv's workers: every key, dtype and value of
    SyncVectorEnv's, across a truncation."""
    pytest.importorskip("mujoco")
    from frugalrl import ClusterEnv

    n = 4
    make = [lambda: gym.make("HalfCheetah-v5", max_episode_steps=20)] * n
    env = ClusterEnv(make, num_workers=2, backend="serial", seed=0, episode_statistics=False)
    ref = gym.vector.SyncVectorEnv(make)
    try:
        env.reset(seed=0)
        ref.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(25):
            actions = rng.uniform(-1, 1, size=(n, 6)).astype(np.float32)
            ours, theirs = env.step(actions)[4], ref.step(actions)[4]
            assert_same(ours, theirs)
    finally:
        env.close()
        ref.close()
