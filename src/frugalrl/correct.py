"""Return and advantage estimators as plain functions (GAE here; V-trace and friends come with AcceRL).

All functions take ``(T, N)`` tensors: step ``t`` of env ``n``. ``next_values[t]`` is the value of
the state reached after step ``t`` (the final observation when the episode ended there), so that
truncated episodes are bootstrapped and terminated ones are not.
"""

from __future__ import annotations

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016).

    ``δ_t = r_t + γ V(s'_t) (1 − term_t) − V(s_t)`` and ``A_t = δ_t + γ λ (1 − done_t) A_{t+1}``, where
    ``done = terminated or truncated``. Returns ``(advantages, returns = advantages + values)``.
    """
    T = rewards.shape[0]
    not_term = 1.0 - terminations.to(rewards.dtype)
    not_done = 1.0 - dones.to(rewards.dtype)
    deltas = rewards + gamma * next_values * not_term - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(T)):
        last = deltas[t] + gamma * lam * not_done[t] * last
        advantages[t] = last
    return advantages, advantages + values


def bootstrap_values(
    value_fn, obs: torch.Tensor, next_obs: torch.Tensor, final_idx: torch.Tensor, final_obs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``values[t, n] = V(obs[t, n])`` and ``next_values[t, n] = V(s'_{t, n})`` for a rollout.

    ``s'`` is ``obs[t + 1]``, ``next_obs`` after the last step, or the final observation where an
    episode ended (``final_idx`` rows ``[t, n]``).
    """
    T, N = obs.shape[:2]
    values = value_fn(obs.reshape(T * N, *obs.shape[2:])).reshape(T, N)
    next_values = torch.empty_like(values)
    next_values[:-1] = values[1:]
    next_values[-1] = value_fn(next_obs)
    if final_idx.shape[0] > 0:
        next_values[final_idx[:, 0], final_idx[:, 1]] = value_fn(final_obs)
    return values, next_values
