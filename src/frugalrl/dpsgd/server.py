"""The DPSGD master (Alg. 1): the parameter server, independent of any transport.

:class:`ParameterServer` keeps the global parameters ``v`` and the global step ``t`` (the *version* of ``v``).
Workers pull ``v`` and push ``w = u - v_pulled``; once ``M`` updates have arrived the server applies
``v ← v + ρ Σ_m w_m`` (:func:`apply_update`; with master momentum μ: ``m ← μ m + Σ_m w_m``, ``v ← v + ρ m``) under
its lock, so no worker pulls a half-updated ``v`` (the paper's atomic update). With ``average_decay`` β > 0 it also
keeps the Polyak average ``v̄ ← β v̄ + (1 − β) v``, which it records and returns (:meth:`ParameterServer.result`)
while the workers still pull ``v``. The staleness of an update pulled at version ``s`` and applied by the step to
version ``t`` is ``τ = (t - 1) - s``, the paper's ``τ_{t,m}`` (docs/dpsgd.md, "The maths").

The server speaks :class:`~frugalrl.wire.Message` (:meth:`ParameterServer.handle`), behind any transport:

====== ============================================ =================================================
op     request (worker → server)                    reply (server → worker)
====== ============================================ =================================================
pull   meta ``held`` (optional)                     ``params``: ``w/v``, meta ``version``; or ``stop``
push   ``grad/w``, meta ``version``, steps, held    the next ``params`` (push and pull in one trip)
       (or column-sparse, meta ``format="columns"``:
       :mod:`frugalrl.dpsgd.sparse`)
error  meta ``error``, ``type``                     ``stop``
====== ============================================ =================================================

With ``pull_delta`` a worker that says which version it ``held`` gets only what changed (docs/dpsgd.md). In
synchronous mode (``M`` = workers) a worker's next pull waits until its round is applied (one update per worker).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from frugalrl.dpsgd.sparse import ColumnUpdate
from frugalrl.wire.delta import Words, to_words, weights_update
from frugalrl.wire.message import Message


def apply_update(
    v: np.ndarray,
    updates: Sequence[np.ndarray],
    rho: float,
    momentum: float = 0.0,
    velocity: np.ndarray | None = None,
) -> np.ndarray:
    """Alg. 1, line 4: ``v + ρ Σ_m w_m`` as a new float32 array (the sum runs in the given order).

    With ``momentum`` μ > 0 and the server's ``velocity`` buffer m (updated in place to ``μ m + Σ_m w_m``)
    the step is ``v + ρ m``: SGD with momentum on the master.
    """
    if not updates:
        raise ValueError("apply_update needs at least one update vector")
    total = np.array(updates[0], dtype=np.float32, copy=True)
    for w in updates[1:]:
        total += w
    if momentum:
        if velocity is None:
            raise ValueError("apply_update with momentum needs the velocity buffer")
        velocity *= np.float32(momentum)
        velocity += total
        total[...] = velocity
    total *= np.float32(rho)  # in place: the only new array is the result
    total += v
    return total


class ParameterServer:
    """The master of Alg. 1: global parameters, master batch, staleness statistics, stop rule.

    Thread-safe: a transport may call :meth:`handle` from one thread per worker connection. It
    stops itself after ``global_updates`` global steps (if given); :meth:`stop` stops it earlier
    (time limit) and :meth:`fail` stops it with an error that the caller then raises.
    """

    def __init__(
        self,
        params: np.ndarray,
        *,
        rho: float,
        momentum: float = 0.0,
        master_batch: int,
        workers: int,
        global_updates: int | None = None,
        synchronous: bool = False,
        log_every: int = 0,
        log_every_s: float | None = None,
        pull_codec: str = "fp32",
        pull_delta: bool = False,
        name: str = "problem",
        average_decay: float = 0.0,
    ) -> None:
        self.v = np.array(params, dtype=np.float32, copy=True)
        if not 0 <= average_decay < 1:
            raise ValueError(f"average_decay must lie in [0, 1), got {average_decay!r}")
        self.average_decay = float(average_decay)
        self.average = self.v if self.average_decay else None  # v̄: like v, never modified in place
        self.rho = float(rho)
        self.momentum = float(momentum)
        self.velocity = np.zeros_like(self.v) if self.momentum else None
        self.master_batch = int(master_batch)
        self.workers = int(workers)
        self.global_updates = global_updates
        self.synchronous = bool(synchronous)
        self.log_every = int(log_every)
        self.log_every_s = None if log_every_s is None else float(log_every_s)
        self._next_record_s = self.log_every_s or 0.0
        self.pull_codec = pull_codec
        self.pull_delta = bool(pull_delta)
        self._sent: dict[int, tuple[int, Words]] = {}  # worker: (version, words) of the params last sent to it
        self.name = name
        self.version = 0
        self._cond = threading.Condition()
        self._pending: list[tuple[int, np.ndarray, int]] = []  # (worker, update, pulled version)
        self._pushed_at = [-1] * self.workers  # synchronous mode: version each worker last pushed from
        self.staleness: Counter[int] = Counter()
        self.pulls = 0
        self.pushes = 0
        self.applied_updates = 0
        self.dropped_updates = 0
        self.gradient_steps = 0
        self.stop_reason: str | None = None
        self.failure: tuple[str, str] | None = None  # (exception type name, message)
        self._t0: float | None = None
        self._t_stop: float | None = None
        self._snapshots: list[tuple[float, int, np.ndarray]] = []
        self._last_pull: dict[int, tuple[int, np.ndarray]] = {}  # worker: (version, v) it last pulled

    # ------------------------------------------------------------------ clock and stopping
    def start_clock(self) -> None:
        """Mark the start of optimisation (loss-curve times and updates/s count from here)."""
        with self._cond:
            self._t0 = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since :meth:`start_clock` (until the stop, once stopped)."""
        with self._cond:
            if self._t0 is None:
                return 0.0
            end = self._t_stop if self._t_stop is not None else time.monotonic()
            return end - self._t0

    @property
    def stopped(self) -> bool:
        """Whether the server has stopped (workers get ``stop`` from now on)."""
        return self.stop_reason is not None

    def stop(self, reason: str) -> None:
        """Stop now (the first reason given is kept); updates still pending are dropped."""
        with self._cond:
            self._stop_locked(reason)

    def fail(self, worker: int | None, message: str, kind: str = "RuntimeError") -> bool:
        """Stop because of an error; the first failure is kept and raised by the caller of the run (True: this
        one)."""
        where = f"worker {worker}: " if worker is not None else ""
        with self._cond:
            first = self.failure is None
            if first:
                self.failure = (kind, where + message)
            self._stop_locked("failure")
        return first

    def _stop_locked(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self._t_stop = time.monotonic()
            self.dropped_updates += len(self._pending)
            self._pending.clear()
        self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a global update or the stop; return :attr:`stopped`."""
        with self._cond:
            if not self.stopped:
                self._cond.wait(timeout)
            return self.stopped

    # ------------------------------------------------------------------ Alg. 1
    def pull(self, worker: int) -> tuple[int, np.ndarray] | None:
        """``(version, v)`` for ``worker``, or None once stopped. ``v`` is never modified in place.

        In synchronous mode this waits until the round the worker last pushed for has been applied.
        """
        with self._cond:
            while self.synchronous and not self.stopped and self._pushed_at[worker] >= self.version:
                self._cond.wait(0.5)
            if self.stopped:
                return None
            self.pulls += 1
            self._last_pull[worker] = (self.version, self.v)  # v is never modified in place: a reference
            return self.version, self.v

    def push(self, worker: int, update: np.ndarray, pulled_version: int, steps: int = 0) -> None:
        """Collect ``w = u - v_pulled`` from ``worker``; apply the global update once ``M`` are in."""
        update = np.asarray(update)
        if update.shape != self.v.shape:
            raise ValueError(
                f"worker {worker} pushed an update of shape {update.shape}, expected {self.v.shape}"
            )
        if not np.isfinite(update).all():
            raise ValueError(
                f"problem {self.name!r}: worker {worker} pushed a non-finite update (NaN or inf): "
                "the local steps diverged; lower eta or rho"
            )
        with self._cond:
            self.pushes += 1
            self.gradient_steps += int(steps)
            if self.stopped:
                self.dropped_updates += 1
                return
            if not 0 <= pulled_version <= self.version:
                raise ValueError(f"worker {worker} pushed an update for unknown version {pulled_version}")
            if self.synchronous:
                if pulled_version != self.version or self._pushed_at[worker] == self.version:
                    raise RuntimeError(f"synchronous DPSGD: worker {worker} pushed out of turn")
                self._pushed_at[worker] = pulled_version
            self._pending.append((worker, update, int(pulled_version)))
            if len(self._pending) >= self.master_batch:
                self._apply_locked()

    def _apply_locked(self) -> None:
        """The atomic global update ``v ← v + ρ Σ_m w_m`` (called with the lock held)."""
        before = self.version
        self.v = apply_update(self.v, [w for _, w, _ in self._pending], self.rho, self.momentum, self.velocity)
        for _, _, pulled in self._pending:
            self.staleness[before - pulled] += 1
        self.applied_updates += len(self._pending)
        self._pending.clear()
        self.version += 1
        if self.average is not None:
            # v̄ + (1 − β)(v − v̄) = β v̄ + (1 − β) v, in one new array (v̄ is never modified in place)
            average = self.v - self.average
            average *= np.float32(1) - np.float32(self.average_decay)
            average += self.average
            self.average = average
        recorded = self.v if self.average is None else self.average
        if self.log_every_s is not None:  # a wall-clock cadence: the first update after each period
            now = self._now()
            if now >= self._next_record_s:
                self._snapshots.append((now, self.version, recorded))
                self._next_record_s = (math.floor(now / self.log_every_s) + 1) * self.log_every_s
        elif self.log_every and self.version % self.log_every == 0:
            self._snapshots.append((self._now(), self.version, recorded))
        if self.global_updates is not None and self.version >= self.global_updates:
            self._stop_locked("global_updates")
        self._cond.notify_all()

    def _now(self) -> float:
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    # ------------------------------------------------------------------ protocol
    def params_message(self, pulled: tuple[int, np.ndarray] | None, worker: int = 0, held: Any = None) -> Message:
        """The reply to a pull: ``params`` with ``w/v`` (in the pull codec), or ``stop``. With ``pull_delta``: the
        code words, as a delta against those last sent to ``worker`` where it says it ``held`` that version."""
        if pulled is None:
            return Message("stop", {"reason": self.stop_reason})
        version, v = pulled
        if not self.pull_delta:
            return Message("params", {"version": version}, {"w/v": v}, {"w/v": self.pull_codec})
        words = to_words({"v": v}, self.pull_codec)
        sent = self._sent.get(worker)  # only this worker's handler touches its entry
        base, base_version = (sent[1], sent[0]) if sent is not None and held == sent[0] else (None, None)
        update = weights_update(words, base, {"version": version, "codec": self.pull_codec}, base_version)
        self._sent[worker] = (version, words)
        return dataclasses.replace(update, op="params")

    def handle(self, worker: int, msg: Message) -> Message:
        """Answer one request of ``worker`` (see the module docstring); may block in synchronous mode."""
        held = msg.meta.get("held")
        if msg.op == "pull":
            return self.params_message(self.pull(worker), worker, held)
        if msg.op == "push":
            update: np.ndarray | None = (
                self.dense_update(worker, msg) if msg.meta.get("format") == "columns" else msg.arrays.get("grad/w")
            )
            if update is None:
                raise ValueError(f"worker {worker} sent a push without 'grad/w'")
            self.push(worker, update, int(msg.meta["version"]), int(msg.meta.get("steps", 0)))
            return self.params_message(self.pull(worker), worker, held)
        if msg.op == "error":
            self.fail(worker, str(msg.meta.get("error")), str(msg.meta.get("type", "RuntimeError")))
            return Message("stop", {"reason": "failure"})
        raise ValueError(f"worker {worker} sent an unknown operation {msg.op!r}")

    def pulled_params(self, worker: int, version: int) -> np.ndarray:
        """The ``v`` that ``worker`` pulled last, which must be ``version`` (``ValueError`` otherwise)."""
        with self._cond:
            last = self._last_pull.get(worker)
        if last is None or last[0] != version:
            raise ValueError(
                f"worker {worker} pushed a column update for version {version}, but its last pull was "
                f"{None if last is None else last[0]}"
            )
        return last[1]

    def dense_update(self, worker: int, msg: Message) -> np.ndarray:
        """The dense ``w`` of a column push (:mod:`frugalrl.dpsgd.sparse`), rebuilt against the ``v`` the
        worker pulled (``base="pulled"``) or the current ``v`` (``"current"``): the server then applies it as a
        dense push."""
        column = ColumnUpdate.from_message(msg)
        pulled = self.pulled_params(worker, int(msg.meta["version"]))
        return column.dense(pulled if column.base == "pulled" else self.snapshot()[1])

    # ------------------------------------------------------------------ results
    def drain_snapshots(self) -> list[tuple[float, int, np.ndarray]]:
        """``(seconds, version, v)`` recorded every ``log_every`` global updates (or ``log_every_s`` seconds)
        since the last call (``v̄`` instead of ``v`` with ``average_decay``)."""
        with self._cond:
            out, self._snapshots = self._snapshots, []
            return out

    def staleness_stats(self) -> dict[str, Any]:
        """``{"mean", "max", "histogram": {τ: count}, "count"}`` over every applied update."""
        with self._cond:
            hist = dict(sorted(self.staleness.items()))
        n = sum(hist.values())
        mean = sum(tau * c for tau, c in hist.items()) / n if n else 0.0
        return {"mean": mean, "max": max(hist, default=0), "histogram": hist, "count": n}

    def snapshot(self) -> tuple[int, np.ndarray]:
        """The current ``(version, v)``."""
        with self._cond:
            return self.version, self.v

    def result(self) -> tuple[int, np.ndarray]:
        """The current ``(version, parameters)`` the run delivers: the Polyak average ``v̄`` with
        ``average_decay``, else ``v``."""
        with self._cond:
            return self.version, self.v if self.average is None else self.average
