"""CNN agents on a worker: the ONNX graph built from the spec and weights gives PyTorch's parameters."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from frugalrl import nets
from frugalrl.nets import MLPActorCritic, NatureCNNActorCritic, acting_state, build_policy, grid_cnn
from frugalrl.npactor import NumpyActor
from frugalrl.onnxactor import (
    NATURE_CHANNELS,
    NATURE_CONVS,
    NATURE_HIDDEN,
    OnnxCnnActor,
    cnn_acting_like,
    cnn_on_onnxruntime,
    worker_actor,
)

pytestmark = pytest.mark.timeout(60)

DISCRETE = {"type": "discrete", "n": 4}
BOX = {"type": "box", "shape": [3], "low": [-1.0] * 3, "high": [1.0] * 3}
# Atari's Nature-CNN, CarRacing's (channels last), MinAtar's grid network, and other geometries and scales
CNNS = [lambda a: NatureCNNActorCritic((4, 84, 84), a),
        lambda a: NatureCNNActorCritic((96, 96, 3), a, channels_last=True),
        lambda a: grid_cnn((10, 10, 4), a), lambda a: grid_cnn((9, 7, 6), a),
        lambda a: NatureCNNActorCritic((3, 40, 36), a, channels=(8, 16), hidden=32, convs=((4, 2), (3, 2))),
        lambda a: NatureCNNActorCritic((2, 12, 12), a, channels=(4, 5, 6), hidden=16, convs=((3, 1), (2, 2), (2, 1)),
                                       scale=0.5)]
MULTI_DISCRETE = {"type": "multidiscrete", "nvec": [3, 5, 2]}
MULTI_BINARY = {"type": "multibinary", "n": 4}
ACTIONS = pytest.mark.parametrize("action", [DISCRETE, BOX, MULTI_DISCRETE, MULTI_BINARY],
                                  ids=["discrete", "box", "multidiscrete", "multibinary"])


def _agent(cnn: int, action: dict) -> NatureCNNActorCritic:
    torch.manual_seed(cnn)
    agent = CNNS[cnn](action)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    return agent


@ACTIONS
@pytest.mark.parametrize("cnn", range(len(CNNS)))
def test_the_graph_gives_pytorchs_parameters(cnn, action):
    """Every geometry (strides, one to three convolutions, channels first or last, a scale), uint8 observations
    and float ones (a session for each dtype)."""
    agent = _agent(cnn, action)
    actor = worker_actor(agent)
    assert isinstance(actor, OnnxCnnActor)
    obs = np.random.default_rng(cnn).integers(0, 256, (8, *agent.obs_shape)).astype(np.uint8)
    for frames in (obs, obs.astype(np.float32)):
        with torch.no_grad():
            expected = agent.dist_params(torch.from_numpy(frames)).numpy()
        got = actor.params(frames)
        assert got.dtype == np.float32 and got.shape == expected.shape
        # float32 sums in another order: errors scale with the largest terms, not each result
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


@ACTIONS
@pytest.mark.parametrize("cnn", range(len(CNNS)))
def test_the_shapes_a_worker_decodes_against_are_the_agents(cnn, action):
    """A worker decodes weights against :func:`cnn_acting_like` of the spec, without building the torch module (a
    contract over every CNN layout)."""
    spec = CNNS[cnn](action).spec.to_json()
    assert cnn_on_onnxruntime(spec)
    expected = {k: (tuple(t.shape), t.numpy().dtype) for k, t in acting_state(build_policy(spec)).items()}
    assert cnn_acting_like(spec) == expected


def test_which_agents_run_on_onnxruntime():
    defaults = inspect.signature(NatureCNNActorCritic).parameters
    assert (nets.NATURE_CONVS, defaults["channels"].default,
                                                              defaults["hidden"].default) == (NATURE_CONVS, NATURE_CHANNELS, NATURE_HIDDEN)
    assert not cnn_on_onnxruntime(MLPActorCritic(5, DISCRETE).spec.to_json())
    assert isinstance(worker_actor(MLPActorCritic(5, DISCRETE)), NumpyActor)
    assert isinstance(worker_actor(MLPActorCritic(5, BOX, sde=True)), NumpyActor)  # gSDE too

    class Custom(NatureCNNActorCritic):
        pass

    assert worker_actor(Custom((10, 10, 4), DISCRETE, (16,), 128, ((3, 1),), channels_last=True)) is None


def test_an_actor_is_a_copy_of_the_weights():
    """The head caches the actor of each version it recomputes behaviour with: training the agent in place after
    must not change it."""
    agent = _agent(2, BOX)
    actor = worker_actor(agent)
    obs = np.ones((4, 10, 10, 4), dtype=np.float32)
    before = actor.params(obs)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(1.0)
    np.testing.assert_array_equal(worker_actor(agent).params(obs) != before, True)
    np.testing.assert_array_equal(actor.params(obs), before)


def test_a_spec_that_leaves_defaults_out_and_weights_that_do_not_fit():
    """A hand-written spec may leave the Nature-CNN's defaults out (as ``build_policy`` accepts it); weights of other
    shapes are refused at once, naming what does not fit."""
    agent = _agent(0, DISCRETE)
    state = {k: t.numpy() for k, t in acting_state(agent).items()}
    bare = {"factory": "frugalrl.nets:NatureCNNActorCritic", "kwargs": {"obs_shape": [4, 84, 84], "action": DISCRETE,
                                                                        "convs": None}}
    frames = np.zeros((2, 4, 84, 84), dtype=np.uint8)
    np.testing.assert_array_equal(OnnxCnnActor.from_state(bare, state).params(frames),
                                  OnnxCnnActor.from_state(agent.spec.to_json(), state).params(frames))
    with pytest.raises(ValueError, match=r"wrong shapes \{'actor.bias': \(3,\)\}"):
        OnnxCnnActor.from_state(bare, {**state, "actor.bias": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"missing \['actor.weight'\]"):
        OnnxCnnActor.from_state(bare, {k: v for k, v in state.items() if k != "actor.weight"})


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_a_restored_cnn_worker_continues_exactly(backend):
    """A checkpoint of workers that act on ONNX Runtime (MinAtar's grid CNN, its weights bf16 delta-coded as by
    default): workers restored from it, in other processes, step and sample exactly what the original ones do next,
    and take the learner's next weights as a full copy."""
    from frugalrl import ClusterEnv, make_agent

    kwargs = {"backend": backend, "seed": 5, "replayable": True, "weights_codec": "bf16", "inline_workers": 0}
    if backend == "serial":
        del kwargs["inline_workers"]
    first, second = (ClusterEnv("MinAtar/Breakout-v1", 2, 2, **kwargs) for _ in range(2))
    try:
        torch.manual_seed(0)
        agent = make_agent(first.single_observation_space, first.single_action_space)
        assert isinstance(worker_actor(agent), OnnxCnnActor)
        first.rollout(agent, 6)
        with torch.no_grad():
            agent.actor.weight.mul_(1.5)  # a new version, sent as a delta to the first run's workers
        first.rollout(agent, 3)
        second.load_state_dict(first.state_dict())
        for _ in range(2):
            a, b = first.rollout(agent, 8), second.rollout(agent, 8)
            np.testing.assert_array_equal(a.actions, b.actions)
            np.testing.assert_array_equal(a.obs, b.obs)
            np.testing.assert_array_equal(a.rewards, b.rewards)
            with torch.no_grad():
                agent.actor.weight.mul_(1.5)
    finally:
        first.close()
        second.close()
