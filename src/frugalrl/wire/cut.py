"""Cut codecs: the gradients (and activations) that cross the cut of a split model.

A model split across two machines sends activations forward and gradients backward at the cut.
This module turns one such tensor into one self-describing binary message and back:

- :func:`encode_dense` / :class:`DenseCut`: every entry, as ``fp32``, ``bf16`` or ``fp16``;
- :func:`encode_sparse`: selected entries only, as sorted flat (row-major) indices plus values;
- :class:`TopPercentile`: the error-feedback top-percentile sparsifier of sparse cut-gradient
  pipeline PPO (accumulate ``G <- G + grad``, send the entries with the largest ``|G|``, keep the
  rest in ``G`` for later steps, send densely during a warm start);
- :func:`decode_cut` turns any of these messages into a dense float32 tensor of its shape.

Nothing is pickled; a message from an untrusted peer can at worst fail with :class:`ValueError`.

Message layout (little-endian)
------------------------------
Every message starts with the same fixed header of :func:`header_nbytes` ``= 12 + 4 * ndim``
bytes::

    u8 magic (0xC7) | u8 version (1) | u8 kind (0 dense, 1 sparse)
    u8 value dtype (0 bf16, 1 fp16, 2 fp32) | u8 index encoding (0 none, 1 coo16, 2 bitmask, 3 gap)
    u8 rice k (gap only, else 0) | u8 ndim (1..8) | u8 flags (0) | u32 nnz (sparse; 0 when dense)
    ndim x u32 dims

A dense message is followed by ``numel`` values (row-major). A sparse message is followed by
``nnz`` values (in increasing index order) and then the index payload, in one of three
encodings of the sorted unique flat indices ``i_0 < i_1 < ...``:

``coo16`` (the paper's int16 coordinates)
    One uint16 per coordinate digit per nonzero, stored as column streams (every nonzero's
    first digit, then every nonzero's second digit, ...). A dimension of size ``s`` needs one
    16-bit digit if ``s <= 65536`` and two (high part, then low part: "offsets") otherwise.
    Payload ``2 * nnz * sum(digits(s) for s in shape)`` bytes.
``bitmask``
    One bit per entry (``np.packbits``, most significant bit first, zero padding):
    ``ceil(numel / 8)`` bytes.
``gap`` (Golomb-Rice)
    Gaps ``g_0 = i_0``, ``g_j = i_j - i_{j-1} - 1`` (so every gap is >= 0), each split as
    ``q = g >> k``, ``r = g & (2**k - 1)``. The payload is ``u32 L`` (byte length of the unary
    stream), then the k-bit remainders packed MSB first (``ceil(nnz * k / 8)`` bytes), then the
    unary stream: for each gap ``q`` one-bits and a zero-bit, padded with one-bits to
    ``L = ceil((sum(q) + nnz) / 8)`` bytes. The payload is
    ``4 + ceil(nnz * k / 8) + ceil((sum(q) + nnz) / 8)`` bytes, and ``k`` (0..62) is chosen per
    message as the value that minimises exactly that. Both streams decode without a Python loop
    (the unary stream by ``np.flatnonzero`` on its zero bits).

Values take 2 bytes (``bf16``: the upper half of the fp32 pattern, rounded to nearest even;
``fp16``) or 4 bytes (``fp32``) each. The encoders refuse NaN and infinities; finite values
beyond the range of ``bf16``/``fp16`` saturate to the largest finite value of that dtype.

Sizes, header included, are exact: :func:`dense_nbytes` ``= header + numel * value_bytes`` and
:func:`sparse_nbytes` ``= header + nnz * value_bytes + index payload``. There is no checksum:
the transport is trusted for integrity, the decoder only checks the structure (magic, lengths,
indices in range and strictly increasing, finite values).
"""

from __future__ import annotations

import math
import operator
import struct
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from frugalrl.wire.codecs import bf16_bits_to_fp32, fp32_to_bf16_bits

INDEX_ENCODINGS = ("coo16", "bitmask", "gap")
VALUE_DTYPES = ("bf16", "fp16", "fp32")

MAGIC = 0xC7
VERSION = 1
#: A sparse message may describe a tensor of at most this many elements (a decoder guard
#: against a corrupt shape making it allocate an absurd tensor).
MAX_DECODE_NUMEL = 2**31
MAX_NDIM = 8
MAX_RICE_K = 62

_FIXED = struct.Struct("<BBBBBBBBI")
_U32 = struct.Struct("<I")
_DENSE, _SPARSE = 0, 1
_INDEX_CODE = {"coo16": 1, "bitmask": 2, "gap": 3}
_INDEX_NAME = {v: k for k, v in _INDEX_CODE.items()}
_VALUE_CODE = {name: i for i, name in enumerate(VALUE_DTYPES)}
_VALUE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_FP16_MAX = 65504.0
_BF16_INF = np.uint16(0x7F80)
_BF16_MAX_BITS = np.uint16(0x7F7F)


# ---------------------------------------------------------------------------------------------
# validation helpers


def _check_values_dtype(name: str, what: str = "value dtype") -> None:
    if name not in VALUE_DTYPES:
        raise ValueError(f"unknown {what} {name!r}; expected one of {VALUE_DTYPES}")


def _check_index(name: str) -> None:
    if name != "auto" and name not in INDEX_ENCODINGS:
        raise ValueError(f"unknown index encoding {name!r}; expected one of {(*INDEX_ENCODINGS, 'auto')}")


def _shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, checked: 1..8 dims, each in [0, 2**32 - 1]."""
    try:
        dims = tuple(operator.index(s) for s in shape)
    except TypeError as e:
        raise ValueError(f"shape {shape!r} is not a sequence of integers") from e
    if not 1 <= len(dims) <= MAX_NDIM:
        raise ValueError(f"a cut tensor needs 1 to {MAX_NDIM} dimensions, got shape {dims}")
    if any(not 0 <= d <= 0xFFFFFFFF for d in dims):
        raise ValueError(f"every dimension must be in [0, 2**32 - 1], got shape {dims}")
    return dims


def _digits(dim: int) -> int:
    """16-bit digits that ``coo16`` needs for a coordinate along a dimension of size ``dim``."""
    return 1 if dim <= 65536 else 2


def _as_float32(x: Any) -> np.ndarray:
    """A C-contiguous float32 NumPy array holding ``x`` (a tensor on any device, or an array)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if x.dtype != torch.float32:
            x = x.float()
        x = x.numpy()
    return np.asarray(x, dtype=np.float32, order="C")  # (ascontiguousarray would make 0-d 1-d)


def _all_finite(x: np.ndarray) -> bool:
    """True if every value of float array ``x`` is finite (one pass, no temporary array).

    A finite sum proves it (NaN and inf propagate); only if the sum is not finite (which may be
    an overflow of finite values) is every element tested.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(x, axis=None)
    return bool(np.isfinite(total)) or bool(np.isfinite(x).all())


def _check_finite(x: np.ndarray, what: str) -> None:
    if not _all_finite(x):
        raise ValueError(f"{what} contains non-finite values")


def _quantize(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``(payload, decoded)``: the wire array of finite float32 ``x`` and what a receiver reads back."""
    if dtype == "fp32":
        return x, x
    if dtype == "fp16":
        h = np.clip(x, -_FP16_MAX, _FP16_MAX).astype(np.float16)
        return h, h.astype(np.float32)
    bits = fp32_to_bf16_bits(x)
    # Finite values above the bf16 range round up to inf: saturate them to the largest finite bf16.
    over = (bits & np.uint16(0x7FFF)) == _BF16_INF
    if over.any():
        bits[over] = (bits[over] & np.uint16(0x8000)) | _BF16_MAX_BITS
    return bits, bf16_bits_to_fp32(bits)


def _dequantize(raw: memoryview, n: int, dtype: str) -> np.ndarray:
    """Float32 values of ``n`` wire values of ``dtype`` (always a fresh, writable array)."""
    if dtype == "fp32":
        return np.frombuffer(raw, dtype="<f4", count=n).astype(np.float32)
    if dtype == "fp16":
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float32)
    return bf16_bits_to_fp32(np.frombuffer(raw, dtype="<u2", count=n))


# ---------------------------------------------------------------------------------------------
# sizes


def header_nbytes(ndim: int) -> int:
    """Size of the fixed header of a cut message of ``ndim`` dimensions: ``12 + 4 * ndim`` bytes."""
    ndim = operator.index(ndim)
    if not 1 <= ndim <= MAX_NDIM:
        raise ValueError(f"a cut tensor needs 1 to {MAX_NDIM} dimensions, got {ndim}")
    return _FIXED.size + 4 * ndim


def dense_nbytes(shape: Any, dtype: str) -> int:
    """Exact size of a dense cut message: ``header_nbytes(ndim) + numel * value_bytes``."""
    dims = _shape(shape)
    _check_values_dtype(dtype)
    return header_nbytes(len(dims)) + math.prod(dims) * _VALUE_BYTES[dtype]


def _coo16_payload(dims: tuple[int, ...], nnz: int) -> int:
    return 2 * nnz * sum(_digits(d) for d in dims)


def _bitmask_payload(numel: int) -> int:
    return (numel + 7) // 8


def _gap_payload(nnz: int, k: int, sum_q: int) -> int:
    return 4 + (nnz * k + 7) // 8 + (sum_q + nnz + 7) // 8


def _gaps(flat_idx: np.ndarray) -> np.ndarray:
    """Gaps ``g_0 = i_0``, ``g_j = i_j - i_{j-1} - 1`` of sorted unique indices (int64, >= 0)."""
    return np.diff(flat_idx, prepend=np.int64(-1)) - 1


def _rice_plan(g: np.ndarray) -> tuple[int, int]:
    """``(k, sum(g >> k))`` for the Rice parameter ``k`` that minimises the gap payload exactly.

    The payload in bits, ``b(k) = n*k + S(k) + n`` with ``S(k) = sum(g >> k)``, is convex in ``k``:
    ``S(k) - S(k+1) = sum(ceil((g >> k) / 2))`` does not grow with ``k``. So a local search finds
    its minimum, and every ``k`` whose byte count could tie or beat it (``b(k) <= min b + 16``,
    the two byte roundings add less than 16 bits) lies in one interval around it.
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
    best = min(range(lo, hi + 1), key=lambda j: (_gap_payload(n, j, s(j)), j))
    return best, s(best)


def _gap_payload_lower_bound(nnz: int, sum_g: int) -> int:
    """A lower bound of the ``gap`` payload from ``nnz`` and the sum of the gaps alone.

    ``g >> k >= (g - 2**k + 1) / 2**k``, so ``sum(q) >= ceil((sum_g - nnz * (2**k - 1)) / 2**k)``;
    the two byte roundings only add. Lets ``auto`` skip the Rice plan when ``gap`` cannot win.
    """
    best = -1
    for k in range(MAX_RICE_K + 1):
        fixed = nnz * (k + 1)
        if best >= 0 and fixed >= best:
            break  # the bound only grows from here
        bits = fixed + max(0, -(-(sum_g - nnz * ((1 << k) - 1)) >> k))
        best = bits if best < 0 else min(best, bits)
    return 4 + (best + 7) // 8


def _plan_index(
    idx: np.ndarray, dims: tuple[int, ...], index: str
) -> tuple[str, int, int, int, np.ndarray | None]:
    """``(index, k, sum_q, payload, gaps)`` for sorted unique ``idx``: ``auto`` resolved to the
    smallest encoding (ties: first in :data:`INDEX_ENCODINGS`); ``k``, ``sum_q`` and ``gaps`` are
    only set for ``gap`` (else 0, 0, ``None``)."""
    nnz, numel = idx.size, math.prod(dims)
    if index == "coo16":
        return index, 0, 0, _coo16_payload(dims, nnz), None
    if index == "bitmask":
        return index, 0, 0, _bitmask_payload(numel), None
    if index == "auto":
        coo, bm = _coo16_payload(dims, nnz), _bitmask_payload(numel)
        best = ("coo16", 0, 0, coo, None) if coo <= bm else ("bitmask", 0, 0, bm, None)
        sum_g = int(idx[-1]) + 1 - nnz if nnz else 0
        if _gap_payload_lower_bound(nnz, sum_g) >= best[3]:
            return best
    g = _gaps(idx)
    k, sum_q = _rice_plan(g)
    gap = _gap_payload(nnz, k, sum_q)
    if index == "auto" and gap >= best[3]:
        return best
    return "gap", k, sum_q, gap, g


def _int64_vector(x: Any, what: str) -> np.ndarray:
    """``x`` (a tensor on any device, or array-like) as a 1-D int64 array; empty may be any dtype."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{what} must be a 1-D integer array, got dtype {a.dtype} and shape {a.shape}")
    return a.astype(np.int64, copy=False)


def _check_flat_idx(flat_idx: Any, numel: int) -> np.ndarray:
    """``flat_idx`` as a 1-D int64 array, checked sorted, unique and within ``[0, numel)``."""
    idx = _int64_vector(flat_idx, "flat_idx")
    if idx.size:
        if idx[0] < 0 or idx[-1] >= numel:
            raise ValueError(f"flat_idx out of range [0, {numel})")
        if idx.size > 1 and not (np.diff(idx) > 0).all():
            raise ValueError("flat_idx must be sorted and unique")
    return idx


def sparse_nbytes(
    shape: Any, nnz: int, index: str, values: str = "bf16", flat_idx: np.ndarray | None = None
) -> int:
    """Exact size of a sparse cut message (header included).

    ``header + nnz * value_bytes`` plus the index payload: ``coo16``
    ``2 * nnz * sum(digits(dim))``; ``bitmask`` ``ceil(numel / 8)``; ``gap``
    ``4 + ceil(nnz * k / 8) + ceil((sum(q) + nnz) / 8)`` with the best ``k``. ``coo16`` and
    ``bitmask`` need only ``nnz``; ``gap`` and ``auto`` (the smallest of the three) depend on the
    positions and need ``flat_idx`` (sorted, unique), else :class:`ValueError`.
    """
    dims = _shape(shape)
    _check_index(index)
    _check_values_dtype(values)
    nnz = operator.index(nnz)
    numel = math.prod(dims)
    if not 0 <= nnz <= numel:
        raise ValueError(f"nnz {nnz} out of range for shape {dims}")
    base = header_nbytes(len(dims)) + nnz * _VALUE_BYTES[values]
    if index == "coo16":
        return base + _coo16_payload(dims, nnz)
    if index == "bitmask":
        return base + _bitmask_payload(numel)
    if flat_idx is None:
        raise ValueError(f"the size of a {index!r} message depends on the positions: pass flat_idx")
    idx = _check_flat_idx(flat_idx, numel)
    if idx.size != nnz:
        raise ValueError(f"flat_idx holds {idx.size} indices but nnz is {nnz}")
    return base + _plan_index(idx, dims, index)[3]


def expected_gap_nbytes(shape: Any, nnz: int, values: str = "bf16") -> float:
    """Expected size of a ``gap`` message whose ``nnz`` positions are uniformly random.

    Gaps are modelled as geometric with success probability ``(nnz + 1) / (numel + 1)`` (which
    matches their mean); for Rice parameter ``k``, ``E[q] = t / (1 - t)`` with
    ``t = (1 - prob) ** (2 ** k)``, each byte rounding adds 7/16 byte on average, and the best
    ``k`` is taken. Meant for estimators that must not build the indices.
    """
    dims = _shape(shape)
    _check_values_dtype(values)
    nnz = operator.index(nnz)
    numel = math.prod(dims)
    if not 0 <= nnz <= numel:
        raise ValueError(f"nnz {nnz} out of range for shape {dims}")
    base = header_nbytes(len(dims)) + nnz * _VALUE_BYTES[values] + 4
    if nnz == 0:
        return float(base)
    prob = (nnz + 1) / (numel + 1)
    ks = np.arange(MAX_RICE_K + 1, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        theta = np.exp(np.exp2(ks) * math.log1p(-prob)) if prob < 1 else np.zeros_like(ks)
        eq = theta / (1.0 - theta)
    sizes = np.ceil(nnz * ks / 8) + nnz * (eq + 1) / 8 + 7 / 16
    sizes[~np.isfinite(sizes)] = np.inf
    return float(base + sizes.min())


def topk_count(numel: int, p: float) -> int:
    """Entries sent at percentile ``p``: ``numel - floor(p * numel)``, at least 1 when ``numel > 0``.

    ``p`` is read as the decimal it prints as (``0.9`` is 9/10, not the binary float just above
    it), and the product is exact: ``topk_count(10, 0.9) == 1``, ``topk_count(10, 0.7) == 3``.
    """
    numel = operator.index(numel)
    p = float(p)
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"percentile p must be in [0, 1], got {p}")
    if numel == 0:
        return 0
    frac = Fraction(repr(p))
    kept = numel - (frac.numerator * numel) // frac.denominator
    return max(1, kept)


# ---------------------------------------------------------------------------------------------
# encoders


def _le_bytes(a: np.ndarray) -> bytes:
    """The bytes of ``a`` in little-endian order."""
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def _header(kind: int, values: str, index_code: int, k: int, dims: tuple[int, ...], nnz: int) -> bytes:
    return _FIXED.pack(
        MAGIC, VERSION, kind, _VALUE_CODE[values], index_code, k, len(dims), 0, nnz
    ) + struct.pack(f"<{len(dims)}I", *dims)


def encode_dense(x: torch.Tensor | np.ndarray, dtype: str = "fp32") -> bytes:
    """A dense cut message of ``x`` (any device, any float dtype) with values in ``dtype``.

    Raises :class:`ValueError` on NaN or infinite values, or on a 0-d or > 8-d tensor.
    """
    _check_values_dtype(dtype)
    arr = _as_float32(x)
    dims = _shape(arr.shape)
    _check_finite(arr, "cut tensor")
    payload, _ = _quantize(arr.reshape(-1), dtype)
    return _header(_DENSE, dtype, 0, 0, dims, 0) + _le_bytes(payload)


def _coo16_bytes(idx: np.ndarray, dims: tuple[int, ...]) -> bytes:
    streams = np.empty((sum(_digits(d) for d in dims), idx.size), dtype="<u2")
    coords = []
    rest = idx
    for d in reversed(dims):
        if d > 0:
            coords.append(rest % d)
            rest = rest // d
        else:
            coords.append(rest)
    row = 0
    for d, c in zip(dims, reversed(coords), strict=True):
        if _digits(d) == 2:
            streams[row] = c >> 16
            row += 1
        streams[row] = c & 0xFFFF
        row += 1
    return streams.tobytes()


def _bitmask_bytes(idx: np.ndarray, numel: int) -> bytes:
    mask = np.zeros(numel, dtype=bool)
    mask[idx] = True
    return np.packbits(mask).tobytes()


def _gap_bytes(g: np.ndarray, k: int, sum_q: int) -> bytes:
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


def _encode_sparse_raw(
    idx: np.ndarray, payload: np.ndarray, dims: tuple[int, ...], index: str, values: str
) -> tuple[bytes, str]:
    """Sparse message of checked indices and wire values; returns it and the index encoding used."""
    numel = math.prod(dims)
    nnz = idx.size
    if numel >= 2**63:
        raise ValueError(f"shape {dims} has too many elements for int64 flat indices")
    if nnz > 0xFFFFFFFF:
        raise ValueError(f"{nnz} nonzeros do not fit the u32 nnz field")
    index, k, sum_q, _, g = _plan_index(idx, dims, index)
    if index == "coo16":
        body = _coo16_bytes(idx, dims)
    elif index == "bitmask":
        body = _bitmask_bytes(idx, numel)
    else:
        assert g is not None
        body = _gap_bytes(g, k, sum_q)
    head = _header(_SPARSE, values, _INDEX_CODE[index], k, dims, nnz)
    return b"".join((head, _le_bytes(payload), body)), index


def encode_sparse(
    flat_idx: np.ndarray,
    values: np.ndarray,
    shape: Any,
    index: str = "auto",
    values_dtype: str = "bf16",
) -> bytes:
    """A sparse cut message: ``values[j]`` at row-major flat index ``flat_idx[j]`` of ``shape``.

    ``flat_idx`` must be sorted and unique (int64), ``values`` finite and of the same length;
    ``nnz = 0`` is allowed. ``index="auto"`` picks whichever of :data:`INDEX_ENCODINGS` is
    smallest for these indices (ties go to the first in that order).
    """
    dims = _shape(shape)
    _check_index(index)
    _check_values_dtype(values_dtype)
    numel = math.prod(dims)
    idx = _check_flat_idx(flat_idx, numel)
    vals = _as_float32(values).reshape(-1)
    if vals.size != idx.size:
        raise ValueError(f"{idx.size} indices but {vals.size} values")
    _check_finite(vals, "cut values")
    payload, _ = _quantize(vals, values_dtype)
    return _encode_sparse_raw(idx, payload, dims, index, values_dtype)[0]


# ---------------------------------------------------------------------------------------------
# decoding


def _corrupt(msg: str) -> ValueError:
    return ValueError(f"corrupt cut message: {msg}")


def _parse_header(view: memoryview) -> tuple[int, str, str | None, int, tuple[int, ...], int, int]:
    """``(kind, values, index, k, shape, nnz, header_size)`` of a message, checked."""
    if len(view) < _FIXED.size:
        raise _corrupt(f"truncated: {len(view)} bytes, a header takes at least {header_nbytes(1)}")
    magic, version, kind, vcode, icode, k, ndim, flags, nnz = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise _corrupt(f"bad magic byte 0x{magic:02x} (expected 0x{MAGIC:02x})")
    if version != VERSION:
        raise _corrupt(f"unsupported version {version}")
    if kind not in (_DENSE, _SPARSE) or vcode >= len(VALUE_DTYPES) or flags != 0:
        raise _corrupt(f"bad kind/value dtype/flags fields ({kind}, {vcode}, {flags})")
    if not 1 <= ndim <= MAX_NDIM:
        raise _corrupt(f"bad ndim {ndim}")
    hsize = header_nbytes(ndim)
    if len(view) < hsize:
        raise _corrupt(f"truncated: {len(view)} bytes, the header takes {hsize}")
    dims = struct.unpack_from(f"<{ndim}I", view, _FIXED.size)
    if kind == _DENSE:
        if icode != 0 or k != 0 or nnz != 0:
            raise _corrupt("dense message with sparse fields set")
        return kind, VALUE_DTYPES[vcode], None, 0, dims, math.prod(dims), hsize
    if icode not in _INDEX_NAME:
        raise _corrupt(f"bad index encoding code {icode}")
    index = _INDEX_NAME[icode]
    if (index != "gap" and k != 0) or k > MAX_RICE_K:
        raise _corrupt(f"bad rice parameter {k} for {index!r}")
    if nnz > math.prod(dims):
        raise _corrupt(f"nnz {nnz} exceeds the {math.prod(dims)} elements of shape {dims}")
    return kind, VALUE_DTYPES[vcode], index, k, dims, nnz, hsize


def cut_info(buf: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Parse the header only: ``{"kind", "shape", "nnz", "index", "values", "rice_k", "nbytes"}``.

    ``kind`` is ``"dense"`` or ``"sparse"``; a dense message has ``index=None`` and ``nnz=numel``;
    ``rice_k`` is the Rice parameter of a ``gap`` message (``None`` otherwise); ``nbytes`` is
    ``len(buf)``. Raises :class:`ValueError` on a bad header.
    """
    view = memoryview(buf).cast("B")
    kind, values, index, k, dims, nnz, _ = _parse_header(view)
    return {
        "kind": "dense" if kind == _DENSE else "sparse",
        "shape": dims,
        "nnz": nnz,
        "index": index,
        "values": values,
        "rice_k": k if index == "gap" else None,
        "nbytes": len(view),
    }


def _expect_len(view: memoryview, expected: int) -> None:
    if len(view) != expected:
        raise _corrupt(f"length {len(view)} bytes, the header implies {expected}")


def _decode_coo16(raw: memoryview, dims: tuple[int, ...], nnz: int) -> np.ndarray:
    if nnz == 0:
        return np.zeros(0, dtype=np.int64)
    streams = np.frombuffer(raw, dtype="<u2").reshape(-1, nnz).astype(np.int64)
    flat = np.zeros(nnz, dtype=np.int64)
    row = 0
    for d in dims:
        c = streams[row]
        row += 1
        if _digits(d) == 2:
            c = (c << 16) | streams[row]
            row += 1
        if (c >= d).any():
            raise _corrupt(f"coordinate out of range for a dimension of size {d}")
        flat = flat * d + c
    return flat


def _decode_bitmask(raw: memoryview, numel: int, nnz: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))
    if bits[numel:].any():
        raise _corrupt("bitmask padding bits set (index out of range)")
    idx = np.flatnonzero(bits[:numel].view(bool))
    if idx.size != nnz:
        raise _corrupt(f"bitmask has {idx.size} set bits but nnz is {nnz}")
    return idx.astype(np.int64, copy=False)


def _decode_gap(raw: memoryview, numel: int, nnz: int, k: int) -> np.ndarray:
    if len(raw) < 4:
        raise _corrupt("truncated gap index")
    (unary_len,) = _U32.unpack_from(raw, 0)
    rem_len = (nnz * k + 7) // 8
    if len(raw) != 4 + rem_len + unary_len:
        raise _corrupt(f"gap index of {len(raw)} bytes, its fields imply {4 + rem_len + unary_len}")
    unary = np.unpackbits(np.frombuffer(raw, dtype=np.uint8, offset=4 + rem_len))
    zeros = np.flatnonzero(unary == 0)
    if zeros.size != nnz:
        raise _corrupt(f"gap index codes {zeros.size} gaps but nnz is {nnz}")
    if unary_len != (int(zeros[-1]) // 8 + 1 if nnz else 0):
        raise _corrupt("gap index has trailing bytes")
    if nnz == 0:
        return np.zeros(0, dtype=np.int64)
    q = np.diff(zeros, prepend=np.int64(-1)) - 1
    if int(q.max()) > (numel >> k):
        raise _corrupt("index out of range")
    g = q << k
    if k > 0:
        bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8, offset=4, count=rem_len), count=nnz * k)
        bits = bits.reshape(nnz, k)
        for j in range(k):  # one pass per bit plane, most significant first
            g |= bits[:, j].astype(np.int64) << (k - 1 - j)
    idx = np.cumsum(g + 1) - 1
    if idx[-1] >= numel:
        raise _corrupt(f"index {int(idx[-1])} out of range for {numel} elements")
    return idx


def decode_cut(buf: bytes | bytearray | memoryview) -> torch.Tensor:
    """Decode any cut message into a fresh dense float32 CPU tensor of its shape.

    Raises :class:`ValueError` (``"corrupt cut message: ..."``) on a truncated or corrupt buffer:
    bad magic or fields, a length the header does not imply, indices out of range or not strictly
    increasing, non-finite values; and on a sparse message of more than :data:`MAX_DECODE_NUMEL`
    elements (a guard against a corrupt shape).
    """
    view = memoryview(buf).cast("B")
    kind, values, index, k, dims, nnz, hsize = _parse_header(view)
    numel = math.prod(dims)
    vbytes = _VALUE_BYTES[values]
    if kind == _DENSE:
        _expect_len(view, hsize + numel * vbytes)
        out = _dequantize(view[hsize:], numel, values)
        if not _all_finite(out):
            raise _corrupt("non-finite values")
        return torch.from_numpy(out.reshape(dims))
    if numel > MAX_DECODE_NUMEL:
        raise ValueError(
            f"cut message of shape {dims}: {numel} elements is more than MAX_DECODE_NUMEL ({MAX_DECODE_NUMEL});"
            " refusing to allocate it (corrupt shape?)"
        )
    vend = hsize + nnz * vbytes
    if index == "coo16":
        _expect_len(view, vend + _coo16_payload(dims, nnz))
    elif index == "bitmask":
        _expect_len(view, vend + _bitmask_payload(numel))
    elif len(view) < vend:
        raise _corrupt(f"truncated: {len(view)} bytes, the values alone end at {vend}")
    vals = _dequantize(view[hsize:vend], nnz, values)
    if not _all_finite(vals):
        raise _corrupt("non-finite values")
    raw = view[vend:]
    if index == "coo16":
        idx = _decode_coo16(raw, dims, nnz)
        if nnz > 1 and not (np.diff(idx) > 0).all():
            raise _corrupt("coo16 indices not strictly increasing")
    elif index == "bitmask":
        idx = _decode_bitmask(raw, numel, nnz)
    else:
        idx = _decode_gap(raw, numel, nnz, k)
    out = np.zeros(numel, dtype=np.float32)
    out[idx] = vals
    return torch.from_numpy(out.reshape(dims))


# ---------------------------------------------------------------------------------------------
# stateful codecs


def _top_k(mag: np.ndarray, k: int, part: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sorted positions of the ``k`` largest of ``mag`` (``0 < k < mag.size``; ties: lowest positions).

    ``part`` and ``mask`` are scratch arrays of ``mag``'s size (float32 and bool).
    """
    cut = mag.size - k
    np.copyto(part, mag)
    part.partition(cut)
    tau = part[cut]  # the k-th largest
    np.greater(mag, tau, out=mask)
    missing = k - int(np.count_nonzero(mask))
    if missing > 0:
        mask[np.flatnonzero(mag == tau)[:missing]] = True
    return np.flatnonzero(mask)


class DenseCut:
    """Stateless dense codec (``fp32`` | ``bf16`` | ``fp16``): :func:`encode_dense` with a fixed dtype."""

    def __init__(self, dtype: str = "fp32") -> None:
        _check_values_dtype(dtype)
        self.dtype = dtype

    def encode(self, x: torch.Tensor) -> bytes:
        """The dense cut message of ``x``."""
        return encode_dense(x, self.dtype)

    def nbytes(self, shape: Any) -> int:
        """Exact size of the message of a tensor of ``shape``."""
        return dense_nbytes(shape, self.dtype)

    def __repr__(self) -> str:
        return f"DenseCut({self.dtype!r})"


class TopPercentile:
    """Error-feedback top-percentile sparsifier (eq. 3-6 of the paper).

    Each :meth:`encode` accumulates ``G = residual + grad`` (eq. 3), sends the
    ``k = topk_count(G.numel(), p)`` entries of largest ``|G|`` as a sparse message (eq. 4-5) and
    keeps in the residual ``G`` minus what the receiver decodes (eq. 6). Exactly ``k`` entries
    are sent: this equals the paper's ``|G| >= quantile(|G|, p)`` when there are no ties at the
    threshold, and keeps message sizes deterministic (ties go to the lowest flat indices). The
    selection is NumPy's O(n) ``partition`` (after a sampled pre-filter on large tensors), which
    picks the same entries as ``torch.topk`` on ``|G|.flatten()`` would (up to ties) at a fraction
    of its CPU time, and yields the indices already sorted.

    - Position mode (``keys=None``, the paper's): one accumulator of the gradient's shape; a
      gradient of another shape raises :class:`ValueError`.
    - Keyed mode (``keys``: 1-D unique integers, one per row of ``grad``): per-sample error
      feedback. Residual rows are stored per key (any int64 key; storage grows on demand), so a
      sample's unsent gradient is replayed when that sample recurs (e.g. next epoch), instead of
      being added to whatever sample next sits at the same row. Rows must keep one shape.
      One instance uses one mode; switching raises :class:`ValueError`.
    - Warm start: while ``steps < warmup_steps``, or with ``dense=True``, ``G`` is sent densely in
      ``warmup_dtype`` and the residual becomes its rounding error (0 for ``fp32``).

    With ``keep_rounding_error=True`` (default) the residual at a sent entry is the rounding error
    of its value, and ``decode_cut(msg) + residual_after == residual_before + grad`` holds
    *exactly* in float32 (the sum on the right is the float32 sum that ``encode`` computes; a
    value and its ``bf16``/``fp16`` rounding are within a factor 2, so their difference is exact).
    Only saturation (|G| beyond the fp16/bf16 range) breaks exactness. With
    ``keep_rounding_error=False`` the residual at sent entries is exactly 0, as in eq. 6, and
    the identity holds up to the value dtype's rounding.

    The accumulators are float32 CPU arrays; gradients on another device are copied to the CPU.
    """

    def __init__(
        self,
        p: float,
        warmup_steps: int = 0,
        index: str = "auto",
        values: str = "bf16",
        warmup_dtype: str = "fp32",
        keep_rounding_error: bool = True,
    ) -> None:
        p = float(p)
        if not 0.0 < p < 1.0:
            raise ValueError(f"percentile p must be in (0, 1), got {p}")
        warmup_steps = operator.index(warmup_steps)
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        _check_index(index)
        _check_values_dtype(values)
        _check_values_dtype(warmup_dtype, "warmup dtype")
        self.p = p
        self.warmup_steps = warmup_steps
        self.index = index
        self.values = values
        self.warmup_dtype = warmup_dtype
        self.keep_rounding_error = bool(keep_rounding_error)
        self.reset()

    def reset(self) -> None:
        """Forget every residual and the step count (the warm start runs again)."""
        self.steps = 0
        self.last_nnz = 0
        self.last_dense = False
        #: The index encoding of the last sparse message (``None`` before one, or after a dense one).
        self.last_index: str | None = None
        self._mode: str | None = None  # "position" | "keyed"
        self._acc: np.ndarray | None = None
        self._row_shape: tuple[int, ...] | None = None
        self._keys = np.zeros(0, dtype=np.int64)  # known keys, sorted
        self._slots = np.zeros(0, dtype=np.int64)  # storage row of each key in self._keys
        self._rows = np.zeros((0,), dtype=np.float32)  # (capacity, *row_shape)
        # Scratch arrays survive a reset: they hold no state, and reallocating them costs page faults.
        self._buffers: dict[str, np.ndarray] = getattr(self, "_buffers", {})

    def _scratch(self, name: str, n: int, dtype: Any) -> np.ndarray:
        """A reusable flat scratch array of ``n`` elements (contents undefined)."""
        buf = self._buffers.get(name)
        if buf is None or buf.size != n or buf.dtype != dtype:
            buf = self._buffers[name] = np.empty(n, dtype=dtype)
        return buf

    # -- keyed storage ------------------------------------------------------------------------

    def _lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, found)`` of ``keys`` in the key table (slot -1 where not found)."""
        if self._keys.size == 0:
            return np.full(keys.size, -1, dtype=np.int64), np.zeros(keys.size, dtype=bool)
        # A key above every known key lands past the end: clamp, and the comparison fails.
        pos = np.minimum(np.searchsorted(self._keys, keys), self._keys.size - 1)
        found = self._keys[pos] == keys
        return np.where(found, self._slots[pos], -1), found

    def _add_keys(self, keys: np.ndarray, slots: np.ndarray, found: np.ndarray) -> np.ndarray:
        """Storage rows of ``keys`` (``slots``, ``found`` from :meth:`_lookup`), giving new keys
        zeroed rows (growing the storage)."""
        new = ~found
        if new.any():
            used = self._keys.size
            m = int(new.sum())
            cap = self._rows.shape[0]
            if used + m > cap:
                assert self._row_shape is not None
                grown = np.zeros((max(used + m, 2 * cap), *self._row_shape), dtype=np.float32)
                grown[:cap] = self._rows
                self._rows = grown
            fresh = np.arange(used, used + m, dtype=np.int64)
            self._rows[fresh] = 0.0
            slots[new] = fresh
            all_keys = np.concatenate([self._keys, keys[new]])
            all_slots = np.concatenate([self._slots, fresh])
            order = np.argsort(all_keys, kind="stable")
            self._keys, self._slots = all_keys[order], all_slots[order]
        return slots

    def _check_keys(self, keys: Any, rows: int | None) -> np.ndarray:
        k = _int64_vector(keys, "keys")
        if rows is not None and k.size != rows:
            raise ValueError(f"{k.size} keys for a gradient of {rows} rows")
        if np.unique(k).size != k.size:
            raise ValueError("keys must be unique")
        return k

    # -- API ------------------------------------------------------------------------------------

    def _check_mode(self, mode: str) -> None:
        if self._mode is not None and self._mode != mode:
            raise ValueError(
                f"this TopPercentile is in {self._mode} mode; call reset() before using {mode} mode"
            )

    def encode(self, grad: torch.Tensor, keys: torch.Tensor | None = None, dense: bool = False) -> bytes:
        """Accumulate ``grad`` and return the message to send (sparse, or dense in the warm start).

        Raises :class:`ValueError` on non-finite values, a changed shape, or bad ``keys``; the
        state is left untouched then.
        """
        g = _as_float32(grad)
        dims = _shape(g.shape)
        # G is built in a scratch buffer (reused across calls: fresh megabyte-sized arrays cost
        # more in page faults than the arithmetic) and becomes the state only once all went well.
        G = self._scratch("G", g.size, np.float32).reshape(g.shape)
        if keys is None:
            if self._acc is not None and self._acc.shape != g.shape:
                raise ValueError(
                    f"cut gradient shape changed from {tuple(self._acc.shape)} to {tuple(g.shape)}; call reset() first"
                )
            mode = "position"
            self._check_mode(mode)
            if self._acc is None:
                np.copyto(G, g)
            else:
                with np.errstate(over="ignore", invalid="ignore"):  # checked just below
                    np.add(self._acc, g, out=G)
            found = slots = None
        else:
            k = self._check_keys(keys, g.shape[0])
            if self._row_shape is not None and self._row_shape != g.shape[1:]:
                raise ValueError(
                    f"cut gradient row shape changed from {self._row_shape} to {tuple(g.shape[1:])}; call reset() first"
                )
            mode = "keyed"
            self._check_mode(mode)
            # New keys are only registered once the message is built (a failure leaves no trace).
            slots, found = self._lookup(k)
            if found.all():
                np.take(self._rows, slots, axis=0, out=G, mode="clip")  # slots are valid: no bounds checks
            else:
                G.fill(0.0)
                if found.any():
                    G[found] = self._rows[slots[found]]
            with np.errstate(over="ignore", invalid="ignore"):  # checked just below
                G += g
        # One pass over G covers g too (NaN and inf propagate); g is only scanned to name the fault.
        if not _all_finite(G):
            if not _all_finite(g):
                raise ValueError("cut gradient contains non-finite values")
            raise ValueError("cut gradient plus residual overflows float32")
        flat = G.reshape(-1)
        send_dense = dense or self.steps < self.warmup_steps
        if send_dense:
            payload, decoded = _quantize(flat, self.warmup_dtype)
            msg = _header(_DENSE, self.warmup_dtype, 0, 0, dims, 0) + _le_bytes(payload)
            if self.keep_rounding_error and self.warmup_dtype != "fp32":
                flat -= decoded
            else:
                flat[:] = 0.0
            self.last_nnz = flat.size
            self.last_index = None
        else:
            idx = self._select(flat)
            sent = flat[idx]
            payload, decoded = _quantize(sent, self.values)
            msg, self.last_index = _encode_sparse_raw(idx, payload, dims, self.index, self.values)
            flat[idx] = sent - decoded if self.keep_rounding_error else 0.0
            self.last_nnz = idx.size
        if keys is None:  # swap: the old accumulator becomes the next scratch buffer
            old = self._acc
            self._acc = G
            if old is None:
                del self._buffers["G"]
            else:
                self._buffers["G"] = old.reshape(-1)
        else:
            if self._row_shape is None:
                self._row_shape = tuple(g.shape[1:])
                self._rows = np.zeros((0, *self._row_shape), dtype=np.float32)
            slots = self._add_keys(k, slots, found)  # may grow (replace) self._rows
            self._rows[slots] = G
        self._mode = mode
        self.last_dense = send_dense
        self.steps += 1
        return msg

    def _select(self, flat: np.ndarray) -> np.ndarray:
        """Sorted flat indices of the ``topk_count`` entries of largest magnitude (ties: lowest index)."""
        n = flat.size
        k = topk_count(n, self.p)
        if k >= n:
            return np.arange(n, dtype=np.int64)
        mag = np.abs(flat, out=self._scratch("mag", n, np.float32))
        mask = self._scratch("mask", n, np.bool_)
        if n >= 1 << 16:
            # Pre-filter: a threshold from a strided sample keeps about 1.3 k candidates, and the
            # exact selection runs on those only. Whenever the top k are all candidates (at least
            # k of them) the result is the same as without it; otherwise fall through.
            sample = mag[::31]
            j = int(sample.size - 1.3 * k * sample.size / n)
            if j > 0:
                low = np.partition(sample, j)[j]
                cand = np.flatnonzero(np.greater_equal(mag, low, out=mask))
                if cand.size >= k:
                    cand_mag = mag[cand]
                    return cand[_top_k(cand_mag, k, np.empty_like(cand_mag), np.empty(cand.size, bool))]
        return _top_k(mag, k, self._scratch("part", n, np.float32), mask)

    def residual(self, keys: torch.Tensor | None = None) -> torch.Tensor:
        """A copy of the current accumulator.

        Position mode: the whole accumulator (``keys`` must be ``None``). Keyed mode: the rows of
        ``keys`` (zeros for unseen keys), or with ``keys=None`` every stored row in increasing key
        order. Before the first :meth:`encode` (or after :meth:`reset`): an empty tensor.
        """
        if self._mode is None:
            return torch.zeros(0)
        if self._mode == "position":
            if keys is not None:
                raise ValueError("this TopPercentile is in position mode; residual() takes no keys")
            assert self._acc is not None
            return torch.from_numpy(self._acc.copy())
        if keys is None:
            return torch.from_numpy(self._rows[self._slots].copy())
        k = self._check_keys(keys, None)
        slots, found = self._lookup(k)
        assert self._row_shape is not None
        out = np.zeros((k.size, *self._row_shape), dtype=np.float32)
        out[found] = self._rows[slots[found]]
        return torch.from_numpy(out)

    def __repr__(self) -> str:
        return (
            f"TopPercentile(p={self.p}, warmup_steps={self.warmup_steps}, index={self.index!r}, "
            f"values={self.values!r}, warmup_dtype={self.warmup_dtype!r}, "
            f"keep_rounding_error={self.keep_rounding_error})"
        )
