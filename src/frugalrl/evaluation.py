"""Evaluate an agent on fresh environments in this process (no workers, no bytes)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from frugalrl import dists
from frugalrl.envs.spec import EnvSpec
from frugalrl.nets import ActorCritic


def evaluate(
    agent: ActorCritic,
    env_spec: EnvSpec,
    episodes: int = 10,
    seed: int = 10_000,
    deterministic: bool = True,
    max_steps: int = 100_000,
) -> tuple[float, float, list[float]]:
    """Mean and standard deviation of the undiscounted return over ``episodes`` full episodes.

    Episodes run on one environment seeded ``seed, seed + 1, ...``; ``deterministic`` picks the
    distribution's mode, else actions are sampled.
    """
    env = env_spec.make()
    action_space = env.action_space
    generator = torch.Generator().manual_seed(seed)
    returns: list[float] = []
    try:
        for ep in range(episodes):
            obs, _ = env.reset(seed=seed + ep)
            total, done, steps = 0.0, False, 0
            while not done and steps < max_steps:
                with torch.no_grad():
                    params = agent.dist_params(torch.as_tensor(np.asarray(obs))[None])
                    u = (dists.mode(agent.dist_kind, params) if deterministic
                         else dists.sample(agent.dist_kind, params, generator))
                    # a squashed policy (the split model's tanh-Gaussian) maps its sample to the env's action
                    squash = getattr(agent, "env_action", None)
                    action = (u if squash is None else squash(u))[0].numpy()
                env_action: np.ndarray | int
                if isinstance(action_space, gym.spaces.Box):
                    env_action = np.clip(action, action_space.low, action_space.high)
                else:
                    env_action = int(action)
                obs, r, term, trunc, _ = env.step(env_action)
                total += float(r)
                done = term or trunc
                steps += 1
            returns.append(total)
    finally:
        env.close()
    return float(np.mean(returns)), float(np.std(returns)), returns


def random_states(env: gym.Env, n: int, seed: int, close: bool = True) -> np.ndarray:
    """``n`` states a uniformly random policy visits in ``env`` (reset at episode ends), stacked.

    Calibration, distillation and KL checks need realistic states before any policy is trained.
    """
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    out: list[np.ndarray] = []
    while len(out) < n:
        out.append(np.asarray(obs))
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            obs, _ = env.reset()
    if close:
        env.close()
    return np.stack(out)
