"""The Ray backend: same results and bytes as the serial reference, dead or silent actors replaced, PPO runs.

One local Ray instance serves the whole module (starting Ray takes seconds).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import numpy as np
import pytest
import torch
from conftest import pid_alive, wait_dead
from test_cluster_env import check_backend_matches_serial

ray = pytest.importorskip("ray", reason="backend='ray' needs Ray (pip install 'frugalrl[ray]')")

from frugalrl import ClusterEnv, make_agent  # noqa: E402
from frugalrl.algos.ppo import PPOConfig, train  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("ray_8cpus")]

W, K = 2, 2
N = W * K


def fresh_agent(env: ClusterEnv, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return make_agent(env.single_observation_space, env.single_action_space, hidden=(32, 32))


def test_serial_and_ray_give_identical_results_and_bytes(closing):
    """The backend contract of tests/test_cluster_env.py, on Ray."""
    check_backend_matches_serial("ray", closing)


def test_killed_actor_is_replaced_and_reported(closing):
    env = closing(ClusterEnv("CartPole-v1", W, K, backend="ray", seed=0, ray_num_cpus=0))
    pids = env.backend.worker_pids()
    assert sorted(pids) == list(range(W)) and len(set(pids.values())) == W
    assert all(pid != os.getpid() and pid_alive(pid) for pid in pids.values())
    nodes = env.backend.worker_nodes()
    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert sorted(nodes) == list(range(W))
    assert all(n["node_id"] in node_ids and n["node_ip"] for n in nodes.values())
    agent = fresh_agent(env)
    ro1 = env.rollout(agent, 16)
    dead = env.backend.worker_pids()[1]
    os.kill(dead, signal.SIGKILL)
    assert wait_dead(dead)
    t0 = time.monotonic()
    ro2 = env.rollout(agent, 16)
    assert time.monotonic() - t0 < 30.0
    assert ro2.restarted_workers == [1]
    assert (ro2.versions == env.learner_version).all()  # the fresh actor got the weights again
    np.testing.assert_array_equal(ro2.obs[0, :K], ro1.next_obs[:K])  # worker 0 carried on
    assert (np.abs(ro2.obs[0, K:]) <= 0.05).all()  # worker 1's envs were reset
    assert env.stats()["restarts"] == 1 and env.stats()["restart_events"][0]["worker"] == 1
    new_pid = env.backend.worker_pids()[1]
    assert new_pid != dead and pid_alive(new_pid)
    # ray.kill of an actor handle: found by the next request too.
    ray.kill(env.backend.actors[0], no_restart=True)
    ro3 = env.rollout(agent, 16)
    assert ro3.restarted_workers == [0]
    assert env.rollout(agent, 16).restarted_workers == []
    pids = set(pids.values()) | set(env.backend.worker_pids().values())
    env.close()
    for pid in pids:
        assert wait_dead(pid, timeout=10.0), f"actor process {pid} still running after close()"


def test_silent_actor_is_declared_dead_after_the_timeout(closing):
    env = closing(ClusterEnv("CartPole-v1", 1, 1, backend="ray", seed=0, worker_timeout=2.0, ray_num_cpus=0))
    agent = fresh_agent(env)
    env.rollout(agent, 8)
    pid = env.backend.worker_pids()[0]
    os.kill(pid, signal.SIGSTOP)  # alive but silent, like a hung worker
    try:
        t0 = time.monotonic()
        ro = env.rollout(agent, 8)
        assert time.monotonic() - t0 < 30.0
        assert ro.restarted_workers == [0]
        assert "no reply" in env.stats()["restart_events"][0]["reason"]
        assert env.backend.worker_pids()[0] != pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_env_that_fails_in_an_actor_is_a_clear_error_at_start():
    """The test module's envs import in the actors (sys.path travels); a build error names the worker."""
    with pytest.raises(RuntimeError, match="worker 0 could not start.*refuses to start in a worker"):
        ClusterEnv("envs_for_tests:FailsInWorkerEnv", 1, backend="ray", env_kwargs={"head_pid": os.getpid()})


def test_ppo_runs_on_ray(tmp_path):
    cfg = PPOConfig(env="CartPole-v1", workers=2, envs_per_worker=2, num_steps=64, num_minibatches=2,
                    update_epochs=2, total_timesteps=2048, seed=3, backend="ray", eval_every=0,
                    progress=False, plots=False, run_dir=str(tmp_path))
    cfg.validate()
    summary = train(cfg)
    assert summary["env_steps"] >= 2048
    assert summary["bytes"]["weights"] > 0 and summary["bytes"]["observations"] > 0
    assert min(summary["weight_syncs"]["per_worker"]) >= 1
