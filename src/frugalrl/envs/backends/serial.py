"""The serial backend: every worker in this process, called in turn. The reference for tests."""

from __future__ import annotations

from frugalrl.envs.backends.base import Backend, WorkerFailure, build_worker
from frugalrl.wire.message import Message, message_sizes
from frugalrl.wire.meter import DOWN, UP


class SerialBackend(Backend):
    """Runs the workers one after another in the calling process (debuggable, deterministic)."""

    name = "serial"

    def start(self) -> dict[int, str]:
        """Build every worker in this process (none can die while starting)."""
        self.workers = [build_worker(c) for c in self.configs]
        return {}

    def request(self, requests: dict[int, Message]) -> dict[int, Message | WorkerFailure]:
        """Call each worker directly; bytes are metered as if the messages had been encoded."""
        replies: dict[int, Message | WorkerFailure] = {}
        sizes_cache: dict[int, dict[str, int]] = {}
        for w, msg in requests.items():
            sizes = sizes_cache.setdefault(id(msg), message_sizes(msg))
            self.meter.add_message(sizes, w, DOWN)
            reply = self.workers[w].handle(msg)
            self.meter.add_message(message_sizes(reply), w, UP)
            replies[w] = reply
        return replies

    def restart(self, worker: int) -> None:
        """Rebuild a worker in place."""
        self._posted.pop(worker, None)
        self.workers[worker].close()
        self.workers[worker] = build_worker(self.configs[worker])

    def close(self) -> None:
        """Close every env."""
        for w in getattr(self, "workers", []):
            w.close()
        self.workers = []
