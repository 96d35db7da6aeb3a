"""ClusterEnv and its workers and backends."""

from frugalrl.envs.cluster import ClusterEnv
from frugalrl.envs.spec import EnvSpec

__all__ = ["ClusterEnv", "EnvSpec"]
