"""WireCache (frugalrl.wire.cache): the same bytes and sizes as encode_message / decode_message, shape after shape."""

from __future__ import annotations

import numpy as np
import pytest

from frugalrl.wire.cache import WireCache
from frugalrl.wire.message import Message, decode_message, encode_message

pytestmark = pytest.mark.timeout(60)


def _step(rng: np.random.Generator, t: int) -> Message:
    return Message(
        "step",
        {"t": 3, "flag": True, "name": "w0"},  # the same meta every time: one shape
        {"obs": rng.standard_normal((4, 3)).astype(np.float32), "w/x": rng.standard_normal(5).astype(np.float32)},
        {"w/x": "bf16"},
    )


def _same(a: Message, b: Message) -> None:
    assert (a.op, a.meta, a.codecs, a.kinds) == (b.op, b.meta, b.codecs, b.kinds)
    assert list(a.arrays) == list(b.arrays)
    for name in a.arrays:
        np.testing.assert_array_equal(a.arrays[name], b.arrays[name])
        assert a.arrays[name].dtype == b.arrays[name].dtype


def test_repeated_shapes_encode_and_decode_exactly():
    enc, dec = WireCache(), WireCache()
    rng = np.random.default_rng(0)
    for t in range(2 * WireCache.CHECK_FIRST + 5):  # past the checked first uses: the cached path
        msg = _step(rng, t)
        blob, sizes = enc.encode(msg)
        assert (blob, sizes) == encode_message(msg)
        got, got_sizes = dec.decode(blob)
        real, real_sizes = decode_message(blob)
        _same(got, real)
        assert got_sizes == real_sizes == sizes
        got.meta["t"] = 99  # a decoded message is the caller's: the cache keeps its own copy
    assert dec.decode(encode_message(_step(rng, 0))[0])[0].meta["t"] == 3


def test_other_shapes_take_the_real_path():
    enc, dec = WireCache(), WireCache()
    for msg in (
        Message("nested", {"a": {"b": [1, 2]}}),  # meta the cache cannot describe
        Message("float", {"x": -0.0}),  # floats are not keys: 0.0 == -0.0 but they encode differently
        Message("float", {"x": 0.0}),
        Message("empty"),
        Message("changes", {}, {"a": np.zeros(3, np.int64)}),
        Message("changes", {}, {"a": np.zeros(4, np.int64)}),
    ):
        for _ in range(4):
            blob, sizes = enc.encode(msg)
            assert (blob, sizes) == encode_message(msg)
            got, got_sizes = dec.decode(blob)
            _same(got, decode_message(blob)[0])
            assert got_sizes == sizes
