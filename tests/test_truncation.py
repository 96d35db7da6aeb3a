"""Truncation is not termination, for every algorithm: on an endless task whose episodes only a time limit ends,
each learner's critic learns the task's true value 1 / (1 - γ), which it can only reach by bootstrapping the
truncated steps from their final observation. Treating the limit as a termination would pull it to the mean
discounted sum to the limit (γ = 0.5, limit 3: 1.42 instead of 2)."""

from __future__ import annotations

import pytest
import torch

from frugalrl.algos import algorithm, load_policy

GAMMA = 0.5
TRUE_VALUE = 1 / (1 - GAMMA)  # 2.0
TRUNCATED_AS_DONE = sum(sum(GAMMA**i for i in range(k)) for k in (1, 2, 3)) / 3  # 1.42: the bug's fixed point
COMMON = {"env": "time_limit_env:make_endless", "gamma": GAMMA, "norm_obs": False, "norm_reward": False,
          "progress": False, "tensorboard": False, "plots": False, "eval_episodes": 1, "eval_stochastic": False,
          "learning_rate": 3e-3, "seed": 3}
SETTINGS = {
    "ppo": {"backend": "serial", "workers": 1, "envs_per_worker": 2, "num_steps": 16, "total_timesteps": 2048,
            "num_minibatches": 2, "update_epochs": 4, "gae_lambda": 0.95},
    "ppo-gym": {"vector_env": "gym", "workers": 1, "envs_per_worker": 2, "num_steps": 16, "total_timesteps": 2048,
                "num_minibatches": 2, "update_epochs": 4, "gae_lambda": 0.95},
    "impala": {"backend": "serial", "workers": 1, "envs_per_worker": 2, "num_steps": 16, "total_timesteps": 2048,
               "num_minibatches": 2, "update_epochs": 4, "overlap": False},
    "hsa2c": {"workers": 1, "local_steps": 2, "envs_per_process": 2, "num_steps": 5, "global_updates": 300,
              "learning_rate": None},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_critic_bootstraps_truncated_episodes(tmp_path, name):
    mod, cls = algorithm(name.split("-")[0]).load()
    settings = {**COMMON, **SETTINGS[name]}
    settings = {k: v for k, v in settings.items() if v is not None}
    cfg = cls(**settings, run_dir=str(tmp_path), run_name="run")
    summary = mod.train(cfg)
    agent, _ = load_policy(summary["run_dir"])
    with torch.no_grad():
        value = float(agent.value(torch.ones(1, 1)).reshape(()))
    assert abs(value - TRUE_VALUE) < abs(value - TRUNCATED_AS_DONE) and value > 1.8, value
