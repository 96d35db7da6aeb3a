"""Starting split-model PPO: both stages on this machine, or the one stage ``torchrun`` / ``--rank`` gives.

:func:`train` spawns two fresh Python processes (``python -m frugalrl.pipeline.launcher CONFIG RANK``) that
join a ``torch.distributed`` group over loopback; if either fails, the other is stopped and its error is
raised in the caller (a ``ValueError`` stays one). With ``cfg.rank`` set, or under ``torchrun`` (``RANK`` in
the environment), only that stage runs in this process (stage 1 returns ``{}``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from frugalrl.pipeline.config import PipelinePPOConfig
from frugalrl.pipeline.stage0 import check_spaces, run_stage0
from frugalrl.pipeline.stage1 import run_stage1
from frugalrl.training import Training
from frugalrl.wire.torchdist import DistChannel


def free_port(addr: str) -> int:
    """A TCP port free on ``addr`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def _is_loopback(addr: str) -> bool:
    return addr in ("localhost", "::1") or addr.startswith("127.")


def run_stage(cfg: PipelinePPOConfig, rank: int, resume: str | Path | None = None) -> dict[str, Any]:
    """Join the process group as ``rank`` and run that stage; rank 0 returns the run summary.

    Rendezvous at ``cfg.master_addr:cfg.master_port`` (``MASTER_ADDR``/``MASTER_PORT`` from ``torchrun``
    take precedence when set). On loopback, gloo is told to use the ``lo`` interface. ``resume``: stage 0
    continues that run directory from its checkpoint and tells stage 1 where, which loads its own half.
    """
    addr = os.environ.get("MASTER_ADDR", cfg.master_addr)
    port = int(os.environ.get("MASTER_PORT", cfg.master_port))
    if port == 0:
        raise ValueError("master_port must be given (non-zero) when a stage is started on its own")
    if _is_loopback(addr):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    run = Training("pipeline-ppo", cfg, tag=cfg.cut, resume=resume) if rank == 0 else None
    torch.manual_seed(cfg.seed + rank)
    dist.init_process_group(cfg.dist_backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=cfg.timeout))
    try:
        chan = DistChannel(rank, 1 - rank)
        if run is None:
            run_stage1(cfg, chan)
            return {}
        return run_stage0(cfg, chan, run)
    finally:
        dist.destroy_process_group()


def train(cfg: PipelinePPOConfig, resume: str | Path | None = None) -> dict[str, Any]:
    """Train split-model PPO as ``cfg`` says; return stage 0's run summary (see the module docstring).

    ``resume`` continues a run directory from its checkpoints (stage 0's ``latest.pt`` and stage 1's
    ``heads.pt``): the networks, optimizers, generators and byte counts continue; the envs start new
    episodes and the sparsifier's residual starts from zero.
    """
    cfg.validate()
    rank = cfg.rank if cfg.rank is not None else (int(os.environ["RANK"]) if "RANK" in os.environ else None)
    if rank is not None:
        if rank == 0:
            check_spaces(cfg)
        return run_stage(cfg, rank, resume)
    check_spaces(cfg)
    if resume is not None:
        run_dir = Path(resume)
        cfg = dataclasses.replace(cfg, run_dir=str(run_dir.parent), run_name=run_dir.name)
    else:
        name = cfg.run_name or (f"pipeline-ppo-{cfg.env.split(':')[-1][:30]}-{cfg.cut}-s{cfg.seed}-"
                                f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        cfg = dataclasses.replace(cfg, run_name=name)
        run_dir = Path(cfg.run_dir) / name
    run_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        port = cfg.master_port or free_port(cfg.master_addr)
        try:
            _launch_both(dataclasses.replace(cfg, master_port=port), run_dir, resume)
            break
        except RuntimeError as e:
            # A free port can be taken between our probe and gloo's bind: try another one.
            if cfg.master_port or "EADDRINUSE" not in str(e) or attempt == 2:
                raise
    return json.loads((run_dir / "summary.json").read_text())


def _launch_both(cfg: PipelinePPOConfig, run_dir: Path, resume: str | Path | None) -> None:
    """Start both stages as subprocesses and wait; stop the other and raise if one fails."""
    for rank in (0, 1):
        (run_dir / f"stage{rank}.error").unlink(missing_ok=True)
    cfg_path = run_dir / "stage_config.json"
    cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
    procs = []
    try:
        for r in (0, 1):
            log = None if r == 0 else open(run_dir / "stage1.log", "w")  # noqa: SIM115 - closed below
            cmd = [sys.executable, "-m", "frugalrl.pipeline.launcher", str(cfg_path), str(r)]
            if resume is not None:
                cmd.append(str(resume))
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=log), log))
        while True:
            codes = [p.poll() for p, _ in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                raise _stage_error(run_dir, failed[0], codes[failed[0]])
            if all(c == 0 for c in codes):
                return
            time.sleep(0.1)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            if log is not None:
                log.close()


def _stage_error(run_dir: Path, rank: int, code: int) -> Exception:
    """The error a failed stage recorded (a ``ValueError`` stays one, so the CLI reports it cleanly)."""
    path = run_dir / f"stage{rank}.error"
    message = path.read_text().strip() if path.exists() else f"exited with code {code} (see {run_dir}/stage1.log)"
    if message.startswith("ValueError: "):
        return ValueError(f"pipeline stage {rank}: {message.removeprefix('ValueError: ')}")
    return RuntimeError(f"pipeline stage {rank} failed: {message}")


def _stage_main(argv: list[str]) -> int:
    """``python -m frugalrl.pipeline.launcher CONFIG_JSON RANK [RESUME_DIR]``: one stage, as :func:`train` starts it."""
    from frugalrl.config import config_from_dict

    cfg_path, rank = Path(argv[0]), int(argv[1])
    resume = argv[2] if len(argv) > 2 else None
    try:
        cfg = config_from_dict(PipelinePPOConfig, json.loads(cfg_path.read_text()), where=str(cfg_path))
        run_stage(cfg, rank, resume)
    except BaseException as e:
        (cfg_path.parent / f"stage{rank}.error").write_text(f"{type(e).__name__}: {e}\n")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(_stage_main(sys.argv[1:]))
