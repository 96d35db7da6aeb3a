"""The lossless experience codecs (frugalrl.wire.lossless): exact round trips, sizes on the wire, and
decoders that refuse corrupt or oversized input before allocating anything."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from frugalrl.wire import (
    Message,
    WireError,
    decode,
    decode_message,
    encode,
    encode_message,
    lossless,
    message_sizes,
)
from frugalrl.wire.cache import WireCache
from frugalrl.wire.codecs import ALL_CODECS, CODECS, encoded_nbytes, payload_nbytes

pytestmark = pytest.mark.timeout(120)

COMPRESSORS = ("lz4", "zstd")
DTYPES = (np.float32, np.float64, np.uint8, np.int64, np.bool_, np.int8, np.dtype(">f4"), np.complex64)
SHAPES = ((), (0,), (3, 0, 2), (1,), (7,), (5, 3, 2), (1000,), (64, 8, 8), (2, 300))


def _array(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.2
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dt)
    return (rng.normal(size=shape) * 3).astype(dt)


def _same(x: np.ndarray, y: np.ndarray) -> None:
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.tobytes() == x.tobytes()  # bit for bit: NaN payloads, signed zeros, byte order
    assert y.flags.writeable and y.flags.owndata


def _codecs_for(dt: np.dtype) -> tuple[str, ...]:
    return (*COMPRESSORS, "bits") if np.dtype(dt).kind == "b" else COMPRESSORS


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_is_exact(dtype, shape):
    x = _array(np.random.default_rng(0), shape, dtype)
    for codec in _codecs_for(x.dtype):
        buf = encode(x, codec)
        assert payload_nbytes(buf + b"more", x.shape, x.dtype.str, codec) == len(buf)
        assert len(buf) <= lossless.max_encoded_nbytes(x.shape, x.dtype, codec)
        _same(x, decode(buf, x.shape, x.dtype.str, codec))
        _same(x, decode(memoryview(bytearray(buf)), x.shape, x.dtype.str, codec))


def test_special_floats_and_nan_payloads_survive():
    x = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-45, -3.4e38] * 50, dtype=np.float32).reshape(50, 7)
    x.view(np.uint32)[0, 0] = 0x7FC12345  # a NaN with a payload
    x.view(np.uint32)[1, 0] = 0xFF800001  # a signalling NaN
    for codec in COMPRESSORS:
        _same(x, decode(encode(x, codec), x.shape, "float32", codec))
        with np.errstate(invalid="ignore"):  # the signalling NaN turns quiet: still a NaN to keep
            y = x.astype(np.float64)
        _same(y, decode(encode(y, codec), y.shape, "float64", codec))


def test_compressible_data_gets_smaller_and_random_bytes_are_stored():
    obs = np.zeros((128, 8, 8), dtype=np.float32)
    obs[:, :, :6] = np.random.default_rng(1).normal(size=(128, 8, 6))
    noise = np.random.default_rng(2).integers(0, 256, size=4096, dtype=np.uint8)
    for codec in COMPRESSORS:
        assert len(encode(obs, codec)) < 0.8 * obs.nbytes
        stored = encode(noise, codec)  # incompressible: the bytes themselves plus the 4-byte length
        assert len(stored) == 4 + noise.nbytes and stored[4:] == noise.tobytes()
        _same(noise, decode(stored, noise.shape, "uint8", codec))
    dones = np.zeros((128, 8), dtype=bool)
    dones[[5, 70], [1, 3]] = True
    assert len(encode(dones, "bits")) == 128 == encoded_nbytes(dones.shape, dones.dtype, "bits")
    assert len(encode(dones, "zstd")) < 40  # bit-packed, then compressed


def test_sizes_that_depend_on_the_data_have_no_formula():
    for codec in COMPRESSORS:
        with pytest.raises(ValueError, match="depends on the data"):
            encoded_nbytes((4,), np.float32, codec)
    assert set(CODECS) < set(ALL_CODECS) and set(lossless.LOSSLESS_CODECS) <= set(ALL_CODECS)


def test_message_sizes_are_the_bytes_produced():
    rng = np.random.default_rng(3)
    arrays = {"obs": rng.normal(size=(128, 2, 8)).astype(np.float32), "rewards": rng.normal(size=(128, 2)),
              "terminations": rng.random((128, 2)) < 0.05, "truncations": np.zeros(2, bool),
              "dist_params": rng.normal(size=(128, 2, 4)).astype(np.float32), "actions": np.zeros((128, 2), np.uint8)}
    codecs = {"obs": "zstd", "rewards": "lz4", "terminations": "zstd", "truncations": "bits", "dist_params": "lz4"}
    msg = Message("rollout", {"version": 3}, arrays, codecs)
    blob, sizes = encode_message(msg)
    raw_blob, raw_sizes = encode_message(Message("rollout", {"version": 3}, arrays))
    assert message_sizes(msg) == sizes and sum(sizes.values()) == len(blob)
    assert sizes["observations"] < raw_sizes["observations"] and sizes["rewards"] < raw_sizes["rewards"]
    out, out_sizes = decode_message(blob)
    assert out_sizes == sizes and out.codecs == {**codecs, "actions": "raw"}
    for name, x in arrays.items():
        _same(x, out.arrays[name])


def test_wire_cache_passes_compressed_messages_through_the_real_codec():
    rng = np.random.default_rng(4)
    wire = WireCache()
    for i in range(6):
        msg = Message("rollout", {"version": i}, {"obs": rng.normal(size=(64, 4)).astype(np.float32),
                                                  "terminations": rng.random(16) < 0.5},
                      {"obs": "zstd", "terminations": "bits"})
        blob, sizes = wire.encode(msg)
        assert (blob, sizes) == encode_message(msg)
        out, out_sizes = wire.decode(blob)
        assert out_sizes == sizes
        for name, x in msg.arrays.items():
            _same(x, out.arrays[name])


# ---------------------------------------------------------------------------------------------- bad input
def test_bits_only_for_canonical_booleans():
    with pytest.raises(ValueError, match="boolean arrays only"):
        encode(np.zeros(3, np.float32), "bits")
    odd = np.frombuffer(bytes([0, 1, 2]), dtype=bool)  # a bool array holding the byte 2
    for codec in ("bits", *COMPRESSORS):
        with pytest.raises(ValueError, match="other than 0 and 1"):
            encode(odd, codec)
    with pytest.raises(ValueError, match="expected 1"):
        decode(b"\x80\x00", (3,), "|b1", "bits")
    with pytest.raises(ValueError, match="padding"):
        decode(b"\x81", (3,), "|b1", "bits")


@pytest.mark.parametrize("codec", COMPRESSORS)
def test_corrupt_payloads_raise_value_errors(codec):
    x = np.tile(np.arange(64, dtype=np.float32), 16)
    buf = encode(x, codec)
    body_len = struct.unpack_from("<I", buf)[0]
    assert body_len < x.nbytes  # compressed
    cases = {
        "truncated length": buf[:3],
        "truncated body": buf[:-1],
        "trailing bytes": buf + b"\x00",
        "length over the array": struct.pack("<I", x.nbytes + 1) + bytes(x.nbytes + 1),
        "garbage body": buf[:4] + b"\xff" * body_len,
    }
    for what, bad in cases.items():
        with pytest.raises(ValueError):
            decode(bad, x.shape, "float32", codec)
        if what.startswith("truncated") or what == "length over the array":
            with pytest.raises(ValueError):
                payload_nbytes(bad, x.shape, "float32", codec)
    with pytest.raises(ValueError):  # the right payload for another shape
        decode(buf, (x.size * 2,), "float32", codec)


def test_zstd_frame_must_declare_the_arrays_size():
    x = np.zeros(1000, dtype=np.float32)
    other = encode(np.zeros(900, dtype=np.float32), "zstd")
    with pytest.raises(ValueError, match="declares 3600 bytes"):
        decode(other, x.shape, "float32", "zstd")


@pytest.mark.parametrize("codec", COMPRESSORS)
def test_a_huge_declared_shape_is_refused_before_allocating(codec):
    # A valid 40-byte payload whose header claims 2**40 floats: no 4 TB allocation, a clear error.
    small = encode(np.zeros(1000, dtype=np.float32), codec)
    for shape in ((2**40,), (2**20, 2**20)):
        with pytest.raises(ValueError, match="declares|cannot hold|MAX_DECODED"):
            decode(small, shape, "float32", codec)
    blob = bytearray(encode_message(Message("rollout", {}, {"obs": np.zeros(1000, np.float32)}, {"obs": codec}))[0])
    blob = bytes(blob).replace(b"[1000]", b"[1099511627776]", 1)
    hlen = struct.unpack_from("<I", blob, 4)[0] + len(b"[1099511627776]") - len(b"[1000]")
    blob = blob[:4] + struct.pack("<I", hlen) + blob[8:]
    with pytest.raises(WireError):
        decode_message(blob)


def test_byte_flips_in_compressed_messages_fail_only_with_wire_error():
    rng = np.random.default_rng(5)
    arrays = {"obs": rng.normal(size=(64, 4)).astype(np.float32), "terminations": rng.random((64, 2)) < 0.1,
              "dist_params": rng.normal(size=(64, 2)).astype(np.float32), "truncations": np.zeros(9, bool)}
    clean = encode_message(Message("rollout", {"v": 1}, arrays, {"obs": "zstd", "terminations": "lz4",
                                                                  "dist_params": "lz4", "truncations": "bits"}))[0]
    for trial in range(400):
        blob = bytearray(clean)
        for _ in range(1 + trial % 3):
            blob[int(rng.integers(len(blob)))] ^= 1 << int(rng.integers(8))
        try:
            decode_message(bytes(blob))
        except WireError:
            pass
    for cut in range(0, len(clean), 7):
        with pytest.raises(WireError):
            decode_message(clean[:cut])


# ---------------------------------------------------------------------------------------------- properties
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(
    x=hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float64, np.uint8, np.int64, np.bool_, np.dtype(">f8")]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
    ),
    codec=st.sampled_from(["lz4", "zstd", "bits"]),
)
def test_property_exact_round_trip(x, codec):
    """Any array (NaN and inf included, which Hypothesis draws for floats) comes back byte for byte."""
    if codec == "bits" and x.dtype.kind != "b":
        codec = "zstd"
    buf = encode(x, codec)
    assert payload_nbytes(buf, x.shape, x.dtype.str, codec) == len(buf)
    _same(x, decode(buf, x.shape, x.dtype.str, codec))


@settings(max_examples=100, deadline=None)
@given(
    bits=hnp.arrays(dtype=np.uint32, shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=20)),
    codec=st.sampled_from(COMPRESSORS),
)
def test_property_every_float32_bit_pattern(bits, codec):
    """Every bit pattern, NaN payloads included, viewed as float32."""
    x = bits.view(np.float32)
    _same(x, decode(encode(x, codec), x.shape, "float32", codec))


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300), shape=st.sampled_from([(0,), (10,), (8, 8), (100,)]),
       dtype=st.sampled_from(["<f4", "|b1", "|u1"]), codec=st.sampled_from(["lz4", "zstd", "bits"]))
def test_property_arbitrary_bytes_decode_or_raise_value_error(data, shape, dtype, codec):
    try:
        y = decode(data, shape, dtype, codec)
    except ValueError:
        return
    assert y.shape == shape
