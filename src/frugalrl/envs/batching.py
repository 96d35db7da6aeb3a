"""How ClusterEnv's per-worker replies join into one vector-env batch (env ``j`` always at index ``j``).

Pure functions of the replies: the head checks the actions a learner gives, merges the workers' infos as
Gymnasium's vector envs do, assembles a rollout from the workers' fragments and bounds the size of a
rollout reply (which sizes the local backend's shared-memory arenas).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from frugalrl.dists import DistKind
from frugalrl.experience import space_shape
from frugalrl.rollout import Rollout
from frugalrl.wire.message import Message


def check_actions(space: gym.spaces.Discrete | gym.spaces.Box, num_envs: int, actions: Any) -> np.ndarray:
    """``actions`` for ``num_envs`` envs with action space ``space``, as an array; ``ValueError`` naming what
    is wrong (shape, dtype, range, NaN)."""
    try:
        arr = np.asarray(actions)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"actions could not be read as an array: {e}") from e
    if isinstance(space, gym.spaces.Discrete):
        if arr.shape != (num_envs,):
            raise ValueError(
                f"actions must have shape ({num_envs},) for {num_envs} envs with a Discrete "
                f"action space, got shape {arr.shape}"
            )
        if arr.dtype.kind not in "iu":
            raise ValueError(f"actions for a Discrete action space must be integers, got dtype {arr.dtype}")
        if (arr < space.start).any() or (arr >= space.start + space.n).any():
            raise ValueError(f"actions out of range [{space.start}, {space.start + space.n}): {arr}")
        return arr.astype(np.int64)
    expected = (num_envs, *space.shape)
    if arr.shape != expected:
        raise ValueError(f"actions must have shape {expected} for this Box action space, got shape {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"actions for a Box action space must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(space.dtype)
    if not np.isfinite(arr).all():
        raise ValueError("actions contain NaN or inf")
    return arr


def merge_infos(replies: dict[int, Message], num_envs: int, k: int) -> dict[str, Any]:
    """The workers' infos (``info/*``, episode statistics, final observations and infos) merged into one
    Gymnasium vector-env ``infos`` dict (value arrays with ``_key`` masks); worker ``w`` holds envs
    ``w·k .. w·k + k − 1``."""
    n = num_envs
    infos: dict[str, Any] = {}
    for w, reply in replies.items():
        base = w * k
        a = reply.arrays
        for name, value in a.items():
            if name.startswith("info/"):
                key = name[5:]
                if key not in infos:
                    infos[key] = np.zeros((n, *value.shape[1:]), dtype=value.dtype)
                infos[key][base : base + k] = value
        if "ep_mask" in a:
            if "episode" not in infos:
                infos["episode"] = {"r": np.zeros(n), "l": np.zeros(n, np.int64), "t": np.zeros(n)}
                infos["_episode"] = np.zeros(n, dtype=bool)
            infos["episode"]["r"][base : base + k] = a["ep_r"]
            infos["episode"]["l"][base : base + k] = a["ep_l"]
            infos["episode"]["t"][base : base + k] = a["ep_t"]
            infos["_episode"][base : base + k] = a["ep_mask"]
        if "final_idx" in a and a["final_idx"].ndim == 1:
            if "final_obs" not in infos:
                infos["final_obs"] = np.full(n, None, dtype=object)
                infos["_final_obs"] = np.zeros(n, dtype=bool)
                infos["final_info"] = {}
                infos["_final_info"] = np.zeros(n, dtype=bool)
            for j, i in enumerate(a["final_idx"]):
                infos["final_obs"][base + int(i)] = a["final_obs"][j]
                infos["_final_obs"][base + int(i)] = True
                infos["_final_info"][base + int(i)] = True
            for name, value in a.items():
                if name.startswith("finfo/"):
                    key = name[6:]
                    if key not in infos["final_info"]:
                        infos["final_info"][key] = np.zeros((n, *value.shape[1:]), dtype=value.dtype)
                    infos["final_info"][key][base : base + k] = value
    return infos


def rollout_bound(obs_space: gym.spaces.Box, act_space: gym.spaces.Discrete | gym.spaces.Box, k: int, T: int) -> int:
    """Largest rollout reply expected from one worker of ``k`` envs over ``T`` steps (bytes)."""
    obs_bytes = int(np.prod(space_shape(obs_space))) * obs_space.dtype.itemsize
    act_bytes = 8 * max(1, int(np.prod(space_shape(act_space))))
    params = act_space.n if isinstance(act_space, gym.spaces.Discrete) else 2 * int(np.prod(space_shape(act_space)))
    per_step = k * (obs_bytes + act_bytes + 4 * int(params) + 8)
    return T * per_step + T * k * obs_bytes // 4 + (1 << 16)


def assemble_rollout(replies: list[Message], action_dtype: np.dtype, dist_kind: DistKind, restarted: list[int],
                     learner_version: int) -> Rollout:
    """One :class:`~frugalrl.rollout.Rollout` (T × N) from the workers' ``rollout`` replies, in worker order."""
    parts = [r.arrays for r in replies]
    k = parts[0]["rewards"].shape[1]

    def cat(name: str) -> np.ndarray:
        return np.concatenate([p[name] for p in parts], axis=1)

    def cat_if(name: str) -> np.ndarray | None:
        return cat(name) if name in parts[0] else None

    T = parts[0]["rewards"].shape[0]
    versions = np.concatenate([np.full((T, k), r.meta["version"], dtype=np.int64) for r in replies], axis=1)
    final_idx, final_obs = [], []
    ep_r: list[float] = []
    ep_l: list[int] = []
    for w, p in enumerate(parts):
        fi = p["final_idx"].astype(np.int64)
        fi[:, 1] += w * k
        final_idx.append(fi)
        final_obs.append(p["final_obs"])
        ep_r += p["ep_r"].tolist()
        ep_l += p["ep_l"].tolist()
    return Rollout(
        obs=cat("obs"),
        actions=cat("actions").astype(action_dtype, copy=False),
        rewards=cat("rewards"),
        terminations=cat("terminations"),
        truncations=cat("truncations"),
        dist_params=cat_if("dist_params"),
        behaviour_logp=cat_if("behaviour_logp"),
        versions=versions,
        next_obs=np.concatenate([p["next_obs"] for p in parts]),
        final_idx=np.concatenate(final_idx),
        final_obs=np.concatenate(final_obs),
        dist_kind=dist_kind,
        episode_returns=ep_r,
        episode_lengths=ep_l,
        restarted_workers=sorted(set(restarted)),
        learner_version=learner_version,
    )
