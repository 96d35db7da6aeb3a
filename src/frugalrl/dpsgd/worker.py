"""The DPSGD worker (Alg. 2): pull ``v``, run ``p`` lock-free Hogwild processes for ``B`` steps each, push ``u - v``.

Each worker is one OS process. Its local parameters ``u`` live in a :class:`SharedVector`: an
anonymous shared-memory file (``memfd_create``) mapped by the worker and by its ``p - 1`` *helper*
processes. The worker process itself is Hogwild process 0, so ``p = 1`` costs no extra process.
A round is::

    u[:] = v                       # line 3: the pulled global parameters, into shared memory
    every Hogwild process k < p:   # lines 4-9, at the same time, without any lock
        B times: û = copy of u;  g = ∇f_i(û);  u -= η g      (numpy, in place, on the shared map)
    push u - v                     # line 10

Reads and writes of ``u`` are not synchronised: a step may read a ``u`` that another process is
halfway through updating, and two processes may overwrite each other's elements (the paper's
``S_j`` matrices). The worker waits for every helper to finish its ``B`` steps before pushing.

Processes are started with ``subprocess`` running ``python -c`` (nothing pickled; configs travel as
JSON in :class:`~frugalrl.wire.Message`). ``frugalrl`` imports its public names lazily, so a process
that needs only ``frugalrl.dpsgd`` and numpy starts in a fraction of a second. Every process exits by itself within about a
second once its parent is gone, and a helper that dies is reported by its worker, which then fails.

The worker's loop, :func:`run_worker`, only needs an ``exchange(Message) -> Message`` function to
talk to the server, so another transport (Ray) can reuse it as is.
"""

from __future__ import annotations

import mmap
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from frugalrl.dpsgd.problems import Problem, check_vector, load_problem
from frugalrl.dpsgd.rates import decayed_rate
from frugalrl.wire.channel import POLLIN as _POLLIN
from frugalrl.wire.channel import recv_frame, send_frame
from frugalrl.wire.message import Message, decode_message, encode_message

# ---------------------------------------------------------------------------------------- framing
# The frames of ``frugalrl.wire.channel``, as the local ClusterEnv backend uses them.


def send_message(sock: socket.socket, msg: Message) -> dict[str, int]:
    """Send ``msg`` as one frame (:func:`frugalrl.wire.channel.send_frame`); return its size by byte-meter kind."""
    blob, sizes = encode_message(msg)
    send_frame(sock, blob)
    return sizes


def recv_message(sock: socket.socket) -> tuple[Message, dict[str, int]]:
    """Receive one frame and decode it (never unpickles anything); ``EOFError`` if the peer closed."""
    return decode_message(recv_frame(sock))


def readable(fds: list[int], timeout: float) -> set[int]:
    """The subset of ``fds`` (sockets or pidfds) that is readable within ``timeout`` seconds."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, _POLLIN)
    return {fd for fd, _ in poller.poll(max(0, int(timeout * 1000)))}


class ServerGone(Exception):
    """The server cannot be reached any more (it closed the connection, or its process is gone)."""


def error_message(e: BaseException, where: str = "") -> Message:
    """An ``error`` message carrying the exception's type name (ValueError stays ValueError at the head)."""
    if isinstance(e, _HelperError):
        return Message("error", e.meta)
    kind = "ValueError" if isinstance(e, ValueError) else "RuntimeError"
    return Message("error", {"error": f"{where}{type(e).__name__}: {e}", "type": kind})


# ---------------------------------------------------------------------------------- child processes
def lean_command(code: str, *args: str) -> list[str]:
    """``python -c code args``: a child process that ignores SIGINT from before its first import (the
    entry points rely on it); it starts fast because ``frugalrl`` imports its public names (torch,
    gymnasium) only when they are first used."""
    return [
        sys.executable,
        "-c",
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n" + code,
        *args,
    ]


def child_env() -> dict[str, str]:
    """Environment of a DPSGD child: the parent's import path, one BLAS thread (parallelism is ``p``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    return env


def make_rng(seed: int, worker: int, thread: int) -> np.random.Generator:
    """The sample stream of Hogwild process ``thread`` of ``worker`` (independent, reproducible)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(worker), int(thread)]))


# ---------------------------------------------------------------------------------- shared memory
class SharedVector:
    """A float32 vector in anonymous shared memory (``memfd``), shared with children through its fd.

    The creator passes :attr:`fd` to child processes (``pass_fds``), which map it with
    :meth:`attach`. Nothing has a name in ``/dev/shm``, so nothing can leak when a process is killed.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = int(size)
        self._map = mmap.mmap(fd, 4 * self.size)
        self.array: np.ndarray = np.frombuffer(self._map, dtype=np.float32, count=self.size)

    @classmethod
    def create(cls, size: int) -> SharedVector:
        """A new zero vector of ``size`` elements (its fd is inheritable by ``pass_fds``)."""
        if size < 1:
            raise ValueError(f"a shared vector needs at least one element, got {size}")
        fd = os.memfd_create("frugalrl-dpsgd-u")  # close-on-exec: children get it only through pass_fds
        os.ftruncate(fd, 4 * int(size))
        return cls(fd, size)

    @classmethod
    def attach(cls, fd: int, size: int) -> SharedVector:
        """Map a vector whose fd this process inherited."""
        return cls(fd, size)

    def close(self) -> None:
        """Unmap and close the fd (a view still held elsewhere keeps the mapping alive until freed)."""
        self.array = np.zeros(0, dtype=np.float32)
        try:
            self._map.close()
        except BufferError:
            pass  # someone still holds a view; the mapping goes when it does
        try:
            os.close(self.fd)
        except OSError:
            pass


def hogwild_steps(
    u: np.ndarray, problem: Problem, eta: float, steps: int, rng: np.random.Generator, name: str
) -> None:
    """Alg. 2, lines 5-9, for one Hogwild process: ``steps`` lock-free updates ``u -= η ∇f_i(û)`` in place."""
    eta32 = np.float32(eta)
    for _ in range(steps):
        u_hat = u.copy()  # line 6: read u (other processes may be writing it meanwhile)
        grad = check_vector(problem.stochastic_grad(u_hat, rng), u.size, name, "stochastic_grad()")
        u -= eta32 * grad  # line 8: no lock


# ---------------------------------------------------------------------------------- Hogwild helpers
class _Helper:
    """One helper process as seen by its worker."""

    def __init__(self, process: subprocess.Popen, sock: socket.socket) -> None:
        self.process = process
        self.sock = sock
        self.pidfd = os.pidfd_open(process.pid)


class HogwildPool:
    """The ``p - 1`` helper processes of a worker (the worker itself is Hogwild process 0)."""

    def __init__(self, cfg: dict[str, Any], vector: SharedVector, startup_timeout: float = 60.0) -> None:
        self.cfg = cfg
        self.worker = int(cfg["worker"])
        self.vector = vector
        self.helpers: list[_Helper] = []
        try:
            for k in range(1, int(cfg["threads"])):
                self.helpers.append(self._spawn(k))
            for k, helper in enumerate(self.helpers, start=1):
                self._await(k, helper, "starting", startup_timeout)
        except BaseException:
            self.close()
            raise

    def _spawn(self, k: int) -> _Helper:
        mine, theirs = socket.socketpair()
        fds = (theirs.fileno(), self.vector.fd)
        code = "from frugalrl.dpsgd.worker import hogwild_entry; hogwild_entry()"
        proc = subprocess.Popen(
            lean_command(code, str(theirs.fileno()), str(os.getpid())),
            pass_fds=fds,
            env=child_env(),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        helper = _Helper(proc, mine)
        meta = {**self.cfg, "thread": k, "fd": self.vector.fd, "size": self.vector.size}
        send_message(mine, Message("config", meta))
        return helper

    def _await(self, k: int, helper: _Helper, doing: str, timeout: float | None) -> Message:
        """The next message of helper ``k``; raise if it died, reported an error, or timed out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = readable([helper.sock.fileno(), helper.pidfd], 1.0)
            if helper.sock.fileno() in ready:
                try:
                    msg, _ = recv_message(helper.sock)
                except (EOFError, OSError):
                    msg = None
                if msg is not None and msg.op == "error":
                    raise _HelperError(msg.meta)
                if msg is not None:
                    return msg
                ready.add(helper.pidfd)
            if helper.pidfd in ready:
                helper.process.wait(timeout=5)
                raise RuntimeError(
                    f"Hogwild process {k} of worker {self.worker} died while {doing} "
                    f"(exit code {helper.process.returncode})"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(
                    f"Hogwild process {k} of worker {self.worker} did not answer while {doing}"
                )

    def begin(self, steps: int, eta: float) -> None:
        """Start ``steps`` Hogwild steps of rate ``eta`` in every helper."""
        for k, helper in enumerate(self.helpers, start=1):
            try:
                send_message(helper.sock, Message("run", {"steps": int(steps), "eta": float(eta)}))
            except OSError as e:
                raise RuntimeError(
                    f"Hogwild process {k} of worker {self.worker} is gone ({e!r}, exit code {helper.process.poll()})"
                ) from e

    def finish(self) -> None:
        """Wait until every helper has done its steps."""
        for k, helper in enumerate(self.helpers, start=1):
            self._await(k, helper, "running", None)

    def close(self) -> None:
        """Ask every helper to exit; kill those that do not within a second."""
        for helper in self.helpers:
            try:
                send_message(helper.sock, Message("close"))
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        for helper in self.helpers:
            try:
                helper.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                helper.process.kill()
                helper.process.wait(timeout=5)
            helper.sock.close()
            os.close(helper.pidfd)
        self.helpers = []


class _HelperError(Exception):
    """An ``error`` message from a helper, forwarded to the server as it is."""

    def __init__(self, meta: dict[str, Any]) -> None:
        super().__init__(meta.get("error"))
        self.meta = meta


# ---------------------------------------------------------------------------------- the worker loop
class DPSGDWorker:
    """Alg. 2 for one worker: its problem, its shared ``u`` and its Hogwild helpers.

    ``cfg`` holds ``worker``, ``threads`` (p), ``local_steps`` (B), ``eta`` (with ``eta_decay`` and
    ``eta_offset``, :func:`~frugalrl.dpsgd.rates.decayed_rate`), ``seed``, ``problem``,
    ``problem_kwargs`` and ``update_codec``. Building it starts the helpers (so that a transport can
    report "ready" only once the worker can compute); :meth:`run` talks to the server through any
    ``exchange(Message) -> Message`` function.
    """

    def __init__(self, cfg: dict[str, Any], startup_timeout: float = 60.0) -> None:
        self.cfg = cfg
        self.name = cfg["problem"]
        self.index = int(cfg["worker"])
        self.problem = load_problem(self.name, cfg["problem_kwargs"])
        size = check_vector(self.problem.init_params(), None, self.name, "init_params()").size
        self.rng = make_rng(cfg["seed"], self.index, 0)
        self.vector = SharedVector.create(size)
        try:
            self.pool = HogwildPool(cfg, self.vector, startup_timeout)
        except BaseException:
            self.vector.close()
            raise

    def round(self, v: np.ndarray, version: int = 0) -> np.ndarray:
        """One pass of the outer loop on parameters ``v`` pulled at global update ``version``: return the
        update ``u - v``."""
        u, steps = self.vector.array, int(self.cfg["local_steps"])
        eta = decayed_rate(self.cfg["eta"], version, self.cfg["eta_decay"], self.cfg["eta_offset"])
        u[:] = v  # line 3
        self.pool.begin(steps, eta)  # line 4
        try:
            hogwild_steps(u, self.problem, eta, steps, self.rng, self.name)
        finally:
            self.pool.finish()
        return u - v  # line 10

    def run(self, exchange: Callable[[Message], Message]) -> None:
        """Pull, compute, push until the server answers ``stop``; errors go to the server as ``error``.

        ``exchange`` raises :class:`ServerGone` when the server cannot be reached; that ends the run
        quietly (there is nobody left to tell).
        """
        steps = int(self.cfg["local_steps"]) * int(self.cfg["threads"])
        try:
            reply = exchange(Message("pull"))
            while reply.op == "params":
                update = self.round(reply.arrays["w/v"], int(reply.meta["version"]))
                push = Message(
                    "push",
                    {"version": reply.meta["version"], "steps": steps},
                    {"grad/w": update},
                    {"grad/w": self.cfg["update_codec"]},
                )
                reply = exchange(push)
        except ServerGone:
            raise
        except Exception as e:  # noqa: BLE001 - reported to the server, which raises it in the caller
            exchange(error_message(e))

    def close(self) -> None:
        """Stop the helpers and free the shared memory."""
        self.pool.close()
        self.vector.close()


def _parent_watch(sock: socket.socket, parent_pid: int) -> Callable[[Message], Message]:
    """``exchange`` over ``sock``; raises :class:`ServerGone` once the connection or the parent is gone."""

    def exchange(msg: Message) -> Message:
        try:
            send_message(sock, msg)
            while not readable([sock.fileno()], 1.0):
                if os.getppid() != parent_pid:
                    raise ServerGone("the server process is gone")
            return recv_message(sock)[0]
        except (EOFError, OSError) as e:
            raise ServerGone(repr(e)) from e

    return exchange


def worker_entry() -> None:
    """Entry point of a worker process: ``python -c '...; worker_entry()' FD PARENT_PID``.

    Receives its config, builds a :class:`DPSGDWorker` (reporting ``ready`` or ``error``), then runs it.
    """
    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    try:
        cfg = recv_message(sock)[0].meta
        try:
            worker = DPSGDWorker(cfg)
        except Exception as e:  # noqa: BLE001 - reported to the server
            send_message(sock, error_message(e))
            return
        try:
            send_message(sock, Message("ready", {"pid": os.getpid()}))
            worker.run(_parent_watch(sock, parent_pid))
        finally:
            worker.close()
    except (EOFError, OSError, ServerGone):
        return  # the server went away
    finally:
        sock.close()


def hogwild_entry() -> None:
    """Entry point of a helper process: attach ``u``, then run ``B`` Hogwild steps per ``run`` request."""
    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    try:
        cfg = recv_message(sock)[0].meta
        try:
            name = cfg["problem"]
            problem = load_problem(name, cfg["problem_kwargs"])
            vector = SharedVector.attach(int(cfg["fd"]), int(cfg["size"]))
            rng = make_rng(cfg["seed"], cfg["worker"], cfg["thread"])
        except Exception as e:  # noqa: BLE001 - reported to the worker
            send_message(sock, error_message(e, f"Hogwild process {cfg.get('thread')}: "))
            return
        send_message(sock, Message("ready"))
        while True:
            if not readable([sock.fileno()], 1.0):
                if os.getppid() != parent_pid:
                    return
                continue
            msg, _ = recv_message(sock)
            if msg.op != "run":
                return
            try:
                hogwild_steps(vector.array, problem, msg.meta["eta"], int(msg.meta["steps"]), rng, name)
            except Exception as e:  # noqa: BLE001 - reported to the worker, which reports to the server
                send_message(sock, error_message(e, f"Hogwild process {cfg['thread']}: "))
                return
            send_message(sock, Message("done"))
    except (EOFError, OSError):
        return
    finally:
        sock.close()
