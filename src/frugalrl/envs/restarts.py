"""When ClusterEnv replaces a worker that died or hung, and when it gives up: a crash-loop rule, not a budget.

A days-long run sees workers die for reasons that have nothing to do with it (a node's OOM killer, a preempted
pod, a stray signal), so a worker that dies after it has completed requests is always replaced, at once. A worker
that dies again before completing a single request since it was (re)started is in a crash loop: it is retried
after a back-off that doubles (``first_delay``, then 2×, 4×, ... up to ``max_delay``), at most ``max_tries`` times
in a row, then :class:`WorkersFailed` is raised with the worker's last errors. The defaults give up on a worker
that can never start in about half a minute, and survive a worker killed every 1-3 s, startup included
(``benchmarks/soak.py``). This is the rule of systemd's
``StartLimitBurst`` and of RLlib's restarted env runners. Errors a worker reports are not deaths: an env that
raises (or returns a NaN) stops the call, unless ``on_env_error="restart"`` (RLlib's
``restart_failed_sub_environments``): then its worker is replaced as a dead one is, under the same rule, so that
an env that raises once a day does not end a week-long run, while one that cannot even reset is given up.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, get_args

from frugalrl.config import EnvErrorRule
from frugalrl.envs.backends.base import Backend, WorkerFailure, WorkerStartFailed
from frugalrl.process import resident_mb
from frugalrl.wire.message import Message

if TYPE_CHECKING:
    from frugalrl.sync_state import PolicySync

log = logging.getLogger("frugalrl")


def checked_env_error_rule(rule: Any) -> EnvErrorRule:
    """``rule`` if it is an :data:`EnvErrorRule`; else a ValueError naming the choices."""
    if rule not in get_args(EnvErrorRule):
        raise ValueError(f"on_env_error must be one of {get_args(EnvErrorRule)}, got {rule!r}")
    return rule


class WorkersFailed(RuntimeError):
    """A worker kept dying before completing any request: the restart rule gave up (the learner is intact)."""

    def __init__(self, worker: int, errors: list[str]) -> None:
        self.worker = worker
        self.errors = errors
        self.run_dir: str | None = None
        """The run directory whose checkpoint and summary were written before this was raised (the driver's)."""
        super().__init__(f"worker {worker} failed {len(errors)} times in a row with no completed request in between "
                         f"(last: {errors[-1]})")


@dataclass
class CrashLoopRule:
    """The restart rule of one ClusterEnv (see the module docstring)."""

    num_workers: int
    max_tries: int = 8
    """Restarts in a row of a worker that completed no request in between, before giving up."""
    first_delay: float = 0.25
    """Back-off before the second restart in a row (seconds); it doubles with each further one."""
    max_delay: float = 4.0
    """The longest back-off (seconds): a worker that can never start is given up in about half a minute."""
    completed: list[int] = field(init=False)
    """Requests each worker completed since it was last (re)started."""
    loop_errors: list[list[str]] = field(init=False)
    """The failures of each worker since its last completed request."""

    def __post_init__(self) -> None:
        if self.max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {self.max_tries!r}")
        self.completed = [0] * self.num_workers
        self.loop_errors = [[] for _ in range(self.num_workers)]

    def succeeded(self, worker: int) -> None:
        """Worker ``worker`` completed a request: it is not in a crash loop."""
        self.completed[worker] += 1
        self.loop_errors[worker].clear()

    def failed(self, worker: int, reason: str) -> float:
        """Worker ``worker`` died or hung with ``reason``: the seconds to wait before replacing it (0: at once).

        Raises :class:`WorkersFailed` when it failed ``max_tries`` times in a row without completing a request.
        """
        errors = self.loop_errors[worker]
        useful = self.completed[worker] > 0
        self.completed[worker] = 0
        if useful:
            errors.clear()
        errors.append(reason)
        if len(errors) > self.max_tries:
            raise WorkersFailed(worker, list(errors))
        return 0.0 if len(errors) == 1 else min(self.max_delay, self.first_delay * 2 ** (len(errors) - 2))

    def wait(self, worker: int, reason: str) -> None:
        """:meth:`failed`, then sleep its back-off."""
        delay = self.failed(worker, reason)
        if delay > 0:
            time.sleep(delay)


class Replacements:
    """How :class:`~frugalrl.envs.cluster.ClusterEnv` (a subclass) replaces workers: after a death, under the
    :class:`CrashLoopRule`, and when one outgrows ``worker_memory_mb`` (recycled between fragments)."""

    memory_check_s: float = 10.0
    """Seconds between two reads of the workers' memory (``worker_memory_mb``)."""

    backend: Backend
    restart_rule: CrashLoopRule
    on_env_error: EnvErrorRule
    restart_events: list[dict[str, Any]]
    recycle_events: list[dict[str, Any]]
    worker_memory_mb: float | None
    policies: PolicySync
    inline_workers: int
    _memory_checked: float
    _head_rss_base: float | None

    if TYPE_CHECKING:  # ClusterEnv's methods, declared for the type checker only
        def close(self, **kwargs: Any) -> None: ...
        def _reset_worker(self, w: int, seed: int | None, defer: bool = False) -> Message: ...

    def _failure(self, result: Message | WorkerFailure) -> str | None:
        """Why a worker's result means it must be replaced (it died or hung, or with ``on_env_error="restart"``
        its env raised), or None (a reply, an error one included, for the caller to read)."""
        if isinstance(result, WorkerFailure):
            return result.reason
        if result.op == "error" and result.meta.get("env") and self.on_env_error == "restart":
            return f"its {result.meta.get('error')}" if str(result.meta.get("error")).startswith("env ") else str(
                result.meta.get("error"))
        return None

    def _restart(self, w: int, reason: str) -> None:
        """Replace worker ``w`` under the crash-loop rule (:mod:`frugalrl.envs.restarts`): at once after useful
        work, with back-off when it keeps dying; :class:`WorkersFailed` (this env closed) when the rule gives up."""
        t0 = time.monotonic()
        while True:
            try:
                self.restart_rule.wait(w, reason)
            except WorkersFailed:
                self.close()
                raise
            log.warning("frugalrl: worker %d failed (%s); replacing it and resetting its envs", w, reason)
            try:
                self.backend.restart(w)
                break
            except WorkerStartFailed as e:
                reason = str(e)
        self.policies.forget(w)
        self.restart_events.append({"worker": w, "reason": reason, "time": time.time(),
                                    "seconds": round(time.monotonic() - t0, 3)})

    def _recycle_large_workers(self) -> list[int]:
        """Replace the workers over ``worker_memory_mb`` (between fragments or steps: nothing is lost but their
        episodes in progress, which start anew, as after a truncation); returns them, for the caller to reset their
        envs (at once before a rollout; as for a worker that failed during a step before a step)."""
        now = time.monotonic()
        if self.worker_memory_mb is None or now - self._memory_checked < self.memory_check_s:
            return []
        self._memory_checked = now
        replaced: list[int] = []
        for w, rss in self.backend.worker_rss_mb().items():
            if rss <= self.worker_memory_mb:
                continue
            log.warning("frugalrl: worker %d uses %.0f MB (over worker_memory_mb=%.0f); replacing it", w, rss,
                        self.worker_memory_mb)
            try:
                self.backend.restart(w)
            except WorkerStartFailed as e:
                self._restart(w, str(e))  # the replacement died while starting: the crash-loop rule decides
            self.policies.forget(w)
            self.recycle_events.append({"worker": w, "rss_mb": round(rss, 1), "time": time.time()})
            replaced.append(w)
        if self.backend.inline_ids():
            replaced += self._move_out_if_head_grew()
        return replaced

    def _move_out_if_head_grew(self) -> list[int]:
        """Inline workers have no process whose memory tells their envs' leaks apart: once this process has grown
        by ``worker_memory_mb`` since its first check, they move to processes of their own, where the bound
        applies to each (a leaking env stops growing the learner; what it leaked here stays)."""
        rss = resident_mb(os.getpid())
        if rss is None:
            return []
        if self._head_rss_base is None:
            self._head_rss_base = rss
            return []
        grown = rss - self._head_rss_base
        assert self.worker_memory_mb is not None, "checked by the caller"
        if grown <= self.worker_memory_mb:
            return []
        inline = self.backend.inline_ids()
        log.warning("frugalrl: this process grew by %.0f MB (over worker_memory_mb=%.0f) while it ran worker(s) %s "
                    "inline; moving them to processes of their own", grown, self.worker_memory_mb, inline)
        for w in inline:
            try:
                self.backend.move_out(w)
            except WorkerStartFailed as e:
                self._restart(w, str(e))  # as a recycled worker that dies while starting
            self.policies.forget(w)
            self.recycle_events.append({"worker": w, "rss_mb": round(rss, 1), "inline": True, "time": time.time()})
        self.inline_workers = len(self.backend.inline_ids())
        return inline
