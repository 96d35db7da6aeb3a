"""The backend interface: how the head of a ClusterEnv talks to its workers.

A backend starts ``num_workers`` :class:`~frugalrl.envs.worker.EnvWorker` instances somewhere
(in this process, in local processes, on Ray actors), sends them :class:`~frugalrl.wire.Message`
requests and gathers the replies. It meters every message on the shared
:class:`~frugalrl.wire.ByteMeter` and never hangs on a dead worker: a worker that dies or stops
answering comes back as a :class:`WorkerFailure`, and :meth:`Backend.restart` replaces it.
"""

from __future__ import annotations

import base64
import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from frugalrl.wire.message import Message
from frugalrl.wire.meter import ByteMeter

if TYPE_CHECKING:
    from frugalrl.envs.worker import EnvWorker


class WorkerStartFailed(RuntimeError):
    """A worker died or hung while starting (not an error it reported): ClusterEnv retries it under its
    crash-loop rule (:mod:`frugalrl.envs.restarts`)."""


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
    replayable: bool = False
    uplink: Any = "none"
    """:class:`~frugalrl.wire.uplink.UplinkOptions`, its JSON dict, or a compressor name."""


def build_worker(config: WorkerConfig) -> EnvWorker:
    """The :class:`~frugalrl.envs.worker.EnvWorker` a config describes, built in this process."""
    from frugalrl.envs.worker import EnvWorker

    c = config
    return EnvWorker(c.index, c.env_spec, c.num_envs, c.first_env, c.autoreset_mode, c.check_finite, c.seed,
                     c.replayable, c.uplink)


def config_to_json(config: WorkerConfig, backend: str) -> dict[str, Any]:
    """A worker config as JSON, for workers in other processes or on other machines.

    A callable env factory travels as its import path; one defined in the user's main script also
    carries ``main_path`` so the worker can import that script. Raises ``ValueError`` for factories
    that cannot be rebuilt elsewhere and for env kwargs that are not JSON.
    """
    spec = config.env_spec
    factory = spec.factory
    main_path = None
    fns = None if spec.fns is None else _pickle_env_fns(spec.fns)
    if callable(factory):
        module = getattr(factory, "__module__", None)
        qualname = getattr(factory, "__qualname__", "")
        if module is None or "<" in qualname:
            raise ValueError(
                f"env factory {factory!r} cannot be rebuilt in a worker process: pass a module-level "
                "function, a 'module:function' path or a Gymnasium id"
            )
        if module == "__main__":
            main_path = getattr(sys.modules["__main__"], "__file__", None)
            if main_path is None:
                raise ValueError(
                    f"env factory {qualname!r} is defined in an interactive session; define it in a module "
                    "(or use backend='serial')"
                )
            module = "__frugalrl_main__"  # the name the worker imports the script under
        factory = f"{module}:{qualname}"
    out = asdict(config)
    out["env_spec"] = {"id": spec.id, "factory": factory, "kwargs": spec.kwargs, "fns": fns,
                       "wrappers": [[path, kwargs] for path, kwargs in spec.wrappers]}
    out["main_path"] = main_path
    try:
        json.dumps(out)
    except TypeError as e:
        raise ValueError(f"env_kwargs and env wrappers' arguments must be JSON-serialisable for backend={backend!r}: "
                         f"{e}") from e
    return out


def worker_from_json(cfg: dict[str, Any]) -> EnvWorker:
    """Build the worker of a :func:`config_to_json` config (in a worker process or actor)."""
    from frugalrl.envs.spec import EnvSpec

    if cfg.get("main_path") and "__frugalrl_main__" not in sys.modules:
        # The factory lives in the user's script: import it under another name, the way multiprocessing
        # does, so that its guarded `if __name__ == "__main__":` code does not run.
        import importlib.util

        spec = importlib.util.spec_from_file_location("__frugalrl_main__", cfg["main_path"])
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import the script {cfg['main_path']!r} that defines the env factory")
        module = importlib.util.module_from_spec(spec)
        sys.modules["__frugalrl_main__"] = module
        spec.loader.exec_module(module)
    fields = {k: v for k, v in cfg.items() if k != "main_path"}
    recipe = dict(cfg["env_spec"])
    if recipe.get("fns") is not None:  # the head's own code, sent to its worker (never the other way round)
        import cloudpickle  # type: ignore[import-untyped]

        recipe["fns"] = tuple(cloudpickle.loads(base64.b64decode(recipe["fns"])))
    recipe["wrappers"] = tuple((str(path), dict(kwargs)) for path, kwargs in recipe.get("wrappers") or ())
    return build_worker(WorkerConfig(**{**fields, "env_spec": EnvSpec(**recipe)}))


def _pickle_env_fns(fns: tuple[Any, ...]) -> str:
    """The env functions as a cloudpickle (base64), for the worker processes; a clear ValueError for one that cannot
    travel (its closure holds an open file, a lock, a socket...)."""
    import cloudpickle

    for i, fn in enumerate(fns):
        try:
            cloudpickle.dumps(fn)
        except Exception as e:  # noqa: BLE001 - any pickling error means the same to the user
            raise ValueError(f"env_fns[{i}] cannot be sent to a worker process ({type(e).__name__}: {e}); build what "
                             "it holds inside the function, or use backend='serial'") from None
    return base64.b64encode(cloudpickle.dumps(tuple(fns))).decode("ascii")


class Backend(ABC):
    """Where the workers run. Implementations: serial, local (processes), ray (Ray actors)."""

    name = "base"

    def __init__(self, configs: list[WorkerConfig], meter: ByteMeter, timeout: float) -> None:
        self.configs = configs
        self.meter = meter
        self.timeout = timeout
        self._posted: dict[int, Message] = {}

    @property
    def num_workers(self) -> int:
        """How many workers this backend runs."""
        return len(self.configs)

    @abstractmethod
    def start(self) -> dict[int, str]:
        """Start every worker; raise a clear error if one cannot be built (an error it reports). Returns the
        workers that died or hung while starting, with the reason: the caller replaces them (:meth:`restart`)."""

    @abstractmethod
    def request(self, requests: dict[int, Message]) -> dict[int, Message | WorkerFailure]:
        """Send each worker its request and wait for every reply (or failure)."""

    def post(self, requests: dict[int, Message]) -> None:
        """Send requests without waiting for their replies (:meth:`gather` collects them); one request in flight
        per worker. This default does the work in :meth:`gather`; the local backend overlaps it with the caller."""
        busy = [w for w in requests if w in self._posted]
        if busy:
            raise RuntimeError(f"worker(s) {busy} already have a request in flight")
        self._posted.update(requests)

    def gather(self, workers: Iterable[int] | None = None, at_least: int | None = None
               ) -> dict[int, Message | WorkerFailure]:
        """Replies (or failures) to posted requests of ``workers`` (default: all posted), in that order: at least
        ``at_least`` of them (default: all), and every other that is already in."""
        wanted = list(self._posted) if workers is None else list(workers)
        unknown = [w for w in wanted if w not in self._posted]
        if unknown:
            raise RuntimeError(f"no request in flight for worker(s) {unknown}")
        return self.request({w: self._posted.pop(w) for w in wanted})

    @abstractmethod
    def restart(self, worker: int) -> None:
        """Replace worker ``worker`` by a fresh one built from the same config; :class:`WorkerStartFailed` if the
        new one dies or hangs while starting (the backend stays usable)."""

    def inline_ids(self) -> list[int]:
        """The workers that run in this process while others run in processes of their own (which
        :meth:`move_out` can move there too)."""
        return []

    def move_out(self, worker: int) -> None:
        """Run inline worker ``worker`` in a process of its own from now on, built afresh (its envs start anew);
        :class:`WorkerStartFailed` if that process dies or hangs while starting."""
        raise ValueError(f"worker {worker} does not run inline on the {self.name} backend")

    def reserve(self, up_bytes: int, down_bytes: int) -> None:  # noqa: B027 - optional hook
        """Hint the largest reply (``up``) and request (``down``) expected next; transports may pre-allocate."""

    @abstractmethod
    def close(self) -> None:
        """Stop every worker and release every resource; idempotent."""

    def worker_pids(self) -> dict[int, int]:
        """Operating-system process ids of the workers, where there are any."""
        return {}

    def worker_rss_mb(self) -> dict[int, float]:
        """Resident memory (MB) of each worker process this machine can see (read from ``/proc``: no message)."""
        from frugalrl.process import resident_mb

        sizes = {w: resident_mb(pid) for w, pid in self.worker_pids().items()}
        return {w: mb for w, mb in sizes.items() if mb is not None}

    def worker_nodes(self) -> dict[int, dict[str, str]]:
        """Where each worker runs (``node_id``, ``node_ip``), for backends that span machines."""
        return {}
