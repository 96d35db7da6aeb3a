"""The replay backend: emulated workers answer with one real worker's recorded traffic, the head doing its own work."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from frugalrl import AAPS, ClusterEnv, make_agent

pytestmark = pytest.mark.timeout(60)


def test_many_emulated_workers_serve_rollouts_and_take_weights():
    env = ClusterEnv("CartPole-v1", num_workers=16, envs_per_worker=2, backend="replay", seed=0, sync=AAPS(0.05))
    try:
        agent = make_agent(env.single_observation_space, env.single_action_space)
        first = env.rollout(agent, 8)
        assert first.obs.shape == (8, 32, 4) and first.actions.shape == (8, 32)
        assert env.stats()["weight_syncs"]["total"] == 16  # every worker got the first weights
        with torch.no_grad():
            agent.actor[-1].bias.copy_(torch.tensor([4.0, -4.0]))  # far from the recorded policy: AAPS resends
        batch = env.rollout(agent, 8)
        assert np.isfinite(batch.behaviour_log_prob().numpy()).all()
        summary = env.meter.summary()
        assert summary["down"]["weights"] > 0 and summary["up"]["observations"] > 0
        assert env.stats()["weight_syncs"]["total"] > 16
        assert env.backend.worker_pids() == {}
        with pytest.raises(RuntimeError, match="replay backend does not answer 'step'"):
            env.step(np.zeros(32, dtype=np.int64))
    finally:
        env.close()


def test_paced_workers_answer_after_their_steps_and_in_request_order():
    env = ClusterEnv("CartPole-v1", num_workers=4, envs_per_worker=2, backend="replay", seed=0)
    try:
        agent = make_agent(env.single_observation_space, env.single_action_space)
        env.rollout(agent, 8)  # the recordings
        with pytest.raises(ValueError, match="steps_per_second must be positive"):
            env.backend.pace(0)
        env.backend.pace(200.0)  # 8 steps x 2 envs at 200 steps/s: 80 ms per rollout, the workers in parallel
        t0 = time.perf_counter()
        batch = env.rollout(agent, 8)
        took = time.perf_counter() - t0
        assert 0.08 <= took < 0.5, took
        assert batch.obs.shape == (8, 8, 4)
        env.backend.pace(None)
        t0 = time.perf_counter()
        env.rollout(agent, 8)
        assert time.perf_counter() - t0 < 0.08
    finally:
        env.close()
