"""Bytes a split-model PPO run puts on the wire, predicted from its config (``frugalrl pipeline-bytes``).

Two uses:

- :func:`predict_run` gives, message by message, what :mod:`frugalrl.pipeline` sends in a
  run (by kind and direction, headers and length prefixes included). For dense gradients and for sparse
  ones with ``coo16`` or ``bitmask`` indices it is exact, and a test checks it against the bytes a real
  two-process run measured. ``gap``/``auto`` index sizes depend on where the large gradients fall;
  the prediction then uses the expected size for uniformly scattered positions.
  Truncated episodes add their final observations' features: pass the run's ``details.truncation_bootstraps``.
- :func:`table_one` reproduces Table I of the paper (cloud setup vs pipeline) and extends it with our
  codecs. The paper counts elements, then bytes at about **2 bytes per element** (14.7 B elements ≈ 28 GB,
  32.7 B ≈ 66 GB), and its element counts do not follow from its own settings: 100 × 4096 × 36,864 is
  15.1 B, and 100 × 10 × 32 × 128 × 4096 × 2 is 33.6 B. We print both the formulas' values and the
  paper's, with the byte size per element stated. The paper's pipeline row also leaves out the rollout
  traffic (features 0→1 for every env step, actions back), which we add as a separate row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from frugalrl.wire import cut
from frugalrl.wire.meter import DOWN, UP
from frugalrl.wire.torchdist import LENGTH_PREFIX_BYTES


@dataclass
class _Tally:
    by: dict[tuple[str, str], float]

    def message(self, direction: str, kind: str, nbytes: float, ndim: int, count: float = 1) -> None:
        header = cut.header_nbytes(ndim)
        self.by[(direction, kind)] = self.by.get((direction, kind), 0) + count * (nbytes - header)
        self.by[(direction, "control")] = self.by.get((direction, "control"), 0) + count * (header + LENGTH_PREFIX_BYTES)

    def raw(self, direction: str, kind: str, nbytes: float) -> None:
        self.by[(direction, kind)] = self.by.get((direction, kind), 0) + nbytes + LENGTH_PREFIX_BYTES


def gradient_message_nbytes(cfg: Any, feature_dim: int, dense: bool) -> float:
    """Bytes of one cut-gradient message (exact, except expected sizes for 'gap'/'auto' indices)."""
    shape = (cfg.minibatch_size, feature_dim)
    if dense or cfg.cut == "dense":
        return cut.dense_nbytes(shape, cfg.cut_dense_dtype)
    nnz = cut.topk_count(math.prod(shape), cfg.cut_percentile)
    if cfg.cut_index in ("coo16", "bitmask"):
        return cut.sparse_nbytes(shape, nnz, cfg.cut_index, cfg.cut_values)
    options = [cut.expected_gap_nbytes(shape, nnz, cfg.cut_values)]
    if cfg.cut_index == "auto":
        options += [cut.sparse_nbytes(shape, nnz, enc, cfg.cut_values) for enc in ("coo16", "bitmask")]
    return min(options)


def predict_run(cfg: Any, feature_dim: int, action_dim: int, handshake_nbytes: tuple[int, int] = (0, 0),
                stats_len: int = 8, truncations: Sequence[int] = ()) -> dict[str, Any]:
    """Bytes of a pipeline-PPO training run with config ``cfg`` (a ``PipelinePPOConfig``).

    ``feature_dim``: width of the cut; ``action_dim``: floats per action (1 for Discrete).
    ``handshake_nbytes``: the JSON bytes of the opening exchange (stage 0's, stage 1's), which depend on
    the env's description; ``stats_len``: floats in the loss-statistics vector stage 1 sends after each
    update (:func:`frugalrl.pipeline.predict_bytes` fills both in). ``truncations``: truncated steps per rollout
    (the run's ``details.truncation_bootstraps``; empty for none): stage 0 sends their final observations'
    features in one more message after each rollout that has any.
    Returns ``{"bytes": {kind: n, "total": n}, "up": {...}, "down": {...}, "exact": bool}``; with
    ``activations_sparse`` the activation bytes are an upper bound (the dense size).
    """
    tally = _Tally({})
    N, T = cfg.num_envs, cfg.num_steps
    b, epochs, mbs = cfg.minibatch_size, cfg.update_epochs, cfg.num_minibatches
    tally.raw(UP, "control", handshake_nbytes[0])
    tally.raw(DOWN, "control", handshake_nbytes[1])
    steps = 0
    for it in range(cfg.iterations):
        tally.message(UP, "activations", cut.dense_nbytes((N, feature_dim), cfg.activations), 2, count=T)
        tally.message(DOWN, "actions", cut.dense_nbytes((N, action_dim), "fp32"), 2, count=T)
        tally.message(UP, "rewards", cut.dense_nbytes((T, N, 3), "fp32"), 3)
        tally.message(UP, "activations", cut.dense_nbytes((N, feature_dim), cfg.activations), 2)
        k = truncations[it] if it < len(truncations) else 0
        if k:
            tally.message(UP, "activations", cut.dense_nbytes((k, feature_dim), cfg.activations), 2)
        steps += N * T
        dense = cfg.cut == "dense" or steps <= cfg.warmup_timesteps
        tally.message(UP, "activations", cut.dense_nbytes((b, feature_dim), cfg.activations), 2, count=epochs * mbs)
        tally.message(DOWN, "gradients", gradient_message_nbytes(cfg, feature_dim, dense), 2, count=epochs * mbs)
        tally.message(DOWN, "control", cut.dense_nbytes((stats_len,), "fp32"), 1)
    up = {k: v for (d, k), v in tally.by.items() if d == UP}
    down = {k: v for (d, k), v in tally.by.items() if d == DOWN}
    kinds = sorted(set(up) | set(down))
    by_kind = {k: up.get(k, 0) + down.get(k, 0) for k in kinds}
    # Sparse activations depend on how many features are zero: the dense size is then an upper bound.
    exact_grads = cfg.cut == "dense" or cfg.cut_index in ("coo16", "bitmask") or steps <= cfg.warmup_timesteps
    exact = exact_grads and not getattr(cfg, "activations_sparse", False)
    return {"bytes": {**by_kind, "total": sum(by_kind.values())}, "up": up, "down": down, "exact": exact}


# ------------------------------------------------------------------------------------------- Table I

@dataclass(kw_only=True)
class TableOneConfig:
    """The settings Table I is computed from (the paper's, by default)."""

    iterations: int = 100
    """PPO iterations."""
    steps: int = 4096
    """Env steps per iteration."""
    epochs: int = 10
    """Update epochs per iteration."""
    minibatches: int = 32
    """Minibatches per epoch."""
    obs_shape: list[int] = field(default_factory=lambda: [4, 96, 96])
    """Shape of one observation (what a cloud setup ships per env step)."""
    feature_dim: int = 4096
    """Width of the cut."""
    percentiles: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """p of the sparse rows."""


def table_one(cfg: TableOneConfig | None = None) -> list[dict[str, Any]]:
    """Rows of Table I (cloud vs pipeline) and of the same table for our codecs.

    Each row: ``setup``, ``elements`` (tensor elements moved, where that is meaningful), ``bytes_per_element``
    (as used for the row), ``bytes``, ``relative`` (to the first row, the paper's cloud setup at 2 B per
    element) and ``note``. Sparse rows use :func:`frugalrl.wire.cut.expected_gap_nbytes` for 'gap' indices.
    """
    c = cfg or TableOneConfig()
    iterations, steps, epochs, minibatches = c.iterations, c.steps, c.epochs, c.minibatches
    obs_shape, feature_dim, percentiles = tuple(c.obs_shape), c.feature_dim, tuple(c.percentiles)
    mb = steps // minibatches
    obs = math.prod(obs_shape)
    cloud_el = iterations * steps * obs
    cut_msgs = iterations * epochs * minibatches
    pipe_el = cut_msgs * mb * feature_dim * 2
    rollout_el = iterations * steps * feature_dim
    rows: list[dict[str, Any]] = []

    def row(setup: str, nbytes: float, note: str, elements: float | None = None, bpe: float | None = None) -> None:
        rows.append({"setup": setup, "elements": elements, "bytes_per_element": bpe, "bytes": nbytes, "note": note})

    row("cloud (paper's figure)", 28e9, "paper: 14.7 B elements ≈ 28 GB", 14.7e9, 2)
    row("pipeline (paper's figure)", 66e9, "paper: 32.7 B elements ≈ 66 GB", 32.7e9, 2)
    row("cloud, formula, 2 B/element", cloud_el * 2, "100×4096×4×96×96 elements at 2 B", cloud_el, 2)
    row("pipeline, formula, 2 B/element", pipe_el * 2, "activations + gradients, training only", pipe_el, 2)
    row("cloud, raw uint8 frames", cloud_el * 1, "what a cloud setup really ships (1 B/pixel)", cloud_el, 1)
    row("pipeline, fp32 both ways", pipe_el * 4, "training only, dense fp32", pipe_el, 4)
    row("pipeline rollout features, bf16", rollout_el * 2, "left out by the paper: 4096 features per env step",
        rollout_el, 2)
    shape = (mb, feature_dim)
    act_bf16 = cut_msgs * cut.dense_nbytes(shape, "bf16")
    grad_fp32 = cut_msgs * cut.dense_nbytes(shape, "fp32")
    row("ours: activations bf16, gradients dense fp32", act_bf16 + grad_fp32, "training traffic, headers included")
    grad_rows = []
    for p in percentiles:
        nnz = cut.topk_count(math.prod(shape), p)
        for enc in ("coo16", "bitmask", "gap"):
            size = (cut.expected_gap_nbytes(shape, nnz, "bf16") if enc == "gap"
                    else cut.sparse_nbytes(shape, nnz, enc, "bf16"))
            grads = cut_msgs * size
            row(f"ours: activations bf16, gradients p={p} {enc}+bf16", act_bf16 + grads,
                "training traffic, headers included")
            grad_rows.append((f"  gradients only, p={p} {enc}+bf16", grads, f"{grads / grad_fp32:.3f}× dense fp32"))
    for setup, nbytes, note in grad_rows:
        row(setup, nbytes, note)
    base = rows[0]["bytes"]
    for r in rows:
        r["relative"] = r["bytes"] / base
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of :func:`table_one` rows."""
    lines = [f"{'setup':58s} {'elements':>10s} {'B/el':>5s} {'bytes':>10s} {'rel.':>6s}  note"]
    for r in rows:
        el = f"{r['elements'] / 1e9:.1f} B" if r["elements"] else ""
        bpe = f"{r['bytes_per_element']:g}" if r["bytes_per_element"] else ""
        lines.append(f"{r['setup']:58s} {el:>10s} {bpe:>5s} {r['bytes'] / 1e9:8.2f} GB {r['relative']:6.2f}×  {r['note']}")
    return "\n".join(lines)
