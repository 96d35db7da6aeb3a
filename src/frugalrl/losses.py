"""The clipped-surrogate update, shared by PPO through ClusterEnv, IMPALA/AcceRL and the pipeline's stage 1.

:class:`SurrogateConfig` is the config part with the update's settings (epochs, minibatches, clip range,
advantage normalisation); :class:`PPOLossConfig` adds GAE's λ for the algorithms that estimate advantages
with GAE. :func:`ppo_loss` is CleanRL's clipped-surrogate objective of one minibatch with optional value
clipping and per-sample importance weights (the decoupled objective of Hilton et al., 2021, used when the
data comes from stale or compressed actors); :func:`surrogate_epochs` runs it over a batch, epochs ×
minibatches. The advantage estimator is the caller's: GAE for PPO, V-trace for IMPALA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from frugalrl import dists
from frugalrl.config import ConfigPart, check_fields


@dataclass(kw_only=True)
class SurrogateConfig(ConfigPart):
    """The clipped-surrogate update: minibatches, epochs, the clip range and advantage normalisation."""

    num_minibatches: int = 4
    """Minibatches per epoch."""
    update_epochs: int = 4
    """Passes over each batch."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    clip_coef: float = 0.2
    """Clip range of the probability ratio (and of the value change with clip_vloss)."""
    anneal_clip: bool = False
    """Anneal the clip range linearly to 0 over the run (rl-zoo's ``lin_`` clip ranges)."""
    clip_vloss: bool = False
    """Clip the value loss around the old values (CleanRL clips; SB3 does not, and on unnormalised returns
    clipping stalls the critic: a continuous-control run of the learning suite ended near −1100 with it,
    −180 without)."""
    target_kl: float | None = None
    """Stop an update's epochs early once the approximate KL exceeds this."""

    def validate(self) -> None:
        """Check the update fields."""
        super().validate()
        check_fields(self, positive_ints=("num_minibatches", "update_epochs"), nonneg=("clip_coef",),
                     positive=("target_kl",))

    def clip_at(self, update: int, num_updates: int) -> float:
        """The clip range of update ``update`` (1-based) of ``num_updates``."""
        if not self.anneal_clip:
            return self.clip_coef
        return (1.0 - (update - 1.0) / num_updates) * self.clip_coef


@dataclass(kw_only=True)
class PPOLossConfig(SurrogateConfig):
    """PPO's update: the clipped surrogate on advantages from generalised advantage estimation."""

    gae_lambda: float = 0.95
    """λ of generalised advantage estimation."""

    def validate(self) -> None:
        """Check λ."""
        super().validate()
        check_fields(self, unit=("gae_lambda",))


@dataclass
class PPOLoss:
    """One minibatch's loss and the statistics a run logs of it."""

    loss: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: float


def ppo_loss(
    cfg: SurrogateConfig,
    ent_coef: float,
    vf_coef: float,
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    new_value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    weights: torch.Tensor | None = None,
    clip_coef: float | None = None,
) -> PPOLoss:
    """The clipped-surrogate PPO loss of one minibatch.

    ``weights`` (optional) multiply each sample's surrogate: the truncated importance weights
    min(π_old/μ, c) of decoupled PPO; None is plain PPO. ``clip_coef``: this update's clip range (an
    annealed one, :meth:`SurrogateConfig.clip_at`); None: ``cfg.clip_coef``.
    """
    clip = cfg.clip_coef if clip_coef is None else clip_coef
    logratio = new_logp - old_logp
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip).float().mean().item()
    adv = advantages
    if cfg.norm_adv and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    pg_loss = surrogate.mean() if weights is None else (weights * surrogate).mean()
    if cfg.clip_vloss:
        v_clipped = old_value + (new_value - old_value).clamp(-clip, clip)
        v_loss = 0.5 * torch.max((new_value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()
    ent = entropy.mean()
    loss = pg_loss - ent_coef * ent + vf_coef * v_loss
    return PPOLoss(loss, pg_loss, v_loss, ent, approx_kl, clipfrac)


@dataclass
class SurrogateBatch:
    """A batch flattened to samples, ready for :func:`surrogate_epochs` (every tensor's first dimension)."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_logp: torch.Tensor
    """log π_old(a|s): the learner's policy when the update began (or the behaviour policy's, for PPO's
    ``ratio="behaviour"``)."""
    advantages: torch.Tensor
    returns: torch.Tensor
    """The value targets (GAE's returns, V-trace's v_s)."""
    values: torch.Tensor
    """The critic's values when the update began (for value clipping and explained variance)."""
    weights: torch.Tensor
    """Per-sample weight of the surrogate (truncated importance weights; ones for plain PPO)."""


def surrogate_epochs(
    agent: Any,
    optimizer: torch.optim.Optimizer,
    batch: SurrogateBatch,
    cfg: SurrogateConfig,
    ent_coef: float,
    vf_coef: float,
    max_grad_norm: float,
    generator: torch.Generator,
    clip_coef: float | None = None,
) -> dict[str, float]:
    """``cfg.update_epochs`` passes of ``cfg.num_minibatches`` shuffled minibatches of :func:`ppo_loss`, each
    a gradient step (norm clipped at ``max_grad_norm``); early stop at ``cfg.target_kl``. Returns the
    statistics a run logs (``losses/*``)."""
    size = batch.obs.shape[0]
    minibatch = max(1, size // cfg.num_minibatches)
    clipfracs: list[float] = []
    for _epoch in range(cfg.update_epochs):
        order = torch.randperm(size, generator=generator)
        for start in range(0, size - minibatch + 1, minibatch):
            mb = order[start : start + minibatch]
            params = agent.dist_params(batch.obs[mb])
            bonus = dists.entropy_bonus(agent.dist_kind, params, getattr(agent, "max_entropy_log_std", None))
            out = ppo_loss(
                cfg, ent_coef, vf_coef,
                new_logp=dists.log_prob(agent.dist_kind, params, batch.actions[mb]), old_logp=batch.old_logp[mb],
                advantages=batch.advantages[mb], entropy=bonus,
                new_value=agent.value(batch.obs[mb]), old_value=batch.values[mb], returns=batch.returns[mb],
                weights=batch.weights[mb], clip_coef=clip_coef,
            )
            clipfracs.append(out.clipfrac)
            optimizer.zero_grad()
            out.loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm, foreach=True)
            optimizer.step()
        if cfg.target_kl is not None and out.approx_kl > cfg.target_kl:
            break
    with torch.no_grad():  # the policy's entropy, not the capped bonus the loss rewarded
        entropy = dists.entropy(agent.dist_kind, params).mean().item()
    return {
        "losses/policy": out.policy.item(),
        "losses/value": out.value.item(),
        "losses/entropy": entropy,
        "losses/approx_kl": out.approx_kl.item(),
        "losses/clipfrac": float(sum(clipfracs) / len(clipfracs)),
        "losses/explained_variance": explained_variance(batch.values, batch.returns),
        "losses/is_weight_mean": batch.weights.mean().item(),
    }


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 − Var(returns − values) / Var(returns) (NaN when the returns do not vary)."""
    y_pred, y_true = values.numpy(), returns.numpy()
    var_y = float(np.var(y_true))
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)
