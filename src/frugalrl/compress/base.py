"""What every compression stage shares: the artifact it transforms, its context and its base class.

A stage (:class:`Compressor`) takes an :class:`Artifact` and returns a new one. An artifact holds a
torch agent (fp32; pruning and distillation change it) and, once a stage has exported it, the
serialized ONNX graph the actor runs instead (quantization and export produce it). ``artifact.actor()``
is the agent sent to workers: the torch module itself, or an
:class:`~frugalrl.compress.runtime.OnnxPolicy` holding the graph bytes.

The stages (:mod:`~frugalrl.compress.prune`, :mod:`~frugalrl.compress.distill`,
:mod:`~frugalrl.compress.quantize`, :mod:`~frugalrl.compress.export`) import this module, and
:mod:`frugalrl.compress.chain` imports the stages, so that no two modules import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frugalrl.compress.runtime import OnnxPolicy, Precision
from frugalrl.nets import ActorCritic


@dataclass
class Artifact:
    """What one stage hands to the next."""

    module: ActorCritic
    """A torch agent (``spec``, ``dist_kind``, ``dist_params``, ``value``) in fp32."""
    onnx: bytes | None = None
    """The serialized ONNX graph the actor runs, once a stage exported one (else the actor is ``module``)."""
    precision: Precision = "fp32"
    """Precision of the exported graph's weights: fp32, fp16 or int8."""

    def actor(self) -> ActorCritic:
        """The agent a worker runs: ``module`` or an ``OnnxPolicy`` over ``onnx``."""
        if self.onnx is None:
            return self.module
        return OnnxPolicy.from_bytes(self.onnx, self.module.dist_kind, precision=self.precision)


@dataclass
class CompressContext:
    """What every stage may use: the teacher (a frozen snapshot of the learner) and recent states."""

    teacher: ActorCritic
    observations: torch.Tensor
    """Recent states, shape ``(N, *obs_shape)``: calibration, distillation and KL measurement data."""
    seed: int = 0


class Compressor:
    """Base class of a chain stage. Subclasses implement :meth:`apply` and :meth:`describe`."""

    def apply(self, art: Artifact, ctx: CompressContext) -> Artifact:
        """Return the compressed artifact (never modify ``art.module`` in place)."""
        raise NotImplementedError

    def describe(self) -> str:
        """Short name for logs and reports, e.g. ``prune:0.5``."""
        return type(self).__name__.lower()
