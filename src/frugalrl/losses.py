"""The PPO loss of one minibatch, shared by PPO through ClusterEnv and the split-model pipeline's stage 1.

:class:`PPOLossConfig` is the config part with PPO's update settings; :func:`ppo_loss` is CleanRL's
clipped-surrogate objective with optional value clipping and per-sample importance weights (the
decoupled objective of Hilton et al., 2021, used when the data comes from stale workers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from frugalrl.config import ConfigPart, check_fields


@dataclass(kw_only=True)
class PPOLossConfig(ConfigPart):
    """PPO's update: advantages, minibatches, epochs and the clipped objective."""

    gae_lambda: float = 0.95
    """λ of generalised advantage estimation."""
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
        """Check the PPO update fields."""
        super().validate()
        check_fields(self, positive_ints=("num_minibatches", "update_epochs"), nonneg=("clip_coef",),
                     unit=("gae_lambda",), positive=("target_kl",))

    def clip_at(self, update: int, num_updates: int) -> float:
        """The clip range of update ``update`` (1-based) of ``num_updates``."""
        if not self.anneal_clip:
            return self.clip_coef
        return (1.0 - (update - 1.0) / num_updates) * self.clip_coef


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
    cfg: PPOLossConfig,
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
    annealed one, :meth:`PPOLossConfig.clip_at`); None: ``cfg.clip_coef``.
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


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 − Var(returns − values) / Var(returns) (NaN when the returns do not vary)."""
    y_pred, y_true = values.numpy(), returns.numpy()
    var_y = float(np.var(y_true))
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)
