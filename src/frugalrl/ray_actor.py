"""One Ray actor body for every frugalrl user of Ray (ClusterEnv's Ray backend, DPSGD's Ray transport), and
the head-side helpers that start, await and kill such actors.

Design. A worker actor is built from the bytes of an encoded ``config`` :class:`~frugalrl.wire.Message`
(JSON meta, as a local child's config) and the head's ``sys.path`` (so that modules the head imports
from a file system the nodes share, such as tests or the user's code, import in the actor too). Its
:meth:`ActorBody.build` makes the worker object; an exception there is kept, not raised, and
:meth:`ActorBody.ready` answers with it as an ``error`` message (:func:`frugalrl.process.error_message`:
a ValueError of the actor can stay a ValueError at the head) or with ``ready``: the same handshake as a
local child's (:mod:`frugalrl.process`), with the same bytes. Where the actor runs (process id, Ray node
id and IP address) comes from :meth:`ActorBody.node`, beside the handshake, so that the handshake costs the
same on every transport. Ray only ever moves ``bytes`` of our messages: nothing of ours is pickled.

On the head, :func:`start_actor` starts one actor (never restarted by Ray: a dead worker is frugalrl's to report
or replace), :func:`await_ready` waits for its handshake and raises an error naming the worker, and
:func:`kill_actor` ends it. Ray is optional: only the modules of its users import this one.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayError

from frugalrl.process import child_error, error_message
from frugalrl.wire.message import Message, decode_message, encode_message

W = TypeVar("W")


class ActorBody(Generic[W]):
    """The common body of a frugalrl worker actor; a subclass says how to :meth:`build` its worker and adds
    the methods the head calls. Started by :func:`start_actor` (which wraps it with ``ray.remote``)."""

    def __init__(self, config: bytes, paths: list[str]) -> None:
        # Modules the head can import (tests, the user's own) on a node that shares its file system; the
        # actor's own child processes inherit this path.
        for p in reversed(paths):
            if p not in sys.path and os.path.isdir(p):
                sys.path.insert(0, p)
        self.worker: W | None = None
        try:
            self.worker = self.build(decode_message(config)[0].meta)
        except Exception as e:  # noqa: BLE001 - reported to the head by ready()
            self._answer = error_message(e)
        else:
            self._answer = Message("ready")

    def build(self, config: dict[str, Any]) -> W:
        """The worker object of this actor, from its config."""
        raise NotImplementedError

    def ready(self) -> bytes:
        """The encoded handshake: ``ready``, or the ``error`` the worker could not be built with."""
        return encode_message(self._answer)[0]

    def node(self) -> dict[str, Any]:
        """Where this actor runs: ``pid``, Ray ``node_id`` and ``node_ip``."""
        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
        }



def start_actor(
    body: type[ActorBody],
    config: Message,
    *args: Any,
    num_cpus: float,
    max_concurrency: int | None = None,
) -> tuple[Any, dict[str, int]]:
    """Start an actor of ``body`` built from ``config`` (and ``args``, after the config and the head's
    ``sys.path``); return its handle and the config's size by byte-meter kind. The actor reserves
    ``num_cpus`` CPUs, is spread across nodes and never restarted by Ray; ``max_concurrency`` lets
    methods of the actor run at once (one at a time by default)."""
    remote = ray.remote(body)  # made anew each time: a class made for an earlier Ray instance may not be known
    blob, sizes = encode_message(config)
    options: dict[str, Any] = {
        "num_cpus": num_cpus,
        "scheduling_strategy": "SPREAD",
        "max_restarts": 0,
        "max_task_retries": 0,
    }
    if max_concurrency is not None:
        options["max_concurrency"] = max_concurrency
    return remote.options(**options).remote(blob, [p for p in sys.path if p], *args), sizes


def await_ready(
    actor: Any,
    name: str,
    timeout: float,
    *,
    deadline: float | None = None,
    error: type[Exception] = RuntimeError,
    keep_value_error: bool = False,
    hint: str = "",
    refused: type[Exception] | None = None,
) -> tuple[Message, dict[str, int], dict[str, Any]]:
    """Wait for the handshake of ``actor`` (``name``: ``"worker 3"``) for ``timeout`` seconds (or until
    ``deadline``, a ``time.monotonic()``); return the ``ready`` message, its sizes by byte-meter kind and
    :meth:`ActorBody.node`'s answer. Raises ``error`` naming the worker when it does not start in time (``hint``
    says what to check) or dies, and :func:`frugalrl.process.child_error` (of class ``refused``, default ``error``)
    when its worker could not be built."""
    if deadline is None:
        deadline = time.monotonic() + timeout
    try:
        blob, info = ray.get([actor.ready.remote(), actor.node.remote()],
                             timeout=max(0.0, deadline - time.monotonic()))
    except GetTimeoutError:
        raise error(
            f"{name} (Ray actor) did not start within {timeout:g} s (not enough free CPUs in the Ray cluster?"
            f"{' ' + hint if hint else ''})"
        ) from None
    except RayError as e:
        raise error(f"{name} (Ray actor) died while starting: {first_line(e)}") from e
    msg, sizes = decode_message(blob)
    if msg.op == "error":
        raise child_error(name, msg.meta, refused or error, keep_value_error)
    return msg, sizes, dict(info)


def kill_actor(actor: Any) -> None:
    """End ``actor`` for good (nothing if it is already gone)."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone, or Ray already shut down
        pass


def first_line(e: BaseException) -> str:
    """The first line of a (often long, multi-line) Ray error."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
