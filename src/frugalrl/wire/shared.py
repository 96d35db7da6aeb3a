"""Shared frames: a message whose arrays go raw into shared memory while only its header travels.

Between processes on one machine (the local ClusterEnv backend) a message can skip encoding altogether when
every array's codec is exact and of fixed size (``raw``; ``fp32`` of float32; ``bits`` of booleans): the sender
writes each array's bytes, as they are, into a shared-memory buffer the receiver has mapped, and sends only the
message's JSON header (the *note*); the receiver reads the arrays back from the buffer. What the receiver gets
is what :func:`~frugalrl.wire.message.decode_message` would give (fresh arrays, the same op, meta, codecs and
kinds), and the byte counts are those of the encoded message: a link to another machine would carry exactly
that many bytes (:func:`~frugalrl.wire.message.message_sizes`), so every transport meters the same numbers. A
note whose header the link has numbered (:mod:`frugalrl.wire.headers`) is sent and counted as that number.

Both sides do the header work once per message shape. Notes are checked like any message from a worker: a
header that does not describe arrays inside the buffer raises :class:`~frugalrl.wire.message.WireError`;
nothing is unpickled.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from frugalrl.wire import codecs as _codecs
from frugalrl.wire.cache import shape_key
from frugalrl.wire.message import (
    _PREFIX,
    Message,
    WireError,
    _header_bytes,
    _spec_fields,
    _specs,
    _wire_dtype,
    message_sizes,
)

#: The first bytes of a note (a header whose arrays are in shared memory).
MAGIC = b"SHR1"
_ALIGN = 8
_SMALL = 4096  # bytes: an array up to this size is written through a bytes copy
_PLAIN = (str, int, bool, float, type(None))


def _exact(codec: str, dtype: np.dtype) -> bool:
    """Whether ``codec`` keeps every bit of an array of ``dtype`` and has a fixed size."""
    return codec == "raw" or (codec == "fp32" and dtype == np.float32) or (codec == "bits" and dtype == np.bool_)


def _offsets(nbytes: list[int]) -> tuple[list[tuple[int, int]], int]:
    """``(offset, size)`` of each array laid out one after the other (8-byte aligned), and the total size."""
    out, offset = [], 0
    for n in nbytes:
        out.append((offset, n))
        offset += -(-n // _ALIGN) * _ALIGN
    return out, offset


class SharedFrames:
    """Writes and reads shared frames, caching the header work per message shape (one instance per side)."""

    MAX_SHAPES = 512

    def __init__(self) -> None:
        self._enc: dict[tuple, tuple | None] = {}
        self._dec: dict[bytes, tuple | None] = {}

    def write(self, msg: Message, buf: Any) -> tuple[bytes, dict[str, int]] | None:
        """Write ``msg``'s arrays into ``buf`` and return the note and the message's sizes by kind; None (nothing
        written) if ``msg`` cannot travel this way (a lossy or compressing codec, or too big for ``buf``)."""
        key = shape_key(msg)
        if key is None:
            return None
        entry = self._enc.get(key)
        if entry is None:
            if key in self._enc or len(self._enc) >= self.MAX_SHAPES:
                return None
            entry = self._enc[key] = _learn(msg)
            if entry is None:
                return None
        note, sizes, layout, total = entry
        if total > len(buf):
            return None
        for (offset, n), arr in zip(layout, msg.arrays.values(), strict=True):
            if n > _SMALL:
                buf[offset : offset + n] = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
            elif n:
                buf[offset : offset + n] = arr.tobytes()  # a copy, but quicker than a view for a small array
        return note, dict(sizes)

    def read(self, note: bytes | memoryview, buf: Any) -> tuple[Message, dict[str, int]]:
        """The message a :meth:`write` note describes, its arrays copied out of ``buf``, and its sizes by kind."""
        key = bytes(note)
        entry = self._dec.get(key)
        if entry is None:
            entry = _parse(key, len(buf))
            if len(self._dec) < self.MAX_SHAPES and all(type(v) in _PLAIN for v in entry[1].values()):
                self._dec[key] = entry
        op, meta, layout, msg_codecs, kinds, sizes, total = entry
        if total > len(buf):
            raise WireError(f"shared frame of {total} bytes does not fit the {len(buf)}-byte buffer")
        data = np.frombuffer(buf, np.uint8, total).copy()  # one copy out of the buffer; the arrays are views of it
        arrays = {name: data[offset : offset + dtype.itemsize * math.prod(shape)].view(dtype).reshape(shape)
                  for name, dtype, shape, offset in layout}
        return Message(op, dict(meta), arrays, dict(msg_codecs), dict(kinds)), dict(sizes)


def _learn(msg: Message) -> tuple | None:
    if not all(_exact(msg.codecs.get(name, "raw"), arr.dtype) for name, arr in msg.arrays.items()):
        return None
    header = _header_bytes(msg, _specs(msg))
    layout, total = _offsets([arr.nbytes for arr in msg.arrays.values()])
    return MAGIC + header, message_sizes(msg), layout, total


def _parse(note: bytes, limit: int) -> tuple:
    """Op, meta, array layout, codecs, kinds, sizes and total size of a note (checked: WireError if corrupt)."""
    if not note.startswith(MAGIC):
        raise WireError(f"not a shared frame (magic {note[:4]!r})")
    header = note[len(MAGIC) :]
    try:
        parsed = json.loads(header)
        op, meta, specs = parsed["op"], parsed["meta"], parsed["arrays"]
    except (ValueError, KeyError, TypeError) as e:
        raise WireError(f"corrupt shared-frame header: {e}") from e
    if not isinstance(op, str) or not isinstance(meta, dict) or not isinstance(specs, list):
        raise WireError("corrupt shared-frame header: wrong field types")
    fields, nbytes = [], []
    sizes: dict[str, int] = {"control": _PREFIX.size + len(header)}
    for spec in specs:
        try:
            if not isinstance(spec, list) or not 3 <= len(spec) <= 5:
                raise ValueError("expected [name, dtype, shape, codec?, kind?]")
            name, dtype, shape, codec, kind = _spec_fields(spec)
            dt = _wire_dtype(dtype)
            if not isinstance(name, str) or not isinstance(kind, str) or min(shape, default=0) < 0:
                raise ValueError("bad name, kind or shape")
            if not _exact(codec, dt):
                raise ValueError(f"codec {codec!r} of {dt} cannot travel in a shared frame")
        except (ValueError, TypeError, IndexError, AttributeError) as e:
            raise WireError(f"corrupt array spec {spec!r}: {e}") from e
        fields.append((name, dt, shape, codec, kind))
        nbytes.append(math.prod(shape) * dt.itemsize)
        sizes[kind] = sizes.get(kind, 0) + _codecs.encoded_nbytes(shape, dt, codec)
    offsets, total = _offsets(nbytes)
    if total > limit:
        raise WireError(f"shared frame of {total} bytes does not fit the {limit}-byte buffer")
    layout = [(name, dt, shape, offset) for (name, dt, shape, _, _), (offset, _) in zip(fields, offsets, strict=True)]
    return (op, meta, layout, {f[0]: f[3] for f in fields}, {f[0]: f[4] for f in fields}, sizes, total)
