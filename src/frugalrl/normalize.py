"""Running normalisation: observations inside the agent, rewards on the learner.

- :class:`ObsNormalizer` is part of the agent (:class:`~frugalrl.nets.MLPActorCritic` with ``obs_norm``):
  its statistics are buffers, updated on the learner from every batch, travelling with the weights
  (losslessly: :attr:`~frugalrl.nets.ActorCritic.exact_tensors`), so that a worker normalises with the copy
  it holds and AAPS's KL compares policies that normalise alike; checkpoints and ``frugalrl eval`` have them.
- :class:`ReturnScaler` divides rewards by the running standard deviation of the discounted return (SB3's
  ``VecNormalize(norm_reward=True)``, CleanRL's ``NormalizeReward``). It changes only the learner's loss,
  never an action, so it stays on the learner (its state is in the checkpoints), and costs no bytes.
- :class:`ValueNormalizer` standardises the critic's targets instead (Sample Factory's ``normalize_returns``,
  MAPPO's value normalisation): the critic learns returns of unit scale while the advantages keep the rewards'
  own proportions. Learner side too, and in the checkpoints.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Mean and variance of everything :meth:`update` has seen, per element of ``shape`` (buffers, float64).

    Batches are merged with Chan et al.'s parallel formula, as SB3's ``RunningMeanStd`` does; ``count``
    starts at a small ``eps`` so that the first batch is not divided by zero.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...] = (), eps: float = 1e-4) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(eps, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge a batch (first dimension: samples) into the statistics, in place."""
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        n = x.shape[0]
        if n == 0:
            return
        mean, var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta.square() * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)


class ObsNormalizer(RunningMeanStd):
    """Observation normalisation inside the agent: ``clip((obs − mean) / sqrt(var + 1e-8), ±clip)``.

    Its statistics are buffers of the agent: updated on the learner from every batch, they travel with the
    weights (losslessly, see :attr:`ActorCritic.exact_tensors`), so a worker normalises with the copy it
    holds and AAPS's KL compares policies that normalise the same way; they are saved in checkpoints and
    used by ``frugalrl eval``.
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0) -> None:
        super().__init__(shape)
        self.clip = float(clip)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Normalised observations (float32)."""
        x = (obs.to(torch.float64) - self.mean) / torch.sqrt(self.var + 1e-8)
        return x.clamp(-self.clip, self.clip).float()


class ReturnScaler:
    """Scales rewards by ``1 / sqrt(var(G) + eps)``, ``G`` the running discounted return of each env (reset at
    the end of an episode), clipped to ``±clip``; the statistics follow every batch it scales."""

    def __init__(self, gamma: float, num_envs: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.gamma = float(gamma)
        self.clip = float(clip)
        self.eps = float(eps)
        self.rms = RunningMeanStd(())
        self.returns = np.zeros(num_envs, dtype=np.float64)

    def scale(self, rewards: np.ndarray, dones: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
        """The scaled rewards of a ``(T, N)`` batch (``dones``: episode ended at that step; ``valid``: steps that
        are transitions at all), after merging the batch's discounted returns into the statistics."""
        T = rewards.shape[0]
        seen = np.empty_like(rewards, dtype=np.float64)
        for t in range(T):
            self.returns = self.returns * self.gamma + rewards[t]
            seen[t] = self.returns
            self.returns[dones[t]] = 0.0
        self.rms.update(torch.from_numpy(seen if valid is None else seen[valid]))
        std = float(np.sqrt(self.rms.var.item() + self.eps))
        return np.clip(rewards / std, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        """The statistics and each env's running return (for checkpoints)."""
        return {"rms": self.rms.state_dict(), "returns": torch.from_numpy(self.returns.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (saved for another number of envs: each env's return starts at zero)."""
        self.rms.load_state_dict(state["rms"])
        returns = state["returns"].numpy()
        self.returns = returns.copy() if returns.shape == self.returns.shape else np.zeros_like(self.returns)

    def episodes_restarted(self, envs: list[int] | None = None) -> None:
        """Envs ``envs`` (None: all) start new episodes (a resume that could not restore them): their returns start
        at zero."""
        self.returns[slice(None) if envs is None else envs] = 0.0


class ValueNormalizer:
    """The critic's targets standardised by the running mean and variance of the returns it is fitted to.

    The critic outputs standardised values: :meth:`denormalize` turns them into returns for GAE, and
    :meth:`normalize` turns GAE's returns into the critic's targets, after :meth:`update` has taken them in.
    Unlike :class:`ReturnScaler`, the rewards the advantages are made of stay as the env gives them.
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = float(eps)
        self.rms = RunningMeanStd(())

    def update(self, returns: torch.Tensor) -> None:
        """Merge a batch of returns into the statistics."""
        self.rms.update(returns.reshape(-1))

    def _mean_std(self) -> tuple[float, float]:
        return self.rms.mean.item(), float(np.sqrt(self.rms.var.item() + self.eps))

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        """Returns from the critic's standardised outputs."""
        mean, std = self._mean_std()
        return values * std + mean

    def normalize(self, returns: torch.Tensor) -> torch.Tensor:
        """The critic's targets (standardised returns)."""
        mean, std = self._mean_std()
        return (returns - mean) / std

    def state_dict(self) -> dict[str, Any]:
        """The statistics (for checkpoints)."""
        return {"rms": self.rms.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.rms.load_state_dict(state["rms"])
