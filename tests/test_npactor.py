"""The numpy actor the workers act with: PyTorch's distribution parameters, a correct sampler, rebuilt on new weights."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from frugalrl import ClusterEnv, dists, make_agent
from frugalrl.nets import MLPActorCritic, NatureCNNActorCritic, acting_state, build_policy
from frugalrl.npactor import NumpyActor, acting_like, one_blas_thread, runs_in_numpy

pytestmark = pytest.mark.timeout(60)

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
OBS = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)


def _obs(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, 5)) * 3).astype(np.float32)


LAYOUTS = [{}, {"activation": "relu", "hidden": (32, 16, 8)}, {"obs_norm": True}]
GSDE = [{"sde": True}, {"sde": True, "obs_norm": True, "hidden": (32,)}]  # Box actions only
# every action space the agents act in: Discrete, Box, MultiDiscrete (rows of unequal width), MultiBinary
ACTION_SPACES = (gym.spaces.Discrete(4), BOX, gym.spaces.MultiDiscrete([3, 5, 2]), gym.spaces.MultiBinary(4))


@pytest.mark.parametrize(("action", "options"), [(a, o) for a in ACTION_SPACES for o in LAYOUTS]
                         + [(BOX, o) for o in GSDE], ids=str)
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
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert NumpyActor.of(NatureCNNActorCritic((4, 84, 84), {"type": "discrete", "n": 3})) is None
    assert NumpyActor.of(make_agent(frames, gym.spaces.Discrete(3))) is None

    class Custom(MLPActorCritic):
        pass

    assert NumpyActor.of(Custom(5, {"type": "discrete", "n": 2})) is None  # a subclass may change dist_params


def test_samples_follow_the_distribution():
    g = np.random.default_rng(0)
    logits = np.array([[2.0, 0.0, -1.0, -30.0, 0.5]], dtype=np.float32).repeat(40_000, 0)
    actor = NumpyActor([], {"type": "discrete", "n": 5}, None, None)
    draws = actor.sample(logits, g)
    assert draws.dtype == np.int64 and draws.min() >= 0 and draws.max() <= 4
    p = np.exp(logits[0] - logits[0].max())
    p /= p.sum()
    freq = np.bincount(draws, minlength=5) / len(draws)
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / len(draws)) + 1e-4)
    assert freq[3] == 0.0  # a probability of e^-32 is not drawn in 40k tries

    params = np.array([[1.0, -2.0, np.log(0.5), np.log(3.0)]], dtype=np.float32).repeat(40_000, 0)
    draws = NumpyActor([], {"type": "box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]}, None, None).sample(params, g)
    assert draws.dtype == np.float32 and draws.shape == (40_000, 2)
    np.testing.assert_allclose(draws.mean(0), [1.0, -2.0], atol=0.05)
    np.testing.assert_allclose(draws.std(0), [0.5, 3.0], rtol=0.03)


SPECS = [make_agent(OBS, action, **options).spec.to_json() for action in ACTION_SPACES
         for options in ({}, {"activation": "relu", "hidden": (32, 16, 8)}, {"obs_norm": True}, {"hidden": ()})]
SPECS += [make_agent(OBS, BOX, sde=True, **options).spec.to_json() for options in ({}, {"hidden": (32, 16, 8)})]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(s["kwargs"]))
def test_the_shapes_a_worker_decodes_against_are_the_agents(spec):
    """A worker decodes weights against :func:`acting_like` of the spec, without building the torch module: the same
    keys, shapes and dtypes as the module's acting state (a contract over every MLP layout)."""
    assert runs_in_numpy(spec)
    agent = build_policy(spec)
    expected = {k: (tuple(t.shape), t.numpy().dtype) for k, t in acting_state(agent).items()}
    assert acting_like(spec) == expected


def test_specs_numpy_does_not_run():
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert not runs_in_numpy(make_agent(frames, gym.spaces.Discrete(3)).spec.to_json())
    assert not runs_in_numpy({"factory": "my.module:Agent", "kwargs": {}})


def test_normalised_observations_are_clipped_as_pytorchs():
    agent = make_agent(OBS, BOX, obs_norm=True)
    with torch.no_grad():
        agent.obs_norm.var.fill_(1e-6)  # every observation far outside ±10 standard deviations
    obs = _obs(32)
    with torch.no_grad():
        expected = agent.dist_params(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(NumpyActor.of(agent).params(obs), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("action", ACTION_SPACES, ids=str)
def test_log_probabilities_are_pytorchs(action):
    agent = make_agent(OBS, action)
    actor = NumpyActor.of(agent)
    params = actor.params(_obs(256))
    actions = actor.sample(params, np.random.default_rng(3))
    expected = dists.log_prob(agent.dist_kind, torch.from_numpy(params), torch.from_numpy(actions)).numpy()
    got = actor.log_prob(params, actions)
    assert got.dtype == np.float32 and got.shape == (256,)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_a_restored_worker_continues_its_sampling_stream():
    """A checkpoint carries each worker's NumPy generator (in its snapshot, as the envs' generators): a run restored
    from it samples the very actions the original run samples next, a half-used 64-bit word included (Gaussian
    actions draw float32 normals)."""
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        first, second = (ClusterEnv(env_id, 2, 2, backend="serial", seed=3, replayable=True) for _ in range(2))
        try:
            agent = make_agent(first.single_observation_space, first.single_action_space)
            first.rollout(agent, 5)
            second.load_state_dict(first.state_dict())
            a, b = first.rollout(agent, 8), second.rollout(agent, 8)
            np.testing.assert_array_equal(a.actions, b.actions, err_msg=env_id)
            np.testing.assert_array_equal(a.obs, b.obs, err_msg=env_id)
        finally:
            first.close()
            second.close()


def test_an_actor_is_a_copy_of_the_weights():
    """The head caches the actor of each version it recomputes behaviour with: training the agent in place after
    must not change it."""
    agent = make_agent(OBS, BOX, obs_norm=True)
    actor = NumpyActor.of(agent)
    obs = _obs(8)
    before = actor.params(obs)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(1.0)
        agent.obs_norm.mean.add_(1.0)
    np.testing.assert_array_equal(actor.params(obs), before)


def test_a_worker_acts_with_the_weights_it_holds():
    """New weights (a new version) are what the workers' next actions come from."""
    env = ClusterEnv("CartPole-v1", 1, 4, backend="serial", seed=0)
    torch.manual_seed(0)
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
            # float32 sums in another order: errors scale with the largest logits (thousands by the third version)
            np.testing.assert_allclose(infos["dist_params"], expected, rtol=1e-5,
                                       atol=1e-6 * max(1.0, float(np.abs(expected).max())))
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


def test_gsde_constants_are_the_modules():
    from frugalrl import nets, npactor

    assert npactor.SDE_EPS == nets.SDE_EPS
