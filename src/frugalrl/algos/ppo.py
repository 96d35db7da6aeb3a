"""PPO (CleanRL-faithful) that learns from ClusterEnv rollouts with worker-side inference.

Read top to bottom: :class:`PPOConfig` (the CLI flags and the Python API), :func:`ppo_update` (the
clipped-surrogate update of one batch) and :class:`PPO` (its parts and one update; the loop, evaluation,
checkpoints and summary are :func:`frugalrl.driver.drive`'s). What differs from CleanRL's ``ppo.py``, and why:

- Workers act with their cached copy of the policy, which the sync rule (every update, an interval, AAPS)
  refreshes, so the data can be off-policy. By default (``ratio="decoupled"``) the ratio is clipped against the
  learner's policy at the start of the update, π_old, and each sample is weighted by min(π_old/μ, ``is_clip``)
  (decoupled PPO, Hilton et al., 2021). Clipping against the behaviour policy μ itself would confine the
  learner to a trust region around a stale μ: under AAPS the KL would then never reach δ and learning stalls.
  With fresh data (μ = π_old) both are exactly CleanRL's PPO.
- Truncated episodes are bootstrapped from their final observation; terminated ones are not.
- It also runs on a plain ``gymnasium.vector`` env (``vector_env="gym"``), with head-side inference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import torch

from frugalrl import dists
from frugalrl.config import (
    ClusterConfig,
    NetConfig,
    NormConfig,
    OptimConfig,
    RunConfig,
    ValueNormConfig,
    check_fields,
)
from frugalrl.driver import Algorithm, Callback, Setup, Step, Update, cluster_traffic, drive
from frugalrl.envs.cluster import ClusterEnv
from frugalrl.envs.spec import to_env_spec
from frugalrl.evaluation import policy_evaluator
from frugalrl.losses import PPOLossConfig, SurrogateBatch, surrogate_epochs
from frugalrl.nets import ActorCritic, make_agent
from frugalrl.normalize import ReturnScaler, ValueNormalizer
from frugalrl.returns import bootstrap_values, gae
from frugalrl.rollout import Rollout, collect_rollout


@dataclass(kw_only=True)
class PPOConfig(NormConfig, ValueNormConfig, NetConfig, PPOLossConfig, OptimConfig, ClusterConfig, RunConfig):
    """Every knob of a PPO run. Field names are the CLI flags (``--envs-per-worker`` ...)."""

    vector_env: Literal["cluster", "gym"] = "cluster"
    """'cluster': a ClusterEnv whose workers act (see backend, sync); 'gym': a plain gymnasium SyncVectorEnv
    of workers × envs_per_worker envs in this process (head-side inference)."""
    ratio: Literal["decoupled", "behaviour"] = "decoupled"
    """'decoupled': clip π/π_old, weight by min(π_old/μ, is_clip); 'behaviour': clip π/μ."""
    is_clip: float = 1.0
    """Truncation of the importance weight π_old/μ (decoupled ratio)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""
        super().validate()
        check_fields(self, positive=("is_clip",))
        if self.batch_size < self.num_minibatches:
            raise ValueError("num_minibatches exceeds the batch size (workers * envs_per_worker * num_steps)")


def make_envs(cfg: PPOConfig, replayable: bool = False) -> ClusterEnv | gym.vector.VectorEnv:
    """The vector env a config asks for (``replayable``: a ClusterEnv that checkpoints can rebuild exactly)."""
    if cfg.vector_env == "gym":
        spec = to_env_spec(cfg.env, cfg.env_kwargs, cfg.env_wrappers)
        return gym.vector.SyncVectorEnv([spec.make for _ in range(cfg.num_envs)])
    return ClusterEnv.from_config(cfg, replayable)


def ppo_update(
    agent: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: Rollout,
    cfg: PPOConfig,
    generator: torch.Generator,
    reward_scaler: ReturnScaler | None = None,
    clip_coef: float | None = None,
    value_norm: ValueNormalizer | None = None,
) -> dict[str, float]:
    """One PPO update (``update_epochs`` × ``num_minibatches``) on a rollout; returns loss statistics.

    The agent's observation statistics (if it normalises) take in the batch first; ``reward_scaler`` (if
    given) scales the rewards before GAE; ``clip_coef`` is this update's clip range (default ``cfg``'s);
    ``value_norm`` (if given) maps the critic's standardised outputs to returns and back, its statistics
    taking in this batch's returns before the critic is fitted to them.
    """
    obs = torch.as_tensor(batch.obs)
    T, N = batch.num_steps, batch.num_envs
    valid = None if batch.valid is None else torch.as_tensor(batch.valid)
    obs_norm = getattr(agent, "obs_norm", None)
    if obs_norm is not None:
        obs_norm.update(obs[valid] if valid is not None else obs)
    rewards = batch.rewards
    if reward_scaler is not None:
        rewards = reward_scaler.scale(rewards, batch.terminations | batch.truncations, batch.valid)
    value_fn = agent.value if value_norm is None else (lambda o: value_norm.denormalize(agent.value(o)))
    with torch.no_grad():
        values, next_values = bootstrap_values(
            value_fn, obs, torch.as_tensor(batch.next_obs),
            torch.as_tensor(batch.final_idx, dtype=torch.long), torch.as_tensor(batch.final_obs),
        )
        dones = torch.as_tensor(batch.terminations | batch.truncations)
        advantages, returns = gae(
            torch.as_tensor(rewards), values, next_values, torch.as_tensor(batch.terminations), dones,
            cfg.gamma, cfg.gae_lambda,
        )
        behaviour_logp = batch.behaviour_log_prob()
        flat_obs = obs.reshape(T * N, *obs.shape[2:])
        flat_actions = torch.as_tensor(batch.actions).reshape(T * N, *batch.actions.shape[2:])
        if cfg.ratio == "decoupled":
            old_logp = dists.log_prob(agent.dist_kind, agent.dist_params(flat_obs), flat_actions)
            weights = (old_logp - behaviour_logp.reshape(-1)).exp().clamp(max=cfg.is_clip)
        else:
            old_logp = behaviour_logp.reshape(-1)
            weights = torch.ones_like(old_logp)
        if value_norm is not None:  # the critic's targets and old values in its standardised units
            value_norm.update(returns if valid is None else returns[valid])
            returns, values = value_norm.normalize(returns), value_norm.normalize(values)

    # Flatten (T, N) and drop invalid steps (reset steps of a NEXT_STEP plain vector env).
    keep = torch.ones(T * N, dtype=torch.bool) if valid is None else valid.reshape(-1)
    samples = SurrogateBatch(obs=flat_obs[keep], actions=flat_actions[keep], old_logp=old_logp[keep],
                             advantages=advantages.reshape(-1)[keep], returns=returns.reshape(-1)[keep],
                             values=values.reshape(-1)[keep], weights=weights[keep])
    return surrogate_epochs(agent, optimizer, samples, cfg, cfg.ent_coef, cfg.vf_coef, cfg.max_grad_norm, generator,
                            clip_coef)


class PPO(Algorithm):
    """PPO's parts and one update."""

    name = "ppo"

    def __init__(self, cfg: PPOConfig, envs: ClusterEnv | gym.vector.VectorEnv | None = None) -> None:
        super().__init__(cfg)
        self.cfg: PPOConfig = cfg
        self.envs = envs
        self.own_envs = envs is None
        self.gym_state: dict[str, Any] = {"seed": cfg.seed}  # a plain vector env's next observation, between rollouts
        self.rollout_seconds = self.update_seconds = 0.0  # this process's, since its start (a resume starts again)

    def tag(self) -> str:
        return self.cfg.sync if self.cfg.vector_env == "cluster" else "gym"

    def setup(self) -> Setup:
        cfg = self.cfg
        if self.envs is None:
            self.envs = make_envs(cfg, replayable=self.run.checkpointing)
        envs = self.envs
        self.cluster = envs if isinstance(envs, ClusterEnv) else None  # None: a plain Gymnasium vector env
        self.norm_obs, self.norm_reward = cfg.normalization(isinstance(envs.single_action_space, gym.spaces.Box))
        self.agent = make_agent(envs.single_observation_space, envs.single_action_space, **cfg.agent_options(),
                                obs_norm=self.norm_obs)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=cfg.learning_rate, eps=1e-5, foreach=True)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.scaler = ReturnScaler(cfg.gamma, envs.num_envs) if self.norm_reward else None
        self.value_norm = ValueNormalizer() if cfg.norm_value else None
        eval_spec = (self.cluster.env_spec if self.cluster is not None
                     else to_env_spec(cfg.env, cfg.env_kwargs, cfg.env_wrappers))
        return Setup(
            parts={"agent": self.agent, "optimizer": self.optimizer, "generator": self.generator,
                   "reward_scaler": self.scaler, "value_norm": self.value_norm, "envs": self.cluster},
            total_updates=max(1, cfg.total_timesteps // (envs.num_envs * cfg.num_steps)),
            steps_per_update=envs.num_envs * cfg.num_steps,
            evaluate=policy_evaluator(self.agent, eval_spec, cfg),
            evaluate_stochastic=policy_evaluator(self.agent, eval_spec, cfg, deterministic=False),
            cluster=self.cluster,
        )

    def start(self) -> None:
        if self.cluster is not None and not self.run.resumed:
            self.cluster.reset(seed=self.cfg.seed)
        elif self.cluster is None and self.run.resumed:  # a plain vector env starts new episodes, not the first ones
            self.gym_state["seed"] = self.cfg.seed + self.run.env_steps

    def update(self, step: Step) -> Update:
        cfg, agent = self.cfg, self.agent
        lr = self.optimizer.param_groups[0]["lr"] = cfg.lr_at(step.index, step.total)
        t0 = time.perf_counter()
        if self.cluster is not None:
            batch = self.cluster.rollout(agent, cfg.num_steps)
        else:
            assert self.envs is not None
            batch = collect_rollout(self.envs, agent, cfg.num_steps, self.gym_state)
        t1 = time.perf_counter()
        stats = ppo_update(agent, self.optimizer, batch, cfg, self.generator, self.scaler,
                           cfg.clip_at(step.index, step.total), self.value_norm)
        # where an iteration's time goes: the cost model (frugalrl.scale_model) scales the two parts apart
        self.rollout_seconds += t1 - t0
        self.update_seconds += time.perf_counter() - t1
        if batch.restarted_workers:
            stats["faults/restarted_workers"] = len(batch.restarted_workers)
        return Update(batch.num_steps * batch.num_envs, {**stats, "charts/lr": lr},
                      episode_returns=batch.episode_returns, episode_lengths=batch.episode_lengths,
                      policy_lag=batch.policy_lag())

    def details(self) -> dict[str, Any]:
        cfg, cluster = self.cfg, self.cluster
        details = {"norm_obs": self.norm_obs, "norm_reward": self.norm_reward, "norm_value": cfg.norm_value,
                   "vector_env": cfg.vector_env, "backend": cfg.backend if cluster is not None else None,
                   "sync_rule": cluster.sync_rule.describe() if cluster is not None else "none (head-side inference)",
                   "workers": cfg.workers, "envs_per_worker": cfg.envs_per_worker, "num_steps": cfg.num_steps,
                   "rollout_seconds": round(self.rollout_seconds, 3),
                   "learner_update_seconds": round(self.update_seconds, 3)}
        if cluster is not None:
            stats = cluster.stats()
            details["restart_events"], details["recycle_events"] = stats["restart_events"], stats["recycle_events"]
        return details

    def traffic(self) -> dict[str, Any]:
        return cluster_traffic(self.envs)

    def close(self) -> None:
        if self.own_envs and self.envs is not None:
            self.envs.close()


def train(cfg: PPOConfig, envs: ClusterEnv | gym.vector.VectorEnv | None = None, resume: str | Path | None = None,
          callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train PPO as ``cfg`` says; return the run summary (also written to ``run_dir/<name>/summary.json``).

    Pass ``envs`` to train on an env you built yourself (a ClusterEnv or any Gymnasium vector env); it is not
    closed here. ``resume`` continues the run directory given from its latest checkpoint (``cfg`` should be its
    config.json); ``callbacks`` see every update and evaluation (:class:`frugalrl.driver.Callback`).
    """
    return drive(PPO(cfg, envs), resume=resume, callbacks=callbacks)
