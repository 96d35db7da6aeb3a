"""Float words: bfloat16 as 16-bit patterns of float32 (round to nearest even), for the weights, cut and experience
codecs; and the zigzag-coded difference of float words in float order, for delta-coded weights
(:mod:`frugalrl.wire.delta`) and the experience transform ``steps`` (:mod:`frugalrl.wire.transforms`)."""

from __future__ import annotations

import numpy as np


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest even) and return the 16-bit patterns as uint16."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # Round to nearest even on the 16 dropped bits.
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    # A NaN whose payload sits only in the dropped bits would round to inf (or wrap to 0 for
    # 0xFFFFFFFF): keep the sign and upper payload and set the quiet bit so NaN stays NaN.
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    """Inverse of :func:`fp32_to_bf16_bits`."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _ordered(words: np.ndarray) -> np.ndarray:
    """Unsigned words in the order of the floats they code (see :func:`difference`); a bijection."""
    sign = words.dtype.type(1 << (8 * words.dtype.itemsize - 1))
    return np.where(words & sign, ~words, words | sign)


def _unordered(ordered: np.ndarray) -> np.ndarray:
    """:func:`_ordered` undone."""
    sign = ordered.dtype.type(1 << (8 * ordered.dtype.itemsize - 1))
    return np.where(ordered & sign, ordered ^ sign, ~ordered)


def difference(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The zigzag-coded, wrapped difference of ``new`` and ``old`` in float order (unsigned words, their dtype):
    each word is mapped to one whose unsigned order is its float's (negative floats' words have every bit
    flipped, the others' their sign bit), then subtracted modulo the word size."""
    bits = 8 * old.dtype.itemsize
    d = (_ordered(new) - _ordered(old)).view(f"i{old.dtype.itemsize}")  # wraps, as unsigned arithmetic does
    return ((d << 1) ^ (d >> (bits - 1))).view(old.dtype)


def undo_difference(old: np.ndarray, diff: np.ndarray) -> np.ndarray:
    """The words whose :func:`difference` from ``old`` is ``diff``."""
    d = (diff >> 1) ^ (np.zeros_like(diff) - (diff & 1))  # zigzag undone, still wrapped
    return _unordered(_ordered(old) + d)


def step_differences(words: np.ndarray) -> np.ndarray:
    """Along the first axis: the first row as it is, then each row's :func:`difference` from the one before."""
    out = words.copy()
    out[1:] = difference(words[:-1], words[1:])
    return out


def undo_step_differences(coded: np.ndarray) -> np.ndarray:
    """The words whose :func:`step_differences` are ``coded`` (a running sum in float order, wrapping)."""
    d = (coded >> 1) ^ (np.zeros_like(coded) - (coded & 1))
    d[:1] = _ordered(coded[:1])
    return _unordered(np.cumsum(d, axis=0, dtype=coded.dtype))
