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

Processes are children of :mod:`frugalrl.process` (docs/architecture.md#the-process-layer). A worker leads its own
process group, which its helpers join, so the server kills a worker with its helpers at once; a helper that dies
is reported by its worker, which then fails.

The worker's loop, :func:`run_worker`, only needs an ``exchange(Message) -> Message`` function to
talk to the server, so another transport (Ray) can reuse it as is.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from frugalrl.dpsgd.problems import Problem, check_vector, load_problem
from frugalrl.dpsgd.rates import decayed_rate
from frugalrl.dpsgd.sparse import ColumnUpdate, supports_columns
from frugalrl.process import Child, ChildError, ChildExited, ParentGone, ParentLink, error_message, spawn
from frugalrl.wire.delta import DeltaError, HeldWeights, from_words
from frugalrl.wire.message import Message

_WORKER_ENTRY = "frugalrl.dpsgd.worker:worker_entry"
_HELPER_ENTRY = "frugalrl.dpsgd.worker:hogwild_entry"


def make_rng(seed: int, worker: int, process: int) -> np.random.Generator:
    """The sample stream of Hogwild process ``process`` of ``worker`` (independent, reproducible)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(worker), int(process)]))


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
    u: np.ndarray, problem: Problem, eta: float, steps: int, rng: np.random.Generator, name: str, version: int = 0
) -> None:
    """Alg. 2, lines 5-9, for one Hogwild process: ``steps`` lock-free updates ``u -= η ∇f_i(û)`` in place, on
    parameters of the whole run's global update ``version`` (:meth:`DPSGDWorker.clock`; told to the problem's
    optional ``set_version``)."""
    eta32 = np.float32(eta)
    set_rate = getattr(problem, "set_rate", None)
    if set_rate is not None:
        set_rate(eta)
    set_version = getattr(problem, "set_version", None)
    if set_version is not None:
        set_version(version)
    for _ in range(steps):
        u_hat = u.copy()  # line 6: read u (other processes may be writing it meanwhile)
        grad = check_vector(problem.stochastic_grad(u_hat, rng), u.size, name, "stochastic_grad()")
        u -= eta32 * grad  # line 8: no lock


# ---------------------------------------------------------------------------------- Hogwild helpers
class HogwildPool:
    """The ``p - 1`` helper processes of a worker (the worker itself is Hogwild process 0).

    Helpers stay in the worker's process group (the server kills them with it) and map the worker's ``u``
    through its inherited memfd.
    """

    def __init__(self, cfg: dict[str, Any], vector: SharedVector, startup_timeout: float = 60.0) -> None:
        self.cfg = cfg
        self.worker = int(cfg["worker"])
        self.vector = vector
        self.helpers: list[Child] = []
        try:
            for k in range(1, int(cfg["processes"])):
                meta = {**cfg, "process": k, "fd": vector.fd, "size": vector.size}
                name = f"Hogwild process {k} of worker {self.worker}"
                self.helpers.append(
                    spawn(_HELPER_ENTRY, meta, name=name, pass_fds=(vector.fd,), own_group=False,
                          one_blas_thread=True)
                )
            deadline = time.monotonic() + startup_timeout
            for helper in self.helpers:
                helper.await_ready(deadline, keep_value_error=True)
        except BaseException:
            self.close()
            raise

    def begin(self, steps: int, eta: float, version: int = 0) -> None:
        """Start ``steps`` Hogwild steps of rate ``eta`` on parameters of the whole run's global update ``version``
        in every helper."""
        run = Message("run", {"steps": int(steps), "eta": float(eta), "version": int(version)})
        for helper in self.helpers:
            try:
                helper.send(run)
            except OSError as e:
                raise RuntimeError(f"{helper.name} is gone ({e!r}, exit code {helper.process.poll()})") from e

    def finish(self) -> None:
        """Wait until every helper has done its steps; raise if one reported an error or died."""
        for helper in self.helpers:
            try:
                got = helper.wait_message(None)
            except ChildExited as e:
                raise RuntimeError(f"{helper.name} died while running (exit code {e.exitcode})") from None
            msg = None if got is None else got[0]
            if msg is not None and msg.op == "error":
                raise ChildError(msg.meta)  # forwarded to the server as it is

    def close(self) -> None:
        """Ask every helper to exit; kill those that do not within a second."""
        for helper in self.helpers:
            with contextlib.suppress(OSError):
                helper.send(Message("close"))
        deadline = time.monotonic() + 1.0
        for helper in self.helpers:
            helper.stop(max(0.0, deadline - time.monotonic()))
        self.helpers = []


# ---------------------------------------------------------------------------------- the worker loop
def pulled_params(reply: Message, held: HeldWeights, size: int) -> np.ndarray:
    """The ``size`` parameters a ``params`` reply carries: as they are, or from the pull codec's code words it
    carries whole or as a delta against those ``held`` (then held instead; ``DeltaError`` where it holds others)."""
    if "codec" not in reply.meta:  # the values themselves, decoded from the pull codec by the wire
        return reply.arrays["w/v"]
    words = held.resolve(reply)
    v = from_words(words, {"v": ((size,), np.dtype(np.float32))}, str(reply.meta["codec"]))["v"]
    held.keep(int(reply.meta["version"]), words)
    return v


class DPSGDWorker:
    """Alg. 2 for one worker: its problem, its shared ``u`` and its Hogwild helpers.

    ``cfg`` holds ``worker``, ``processes`` (p), ``local_steps`` (B), ``eta`` (with ``eta_decay``, ``eta_offset``,
    ``eta_horizon``, ``eta_anneal`` and ``clock_offset``, :func:`~frugalrl.dpsgd.rates.decayed_rate`), ``seed``,
    ``problem``, ``problem_kwargs``, ``update_codec`` and ``size`` (the vector's length; optional). Building it
    starts the helpers (so that a transport can report "ready" only once the worker can compute); :meth:`run`
    talks to the server through any ``exchange(Message) -> Message`` function.
    """

    def __init__(self, cfg: dict[str, Any], startup_timeout: float = 60.0) -> None:
        self.cfg = cfg
        self.name = cfg["problem"]
        self.index = int(cfg["worker"])
        self.problem = load_problem(self.name, cfg["problem_kwargs"])
        if "size" in cfg:  # run_dpsgd sends it: no starting point built only to be measured
            size = int(cfg["size"])
        else:
            size = check_vector(self.problem.init_params(), None, self.name, "init_params()").size
        self.rng = make_rng(cfg["seed"], self.index, 0)
        fmt = cfg.get("update_format", "dense")
        if fmt == "auto":
            fmt = "columns" if supports_columns(self.problem) and int(cfg["processes"]) == 1 else "dense"
        self.columns = fmt == "columns"
        if self.columns and not supports_columns(self.problem):
            raise ValueError(
                f"problem {self.name!r} has no column_shape / decay_target / column_step: it cannot push "
                "update_format='columns' (use 'dense')"
            )
        self.held = HeldWeights()  # the code words of the last pulled parameters (a server with pull_delta)
        self.vector = SharedVector.create(size)
        try:
            self.pool = HogwildPool(cfg, self.vector, startup_timeout)
        except BaseException:
            self.vector.close()
            raise

    def clock(self, version: int) -> int:
        """The whole run's clock of parameters pulled at this segment's global update ``version``: a resumed run's
        ``clock_offset`` adds the updates of its earlier segments. The rate schedule runs on it, and the problem's
        ``set_version`` is told it."""
        return version + int(self.cfg.get("clock_offset", 0))

    def rate(self, t: int) -> float:
        """The local rate η of a round on parameters of the whole run's global update ``t`` (:meth:`clock`)."""
        cfg = self.cfg
        return decayed_rate(cfg["eta"], t, cfg["eta_decay"], cfg["eta_offset"], cfg.get("eta_horizon"),
                            cfg.get("eta_anneal", 1.0))

    def round(self, v: np.ndarray, version: int = 0) -> np.ndarray:
        """One pass of the outer loop on parameters ``v`` pulled at global update ``version``: return the
        update ``u - v``."""
        u, steps = self.vector.array, int(self.cfg["local_steps"])
        t = self.clock(version)
        eta = self.rate(t)
        u[:] = v  # line 3
        self.pool.begin(steps, eta, t)  # line 4
        try:
            hogwild_steps(u, self.problem, eta, steps, self.rng, self.name, t)
        finally:
            self.pool.finish()
        return u - v  # line 10

    def round_columns(self, v: np.ndarray, version: int = 0) -> ColumnUpdate:
        """:meth:`round` for column-sparse pushes (one Hogwild process): the same ``B`` SVI-type steps, by
        the problem's ``column_step``, returned as a :class:`~frugalrl.dpsgd.sparse.ColumnUpdate`. :meth:`run`
        pushes it densely instead (``u − v``, the same update) when that is no larger and ``base`` is ``pulled``."""
        u, steps = self.vector.array, int(self.cfg["local_steps"])
        eta = self.rate(self.clock(version))
        problem: Any = self.problem
        u[:] = v
        touched = []
        for _ in range(steps):
            touched.append(problem.column_step(u, eta, self.rng))
        if not np.isfinite(u).all():
            raise ValueError(
                f"problem {self.name!r}: column_step() made the parameters non-finite (NaN or inf); "
                "the run diverged: lower eta or rho"
            )
        decay = (1.0 - eta) ** steps
        return ColumnUpdate.from_step(
            u, v, problem.column_shape, decay, problem.decay_target, np.concatenate(touched),
            self.cfg.get("column_base", "pulled"),
        )

    def run(self, exchange: Callable[[Message], Message]) -> None:
        """Pull, compute, push until the server answers ``stop``; errors go to the server as ``error``.

        ``exchange`` raises :class:`~frugalrl.process.ParentGone` when the server cannot be reached; that
        ends the run quietly (there is nobody left to tell).
        """
        steps = int(self.cfg["local_steps"]) * int(self.cfg["processes"])
        try:
            reply = exchange(self._request(Message("pull")))
            while reply.op == "params":
                try:
                    v = pulled_params(reply, self.held, self.vector.array.size)
                except DeltaError:  # the server coded against words this worker does not hold: a full copy
                    self.held.clear()
                    reply = exchange(self._request(Message("pull")))
                    continue
                version = reply.meta["version"]
                if self.columns:
                    cols = self.round_columns(v, int(version))
                    if not cols.smaller_than_dense():  # the batch touched (nearly) every column
                        update = self.vector.array - v  # the same update, as the dense push
                    else:
                        reply = exchange(self._request(cols.message(version, steps, self.cfg["update_codec"])))
                        continue
                else:
                    update = self.round(v, int(version))
                push = Message("push", {"version": version, "steps": steps}, {"grad/w": update},
                               {"grad/w": self.cfg["update_codec"]})
                reply = exchange(self._request(push))
        except ParentGone:
            raise
        except Exception as e:  # noqa: BLE001 - reported to the server, which raises it in the caller
            exchange(error_message(e))

    def _request(self, msg: Message) -> Message:
        """``msg``, telling the server which parameters' version this worker holds (what a delta pull applies to)."""
        if self.held.version is not None:
            msg.meta["held"] = self.held.version
        return msg

    def close(self) -> None:
        """Stop the helpers and free the shared memory."""
        self.pool.close()
        self.vector.close()


def worker_entry() -> None:
    """Entry point of a worker process (:func:`frugalrl.process.spawn`): build a :class:`DPSGDWorker` from
    the config (answering ``ready`` or ``error``), then run it against the server on the other end."""
    link = ParentLink.from_argv()
    try:
        worker = link.start(DPSGDWorker)
    except ParentGone:
        return
    if worker is None:
        return  # the error went to the server
    try:
        worker.run(link.exchange)
    except ParentGone:
        pass  # the server went away: nobody to tell
    finally:
        worker.close()
        link.close()


class _HelperProcess:
    """What a helper process computes with: its problem, the worker's ``u`` and its own sample stream."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.index = int(cfg["process"])
        self.name = cfg["problem"]
        self.problem = load_problem(self.name, cfg["problem_kwargs"])
        self.vector = SharedVector.attach(int(cfg["fd"]), int(cfg["size"]))
        self.rng = make_rng(cfg["seed"], cfg["worker"], self.index)

    def steps(self, eta: float, steps: int, version: int) -> None:
        """Alg. 2, lines 5-9, on the shared ``u``, pulled at the whole run's global update ``version``."""
        hogwild_steps(self.vector.array, self.problem, eta, steps, self.rng, self.name, version)


def hogwild_entry() -> None:
    """Entry point of a helper process: attach ``u``, then run ``B`` Hogwild steps per ``run`` request."""
    link = ParentLink.from_argv()
    try:
        helper = link.start(_HelperProcess)
        if helper is None:
            return  # the error went to the worker
        while True:
            msg = link.recv()
            if msg.op != "run":
                return
            try:
                helper.steps(float(msg.meta["eta"]), int(msg.meta["steps"]), int(msg.meta["version"]))
            except Exception as e:  # noqa: BLE001 - reported to the worker, which reports to the server
                link.send(error_message(e, f"Hogwild process {helper.index}: "))
                return
            link.send(Message("done"))
    except ParentGone:
        return
    finally:
        link.close()
