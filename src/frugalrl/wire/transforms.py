"""Experience transforms before a lossless compressor: frame-stack deltas (exact) and low-bit floats (lossy).

A composite codec is named ``"<transform>+<compressor>"`` (``"frames+zstd"``, ``"int8+lz4"``...): the
transform turns the array into *side* bytes (a fixed size, from the array's shape) and one *main* array,
which the compressor of :mod:`frugalrl.wire.lossless` encodes (self-delimiting). The payload is::

    side bytes | lz4 / zstd payload of the main array

Transforms (docs/clusterenv.md#the-experience-uplink):

- ``frames`` (lossless) for a rollout of stacked frames, shape ``(T, k, S, ...)`` (T steps of k envs, a stack of
  S frames): a step whose stack is the previous one shifted by one frame (``x[t, i, :-1] == x[t − 1, i, 1:]``)
  sends only its newest frame, others (an episode start, an autoreset) the whole stack. Side bytes: those flags,
  8 to a byte; main: the frames sent, env by env. The receiver rebuilds exactly the array that was encoded.
- ``steps`` (lossless) for a rollout of float observations, shape ``(T, k, ...)``: each step's words as their
  zigzag-coded difference in float order from the step before (:func:`frugalrl.wire.floats.step_differences`),
  env by env (main shape ``(k, T, ...)``, no side bytes): a physical state's high bytes become runs of zeros.
- ``fp16`` / ``bf16`` (lossy): float32 rounded to 16 bits (relative error ≤ 2⁻¹¹ / 2⁻⁸).
- ``int8`` / ``int16`` (lossy): an affine code per feature (the last axis), ``x ≈ lo + scale · q``, ``lo`` and
  ``scale`` each feature's minimum and range over ``2^b − 1`` in the message (float32 side bytes); the error is at
  most ``scale / 2`` (:func:`quantisation_error`). NaN and ±inf are refused.

Decoding checks every size the shape and the side bytes imply before allocating (corrupt input raises
``ValueError``).
"""

from __future__ import annotations

import math

import numpy as np

from frugalrl.wire import lossless
from frugalrl.wire.floats import bf16_bits_to_fp32, fp32_to_bf16_bits, step_differences, undo_step_differences

#: Transforms that reproduce the array exactly.
EXACT_TRANSFORMS: tuple[str, ...] = ("frames", "steps")
#: Transforms that round floats (their error is stated: :func:`quantisation_error`).
LOSSY_TRANSFORMS: tuple[str, ...] = ("fp16", "bf16", "int8", "int16")
TRANSFORMS: tuple[str, ...] = (*EXACT_TRANSFORMS, *LOSSY_TRANSFORMS)
#: Every composite codec name.
COMPOSITE_CODECS: tuple[str, ...] = tuple(f"{t}+{c}" for t in TRANSFORMS for c in lossless.VARIABLE_CODECS)

_F32 = np.dtype(np.float32)


def split(codec: str) -> tuple[str, str]:
    """``(transform, compressor)`` of a composite codec name; ``ValueError`` for anything else."""
    if codec not in COMPOSITE_CODECS:
        raise ValueError(f"unknown composite codec {codec!r}; expected one of {COMPOSITE_CODECS}")
    transform, compressor = codec.split("+")
    return transform, compressor


def check_array(x: np.ndarray, transform: str) -> None:
    """``ValueError`` if ``transform`` cannot encode ``x`` (checked by the worker before it picks a codec)."""
    if transform == "frames":
        if x.ndim < 4 or x.shape[2] < 2:
            raise ValueError(f"the frames transform needs a (T, k, S >= 2, ...) array, got shape {x.shape}")
        return
    if transform == "steps":
        if x.ndim < 2 or x.dtype.kind != "f":
            raise ValueError(f"the steps transform needs a (T, k, ...) float array, got {x.dtype} {x.shape}")
        return
    if x.dtype != _F32:
        raise ValueError(f"the {transform} transform encodes float32 arrays, got {x.dtype}")


# ---------------------------------------------------------------------------------------------- frames
def _frame_flags(x: np.ndarray) -> np.ndarray:
    """(T, k) bool: the stack at [t, i] is the one at [t − 1, i] shifted by one new frame (never at t = 0)."""
    T, k = x.shape[:2]
    flags = np.zeros((T, k), dtype=bool)
    if T > 1:
        same = x[1:, :, :-1] == x[:-1, :, 1:]
        flags[1:] = same.reshape(T - 1, k, -1).all(axis=-1)
    return flags


def _frames_main(x: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """The frames sent, env by env: the newest frame of each flagged step, the whole stack of the others."""
    k = x.shape[1]
    parts = []
    for i in range(k):
        col, f = x[:, i], flags[:, i]
        # within one env, steps in order: whole stacks where not flagged, newest frames where flagged
        starts = np.flatnonzero(~f)
        bounds = [*starts.tolist(), len(f)]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            parts.append(col[a].reshape(-1))
            if b > a + 1:
                parts.append(col[a + 1 : b, -1].reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, x.dtype)


def _frames_rebuild(main: np.ndarray, flags: np.ndarray, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    T, k, S = shape[:3]
    frame = math.prod(shape[3:])
    out = np.empty(shape, dtype=dt)
    pos = 0
    for i in range(k):
        col = out[:, i]
        for t in range(T):
            if flags[t, i]:
                col[t, :-1] = col[t - 1, 1:]
                col[t, -1] = main[pos : pos + frame].reshape(shape[3:])
                pos += frame
            else:
                col[t] = main[pos : pos + S * frame].reshape(shape[2:])
                pos += S * frame
    return out


def _frames_main_count(flags: np.ndarray, shape: tuple[int, ...]) -> int:
    frame = math.prod(shape[3:])
    flagged = int(flags.sum())
    return flagged * frame + (flags.size - flagged) * shape[2] * frame


# ---------------------------------------------------------------------------------------------- low-bit
def _features(shape: tuple[int, ...]) -> int:
    return int(shape[-1]) if len(shape) >= 2 else 1


def _affine(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lo, scale, q)``: the per-feature affine code of ``x`` on ``bits`` bits."""
    if not np.isfinite(x).all():
        raise ValueError(f"int{bits} observations cannot encode NaN or infinite values")
    d = _features(x.shape)
    rows = x.reshape(-1, d)
    levels = (1 << bits) - 1
    if rows.shape[0] == 0:
        lo = np.zeros(d, np.float32)
        hi = lo
    else:
        lo, hi = rows.min(axis=0), rows.max(axis=0)
    scale = ((hi.astype(np.float64) - lo) / levels).astype(np.float32)
    scale[~(scale > 0)] = 1.0  # a constant feature (or an empty array): any step decodes it exactly
    q = np.rint((rows.astype(np.float64) - lo) / scale.astype(np.float64))
    q = np.clip(q, 0, levels).astype(np.uint8 if bits == 8 else np.uint16)
    return lo.astype(np.float32), scale, q.reshape(x.shape)


def quantisation_error(x: np.ndarray, transform: str) -> float:
    """The largest absolute error ``transform`` makes on ``x`` (found by encoding, decoding and comparing)."""
    if x.size == 0:
        return 0.0
    y = decode(encode(x, f"{transform}+lz4"), x.shape, x.dtype, f"{transform}+lz4")
    return float(np.max(np.abs(y.astype(np.float64) - x.astype(np.float64))))


# ---------------------------------------------------------------------------------------------- codec
def _side_nbytes(transform: str, shape: tuple[int, ...]) -> int:
    if transform == "frames":
        return (math.prod(shape[:2]) + 7) // 8
    if transform in ("int8", "int16"):
        return 8 * _features(shape)
    return 0


def _main_dtype(transform: str, dt: np.dtype) -> np.dtype:
    if transform == "steps":
        return np.dtype(f"u{dt.itemsize}")
    return {"frames": dt, "fp16": np.dtype(np.float16), "bf16": np.dtype(np.uint16),
            "int8": np.dtype(np.uint8), "int16": np.dtype(np.uint16)}[transform]


def encode(x: np.ndarray, codec: str) -> bytes:
    """Encode ``x`` with a composite codec; its shape and dtype travel separately (in a header)."""
    transform, compressor = split(codec)
    x = np.ascontiguousarray(x)
    check_array(x, transform)
    side = b""
    if transform == "frames":
        flags = _frame_flags(x)
        side = np.packbits(flags.reshape(-1)).tobytes()
        main = _frames_main(x, flags)
    elif transform == "steps":
        main = np.ascontiguousarray(np.swapaxes(step_differences(x.view(_main_dtype("steps", x.dtype))), 0, 1))
    elif transform == "fp16":
        main = x.astype(np.float16)
    elif transform == "bf16":
        main = fp32_to_bf16_bits(x)
    else:
        lo, scale, main = _affine(x, 8 if transform == "int8" else 16)
        side = lo.tobytes() + scale.tobytes()
    return side + lossless.encode(main, compressor)


def _parts(buf: bytes | memoryview, shape: tuple[int, ...], dt: np.dtype, codec: str) -> tuple[int, int, tuple[int, ...]]:
    """``(side bytes, payload bytes, main shape)`` of a payload at the start of ``buf``, checked."""
    transform, compressor = split(codec)
    if transform == "frames":
        if len(shape) < 4 or shape[2] < 2:
            raise ValueError(f"frames payload for an array of shape {shape}: needs (T, k, S >= 2, ...)")
    elif transform == "steps":
        if len(shape) < 2 or dt.kind != "f":
            raise ValueError(f"steps payload for a {dt} array of shape {shape}: needs a (T, k, ...) float array")
    elif dt != _F32:
        raise ValueError(f"{codec} payload for a {dt} array: the {transform} transform decodes to float32")
    side = _side_nbytes(transform, shape)
    if len(buf) < side:
        raise ValueError(f"{codec} payload truncated: {len(buf)} bytes, its side part needs {side}")
    if transform == "frames":
        flags = np.unpackbits(np.frombuffer(buf[:side], np.uint8), count=math.prod(shape[:2])).astype(bool)
        main_shape: tuple[int, ...] = (_frames_main_count(flags.reshape(shape[:2]), shape),)
    elif transform == "steps":
        main_shape = (shape[1], shape[0], *shape[2:])
    else:
        main_shape = shape
    body = lossless.payload_nbytes(memoryview(buf)[side:], main_shape, _main_dtype(transform, dt), compressor)
    return side, side + body, main_shape


def payload_nbytes(buf: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype, codec: str) -> int:
    """Size of the composite payload at the start of ``buf`` (which may hold more), checked."""
    return _parts(buf, tuple(int(s) for s in shape), np.dtype(dtype), codec)[1]


def decode(buf: bytes | memoryview, shape: tuple[int, ...], dtype: str | np.dtype, codec: str) -> np.ndarray:
    """Decode exactly one composite payload (``buf`` holds it and nothing else) into a fresh array."""
    dt = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    transform, compressor = split(codec)
    side, total, main_shape = _parts(buf, shape, dt, codec)
    if total != len(buf):
        raise ValueError(f"{codec} payload declares {total} bytes but {len(buf)} were given")
    main = lossless.decode(memoryview(buf)[side:], main_shape, _main_dtype(transform, dt), compressor)
    if transform == "frames":
        flags = np.unpackbits(np.frombuffer(buf[:side], np.uint8), count=math.prod(shape[:2])).astype(bool)
        flags = flags.reshape(shape[:2])
        if flags[:1].any():
            raise ValueError("frames payload flags a first step as a shifted stack (it has no previous one)")
        return _frames_rebuild(main, flags, shape, dt)
    if transform == "steps":
        return undo_step_differences(np.swapaxes(main, 0, 1)).view(dt)
    if transform == "fp16":
        return main.astype(np.float32)
    if transform == "bf16":
        return bf16_bits_to_fp32(main).reshape(shape).copy()
    d = _features(shape)
    lo = np.frombuffer(buf[: 4 * d], np.float32)
    scale = np.frombuffer(buf[4 * d : side], np.float32)
    return (lo + main.reshape(-1, d).astype(np.float32) * scale).astype(np.float32).reshape(shape)
