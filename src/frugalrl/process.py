"""The one process layer: how frugalrl starts a child process, gives it its config, learns that it is ready
(or why it is not), sees it die, and stops it.

Every local child goes through here (ClusterEnv's local workers, DPSGD's workers and their Hogwild helpers), so
each of these is solved once (the design in full: docs/architecture.md#the-process-layer):

- :func:`spawn` runs ``python -c "<ignore SIGINT>; from MOD import FN; FN()" FD PARENT_PID`` with plain
  ``subprocess``, never ``multiprocessing``: the user's script is not re-imported and nothing is pickled;
- the first message is the ``config``; the child answers ``ready`` or ``error`` (:func:`error_message`), and
  :meth:`Child.await_ready` raises an error that names the child;
- a pidfd makes a dead child visible at once (:meth:`Child.poll`, :func:`poll_children`);
- a child exits within about a second of its parent's end (:class:`ParentLink`);
- a child runs in its own process group, killed with its own children by one ``killpg`` before it is reaped
  (:meth:`Child.stop`).

Messages are framed by :class:`~frugalrl.wire.channel.Channel` (the one framing layer). This module
imports only the standard library and :mod:`frugalrl.wire` (no torch), so a child starts fast.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, Literal, TypeVar

from frugalrl.wire.channel import POLLIN, Channel
from frugalrl.wire.message import Message, WireError, decode_message, encode_message

T = TypeVar("T")

PARENT_POLL_S = 1.0
#: A yield longer than this means a process that is not waiting on us took the core for a time slice (a yield to
#: the process we wait for, e.g. a learner's inference, is shorter): spinning stops (:func:`spin`).
SPIN_CONTENDED_S = 2e-3
#: How long a process that met contention while spinning blocks instead.
SPIN_BACKOFF_S = 0.5
"""How often a waiting child checks that its parent is still there."""
_BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# ---------------------------------------------------------------------------------------- errors
class ChildError(RuntimeError):
    """An ``error`` message a child sent (``meta``: ``error``, the text, and ``type``), raised where it
    was received; :func:`error_message` forwards it unchanged."""

    def __init__(self, meta: dict[str, Any]) -> None:
        super().__init__(str(meta.get("error")))
        self.meta = dict(meta)


class ChildExited(RuntimeError):
    """A child process ended (or closed its socket) while its parent waited for a message from it."""

    def __init__(self, name: str, exitcode: int | None) -> None:
        super().__init__(f"{name} died (exit code {exitcode})")
        self.exitcode = exitcode


class ParentGone(ConnectionError):
    """The parent cannot be reached any more: it closed the connection, or its process is gone."""


def error_message(e: BaseException, where: str = "") -> Message:
    """An ``error`` message for ``e``: ``error`` is ``where``, the exception's type name and its text; ``type``
    is ``"ValueError"`` for a ValueError (so that the receiver may raise one again), else ``"RuntimeError"``;
    ``env`` is True for an env's own failure (a DPSGD worker's may be restarted). A :class:`ChildError` is
    forwarded as it came."""
    if isinstance(e, ChildError):
        return Message("error", dict(e.meta))
    kind = "ValueError" if isinstance(e, ValueError) else "RuntimeError"
    meta: dict[str, Any] = {"error": f"{where}{type(e).__name__}: {e}", "type": kind}
    if getattr(e, "raised_by_env", None) is not None:  # an env's own failure (frugalrl.experience.mark_env_error)
        meta["env"] = True
    return Message("error", meta)


def child_error(
    name: str,
    meta: dict[str, Any],
    error: type[Exception] = RuntimeError,
    keep_value_error: bool = False,
    what: str = "could not start",
) -> Exception:
    """The exception to raise for an ``error`` message (``meta``) of the child ``name``:
    ``error("{name} {what}: ...")``, or a ValueError if the child's error was one and ``keep_value_error``
    (``what``: ``"could not start"`` for an answer to the config, ``"failed"`` later, say)."""
    cls: type[Exception] = ValueError if keep_value_error and meta.get("type") == "ValueError" else error
    return cls(f"{name} {what}: {meta.get('error')}")


# ---------------------------------------------------------------------------------------- starting
def command(entry: str, *args: str) -> list[str]:
    """``python -c`` running ``entry()`` (``"module:function"``) with ``args``; SIGINT is ignored before
    the first import. ``frugalrl`` imports its public names (torch, gymnasium) only when they are first
    used, so a child that needs little starts in a fraction of a second."""
    module, _, function = entry.partition(":")
    if not module or not function.isidentifier():
        raise ValueError(f"a child entry point must be 'module:function', got {entry!r}")
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        f"from {module} import {function}; {function}()"
    )
    return [sys.executable, "-c", code, *args]


def child_env(one_blas_thread: bool = False) -> dict[str, str]:
    """The environment of a child: the parent's, with the parent's import path as ``PYTHONPATH`` and, if
    ``one_blas_thread``, one OpenMP/OpenBLAS/MKL thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if one_blas_thread:
        for var in _BLAS_THREAD_VARS:
            env[var] = "1"
    return env


def spawn(
    entry: str,
    config: dict[str, Any],
    *,
    name: str,
    pass_fds: Sequence[int] = (),
    own_group: bool = True,
    one_blas_thread: bool = False,
    log: IO[str] | None = None,
) -> Child:
    """Start ``entry`` (``"module:function"``) in a child process and send it ``config``.

    ``name`` (``"worker 3"``) is how errors refer to the child. ``pass_fds`` are more descriptors for it to
    inherit (a shared-memory file). With ``own_group`` (the default) it leads a new process group, which
    :meth:`Child.kill` kills whole; otherwise it stays in this process's group (a helper that must die
    with its parent's group). ``log`` takes the child's standard output and error (None: this process's).
    The entry function builds its :class:`ParentLink` with :meth:`ParentLink.from_argv`. Returns at once;
    :meth:`Child.await_ready` waits for the handshake.
    """
    mine, theirs = socket.socketpair()
    try:
        fd = theirs.fileno()
        process = subprocess.Popen(
            command(entry, str(fd), str(os.getpid())),
            pass_fds=(fd, *pass_fds),
            env=child_env(one_blas_thread),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            process_group=0 if own_group else None,
        )
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    child = Child(name, process, mine, own_group)
    blob, child.config_sizes = encode_message(Message("config", config))
    with contextlib.suppress(OSError):  # already dead: await_ready says so
        child.channel.send_bytes(blob)
    return child


def _readable(fds: Sequence[int], timeout: float | None) -> set[int]:
    """The subset of ``fds`` readable within ``timeout`` seconds (None: wait for one)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, POLLIN)
    ms = None if timeout is None else max(0, int(timeout * 1000))
    return {fd for fd, _ in poller.poll(ms)}


# ---------------------------------------------------------------------------------------- the parent's side
class Child:
    """A child process as its parent sees it: the process, its socket (:attr:`channel`) and its pidfd.

    Made by :func:`spawn`. Thread-safe only as far as one thread talks to one child.
    """

    def __init__(self, name: str, process: subprocess.Popen, sock: socket.socket, own_group: bool) -> None:
        self.name = name
        self.process = process
        self.channel = Channel(sock)
        self.pidfd = os.pidfd_open(process.pid)
        self.own_group = own_group
        self.config_sizes: dict[str, int] = {}
        """Bytes by byte-meter kind of the ``config`` message :func:`spawn` sent."""
        self._closed = False

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the child has been reaped (None before)."""
        return self.process.returncode

    # ------------------------------------------------------------------ messages
    def send(self, msg: Message) -> dict[str, int]:
        """Send ``msg``; return its size by byte-meter kind. Raises ``OSError`` if the child is gone."""
        blob, sizes = encode_message(msg)
        self.channel.send_bytes(blob)
        return sizes

    def recv(self) -> tuple[Message, dict[str, int]]:
        """The next message and its sizes (blocking). Raises ``EOFError``/``OSError`` if the connection is
        gone, :class:`~frugalrl.wire.WireError` for bytes that are not a message (nothing is unpickled)."""
        return decode_message(self.channel.recv_bytes())

    def poll(self, timeout: float | None) -> Literal["message", "exited"] | None:
        """``"message"`` once a message (or the end of the connection) can be read, ``"exited"`` once the
        process has ended with nothing left to read, None after ``timeout`` seconds (None: no limit)."""
        if self.channel.pending():
            return "message"
        ready = _readable([self.channel.fileno(), self.pidfd], timeout)
        if self.channel.fileno() in ready:
            return "message"
        return "exited" if self.pidfd in ready else None

    def wait_message(self, timeout: float | None) -> tuple[Message, dict[str, int]] | None:
        """The child's next message with its sizes, or None if none came within ``timeout`` seconds (None:
        no limit). A message sent before the child ended is still returned; after that, raises
        :class:`ChildExited` (the child is killed and reaped first: a closed socket means it is ending)."""
        state = self.poll(timeout)
        if state is None:
            return None
        if state == "message":
            try:
                return self.recv()
            except (EOFError, OSError):
                self.exited(0.5)  # the connection closes as the process ends: let it end
        self.kill()
        raise ChildExited(self.name, self.reap())

    def await_ready(
        self, deadline: float, error: type[Exception] = RuntimeError, keep_value_error: bool = False,
        died: type[Exception] | None = None,
    ) -> tuple[Message, dict[str, int]]:
        """Wait until ``deadline`` (``time.monotonic()``) for the child's ``ready``; return it with its sizes.

        An ``error`` answer raises :func:`child_error` (``"{name} could not start: ..."``); a child that
        dies, closes its socket, sends something else or lets the deadline pass raises
        ``died("{name} died or hung while starting (exit code N)")`` (``died`` defaults to ``error``: a caller that
        retries deaths but not errors tells them apart by it).
        """
        try:
            got = self.wait_message(max(0.0, deadline - time.monotonic()))
        except (ChildExited, WireError):
            got = None
        if got is not None:
            msg, sizes = got
            if msg.op == "error":
                raise child_error(self.name, msg.meta, error, keep_value_error)
            if msg.op == "ready":
                return msg, sizes
        raise (died or error)(f"{self.name} died or hung while starting (exit code {self.returncode})")

    # ------------------------------------------------------------------ life and death
    def exited(self, timeout: float = 0.0) -> bool:
        """Whether the process has ended, waiting up to ``timeout`` seconds (it is not reaped)."""
        return self.process.returncode is not None or bool(_readable([self.pidfd], timeout))

    def kill(self) -> None:
        """SIGKILL the child, with its whole process group if it leads one; nothing once it is reaped (its
        process and group ids may belong to someone else by then)."""
        if self.process.returncode is not None:
            return
        try:
            if self.own_group:
                os.killpg(self.process.pid, signal.SIGKILL)
            else:
                self.process.kill()
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self, timeout: float = 5.0) -> int | None:
        """Wait up to ``timeout`` seconds for the process to end and collect its exit code (None if it runs on)."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float) -> int | None:
        """End the child: shut its socket down (a child waiting for a message sees the end), let it exit by
        itself for up to ``grace`` seconds, then kill it (its group first), reap it and close the socket
        and pidfd. Idempotent; returns the exit code."""
        if not self._closed:
            with contextlib.suppress(OSError):
                self.channel.sock.shutdown(socket.SHUT_RDWR)
            if self.process.returncode is None:
                self.exited(grace)
                self.kill()
                self.reap()
            self.close()
        return self.process.returncode

    def close(self) -> None:
        """Close the socket and the pidfd (the process is left as it is; see :meth:`stop`)."""
        if not self._closed:
            self._closed = True
            self.channel.close()
            os.close(self.pidfd)


def poll_children(children: Sequence[Child], timeout: float | None) -> list[Child]:
    """The children that have a message to read or have ended, waiting up to ``timeout`` seconds (None: no
    limit) for at least one (for a parent that supervises several long-running children)."""
    ready = [c for c in children if c.channel.pending()]
    if ready:
        return ready
    owner = {}
    for c in children:
        owner[c.channel.fileno()] = c
        owner[c.pidfd] = c
    hit = _readable(list(owner), timeout)
    return [c for c in children if c.channel.fileno() in hit or c.pidfd in hit]


_spin_off_until = 0.0  # time.perf_counter() until which this process does not spin (it met contention)


def spin(ready: Callable[[], bool], seconds: float) -> bool:
    """Poll ``ready()`` for up to ``seconds``, yielding the core between polls; True as soon as it is.

    A yield that takes long means another process wanted the core and ran: with more busy processes than
    cores, spinning only takes time from them (and each yield may cost a whole time slice), so this process
    stops spinning at once and for the next :data:`SPIN_BACKOFF_S`; the caller blocks instead.
    """
    global _spin_off_until
    start = time.perf_counter()
    if start < _spin_off_until:
        return ready()
    until = start + seconds
    while not ready():
        now = time.perf_counter()
        if now >= until:
            return False
        os.sched_yield()
        if time.perf_counter() - now > SPIN_CONTENDED_S:
            _spin_off_until = now + SPIN_BACKOFF_S
            return ready()
    return True


# ---------------------------------------------------------------------------------------- the child's side
class ParentLink:
    """A child's end of the connection to its parent, made from ``FD PARENT_PID`` on its command line.

    Every wait for a message checks once a second that the parent is still there, and raises
    :class:`ParentGone` when it is not (or when the connection closes): a child's loop then simply returns,
    so that no child outlives its parent by more than about a second.
    """

    def __init__(self, sock: socket.socket, parent_pid: int) -> None:
        self.channel = Channel(sock)
        self.parent_pid = parent_pid
        self._poller = select.poll()
        self._poller.register(sock.fileno(), POLLIN)

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> ParentLink:
        """The link of a child started by :func:`spawn` (``argv``: ``[_, FD, PARENT_PID]``, ``sys.argv`` by default)."""
        args = sys.argv if argv is None else argv
        return cls(socket.socket(fileno=int(args[1])), int(args[2]))

    def parent_alive(self) -> bool:
        """Whether the parent process still exists (a child whose parent died is adopted by another)."""
        return os.getppid() == self.parent_pid

    def wait(self, spin_s: float = 0.0) -> None:
        """Block until a message (or the end of the connection) can be read; :class:`ParentGone` if the
        parent process ends first.

        With ``spin_s`` it first polls without blocking for up to that long, yielding the core between
        polls: a request that comes soon is taken without the wake-up of a sleeping process (tens of
        microseconds, more in a virtual machine), and a process that needs the core still gets it.
        """
        if spin_s > 0.0 and not self.channel.pending():
            spin(lambda: bool(self._poller.poll(0)), spin_s)
        while not self.channel.pending() and not self._poller.poll(int(PARENT_POLL_S * 1000)):
            if not self.parent_alive():
                raise ParentGone(f"the parent process {self.parent_pid} is gone")

    def recv_bytes(self) -> memoryview:
        """The next frame (valid until the next receive); :class:`ParentGone` once the parent is gone."""
        self.wait()
        try:
            return self.channel.recv_bytes()
        except (EOFError, OSError) as e:
            raise ParentGone(f"the connection to the parent is closed ({e!r})") from e

    def recv(self) -> Message:
        """The next message from the parent."""
        return decode_message(self.recv_bytes())[0]

    def send_bytes(self, blob: bytes | bytearray | memoryview) -> None:
        """Send one frame; :class:`ParentGone` if the connection is gone."""
        try:
            self.channel.send_bytes(blob)
        except OSError as e:
            raise ParentGone(f"the connection to the parent is closed ({e!r})") from e

    def send(self, msg: Message) -> None:
        """Send ``msg`` to the parent."""
        self.send_bytes(encode_message(msg)[0])

    def exchange(self, msg: Message) -> Message:
        """Send ``msg`` and return the parent's answer."""
        self.send(msg)
        return self.recv()

    def start(self, build: Callable[[dict[str, Any]], T], ready: dict[str, Any] | None = None) -> T | None:
        """The handshake: receive the ``config``, ``build`` from its meta, answer ``ready`` (with meta
        ``ready``) and return what was built; if ``build`` raises, answer ``error`` and return None.
        Raises :class:`ParentGone` if the parent goes away meanwhile (the caller then just returns; what
        was built goes with the process)."""
        config = self.recv().meta
        try:
            built = build(config)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
            with contextlib.suppress(ParentGone):
                self.send(error_message(e))
            return None
        self.send(Message("ready", dict(ready or {})))
        return built

    def watch_parent(self) -> threading.Thread:
        """Start a daemon thread that ends this process (``os._exit(1)``) within about a second of the
        parent's end, for a child that computes for long stretches without waiting on its socket."""

        def watch() -> None:
            while self.parent_alive():
                time.sleep(PARENT_POLL_S)
            os._exit(1)

        thread = threading.Thread(target=watch, name="frugalrl-parent-watch", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Close the socket."""
        self.channel.close()


def resident_mb(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MB, from ``/proc`` (None if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None
