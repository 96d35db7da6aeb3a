"""The Ray transport of DPSGD: one Ray actor per worker, possibly on other machines of a Ray cluster.

The :class:`~frugalrl.dpsgd.server.ParameterServer` stays in the calling process, exactly as with the local
transport. A Ray actor cannot call a plain driver process back, so the head *drives* the workers: each worker actor
(:class:`DPSGDActor`, on the common body of :mod:`frugalrl.ray_actor`) runs an unchanged
:class:`~frugalrl.dpsgd.worker.DPSGDWorker` loop (its Hogwild helpers on the actor's node) in a thread, and the
head calls ``actor.exchange(reply) -> next request`` in one thread per worker, answering each request with
:meth:`ParameterServer.handle`. Ray only moves ``bytes`` of encoded :class:`~frugalrl.wire.Message` s, so nothing
is pickled and a run counts exactly the same bytes as on the local transport. A dead or silent worker is replaced
by a new actor as on the local transport (:meth:`~frugalrl.dpsgd.transport.Transport._replace`, its crash-loop rule
included); Ray itself is :mod:`frugalrl.ray_session`'s, shared with ClusterEnv's Ray backend. The design in
full: docs/dpsgd.md#the-ray-transport.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from frugalrl import ray_session
from frugalrl.dpsgd.transport import DPSGDError, Transport
from frugalrl.dpsgd.worker import DPSGDWorker
from frugalrl.process import ParentGone, error_message
from frugalrl.ray_actor import ActorBody, await_ready, first_line, kill_actor, start_actor
from frugalrl.wire.message import Message, WireError, decode_message, encode_message
from frugalrl.wire.meter import DOWN, UP

_OBJECT_STORE_BYTES = 128 * 1024**2  # object store of a private instance (larger messages spill to disk)
_POLL_S = 0.5  # how often a waiting head thread looks at the clock and at close()


# ---------------------------------------------------------------------------------------- the actor
class DPSGDActor(ActorBody[DPSGDWorker]):
    """The body of a worker actor: a :class:`DPSGDWorker` built from the config (see
    :class:`~frugalrl.ray_actor.ActorBody`) whose loop, on the first :meth:`exchange`, runs in a thread
    whose ``exchange`` is the pair of queues below."""

    def __init__(self, config: bytes, paths: list[str], startup_timeout: float) -> None:
        self.startup_timeout = startup_timeout
        self._requests: queue.Queue[bytes | None] = queue.Queue()  # worker -> head; None: loop ended
        self._replies: queue.Queue[bytes | None] = queue.Queue()  # head -> worker; None: closing
        self._closing = False
        self._thread: threading.Thread | None = None
        super().__init__(config, paths)

    def build(self, config: dict[str, Any]) -> DPSGDWorker:
        """The worker and its Hogwild helper processes (on this actor's node)."""
        return DPSGDWorker(config, self.startup_timeout)

    def exchange(self, reply: bytes | None) -> bytes:
        """Give the worker the server's ``reply`` (None: start the loop) and return its next request
        (``b""`` once the loop has ended)."""
        if reply is None:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dpsgd-worker", daemon=True)
                self._thread.start()
        else:
            self._replies.put(reply)
        request = self._requests.get()
        return b"" if request is None else request

    def _run(self) -> None:
        try:
            if self.worker is None:
                raise RuntimeError("the worker could not be built")
            self.worker.run(self._exchange)
        except ParentGone:
            pass
        except BaseException as e:  # noqa: BLE001 - the head fails the run with it
            self._requests.put(encode_message(error_message(e))[0])
        finally:
            self._requests.put(None)

    def _exchange(self, msg: Message) -> Message:
        """The worker's ``exchange``: hand ``msg`` to the head's pending call, wait for the reply."""
        if self._closing:
            raise ParentGone("the transport is closing")
        self._requests.put(encode_message(msg)[0])
        reply = self._replies.get()
        if reply is None:
            raise ParentGone("the transport is closing")
        return decode_message(reply)[0]

    def shutdown(self, timeout: float) -> None:
        """End the loop (killing Hogwild helpers that do not finish their round), then close the worker."""
        self._closing = True
        self._replies.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self.worker is not None:
                for helper in self.worker.pool.helpers:  # a hung helper: its worker then sees it die
                    helper.kill()
                self._thread.join(1.0)
            if self._thread.is_alive():
                return  # stuck in the problem's own code: ray.kill ends it (helpers exit with it)
        if self.worker is not None:
            self.worker.close()
            self.worker = None


# ---------------------------------------------------------------------------------------- the transport
class RayTransport(Transport):
    """Workers in Ray actors; the server in this process (see the module docstring)."""

    name = "ray"

    def __init__(
        self,
        *args: Any,
        ray_address: str | None = None,
        num_cpus: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if num_cpus is not None and not num_cpus >= 0:
            raise ValueError(f"num_cpus must be >= 0, got {num_cpus!r}")
        self.address = ray_address
        self.num_cpus = num_cpus
        self.actors: list[Any] = [None] * len(self.configs)
        self._info: dict[int, dict[str, Any]] = {}  # worker -> pid, node_id, node_ip of its actor
        self._threads: list[threading.Thread] = []
        self._done = [False] * len(self.configs)
        self._last: dict[int, Any] = {}  # worker -> its final exchange call (the one that carried ``stop``)
        self._counted = False  # whether this transport counts as a user of the Ray instance (ray_session)

    def _cpus(self, cfg: dict[str, Any]) -> float:
        return float(cfg["processes"]) if self.num_cpus is None else float(self.num_cpus)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Connect to (or start) Ray, start every actor and wait until each has built its worker."""
        try:
            self._counted = ray_session.acquire(
                self.address, sum(self._cpus(c) for c in self.configs), _OBJECT_STORE_BYTES
            )
            for w, cfg in enumerate(self.configs):
                self.actors[w], sizes = self._launch(w, cfg)
                self.meter.add_message(sizes, w, DOWN)
            deadline = time.monotonic() + self.startup_timeout
            for w, actor in enumerate(self.actors):
                self.meter.add_message(self._await_ready(w, actor, deadline), w, UP)
        except BaseException:
            self.close()
            raise

    def serve(self) -> None:
        """Start every worker's loop and one head thread per worker answering its requests."""
        for w, actor in enumerate(self.actors):
            thread = threading.Thread(target=self._serve, args=(w, actor), name=f"dpsgd-ray-{w}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, w: int, actor: Any) -> None:
        """Answer worker ``w`` until it is told to stop or the transport closes; a worker that dies, goes silent,
        breaks the protocol or (``on_env_error="restart"``) reports an error is replaced
        (:meth:`~frugalrl.dpsgd.transport.Transport._replace`)."""
        try:
            ref = actor.exchange.remote(None)
            while not self._closing:
                blob = self._receive(w, ref)
                if blob is None:
                    return
                if isinstance(blob, str):  # why the worker must be replaced
                    failed: str | None = blob
                else:
                    try:
                        msg, sizes = decode_message(blob)
                    except WireError as e:
                        failed = f"sent a malformed message ({e})"
                    else:
                        failed = self.env_error_to_restart(w, msg, sizes)
                if failed is not None:
                    actor = self._replace(w, actor, failed)
                    if actor is None:
                        return
                    ref = actor.exchange.remote(None)
                    continue
                reply = self.answer(w, msg, sizes)
                out, sizes = encode_message(reply)
                ref = actor.exchange.remote(out)
                self.meter.add_message(sizes, w, DOWN)
                if reply.op == "stop":
                    self._last[w] = ref
                    return
        except Exception as e:  # noqa: BLE001 - a Ray call's own error (object store, GCS): the run fails with it
            self._serve_failed(w, e)
        finally:
            self._done[w] = True

    def _receive(self, w: int, ref: Any) -> bytes | str | None:
        """The worker's next request; why the worker must be replaced if there is none; None if the transport is
        closing."""
        last = time.monotonic()
        while True:
            ready, _ = ray.wait([ref], timeout=_POLL_S)
            if ready:
                break
            if self._closing:
                return None
            if self.worker_timeout is not None and time.monotonic() - last > self.worker_timeout:
                return f"no message for {self.worker_timeout:g} s: the worker is hung"
        try:
            blob = ray.get(ref)
        except RayActorError as e:
            return None if self._closing else f"Ray actor (pid {self._info.get(w, {}).get('pid')}) died: {first_line(e)}"
        except RayError as e:
            return None if self._closing else f"Ray error: {type(e).__name__}: {first_line(e)}"
        if not blob:
            return None if self._closing else "the worker's loop ended without being told to stop"
        return blob

    def finished(self) -> bool:
        """Whether every head thread has ended."""
        return bool(self._threads) and all(self._done)

    def close(self) -> None:
        """End the head threads, let the workers end their round (up to 3 s), close them, kill the actors."""
        starting = self._begin_close()
        if starting is None:
            return
        self.server.stop("closed")  # releases head threads waiting in a synchronous pull
        for actor in starting:  # replacements still starting: their threads leave them to this
            kill_actor(actor)
        for thread in self._threads:
            thread.join(timeout=2.0)
        if ray.is_initialized():
            # Workers told to stop end their loop by themselves; after a failure nothing is worth waiting for.
            if self.server.failure is None and self._last:
                ray.wait(list(self._last.values()), num_returns=len(self._last), timeout=3.0)
            with self._lock:  # a head thread replaces no actor from now on (it sees _closing)
                live = [a for a in self.actors if a is not None]
            grace = 1.0 if self.server.failure is None else 0.2  # to end the round before helpers are killed
            _shutdown(live, grace)
        self.actors = [None] * len(self.configs)
        ray_session.release(self._counted)
        self._counted = False

    # ------------------------------------------------------------------ Transport._replace's hooks
    def _launch(self, w: int, config: dict[str, Any]) -> tuple[Any, dict[str, int]]:
        try:
            return start_actor(
                DPSGDActor,
                Message("config", config),
                self.startup_timeout,
                num_cpus=self._cpus(config),
                max_concurrency=4,  # exchange blocks while the worker computes; ready/node/shutdown get through
            )
        except RayError as e:
            raise OSError(f"Ray could not start an actor: {first_line(e)}") from e

    def _await_ready(self, w: int, worker: Any, deadline: float | None = None) -> dict[str, int]:
        _, sizes, self._info[w] = await_ready(
            worker, f"worker {w}", self.startup_timeout, deadline=deadline, error=DPSGDError,
            keep_value_error=True, hint="see num_cpus",
        )
        return sizes

    def _discard(self, worker: Any) -> None:
        _shutdown([worker], 0.2)

    def _set_worker(self, w: int, worker: Any) -> None:
        self.actors[w] = worker

    # ------------------------------------------------------------------ introspection
    def worker_pids(self) -> dict[int, int]:
        """Process id of each worker actor (on its own node)."""
        return {w: int(info["pid"]) for w, info in self._info.items()}

    def worker_nodes(self) -> dict[int, dict[str, str]]:
        """Ray node id and IP address of each live worker actor."""
        return {
            w: {"node_id": info["node_id"], "node_ip": info["node_ip"]}
            for w, info in self._info.items()
            if self.actors[w] is not None
        }


def _shutdown(actors: list[Any], grace: float) -> None:
    """Let each actor end its round for ``grace`` seconds and close its worker (its Hogwild helpers killed if
    they do not finish), waiting up to 5 s in all, then kill the actors."""
    refs = []
    for actor in actors:
        try:
            refs.append(actor.shutdown.remote(grace))
        except RayError:
            pass
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=5.0)
    for actor in actors:
        kill_actor(actor)
