"""Rollout batches: what a fragment of experience looks like, from ClusterEnv or a plain vector env.

A :class:`Rollout` holds ``T`` steps of ``N`` envs with *same-step* autoreset: ``obs[t+1]`` is
always the state after ``obs[t]`` within an episode or the first state of a new one, and the
final observation of every finished episode is kept apart (``final_idx``, ``final_obs``) for
bootstrapping truncated episodes. Terminations and truncations stay separate. Every step carries
the behaviour distribution's parameters, or only the log-probability of its action under them (what
ClusterEnv's workers send by default), and the policy version that chose its action.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from frugalrl import dists
from frugalrl.dists import DistKind
from frugalrl.nets import ActorCritic


@dataclass
class Rollout:
    """``T`` steps × ``N`` envs of experience (NumPy arrays)."""

    obs: np.ndarray  # (T, N, *obs_shape)
    actions: np.ndarray  # (T, N, *act_shape)
    rewards: np.ndarray  # (T, N) float32
    terminations: np.ndarray  # (T, N) bool
    truncations: np.ndarray  # (T, N) bool
    dist_params: np.ndarray | None  # (T, N, P) behaviour distribution parameters (None: behaviour_logp only)
    versions: np.ndarray  # (T, N) policy version that chose each action (-1: none)
    next_obs: np.ndarray  # (N, *obs_shape) state after the last step
    final_idx: np.ndarray  # (K, 2) [t, env] of every finished episode
    final_obs: np.ndarray  # (K, *obs_shape) its last observation
    dist_kind: DistKind
    valid: np.ndarray | None = None  # (T, N) False for steps to ignore (NEXT_STEP reset steps)
    behaviour_logp: np.ndarray | None = None  # (T, N) float32 log μ(a_t | s_t), when sent instead of dist_params
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    restarted_workers: list[int] = field(default_factory=list)
    learner_version: int = 0

    @property
    def num_steps(self) -> int:
        """T."""
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        """N."""
        return int(self.rewards.shape[1])

    def behaviour_log_prob(self) -> torch.Tensor:
        """log μ(a_t | s_t) under the behaviour distribution recorded with each step, shape (T, N)."""
        if self.behaviour_logp is not None:
            return torch.from_numpy(self.behaviour_logp)
        if self.dist_params is None:
            raise ValueError("this rollout carries neither behaviour parameters nor log-probabilities")
        return dists.log_prob(
            self.dist_kind, torch.from_numpy(self.dist_params), torch.from_numpy(self.actions)
        )

    def policy_lag(self) -> np.ndarray:
        """learner version − behaviour version for each step."""
        return self.learner_version - self.versions


def collect_rollout(
    envs: gym.vector.VectorEnv, agent: ActorCritic, num_steps: int, state: dict[str, Any]
) -> Rollout:
    """Collect a :class:`Rollout` from a plain Gymnasium vector env with head-side inference.

    ``state`` carries the current observation and autoreset flags between calls (start with ``{}``;
    it is filled from ``envs.reset()`` on the first call, seeded with ``state.get("seed")``).
    Handles NEXT_STEP (the Gymnasium default) and SAME_STEP autoreset; with NEXT_STEP the reset
    steps are marked invalid and the final observations are taken from the step that ended.
    """
    mode = envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
    mode = mode.value if hasattr(mode, "value") else str(mode)
    if "obs" not in state:
        state["obs"], _ = envs.reset(seed=state.get("seed"))
        state["resetting"] = np.zeros(envs.num_envs, dtype=bool)
    n = envs.num_envs
    action_space = envs.single_action_space
    obs_buf, act_buf, par_buf = [], [], []
    rewards = np.zeros((num_steps, n), np.float32)
    terms = np.zeros((num_steps, n), bool)
    truncs = np.zeros((num_steps, n), bool)
    valid = np.ones((num_steps, n), bool)
    final_idx: list[tuple[int, int]] = []
    final_obs: list[np.ndarray] = []
    ep_r: list[float] = []
    ep_l: list[int] = []
    generator = state.setdefault("generator", torch.Generator().manual_seed(state.get("seed") or 0))
    ep_ret = state.setdefault("ep_ret", np.zeros(n))
    ep_len = state.setdefault("ep_len", np.zeros(n, dtype=np.int64))
    for t in range(num_steps):
        obs = state["obs"]
        valid[t] = ~state["resetting"]
        with torch.no_grad():
            params = agent.dist_params(torch.as_tensor(obs))
            action = dists.sample(agent.dist_kind, params, generator).numpy()
        obs_buf.append(np.asarray(obs).copy())
        act_buf.append(action)
        par_buf.append(params.float().numpy())
        if isinstance(action_space, gym.spaces.Box):
            env_action = np.clip(action, action_space.low, action_space.high)
        else:
            env_action = action
        next_obs, r, te, tr, infos = envs.step(env_action)
        rewards[t], terms[t], truncs[t] = r, te, tr
        done = np.logical_or(te, tr)
        for i in np.flatnonzero(done):
            final_idx.append((t, int(i)))
            if mode == "SameStep":
                final_obs.append(np.asarray(infos["final_obs"][i]))
            else:
                final_obs.append(np.asarray(next_obs[i]))
        ep_ret += np.where(valid[t], r, 0.0)
        ep_len += valid[t]
        for i in np.flatnonzero(done):
            ep_r.append(float(ep_ret[i]))
            ep_l.append(int(ep_len[i]))
            ep_ret[i], ep_len[i] = 0.0, 0
        # With NEXT_STEP autoreset the next step of a finished env only resets it: mark it invalid.
        state["resetting"] = done if mode == "NextStep" else np.zeros(n, bool)
        state["obs"] = next_obs
    obs_arr = np.stack(obs_buf)
    return Rollout(
        obs=obs_arr,
        actions=np.stack(act_buf),
        rewards=rewards,
        terminations=terms,
        truncations=truncs,
        dist_params=np.stack(par_buf),
        versions=np.zeros((num_steps, n), np.int64),
        next_obs=np.asarray(state["obs"]).copy(),
        final_idx=np.array(final_idx, np.int32).reshape(-1, 2),
        final_obs=np.stack(final_obs) if final_obs else np.zeros((0, *obs_arr.shape[2:]), obs_arr.dtype),
        dist_kind=agent.dist_kind,
        valid=None if valid.all() else valid,
        episode_returns=ep_r,
        episode_lengths=ep_l,
    )
