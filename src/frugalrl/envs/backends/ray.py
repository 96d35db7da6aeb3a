"""The Ray backend: one Ray actor per worker, possibly on other machines of a Ray cluster.

Each actor (:class:`EnvActor`, on the common body of :mod:`frugalrl.ray_actor`, which also gives the
start, the ready/error handshake and the errors naming a worker) wraps an
:class:`~frugalrl.envs.worker.EnvWorker`. Its one method takes the bytes of an
encoded :class:`~frugalrl.wire.Message` (:func:`~frugalrl.wire.message.encode_message`) and returns
the encoded reply, so Ray only ever moves ``bytes``: nothing of ours is pickled and the byte meter
counts exactly the logical bytes the local backend counts (with the same header numbers: the head and each actor
keep the link's :class:`~frugalrl.wire.headers.HeaderBook` pair, new with each actor). The worker's config travels as a JSON
message, as for the local backend (env factories must be importable by the actors: a Gymnasium id, a
``"module:function"`` path, or a module-level function of a module installed on every node).

A message of more than :func:`inline_bytes` sent in full to several workers (weights, mostly, while their header
is new: a header that crossed twice crosses as a number of each link's own) is put in Ray's object store once and
the same ``ObjectRef`` is handed to every actor; a smaller one travels inside each actor call's request, as Ray
sends small arguments (a reference would cost the worker's node a fetch, round trips of its own). Replies are gathered with ``ray.wait`` under the backend's
timeout: an actor that dies comes back as a :class:`~frugalrl.envs.backends.base.WorkerFailure`, one
that stays silent too, after ``timeout`` seconds (and is killed), so the head never hangs.

Ray itself (a Ray this process already runs, the cluster at ``ray_address``, or a private single-machine one) is
:mod:`frugalrl.ray_session`'s, shared with DPSGD's Ray transport. Actors are spread across nodes and reserve
``num_cpus`` CPUs each (1 by default).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError, RayError

from frugalrl import ray_session
from frugalrl.envs.backends.base import (
    Backend,
    WorkerFailure,
    WorkerStartFailed,
    config_to_json,
    worker_from_json,
)
from frugalrl.ray_actor import ActorBody, await_ready, kill_actor, start_actor
from frugalrl.wire import headers
from frugalrl.wire.headers import HeaderBook
from frugalrl.wire.message import Message, decode_message, encode_message
from frugalrl.wire.meter import DOWN, UP, ByteMeter

if TYPE_CHECKING:
    from frugalrl.envs.backends.base import WorkerConfig
    from frugalrl.envs.worker import EnvWorker


def inline_bytes() -> int:
    """Ray's ``max_direct_call_object_size`` (its ``RAY_max_direct_call_object_size`` variable, else its default of
    100 KiB): an argument up to this size goes inside the task's request, a larger one through the object store,
    from which the worker's node fetches it. Read in this process's environment: a value set through
    ``ray.init(_system_config=...)``, or only in a remote cluster's environment, is not seen."""
    return int(os.environ.get("RAY_max_direct_call_object_size", 100 * 1024))  # noqa: SIM112 - Ray spells it so


class EnvActor(ActorBody["EnvWorker"]):
    """The body of a worker actor: an :class:`~frugalrl.envs.worker.EnvWorker` answering encoded requests."""

    def build(self, config: dict[str, Any]) -> EnvWorker:
        """The worker of a :func:`~frugalrl.envs.backends.base.config_to_json` config (one torch thread, if it ever
        imports torch: as a local worker process, only for a policy numpy does not run)."""
        from frugalrl.envs import worker

        worker.ONE_TORCH_THREAD = True
        self.books = (HeaderBook(), HeaderBook())  # down, up: this link's, as the head keeps them
        return worker_from_json(config)

    def handle(self, blob: bytes) -> bytes:
        """Decode a request, answer it, encode the reply."""
        assert self.worker is not None, "handle() on an actor whose worker could not be built"
        down, up = self.books
        request, crossing = headers.unpack(blob, down)
        msg, sizes = decode_message(request)
        headers.received(down, crossing, sizes)
        return headers.pack(*encode_message(self.worker.handle(msg)), up)[0]

    def close(self) -> None:
        """Close the envs."""
        if self.worker is not None:
            self.worker.close()


class RayBackend(Backend):
    """Workers in Ray actors."""

    name = "ray"

    def __init__(
        self,
        configs: list[WorkerConfig],
        meter: ByteMeter,
        timeout: float,
        address: str | None = None,
        num_cpus: float = 1.0,
    ) -> None:
        super().__init__(configs, meter, timeout)
        if not num_cpus >= 0:
            raise ValueError(f"ray_num_cpus must be >= 0, got {num_cpus!r}")
        self.address = address
        self.num_cpus = float(num_cpus)
        self._inline_bytes = inline_bytes()  # read once: every request checks against it
        self._configs = [Message("config", config_to_json(c, "ray")) for c in configs]
        self.actors: list[Any] = [None] * len(configs)
        self._info: list[dict[str, Any]] = [{} for _ in configs]
        self._books: list[tuple[HeaderBook, HeaderBook]] = [(HeaderBook(), HeaderBook()) for _ in configs]  # down, up
        self._owns_ray = False
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> dict[int, str]:
        """Connect to (or start) Ray, start every actor and wait until each has built its envs (an actor that dies
        while starting is an error here: Ray already retried placing it)."""
        self._owns_ray = ray_session.acquire(self.address, self.num_workers * self.num_cpus)
        try:
            for w in range(self.num_workers):
                self._spawn(w)
            for w in range(self.num_workers):
                self._await_ready(w)
        except BaseException:
            self.close()
            raise
        return {}

    def _spawn(self, w: int) -> None:
        self.actors[w], _ = start_actor(EnvActor, self._configs[w], num_cpus=self.num_cpus)
        self._books[w] = (HeaderBook(), HeaderBook())  # a new link: both ends start with empty books

    def _await_ready(self, w: int, refused: type[Exception] | None = None) -> None:
        _, _, self._info[w] = await_ready(self.actors[w], f"worker {w}", max(self.timeout, 60.0), hint="see ray_num_cpus",
                                          refused=refused)

    def restart(self, worker: int) -> None:
        """Kill (if needed) and replace one actor."""
        self._posted.pop(worker, None)
        self._kill(worker)
        self._spawn(worker)
        try:  # an env that cannot be built now is for the crash-loop rule; an actor that no node takes (its node
            self._await_ready(worker, refused=WorkerStartFailed)  # is gone) fails the run after the start floor
        except WorkerStartFailed:
            self._kill(worker)
            raise

    def _kill(self, w: int) -> None:
        actor, self.actors[w] = self.actors[w], None
        self._info[w] = {}
        if actor is not None:
            kill_actor(actor)

    def close(self) -> None:
        """Kill every actor; shut Ray down (or disconnect) if frugalrl started it and this is its last user."""
        if self._closed:
            return
        self._closed = True
        if ray.is_initialized():
            for w in range(self.num_workers):
                self._kill(w)
        ray_session.release(self._owns_ray)
        self._owns_ray = False

    def worker_pids(self) -> dict[int, int]:
        """Process id of each live actor (on its own node)."""
        return {w: info["pid"] for w, info in enumerate(self._info) if "pid" in info}

    def worker_rss_mb(self) -> dict[int, float]:
        """Resident memory (MB) of the actors on this node only: an actor's pid on another node names some other
        process here (its memory bound then does not apply; Ray's own memory monitor watches each node)."""
        here = ray.get_runtime_context().get_node_id()
        local = {w for w, info in enumerate(self._info) if info.get("node_id") == here}
        return {w: mb for w, mb in super().worker_rss_mb().items() if w in local}

    def worker_nodes(self) -> dict[int, dict[str, str]]:
        """Ray node id and IP address of each live actor."""
        return {w: {"node_id": i["node_id"], "node_ip": i["node_ip"]} for w, i in enumerate(self._info) if "pid" in i}

    # ------------------------------------------------------------------ messaging
    def request(self, requests: dict[int, Message]) -> dict[int, Message | WorkerFailure]:
        """Send every request, then gather replies; dead or silent actors become failures."""
        if self._closed:
            raise RuntimeError("backend is closed")
        results: dict[int, Message | WorkerFailure] = {}
        # Encode each distinct message once; one shared by several workers goes to the object store
        # once and every actor gets the same reference.
        encoded: dict[int, tuple[Any, dict[str, int]]] = {}
        count: dict[int, int] = {}
        for msg in requests.values():
            count[id(msg)] = count.get(id(msg), 0) + 1
        for msg in requests.values():
            if id(msg) not in encoded:
                blob, sizes = encode_message(msg)
                encoded[id(msg)] = (blob, sizes)
        shared: dict[int, Any] = {}
        pending: dict[Any, int] = {}  # ObjectRef -> worker
        for w, msg in requests.items():
            actor = self.actors[w]
            if actor is None:
                results[w] = WorkerFailure(w, "actor is not running")
                continue
            blob, sizes = encoded[id(msg)]
            payload, sizes = headers.pack(blob, sizes, self._books[w][0])
            if payload is blob and count[id(msg)] > 1 and len(blob) > self._inline_bytes:  # to the object store once
                if id(msg) not in shared:
                    shared[id(msg)] = ray.put(blob)
                payload = shared[id(msg)]
            pending[actor.handle.remote(payload)] = w
            self.meter.add_message(sizes, w, DOWN)
        deadline = time.monotonic() + self.timeout
        while pending:
            left = deadline - time.monotonic()
            # A dead actor's reply is an error object, ready at once: only a silent actor runs out the clock.
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=max(0.0, left))
            if not ready and left <= 0:
                for w in pending.values():
                    results[w] = WorkerFailure(w, f"no reply within {self.timeout:.0f} s")
                    self._kill(w)
                break
            try:  # one round trip for every ready reply; a failed one sends us reply by reply
                blobs = dict(zip(ready, ray.get(ready), strict=True))
            except RayError:
                blobs = {}
            for ref in ready:
                w = pending.pop(ref)
                try:
                    blob = blobs[ref] if ref in blobs else ray.get(ref)
                except RayActorError as e:
                    results[w] = WorkerFailure(w, f"Ray actor died: {type(e).__name__}")
                    continue
                except RayError as e:
                    results[w] = WorkerFailure(w, f"Ray error: {type(e).__name__}: {e}")
                    continue
                data, crossing = headers.unpack(blob, self._books[w][1])
                reply, sizes = decode_message(data)
                self.meter.add_message(headers.received(self._books[w][1], crossing, sizes), w, UP)
                results[w] = reply
        # In request order, as the other backends answer.
        return {w: results[w] for w in requests}
