"""Split-model PPO over a rate-shaped link: wall time per iteration, dense vs sparse cut gradients.

    python benchmarks/pipeline_shaped_link.py                       # 100mbit and 10mbit; dense, p0.9, p0.99
    python benchmarks/pipeline_shaped_link.py --rates none --variants dense --iterations 1   # smoke test

Two network namespaces (:class:`frugalrl.netem.TestHosts`) joined by a veth pair, ``tbf`` on both
hosts' egress (this kernel has no netem, so no delay). Stage 0 of :mod:`frugalrl.pipeline`
(env + encoder) runs in host 0 (10.213.0.1, the rendezvous), stage 1 (heads + loss) in host 1, each
started exactly as on two machines: ``ip netns exec NS env GLOO_SOCKET_IFNAME=veth0 frugalrl train
pipeline-ppo FLAGS --rank RANK``. Variants: ``dense`` (fp32 cut gradients), ``p0.9`` /
``p0.99`` (TopPercentile, ``auto`` index encoding, bf16 values, no warm start); activations bf16 in all.
Per (rate, variant) one short run; stage 0's ``summary.json`` gives the seconds of each iteration (the
median drops the first when there are at least 3), the rollout/update split, stage 0's time waiting on
the channel, and bytes by kind. Needs root, ``ip`` and ``tc``.
Results: ``benchmarks/results/pipeline_shaped_link.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _ppo_runs import config_flags  # noqa: E402 - benchmarks/ is on the path when a script runs

from frugalrl import netem
from frugalrl.pipeline import PipelinePPOConfig
from frugalrl.presets import make_config

RESULTS = Path(__file__).parent / "results"
VARIANTS: dict[str, dict[str, Any]] = {
    "dense": {"cut": "dense", "cut_dense_dtype": "fp32"},
    "p0.9": {"cut": "topk", "cut_percentile": 0.9, "cut_index": "auto"},
    "p0.99": {"cut": "topk", "cut_percentile": 0.99, "cut_index": "auto"},
}
RUN_NAME = "run"


def _other_benchmarks() -> list[str]:
    """Command lines of other running benchmark / pipeline-stage processes (they share the CPU with us)."""
    out = []
    mine, pid = set(), os.getpid()  # this process and its ancestors (a `timeout` wrapper, say)
    while pid > 1 and pid not in mine:
        mine.add(pid)
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in mine:
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if "benchmarks/" in cmd or "pipeline-ppo" in cmd:
            out.append(cmd)
    return sorted(out)


def run_one(hosts: netem.TestHosts, cfg: PipelinePPOConfig, timeout: float) -> tuple[dict[str, Any], list[str]]:
    """Run stage 0 in host 0 and stage 1 in host 1; return stage 0's summary and the two commands."""
    stage_dir = Path(cfg.run_dir) / RUN_NAME
    stage_dir.mkdir(parents=True, exist_ok=True)
    # torchrun's variables would override the config's rendezvous: keep them out of the stages' env
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    procs, logs, cmds = [], [], []
    try:
        for r in (0, 1):
            argv = ["env", "GLOO_SOCKET_IFNAME=veth0", sys.executable, "-m", "frugalrl.cli", "train", "pipeline-ppo",
                    *config_flags(dataclasses.replace(cfg, rank=r))]
            cmds.append(" ".join(shlex.quote(a) for a in [*hosts.exec_prefix(r), *argv]))
            log = open(stage_dir / f"stage{r}.log", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(hosts.popen(r, argv, stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r = failed[0]
                tail = (stage_dir / f"stage{r}.log").read_text()[-3000:]
                raise RuntimeError(f"stage {r} exited with code {codes[r]}\n--- stage{r}.log (tail) ---\n{tail}")
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stages did not finish within {timeout:.0f} s (logs in {stage_dir})")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for log in logs:
            log.close()
    return json.loads((stage_dir / "summary.json").read_text()), cmds


def row_from(rate: str, variant: str, summary: dict[str, Any], wall: float, cmds: list[str]) -> dict[str, Any]:
    """One table row: median iteration seconds, the rollout/update split and bytes per iteration."""
    d = summary["details"]
    its = d["iteration_seconds"]
    kept = its[1:] if len(its) >= 3 else its
    n = len(its)
    b = summary["bytes"]
    return {
        "rate": rate, "variant": variant, "iterations": n,
        "iteration_seconds": its,
        "median_iteration_s": statistics.median(kept),
        "median_over": f"iterations {n - len(kept) + 1}..{n}",
        "rollout_s_per_iter": d["rollout_seconds"] / n,
        "update_s_per_iter": d["update_seconds"] / n,
        "comm_wait_s_per_iter_stage0": d["comm_wait_seconds_stage0"] / n,
        "bytes_per_iter": {"total": b["total"] / n, "gradients": b.get("gradients", 0) / n,
                           "activations": b.get("activations", 0) / n},
        "bytes": b,
        "bytes_by_direction": {"up": summary["bytes"]["up"], "down": summary["bytes"]["down"]},
        "train_wall_s": summary["wall_seconds"],
        "run_wall_s": wall,
        "stage_commands": cmds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default=PipelinePPOConfig.env)
    parser.add_argument("--rates", default="100mbit,10mbit", help="tbf rates, comma separated; 'none' = unshaped")
    parser.add_argument("--variants", default="dense,p0.9,p0.99", help=f"of {','.join(VARIANTS)}")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=64)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master-port", type=int, default=29613, help="run k uses this + k")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run")
    parser.add_argument("--out", default=str(RESULTS / "pipeline_shaped_link.json"))
    args = parser.parse_args()
    for v in args.variants.split(","):
        if v not in VARIANTS:
            sys.exit(f"unknown variant {v!r} (choose from {', '.join(VARIANTS)})")
    ok, why = netem.netns_available()
    if not ok:
        sys.exit(f"network namespaces unavailable: {why}")

    sharing = _other_benchmarks()
    batch = args.num_envs * args.num_steps
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="frl-pipe-link-") as tmp, netem.TestHosts(n=2) as hosts:
        k = 0
        for rate in args.rates.split(","):
            hosts.shape(rate=None if rate == "none" else rate)
            for variant in args.variants.split(","):
                cfg: PipelinePPOConfig = make_config(  # the env's preset (CarRacing: the paper's), then these
                    "pipeline-ppo", args.env, seed=args.seed, total_timesteps=args.iterations * batch,
                    num_envs=args.num_envs, num_steps=args.num_steps, update_epochs=args.update_epochs,
                    num_minibatches=args.num_minibatches, warmup_timesteps=0, activations="bf16",
                    master_addr=hosts.address(0), master_port=args.master_port + k,
                    run_dir=str(Path(tmp) / f"{rate}-{variant}"), run_name=RUN_NAME,
                    progress=False, tensorboard=False, plots=False, **VARIANTS[variant])
                cfg.validate()
                k += 1
                t0 = time.monotonic()
                summary, cmds = run_one(hosts, cfg, args.timeout)
                rows.append(row_from(rate, variant, summary, time.monotonic() - t0, cmds))
                r = rows[-1]
                print(f"{rate:>8s} {variant:6s}: {r['median_iteration_s']:7.2f} s/iter "
                      f"(rollout {r['rollout_s_per_iter']:.2f}, update {r['update_s_per_iter']:.2f}, "
                      f"wait {r['comm_wait_s_per_iter_stage0']:.2f}), {r['bytes_per_iter']['total'] / 1e6:.2f} MB/iter, "
                      f"iterations {[round(s, 2) for s in r['iteration_seconds']]}", flush=True)
        hosts.shape()

    dense = {r["rate"]: r["median_iteration_s"] for r in rows if r["variant"] == "dense"}
    for r in rows:
        d = dense.get(r["rate"])
        r["time_ratio_vs_dense"] = r["median_iteration_s"] / d if d else None

    print()
    print("| link | variant | s / iteration (median) | rollout s | update s | stage-0 comm wait s | "
          "MB / iter total | gradients MB | activations MB | time / dense |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = r["bytes_per_iter"]
        ratio = f"{r['time_ratio_vs_dense']:.2f}" if r["time_ratio_vs_dense"] is not None else "-"
        print(f"| {r['rate']} | {r['variant']} | {r['median_iteration_s']:.2f} | {r['rollout_s_per_iter']:.2f} | "
              f"{r['update_s_per_iter']:.2f} | {r['comm_wait_s_per_iter_stage0']:.2f} | {b['total'] / 1e6:.2f} | "
              f"{b['gradients'] / 1e6:.2f} | {b['activations'] / 1e6:.3f} | {ratio} |")

    out = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "config": vars(args),
        "setup": ("stage 0 (env + encoder) in netns host 0 (10.213.0.1, rendezvous), stage 1 (heads) in netns "
                  "host 1 (10.213.0.2), one veth pair, tbf rate on both egresses, no delay (no netem here); "
                  "gloo over veth0; warmup_timesteps=0, activations bf16, torch_threads 1 per stage"),
        "per_iteration": {"env_steps": batch,
                          "minibatches": args.update_epochs * args.num_minibatches,
                          "minibatch_size": batch // args.num_minibatches},
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "cpu_shared_with": sharing,
        "note": ("the CPU was shared with another benchmark running at the same time (see cpu_shared_with): "
                 "absolute times are inflated and noisy" if sharing else "no other benchmark was running"),
        "total_seconds": time.monotonic() - t_start,
        "runs": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {args.out} ({out['total_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
