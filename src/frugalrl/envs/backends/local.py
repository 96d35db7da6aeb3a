"""The local backend: one OS process per worker, a socket pair for messages, shared memory for big ones; or, for
its first ``inline`` workers, the head's own process (stepped while the processes step theirs).

Workers are children of :mod:`frugalrl.process` (``python -c ...`` with ``subprocess``, not
``multiprocessing``): the user's main script is never re-imported (no ``if __name__ == "__main__"``
needed unless an env factory lives in it), nothing is pickled, the worker's config travels as a JSON
message and the worker answers ``ready`` or a named ``error``. A worker that dies is seen at once
through its pidfd; one that stops answering is declared dead after ``timeout`` seconds (and killed
with its process group). Workers ignore SIGINT (Ctrl-C is the head's to handle) and exit by themselves
within a second if the head disappears.

Each worker gets two shared-memory arenas (files in ``/dev/shm``, unlinked as soon as both sides
have mapped them, so nothing can leak): head→worker and worker→head. A message that fits its
arena is written there and only a 12-byte note travels on the socket; anything else goes through
the socket itself (:class:`~frugalrl.wire.channel.Channel` frames: a small frame is written with one
system call and usually read with one). Repeated message shapes skip the JSON header work
(:class:`~frugalrl.wire.cache.WireCache`), and a header that crossed twice crosses as its number (a
:class:`~frugalrl.wire.headers.HeaderBook` pair per worker, new with each worker process).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
import tempfile
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from frugalrl.envs.backends.base import (
    Backend,
    WorkerConfig,
    WorkerFailure,
    WorkerStartFailed,
    config_to_json,
    worker_from_json,
)
from frugalrl.envs.backends.serial import InProcessWorkers
from frugalrl.process import Child, ParentGone, ParentLink, spawn, spin
from frugalrl.wire import headers
from frugalrl.wire.cache import WireCache
from frugalrl.wire.channel import POLLIN, Channel
from frugalrl.wire.headers import HeaderBook
from frugalrl.wire.message import Message, encode_message
from frugalrl.wire.meter import DOWN, UP, ByteMeter
from frugalrl.wire.shared import MAGIC as SHARED_MAGIC
from frugalrl.wire.shared import SharedFrames

if TYPE_CHECKING:
    from frugalrl.envs.worker import EnvWorker

_ENTRY = "frugalrl.envs.backends.local:worker_entry"
_SHM_NOTE = struct.Struct("<4sQ")
_SHM_MAGIC = b"SHM!"
_MIN_ARENA = 1 << 16
#: How long a process waiting for a message first polls without blocking (yielding its core between polls), unless
#: the environment variable ``FRUGALRL_SPIN_MS`` says otherwise (0: never): a message that comes within it is taken
#: without waking a sleeping process, which costs tens of microseconds (more in a virtual machine) on every step. A
#: worker spins only while requests have been coming that soon.
SPIN_S = 0.001


def spin_seconds() -> float:
    """:data:`SPIN_S`, or ``FRUGALRL_SPIN_MS`` (milliseconds) where it is set."""
    value = os.environ.get("FRUGALRL_SPIN_MS")
    if value is None:
        return SPIN_S
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not 0.0 <= ms <= 1000.0:
        raise ValueError(f"FRUGALRL_SPIN_MS must be a number of milliseconds in [0, 1000], got {value!r}")
    return ms / 1000.0
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class Arena:
    """A shared-memory buffer backed by a file that is unlinked once mapped on both sides."""

    def __init__(self, path: str, size: int, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.size = os.fstat(fd).st_size
            self.buf = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.path = path

    @classmethod
    def create(cls, size: int) -> Arena:
        """A new arena of ``size`` bytes with a unique name."""
        path = os.path.join(_SHM_DIR, f"frugalrl-{os.getpid()}-{os.urandom(6).hex()}")
        return cls(path, size, create=True)

    def unlink(self) -> None:
        """Remove the name; the mapping stays valid for whoever has it."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Unmap."""
        self.buf.close()


class Codec:
    """One side's message coding on a connection: shared frames where the arena allows, else encoded messages
    (through the arena when they are big); with a :class:`~frugalrl.wire.headers.HeaderBook` of the link's
    direction, headers that crossed twice cross as their number."""

    def __init__(self) -> None:
        self.wire = WireCache()
        self.frames = SharedFrames()

    def send(self, conn: Channel, msg: Message, arena: Arena | None, book: HeaderBook | None) -> dict[str, int]:
        """Send ``msg``; return its sizes by kind (those of the message as a link carries it, whichever way it
        went)."""
        if arena is not None:
            shared = self.frames.write(msg, arena.buf)
            if shared is not None:
                note, sizes = headers.pack_note(shared[0], SHARED_MAGIC, book, shared[1])
                conn.send_bytes(note)
                return sizes
        blob, sizes = headers.pack(*self.wire.encode(msg), book)
        if arena is not None and 4096 < len(blob) <= arena.size:
            arena.buf[: len(blob)] = blob
            conn.send_bytes(_SHM_NOTE.pack(_SHM_MAGIC, len(blob)))
        else:
            conn.send_bytes(blob)
        return sizes

    def recv(self, conn: Channel, arena: Arena | None, book: HeaderBook | None) -> tuple[Message, dict[str, int]]:
        """The next message on ``conn`` and its sizes by kind (as the link carried it). ``attach`` and its reply
        stay out of the books (they are not metered, so that every backend's books see the same messages)."""
        data = conn.recv_bytes()
        magic = data[:4]
        shared = magic in (SHARED_MAGIC, headers.NUMBERED_NOTE, headers.TEMPLATED_NOTE)
        crossing: headers.Crossing | None
        if shared:
            if arena is None:
                raise RuntimeError("shared-memory note received but no arena is attached")
            note, crossing = headers.unpack_note(data, SHARED_MAGIC, book)
            msg, sizes = self.frames.read(note, arena.buf)
        else:
            if len(data) == _SHM_NOTE.size and magic == _SHM_MAGIC:
                if arena is None:
                    raise RuntimeError("shared-memory note received but no arena is attached")
                data = memoryview(arena.buf)[: _SHM_NOTE.unpack(data)[1]]
            blob, crossing = headers.unpack(data, book)
            msg, sizes = self.wire.decode(blob)
        return msg, (sizes if msg.op == "attach" else headers.received(book, crossing, sizes))


def _build_worker(config: dict[str, Any]) -> EnvWorker:
    from frugalrl.envs import worker

    worker.ONE_TORCH_THREAD = True  # torch itself is imported only if this worker gets a policy
    return worker_from_json(config)


def worker_entry() -> None:
    """Entry point of a worker process (:func:`frugalrl.process.spawn`): build the worker, then answer the
    head's requests until ``close``, the end of the connection, or the head's death."""
    link = ParentLink.from_argv()
    try:
        worker = link.start(_build_worker)
    except ParentGone:
        return
    if worker is None:
        return  # the error went to the head
    arena_in: Arena | None = None
    arena_out: Arena | None = None
    codec = Codec()
    down, up = HeaderBook(), HeaderBook()  # this link's, as the head keeps them
    spin = most = spin_seconds()
    try:
        while True:
            idle = time.perf_counter()
            link.wait(spin)
            spin = most if time.perf_counter() - idle < most else 0.0  # spin again while requests come soon
            msg, _ = codec.recv(link.channel, arena_in, down)
            if msg.op == "close":
                return
            if msg.op == "attach":
                for a in (arena_in, arena_out):
                    if a is not None:
                        a.close()
                arena_in = Arena(msg.meta["down"], 0, create=False)
                arena_out = Arena(msg.meta["up"], 0, create=False)
                reply = Message("ok")
            else:
                reply = worker.handle(msg)
            codec.send(link.channel, reply, arena_out, None if msg.op == "attach" else up)
    except (EOFError, OSError):  # ParentGone included
        return
    finally:
        worker.close()


class LocalBackend(Backend):
    """Workers in local processes."""

    name = "local"

    def __init__(self, configs: list[WorkerConfig], meter: ByteMeter, timeout: float, inline: int = 0) -> None:
        super().__init__(configs, meter, timeout)
        self._config_json = [config_to_json(c, "local") for c in configs]  # fails early on unpicklable factories
        # The first ``inline`` workers run in this process, stepped while the others' replies are on their way.
        self.inline = InProcessWorkers({w: configs[w] for w in range(inline)}, meter)
        self.children: list[Child | None] = [None] * len(configs)
        self._arenas: list[tuple[Arena, Arena] | None] = [None] * len(configs)  # (down, up) of each worker
        self._arena_sizes = (_MIN_ARENA, _MIN_ARENA)
        self._closed = False
        self._codec = Codec()
        self._books: list[tuple[HeaderBook, HeaderBook]] = [(HeaderBook(), HeaderBook()) for _ in configs]  # down, up
        self._spin = spin_seconds()
        self._pending: dict[int, tuple[Child, float, bool]] = {}  # posted, not answered: (child, deadline, meter)
        self._failed: dict[int, WorkerFailure] = {}  # posted but could not be sent

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> dict[int, str]:
        """Start every process and wait until each has built its environments; returns those that died or hung
        while starting (see :meth:`Backend.start`)."""
        processes = [w for w in range(self.num_workers) if w not in self.inline]
        for w in processes:
            self._spawn(w)
        try:
            self.inline.start()
        except BaseException:
            self.close()
            raise
        failed: dict[int, str] = {}
        for w in processes:
            try:
                self._await_ready(w)
            except WorkerStartFailed as e:
                failed[w] = str(e)
                continue
            if not self._attach(w):
                self._child(w).kill()
                failed[w] = f"worker {w} died while attaching shared memory at start"
        return failed

    def _spawn(self, w: int) -> None:
        # One BLAS thread, as the worker's torch: a process per core, and no BLAS thread spinning on another's.
        self.children[w] = spawn(_ENTRY, self._config_json[w], name=f"worker {w}", one_blas_thread=True)
        self._books[w] = (HeaderBook(), HeaderBook())  # a new link: both ends start with empty books

    def _child(self, w: int) -> Child:
        child = self.children[w]
        if child is None:
            raise RuntimeError(f"worker {w} is not running")
        return child

    def _await_ready(self, w: int, replacing: bool = False) -> None:
        """Wait for worker ``w``'s ready; one that dies or hangs raises :class:`WorkerStartFailed` (and is killed),
        one that reports an error (its env cannot be built) closes the backend and raises it, or, ``replacing`` a
        worker mid-run (a simulator that cannot start again now), is a :class:`WorkerStartFailed` too: the
        crash-loop rule decides."""
        try:
            self._child(w).await_ready(time.monotonic() + max(self.timeout, 60.0), died=WorkerStartFailed)
        except WorkerStartFailed:
            self._child(w).kill()
            raise
        except Exception as e:
            if not replacing:
                self.close()
                raise
            self._child(w).kill()
            raise WorkerStartFailed(f"worker {w} could not start again: {e}") from e
        except BaseException:
            self.close()
            raise

    def _attach(self, w: int) -> bool:
        """Give worker ``w`` fresh shared-memory arenas of the current sizes; False if it failed meanwhile."""
        self._free_arenas(w, unlink=False)
        down, up = (Arena.create(size) for size in self._arena_sizes)
        self._arenas[w] = (down, up)
        msg = Message("attach", {"down": down.path, "up": up.path})
        result = self._exchange({w: msg}, meter=False)[w]
        down.unlink()
        up.unlink()
        return not isinstance(result, WorkerFailure)

    def _free_arenas(self, w: int, unlink: bool = True) -> None:
        arenas, self._arenas[w] = self._arenas[w], None
        for arena in arenas or ():
            if unlink:
                arena.unlink()
            arena.close()

    def reserve(self, up_bytes: int, down_bytes: int) -> None:
        """Grow the arenas (all workers) so that replies of ``up_bytes`` go through shared memory."""
        down, up = self._arena_sizes
        new = (max(down, _round(down_bytes)), max(up, _round(up_bytes)))
        if new != self._arena_sizes:
            self._arena_sizes = new
            for w in range(self.num_workers):
                if self._alive(w) and not self._attach(w):
                    # Silent or dead while attaching: make sure it is dead, so that the next request
                    # reports it as a failure and the env replaces it.
                    self._child(w).kill()

    def restart(self, worker: int) -> None:
        """Kill (if needed) and replace one worker process with fresh arenas (rebuild an in-process one)."""
        if worker in self.inline:
            self.inline.restart(worker)
            return
        self._stop(worker, grace=0.0)
        self._start_process(worker, "after a restart")

    def inline_ids(self) -> list[int]:
        """The workers that run in this process (``inline``)."""
        return sorted(self.inline.configs)

    def move_out(self, worker: int) -> None:
        """Close inline worker ``worker``'s envs here and start it in a process of its own (a fresh worker)."""
        if worker not in self.inline:
            raise ValueError(f"worker {worker} does not run inline")
        self.inline.remove(worker)
        self._start_process(worker, "after leaving the head's process")

    def _start_process(self, worker: int, when: str) -> None:
        self._spawn(worker)
        self._await_ready(worker, replacing=True)
        if not self._attach(worker):
            self._child(worker).kill()
            raise WorkerStartFailed(f"worker {worker} died while attaching shared memory {when}")

    def close(self) -> None:
        """Ask every worker to exit, kill the ones that do not, free the shared memory."""
        if self._closed:
            return
        self._closed = True
        bye = encode_message(Message("close"))[0]
        for child in self.children:
            if child is not None:
                with contextlib.suppress(OSError):
                    child.channel.send_bytes(bye)
        deadline = time.monotonic() + 3.0
        for w in range(self.num_workers):
            self._stop(w, grace=max(0.0, deadline - time.monotonic()))
        self.inline.close()

    def _stop(self, w: int, grace: float) -> None:
        """Let worker ``w`` exit for up to ``grace`` seconds, then kill it; release everything."""
        child, self.children[w] = self.children[w], None
        self._pending.pop(w, None)  # a request in flight to it is forgotten
        self._failed.pop(w, None)
        if child is not None:
            child.stop(grace)
        self._free_arenas(w)

    def worker_pids(self) -> dict[int, int]:
        """Process id of each live worker."""
        return {w: c.pid for w, c in enumerate(self.children) if c is not None}

    def _alive(self, w: int) -> bool:
        child = self.children[w]
        return child is not None and not child.exited()

    # ------------------------------------------------------------------ messaging
    def request(self, requests: dict[int, Message]) -> dict[int, Message | WorkerFailure]:
        """Send every request, then gather replies; dead or silent workers become failures."""
        return self._exchange(requests, meter=True)

    def post(self, requests: dict[int, Message]) -> None:
        """Send every request and return at once (:meth:`gather` collects the replies)."""
        self._post(requests, meter=True)

    def gather(self, workers: Iterable[int] | None = None, at_least: int | None = None
               ) -> dict[int, Message | WorkerFailure]:
        """Replies to posted requests (see :meth:`Backend.gather`): as soon as ``at_least`` of ``workers`` have
        answered or failed, every reply already in is returned."""
        return self._gather(workers, at_least)

    def _exchange(self, requests: dict[int, Message], meter: bool) -> dict[int, Message | WorkerFailure]:
        self._post(requests, meter)
        return self._gather(list(requests), None)

    def _post(self, requests: dict[int, Message], meter: bool) -> None:
        if self._closed:
            raise RuntimeError("backend is closed")
        for w, msg in requests.items():
            if w in self.inline:
                self.inline.post(w, msg, meter)
                continue
            if w in self._pending or w in self._failed:
                raise RuntimeError(f"worker {w} already has a request in flight")
            child = self.children[w]
            arenas = self._arenas[w]
            try:
                if child is None:
                    raise OSError("the worker is not running")
                # An attach names the new arenas: it cannot travel in them before the worker has mapped them.
                down = None if arenas is None or msg.op == "attach" else arenas[0]
                sizes = self._codec.send(child.channel, msg, down, self._books[w][0] if meter else None)
            except OSError as e:
                self._failed[w] = WorkerFailure(w, f"could not send to worker: {e!r}")
                continue
            self._pending[w] = (child, time.monotonic() + self.timeout, meter)
            if meter:
                self.meter.add_message(sizes, w, DOWN)

    def _gather(self, workers: Iterable[int] | None, at_least: int | None) -> dict[int, Message | WorkerFailure]:
        inline = self.inline.posted
        wanted = [*self._pending, *self._failed, *inline] if workers is None else list(workers)
        unknown = [w for w in wanted if w not in self._pending and w not in self._failed and w not in inline]
        if unknown:
            raise RuntimeError(f"no request in flight for worker(s) {unknown}")
        need = len(wanted) if at_least is None else max(1, min(at_least, len(wanted)))
        results: dict[int, Message | WorkerFailure] = {w: self._failed.pop(w) for w in wanted if w in self._failed}
        # This process's own workers step while the others' replies are on their way; when not all replies are
        # needed, one already in is taken first (the caller can work on it while an own worker's request waits).
        own = [w for w in wanted if w in inline]
        # One poll set for this wait: each pending worker's socket and pidfd (a worker that dies is seen at
        # once); a worker leaves the set as soon as it has answered.
        poller = select.poll()
        owner: dict[int, tuple[int, bool]] = {}  # fd -> (worker, is its socket)
        for w in wanted:
            if w in self._pending:
                child = self._pending[w][0]
                owner[child.channel.fileno()] = (w, True)
                owner[child.pidfd] = (w, False)
                poller.register(child.channel.fileno(), POLLIN)
                poller.register(child.pidfd, POLLIN)
        events: list[tuple[int, int]] = []

        def ready() -> bool:
            events[:] = poller.poll(0) if owner else ()
            return bool(events)

        while len(results) < need:
            if own and (at_least is None or not ready()):
                w = own.pop(0)
                results[w] = self.inline.answer(w)
                continue
            if not events and not spin(ready, self._spin):  # a reply that comes soon is taken without a wake-up
                first = min(self._pending[w][1] for w in wanted if w in self._pending)
                events[:] = poller.poll(int(max(0.0, min(1.0, first - time.monotonic())) * 1000) + 1)
            for fd, _ in events:
                w, is_socket = owner[fd]
                if w not in self._pending:
                    continue
                child, _, meter = self._pending.pop(w)
                if is_socket or child.channel.poll():
                    arenas = self._arenas[w]
                    try:
                        reply, sizes = self._codec.recv(child.channel, None if arenas is None else arenas[1],
                                                        self._books[w][1] if meter else None)
                    except (EOFError, OSError) as e:
                        results[w] = WorkerFailure(w, f"connection lost: {e!r}")
                    else:
                        results[w] = reply
                        if meter:
                            self.meter.add_message(sizes, w, UP)
                else:
                    child.kill()  # its process group, before it is reaped
                    results[w] = WorkerFailure(w, f"process died (exit code {child.reap()})")
                poller.unregister(child.channel.fileno())
                poller.unregister(child.pidfd)
            events.clear()
            now = time.monotonic()
            for w in wanted:
                if w in self._pending and now >= self._pending[w][1]:
                    self._pending.pop(w)[0].kill()
                    results[w] = WorkerFailure(w, f"no reply within {self.timeout:.0f} s")
        # In the order asked for (as the serial backend answers), whatever order the replies came in: the
        # first error a caller meets does not depend on which worker happened to answer first.
        return {w: results[w] for w in wanted if w in results}


def _round(n: int) -> int:
    """Round a size up to a power of two (at least the minimum arena)."""
    size = _MIN_ARENA
    while size < n:
        size <<= 1
    return size
