"""The Compressor chain (AcceRL, Zhang 2022, Code 1): stages that turn the learner's policy into an actor.

    chain = CompressorChain().add(Prune(0.5)).add(Distill()).add(Quantize("int8")).add(Export("onnx"))
    actor = chain.build(learner_agent, recent_obs)      # an agent ClusterEnv workers can run
    chain.reports                                       # params, wire bytes, latency, KL per stage

A stage (:class:`~frugalrl.compress.base.Compressor`) takes an
:class:`~frugalrl.compress.base.Artifact` and returns a new one (see :mod:`frugalrl.compress.base`,
which the stages import; this module imports the stages, for :func:`parse_chain`).

Every stage is measured on the same recent observations: parameters, bytes of the weights message
that would carry the actor to a worker, inference latency at batch 1 and 16, and KL(teacher ‖ actor).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from frugalrl import dists
from frugalrl.compress.base import Artifact, CompressContext, Compressor
from frugalrl.compress.distill import Distill
from frugalrl.compress.export import Export, check_format
from frugalrl.compress.prune import Prune, check_sparsity
from frugalrl.compress.quantize import Quantize
from frugalrl.compress.runtime import Precision, check_precision
from frugalrl.nets import ActorCritic
from frugalrl.wire.message import encode_state_dict, message_sizes


@dataclass
class StageReport:
    """Measurements after one stage."""

    stage: str
    params: int
    """Parameters of the torch module (the exported graph has the same number)."""
    wire_bytes: int
    """Bytes of the weights message that carries the actor to one worker (payload + header)."""
    latency_ms: dict[int, float]
    """Median inference milliseconds per call, by batch size (one thread)."""
    kl_mean: float
    kl_max: float
    """KL(teacher ‖ actor) over the context's observations."""
    seconds: float
    """Time the stage took."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self)
        d["latency_ms"] = {str(k): v for k, v in self.latency_ms.items()}
        return d


@dataclass
class CompressorChain:
    """A chain of responsibility of compression stages; ``add`` returns the chain for one-line composition."""

    stages: list[Compressor] = field(default_factory=list)
    measure: bool = True
    """Measure latency and KL after each stage (turn off for the fastest rebuilds during training)."""
    batch_sizes: tuple[int, ...] = (1, 16)
    reports: list[StageReport] = field(default_factory=list)
    artifact: Artifact | None = None

    def add(self, stage: Compressor) -> CompressorChain:
        """Append a stage; returns ``self``."""
        if not isinstance(stage, Compressor):
            raise TypeError(f"a chain stage must be a frugalrl.compress.Compressor, got {type(stage).__name__}")
        self.stages.append(stage)
        return self

    def configure(self, precision: Precision | None = None, sparsity: float | None = None) -> None:
        """Change the stages for the next :meth:`build` (what the Monitor's strategies do).

        ``precision`` (fp32, fp16, int8) goes to every stage with a ``precision`` attribute (the
        quantization stages), ``sparsity`` to every stage with a ``sparsity`` attribute (the pruning
        stages); None leaves a setting as it is.
        """
        if precision is not None:
            precision = check_precision(precision)
        if sparsity is not None:
            sparsity = check_sparsity(sparsity)
        for stage in self.stages:
            if precision is not None and hasattr(stage, "precision"):
                stage.precision = precision
            if sparsity is not None and hasattr(stage, "sparsity"):
                stage.sparsity = sparsity

    def describe(self) -> str:
        """The stages, comma-separated (the ``--compress`` syntax)."""
        return ",".join(s.describe() for s in self.stages) or "none"

    def build(self, teacher: ActorCritic, observations: torch.Tensor | np.ndarray, seed: int = 0) -> ActorCritic:
        """Run every stage on a frozen copy of ``teacher``; return the actor (also ``self.policy``).

        ``self.reports`` gets one entry for the original and one per stage.
        """
        obs = torch.as_tensor(np.asarray(observations))
        if obs.ndim < 2 or obs.shape[0] == 0:
            raise ValueError(f"observations must be a non-empty batch of states, got shape {tuple(obs.shape)}")
        frozen = copy.deepcopy(teacher).eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        ctx = CompressContext(frozen, obs, seed)
        art = Artifact(frozen)
        self.reports = [self._report("original", art, ctx, 0.0)] if self.measure else []
        for stage in self.stages:
            t0 = time.perf_counter()
            art = stage.apply(art, ctx)
            seconds = time.perf_counter() - t0
            if self.measure:
                self.reports.append(self._report(stage.describe(), art, ctx, seconds))
        self.artifact = art
        return art.actor()

    @property
    def policy(self) -> ActorCritic:
        """The actor from the last :meth:`build`."""
        if self.artifact is None:
            raise RuntimeError("CompressorChain.policy: call build(teacher, observations) first")
        return self.artifact.actor()

    def _report(self, name: str, art: Artifact, ctx: CompressContext, seconds: float) -> StageReport:
        actor = art.actor()
        kl = policy_kl(ctx.teacher, actor, ctx.observations)
        latency = {b: measure_latency(actor, ctx.observations, b) for b in self.batch_sizes}
        return StageReport(
            stage=name,
            params=count_params(art.module),
            wire_bytes=wire_bytes(actor),
            latency_ms=latency,
            kl_mean=float(kl.mean()),
            kl_max=float(kl.max()),
            seconds=round(seconds, 4),
        )


def count_params(module: nn.Module) -> int:
    """Number of parameters."""
    return int(sum(p.numel() for p in module.parameters()))


def wire_bytes(actor: ActorCritic, codec: str = "fp32") -> int:
    """Bytes of the weights message that sends ``actor`` to one worker (what ClusterEnv would send)."""
    msg = encode_state_dict(actor.state_dict(), codec)
    msg.meta = {"version": 0, "spec": actor.spec.to_json()}
    return sum(message_sizes(msg).values())


def policy_kl(teacher: ActorCritic, actor: ActorCritic, observations: torch.Tensor) -> torch.Tensor:
    """Per-state KL(teacher ‖ actor) on ``observations``."""
    with torch.inference_mode():
        p = teacher.dist_params(observations).float()
        q = actor.dist_params(observations).float()
    return dists.kl(teacher.dist_kind, p, q)


def measure_latency(actor: ActorCritic, observations: torch.Tensor, batch: int, repeats: int = 50) -> float:
    """Median milliseconds of one ``actor.dist_params`` call on ``batch`` states, on one thread."""
    idx = torch.arange(batch) % observations.shape[0]
    x = observations[idx].contiguous()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        with torch.inference_mode():
            for _ in range(5):
                actor.dist_params(x)
            for _ in range(repeats):
                t0 = time.perf_counter()
                actor.dist_params(x)
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return float(np.median(times) * 1e3)


def parse_chain(text: str, distill_steps: int | None = None, distill: dict[str, Any] | None = None,
                **options: Any) -> CompressorChain:
    """Build a chain from the CLI syntax ``prune:0.5,distill,int8,onnx`` (``none`` or ``""``: no stage).

    Stage words: ``prune:S`` (sparsity S), ``distill`` or ``distill:STEPS``, ``int8``/``fp16`` (or
    ``quantize:int8``), ``onnx`` (or ``export:onnx``). ``distill``: further keyword arguments of
    :class:`Distill` (``beta``, ``kl_tol``...); ``options`` go to :class:`CompressorChain`.
    """
    chain = CompressorChain(**options)
    for word in [w.strip() for w in (text or "").split(",") if w.strip()]:
        name, _, arg = word.partition(":")
        name = name.lower()
        try:
            if name == "none":
                continue
            if name == "prune":
                chain.add(Prune(float(arg) if arg else 0.5))
            elif name == "distill":
                steps = int(arg) if arg else distill_steps
                kwargs: dict[str, Any] = dict(distill or {})
                if steps is not None:
                    kwargs["steps"] = steps
                chain.add(Distill(**kwargs))
            elif name in ("int8", "fp16"):
                chain.add(Quantize(check_precision(name)))
            elif name == "quantize":
                chain.add(Quantize(check_precision(arg or "int8")))
            elif name in ("onnx", "export"):
                chain.add(Export(check_format(arg or "onnx")) if name == "export" else Export("onnx"))
            else:
                raise ValueError(f"unknown stage {name!r}")
        except ValueError as e:
            raise ValueError(
                f"bad --compress stage {word!r} in {text!r}: {e}; expected a comma-separated list of "
                "prune:S, distill[:STEPS], int8, fp16, onnx"
            ) from e
    return chain
