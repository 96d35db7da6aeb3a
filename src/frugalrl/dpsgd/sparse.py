"""Column-sparse pushes: an update that decays every parameter by one factor and changes a few columns.

Some problems take local steps of the form ``u ← (1 − η) u + η · c`` everywhere plus a change on a few
columns of ``u`` seen as a ``rows × cols`` matrix. SVI for LDA is one (Hoffman, Blei, Wang & Paisley
2013): ``λ ← (1 − η) λ + η λ̂`` where ``λ̂`` equals the topic prior ``c`` off the batch's words. After
``B`` such steps from the pulled ``v`` the update ``w = u − v`` is

    w = (d − 1)(v − c)          off the touched columns, d = Π_b (1 − η_b)
    w[:, J] = (u − v)[:, J]     on the touched columns J

so a worker sends ``d``, ``c``, the column indices ``J`` (int32) and the ``rows × |J|`` *innovation*
``E = u[:, J] − d v[:, J] − (1 − d) c`` (:class:`ColumnUpdate`), which the server turns back into a dense push
(:meth:`ColumnUpdate.dense`) against the ``v`` the worker pulled (``base="pulled"``: exactly DPSGD) or its current
``v`` (``base="current"``: a stale step is still a convex combination, as in gensim's ``LdaMulticore``). A problem
supports it with ``column_shape``, ``decay_target`` and ``column_step`` (:func:`supports_columns`); column pushes
need ``processes == 1`` (racing Hogwild processes would lose decays), and a batch that touches nearly every column
pushes dense instead. On the wire: the ``push`` message with meta ``format="columns"`` (docs/dpsgd.md,
"Column-sparse pushes").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from frugalrl.dpsgd.config import COLUMN_BASES
from frugalrl.wire.message import Message


def supports_columns(problem: Any) -> bool:
    """Whether ``problem`` provides ``column_shape``, ``decay_target`` and ``column_step`` (module docstring)."""
    return all(hasattr(problem, a) for a in ("column_shape", "decay_target")) and callable(
        getattr(problem, "column_step", None)
    )


@dataclass
class ColumnUpdate:
    """``w = (decay − 1)(v − target)`` with the columns ``columns`` replaced by ``values`` (module docstring)."""

    decay: float
    """Product of ``1 − η`` over the local steps."""
    target: float
    """The value the decay pulls every parameter towards (LDA: the topic prior)."""
    columns: np.ndarray
    """Indices of the changed columns, int32, distinct."""
    values: np.ndarray
    """``(u − v)[:, columns]``, float32, ``rows × len(columns)``."""
    shape: tuple[int, int]
    """``(rows, cols)`` of the parameters seen as a matrix."""
    base: str = "pulled"
    """What the decay applies to on the server: ``pulled`` (the worker's ``v``) or ``current`` (module docstring)."""

    def __post_init__(self) -> None:
        if self.base not in COLUMN_BASES:
            raise ValueError(f"ColumnUpdate.base must be one of {COLUMN_BASES}, got {self.base!r}")

    @classmethod
    def from_step(
        cls,
        u: np.ndarray,
        v: np.ndarray,
        shape: tuple[int, int],
        decay: float,
        target: float,
        columns: Any,
        base: str = "pulled",
    ) -> ColumnUpdate:
        """The update of a worker that went from ``v`` to ``u`` (flat) by steps of total ``decay`` that
        changed ``columns`` (any integer sequence, repeats allowed) beyond the decay."""
        cols = np.unique(np.asarray(columns, dtype=np.int64)).astype(np.int32)
        um, vm = u.reshape(shape), v.reshape(shape)
        decayed = decay * vm[:, cols].astype(np.float64) + (1.0 - decay) * target
        values = (um[:, cols] - decayed).astype(np.float32)
        return cls(float(decay), float(target), cols, values, (int(shape[0]), int(shape[1])), base)

    def dense(self, v: np.ndarray) -> np.ndarray:
        """The flat float32 update ``w = (decay − 1)(v − target)`` plus the innovation on the columns, for
        the base parameters ``v`` (flat)."""
        rows, cols = self.shape
        if v.size != rows * cols:
            raise ValueError(f"column update of shape {self.shape} against parameters of size {v.size}")
        w = np.asarray(v, dtype=np.float32).reshape(rows, cols) - np.float32(self.target)
        w *= np.float32(self.decay - 1.0)
        w[:, self.columns] += self.values
        return w.reshape(-1)

    def smaller_than_dense(self) -> bool:
        """Whether this update is worth sending as columns: ``base="current"`` (no dense equivalent), or its
        values and indices take fewer elements than the dense vector (else the worker pushes ``u − v``)."""
        rows, cols = self.shape
        return self.base == "current" or self.columns.size * (rows + 1) < rows * cols

    def message(self, version: int, steps: int, codec: str) -> Message:
        """The ``push`` message carrying this update (values in ``codec``)."""
        meta = {
            "version": version,
            "steps": steps,
            "format": "columns",
            "decay": self.decay,
            "target": self.target,
            "shape": list(self.shape),
            "base": self.base,
        }
        arrays = {"grad/cols": self.columns, "grad/vals": self.values}
        return Message("push", meta, arrays, {"grad/vals": codec})

    @classmethod
    def from_message(cls, msg: Message) -> ColumnUpdate:
        """Parse a column push; ``ValueError`` naming what is missing or inconsistent."""
        try:
            rows, ncols = (int(x) for x in msg.meta["shape"])
            decay, target = float(msg.meta["decay"]), float(msg.meta["target"])
            cols, values = msg.arrays["grad/cols"], msg.arrays["grad/vals"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed column push: {type(e).__name__}: {e}") from None
        cols = np.asarray(cols)
        if cols.ndim != 1 or cols.dtype.kind not in "iu":
            raise ValueError(f"column push: grad/cols must be a flat integer array, got {cols.dtype} {cols.shape}")
        if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= ncols):
            raise ValueError(f"column push: a column index lies outside [0, {ncols})")
        values = np.asarray(values, dtype=np.float32)
        if values.shape != (rows, cols.size):
            raise ValueError(f"column push: grad/vals has shape {values.shape}, expected {(rows, cols.size)}")
        if not (np.isfinite(decay) and np.isfinite(target)):
            raise ValueError("column push: decay and target must be finite")
        base = msg.meta.get("base", "pulled")
        if base not in COLUMN_BASES:
            raise ValueError(f"column push: base must be one of {COLUMN_BASES}, got {base!r}")
        return cls(decay, target, cols.astype(np.int32), values, (rows, ncols), str(base))
