"""DPSGD's transports: how the workers are started and how their messages reach the parameter server.

The server (:class:`~frugalrl.dpsgd.server.ParameterServer`) lives in the calling process. A
:class:`Transport` starts the workers and carries their messages to it; every message is a
:class:`~frugalrl.wire.Message` counted on a :class:`~frugalrl.wire.ByteMeter` (the ``config`` down and
the ``ready`` up at start, then pulls as ``weights`` down, pushes as ``gradients`` up, headers and
commands as ``control``): the same logical bytes on every transport.

:class:`LocalTransport` runs each worker (:class:`~frugalrl.dpsgd.worker.DPSGDWorker`) as a child of
:mod:`frugalrl.process` (its own process group, with its Hogwild helpers; one BLAS thread) with a socket
pair to the server and one server thread per connection; the Ray transport
(:class:`~frugalrl.dpsgd.ray_transport.RayTransport`) runs them in Ray actors instead. On both, a worker that
dies (seen at once) or sends nothing for ``worker_timeout`` seconds is replaced (:meth:`Transport._replace`) by a
new one from its config (a new seed, so new episodes), under ClusterEnv's crash-loop rule
(:class:`~frugalrl.envs.restarts.CrashLoopRule`: at once after a push, with back-off before one, the run failing
with a :class:`DPSGDError` naming it past ``crash_loop_tries`` in a row). An error a worker reports (its env
raised) fails the run, or with ``on_env_error="restart"`` replaces it too. The server never misses it: a
replacement holds no parameters, so it pulls a full copy of the current ``v``, and in synchronous mode pushes for
the round its predecessor left.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, Literal

from frugalrl.dpsgd.server import ParameterServer
from frugalrl.envs.restarts import CrashLoopRule, WorkersFailed
from frugalrl.process import Child, spawn
from frugalrl.wire.message import Message, WireError
from frugalrl.wire.meter import DOWN, UP, ByteMeter

_ENTRY = "frugalrl.dpsgd.worker:worker_entry"

log = logging.getLogger("frugalrl")


class DPSGDError(RuntimeError):
    """A DPSGD run failed: a worker died, hung, or broke the protocol."""


class Transport(ABC):
    """Starts the workers and carries their messages to :meth:`ParameterServer.handle`.

    Every message is counted on ``meter`` (``UP``: worker to server, ``DOWN``: server to worker).
    Failures (a dead or silent worker) go to :meth:`ParameterServer.fail`, which stops the run.
    """

    name = "base"

    def __init__(
        self,
        server: ParameterServer,
        meter: ByteMeter,
        configs: list[dict[str, Any]],
        startup_timeout: float,
        worker_timeout: float | None,
        crash_loop_tries: int = 8,
        on_env_error: str = "raise",
    ) -> None:
        self.server = server
        self.meter = meter
        self.configs = configs
        self.startup_timeout = startup_timeout
        self.worker_timeout = worker_timeout
        self.restart_rule = CrashLoopRule(len(configs), max_tries=crash_loop_tries)
        self.on_env_error = on_env_error
        self.restart_events: list[dict[str, Any]] = []
        """Each worker replaced: ``{worker, reason, time, seconds}``."""
        self.gave_up: WorkersFailed | None = None
        """The crash-loop rule's verdict on a worker that kept failing, which stopped the run."""
        # A replacement is started by its worker's thread while close() may run: whoever takes a worker out of the
        # transport's list or _starting under this lock stops it, so that none is stopped twice or left behind.
        self._lock = threading.Lock()
        self._starting: dict[int, Any] = {}
        self._closed = threading.Event()  # set by close(): no worker is replaced from then on; wakes a back-off

    @property
    def _closing(self) -> bool:
        return self._closed.is_set()

    @abstractmethod
    def start(self) -> None:
        """Start every worker and return once all are ready; raise a clear error otherwise."""

    @abstractmethod
    def serve(self) -> None:
        """Begin answering the workers' requests (returns at once)."""

    @abstractmethod
    def finished(self) -> bool:
        """Whether every worker has been told to stop (or has failed)."""

    @abstractmethod
    def close(self) -> None:
        """Stop every worker and release everything; idempotent."""

    def worker_pids(self) -> dict[int, int]:
        """Operating-system process ids of the workers, where there are any."""
        return {}

    def answer(self, w: int, msg: Message, sizes: dict[str, int]) -> Message:
        """Count request ``msg`` of worker ``w`` (``sizes`` by byte-meter kind) and return the server's reply;
        a request the server refuses fails the run and is answered ``stop``. A push the server takes is the
        worker's success for the crash-loop rule."""
        self.meter.add_message(sizes, w, UP)
        try:
            reply = self.server.handle(w, msg)
        except (ValueError, RuntimeError, KeyError) as e:
            kind = "ValueError" if isinstance(e, ValueError) else "RuntimeError"
            self.server.fail(None, str(e), kind)
            return Message("stop", {"reason": "failure"})
        if msg.op == "push" and reply.op != "stop":
            self.restart_rule.succeeded(w)
        return reply

    def env_error_to_restart(self, w: int, msg: Message, sizes: dict[str, int]) -> str | None:
        """Why worker ``w`` must be replaced if ``msg`` is its env's error and ``on_env_error="restart"`` (the
        message is then counted here, not answered); None for any other message."""
        if msg.op != "error" or not msg.meta.get("env") or self.on_env_error != "restart" or self.server.stopped:
            return None
        self.meter.add_message(sizes, w, UP)
        return f"{msg.meta.get('type', 'RuntimeError')}: {msg.meta.get('error')}"

    # ------------------------------------------------------------------ replacing a worker
    def _replace(self, w: int, old: Any, reason: str) -> Any | None:
        """A new worker ``w`` (whose ``old`` one failed with ``reason``) under the crash-loop rule, or None when
        the run has stopped or the rule gives up (the run then fails, naming the worker's errors). The old worker
        is stopped first, so that its CPUs are free for the new one."""
        t0 = time.monotonic()
        with self._lock:
            if self._closing:
                return None  # close() stops it
            self._set_worker(w, None)
        self._discard(old)
        while not self.server.stopped:
            try:
                delay = self.restart_rule.failed(w, reason)
            except WorkersFailed as e:
                if self.server.fail(w, str(e).removeprefix(f"worker {w} ")):  # the failure the run reports
                    self.gave_up = e
                return None
            log.warning("frugalrl: DPSGD worker %d failed (%s); replacing it", w, reason)
            if self._closed.wait(delay) or self.server.stopped:  # closing, or the run ended meanwhile
                return None
            replaced = len([e for e in self.restart_events if e["worker"] == w]) + 1
            config = {**self.configs[w], "seed": int(self.configs[w].get("seed", 0)) + 7919 * replaced}
            with self._lock:
                if self._closing or self.server.stopped:
                    return None
                try:
                    new, sizes = self._launch(w, config)
                except OSError as e:
                    reason = f"could not start a new worker: {e}"
                    continue
                self._starting[w] = new
            self.meter.add_message(sizes, w, DOWN)
            try:
                sizes = self._await_ready(w, new)
            except (DPSGDError, ValueError, WireError) as e:
                failed_start: Exception | None = e
            else:
                failed_start = None
            with self._lock:
                mine = self._starting.pop(w, None) is new  # else close() took it, and stops it
                keep = mine and failed_start is None and not self._closing and not self.server.stopped
                if keep:
                    self._set_worker(w, new)
            if keep:
                self.meter.add_message(sizes, w, UP)
                self.restart_events.append({"worker": w, "reason": reason, "time": time.time(),
                                            "seconds": round(time.monotonic() - t0, 3)})
                return new
            if mine:
                self._discard(new)
            if failed_start is None or not mine:  # ready, but the run stopped or is closing
                return None
            reason = f"its replacement failed to start: {failed_start}"  # the crash-loop rule decides again
        return None

    def _serve_failed(self, w: int, e: Exception) -> None:
        """A head thread's own unexpected error (not the worker's): the run fails naming it, rather than going on
        a worker short (or waiting for it forever in synchronous mode); nothing while closing."""
        if not self._closing:
            log.exception("frugalrl: the head's thread of DPSGD worker %d failed", w)
            self.server.fail(w, f"the head's thread serving it failed: {type(e).__name__}: {e}")

    def _begin_close(self) -> list[Any] | None:
        """For close(): None if it ran already; else mark the transport closing and take the replacements still
        starting (their threads then leave them to the caller to stop)."""
        with self._lock:
            if self._closing:
                return None
            self._closed.set()
            starting, self._starting = list(self._starting.values()), {}
        return starting

    @abstractmethod
    def _launch(self, w: int, config: dict[str, Any]) -> tuple[Any, dict[str, int]]:
        """Start a worker ``w`` from ``config`` without waiting for it; return it and the config's sizes by
        byte-meter kind. OSError if it cannot be started."""

    @abstractmethod
    def _await_ready(self, w: int, worker: Any, deadline: float | None = None) -> dict[str, int]:
        """Wait for a started worker's ``ready`` (until ``deadline``, a ``time.monotonic()``; default:
        ``startup_timeout`` from now); return its sizes (DPSGDError or ValueError if it fails)."""

    @abstractmethod
    def _discard(self, worker: Any) -> None:
        """Stop a worker that failed or is not wanted, with its Hogwild helpers, at once."""

    @abstractmethod
    def _set_worker(self, w: int, worker: Any) -> None:
        """Make ``worker`` (None: none, while it is replaced) worker ``w``; called under the lock."""


class LocalTransport(Transport):
    """Worker processes on this machine, a socket pair each, one server thread per connection."""

    name = "local"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.children: list[Child | None] = []  # None: worker w's process is being replaced
        self._threads: list[threading.Thread] = []
        self._done: list[bool] = []

    def start(self) -> None:
        """Spawn every worker (they start in parallel), send its config, wait for its ``ready``."""
        try:
            started: list[Child] = []
            for w, cfg in enumerate(self.configs):
                child, sizes = self._launch(w, cfg)
                started.append(child)
                self.children.append(child)
                self.meter.add_message(sizes, w, DOWN)
            deadline = time.monotonic() + self.startup_timeout
            for w, child in enumerate(started):
                self.meter.add_message(self._await_ready(w, child, deadline), w, UP)
        except BaseException:
            self.close()
            raise

    def serve(self) -> None:
        """One thread per worker connection, each running :meth:`_serve`."""
        self._done = [False] * len(self.children)
        for w, child in enumerate(self.children):
            thread = threading.Thread(target=self._serve, args=(w, child), name=f"dpsgd-conn-{w}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, w: int, child: Child | None) -> None:
        """Answer worker ``w`` until it is told to stop or the transport closes; a worker that dies, goes silent
        or (``on_env_error="restart"``) reports an error is replaced (:meth:`Transport._replace`)."""
        last = time.monotonic()
        try:
            while child is not None and not self._closing:
                state = child.poll(0.5)
                if state == "message":
                    done = self._answer(w, child)
                    if done is True:
                        return
                    if done is not None:  # the worker failed: ``done`` says how
                        child = self._replace(w, child, done)
                    last = time.monotonic()
                elif state == "exited":
                    child = self._replace(w, child, self._lost(child, None))
                    last = time.monotonic()
                elif self.worker_timeout is not None and time.monotonic() - last > self.worker_timeout:
                    child = self._replace(w, child, f"no message for {self.worker_timeout:g} s: the worker is hung")
                    last = time.monotonic()
        except Exception as e:  # noqa: BLE001 - the run fails with it (_serve_failed)
            self._serve_failed(w, e)
        finally:
            self._done[w] = True

    def _answer(self, w: int, child: Child) -> Literal[True] | str | None:
        """Receive one request of worker ``w`` and send the server's reply: None to go on, True once the
        connection is done (told to stop, or the run failed), or why the worker must be replaced."""
        try:
            msg, sizes = child.recv()
        except (EOFError, OSError, WireError) as e:
            return self._lost(child, e)
        restart = self.env_error_to_restart(w, msg, sizes)
        if restart is not None:
            return restart
        reply = self.answer(w, msg, sizes)
        try:
            self.meter.add_message(child.send(reply), w, DOWN)
        except OSError as e:
            if reply.op != "stop":
                return self._lost(child, e)
            return True
        return True if reply.op == "stop" else None

    # ------------------------------------------------------------------ Transport._replace's hooks
    def _launch(self, w: int, config: dict[str, Any]) -> tuple[Child, dict[str, int]]:
        child = spawn(_ENTRY, config, name=f"worker {w}", one_blas_thread=True)
        return child, child.config_sizes

    def _await_ready(self, w: int, worker: Child, deadline: float | None = None) -> dict[str, int]:
        deadline = time.monotonic() + self.startup_timeout if deadline is None else deadline
        return worker.await_ready(deadline, error=DPSGDError, keep_value_error=True)[1]

    def _discard(self, worker: Child) -> None:
        worker.stop(0.0)  # killed with its Hogwild helpers (one process group), its socket and pidfd closed

    def _set_worker(self, w: int, worker: Child | None) -> None:
        self.children[w] = worker

    @staticmethod
    def _lost(child: Child, error: BaseException | None) -> str:
        """What happened to a worker whose connection broke: it died (its Hogwild helpers are killed with
        it, as one process group), or only the connection is gone."""
        if child.exited(0.0 if error is None else 0.5):
            child.kill()
            return f"process {child.pid} died (exit code {child.reap()})"
        return f"connection lost ({type(error).__name__}: {error})"

    def finished(self) -> bool:
        """Whether every connection thread has ended."""
        return bool(self._done) and all(self._done)

    def close(self) -> None:
        """End the connection threads, let the workers exit (up to 3 s), then kill their process groups."""
        starting = self._begin_close()
        if starting is None:
            return
        self.server.stop("closed")  # releases connection threads waiting in a synchronous pull
        for child in starting:  # replacements still starting: their threads leave them to this
            child.stop(0.0)
        for thread in self._threads:
            thread.join(timeout=2.0)
        # Workers told to stop exit by themselves; after a failure nothing is worth waiting for.
        deadline = time.monotonic() + (0.0 if self.server.failure is not None else 3.0)
        with self._lock:  # a worker's thread replaces no child from now on (it sees _closing)
            children = [child for child in self.children if child is not None]
        for child in children:
            with contextlib.suppress(OSError):
                child.channel.sock.shutdown(socket.SHUT_RDWR)  # a worker waiting for a reply sees EOF
        for child in children:
            child.stop(max(0.0, deadline - time.monotonic()))

    def worker_pids(self) -> dict[int, int]:
        """Process id of each worker (not one being replaced)."""
        return {w: child.pid for w, child in enumerate(self.children) if child is not None}
