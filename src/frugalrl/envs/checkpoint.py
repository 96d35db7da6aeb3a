"""Checkpoints of a :class:`~frugalrl.envs.cluster.ClusterEnv` (``replayable`` workers): what
``ClusterEnv.state_dict()`` and ``load_state_dict()`` do.

A worker's snapshot is how its envs' episodes began and the actions taken since, its sampling generator and the
policy it holds; restoring replays the episodes, so the envs continue exactly where they were whenever the env is
deterministic given its ``np_random``. Both directions cross the wire as ``checkpoint`` bytes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from frugalrl.wire.message import Message

if TYPE_CHECKING:
    from frugalrl.envs.cluster import ClusterEnv

log = logging.getLogger("frugalrl")


def snapshot(env: ClusterEnv) -> dict[str, Any]:
    """The sync state, the byte meter, restarts, the current observations and each worker's snapshot."""
    env._check_open()
    if not env.replayable:
        raise RuntimeError("ClusterEnv.state_dict() needs workers started with replayable=True")
    if env._obs is None:
        env.reset(seed=env.seed)
    msg = Message("snapshot")

    def recover(w: int, reason: str) -> Message:
        env._restart(w, reason)
        env._reset_worker(w, seed=None)
        return msg

    replies = env._request({w: msg for w in range(env.num_workers)}, on_failure=recover)
    assert env._obs is not None
    workers = [
        {"meta": replies[w].meta, "arrays": {k: torch.from_numpy(np.ascontiguousarray(v))
                                             for k, v in replies[w].arrays.items()}}
        for w in range(env.num_workers)
    ]
    return {
        "policies": env.policies.state_dict(),
        "meter": env.meter.state_dict(),
        "restart_events": list(env.restart_events),
        "obs": torch.from_numpy(env._obs.copy()),
        "workers": workers,
    }


def restore(env: ClusterEnv, state: dict[str, Any]) -> list[int]:
    """Every worker rebuilds its envs from ``state`` (a :func:`snapshot`); returns the envs whose replay did not
    reproduce the observation (they start new episodes, with a warning)."""
    env._check_open()
    if not env.replayable:
        raise RuntimeError("ClusterEnv.load_state_dict() needs workers started with replayable=True")
    if len(state["workers"]) != env.num_workers:
        raise ValueError(f"the checkpoint has {len(state['workers'])} workers, this ClusterEnv {env.num_workers}")
    obs = state["obs"].numpy()
    k = env.envs_per_worker
    requests = {}
    for w, snap in enumerate(state["workers"]):
        arrays = {name: t.numpy() for name, t in snap["arrays"].items()}
        arrays["obs"] = obs[w * k : (w + 1) * k]
        requests[w] = Message("restore", dict(snap["meta"]), arrays, kinds={n: "checkpoint" for n in arrays})

    def fail(w: int, reason: str) -> None:
        raise RuntimeError(f"worker {w} failed while restoring a checkpoint: {reason}")

    replies = env._request(requests, on_failure=fail)
    env.policies.load_state_dict(state["policies"])
    env.meter.load_state_dict(state["meter"])
    env.restart_events = list(state["restart_events"])
    inexact = [w * k + i for w in range(env.num_workers) for i, ok in enumerate(replies[w].meta["exact"]) if not ok]
    env._obs = np.concatenate([replies[w].arrays["obs"] for w in range(env.num_workers)])
    if inexact:
        log.warning("frugalrl: envs %s could not be rebuilt exactly from the checkpoint (%s is not "
                    "deterministic given its np_random); they start new episodes", inexact, env.env_spec.describe())
    return inexact
