"""Worker-side actors that run an exported ONNX graph with ONNX Runtime (AcceRL's static-graph actor).

An :class:`OnnxPolicy` is an ordinary frugalrl agent: a ``torch.nn.Module`` with ``spec``,
``dist_kind``, ``dist_params(obs)`` and ``value(obs)``. Its only state is the buffer ``model``, a
uint8 tensor holding the serialized ONNX graph (weights included), so it travels to workers as an
ordinary weights message (the graph bytes go raw, whatever the float codec); a worker runs it as an
:class:`~frugalrl.onnxactor.OnnxActor`, without torch. Loading a graph of another size into an
``OnnxPolicy`` replaces the buffer and rebuilds the inference session.

The graph is parsed by ONNX Runtime (protobuf, no pickle). Sessions run on the CPU execution
provider with ``threads`` intra-op threads, one inter-op thread and every graph optimisation
(ONNX Runtime fuses Conv/MatMul + bias + ReLU and folds constants when the session is created).
"""

from __future__ import annotations

import copy
import zlib
from typing import Any, Literal, get_args

import numpy as np
import torch

from frugalrl.dists import KINDS, DistKind
from frugalrl.nets import ActorCritic, PolicySpec
from frugalrl.onnxactor import DIST_OUTPUT, VALUE_OUTPUT, check_graph, graph_bytes, make_session

__all__ = ["DIST_OUTPUT", "PRECISIONS", "VALUE_OUTPUT", "OnnxPolicy", "Precision", "check_precision", "make_session"]

Precision = Literal["fp32", "fp16", "int8"]
"""Precision of an exported graph's weights (what :mod:`frugalrl.compress.quantize` produces)."""
PRECISIONS: tuple[Precision, ...] = get_args(Precision)


def check_precision(precision: str) -> Precision:
    """``precision`` as a :data:`Precision`; ``ValueError`` naming it unless it is fp32, fp16 or int8."""
    for known in PRECISIONS:
        if precision == known:
            return known
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")

class OnnxPolicy(ActorCritic):
    """An agent that runs a serialized ONNX graph (inputs ``obs``; outputs ``dist_params``, ``value``).

    Build it with :meth:`from_bytes` on the learner side; a worker builds an empty one from ``spec``
    and receives the graph through ``load_state_dict`` (directly or as a submodule of another module).
    ``precision`` (fp32, fp16, int8) only describes the graph's weights; it is part of the spec.
    """

    model: torch.Tensor
    """The serialized ONNX graph, zlib-compressed, a 1-D uint8 buffer (empty until weights arrive). What a sync
    sends: a small network's graph is mostly node names and quantization parameters, which compress well
    (sizes: docs/benchmarks.md#accerl-graph-bytes)."""

    def __init__(self, dist_kind: DistKind, precision: Precision = "fp32", threads: int = 1):
        super().__init__()
        if int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
        if dist_kind not in KINDS:
            raise ValueError(f"dist_kind must be one of {KINDS}, got {dist_kind!r}")
        self.dist_kind = dist_kind
        self.precision: Precision = check_precision(precision)
        self.threads = int(threads)
        self.spec = PolicySpec(
            "frugalrl.compress.runtime:OnnxPolicy",
            {"dist_kind": self.dist_kind, "precision": self.precision, "threads": self.threads},
        )
        self.register_buffer("model", torch.zeros(0, dtype=torch.uint8))
        self._session: Any = None
        self._loaded: bytes | None = None
        self._input_name = "obs"
        self._input_dtype = np.dtype(np.float32)
        self._outputs: tuple[str, ...] = ()

    @classmethod
    def from_bytes(
        cls, data: bytes, dist_kind: DistKind, precision: Precision = "fp32", threads: int = 1
    ) -> OnnxPolicy:
        """An agent running the serialized ONNX graph ``data`` (``ValueError`` if it is not one)."""
        policy = cls(dist_kind, precision=precision, threads=threads)
        policy.set_model(data)
        return policy

    # ------------------------------------------------------------------ graph
    @property
    def onnx_bytes(self) -> bytes:
        """The serialized graph this agent runs (empty before weights arrive)."""
        return graph_bytes(self.model.detach().cpu().numpy().tobytes())

    def set_model(self, data: bytes) -> None:
        """Replace the graph with ``data`` and rebuild the session (``ValueError`` if invalid)."""
        data = bytes(data)
        self._build(data)
        self._buffers["model"] = (
            torch.frombuffer(bytearray(zlib.compress(data, 6)), dtype=torch.uint8)
            if data
            else torch.zeros(0, dtype=torch.uint8)
        )

    def _build(self, data: bytes) -> None:
        """Create the session for ``data`` (skipped when it is the graph already loaded)."""
        if data == self._loaded and self._session is not None:
            return
        if not data:
            raise ValueError("OnnxPolicy: empty model bytes; expected a serialized ONNX graph")
        session = make_session(data, self.threads)
        self._input_name, self._input_dtype, self._outputs = check_graph(session)
        self._session, self._loaded = session, data

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Accept a ``model`` tensor of any length: resize the buffer, copy, rebuild the session."""
        key = prefix + "model"
        incoming = state_dict.get(key)
        if incoming is not None:
            if not isinstance(incoming, torch.Tensor) or incoming.dtype != torch.uint8 or incoming.ndim != 1:
                desc = (
                    f"{incoming.dtype} tensor of shape {tuple(incoming.shape)}"
                    if isinstance(incoming, torch.Tensor)
                    else type(incoming).__name__
                )
                raise ValueError(f"OnnxPolicy: {key!r} must be a 1-D uint8 tensor of graph bytes, got {desc}")
            if incoming.shape != self.model.shape:
                self._buffers["model"] = torch.zeros(incoming.shape, dtype=torch.uint8)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if incoming is not None:
            self._build(self.onnx_bytes)

    def __deepcopy__(self, memo: dict[int, Any]) -> OnnxPolicy:
        """A copy with its own session (an ``InferenceSession`` cannot be copied), built from the bytes."""
        new = type(self)(self.dist_kind, precision=self.precision, threads=self.threads)
        memo[id(self)] = new
        if self.model.numel():
            new.set_model(self.onnx_bytes)
        new.train(self.training)
        for name, module in self._modules.items():  # none by default; subclasses may add some
            new._modules[name] = copy.deepcopy(module, memo)
        return new

    # ------------------------------------------------------------------ inference
    def _run(self, output: str, obs: torch.Tensor | np.ndarray) -> torch.Tensor:
        if self._session is None:
            raise ValueError(
                "OnnxPolicy has no graph yet: weights (the 'model' tensor) must be loaded before acting"
            )
        if output not in self._outputs:
            raise ValueError(
                f"this OnnxPolicy's graph has no {output!r} output (outputs: {list(self._outputs)})"
            )
        arr = obs.detach().cpu().numpy() if isinstance(obs, torch.Tensor) else np.asarray(obs)
        arr = np.ascontiguousarray(arr, dtype=self._input_dtype)
        try:
            (out,) = self._session.run([output], {self._input_name: arr})
        except Exception as e:  # onnxruntime's pybind exceptions: wrong rank or shape
            raise ValueError(
                f"OnnxPolicy cannot run on observations of shape {arr.shape}: {type(e).__name__}: {e}"
            ) from e
        return torch.from_numpy(np.asarray(out, dtype=np.float32))

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Distribution parameters (float32), shape ``(batch, *params shape)``, for any batch size."""
        return self._run(DIST_OUTPUT, obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State value (float32), shape ``(batch,)``."""
        return self._run(VALUE_OUTPUT, obs).reshape(-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Same as :meth:`dist_params`."""
        return self.dist_params(obs)

    def extra_repr(self) -> str:
        """Kind, precision, threads and graph size."""
        return f"dist_kind={self.dist_kind}, precision={self.precision}, threads={self.threads}, bytes={self.model.numel()}"
