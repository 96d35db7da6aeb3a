"""The wire layer: codecs, the message envelope and the byte meter."""

from __future__ import annotations

import json
import random
import struct
import threading

import numpy as np
import pytest
import torch

from frugalrl.nets import MLPActorCritic
from frugalrl.wire import (
    CODECS,
    DOWN,
    KINDS,
    UP,
    ByteMeter,
    Message,
    WireError,
    decode,
    decode_message,
    decode_state_dict,
    encode,
    encode_message,
    encode_state_dict,
    encoded_nbytes,
    message_sizes,
)
from frugalrl.wire.codecs import bf16_bits_to_fp32, fp32_to_bf16_bits

pytestmark = pytest.mark.timeout(60)

SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 0, 5), (2, 3, 4, 5)]
FLOAT_DTYPES = [np.float16, np.float32, np.float64]
RAW_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float32, np.float64]


def _random_floats(rng: np.random.Generator, shape, dtype, scale: float = 10.0) -> np.ndarray:
    """Normal values with a spread of magnitudes (kept in fp16's normal range)."""
    x = rng.normal(size=shape) * scale * np.exp(rng.uniform(-3, 3, size=shape))
    x = np.clip(x, -60000, 60000)
    return x.astype(dtype)


def _roundtrip(x: np.ndarray, codec: str, dtype=None) -> np.ndarray:
    dtype = np.dtype(dtype or x.dtype)
    buf = encode(x, codec)
    assert len(buf) == encoded_nbytes(x.shape, x.dtype, codec)
    y = decode(buf, x.shape, dtype.str, codec)
    assert y.shape == x.shape and y.dtype == dtype
    return y


# ---------------------------------------------------------------------------------------------- codecs
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_fp32_roundtrip_is_exact_in_float32(shape, dtype):
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = _random_floats(rng, shape, dtype)
        y = _roundtrip(x, "fp32")
        np.testing.assert_array_equal(y, x.astype(np.float32).astype(dtype))


@pytest.mark.parametrize("shape", SHAPES)
def test_fp16_roundtrip_within_relative_tolerance(shape):
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = _random_floats(rng, shape, np.float32)
        y = _roundtrip(x, "fp16")
        # 10 explicit mantissa bits: relative error <= 2^-11 (half an ulp), subnormal spacing 2^-24.
        np.testing.assert_allclose(y, x, rtol=2.0**-11, atol=2.0**-25)
        np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bf16_roundtrip_within_relative_tolerance(shape, dtype):
    rng = np.random.default_rng(2)
    for _ in range(5):
        x = _random_floats(rng, shape, dtype, scale=1e3)
        y = _roundtrip(x, "bf16")
        # 7 explicit mantissa bits, round to nearest: relative error <= 2^-8 (plus fp32 rounding of x).
        np.testing.assert_allclose(y, x, rtol=2.0**-8 + 2.0**-23, atol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_roundtrip_within_half_a_step(shape):
    rng = np.random.default_rng(3)
    for _ in range(5):
        x = _random_floats(rng, shape, np.float32)
        buf = encode(x, "int8")
        assert len(buf) == 4 + x.size == encoded_nbytes(x.shape, x.dtype, "int8")
        scale = float(np.frombuffer(buf[:4], dtype=np.float32)[0])
        if x.size:
            assert scale == pytest.approx(float(np.abs(x).max()) / 127, rel=1e-6)
        q = np.frombuffer(buf[4:], dtype=np.int8)
        assert q.size == 0 or (np.abs(q.astype(np.int32)) <= 127).all()
        y = decode(buf, x.shape, "float32", "int8")
        assert y.shape == x.shape
        assert (np.abs(y - x) <= scale / 2 * (1 + 1e-5) + 1e-30).all()


def test_int8_all_zero_and_nonfinite():
    y = decode(encode(np.zeros(5, np.float32), "int8"), (5,), "float32", "int8")
    np.testing.assert_array_equal(y, np.zeros(5))
    # Values so small that max|x|/127 underflows float32 (the scale's wire type) decode to zeros,
    # without dividing by zero.
    tiny = np.array([1e-44, -3e-45, 0.0], np.float32)
    with np.errstate(all="raise"):
        y = decode(encode(tiny, "int8"), (3,), "float32", "int8")
    np.testing.assert_array_equal(y, np.zeros(3))
    with pytest.raises(ValueError, match="NaN or infinite"):
        encode(np.array([1.0, np.nan], np.float32), "int8")
    with pytest.raises(ValueError, match="NaN or infinite"):
        encode(np.array([np.inf], np.float32), "int8")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", RAW_DTYPES)
def test_raw_roundtrip_is_exact(shape, dtype):
    rng = np.random.default_rng(4)
    if dtype == np.bool_:
        x = rng.integers(0, 2, size=shape).astype(bool)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    else:
        x = _random_floats(rng, shape, dtype)
    y = _roundtrip(x, "raw")
    np.testing.assert_array_equal(y, x)
    assert encoded_nbytes(shape, dtype, "raw") == x.nbytes


def test_decode_returns_a_fresh_writable_array():
    x = np.arange(6, dtype=np.float32)
    for codec in CODECS:
        buf = bytearray(encode(x, codec))
        y = decode(memoryview(buf), (6,), "float32", codec)
        assert y.flags.writeable and y.flags.owndata
        y[:] = -1  # must not write into the buffer
        assert bytes(buf) == encode(x, codec)


def test_unknown_codec_is_rejected():
    with pytest.raises(ValueError, match="unknown codec 'fp8'"):
        encode(np.zeros(2), "fp8")
    with pytest.raises(ValueError, match="unknown codec"):
        decode(b"", (0,), "float32", "fp8")
    with pytest.raises(ValueError, match="unknown codec"):
        encoded_nbytes((2,), np.float32, "fp8")


# ---------------------------------------------------------------------------------------------- bf16
def _f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


@pytest.mark.parametrize(
    "bits_in, bits_out",
    [
        (0x3F800000, 0x3F80),  # 1.0 exactly
        (0x3F808000, 0x3F80),  # 1 + 2^-8: a tie, rounds to the even 0x3F80
        (0x3F818000, 0x3F82),  # 1 + 3*2^-8: a tie, rounds to the even 0x3F82
        (0x3F808001, 0x3F81),  # just above the tie rounds up
        (0x3F807FFF, 0x3F80),  # just below the tie rounds down
        (0xBF818000, 0xBF82),  # sign does not change the rounding
        (0x40490FDB, 0x4049),  # pi -> 3.140625
        (0x7F800000, 0x7F80),  # +inf
        (0xFF800000, 0xFF80),  # -inf
        (0x7F7FFFFF, 0x7F80),  # max float32 overflows to +inf under round-to-nearest
        (0x00000001, 0x0000),  # smallest subnormal rounds to +0
        (0x80000000, 0x8000),  # -0 keeps its sign
    ],
)
def test_bf16_round_to_nearest_even(bits_in, bits_out):
    out = fp32_to_bf16_bits(np.array([_f32(bits_in)]))
    assert out.dtype == np.uint16
    assert int(out[0]) == bits_out, f"{bits_in:#010x} -> {int(out[0]):#06x}, expected {bits_out:#06x}"


def test_bf16_known_values():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7, np.pi, -2.5, 0.0], dtype=np.float32)
    y = bf16_bits_to_fp32(fp32_to_bf16_bits(x))
    np.testing.assert_array_equal(y, [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, 3.140625, -2.5, 0.0])


@pytest.mark.parametrize("bits", [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F80FFFF, 0xFFFFFFFF, 0xFF800001])
def test_bf16_nan_stays_nan(bits):
    """Every NaN, including those whose payload lies only in the dropped bits, stays NaN."""
    y = bf16_bits_to_fp32(fp32_to_bf16_bits(np.array([_f32(bits)])))
    assert np.isnan(y[0]), f"NaN {bits:#010x} became {y[0]}"
    assert np.signbit(y[0]) == bool(bits >> 31)


def test_bf16_matches_torch_rounding():
    rng = np.random.default_rng(5)
    x = _random_floats(rng, (4096,), np.float32, scale=1.0)
    ours = bf16_bits_to_fp32(fp32_to_bf16_bits(x))
    ref = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(ours, ref)


# ---------------------------------------------------------------------------------------------- messages
def _sample_message() -> Message:
    rng = np.random.default_rng(6)
    return Message(
        "rollout",
        {"version": 3, "worker": 1, "note": "héllo", "nested": {"a": [1, 2.5, None]}},
        {
            "obs": rng.normal(size=(5, 2, 4)).astype(np.float32),
            "actions": rng.integers(0, 4, size=(5, 2)),
            "rewards": rng.normal(size=(5, 2)).astype(np.float32),
            "terminations": rng.integers(0, 2, size=(5, 2)).astype(bool),
            "dist_params": rng.normal(size=(5, 2, 4)).astype(np.float32),
            "w/actor.0.weight": rng.normal(size=(8, 4)).astype(np.float32),
            "w/actor.0.bias": rng.normal(size=(8,)).astype(np.float32),
            "grad/x": rng.normal(size=(3,)).astype(np.float32),
            "empty": np.zeros((0, 3), np.float32),
            "scalar": np.array(7, dtype=np.int64),
            "custom": np.ones(2, np.float64),
        },
        codecs={"w/actor.0.weight": "bf16", "w/actor.0.bias": "int8", "grad/x": "fp16", "obs": "fp32"},
        kinds={"custom": "activations"},
    )


def test_message_roundtrip():
    msg = _sample_message()
    blob, sizes = encode_message(msg)
    out, out_sizes = decode_message(blob)
    assert out.op == msg.op
    assert out.meta == msg.meta
    assert list(out.arrays) == list(msg.arrays)
    assert out_sizes == sizes
    for name, arr in msg.arrays.items():
        got = out.arrays[name]
        assert got.shape == arr.shape and got.dtype == arr.dtype, name
        codec = msg.codecs.get(name, "raw")
        assert out.codecs[name] == codec
        assert out.kind_of(name) == msg.kind_of(name)
        if codec in ("raw", "fp32"):
            np.testing.assert_array_equal(got, arr)
        else:
            np.testing.assert_allclose(got, arr, rtol=0.02, atol=float(np.abs(arr).max()) / 127)


def test_message_kinds():
    msg = _sample_message()
    _, sizes = encode_message(msg)
    assert msg.kind_of("obs") == "observations"
    assert msg.kind_of("actions") == "actions"
    assert msg.kind_of("terminations") == "rewards"
    assert msg.kind_of("dist_params") == "behaviour"
    assert msg.kind_of("w/actor.0.weight") == "weights"
    assert msg.kind_of("grad/x") == "gradients"
    assert msg.kind_of("custom") == "activations"
    assert msg.kind_of("scalar") == "control"
    assert sizes["weights"] == 8 * 4 * 2 + (4 + 8)  # bf16 weight + int8 bias
    assert sizes["gradients"] == 3 * 2
    assert sizes["observations"] == 5 * 2 * 4 * 4
    assert set(sizes) <= set(KINDS)


def test_message_sizes_match_encoding():
    msg = _sample_message()
    blob, sizes = encode_message(msg)
    assert message_sizes(msg) == sizes
    assert sum(sizes.values()) == len(blob)
    empty = Message("ping")
    blob, sizes = encode_message(empty)
    assert message_sizes(empty) == sizes == {"control": len(blob)}


def test_corrupt_messages_raise_wire_error():
    blob, _ = encode_message(_sample_message())
    with pytest.raises(WireError, match="too short"):
        decode_message(blob[:5])
    with pytest.raises(WireError, match="too short"):
        decode_message(b"")
    with pytest.raises(WireError, match="not a frugalrl message"):
        decode_message(b"XXXX" + blob[4:])
    with pytest.raises(WireError, match="truncated"):
        decode_message(blob[:-1])
    (hlen,) = struct.unpack_from("<I", blob, 4)
    with pytest.raises(WireError, match="corrupt message header"):
        decode_message(blob[: 8 + hlen // 2])
    bad = bytearray(blob)
    bad[8] = ord("[")  # the header no longer parses as the JSON object it was
    with pytest.raises(WireError, match="corrupt"):
        decode_message(bytes(bad))
    with pytest.raises(WireError, match="corrupt message header"):
        decode_message(b"FRL1" + struct.pack("<I", 1000) + b"{}")


def _split(blob: bytes) -> tuple[dict, bytes]:
    (hlen,) = struct.unpack_from("<I", blob, 4)
    return json.loads(blob[8 : 8 + hlen]), blob[8 + hlen :]


def _join(header: dict, payload: bytes) -> bytes:
    h = json.dumps(header).encode()
    return b"FRL1" + struct.pack("<I", len(h)) + h + payload


def _mutate_spec(spec: list, what: str) -> list:
    """Damage one field of an array spec, found by its value (the spec's layout is the wire's business)."""
    spec = list(spec)
    shape_at = next(i for i, v in enumerate(spec) if isinstance(v, list))
    dtype_at = next(i for i, v in enumerate(spec) if v == "<f4")
    if what == "negative shape":
        spec[shape_at] = [-2, -3]  # same element count as [2, 3]
    elif what == "text shape":
        spec[shape_at] = ["two", 3]
    elif what == "bigger shape":
        spec[shape_at] = [200, 300]
    elif what == "object dtype":
        spec[dtype_at] = "|O"
    elif what == "unknown dtype":
        spec[dtype_at] = "nope"
    elif what == "structured dtype":
        spec[dtype_at] = [["a", "<f4"]]
    elif what == "name":
        spec[0] = ["not", "a", "name"]
    elif what == "too long":
        spec += ["extra"] * 8
    elif what == "too short":
        spec = spec[:1]
    elif what == "not a list":
        spec = {"name": spec[0]}
    return spec


SPEC_DAMAGE = [
    "negative shape", "text shape", "bigger shape", "object dtype", "unknown dtype", "structured dtype",
    "name", "too long", "too short", "not a list",
]


@pytest.mark.parametrize("what", SPEC_DAMAGE)
def test_inconsistent_array_specs_raise_wire_error(what):
    """A header that parses as JSON but does not describe its payload is corrupt too."""
    msg = Message("x", {"k": 1}, {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.int64)})
    header, payload = _split(encode_message(msg)[0])
    assert decode_message(_join(header, payload))[0].arrays["a"].shape == (2, 3)  # the re-joined original is fine
    header["arrays"][0] = _mutate_spec(header["arrays"][0], what)
    with pytest.raises(WireError):
        decode_message(_join(header, payload))


def test_unknown_codec_in_header_raises_wire_error():
    msg = Message("x", {}, {"w/a": np.ones(4, np.float32)}, codecs={"w/a": "bf16"})
    header, payload = _split(encode_message(msg)[0])
    spec = header["arrays"][0]
    spec[spec.index("bf16")] = "fp9"
    with pytest.raises(WireError):
        decode_message(_join(header, payload))


@pytest.mark.parametrize(
    "change",
    [
        lambda h: h.pop("arrays"),
        lambda h: h.pop("op"),
        lambda h: h.update(arrays=5),
        lambda h: h.update(meta=[1, 2]),
        lambda h: h.update(op=["x"]),
    ],
)
def test_bad_header_fields_raise_wire_error(change):
    header, payload = _split(encode_message(Message("x", {}, {"a": np.ones(2, np.float32)}))[0])
    change(header)
    with pytest.raises(WireError, match="corrupt"):
        decode_message(_join(header, payload))
    with pytest.raises(WireError):
        decode_message(_join([1, 2], payload))  # a header that is not an object


def test_random_corruptions_fail_only_with_wire_error():
    """Flipped bytes and cuts (NumPy RNG): decoding succeeds (payload damage) or raises WireError."""
    rng = np.random.default_rng(7)
    clean = encode_message(_sample_message())[0]
    (hlen,) = struct.unpack_from("<I", clean, 4)
    for _ in range(400):
        blob = bytearray(clean)
        for _ in range(rng.integers(1, 4)):
            i = int(rng.integers(0, 8 + hlen + 16))  # mostly the prefix and the header
            blob[i] = int(rng.integers(0, 256))
        cut = int(rng.integers(0, len(blob) + 1)) if rng.random() < 0.3 else len(blob)
        try:
            decode_message(bytes(blob[:cut]))
        except WireError:
            pass


def test_state_dict_roundtrip():
    torch.manual_seed(0)
    agent = MLPActorCritic(4, {"type": "discrete", "n": 2}, [8])
    state = agent.state_dict()
    state["steps"] = torch.tensor([3, 4], dtype=torch.int64)  # an integer buffer travels raw
    for codec, tol in (("fp32", 0.0), ("fp16", 1e-3), ("bf16", 8e-3), ("int8", None)):
        msg = encode_state_dict(state, codec)
        assert msg.op == "weights"
        assert msg.codecs["w/steps"] == "raw"
        blob, sizes = encode_message(msg)
        back = decode_state_dict(decode_message(blob)[0])
        assert list(back) == list(state)
        torch.testing.assert_close(back["steps"], state["steps"], rtol=0, atol=0)
        n_float = sum(t.numel() for k, t in state.items() if t.is_floating_point())
        n_tensors = sum(1 for t in state.values() if t.is_floating_point())
        per = {"fp32": 4 * n_float, "fp16": 2 * n_float, "bf16": 2 * n_float, "int8": n_float + 4 * n_tensors}
        assert sizes["weights"] == per[codec] + 2 * 8
        for k, t in state.items():
            if not t.is_floating_point():
                continue
            if tol is None:
                step = float(t.abs().max()) / 127
                assert float((back[k] - t).abs().max()) <= step / 2 * (1 + 1e-5) + 1e-12
            else:
                torch.testing.assert_close(back[k], t, rtol=tol, atol=1e-6)


# ---------------------------------------------------------------------------------------------- meter
def test_byte_meter_by_kind_direction_worker():
    m = ByteMeter()
    m.add("weights", 1000, worker=0, direction=DOWN)
    m.add("weights", 500, worker=1, direction=DOWN)
    m.add("observations", 64, worker=1, direction=UP)
    m.add("control", 10)  # no worker: counted in kinds and direction only
    assert m.total() == 1574
    assert m.kind_total("weights") == 1500
    assert m.kind_total("gradients") == 0
    assert m.worker_bytes(0) == 1000
    assert m.worker_bytes(1) == 564
    assert m.worker_bytes(1, "observations") == 64
    assert m.worker_bytes(2) == 0
    by_kind = m.by_kind()
    assert list(by_kind)[: len(KINDS)] == list(KINDS)
    assert by_kind["weights"] == 1500 and by_kind["actions"] == 0
    s = m.summary()
    for kind in KINDS:
        assert s[kind] == by_kind[kind]
    assert s["total"] == 1574
    assert s["down"] == {"weights": 1500}
    assert s["up"] == {"observations": 64, "control": 10}
    assert s["per_worker"] == {"0": {"weights": 1000}, "1": {"observations": 64, "weights": 500}}
    assert s["messages"] == 0
    json.dumps(s)  # JSON-ready


def test_byte_meter_messages_and_reset():
    m = ByteMeter()
    msg = _sample_message()
    blob, sizes = encode_message(msg)
    m.add_message(sizes, worker=3, direction=DOWN)
    m.add_message(sizes, worker=3, direction=UP)
    s = m.summary()
    assert s["messages"] == 2
    assert s["total"] == 2 * len(blob)
    assert sum(s["down"].values()) == len(blob) == sum(s["up"].values())
    assert m.worker_bytes(3) == 2 * len(blob)
    with pytest.raises(ValueError, match="negative byte count"):
        m.add("weights", -1)
    m.reset()
    s = m.summary()
    assert s["total"] == 0 and s["messages"] == 0 and s["per_worker"] == {} and s["up"] == {}


def test_byte_meter_is_thread_safe():
    m = ByteMeter()

    def work(w: int) -> None:
        for _ in range(2000):
            m.add_message({"control": 3, "observations": 5}, worker=w, direction=UP)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = m.summary()
    assert s["messages"] == 8000
    assert s["total"] == 8000 * 8
    assert all(m.worker_bytes(w) == 2000 * 8 for w in range(4))


def test_bytes_by_direction_are_the_summarys():
    """``by_direction`` is the summary's up/down split, without the per-worker table."""
    meter = ByteMeter()
    meter.add_message({"observations": 40, "control": 3}, 0, "up")
    meter.add_message({"weights": 100}, 1, "down")
    meter.add("control", 5, None, "down")
    split = meter.by_direction()
    assert split == {"up": {"observations": 40, "control": 3}, "down": {"weights": 100, "control": 5}}
    summary = meter.summary()
    assert (summary["up"], summary["down"]) == (split["up"], split["down"])


def test_byte_meter_counts_as_if_each_message_were_added_at_once():
    """Messages are tallied by their sizes and added up when read: any mix of reads, checkpoints and messages of
    many sizes (more than the tally holds) reads as the plain sums."""
    rng = random.Random(0)
    m = ByteMeter()
    by_kind: dict[str, int] = {}
    per_worker: dict[str, dict[str, int]] = {}
    for i in range(3 * ByteMeter.MAX_TALLY):
        sizes = {"control": rng.randrange(3), "observations": rng.choice([0, 40, 41 + i])}
        worker, direction = rng.choice([None, 0, 1]), rng.choice([UP, DOWN])
        m.add_message(sizes, worker, direction)
        for kind, n in sizes.items():
            by_kind[kind] = by_kind.get(kind, 0) + n
            if worker is not None:
                per_worker.setdefault(str(worker), {}).setdefault(kind, 0)
                per_worker[str(worker)][kind] += n
        if i % 97 == 0:
            assert m.total() == sum(by_kind.values())
        if i == 400:
            restored = ByteMeter()
            restored.load_state_dict(json.loads(json.dumps(m.state_dict())))
            assert restored.summary() == m.summary()
    s = m.summary()
    assert s["messages"] == 3 * ByteMeter.MAX_TALLY
    assert {k: s[k] for k in by_kind} == by_kind and s["per_worker"] == per_worker
    assert sum(s["up"].values()) + sum(s["down"].values()) == s["total"]
    with pytest.raises(ValueError, match="negative byte count"):
        m.add_message({"control": -1}, 0, UP)
