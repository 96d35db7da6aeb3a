"""Shared frames (frugalrl.wire.shared): what decode_message would give, the sizes encode_message counts."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frugalrl.wire.message import Message, WireError, decode_message, encode_message
from frugalrl.wire.shared import SharedFrames

pytestmark = pytest.mark.timeout(60)

_DTYPES = (np.float32, np.float64, np.int64, np.uint8, np.int32, np.bool_)


def _same(a: Message, b: Message) -> None:
    assert (a.op, a.meta, a.codecs, a.kinds) == (b.op, b.meta, b.codecs, b.kinds)
    assert list(a.arrays) == list(b.arrays)
    for name in a.arrays:
        assert a.arrays[name].dtype == b.arrays[name].dtype and a.arrays[name].shape == b.arrays[name].shape
        np.testing.assert_array_equal(a.arrays[name], b.arrays[name])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), max_size=3)), max_size=5),
       st.integers(-2, 10**6), st.integers(0, 2**31 - 1))
def test_a_shared_frame_reads_back_as_the_encoded_message(arrays, version, seed):
    rng = np.random.default_rng(seed)
    msg = Message("step", {"version": version}, {}, {})
    for i, (dtype, shape) in enumerate(arrays):
        name = ("obs", "rewards", "terminations", f"info/x{i}", "actions")[i]
        msg.arrays[name] = np.asarray(rng.standard_normal(shape) * 100).astype(dtype)
        if dtype == np.bool_:
            msg.codecs[name] = "bits"
        elif dtype == np.float32 and i % 2:
            msg.codecs[name] = "fp32"
    buf = mmap.mmap(-1, 1 << 16)
    writer, reader = SharedFrames(), SharedFrames()
    for _ in range(3):  # first use and cached uses
        note, sizes = writer.write(msg, buf)
        got, got_sizes = reader.read(note, buf)
        real, real_sizes = decode_message(encode_message(msg)[0])
        _same(got, real)
        assert got_sizes == real_sizes == sizes == encode_message(msg)[1]
        got.meta["version"] = "changed"  # a read message is the caller's
        for arr in got.arrays.values():
            arr[...] = 0  # a fresh array: not a view of the buffer
    _same(reader.read(note, buf)[0], decode_message(encode_message(msg)[0])[0])


def test_lossy_compressing_or_too_big_messages_are_not_shared():
    buf = mmap.mmap(-1, 4096)
    frames = SharedFrames()
    x = np.ones(8, np.float32)
    assert frames.write(Message("w", {}, {"w/a": x}, {"w/a": "bf16"}), buf) is None
    assert frames.write(Message("w", {}, {"obs": x}, {"obs": "lz4"}), buf) is None
    assert frames.write(Message("w", {}, {"obs": np.ones(2048, np.float32)}), buf) is None
    assert frames.write(Message("w", {"x": 0.5}, {"obs": x}), buf) is None  # float meta: not a shape key
    assert frames.write(Message("w", {}, {"obs": x}), buf) is not None


@pytest.mark.parametrize("note", [
    b"FRL1{}", b"SHR1not json", b'SHR1{"op":"s","meta":{},"arrays":[["obs","|O",[2]]]}',
    b'SHR1{"op":"s","meta":{},"arrays":[["obs","<f4",[100000]]]}',
    b'SHR1{"op":"s","meta":{},"arrays":[["obs","<f4",[2],"bf16"]]}', b'SHR1{"op":1,"meta":{},"arrays":[]}',
    b'SHR1{"op":"s","meta":{},"arrays":[["obs","<f4",[-1]]]}',
])
def test_a_bad_note_is_a_wire_error(note):
    with pytest.raises(WireError):
        SharedFrames().read(note, mmap.mmap(-1, 4096))
