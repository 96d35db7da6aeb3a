"""Post-training quantization of an exported agent graph (AcceRL's "Quantilizer('INT8')", Zhang 2022).

- **int8**: ONNX Runtime static quantization in QDQ form, weights int8 per output channel, activations
  uint8, ranges calibrated (min/max) on recent states of the learner (:func:`quantize_int8`). ONNX
  Runtime turns the QDQ pairs into integer ``QLinearConv``/``MatMulInteger``-style kernels and fuses
  Conv/MatMul + bias + ReLU when the session is created, which is where the speed-up comes from
  (VNNI instructions on CPUs that have them). The graph is about 4x smaller than fp32.
- **fp16**: weights stored as float16 initializers each followed by a ``Cast`` to float
  (:func:`to_fp16`). This halves the bytes sent to workers; compute stays fp32 on a CPU (ONNX Runtime
  folds the casts into fp32 constants when the session is created), so it is not faster.
- **fp32**: the plain exported graph.

The :class:`Quantize` chain stage exports the artifact's module first when needed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from frugalrl.compress.base import Artifact, CompressContext, Compressor
from frugalrl.compress.export import EXAMPLE_STATES, export_onnx
from frugalrl.compress.runtime import Precision, check_precision

CALIBRATION_BATCH = 32
"""States per calibration batch fed to ONNX Runtime's calibrator."""
FP16_MIN_ELEMENTS = 16
"""Initializers with fewer elements stay fp32 in :func:`to_fp16` (scalars, scales: no bytes to save)."""


class _Calibration:
    """An ``onnxruntime.quantization.CalibrationDataReader`` over a batch of states."""

    def __init__(self, input_name: str, states: np.ndarray, batch: int = CALIBRATION_BATCH):
        self._batches: Iterator[dict[str, np.ndarray]] = iter(
            [{input_name: np.ascontiguousarray(states[i : i + batch])} for i in range(0, len(states), batch)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # pragma: no cover - not used by the MinMax calibrator
        raise NotImplementedError


def quantize_int8(
    onnx_bytes: bytes, calibration_obs: torch.Tensor | np.ndarray, per_channel: bool = True
) -> bytes:
    """Statically quantized (QDQ, int8 weights, uint8 activations) copy of the graph ``onnx_bytes``.

    ``calibration_obs`` is a batch of states in the graph input's dtype; activation ranges are their
    min/max. ``per_channel`` quantizes weights per output channel (much more accurate for convolutions).
    The edge layers stay in float (:func:`edge_layers`): the fully connected layers that read raw vector
    observations and those that write the policy's and the critic's outputs, where one uint8 scale over all
    observation features, or over a sharp policy's logits, would be most of the error
    (docs/benchmarks.md#accerl-edge-layers).
    """
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    states = np.asarray(calibration_obs)
    if states.ndim < 2 or states.shape[0] == 0:
        raise ValueError(f"calibration_obs must be a non-empty batch of states, got shape {states.shape}")
    model = onnx.load_from_string(bytes(onnx_bytes))
    input_name = model.graph.input[0].name

    class Reader(_Calibration, CalibrationDataReader):
        pass

    with tempfile.TemporaryDirectory(prefix="frugalrl-quant-") as tmp:
        src, pre, dst = (os.path.join(tmp, n) for n in ("model.onnx", "pre.onnx", "int8.onnx"))
        with open(src, "wb") as out:
            out.write(bytes(onnx_bytes))
        quant_pre_process(src, pre)
        prepared = onnx.load(pre)
        quantize_static(
            pre,
            dst,
            Reader(input_name, states),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            nodes_to_exclude=edge_layers(prepared) + padding_nodes(prepared),
        )
        with open(dst, "rb") as result:
            return result.read()


_LAYERS = ("Gemm", "MatMul", "Conv")


def padding_nodes(model: Any) -> list[str]:
    """Names of the nodes that lay a MultiDiscrete head's logits out in padded rows (Split, Pad, Concat, Unsqueeze,
    Reshape: the graph has a Pad), which :func:`quantize_int8` keeps in float: the padding's −1e9 in a calibrated
    8-bit range would leave every real logit 0."""
    nodes = list(model.graph.node)
    if not any(n.op_type == "Pad" for n in nodes):
        return []
    return [n.name for n in nodes if n.op_type in ("Split", "Pad", "Concat", "Unsqueeze", "Reshape")]


def edge_layers(model: Any) -> list[str]:
    """Names of the fully connected nodes (Gemm, MatMul) of an ONNX model that read the graph's input, or write
    one of its outputs, with no other layer (Gemm, MatMul, Conv) in between: what :func:`quantize_int8` keeps
    in float. A convolution reading frames is not one (its input is 8-bit already)."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    inputs = {i.name for i in graph.input}
    outputs = {o.name for o in graph.output}

    def reaches(start: list[str], step: Any, goal: set[str]) -> bool:
        seen, todo = set(), list(start)
        while todo:
            name = todo.pop()
            if name in goal:
                return True
            if name in seen:
                continue
            seen.add(name)
            for node in step(name):
                if node.op_type not in _LAYERS:
                    todo.extend(node.input if step is _back else node.output)
        return False

    def _back(name: str) -> list[Any]:
        return [producer[name]] if name in producer else []

    def _forward(name: str) -> list[Any]:
        return consumers.get(name, [])

    edges = []
    for node in graph.node:
        if node.op_type in ("Gemm", "MatMul") and (
                reaches([node.input[0]], _back, inputs) or reaches(list(node.output), _forward, outputs)):
            edges.append(node.name)
    return edges


def to_fp16(onnx_bytes: bytes) -> bytes:
    """The graph with its float initializers stored as float16, each cast back to float in the graph.

    Halves the weight bytes; the computation (and the graph's inputs and outputs) stay fp32.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(bytes(onnx_bytes))
    graph = model.graph
    casts = []
    kept = []
    for init in graph.initializer:
        arr = numpy_helper.to_array(init)
        if init.data_type != TensorProto.FLOAT or arr.size < FP16_MIN_ELEMENTS:
            kept.append(init)
            continue
        half_name = f"{init.name}__fp16"
        kept.append(numpy_helper.from_array(arr.astype(np.float16), half_name))
        casts.append(
            helper.make_node("Cast", [half_name], [init.name], to=TensorProto.FLOAT, name=f"{half_name}_cast")
        )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(casts + nodes)
    # Graph inputs that shadow initializers (old exporters) would now lack their initializer.
    inputs = [i for i in graph.input if i.name not in {c.output[0] for c in casts}]
    del graph.input[:]
    graph.input.extend(inputs)
    onnx.checker.check_model(model)
    return model.SerializeToString()


class Quantize(Compressor):
    """Chain stage: post-training quantization of the actor graph to ``precision`` (int8, fp16, fp32).

    Exports ``art.module`` to ONNX first unless the artifact already holds an fp32 graph. int8 is
    calibrated on ``calibration_size`` states drawn (seeded by ``ctx.seed``) from ``ctx.observations``;
    fp16 halves the bytes on the wire but computes in fp32 on a CPU; fp32 is the plain export. ONNX
    Runtime fuses Conv/MatMul + ReLU when the worker creates its session. ``precision`` may be changed
    between builds (``CompressorChain.configure``).
    """

    def __init__(self, precision: Precision = "int8", per_channel: bool = True, calibration_size: int = 256):
        self.precision: Precision = check_precision(precision)
        self.per_channel = bool(per_channel)
        if int(calibration_size) < 1:
            raise ValueError(f"calibration_size must be >= 1, got {calibration_size!r}")
        self.calibration_size = int(calibration_size)

    def apply(self, art: Artifact, ctx: CompressContext) -> Artifact:
        """An artifact holding the quantized graph (``module`` unchanged)."""
        precision = check_precision(self.precision)
        obs = ctx.observations
        if art.onnx is not None and art.precision == "fp32":
            graph = art.onnx
        else:
            graph = export_onnx(art.module, obs[:EXAMPLE_STATES])
        if precision == "int8":
            n = obs.shape[0]
            if n > self.calibration_size:
                rng = np.random.default_rng(ctx.seed)
                idx = np.sort(rng.choice(n, size=self.calibration_size, replace=False))
                states = np.asarray(obs)[idx]
            else:
                states = np.asarray(obs)
            graph = quantize_int8(graph, states, per_channel=self.per_channel)
        elif precision == "fp16":
            graph = to_fp16(graph)
        return Artifact(module=art.module, onnx=graph, precision=precision)

    def describe(self) -> str:
        """The precision: ``int8``, ``fp16`` or ``fp32``."""
        return self.precision
