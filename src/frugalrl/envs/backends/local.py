"""The local backend: one OS process per worker, a socket pair for messages, shared memory for big ones.

Workers are started with ``subprocess`` (``python -c ...``), not ``multiprocessing``: the user's
main script is never re-imported (no ``if __name__ == "__main__"`` needed unless an env factory
lives in it) and nothing is pickled. The worker's config travels as a JSON message.

Each worker gets two shared-memory arenas (files in ``/dev/shm``, unlinked as soon as both sides
have mapped them, so nothing can leak): head→worker and worker→head. A message that fits its
arena is written there and only a 12-byte note travels on the socket; anything else goes through
the socket itself. A worker that dies is seen at once through a pidfd; one that stops answering
is declared dead after ``timeout`` seconds. Workers ignore SIGINT (Ctrl-C is the head's to
handle) and exit by themselves within a second if the head disappears.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from multiprocessing.connection import Connection, wait

from frugalrl.envs.backends.base import Backend, WorkerConfig, WorkerFailure
from frugalrl.envs.spec import EnvSpec
from frugalrl.wire.message import Message, decode_message, encode_message
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


def _send(conn: Connection, blob: bytes, arena: Arena | None) -> None:
    if arena is not None and 4096 < len(blob) <= arena.size:
        arena.buf[: len(blob)] = blob
        conn.send_bytes(_SHM_NOTE.pack(_SHM_MAGIC, len(blob)))
    else:
        conn.send_bytes(blob)


def _recv(conn: Connection, arena: Arena | None) -> tuple[Message, dict[str, int]]:
    data = conn.recv_bytes()
    if len(data) == _SHM_NOTE.size and data[:4] == _SHM_MAGIC:
        if arena is None:
            raise RuntimeError("shared-memory note received but no arena is attached")
        (_, n) = _SHM_NOTE.unpack(data)
        return decode_message(memoryview(arena.buf)[:n])
    return decode_message(data)


def _config_to_json(config: WorkerConfig) -> dict:
    spec: EnvSpec = config.env_spec
    factory = spec.factory
    main_path = None
    if callable(factory):
        module = getattr(factory, "__module__", None)
        qualname = getattr(factory, "__qualname__", "")
        if module is None or "<" in qualname:
            raise ValueError(
                f"env factory {factory!r} cannot be rebuilt in a worker process: pass a module-level "
                "function, a 'module:function' path or a Gymnasium id"
            )
        if module == "__main__":
            main_path = getattr(sys.modules["__main__"], "__file__", None)
            if main_path is None:
                raise ValueError(
                    f"env factory {qualname!r} is defined in an interactive session; define it in a module "
                    "(or use backend='serial')"
                )
        factory = f"{module}:{qualname}"
    out = asdict(config)
    out["env_spec"] = {"id": spec.id, "factory": factory, "kwargs": spec.kwargs}
    out["main_path"] = main_path
    try:
        json.dumps(out)
    except TypeError as e:
        raise ValueError(f"env_kwargs must be JSON-serialisable for backend='local': {e}") from e
    return out


def worker_entry() -> None:
    """Entry point of a worker process: ``python -c '...; worker_entry()' FD PARENT_PID``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    conn = Connection(fd)
    msg, _ = decode_message(conn.recv_bytes())
    cfg = msg.meta
    if cfg.get("main_path"):
        # The factory lives in the user's script: import it the way multiprocessing does (guarded code
        # under `if __name__ == "__main__":` does not run).
        import importlib.util

        spec = importlib.util.spec_from_file_location("__mp_main__", cfg["main_path"])
        module = importlib.util.module_from_spec(spec)
        sys.modules["__mp_main__"] = sys.modules["__main__"] = module
        spec.loader.exec_module(module)

    import torch

    torch.set_num_threads(1)
    from frugalrl.envs.worker import EnvWorker

    try:
        env_spec = EnvSpec(**cfg["env_spec"])
        worker = EnvWorker(
            cfg["index"], env_spec, cfg["num_envs"], cfg["first_env"],
            cfg["autoreset_mode"], cfg["check_finite"], cfg["seed"],
        )
    except Exception as e:  # noqa: BLE001 - reported to the head
        conn.send_bytes(encode_message(Message("error", {"error": f"{type(e).__name__}: {e}"}))[0])
        return
    conn.send_bytes(encode_message(Message("ready", {"pid": os.getpid()}))[0])
    arena_in: Arena | None = None
    arena_out: Arena | None = None
    try:
        while True:
            if not conn.poll(1.0):
                if os.getppid() != parent_pid:
                    return  # the head is gone
                continue
            msg, _ = _recv(conn, arena_in)
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
            _send(conn, encode_message(reply)[0], arena_out)
    except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
        return
    finally:
        worker.close()


class _Slot:
    """One worker process with its socket, pidfd and arenas, as seen from the head."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.pidfd: int | None = None
        self.conn: Connection | None = None
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
        self._config_json = [_config_to_json(c) for c in configs]  # fails early on unpicklable factories
        self.slots = [_Slot() for _ in configs]
        self._arena_sizes = (_MIN_ARENA, _MIN_ARENA)
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start every process and wait until each has built its environments."""
        for w in range(self.num_workers):
            self._spawn(w)
        for w in range(self.num_workers):
            self._await_ready(w)
            self._attach(w)

    def _spawn(self, w: int) -> None:
        head_sock, child_sock = socket.socketpair()
        env = dict(os.environ)
        # The worker must import whatever the head can (tests, the user's own modules).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        code = "from frugalrl.envs.backends.local import worker_entry; worker_entry()"
        child_fd = child_sock.fileno()
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(child_fd), str(os.getpid())],
            pass_fds=(child_fd,),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child_sock.close()
        slot = self.slots[w]
        slot.process = proc
        slot.pidfd = os.pidfd_open(proc.pid)
        slot.conn = Connection(head_sock.detach())
        slot.conn.send_bytes(encode_message(Message("config", self._config_json[w]))[0])

    def _await_ready(self, w: int) -> None:
        slot = self.slots[w]
        assert slot.conn is not None and slot.process is not None
        deadline = time.monotonic() + max(self.timeout, 60.0)
        while time.monotonic() < deadline:
            ready = wait([slot.conn, slot.pidfd], timeout=0.5)
            if slot.conn in ready:
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

    def _attach(self, w: int) -> None:
        """Give worker ``w`` fresh shared-memory arenas of the current sizes."""
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
        if isinstance(result, WorkerFailure):
            raise RuntimeError(f"worker {w} failed while attaching shared memory: {result.reason}")

    def reserve(self, up_bytes: int, down_bytes: int) -> None:
        """Grow the arenas (all workers) so that replies of ``up_bytes`` go through shared memory."""
        down, up = self._arena_sizes
        new = (max(down, _round(down_bytes)), max(up, _round(up_bytes)))
        if new != self._arena_sizes:
            self._arena_sizes = new
            for w in range(self.num_workers):
                if self._alive(w):
                    self._attach(w)

    def restart(self, worker: int) -> None:
        """Kill (if needed) and replace one worker process with fresh arenas."""
        self._stop(self.slots[worker], grace=0.0)
        self._spawn(worker)
        self._await_ready(worker)
        self._attach(worker)

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
        encoded: dict[int, tuple[bytes, dict[str, int]]] = {}
        for w, msg in requests.items():
            blob, sizes = encoded.setdefault(id(msg), encode_message(msg))
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
        deadline = time.monotonic() + self.timeout
        while pending:
            waitables = {}
            for w in pending:
                slot = self.slots[w]
                waitables[slot.conn] = w
                waitables[slot.pidfd] = w
            ready = wait(list(waitables), timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            for obj in ready:
                w = waitables[obj]
                if w not in pending:
                    continue
                slot = self.slots[w]
                if obj is slot.conn or slot.conn.poll():
                    try:
                        reply, sizes = _recv(slot.conn, slot.arena_up)
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
            if pending and time.monotonic() >= deadline:
                for w in pending:
                    results[w] = WorkerFailure(w, f"no reply within {self.timeout:.0f} s")
                    if self.slots[w].process is not None:
                        self.slots[w].process.kill()
                pending.clear()
        return results


def _round(n: int) -> int:
    """Round a size up to a power of two (at least the minimum arena)."""
    size = _MIN_ARENA
    while size < n:
        size <<= 1
    return size
