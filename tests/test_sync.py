"""Sync rules: unit tests on hand-built contexts, and AAPS against EveryUpdate on a real training loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from frugalrl import AAPS, ClusterEnv, EveryUpdate, Interval, dists, make_agent
from frugalrl.algos.ppo import PPOConfig
from frugalrl.nets import acting_state
from frugalrl.sync import SyncContext, lag_guard, make_sync_rule
from frugalrl.wire.uplink import UplinkOptions

pytestmark = pytest.mark.timeout(120)


def ctx(learner: int, versions: list, kls: dict | None = None) -> SyncContext:
    kls = kls or {}
    asked: list[int] = []

    def kl(w: int):
        asked.append(w)
        return kls.get(w)

    c = SyncContext(learner, list(versions), kl)
    c.asked = asked  # type: ignore[attr-defined]
    return c


# ---------------------------------------------------------------------------------------------- units
def test_every_update_selects_stale_workers():
    rule = EveryUpdate()
    assert rule.select(ctx(3, [None, 3, 2, 0])) == [0, 2, 3]
    assert rule.select(ctx(3, [3, 3])) == []
    assert rule.select(ctx(1, [None, None])) == [0, 1]
    assert rule.describe() == "every"


def test_interval_selects_workers_n_versions_behind():
    rule = Interval(3)
    assert rule.select(ctx(10, [None, 10, 9, 8, 7, 1])) == [0, 4, 5]
    assert rule.select(ctx(10, [10, 10])) == []
    assert Interval(1).select(ctx(5, [4, 5, None])) == [0, 2]
    assert rule.describe() == "interval(3)"


def test_adaptive_kl_selects_by_kl():
    rule = AAPS(0.05)
    c = ctx(5, [None, 5, 4, 4, 4, 3], {2: 0.01, 3: 0.2, 4: None, 5: 0.05})
    # 0: never synced; 3: KL above δ; 4: no recent data; 2, 5: KL at or below δ; 1: current.
    assert rule.select(c) == [0, 3, 4]
    assert sorted(c.asked) == [2, 3, 4, 5]  # KL is only evaluated for stale workers that hold weights
    assert rule.describe() == "aaps(0.05, lag<=20)"
    assert AAPS(0.05, max_lag=None).describe() == "aaps(0.05)"


def test_adaptive_kl_max_lag():
    rule = AAPS(0.5, max_lag=3)
    c = ctx(10, [9, 7, 6, 10], {0: 0.0, 1: 0.0, 2: 0.0})
    assert rule.select(c) == [1, 2]
    assert c.asked == [0]  # lagging workers are synced without computing their KL


def test_lag_guard_shrinks_with_a_short_run():
    """A quarter of the run's updates, at least 1 and at most max_lag; None without max_lag or without a share."""
    assert [lag_guard(20, 0.25, n) for n in (1, 5, 8, 61, 80, 4000)] == [1, 1, 2, 15, 20, 20]
    assert lag_guard(None, 0.25, 5) is None and lag_guard(20, None, 5) == 20
    cfg = PPOConfig(env="BipedalWalker-v3", workers=2, envs_per_worker=16, num_steps=2048, total_timesteps=327_680)
    assert cfg.num_updates == 5 and cfg.sync_rule() == AAPS(0.05, max_lag=1)
    assert PPOConfig(env="CartPole-v1", total_timesteps=327_680).sync_rule() == AAPS(0.05, max_lag=20)
    assert PPOConfig(env="CartPole-v1", max_policy_lag=None).sync_rule() == AAPS(0.05, max_lag=None)
    with pytest.raises(ValueError, match="max_policy_lag_fraction"):
        PPOConfig(env="CartPole-v1", max_policy_lag_fraction=0.0).validate()


def test_make_sync_rule():
    assert isinstance(make_sync_rule("every"), EveryUpdate)
    assert make_sync_rule("interval", interval=4) == Interval(4)
    assert make_sync_rule("AAPS", kl_threshold=0.1) == AAPS(0.1)
    with pytest.raises(ValueError, match="unknown sync rule 'sometimes'"):
        make_sync_rule("sometimes")


# ---------------------------------------------------------------------------------------------- integration
W, K, T = 2, 2, 32


def _agent(env: ClusterEnv, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return make_agent(env.single_observation_space, env.single_action_space, hidden=(32, 32))


def _pg_step(agent, opt, ro) -> None:
    """One REINFORCE step on a rollout (undiscounted reward-to-go within the fragment, normalised)."""
    T_, N_ = ro.rewards.shape
    ret = np.zeros((T_, N_), np.float32)
    acc = np.zeros(N_, np.float32)
    done = ro.terminations | ro.truncations
    for t in reversed(range(T_)):
        acc = ro.rewards[t] + acc * (~done[t])
        ret[t] = acc
    adv = torch.from_numpy((ret - ret.mean()) / (ret.std() + 1e-8))
    obs = torch.from_numpy(ro.obs.reshape(T_ * N_, -1))
    logp = dists.log_prob(agent.dist_kind, agent.dist_params(obs), torch.from_numpy(ro.actions.reshape(-1)))
    loss = -(logp * adv.reshape(-1)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _train(rule, iters: int = 10, backend: str = "serial", weights_delta: bool = False) -> dict:
    """``iters`` rollouts and policy-gradient steps; full copies every sync unless ``weights_delta``."""
    env = ClusterEnv("CartPole-v1", W, K, backend=backend, sync=rule, seed=11, weights_delta=weights_delta)
    try:
        agent = _agent(env)
        opt = torch.optim.Adam(agent.parameters(), lr=1e-3)
        versions = []
        for _ in range(iters):
            ro = env.rollout(agent, T)
            versions.append(ro.versions.copy())
            _pg_step(agent, opt, ro)
        stats = env.stats()
        stats["versions"] = versions
        return stats
    finally:
        env.close()


def test_aaps_syncs_less_than_every_update():
    iters = 10
    every = _train(EveryUpdate(), iters)
    aaps = _train(AAPS(0.05), iters)
    # EveryUpdate: every worker, every iteration (the learner changes after every rollout).
    assert every["weight_syncs"]["total"] == W * iters
    assert every["weight_syncs"]["per_worker"] == [iters] * W
    assert aaps["weight_syncs"]["total"] < every["weight_syncs"]["total"]
    assert len(aaps["weight_syncs"]["per_worker"]) == W
    assert sum(aaps["weight_syncs"]["per_worker"]) == aaps["weight_syncs"]["total"]
    assert all(c >= 1 for c in aaps["weight_syncs"]["per_worker"])  # the first sync always happens
    # Bytes follow syncs: the same full weights message is sent per sync (deltas off).
    per_sync = every["bytes"]["weights"] / every["weight_syncs"]["total"]
    assert aaps["bytes"]["weights"] == per_sync * aaps["weight_syncs"]["total"]
    assert aaps["bytes"]["weights"] < every["bytes"]["weights"]
    assert aaps["bytes"]["down"]["weights"] == aaps["bytes"]["weights"]
    # Every worker's rollout data came from the version it held: lag > 0 only under AAPS.
    assert all((v == i + 1).all() for i, v in enumerate(every["versions"]))
    assert any((v < i + 1).any() for i, v in enumerate(aaps["versions"]))
    assert aaps["sync_rule"] == "aaps(0.05, lag<=20)" and every["sync_rule"] == "every"
    assert all(k is None or k >= 0 for k in aaps["last_kl"])


def test_aaps_local_backend_reports_per_worker_syncs():
    aaps = _train(AAPS(0.05), iters=4, backend="local")
    assert aaps["backend"] == "local"
    assert len(aaps["weight_syncs"]["per_worker"]) == W
    assert aaps["weight_syncs"]["total"] < W * 4
    per_worker_weights = [aaps["bytes"]["per_worker"][str(w)].get("weights", 0) for w in range(W)]
    per_sync = aaps["bytes"]["weights"] / aaps["weight_syncs"]["total"]
    assert per_worker_weights == [per_sync * c for c in aaps["weight_syncs"]["per_worker"]]


@pytest.fixture(params=["logprob", "params"])
def aaps_env(request):
    """AAPS over both behaviour streams: the taken actions' log-probabilities (the default) and full
    distribution parameters."""
    env = ClusterEnv("CartPole-v1", W, K, backend="serial", sync=AAPS(0.05), seed=3,
                     uplink=UplinkOptions(behaviour=request.param))
    yield env
    env.close()


def _manual_kl(env: ClusterEnv, agent, ro, w: int) -> float:
    """KL(behaviour ‖ learner) on worker w's states of the last rollout, computed by hand: exact from the
    behaviour parameters, or Schulman's estimator E[r − 1 − log r] from the taken actions' log-probabilities."""
    sl = slice(w * K, (w + 1) * K)
    states = torch.from_numpy(ro.obs[:, sl].reshape(-1, 4))
    with torch.no_grad():
        learner = agent.dist_params(states)
        if ro.dist_params is not None:
            behaviour = torch.from_numpy(ro.dist_params[:, sl].reshape(-1, 2))
            return float(dists.kl("categorical", behaviour, learner).mean())
        actions = torch.from_numpy(ro.actions[:, sl].reshape(-1))
        log_r = dists.log_prob("categorical", learner, actions) - torch.from_numpy(ro.behaviour_logp[:, sl].reshape(-1))
        return float((torch.expm1(log_r) - log_r).mean())


def test_aaps_kl_is_measured_on_the_workers_states(aaps_env):
    env = aaps_env
    agent = _agent(env)
    ro = env.rollout(agent, T)
    assert env.stats()["weight_syncs"]["per_worker"] == [1, 1]
    # No learner change: nobody is stale, nothing moves.
    assert env.send_weights(agent) == []
    # A tiny learner change: KL on the recorded states is tiny, no sync, and it is the KL we compute.
    with torch.no_grad():
        agent.actor[-1].bias.add_(torch.tensor([0.01, -0.01]))
    before = env.meter.kind_total("weights")
    assert env.send_weights(agent) == []
    assert env.meter.kind_total("weights") == before
    for w in range(W):
        assert env.last_kl[w] == pytest.approx(_manual_kl(env, agent, ro, w), rel=1e-5, abs=1e-9)
        assert 0 < env.last_kl[w] < 0.05
    # A large learner change: KL far above δ, every worker is synced.
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.tensor([3.0, -3.0]))
    assert env.send_weights(agent) == [0, 1]
    for w in range(W):
        assert env.last_kl[w] == pytest.approx(_manual_kl(env, agent, ro, w), rel=1e-5)
        assert env.last_kl[w] > 0.05
    assert env.stats()["weight_syncs"]["per_worker"] == [2, 2]
    # The next rollout runs the new weights.
    ro2 = env.rollout(agent, T)
    assert (ro2.versions == env.learner_version).all()
    assert (ro2.behaviour_log_prob()[ro2.actions == 0] > np.log(0.99)).all()
    assert (ro2.actions == 0).mean() > 0.95


def test_aaps_kl_refers_to_the_weights_a_worker_holds(aaps_env):
    """After a sync, the KL is against the policy the worker now runs, not its older behaviour.

    Sync to a very different policy, then change the learner a little: the worker holds weights
    close to the learner's, so no second sync may happen even before the worker collects new data.
    """
    env = aaps_env
    agent = _agent(env)
    env.rollout(agent, T)
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.tensor([3.0, -3.0]))
    assert env.send_weights(agent) == [0, 1]
    with torch.no_grad():
        agent.actor[-1].bias.add_(torch.tensor([0.01, -0.01]))
    assert env.send_weights(agent) == [], f"resynced although KL to the held weights is tiny: {env.last_kl}"
    assert all(k is not None and k < 0.05 for k in env.last_kl)


def test_aaps_in_step_agent_mode(aaps_env):
    """DETACH step(agent): KL states come from the steps; same rule applies."""
    env = aaps_env
    agent = _agent(env)
    env.reset(seed=3)
    for _ in range(10):
        env.step(agent)
    assert env.stats()["weight_syncs"]["per_worker"] == [1, 1]
    with torch.no_grad():
        agent.actor[-1].bias.add_(torch.tensor([0.01, -0.01]))
    env.step(agent)
    assert env.stats()["weight_syncs"]["per_worker"] == [1, 1]
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.tensor([3.0, -3.0]))
    _, _, _, _, infos = env.step(agent)
    assert env.stats()["weight_syncs"]["per_worker"] == [2, 2]
    np.testing.assert_array_equal(infos["policy_version"], [env.learner_version] * (W * K))
    # Right after that sync a tiny change must not trigger another one (KL against held weights).
    with torch.no_grad():
        agent.actor[-1].bias.add_(torch.tensor([0.01, -0.01]))
    env.step(agent)
    assert env.stats()["weight_syncs"]["per_worker"] == [2, 2]


def test_interval_rule_in_a_run():
    env = ClusterEnv("CartPole-v1", W, K, backend="serial", sync=Interval(3), seed=5)
    try:
        agent = _agent(env)
        opt = torch.optim.SGD(agent.parameters(), lr=1e-3)
        for _ in range(7):
            ro = env.rollout(agent, 8)
            _pg_step(agent, opt, ro)
        # Versions 1..7 at rollouts: syncs at 1, 4, 7.
        assert env.stats()["weight_syncs"]["per_worker"] == [3, 3]
        assert (ro.versions == 7).all() and ro.learner_version == 7
    finally:
        env.close()


def test_force_sync_and_new_agent_objects(aaps_env):
    env = aaps_env
    a1 = _agent(env, seed=1)
    env.rollout(a1, 4)
    with torch.no_grad():
        a1.actor[-1].bias.add_(torch.tensor([1e-4, 0.0]))
    assert env.send_weights(a1) == []
    assert env.send_weights(a1, force=True) == [0, 1]
    # A brand-new agent (possibly at a recycled id()) is a new version and reaches the workers.
    for seed in range(2, 8):
        del a1
        a1 = _agent(env, seed=seed)
        env.send_weights(a1, force=True)
        for w in range(W):
            held = env.backend.workers[w].held_state()
            assert set(held) == set(acting_state(a1))
            assert all(torch.equal(torch.from_numpy(held[k]), v) for k, v in acting_state(a1).items()), (seed, w)


@pytest.mark.parametrize("codec, ratio", [("bf16", 2), ("fp16", 2)])
def test_weights_codec_shrinks_weight_bytes(codec, ratio):
    envs = {c: ClusterEnv("CartPole-v1", 1, 1, backend="serial", seed=0, weights_codec=c) for c in ("fp32", codec)}
    try:
        agent = _agent(envs["fp32"])
        for env in envs.values():
            env.send_weights(agent)
        full, small = (envs[c].meter.kind_total("weights") for c in ("fp32", codec))
        assert full == ratio * small
        obs = torch.randn(16, 4)
        held = envs[codec].backend.workers[0].actor  # an MLP agent: the worker holds it as numpy arrays
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(held.params(obs.numpy())), agent.dist_params(obs),
                                       atol=2e-2, rtol=2e-2)
    finally:
        for env in envs.values():
            env.close()


def test_lag_bound_says_how_stale_a_rule_lets_a_worker_get():
    """The stall watch only calls a lag beyond the rule's own bound a stall."""
    from frugalrl.sync import AAPS, EveryUpdate, Interval

    assert EveryUpdate().lag_bound == 1
    assert Interval(3).lag_bound == 3
    assert AAPS(0.05).lag_bound == 20
    assert AAPS(0.05, None).lag_bound is None
