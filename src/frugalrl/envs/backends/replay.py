"""The replay backend: a load generator that measures the head alone.

Capacity questions (how many workers can one learner serve?) need many workers, and 256 real ones do not fit on a
small machine. Here one real :class:`~frugalrl.envs.worker.EnvWorker` (worker 0's config, in this process) acts with
the learner's first weights and records a few rollout fragments, with the real uplink codecs; then every emulated
worker answers its ``rollout`` requests with one of those recordings (as encoded bytes) and its ``weights`` requests
as a worker does. The head does all of its own work for real: it encodes each request, decodes each reply from its
bytes, meters both, computes AAPS's KL on each worker's states and assembles the batch. What it does not pay for is
the workers' (their envs, their inference, their encoding): answers come at once. A reply's header names the
source's version and index (a few bytes off the emulated worker's own), set right after decoding.

The data is real but stale: fragments recorded with the first policy, so a learner that moves on sees growing
importance ratios and KLs (AAPS syncs at least as often as with real workers). ``reset`` is answered with a
recorded reset; other requests (``step``, checkpoints, calls) get an error naming the backend.

:meth:`ReplayBackend.pace` sets how fast the emulated workers step (env steps per second each, as real workers on
cores of their own): a rollout reply is then due that long after its request went out, and the head takes the
replies in the order they fall due, waiting where it is ahead, as it would for real workers. Unpaced, every reply
is there at once, and the head's time is its serving cost alone.
"""

from __future__ import annotations

import time

from frugalrl.envs.backends.base import Backend, WorkerConfig, WorkerFailure, build_worker
from frugalrl.wire import headers
from frugalrl.wire.cache import WireCache
from frugalrl.wire.headers import HeaderBook
from frugalrl.wire.message import Message, encode_message, uncarried
from frugalrl.wire.meter import DOWN, UP, ByteMeter

#: Distinct rollout fragments recorded per ``num_steps`` (emulated workers cycle through them).
RECORDINGS = 4


class ReplayBackend(Backend):
    """Emulated workers replaying one real worker's recorded traffic (see the module's docstring)."""

    name = "replay"

    def __init__(self, configs: list[WorkerConfig], meter: ByteMeter, timeout: float) -> None:
        super().__init__(configs, meter, timeout)
        self._wire = WireCache()
        self._source = build_worker(configs[0])
        self._reset: bytes | None = None
        self._fragments: dict[int, list[bytes]] = {}  # num_steps -> encoded rollout replies
        self._served = [0] * len(configs)
        self._held = [-1] * len(configs)  # the version each emulated worker holds
        self._books = [(HeaderBook(), HeaderBook()) for _ in configs]  # down, up
        self._steps_per_second: float | None = None

    def pace(self, steps_per_second: float | None) -> None:
        """Emulated workers step ``steps_per_second`` env steps per second each (None: they answer at once)."""
        if steps_per_second is not None and not steps_per_second > 0:
            raise ValueError(f"steps_per_second must be positive or None, got {steps_per_second!r}")
        self._steps_per_second = steps_per_second

    def start(self) -> dict[int, str]:
        """Nothing to start: the source worker was built with the backend."""
        return {}

    def request(self, requests: dict[int, Message]) -> dict[int, Message | WorkerFailure]:
        """Encode and meter each request, answer it from the recordings, decode and meter the reply."""
        due: list[tuple[float, int, bytes]] = []
        for w, msg in requests.items():
            _, sizes = headers.pack(*self._wire.encode(msg), self._books[w][0])  # sizes as the link carries it
            self.meter.add_message(sizes, w, DOWN)
            posted = time.perf_counter()
            due.append((posted + self._busy_seconds(w, msg), w, self._answer(w, msg)))
        replies: dict[int, Message | WorkerFailure] = {}
        for at, w, data in sorted(due):  # in the order the replies fall due, waiting for one not yet due
            ahead = at - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            reply, up = self._wire.decode(data)
            _, up = headers.pack(data, up, self._books[w][1])  # as a worker's end of the link would send it
            self.meter.add_message(up, w, UP)
            if reply.op == "rollout":  # the recording's header named the source's version and index
                reply.meta.update(version=self._held[w], worker=w)
            replies[w] = reply
        return {w: replies[w] for w in requests}

    def _busy_seconds(self, w: int, msg: Message) -> float:
        """How long emulated worker ``w`` steps to answer ``msg`` at the set pace (0: unpaced, or not a rollout)."""
        if self._steps_per_second is None or msg.op != "rollout":
            return 0.0
        return int(msg.meta["num_steps"]) * self.configs[w].num_envs / self._steps_per_second

    def _answer(self, w: int, msg: Message) -> bytes:
        """The encoded reply of emulated worker ``w`` to ``msg`` (weights it carries are taken first)."""
        msg, inside = uncarried(msg)
        if inside is not None:
            self._answer(w, inside)
        if msg.op == "weights":
            if self._source.version < 0 or not self._fragments:  # the source acts with the first weights
                self._source.handle(msg)
            self._held[w] = int(msg.meta["version"])
            return encode_message(Message("ok", {"worker": w, "version": self._held[w]}))[0]
        if msg.op == "reset":
            if self._reset is None:
                self._reset = encode_message(self._recorded(msg))[0]
            return self._reset
        if msg.op == "rollout":
            recorded = self._fragments.setdefault(int(msg.meta["num_steps"]), [])
            while len(recorded) < RECORDINGS:
                recorded.append(encode_message(self._recorded(msg))[0])
            self._served[w] += 1
            return recorded[(w + self._served[w]) % RECORDINGS]
        return encode_message(Message("error", {"error": f"the replay backend does not answer {msg.op!r} requests",
                                                "worker": w}))[0]

    def _recorded(self, msg: Message) -> Message:
        """The source worker's reply to ``msg``, to record; its error raises here, never replayed (a load generator
        whose env failed has nothing to replay)."""
        reply = self._source.handle(msg)
        if reply.op == "error":
            raise RuntimeError(f"the replay backend's source worker failed: {reply.meta.get('error')}")
        return reply

    def restart(self, worker: int) -> None:
        """An emulated worker never dies; a restart forgets what it holds."""
        self._posted.pop(worker, None)
        self._held[worker] = -1
        self._books[worker] = (HeaderBook(), HeaderBook())

    def close(self) -> None:
        """Close the source worker's envs."""
        self._source.close()

