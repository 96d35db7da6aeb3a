"""ByteMeter: every byte that crosses a process or machine boundary, counted by kind.

The head of a ClusterEnv (and every later transport) records each message it sends or
receives here. Counts are *logical* bytes of the encoded message (header + payloads), so
the serial, local and Ray backends report the same numbers for the same traffic.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

#: The kinds every run reports, in a stable order. Other kinds may be added by later parts.
KINDS: tuple[str, ...] = (
    "observations",
    "actions",
    "rewards",  # rewards, terminations and truncations
    "behaviour",  # behaviour-distribution parameters (logits, or mean and log-std)
    "weights",
    "activations",
    "gradients",
    "info",  # episode statistics and other per-env infos
    "control",  # message headers, commands, versions
    "checkpoint",  # worker state fetched for a checkpoint, and sent back on resume
)

UP = "up"  # worker -> head
DOWN = "down"  # head -> worker


class ByteMeter:
    """Thread-safe counters of bytes by kind, by direction and by worker.

    >>> m = ByteMeter()
    >>> m.add("weights", 1024, worker=0, direction=DOWN)
    >>> m.total()
    1024
    """

    MAX_TALLY = 256  # distinct (worker, direction, sizes) held before they are added up

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_kind: dict[str, int] = defaultdict(int)
        self._by_dir: dict[tuple[str, str], int] = defaultdict(int)
        self._by_worker: dict[tuple[int, str], int] = defaultdict(int)
        self._messages = 0
        # Messages not yet added to the counters, by (worker, direction, sizes): a step's messages have the same
        # sizes step after step, so recording one is a single dict update; the readers add them up first.
        self._tally: dict[tuple[int | None, str, tuple[tuple[str, int], ...]], int] = {}

    def add(self, kind: str, nbytes: int, worker: int | None = None, direction: str = UP) -> None:
        """Record ``nbytes`` of ``kind`` moving in ``direction`` (to/from ``worker`` if known)."""
        if nbytes < 0:
            raise ValueError(f"negative byte count {nbytes} for kind {kind!r}")
        with self._lock:
            self._by_kind[kind] += nbytes
            self._by_dir[(direction, kind)] += nbytes
            if worker is not None:
                self._by_worker[(worker, kind)] += nbytes

    def add_message(self, sizes: dict[str, int], worker: int | None, direction: str) -> None:
        """Record one message whose encoded size split by kind is ``sizes``."""
        key = (worker, direction, tuple(sizes.items()))
        with self._lock:  # once per message: this runs on every step of every worker
            count = self._tally.get(key)
            if count is not None:
                self._tally[key] = count + 1
                return
            if any(n < 0 for n in sizes.values()):
                raise ValueError(f"negative byte count in {sizes}")
            if len(self._tally) >= self.MAX_TALLY:
                self._add_tally()
            self._tally[key] = 1

    def _add_tally(self) -> None:
        """Add the tallied messages to the counters (the caller holds the lock)."""
        for (worker, direction, sizes), count in self._tally.items():
            self._messages += count
            for kind, n in sizes:
                self._by_kind[kind] += n * count
                self._by_dir[(direction, kind)] += n * count
                if worker is not None:
                    self._by_worker[(worker, kind)] += n * count
        self._tally.clear()

    def by_kind(self) -> dict[str, int]:
        """Bytes per kind (every kind in :data:`KINDS` present, zero if unused)."""
        with self._lock:
            self._add_tally()
            out = {k: 0 for k in KINDS}
            out.update(self._by_kind)
            return out

    def total(self) -> int:
        """All bytes counted so far."""
        with self._lock:
            self._add_tally()
            return sum(self._by_kind.values())

    def kind_total(self, kind: str) -> int:
        """Bytes counted for one kind."""
        with self._lock:
            self._add_tally()
            return self._by_kind.get(kind, 0)

    def worker_bytes(self, worker: int, kind: str | None = None) -> int:
        """Bytes to and from ``worker`` (of one ``kind`` if given)."""
        with self._lock:
            self._add_tally()
            if kind is not None:
                return self._by_worker.get((worker, kind), 0)
            return sum(v for (w, _), v in self._by_worker.items() if w == worker)

    def by_direction(self) -> dict[str, dict[str, int]]:
        """Bytes per kind in each direction: ``{"up": {kind: n, ...}, "down": {...}}`` (kinds seen so far)."""
        with self._lock:
            self._add_tally()
            return {d: {k: v for (d_, k), v in self._by_dir.items() if d_ == d} for d in (UP, DOWN)}

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary: ``{kind: bytes, ..., "total": n, "up": {...}, "down": {...}, "per_worker": {...}}``
        (``per_worker`` by worker index over the whole run: after a resume on fewer workers, those that left keep
        their counts)."""
        by_kind = self.by_kind()
        directions = self.by_direction()
        up, down = directions[UP], directions[DOWN]
        with self._lock:
            self._add_tally()
            per_worker: dict[str, dict[str, int]] = defaultdict(dict)
            for (w, k), v in sorted(self._by_worker.items()):
                per_worker[str(w)][k] = v
            messages = self._messages
        return {
            **by_kind,
            "total": sum(by_kind.values()),
            "up": up,
            "down": down,
            "per_worker": dict(per_worker),
            "messages": messages,
        }

    def state_dict(self) -> dict[str, Any]:
        """Every counter, as JSON (for checkpoints): :meth:`load_state_dict` continues counting from it."""
        with self._lock:
            self._add_tally()
            return {
                "by_kind": dict(self._by_kind),
                "by_dir": [[d, k, v] for (d, k), v in self._by_dir.items()],
                "by_worker": [[w, k, v] for (w, k), v in self._by_worker.items()],
                "messages": self._messages,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace every counter by those of :meth:`state_dict`."""
        with self._lock:
            self._add_tally()
            self._by_kind = defaultdict(int, {str(k): int(v) for k, v in state["by_kind"].items()})
            self._by_dir = defaultdict(int, {(str(d), str(k)): int(v) for d, k, v in state["by_dir"]})
            self._by_worker = defaultdict(int, {(int(w), str(k)): int(v) for w, k, v in state["by_worker"]})
            self._messages = int(state["messages"])

    def reset(self) -> None:
        """Forget everything counted so far."""
        with self._lock:
            self._tally.clear()
            self._by_kind.clear()
            self._by_dir.clear()
            self._by_worker.clear()
            self._messages = 0
