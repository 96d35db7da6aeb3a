"""Actors on ONNX Runtime, without PyTorch: the session, :class:`OnnxActor` and :class:`OnnxCnnActor`.

:class:`~frugalrl.compress.runtime.OnnxPolicy` (AcceRL's static-graph actor) is a ``torch.nn.Module`` on the learner;
its only state is the zlib-compressed graph. A worker that gets one builds an :class:`OnnxActor` from its spec and
that buffer instead, runs the graph with ONNX Runtime and samples with :func:`frugalrl.npactor.sample`, so a
compressed actor's process never imports torch. A CNN agent (Atari's Nature-CNN, MinAtar's grid CNN) reaches a
worker as its spec and weights like any other; the worker builds the actor's graph from them (:func:`cnn_graph`)
and runs it as an :class:`OnnxCnnActor`, faster than PyTorch or numpy there. This module imports neither torch nor ONNX Runtime until a
session is made (:func:`make_session`).
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from frugalrl.action_heads import action_head, head_params
from frugalrl.npactor import NumpyActor, SampledActor

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


def make_session(data: bytes, threads: int = 1, weights: Mapping[str, np.ndarray] | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` over the serialized graph ``data``, with ``weights`` for its initializers
    stored as external data (:func:`cnn_graph`'s: no copy of them through protobuf, ~25 MB less for the Nature-CNN).

    CPU execution provider, ``threads`` intra-op threads, one inter-op thread, sequential execution,
    ``ORT_ENABLE_ALL`` graph optimisation. Raises ``ValueError`` if ``data`` is not a valid ONNX model.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    arrays = [np.ascontiguousarray(a) for a in (weights or {}).values()]  # alive until the session has copied them
    if arrays:
        opts.add_external_initializers(list(weights or {}), [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays])
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(bytes(data), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own pybind exception types
        raise ValueError(f"not a valid ONNX model ({len(data)} bytes): {type(e).__name__}: {e}") from e
    del arrays
    return session


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


class OnnxActor(SampledActor):
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


CNN_FACTORY = "frugalrl.nets:NatureCNNActorCritic"
"""The spec factory of :class:`~frugalrl.nets.NatureCNNActorCritic` (the Nature-CNN, and MinAtar's grid CNN)."""
# Its (kernel, stride) pairs, channels and hidden width where a spec names none (NatureCNNActorCritic's defaults).
NATURE_CONVS, NATURE_CHANNELS, NATURE_HIDDEN = ((8, 4), (4, 2), (3, 1)), (32, 64, 64), 512


def cnn_on_onnxruntime(spec: Mapping[str, Any]) -> bool:
    """Whether a worker runs the agent of ``spec`` as an :class:`OnnxCnnActor`: a
    :class:`~frugalrl.nets.NatureCNNActorCritic` (on frames or grids alike: ONNX Runtime's convolutions take a
    half to a quarter of PyTorch's time on a worker's few observations, docs/benchmarks.md#actor-speed)."""
    return spec.get("factory") == CNN_FACTORY


def cnn_layout(kw: Mapping[str, Any]) -> tuple[list[tuple[int, int, int, int]], tuple[int, int, int]]:
    """(in channels, out channels, kernel, stride) of each convolution of a CNN spec's kwargs, and the (C, H, W)
    they leave (no padding, as :func:`frugalrl.nets.conv_layers`)."""
    shape = [int(x) for x in kw["obs_shape"]]
    c, h, w = (shape[2], shape[0], shape[1]) if kw.get("channels_last", False) else shape
    layout = []
    for out, (kernel, stride) in zip(kw.get("channels", NATURE_CHANNELS), kw.get("convs") or NATURE_CONVS,
                                     strict=False):
        layout.append((c, int(out), int(kernel), int(stride)))
        c, h, w = int(out), (h - int(kernel)) // int(stride) + 1, (w - int(kernel)) // int(stride) + 1
    return layout, (c, h, w)


def cnn_acting_like(spec: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The keys, shapes and dtypes of :func:`frugalrl.nets.acting_state` of the CNN agent ``spec`` builds, without
    building it: what a weights message is decoded against."""
    kw, f32 = spec["kwargs"], np.dtype(np.float32)
    action = kw["action"]
    out = action_head(action)[1]
    layout, (c, h, w) = cnn_layout(kw)
    like: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for i, (c_in, c_out, k, _) in enumerate(layout):
        like[f"trunk.{2 * i}.weight"] = ((c_out, c_in, k, k), f32)
        like[f"trunk.{2 * i}.bias"] = ((c_out,), f32)
    fc, hidden = f"trunk.{2 * len(layout) + 1}", int(kw.get("hidden", NATURE_HIDDEN))  # after the ReLUs, Flatten
    like.update({f"{fc}.weight": ((hidden, c * h * w), f32), f"{fc}.bias": ((hidden,), f32),
                 "actor.weight": ((out, hidden), f32), "actor.bias": ((out,), f32)})
    if action["type"] == "box":
        like["log_std"] = ((out,), f32)
    return like


def cnn_graph(spec: Mapping[str, Any], input_dtype: np.dtype) -> bytes:
    """The ONNX graph of the actor of the CNN agent ``spec`` describes, its weights left out (initializers of the
    acting state's names, shapes and dtypes whose data a session is given: :meth:`OnnxCnnActor.params`):
    ``input_dtype`` frames in, scaled and (channels last) transposed as the module does, its convolutions and ReLUs,
    the fully connected layer, the actor head out (logits, or the Gaussian's mean). A few kB; built once a spec."""
    from onnx import TensorProto, helper, numpy_helper

    kw, like = spec["kwargs"], cnn_acting_like(spec)
    layout, _ = cnn_layout(kw)
    weights = []
    for name, (shape, dtype) in like.items():
        if name != "log_std":  # data the session gets (external), not in the graph's bytes
            weights.append(TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(dtype), dims=shape,
                                       data_location=TensorProto.EXTERNAL))
            weights[-1].external_data.add(key="location", value=name)
    nodes = [helper.make_node("Cast", ["obs"], ["x"], to=TensorProto.FLOAT)]
    x, scale = "x", float(kw.get("scale", 1.0 / 255.0))
    if scale != 1.0:
        weights.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), "scale"))
        nodes.append(helper.make_node("Mul", [x, "scale"], ["scaled"]))
        x = "scaled"
    if kw.get("channels_last", False):
        nodes.append(helper.make_node("Transpose", [x], ["chw"], perm=[0, 3, 1, 2]))
        x = "chw"
    for i, (_, _, k, s) in enumerate(layout):
        nodes += [helper.make_node("Conv", [x, f"trunk.{2 * i}.weight", f"trunk.{2 * i}.bias"], [f"conv{i}"],
                                   kernel_shape=[k, k], strides=[s, s]),
                  helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"])]
        x = f"relu{i}"
    fc = f"trunk.{2 * len(layout) + 1}"
    nodes += [helper.make_node("Flatten", [x], ["flat"], axis=1),
              helper.make_node("Gemm", ["flat", f"{fc}.weight", f"{fc}.bias"], ["fc"], transB=1),
              helper.make_node("Relu", ["fc"], ["hidden"]),
              helper.make_node("Gemm", ["hidden", "actor.weight", "actor.bias"], [DIST_OUTPUT], transB=1)]
    out = like["actor.bias"][0][0]
    graph = helper.make_graph(
        nodes, "actor", [helper.make_tensor_value_info(
            "obs", helper.np_dtype_to_tensor_dtype(np.dtype(input_dtype)), [None, *(int(d) for d in kw["obs_shape"])])],
        [helper.make_tensor_value_info(DIST_OUTPUT, TensorProto.FLOAT, [None, out])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", GRAPH_OPSET)])
    model.ir_version = GRAPH_IR_VERSION
    return bytes(model.SerializeToString())


@functools.lru_cache(maxsize=8)
def _cnn_graph_of(spec_json: str, input_dtype: str) -> bytes:
    return cnn_graph(json.loads(spec_json), np.dtype(input_dtype))


GRAPH_OPSET = 17
"""The ONNX operator set of :func:`cnn_graph` (every onnxruntime this library accepts runs it)."""
GRAPH_IR_VERSION = 8
"""The ONNX IR version of :func:`cnn_graph` (newer onnx packages write newer ones than older runtimes read)."""


class OnnxCnnActor(SampledActor):
    """The actor of a CNN agent on ONNX Runtime: the graph of its spec (:func:`cnn_graph`) with its weights (a
    session for each observation dtype it meets, made on first use, a few ms), sampled in numpy. ONNX Runtime and
    onnx add ~30 MB to a process, torch ~190 MB (docs/benchmarks.md#actor-speed)."""

    acting_like = staticmethod(cnn_acting_like)

    def __init__(self, spec: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> None:
        like = cnn_acting_like(spec)
        wrong = {k: np.shape(state[k]) for k in like if k in state and np.shape(state[k]) != like[k][0]}
        if set(state) != set(like) or wrong:
            raise ValueError(f"CNN weights do not fit the spec: missing {sorted(set(like) - set(state))}, unexpected "
                             f"{sorted(set(state) - set(like))}, wrong shapes {wrong}")
        self.spec = spec
        self.state = {k: np.array(v, dtype=np.float32) for k, v in state.items()}  # a copy, which sessions read
        self.action = spec["kwargs"]["action"]
        self.kind = action_head(self.action)[0]
        self.log_std = self.state.get("log_std")
        self._spec_json = json.dumps(spec, sort_keys=True)
        self._sessions: dict[np.dtype, Any] = {}

    @classmethod
    def from_state(cls, spec: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> OnnxCnnActor:
        """The actor of the CNN agent ``spec`` builds (one :func:`cnn_on_onnxruntime`), holding ``state``."""
        return cls(spec, state)

    @classmethod
    def of(cls, agent: Any) -> OnnxCnnActor | None:
        """The actor a worker runs for ``agent`` (a module), or None if a worker does not run it as this class."""
        from frugalrl.nets import NatureCNNActorCritic, acting_state

        spec = agent.spec.to_json()
        if type(agent) is not NatureCNNActorCritic or not cnn_on_onnxruntime(spec):
            return None
        return cls(spec, {k: t.detach().numpy() for k, t in acting_state(agent).items()})

    def params(self, obs: np.ndarray) -> np.ndarray:
        """The distribution parameters (float32), as the module's ``dist_params`` gives them."""
        session = self._sessions.get(obs.dtype)
        if session is None:
            weights = {k: v for k, v in self.state.items() if k != "log_std"}
            session = self._sessions[obs.dtype] = make_session(_cnn_graph_of(self._spec_json, obs.dtype.str),
                                                               weights=weights)
        (out,) = session.run([DIST_OUTPUT], {"obs": np.ascontiguousarray(obs)})
        return head_params(self.kind, self.action, np.asarray(out, dtype=np.float32), self.log_std)


def worker_actor(agent: Any) -> NumpyActor | OnnxCnnActor | None:
    """The actor a worker runs ``agent`` (a module) with where it is one built from the weights (an MLP agent in
    numpy, a CNN agent on ONNX Runtime), for the head to recompute the workers' behaviour with the same arithmetic;
    None for any other agent."""
    return NumpyActor.of(agent) or OnnxCnnActor.of(agent)
