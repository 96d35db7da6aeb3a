"""frugalrl: distributed reinforcement learning that counts every byte.

The public names::

    from frugalrl import ClusterEnv, EveryUpdate, Interval, AdaptiveKL, ByteMeter, Rollout
"""

from frugalrl.envs.cluster import ClusterEnv
from frugalrl.envs.spec import EnvSpec
from frugalrl.nets import MLPActorCritic, PolicySpec, make_agent
from frugalrl.rollout import Rollout, collect_rollout
from frugalrl.sync import AdaptiveKL, EveryUpdate, Interval, SyncRule
from frugalrl.wire.meter import ByteMeter

__version__ = "0.1.0"

__all__ = [
    "AdaptiveKL",
    "ByteMeter",
    "ClusterEnv",
    "EnvSpec",
    "EveryUpdate",
    "Interval",
    "MLPActorCritic",
    "PolicySpec",
    "Rollout",
    "SyncRule",
    "collect_rollout",
    "make_agent",
]
