"""PPO: the math pieces against references, and learning on CartPole through ClusterEnv and plain gym."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from frugalrl.algos.ppo import PPOConfig, train
from frugalrl.returns import gae

# CartPole settings in the spirit of rl-zoo's tuned PPO: small fragments, many epochs.
CARTPOLE = dict(
    env="CartPole-v1", workers=2, envs_per_worker=4, num_steps=32, num_minibatches=1, update_epochs=20,
    learning_rate=1e-3, gamma=0.98, gae_lambda=0.8, ent_coef=0.0, progress=False,
)


def gae_reference(rewards, values, next_values, terms, dones, gamma, lam):
    """Straightforward per-env loop over time, written independently of frugalrl.returns.gae."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            delta = rewards[t, n] + gamma * next_values[t, n] * (1 - terms[t, n]) - values[t, n]
            running = delta + gamma * lam * (1 - dones[t, n]) * running
            adv[t, n] = running
    return adv


def test_gae_matches_reference():
    rng = np.random.default_rng(0)
    T, N = 17, 5
    rewards, values, next_values = rng.normal(size=(3, T, N))
    terms = rng.random((T, N)) < 0.1
    truncs = (rng.random((T, N)) < 0.1) & ~terms
    dones = terms | truncs
    adv, ret = gae(*(torch.as_tensor(x) for x in (rewards, values, next_values, terms, dones)), 0.99, 0.95)
    expected = gae_reference(rewards, values, next_values, terms, dones, 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-6, atol=1e-8)


def test_truncation_bootstraps_but_termination_does_not():
    r = torch.zeros(1, 2)
    v = torch.zeros(1, 2)
    nv = torch.ones(1, 2) * 10.0
    terms = torch.tensor([[True, False]])
    dones = torch.tensor([[True, True]])  # env 0 terminated, env 1 truncated
    adv, _ = gae(r, v, nv, terms, dones, 0.9, 0.95)
    assert adv[0, 0] == 0.0
    assert adv[0, 1] == pytest.approx(9.0)


@pytest.mark.timeout(240)
def test_ppo_learns_cartpole_through_clusterenv(tmp_path):
    """Issue 2: evaluation mean ≥ 475 on CartPole-v1 within 100k steps, ClusterEnv with 2 workers."""
    cfg = PPOConfig(**CARTPOLE, total_timesteps=100_000, seed=1, backend="local", eval_every=20,
                    eval_episodes=10, target_return=475.0, run_dir=str(tmp_path))
    summary = train(cfg)
    assert summary["env_steps"] <= 100_000
    assert summary["eval_return_mean"] >= 475, summary["eval_history"]
    assert summary["weight_syncs"]["per_worker"] and min(summary["weight_syncs"]["per_worker"]) >= 1
    run_dir = tmp_path / summary["run_dir"].split("/")[-1]
    saved = json.loads((run_dir / "summary.json").read_text())
    for key in ("algo", "env_id", "seed", "env_steps", "wall_seconds", "eval_return_mean", "eval_return_std",
                "weight_syncs", "bytes"):
        assert key in saved
    assert saved["bytes"]["total"] == sum(
        v for k, v in saved["bytes"].items() if k not in ("total", "up", "down", "per_worker", "messages")
    )
    assert saved["bytes"]["weights"] > 0 and saved["bytes"]["observations"] > 0
    for png in ("return_vs_steps.png", "return_vs_time.png", "syncs_per_worker.png", "bytes_by_kind.png"):
        assert (run_dir / "plots" / png).stat().st_size > 1000
    assert (run_dir / "checkpoints" / "latest.pt").exists()
    assert list(run_dir.glob("events.out.tfevents.*"))


@pytest.mark.timeout(240)
def test_ppo_runs_on_plain_gymnasium_vector_env(tmp_path):
    """The same PPO learns from a plain gymnasium SyncVectorEnv (NEXT_STEP autoreset, head-side inference)."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(8)])
    cfg = PPOConfig(**CARTPOLE, total_timesteps=60_000, seed=2, vector_env="gym", eval_every=20,
                    target_return=475.0, run_dir=str(tmp_path), plots=False)
    summary = train(cfg, envs=envs)
    envs.close()
    assert summary["eval_return_mean"] >= 300, summary["eval_history"]


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_steps"):
        PPOConfig(num_steps=0).validate()
    with pytest.raises(ValueError, match="gamma"):
        PPOConfig(gamma=1.5).validate()
    with pytest.raises(ValueError, match="sync rule"):
        PPOConfig(sync="sometimes").validate()
    with pytest.raises(ValueError, match="backend"):
        PPOConfig(backend="cloud").validate()
