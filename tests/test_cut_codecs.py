"""Tests of the cut codecs (frugalrl.wire.cut): formats, exact sizes, the top-percentile sparsifier."""

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
    DenseCut,
    TopPercentile,
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


# ---------------------------------------------------------------------------------------------
# TopPercentile


def _grads(shape, steps, seed):
    rng = np.random.default_rng(seed)
    for t in range(steps):
        scale = 10.0 ** rng.integers(-4, 3)
        yield torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32)), t


@pytest.mark.parametrize("values", VALUE_DTYPES)
@pytest.mark.parametrize("index", ALL_INDEX)
def test_error_feedback_invariant_is_exact_in_position_mode(values, index):
    shape = (16, 48)
    tp = TopPercentile(0.9, warmup_steps=2, index=index, values=values, warmup_dtype="bf16")
    k = topk_count(16 * 48, 0.9)
    for grad, t in _grads(shape, 8, seed=1):
        before = tp.residual()
        if before.numel() == 0:
            before = torch.zeros(shape)
        msg = tp.encode(grad)
        after = tp.residual()
        assert torch.equal(decode_cut(msg) + after, before + grad), t
        info = cut_info(msg)
        assert (
            tp.steps == t + 1
            and tp.last_dense == (t < 2)
            and info["kind"] == ("dense" if t < 2 else "sparse")
        )
        if t >= 2:
            assert info["nnz"] == tp.last_nnz == k
            assert info["values"] == values and tp.last_index == info["index"]
            assert index == "auto" or info["index"] == index
            # at a sent entry only the rounding error of the value stays behind
            sent = decode_cut(msg) != 0
            total = (before + grad)[sent]
            assert torch.all(after[sent].abs() <= total.abs() * (2.0**-8 if values != "fp32" else 0.0))
        else:
            assert info["values"] == "bf16" and tp.last_nnz == 16 * 48


def test_paper_mode_zeroes_sent_entries():
    shape = (32, 32)
    tp = TopPercentile(0.95, keep_rounding_error=False, values="bf16", warmup_steps=1, warmup_dtype="fp16")
    for grad, t in _grads(shape, 5, seed=2):
        before = tp.residual() if t else torch.zeros(shape)
        msg = tp.encode(grad)
        dec, after = decode_cut(msg), tp.residual()
        if t == 0:
            assert (
                torch.count_nonzero(after) == 0
            )  # warm start: the residual is dropped, not the rounding error
        sent = dec != 0
        assert torch.count_nonzero(after[sent]) == 0
        torch.testing.assert_close(dec + after, before + grad, rtol=2.0**-8, atol=1e-7)


def test_warm_start_then_sparse_and_forced_dense():
    tp = TopPercentile(0.99, warmup_steps=3, warmup_dtype="fp32")
    kinds = []
    for grad, t in _grads((20, 50), 6, seed=3):
        msg = tp.encode(grad, dense=(t == 5))
        kinds.append(cut_info(msg)["kind"])
        if kinds[-1] == "dense":
            assert len(msg) == dense_nbytes((20, 50), "fp32")
            assert tp.last_dense and tp.last_nnz == 1000 and tp.last_index is None
            assert torch.count_nonzero(tp.residual()) == 0  # fp32 dense sends everything exactly
            assert torch.equal(decode_cut(msg), grad) or t > 0
        else:
            assert tp.last_nnz == cut_info(msg)["nnz"] == 10 and not tp.last_dense
    assert kinds == ["dense"] * 3 + ["sparse", "sparse", "dense"]
    assert tp.steps == 6


def test_largest_entries_are_sent():
    rng = np.random.default_rng(4)
    grad = torch.from_numpy(rng.standard_normal((30, 40)).astype(np.float32))
    tp = TopPercentile(0.9, values="fp32")
    dec = decode_cut(tp.encode(grad)).reshape(-1)
    k = topk_count(1200, 0.9)
    top = torch.argsort(grad.reshape(-1).abs(), descending=True)[:k]
    assert set(torch.nonzero(dec).reshape(-1).tolist()) == set(top.tolist())
    assert torch.equal(dec[top], grad.reshape(-1)[top])
    assert torch.equal(tp.residual().reshape(-1)[top], torch.zeros(k))


def _sent_positions(msg: bytes) -> np.ndarray:
    """The flat indices of a ``bitmask`` message, read straight from its trailing bitmask."""
    info = cut_info(msg)
    numel = math.prod(info["shape"])
    tail = np.frombuffer(msg[len(msg) - (numel + 7) // 8 :], dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(tail)[:numel])


def _patterns(shape):
    rng = np.random.default_rng(8)
    numel = math.prod(shape)
    pos = np.arange(numel)
    yield rng.standard_normal(numel)
    yield rng.standard_cauchy(numel)
    yield np.ones(numel)  # all tied
    yield np.round(rng.standard_normal(numel))  # many ties at the threshold
    few = np.zeros(numel)
    few[rng.choice(numel, 100, replace=False)] = 1.0 + rng.random(100)
    yield few  # fewer nonzeros than k: zeros fill up, lowest indices first
    yield np.where(pos % 31 == 0, 10.0, 1.0) * rng.random(numel)  # big where a strided sample looks
    yield np.where(pos % 31 == 0, 0.1, 1.0) * rng.random(numel)  # small where it looks


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_selection_matches_a_full_sort_on_large_tensors(p):
    shape = (128, 4096)
    k = topk_count(math.prod(shape), p)
    for grad in _patterns(shape):
        grad = grad.astype(np.float32)
        tp = TopPercentile(p, index="bitmask", values="fp32")
        msg = tp.encode(torch.from_numpy(grad.reshape(shape)))
        order = np.lexsort((np.arange(grad.size), -np.abs(grad)))  # by |g| descending, then index
        assert np.array_equal(_sent_positions(msg), np.sort(order[:k]))


def test_ties_at_the_threshold_send_exactly_k():
    grad = torch.ones(10, 10)
    tp = TopPercentile(0.95)
    msg = tp.encode(grad)
    assert cut_info(msg)["nnz"] == 5
    assert torch.nonzero(decode_cut(msg).reshape(-1)).reshape(-1).tolist() == [0, 1, 2, 3, 4]


def test_small_constant_gradient_is_eventually_sent():
    tp = TopPercentile(0.75, values="fp32")  # 4 entries, one sent per step
    grad = torch.tensor([1.0, 0.1, 0.0, 0.0])
    sent_at = None
    for step in range(1, 15):
        dec = decode_cut(tp.encode(grad))
        if dec[1] != 0:
            sent_at = step
            assert dec[1].item() == pytest.approx(0.1 * step, rel=1e-5)  # nothing was lost
            break
    assert sent_at is not None and 10 <= sent_at <= 11
    assert tp.residual()[1].item() == 0.0


def _keyed_batches(n_samples, batch, epochs, row_shape, seed):
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        perm = rng.permutation(n_samples)
        for i in range(0, n_samples, batch):
            keys = torch.from_numpy(perm[i : i + batch].astype(np.int64) * 1000 + 7)  # sparse, large keys
            grad = torch.from_numpy(rng.standard_normal((keys.numel(), *row_shape)).astype(np.float32))
            yield keys, grad


@pytest.mark.parametrize("values", ["bf16", "fp32"])
def test_error_feedback_invariant_is_exact_in_keyed_mode(values):
    tp = TopPercentile(0.9, warmup_steps=1, values=values, warmup_dtype="fp16")
    replayed = 0
    for keys, grad in _keyed_batches(12, 5, 3, (8, 6), seed=5):
        before = tp.residual(keys)
        if tp.steps == 0:
            assert before.numel() == 0  # nothing encoded yet: the row shape is unknown
            before = torch.zeros_like(grad)
        assert tuple(before.shape) == (keys.numel(), 8, 6)
        replayed += int(before.abs().sum() > 0)
        msg = tp.encode(grad, keys=keys)
        after = tp.residual(keys)
        assert torch.equal(decode_cut(msg) + after, before + grad)
        assert cut_info(msg)["nnz"] == (grad.numel() if tp.steps == 1 else topk_count(grad.numel(), 0.9))
    assert replayed > 0  # residuals of earlier epochs came back with their samples
    everything = tp.residual()
    assert tuple(everything.shape) == (12, 8, 6)
    assert tp.residual(torch.tensor([123456789])).abs().sum() == 0  # an unseen key has no residual


def test_keyed_residual_follows_the_sample_not_the_row():
    tp = TopPercentile(0.5, values="fp32")
    grad = torch.tensor([[10.0, 0.25], [9.0, 0.5]])
    tp.encode(grad, keys=torch.tensor([4, 9]))  # sends the 10 and the 9
    assert tp.residual(torch.tensor([9, 4])).tolist() == [[0.0, 0.5], [0.0, 0.25]]
    dec = decode_cut(tp.encode(torch.zeros(2, 2), keys=torch.tensor([9, 4])))  # rows swapped
    assert dec.tolist() == [[0.0, 0.5], [0.0, 0.25]]  # each sample's leftover, at its new row


def test_keyed_with_fixed_keys_equals_position_mode():
    a = TopPercentile(0.9, warmup_steps=1, index="gap")
    b = TopPercentile(0.9, warmup_steps=1, index="gap")
    keys = torch.arange(16)
    for grad, _ in _grads((16, 40), 5, seed=6):
        assert a.encode(grad) == b.encode(grad, keys=keys)
    assert torch.equal(a.residual(), b.residual(keys))


def test_reset_and_residual_before_use():
    tp = TopPercentile(0.9, warmup_steps=1)
    assert tp.residual().numel() == 0
    tp.encode(torch.randn(4, 5))
    tp.encode(torch.randn(4, 5))
    assert tp.steps == 2 and torch.count_nonzero(tp.residual()) > 0
    tp.reset()
    assert tp.steps == 0 and tp.residual().numel() == 0 and tp.last_nnz == 0
    assert cut_info(tp.encode(torch.randn(3, 3)))["kind"] == "dense"  # warm start again, any shape


def test_top_percentile_errors_leave_state_untouched():
    tp = TopPercentile(0.9)
    tp.encode(torch.randn(4, 5))
    state = tp.residual()
    for bad in (float("nan"), float("inf")):
        grad = torch.randn(4, 5)
        grad[1, 2] = bad
        with pytest.raises(ValueError, match="cut gradient contains non-finite values"):
            tp.encode(grad)
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(5, 4\)"):
        tp.encode(torch.randn(5, 4))
    with pytest.raises(ValueError, match="position mode"):
        tp.encode(torch.randn(4, 5), keys=torch.arange(4))
    with pytest.raises(ValueError, match="position mode"):
        tp.residual(torch.arange(4))
    assert tp.steps == 1 and torch.equal(tp.residual(), state)


def test_top_percentile_bad_arguments():
    for p in (0.0, 1.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="percentile"):
            TopPercentile(p)
    with pytest.raises(ValueError, match="index encoding"):
        TopPercentile(0.9, index="csr")
    with pytest.raises(ValueError, match="value dtype"):
        TopPercentile(0.9, values="int8")
    with pytest.raises(ValueError, match="warmup dtype"):
        TopPercentile(0.9, warmup_dtype="fp64")
    with pytest.raises(ValueError, match="warmup_steps"):
        TopPercentile(0.9, warmup_steps=-1)
    tp = TopPercentile(0.9)
    with pytest.raises(ValueError, match="keys"):
        tp.encode(torch.randn(4, 5), keys=torch.arange(3))
    with pytest.raises(ValueError, match="unique"):
        tp.encode(torch.randn(4, 5), keys=torch.tensor([1, 2, 2, 3]))
    with pytest.raises(ValueError, match="integer"):
        tp.encode(torch.randn(4, 5), keys=torch.zeros(4))
    tp.encode(torch.randn(4, 5), keys=torch.arange(4))
    with pytest.raises(ValueError, match="row shape"):
        tp.encode(torch.randn(4, 6), keys=torch.arange(4))
    with pytest.raises(ValueError, match="keyed mode"):
        tp.encode(torch.randn(4, 5))
    assert tp.steps == 1


def test_top_percentile_overflow_and_keyed_errors_leave_state_untouched():
    big = torch.full((2, 4), 3e38)
    for keys in (None, torch.tensor([3, 4])):
        tp = TopPercentile(0.5)
        tp.encode(big, keys=keys)  # sends 4 of 8 entries; the other 4 stay at 3e38 in the residual
        state = tp.residual()
        with pytest.raises(ValueError, match="overflows float32"):
            tp.encode(big, keys=keys)
        assert tp.steps == 1 and torch.equal(tp.residual(), state)
    # Keyed: a failing call registers none of its new keys ...
    with pytest.raises(ValueError, match="overflows float32"):
        tp.encode(big, keys=torch.tensor([4, 9]))
    assert torch.equal(tp.residual(), state)
    # ... and a failing first call pins neither the mode nor the row shape.
    tp = TopPercentile(0.5)
    bad = torch.randn(3, 4)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="cut gradient contains non-finite values"):
        tp.encode(bad, keys=torch.tensor([5, 6, 7]))
    assert tp.residual().numel() == 0
    tp.encode(torch.randn(8), keys=None)
    assert tp.residual().shape == (8,)


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
