"""Stateful cut codecs: which entries of a cut gradient to send, and what to keep for later.

:mod:`frugalrl.wire.cut` defines the messages; this module decides what goes into them, step after
step:

- :class:`DenseCut`: every entry every step (a fixed value dtype), the stateless baseline;
- :class:`TopPercentile`: the error-feedback top-percentile sparsifier of sparse cut-gradient
  pipeline PPO (accumulate ``G <- G + grad``, send the entries with the largest ``|G|``, keep the
  rest in ``G`` for later steps, send densely during a warm start), with one accumulator per
  position (the paper's) or one residual row per sample key.

Both return the bytes of one cut message per call, which :func:`frugalrl.wire.cut.decode_cut`
reads back; their sizes follow :func:`~frugalrl.wire.cut.dense_nbytes` and
:func:`~frugalrl.wire.cut.sparse_nbytes` exactly.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch

from frugalrl.wire.cut import (
    all_finite,
    as_float32,
    check_index_encoding,
    check_shape,
    check_value_dtype,
    dense_message,
    dense_nbytes,
    encode_dense,
    int64_vector,
    quantize,
    sparse_message,
    topk_count,
)


def _top_k(mag: np.ndarray, k: int, part: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sorted positions of the ``k`` largest of ``mag`` (``0 < k < mag.size``; ties: lowest positions).

    ``part`` and ``mask`` are scratch arrays of ``mag``'s size (float32 and bool).
    """
    cut = mag.size - k
    np.copyto(part, mag)
    part.partition(cut)
    tau = part[cut]  # the k-th largest
    np.greater(mag, tau, out=mask)
    missing = k - int(np.count_nonzero(mask))
    if missing > 0:
        mask[np.flatnonzero(mag == tau)[:missing]] = True
    return np.flatnonzero(mask)


class DenseCut:
    """Stateless dense codec (``fp32`` | ``bf16`` | ``fp16``): :func:`encode_dense` with a fixed dtype."""

    def __init__(self, dtype: str = "fp32") -> None:
        check_value_dtype(dtype)
        self.dtype = dtype

    def encode(self, x: torch.Tensor) -> bytes:
        """The dense cut message of ``x``."""
        return encode_dense(x, self.dtype)

    def nbytes(self, shape: Any) -> int:
        """Exact size of the message of a tensor of ``shape``."""
        return dense_nbytes(shape, self.dtype)

    def __repr__(self) -> str:
        return f"DenseCut({self.dtype!r})"


class TopPercentile:
    """Error-feedback top-percentile sparsifier (eq. 3-6 of the paper).

    Each :meth:`encode` accumulates ``G = residual + grad`` (eq. 3), sends the ``k = topk_count(G.numel(), p)``
    entries of largest ``|G|`` as a sparse message (eq. 4-5) and keeps in the residual ``G`` minus what the receiver
    decodes (eq. 6). Exactly ``k`` entries (the paper's ``|G| >= quantile(|G|, p)`` without ties; ties go to the
    lowest flat indices) keep message sizes deterministic. The selection is NumPy's O(n) ``partition``: the
    entries ``torch.topk`` would pick, for less CPU, with the indices already sorted.

    - Position mode (``keys=None``, the paper's): one accumulator of the gradient's shape; a
      gradient of another shape raises :class:`ValueError`.
    - Keyed mode (``keys``: 1-D unique integers, one per row of ``grad``): per-sample error feedback; a
      sample's unsent gradient is replayed when that sample recurs (e.g. next epoch), instead of being added
      to whatever sample next sits at the same row. Rows keep one shape; one instance uses one mode.
    - Warm start: while ``steps < warmup_steps``, or with ``dense=True``, ``G`` is sent densely in
      ``warmup_dtype`` and the residual becomes its rounding error (0 for ``fp32``).

    With ``keep_rounding_error=True`` (default) the residual at a sent entry is the rounding error of its value,
    so ``decode_cut(msg) + residual_after == residual_before + grad`` holds *exactly* in float32 (a value and its
    ``bf16``/``fp16`` rounding are within a factor 2, so their difference is exact; only saturation breaks it).
    With ``False`` the residual at sent entries is 0, as in eq. 6.

    The accumulators are float32 CPU arrays; gradients on another device are copied to the CPU.
    """

    def __init__(
        self,
        p: float,
        warmup_steps: int = 0,
        index: str = "auto",
        values: str = "bf16",
        warmup_dtype: str = "fp32",
        keep_rounding_error: bool = True,
    ) -> None:
        p = float(p)
        if not 0.0 < p < 1.0:
            raise ValueError(f"percentile p must be in (0, 1), got {p}")
        warmup_steps = operator.index(warmup_steps)
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        check_index_encoding(index)
        check_value_dtype(values)
        check_value_dtype(warmup_dtype, "warmup dtype")
        self.p = p
        self.warmup_steps = warmup_steps
        self.index = index
        self.values = values
        self.warmup_dtype = warmup_dtype
        self.keep_rounding_error = bool(keep_rounding_error)
        self.reset()

    def reset(self) -> None:
        """Forget every residual and the step count (the warm start runs again)."""
        self.steps = 0
        self.last_nnz = 0
        self.last_dense = False
        #: The index encoding of the last sparse message (``None`` before one, or after a dense one).
        self.last_index: str | None = None
        self._mode: str | None = None  # "position" | "keyed"
        self._acc: np.ndarray | None = None
        self._row_shape: tuple[int, ...] | None = None
        self._keys = np.zeros(0, dtype=np.int64)  # known keys, sorted
        self._slots = np.zeros(0, dtype=np.int64)  # storage row of each key in self._keys
        self._rows: np.ndarray = np.zeros((0,), dtype=np.float32)  # (capacity, *row_shape)
        # Scratch arrays survive a reset: they hold no state, and reallocating them costs page faults.
        self._buffers: dict[str, np.ndarray] = getattr(self, "_buffers", {})

    def _scratch(self, name: str, n: int, dtype: Any) -> np.ndarray:
        """A reusable flat scratch array of ``n`` elements (contents undefined)."""
        buf = self._buffers.get(name)
        if buf is None or buf.size != n or buf.dtype != dtype:
            buf = self._buffers[name] = np.empty(n, dtype=dtype)
        return buf

    # -- keyed storage ------------------------------------------------------------------------

    def _lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, found)`` of ``keys`` in the key table (slot -1 where not found)."""
        if self._keys.size == 0:
            return np.full(keys.size, -1, dtype=np.int64), np.zeros(keys.size, dtype=bool)
        # A key above every known key lands past the end: clamp, and the comparison fails.
        pos = np.minimum(np.searchsorted(self._keys, keys), self._keys.size - 1)
        found = self._keys[pos] == keys
        return np.where(found, self._slots[pos], -1), found

    def _add_keys(self, keys: np.ndarray, slots: np.ndarray, found: np.ndarray) -> np.ndarray:
        """Storage rows of ``keys`` (``slots``, ``found`` from :meth:`_lookup`), giving new keys
        zeroed rows (growing the storage)."""
        new = ~found
        if new.any():
            used = self._keys.size
            m = int(new.sum())
            cap = self._rows.shape[0]
            if used + m > cap:
                assert self._row_shape is not None
                grown = np.zeros((max(used + m, 2 * cap), *self._row_shape), dtype=np.float32)
                grown[:cap] = self._rows
                self._rows = grown
            fresh = np.arange(used, used + m, dtype=np.int64)
            self._rows[fresh] = 0.0
            slots[new] = fresh
            all_keys = np.concatenate([self._keys, keys[new]])
            all_slots = np.concatenate([self._slots, fresh])
            order = np.argsort(all_keys, kind="stable")
            self._keys, self._slots = all_keys[order], all_slots[order]
        return slots

    def _check_keys(self, keys: Any, rows: int | None) -> np.ndarray:
        k = int64_vector(keys, "keys")
        if rows is not None and k.size != rows:
            raise ValueError(f"{k.size} keys for a gradient of {rows} rows")
        if np.unique(k).size != k.size:
            raise ValueError("keys must be unique")
        return k

    # -- API ------------------------------------------------------------------------------------

    def _check_mode(self, mode: str) -> None:
        if self._mode is not None and self._mode != mode:
            raise ValueError(
                f"this TopPercentile is in {self._mode} mode; call reset() before using {mode} mode"
            )

    def encode(self, grad: torch.Tensor, keys: torch.Tensor | None = None, dense: bool = False) -> bytes:
        """Accumulate ``grad`` and return the message to send (sparse, or dense in the warm start).

        Raises :class:`ValueError` on non-finite values, a changed shape, or bad ``keys``; the
        state is left untouched then.
        """
        g = as_float32(grad)
        dims = check_shape(g.shape)
        # G is built in a scratch buffer (reused across calls: fresh megabyte-sized arrays cost
        # more in page faults than the arithmetic) and becomes the state only once all went well.
        G = self._scratch("G", g.size, np.float32).reshape(g.shape)
        # Keyed mode: (keys, their storage slots, which of them are known), registered at the end.
        keyed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if keys is None:
            if self._acc is not None and self._acc.shape != g.shape:
                raise ValueError(
                    f"cut gradient shape changed from {tuple(self._acc.shape)} to {tuple(g.shape)}; call reset() first"
                )
            mode = "position"
            self._check_mode(mode)
            if self._acc is None:
                np.copyto(G, g)
            else:
                with np.errstate(over="ignore", invalid="ignore"):  # checked just below
                    np.add(self._acc, g, out=G)
        else:
            key_arr = self._check_keys(keys, g.shape[0])
            if self._row_shape is not None and self._row_shape != g.shape[1:]:
                raise ValueError(
                    f"cut gradient row shape changed from {self._row_shape} to {tuple(g.shape[1:])}; call reset() first"
                )
            mode = "keyed"
            self._check_mode(mode)
            # New keys are only registered once the message is built (a failure leaves no trace).
            slots, found = self._lookup(key_arr)
            keyed = (key_arr, slots, found)
            if found.all():
                np.take(self._rows, slots, axis=0, out=G, mode="clip")  # slots are valid: no bounds checks
            else:
                G.fill(0.0)
                if found.any():
                    G[found] = self._rows[slots[found]]
            with np.errstate(over="ignore", invalid="ignore"):  # checked just below
                G += g
        # One pass over G covers g too (NaN and inf propagate); g is only scanned to name the fault.
        if not all_finite(G):
            if not all_finite(g):
                raise ValueError("cut gradient contains non-finite values")
            raise ValueError("cut gradient plus residual overflows float32")
        flat = G.reshape(-1)
        send_dense = dense or self.steps < self.warmup_steps
        if send_dense:
            payload, decoded = quantize(flat, self.warmup_dtype)
            msg = dense_message(payload, dims, self.warmup_dtype)
            if self.keep_rounding_error and self.warmup_dtype != "fp32":
                flat -= decoded
            else:
                flat[:] = 0.0
            self.last_nnz = flat.size
            self.last_index = None
        else:
            idx = self._select(flat)
            sent = flat[idx]
            payload, decoded = quantize(sent, self.values)
            msg, self.last_index = sparse_message(idx, payload, dims, self.index, self.values)
            flat[idx] = sent - decoded if self.keep_rounding_error else 0.0
            self.last_nnz = idx.size
        if keyed is None:  # swap: the old accumulator becomes the next scratch buffer
            old = self._acc
            self._acc = G
            if old is None:
                del self._buffers["G"]
            else:
                self._buffers["G"] = old.reshape(-1)
        else:
            if self._row_shape is None:
                self._row_shape = tuple(g.shape[1:])
                self._rows = np.zeros((0, *self._row_shape), dtype=np.float32)
            key_arr, slots, found = keyed
            slots = self._add_keys(key_arr, slots, found)  # may grow (replace) self._rows
            self._rows[slots] = G
        self._mode = mode
        self.last_dense = send_dense
        self.steps += 1
        return msg

    def _select(self, flat: np.ndarray) -> np.ndarray:
        """Sorted flat indices of the ``topk_count`` entries of largest magnitude (ties: lowest index)."""
        n = flat.size
        k = topk_count(n, self.p)
        if k >= n:
            return np.arange(n, dtype=np.int64)
        mag = np.abs(flat, out=self._scratch("mag", n, np.float32))
        mask = self._scratch("mask", n, np.bool_)
        if n >= 1 << 16:
            # Pre-filter: a threshold from a strided sample keeps about 1.3 k candidates, and the
            # exact selection runs on those only. Whenever the top k are all candidates (at least
            # k of them) the result is the same as without it; otherwise fall through.
            sample = mag[::31]
            j = int(sample.size - 1.3 * k * sample.size / n)
            if j > 0:
                low = np.partition(sample, j)[j]
                cand = np.flatnonzero(np.greater_equal(mag, low, out=mask))
                if cand.size >= k:
                    cand_mag = mag[cand]
                    return cand[_top_k(cand_mag, k, np.empty_like(cand_mag), np.empty(cand.size, bool))]
        return _top_k(mag, k, self._scratch("part", n, np.float32), mask)

    def residual(self, keys: torch.Tensor | None = None) -> torch.Tensor:
        """A copy of the current accumulator.

        Position mode: the whole accumulator (``keys`` must be ``None``). Keyed mode: the rows of
        ``keys`` (zeros for unseen keys), or with ``keys=None`` every stored row in increasing key
        order. Before the first :meth:`encode` (or after :meth:`reset`): an empty tensor.
        """
        if self._mode is None:
            return torch.zeros(0)
        if self._mode == "position":
            if keys is not None:
                raise ValueError("this TopPercentile is in position mode; residual() takes no keys")
            assert self._acc is not None
            return torch.from_numpy(self._acc.copy())
        if keys is None:
            return torch.from_numpy(self._rows[self._slots].copy())
        k = self._check_keys(keys, None)
        slots, found = self._lookup(k)
        assert self._row_shape is not None
        out = np.zeros((k.size, *self._row_shape), dtype=np.float32)
        out[found] = self._rows[slots[found]]
        return torch.from_numpy(out)

    def __repr__(self) -> str:
        return (
            f"TopPercentile(p={self.p}, warmup_steps={self.warmup_steps}, index={self.index!r}, "
            f"values={self.values!r}, warmup_dtype={self.warmup_dtype!r}, "
            f"keep_rounding_error={self.keep_rounding_error})"
        )
