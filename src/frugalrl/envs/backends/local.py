"""The local backend: one OS process per worker, a socket pair for messages, shared memory for big ones.

Workers are started with ``subprocess`` (``python -c ...``), not ``multiprocessing``: the user's
main script is never re-imported (no ``if __name__ == "__main__"`` needed unless an env factory
lives in it) and nothing is pickled. The worker's config travels as a JSON message.

Each worker gets two shared-memory arenas (files in ``/dev/shm``, unlinked as soon as both sides
have mapped them, so nothing can leak): head→worker and worker→head. A message that fits its
arena is written there and only a 12-byte note travels on the socket; anything else goes through
the socket itself. Frames on the socket are an 8-byte length and the bytes; a small frame is
written with one system call and usually read with one, and repeated message shapes skip the
JSON header work (:class:`WireCache`). A worker that dies is seen at once through a pidfd; one
that stops answering is declared dead after ``timeout`` seconds. Workers ignore SIGINT (Ctrl-C
is the head's to handle) and exit by themselves within a second if the head disappears.
"""

from __future__ import annotations

import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

from frugalrl.envs.backends.base import Backend, WorkerConfig, WorkerFailure, config_to_json, worker_from_json
from frugalrl.wire import codecs as _codecs
from frugalrl.wire.channel import POLLIN as _POLLIN
from frugalrl.wire.channel import Channel
from frugalrl.wire.message import _PREFIX, Message, decode_message, encode_message
from frugalrl.wire.meter import DOWN, UP

_SHM_NOTE = struct.Struct("<4sQ")
_SHM_MAGIC = b"SHM!"
_MIN_ARENA = 1 << 16
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


class WireCache:
    """Encodes and decodes messages byte for byte as :mod:`frugalrl.wire.message` does, doing the header
    work once per message *shape* instead of once per message.

    Step after step, a worker's requests and replies have the same op, the same small ``meta`` and
    arrays of the same names, dtypes and shapes, hence the same JSON header: only the payload bytes
    change. This cache keeps, per shape, the encoded prefix and header (and the byte sizes by kind)
    for encoding, and, keyed by the received header bytes, the decoded op, meta and array layout for
    decoding; payloads still go through :func:`frugalrl.wire.codecs.encode` / ``decode``.

    It is checked against the real encoder and decoder on the first uses of every shape and then
    every ``CHECK_EVERY`` uses; a shape that ever differs (or that the cache cannot describe: nested
    meta, non-array values, ...) always takes the real path.
    """

    CHECK_FIRST = 2
    CHECK_EVERY = 1000
    MAX_SHAPES = 512

    def __init__(self) -> None:
        self._enc: dict[tuple, list | None] = {}
        self._dec: dict[bytes, list | None] = {}

    # ------------------------------------------------------------------ encode
    def encode(self, msg: Message) -> tuple[bytes, dict[str, int]]:
        """``encode_message(msg)``."""
        key = _shape_key(msg)
        entry = self._enc.get(key) if key is not None else None
        if entry is None:
            if key is None or key in self._enc or len(self._enc) >= self.MAX_SHAPES:
                return encode_message(msg)
            return self._learn_encoding(key, msg)
        payloads = [_codecs.encode(arr, msg.codecs.get(name, "raw")) for name, arr in msg.arrays.items()]
        blob = b"".join([entry[0], *payloads])
        entry[2] += 1
        if entry[2] <= self.CHECK_FIRST or entry[2] % self.CHECK_EVERY == 0:
            real = encode_message(msg)
            if real[0] != blob or real[1] != entry[1]:
                self._enc[key] = None
            return real
        return blob, dict(entry[1])

    def _learn_encoding(self, key: tuple, msg: Message) -> tuple[bytes, dict[str, int]]:
        blob, sizes = encode_message(msg)
        payload = b"".join(_codecs.encode(arr, msg.codecs.get(name, "raw")) for name, arr in msg.arrays.items())
        head = blob[: len(blob) - len(payload)]
        self._enc[key] = [head, dict(sizes), 0] if head + payload == blob else None
        return blob, sizes

    # ------------------------------------------------------------------ decode
    def decode(self, buf: bytes | bytearray | memoryview) -> tuple[Message, dict[str, int]]:
        """``decode_message(buf)``."""
        view = memoryview(buf)
        try:
            _, hlen = _PREFIX.unpack_from(view, 0)
            key = bytes(view[: _PREFIX.size + hlen])
        except Exception:  # noqa: BLE001 - whatever it is, the real decoder says what is wrong
            return decode_message(view)
        entry = self._dec.get(key)
        if entry is None or len(view) != entry[6]:
            if key in self._dec or len(self._dec) >= self.MAX_SHAPES:
                return decode_message(view)
            return self._learn_decoding(key, view)
        op, meta, layout, msg_codecs, kinds, sizes, _, uses = entry
        arrays = {name: _codecs.decode(view[a:b], shape, dtype, codec) for name, a, b, shape, dtype, codec in layout}
        msg = Message(op, dict(meta), arrays, dict(msg_codecs), dict(kinds))
        entry[7] = uses = uses + 1
        if uses <= self.CHECK_FIRST or uses % self.CHECK_EVERY == 0:
            real = decode_message(view)
            if not _same_message(real[0], msg) or real[1] != sizes:
                self._dec[key] = None
            return real
        return msg, dict(sizes)

    def _learn_decoding(self, key: bytes, view: memoryview) -> tuple[Message, dict[str, int]]:
        msg, sizes = decode_message(view)
        if not all(type(v) in _PLAIN_META for v in msg.meta.values()):
            self._dec[key] = None
            return msg, sizes
        layout = []
        offset = len(key)
        for name, arr in msg.arrays.items():
            codec = msg.codecs.get(name, "raw")
            n = _codecs.encoded_nbytes(arr.shape, arr.dtype, codec)
            layout.append((name, offset, offset + n, arr.shape, arr.dtype.str, codec))
            offset += n
        if offset == len(view):  # a layout that accounts for every byte; otherwise try again next time
            self._dec[key] = [msg.op, dict(msg.meta), layout, dict(msg.codecs), dict(msg.kinds), dict(sizes),
                              len(view), 0]
        return msg, sizes


_PLAIN_META = (str, int, bool, float, type(None))
_PLAIN_KEY = (str, int, bool, type(None))  # floats are left out: 0.0 == -0.0 but they encode differently


def _shape_key(msg: Message) -> tuple | None:
    """What a message's header is a function of, or None if the cache should not handle it."""
    if type(msg) is not Message or type(msg.op) is not str or type(msg.meta) is not dict:
        return None
    meta = []
    for k, v in msg.meta.items():
        t = type(v)
        if type(k) is not str or t not in _PLAIN_KEY:
            return None
        meta.append((k, t, v))
    arrays = []
    for name, arr in msg.arrays.items():
        if type(arr) is not np.ndarray or type(name) is not str:
            return None
        arrays.append((name, arr.dtype.str, arr.shape, msg.codecs.get(name, "raw"), msg.kinds.get(name)))
    return (msg.op, tuple(meta), tuple(arrays))


def _same_message(a: Message, b: Message) -> bool:
    if (a.op, a.meta, a.codecs, a.kinds) != (b.op, b.meta, b.codecs, b.kinds) or list(a.arrays) != list(b.arrays):
        return False
    for name, x in a.arrays.items():
        y = b.arrays[name]
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def _send(conn: Channel, blob: bytes, arena: Arena | None) -> None:
    if arena is not None and 4096 < len(blob) <= arena.size:
        arena.buf[: len(blob)] = blob
        conn.send_bytes(_SHM_NOTE.pack(_SHM_MAGIC, len(blob)))
    else:
        conn.send_bytes(blob)


def _recv(conn: Channel, arena: Arena | None, wire: WireCache | None = None) -> tuple[Message, dict[str, int]]:
    decode = decode_message if wire is None else wire.decode
    data = conn.recv_bytes()
    if len(data) == _SHM_NOTE.size and data[:4] == _SHM_MAGIC:
        if arena is None:
            raise RuntimeError("shared-memory note received but no arena is attached")
        (_, n) = _SHM_NOTE.unpack(data)
        return decode(memoryview(arena.buf)[:n])
    return decode(data)


def worker_entry() -> None:
    """Entry point of a worker process: ``python -c '...; worker_entry()' FD PARENT_PID``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    conn = Channel(socket.socket(fileno=fd))
    try:
        msg, _ = decode_message(conn.recv_bytes())
    except (EOFError, OSError):
        return  # the head went away before sending the config
    import torch

    torch.set_num_threads(1)
    try:
        worker = worker_from_json(msg.meta)
    except Exception as e:  # noqa: BLE001 - reported to the head
        reply = Message("error", {"error": f"{type(e).__name__}: {e}"})
    else:
        reply = Message("ready", {"pid": os.getpid()})
    try:
        conn.send_bytes(encode_message(reply)[0])
    except OSError:
        return  # the head went away while this worker was starting
    if reply.op == "error":
        return
    arena_in: Arena | None = None
    arena_out: Arena | None = None
    poller = select.poll()
    poller.register(conn.fileno(), _POLLIN)
    wire = WireCache()
    try:
        while True:
            if not poller.poll(1000):
                if os.getppid() != parent_pid:
                    return  # the head is gone
                continue
            msg, _ = _recv(conn, arena_in, wire)
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
            _send(conn, wire.encode(reply)[0], arena_out)
    except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
        return
    finally:
        worker.close()


class _Slot:
    """One worker process with its socket, pidfd and arenas, as seen from the head."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.pidfd: int | None = None
        self.conn: Channel | None = None
        self.arena_down: Arena | None = None
        self.arena_up: Arena | None = None

    def exitcode(self) -> int | None:
        """The exit code if the process has ended."""
        return None if self.process is None else self.process.poll()


class LocalBackend(Backend):
    """Workers in local processes."""

    name = "local"

    def __init__(self, configs: list[WorkerConfig], meter, timeout: float) -> None:
        super().__init__(configs, meter, timeout)
        self._config_json = [config_to_json(c, "local") for c in configs]  # fails early on unpicklable factories
        self.slots = [_Slot() for _ in configs]
        self._arena_sizes = (_MIN_ARENA, _MIN_ARENA)
        self._closed = False
        self._wire = WireCache()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start every process and wait until each has built its environments."""
        for w in range(self.num_workers):
            self._spawn(w)
        for w in range(self.num_workers):
            self._await_ready(w)
            if not self._attach(w):
                self.close()
                raise RuntimeError(f"worker {w} failed while attaching shared memory at start")

    def _spawn(self, w: int) -> None:
        head_sock, child_sock = socket.socketpair()
        env = dict(os.environ)
        # The worker must import whatever the head can (tests, the user's own modules).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        # SIGINT is ignored before anything is imported: Ctrl-C is the head's to handle.
        code = (
            "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "from frugalrl.envs.backends.local import worker_entry; worker_entry()"
        )
        child_fd = child_sock.fileno()
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(child_fd), str(os.getpid())],
            pass_fds=(child_fd,),
            env=env,
            stdin=subprocess.DEVNULL,
            process_group=0,  # not in the terminal's foreground group: Ctrl-C reaches only the head
        )
        child_sock.close()
        slot = self.slots[w]
        slot.process = proc
        slot.pidfd = os.pidfd_open(proc.pid)
        slot.conn = Channel(head_sock)
        slot.conn.send_bytes(encode_message(Message("config", self._config_json[w]))[0])

    def _await_ready(self, w: int) -> None:
        slot = self.slots[w]
        assert slot.conn is not None and slot.process is not None
        deadline = time.monotonic() + max(self.timeout, 60.0)
        poller = select.poll()
        poller.register(slot.conn.fileno(), _POLLIN)
        poller.register(slot.pidfd, _POLLIN)
        while time.monotonic() < deadline:
            ready = {fd for fd, _ in poller.poll(500)}
            if slot.conn.fileno() in ready:
                try:
                    msg, _ = decode_message(slot.conn.recv_bytes())
                except EOFError:
                    break
                if msg.op == "error":
                    self.close()
                    raise RuntimeError(f"worker {w} could not start: {msg.meta.get('error')}")
                return
            if slot.pidfd in ready:
                break
        code = slot.exitcode()
        self.close()
        raise RuntimeError(f"worker {w} died or hung while starting (exit code {code})")

    def _attach(self, w: int) -> bool:
        """Give worker ``w`` fresh shared-memory arenas of the current sizes; False if it failed meanwhile."""
        slot = self.slots[w]
        for arena in (slot.arena_down, slot.arena_up):
            if arena is not None:
                arena.close()
        slot.arena_down, slot.arena_up = (Arena.create(size) for size in self._arena_sizes)
        assert slot.arena_down is not None and slot.arena_up is not None
        msg = Message("attach", {"down": slot.arena_down.path, "up": slot.arena_up.path})
        result = self._exchange({w: msg}, meter=False)[w]
        slot.arena_down.unlink()
        slot.arena_up.unlink()
        return not isinstance(result, WorkerFailure)

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
                    self.slots[w].process.kill()

    def restart(self, worker: int) -> None:
        """Kill (if needed) and replace one worker process with fresh arenas."""
        self._stop(self.slots[worker], grace=0.0)
        self._spawn(worker)
        self._await_ready(worker)
        if not self._attach(worker):
            raise RuntimeError(f"worker {worker} failed again right after being restarted")

    def close(self) -> None:
        """Ask every worker to exit, kill the ones that do not, free the shared memory."""
        if self._closed:
            return
        self._closed = True
        bye = encode_message(Message("close"))[0]
        for slot in self.slots:
            if slot.conn is not None:
                try:
                    slot.conn.send_bytes(bye)
                except OSError:
                    pass
        deadline = time.monotonic() + 3.0
        for slot in self.slots:
            self._stop(slot, grace=max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _stop(slot: _Slot, grace: float) -> None:
        """Wait up to ``grace`` seconds for the process to exit, then kill it; release everything."""
        if slot.process is not None:
            try:
                slot.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                slot.process.kill()
                slot.process.wait(timeout=5)
        if slot.conn is not None:
            slot.conn.close()
        if slot.pidfd is not None:
            os.close(slot.pidfd)
        for arena in (slot.arena_down, slot.arena_up):
            if arena is not None:
                arena.unlink()
                arena.close()
        slot.conn = slot.process = slot.pidfd = slot.arena_down = slot.arena_up = None

    def worker_pids(self) -> dict[int, int]:
        """Process id of each live worker."""
        return {w: s.process.pid for w, s in enumerate(self.slots) if s.process is not None}

    def _alive(self, w: int) -> bool:
        return self.slots[w].exitcode() is None and self.slots[w].process is not None

    # ------------------------------------------------------------------ messaging
    def request(self, requests: dict[int, Message]) -> dict[int, Message | WorkerFailure]:
        """Send every request, then gather replies; dead or silent workers become failures."""
        return self._exchange(requests, meter=True)

    def _exchange(self, requests: dict[int, Message], meter: bool) -> dict[int, Message | WorkerFailure]:
        if self._closed:
            raise RuntimeError("backend is closed")
        results: dict[int, Message | WorkerFailure] = {}
        # Encode everything first (a message shared by several workers once), then send in a tight loop
        # so that the workers start together.
        encoded: dict[int, tuple[bytes, dict[str, int]]] = {}
        for msg in requests.values():
            if id(msg) not in encoded:
                encoded[id(msg)] = self._wire.encode(msg)
        for w, msg in requests.items():
            blob, sizes = encoded[id(msg)]
            slot = self.slots[w]
            try:
                assert slot.conn is not None
                _send(slot.conn, blob, slot.arena_down)
            except (OSError, AssertionError) as e:
                results[w] = WorkerFailure(w, f"could not send to worker: {e!r}")
                continue
            if meter:
                self.meter.add_message(sizes, w, DOWN)
        pending = {w for w in requests if w not in results}
        if not pending:
            return results
        # One poll set for this exchange: each pending worker's socket and pidfd (a worker that dies is
        # seen at once); a worker leaves the set as soon as it has answered.
        poller = select.poll()
        owner: dict[int, tuple[int, bool]] = {}  # fd -> (worker, is its socket)
        for w in pending:
            slot = self.slots[w]
            fd = slot.conn.fileno()
            owner[fd] = (w, True)
            owner[slot.pidfd] = (w, False)
            poller.register(fd, _POLLIN)
            poller.register(slot.pidfd, _POLLIN)
        deadline = time.monotonic() + self.timeout
        while pending:
            timeout = max(0.0, min(1.0, deadline - time.monotonic()))
            for fd, _ in poller.poll(int(timeout * 1000) + 1):
                w, is_socket = owner[fd]
                if w not in pending:
                    continue
                slot = self.slots[w]
                if is_socket or slot.conn.poll():
                    try:
                        reply, sizes = _recv(slot.conn, slot.arena_up, self._wire)
                    except (EOFError, OSError) as e:
                        results[w] = WorkerFailure(w, f"connection lost: {e!r}")
                    else:
                        results[w] = reply
                        if meter:
                            self.meter.add_message(sizes, w, UP)
                else:
                    slot.process.wait(timeout=5)
                    results[w] = WorkerFailure(w, f"process died (exit code {slot.exitcode()})")
                pending.discard(w)
                poller.unregister(slot.conn.fileno())
                poller.unregister(slot.pidfd)
            if pending and time.monotonic() >= deadline:
                for w in pending:
                    results[w] = WorkerFailure(w, f"no reply within {self.timeout:.0f} s")
                    if self.slots[w].process is not None:
                        self.slots[w].process.kill()
                pending.clear()
        # In request order (as the serial backend answers), whatever order the replies came in: the
        # first error a caller meets does not depend on which worker happened to answer first.
        return {w: results[w] for w in requests}


def _round(n: int) -> int:
    """Round a size up to a power of two (at least the minimum arena)."""
    size = _MIN_ARENA
    while size < n:
        size <<= 1
    return size
