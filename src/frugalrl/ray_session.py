"""The one Ray instance of this process, shared by every frugalrl user of Ray (ClusterEnv's Ray backend,
DPSGD's Ray transport), with a single count of its users.

:func:`acquire` makes sure Ray is initialised:

- an instance this process (the user, a test) initialised itself is only used, never shut down;
- otherwise ``address`` joins an existing cluster, and without it a private single-machine instance is
  started. Either is counted: the last :func:`release` shuts it down (or disconnects from the cluster),
  whichever frugalrl part started it.

Importing this module imports only ``ray`` (no torch), so DPSGD processes stay light.
"""

from __future__ import annotations

import math
import os

import ray

_users = 0  # live frugalrl users of a Ray instance that frugalrl started or joined


def acquire(address: str | None, need_cpus: float, object_store_bytes: int | None = None) -> bool:
    """Make sure Ray is up for a user needing ``need_cpus`` CPUs; return whether this use is counted
    (pass it to :func:`release`). Raises ``RuntimeError`` if a private instance frugalrl started earlier
    is too small."""
    global _users
    if ray.is_initialized():
        if _users == 0:
            return False  # the user's own instance: used, left up
        _users += 1
        if address is None:  # a private instance has a fixed size: fail now, not after a timeout
            free = ray.available_resources().get("CPU", 0.0)
            if need_cpus > free:
                release(True)
                raise RuntimeError(
                    f"the Ray instance that an earlier backend='ray' env or run started has {free:g} free CPUs, "
                    f"{need_cpus:g} are needed: close the other one first, reserve fewer CPUs per worker "
                    "(ray_num_cpus / num_cpus), or call ray.init(num_cpus=...) yourself first"
                )
        return True
    if address is not None:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    else:
        # A private single-machine instance with enough logical CPUs for every worker, whatever the core
        # count. Ray replaces a loopback _node_ip_address by the machine's reachable address
        # (resolve_ip_for_localhost), so its ports are not loopback-only: Ray's token authentication
        # (on by default in recent Ray) is what guards them.
        ray.init(
            num_cpus=max(os.cpu_count() or 1, math.ceil(need_cpus)),
            object_store_memory=object_store_bytes,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    _users = 1
    return True


def release(counted: bool) -> None:
    """Undo a counted :func:`acquire`: the last user shuts Ray down (or disconnects)."""
    global _users
    if not counted:
        return
    _users -= 1
    if _users == 0 and ray.is_initialized():
        ray.shutdown()
