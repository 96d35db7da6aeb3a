"""WireCache: encoding and decoding of repeated message shapes without redoing the header work.

On a hot request/reply loop (the local ClusterEnv backend's head and workers) the messages of one kind
have the same JSON header step after step; :class:`WireCache` keeps it per shape and produces exactly the
bytes (and sizes by kind) that :func:`~frugalrl.wire.message.encode_message` and
:func:`~frugalrl.wire.message.decode_message` would, checking itself against them now and then.
"""

from __future__ import annotations

import numpy as np

from frugalrl.wire import codecs as _codecs
from frugalrl.wire.message import (
    _PREFIX,
    Message,
    decode_message,
    encode_message,
    header_and_sizes,
)


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
    meta, non-array values, an array with a compressing codec, whose size depends on its data, ...)
    always takes the real path.
    """

    CHECK_FIRST = 2
    CHECK_EVERY = 1000
    MAX_SHAPES = 512

    def __init__(self) -> None:
        self._enc: dict[tuple, list | None] = {}
        self._dec: dict[bytes, list | None] = {}
        self._sizes: dict[tuple, tuple[bytes, dict[str, int]]] = {}

    # ------------------------------------------------------------------ sizes
    def sizes(self, msg: Message) -> tuple[bytes, dict[str, int]]:
        """``msg``'s JSON header and ``message_sizes(msg)``: what ``msg`` would take on the wire, for a message that
        does not travel (a worker in the caller's process). A fixed-size shape's are those of its shape alone, so
        they are kept."""
        key = shape_key(msg)
        if key is None:
            return header_and_sizes(msg)
        known = self._sizes.get(key)
        if known is None:
            known = header_and_sizes(msg)
            if len(self._sizes) < self.MAX_SHAPES:
                self._sizes[key] = known
        return known[0], dict(known[1])

    # ------------------------------------------------------------------ encode
    def encode(self, msg: Message) -> tuple[bytes, dict[str, int]]:
        """``encode_message(msg)``."""
        key = shape_key(msg)
        if key is None:
            return encode_message(msg)
        entry = self._enc.get(key)
        if entry is None:
            if key in self._enc or len(self._enc) >= self.MAX_SHAPES:
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
        if not all(type(v) in _PLAIN_META for v in msg.meta.values()) or _variable(msg):
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
_VARIABLE_CODECS = frozenset(_codecs.VARIABLE_CODECS)


def shape_key(msg: Message) -> tuple | None:
    """What a message's header is a function of, or None if the cache should not handle it (called for every
    message on a hot loop, hence the plain loops)."""
    if type(msg) is not Message or type(msg.op) is not str or type(msg.meta) is not dict:
        return None
    meta = []
    for k, v in msg.meta.items():
        t = type(v)
        if type(k) is not str or t not in _PLAIN_KEY:
            return None
        meta.append((k, t, v))
    codecs, kinds = msg.codecs, msg.kinds
    arrays = []
    for name, arr in msg.arrays.items():
        if type(arr) is not np.ndarray or type(name) is not str:
            return None
        arrays.append((name, arr.dtype, arr.shape, codecs.get(name, "raw"), kinds.get(name)))  # equal dtypes: same str
    if codecs and not _VARIABLE_CODECS.isdisjoint(codecs.values()):
        return None
    return (msg.op, tuple(meta), tuple(arrays))


def _variable(msg: Message) -> bool:
    """True if an array of ``msg`` has a codec whose size depends on the data (its layout is not fixed)."""
    return not _VARIABLE_CODECS.isdisjoint(msg.codecs.values())


def _same_message(a: Message, b: Message) -> bool:
    if (a.op, a.meta, a.codecs, a.kinds) != (b.op, b.meta, b.codecs, b.kinds) or list(a.arrays) != list(b.arrays):
        return False
    for name, x in a.arrays.items():
        y = b.arrays[name]
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True
