"""frugalrl: distributed reinforcement learning that counts every byte.

The public names::

    from frugalrl import ClusterEnv, EveryUpdate, Interval, AAPS, ByteMeter, Rollout

They are imported on first use (PEP 562), so that ``import frugalrl.wire.cut`` or a worker process
that needs only a small part of the library does not pay for torch and gymnasium at startup.
"""

from __future__ import annotations

from frugalrl.lazy import lazy_names

__version__ = "0.1.0"

_PUBLIC = {
    "AAPS": "frugalrl.sync",
    "ByteMeter": "frugalrl.wire.meter",
    "ClusterEnv": "frugalrl.envs.cluster",
    "EnvSpec": "frugalrl.envs.spec",
    "EveryUpdate": "frugalrl.sync",
    "Interval": "frugalrl.sync",
    "MLPActorCritic": "frugalrl.nets",
    "PolicySpec": "frugalrl.nets",
    "Rollout": "frugalrl.rollout",
    "SyncRule": "frugalrl.sync",
    "collect_rollout": "frugalrl.rollout",
    "make_agent": "frugalrl.nets",
}

__all__ = sorted(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
