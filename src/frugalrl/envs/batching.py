"""How ClusterEnv's per-worker replies join into one vector-env batch (env ``j`` always at index ``j``).

Pure functions of the replies: the head checks the actions a learner gives, merges the workers' infos as
Gymnasium's vector envs do, assembles a rollout from the workers' fragments and bounds the size of a
rollout reply (which sizes the local backend's shared-memory arenas).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from frugalrl.action_heads import action_desc, action_head, params_shape
from frugalrl.dists import DistKind
from frugalrl.experience import space_shape
from frugalrl.infos import info_path, widened
from frugalrl.rollout import Rollout
from frugalrl.wire.message import Message


def check_actions(space: gym.spaces.Discrete | gym.spaces.Box, num_envs: int, actions: Any,
                  discrete_dtype: np.dtype | None = None) -> np.ndarray:
    """``actions`` for ``num_envs`` envs with action space ``space``, as an array (Discrete ones in
    ``discrete_dtype``, int64 by default); ``ValueError`` naming what is wrong (shape, dtype, range, NaN)."""
    try:
        arr = np.asarray(actions)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"actions could not be read as an array: {e}") from e
    if arr.ndim == 0 and arr.dtype != object:  # one number for a vector env: Gymnasium's iterate raises TypeError
        raise TypeError(f"actions must hold one action per env ({num_envs}), got the scalar {actions!r}")
    if isinstance(space, gym.spaces.Discrete):
        if arr.shape != (num_envs,):
            raise ValueError(
                f"actions must have shape ({num_envs},) for {num_envs} envs with a Discrete "
                f"action space, got shape {arr.shape}"
            )
        if arr.dtype.kind not in "iu":
            raise ValueError(f"actions for a Discrete action space must be integers, got dtype {arr.dtype}")
        if arr.size and (arr.min() < space.start or arr.max() >= space.start + space.n):
            raise ValueError(f"actions out of range [{space.start}, {space.start + space.n}): {arr}")
        return arr.astype(np.int64 if discrete_dtype is None else discrete_dtype)
    expected = (num_envs, *space.shape)
    if arr.shape != expected:
        raise ValueError(f"actions must have shape {expected} for this Box action space, got shape {arr.shape}")
    if arr.dtype.kind not in "fiu" and not (arr.dtype.kind == "b" and space.dtype.kind == "b"):
        raise ValueError(f"actions for a Box action space must be numeric, got dtype {arr.dtype}")
    if arr.dtype.kind != "f":  # floats reach the env as given, as in Gymnasium; others in the space's dtype
        arr = arr.astype(space.dtype)
    if not np.isfinite(arr).all():
        raise ValueError("actions contain NaN or inf")
    return arr


def reset_requests(num_envs: int, k: int, seed: Any, options: dict[str, Any] | None) -> dict[int, Message]:
    """The ``reset`` message of each worker of ``k`` envs, checked as AsyncVectorEnv checks them: ``seed`` None, an
    integer (env ``j`` gets ``seed + j``) or one per env; ``options["reset_mask"]`` resets only the envs it picks
    (workers with none get no message)."""
    meta: dict[str, Any] = {"seed": None}
    seeds = None
    if isinstance(seed, list | tuple):
        if len(seed) != num_envs:
            raise ValueError(f"If seeds are passed as a list the length must match num_envs={num_envs} but got "
                             f"length={len(seed)}.")
        seeds = [None if s is None else int(s) for s in seed]
    elif seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
        raise ValueError(f"reset(seed=...) takes an integer or None, got {seed!r} (or a list, one per env)")
    elif seed is not None:
        meta["seed"] = int(seed)
    options = dict(options) if options is not None else None
    mask = None if options is None or "reset_mask" not in options else options.pop("reset_mask")
    if mask is not None:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
        if mask.shape != (num_envs,):
            raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got {mask.shape}")
        if mask.dtype != np.bool_:
            raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
        if not mask.any():
            raise ValueError("`options['reset_mask']` must contain a boolean array with at least one True value, got "
                             f"reset_mask={mask}")
    meta["options"] = options
    out = {}
    for w in range(num_envs // k):
        part = {**meta}
        if seeds is not None:
            part["seeds"] = seeds[w * k : (w + 1) * k]
        if mask is not None:
            if not mask[w * k : (w + 1) * k].any():
                continue
            part["mask"] = mask[w * k : (w + 1) * k].tolist()
        out[w] = Message("reset", part)
    return out


def merge_infos(replies: dict[int, Message], num_envs: int, k: int,
                final_obs: Callable[[Message], list[Any]] | None = None, same_step: bool = True,
                widen: bool = False) -> dict[str, Any]:
    """The workers' infos (``info/*``, episode statistics, final observations and infos) merged into one
    Gymnasium vector-env ``infos`` dict (value arrays with ``_key`` masks); worker ``w`` holds envs
    ``w·k .. w·k + k − 1``. A step reply with episode statistics lists them for the envs its flags say ended, in
    env order, and under ``same_step`` autoreset their final observations (``final_obs(reply)``: those of a space
    other than Box and Discrete) and infos. An info whose dtype differs between envs takes the first env's, as
    SyncVectorEnv casts it, or with ``widen`` one that holds every env's value."""
    n = num_envs
    infos: dict[str, Any] = {}
    for w in sorted(replies):  # env order, whatever order the replies came in: the first env sets an info's dtype
        reply = replies[w]
        base = w * k
        a = reply.arrays
        _put_infos(infos, reply, "info", base, k, n, widen)
        _say_left_out(reply.meta.get("infos_left_out"))
        if "ep_r" not in a:
            continue
        ended_here = np.flatnonzero(a["terminations"] | a["truncations"])
        ended = base + ended_here
        if "episode" not in infos:
            infos["episode"] = {"r": np.zeros(n), "l": np.zeros(n, np.int64), "t": np.zeros(n)}
            infos["_episode"] = np.zeros(n, dtype=bool)
        infos["episode"]["r"][ended] = a["ep_r"]
        infos["episode"]["l"][ended] = a["ep_l"]
        infos["episode"]["t"][ended] = a["ep_t"]
        infos["_episode"][ended] = True
        if same_step:
            if "final_obs" not in infos:
                infos["final_obs"] = np.full(n, None, dtype=object)
                infos["_final_obs"] = np.zeros(n, dtype=bool)
                infos["final_info"] = {}
                infos["_final_info"] = np.zeros(n, dtype=bool)
            finals = a["final_obs"] if final_obs is None else final_obs(reply)
            for j, i in enumerate(ended_here):
                infos["final_obs"][base + int(i)] = finals[j]
                infos["_final_obs"][base + int(i)] = True
                infos["_final_info"][base + int(i)] = True
            _put_infos(infos["final_info"], reply, "finfo", base, k, n, widen)
    return infos


def _put_infos(infos: dict[str, Any], reply: Message, prefix: str, base: int, k: int, n: int,
               widen: bool = False) -> None:
    """A reply's batched infos (``prefix/name`` arrays and ``meta[prefix]`` data, :meth:`EnvWorker._put_infos`)
    into the vector ``infos`` at envs ``base .. base + k - 1``, nested dicts rebuilt from the names' key paths. A new
    array takes the dtype of the reply's first env (``meta[prefix + "_dtype"]`` where the worker widened it), and
    later envs' values are cast to it, as Gymnasium batches them; with ``widen`` the array widens instead."""
    head = prefix + "/"
    firsts = {} if widen else reply.meta.get(f"{prefix}_dtype") or {}
    for name, value in reply.arrays.items():
        if name.startswith(head):
            sub = name[len(head):]
            node, key = _node(infos, sub)
            if key not in node:
                node[key] = np.zeros((n, *value.shape[1:]), dtype=np.dtype(firsts.get(sub, value.dtype)))
            elif widen:
                node[key] = widened(node[key], value.dtype)
            node[key][base : base + k] = value
    for name, by_env in reply.meta.get(prefix, {}).items():
        node, key = _node(infos, name)
        if key not in node:
            node[key] = np.full(n, None, dtype=object)
        for j, value in by_env.items():
            node[key][base + int(j)] = value


def _node(infos: dict[Any, Any], name: str) -> tuple[dict[Any, Any], Any]:
    """The dict that holds the info a wire name stands for (made on the way), and its key there."""
    *parents, key = info_path(name)
    for parent in parents:
        infos = infos.setdefault(parent, {})
    return infos, key


def _say_left_out(keys: list[str] | None) -> None:
    """Warn of infos a worker left out (each worker names a key once; Python shows the warning once)."""
    for key in keys or ():
        warnings.warn(f"info {key!r} is left out of infos: a value that is not data (numbers, arrays, strings, None, "
                      "lists or dicts of them) cannot leave a worker, nor an array of another shape than in the "
                      "envs before", RuntimeWarning, stacklevel=2)


def rollout_bound(obs_space: gym.spaces.Box, act_space: gym.spaces.Discrete | gym.spaces.Box, k: int, T: int) -> int:
    """Largest rollout reply expected from one worker of ``k`` envs over ``T`` steps (bytes)."""
    obs_bytes = int(np.prod(space_shape(obs_space))) * obs_space.dtype.itemsize
    act_bytes = 8 * max(1, int(np.prod(space_shape(act_space))))
    params = int(np.prod(params_shape(action_desc(act_space))))
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
        fi = np.argwhere(p["terminations"] | p["truncations"])  # the order the worker's final_obs and ep_* are in
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


def check_agent_fits(agent: Any, obs_space: gym.Space, space: gym.Space) -> None:
    """Fail on the head, with a clear message, for an agent built for other spaces."""
    import torch

    action = action_desc(space)
    kind, shape = action_head(action)[0], params_shape(action)
    if agent.dist_kind != kind:
        raise ValueError(f"agent.dist_kind is {agent.dist_kind!r} but this env's action space {space} needs {kind!r}")
    obs = torch.as_tensor(np.stack([obs_space.sample()]))
    try:
        with torch.no_grad():
            params = agent.dist_params(obs)
    except Exception as e:
        raise ValueError(f"agent cannot act on this env's observations {obs_space}: {type(e).__name__}: {e}") from e
    if tuple(params.shape) != (1, *shape):
        raise ValueError(f"agent.dist_params returned shape {tuple(params.shape[1:])} per observation; "
                         f"the action space {space} needs {shape}")
