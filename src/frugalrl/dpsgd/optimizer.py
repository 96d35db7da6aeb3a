"""DPSGD: the config, the transports between server and workers, and :func:`run_dpsgd`.

Distributed Parallel SGD (seed paper 002, Alg. 1 and 2)::

    cfg = DPSGDConfig(problem="frugalrl.dpsgd.problems:least_squares", problem_kwargs={"dim": 20},
                      workers=2, threads=2, local_steps=10, master_batch=2, rho=1.0, eta=0.01,
                      global_updates=200)
    summary = run_dpsgd(cfg)   # summary["params"], summary["loss_curve"], summary["bytes"], ...

The server (:class:`~frugalrl.dpsgd.server.ParameterServer`) lives in the calling process. A
:class:`Transport` starts the workers and carries their messages to it. The local transport runs
each worker (:class:`~frugalrl.dpsgd.worker.DPSGDWorker`) in its own process group with a socket
pair to the server and one server thread per connection; every message is a
:class:`~frugalrl.wire.Message` and is counted on a :class:`~frugalrl.wire.ByteMeter` (pulls as
``weights`` down, pushes as ``gradients`` up, headers and commands as ``control``).

A worker that dies is seen at once (its pidfd becomes readable) and the run fails with a
:class:`DPSGDError` naming it; it is not restarted. A worker that sends nothing for
``worker_timeout_s`` seconds is treated the same way.

``backend="ray"`` (:class:`~frugalrl.dpsgd.ray_transport.RayTransport`, imported only when used) runs
each worker in a Ray actor, possibly on other machines; the server stays in this process and answers
the actors' requests in one thread per worker, as here.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from frugalrl.dpsgd.problems import check_problem, load_problem
from frugalrl.dpsgd.rates import scale_learning_rate
from frugalrl.dpsgd.server import ParameterServer
from frugalrl.dpsgd.worker import child_env, lean_command, readable, recv_message, send_message
from frugalrl.wire.message import Message, WireError
from frugalrl.wire.meter import DOWN, UP, ByteMeter

UPDATE_CODECS = ("fp32", "bf16", "fp16")


class DPSGDError(RuntimeError):
    """A DPSGD run failed: a worker died, hung, or broke the protocol."""


@dataclass
class DPSGDConfig:
    """Everything a DPSGD run is built from (the paper's symbols in brackets)."""

    problem: Any
    """Factory of the problem: ``"module:function"`` (or a module-level function), see :mod:`frugalrl.dpsgd.problems`."""
    problem_kwargs: dict[str, Any] = field(default_factory=dict)
    """JSON keyword arguments of the factory (every process builds its own problem from them)."""
    workers: int = 2
    """Worker processes (nW)."""
    threads: int = 1
    """Lock-free Hogwild processes per worker (p)."""
    local_steps: int = 1
    """Local steps of each Hogwild process per pull (B)."""
    master_batch: int = 1
    """Updates collected by the server per global update (M)."""
    rho: float = 1.0
    """Global learning rate (ρ)."""
    eta: float = 0.01
    """Local learning rate (η)."""
    eta_decay: float = 0.0
    """κ of the local-rate schedule ``η_t = η (1 + t/τ)^(−κ)``, t = the global update a worker pulled
    (SVI's Robbins-Monro rates; 0: constant η, as in the paper)."""
    eta_offset: float = 10.0
    """τ of that schedule, in global updates."""
    global_updates: int | None = 100
    """Stop after this many global updates (T); None: only ``time_limit_s`` stops the run."""
    time_limit_s: float | None = None
    """Stop after this many seconds of optimisation (startup excluded)."""
    update_codec: str = "fp32"
    """Wire codec of the pushed update vectors: fp32, bf16 or fp16."""
    pull_codec: str = "fp32"
    """Wire codec of the pulled global parameters: fp32, bf16 or fp16."""
    synchronous: bool = False
    """Synchronous baseline: every global update takes exactly one update from each worker, all from the
    same ``v`` (needs ``master_batch == workers``; the classic synchronous SGD also has ``local_steps=1``)."""
    rescale_from: tuple[int, int, int] | None = None
    """``(p, B, M)`` that ``rho`` and ``eta`` were tuned for; rescaled to this run's by eq. (13)."""
    seed: int = 0
    """Seed of every sample stream (one per Hogwild process)."""
    log_every: int = 10
    """Record the loss every this many global updates (0: only at the start and the end)."""
    target_loss: float | None = None
    """Stop once a recorded loss is at or below this (the summary's ``target`` says when); None: never."""
    deferred_eval: bool = False
    """Keep the recorded parameters and compute their losses after the run, so that evaluating takes no
    CPU from the workers (timing benchmarks on few cores); ``target_loss`` then cannot stop the run early."""
    backend: str = "local"
    """Transport between server and workers: ``local`` (processes on this machine) or ``ray`` (Ray actors)."""
    ray_address: str | None = None
    """``backend="ray"``: the cluster to join (``"auto"``, ``"host:port"``); None: a Ray this process has
    already started, else a private single-machine one."""
    startup_timeout_s: float = 120.0
    """How long a worker (with its helpers) may take to start."""
    worker_timeout_s: float | None = 300.0
    """A worker silent for this long (no push, no pull) is declared hung; None: wait forever."""

    def __post_init__(self) -> None:
        if callable(self.problem):
            self.problem = _factory_path(self.problem)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        if (
            not isinstance(self.problem, str)
            or self.problem.count(":") != 1
            or not all(self.problem.split(":"))
        ):
            raise ValueError(f"DPSGDConfig.problem must be a 'module:function' string, got {self.problem!r}")
        if not isinstance(self.problem_kwargs, dict):
            raise ValueError(
                f"DPSGDConfig.problem_kwargs must be a dict, got {type(self.problem_kwargs).__name__}"
            )
        try:
            json.dumps(self.problem_kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"DPSGDConfig.problem_kwargs must be JSON-serialisable: {e}") from e
        for name in ("workers", "threads", "local_steps", "master_batch"):
            _check_int(name, getattr(self, name), 1)
        _check_int("seed", self.seed, 0)
        _check_int("log_every", self.log_every, 0)
        for name in ("rho", "eta", "eta_offset"):
            _check_positive(name, getattr(self, name))
        if isinstance(self.eta_decay, bool) or not isinstance(self.eta_decay, (int, float)) or not (
            0 <= self.eta_decay <= 1
        ):
            raise ValueError(f"DPSGDConfig.eta_decay must lie in [0, 1], got {self.eta_decay!r}")
        if self.global_updates is not None:
            _check_int("global_updates", self.global_updates, 1)
        if self.time_limit_s is not None:
            _check_positive("time_limit_s", self.time_limit_s)
        if self.target_loss is not None and (
            isinstance(self.target_loss, bool)
            or not isinstance(self.target_loss, (int, float))
            or not math.isfinite(self.target_loss)
        ):
            raise ValueError(f"DPSGDConfig.target_loss must be a finite number or None, got {self.target_loss!r}")
        if not isinstance(self.deferred_eval, bool):
            raise ValueError(f"DPSGDConfig.deferred_eval must be a bool, got {self.deferred_eval!r}")
        if self.global_updates is None and self.time_limit_s is None:
            raise ValueError(
                "DPSGDConfig.global_updates and time_limit_s are both None: the run would never stop"
            )
        for name in ("update_codec", "pull_codec"):
            if getattr(self, name) not in UPDATE_CODECS:
                raise ValueError(
                    f"DPSGDConfig.{name} must be one of {UPDATE_CODECS}, got {getattr(self, name)!r}"
                )
        if not isinstance(self.synchronous, bool):
            raise ValueError(f"DPSGDConfig.synchronous must be a bool, got {self.synchronous!r}")
        if self.synchronous and self.master_batch != self.workers:
            raise ValueError(
                f"DPSGDConfig.master_batch must equal workers ({self.workers}) when synchronous=True, "
                f"got {self.master_batch}"
            )
        if self.rescale_from is not None:
            try:
                scale_learning_rate(1.0, tuple(self.rescale_from), (1, 1, 1))
            except ValueError as e:
                raise ValueError(f"DPSGDConfig.rescale_from: {e}") from e
        if self.backend not in TRANSPORTS:
            raise ValueError(f"DPSGDConfig.backend must be one of {sorted(TRANSPORTS)}, got {self.backend!r}")
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            raise ValueError(f"DPSGDConfig.ray_address must be a non-empty string or None, got {self.ray_address!r}")
        _check_positive("startup_timeout_s", self.startup_timeout_s)
        if self.worker_timeout_s is not None:
            _check_positive("worker_timeout_s", self.worker_timeout_s)

    def as_synchronous_baseline(self) -> DPSGDConfig:
        """This config as the synchronous SGD baseline: ``B = 1``, ``M = workers``, ``synchronous=True``."""
        return replace(self, local_steps=1, master_batch=self.workers, synchronous=True)

    def effective_rates(self) -> tuple[float, float]:
        """``(rho, eta)`` of this run: as given, or rescaled from ``rescale_from`` by eq. (13)."""
        if self.rescale_from is None:
            return float(self.rho), float(self.eta)
        new = (self.threads, self.local_steps, self.master_batch)
        ref = tuple(self.rescale_from)
        return scale_learning_rate(self.rho, ref, new), scale_learning_rate(self.eta, ref, new)

    def worker_config(self, worker: int, eta: float) -> dict[str, Any]:
        """The JSON config worker ``worker`` is built from."""
        return {
            "worker": worker,
            "workers": self.workers,
            "threads": self.threads,
            "local_steps": self.local_steps,
            "eta": eta,
            "eta_decay": float(self.eta_decay),
            "eta_offset": float(self.eta_offset),
            "seed": self.seed,
            "problem": self.problem,
            "problem_kwargs": self.problem_kwargs,
            "update_codec": self.update_codec,
        }


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"DPSGDConfig.{name} must be an integer >= {minimum}, got {value!r}")


def _check_positive(name: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"DPSGDConfig.{name} must be a finite number > 0, got {value!r}")


def _factory_path(factory: Any) -> str:
    """``"module:qualname"`` of a module-level function, for processes that import it."""
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", "")
    if module is None or module == "__main__" or "<" in qualname:
        raise ValueError(
            f"DPSGDConfig.problem: {factory!r} cannot be imported by worker processes; "
            "define it in an importable module and pass 'module:function'"
        )
    return f"{module}:{qualname}"


# ---------------------------------------------------------------------------------------- transports
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
    ) -> None:
        self.server = server
        self.meter = meter
        self.configs = configs
        self.startup_timeout = startup_timeout
        self.worker_timeout = worker_timeout

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
        a request the server refuses fails the run and is answered ``stop``."""
        self.meter.add_message(sizes, w, UP)
        try:
            return self.server.handle(w, msg)
        except (ValueError, RuntimeError, KeyError) as e:
            kind = "ValueError" if isinstance(e, ValueError) else "RuntimeError"
            self.server.fail(None, str(e), kind)
            return Message("stop", {"reason": "failure"})


class _Connection:
    """One worker process as seen by the local transport."""

    def __init__(self, process: subprocess.Popen, sock: socket.socket) -> None:
        self.process = process
        self.sock = sock
        self.pidfd = os.pidfd_open(process.pid)
        self.thread: threading.Thread | None = None
        self.done = False


class LocalTransport(Transport):
    """Worker processes on this machine, a socket pair each, one server thread per connection."""

    name = "local"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conns: list[_Connection] = []
        self._closing = False
        self._closed = False

    def start(self) -> None:
        """Spawn every worker (in parallel), send its config, wait for its ``ready``."""
        try:
            for cfg in self.configs:
                self.conns.append(self._spawn(cfg))
            deadline = time.monotonic() + self.startup_timeout
            for w, conn in enumerate(self.conns):
                self._await_ready(w, conn, deadline)
        except BaseException:
            self.close()
            raise

    def _spawn(self, cfg: dict[str, Any]) -> _Connection:
        mine, theirs = socket.socketpair()
        code = "from frugalrl.dpsgd.worker import worker_entry; worker_entry()"
        proc = subprocess.Popen(
            lean_command(code, str(theirs.fileno()), str(os.getpid())),
            pass_fds=(theirs.fileno(),),
            env=child_env(),
            stdin=subprocess.DEVNULL,
            process_group=0,  # its own group: its Hogwild helpers can be killed with it, Ctrl-C is ours
        )
        theirs.close()
        conn = _Connection(proc, mine)
        self.meter.add_message(send_message(mine, Message("config", cfg)), int(cfg["worker"]), DOWN)
        return conn

    def _await_ready(self, w: int, conn: _Connection, deadline: float) -> None:
        while time.monotonic() < deadline:
            ready = readable([conn.sock.fileno(), conn.pidfd], 0.5)
            if conn.sock.fileno() in ready:
                try:
                    msg, sizes = recv_message(conn.sock)
                except (EOFError, OSError, WireError):
                    break
                self.meter.add_message(sizes, w, UP)
                if msg.op == "error":
                    text = f"worker {w} could not start: {msg.meta.get('error')}"
                    raise ValueError(text) if msg.meta.get("type") == "ValueError" else DPSGDError(text)
                return
            if conn.pidfd in ready:
                break
        conn.process.poll()
        raise DPSGDError(f"worker {w} died or hung while starting (exit code {conn.process.returncode})")

    def serve(self) -> None:
        """One thread per worker connection, each running :meth:`_serve`."""
        for w, conn in enumerate(self.conns):
            conn.thread = threading.Thread(
                target=self._serve, args=(w, conn), name=f"dpsgd-conn-{w}", daemon=True
            )
            conn.thread.start()

    def _serve(self, w: int, conn: _Connection) -> None:
        """Answer worker ``w`` until it is told to stop, dies, goes silent, or the transport closes."""
        last = time.monotonic()
        try:
            while not self._closing:
                ready = readable([conn.sock.fileno(), conn.pidfd], 0.5)
                if conn.sock.fileno() in ready:
                    if not self._answer(w, conn):
                        return
                    last = time.monotonic()
                elif conn.pidfd in ready:
                    self.server.fail(w, self._lost(conn, None))
                    return
                elif self.worker_timeout is not None and time.monotonic() - last > self.worker_timeout:
                    self.server.fail(w, f"no message for {self.worker_timeout:g} s: the worker is hung")
                    return
        finally:
            conn.done = True

    def _answer(self, w: int, conn: _Connection) -> bool:
        """Receive one request of worker ``w`` and send the server's reply; False once the connection is done."""
        server = self.server
        try:
            msg, sizes = recv_message(conn.sock)
        except (EOFError, OSError, WireError) as e:
            server.fail(w, self._lost(conn, e))
            return False
        reply = self.answer(w, msg, sizes)
        try:
            self.meter.add_message(send_message(conn.sock, reply), w, DOWN)
        except OSError as e:
            if reply.op != "stop":
                server.fail(w, self._lost(conn, e))
            return False
        return reply.op != "stop"

    @staticmethod
    def _lost(conn: _Connection, error: BaseException | None) -> str:
        """What happened to a worker whose connection broke: it died (its Hogwild helpers are killed
        with it), or only the connection is gone."""
        if readable([conn.pidfd], 0.0 if error is None else 0.5):
            _kill_group(conn.process.pid)
            conn.process.wait(timeout=5)
            return f"process {conn.process.pid} died (exit code {conn.process.returncode})"
        return f"connection lost ({type(error).__name__}: {error})"

    def finished(self) -> bool:
        """Whether every connection thread has ended."""
        return all(conn.done for conn in self.conns)

    def close(self) -> None:
        """End the connection threads, let the workers exit (up to 3 s), then kill their process groups."""
        if self._closed:
            return
        self._closed = self._closing = True
        self.server.stop("closed")  # releases connection threads waiting in a synchronous pull
        for conn in self.conns:
            if conn.thread is not None:
                conn.thread.join(timeout=2.0)
        # Workers told to stop exit by themselves; after a failure nothing is worth waiting for.
        deadline = time.monotonic() + (0.0 if self.server.failure is not None else 3.0)
        for conn in self.conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)  # a worker waiting for a reply sees EOF and exits
            except OSError:
                pass
            if conn.process.returncode is None:
                readable([conn.pidfd], max(0.0, deadline - time.monotonic()))
                _kill_group(conn.process.pid)  # before reaping: the group id cannot be reused meanwhile
                conn.process.wait(timeout=5)
            conn.sock.close()
            os.close(conn.pidfd)

    def worker_pids(self) -> dict[int, int]:
        """Process id of each worker."""
        return {w: conn.process.pid for w, conn in enumerate(self.conns)}


def _kill_group(pgid: int) -> None:
    """SIGKILL a worker's process group (the worker and its Hogwild helpers), if any of it is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _ray_transport(*args: Any, **kwargs: Any) -> Transport:
    """:class:`~frugalrl.dpsgd.ray_transport.RayTransport`, imported on first use (Ray is optional)."""
    from frugalrl.dpsgd.ray_transport import RayTransport

    return RayTransport(*args, **kwargs)


TRANSPORTS: dict[str, Callable[..., Transport]] = {"local": LocalTransport, "ray": _ray_transport}
"""Transport factories by ``DPSGDConfig.backend`` name."""

_STOP_GRACE_S = 5.0  # after the stop, how long to let workers finish their round before killing them


# ---------------------------------------------------------------------------------------- the run
def run_dpsgd(cfg: DPSGDConfig, problem: Any = None) -> dict[str, Any]:
    """Run DPSGD as ``cfg`` says and return a summary.

    Keys: ``params`` (final ``v``), ``final_loss``, ``loss_curve`` ``[(seconds, global_update, loss)]``,
    ``global_updates`` (T reached), ``staleness`` (``mean``, ``max``, ``histogram``), ``bytes`` (the
    :meth:`ByteMeter.summary`, with ``up``/``down`` by kind), ``pulls``, ``pushes``,
    ``applied_updates``, ``dropped_updates``, ``gradient_steps``, ``updates_per_second``,
    ``wall_time_s`` (optimisation), ``startup_s``, ``stop_reason``, ``target`` (``{seconds,
    global_update, loss}`` of the first recorded loss at or below ``target_loss``, or None),
    ``rho``/``eta`` (as used), ``config``.

    ``problem`` is the head's instance (its ``loss`` scores the recorded parameters): one the caller
    built from ``cfg.problem`` and ``cfg.problem_kwargs`` and wants to keep, or None to build it here.

    Raises ``ValueError`` for a bad config or a bad problem (naming it), :class:`DPSGDError` when a
    worker dies, hangs or breaks the protocol.
    """
    cfg.validate()
    rho, eta = cfg.effective_rates()
    name = cfg.problem
    if problem is None:
        problem = load_problem(name, cfg.problem_kwargs)
    v0 = check_problem(problem, name, np.random.default_rng(cfg.seed))
    server = ParameterServer(
        v0,
        rho=rho,
        master_batch=cfg.master_batch,
        workers=cfg.workers,
        global_updates=cfg.global_updates,
        synchronous=cfg.synchronous,
        log_every=cfg.log_every,
        pull_codec=cfg.pull_codec,
        name=name,
    )
    meter = ByteMeter()
    configs = [cfg.worker_config(w, eta) for w in range(cfg.workers)]
    extra = {"ray_address": cfg.ray_address} if cfg.backend == "ray" else {}
    transport = TRANSPORTS[cfg.backend](
        server, meter, configs, cfg.startup_timeout_s, cfg.worker_timeout_s, **extra
    )
    curve: list[tuple[float, int, float]] = [(0.0, 0, float(problem.loss(v0)))]
    deferred: list[tuple[float, int, np.ndarray]] = []
    goal = -math.inf if cfg.target_loss is None else cfg.target_loss
    if curve[0][2] <= goal:
        server.stop("target_loss")  # the workers start, get "stop" at their first pull, and exit
    t_start = time.monotonic()
    try:
        transport.start()
        startup_s = time.monotonic() - t_start
        server.start_clock()
        transport.serve()
        stopped_at = None
        while True:
            stopped = server.wait(0.1)
            for seconds, version, v in server.drain_snapshots():
                if cfg.deferred_eval:
                    deferred.append((seconds, version, v))  # v is never modified in place: no copy
                    continue
                curve.append((seconds, version, float(problem.loss(v))))
                if curve[-1][2] <= goal:
                    server.stop("target_loss")
                    break  # later snapshots are not worth evaluating
            if server.failure is not None:
                break
            if not stopped and cfg.time_limit_s is not None and server.elapsed() >= cfg.time_limit_s:
                server.stop("time_limit")
                continue
            if stopped:
                stopped_at = stopped_at or time.monotonic()
                if transport.finished() or time.monotonic() - stopped_at > _STOP_GRACE_S:
                    break
    finally:
        transport.close()
    if server.failure is not None:
        kind, message = server.failure
        raise (ValueError if kind == "ValueError" else DPSGDError)(f"DPSGD failed: {message}")

    curve += [(seconds, version, float(problem.loss(v))) for seconds, version, v in deferred]
    version, params = server.snapshot()
    if curve[-1][1] == version:  # the last recorded loss is the final parameters' (v is never modified)
        final_loss = curve[-1][2]
    else:
        final_loss = float(problem.loss(params))
        curve.append((server.elapsed(), version, final_loss))
    target = next(
        ({"seconds": t, "global_update": u, "loss": loss} for t, u, loss in curve if loss <= goal), None
    )
    wall = server.elapsed()
    return {
        "params": params.copy(),
        "final_loss": final_loss,
        "loss_curve": curve,
        "global_updates": version,
        "staleness": server.staleness_stats(),
        "bytes": meter.summary(),
        "pulls": server.pulls,
        "pushes": server.pushes,
        "applied_updates": server.applied_updates,
        "dropped_updates": server.dropped_updates,
        "gradient_steps": server.gradient_steps,
        "updates_per_second": version / wall if wall > 0 else 0.0,
        "wall_time_s": wall,
        "startup_s": startup_s,
        "stop_reason": server.stop_reason,
        "target": target,
        "rho": rho,
        "eta": eta,
        "config": asdict(cfg),
    }
