"""When ClusterEnv replaces a worker that died or hung, and when it gives up: a crash-loop rule, not a budget.

A days-long run sees workers die for reasons that have nothing to do with it (a node's OOM killer, a preempted
pod, a stray signal), so a worker that dies after it has completed requests is always replaced, at once. A worker
that dies again before completing a single request since it was (re)started is in a crash loop: it is retried
after a back-off that doubles (``first_delay``, then 2×, 4×, ... up to ``max_delay``), at most ``max_tries`` times
in a row, then :class:`WorkersFailed` is raised with the worker's last errors. This is the rule of systemd's
``StartLimitBurst`` and of RLlib's restarted env runners; errors a worker reports (an env that raises) are not
deaths and are never retried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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
    max_tries: int = 5
    """Restarts in a row of a worker that completed no request in between, before giving up."""
    first_delay: float = 0.5
    """Back-off before the second restart in a row (seconds); it doubles with each further one."""
    max_delay: float = 30.0
    """The longest back-off (seconds)."""
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
