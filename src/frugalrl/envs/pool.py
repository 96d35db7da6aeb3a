"""EnvPool-style asynchronous steps for ClusterEnv: send actions to some envs, receive whichever are ready.

``step()`` waits for every worker, so the learner's inference and the workers' stepping take turns. With
``send`` / ``recv`` (EnvPool's API) the learner infers on the envs that are ready while the workers step the
others; a batch is one or more workers' envs, so env ids come in whole workers::

    env.async_reset(seed=0)
    while True:
        obs, rewards, terminations, truncations, infos = env.recv()
        env.send(policy(obs), infos["env_id"])

Autoreset and episode statistics follow the env's settings as in ``step()``; a worker that dies is replaced
and its envs come back truncated with ``infos["worker_restarted"]``, as in ``step()``. A synchronous call
(``step``, ``reset``, ``rollout``...) on a worker whose envs are in flight is an error: ``recv`` them first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import AutoresetMode

from frugalrl.envs.batching import check_actions
from frugalrl.experience import space_shape
from frugalrl.wire.message import Message

if TYPE_CHECKING:
    from gymnasium.spaces import Space

    from frugalrl.envs.backends.base import Backend, WorkerFailure
    from frugalrl.envs.restarts import CrashLoopRule
    from frugalrl.envs.spaces import Batches


#: The arrays of a step reply without infos, episode statistics or final observations.
_PLAIN = {"obs", "rewards", "terminations", "truncations"}


class AsyncSteps:
    """``async_reset`` / ``send`` / ``recv`` (mixed into :class:`~frugalrl.envs.cluster.ClusterEnv`)."""

    num_workers: int
    envs_per_worker: int
    num_envs: int
    _in_flight: set[int]

    if TYPE_CHECKING:  # ClusterEnv's, declared for the type checker only
        single_observation_space: Space
        single_action_space: Space
        backend: Backend
        autoreset_mode: AutoresetMode
        restart_rule: CrashLoopRule
        _obs: np.ndarray | None
        _obs_batches: Batches
        _act_batches: Batches
        _action_wire_dtype: np.dtype | None

        def _check_open(self) -> None: ...
        def _restart(self, w: int, reason: str) -> None: ...
        def _failure(self, result: Message | WorkerFailure) -> str | None: ...
        def _reset_worker(self, w: int, seed: int | None, defer: bool = False) -> Message: ...
        def _accept(self, w: int, reply: Message) -> Message: ...
        def _note_codecs(self, reply: Message) -> None: ...
        def _finish_step(self, result: tuple[dict[int, Message], list[int]]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]: ...

    def async_reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Reset every env (env ``j`` with ``seed + j``); the first observations come from :meth:`recv`."""
        self._check_open()
        self._check_pool()
        self._check_idle(range(self.num_workers))
        if self._obs is None:
            shape = space_shape(self.single_observation_space)
            self._obs = np.zeros((self.num_envs, *shape), dtype=self.single_observation_space.dtype)
        msg = Message("reset", {"seed": None if seed is None else int(seed), "options": options})
        self.backend.post({w: msg for w in range(self.num_workers)})
        self._in_flight.update(range(self.num_workers))

    def send(self, actions: Any, env_id: Any = None) -> None:
        """Step the envs ``env_id`` (default: all) with ``actions`` (one row per id, in the order of the ids);
        returns at once. The ids must make up whole workers' envs (``infos["env_id"]`` of a :meth:`recv`)."""
        self._check_open()
        self._check_pool()
        n, k = self.num_envs, self.envs_per_worker
        ids = np.arange(n) if env_id is None else np.asarray(env_id).reshape(-1)
        if ids.dtype.kind not in "iu" or ids.size == 0 or ids.min() < 0 or ids.max() >= n:
            raise ValueError(f"env_id must be indices of this ClusterEnv's {n} envs, got {env_id!r}")
        blocks = ids.reshape(-1, k) if ids.size % k == 0 else None
        order = None
        if blocks is not None and not (blocks == blocks[:, :1] + np.arange(k)).all():  # not whole workers in order
            order = np.argsort(ids, kind="stable")
            blocks = ids[order].reshape(-1, k)
        if blocks is None or not (blocks == blocks[:, :1] + np.arange(k)).all() or (blocks[:, 0] % k).any():
            raise ValueError(f"env_id must hold whole workers' envs (worker w has envs w*{k} .. w*{k}+{k - 1}), "
                             f"got {ids.tolist()}")
        workers = (blocks[:, 0] // k).tolist()
        if len(set(workers)) != len(workers):
            raise ValueError(f"env_id repeats an env: {ids.tolist()}")
        self._check_idle(workers)
        if self._obs is None:
            raise RuntimeError("call reset() or async_reset() before send()")
        acts = check_actions(self.single_action_space, ids.size, actions,  # type: ignore[arg-type]
                             self._action_wire_dtype)
        if order is not None:
            acts = acts[order]
        self.backend.post({w: Message("step", {}, {"actions": acts[i * k : (i + 1) * k]})
                           for i, w in enumerate(workers)})
        self._in_flight.update(workers)

    def recv(self, min_workers: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """The envs of at least ``min_workers`` workers in flight (and of any other already done), as ``step()``
        returns them, ``infos["env_id"]`` saying which envs they are; envs just reset have zero rewards."""
        self._check_open()
        if not self._in_flight:
            raise RuntimeError("no envs in flight: send() actions or async_reset() first")
        results = self.backend.gather(sorted(self._in_flight), at_least=int(min_workers))
        self._in_flight.difference_update(results)
        restarted: list[int] = []
        replies: dict[int, Message] = {}
        for w, result in results.items():
            reason = self._failure(result)
            if reason is not None:
                restarted.append(w)
                self._restart(w, reason)
                self._reset_worker(w, seed=None, defer=self.autoreset_mode == AutoresetMode.NEXT_STEP)
                continue
            assert isinstance(result, Message), "a worker's failure has a reason"
            self._accept(w, result)
            if result.op == "reset":  # from async_reset: a step of nothing
                k = self.envs_per_worker
                result.arrays.update(rewards=np.zeros(k), terminations=np.zeros(k, bool),
                                     truncations=np.zeros(k, bool))
            replies[w] = result
        k = self.envs_per_worker
        ids = np.concatenate([np.arange(w * k, (w + 1) * k) for w in sorted(results)])
        if not restarted and all(r.arrays.keys() == _PLAIN for r in replies.values()):  # the common step: no infos
            parts = [replies[w] for w in sorted(replies)]
            assert self._obs is not None, "async_reset() or reset() came first"
            for w, r in zip(sorted(replies), parts, strict=True):
                self._obs[w * k : (w + 1) * k] = r.arrays["obs"]
                self._note_codecs(r)
            return (np.concatenate([r.arrays["obs"] for r in parts]),
                    np.concatenate([r.arrays["rewards"] for r in parts]).astype(np.float64, copy=False),
                    np.concatenate([r.arrays["terminations"] for r in parts]),
                    np.concatenate([r.arrays["truncations"] for r in parts]), {"env_id": ids})
        obs, rewards, terms, truncs, infos = self._finish_step((replies, restarted))
        out = _take(infos, ids, self.num_envs)
        out["env_id"] = ids
        return obs[ids], rewards[ids], terms[ids], truncs[ids], out

    def _check_pool(self) -> None:
        if not (self._obs_batches.simple and self._act_batches.simple):
            raise TypeError("send/recv take Box or Discrete observations and actions, not "
                            f"{self.single_observation_space} and {self.single_action_space}")

    def _check_idle(self, workers: Any) -> None:
        busy = sorted(self._in_flight.intersection(workers))
        if busy:
            raise RuntimeError(f"the envs of worker(s) {busy} are in flight (send/async_reset): recv() them first")


def _take(infos: dict[str, Any], ids: np.ndarray, n: int) -> dict[str, Any]:
    """``infos`` of a vector env of ``n`` envs restricted to the envs ``ids`` (nested dicts included)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if isinstance(value, dict):
            out[key] = _take(value, ids, n)
        elif isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n:
            out[key] = value[ids]
        else:
            out[key] = value
    return out
