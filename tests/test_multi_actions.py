"""MultiDiscrete and MultiBinary actions, and Discrete ones from a start and Box ones of two dimensions: frugalrl's
agents act in them on torch-free workers, every algorithm with a flat actor learns with them, checkpoints replay
them, and the split model says which it does not take."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from frugalrl import ClusterEnv, make_agent
from frugalrl.experience import env_actions

pytestmark = pytest.mark.timeout(180)

MATCH = "envs_for_tests:MatchEnv"
MATRIX = "envs_for_tests:MatrixActionEnv"
SPACES = {"multidiscrete": {}, "multibinary": {"bits": 6}}


CASES = {**{name: (MATCH, kwargs) for name, kwargs in SPACES.items()},
         "discrete-from-minus-1": (MATCH, {"nvec": (3,), "start": -1}),
         "discrete-200-from-minus-100": (MATCH, {"nvec": (200,), "start": -100}),  # indices need int16 on the wire
         "box-2x3": (MATRIX, {}), "box-scalar": (MATRIX, {"shape": ()})}
"""Each action space the workers act in without torch, and one of each kind the policy's actions are shifted
(a Discrete space's start) or reshaped (a Box of two dimensions) for."""


@pytest.mark.parametrize(("env_id", "kwargs"), CASES.values(), ids=CASES.keys())
def test_workers_act_without_torch_and_a_checkpoint_replays_their_actions(env_id, kwargs):
    """The rollout holds what the policy chose (an index from 0; a Box's sample, in the Box's shape), which the envs
    got shifted or clipped (each test env checks every action it gets); a checkpoint replays the envs exactly."""
    env = ClusterEnv(env_id, 2, 3, backend="local", inline_workers=0, seed=3, env_kwargs=kwargs, replayable=True,
                     uplink={"behaviour": "logprob"})
    other = ClusterEnv(env_id, 2, 3, backend="local", inline_workers=0, seed=3, env_kwargs=kwargs, replayable=True)
    try:
        torch.manual_seed(0)
        agent = make_agent(env.single_observation_space, env.single_action_space)
        ro = env.rollout(agent, 20)
        space = env.single_action_space
        assert ro.actions.shape == (20, 6, *space.shape)
        if not isinstance(space, gym.spaces.Box):
            assert all(space.contains(env_actions(space, batched=False)(a).astype(space.dtype))
                       for a in ro.actions.reshape(-1, *space.shape))
        assert ro.behaviour_logp.shape == (20, 6)
        assert ["libtorch" in Path(f"/proc/{pid}/maps").read_text() for pid in env.backend.worker_pids().values()] \
            == [False, False]
        _, _, _, _, infos = env.step(agent)  # step(agent): the workers' actions and parameters come back
        assert infos["actions"].shape == (6, *space.shape)
        assert other.load_state_dict(env.state_dict()) == []  # episodes replayed with their recorded actions
        a, b = env.rollout(agent, 12), other.rollout(agent, 12)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.obs, b.obs)
    finally:
        env.close()
        other.close()


@pytest.mark.parametrize(("algo", "kwargs", "at_least"), [
    ("ppo", SPACES["multidiscrete"], 7.0), ("ppo", SPACES["multibinary"], 5.5),
    ("impala", SPACES["multidiscrete"], 5.0), ("hsa2c", SPACES["multidiscrete"], 7.0),
    ("hsa2c", SPACES["multibinary"], 6.5)])
def test_every_flat_algorithm_learns_them_with_no_flags(algo, kwargs, at_least, tmp_path):
    """Say the target back in 8 steps: a random policy returns 2.9 (MultiDiscrete [3, 4, 2]) or 4.0 (6 bits), a
    perfect one 8. What ``frugalrl train ALGO --env ...`` runs with no other flag (``make_config``: the discrete
    family's fallback where the algorithm has one), 16k steps."""
    from frugalrl.algos import algorithm
    from frugalrl.presets import make_config

    train = algorithm(algo).load()[0].train
    out = train(make_config(algo, MATCH, env_kwargs=kwargs, total_timesteps=16_000, seed=1, run_dir=str(tmp_path),
                            progress=False, plots=False, tensorboard=False))
    assert out["eval_return_mean"] >= at_least, out["eval_return_mean"]


@pytest.mark.parametrize(("algo", "env", "kwargs", "at_least"), [
    ("ppo", MATCH, {"nvec": (3,), "start": -1}, 7.0), ("impala", MATCH, {"start": 5}, 5.0),
    ("hsa2c", MATCH, {"nvec": (4,), "start": 1}, 6.0), ("ppo", MATRIX, {}, -4.0)])
def test_actions_from_a_start_and_of_a_box_of_two_dimensions(algo, env, kwargs, at_least, tmp_path):
    """Discrete(3, start=-1), MultiDiscrete from 5, Discrete(4, start=1) and Box((2, 3)) actions: the envs check
    every action they get (a policy's index from 0 shifted by the start; a flat Gaussian's sample in the Box's shape)
    and each algorithm learns with no flags. A random policy returns 2.7 (Discrete(3)), 2.9, 2 (Discrete(4)); the
    Box's policy at its start, −12."""
    from frugalrl.algos import algorithm
    from frugalrl.presets import make_config

    train = algorithm(algo).load()[0].train
    out = train(make_config(algo, env, env_kwargs=kwargs, total_timesteps=16_000, seed=1, run_dir=str(tmp_path),
                            progress=False, plots=False, tensorboard=False))
    assert out["eval_return_mean"] >= at_least, out["eval_return_mean"]


def test_the_split_model_names_the_spaces_it_takes(tmp_path):
    from frugalrl.pipeline import PipelinePPOConfig, train

    with pytest.raises(ValueError, match=r"pipeline PPO's split model acts in Discrete and Box action spaces, not "
                                         r"MultiDiscrete\(\[3 4 2\]\)"):
        train(PipelinePPOConfig(env=MATCH, total_timesteps=1024, run_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"pipeline PPO needs Discrete actions from 0, got Discrete\(3, start=-1\)"):
        train(PipelinePPOConfig(env=MATCH, env_kwargs={"nvec": (3,), "start": -1}, total_timesteps=1024,
                                run_dir=str(tmp_path)))


def test_aaps_keeps_each_states_parameter_rows():
    """AAPS's evidence keeps a MultiDiscrete behaviour's ``(k, m)`` rows per state (the KL of the held policy and
    the learner's on them), whether the parameters come from ``step(agent)`` or a rollout's uplink."""
    from frugalrl import AAPS

    env = ClusterEnv(MATCH, 2, 2, backend="serial", seed=2, sync=AAPS(0.05), uplink={"behaviour": "params"})
    try:
        torch.manual_seed(0)
        agent = make_agent(env.single_observation_space, env.single_action_space)
        env.reset(seed=2)
        for _ in range(3):
            for _ in range(4):
                env.step(agent)
            with torch.no_grad():
                agent.actor[-1].weight.add_(0.5)  # the learner moves: AAPS weighs a sync on the rows it kept
            env.rollout(agent, 8)
        assert all(kl is not None and kl >= 0 for kl in env.last_kl)
    finally:
        env.close()


def test_an_int8_actor_keeps_the_rows_of_logits():
    """AcceRL's int8 actor of a MultiDiscrete agent: the padding stays in float, so the 8-bit range is the logits'
    (with the −1e9 padding in the calibrated range every logit would come out 0)."""
    from envs_for_tests import MatchEnv

    from frugalrl import dists
    from frugalrl.compress.export import export_onnx
    from frugalrl.compress.quantize import quantize_int8
    from frugalrl.compress.runtime import OnnxPolicy
    from frugalrl.evaluation import random_states

    env = MatchEnv(nvec=(3, 5, 2))
    states = torch.from_numpy(random_states(env, 256, seed=0))
    torch.manual_seed(0)
    net = make_agent(env.observation_space, env.action_space)
    with torch.no_grad():
        net.actor[-1].weight.mul_(150.0)  # logits of a trained policy's size
    actor = OnnxPolicy.from_bytes(quantize_int8(export_onnx(net, states[:8]), states), "multi_categorical",
                                  precision="int8")
    with torch.no_grad():
        teacher, student = net.dist_params(states[:64]), actor.dist_params(states[:64])
    assert teacher.abs()[teacher > -1e8].max() > 1.0
    assert float(dists.kl("multi_categorical", teacher, student).max()) < 0.01
