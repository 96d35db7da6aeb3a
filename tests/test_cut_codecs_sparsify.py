"""Tests of the stateful cut codecs (frugalrl.wire.sparsify): the error-feedback top-percentile sparsifier.

The message format they produce (frugalrl.wire.cut) is tested in test_cut_codecs.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from frugalrl.wire.cut import INDEX_ENCODINGS, VALUE_DTYPES, cut_info, decode_cut, dense_nbytes, topk_count
from frugalrl.wire.sparsify import TopPercentile

pytestmark = pytest.mark.timeout(120)

ALL_INDEX = (*INDEX_ENCODINGS, "auto")


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
