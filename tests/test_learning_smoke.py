"""The learning suite's CI-sized subset: frugal settings on (AAPS, bf16 weights), presets as a user gets them.

The full suite (benchmarks/learning_suite.py) compares with Stable-Baselines3 on eight envs and three seeds;
these runs check, in a couple of minutes, that the frugal defaults learn a discrete and a continuous task and
that AAPS cannot leave its workers on a stale policy.
"""

from __future__ import annotations

import os
import signal

import pytest

from frugalrl import presets
from frugalrl.algos import load_policy
from frugalrl.algos.ppo import PPOConfig, train
from frugalrl.driver import Callback
from frugalrl.envs.spec import to_env_spec
from frugalrl.evaluation import EVAL_SEED, evaluate

QUIET = {"progress": False, "tensorboard": False, "plots": False}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_continuous_control_learns_with_aaps_and_bf16(tmp_path):
    """Pendulum-v1 with its preset (normalised observations and rewards): random play scores about −1200. The run
    stops at the first evaluation that reaches the bar (else it runs the preset's whole budget)."""
    cfg = presets.make_config("ppo", "Pendulum-v1", sync="aaps", weights_codec="bf16", seed=1, eval_every=5,
                              target_return=-400.0, run_dir=str(tmp_path), **QUIET)
    s = train(cfg)
    assert s["details"]["norm_obs"] and s["details"]["norm_reward"]
    assert s["eval_return_mean"] >= -400, s["eval_history"]
    assert s["stochastic_return_mean"] is not None and s["eval_deterministic"]
    assert s["weight_syncs"]["total"] < 2 * s["updates"]  # AAPS skipped syncs
    assert not s["sync_stalls"]


@pytest.mark.timeout(300)
def test_discrete_task_learns_with_aaps_and_bf16(tmp_path):
    cfg = presets.make_config("ppo", "CartPole-v1", sync="aaps", weights_codec="bf16", seed=2, eval_every=10,
                              target_return=475.0, run_dir=str(tmp_path), **QUIET)
    s = train(cfg)
    assert s["eval_return_mean"] >= 475, s["eval_history"]
    # the best evaluation's policy (checkpoints/best.pt) scores the best entry again on the same episodes
    best_entry = max(s["eval_history"], key=lambda e: e["mean"])
    agent, counters = load_policy(s["run_dir"], "best")
    assert counters["env_steps"] == best_entry["step"]
    mean, _, _ = evaluate(agent, to_env_spec("CartPole-v1"), cfg.eval_episodes, seed=EVAL_SEED + cfg.seed)
    assert mean == best_entry["mean"]
    assert s["eval_regression"] is None  # it stopped at the target


@pytest.mark.timeout(300)
def test_aaps_guard_prevents_a_stale_policy_and_the_run_reports_one(tmp_path):
    """Acrobot-v1 (reward −1 per step until the goal): AAPS's KL, measured on the states a stale policy
    visits, stays under δ while the learner improves. Without the max-lag guard the workers keep their first
    policy (1 sync each) and the run says so; with it (the default) the training return improves."""
    base = dict(env="Acrobot-v1", sync="aaps", norm_obs=False, total_timesteps=81_920, seed=2, eval_episodes=1,
                run_dir=str(tmp_path), **QUIET)
    stale = train(PPOConfig(**base, max_policy_lag=None, run_name="stale"))
    assert stale["weight_syncs"]["per_worker"] == [1, 1]
    assert stale["sync_stalls"] and "not sending weights" in stale["sync_stalls"][0]["message"]
    guarded = train(PPOConfig(**base, run_name="guarded"))
    assert min(guarded["weight_syncs"]["per_worker"]) >= 2
    assert not guarded["sync_stalls"]
    assert guarded["train_return_mean_last100"] > stale["train_return_mean_last100"] + 50


@pytest.mark.timeout(120)
def test_a_short_run_whose_workers_keep_their_first_policy_says_so(tmp_path):
    """Six updates too small for AAPS's KL to reach δ, and no lag guard: the stall watch's window never fills, so
    the end of the run reports that the workers still act with their first policy (BipedalWalker's preset at 5
    updates did this, docs/benchmarks.md#learning-suite-frugalrl-ppo-against-sb3)."""
    base = dict(env="CartPole-v1", sync="aaps", max_policy_lag=None, learning_rate=1e-9, anneal_lr=False,
                total_timesteps=6 * 2 * 4 * 128, num_steps=128, envs_per_worker=4, eval_episodes=1,
                run_dir=str(tmp_path), **QUIET)
    s = train(PPOConfig(**base, run_name="stale"))
    assert s["updates"] == 6 and s["weight_syncs"]["per_worker"] == [1, 1]
    assert len(s["sync_stalls"]) == 1 and "ended this 6-update run" in s["sync_stalls"][0]["message"]
    every = train(PPOConfig(**{**base, "sync": "every"}, run_name="every"))
    assert not every["sync_stalls"]
    # The default guard (a quarter of a 6-update run: 1 update) syncs every update: nothing to say.
    guarded = train(PPOConfig(**{k: v for k, v in base.items() if k != "max_policy_lag"}, run_name="guarded"))
    assert guarded["details"]["sync_rule"] == "aaps(0.05, lag<=1)" and not guarded["sync_stalls"]
    # A run stopped by a signal has not ended: it will be resumed, so its lag is no verdict on the run.
    inherited = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        cut = train(PPOConfig(**base, run_name="cut"), callbacks=[_SignalAt(5)])
    finally:
        signal.signal(signal.SIGTERM, inherited)
    assert cut["stop_reason"] == "preempted" and cut["updates"] == 5 and not cut["sync_stalls"]


class _SignalAt(Callback):
    """Sends this process SIGTERM after update ``at``, as a scheduler would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_update(self, run, update, row):
        if run.updates == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
