"""Rollout batches: what a fragment of experience looks like, from ClusterEnv or a plain vector env.

A :class:`Rollout` holds ``T`` steps of ``N`` envs with *same-step* autoreset: ``obs[t+1]`` is
always the state after ``obs[t]`` within an episode or the first state of a new one, and the
final observation of every finished episode is kept apart (``final_idx``, ``final_obs``) for
bootstrapping truncated episodes. Terminations and truncations stay separate. Every step carries
the behaviour distribution's parameters, or only the log-probability of its action under them (what
ClusterEnv's workers send by default), and the policy version that chose its action.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import gymnasium as gym
import numpy as np
import torch

from frugalrl import dists
from frugalrl.dists import DistKind
from frugalrl.experience import VectorGroup, collect_fragment
from frugalrl.nets import ActorCritic


@dataclass
class Rollout:
    """``T`` steps × ``N`` envs of experience (NumPy arrays)."""

    obs: np.ndarray  # (T, N, *obs_shape)
    actions: np.ndarray  # (T, N, *act_shape)
    rewards: np.ndarray  # (T, N) float32
    terminations: np.ndarray  # (T, N) bool
    truncations: np.ndarray  # (T, N) bool
    dist_params: np.ndarray | None  # (T, N, *param shape) behaviour distributions (None: behaviour_logp only)
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

    ``state`` carries the env's place between calls (start with ``{}``, or ``{"seed": s}``: the first call resets
    the env with that seed). NEXT_STEP (the Gymnasium default) and SAME_STEP autoreset both work; with NEXT_STEP the
    reset steps are marked invalid and the final observations are taken from the step that ended.
    """
    if "group" not in state:
        state["group"] = VectorGroup(envs, seed=state.get("seed"))
    generator = state.setdefault("generator", torch.Generator().manual_seed(state.get("seed") or 0))

    def policy(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            params = agent.dist_params(torch.as_tensor(obs))
            return dists.sample(agent.dist_kind, params, generator).numpy(), params.float().numpy()

    f = collect_fragment(state["group"], policy, num_steps)
    return Rollout(
        obs=f.obs, actions=f.actions, rewards=f.rewards, terminations=f.terminations, truncations=f.truncations,
        dist_params=f.params, versions=np.zeros((num_steps, envs.num_envs), np.int64), next_obs=f.next_obs,
        final_idx=f.final_idx, final_obs=f.final_obs, dist_kind=agent.dist_kind, valid=f.valid,
        episode_returns=f.episode_returns, episode_lengths=f.episode_lengths,
    )


R = TypeVar("R")


class RolloutsAhead(Generic[R]):
    """The next rollout on a thread while the learner updates (IMPALA's actors running ahead), or, without
    ``overlap``, each rollout when it is taken: the one loop for both, which IMPALA and the learner-capacity
    benchmark share. :meth:`start` begins the next rollout; :meth:`take` returns it (or runs one now if none was
    started); :meth:`close` waits for the one in flight."""

    def __init__(self, rollout: Callable[..., R], overlap: bool) -> None:
        self.rollout = rollout
        self.pool = concurrent.futures.ThreadPoolExecutor(1) if overlap else None
        self.pending: concurrent.futures.Future[R] | None = None

    def start(self, *args: Any) -> None:
        """Begin ``rollout(*args)`` on the thread (nothing without overlap: :meth:`take` will run it)."""
        if self.pool is not None:
            self.pending = self.pool.submit(self.rollout, *args)

    def take(self, *args: Any) -> R:
        """The rollout :meth:`start` began, or ``rollout(*args)`` now if none is in flight."""
        pending, self.pending = self.pending, None
        return pending.result() if pending is not None else self.rollout(*args)

    def close(self) -> None:
        """Wait for the rollout in flight and stop the thread; the rollout's own error is dropped (a loop that
        stops on an error raises its own)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - the loop's own error (if any) is the one to raise
                pass
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
