"""The serial backend: every worker in this process, called in turn. The reference for tests."""

from __future__ import annotations

from frugalrl.envs.backends.base import Backend, WorkerFailure
from frugalrl.envs.worker import EnvWorker
from frugalrl.wire.message import Message, message_sizes
from frugalrl.wire.meter import DOWN, UP


class SerialBackend(Backend):
    """Runs the workers one after another in the calling process (debuggable, deterministic)."""

    name = "serial"

    def start(self) -> None:
        """Build every worker in this process."""
        self.workers = [self._build(c) for c in self.configs]

    @staticmethod
    def _build(c) -> EnvWorker:
        return EnvWorker(c.index, c.env_spec, c.num_envs, c.first_env, c.autoreset_mode, c.check_finite, c.seed)

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
        self.workers[worker].close()
        self.workers[worker] = self._build(self.configs[worker])

    def close(self) -> None:
        """Close every env."""
        for w in getattr(self, "workers", []):
            w.close()
        self.workers = []
