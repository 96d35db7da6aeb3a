"""Codecs: how a tensor becomes bytes on the wire, and back.

Plain functions over NumPy arrays, no pickle anywhere. A codec is named by a short string
(``"fp32"``, ``"bf16"``, ``"fp16"``, ``"int8"``) so that it can travel in a JSON header.

- dense ``fp32`` / ``fp16`` / ``bf16`` for any floating tensor (bf16 is stored as the upper
  16 bits of the fp32 pattern, rounded to nearest even);
- ``int8`` for weights: symmetric per-tensor scale, ``x ≈ scale * q`` with ``q`` in [-127, 127];
  4 bytes of scale + 1 byte per element.
- ``raw`` keeps any array as it is (integers, booleans, float64 ...);
- lossless experience codecs (:mod:`frugalrl.wire.lossless`): ``bits`` (booleans 8 to a byte) and
  ``lz4`` / ``zstd`` (byte-plane shuffle, then a compressor), whose size depends on the data
  (:data:`VARIABLE_CODECS`: :func:`encoded_nbytes` refuses them, :func:`payload_nbytes` reads it);
- composite experience codecs (:mod:`frugalrl.wire.transforms`): ``"<transform>+<compressor>"``, a
  frame-stack delta (``frames``, exact) or a low-bit float code (``fp16``, ``bf16``, ``int8``, ``int16``)
  followed by ``lz4`` / ``zstd`` (variable size too).
"""

from __future__ import annotations

import math

import numpy as np

from frugalrl.wire import lossless, transforms
from frugalrl.wire.floats import bf16_bits_to_fp32, fp32_to_bf16_bits
from frugalrl.wire.lossless import LOSSLESS_CODECS
from frugalrl.wire.transforms import COMPOSITE_CODECS

FLOAT_CODECS = ("fp32", "fp16", "bf16", "int8")
#: The codecs of a fixed size (a function of shape and dtype).
CODECS = ("raw", *FLOAT_CODECS)
#: Codecs whose payload size depends on the data (self-delimiting).
VARIABLE_CODECS = (*lossless.VARIABLE_CODECS, *COMPOSITE_CODECS)
#: Every codec, the experience codecs included.
ALL_CODECS = (*CODECS, *LOSSLESS_CODECS, *COMPOSITE_CODECS)


def _check(codec: str) -> None:
    if codec not in ALL_CODECS:
        raise ValueError(f"unknown codec {codec!r}; expected one of {ALL_CODECS}")


def encoded_nbytes(shape: tuple[int, ...], dtype: np.dtype, codec: str) -> int:
    """Size in bytes of an array of ``shape``/``dtype`` encoded with ``codec``.

    ``ValueError`` for the codecs of :data:`VARIABLE_CODECS` (``lz4``, ``zstd``): their size depends on the
    data, so there is no formula; encode to measure it, or read it with :func:`payload_nbytes`.
    """
    _check(codec)
    if codec in COMPOSITE_CODECS:
        raise ValueError(f"codec {codec!r} has no size formula: its size depends on the data (encode to measure it)")
    if codec in LOSSLESS_CODECS:
        return lossless.encoded_nbytes(shape, np.dtype(dtype), codec)
    n = math.prod(map(int, shape))
    if codec == "raw":
        return n * np.dtype(dtype).itemsize
    return {"fp32": 4 * n, "fp16": 2 * n, "bf16": 2 * n, "int8": 4 + n}[codec]


def encode(x: np.ndarray, codec: str = "raw") -> bytes:
    """Encode an array with ``codec``; the shape and dtype travel separately (in a header)."""
    _check(codec)
    if codec == "raw":
        return np.ascontiguousarray(x).tobytes()
    if codec in COMPOSITE_CODECS:
        return transforms.encode(x, codec)
    if codec in LOSSLESS_CODECS:
        return lossless.encode(x, codec)
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if codec == "fp32":
        return x32.tobytes()
    if codec == "fp16":
        return x32.astype(np.float16).tobytes()
    if codec == "bf16":
        return fp32_to_bf16_bits(x32).tobytes()
    # int8
    finite = np.isfinite(x32)
    if not finite.all():
        raise ValueError("int8 codec cannot encode NaN or infinite values")
    amax = float(np.abs(x32).max()) if x32.size else 0.0
    # The scale travels as float32: if it underflows to 0 (|x| < ~1e-43), every value rounds to 0.
    scale = np.float32(amax / 127.0)
    if not scale > 0:
        scale = np.float32(1.0)
    q = np.clip(np.rint(x32 / scale), -127, 127).astype(np.int8)
    return np.float32(scale).tobytes() + q.tobytes()


def decode(buf: bytes | memoryview, shape: tuple[int, ...], dtype: str, codec: str = "raw") -> np.ndarray:
    """Decode bytes produced by :func:`encode` into a fresh array of ``shape`` and ``dtype``."""
    _check(codec)
    shape = tuple(int(s) for s in shape)
    if codec in COMPOSITE_CODECS:
        return transforms.decode(buf, shape, dtype, codec)
    if codec in LOSSLESS_CODECS:
        return lossless.decode(buf, shape, dtype, codec)
    if codec == "raw":
        return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape).copy()
    out: np.ndarray
    if codec == "fp32":
        out = np.frombuffer(buf, dtype=np.float32).reshape(shape)
    elif codec == "fp16":
        out = np.frombuffer(buf, dtype=np.float16).reshape(shape)
    elif codec == "bf16":
        out = bf16_bits_to_fp32(np.frombuffer(buf, dtype=np.uint16)).reshape(shape)
    else:
        scale = np.frombuffer(buf[:4], dtype=np.float32)[0]
        out = np.frombuffer(buf[4:], dtype=np.int8).reshape(shape).astype(np.float32) * scale
    return out.astype(np.dtype(dtype), copy=True)


def payload_nbytes(buf: bytes | memoryview, shape: tuple[int, ...], dtype: str | np.dtype, codec: str) -> int:
    """Size of the ``codec`` payload of such an array at the start of ``buf`` (which may hold more after it):
    :func:`encoded_nbytes` for a fixed-size codec, the length it declares for ``lz4`` / ``zstd`` (checked
    against the bytes present and against the array; ``ValueError`` if it cannot be right)."""
    _check(codec)
    if codec in COMPOSITE_CODECS:
        return transforms.payload_nbytes(buf, shape, np.dtype(dtype), codec)
    if codec in lossless.VARIABLE_CODECS:
        return lossless.payload_nbytes(buf, shape, np.dtype(dtype), codec)
    return encoded_nbytes(shape, np.dtype(dtype), codec)
