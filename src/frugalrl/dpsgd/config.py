"""The configuration of a DPSGD run: the optimiser's options every application shares, and the run's config.

:class:`DPSGDOptions` holds the knobs of DPSGD itself (its parallelism ``nW``, ``p``, ``B``, ``M``,
the rates ``ρ`` and ``η``, stopping, codecs, the transport). Applications built on DPSGD embed it by
inheritance, so that every option is declared, documented and validated once:

- :class:`DPSGDConfig` adds the problem to optimise (a ``"module:function"`` factory and its JSON
  arguments), the seed and the loss logging: it is what :func:`~frugalrl.dpsgd.run.run_dpsgd` runs;
- :class:`~frugalrl.algos.hsa2c.HSA2CConfig` and :class:`~frugalrl.dpsgd.lda.LDAConfig` add their own
  fields and build their :class:`DPSGDConfig` from the inherited options (:meth:`DPSGDOptions.options`).

An application that wants another default for an option redeclares only the field with its new default;
its documentation is the one here (the CLI reads attribute docstrings along the class hierarchy).
Validation errors name the concrete class and the field (``"HSA2CConfig.workers must be ..."``); ``validate()``
is the cooperative chain of every :class:`~frugalrl.config.ConfigPart`.

This module imports no torch and no transport, so an application's config stays light to import.
``workers`` here are DPSGD's (each a process of Hogwild processes), not ClusterEnv's env workers: no config has both.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Self, get_args

import numpy as np

from frugalrl.config import ConfigPart, EnvErrorRule
from frugalrl.dpsgd.rates import scale_learning_rate

Codec = Literal["fp32", "bf16", "fp16"]
"""Wire codecs of DPSGD's parameter vectors (pulls)."""
UpdateCodec = Literal["fp32", "bf16", "fp16", "zstd", "bf16+zstd"]
"""Wire codecs of DPSGD's update vectors (pushes): ``zstd`` is fp32's bytes shuffled into byte planes and
compressed (lossless), ``bf16+zstd`` the same for bf16 (the values of ``bf16``, in fewer bytes)."""
UPDATE_CODECS: tuple[str, ...] = get_args(UpdateCodec)
TransportName = Literal["local", "ray"]
"""Transports between the server and the workers (:data:`frugalrl.dpsgd.run.TRANSPORTS`)."""
TRANSPORT_NAMES: tuple[str, ...] = get_args(TransportName)
UpdateFormat = Literal["dense", "columns", "auto"]
"""How a worker's update travels: the dense vector, column-sparse (:mod:`frugalrl.dpsgd.sparse`), or ``auto``
(columns where the problem supports them and ``processes == 1``, else dense)."""
UPDATE_FORMATS: tuple[str, ...] = get_args(UpdateFormat)
ColumnBase = Literal["pulled", "current"]
"""What a column push's decay applies to on the server (:attr:`frugalrl.dpsgd.sparse.ColumnUpdate.base`)."""
COLUMN_BASES: tuple[str, ...] = get_args(ColumnBase)
ColumnBaseOption = Literal["pulled", "current", "auto"]
"""``column_base`` of a config: a :data:`ColumnBase`, or ``auto`` (``current`` with several workers, else ``pulled``)."""
COLUMN_BASE_OPTIONS: tuple[str, ...] = get_args(ColumnBaseOption)


@dataclass
class DPSGDOptions(ConfigPart):
    """The options of the DPSGD optimiser that every application shares (the paper's symbols in brackets)."""

    workers: int = 2
    """Worker processes (nW)."""
    processes: int = 1
    """Lock-free Hogwild processes per worker (p), the worker's own process included."""
    local_steps: int = 1
    """Local steps of each Hogwild process per pull (B)."""
    master_batch: int = 1
    """Updates collected by the server per global update (M)."""
    rho: float = 1.0
    """Global learning rate (ρ)."""
    momentum: float = 0.0
    """Master momentum μ: the server keeps ``m ← μ m + Σ_m w_m`` and applies ``v ← v + ρ m`` (the paper's
    HSA2C runs use "SGD with 0.5 momentum" on the master; 0: Alg. 1 exactly). Dense problems only: a decay
    carried over by momentum would break LDA's convex combination."""
    eta: float = 0.01
    """Local learning rate (η)."""
    eta_decay: float = 0.0
    """κ of the local-rate schedule ``η_t = η (1 + t/τ)^(−κ)``, t = the global update a worker pulled
    (SVI's Robbins-Monro rates; 0: constant η, as in the paper)."""
    eta_offset: float = 10.0
    """τ of that schedule, in global updates."""
    eta_anneal: float = 0.0
    """Fraction of the run's ``global_updates`` (needs them), at its end, over which ``η`` falls linearly to 0:
    1 is A3C's linear schedule over the whole run, 0.2 a constant rate then a cool-down over the last fifth,
    0 none (``true`` / ``false`` read as 1 / 0)."""
    average: float = 0.0
    """Polyak averaging: the server also keeps ``v̄ ← β v̄ + (1 − β) v`` after each global update, with
    ``β = 1 − 1 / (average · global_updates)`` (an average over about that fraction of the run), and records,
    checks against the target and returns ``v̄``; the workers still pull ``v``. It smooths the oscillation
    of constant-rate SGD (Polyak & Juditsky 1992; for A2C, Nikishin et al. 2018). 0: none (needs
    ``global_updates`` otherwise)."""
    rescale_from: tuple[int, int, int] | None = None
    """``(p, B, M)`` that ``rho`` and ``eta`` were tuned for; rescaled to this run's by eq. (13)."""
    global_updates: int | None = 100
    """Stop after this many global updates (T); None: only ``time_limit_s`` stops the run."""
    time_limit_s: float | None = None
    """Stop after this many seconds of optimisation (startup excluded)."""
    update_codec: UpdateCodec = "fp32"
    """Wire codec of the pushed update vectors: fp32, bf16, fp16, zstd (fp32 values, compressed) or bf16+zstd."""
    pull_codec: Codec = "fp32"
    """Wire codec of the pulled global parameters: fp32, bf16 or fp16."""
    pull_delta: bool = True
    """A worker that holds the parameters of an earlier pull is sent only what changed since (the XOR or the
    difference of the pull codec's words with its copy, compressed), when that is smaller than a full copy;
    exact: it ends with the very parameters a full copy gives. False: a full copy every pull."""
    update_format: UpdateFormat = "dense"
    """Pushed updates: ``dense`` (the whole vector), ``columns`` (one decay factor plus the changed columns,
    :mod:`frugalrl.dpsgd.sparse`; needs a problem with ``column_step`` and ``processes == 1``) or ``auto``
    (``columns`` where those hold, else ``dense``)."""
    column_base: ColumnBaseOption = "pulled"
    """``update_format="columns"``: the server decays the ``v`` the worker pulled (``pulled``: exactly the dense
    DPSGD update) or its current ``v`` (``current``: a stale update still gives a convex combination, as in
    gensim's asynchronous SVI); the same without staleness. ``auto``: ``current`` with several workers, else
    ``pulled``."""
    synchronous: bool = False
    """Synchronous baseline: every global update takes exactly one update from each worker, all from the
    same ``v`` (needs ``master_batch == workers``; the classic synchronous SGD also has ``local_steps=1``)."""
    deferred_eval: bool = False
    """Keep the recorded parameters and compute their losses after the run, so that evaluating takes no
    CPU from the workers (timing benchmarks on few cores); a target then cannot stop the run early."""
    transport: TransportName = "local"
    """Transport between server and workers: ``local`` (processes on this machine) or ``ray`` (Ray actors,
    possibly on other machines)."""
    ray_address: str | None = None
    """``transport="ray"``: the cluster to join (``"auto"``, ``"host:port"``); None: a Ray this process has
    already started, else a private single-machine one."""
    startup_timeout_s: float = 120.0
    """How long a worker (with its Hogwild processes) may take to start."""
    worker_timeout_s: float | None = 300.0
    """A worker silent for this long (no push, no pull) is declared hung; None: wait forever."""
    crash_loop_tries: int = 8
    """A worker that dies or hangs is replaced (a new process, or Ray actor, from its config, at once after it
    pushed an update, else after a back-off of 0.25, 0.5, ... up to 4 s); past this many times in a row without a
    push the run stops."""
    on_env_error: EnvErrorRule = "raise"
    """An error a worker reports (HSA2C: its env raised): 'raise' stops the run with the weights it recorded last;
    'restart' replaces the worker as a dead one is."""

    def options(self) -> dict[str, Any]:
        """The DPSGD options of this config, by field name (to build a :class:`DPSGDConfig` from)."""
        return {f.name: getattr(self, f.name) for f in fields(DPSGDOptions)}

    @property
    def budget_updates(self) -> int | None:
        """Global updates the run may make (None: until ``time_limit_s``); HSA2C adds its env-step budget."""
        return self.global_updates

    def validate(self) -> None:
        """Raise ``ValueError`` naming the class and the first bad DPSGD option."""
        super().validate()
        where = type(self).__name__
        for name in ("workers", "processes", "local_steps", "master_batch", "crash_loop_tries"):
            _check_int(where, name, getattr(self, name), 1)
        for name in ("rho", "eta", "eta_offset"):
            _check_positive(where, name, getattr(self, name))
        if isinstance(self.momentum, bool) or not isinstance(self.momentum, (int, float)) or not (
            0 <= self.momentum < 1
        ):
            raise ValueError(f"{where}.momentum must lie in [0, 1), got {self.momentum!r}")
        if self.momentum and self.update_format != "dense":
            raise ValueError(
                f"{where}.momentum needs update_format='dense' (column pushes carry a decay that momentum "
                f"would repeat), got {self.update_format!r}"
            )
        if isinstance(self.eta_decay, bool) or not isinstance(self.eta_decay, (int, float)) or not (
            0 <= self.eta_decay <= 1
        ):
            raise ValueError(f"{where}.eta_decay must lie in [0, 1], got {self.eta_decay!r}")
        if self.global_updates is not None:
            _check_int(where, "global_updates", self.global_updates, 1)
        if self.time_limit_s is not None:
            _check_positive(where, "time_limit_s", self.time_limit_s)
        if self.budget_updates is None and self.time_limit_s is None:
            raise ValueError(f"{where}.global_updates and time_limit_s are both None: the run would never stop")
        # a bool (the older switch) passes as 0 or 1: the worker config carries float(eta_anneal)
        if not isinstance(self.eta_anneal, (int, float)) or not (0 <= self.eta_anneal <= 1):
            raise ValueError(f"{where}.eta_anneal must be a fraction in [0, 1], got {self.eta_anneal!r}")
        if isinstance(self.average, bool) or not isinstance(self.average, (int, float)) or not (
            0 <= self.average <= 1
        ):
            raise ValueError(f"{where}.average must be a fraction in [0, 1], got {self.average!r}")
        for name in ("synchronous", "deferred_eval"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{where}.{name} must be a bool, got {getattr(self, name)!r}")
        if self.synchronous and self.master_batch != self.workers:
            raise ValueError(
                f"{where}.master_batch must equal workers ({self.workers}) when synchronous=True, "
                f"got {self.master_batch}"
            )
        if self.rescale_from is not None:
            try:
                scale_learning_rate(1.0, _parallelism(self.rescale_from), (1, 1, 1))
            except ValueError as e:
                raise ValueError(f"{where}.rescale_from: {e}") from e
        if self.update_format == "columns" and self.processes != 1:
            raise ValueError(
                f"{where}.processes must be 1 with update_format='columns' (Hogwild races would lose decays), "
                f"got {self.processes}"
            )
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            raise ValueError(f"{where}.ray_address must be a non-empty string or None, got {self.ray_address!r}")
        _check_positive(where, "startup_timeout_s", self.startup_timeout_s)
        if self.worker_timeout_s is not None:
            _check_positive(where, "worker_timeout_s", self.worker_timeout_s)

    def resolved_column_base(self) -> ColumnBase:
        """``column_base`` with ``auto`` resolved for this run's number of workers."""
        if self.column_base == "auto":
            return "current" if self.workers > 1 else "pulled"
        return self.column_base

    def as_synchronous_baseline(self) -> Self:
        """This config as the synchronous SGD baseline: ``B = 1``, ``M = workers``, ``synchronous=True``."""
        return replace(self, local_steps=1, master_batch=self.workers, synchronous=True)

    def effective_rates(self) -> tuple[float, float]:
        """``(rho, eta)`` of this run: as given, or rescaled from ``rescale_from`` by eq. (13)."""
        if self.rescale_from is None:
            return float(self.rho), float(self.eta)
        new = (self.processes, self.local_steps, self.master_batch)
        ref = _parallelism(self.rescale_from)
        return scale_learning_rate(self.rho, ref, new), scale_learning_rate(self.eta, ref, new)


@dataclass(kw_only=True)
class DPSGDConfig(DPSGDOptions):
    """Everything a DPSGD run is built from: the options, the problem, the seed and the loss logging."""

    problem: Any
    """Factory of the problem: ``"module:function"`` (or a module-level function), see :mod:`frugalrl.dpsgd.problems`."""
    problem_kwargs: dict[str, Any] = field(default_factory=dict)
    """JSON keyword arguments of the factory (every process builds its own problem from them)."""
    seed: int = 0
    """Seed of every sample stream (one per Hogwild process)."""
    log_every: int = 10
    """Record the loss every this many global updates (0: only at the start and the end)."""
    log_every_s: float | None = None
    """Record the loss at the first global update after every this many seconds of optimisation instead of
    every ``log_every`` updates: one wall-clock cadence for runs whose global updates differ in size (a
    benchmark comparing asynchronous and synchronous variants); None: ``log_every`` counts."""
    target_loss: float | None = None
    """Stop once a recorded loss is at or below this (the summary's ``target`` says when); None: never.
    With ``deferred_eval`` the losses are known only after the run, which then does not stop early."""
    clock_offset: int = 0
    """Global updates that earlier segments of this run made (a resumed run): the local-rate schedule and the
    Polyak average's window run on the whole run's clock, update ``t + clock_offset`` of ``global_updates +
    clock_offset``, so a run resumed halfway through ``eta_anneal`` goes on from half the rate, not from ``η``."""

    def __post_init__(self) -> None:
        if callable(self.problem):
            self.problem = _factory_path(self.problem)
        if isinstance(self.rescale_from, list):  # from JSON or the command line
            self.rescale_from = tuple(self.rescale_from)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        if (
            not isinstance(self.problem, str)
            or self.problem.count(":") != 1
            or not all(self.problem.split(":"))
        ):
            raise ValueError(f"DPSGDConfig.problem must be a 'module:function' string, got {self.problem!r}")
        if not isinstance(self.problem_kwargs, dict):
            raise ValueError(
                f"DPSGDConfig.problem_kwargs must be a dict, got {type(self.problem_kwargs).__name__}"
            )
        try:
            json.dumps(self.problem_kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"DPSGDConfig.problem_kwargs must be JSON-serialisable: {e}") from e
        super().validate()
        _check_int("DPSGDConfig", "seed", self.seed, 0)
        _check_int("DPSGDConfig", "log_every", self.log_every, 0)
        _check_int("DPSGDConfig", "clock_offset", self.clock_offset, 0)
        if self.eta_anneal and self.global_updates is None:
            raise ValueError("DPSGDConfig.eta_anneal needs global_updates (the horizon η anneals to 0 over)")
        if self.average and self.global_updates is None:
            raise ValueError("DPSGDConfig.average needs global_updates (the average spans a fraction of them)")
        if self.log_every_s is not None:
            _check_positive("DPSGDConfig", "log_every_s", self.log_every_s)
        if self.target_loss is not None and (
            isinstance(self.target_loss, bool)
            or not isinstance(self.target_loss, (int, float))
            or not math.isfinite(self.target_loss)
        ):
            raise ValueError(f"DPSGDConfig.target_loss must be a finite number or None, got {self.target_loss!r}")

    def average_decay(self) -> float:
        """β of the server's Polyak average (0: none), from ``average`` and the whole run's global updates."""
        if not self.average or self.run_updates is None:
            return 0.0
        return 1.0 - 1.0 / max(1.0, self.average * self.run_updates)

    @property
    def run_updates(self) -> int | None:
        """Global updates of the whole run: this segment's ``global_updates`` plus ``clock_offset``."""
        return None if self.global_updates is None else self.global_updates + self.clock_offset

    def worker_config(self, worker: int, eta: float) -> dict[str, Any]:
        """The JSON config worker ``worker`` is built from."""
        return {
            "worker": worker,
            "workers": self.workers,
            "processes": self.processes,
            "local_steps": self.local_steps,
            "eta": eta,
            "eta_decay": float(self.eta_decay),
            "eta_offset": float(self.eta_offset),
            "eta_horizon": self.run_updates if self.eta_anneal else None,
            "eta_anneal": float(self.eta_anneal),
            "clock_offset": self.clock_offset,
            "seed": self.seed,
            "problem": self.problem,
            "problem_kwargs": self.problem_kwargs,
            "update_codec": self.update_codec,
            "update_format": self.update_format,
            "column_base": self.resolved_column_base(),
        }


def _parallelism(value: Any) -> tuple[int, int, int]:
    """``rescale_from`` as the ``(p, B, M)`` triple :func:`scale_learning_rate` checks (as given otherwise)."""
    return tuple(value) if isinstance(value, (tuple, list)) else value


def _check_int(where: str, name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{where}.{name} must be an integer >= {minimum}, got {value!r}")


def _check_positive(where: str, name: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{where}.{name} must be a finite number > 0, got {value!r}")


def _factory_path(factory: Any) -> str:
    """``"module:qualname"`` of a module-level function, for processes that import it."""
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", "")
    if module is None or module == "__main__" or "<" in qualname:
        raise ValueError(
            f"DPSGDConfig.problem: {factory!r} cannot be imported by worker processes; "
            "define it in an importable module and pass 'module:function'"
        )
    return f"{module}:{qualname}"
