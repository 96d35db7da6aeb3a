"""An exported ONNX graph as a worker's actor, without PyTorch: the session, and :class:`OnnxActor`.

:class:`~frugalrl.compress.runtime.OnnxPolicy` (AcceRL's static-graph actor) is a ``torch.nn.Module`` on the learner;
its only state is the zlib-compressed graph. A worker that gets one builds an :class:`OnnxActor` from its spec and
that buffer instead, runs the graph with ONNX Runtime and samples with :func:`frugalrl.npactor.sample`, so a
compressed actor's process never imports torch. This module imports neither torch nor ONNX Runtime until a
session is made (:func:`make_session`).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from frugalrl.npactor import log_prob, sample

ONNX_FACTORY = "frugalrl.compress.runtime:OnnxPolicy"
"""The spec factory of :class:`~frugalrl.compress.runtime.OnnxPolicy`."""
DIST_OUTPUT = "dist_params"
"""Name of the graph output holding the distribution parameters."""
VALUE_OUTPUT = "value"
"""Name of the graph output holding the state value."""

# ONNX Runtime's input type names -> NumPy dtypes the graph input may expect.
ORT_DTYPES: dict[str, np.dtype] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(bool)": np.dtype(np.bool_),
}


def make_session(data: bytes, threads: int = 1) -> Any:
    """An ``onnxruntime.InferenceSession`` over the serialized graph ``data``.

    CPU execution provider, ``threads`` intra-op threads, one inter-op thread, sequential execution,
    ``ORT_ENABLE_ALL`` graph optimisation. Raises ``ValueError`` if ``data`` is not a valid ONNX model.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(bytes(data), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own pybind exception types
        raise ValueError(f"not a valid ONNX model ({len(data)} bytes): {type(e).__name__}: {e}") from e


def graph_bytes(packed: bytes) -> bytes:
    """The serialized graph of an ``OnnxPolicy``'s ``model`` buffer (zlib-compressed, or stored plain by
    checkpoints written before compression)."""
    try:
        return zlib.decompress(packed) if packed else packed
    except zlib.error:
        return packed


def check_graph(session: Any) -> tuple[str, np.dtype, tuple[str, ...]]:
    """The input name, input dtype and output names of an actor's graph (``ValueError`` unless it has one input
    and a :data:`DIST_OUTPUT` output of a supported type)."""
    inputs = session.get_inputs()
    outputs = tuple(o.name for o in session.get_outputs())
    if len(inputs) != 1 or DIST_OUTPUT not in outputs:
        raise ValueError(
            f"OnnxPolicy needs a graph with one input and a {DIST_OUTPUT!r} output; got inputs "
            f"{[i.name for i in inputs]} and outputs {list(outputs)} (use frugalrl.compress.export.export_onnx)"
        )
    dtype = ORT_DTYPES.get(inputs[0].type)
    if dtype is None:
        raise ValueError(f"OnnxPolicy: unsupported graph input type {inputs[0].type}")
    return inputs[0].name, dtype, outputs


def runs_on_onnxruntime(spec: Mapping[str, Any]) -> bool:
    """Whether a policy spec is an ``OnnxPolicy``'s (which a worker runs as an :class:`OnnxActor`)."""
    return spec.get("factory") == ONNX_FACTORY


ACTING_LIKE: dict[str, tuple[tuple[int, ...], np.dtype]] = {"model": ((0,), np.dtype(np.uint8))}
"""An ``OnnxPolicy``'s acting state as a weights message is decoded against (the buffer travels as it is, of any
length)."""


class OnnxActor:
    """The actor of an ``OnnxPolicy``: its graph in an ONNX Runtime session, sampled in numpy."""

    def __init__(self, graph: bytes, kind: str, threads: int = 1) -> None:
        if not graph:
            raise ValueError("OnnxPolicy: empty model bytes; expected a serialized ONNX graph")
        self.kind = kind
        self.session = make_session(graph, threads)
        self.input_name, self.input_dtype, _ = check_graph(self.session)

    @staticmethod
    def acting_like(spec: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What a weights message for ``spec`` is decoded against (:data:`ACTING_LIKE`, whatever the spec)."""
        return dict(ACTING_LIKE)

    @classmethod
    def from_state(cls, spec: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> OnnxActor:
        """The actor of the ``OnnxPolicy`` ``spec`` describes, running the graph in ``state["model"]``."""
        kw = spec["kwargs"]
        return cls(graph_bytes(np.asarray(state["model"], dtype=np.uint8).tobytes()), kw["dist_kind"],
                   int(kw.get("threads", 1)))

    def params(self, obs: np.ndarray) -> np.ndarray:
        """The distribution parameters (float32), as ``OnnxPolicy.dist_params`` gives them."""
        arr = np.ascontiguousarray(obs, dtype=self.input_dtype)
        (out,) = self.session.run([DIST_OUTPUT], {self.input_name: arr})
        return np.asarray(out, dtype=np.float32)

    def sample(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One action per row (:func:`frugalrl.npactor.sample`)."""
        return sample(self.kind, params, rng)

    def log_prob(self, params: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log π(a | params) of each row's action (:func:`frugalrl.npactor.log_prob`)."""
        return log_prob(self.kind, params, actions)
