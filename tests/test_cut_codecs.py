"""Tests of the cut message format (frugalrl.wire.cut): round trips, exact sizes, corrupt input.

The sparsifier that fills these messages (frugalrl.wire.sparsify) is tested in test_cut_codecs_sparsify.py.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from frugalrl.wire import cut
from frugalrl.wire.cut import (
    INDEX_ENCODINGS,
    MAX_DECODE_NUMEL,
    VALUE_DTYPES,
    cut_info,
    decode_cut,
    dense_nbytes,
    encode_dense,
    encode_sparse,
    expected_gap_nbytes,
    header_nbytes,
    sparse_nbytes,
    topk_count,
)
from frugalrl.wire.sparsify import DenseCut

pytestmark = pytest.mark.timeout(120)

VBYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ALL_INDEX = (*INDEX_ENCODINGS, "auto")


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """What a receiver should read back for float32 ``values`` sent as ``dtype`` (independent reference)."""
    v = np.asarray(values, dtype=np.float32)
    if dtype == "fp32":
        return v
    if dtype == "fp16":
        return np.clip(v, -65504, 65504).astype(np.float16).astype(np.float32)
    return torch.from_numpy(v.copy()).to(torch.bfloat16).float().numpy()


def _coo16_formula(shape: tuple[int, ...], nnz: int, values: str) -> int:
    digits = sum(1 if d <= 65536 else 2 for d in shape)
    return header_nbytes(len(shape)) + nnz * (VBYTES[values] + 2 * digits)


def _bitmask_formula(shape: tuple[int, ...], nnz: int, values: str) -> int:
    return header_nbytes(len(shape)) + nnz * VBYTES[values] + math.ceil(math.prod(shape) / 8)


def _random_sparse(shape: tuple[int, ...], density: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    numel = math.prod(shape)
    nnz = round(density * numel)
    idx = np.sort(rng.choice(numel, size=nnz, replace=False)).astype(np.int64)
    vals = (rng.standard_normal(nnz) * 10.0 ** rng.integers(-3, 3, nnz)).astype(np.float32)
    return idx, vals


def _expected_dense(shape: tuple[int, ...], idx: np.ndarray, vals: np.ndarray, dtype: str) -> np.ndarray:
    out = np.zeros(math.prod(shape), dtype=np.float32)
    out[idx] = _rounded(vals, dtype)
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------------
# sizes and counts


def test_header_and_dense_sizes():
    assert [header_nbytes(n) for n in range(1, 9)] == [12 + 4 * n for n in range(1, 9)]
    assert dense_nbytes((128, 4096), "fp32") == 20 + 4 * 128 * 4096
    assert dense_nbytes((128, 4096), "bf16") == 20 + 2 * 128 * 4096
    assert DenseCut("fp16").nbytes((3, 5, 7)) == 24 + 2 * 105
    for bad in (0, 9):
        with pytest.raises(ValueError):
            header_nbytes(bad)
    for bad_shape in ((), tuple([1] * 9), (2**32,), (-1, 3), ("a",)):
        with pytest.raises(ValueError):
            dense_nbytes(bad_shape, "fp32")


def test_topk_count():
    assert topk_count(10, 0.9) == 1
    assert topk_count(10, 0.7) == 3  # 0.7 is read as 7/10, not the binary float just below it
    assert topk_count(100, 0.29) == 71
    assert topk_count(128 * 4096, 0.9) == 52429
    assert topk_count(128 * 4096, 0.99) == 5243
    assert topk_count(5, 0.999) == 1  # at least one entry
    assert topk_count(1, 0.5) == 1
    assert topk_count(0, 0.5) == 0
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            topk_count(10, bad)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**7), st.integers(0, 1000))
def test_topk_count_is_exact_for_decimal_percentiles(numel, permille):
    p = permille / 1000
    expected = numel - (numel * permille) // 1000
    assert topk_count(numel, p) == (max(1, expected) if numel else 0)


def test_sparse_nbytes_needs_positions_for_gap_and_auto():
    for index in ("gap", "auto"):
        with pytest.raises(ValueError, match="flat_idx"):
            sparse_nbytes((4, 4), 3, index)
    with pytest.raises(ValueError, match="nnz"):
        sparse_nbytes((4, 4), 3, "gap", flat_idx=np.array([0, 1]))
    with pytest.raises(ValueError):
        sparse_nbytes((4, 4), 17, "coo16")
    with pytest.raises(ValueError, match="index encoding"):
        sparse_nbytes((4, 4), 3, "csr")
    with pytest.raises(ValueError, match="value dtype"):
        sparse_nbytes((4, 4), 3, "coo16", "int8")


# ---------------------------------------------------------------------------------------------
# dense round trips

_dense_arrays = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=7),
    elements=st.floats(-1e5, 1e5, width=32),
)


@settings(max_examples=60, deadline=None)
@given(_dense_arrays, st.sampled_from(VALUE_DTYPES), st.booleans())
def test_dense_round_trip(x, dtype, as_tensor):
    msg = encode_dense(torch.from_numpy(x) if as_tensor else x, dtype)
    assert len(msg) == dense_nbytes(x.shape, dtype) == DenseCut(dtype).nbytes(x.shape)
    assert msg == DenseCut(dtype).encode(torch.from_numpy(x))
    out = decode_cut(msg)
    assert out.dtype == torch.float32 and tuple(out.shape) == x.shape
    assert np.array_equal(out.numpy(), _rounded(x, dtype))  # fp32 exact; bf16/fp16 correctly rounded
    if dtype != "fp32":
        rel = 2.0**-8 if dtype == "bf16" else 2.0**-11
        big = np.abs(x) <= 65504
        assert np.allclose(out.numpy()[big], x[big], rtol=rel, atol=6e-8)
    info = cut_info(msg)
    assert info == {
        "kind": "dense",
        "shape": x.shape,
        "nnz": x.size,
        "index": None,
        "values": dtype,
        "rice_k": None,
        "nbytes": len(msg),
    }


def test_dense_saturates_and_refuses_non_finite():
    x = np.array([1e5, -1e5, 3.4e38, -3.4e38, 1.0], dtype=np.float32)
    assert decode_cut(encode_dense(x, "fp16")).tolist()[:2] == [65504.0, -65504.0]
    bf = decode_cut(encode_dense(x, "bf16")).numpy()
    assert np.isfinite(bf).all() and bf[2] > 3.38e38 and bf[3] < -3.38e38
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="non-finite"):
            encode_dense(np.array([1.0, bad], dtype=np.float32))
    with pytest.raises(ValueError):
        encode_dense(np.float32(1.0))  # 0-d
    with pytest.raises(ValueError, match="value dtype"):
        DenseCut("int8")


def test_dense_accepts_other_dtypes_and_grad_tensors():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    out = decode_cut(encode_dense(x * 2))
    assert torch.equal(out, (x * 2).detach().float())
    out[0, 0] = 5.0  # the decoded tensor is writable and owns its memory
    assert decode_cut(bytearray(encode_dense(x.detach()))).shape == (3, 4)
    assert decode_cut(memoryview(encode_dense(x.detach()))).shape == (3, 4)


# ---------------------------------------------------------------------------------------------
# sparse round trips and sizes

_small_dim = st.integers(1, 9)
_any_dim = st.one_of(_small_dim, _small_dim, st.integers(65530, 140000))
_shapes = st.lists(_small_dim, min_size=1, max_size=4).map(tuple) | st.tuples(_any_dim, st.integers(1, 3))
_densities = st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.3, 0.7, 1.0]) | st.floats(0, 1)


def _check_sparse_case(shape, idx, vals):
    sizes = {}
    for values in VALUE_DTYPES:
        expected = _expected_dense(shape, idx, vals, values)
        for index in ALL_INDEX:
            msg = encode_sparse(idx, vals, shape, index, values)
            assert len(msg) == sparse_nbytes(shape, idx.size, index, values, flat_idx=idx), (index, values)
            out = decode_cut(msg)
            assert tuple(out.shape) == shape and out.dtype == torch.float32
            assert np.array_equal(out.numpy(), expected), (index, values)
            info = cut_info(msg)
            assert info["kind"] == "sparse" and info["shape"] == shape and info["nnz"] == idx.size
            assert info["values"] == values and info["nbytes"] == len(msg)
            assert info["index"] == index or (index == "auto" and info["index"] in INDEX_ENCODINGS)
            assert (info["rice_k"] is not None) == (info["index"] == "gap")
            sizes[index] = len(msg)
        assert (
            sizes["coo16"]
            == sparse_nbytes(shape, idx.size, "coo16", values)
            == _coo16_formula(shape, idx.size, values)
        )
        assert (
            sizes["bitmask"]
            == sparse_nbytes(shape, idx.size, "bitmask", values)
            == _bitmask_formula(shape, idx.size, values)
        )
        assert sizes["auto"] == min(sizes[i] for i in INDEX_ENCODINGS)


@settings(max_examples=40, deadline=None)
@given(_shapes, _densities, st.integers(0, 2**32 - 1))
def test_sparse_round_trip(shape, density, seed):
    numel = math.prod(shape)
    if numel > 20000:  # keep big-dimension cases sparse so the test stays fast
        density = min(density, 0.01)
    idx, vals = _random_sparse(shape, density, seed)
    _check_sparse_case(shape, idx, vals)


@pytest.mark.parametrize(
    "shape",
    [(70000,), (3, 65537), (65536, 2), (65537, 2), (2, 3, 70001), (1, 1, 1, 1, 1, 1, 1, 5)],
)
def test_sparse_round_trip_big_dims(shape):
    rng = np.random.default_rng(sum(shape))
    numel = math.prod(shape)
    idx = np.unique(np.concatenate([[0, numel - 1], rng.integers(0, numel, 300)])).astype(np.int64)
    vals = rng.standard_normal(idx.size).astype(np.float32)
    _check_sparse_case(shape, idx, vals)


def test_coo16_splits_dims_above_65536():
    idx = np.array([0, 5, 2**32 - 2], dtype=np.int64)
    vals = np.ones(3, dtype=np.float32)
    msg = encode_sparse(idx, vals, (2**32 - 1,), "coo16", "fp32")
    assert len(msg) == header_nbytes(1) + 3 * (4 + 2 * 2)  # two 16-bit digits per coordinate
    assert cut_info(msg)["shape"] == (2**32 - 1,)
    with pytest.raises(ValueError, match="MAX_DECODE_NUMEL"):
        decode_cut(msg)  # a 16 GiB dense tensor: refused, not allocated
    assert MAX_DECODE_NUMEL < 2**32 - 1
    assert sparse_nbytes((65536, 65537), 10, "coo16", "bf16") == header_nbytes(2) + 10 * (2 + 2 * 3)


def test_empty_and_full_sparse_messages():
    for shape in [(5,), (3, 4), (0, 7)]:
        numel = math.prod(shape)
        _check_sparse_case(shape, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        full = np.arange(numel, dtype=np.int64)
        _check_sparse_case(shape, full, np.linspace(-1, 1, numel, dtype=np.float32))


def test_auto_picks_each_encoding_where_it_is_smallest():
    shape = (64, 512)
    picks = {}
    for density in (0.0005, 0.01, 0.1, 0.5, 0.9):
        idx, vals = _random_sparse(shape, density, 7)
        msg = encode_sparse(idx, vals, shape)  # index="auto"
        sizes = {i: len(encode_sparse(idx, vals, shape, i)) for i in INDEX_ENCODINGS}
        assert len(msg) == min(sizes.values())
        picks[density] = cut_info(msg)["index"]
    assert picks[0.01] == "gap" and picks[0.9] == "bitmask"
    # a single nonzero of a short vector: two bytes of coo16 beat the gap encoding's length field
    one = encode_sparse(np.array([5]), np.array([1.0]), (1000,))
    assert cut_info(one)["index"] == "coo16"


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 2**40), min_size=0, max_size=60, unique=True)
    | st.lists(st.integers(0, 300), min_size=0, max_size=200, unique=True)
)
def test_gap_rice_parameter_is_the_exact_optimum(positions):
    idx = np.array(sorted(positions), dtype=np.int64)
    shape = (2**20, 2**21)  # 2**41 elements, never decoded
    n = idx.size
    gaps = np.diff(idx, prepend=-1) - 1
    payloads = [4 + -(-n * k // 8) + -(-(int((gaps >> k).sum()) + n) // 8) for k in range(63)]
    msg = encode_sparse(idx, np.ones(n), shape, "gap", "fp32")
    assert len(msg) == header_nbytes(2) + 4 * n + min(payloads)
    assert cut_info(msg)["rice_k"] == int(np.argmin(payloads))  # the smallest best k


@pytest.mark.parametrize("density", [0.1, 0.01])
def test_gap_beats_coo16_on_random_positions(density):
    shape = (128, 4096)
    idx, vals = _random_sparse(shape, density, 3)
    gap = len(encode_sparse(idx, vals, shape, "gap"))
    coo = len(encode_sparse(idx, vals, shape, "coo16"))
    assert gap < coo
    # index bits per nonzero: coo16 spends 32, Rice coding about log2(1/density) + 2
    index_bits = 8 * (gap - header_nbytes(2) - 2 * idx.size) / idx.size
    assert index_bits < math.log2(1 / density) + 2.5


@pytest.mark.parametrize("density", [0.001, 0.01, 0.1, 0.3])
@pytest.mark.parametrize("values", VALUE_DTYPES)
def test_expected_gap_nbytes_matches_random_positions(density, values):
    shape = (128, 4096)
    idx, _ = _random_sparse(shape, density, 11)
    measured = sparse_nbytes(shape, idx.size, "gap", values, flat_idx=idx)
    expected = expected_gap_nbytes(shape, idx.size, values)
    assert abs(expected - measured) / measured < 0.05
    # and for the index part alone
    vbytes = header_nbytes(2) + VBYTES[values] * idx.size
    assert abs((expected - vbytes) - (measured - vbytes)) / (measured - vbytes) < 0.05


def test_expected_gap_nbytes_edges():
    assert expected_gap_nbytes((10, 10), 0) == header_nbytes(2) + 4
    full = sparse_nbytes((10, 10), 100, "gap", flat_idx=np.arange(100))
    assert abs(expected_gap_nbytes((10, 10), 100) - full) < 1


def test_encode_sparse_rejects_bad_input():
    shape = (4, 4)
    with pytest.raises(ValueError, match="sorted"):
        encode_sparse(np.array([3, 1]), np.ones(2), shape)
    with pytest.raises(ValueError, match="sorted"):
        encode_sparse(np.array([1, 1]), np.ones(2), shape)
    with pytest.raises(ValueError, match="range"):
        encode_sparse(np.array([1, 16]), np.ones(2), shape)
    with pytest.raises(ValueError, match="range"):
        encode_sparse(np.array([-1, 3]), np.ones(2), shape)
    with pytest.raises(ValueError, match="values"):
        encode_sparse(np.array([1, 3]), np.ones(3), shape)
    with pytest.raises(ValueError, match="non-finite"):
        encode_sparse(np.array([1, 3]), np.array([1.0, np.nan]), shape)
    with pytest.raises(ValueError, match="integer"):
        encode_sparse(np.array([1.0, 3.0]), np.ones(2), shape)
    with pytest.raises(ValueError, match="index encoding"):
        encode_sparse(np.array([1]), np.ones(1), shape, "csr")
    with pytest.raises(ValueError, match="value dtype"):
        encode_sparse(np.array([1]), np.ones(1), shape, "gap", "fp64")
    # torch inputs are fine
    msg = encode_sparse(torch.tensor([1, 3]), torch.tensor([2.0, -1.0]), shape, "gap", "fp32")
    assert decode_cut(msg).reshape(-1)[[1, 3]].tolist() == [2.0, -1.0]


# ---------------------------------------------------------------------------------------------
# corrupt and truncated messages


def _sample_messages() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    shape = (6, 70)
    idx = np.sort(rng.choice(420, 40, replace=False)).astype(np.int64)
    vals = rng.standard_normal(40).astype(np.float32)
    msgs = {i: encode_sparse(idx, vals, shape, i, "fp16") for i in INDEX_ENCODINGS}
    msgs["dense"] = encode_dense(rng.standard_normal(shape).astype(np.float32), "bf16")
    msgs["big-coo16"] = encode_sparse(np.array([3, 70000]), np.ones(2), (2, 65537), "coo16")
    return msgs


@pytest.mark.parametrize("kind", ["coo16", "bitmask", "gap", "dense", "big-coo16"])
def test_truncated_or_extended_messages_raise_value_error(kind):
    msg = _sample_messages()[kind]
    for n in range(len(msg)):
        with pytest.raises(ValueError, match="cut message"):
            decode_cut(msg[:n])
    with pytest.raises(ValueError, match="cut message"):
        decode_cut(msg + b"\0")


def test_bad_header_fields_raise_value_error():
    msg = bytearray(_sample_messages()["gap"])
    for offset, value, _field in [
        (0, 0x00, "magic"),
        (1, 2, "version"),
        (2, 5, "kind"),
        (3, 7, "value dtype"),
        (4, 9, "index encoding"),
        (5, 63, "rice"),
        (6, 0, "ndim"),
        (6, 9, "ndim"),
        (7, 1, "flags"),
    ]:
        bad = bytearray(msg)
        bad[offset] = value
        with pytest.raises(ValueError, match="corrupt cut message"):
            decode_cut(bad)
        with pytest.raises(ValueError, match="corrupt cut message"):
            cut_info(bad)
    with pytest.raises(ValueError, match="corrupt cut message"):
        decode_cut(b"")


def _set_dims(msg: bytes, dims: tuple[int, ...]) -> bytes:
    b = bytearray(msg)
    struct.pack_into(f"<{len(dims)}I", b, 12, *dims)
    return bytes(b)


def test_indices_out_of_range_raise_value_error():
    vals = np.ones(2, dtype=np.float32)
    gap = encode_sparse(np.array([3, 99]), vals, (100,), "gap")
    with pytest.raises(ValueError, match="out of range"):
        decode_cut(_set_dims(gap, (60,)))
    coo = encode_sparse(np.array([3, 14]), vals, (3, 5), "coo16")
    with pytest.raises(ValueError, match="out of range"):
        decode_cut(_set_dims(coo, (3, 4)))
    # a two-digit coordinate whose high digit points past the dimension
    big = bytearray(encode_sparse(np.array([3, 70000]), vals, (2, 65537), "coo16", "bf16"))
    high = header_nbytes(2) + 2 * 2 + 2 * 2  # after the values and the first dimension's stream
    struct.pack_into("<H", big, high, 5)
    with pytest.raises(ValueError, match="out of range"):
        decode_cut(big)
    # a padding bit of the bitmask set: an index past the end
    bm = bytearray(encode_sparse(np.array([1, 3]), vals, (5,), "bitmask", "fp32"))
    bm[-1] |= 0x01
    with pytest.raises(ValueError, match="out of range"):
        decode_cut(bm)
    # coo16 indices out of order
    coo_bytes = bytearray(coo)
    body = header_nbytes(2) + 2 * 2
    coo_bytes[body : body + 4] = coo_bytes[body + 2 : body + 4] + coo_bytes[body : body + 2]
    with pytest.raises(ValueError, match="increasing"):
        decode_cut(coo_bytes)


def test_non_finite_values_in_message_raise_value_error():
    msg = bytearray(encode_sparse(np.array([1, 3]), np.ones(2), (5,), "coo16", "fp32"))
    struct.pack_into("<f", msg, header_nbytes(1), float("nan"))
    with pytest.raises(ValueError, match="non-finite"):
        decode_cut(msg)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["coo16", "bitmask", "gap", "dense", "big-coo16"]), st.data())
def test_random_corruption_never_escapes_as_another_error(kind, data):
    msg = bytearray(_sample_messages()[kind])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(msg) - 1))
        msg[pos] ^= data.draw(st.integers(1, 255))
    # A flipped dimension of a sparse message can describe a valid, huge tensor: cap its size.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cut, "MAX_DECODE_NUMEL", 10**6)
        try:
            out = decode_cut(msg)
        except ValueError:
            return
    assert out.dtype == torch.float32


@pytest.mark.parametrize("density", [0.0, 0.001, 0.02, 0.1, 0.3, 0.5, 0.8, 1.0])
def test_auto_is_the_smallest_exact_size_at_any_density(density):
    # "auto" skips the Rice plan when a closed-form bound shows gap cannot win: same choice, same size.
    shape = (37, 211)
    rng = np.random.default_rng(int(density * 1000))
    idx = np.flatnonzero(rng.random(math.prod(shape)) < density)
    sizes = {i: sparse_nbytes(shape, idx.size, i, flat_idx=idx) for i in INDEX_ENCODINGS}
    msg = encode_sparse(idx, np.ones(idx.size, np.float32), shape)
    assert len(msg) == sparse_nbytes(shape, idx.size, "auto", flat_idx=idx) == min(sizes.values())
    assert cut_info(msg)["index"] == min(INDEX_ENCODINGS, key=sizes.__getitem__)
