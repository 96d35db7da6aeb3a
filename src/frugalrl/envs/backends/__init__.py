"""Where a ClusterEnv's workers run: ``serial`` (in this process), ``local`` (processes), ``ray`` (Ray actors)."""

from __future__ import annotations

from typing import Any

from frugalrl.envs.backends.base import Backend, WorkerConfig
from frugalrl.wire.meter import ByteMeter

BACKENDS = ("serial", "local", "ray")


def make_backend(
    name: str, configs: list[WorkerConfig], meter: ByteMeter, timeout: float, **options: Any
) -> Backend:
    """Build the backend called ``name`` (``options``: ``ray_address``, ``ray_num_cpus`` for Ray)."""
    if name == "serial":
        from frugalrl.envs.backends.serial import SerialBackend

        return SerialBackend(configs, meter, timeout)
    if name == "local":
        from frugalrl.envs.backends.local import LocalBackend

        return LocalBackend(configs, meter, timeout)
    if name == "ray":
        try:
            from frugalrl.envs.backends.ray import RayBackend
        except ImportError as e:
            raise ImportError(f"backend='ray' needs Ray: pip install 'frugalrl[ray]' ({e})") from e

        return RayBackend(
            configs, meter, timeout, address=options.get("ray_address"), num_cpus=options.get("ray_num_cpus", 1.0)
        )
    raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")
