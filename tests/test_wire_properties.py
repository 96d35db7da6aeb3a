"""Property-based tests of the wire layer (Hypothesis; skipped where it is not installed)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402
from test_wire import _sample_message  # noqa: E402

from frugalrl.wire import (  # noqa: E402
    Message,
    WireError,
    decode,
    decode_message,
    encode,
    encode_message,
    encoded_nbytes,
    message_sizes,
)

pytestmark = pytest.mark.timeout(120)


@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(
        dtype=np.float32,
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
        elements=st.floats(-(2.0**100), 2.0**100, allow_nan=False, width=32),
    )
)
def test_property_float_codecs(x):
    """Every float codec: exact size, shape kept, error within the codec's bound."""
    for codec in ("fp32", "bf16", "int8"):
        buf = encode(x, codec)
        assert len(buf) == encoded_nbytes(x.shape, x.dtype, codec)
        y = decode(buf, x.shape, "float32", codec)
        assert y.shape == x.shape
        if codec == "fp32":
            np.testing.assert_array_equal(y, x)
        elif codec == "bf16":
            tiny = np.finfo(np.float32).tiny  # below it bf16 keeps fp32's absolute spacing
            assert (np.abs(y - x) <= np.abs(x) * 2.0**-8 + tiny).all()
        else:
            scale = float(np.abs(x).max()) / 127 if x.size else 1.0
            assert (np.abs(y.astype(np.float64) - x) <= scale / 2 * (1 + 1e-5) + 1e-35).all()


@settings(max_examples=40, deadline=None)
@given(
    x=hnp.arrays(
        dtype=st.sampled_from([np.int8, np.int32, np.int64, np.uint8, np.bool_, np.float64]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    )
)
def test_property_raw_codec(x):
    y = decode(encode(x, "raw"), x.shape, x.dtype.str, "raw")
    np.testing.assert_array_equal(y, x)  # NaN == NaN for assert_array_equal
    assert y.dtype == x.dtype


@settings(max_examples=40, deadline=None)
@given(
    arrays=st.dictionaries(
        st.sampled_from(["obs", "actions", "rewards", "w/a", "w/b", "info/x", "ep_r", "act/h", "other"]),
        hnp.arrays(
            dtype=st.sampled_from([np.float32, np.float64, np.int64, np.bool_]),
            shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        ),
        max_size=5,
    ),
    codec=st.sampled_from(["raw", "fp32", "fp16", "bf16"]),
    meta=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5) | st.none(), max_size=3),
)
def test_property_message_sizes(arrays, codec, meta):
    codecs = {
        n: codec
        for n, a in arrays.items()
        if a.dtype.kind == "f" and np.isfinite(a).all() and (a.size == 0 or np.abs(a).max() < 6e4)
    }
    msg = Message("op", meta, arrays, codecs)
    blob, sizes = encode_message(msg)
    assert message_sizes(msg) == sizes
    assert sum(sizes.values()) == len(blob)
    out, out_sizes = decode_message(blob)
    assert out_sizes == sizes and out.meta == meta and set(out.arrays) == set(arrays)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_property_byte_flips_fail_only_with_wire_error(data):
    """A corrupted message either decodes (payload damage is undetectable) or raises WireError."""
    blob = bytearray(encode_message(_sample_message())[0])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    try:
        decode_message(bytes(blob[:cut]) if data.draw(st.booleans()) else bytes(blob))
    except WireError:
        pass
