"""SB3VecEnv: ClusterEnv as a Stable-Baselines3 VecEnv, checked against SB3's own DummyVecEnv of
Monitor-wrapped envs (same seeds, same actions), and trained on by SB3's PPO and A2C.
"""

from __future__ import annotations

import os
import signal
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import pid_exists, wait_dead

pytest.importorskip("stable_baselines3")

from stable_baselines3 import A2C, PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize  # noqa: E402

from frugalrl import ClusterEnv  # noqa: E402
from frugalrl.integrations.sb3 import SB3VecEnv, make_sb3_vec_env  # noqa: E402

pytestmark = pytest.mark.timeout(180)

W, K = 2, 2
N = W * K
HORIZON = 30  # CartPole's time limit here, so that episodes end by truncation too


class StepInfo(gym.Wrapper):
    """CartPole with numeric infos at reset (``start``) and at every step (``steps``)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.steps = 0
        return obs, {**info, "start": 1}

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        self.steps += 1
        return obs, r, te, tr, {**info, "steps": self.steps}


def info_cartpole(**kwargs) -> gym.Env:
    return StepInfo(gym.make("CartPole-v1", **kwargs))


def random_actions(space: gym.Space, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, size=n)
    return rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(np.float32)


def compare_with_dummy(venv: VecEnv, ref: VecEnv, steps: int, seed: int) -> dict[str, int]:
    """Step ``venv`` and SB3's ``ref`` with the same actions; every return value must be the same."""
    assert venv.seed(seed) == ref.seed(seed) == [seed + j for j in range(venv.num_envs)]
    obs, ref_obs = venv.reset(), ref.reset()
    assert isinstance(obs, np.ndarray)
    np.testing.assert_array_equal(obs, ref_obs)
    assert venv.reset_infos == ref.reset_infos
    rng = np.random.default_rng(seed)
    counts = {"terminated": 0, "truncated": 0}
    for t in range(steps):
        actions = random_actions(venv.action_space, venv.num_envs, rng)
        out, ref_out = venv.step(actions), ref.step(actions)
        assert len(out) == 4
        obs, rewards, dones, infos = out
        for name, a, b in zip(("obs", "rewards", "dones"), out[:3], ref_out[:3], strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, (t, name, a.shape, b.shape, a.dtype, b.dtype)
            np.testing.assert_array_equal(a, b, err_msg=f"step {t}: {name}")
        assert obs.shape == (venv.num_envs, *venv.observation_space.shape)
        assert obs.dtype == venv.observation_space.dtype
        assert all(venv.observation_space.contains(o) for o in obs)
        assert isinstance(infos, list) and len(infos) == venv.num_envs
        for i, (info, ref_info) in enumerate(zip(infos, ref_out[3], strict=True)):
            assert isinstance(info["TimeLimit.truncated"], bool)
            if dones[i]:
                term = info.pop("terminal_observation")
                np.testing.assert_array_equal(term, ref_info.pop("terminal_observation"))
                assert term.dtype == venv.observation_space.dtype and venv.observation_space.contains(term)
                assert not np.array_equal(term, obs[i])  # the returned obs already is the next episode's
                episode, ref_episode = info.pop("episode"), ref_info.pop("episode")
                assert episode["r"] == ref_episode["r"] and episode["l"] == ref_episode["l"], (t, i)
                assert episode["t"] >= 0
                assert info.pop("frugalrl/bytes_total") > 0
                counts["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
            else:
                assert "terminal_observation" not in info and "episode" not in info
            assert info == ref_info, (t, i)
        assert venv.reset_infos == ref.reset_infos
    return counts


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_matches_sb3_dummy_vec_env_on_cartpole(backend, closing):
    venv = closing(make_sb3_vec_env("CartPole-v1", W, K, backend=backend, env_kwargs={"max_episode_steps": HORIZON}))
    assert isinstance(venv, VecEnv) and venv.num_envs == N
    assert venv.observation_space == gym.make("CartPole-v1").observation_space
    assert venv.action_space == gym.spaces.Discrete(2)
    ref = DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1", max_episode_steps=HORIZON)) for _ in range(N)])
    counts = compare_with_dummy(venv, ref, steps=250, seed=11)
    assert counts["terminated"] >= 5 and counts["truncated"] >= 1, counts


def test_env_infos_and_reset_infos_like_dummy_vec_env(closing):
    """The env's own infos: step infos in ``infos`` (the final step's for a finished env), reset infos in
    ``reset_infos``, exactly as in DummyVecEnv."""
    venv = closing(make_sb3_vec_env(info_cartpole, 1, 3, backend="serial"))
    ref = DummyVecEnv([lambda: Monitor(info_cartpole()) for _ in range(3)])
    assert compare_with_dummy(venv, ref, steps=120, seed=3)["terminated"] >= 5
    assert venv.reset_infos == [{"start": 1}] * 3


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_each_envs_info_keeps_its_own_dtype(backend, closing):
    """FrozenLake's ``prob`` is an int after a reset and a float after a step. A Gymnasium vector env casts every
    env's value to the first env's dtype (0.333 → 0 when env 0 just reset); SB3's envs each report their own,
    and so does the adapter."""
    venv = closing(make_sb3_vec_env("FrozenLake-v1", W, K, backend=backend))
    ref = DummyVecEnv([lambda: Monitor(gym.make("FrozenLake-v1")) for _ in range(N)])
    assert compare_with_dummy(venv, ref, steps=150, seed=7)["terminated"] >= 5


def test_box_actions_like_dummy_vec_env(closing):
    venv = closing(make_sb3_vec_env("Pendulum-v1", 1, 2, backend="serial", env_kwargs={"max_episode_steps": 7}))
    ref = DummyVecEnv([lambda: Monitor(gym.make("Pendulum-v1", max_episode_steps=7)) for _ in range(2)])
    counts = compare_with_dummy(venv, ref, steps=20, seed=5)
    assert counts == {"terminated": 0, "truncated": 4}


def test_seed_then_reset_is_reproducible(closing):
    venv = closing(make_sb3_vec_env("CartPole-v1", 1, 3, backend="serial", seed=4))
    first = venv.reset()  # the seed given to make_sb3_vec_env
    np.testing.assert_array_equal(first, np.stack([gym.make("CartPole-v1").reset(seed=4 + j)[0] for j in range(3)]))
    assert not np.array_equal(venv.reset(), first)  # seeds are used once
    actions = np.array([0, 1, 1])

    def play() -> list[np.ndarray]:
        out = [venv.reset()]
        for _ in range(40):
            obs, rewards, dones, _ = venv.step(actions)
            out += [obs, rewards, dones]
        return out

    assert venv.seed(99) == [99, 100, 101]
    a = play()
    venv.seed(99)
    b = play()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    seeds = venv.seed()  # a random seed, still consecutive
    assert all(isinstance(s, int) for s in seeds) and seeds == [seeds[0] + j for j in range(3)]
    venv._seeds = [1, 5, 2]  # not ClusterEnv's seed + j: they travel in the reset options to each env
    venv.set_options([{"low": -0.01, "high": 0.01}, {}, {}])
    obs = venv.reset()
    np.testing.assert_array_equal(obs[0], gym.make("CartPole-v1").reset(seed=1, options={"low": -0.01, "high": 0.01})[0])
    np.testing.assert_array_equal(obs[1:], np.stack([gym.make("CartPole-v1").reset(seed=s)[0] for s in (5, 2)]))
    bare = closing(SB3VecEnv(ClusterEnv("CartPole-v1", 1, 3, backend="serial", autoreset_mode="SameStep")))
    bare._seeds = [1, 5, 2]  # a ClusterEnv not built by the adapter cannot apply them
    with pytest.raises(ValueError, match="seed \\+ j"):
        bare.reset()
    bare._reset_seeds()
    bare.set_options([{"a": 1}, {}, {}])
    with pytest.raises(ValueError, match="same options"):
        bare.reset()


def test_attributes_methods_and_wrappers(closing):
    venv = closing(make_sb3_vec_env("CartPole-v1", 1, 2, backend="serial"))
    assert venv.render_mode == "rgb_array" and venv.metadata == {"render_modes": ["human", "rgb_array"]}  # as SB3's
    assert venv.get_attr("render_mode") == ["rgb_array", "rgb_array"]
    assert [s.id for s in venv.get_attr("spec", indices=1)] == ["CartPole-v1"]
    assert venv.get_attr("action_space", [0, 1]) == [gym.spaces.Discrete(2)] * 2
    assert venv.get_attr("observation_space", 0) == [venv.observation_space]
    assert venv.get_attr("metadata")[0]["render_fps"] == 50
    assert venv.has_attr("spec") and venv.has_attr("gravity") and not venv.has_attr("no_such_attribute")
    with pytest.raises(AttributeError, match="env 0 has no attribute 'no_such_attribute'"):
        venv.get_attr("no_such_attribute")
    venv.set_attr("gravity", 1.0, indices=[1])  # in the worker's env, through its wrappers
    assert venv.get_attr("gravity") == [9.8, 1.0]
    assert venv.env_method("get_wrapper_attr", "gravity", indices=[1]) == [1.0]
    assert venv.env_is_wrapped(Monitor) == [True, True]  # make_vec_env's Monitor, in the workers
    assert venv.env_is_wrapped(gym.wrappers.TimeLimit, indices=-1) == [True]  # gym.make's wrappers
    assert venv.env_is_wrapped(gym.wrappers.ClipAction) == [False, False]
    with pytest.raises(RuntimeError, match="step_async"):
        venv.step_wait()
    before = venv.bytes["total"]
    assert 0 < before == venv.bytes["control"]  # only the attribute calls have travelled yet
    venv.reset()
    assert venv.bytes["total"] > before and venv.stats()["bytes"]["total"] == venv.bytes["total"]
    assert venv.get_images()[1].shape == (400, 600, 3) and venv.render().shape == (800, 600, 3)  # tiled
    assert "SB3VecEnv(ClusterEnv(env_fns (CartPole-v1)" in repr(venv)
    bare = closing(SB3VecEnv(ClusterEnv("CartPole-v1", 1, 2, backend="serial", autoreset_mode="SameStep")))
    assert bare.env_is_wrapped(Monitor) == [True, True]  # the adapter records Monitor's statistics
    with pytest.warns(UserWarning, match="render mode is None"):
        assert bare.get_images() == [None, None]
    with pytest.warns(UserWarning):
        assert bare.render() is None


def test_needs_same_step_autoreset():
    cluster = ClusterEnv("CartPole-v1", 1, 1, backend="serial", seed=0)  # NextStep, Gymnasium's default
    try:
        with pytest.raises(ValueError, match="autoreset_mode='SameStep'"):
            SB3VecEnv(cluster)
    finally:
        cluster.close()
    with pytest.raises(ValueError, match="autoreset_mode='SameStep'"):
        make_sb3_vec_env("CartPole-v1", 1, 1, backend="serial", autoreset_mode="NextStep")
    with pytest.raises(TypeError, match="ClusterEnv"):
        SB3VecEnv(DummyVecEnv([lambda: gym.make("CartPole-v1")]))  # type: ignore[arg-type]


def test_close_is_idempotent_and_stops_the_workers():
    venv = make_sb3_vec_env("CartPole-v1", W, 1, seed=0, inline_workers=0)
    pids = list(venv.cluster.backend.worker_pids().values())
    venv.reset()
    venv.close()
    venv.close()
    assert all(wait_dead(p) for p in pids) and not any(pid_exists(p) for p in pids)
    with pytest.raises(RuntimeError, match="closed"):
        venv.reset()


def test_a_killed_worker_ends_its_envs_episodes_as_truncated(closing):
    venv = closing(make_sb3_vec_env("CartPole-v1", W, K, seed=1, inline_workers=0))
    obs = venv.reset()
    zeros = np.zeros(N, dtype=np.int64)
    for _ in range(3):
        obs, *_ = venv.step(zeros)
    pid = venv.cluster.backend.worker_pids()[0]
    os.kill(pid, signal.SIGKILL)
    assert wait_dead(pid)
    new_obs, rewards, dones, infos = venv.step(zeros)
    assert dones[:K].all() and not dones[K:].any()
    for j in range(K):
        assert infos[j]["frugalrl/worker_restarted"] and infos[j]["TimeLimit.truncated"]
        np.testing.assert_array_equal(infos[j]["terminal_observation"], obs[j])
        assert infos[j]["episode"]["l"] == 3 and infos[j]["episode"]["r"] == 3.0
        assert (np.abs(new_obs[j]) <= 0.05).all()  # a fresh episode
    assert all("frugalrl/worker_restarted" not in info for info in infos[K:])
    assert venv.stats()["restarts"] == 1
    _, rewards, dones, _ = venv.step(zeros)
    assert (rewards == 1).all()


class InfoLog(BaseCallback):
    """Keeps the ``frugalrl/bytes_total`` counts that finished episodes report."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes_totals: list[int] = []

    def _on_step(self) -> bool:
        self.bytes_totals += [info["frugalrl/bytes_total"] for info in self.locals["infos"] if "episode" in info]
        return True


@pytest.mark.slow  # ~20 s: CI runs it in `make test-slow`; the default suite must stay under 15 min on 2 cores
def test_sb3_ppo_learns_cartpole_on_clusterenv(closing):
    """SB3's PPO (rl-zoo's CartPole-v1 hyperparameters) on 2 local worker processes x 4 envs, 40k steps.

    Deterministic evaluation over 10 episodes, measured at 40k steps for seeds 0..7 on a 2-core machine:
    500, 500, 500, 500, 500, 488.6, 500, 458.4 (at 30k steps: 500, 500, 500, 305, 111). A random policy
    scores about 22; the threshold 200 leaves room for other CPUs' floating-point paths.
    """
    torch.set_num_threads(1)
    t0 = time.monotonic()
    venv = closing(make_sb3_vec_env("CartPole-v1", num_workers=2, envs_per_worker=4, seed=0))
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=lambda f: 1e-3 * f, clip_range=lambda f: 0.2 * f, seed=0, device="cpu")
    log = InfoLog()
    model.learn(40_000, callback=log)
    assert len(model.ep_info_buffer) > 0  # SB3's logger got the Monitor statistics
    mean, _ = evaluate_policy(model, venv, n_eval_episodes=10, deterministic=True)
    assert mean >= 200, f"PPO's mean evaluation return {mean} after 40k steps"
    assert log.bytes_totals and log.bytes_totals[0] > 0 and log.bytes_totals == sorted(log.bytes_totals)
    assert venv.bytes["total"] >= log.bytes_totals[-1] and venv.bytes["observations"] > 0
    assert time.monotonic() - t0 < 150


def test_sb3_a2c_trains_through_vec_normalize(closing):
    torch.set_num_threads(1)
    venv = closing(make_sb3_vec_env("CartPole-v1", num_workers=2, envs_per_worker=2, seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning from SB3 about the env
        model = A2C("MlpPolicy", VecNormalize(venv), n_steps=8, seed=1, device="cpu")
        model.learn(2_000)
    assert model.num_timesteps >= 2_000 and len(model.ep_info_buffer) > 0
    assert venv.bytes["total"] > 0


def test_make_sb3_vec_env_takes_make_vec_envs_arguments(closing):
    """``wrapper_class`` / ``wrapper_kwargs`` wrap each env in the workers, ``env_kwargs`` reach the env and
    ``vec_env_kwargs`` the ClusterEnv, as SB3's ``make_vec_env`` passes them."""
    venv = closing(make_sb3_vec_env("Pendulum-v1", 2, 1, backend="local", seed=0, env_kwargs={"g": 3.0},
                                    wrapper_class=gym.wrappers.TimeLimit, wrapper_kwargs={"max_episode_steps": 7},
                                    vec_env_kwargs={"uplink": "none"}))
    venv.reset()
    for _ in range(7):
        _, _, dones, infos = venv.step(np.zeros((2, 1), dtype=np.float32))
    assert dones.all() and all(info["TimeLimit.truncated"] for info in infos)  # the wrapper's 7 steps, not 200
    assert venv.get_attr("g") == [3.0, 3.0] and venv.cluster.uplink.compressor == "none"
