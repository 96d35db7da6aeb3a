"""Bad input fails fast with an error that names the problem (and never hangs)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import worker_children

from frugalrl import AAPS, ClusterEnv, Interval, make_agent
from frugalrl.nets import MLPActorCritic

pytestmark = pytest.mark.timeout(60)

FAST_S = 30.0  # "quickly": far below any hang, generous for a loaded machine


@pytest.fixture(scope="module")
def cartpole():
    env = ClusterEnv("CartPole-v1", 2, 1, backend="serial", seed=0)
    yield env
    env.close()


@pytest.fixture(scope="module")
def pendulum():
    env = ClusterEnv("Pendulum-v1", 2, 1, backend="serial", seed=0)
    env.reset(seed=0)
    yield env
    env.close()


# ---------------------------------------------------------------------------------------------- envs
@pytest.mark.parametrize("backend", ["serial", "local"])
@pytest.mark.parametrize(
    "env, match",
    [
        ("NoSuchEnv-v0", r"unknown Gymnasium environment id 'NoSuchEnv-v0'"),
        ("CartPole-v99", r"unknown Gymnasium environment id 'CartPole-v99'.*v1"),
        ("nope.module:fn", r"cannot import module 'nope.module'"),
        ("frugalrl:nothing", r"module 'frugalrl' has no attribute 'nothing'"),
        ("envs_for_tests:raising_factory", r"could not build environment 'envs_for_tests:raising_factory'.*boom"),
        (42, r"env must be a Gymnasium id, a 'module:function' path, a callable or a list of env functions"),
    ],
)
def test_bad_env_names(backend, env, match):
    before = set(worker_children())
    t0 = time.monotonic()
    with pytest.raises((ValueError, TypeError), match=match):
        ClusterEnv(env, 1, backend=backend)
    assert time.monotonic() - t0 < FAST_S
    assert set(worker_children()) <= before  # nothing was started, or it was stopped


def test_factory_callable_that_raises():
    from envs_for_tests import raising_factory

    with pytest.raises(ValueError, match=r"could not build environment 'raising_factory': RuntimeError: boom"):
        ClusterEnv(raising_factory, 1, backend="serial")


def test_factory_that_returns_no_env():
    with pytest.raises(ValueError, match=r"factory 'builtins:dict' returned dict, not a gymnasium.Env"):
        ClusterEnv("builtins:dict", 1, backend="serial")


def test_local_backend_needs_importable_factories_and_json_kwargs():
    from envs_for_tests import CounterEnv

    with pytest.raises(ValueError, match=r"cannot be rebuilt in a worker process"):
        ClusterEnv(lambda: CounterEnv(), 1, backend="local")
    with pytest.raises(ValueError, match=r"env_kwargs and env wrappers' arguments must be JSON-serialisable for backend='local'"):
        ClusterEnv("envs_for_tests:CounterEnv", 1, backend="local", env_kwargs={"horizon": np.int64(5)})


@pytest.mark.parametrize("env_id", ["envs_for_tests:TextObservationEnv", "envs_for_tests:MultiDiscreteEnv"])
def test_worker_side_inference_needs_box_observations_and_box_or_discrete_actions(env_id):
    """Other spaces work with step(actions) (tests/test_cluster_spaces.py); an agent on the workers is one line."""
    env = ClusterEnv(env_id, 1, backend="serial")
    try:
        with pytest.raises(TypeError, match=r"worker-side inference \(step\(agent\), rollout\) needs Box observations"):
            env.rollout(torch.nn.Linear(2, 2), 4)
    finally:
        env.close()


def test_an_action_space_no_agent_takes_is_named_as_the_agents_limit():
    """A MultiDiscrete env of two dimensions under ``frugalrl train`` first meets the checkpoints' check: the line
    says that the agents are what does not take it, which spaces they take, and what takes any."""
    with pytest.raises(TypeError, match=r"replayable=True \(checkpoints\) needs .* frugalrl's agents act in Box, "
                                        r"Discrete, MultiDiscrete \(of one dimension\) and MultiBinary \(of "
                                        r"one dimension\) action spaces: step\(actions\) with a policy of your own "
                                        r"takes any"):
        ClusterEnv("envs_for_tests:MultiDiscreteEnv", 1, backend="serial", replayable=True)
    with pytest.raises(TypeError, match=r"frugalrl's agents take MultiBinary spaces of one dimension"):
        make_agent(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiBinary((2, 2)))


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_workers": 0}, r"num_workers must be a positive integer, got 0"),
        ({"num_workers": -2}, r"num_workers must be a positive integer, got -2"),
        ({"num_workers": 1.5}, r"num_workers must be a positive integer, got 1.5"),
        ({"num_workers": True}, r"num_workers must be a positive integer, got True"),
        ({"envs_per_worker": -1}, r"envs_per_worker must be a positive integer, got -1"),
        ({"envs_per_worker": 0}, r"envs_per_worker must be a positive integer, got 0"),
        ({"backend": "nope"}, r"unknown backend 'nope'; expected one of \('serial', 'local', 'ray', 'replay'\)"),
        ({"weights_codec": "x"}, r"unknown weights_codec 'x'"),
        ({"weights_codec": "raw"}, r"unknown weights_codec 'raw'"),
        ({"autoreset_mode": "x"}, r"autoreset_mode must be 'NextStep', 'SameStep' or 'Disabled', got 'x'"),
        ({"worker_timeout": 0}, r"worker_timeout must be > 0 seconds, got 0"),
        ({"worker_timeout": -1.0}, r"worker_timeout must be > 0 seconds"),
        ({"kl_states": 0}, r"kl_states must be a positive integer, got 0"),
        ({"seed": 1.5}, r"seed must be an integer or None, got 1.5"),
        ({"seed": "7"}, r"seed must be an integer or None, got '7'"),
    ],
)
def test_invalid_config_values(kwargs, match):
    args = {"num_workers": 1, "backend": "serial", **kwargs}
    with pytest.raises(ValueError, match=match):
        ClusterEnv("CartPole-v1", **args)


def test_invalid_sync_rules():
    with pytest.raises(ValueError, match=r"AAPS\(delta\) needs delta > 0, got 0"):
        AAPS(0)
    with pytest.raises(ValueError, match=r"AAPS\(delta\) needs delta > 0, got -0.1"):
        AAPS(-0.1)
    with pytest.raises(ValueError, match=r"AAPS\(delta\) needs delta > 0, got nan"):
        AAPS(float("nan"))
    with pytest.raises(ValueError, match=r"max_lag must be >= 1, got 0"):
        AAPS(0.1, max_lag=0)
    with pytest.raises(ValueError, match=r"Interval\(n\) needs n >= 1, got 0"):
        Interval(0)
    with pytest.raises(ValueError, match=r"Interval\(n\) needs n >= 1, got -3"):
        Interval(-3)
    with pytest.raises(TypeError, match=r"sync must be a SyncRule .* got 'aaps'"):
        ClusterEnv("CartPole-v1", 1, backend="serial", sync="aaps")


# ---------------------------------------------------------------------------------------------- calls
def test_step_before_reset():
    env = ClusterEnv("CartPole-v1", 1, backend="serial")
    try:
        with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
            env.step(np.zeros(1, dtype=np.int64))
        agent = make_agent(env.single_observation_space, env.single_action_space)
        with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
            env.step(agent)
    finally:
        env.close()


@pytest.mark.parametrize(
    "actions, match",
    [
        (np.array([0, 1, 1]), r"actions must have shape \(2,\) .* got shape \(3,\)"),
        (np.array([[0], [1]]), r"actions must have shape \(2,\) .* got shape \(2, 1\)"),
        (None, r"actions must have shape \(2,\) .* got shape \(\)"),
        (np.array([0.0, 1.0]), r"actions for a Discrete action space must be integers, got dtype float64"),
        (np.array([0, 1], dtype=np.float32), r"must be integers, got dtype float32"),
        (np.array([True, False]), r"must be integers, got dtype bool"),
        (np.array(["a", "b"]), r"must be integers, got dtype <U1"),
        (np.array([0, 2]), r"actions out of range \[0, 2\)"),
        (np.array([-1, 0]), r"actions out of range \[0, 2\)"),
    ],
)
def test_bad_discrete_actions(cartpole, actions, match):
    cartpole.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        cartpole.step(actions)
    cartpole.step(np.array([0, 1]))  # still usable


@pytest.mark.parametrize(
    "actions, match",
    [
        (np.zeros(2, np.float32), r"actions must have shape \(2, 1\) for this Box action space, got shape \(2,\)"),
        (np.zeros((2, 2), np.float32), r"must have shape \(2, 1\).*got shape \(2, 2\)"),
        (np.array([[np.nan], [0.0]]), r"actions contain NaN or inf"),
        (np.array([[np.inf], [0.0]]), r"actions contain NaN or inf"),
        (np.zeros((2, 1), bool), r"actions for a Box action space must be numeric, got dtype bool"),
    ],
)
def test_bad_box_actions(pendulum, actions, match):
    with pytest.raises(ValueError, match=match):
        pendulum.step(actions)
    pendulum.step(np.zeros((2, 1), np.float32))


@pytest.mark.parametrize("num_steps", [0, -5, 2.5, "10"])
def test_rollout_with_bad_num_steps(cartpole, num_steps):
    agent = make_agent(cartpole.single_observation_space, cartpole.single_action_space)
    with pytest.raises(ValueError, match=r"num_steps must be a positive integer, got"):
        cartpole.rollout(agent, num_steps)


def test_bad_agents(cartpole):
    with pytest.raises(TypeError, match=r"cannot be used as a worker-side agent.*missing \['spec', 'dist_kind'"):
        cartpole.rollout(object(), 4)
    with pytest.raises(TypeError, match=r"cannot be used as a worker-side agent"):
        cartpole.rollout(torch.nn.Linear(4, 2), 4)
    wrong_obs = MLPActorCritic(3, {"type": "discrete", "n": 2})
    with pytest.raises(ValueError, match=r"agent cannot act on this env's observations"):
        cartpole.rollout(wrong_obs, 4)
    wrong_n = MLPActorCritic(4, {"type": "discrete", "n": 3})
    with pytest.raises(ValueError, match=r"dist_params returned shape \(3,\).*needs \(2,\)"):
        cartpole.rollout(wrong_n, 4)
    gaussian = MLPActorCritic(4, {"type": "box", "shape": [2], "low": [-1, -1], "high": [1, 1]})
    with pytest.raises(ValueError, match=r"dist_kind is 'gaussian'.*needs 'categorical'"):
        cartpole.reset()
        cartpole.step(gaussian)
    # The env is still usable with a fitting agent.
    good = make_agent(cartpole.single_observation_space, cartpole.single_action_space)
    assert cartpole.rollout(good, 4).obs.shape == (4, 2, 4)


def test_reset_with_bad_seed(cartpole):
    with pytest.raises(ValueError, match=r"reset\(seed=...\) takes an integer or None, got 'a'"):
        cartpole.reset(seed="a")
    with pytest.raises(ValueError, match=r"seeds are passed as a list the length must match num_envs=2 but got length=3"):
        cartpole.reset(seed=[1, 2, 3])  # one per env, as in Gymnasium


def test_using_a_closed_env():
    env = ClusterEnv("CartPole-v1", 1, backend="serial")
    agent = make_agent(env.single_observation_space, env.single_action_space)
    env.reset()
    env.close()
    for call in (
        lambda: env.reset(),
        lambda: env.step(np.zeros(1, dtype=np.int64)),
        lambda: env.step(agent),
        lambda: env.rollout(agent, 4),
        lambda: env.send_weights(agent),
    ):
        with pytest.raises(RuntimeError, match=r"this ClusterEnv is closed"):
            call()
    env.close()


# ---------------------------------------------------------------------------------------------- NaN
@pytest.mark.parametrize("backend", ["serial", "local"])
def test_nan_observation(backend):
    env = ClusterEnv("envs_for_tests:NaNObsEnv", 1, 2, backend=backend, env_kwargs={"nan_after": 3})
    try:
        env.reset(seed=0)
        zeros = np.zeros(2, dtype=np.int64)
        env.step(zeros)
        env.step(zeros)
        t0 = time.monotonic()
        with pytest.raises(
            RuntimeError, match=r"worker 0: .*non-finite observation \(NaN or inf\) from worker 0, env 0 \(envs_for_tests:NaNObsEnv\)"
        ):
            env.step(zeros)
        assert time.monotonic() - t0 < FAST_S
    finally:
        env.close()


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_nan_reward_in_rollout(backend):
    env = ClusterEnv("envs_for_tests:NaNRewardEnv", 1, 2, backend=backend, env_kwargs={"nan_after": 4})
    try:
        agent = make_agent(env.single_observation_space, env.single_action_space)
        with pytest.raises(RuntimeError, match=r"non-finite reward nan from worker 0, env 0 \(envs_for_tests:NaNRewardEnv\)"):
            env.rollout(agent, 10)
        # Nothing was restarted: a bad env is an error, not a dead worker.
        assert env.stats()["restarts"] == 0
    finally:
        env.close()


@pytest.mark.parametrize(("broken", "says"), [
    ("reset", r"reset\(\) returned one ndarray, Gymnasium's API returns \(obs, info\)"),
    ("step", r"step\(\) returned 4 values, Gymnasium's API returns \(obs, reward, terminated, truncated, info\)"),
    ("reward", r"step\(\) returned the reward array\(\[1\.\]\), not a number")])
def test_an_env_of_the_old_gym_api_is_named_in_one_line(broken, says):
    """Gymnasium's SyncVectorEnv fails with "too many values to unpack" or "setting an array element with a sequence";
    the line here names the env, the call and what Gymnasium's API returns."""
    env = ClusterEnv("envs_for_tests:OldAPIEnv", 1, 2, backend="serial", env_kwargs={"broken": broken})
    try:
        with pytest.raises(RuntimeError, match=rf"worker 0: EnvAPIError: worker 0, env 0 \(envs_for_tests:OldAPIEnv\): "
                                               rf"{says}"):
            env.reset(seed=0)
            for _ in range(3):
                env.step(np.zeros(2, dtype=np.int64))
    finally:
        env.close()


def test_nan_checks_can_be_disabled():
    env = ClusterEnv("envs_for_tests:NaNObsEnv", 1, backend="serial", env_kwargs={"nan_after": 1}, check_finite=False)
    try:
        env.reset()
        obs = env.step(np.zeros(1, dtype=np.int64))[0]
        assert np.isnan(obs).any()
    finally:
        env.close()


def test_a_bad_checkpoint_file_is_one_line_naming_it(tmp_path):
    """Truncated, random or foreign checkpoint files: ``frugalrl eval``, ``--resume`` and the Python API each say in one
    line which file and what is wrong (never a traceback; nothing a worker or a stranger wrote is unpickled)."""
    import subprocess
    import sys

    import torch

    from frugalrl.algos import load_policy
    from frugalrl.algos.ppo import PPOConfig, train

    train(PPOConfig(env="CartPole-v1", backend="serial", workers=1, envs_per_worker=2, num_steps=16,
                    total_timesteps=64, eval_episodes=1, progress=False, tensorboard=False, plots=False,
                    run_dir=str(tmp_path), run_name="run"))
    ckpt = tmp_path / "run" / "checkpoints" / "latest.pt"
    whole = ckpt.read_bytes()
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    cases = [("truncated", whole[: len(whole) // 2], "eval"), ("random", bytes(range(256)) * 8, "train"),
             ("foreign", foreign.read_bytes(), "eval")]
    for name, data, command in cases:
        ckpt.write_bytes(data)
        with pytest.raises(ValueError, match="latest.pt is not a"):
            load_policy(tmp_path / "run")
        argv = ["eval", str(tmp_path / "run")] if command == "eval" else ["train", "ppo", "--resume", str(tmp_path / "run")]
        out = subprocess.run([sys.executable, "-m", "frugalrl.cli", *argv], capture_output=True, text=True, timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "latest.pt is not a" in lines[0], (name, out.stderr)
