"""bfloat16 as 16-bit patterns of float32 (round to nearest even), for the weights, cut and experience codecs."""

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
