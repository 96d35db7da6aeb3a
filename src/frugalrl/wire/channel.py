"""Length-prefixed frames over a stream socket: the framing every local transport shares.

A frame is an 8-byte little-endian length and the bytes. :func:`send_frame` writes a small frame with
one system call (prefix and bytes together up to :data:`SMALL_FRAME`) and a big one without copying it
to prepend the prefix. :class:`Channel` adds a reusable receive buffer: every connection of the process
layer (:mod:`frugalrl.process`: the local ClusterEnv backend's workers, DPSGD's workers and their Hogwild
helpers) is one. :func:`recv_frame` is the plain blocking read, for a socket without a Channel. Only
numpy-free standard-library modules are used, so a process that imports this starts fast.
"""

from __future__ import annotations

import select
import socket
import struct

FRAME = struct.Struct("<Q")
"""The length prefix of every frame."""
SMALL_FRAME = 1 << 16
"""Frames up to this size are sent with one ``sendall``; also the receive buffer's resting size."""
POLLIN = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
"""Poll events that mean "a frame, or the end of the stream, can be read"."""


def send_frame(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    """Send one frame."""
    n = len(data)
    if n <= SMALL_FRAME:
        sock.sendall(FRAME.pack(n) + data)
    else:  # no copy of a large payload just to prepend eight bytes
        sock.sendall(FRAME.pack(n))
        sock.sendall(data)


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes from ``sock``; ``EOFError`` if the peer closes first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError("connection closed")
        got += k
    return buf


def recv_frame(sock: socket.socket) -> bytearray:
    """The next frame from ``sock`` (blocking)."""
    (n,) = FRAME.unpack(recv_exact(sock, FRAME.size))
    return recv_exact(sock, n)


class Channel:
    """One end of a socket pair carrying length-prefixed frames.

    Replaces ``multiprocessing.connection.Connection`` on the hot path: a frame is sent with one
    ``sendall`` (prefix and bytes together up to 64 KiB) and received into a reusable buffer, so a
    small message usually costs one ``recv_into`` instead of two reads and two copies.
    :meth:`recv_bytes` returns a view that stays valid only until the next call.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._new_buffer(SMALL_FRAME)

    def _new_buffer(self, size: int, keep: memoryview | None = None) -> None:
        buf = bytearray(size)
        n = 0 if keep is None else len(keep)
        if keep is not None and n:
            buf[:n] = keep
        self._buf = buf
        self._view = memoryview(buf)
        self._start, self._end = 0, n

    def fileno(self) -> int:
        """The socket's file descriptor."""
        return self.sock.fileno()

    def send_bytes(self, data: bytes | bytearray | memoryview) -> None:
        """Send one frame."""
        send_frame(self.sock, data)

    def _fill(self, need: int) -> None:
        """Read until ``need`` bytes past ``_start`` are buffered."""
        if self._start + need > len(self._buf):
            pending = self._view[self._start : self._end]
            self._new_buffer(max(need, SMALL_FRAME), pending)
        while self._end - self._start < need:
            got = self.sock.recv_into(self._view[self._end :])
            if not got:
                raise EOFError
            self._end += got

    def recv_bytes(self) -> memoryview:
        """The next frame (valid until the next call)."""
        if self._start == self._end:
            if len(self._buf) > SMALL_FRAME:  # give back the memory of an unusually big frame
                self._new_buffer(SMALL_FRAME)
            self._start = self._end = 0
        self._fill(FRAME.size)
        (n,) = FRAME.unpack_from(self._buf, self._start)
        self._fill(FRAME.size + n)
        begin = self._start + FRAME.size
        self._start = begin + n
        return self._view[begin : begin + n]

    def pending(self) -> bool:
        """Whether bytes of a next frame are already buffered (a socket poll would not see them)."""
        return self._end > self._start

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a frame (or EOF) can be read without blocking for longer than ``timeout`` seconds."""
        if self._end > self._start:
            return True
        return bool(select.select([self.sock], [], [], max(0.0, timeout))[0])

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()
