"""ClusterEnv as a Gymnasium vector env, on the serial and local backends, against Gymnasium's own SyncVectorEnv.

What every backend (Ray's too) must do alike is tests/test_backend_contract.py.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from frugalrl import ClusterEnv, make_agent
from frugalrl.envs.spec import flat_observations
from frugalrl.monitor import MixPolicy

pytestmark = pytest.mark.timeout(120)

BACKENDS = ["serial", "local"]
SEED = 123
W, K = 2, 2  # workers, envs per worker
N = W * K


def make_ref(env_id: str, n: int, mode: AutoresetMode = AutoresetMode.NEXT_STEP) -> SyncVectorEnv:
    return SyncVectorEnv([lambda: gym.make(env_id) for _ in range(n)], autoreset_mode=mode)


def random_actions(space: gym.Space, n: int, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=n)
    return (rng.uniform(space.low, space.high, size=(n, *space.shape)) * scale).astype(np.float32)


def assert_same_step(out, ref_out, t):
    for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), out[:4], ref_out[:4], strict=True):
        assert a.shape == b.shape, (t, name, a.shape, b.shape)
        assert a.dtype == b.dtype, (t, name, a.dtype, b.dtype)
        np.testing.assert_array_equal(a, b, err_msg=f"step {t}: {name}")


def fresh_agent(env: ClusterEnv, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return make_agent(env.single_observation_space, env.single_action_space, hidden=(32, 32))


@pytest.fixture(scope="module")
def cartpoles():
    envs = {b: ClusterEnv("CartPole-v1", W, K, backend=b, seed=SEED) for b in BACKENDS}
    yield envs
    for env in envs.values():
        env.close()


@pytest.fixture(params=BACKENDS)
def cartpole(request, cartpoles):
    return cartpoles[request.param]


@pytest.fixture(scope="module")
def pendulums():
    envs = {b: ClusterEnv("Pendulum-v1", W, 1, backend=b, seed=SEED) for b in BACKENDS}
    yield envs
    for env in envs.values():
        env.close()


@pytest.fixture(params=BACKENDS)
def pendulum(request, pendulums):
    return pendulums[request.param]


# ---------------------------------------------------------------------------------------------- API
def test_is_a_gymnasium_vector_env(cartpole):
    single = gym.make("CartPole-v1")
    ref = make_ref("CartPole-v1", N)
    assert isinstance(cartpole, gym.vector.VectorEnv)
    assert cartpole.num_envs == N
    assert cartpole.single_observation_space == single.observation_space
    assert cartpole.single_action_space == single.action_space
    assert cartpole.observation_space == ref.observation_space
    assert cartpole.action_space == ref.action_space
    assert cartpole.observation_space.dtype == np.float32
    assert cartpole.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert cartpole.spec is not None and cartpole.spec.id == "CartPole-v1"
    assert cartpole.backend_name in repr(cartpole) and "CartPole-v1" in repr(cartpole)
    assert cartpole.unwrapped is cartpole
    cartpole.reset(seed=SEED)
    assert cartpole.render() == (None,) * N  # every env's render(), as AsyncVectorEnv's (no render_mode here)


def test_reset_seeds_env_j_with_seed_plus_j(cartpole):
    obs, infos = cartpole.reset(seed=SEED)
    ref_obs, _ = make_ref("CartPole-v1", N).reset(seed=SEED)
    ref_list_obs, _ = make_ref("CartPole-v1", N).reset(seed=[SEED + j for j in range(N)])
    np.testing.assert_array_equal(ref_obs, ref_list_obs)  # Gymnasium's own convention: seed + j
    np.testing.assert_array_equal(obs, ref_obs)
    assert obs.shape == (N, 4) and obs.dtype == np.float32
    assert isinstance(infos, dict)
    for j in range(N):
        single, _ = gym.make("CartPole-v1").reset(seed=SEED + j)
        np.testing.assert_array_equal(obs[j], single)
    other, _ = cartpole.reset(seed=SEED + 1)
    assert not np.array_equal(other, obs)
    np.testing.assert_array_equal(other[:-1], obs[1:])  # env j with seed+1 starts where env j+1 did


def test_step_matches_sync_vector_env_next_step(cartpole):
    """Same obs/rewards/flags (values, shapes, dtypes) as SyncVectorEnv, including NEXT_STEP autoresets."""
    rng = np.random.default_rng(0)
    ref = gym.wrappers.vector.RecordEpisodeStatistics(make_ref("CartPole-v1", N))
    obs, _ = cartpole.reset(seed=SEED)
    ref_obs, _ = ref.reset(seed=SEED)
    np.testing.assert_array_equal(obs, ref_obs)
    done_prev = np.zeros(N, dtype=bool)
    episodes = 0
    for t in range(150):
        actions = random_actions(cartpole.single_action_space, N, rng)
        out = cartpole.step(actions)
        ref_out = ref.step(actions)
        assert_same_step(out, ref_out, t)
        obs, rewards, terms, truncs, infos = out
        # NEXT_STEP: the step after an episode ends only resets that env.
        assert (rewards[done_prev] == 0).all() and not terms[done_prev].any() and not truncs[done_prev].any()
        assert (np.abs(obs[done_prev]) <= 0.05).all()  # CartPole's reset distribution
        done = terms | truncs
        ref_infos = ref_out[4]
        if done.any():
            episodes += int(done.sum())
            np.testing.assert_array_equal(infos["_episode"], ref_infos["_episode"])
            np.testing.assert_array_equal(infos["_episode"], done)
            np.testing.assert_allclose(infos["episode"]["r"][done], ref_infos["episode"]["r"][done])
            np.testing.assert_array_equal(infos["episode"]["l"][done], ref_infos["episode"]["l"][done])
            assert infos["episode"]["l"].dtype.kind == "i"
            assert (infos["episode"]["t"][done] >= 0).all()
            assert set(infos["episode"]) == {"r", "l", "t"}
        else:
            assert "episode" not in infos and "_episode" not in ref_infos
        done_prev = done
    assert episodes >= 5


@pytest.mark.parametrize("env_id, steps", [("LunarLander-v3", 120), ("MountainCarContinuous-v0", 60)])
def test_other_envs_match_sync_vector_env(env_id, steps, closing):
    """More Discrete and Box envs on the serial backend (Box actions within their bounds).

    The local backend runs the same worker code; CartPole and Pendulum check it against Gymnasium.
    """
    env = closing(ClusterEnv(env_id, 2, 1, backend="serial", seed=SEED))
    ref = make_ref(env_id, 2)
    assert env.action_space == ref.action_space and env.observation_space == ref.observation_space
    rng = np.random.default_rng(1)
    np.testing.assert_array_equal(env.reset(seed=SEED)[0], ref.reset(seed=SEED)[0])
    ended = 0
    for t in range(steps):
        actions = random_actions(env.single_action_space, 2, rng)
        out, ref_out = env.step(actions), ref.step(actions)
        assert_same_step(out, ref_out, t)
        ended += int((out[2] | out[3]).sum())
    if env_id != "MountainCarContinuous-v0":
        assert ended >= 1  # crossed at least one autoreset


def test_rewards_travel_as_float32_only_where_that_is_exact(closing):
    """CartPole's rewards (1.0) cross as float32, 4 bytes each, and come out float64 as SyncVectorEnv's; MountainCar
    Continuous's (fractions of the action's square) are not float32 numbers and cross as they are."""
    for env_id, reward_bytes in (("CartPole-v1", 4), ("MountainCarContinuous-v0", 8)):
        env = closing(ClusterEnv(env_id, 2, 2, backend="serial", seed=SEED))
        env.reset(seed=SEED)
        env.action_space.seed(SEED)
        before = env.meter.by_kind()["rewards"]
        for _ in range(10):
            rewards = env.step(env.action_space.sample())[1]
            assert rewards.dtype == np.float64
        flags = 2 * 2  # terminations and truncations, a bit-packed byte each, per worker
        assert env.meter.by_kind()["rewards"] - before == 10 * (4 * reward_bytes + flags)


def test_out_of_bounds_box_actions_reach_the_env_unchanged(closing):
    env = closing(ClusterEnv("MountainCarContinuous-v0", 1, 2, backend="serial", seed=SEED))
    ref = make_ref("MountainCarContinuous-v0", 2)
    np.testing.assert_array_equal(env.reset(seed=SEED)[0], ref.reset(seed=SEED)[0])
    actions = np.array([[3.0], [-2.0]], dtype=np.float32)
    assert_same_step(env.step(actions), ref.step(actions), 0)


@pytest.mark.parametrize("env_id, size, ones", [("FrozenLake-v1", 16, 1), ("Blackjack-v1", 45, 3)])
def test_discrete_and_tuple_observations_arrive_one_hot(env_id, size, ones, closing):
    """Discrete and Tuple observations reach the agent as one flat one-hot Box (Stable-Baselines3's preprocessing,
    :func:`frugalrl.envs.spec.flat_observations`), a byte per entry, the steps those of Gymnasium's own
    ``FlattenObservation`` on the same seeds."""
    env = closing(ClusterEnv(env_id, 1, 2, backend="local", seed=SEED))
    assert env.single_observation_space == gym.spaces.Box(0, 1, (size,), np.uint8)
    ref = SyncVectorEnv([lambda: gym.wrappers.FlattenObservation(gym.make(env_id)) for _ in range(2)])
    obs, ref_obs = env.reset(seed=SEED)[0], ref.reset(seed=SEED)[0]
    assert obs.dtype == np.uint8 and (obs.sum(1) == ones).all()
    np.testing.assert_array_equal(obs, ref_obs)
    rng = np.random.default_rng(0)
    for _ in range(20):
        actions = random_actions(env.single_action_space, 2, rng)
        out, ref_out = env.step(actions), ref.step(actions)
        np.testing.assert_array_equal(out[0], ref_out[0])
        np.testing.assert_array_equal(out[1], ref_out[1])


class _OutsideItsSpace(gym.Env):
    """A Dict observation whose text part holds a character its Text space's charset lacks."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Discrete(3), "mission": gym.spaces.Text(8)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return {"pos": 0, "mission": "go left"}, {}


def test_an_observation_outside_its_space_fails_with_one_clear_line():
    with pytest.raises(ValueError, match=r"does not fit the env's observation space Dict.*KeyError: ' '"):
        flat_observations(_OutsideItsSpace()).reset(seed=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_step_autoreset_matches_sync_vector_env(backend, closing):
    env = closing(ClusterEnv("CartPole-v1", W, K, backend=backend, seed=SEED, autoreset_mode="SameStep"))
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    ref = make_ref("CartPole-v1", N, AutoresetMode.SAME_STEP)
    rng = np.random.default_rng(2)
    np.testing.assert_array_equal(env.reset(seed=SEED)[0], ref.reset(seed=SEED)[0])
    finals = 0
    for t in range(120):
        actions = random_actions(env.single_action_space, N, rng)
        out, ref_out = env.step(actions), ref.step(actions)
        assert_same_step(out, ref_out, t)
        done = out[2] | out[3]
        infos, ref_infos = out[4], ref_out[4]
        if done.any():
            np.testing.assert_array_equal(infos["_final_obs"], ref_infos["_final_obs"])
            np.testing.assert_array_equal(infos["_final_obs"], done)
            for j in np.flatnonzero(done):
                np.testing.assert_array_equal(infos["final_obs"][j], ref_infos["final_obs"][j])
                assert not np.array_equal(infos["final_obs"][j], out[0][j])
            assert (np.abs(out[0][done]) <= 0.05).all()  # already reset in the same step
            np.testing.assert_array_equal(infos["_episode"], done)
            finals += int(done.sum())
        else:
            assert "final_obs" not in infos
    assert finals >= 5


ROLLOUT_FIELDS = ("obs", "actions", "rewards", "terminations", "truncations", "behaviour_logp", "final_idx",
                  "next_obs")


def test_same_seed_gives_same_trajectories(cartpole, closing):
    """Seeded resets repeat steps and rollouts exactly; so does a new env built with the same seed.

    (The new env is serial; local == serial is checked by tests/test_backend_contract.py.)
    """
    agent = fresh_agent(cartpole)
    rng = np.random.default_rng(3)
    actions = [random_actions(cartpole.single_action_space, N, rng) for _ in range(60)]
    runs = []
    for _ in range(2):
        first = cartpole.reset(seed=SEED)[0]
        runs.append([first] + [cartpole.step(a) for a in actions] + [cartpole.rollout(agent, 40)])
    for t, (a, b) in enumerate(zip(runs[0][1:-1], runs[1][1:-1], strict=True)):
        assert_same_step(a, b, t)
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    for name in ROLLOUT_FIELDS:
        np.testing.assert_array_equal(getattr(runs[0][-1], name), getattr(runs[1][-1], name), err_msg=name)
    other = cartpole.reset(seed=SEED + 1)[0]
    assert not np.array_equal(other, runs[0][0])
    # A rollout on a never-reset env starts from reset(seed=env.seed), i.e. the constructor's seed.
    cartpole.reset(seed=SEED + 5)
    r1 = cartpole.rollout(agent, 40)
    fresh = closing(ClusterEnv("CartPole-v1", W, K, backend="serial", seed=SEED + 5))
    r2 = fresh.rollout(agent, 40)
    for name in ROLLOUT_FIELDS:
        np.testing.assert_array_equal(getattr(r1, name), getattr(r2, name), err_msg=name)


def test_env_order_step_path_matches_single_envs(cartpole):
    """Env j is always at index j: it replays a single env seeded seed+j under the same actions."""
    rng = np.random.default_rng(4)
    T = 80
    actions = np.stack([random_actions(cartpole.single_action_space, N, rng) for _ in range(T)])
    got = [cartpole.reset(seed=SEED)[0]]
    for t in range(T):
        got.append(cartpole.step(actions[t])[0])
    got = np.stack(got)
    for j in range(N):
        single = gym.make("CartPole-v1")
        expected = [single.reset(seed=SEED + j)[0]]
        needs_reset = False
        for t in range(T):
            if needs_reset:
                o, _ = single.reset()
                needs_reset = False
            else:
                o, _, te, tr, _ = single.step(int(actions[t, j]))
                needs_reset = te or tr
            expected.append(o)
        np.testing.assert_array_equal(got[:, j], np.stack(expected), err_msg=f"env {j}")


def _replay_rollout(env_id: str, seed: int, ro, j: int, box: bool) -> None:
    """Drive a single env with rollout column j's actions and check every obs, reward and final obs."""
    single = gym.make(env_id)
    o, _ = single.reset(seed=seed)
    finals = {(int(t), int(e)): i for i, (t, e) in enumerate(ro.final_idx)}
    for t in range(ro.num_steps):
        np.testing.assert_array_equal(ro.obs[t, j], o, err_msg=f"env {j}, step {t}")
        a = ro.actions[t, j]
        if box:
            a = np.clip(a, single.action_space.low, single.action_space.high)
        o, r, te, tr, _ = single.step(a if box else int(a))
        assert ro.rewards[t, j] == np.float32(r)
        assert ro.terminations[t, j] == te and ro.truncations[t, j] == tr
        if te or tr:
            np.testing.assert_array_equal(ro.final_obs[finals.pop((t, j))], o)
            o, _ = single.reset()
    np.testing.assert_array_equal(ro.next_obs[j], o)
    assert not [k for k in finals if k[1] == j]


def test_env_order_rollout_path_matches_single_envs(cartpole):
    agent = fresh_agent(cartpole, seed=1)
    cartpole.reset(seed=SEED)
    ro = cartpole.rollout(agent, 100)
    assert len(ro.final_idx) >= 3
    for j in range(N):
        _replay_rollout("CartPole-v1", SEED + j, ro, j, box=False)


def test_finished_episodes_cross_as_returns_and_lengths_only(cartpole):
    """A rollout reply carries each finished episode's return (float32 where exact, as CartPole's) and length (the
    smallest unsigned dtype) and its final observation; the head derives where it ended from the flags."""
    from frugalrl.envs.worker import episode_stats

    agent = fresh_agent(cartpole, seed=3)
    cartpole.reset(seed=SEED)
    before = cartpole.meter.by_kind()
    ro = cartpole.rollout(agent, 64)
    moved = {k: n - before.get(k, 0) for k, n in cartpole.meter.by_kind().items()}
    episodes = len(ro.episode_returns)
    assert episodes >= 3 and max(ro.episode_lengths) < 256
    assert moved["info"] == 5 * episodes  # 4 B of float32 return + 1 B of uint8 length each (28 B before)
    stats = episode_stats([1.5, 200.0], [3, 300])
    assert (stats["ep_r"].dtype, stats["ep_l"].dtype) == (np.float32, np.uint16)
    lunar = episode_stats([-123.456789, 1.0], [70000])
    assert lunar["ep_r"].dtype == np.float64 and lunar["ep_r"].tolist() == [-123.456789, 1.0]
    assert lunar["ep_l"].dtype == np.uint32 and episode_stats([], [])["ep_l"].size == 0


def test_rollout_structure(cartpole):
    agent = fresh_agent(cartpole, seed=2)
    cartpole.reset(seed=SEED)
    T = 64
    ro = cartpole.rollout(agent, T)
    assert ro.num_steps == T and ro.num_envs == N
    assert ro.obs.shape == (T, N, 4) and ro.obs.dtype == np.float32
    assert ro.actions.shape == (T, N) and ro.actions.dtype == np.int64
    assert ((ro.actions >= 0) & (ro.actions < 2)).all()
    assert ro.rewards.shape == (T, N) and ro.rewards.dtype == np.float32
    assert ro.terminations.dtype == bool and ro.truncations.dtype == bool
    # The behaviour: the log-probability of each taken action (uplink_behaviour "logprob", the default).
    assert ro.dist_params is None and ro.behaviour_logp.shape == (T, N) and ro.behaviour_logp.dtype == np.float32
    assert ro.next_obs.shape == (N, 4)
    assert ro.dist_kind == "categorical" and ro.valid is None
    assert ro.restarted_workers == []
    # final_idx / final_obs list exactly the steps where an episode ended.
    done = ro.terminations | ro.truncations
    assert sorted(map(tuple, ro.final_idx.tolist())) == sorted(map(tuple, np.argwhere(done).tolist()))
    assert ro.final_idx.shape == (int(done.sum()), 2) and ro.final_obs.shape == (int(done.sum()), 4)
    for (t, j), fo in zip(ro.final_idx, ro.final_obs, strict=True):
        assert abs(fo[0]) > 2.4 or abs(fo[2]) > 0.2094 or ro.truncations[t, j]  # a terminal CartPole state
        if t + 1 < T:
            assert (np.abs(ro.obs[t + 1, j]) <= 0.05).all()  # same-step autoreset
    assert len(ro.episode_returns) == len(ro.episode_lengths) == int(done.sum())
    np.testing.assert_array_equal(ro.episode_returns, ro.episode_lengths)  # reward 1 per step
    # Versions: every action chosen by the learner's current version (EveryUpdate).
    assert ro.learner_version == cartpole.learner_version
    assert (ro.versions == cartpole.learner_version).all()
    assert (ro.policy_lag() == 0).all()
    assert cartpole.stats()["worker_versions"] == [cartpole.learner_version] * W
    # The behaviour log-probabilities are the agent's on the recorded states and actions.
    with torch.no_grad():
        params = agent.dist_params(torch.from_numpy(ro.obs.reshape(-1, 4))).reshape(T, N, 2)
        expected = torch.log_softmax(params, -1).gather(-1, torch.from_numpy(ro.actions)[..., None])[..., 0]
    np.testing.assert_allclose(ro.behaviour_logp, expected.numpy(), atol=1e-5)
    logp = ro.behaviour_log_prob()
    assert logp.shape == (T, N) and torch.isfinite(logp).all() and (logp <= 0).all()
    # The next rollout continues where this one stopped.
    ro2 = cartpole.rollout(agent, 8)
    np.testing.assert_array_equal(ro2.obs[0], ro.next_obs)


def test_step_with_agent_detach(cartpole):
    """step(agent): workers infer with their cached copy; infos carry actions, params and version."""
    agent = fresh_agent(cartpole, seed=3)
    obs, _ = cartpole.reset(seed=SEED)
    syncs_before = cartpole.stats()["weight_syncs"]["per_worker"]
    for _ in range(20):
        out = cartpole.step(agent)
        infos = out[4]
        assert infos["actions"].shape == (N,) and infos["actions"].dtype == np.int64
        assert infos["dist_params"].shape == (N, 2)
        with torch.no_grad():
            expected = agent.dist_params(torch.from_numpy(obs)).numpy()
        np.testing.assert_allclose(infos["dist_params"], expected, atol=1e-5)
        np.testing.assert_array_equal(infos["policy_version"], np.full(N, cartpole.learner_version))
        obs = out[0]
    # Weights moved once per worker: the agent did not change between steps.
    after = cartpole.stats()["weight_syncs"]["per_worker"]
    assert [a - b for a, b in zip(after, syncs_before, strict=True)] == [1] * W


def test_box_actions_in_rollout(pendulum):
    agent = fresh_agent(pendulum, seed=5)
    assert agent.dist_kind == "gaussian"
    pendulum.reset(seed=SEED)
    T = 210  # crosses Pendulum's 200-step truncation
    ro = pendulum.rollout(agent, T)
    n = pendulum.num_envs
    assert ro.actions.shape == (T, n, 1) and ro.actions.dtype == np.float32
    assert ro.behaviour_logp.shape == (T, n)
    assert ro.truncations[199].all() and not ro.terminations.any()
    np.testing.assert_array_equal(ro.final_idx[:, 0], [199] * n)
    for j in range(n):
        _replay_rollout("Pendulum-v1", SEED + j, ro, j, box=True)
    logp = ro.behaviour_log_prob()
    assert logp.shape == (T, n) and torch.isfinite(logp).all()


def test_box_actions_in_step(pendulum):
    rng = np.random.default_rng(6)
    n = pendulum.num_envs
    ref = make_ref("Pendulum-v1", n)
    np.testing.assert_array_equal(pendulum.reset(seed=SEED)[0], ref.reset(seed=SEED)[0])
    for t in range(205):  # crosses the 200-step truncation and its NEXT_STEP reset
        actions = random_actions(pendulum.single_action_space, n, rng, scale=3.0)
        assert_same_step(pendulum.step(actions), ref.step(actions), t)
    agent = fresh_agent(pendulum, seed=6)
    obs, _, _, _, infos = pendulum.step(agent)
    assert infos["actions"].shape == (n, 1) and infos["actions"].dtype == np.float32
    assert infos["dist_params"].shape == (n, 2)
    assert obs.shape == (n, 3)


def test_same_step_final_info_matches_gymnasium(closing):
    """SameStep mode: final_obs and final_info of finished envs, with masks, like SyncVectorEnv."""
    env = closing(ClusterEnv("CartPole-v1", 2, 2, backend="serial", seed=SEED, autoreset_mode="SameStep"))
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)], autoreset_mode="SameStep")
    env.reset(seed=SEED)
    ref.reset(seed=SEED)
    seen = False
    for _ in range(60):
        a = np.ones(4, dtype=np.int64)
        o1, _, te1, tr1, i1 = env.step(a)
        o2, _, te2, tr2, i2 = ref.step(a)
        np.testing.assert_allclose(o1, o2)
        if "_final_obs" in i2:
            seen = True
            np.testing.assert_array_equal(i1["_final_obs"], i2["_final_obs"])
            np.testing.assert_array_equal(i1["_final_info"], i2["_final_info"])
            for j in np.flatnonzero(i2["_final_obs"]):
                np.testing.assert_allclose(i1["final_obs"][j], i2["final_obs"][j])
    ref.close()
    assert seen


def assert_same_infos(ours: dict, ref: dict, where: str) -> None:
    """Every key, nested dict, dtype and value of SyncVectorEnv's ``infos`` (an object array's values by ==)."""
    assert set(ours) == set(ref), (where, set(ours) ^ set(ref))
    for key, b in ref.items():
        a = ours[key]
        if isinstance(b, dict):
            assert_same_infos(a, b, f"{where}: {key}")
        elif key == "final_obs":
            assert [x is None for x in a] == [x is None for x in b], where
        else:
            assert a.dtype == b.dtype and a.shape == b.shape, (where, key, a.dtype, b.dtype, a.shape, b.shape)
            assert all(x == y or (x is None and y is None) for x, y in zip(a.tolist(), b.tolist(), strict=True)), (
                where, key, a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_infos_of_every_kind_are_laid_out_as_syncvectorenv_lays_them_out(closing, backend, mode):
    """Strings, None, lists, numpy booleans and nested dicts cross as data (in the reply's header), numbers and
    arrays as arrays; ``reset`` and ``step`` infos (``final_info`` too) have SyncVectorEnv's every key, dtype and
    value (``episode_statistics=False``: its exact layout)."""
    from envs_for_tests import InfoKindsEnv

    env = closing(ClusterEnv([lambda: InfoKindsEnv()] * N, num_workers=W, backend=backend, seed=SEED,
                             autoreset_mode=mode, episode_statistics=False))
    ref = SyncVectorEnv([lambda: InfoKindsEnv()] * N, autoreset_mode=mode)
    assert_same_infos(env.reset(seed=SEED)[1], ref.reset(seed=SEED)[1], "reset")
    for t in range(9):  # two episodes of 4 steps, and the next-step resets between them
        actions = np.zeros(N, dtype=np.int64)
        assert_same_infos(env.step(actions)[4], ref.step(actions)[4], f"step {t}")
    ref.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_an_info_whose_dtype_differs_between_envs_takes_the_first_envs_as_syncvectorenv_does(closing, backend, mode):
    """FrozenLake's ``prob`` is an int after a reset and a float after a slippery step: the vector env's first env
    sets the array's dtype and the others are cast to it (Gymnasium's ``_add_info``). A worker holding a reset env
    before a stepped one must not truncate the stepped one's 0.333 when the vector env's first env is a float."""
    env = closing(ClusterEnv([lambda: gym.make("FrozenLake-v1")] * N, num_workers=W, backend=backend,
                             autoreset_mode=mode, episode_statistics=False))
    ref = SyncVectorEnv([lambda: gym.make("FrozenLake-v1")] * N, autoreset_mode=mode)
    assert_same_infos(env.reset(seed=3)[1], ref.reset(seed=3)[1], "reset")
    ref.action_space.seed(5)
    mixed = 0
    for t in range(120):
        actions = ref.action_space.sample()
        ours, theirs = env.step(actions)[4], ref.step(actions)[4]
        assert_same_infos(ours, theirs, f"step {t}")
        mixed += len({float(p) for p in theirs["prob"]}) > 1  # the case that needs the first env's dtype
    ref.close()
    assert mixed


def test_an_info_that_is_not_data_is_left_out_and_named_once(closing):
    """An object in infos cannot leave a worker (nothing a worker sends is unpickled): it is left out, and each
    worker names the key once (a warning, which Python then shows once); every other info still arrives."""
    from envs_for_tests import InfoKindsEnv

    env = closing(ClusterEnv([lambda: InfoKindsEnv(with_object=True)] * N, num_workers=W, backend="local",
                             seed=SEED))
    with pytest.warns(RuntimeWarning, match="info 'handle' is left out of infos: a value that is not data") as caught:
        infos = env.reset(seed=SEED)[1]
        for _ in range(3):
            infos = env.step(np.zeros(N, dtype=np.int64))[4]
    assert len([w for w in caught if "handle" in str(w.message)]) == W  # not once per step
    assert "handle" not in infos and infos["stage"].tolist() == ["stage-0"] * N


def test_an_info_array_whose_shape_differs_between_envs_is_named(closing):
    """Gymnasium cannot batch an info array whose shape differs between envs (SyncVectorEnv raises); the worker
    keeps the first env's and names the key instead of dropping the others silently."""
    from envs_for_tests import InfoKindsEnv

    env = closing(ClusterEnv([lambda: InfoKindsEnv(ragged=True)] * 4, num_workers=1, backend="serial", seed=SEED))
    with pytest.warns(RuntimeWarning, match="info 'path' is left out of infos"):
        env.reset(seed=SEED)


def test_workers_import_torch_only_for_policies_numpy_does_not_run(closing):
    """Head-side inference (``step(actions)``) needs no policy in the workers, and an MLP agent runs in numpy (gSDE's
    too): their processes never load torch (they start in a fraction of the time and hold ~40 MB instead of ~230 MB,
    docs/benchmarks.md#worker-footprint); a policy that needs torch (AcceRL's alpha mix here) loads it."""
    env = closing(ClusterEnv("CartPole-v1", W, K, backend="local", seed=SEED, inline_workers=0,
                             uplink={"behaviour": "logprob"}))

    def torch_loaded(env: ClusterEnv) -> list[bool]:
        return ["libtorch" in open(f"/proc/{pid}/maps").read() for pid in env.backend.worker_pids().values()]

    env.reset(seed=SEED)
    for _ in range(3):
        env.step(np.zeros(N, dtype=np.int64))
    assert torch_loaded(env) == [False] * W
    ro = env.rollout(fresh_agent(env), 4)  # the workers decode, act and send log μ(a|s) in numpy
    assert ro.behaviour_logp.shape == (4, N)
    assert torch_loaded(env) == [False] * W
    pendulum = closing(ClusterEnv("Pendulum-v1", 1, 1, backend="local", seed=SEED, inline_workers=0))
    spaces = (pendulum.single_observation_space, pendulum.single_action_space)
    pendulum.rollout(make_agent(*spaces, sde=True), 4)
    assert torch_loaded(pendulum) == [False]
    pendulum.rollout(MixPolicy(make_agent(*spaces, hidden=(16,)), make_agent(*spaces), alpha=0.5), 4)
    assert torch_loaded(pendulum) == [True]
