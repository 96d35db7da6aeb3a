"""Workers in the calling process: the serial backend (all of them; the reference for tests) and the local
backend's in-process workers (:class:`InProcessWorkers`).

A worker in this process is called directly: nothing is encoded, and each message is metered with the sizes its
encoding would have (:meth:`~frugalrl.wire.cache.WireCache.sizes`), so that every backend counts the same bytes.
Such a worker cannot die on its own or be timed out: an env that crashes the process or hangs takes the caller
with it, which is why only the local backend's ``inline_workers`` (and this backend) run envs here.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from frugalrl.envs.backends.base import Backend, WorkerConfig, WorkerFailure, WorkerStartFailed, build_worker
from frugalrl.npactor import one_blas_thread
from frugalrl.wire.cache import WireCache, shape_key
from frugalrl.wire.headers import NUMBERED, HeaderBook, send_sizes
from frugalrl.wire.message import Message
from frugalrl.wire.meter import DOWN, UP, ByteMeter

if TYPE_CHECKING:
    from frugalrl.envs.worker import EnvWorker

log = logging.getLogger("frugalrl")


class InProcessWorkers:
    """Workers of some indices, built and called in this process; requests are posted, then answered in turn."""

    def __init__(self, configs: dict[int, WorkerConfig], meter: ByteMeter) -> None:
        self.configs = configs
        self.meter = meter
        self.workers: dict[int, EnvWorker] = {}
        self.posted: dict[int, tuple[Message, bool]] = {}  # worker -> (request, metered)
        self._wire = WireCache()
        self._books = {w: (HeaderBook(), HeaderBook()) for w in configs}  # down, up: as a link's two ends keep them
        # Sizes as sent of the message shapes whose header a book has numbered (for good: numbers are never
        # dropped), by (worker, direction, shape): such a message costs a lookup to meter.
        self._numbered: dict[tuple[int, str, tuple], dict[str, int]] = {}

    def __contains__(self, worker: object) -> bool:
        return worker in self.configs

    def start(self) -> None:
        """Build every worker (an env that fails to build raises here)."""
        for w, config in self.configs.items():
            self.workers[w] = build_worker(config)

    def post(self, worker: int, msg: Message, meter: bool = True) -> None:
        """Take a request for ``worker`` (answered by :meth:`answer`)."""
        if worker in self.posted:
            raise RuntimeError(f"worker {worker} already has a request in flight")
        if meter:
            self._meter(worker, DOWN, msg)
        self.posted[worker] = (msg, meter)

    def answer(self, worker: int) -> Message:
        """Run ``worker`` on its posted request; its reply (an ``error`` reply if the request raised)."""
        msg, meter = self.posted.pop(worker)
        # A rollout's inference on one BLAS thread, as a worker process's: not the head's threads, spinning on the
        # cores the worker processes step on (the limit costs tens of µs: a rollout's, not every step's).
        with one_blas_thread() if msg.op == "rollout" else contextlib.nullcontext():
            reply = self.workers[worker].handle(msg)
        if meter:
            self._meter(worker, UP, reply)
        return reply

    def _meter(self, worker: int, direction: str, msg: Message) -> None:
        """Count ``msg`` as the link's ``direction`` would carry it, its header numbered once the book has it."""
        shape = shape_key(msg)
        sent = None if shape is None else self._numbered.get((worker, direction, shape))
        if sent is None:
            short, sent = send_sizes(self._books[worker][direction == UP], *self._wire.sizes(msg))
            if shape is not None and short is not None and short[:4] == NUMBERED and len(self._numbered) < 4096:
                self._numbered[(worker, direction, shape)] = sent
        self.meter.add_message(sent, worker, direction)

    def restart(self, worker: int) -> None:
        """Rebuild a worker in place (its posted request, if any, is forgotten); :class:`WorkerStartFailed` if its
        envs cannot be built, as for a worker process that dies while starting."""
        self.posted.pop(worker, None)
        old = self.workers.pop(worker, None)
        if old is not None:
            try:
                old.close()
            except Exception as e:  # noqa: BLE001 - a broken env's close may fail too (its simulator is gone)
                log.warning("frugalrl: closing worker %d's envs failed: %s: %s", worker, type(e).__name__, e)
        try:
            self.workers[worker] = build_worker(self.configs[worker])
        except Exception as e:  # noqa: BLE001 - the crash-loop rule decides
            raise WorkerStartFailed(f"worker {worker} could not be rebuilt: {type(e).__name__}: {e}") from e
        self._books[worker] = (HeaderBook(), HeaderBook())
        self._numbered = {key: sent for key, sent in self._numbered.items() if key[0] != worker}

    def remove(self, worker: int) -> None:
        """Close ``worker``'s envs and forget it (its posted request too): it runs elsewhere from now on."""
        self.posted.pop(worker, None)
        old = self.workers.pop(worker, None)
        if old is not None:
            old.close()
        del self.configs[worker], self._books[worker]
        self._numbered = {key: sent for key, sent in self._numbered.items() if key[0] != worker}

    def close(self) -> None:
        """Close every env."""
        self.posted.clear()
        workers, self.workers = self.workers, {}
        for w in workers.values():
            w.close()


class SerialBackend(Backend):
    """Runs the workers one after another in the calling process (debuggable, deterministic)."""

    name = "serial"

    def __init__(self, configs: list[WorkerConfig], meter: ByteMeter, timeout: float) -> None:
        super().__init__(configs, meter, timeout)
        self.inline = InProcessWorkers(dict(enumerate(configs)), meter)

    @property
    def workers(self) -> list[EnvWorker]:
        """The workers, in index order."""
        return [self.inline.workers[w] for w in range(self.num_workers)]

    def start(self) -> dict[int, str]:
        """Build every worker in this process (none can die while starting)."""
        self.inline.start()
        return {}

    def request(self, requests: dict[int, Message]) -> dict[int, Message | WorkerFailure]:
        """Call each worker directly; bytes are metered as if the messages had been encoded."""
        replies: dict[int, Message | WorkerFailure] = {}
        for w, msg in requests.items():
            self.inline.post(w, msg)
            replies[w] = self.inline.answer(w)
        return replies

    def restart(self, worker: int) -> None:
        """Rebuild a worker in place."""
        self._posted.pop(worker, None)
        self.inline.restart(worker)

    def close(self) -> None:
        """Close every env."""
        self.inline.close()
