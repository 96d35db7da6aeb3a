"""Lossless experience codecs: what the workers' rollouts cost on the uplink, without changing a bit.

Three codecs of :mod:`frugalrl.wire.codecs`, for any plain numeric or boolean array:

- ``bits``: booleans packed 8 to a byte (``ceil(n / 8)`` bytes, a fixed size; bool arrays only);
- ``lz4`` and ``zstd``: a *filter*, then a compressor. The filter splits the bytes into planes: for a
  multi-byte dtype, plane ``(j, b)`` holds byte ``b`` of element ``j`` of every row of the last axis (a
  row of at most :data:`MAX_ROW_PLANES` bytes, e.g. one observation's features: each feature's sign and
  exponent bytes become runs a compressor sees), or byte ``b`` of every element (1-D arrays, longer
  rows); booleans are packed 8 to a byte; single bytes stay as they are. The compressor is an LZ4 block
  (fast) or a zstd frame at level 1 (smaller, a little slower).

The size of an ``lz4`` / ``zstd`` payload depends on the data, so it is self-delimiting::

    u32 body length L | body

where the body is the compressed filtered bytes, or, if compressing would not save anything, the
filtered bytes themselves (stored: ``L`` is then exactly the filtered size ``F``, which a compressed body
never reaches). :func:`encoded_nbytes` has no formula for them (:func:`payload_nbytes` reads ``L``), and
the byte meter counts the payloads actually produced.

Decoding reproduces the original bytes exactly (NaN payloads, signed zeros, any byte order) and checks every size a
header declares (``L``, the filtered size ``F``, the zstd frame's content size, :data:`MAX_DECODED_NBYTES`) before
allocating anything. Corrupt input raises ``ValueError``.
"""

from __future__ import annotations

import math
import struct
import threading
from typing import Any

import lz4.block
import numpy as np
import zstandard

#: Codecs whose payload size depends on the data (self-delimiting, see the module docstring).
VARIABLE_CODECS: tuple[str, ...] = ("lz4", "zstd")
#: Every codec of this module.
LOSSLESS_CODECS: tuple[str, ...] = ("bits", *VARIABLE_CODECS)
#: The largest array (in bytes) an ``lz4`` / ``zstd`` payload may decode to: a corrupt shape cannot make the
#: decoder allocate more.
MAX_DECODED_NBYTES = 1 << 30
ZSTD_LEVEL = 1

#: Rows of the last axis up to this many bytes are shuffled as one record (see the module docstring).
MAX_ROW_PLANES = 256

_LEN = struct.Struct("<I")
_ZSTD_BLOCK_MAX = 128 * 1024  # no zstd block decodes to more; every block takes at least 3 bytes
_LZ4_MAX_RATIO = 256  # an LZ4 block expands at most ~255 times
_local = threading.local()


def _zstd() -> tuple[Any, Any]:
    """This thread's zstd compressor and decompressor (they are not safe to share between threads)."""
    pair = getattr(_local, "zstd", None)
    if pair is None:
        pair = (zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=False,
                                         write_dict_id=False), zstandard.ZstdDecompressor())
        _local.zstd = pair
    return pair


def _count(shape: tuple[int, ...]) -> int:
    return math.prod(int(s) for s in shape)


def filtered_nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of the filtered (shuffled, or bit-packed for booleans) form of an array."""
    n = _count(shape)
    dt = np.dtype(dtype)
    return (n + 7) // 8 if dt.kind == "b" else n * dt.itemsize


def encoded_nbytes(shape: tuple[int, ...], dtype: np.dtype, codec: str) -> int:
    """Exact payload size of ``bits``; ``ValueError`` for ``lz4`` / ``zstd``, whose size depends on the data
    (see :func:`payload_nbytes`, :func:`max_encoded_nbytes`)."""
    if codec == "bits":
        _check_bool(np.dtype(dtype))
        return filtered_nbytes(shape, dtype)
    raise ValueError(f"codec {codec!r} has no size formula: its size depends on the data (encode to measure it)")


def max_encoded_nbytes(shape: tuple[int, ...], dtype: np.dtype, codec: str) -> int:
    """The largest payload ``codec`` can produce for such an array (stored body plus its length)."""
    size = filtered_nbytes(shape, dtype)
    return size if codec == "bits" else _LEN.size + size


def _check_bool(dt: np.dtype) -> None:
    if dt.kind != "b":
        raise ValueError(f"codec 'bits' encodes boolean arrays only, got dtype {dt}")


# ---------------------------------------------------------------------------------------------- filters
def _record(shape: tuple[int, ...], dt: np.dtype) -> int:
    """Bytes of the record whose byte planes the filter separates: a row of the last axis, or one element
    (1 for single bytes: no shuffle)."""
    size = dt.itemsize
    if size == 1:
        return 1
    if len(shape) >= 2 and size * int(shape[-1]) <= MAX_ROW_PLANES:
        return size * max(1, int(shape[-1]))
    return size


def _filter(x: np.ndarray) -> bytes:
    """The bytes a compressor sees: byte planes of each record, or booleans 8 to a byte."""
    x = np.ascontiguousarray(x)
    if x.dtype.kind == "b":
        raw = x.reshape(-1).view(np.uint8)
        if raw.size and int(raw.max()) > 1:
            raise ValueError("boolean array holds bytes other than 0 and 1; it cannot be bit-packed exactly")
        return np.packbits(raw).tobytes()
    rec = _record(x.shape, x.dtype)
    if rec == 1 or x.nbytes <= rec:
        return x.tobytes()
    return np.ascontiguousarray(x.reshape(-1).view(np.uint8).reshape(-1, rec).T).tobytes()


def _unfilter(data: bytes | memoryview, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """A fresh array of ``shape`` and ``dt`` from its filtered bytes (of exactly the filtered size)."""
    out = np.empty(shape, dtype=dt)
    n = out.size
    flat = out.reshape(-1).view(np.uint8)
    src = np.frombuffer(data, dtype=np.uint8)
    if dt.kind == "b":
        if n % 8 and src[-1] & ((1 << (8 - n % 8)) - 1):
            raise ValueError("bit-packed booleans have non-zero padding bits")
        flat[:] = np.unpackbits(src, count=n)
        return out
    rec = _record(shape, dt)
    if rec == 1 or out.nbytes <= rec:
        flat[:] = src
    else:
        rows = out.nbytes // rec
        flat.reshape(rows, rec)[:] = src.reshape(rec, rows).T
    return out


# ---------------------------------------------------------------------------------------------- codecs
def encode(x: np.ndarray, codec: str) -> bytes:
    """Encode ``x`` with ``bits``, ``lz4`` or ``zstd``; its shape and dtype travel separately (in a header)."""
    x = np.asarray(x)
    if codec == "bits":
        _check_bool(x.dtype)
        return _filter(x)
    filtered = _filter(x)
    body = filtered
    if filtered:
        packed = _zstd()[0].compress(filtered) if codec == "zstd" else lz4.block.compress(filtered, store_size=False)
        if len(packed) < len(filtered):
            body = packed
    return _LEN.pack(len(body)) + body


def payload_nbytes(buf: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype, codec: str) -> int:
    """Size of the ``codec`` payload at the start of ``buf`` (which may hold more after it), checked against
    the bytes present and against what such an array can take; ``ValueError`` if it cannot be right."""
    dt = np.dtype(dtype)
    size = filtered_nbytes(shape, dt)
    if codec == "bits":
        _check_bool(dt)
        return size
    if len(buf) < _LEN.size:
        raise ValueError(f"{codec} payload truncated: {len(buf)} bytes, not even its length")
    (body,) = _LEN.unpack_from(buf, 0)
    if body > size:
        raise ValueError(f"{codec} payload declares {body} bytes for an array of {size} (filtered) bytes")
    if _LEN.size + body > len(buf):
        raise ValueError(f"{codec} payload truncated: declares {body} bytes, {len(buf) - _LEN.size} present")
    return _LEN.size + body


def decode(buf: bytes | memoryview, shape: tuple[int, ...], dtype: str | np.dtype, codec: str) -> np.ndarray:
    """Decode exactly one payload of :func:`encode` (``buf`` holds it and nothing else) into a fresh array."""
    dt = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    size = filtered_nbytes(shape, dt)
    if codec == "bits":
        _check_bool(dt)
        if len(buf) != size:
            raise ValueError(f"bits payload of {len(buf)} bytes for {_count(shape)} booleans (expected {size})")
        return _unfilter(buf, shape, dt)
    n = payload_nbytes(buf, shape, dt, codec)
    if n != len(buf):
        raise ValueError(f"{codec} payload declares {n} bytes but {len(buf)} were given")
    body = memoryview(buf)[_LEN.size :]
    if len(body) == size:  # stored
        return _unfilter(body, shape, dt)
    if size > MAX_DECODED_NBYTES:
        raise ValueError(f"{codec} payload would decode to {size} bytes, over MAX_DECODED_NBYTES")
    if codec == "zstd":
        if size > (len(body) // 3 + 1) * _ZSTD_BLOCK_MAX:
            raise ValueError(f"zstd body of {len(body)} bytes cannot hold {size} bytes")
        try:
            declared = zstandard.frame_content_size(body)
        except zstandard.ZstdError as e:
            raise ValueError(f"corrupt zstd frame: {e}") from e
        if declared != size:
            raise ValueError(f"zstd frame declares {declared} bytes, the array needs {size}")
        try:
            data = _zstd()[1].decompress(body, max_output_size=size, allow_extra_data=False)
        except zstandard.ZstdError as e:
            raise ValueError(f"corrupt zstd frame: {e}") from e
    else:
        if size > _LZ4_MAX_RATIO * len(body) + 16:
            raise ValueError(f"lz4 body of {len(body)} bytes cannot hold {size} bytes")
        try:
            data = lz4.block.decompress(body, uncompressed_size=size)
        except lz4.block.LZ4BlockError as e:
            raise ValueError(f"corrupt lz4 block: {e}") from e
    if len(data) != size:
        raise ValueError(f"{codec} body decoded to {len(data)} bytes, the array needs {size}")
    return _unfilter(data, shape, dt)
