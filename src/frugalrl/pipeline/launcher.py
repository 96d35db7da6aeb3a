"""Starting split-model PPO: both stages on this machine, or the one stage ``torchrun`` / ``--rank`` gives.

:func:`train` spawns two fresh Python processes through :mod:`frugalrl.process` (the config and rank travel
in its handshake, each stage reports ``done`` or its error) that join a ``torch.distributed`` group over
loopback; if either fails or dies, the other is stopped and its error is raised in the caller (a
``ValueError`` stays one). With ``cfg.rank`` set, or under ``torchrun`` (``RANK`` in
the environment), only that stage runs in this process (stage 1 returns ``{}``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from frugalrl.driver import Callback, StopSignals, drive, note_stop_signals_early
from frugalrl.envs.worker import WorkerError
from frugalrl.pipeline.config import PipelinePPOConfig
from frugalrl.pipeline.stage0 import Stage0, check_spaces
from frugalrl.pipeline.stage1 import run_stage1
from frugalrl.process import (
    ChildExited,
    ParentGone,
    ParentLink,
    child_error,
    error_message,
    poll_children,
    spawn,
)
from frugalrl.runs import slug
from frugalrl.wire.message import Message
from frugalrl.wire.torchdist import TorchDistChannel


def free_port(addr: str) -> int:
    """A TCP port free on ``addr`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def _is_loopback(addr: str) -> bool:
    return addr in ("localhost", "::1") or addr.startswith("127.")


def run_stage(cfg: PipelinePPOConfig, rank: int, resume: str | Path | None = None,
              callbacks: Sequence[Callback] = (), port: int | None = None) -> dict[str, Any]:
    """Join the process group as ``rank`` and run that stage; rank 0 returns the run summary.

    Rendezvous at ``cfg.master_addr:cfg.master_port`` (``MASTER_ADDR``/``MASTER_PORT`` from ``torchrun``
    take precedence when set; ``port``, the one :func:`train` picked, over both). On loopback, gloo is told to use
    the ``lo`` interface. ``resume``: stage 0 continues that run directory from its checkpoint and tells stage 1
    where, which loads its own half.
    """
    addr = os.environ.get("MASTER_ADDR", cfg.master_addr)
    port = port or int(os.environ.get("MASTER_PORT", cfg.master_port))
    if port == 0:
        raise ValueError("master_port must be given (non-zero) when a stage is started on its own")
    if _is_loopback(addr):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(cfg.torch_threads)  # stage 1 too: both stages share this machine's cores when local

    def connect() -> TorchDistChannel:
        torch.manual_seed(cfg.seed + rank)
        dist.init_process_group(cfg.dist_backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=cfg.timeout))
        return TorchDistChannel(rank, 1 - rank)

    try:
        if rank == 1:
            run_stage1(cfg, connect())
            return {}
        return drive(Stage0(cfg, connect), resume=resume, callbacks=callbacks)  # connects after the run's seeding
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def default_run_name(cfg: PipelinePPOConfig) -> str:
    """The run directory's name when none is given: one level, whatever the env id (``MinAtar/Breakout-v1``)."""
    return (f"pipeline-ppo-{slug(cfg.env.split(':')[-1])[:30]}-{cfg.cut}-s{cfg.seed}-"
            f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def train(cfg: PipelinePPOConfig, resume: str | Path | None = None, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train split-model PPO as ``cfg`` says; return stage 0's run summary (see the module docstring).

    ``resume`` continues a run directory from its checkpoints (stage 0's ``latest.pt`` and stage 1's
    ``heads.pt``): the networks, optimizers, generators and byte counts continue; the envs start new
    episodes and the sparsifier's residual starts from zero. ``callbacks`` run in stage 0's process, so they
    need this process to be stage 0 (``rank=0``, or ``RANK=0`` from ``torchrun``).
    """
    cfg.validate()
    rank = cfg.rank if cfg.rank is not None else (int(os.environ["RANK"]) if "RANK" in os.environ else None)
    if callbacks and rank != 0:
        raise ValueError("pipeline PPO runs callbacks in stage 0's process: start this process as stage 0 "
                         "(rank=0, or torchrun's RANK=0) and stage 1 beside it")
    if rank is not None:
        if rank == 0:
            check_spaces(cfg)
        return run_stage(cfg, rank, resume, callbacks)
    check_spaces(cfg)
    if resume is not None:
        run_dir = Path(resume)
        cfg = dataclasses.replace(cfg, run_dir=str(run_dir.parent), run_name=run_dir.name)
    else:
        name = cfg.run_name or default_run_name(cfg)
        cfg = dataclasses.replace(cfg, run_name=name)
        run_dir = Path(cfg.run_dir) / name
    run_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        port = cfg.master_port or free_port(cfg.master_addr)
        try:
            _launch_both(cfg, port, run_dir, resume)
            break
        except RuntimeError as e:
            # A free port can be taken between our probe and gloo's bind: try another one.
            if cfg.master_port or "EADDRINUSE" not in str(e) or attempt == 2:
                saved = (run_dir / "checkpoints" / "latest.pt").exists()  # a stage failed (its env raised...)
                failed = WorkerError(f"{e} (the progress since the last checkpoint is lost)" if saved else str(e))
                failed.run_dir = str(run_dir) if saved else None
                raise failed from e
    return json.loads((run_dir / "summary.json").read_text())


def _launch_both(cfg: PipelinePPOConfig, port: int, run_dir: Path, resume: str | Path | None) -> None:
    """Start both stages (:func:`frugalrl.process.spawn`) to meet on ``port`` and wait for their ``done``; if one
    fails (reports an error, or dies), stop the other and raise. Stage 1's output goes to ``<run dir>/stage1.log``.
    The port travels beside the config, whose ``master_port`` (0: pick one) is what ``config.json`` keeps: a
    resume picks a free port again."""
    config = {"config": dataclasses.asdict(cfg), "resume": None if resume is None else str(resume), "port": port}
    with open(run_dir / "stage1.log", "a") as log:  # a resume's segment after the earlier ones
        children = [spawn(STAGE_ENTRY, {**config, "rank": r}, name=f"pipeline stage {r}", log=None if r == 0 else log)
                    for r in (0, 1)]
        # SIGTERM or SIGINT to the launcher goes to stage 0 as SIGTERM (it ignores SIGINT, as every child does):
        # its driver stops after the iteration in progress and stage 1 stops with it. Until stage 0 is ready (it
        # notes the signal from then on, see stage_entry) the signal waits here: before, it would kill the stage.
        started = False

        def forward(_: int) -> None:
            if started:
                os.kill(children[0].pid, signal.SIGTERM)

        with StopSignals(on_first=forward) as signals:
            try:
                deadline = time.monotonic() + cfg.timeout
                for child in children:
                    child.await_ready(deadline, keep_value_error=True)
                started = True
                if signals.reason is not None:
                    forward(signal.SIGTERM)
                done: set[str] = set()
                while len(done) < 2:
                    for child in poll_children(children, 1.0):
                        try:
                            got = child.wait_message(0)
                        except ChildExited as e:
                            raise RuntimeError(f"{child.name} failed: exited with code {e.exitcode} "
                                               f"(see {run_dir}/stage1.log)") from None
                        if got is None:
                            continue
                        msg, _ = got
                        if msg.op == "error":
                            raise child_error(child.name, msg.meta, keep_value_error=True, what="failed")
                        done.add(child.name)
            finally:
                for child in children:
                    child.stop(10.0)


STAGE_ENTRY = "frugalrl.pipeline.launcher:stage_entry"


def stage_entry() -> None:
    """A stage as :func:`train` starts it (a child of :func:`frugalrl.process.spawn`): the config and rank come
    in the handshake; the stage reports ``done`` or its error, then waits for the launcher to let it go."""
    from frugalrl.config import config_from_dict

    note_stop_signals_early()  # a preemption from here on stops the run after its first update, with checkpoints
    link = ParentLink.from_argv()
    try:
        job = link.start(lambda meta: (config_from_dict(PipelinePPOConfig, meta["config"]), int(meta["rank"]),
                                       meta.get("resume"), int(meta["port"])))
        if job is None:
            return
        link.watch_parent()
        cfg, rank, resume, port = job
        try:
            run_stage(cfg, rank, resume, port=port)
        except Exception as e:  # noqa: BLE001 - reported to the launcher, which raises it
            link.send(error_message(e))
        else:
            link.send(Message("done", {"rank": rank}))
        link.recv()  # the launcher closes the connection once both stages are done
    except ParentGone:
        return
