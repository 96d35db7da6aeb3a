"""Static-graph export of an agent to ONNX (AcceRL's "ONNX()" stage, Zhang 2022).

:func:`export_onnx` traces a torch agent into an ONNX graph with one input ``obs`` (dynamic batch, the
dtype the agent is fed: uint8 frames stay uint8 and are scaled inside the graph) and two outputs,
``dist_params`` and ``value``, and checks that ONNX Runtime reproduces the torch outputs. The
:class:`Export` chain stage exports the artifact's module unless an earlier stage (``Quantize``) has
already produced the graph, which it then keeps. Workers run the graph with
:class:`frugalrl.compress.runtime.OnnxPolicy`.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Literal, get_args

import numpy as np
import torch
from torch import nn

from frugalrl.action_heads import PAD_LOGIT
from frugalrl.compress.base import Artifact, CompressContext, Compressor
from frugalrl.compress.runtime import DIST_OUTPUT, VALUE_OUTPUT, make_session
from frugalrl.nets import ActorCritic

OPSET = 17
"""ONNX opset of exported graphs."""
ExportFormat = Literal["onnx"]
"""An export format :class:`Export` supports."""
FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)
EXAMPLE_STATES = 32
"""States of the context the :class:`Export` stage traces with and checks the graph on."""


def check_format(format: str) -> ExportFormat:
    """``format`` as an :data:`ExportFormat`; ``ValueError`` naming it unless :class:`Export` supports it."""
    for known in FORMATS:
        if format == known:
            return known
    raise ValueError(f"unsupported export format {format!r}; supported: {', '.join(FORMATS)}")


class _Heads(nn.Module):
    """``obs -> (dist_params, value)`` of an agent, sharing the trunk when the agent can."""

    def __init__(self, agent: ActorCritic):
        super().__init__()
        self.agent = agent

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = getattr(self.agent, "dist_params_and_value", None)
        if callable(both):
            params, value = both(obs)
        else:
            params, value = self.agent.dist_params(obs), self.agent.value(obs)
        return params.float(), value.float().reshape(-1)


def export_onnx(
    module: ActorCritic,
    example_obs: torch.Tensor | np.ndarray,
    opset: int = OPSET,
    rtol: float = 1e-3,
    atol: float = 1e-4,
) -> bytes:
    """Serialized ONNX graph of ``module`` (input ``obs``, outputs ``dist_params`` and ``value``).

    ``example_obs`` is a batch of states in the dtype workers feed (the batch axis is dynamic). The
    graph is run with ONNX Runtime on ``example_obs`` and must match torch within
    ``atol + rtol * max|output|``; otherwise ``RuntimeError``.
    """
    obs = torch.as_tensor(np.asarray(example_obs))
    if obs.ndim < 2 or obs.shape[0] == 0:
        raise ValueError(f"example_obs must be a non-empty batch of states, got shape {tuple(obs.shape)}")
    wrapper = _Heads(module)
    modes = {m: m.training for m in module.modules()}
    wrapper.eval()
    try:
        with torch.no_grad():
            expected = wrapper(obs)
        with tempfile.TemporaryDirectory(prefix="frugalrl-export-") as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path = os.path.join(tmp, "model.onnx")
            torch.onnx.export(
                wrapper,
                (obs,),
                path,
                dynamo=False,
                opset_version=opset,
                input_names=["obs"],
                output_names=[DIST_OUTPUT, VALUE_OUTPUT],
                dynamic_axes={"obs": {0: "batch"}, DIST_OUTPUT: {0: "batch"}, VALUE_OUTPUT: {0: "batch"}},
            )
            with open(path, "rb") as f:
                data = f.read()
    finally:
        for m, training in modes.items():
            m.training = training
    check_onnx(data, obs, expected, rtol=rtol, atol=atol)
    return data


def check_onnx(
    data: bytes,
    obs: torch.Tensor,
    expected: tuple[torch.Tensor, ...],
    rtol: float = 1e-3,
    atol: float = 1e-4,
) -> None:
    """Raise ``RuntimeError`` unless ONNX Runtime's outputs of ``data`` on ``obs`` match ``expected``."""
    session = make_session(data)
    got = session.run([DIST_OUTPUT, VALUE_OUTPUT], {session.get_inputs()[0].name: obs.numpy()})
    for name, g, t in zip((DIST_OUTPUT, VALUE_OUTPUT), got, expected, strict=True):
        e = t.detach().numpy()
        real = e > PAD_LOGIT / 2  # a MultiDiscrete head's padding (-1e9) is no logit: it would set the scale
        err = float(np.max(np.abs(g.reshape(e.shape) - e)[real], initial=0.0))
        tol = atol + rtol * float(np.max(np.abs(e[real]), initial=0.0))
        if not np.isfinite(err) or err > tol:
            raise RuntimeError(
                f"exported ONNX graph differs from torch on {name!r}: max |diff| {err:.3g} > {tol:.3g}"
            )


class Export(Compressor):
    """Chain stage: the actor becomes a static ONNX graph run by ONNX Runtime.

    Exports ``art.module`` in fp32 when no earlier stage has produced a graph; otherwise keeps the
    graph already exported (for example the int8 one of ``Quantize``) unchanged.
    """

    def __init__(self, format: ExportFormat = "onnx"):
        self.format = check_format(format)

    def apply(self, art: Artifact, ctx: CompressContext) -> Artifact:
        """An artifact whose actor runs the ONNX graph (exported here if ``art.onnx`` is None)."""
        if art.onnx is not None:
            return Artifact(module=art.module, onnx=art.onnx, precision=art.precision)
        data = export_onnx(art.module, ctx.observations[:EXAMPLE_STATES])
        return Artifact(module=art.module, onnx=data, precision="fp32")

    def describe(self) -> str:
        """``onnx``."""
        return self.format
