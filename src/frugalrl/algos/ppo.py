"""PPO (CleanRL-faithful) that learns from ClusterEnv rollouts with worker-side inference.

Read top to bottom: :class:`PPOConfig` (shared by the CLI and the Python API), :func:`make_envs`,
:func:`ppo_update` (the clipped-surrogate update of one batch), :func:`train` (the loop).

What differs from CleanRL's ``ppo.py``, and why:

- Experience comes from ``ClusterEnv.rollout(agent, num_steps)``: workers act with their cached
  copy of the policy, which the sync rule (EveryUpdate, Interval, AAPS) refreshes, so the data can
  be off-policy. The behaviour log-probabilities the workers actually sampled with (recomputed
  exactly from the behaviour-distribution parameters that travel with each step) enter the loss.
  By default (``ratio="decoupled"``) the clipped ratio is taken against the learner's policy at the
  start of the update, π_old, and each sample is weighted by the truncated importance weight
  min(π_old/μ, ``is_clip``) (the decoupled PPO objective of Hilton et al., 2021). Clipping the ratio
  against the behaviour policy μ itself (``ratio="behaviour"``) confines the learner to a trust
  region around a stale μ: with AAPS, the learner then cannot drift further than about the clip
  range allows, the KL never reaches δ, no sync happens, and learning stalls. With fresh data
  (μ = π_old) both are exactly CleanRL's PPO.
- Truncation is kept apart from termination: truncated episodes are bootstrapped from their
  final observation.
- It also runs on a plain ``gymnasium.vector`` env (``backend="gym"``), with head-side inference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from frugalrl import dists
from frugalrl.algos.common import check_fields, cluster_summary, make_cluster_env, progress_bar, slug
from frugalrl.correct import bootstrap_values, gae
from frugalrl.envs.cluster import ClusterEnv
from frugalrl.envs.spec import to_env_spec
from frugalrl.evaluation import evaluate
from frugalrl.nets import make_agent
from frugalrl.rollout import Rollout, collect_rollout
from frugalrl.sync import make_sync_rule


@dataclass
class PPOConfig:
    """Every knob of a PPO run. Field names are the CLI flags (``--envs-per-worker`` ...)."""

    env: str = "CartPole-v1"
    """Gymnasium id or 'module:function' env factory."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env (JSON on the CLI)."""
    seed: int = 1
    total_timesteps: int = 500_000
    backend: str = "local"
    """'local' (processes), 'serial' (in-process ClusterEnv), 'ray' (Ray actors) or 'gym' (plain gymnasium
    SyncVectorEnv)."""
    ray_address: str | None = None
    """backend 'ray': the Ray cluster to join ('auto' or 'host:port'); None starts a local Ray."""
    workers: int = 2
    envs_per_worker: int = 4
    num_steps: int = 128
    """Steps per env per rollout fragment."""
    sync: str = "every"
    """Weight-sync rule: 'every', 'interval' or 'aaps'."""
    kl_threshold: float = 0.05
    """δ of AAPS: sync a worker when mean KL(behaviour ‖ learner) on its recent states exceeds it."""
    sync_interval: int = 1
    """n of Interval(n)."""
    weights_codec: str = "fp32"
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    ratio: str = "decoupled"
    """'decoupled': clip π/π_old, weight by min(π_old/μ, is_clip); 'behaviour': clip π/μ."""
    is_clip: float = 1.0
    """Truncation of the importance weight π_old/μ (decoupled ratio)."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    eval_episodes: int = 10
    eval_every: int = 0
    """Evaluate every this many updates (0: only at the end)."""
    target_return: float | None = None
    """Stop early once an evaluation reaches this mean return."""
    torch_threads: int = 1
    run_dir: str = "runs"
    run_name: str | None = None
    checkpoint_every: int = 0
    """Save a checkpoint every this many updates (0: only at the end)."""
    progress: bool = True
    tensorboard: bool = True
    plots: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""
        check_fields(
            self,
            positive_ints=("total_timesteps", "workers", "envs_per_worker", "num_steps", "num_minibatches",
                           "update_epochs", "torch_threads", "sync_interval"),
            positive=("learning_rate", "kl_threshold"),
            nonneg=("clip_coef", "ent_coef", "vf_coef", "max_grad_norm", "eval_episodes", "eval_every",
                    "checkpoint_every"),
            unit=("gamma", "gae_lambda"),
        )
        if self.ratio not in ("decoupled", "behaviour"):
            raise ValueError(f"ratio must be 'decoupled' or 'behaviour', got {self.ratio!r}")
        if not self.is_clip > 0:
            raise ValueError(f"is_clip must be > 0, got {self.is_clip!r}")
        if self.backend not in ("local", "serial", "ray", "gym"):
            raise ValueError(f"backend must be 'local', 'serial', 'ray' or 'gym', got {self.backend!r}")
        make_sync_rule(self.sync, self.kl_threshold, self.sync_interval)
        if (self.workers * self.envs_per_worker * self.num_steps) < self.num_minibatches:
            raise ValueError("num_minibatches exceeds the batch size (workers * envs_per_worker * num_steps)")

    @property
    def batch_size(self) -> int:
        """Transitions per update."""
        return self.workers * self.envs_per_worker * self.num_steps

    @property
    def num_updates(self) -> int:
        """Updates in the run (at least one)."""
        return max(1, self.total_timesteps // self.batch_size)


def make_envs(cfg: PPOConfig) -> ClusterEnv | gym.vector.VectorEnv:
    """The vector env a config asks for."""
    if cfg.backend == "gym":
        spec = to_env_spec(cfg.env, cfg.env_kwargs)
        return gym.vector.SyncVectorEnv([spec.make for _ in range(cfg.workers * cfg.envs_per_worker)])
    return make_cluster_env(cfg)


def ppo_update(
    agent: nn.Module, optimizer: torch.optim.Optimizer, batch: Rollout, cfg: PPOConfig, generator: torch.Generator
) -> dict[str, float]:
    """One PPO update (``update_epochs`` × ``num_minibatches``) on a rollout; returns loss statistics."""
    obs = torch.as_tensor(batch.obs)
    T, N = batch.num_steps, batch.num_envs
    with torch.no_grad():
        values, next_values = bootstrap_values(
            agent.value, obs, torch.as_tensor(batch.next_obs),
            torch.as_tensor(batch.final_idx, dtype=torch.long), torch.as_tensor(batch.final_obs),
        )
        dones = torch.as_tensor(batch.terminations | batch.truncations)
        advantages, returns = gae(
            torch.as_tensor(batch.rewards), values, next_values, torch.as_tensor(batch.terminations), dones,
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

    # Flatten (T, N) and drop invalid steps (reset steps of a NEXT_STEP plain vector env).
    keep = torch.ones(T * N, dtype=torch.bool) if batch.valid is None else torch.as_tensor(batch.valid).reshape(-1)
    b_obs = flat_obs[keep]
    b_actions = flat_actions[keep]
    b_logp = old_logp[keep]
    b_weights = weights[keep]
    b_adv = advantages.reshape(-1)[keep]
    b_returns = returns.reshape(-1)[keep]
    b_values = values.reshape(-1)[keep]
    size = b_obs.shape[0]
    minibatch = max(1, size // cfg.num_minibatches)

    clipfracs: list[float] = []
    stats: dict[str, float] = {}
    for _epoch in range(cfg.update_epochs):
        order = torch.randperm(size, generator=generator)
        for start in range(0, size - minibatch + 1, minibatch):
            mb = order[start : start + minibatch]
            params = agent.dist_params(b_obs[mb])
            new_logp = dists.log_prob(agent.dist_kind, params, b_actions[mb])
            entropy = dists.entropy(agent.dist_kind, params)
            new_value = agent.value(b_obs[mb])
            logratio = new_logp - b_logp[mb]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs.append(((ratio - 1.0).abs() > cfg.clip_coef).float().mean().item())
            adv = b_adv[mb]
            if cfg.norm_adv and adv.numel() > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef))
            pg_loss = (b_weights[mb] * surrogate).mean()
            if cfg.clip_vloss:
                v_unclipped = (new_value - b_returns[mb]) ** 2
                v_clipped = b_values[mb] + (new_value - b_values[mb]).clamp(-cfg.clip_coef, cfg.clip_coef)
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb]) ** 2).mean()
            else:
                v_loss = 0.5 * ((new_value - b_returns[mb]) ** 2).mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - cfg.ent_coef * entropy_loss + v_loss * cfg.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
            optimizer.step()
        if cfg.target_kl is not None and approx_kl > cfg.target_kl:
            break

    y_pred, y_true = b_values.numpy(), b_returns.numpy()
    var_y = np.var(y_true)
    stats.update(
        {
            "losses/policy": pg_loss.item(),
            "losses/value": v_loss.item(),
            "losses/entropy": entropy_loss.item(),
            "losses/approx_kl": approx_kl.item(),
            "losses/clipfrac": float(np.mean(clipfracs)) if clipfracs else 0.0,
            "losses/explained_variance": float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y),
            "losses/is_weight_mean": b_weights.mean().item(),
        }
    )
    return stats


def train(cfg: PPOConfig, envs: ClusterEnv | gym.vector.VectorEnv | None = None) -> dict[str, Any]:
    """Train PPO as ``cfg`` says; return the run summary (also written to ``run_dir/<name>/summary.json``).

    Pass ``envs`` to train on an env you built yourself (a ClusterEnv or any Gymnasium vector env);
    it is not closed here. Otherwise the env is built from ``cfg`` and closed at the end.
    """
    from frugalrl.runs import Run

    cfg.validate()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.set_num_threads(cfg.torch_threads)
    own_envs = envs is None
    envs = make_envs(cfg) if envs is None else envs
    cluster = isinstance(envs, ClusterEnv)
    name = cfg.run_name or f"ppo-{slug(cfg.env)}-{cfg.sync}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = Run(cfg.run_dir, name, cfg, tensorboard=cfg.tensorboard)
    try:
        return _train_loop(cfg, envs, cluster, run)
    finally:
        if own_envs:
            envs.close()


def _train_loop(cfg: PPOConfig, envs, cluster: bool, run) -> dict[str, Any]:
    agent = make_agent(envs.single_observation_space, envs.single_action_space, tuple(cfg.hidden))
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)
    generator = torch.Generator().manual_seed(cfg.seed)
    eval_spec = envs.env_spec if cluster else to_env_spec(cfg.env, cfg.env_kwargs)
    num_envs = envs.num_envs
    num_updates = max(1, cfg.total_timesteps // (num_envs * cfg.num_steps))
    gym_state: dict[str, Any] = {"seed": cfg.seed}
    if cluster:
        envs.reset(seed=cfg.seed)

    recent_returns: list[float] = []
    episodes = 0
    env_steps = 0
    lag_sum, lag_n = 0.0, 0
    evals: list[tuple[int, float, float]] = []
    start = time.monotonic()
    bar = progress_bar(cfg.progress, num_updates * num_envs * cfg.num_steps, f"ppo {cfg.env}")
    eval_mean = eval_std = float("nan")
    stopped_early = False
    for update in range(1, num_updates + 1):
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (update - 1.0) / num_updates) * cfg.learning_rate

        batch = envs.rollout(agent, cfg.num_steps) if cluster else collect_rollout(envs, agent, cfg.num_steps, gym_state)
        if batch.restarted_workers:
            run.log(env_steps, {"faults/restarted_workers": len(batch.restarted_workers)})
        env_steps += batch.num_steps * batch.num_envs
        episodes += len(batch.episode_returns)
        recent_returns = (recent_returns + list(batch.episode_returns))[-100:]
        lag = batch.policy_lag()
        lag_sum += float(lag.sum())
        lag_n += lag.size

        stats = ppo_update(agent, optimizer, batch, cfg, generator)

        sps = env_steps / max(1e-9, time.monotonic() - start)
        row: dict[str, Any] = {**stats, "charts/sps": sps, "charts/lr": optimizer.param_groups[0]["lr"],
                               "charts/policy_lag": float(lag.mean())}
        if batch.episode_returns:
            row["train/episode_return"] = float(np.mean(batch.episode_returns))
            row["train/episode_length"] = float(np.mean(batch.episode_lengths))
        if cluster:
            st = envs.stats()
            row["syncs/total"] = st["weight_syncs"]["total"]
            row["bytes/total"] = st["bytes"]["total"]
            row["bytes/weights"] = st["bytes"]["weights"]
            kls = [k for k in st["last_kl"] if k is not None]
            if kls:
                row["syncs/kl_mean"] = float(np.mean(kls))
        if cfg.eval_every and update % cfg.eval_every == 0 and update != num_updates:
            eval_mean, eval_std, _ = evaluate(agent, eval_spec, cfg.eval_episodes, seed=10_000 + cfg.seed)
            evals.append((env_steps, eval_mean, eval_std))
            row["eval/return_mean"], row["eval/return_std"] = eval_mean, eval_std
        run.log(env_steps, row)
        if cfg.checkpoint_every and update % cfg.checkpoint_every == 0:
            run.save_checkpoint(agent, env_steps)
        if bar is not None:
            post = {"ret": f"{np.mean(recent_returns):.1f}" if recent_returns else "-", "sps": f"{sps:.0f}"}
            if cluster:
                post["syncs"] = row["syncs/total"]
            if evals:
                post["eval"] = f"{evals[-1][1]:.1f}"
            bar.set_postfix(post, refresh=False)
            bar.update(batch.num_steps * batch.num_envs)
        if cfg.target_return is not None and evals and evals[-1][1] >= cfg.target_return:
            stopped_early = True
            break

    if bar is not None:
        bar.close()
    if cfg.eval_episodes > 0 and not (stopped_early and evals):
        eval_mean, eval_std, _ = evaluate(agent, eval_spec, cfg.eval_episodes, seed=10_000 + cfg.seed)
        evals.append((env_steps, eval_mean, eval_std))
        run.log(env_steps, {"eval/return_mean": eval_mean, "eval/return_std": eval_std})
    elif evals:
        eval_mean, eval_std = evals[-1][1], evals[-1][2]
    wall = time.monotonic() - start
    run.save_checkpoint(agent, env_steps)
    summary: dict[str, Any] = {
        "algo": "ppo",
        "env_id": cfg.env,
        "seed": cfg.seed,
        "env_steps": env_steps,
        "updates": update,
        "wall_seconds": round(wall, 3),
        "steps_per_second": round(env_steps / max(wall, 1e-9), 1),
        "eval_return_mean": eval_mean,
        "eval_return_std": eval_std,
        "eval_history": [{"step": s, "mean": m, "std": sd} for s, m, sd in evals],
        "train_return_mean_last100": float(np.mean(recent_returns)) if recent_returns else None,
        "episodes": episodes,
        "stopped_early": stopped_early,
        "policy_lag_mean": lag_sum / max(1, lag_n),
        "backend": cfg.backend,
        "run_dir": str(run.dir),
    }
    if cluster:
        summary.update(cluster_summary(envs))
    else:
        summary.update(
            sync_rule="none (head-side inference)",
            weight_syncs={"total": 0, "per_worker": []},
            bytes={"total": 0},
            restarts=0,
        )
    return run.finish(summary, plots=cfg.plots)
