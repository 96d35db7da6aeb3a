"""AcceRL's Table 6 (AcceRL, Zhang 2022) on this CPU: network size, bytes on the wire and inference time.

Rows (all on 4x84x84 uint8 Pong frames, 6 actions):

  Original torch fp32     Nature-CNN, convs 32(8) 64(4) 64(3), fc 512, run by PyTorch: the baseline
  Original ONNX fp32      the same network exported to a static ONNX graph (ONNX Runtime, fused ops)
  Original ONNX fp16      weights stored as fp16 (half the bytes; computes in fp32 on a CPU)
  Original ONNX int8      post-training static quantization (QDQ, per-channel int8 weights)
  Net1/Net2/Net3          the paper's smaller networks, 16(8) 32(4) | 256, 8(8) 16(4) | 128,
                          4(8) 4(4) | 32, in torch fp32 and as ONNX fp32 graphs (random weights: their
                          KL to the original is not meaningful and is not reported)
  Chain                   ``CompressorChain().add(Prune(0.5)).add(Distill(steps=200))
                          .add(Quantize("int8")).add(Export("onnx"))`` built from the original on the
                          recorded frames; the pruned+distilled torch module is reported too

Each row reports parameters, bytes of the weights message that carries the actor to one worker,
milliseconds per state at batch 1 and batch 16 (one thread, warm-up, median of ``--repeats``
interleaved rounds, each itself a median of 50 calls), the speed-up against the torch fp32 original
measured in the same run, and KL(original ‖ row) on the recorded frames for compressed versions of
the original. Table 6 lists the original's F.C as 2048; this uses the standard Nature-CNN's 512
(frugalrl's default network); "Paper ms" is the paper's per-state time on its server, for reference
only. The original is randomly initialised with its actor head scaled up (no trained Pong
policy is shipped), so that its policy is far from uniform and KL is informative. Example::

    python benchmarks/compress_table6.py --repeats 5 --out benchmarks/results/compress_table6.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from frugalrl.compress.chain import CompressorChain, count_params, measure_latency, policy_kl, wire_bytes
from frugalrl.compress.export import Export, export_onnx
from frugalrl.compress.quantize import Quantize, quantize_int8, to_fp16
from frugalrl.compress.runtime import OnnxPolicy
from frugalrl.envs.atari import make_atari
from frugalrl.evaluation import random_states
from frugalrl.nets import NatureCNNActorCritic, action_desc

BATCHES = (1, 16)
HEAD_SCALE = 1000.0
"""Scale of the original's actor head (a random-init head gives a near-uniform policy)."""
PAPER_MS = {"Original": 6.0, "Net1": 2.5, "Net2": 1.9, "Net3": 1.2}
"""Table 6's inference times (ms, the paper's server)."""
NETS = {"Net1": ((16, 32), 256), "Net2": ((8, 16), 128), "Net3": ((4, 4), 32)}
"""The paper's compressed networks: conv channels (8x8 s4, 4x4 s2) and fc width."""
PRUNED_FALLBACK = ((16, 32, 32), 256)
"""What Prune(0.5) makes of the original, built directly when the prune/distill stages are missing."""


def collect_frames(n: int, seed: int) -> torch.Tensor:
    """``n`` preprocessed Pong frames (4x84x84 uint8) visited with random actions."""
    return torch.from_numpy(random_states(make_atari("ALE/Pong-v5"), n, seed))


def machine_info() -> dict[str, Any]:
    """Command, CPU, library versions and load, for the JSON record."""
    import onnxruntime

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    from _commit import measured_commit

    commit = measured_commit()
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "git_commit": commit,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def build_rows(
    teacher: nn.Module, frames: torch.Tensor, distill_steps: int, seed: int
) -> list[dict[str, Any]]:
    """Every row's actor and description (``actor``, ``name``, ``arch``, ``runtime``, ``module``, ``kl``)."""
    shape, action = teacher.obs_shape, teacher.action
    example = frames[:32]
    graph = export_onnx(teacher, example)
    rows: list[dict[str, Any]] = [
        dict(
            name="Original",
            arch="32(8) 64(4) 64(3) / fc 512",
            runtime="torch fp32",
            actor=teacher,
            module=teacher,
        ),
        dict(
            name="Original",
            arch="32(8) 64(4) 64(3) / fc 512",
            runtime="ONNX fp32",
            actor=OnnxPolicy.from_bytes(graph, "categorical"),
            module=teacher,
            kl=True,
        ),
        dict(
            name="Original",
            arch="32(8) 64(4) 64(3) / fc 512",
            runtime="ONNX fp16 weights",
            actor=OnnxPolicy.from_bytes(to_fp16(graph), "categorical", precision="fp16"),
            module=teacher,
            kl=True,
        ),
        dict(
            name="Original",
            arch="32(8) 64(4) 64(3) / fc 512",
            runtime="ONNX int8",
            actor=OnnxPolicy.from_bytes(quantize_int8(graph, frames[:256]), "categorical", precision="int8"),
            module=teacher,
            kl=True,
        ),
    ]
    for name, (channels, hidden) in NETS.items():
        torch.manual_seed(seed)
        net = NatureCNNActorCritic(shape, action, channels=channels, hidden=hidden).eval()
        arch = f"{channels[0]}(8) {channels[1]}(4) / fc {hidden}"
        rows.append(dict(name=name, arch=arch, runtime="torch fp32", actor=net, module=net))
        rows.append(
            dict(
                name=name,
                arch=arch,
                runtime="ONNX fp32",
                actor=OnnxPolicy.from_bytes(export_onnx(net, example), "categorical"),
                module=net,
            )
        )

    t0 = time.perf_counter()
    try:
        from frugalrl.compress.distill import Distill
        from frugalrl.compress.prune import Prune
    except ImportError as e:
        print(
            f"  note: Prune/Distill not importable ({e}); the chain row uses a directly built "
            f"{PRUNED_FALLBACK} network quantized to int8 (random weights, no KL)"
        )
        channels, hidden = PRUNED_FALLBACK
        torch.manual_seed(seed)
        student = NatureCNNActorCritic(shape, action, channels=channels, hidden=hidden).eval()
        chain = CompressorChain(measure=False).add(Quantize("int8")).add(Export("onnx"))
        actor = chain.build(student, frames, seed=seed)
        module, label, kl = student, "pruned-size int8 (fallback)", False
    else:
        chain = (
            CompressorChain(measure=False)
            .add(Prune(0.5))
            .add(Distill(steps=distill_steps))
            .add(Quantize("int8"))
            .add(Export("onnx"))
        )
        actor = chain.build(teacher, frames, seed=seed)
        assert chain.artifact is not None
        module, label, kl = chain.artifact.module, chain.describe(), True
    build_s = time.perf_counter() - t0
    arch = arch_of(module)
    rows.append(
        dict(
            name="Chain",
            arch=arch,
            runtime="torch fp32 (pruned+distilled)",
            actor=module,
            module=module,
            kl=kl,
        )
    )
    rows.append(
        dict(name="Chain", arch=arch, runtime=f"ONNX int8 [{label}]", actor=actor, module=module, kl=kl)
    )
    rows[-1]["chain_build_s"] = round(build_s, 2)
    return rows


def arch_of(module: nn.Module) -> str:
    """``C1(8) C2(4) ... / fc H`` of a Nature-CNN agent."""
    if isinstance(module, NatureCNNActorCritic):
        kernels = (8, 4, 3)
        return (
            " ".join(f"{c}({k})" for c, k in zip(module.channels, kernels, strict=False))
            + f" / fc {module.hidden}"
        )
    return type(module).__name__


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the markdown table and write the JSON record."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (median reported)")
    p.add_argument("--calls", type=int, default=50, help="timed calls per row, batch size and round")
    p.add_argument("--frames", type=int, default=384, help="Pong frames recorded with random actions")
    p.add_argument("--distill-steps", type=int, default=200, help="Distill steps of the combined chain")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/compress_table6.json", help="JSON output path")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.calls < 1 or args.frames < 16:
        p.error("--repeats and --calls must be positive and --frames at least 16")
    info = machine_info()
    print(f"compress_table6: {info['command']}")
    print(f"  {info['nproc']} CPUs ({info['cpu']}), torch {info['torch']}, onnxruntime {info['onnxruntime']}")
    t_start = time.perf_counter()

    frames = collect_frames(args.frames, args.seed)
    env = make_atari("ALE/Pong-v5")
    torch.manual_seed(args.seed)
    teacher = NatureCNNActorCritic(env.observation_space.shape, action_desc(env.action_space)).eval()
    env.close()
    with torch.no_grad():
        teacher.actor.weight.mul_(HEAD_SCALE)
        entropy = float(torch.distributions.Categorical(logits=teacher.dist_params(frames)).entropy().mean())
    print(
        f"  {len(frames)} Pong frames; original policy entropy {entropy:.3f} nats (uniform: {np.log(6):.3f})"
    )

    rows = build_rows(teacher, frames, args.distill_steps, args.seed)
    timings: list[dict[int, list[float]]] = [{b: [] for b in BATCHES} for _ in rows]
    for r in range(args.repeats):
        order = list(range(len(rows)))
        order = order[r % len(order) :] + order[: r % len(order)]  # rotate: every row sees the same load
        for i in order:
            for b in BATCHES:
                timings[i][b].append(measure_latency(rows[i]["actor"], frames, b, repeats=args.calls))

    base = {b: statistics.median(timings[0][b]) / b for b in BATCHES}
    results = []
    for row, t in zip(rows, timings, strict=True):
        ms = {b: statistics.median(t[b]) / b for b in BATCHES}
        kl = policy_kl(teacher, row["actor"], frames) if row.get("kl") else None
        results.append(
            {
                "network": row["name"],
                "arch": row["arch"],
                "runtime": row["runtime"],
                "params": count_params(row["module"]),
                "wire_bytes": wire_bytes(row["actor"]),
                "ms_per_state": {str(b): round(ms[b], 4) for b in BATCHES},
                "ms_per_call": {str(b): round(ms[b] * b, 4) for b in BATCHES},
                "ms_per_state_rounds": {str(b): [round(x / b, 4) for x in t[b]] for b in BATCHES},
                "speedup_vs_torch_fp32_original": {str(b): round(base[b] / ms[b], 2) for b in BATCHES},
                "kl_mean": None if kl is None else float(kl.mean()),
                "kl_max": None if kl is None else float(kl.max()),
                "paper_ms": PAPER_MS.get(row["name"]) if row["runtime"] == "torch fp32" else None,
                **({"chain_build_s": row["chain_build_s"]} if "chain_build_s" in row else {}),
            }
        )

    header = (
        "| Network | Conv (kernel) / F.C | Runtime | Params | Wire bytes | ms/state b=1 | ms/state b=16 "
        "| Speed-up b=1 | Speed-up b=16 | KL mean | Paper ms |"
    )
    lines = [header, "|" + "---|" * 11]
    for res in results:
        kl = "-" if res["kl_mean"] is None else f"{max(res['kl_mean'], 0.0):.1e}"
        paper = "-" if res["paper_ms"] is None else f"{res['paper_ms']}"
        ms, sp = res["ms_per_state"], res["speedup_vs_torch_fp32_original"]
        lines.append(
            f"| {res['network']} | {res['arch']} | {res['runtime']} | {res['params']:,} | {res['wire_bytes']:,} "
            f"| {ms['1']:.3f} | {ms['16']:.3f} | {sp['1']:.2f}x | {sp['16']:.2f}x | {kl} | {paper} |"
        )
    table = "\n".join(lines)
    print()
    print(table)
    info["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    record = {
        "benchmark": "compress_table6",
        "machine": info,
        "settings": {
            "repeats": args.repeats,
            "calls": args.calls,
            "frames": len(frames),
            "distill_steps": args.distill_steps,
            "seed": args.seed,
            "threads": 1,
            "head_scale": HEAD_SCALE,
            "original_entropy": entropy,
        },
        "rows": results,
        "markdown": table,
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {out} ({record['seconds']} s)")
    return record


if __name__ == "__main__":
    main()
