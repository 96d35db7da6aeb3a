"""The cut message format: the gradients (and activations) that cross the cut of a split model.

One tensor becomes one self-describing binary message and back: :func:`encode_dense` (every entry, as ``fp32``,
``bf16`` or ``fp16``), :func:`encode_sparse` (selected entries as sorted flat indices, ``coo16``, ``bitmask`` or
Golomb-Rice ``gap``, plus their values), :func:`decode_cut` (any message to a dense float32 tensor) and
:func:`cut_info` (its header). :func:`dense_nbytes`, :func:`sparse_nbytes`, :func:`expected_gap_nbytes` and
:func:`topk_count` give exact message sizes without building the messages.

*Which* entries to send is decided by the stateful codecs of :mod:`frugalrl.wire.sparsify`. A sparsifier must know
what the receiver will decode (its residual keeps the rest), so the steps of an encoder are building blocks here:
the input checks (:func:`check_shape`, :func:`check_value_dtype`, :func:`check_index_encoding`,
:func:`as_float32`, :func:`int64_vector`, :func:`all_finite`), :func:`quantize` and :func:`dense_message` /
:func:`sparse_message`. The ``gap`` code lives in :mod:`frugalrl.wire.rice`.

Nothing is pickled; a message from an untrusted peer can at worst fail with :class:`ValueError`. The byte layout,
field by field: docs/pipeline.md#the-cut-message-format.
"""

from __future__ import annotations

import math
import operator
import struct
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from frugalrl.wire import rice
from frugalrl.wire.floats import bf16_bits_to_fp32, fp32_to_bf16_bits
from frugalrl.wire.rice import MAX_RICE_K

INDEX_ENCODINGS = ("coo16", "bitmask", "gap")
VALUE_DTYPES = ("bf16", "fp16", "fp32")

MAGIC = 0xC7
VERSION = 1
#: A sparse message may describe a tensor of at most this many elements (a decoder guard
#: against a corrupt shape making it allocate an absurd tensor).
MAX_DECODE_NUMEL = 2**31
MAX_NDIM = 8

_FIXED = struct.Struct("<BBBBBBBBI")
_DENSE, _SPARSE = 0, 1
_INDEX_CODE = {"coo16": 1, "bitmask": 2, "gap": 3}
_INDEX_NAME = {v: k for k, v in _INDEX_CODE.items()}
_VALUE_CODE = {name: i for i, name in enumerate(VALUE_DTYPES)}
_VALUE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_FP16_MAX = 65504.0
_BF16_INF = np.uint16(0x7F80)
_BF16_MAX_BITS = np.uint16(0x7F7F)


# ---------------------------------------------------------------------------------------------
# input checks and value rounding


def check_value_dtype(name: str, what: str = "value dtype") -> None:
    """Raise :class:`ValueError` (naming ``what``) unless ``name`` is one of :data:`VALUE_DTYPES`."""
    if name not in VALUE_DTYPES:
        raise ValueError(f"unknown {what} {name!r}; expected one of {VALUE_DTYPES}")


def check_index_encoding(name: str) -> None:
    """Raise :class:`ValueError` unless ``name`` is one of :data:`INDEX_ENCODINGS` or ``"auto"``."""
    if name != "auto" and name not in INDEX_ENCODINGS:
        raise ValueError(f"unknown index encoding {name!r}; expected one of {(*INDEX_ENCODINGS, 'auto')}")


def check_shape(shape: Any) -> tuple[int, ...]:
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


def as_float32(x: Any) -> np.ndarray:
    """A C-contiguous float32 NumPy array holding ``x`` (a tensor on any device, or an array)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if x.dtype != torch.float32:
            x = x.float()
        x = x.numpy()
    return np.asarray(x, dtype=np.float32, order="C")  # (ascontiguousarray would make 0-d 1-d)


def all_finite(x: np.ndarray) -> bool:
    """True if every value of float array ``x`` is finite (one pass, no temporary array).

    A finite sum proves it (NaN and inf propagate); only if the sum is not finite (which may be
    an overflow of finite values) is every element tested.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(x, axis=None)
    return bool(np.isfinite(total)) or bool(np.isfinite(x).all())


def _check_finite(x: np.ndarray, what: str) -> None:
    if not all_finite(x):
        raise ValueError(f"{what} contains non-finite values")


def quantize(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
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
    dims = check_shape(shape)
    check_value_dtype(dtype)
    return header_nbytes(len(dims)) + math.prod(dims) * _VALUE_BYTES[dtype]


def _coo16_payload(dims: tuple[int, ...], nnz: int) -> int:
    return 2 * nnz * sum(_digits(d) for d in dims)


def _bitmask_payload(numel: int) -> int:
    return (numel + 7) // 8


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
        # Skip the Rice plan when a bound from the sum of the gaps shows gap cannot win.
        if rice.payload_lower_bound(nnz, sum_g) >= best[3]:
            return best
    g = rice.gaps(idx)
    k, sum_q = rice.plan(g)
    gap = rice.payload_nbytes(nnz, k, sum_q)
    if index == "auto" and gap >= best[3]:
        return best
    return "gap", k, sum_q, gap, g


def int64_vector(x: Any, what: str) -> np.ndarray:
    """``x`` (a tensor on any device, or array-like) as a 1-D int64 array; empty may be any dtype."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{what} must be a 1-D integer array, got dtype {a.dtype} and shape {a.shape}")
    return a.astype(np.int64, copy=False)


def _check_flat_idx(flat_idx: Any, numel: int) -> np.ndarray:
    """``flat_idx`` as a 1-D int64 array, checked sorted, unique and within ``[0, numel)``."""
    idx = int64_vector(flat_idx, "flat_idx")
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
    dims = check_shape(shape)
    check_index_encoding(index)
    check_value_dtype(values)
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
    ``k`` is taken (:func:`frugalrl.wire.rice.expected_streams_nbytes`). Meant for estimators that
    must not build the indices.
    """
    dims = check_shape(shape)
    check_value_dtype(values)
    nnz = operator.index(nnz)
    numel = math.prod(dims)
    if not 0 <= nnz <= numel:
        raise ValueError(f"nnz {nnz} out of range for shape {dims}")
    base = header_nbytes(len(dims)) + nnz * _VALUE_BYTES[values] + 4
    if nnz == 0:
        return float(base)
    return base + rice.expected_streams_nbytes(numel, nnz)


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
    """The fixed header (little-endian; docs/pipeline.md#the-cut-message-format)::

        u8 magic (0xC7) | u8 version (1) | u8 kind (0 dense, 1 sparse)
        u8 value dtype (0 bf16, 1 fp16, 2 fp32) | u8 index encoding (0 none, 1 coo16, 2 bitmask, 3 gap)
        u8 rice k (gap only, else 0) | u8 ndim (1..8) | u8 flags (0) | u32 nnz (sparse; 0 when dense)
        ndim x u32 dims
    """
    return _FIXED.pack(
        MAGIC, VERSION, kind, _VALUE_CODE[values], index_code, k, len(dims), 0, nnz
    ) + struct.pack(f"<{len(dims)}I", *dims)


def dense_message(payload: np.ndarray, dims: tuple[int, ...], dtype: str) -> bytes:
    """The dense message of ``payload``, the row-major wire values (from :func:`quantize` with
    ``dtype``) of a tensor of checked shape ``dims``."""
    return _header(_DENSE, dtype, 0, 0, dims, 0) + _le_bytes(payload)


def encode_dense(x: torch.Tensor | np.ndarray, dtype: str = "fp32") -> bytes:
    """A dense cut message of ``x`` (any device, any float dtype) with values in ``dtype``.

    Raises :class:`ValueError` on NaN or infinite values, or on a 0-d or > 8-d tensor.
    """
    check_value_dtype(dtype)
    arr = as_float32(x)
    dims = check_shape(arr.shape)
    _check_finite(arr, "cut tensor")
    payload, _ = quantize(arr.reshape(-1), dtype)
    return dense_message(payload, dims, dtype)


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


def sparse_message(
    idx: np.ndarray, payload: np.ndarray, dims: tuple[int, ...], index: str, values: str
) -> tuple[bytes, str]:
    """``(message, index encoding used)``: the sparse message of wire values ``payload`` (from
    :func:`quantize` with ``values``) at checked sorted unique flat indices ``idx`` of shape ``dims``;
    ``index="auto"`` resolves to the smallest encoding."""
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
        body = rice.encode(g, k, sum_q)
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
    dims = check_shape(shape)
    check_index_encoding(index)
    check_value_dtype(values_dtype)
    numel = math.prod(dims)
    idx = _check_flat_idx(flat_idx, numel)
    vals = as_float32(values).reshape(-1)
    if vals.size != idx.size:
        raise ValueError(f"{idx.size} indices but {vals.size} values")
    _check_finite(vals, "cut values")
    payload, _ = quantize(vals, values_dtype)
    return sparse_message(idx, payload, dims, index, values_dtype)[0]


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
        if not all_finite(out):
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
    if not all_finite(vals):
        raise _corrupt("non-finite values")
    raw = view[vend:]
    if index == "coo16":
        idx = _decode_coo16(raw, dims, nnz)
        if nnz > 1 and not (np.diff(idx) > 0).all():
            raise _corrupt("coo16 indices not strictly increasing")
    elif index == "bitmask":
        idx = _decode_bitmask(raw, numel, nnz)
    else:
        try:
            idx = rice.decode(raw, numel, nnz, k)
        except ValueError as e:
            raise _corrupt(str(e)) from None
    out = np.zeros(numel, dtype=np.float32)
    out[idx] = vals
    return torch.from_numpy(out.reshape(dims))
