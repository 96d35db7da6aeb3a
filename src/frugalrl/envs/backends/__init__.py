"""Where a ClusterEnv's workers run: ``serial`` (in this process), ``local`` (processes), ``ray`` (Ray actors), or
``replay`` (emulated workers replaying recorded traffic: a load generator for the head alone)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from frugalrl.envs.backends.base import Backend, WorkerConfig
from frugalrl.wire.meter import ByteMeter

BACKENDS = ("serial", "local", "ray", "replay")


def inline_workers(backend: str, num_workers: int, inline: int | None) -> int:
    """How many workers run in the head's process: ``inline`` (local backend only), or where None, as many as keep
    the worker processes fewer than the cores this process may use (one is the head's). The head waits while the
    workers step, so it can step some envs itself; a process more than there are cores only adds wake-ups."""
    if inline is not None:
        if isinstance(inline, bool) or not isinstance(inline, int) or not 0 <= inline <= num_workers:
            raise ValueError(f"inline_workers must be an integer in [0, num_workers={num_workers}] or None, "
                             f"got {inline!r}")
        if inline and backend != "local":
            raise ValueError(f"inline_workers applies to backend='local' only, not {backend!r}")
        return inline
    if backend != "local":
        return 0
    return max(0, num_workers - (_cores() - 1))


def note_torch_threads(backend: str, num_workers: int, inline: int) -> None:
    """Say once per process, in one logged line, when torch (already imported here) runs more threads than the cores
    a ClusterEnv's worker processes leave it: its idle threads spin on the cores the workers step on."""
    global _threads_noted
    torch = sys.modules.get("torch")
    processes = num_workers - inline if backend == "local" else 0
    if _threads_noted or torch is None or processes <= 0:
        return
    threads, cores = torch.get_num_threads(), _cores()
    if threads <= 1 or threads + processes <= cores:
        return
    _threads_noted = True
    logging.getLogger("frugalrl").warning(
        "frugalrl: torch runs %d threads in this process while %d ClusterEnv worker process(es) step envs on its %d "
        "cores; torch.set_num_threads(%d) before your loop leaves them their cores (docs/clusterenv.md#head-threads)",
        threads, processes, cores, max(1, cores - processes))


_threads_noted = False


def _cores() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def make_backend(
    name: str, configs: list[WorkerConfig], meter: ByteMeter, timeout: float, **options: Any
) -> Backend:
    """Build the backend called ``name`` (``options``: ``inline`` for the local backend, ``ray_address`` and
    ``ray_num_cpus`` for Ray)."""
    if name == "serial":
        from frugalrl.envs.backends.serial import SerialBackend

        return SerialBackend(configs, meter, timeout)
    if name == "local":
        from frugalrl.envs.backends.local import LocalBackend

        return LocalBackend(configs, meter, timeout, inline=options.get("inline", 0))
    if name == "replay":
        from frugalrl.envs.backends.replay import ReplayBackend

        return ReplayBackend(configs, meter, timeout)
    if name == "ray":
        try:
            from frugalrl.envs.backends.ray import RayBackend
        except ImportError as e:
            raise ImportError(f"backend='ray' needs Ray: pip install 'frugalrl[ray]' ({e})") from e

        return RayBackend(
            configs, meter, timeout, address=options.get("ray_address"), num_cpus=options.get("ray_num_cpus", 1.0)
        )
    raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")
