"""When weights move from the learner to the workers: EveryUpdate, Interval(n), AAPS(delta).

A sync rule sees, for each worker, the policy version it holds and (for AAPS) a way to estimate
KL(behaviour ‖ learner) on that worker's recent states, and returns the workers to send the
current weights to. Only those workers receive weights, so a skipped sync saves its bytes.

AAPS (Adaptive Actor Policy Synchronization, Lafuente-Mercado's ClusterEnv paper) is :class:`AAPS`. Unlike the
paper's public code, the KL is measured on the *same* states for both policies: the states a
worker visited in its last fragment and the behaviour-distribution parameters it recorded there,
against the learner's distribution on those states. It is a mean per worker, not a sum over envs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class SyncContext:
    """What a rule may look at when the learner's version is ``learner_version``."""

    learner_version: int
    worker_versions: list[int | None]  # None: the worker has never received weights
    kl: Callable[[int], float | None]  # mean KL(behaviour ‖ learner) on a worker's recent states


class SyncRule:
    """Base class: decides which workers receive the learner's current weights."""

    def select(self, ctx: SyncContext) -> list[int]:
        """Workers to sync now."""
        raise NotImplementedError

    @property
    def lag_bound(self) -> int | None:
        """The most learner updates a worker's policy can lag under this rule (None: unbounded)."""
        return None

    def describe(self) -> str:
        """Short name for logs."""
        return type(self).__name__


def _stale(ctx: SyncContext) -> list[int]:
    return [w for w, v in enumerate(ctx.worker_versions) if v != ctx.learner_version]


@dataclass
class EveryUpdate(SyncRule):
    """Send weights to every worker whenever the learner's weights changed (the baseline)."""

    @property
    def lag_bound(self) -> int | None:
        """1: the workers act with the policy of the last update."""
        return 1

    def select(self, ctx: SyncContext) -> list[int]:
        """Every worker that does not hold the current version."""
        return _stale(ctx)

    def describe(self) -> str:
        """``every``."""
        return "every"


@dataclass
class Interval(SyncRule):
    """Send weights to a worker once it is ``n`` or more learner versions behind."""

    n: int = 1

    @property
    def lag_bound(self) -> int | None:
        """``n``."""
        return self.n

    def __post_init__(self) -> None:
        if int(self.n) < 1:
            raise ValueError(f"Interval(n) needs n >= 1, got {self.n}")

    def select(self, ctx: SyncContext) -> list[int]:
        """Workers without weights, or ``n`` versions behind."""
        chosen = []
        for w in _stale(ctx):
            held = ctx.worker_versions[w]
            if held is None or ctx.learner_version - held >= self.n:
                chosen.append(w)
        return chosen

    def describe(self) -> str:
        """``interval(n)``."""
        return f"interval({self.n})"


@dataclass
class AAPS(SyncRule):
    """AAPS: sync a worker when mean KL(its behaviour policy ‖ learner) on its recent states exceeds δ.

    ``max_lag`` (the guard, 20 by default; None turns it off) also syncs a worker that is that many learner
    versions behind, whatever its KL. The KL is measured on the states the worker's own, older policy
    visits; where the learner improves elsewhere (a sparse reward the old policy never reaches) it can stay
    under δ indefinitely, and the workers would keep acting with their first policy
    (docs/benchmarks.md#aaps-lag-guard). The bound also caps how far off-policy the data can get.
    """

    delta: float = 0.05
    max_lag: int | None = 20

    @property
    def lag_bound(self) -> int | None:
        """The guard's ``max_lag`` (None without it)."""
        return self.max_lag

    def __post_init__(self) -> None:
        if not self.delta > 0:
            raise ValueError(f"AAPS(delta) needs delta > 0, got {self.delta}")
        if self.max_lag is not None and self.max_lag < 1:
            raise ValueError(f"AAPS max_lag must be >= 1, got {self.max_lag}")

    def select(self, ctx: SyncContext) -> list[int]:
        """Workers without weights, without recent data, or whose KL exceeds δ."""
        chosen = []
        for w in _stale(ctx):
            held = ctx.worker_versions[w]
            if held is None:
                chosen.append(w)
                continue
            if self.max_lag is not None and ctx.learner_version - held >= self.max_lag:
                chosen.append(w)
                continue
            kl = ctx.kl(w)
            if kl is None or kl > self.delta:
                chosen.append(w)
        return chosen

    def describe(self) -> str:
        """``aaps(δ)``, or ``aaps(δ, lag≤L)`` with a max lag."""
        return f"aaps({self.delta:g})" if self.max_lag is None else f"aaps({self.delta:g}, lag<={self.max_lag})"


def lag_guard(max_lag: int | None, fraction: float | None, num_updates: int) -> int | None:
    """AAPS's guard for a run of ``num_updates`` updates: ``max_lag``, lowered to a ``fraction`` of the run
    (rounded down, at least 1) where that is smaller; None without ``max_lag`` (KL only).

    A fixed guard of 20 is out of reach in a run of 5 large updates, where AAPS's KL can stay under δ to the end
    and the workers keep their first policy (docs/benchmarks.md#aaps-lag-guard)."""
    if max_lag is None or fraction is None:
        return max_lag
    return max(1, min(max_lag, int(fraction * num_updates + 1e-9)))


def make_sync_rule(name: str, kl_threshold: float = 0.05, interval: int = 1, max_lag: int | None = 20) -> SyncRule:
    """Build a rule from its CLI name: ``every``, ``interval`` or ``aaps`` (with ``max_lag``, its guard)."""
    name = name.lower()
    if name in ("every", "everyupdate", "every-update"):
        return EveryUpdate()
    if name == "interval":
        return Interval(interval)
    if name in ("aaps", "kl", "adaptive", "adaptivekl"):
        return AAPS(kl_threshold, max_lag)
    raise ValueError(f"unknown sync rule {name!r}; expected 'every', 'interval' or 'aaps'")
