"""Checkpoints of a :class:`~frugalrl.envs.cluster.ClusterEnv` (``replayable`` workers): its ``state_dict()`` and
``load_state_dict()``, from :class:`Checkpoints`, a base class of ClusterEnv.

A worker's snapshot is how its envs' episodes began and the actions taken since, its sampling generator and the
policy it holds; restoring replays the episodes, so the envs continue exactly where they were whenever the env is
deterministic given its ``np_random`` and the reset state it declares (:func:`frugalrl.experience.start_state`). Both directions cross the wire as ``checkpoint`` bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from frugalrl.envs.spec import EnvSpec
from frugalrl.sync_state import PolicySync
from frugalrl.wire.message import Message
from frugalrl.wire.meter import ByteMeter

log = logging.getLogger("frugalrl")


class Checkpoints:
    """``state_dict()`` and ``load_state_dict()`` of :class:`~frugalrl.envs.cluster.ClusterEnv`, which defines what
    they use (declared here): its workers, sync state, byte meter, restarts, current observations and requests."""

    num_workers: int
    envs_per_worker: int
    env_spec: EnvSpec
    seed: int
    replayable: bool
    policies: PolicySync
    meter: ByteMeter
    restart_events: list[dict[str, Any]]
    _obs: np.ndarray | None

    if TYPE_CHECKING:  # ClusterEnv's methods, declared for the type checker only (nothing here to override them)
        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any: ...
        def _check_open(self) -> None: ...
        def _request(self, requests: dict[int, Message],
                     on_failure: Callable[[int, str], Message | None]) -> dict[int, Message]: ...
        def _restart(self, w: int, reason: str) -> None: ...
        def _reset_worker(self, w: int, seed: int | None, defer: bool = False) -> Message: ...

    def state_dict(self, workers: bool = True) -> dict[str, Any]:
        """Everything needed to continue exactly from here in a new ClusterEnv (``replayable`` workers):
        the sync state, the byte meter, restarts, the current observations and each worker's snapshot
        (how its envs' episodes began and the actions since, its sampling generator, the policy it holds).
        Fetching the snapshots is counted as ``checkpoint`` bytes. ``workers=False``: the books only (sync
        counts, bytes, restarts; no request is made), for envs that cannot be rebuilt (not replayable, or closed
        after their workers failed): a resume then starts their envs anew but keeps counting."""
        if not workers:
            return {"policies": self.policies.state_dict(), "meter": self.meter.state_dict(),
                    "restart_events": list(self.restart_events), "obs": None, "workers": None}
        self._check_open()
        if not self.replayable:
            raise RuntimeError("ClusterEnv.state_dict() needs workers started with replayable=True")
        if self._obs is None:
            self.reset(seed=self.seed)
        msg = Message("snapshot")

        def recover(w: int, reason: str) -> Message:
            self._restart(w, reason)
            self._reset_worker(w, seed=None)
            return msg

        replies = self._request({w: msg for w in range(self.num_workers)}, on_failure=recover)
        assert self._obs is not None
        snapshots = [
            {"meta": replies[w].meta, "arrays": {k: torch.from_numpy(np.ascontiguousarray(v))
                                                 for k, v in replies[w].arrays.items()}}
            for w in range(self.num_workers)
        ]
        return {
            "policies": self.policies.state_dict(),
            "meter": self.meter.state_dict(),
            "restart_events": list(self.restart_events),
            "obs": torch.from_numpy(self._obs.copy()),
            "workers": snapshots,
        }

    def load_state_dict(self, state: dict[str, Any]) -> list[int]:
        """Continue from :meth:`state_dict`: every worker rebuilds its envs by replaying their episodes.

        Returns the envs that could not be rebuilt exactly (their replay did not reproduce the
        observation: the env depends on more than its ``np_random`` and its reset state,
        :func:`frugalrl.experience.start_state`); those start a new episode, with a warning. Restoring is counted as ``checkpoint`` bytes.
        """
        self._check_open()
        if state["workers"] is None:  # the books only (state_dict(workers=False)): the envs start anew
            self.policies.load_state_dict(state["policies"])
            for w in range(self.num_workers):
                self.policies.forget(w)  # these workers hold no weights yet
            self.meter.load_state_dict(state["meter"])
            self.restart_events = list(state["restart_events"])
            return list(range(self.num_workers * self.envs_per_worker))
        if not self.replayable:
            raise RuntimeError("ClusterEnv.load_state_dict() needs workers started with replayable=True")
        if len(state["workers"]) != self.num_workers:
            raise ValueError(f"the checkpoint has {len(state['workers'])} workers, this ClusterEnv {self.num_workers}")
        obs = state["obs"].numpy()
        k = self.envs_per_worker
        requests = {}
        for w, snap in enumerate(state["workers"]):
            arrays = {name: t.numpy() for name, t in snap["arrays"].items()}
            arrays["obs"] = obs[w * k : (w + 1) * k]
            requests[w] = Message("restore", dict(snap["meta"]), arrays, kinds={n: "checkpoint" for n in arrays})

        def retry(w: int, reason: str) -> Message:  # a fresh worker replays the same episodes
            self._restart(w, reason)
            return requests[w]

        first_event = len(self.restart_events)
        replies = self._request(requests, on_failure=retry)
        self.policies.load_state_dict(state["policies"])
        for w, snap in enumerate(state["workers"]):  # what each worker acts with: the head recomputes its behaviour
            acting = {name[2:]: t.numpy() for name, t in snap["arrays"].items() if name.startswith("w/")}
            self.policies.restored(w, int(snap["meta"]["version"]), snap["meta"].get("spec"), acting)
        self.meter.load_state_dict(state["meter"])
        self.restart_events = list(state["restart_events"]) + self.restart_events[first_event:]
        inexact = [w * k + i for w in range(self.num_workers) for i, ok in enumerate(replies[w].meta["exact"])
                   if not ok]
        self._obs = np.concatenate([replies[w].arrays["obs"] for w in range(self.num_workers)])
        if inexact:
            log.warning("frugalrl: envs %s could not be rebuilt exactly from the checkpoint (%s depends on more than "
                        "its np_random: its env can say on what with get_reset_state() and set_reset_state(), "
                        "docs/clusterenv.md); they start new episodes", inexact, self.env_spec.describe())
        return inexact


def resume_envs(envs: Any, state: dict[str, Any] | None, seed: int) -> list[int] | str:
    """Rebuild a resumed run's envs from their checkpoint ``state``: "restored", or the envs that could not be
    rebuilt exactly. A checkpoint without their state, envs that cannot hold it, or envs on another number of
    workers or envs per worker (a run resumed on another allocation) take back their books only and start new
    episodes from ``seed`` (one no earlier segment used): "reset"."""
    if state is not None and state.get("workers") is not None and getattr(envs, "replayable", False):
        saved = (len(state["workers"]), state["obs"].shape[0] // len(state["workers"]))
        if saved == (envs.num_workers, envs.envs_per_worker):
            inexact = envs.load_state_dict(state)
            return [int(i) for i in inexact] if inexact else "restored"
        log.warning("frugalrl: the run resumes on %d worker%s × %d envs (it ran on %d × %d): the envs start new "
                    "episodes", envs.num_workers, "s" * (envs.num_workers > 1), envs.envs_per_worker, *saved)
    else:
        log.warning("frugalrl: the checkpoint holds no env state; the envs start new episodes")
    if state is not None:
        envs.load_state_dict({**state, "workers": None})  # their books: bytes, syncs, restarts
    if hasattr(envs, "reset"):
        envs.reset(seed=seed)
    return "reset"
