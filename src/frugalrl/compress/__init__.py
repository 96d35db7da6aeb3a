"""AcceRL's Compressor chain (Zhang 2022): prune, distill, quantize and export the actors' policy.

    from frugalrl.compress import CompressorChain, Prune, Distill, Quantize, Export
    chain = CompressorChain().add(Prune(0.5)).add(Distill()).add(Quantize("int8")).add(Export("onnx"))

Modules, each importing only those listed before it: :mod:`~frugalrl.compress.runtime`
(``OnnxPolicy``, the actor that runs an exported graph, and ``Precision``), :mod:`~frugalrl.compress.base`
(what stages share: ``Artifact``, ``CompressContext``, ``Compressor``), one module per stage
(``prune``, ``distill``, ``export``, ``quantize``) and :mod:`~frugalrl.compress.chain`
(``CompressorChain``, its measurements, ``parse_chain``).
"""

from frugalrl.compress.base import Artifact, CompressContext, Compressor
from frugalrl.compress.chain import (
    CompressorChain,
    StageReport,
    measure_latency,
    parse_chain,
    policy_kl,
    wire_bytes,
)
from frugalrl.compress.distill import Distill, distill
from frugalrl.compress.export import Export, export_onnx
from frugalrl.compress.prune import Prune, prune_agent
from frugalrl.compress.quantize import Quantize, quantize_int8, to_fp16
from frugalrl.compress.runtime import PRECISIONS, OnnxPolicy, Precision, check_precision

__all__ = [
    "Artifact",
    "CompressContext",
    "Compressor",
    "CompressorChain",
    "Distill",
    "Export",
    "OnnxPolicy",
    "PRECISIONS",
    "Precision",
    "Prune",
    "Quantize",
    "StageReport",
    "check_precision",
    "distill",
    "export_onnx",
    "measure_latency",
    "parse_chain",
    "policy_kl",
    "prune_agent",
    "quantize_int8",
    "to_fp16",
    "wire_bytes",
]
