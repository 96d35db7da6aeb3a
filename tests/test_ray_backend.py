"""The Ray backend: PPO runs on it.

Same results and bytes as the serial reference, dead or silent actors replaced, clear errors and a clean
close: tests/test_backend_contract.py, which runs one suite over every backend. One local Ray instance
serves the whole module (starting Ray takes seconds).
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="backend='ray' needs Ray (pip install 'frugalrl[ray]')")

from frugalrl.algos.ppo import PPOConfig, train  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("ray_8cpus")]


def test_ppo_runs_on_ray(tmp_path):
    cfg = PPOConfig(env="CartPole-v1", workers=2, envs_per_worker=2, num_steps=64, num_minibatches=2,
                    update_epochs=2, total_timesteps=2048, seed=3, backend="ray", eval_every=0,
                    progress=False, plots=False, run_dir=str(tmp_path))
    cfg.validate()
    summary = train(cfg)
    assert summary["env_steps"] >= 2048
    assert summary["bytes"]["weights"] > 0 and summary["bytes"]["observations"] > 0
    assert min(summary["weight_syncs"]["per_worker"]) >= 1


def test_only_actors_on_this_node_are_read_for_the_memory_bound():
    """An actor's pid on another node would name some other process here: worker_memory_mb reads this node's."""
    from frugalrl import ClusterEnv

    env = ClusterEnv("CartPole-v1", 2, 1, backend="ray", ray_num_cpus=0, seed=0)
    try:
        assert sorted(env.backend.worker_rss_mb()) == [0, 1]
        env.backend._info[1]["node_id"] = "another node"
        assert sorted(env.backend.worker_rss_mb()) == [0]
    finally:
        env.close()


def test_a_large_message_for_several_actors_goes_to_the_object_store_once(monkeypatch):
    """The first weights, the same bytes for both actors, are put in Ray's object store once when they exceed Ray's
    inline limit (read from its variable), and travel inside each call when they do not."""
    from frugalrl import ClusterEnv, make_agent
    from frugalrl.envs.backends import ray as ray_backend

    puts: list[int] = []
    put = ray.put
    monkeypatch.setattr(ray, "put", lambda blob, **kw: puts.append(len(blob)) or put(blob, **kw))
    for limit, stored in ((10**9, 0), (1024, 1)):
        monkeypatch.setenv("RAY_max_direct_call_object_size", str(limit))
        assert ray_backend.inline_bytes() == limit
        puts.clear()
        env = ClusterEnv("CartPole-v1", 2, 1, backend="ray", ray_num_cpus=0, seed=0)
        try:
            agent = make_agent(env.single_observation_space, env.single_action_space)
            batch = env.rollout(agent, 4)
            assert batch.obs.shape == (4, 2, 4)
            assert len(puts) == stored and all(n > limit for n in puts)
        finally:
            env.close()
