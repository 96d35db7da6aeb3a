"""Composite experience codecs (frugalrl.wire.transforms): frame-stack deltas and step differences rebuild the very
same rollout (episode starts and autoresets included), low-bit observation codes stay within their stated error, and every
decoder refuses corrupt input with a ValueError."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frugalrl.wire import Message, WireError, decode_message, encode_message
from frugalrl.wire.codecs import ALL_CODECS, VARIABLE_CODECS, decode, encode, encoded_nbytes, payload_nbytes
from frugalrl.wire.transforms import COMPOSITE_CODECS, LOSSY_TRANSFORMS, quantisation_error

pytestmark = pytest.mark.timeout(120)


def stacked_rollout(rng: np.random.Generator, T: int, k: int, S: int, frame: tuple[int, ...], resets: float,
                    dtype=np.uint8) -> np.ndarray:
    """(T, k, S, *frame) stacks of a frame stream, as FrameStackObservation makes them: each step shifts in one
    new frame; an episode start (probability ``resets``) is a fresh stack of one repeated reset frame."""
    out = np.empty((T, k, S, *frame), dtype=dtype)
    for i in range(k):
        stack = np.repeat(rng.integers(0, 256, (1, *frame)).astype(dtype), S, axis=0)
        for t in range(T):
            if t and rng.random() < resets:
                stack = np.repeat(rng.integers(0, 256, (1, *frame)).astype(dtype), S, axis=0)
            elif t:
                stack = np.concatenate([stack[1:], rng.integers(0, 256, (1, *frame)).astype(dtype)])
            out[t, i] = stack
    return out


def test_codec_names_are_registered():
    assert set(COMPOSITE_CODECS) <= set(VARIABLE_CODECS) <= set(ALL_CODECS)
    assert "frames+zstd" in COMPOSITE_CODECS and "int8+lz4" in COMPOSITE_CODECS
    with pytest.raises(ValueError, match="no size formula"):
        encoded_nbytes((4, 2, 4, 3), np.uint8, "frames+zstd")


@pytest.mark.parametrize("codec", ["frames+zstd", "frames+lz4"])
@pytest.mark.parametrize("resets", [0.0, 0.1, 1.0])
def test_frames_rebuild_the_same_rollout(codec, resets):
    rng = np.random.default_rng(0)
    x = stacked_rollout(rng, 40, 3, 4, (6, 5), resets)
    buf = encode(x, codec)
    y = decode(buf, x.shape, x.dtype, codec)
    assert y.dtype == x.dtype and y.tobytes() == x.tobytes()
    assert payload_nbytes(buf + b"more", x.shape, x.dtype, codec) == len(buf)
    if resets == 0.0:  # one new frame per step after the first: about a quarter of the stacks' bytes
        assert len(buf) < 0.3 * x.nbytes + 64


def test_frames_of_anything_that_is_not_a_shifted_stack_are_sent_whole():
    """Any (T, k, S, ...) array decodes exactly, stacks or not (a step that is no shift goes whole)."""
    rng = np.random.default_rng(1)
    for x in (rng.integers(0, 3, (9, 2, 3, 4), dtype=np.uint8), rng.normal(size=(5, 2, 2, 3)).astype(np.float32),
              np.zeros((0, 2, 4, 3), np.uint8), np.zeros((1, 1, 2, 1), np.uint8)):
        assert decode(encode(x, "frames+zstd"), x.shape, x.dtype, "frames+zstd").tobytes() == x.tobytes()
    with pytest.raises(ValueError, match="T, k, S"):
        encode(np.zeros((4, 2, 1, 3), np.uint8), "frames+zstd")


def lander_rollout(T: int, k: int) -> np.ndarray:
    """(T, k, 8) observations of LunarLander played by Gymnasium's heuristic lander, with autoresets."""
    import gymnasium as gym
    from gymnasium.envs.box2d.lunar_lander import heuristic

    envs = [gym.make("LunarLander-v3") for _ in range(k)]
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    out = np.empty((T, k, 8), np.float32)
    for t in range(T):
        for i, env in enumerate(envs):
            out[t, i] = obs[i]
            obs[i], _, terminated, truncated, _ = env.step(heuristic(env.unwrapped, obs[i]))
            if terminated or truncated:
                obs[i] = env.reset()[0]
    return out


def test_steps_rebuild_a_real_rollout_in_fewer_bytes():
    """A physical state moves little per step: its differences in float order compress better than the states."""
    pytest.importorskip("Box2D")
    x = lander_rollout(128, 4)
    buf = encode(x, "steps+zstd")
    assert decode(buf, x.shape, x.dtype, "steps+zstd").tobytes() == x.tobytes()
    assert payload_nbytes(buf + b"more", x.shape, x.dtype, "steps+zstd") == len(buf)
    assert len(buf) < 0.92 * len(encode(x, "zstd"))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ">f4"])
def test_steps_are_exact_on_any_float_words(dtype):
    """NaN payloads, infinities, signed zeros, wrapping differences: every word comes back."""
    rng = np.random.default_rng(5)
    size = np.dtype(dtype).itemsize
    x = rng.integers(0, 256, (9, 3, 4 * size), dtype=np.uint8).view(dtype)
    x[0, 0, :3] = [np.nan, -0.0, np.inf]
    for codec in ("steps+zstd", "steps+lz4"):
        y = decode(encode(x, codec), x.shape, x.dtype, codec)
        assert y.dtype == x.dtype and y.tobytes() == x.tobytes()
    with pytest.raises(ValueError, match="T, k"):
        encode(np.zeros(5, np.float32), "steps+zstd")
    with pytest.raises(ValueError, match="float"):
        encode(np.zeros((5, 2), np.int32), "steps+zstd")


@settings(max_examples=60, deadline=None)
@given(T=st.integers(0, 12), k=st.integers(0, 3), f=st.integers(1, 5), seed=st.integers(0, 99))
def test_property_steps_round_trip(T, k, f, seed):
    x = np.random.default_rng(seed).normal(size=(T, k, f)).cumsum(axis=0).astype(np.float32)
    assert decode(encode(x, "steps+zstd"), x.shape, x.dtype, "steps+zstd").tobytes() == x.tobytes()


@pytest.mark.parametrize("transform", LOSSY_TRANSFORMS)
def test_low_bit_codes_stay_within_their_stated_error(transform):
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(128, 8, 6)) * np.array([1, 10, 0.1, 100, 1e-3, 5])).astype(np.float32)
    x[..., 5] = 2.5  # a constant feature decodes exactly under the affine codes
    codec = f"{transform}+zstd"
    y = decode(encode(x, codec), x.shape, x.dtype, codec)
    assert y.dtype == np.float32 and y.shape == x.shape
    err = np.abs(y.astype(np.float64) - x)
    if transform in ("int8", "int16"):
        steps = (x.max(axis=(0, 1)).astype(np.float64) - x.min(axis=(0, 1))) / ((1 << int(transform[3:])) - 1)
        assert (err.max(axis=(0, 1)) <= steps / 2 * (1 + 1e-5) + 1e-6 * np.abs(x).max(axis=(0, 1))).all()
        assert (y[..., 5] == 2.5).all()
    else:
        rel = 2.0 ** (-11 if transform == "fp16" else -8)
        big = np.abs(x) > 1e-4  # fp16 has subnormals below ~6e-5
        assert (err[big] <= rel * np.abs(x[big])).all()
    assert quantisation_error(x, transform) == pytest.approx(float(err.max()), rel=1e-6)
    with pytest.raises(ValueError, match="NaN|float32"):
        encode(np.array([[np.nan, 1.0]], np.float32) if transform.startswith("int") else np.zeros((2, 2)), codec)


@pytest.mark.parametrize("codec", ["frames+zstd", "int8+lz4", "bf16+zstd", "steps+zstd"])
def test_corrupt_composite_payloads_raise_value_errors(codec):
    rng = np.random.default_rng(3)
    x = (stacked_rollout(rng, 12, 2, 4, (5, 5), 0.2) if codec.startswith("frames")
         else rng.normal(size=(64, 8)).astype(np.float32))
    buf = encode(x, codec)
    assert decode(buf, x.shape, x.dtype, codec).shape == x.shape
    for bad in (buf[:-1], buf[:3], buf + b"\0", b""):
        with pytest.raises(ValueError):
            decode(bad, x.shape, x.dtype, codec)
    if codec.startswith("frames"):  # a first step flagged as a shifted stack: it has nothing to shift from
        with pytest.raises(ValueError):
            decode(b"\xff" + buf[1:], x.shape, x.dtype, codec)


def test_composite_codecs_in_messages_count_the_bytes_produced():
    rng = np.random.default_rng(4)
    frames = stacked_rollout(rng, 16, 2, 4, (8, 8), 0.05)
    obs = rng.normal(size=(16, 2, 8)).astype(np.float32)
    msg = Message("rollout", {}, {"obs": frames, "final_obs": obs}, {"obs": "frames+zstd", "final_obs": "int8+zstd"})
    blob, sizes = encode_message(msg)
    back, sizes2 = decode_message(blob)
    assert back.arrays["obs"].tobytes() == frames.tobytes() and sizes == sizes2
    assert sizes["observations"] == len(encode(frames, "frames+zstd")) + len(encode(obs, "int8+zstd"))
    with pytest.raises(WireError):
        decode_message(blob[:-5])


@settings(max_examples=60, deadline=None)
@given(T=st.integers(0, 12), k=st.integers(1, 3), S=st.integers(2, 5), resets=st.floats(0, 1), seed=st.integers(0, 99))
def test_property_frames_round_trip(T, k, S, resets, seed):
    x = stacked_rollout(np.random.default_rng(seed), T, k, S, (3, 2), resets)
    assert decode(encode(x, "frames+zstd"), x.shape, x.dtype, "frames+zstd").tobytes() == x.tobytes()


@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=200), codec=st.sampled_from(COMPOSITE_CODECS))
def test_property_arbitrary_bytes_decode_or_raise_value_error(data, codec):
    shape, dtype = ((3, 2, 2, 4), np.uint8) if codec.startswith("frames") else ((6, 3), np.float32)
    try:
        out = decode(data, shape, dtype, codec)
    except ValueError:
        return
    assert out.shape == shape and out.dtype == np.dtype(dtype)
