"""ClusterEnv and its workers and backends.

``ClusterEnv`` and ``EnvSpec`` are imported on first use (PEP 562), so that a worker process, which imports
:mod:`frugalrl.envs.backends` and :mod:`frugalrl.envs.worker`, does not pay for the head's modules.
"""

from __future__ import annotations

from frugalrl.lazy import lazy_names

_PUBLIC = {"ClusterEnv": "frugalrl.envs.cluster", "EnvSpec": "frugalrl.envs.spec"}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
