"""Shared by the benchmarks that run Stable-Baselines3 as the reference: frugalrl's evaluation protocol for an SB3
model, and the MinAtar paper's network as an SB3 features extractor (what frugalrl's ``--net auto`` gives MinAtar)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from frugalrl.evaluation import EVAL_SEED

EVAL_EPISODES = 10
"""Episodes per evaluation: frugalrl's ``RunConfig.eval_episodes`` default."""


def grid_extractor() -> type:
    """SB3 features extractor of the MinAtar paper's network (as :func:`frugalrl.nets.grid_cnn`): a 3×3 convolution
    of 16 channels on the (H, W, C) grid, then 128 ReLU units; SB3 puts its linear actor and critic heads on it."""
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    from frugalrl.nets import GRID_CHANNELS, GRID_CONVS, GRID_HIDDEN, conv_layers

    class GridCNN(BaseFeaturesExtractor):
        def __init__(self, space: Any) -> None:
            super().__init__(space, GRID_HIDDEN)
            h, w, c = space.shape
            convs, n = conv_layers((c, h, w), GRID_CHANNELS, GRID_CONVS)
            self.net = nn.Sequential(*convs, nn.Linear(n, GRID_HIDDEN), nn.ReLU())

        def forward(self, obs: Any) -> Any:
            return self.net(obs.float().permute(0, 3, 1, 2))

    return GridCNN


def evaluate_sb3(model: Any, env_spec: Any, seed: int, deterministic: bool, vecnorm: Any,
                 max_steps: int | None = None, wrapper: Any = None) -> tuple[float, float]:
    """frugalrl's evaluation protocol for an SB3 model: ``EVAL_EPISODES`` episodes on a fresh env seeded
    ``EVAL_SEED + seed + i``, observations normalised with the (frozen) VecNormalize statistics if any, each
    episode cut after ``max_steps`` steps if given (frugalrl's ``eval_max_steps``), the env wrapped in
    ``wrapper`` if given."""
    env = env_spec.make() if wrapper is None else wrapper(env_spec.make())
    discrete = isinstance(env.action_space, gym.spaces.Discrete)  # a 0-d array is no key of toy-text envs' tables
    returns = []
    for ep in range(EVAL_EPISODES):
        obs, _ = env.reset(seed=EVAL_SEED + seed + ep)
        total, done, steps = 0.0, False, 0
        while not done and (max_steps is None or steps < max_steps):
            x = obs if vecnorm is None else vecnorm.normalize_obs(obs)
            action, _ = model.predict(x, deterministic=deterministic)
            if discrete:
                action = int(action)
            obs, r, term, trunc, _ = env.step(action)
            total += float(r)
            steps += 1
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns)), float(np.std(returns))
