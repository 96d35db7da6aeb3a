"""The backend interface: how the head of a ClusterEnv talks to its workers.

A backend starts ``num_workers`` :class:`~frugalrl.envs.worker.EnvWorker` instances somewhere
(in this process, in local processes, on Ray actors), sends them :class:`~frugalrl.wire.Message`
requests and gathers the replies. It meters every message on the shared
:class:`~frugalrl.wire.ByteMeter` and never hangs on a dead worker: a worker that dies or stops
answering comes back as a :class:`WorkerFailure`, and :meth:`Backend.restart` replaces it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from frugalrl.wire.message import Message
from frugalrl.wire.meter import ByteMeter


@dataclass
class WorkerFailure:
    """A worker that died or timed out while a request was outstanding."""

    worker: int
    reason: str


@dataclass
class WorkerConfig:
    """Everything a worker is built from (picklable; sent once when its process starts)."""

    index: int
    env_spec: Any
    num_envs: int
    first_env: int
    autoreset_mode: str
    check_finite: bool
    seed: int


class Backend(ABC):
    """Where the workers run. Implementations: serial, local (processes), ray (Ray actors)."""

    name = "base"

    def __init__(self, configs: list[WorkerConfig], meter: ByteMeter, timeout: float) -> None:
        self.configs = configs
        self.meter = meter
        self.timeout = timeout

    @property
    def num_workers(self) -> int:
        """How many workers this backend runs."""
        return len(self.configs)

    @abstractmethod
    def start(self) -> None:
        """Start every worker; raise a clear error if one cannot be built."""

    @abstractmethod
    def request(self, requests: dict[int, Message]) -> dict[int, Message | WorkerFailure]:
        """Send each worker its request and wait for every reply (or failure)."""

    @abstractmethod
    def restart(self, worker: int) -> None:
        """Replace worker ``worker`` by a fresh one built from the same config."""

    def reserve(self, up_bytes: int, down_bytes: int) -> None:  # noqa: B027 - optional hook
        """Hint the largest reply (``up``) and request (``down``) expected next; transports may pre-allocate."""

    @abstractmethod
    def close(self) -> None:
        """Stop every worker and release every resource; idempotent."""

    def worker_pids(self) -> dict[int, int]:
        """Operating-system process ids of the workers, where there are any."""
        return {}

    def worker_nodes(self) -> dict[int, dict[str, str]]:
        """Where each worker runs (``node_id``, ``node_ip``), for backends that span machines."""
        return {}
