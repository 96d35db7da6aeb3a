"""ClusterEnv(env_fns): the user's own env functions and wrappers, exactly as Gymnasium's AsyncVectorEnv takes them.

The functions travel head → worker as cloudpickles (closures and lambdas included; never the other way round), so
CleanRL's ``make_env`` thunks with their wrappers run unchanged; the steps match SyncVectorEnv's on the same thunks.
"""

from __future__ import annotations

import importlib.util
import threading

import gymnasium as gym
import numpy as np
import pytest

from frugalrl import ClusterEnv

pytestmark = pytest.mark.timeout(120)


def make_env(env_id: str, gamma: float):
    """CleanRL's ppo_continuous_action.py ``make_env``: a closure with the wrappers and two lambdas."""

    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_cleanrl_thunks_with_wrappers_step_as_sync_vector_env(backend):
    fns = [make_env("Pendulum-v1", 0.99) for _ in range(4)]
    ref = gym.vector.SyncVectorEnv(fns)
    ours = ClusterEnv(fns, num_workers=2, backend=backend)
    try:
        assert ours.num_envs == 4 and ours.envs_per_worker == 2
        obs_ref, _ = ref.reset(seed=1)
        obs, _ = ours.reset(seed=1)
        np.testing.assert_allclose(obs, obs_ref, rtol=1e-6)
        rng = np.random.default_rng(0)
        for _ in range(250):  # past Pendulum's time limit: autoreset too
            actions = rng.uniform(-3, 3, (4, 1)).astype(np.float32)  # outside the box: ClipAction's job
            out_ref, out = ref.step(actions), ours.step(actions)
            for a, b in zip(out[:4], out_ref[:4], strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    finally:
        ref.close()
        ours.close()


def test_an_env_function_that_cannot_travel_is_one_clear_line():
    lock = threading.Lock()

    def holds_a_lock():
        with lock:
            return gym.make("CartPole-v1")

    with pytest.raises(ValueError, match=r"env_fns\[1\] cannot be sent to a worker process \(TypeError: .*lock"):
        ClusterEnv([lambda: gym.make("CartPole-v1"), holds_a_lock], num_workers=2, backend="local")
    serial = ClusterEnv([holds_a_lock, holds_a_lock], num_workers=2, backend="serial")  # nothing travels
    serial.close()
    with pytest.raises(ValueError, match="3 env functions cannot be split evenly into 2 workers"):
        ClusterEnv([holds_a_lock] * 3, num_workers=2, backend="serial")


def test_module_colon_env_id_is_gymnasiums_convention():
    """``"module:EnvId"``: the module registers the id when imported (in the head and in every worker)."""
    env = ClusterEnv("envs_for_tests:FrugalCounter-v0", 2, 1, backend="local")
    try:
        env.reset(seed=0)
        for _ in range(7):
            _, _, _, truncated, _ = env.step(np.zeros(2, dtype=np.int64))
        assert truncated.all()  # the registered horizon of 7
    finally:
        env.close()


def test_env_wrappers_wrap_every_env_of_an_id_in_the_workers_as_rl_zoo_writes_them():
    """``env_wrappers`` (rl-zoo's ``env_wrapper``): a name, rl-zoo's dotted form or a name with its keyword
    arguments; they travel to worker processes as JSON and wrap each env, innermost first."""
    from frugalrl.envs.spec import parse_wrappers, to_env_spec

    wrappers = ["gymnasium.wrappers.RecordEpisodeStatistics", {"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 5}}]
    assert parse_wrappers(wrappers) == (("gymnasium.wrappers:RecordEpisodeStatistics", {}),
                                        ("gymnasium.wrappers:TimeLimit", {"max_episode_steps": 5}))
    env = ClusterEnv("CartPole-v1", 2, 2, backend="local", inline_workers=0, env_wrappers=wrappers)
    try:
        env.reset(seed=0)
        for _ in range(5):
            _, _, terminated, truncated, _ = env.step(np.zeros(4, dtype=np.int64))
        assert truncated.all() and not terminated.any()  # CartPole pushed left ends later than step 5 from a reset
    finally:
        env.close()
    with pytest.raises(ValueError, match="env wrapper 'no_such_module:Wrapper': cannot import module"):
        to_env_spec("CartPole-v1", env_wrappers=["no_such_module:Wrapper"])
    with pytest.raises(ValueError, match="an env wrapper is 'module:Class' or"):
        to_env_spec("CartPole-v1", env_wrappers=[{"a:B": {}, "c:D": {}}])
    with pytest.raises(ValueError, match="env_wrappers cannot be used with a list of env functions"):
        to_env_spec([lambda: gym.make("CartPole-v1")], env_wrappers=["gymnasium.wrappers:TimeLimit"])


def test_an_ale_id_imports_the_package_that_registers_it():
    """Gymnasium 1.x no longer imports ale-py for ``ALE/...`` ids: frugalrl reads ``ALE/Pong-v5`` as
    ``ale_py:ALE/Pong-v5`` (ale-py is a dependency), so a worker process imports it too."""
    from frugalrl.envs.spec import to_env_spec

    assert to_env_spec("ALE/Pong-v5").id == "ale_py:ALE/Pong-v5"
    assert to_env_spec("PongNoFrameskip-v4").id == "ale_py:PongNoFrameskip-v4"  # registered by the same import
    if importlib.util.find_spec("minigrid") is None:  # not a dependency: the error names the package
        with pytest.raises(ValueError, match="pip install minigrid"):
            to_env_spec("MiniGrid-Empty-5x5-v0")
    with pytest.raises(ValueError, match="doesn't exist in namespace ALE"):
        to_env_spec("ALE/NoSuchGame-v5")
    env = ClusterEnv("ALE/Pong-v5", 1, 1, backend="local", inline_workers=0)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (1, 210, 160, 3) and obs.dtype == np.uint8
    finally:
        env.close()


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_minigrid_missions_travel_as_strings_and_step_as_sync_vector_env(backend):
    """minigrid's observations hold its own ``MissionSpace`` (a custom space of strings, with placeholders in
    Fetch): ClusterEnv carries its values as JSON strings, and every observation, reward and flag equals
    SyncVectorEnv's over episodes that end (Fetch's missions change with each episode)."""
    pytest.importorskip("minigrid")
    env_id = "MiniGrid-Fetch-5x5-N2-v0"
    env = ClusterEnv(env_id, num_workers=2, envs_per_worker=2, backend=backend, seed=0)
    ref = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * 4)
    try:
        obs, _ = env.reset(seed=3)
        want, _ = ref.reset(seed=3)
        rng = np.random.default_rng(0)
        missions = set()
        for _ in range(120):
            assert obs["mission"] == want["mission"] and isinstance(obs["mission"], tuple)
            assert np.array_equal(obs["image"], want["image"]) and np.array_equal(obs["direction"], want["direction"])
            missions.update(obs["mission"])
            actions = rng.integers(0, 7, size=4)
            obs, reward, term, trunc, _ = env.step(actions)
            want, want_reward, want_term, want_trunc, _ = ref.step(actions)
            assert np.array_equal(reward, want_reward) and np.array_equal(term | trunc, want_term | want_trunc)
        assert len(missions) > 1
    finally:
        env.close()
        ref.close()


def test_a_minatar_id_registers_minatars_own_envs_in_every_worker():
    """MinAtar's package defines ``MinAtar/<Game>-v1`` ids but registers them only when asked: frugalrl reads the id
    as ``frugalrl.envs.minatar:MinAtar/...``, whose import registers them (for its own MinAtarEnv, the same game
    without minatar's display libraries), in a worker process too."""
    from frugalrl.envs.spec import to_env_spec

    assert to_env_spec("MinAtar/Freeway-v1").id == "frugalrl.envs.minatar:MinAtar/Freeway-v1"
    env = ClusterEnv("MinAtar/Freeway-v1", 1, 2, backend="local", inline_workers=0)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 10, 10, 7) and obs.dtype == bool
        assert env.single_action_space.n == 3  # v1: the minimal action set
        env.step(np.array([1, 2]))
    finally:
        env.close()


def test_an_env_function_may_make_an_id_its_script_registered():
    """CleanRL's Atari thunks call ``gym.make("BreakoutNoFrameskip-v4")`` in a script that imported ale-py. A
    ClusterEnv worker process is spawned, not forked (as AsyncVectorEnv's are), so ale-py is not imported there:
    the worker imports the packages that register ids and builds the env."""

    def make_env():
        def thunk():
            return gym.wrappers.RecordEpisodeStatistics(gym.make("PongNoFrameskip-v4"))
        return thunk

    env = ClusterEnv([make_env(), make_env()], 1, backend="local", inline_workers=0)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 210, 160, 3)
    finally:
        env.close()
