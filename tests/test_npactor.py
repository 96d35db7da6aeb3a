"""The numpy actor the workers act with: PyTorch's distribution parameters, a correct sampler, rebuilt on new weights."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from frugalrl import ClusterEnv, make_agent
from frugalrl.nets import MLPActorCritic, NatureCNNActorCritic
from frugalrl.npactor import NumpyActor, one_blas_thread

pytestmark = pytest.mark.timeout(60)

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
OBS = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)


def _obs(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, 5)) * 3).astype(np.float32)


@pytest.mark.parametrize("action", [gym.spaces.Discrete(4), BOX])
@pytest.mark.parametrize("options", [{}, {"activation": "relu", "hidden": (32, 16, 8)}, {"obs_norm": True}])
def test_parameters_are_pytorchs(action, options):
    agent = make_agent(OBS, action, **options)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        if agent.obs_norm is not None:
            agent.obs_norm.mean.fill_(0.5)
            agent.obs_norm.var.fill_(4.0)
    actor = NumpyActor.of(agent)
    assert actor is not None
    obs = _obs(64)
    with torch.no_grad():
        expected = agent.dist_params(torch.from_numpy(obs)).numpy()
    got = actor.params(obs)
    assert got.dtype == np.float32 and got.shape == expected.shape
    # float32 sums in another order: errors scale with the largest terms (logits of ~250 here), not each result
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(expected).max())))


def test_other_agents_keep_pytorch():
    assert NumpyActor.of(make_agent(OBS, BOX, sde=True)) is None
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert NumpyActor.of(NatureCNNActorCritic((4, 84, 84), {"type": "discrete", "n": 3})) is None
    assert NumpyActor.of(make_agent(frames, gym.spaces.Discrete(3))) is None

    class Custom(MLPActorCritic):
        pass

    assert NumpyActor.of(Custom(5, {"type": "discrete", "n": 2})) is None  # a subclass may change dist_params


def test_samples_follow_the_distribution():
    g = torch.Generator().manual_seed(0)
    logits = np.array([[2.0, 0.0, -1.0, -30.0, 0.5]], dtype=np.float32).repeat(40_000, 0)
    actor = NumpyActor([], "categorical", None, None)
    draws = actor.sample(logits, g)
    assert draws.dtype == np.int64 and draws.min() >= 0 and draws.max() <= 4
    p = np.exp(logits[0] - logits[0].max())
    p /= p.sum()
    freq = np.bincount(draws, minlength=5) / len(draws)
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / len(draws)) + 1e-4)
    assert freq[3] == 0.0  # a probability of e^-32 is not drawn in 40k tries

    params = np.array([[1.0, -2.0, np.log(0.5), np.log(3.0)]], dtype=np.float32).repeat(40_000, 0)
    draws = NumpyActor([], "gaussian", None, None).sample(params, g)
    assert draws.dtype == np.float32 and draws.shape == (40_000, 2)
    np.testing.assert_allclose(draws.mean(0), [1.0, -2.0], atol=0.05)
    np.testing.assert_allclose(draws.std(0), [0.5, 3.0], rtol=0.03)


def test_a_worker_acts_with_the_weights_it_holds():
    """New weights (a new version) are what the workers' next actions come from."""
    env = ClusterEnv("CartPole-v1", 1, 4, backend="serial", seed=0)
    agent = make_agent(env.single_observation_space, env.single_action_space)
    obs, _ = env.reset(seed=0)
    try:
        for _ in range(3):
            with torch.no_grad():
                agent.actor[-1].weight.mul_(50.0)  # sharper logits at each version: each step syncs
            before = obs
            obs, *_, infos = env.step(agent)
            with torch.no_grad():
                expected = agent.dist_params(torch.from_numpy(before)).numpy()
            np.testing.assert_allclose(infos["dist_params"], expected, rtol=1e-5, atol=1e-5)
    finally:
        env.close()


def test_one_blas_thread_holds_inside_and_gives_back_the_limits_after():
    """The head's recompute runs numpy's BLAS on one thread (a second one would spin on a worker's core); the
    user's own limits come back afterwards."""
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:  # numpy's own (other libraries' may load after the first use: not ours)
        return [pool["num_threads"] for pool in threadpool_info()
                if pool["user_api"] == "blas" and "numpy" in pool["filepath"]]

    before = blas_threads()
    assert before
    with one_blas_thread():
        assert blas_threads() == [1] * len(before)
        a = np.ones((512, 64), np.float32)
        assert float((a @ a.T)[0, 0]) == 64.0
    assert blas_threads() == before
