"""Gymnasium's asynchronous vector-env calls on ClusterEnv: ``reset_async`` / ``reset_wait``, ``step_async`` /
``step_wait`` (:class:`AsyncCalls`, a base class).

The ``*_async`` call checks its arguments at once, as AsyncVectorEnv does, and runs the requests in a helper thread;
``*_wait(timeout)`` waits for that thread and raises ``multiprocessing.TimeoutError`` when it does not end in time.
One call at a time: any other call before the wait raises ``AlreadyPendingCallError``, a wait without its call
``NoAsyncCallError``. A call whose wait timed out still runs to its end (the workers answer in order): the next call
first waits for it, and drops its result. ``close()`` while a call is pending warns and waits for it.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gymnasium import logger
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError


class EnvClosedError(ClosedEnvironmentError, RuntimeError):
    """A call on a closed ClusterEnv (Gymnasium's ``ClosedEnvironmentError``, and a ``RuntimeError``)."""


class _Call(threading.Thread):
    def __init__(self, name: str, run: Callable[[], Any]) -> None:
        super().__init__(name=f"ClusterEnv.{name}_async", daemon=True)
        self.call, self.run_fn = name, run
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.run_fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by the wait
            self.error = e


class AsyncCalls:
    """``reset_async`` / ``reset_wait`` and ``step_async`` / ``step_wait`` of ClusterEnv."""

    _pending: _Call | None = None  # the call whose wait has not come yet
    _stale: _Call | None = None  # a call whose wait timed out, perhaps still running
    closed: bool

    if TYPE_CHECKING:  # ClusterEnv's: check the arguments, return what sends the requests and reads the replies
        def _reset_prepare(self, seed: Any, options: Any) -> Callable[[], Any]: ...
        def _step_prepare(self, actions: Any) -> Callable[[], Any]: ...

    def _idle(self, op: str) -> None:
        """Raise unless the env is open with no call pending; wait for a call whose wait timed out."""
        if self.closed:
            raise EnvClosedError(f"this ClusterEnv is closed: `{op}` after a call to `close()`")
        if self._pending is not None:
            state = self._pending.call
            raise AlreadyPendingCallError(
                f"Calling `{op}` while waiting for a pending call to `{state}` to complete.", state)
        if self._stale is not None:
            self._stale.join()
            self._stale = None

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Start :meth:`reset` (arguments checked now); :meth:`reset_wait` returns its result."""
        self._idle("reset_async")
        self._start("reset", self._reset_prepare(seed, options))

    def reset_wait(self, timeout: float | None = None) -> Any:
        """The result of the pending :meth:`reset_async` (``multiprocessing.TimeoutError`` after ``timeout`` s)."""
        return self._wait("reset", timeout)

    def step_async(self, actions: Any) -> None:
        """Start :meth:`step` with ``actions`` (checked now); :meth:`step_wait` returns its result."""
        self._idle("step_async")
        self._start("step", self._step_prepare(actions))

    def step_wait(self, timeout: float | None = None) -> Any:
        """The result of the pending :meth:`step_async` (``multiprocessing.TimeoutError`` after ``timeout`` s)."""
        return self._wait("step", timeout)

    def _start(self, name: str, run: Callable[[], Any]) -> None:
        call = _Call(name, run)
        self._pending = call
        call.start()

    def _wait(self, name: str, timeout: float | None) -> Any:
        if self.closed:
            raise EnvClosedError(f"this ClusterEnv is closed: `{name}_wait` after a call to `close()`")
        call = self._pending
        if call is None or call.call != name:
            raise NoAsyncCallError(f"Calling `{name}_wait` without any prior call to `{name}_async`.", name)
        call.join(timeout)
        self._pending = None
        if call.is_alive():
            self._stale = call
            raise multiprocessing.TimeoutError(f"The call to `{name}_wait` has timed out after {timeout} second(s).")
        if call.error is not None:
            raise call.error
        return call.result

    def _settle(self) -> None:
        """Before closing: wait for a pending call (warning as AsyncVectorEnv does) or one whose wait timed out."""
        if self._pending is not None:
            logger.warn(f"Calling `close` while waiting for a pending call to `{self._pending.call}` to complete.")
            self._stale, self._pending = self._pending, None
        if self._stale is not None:
            self._stale.join()
            self._stale = None
