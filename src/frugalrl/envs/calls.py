"""Gymnasium's ``call``, ``get_attr`` and ``set_attr`` on ClusterEnv's remote envs (:class:`EnvCalls`, a base class).

The name and the arguments go to the workers as JSON; what comes back is data, never a pickle: JSON values (numbers,
strings, lists, dicts, None) in the reply's header and NumPy arrays as arrays. A result that is neither (a space, an
object) is refused with a clear error. The attributes the head knows itself (the spaces, ``spec``, ``metadata``,
``render_mode``) are answered without a message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from frugalrl.envs.spaces import pack_value, unpack_value
from frugalrl.wire.message import Message

if TYPE_CHECKING:
    import gymnasium as gym

HEAD_ATTRS = ("observation_space", "action_space", "spec", "metadata", "render_mode")
"""Attributes :meth:`EnvCalls.get_attr` answers from the head's own copy (the same for every env)."""


class EnvCalls:
    """``call`` / ``get_attr`` / ``set_attr`` of :class:`~frugalrl.envs.cluster.ClusterEnv`, as Gymnasium's vector
    envs have them (results in env order, one per env)."""

    num_workers: int
    envs_per_worker: int
    num_envs: int
    single_observation_space: gym.Space
    single_action_space: gym.Space

    if TYPE_CHECKING:  # ClusterEnv's, declared for the type checker only
        spec: Any
        metadata: dict[str, Any]
        render_mode: str | None

        def _check_open(self) -> None: ...
        def _request(self, requests: dict[int, Message],
                     on_failure: Callable[[int, str], Message | None]) -> dict[int, Message]: ...
        def _restart(self, w: int, reason: str) -> None: ...
        def _reset_worker(self, w: int, seed: int | None, defer: bool = False) -> Message: ...

    def call(self, name: str, *args: Any, envs: Sequence[int] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (of ``envs``, indices, if given) with JSON arguments, or read attribute
        ``name`` where it is not callable; returns the results in env order."""
        return self._remote(name, "call", envs, args=list(args), kwargs=kwargs)

    @property
    def np_random_seed(self) -> tuple[Any, ...]:
        """Every env's ``np_random_seed``, as AsyncVectorEnv's."""
        return self.get_attr("np_random_seed")

    def get_attr(self, name: str, envs: Sequence[int] | None = None) -> tuple[Any, ...]:
        """Attribute ``name`` of every env (of ``envs``), found through the env's wrappers as Gymnasium's
        ``get_wrapper_attr`` finds it."""
        if name in HEAD_ATTRS:
            one = {"observation_space": self.single_observation_space, "action_space": self.single_action_space,
                   "spec": self.spec, "metadata": self.metadata, "render_mode": self.render_mode}[name]
            return tuple(one for _ in (range(self.num_envs) if envs is None else envs))
        return self._remote(name, "get", envs)

    def set_attr(self, name: str, values: Any | list[Any] | tuple[Any, ...], envs: Sequence[int] | None = None) -> None:
        """Set attribute ``name`` of every env (of ``envs``) to ``values``: one JSON value for all, or one per env. It
        is set on the outermost wrapper that has it (``set_wrapper_attr``); a wrapper's copy in the head is not."""
        targets = list(range(self.num_envs)) if envs is None else list(envs)
        per_env = list(values) if isinstance(values, list | tuple) else [values] * len(targets)
        if len(per_env) != len(targets):
            raise ValueError(f"set_attr({name!r}) got {len(per_env)} values for {len(targets)} envs")
        self._remote(name, "set", targets, values=dict(zip(targets, per_env, strict=True)))

    def _remote(self, name: str, mode: str, envs: Sequence[int] | None, **payload: Any) -> tuple[Any, ...]:
        self._check_open()
        targets = list(range(self.num_envs)) if envs is None else [int(j) for j in envs]
        if any(not 0 <= j < self.num_envs for j in targets):
            raise IndexError(f"env indices must lie in [0, {self.num_envs}), got {targets}")
        k = self.envs_per_worker
        requests: dict[int, Message] = {}
        for w in sorted({j // k for j in targets}):
            mine = [j - w * k for j in targets if j // k == w]
            meta = {"name": name, "mode": mode, "envs": mine, "args": payload.get("args", []),
                    "kwargs": payload.get("kwargs", {})}
            if mode == "set":
                meta["values"] = [payload["values"][w * k + i] for i in mine]
            try:
                json.dumps(meta)
            except TypeError as e:
                raise ValueError(f"{mode}({name!r}): arguments must be JSON values to reach the workers ({e})") from None
            requests[w] = Message("call", meta)

        def recover(w: int, reason: str) -> Message:  # a replaced worker answers for its fresh envs
            self._restart(w, reason)
            self._reset_worker(w, seed=None)
            return requests[w]

        replies = self._request(requests, on_failure=recover)
        results: dict[int, Any] = {}
        for w, reply in replies.items():
            for i, (local, value) in enumerate(zip(requests[w].meta["envs"], reply.meta["results"], strict=True)):
                if value.get("missing"):
                    raise AttributeError(f"env {w * k + local} has no attribute {name!r} (nor do its wrappers)")
                if "packed" in value:
                    results[w * k + local] = unpack_value(value["packed"], reply.arrays)
                else:
                    results[w * k + local] = reply.arrays[f"r/{i}"] if value.get("array") else value["value"]
        return tuple(results[j] for j in targets)


def call_envs(envs: list[Any], meta: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """The worker's side of a ``call`` message on its ``envs``: results as JSON entries and arrays."""
    name, mode = meta["name"], meta["mode"]
    entries: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    for i, local in enumerate(meta["envs"]):
        env = envs[local]
        if mode == "set":
            env.set_wrapper_attr(name, meta["values"][i])
            entries.append({"value": None})
            continue
        try:
            value = env.get_wrapper_attr(name)
        except AttributeError:
            entries.append({"missing": True})
            continue
        if mode == "call" and callable(value):
            value = value(*meta["args"], **meta["kwargs"])
        if isinstance(value, np.ndarray) and value.dtype != object:
            arrays[f"r/{i}"] = value
            entries.append({"array": True})
            continue
        if isinstance(value, np.generic):
            value = value.item()
        try:
            json.dumps(value)
        except TypeError:
            try:  # a list of frames, a tuple of arrays...: :mod:`frugalrl.envs.spaces`'s data
                entries.append({"packed": pack_value(value, f"r/{i}", arrays)})
            except TypeError:
                raise TypeError(f"{name!r} of env {local} is a {type(value).__name__}, which cannot travel back as "
                                "data (JSON values, NumPy arrays, and tuples, lists and dicts of them can)") from None
            continue
        entries.append({"value": value})
    return entries, arrays
