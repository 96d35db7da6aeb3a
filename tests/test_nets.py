"""Which network ``make_agent`` (and so every algorithm's ``--net``) builds for which observations, on real envs."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from frugalrl.compress.export import export_onnx
from frugalrl.compress.quantize import quantize_int8
from frugalrl.compress.runtime import OnnxPolicy
from frugalrl.envs.atari import make_atari
from frugalrl.envs.minatar import make_minatar
from frugalrl.evaluation import random_states
from frugalrl.nets import (
    GRID_CHANNELS,
    GRID_CONVS,
    GRID_HIDDEN,
    MLPActorCritic,
    NatureCNNActorCritic,
    build_policy,
    image_layout,
    make_agent,
)


@pytest.fixture(scope="module")
def breakout() -> tuple[gym.Env, torch.Tensor]:
    """MinAtar Breakout and 64 of its (10, 10, 4) bool grids from random play."""
    env = make_minatar("breakout")
    return env, torch.as_tensor(random_states(env, 64, seed=1))


def test_auto_picks_the_network_by_observation() -> None:
    cartpole = gym.make("CartPole-v1")
    pong = make_atari("ALE/Pong-v5")
    grid = make_minatar("breakout")
    assert image_layout(cartpole.observation_space) is None
    assert image_layout(pong.observation_space) == "frames"
    assert image_layout(grid.observation_space) == "grid"
    assert type(make_agent(cartpole.observation_space, cartpole.action_space)) is MLPActorCritic
    nature = make_agent(pong.observation_space, pong.action_space)
    assert isinstance(nature, NatureCNNActorCritic) and nature.channels == [32, 64, 64] and nature.hidden == 512
    # the Nature-CNN's spec is what it was before other geometries existed: stored checkpoints still rebuild
    assert set(nature.spec.kwargs) == {"obs_shape", "action", "channels", "hidden"}
    minatar = make_agent(grid.observation_space, grid.action_space)
    assert isinstance(minatar, NatureCNNActorCritic) and minatar.channels_last
    assert minatar.channels == list(GRID_CHANNELS) and minatar.hidden == GRID_HIDDEN
    assert minatar.convs == [list(c) for c in GRID_CONVS]
    assert minatar.trunk[0].weight.shape == (16, 4, 3, 3) and minatar.trunk[3].weight.shape == (128, 16 * 8 * 8)
    # 'mlp' flattens the grid; 'cnn' refuses what is not an image, naming the shape
    flat = make_agent(grid.observation_space, grid.action_space, net="mlp")
    assert type(flat) is MLPActorCritic and flat.obs_dim == 400
    with pytest.raises(ValueError, match=r"net='cnn' needs .*\(4,\)"):
        make_agent(cartpole.observation_space, cartpole.action_space, net="cnn")
    with pytest.raises(ValueError, match="net must be"):
        make_agent(cartpole.observation_space, cartpole.action_space, net="transformer")  # type: ignore[arg-type]
    # an (H, W, C) image too large to be a grid is not taken for one; as uint8 it is a frame, channels last
    big = gym.spaces.Box(0, 255, (96, 96, 3), np.float32)
    assert image_layout(big) is None
    assert image_layout(gym.spaces.Box(0, 255, (96, 96, 3), np.uint8)) == "frames_last"


def test_frames_with_box_actions_get_the_cnn_and_a_gaussian_head() -> None:
    """CarRacing-v3 as Gymnasium makes it ((96, 96, 3) uint8 frames, steering and pedals): the Nature-CNN reads
    the frames channels last, a Gaussian acts, and the agent rebuilds from its spec, prunes and exports."""
    from frugalrl.compress.prune import prune_agent
    from frugalrl.presets import family_of

    env = gym.make("CarRacing-v3")
    assert family_of(env.observation_space, env.action_space) == "image"
    frames = torch.as_tensor(random_states(env, 8, seed=1))
    env.close()
    assert frames.shape == (8, 96, 96, 3) and frames.dtype == torch.uint8
    torch.manual_seed(0)
    agent = make_agent(env.observation_space, env.action_space)
    assert isinstance(agent, NatureCNNActorCritic) and agent.channels_last and agent.dist_kind == "gaussian"
    with torch.no_grad():
        params, value = agent.dist_params_and_value(frames)
        assert params.shape == (8, 6) and value.shape == (8,)
        assert torch.equal(params[:, 3:], agent.log_std.expand(8, 3))  # log-std 0: one half-box of noise
        torch.testing.assert_close(agent.max_entropy_log_std, torch.log(torch.tensor([1.0, 0.5, 0.5])))
        rebuilt = build_policy(agent.spec.to_json())
        rebuilt.load_state_dict(agent.state_dict())
        assert torch.equal(rebuilt.dist_params(frames), params)
        agent.log_std.fill_(-0.5)
        pruned = prune_agent(agent, 0.5)
        assert pruned.dist_kind == "gaussian" and torch.equal(pruned.log_std, agent.log_std)
        assert pruned.dist_params(frames).shape == (8, 6)
    graph = export_onnx(agent, frames)
    onnx = OnnxPolicy.from_bytes(graph, "gaussian")
    torch.testing.assert_close(onnx.dist_params(frames), agent.dist_params(frames).detach(), rtol=1e-4, atol=1e-5)


def test_grid_cnn_rebuilds_exports_and_quantizes(breakout: tuple[gym.Env, torch.Tensor]) -> None:
    """The grid CNN crosses the wire as a spec plus tensors and runs as an ONNX graph (fp32 and int8) on the
    bool grids workers feed it, as the Nature-CNN does on frames."""
    env, grids = breakout
    torch.manual_seed(0)
    agent = make_agent(env.observation_space, env.action_space).eval()
    rebuilt = build_policy(agent.spec.to_json())
    rebuilt.load_state_dict(agent.state_dict())
    with torch.no_grad():
        assert torch.equal(rebuilt.dist_params(grids), agent.dist_params(grids))
        # channels-last in, the same as the convolution on the channels-first grid
        chw = grids.permute(0, 3, 1, 2).float()
        logits = agent.actor(agent.trunk(chw))
        assert torch.allclose(logits, agent.dist_params(grids), atol=1e-6)
    graph = export_onnx(agent, grids)
    fp32 = OnnxPolicy.from_bytes(graph, "categorical")
    torch.testing.assert_close(fp32.dist_params(grids), agent.dist_params(grids), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fp32.value(grids), agent.value(grids), rtol=1e-4, atol=1e-5)
    int8 = OnnxPolicy.from_bytes(quantize_int8(graph, grids), "categorical", precision="int8")
    agree = (int8.dist_params(grids).argmax(1) == agent.dist_params(grids).argmax(1)).float().mean()
    assert agree > 0.9, f"the int8 graph picks the fp32 network's action on only {agree:.0%} of the grids"


def test_sde_noise_is_the_gaussian_dist_params_describes() -> None:
    """gSDE (``sde``): for one step, ``φ(s) ε`` with ``ε_ij ~ N(0, σ_ij²)`` is Gaussian with the log-std that
    :meth:`MLPActorCritic.dist_params` returns, so log-probabilities and entropies are those of any Gaussian head;
    the spec rebuilds the same module (with its (features × actions) log-std matrix); Discrete actions refuse it."""
    torch.manual_seed(0)
    action = {"type": "box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]}
    agent = MLPActorCritic(3, action, hidden=(16, 8), log_std_init=-1.0, sde=True)
    assert agent.log_std.shape == (8, 2) and agent.spec.kwargs["sde"] is True
    with torch.no_grad():
        agent.log_std.add_(0.3 * torch.randn(8, 2))
    obs = torch.randn(2, 3)
    params = agent.dist_params(obs)
    draws = 40_000
    eps = torch.randn(draws, 8, 2)
    with torch.no_grad():
        noise = torch.stack([agent.sde_act(obs[i : i + 1].expand(draws, 3), eps)[1] - params[i, :2] for i in range(2)])
    assert torch.allclose(noise.std(dim=1).log(), params[:, 2:], atol=0.02)
    assert torch.allclose(noise.mean(dim=1), torch.zeros(2, 2), atol=0.02 * noise.std(dim=1).max())
    rebuilt = build_policy(agent.spec)
    rebuilt.load_state_dict(agent.state_dict())
    assert torch.equal(rebuilt.dist_params(obs), params)
    with pytest.raises(ValueError, match="Box actions"):
        MLPActorCritic(3, {"type": "discrete", "n": 2}, sde=True)


def test_sde_noise_starts_in_half_widths_of_the_box() -> None:
    """The gSDE matrix starts at ``log_std_init`` plus the log of each dimension's half box (Pendulum's ±2 torque
    explores twice as far as a ±1 box), an unbounded dimension as ±1, and a half-width past 1000 as 1000: float32's
    maximum, which envs use for "unbounded", would overflow the variance (e^86) and give infinite log-stds."""
    big = float(np.finfo(np.float32).max)
    action = {"type": "box", "shape": [4], "low": [-2.0, -np.inf, -big, 0.0], "high": [2.0, np.inf, big, 0.5]}
    agent = MLPActorCritic(3, action, hidden=(8,), log_std_init=-2.0, sde=True)
    start = [-2.0 + math.log(2.0), -2.0, -2.0 + math.log(1e3), -2.0 + math.log(0.25)]
    assert torch.allclose(agent.log_std, torch.tensor(start).expand(8, 4))
    assert torch.isfinite(agent.dist_params(torch.randn(5, 3))).all()


def test_the_acting_state_leaves_the_critic_out_and_loads_only_whole():
    from frugalrl import make_agent
    from frugalrl.nets import acting_state, load_acting_state

    agent = make_agent(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    state = acting_state(agent)
    assert state and not any(k.startswith("critic.") for k in state)
    other = make_agent(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    load_acting_state(other, state)  # the critic keeps its own values
    assert all(torch.equal(t, state[k]) for k, t in acting_state(other).items())
    with pytest.raises(KeyError, match="missing"):
        load_acting_state(other, {k: t for k, t in state.items() if k != next(iter(state))})


def test_a_worker_acts_on_frames_with_the_gaussian_cnn() -> None:
    """The library's own CarRacing factory ((4, 96, 96) stacked frames, Box actions): a worker process rebuilds
    the CNN from its spec and weights and samples the actions that the head's copy describes."""
    from frugalrl import ClusterEnv
    from frugalrl.dists import log_prob

    envs = ClusterEnv("frugalrl.envs.carracing:make_car_racing", num_workers=1, envs_per_worker=2, seed=3,
                      inline_workers=0)
    try:
        torch.manual_seed(0)
        agent = make_agent(envs.single_observation_space, envs.single_action_space)
        assert isinstance(agent, NatureCNNActorCritic) and not agent.channels_last
        batch = envs.rollout(agent, 4)
    finally:
        envs.close()
    assert batch.obs.shape == (4, 2, 4, 96, 96) and batch.actions.shape == (4, 2, 3)
    assert batch.behaviour_logp is not None  # the uplink's default sends log μ(a|s), not the Gaussian's parameters
    with torch.no_grad():
        params = agent.dist_params(torch.as_tensor(batch.obs.reshape(8, 4, 96, 96)))
        logp = log_prob("gaussian", params, torch.as_tensor(batch.actions.reshape(8, 3)))
    torch.testing.assert_close(torch.as_tensor(batch.behaviour_logp.reshape(8)), logp, rtol=1e-4, atol=1e-4)
