"""AcceRL's Compressor chain (seed paper 004): prune, distill, quantize and export the actors' policy.

    from frugalrl.compress import CompressorChain, Prune, Distill, Quantize, Export
    chain = CompressorChain().add(Prune(0.5)).add(Distill()).add(Quantize("int8")).add(Export("onnx"))
"""

from frugalrl.compress.chain import (
    Artifact,
    CompressContext,
    Compressor,
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
from frugalrl.compress.runtime import OnnxPolicy

__all__ = [
    "Artifact",
    "Distill",
    "Export",
    "OnnxPolicy",
    "Prune",
    "Quantize",
    "distill",
    "export_onnx",
    "prune_agent",
    "quantize_int8",
    "to_fp16",
    "CompressContext",
    "Compressor",
    "CompressorChain",
    "StageReport",
    "measure_latency",
    "parse_chain",
    "policy_kl",
    "wire_bytes",
]
