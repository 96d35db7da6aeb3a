"""Golomb-Rice coding of a sorted set of flat indices: the ``gap`` index encoding of cut messages.

The byte layout is specified with the rest of the cut message format in :mod:`frugalrl.wire.cut`;
this module holds the coding itself, which the format calls through :func:`gaps`, :func:`plan`,
:func:`encode` and :func:`decode`.

Sorted unique indices ``i_0 < i_1 < ...`` become gaps ``g_0 = i_0``, ``g_j = i_j - i_{j-1} - 1``
(every gap ``>= 0``), each split as ``q = g >> k`` (sent in unary) and ``r = g & (2**k - 1)`` (sent
in ``k`` bits). The payload, ``4 + ceil(nnz * k / 8) + ceil((sum(q) + nnz) / 8)`` bytes
(:func:`payload_nbytes`), depends on ``k``; :func:`plan` finds the ``k`` that minimises it exactly
(not the usual ``log2(mean gap)`` rule of thumb), and :func:`payload_lower_bound` bounds it from
the sum of the gaps alone, so that a caller choosing among encodings can skip the plan when ``gap``
cannot win. Both streams encode and decode without a Python loop over the indices (one NumPy pass
per bit of ``k``; the unary stream by ``np.flatnonzero`` on its zero bits).

:func:`expected_streams_nbytes` models the size for uniformly random positions, for estimators
that must not build the indices.
"""

from __future__ import annotations

import math
import struct

import numpy as np

#: The largest Rice parameter (the header field allows it; indices are int64).
MAX_RICE_K = 62

_U32 = struct.Struct("<I")


def payload_nbytes(nnz: int, k: int, sum_q: int) -> int:
    """Bytes of a gap payload: ``u32`` length, ``k``-bit remainders, unary quotients (each padded)."""
    return 4 + (nnz * k + 7) // 8 + (sum_q + nnz + 7) // 8


def gaps(flat_idx: np.ndarray) -> np.ndarray:
    """Gaps ``g_0 = i_0``, ``g_j = i_j - i_{j-1} - 1`` of sorted unique indices (int64, >= 0)."""
    return np.diff(flat_idx, prepend=np.int64(-1)) - 1


def plan(g: np.ndarray) -> tuple[int, int]:
    """``(k, sum(g >> k))`` for the Rice parameter ``k`` that minimises the gap payload exactly.

    The payload in bits, ``b(k) = n*k + S(k) + n`` with ``S(k) = sum(g >> k)``, is convex in ``k``:
    ``S(k) - S(k+1) = sum(ceil((g >> k) / 2))`` does not grow with ``k``. So a local search finds
    its minimum, and every ``k`` whose byte count could tie or beat it (``b(k) <= min b + 16``,
    the two byte roundings add less than 16 bits) lies in one interval around it. Ties go to the
    smallest ``k``.
    """
    n = g.size
    if n == 0:
        return 0, 0
    cache: dict[int, int] = {}

    def s(k: int) -> int:
        if k not in cache:
            cache[k] = int((g >> k).sum())
        return cache[k]

    def bits(k: int) -> int:
        return n * k + s(k) + n

    mean = float(g.mean())
    k = min(MAX_RICE_K, max(0, int(math.log2(mean * math.log(2))) if mean > 1 else 0))
    while k + 1 <= MAX_RICE_K and bits(k + 1) < bits(k):
        k += 1
    while k > 0 and bits(k - 1) <= bits(k):
        k -= 1
    best_bits = bits(k)
    lo = k
    while lo > 0 and bits(lo - 1) <= best_bits + 16:
        lo -= 1
    hi = k
    while hi < MAX_RICE_K and bits(hi + 1) <= best_bits + 16:
        hi += 1
    best = min(range(lo, hi + 1), key=lambda j: (payload_nbytes(n, j, s(j)), j))
    return best, s(best)


def payload_lower_bound(nnz: int, sum_g: int) -> int:
    """A lower bound of the gap payload from ``nnz`` and the sum of the gaps alone.

    ``g >> k >= (g - 2**k + 1) / 2**k``, so ``sum(q) >= ceil((sum_g - nnz * (2**k - 1)) / 2**k)``;
    the two byte roundings only add.
    """
    best = -1
    for k in range(MAX_RICE_K + 1):
        fixed = nnz * (k + 1)
        if best >= 0 and fixed >= best:
            break  # the bound only grows from here
        bits = fixed + max(0, -(-(sum_g - nnz * ((1 << k) - 1)) >> k))
        best = bits if best < 0 else min(best, bits)
    return 4 + (best + 7) // 8


def expected_streams_nbytes(numel: int, nnz: int) -> float:
    """Expected bytes of the two streams (the payload less its 4-byte length field) for ``nnz > 0``
    uniformly random positions among ``numel``, with the best ``k``.

    Gaps are modelled as geometric with success probability ``(nnz + 1) / (numel + 1)`` (which
    matches their mean); for Rice parameter ``k``, ``E[q] = t / (1 - t)`` with
    ``t = (1 - prob) ** (2 ** k)``, and each byte rounding adds 7/16 byte on average.
    """
    prob = (nnz + 1) / (numel + 1)
    ks = np.arange(MAX_RICE_K + 1, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        theta = np.exp(np.exp2(ks) * math.log1p(-prob)) if prob < 1 else np.zeros_like(ks)
        eq = theta / (1.0 - theta)
    sizes = np.ceil(nnz * ks / 8) + nnz * (eq + 1) / 8 + 7 / 16
    sizes[~np.isfinite(sizes)] = np.inf
    return float(sizes.min())


def encode(g: np.ndarray, k: int, sum_q: int) -> bytes:
    """The gap payload of gaps ``g`` with Rice parameter ``k`` (``sum_q = sum(g >> k)``, from :func:`plan`).

    Raises :class:`ValueError` if the unary stream is too long for its u32 length field.
    """
    n = g.size
    q = g >> k
    rem = b""
    if k > 0 and n > 0:
        bits = np.empty((n, k), dtype=np.uint8)
        for j in range(k):  # one pass per bit plane, most significant first
            bits[:, j] = (g >> (k - 1 - j)) & 1
        rem = np.packbits(bits.reshape(-1)).tobytes()
    nbytes = (sum_q + n + 7) // 8
    if nbytes > 0xFFFFFFFF:
        raise ValueError("gap index too long for its u32 length field")
    unary = np.ones(8 * nbytes, dtype=np.uint8)
    if n:
        unary[np.cumsum(q + 1) - 1] = 0
    return _U32.pack(nbytes) + rem + np.packbits(unary).tobytes()


def decode(raw: memoryview, numel: int, nnz: int, k: int) -> np.ndarray:
    """The sorted flat indices (int64) that gap payload ``raw`` codes.

    Raises :class:`ValueError` naming the fault if ``raw`` is not exactly a payload of ``nnz``
    indices below ``numel`` with Rice parameter ``k`` (wrong length, trailing bytes, wrong count,
    an index out of range).
    """
    if len(raw) < 4:
        raise ValueError("truncated gap index")
    (unary_len,) = _U32.unpack_from(raw, 0)
    rem_len = (nnz * k + 7) // 8
    if len(raw) != 4 + rem_len + unary_len:
        raise ValueError(f"gap index of {len(raw)} bytes, its fields imply {4 + rem_len + unary_len}")
    unary = np.unpackbits(np.frombuffer(raw, dtype=np.uint8, offset=4 + rem_len))
    zeros = np.flatnonzero(unary == 0)
    if zeros.size != nnz:
        raise ValueError(f"gap index codes {zeros.size} gaps but nnz is {nnz}")
    if unary_len != (int(zeros[-1]) // 8 + 1 if nnz else 0):
        raise ValueError("gap index has trailing bytes")
    if nnz == 0:
        return np.zeros(0, dtype=np.int64)
    q = np.diff(zeros, prepend=np.int64(-1)) - 1
    if int(q.max()) > (numel >> k):
        raise ValueError("index out of range")
    g = q << k
    if k > 0:
        flat_bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8, offset=4, count=rem_len), count=nnz * k)
        bits = flat_bits.reshape(nnz, k)
        for j in range(k):  # one pass per bit plane, most significant first
            g |= bits[:, j].astype(np.int64) << (k - 1 - j)
    idx = np.cumsum(g + 1) - 1
    if idx[-1] >= numel:
        raise ValueError(f"index {int(idx[-1])} out of range for {numel} elements")
    return idx
