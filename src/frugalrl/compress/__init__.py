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

__all__ = [
    "Artifact",
    "CompressContext",
    "Compressor",
    "CompressorChain",
    "StageReport",
    "measure_latency",
    "parse_chain",
    "policy_kl",
    "wire_bytes",
]
