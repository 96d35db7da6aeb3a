"""DPSGD: :func:`run_dpsgd` and the registry of transports.

Distributed Parallel SGD (the DPSGD paper, Alg. 1 and 2)::

    cfg = DPSGDConfig(problem="frugalrl.dpsgd.problems:least_squares", problem_kwargs={"dim": 20},
                      workers=2, processes=2, local_steps=10, master_batch=2, rho=1.0, eta=0.01,
                      global_updates=200)
    summary = run_dpsgd(cfg)   # summary["params"], summary["loss_curve"], summary["bytes"], ...

The server (:class:`~frugalrl.dpsgd.server.ParameterServer`) lives in the calling process; the transport
``cfg.transport`` names (:data:`TRANSPORTS`) starts the workers and carries their messages to it:
``local`` (:class:`~frugalrl.dpsgd.transport.LocalTransport`, processes on this machine) or ``ray``
(:class:`~frugalrl.dpsgd.ray_transport.RayTransport`, Ray actors, possibly on other machines; imported
only when used, as Ray is optional). :func:`dpsgd_records` polls the server: it records the loss every
``log_every`` global updates or ``log_every_s`` seconds (or keeps the parameters to score after the run), stops on
``global_updates``, ``time_limit_s`` or ``target_loss``, and raises the first failure.
"""

from __future__ import annotations

import math
import time
import typing
from collections.abc import Callable, Generator
from dataclasses import asdict
from typing import Any

import numpy as np

from frugalrl.dpsgd.config import DPSGDConfig
from frugalrl.dpsgd.problems import check_problem, check_vector, load_problem
from frugalrl.dpsgd.server import ParameterServer
from frugalrl.dpsgd.transport import DPSGDError, LocalTransport, Transport
from frugalrl.wire.meter import ByteMeter


def _ray_transport(*args: Any, **kwargs: Any) -> Transport:
    """:class:`~frugalrl.dpsgd.ray_transport.RayTransport`, imported on first use (Ray is optional)."""
    from frugalrl.dpsgd.ray_transport import RayTransport

    return RayTransport(*args, **kwargs)


TRANSPORTS: dict[str, Callable[..., Transport]] = {"local": LocalTransport, "ray": _ray_transport}
"""Transport factories by ``DPSGDConfig.transport`` name (the names of :data:`~frugalrl.dpsgd.config.TransportName`)."""

_STOP_GRACE_S = 5.0  # after the stop, how long to let workers finish their round before killing them


# ---------------------------------------------------------------------------------------- the run
Recorder = Callable[[float, int, float, np.ndarray], None]
"""Called with ``(seconds, global_update, loss, params)`` for every recorded loss, in order."""


def run_dpsgd(
    cfg: DPSGDConfig, problem: Any = None, *, initial: np.ndarray | None = None, on_record: Recorder | None = None
) -> dict[str, Any]:
    """Run DPSGD as ``cfg`` says and return a summary: :func:`dpsgd_records` to its end, each record handed to
    ``on_record`` (see :data:`Recorder`)."""
    records = dpsgd_records(cfg, problem, initial=initial)
    while True:
        try:
            record = next(records)
        except StopIteration as end:
            return typing.cast(dict[str, Any], end.value)
        if on_record is not None:
            on_record(*record)


def dpsgd_records(
    cfg: DPSGDConfig, problem: Any = None, *, initial: np.ndarray | None = None
) -> Generator[tuple[float, int, float, np.ndarray], str | None, dict[str, Any]]:
    """Run DPSGD as ``cfg`` says, yielding ``(seconds, global_update, loss, params)`` for every recorded loss
    while the server runs; the generator's return value is the summary. ``send("stop")`` in place of ``next``
    stops the server (``stop_reason`` "requested") and the records end soon after; closing the generator
    early stops the workers too, without a summary.

    Summary keys: ``params`` (final ``v``, or its Polyak average with ``average``; after a target stop, the
    parameters whose loss met the target), ``final_loss``, ``loss_curve`` ``[(seconds, global_update, loss)]``,
    ``global_updates`` (T reached), ``params_version`` (the global update ``params`` are from), ``staleness``
    (``mean``, ``max``, ``histogram``), ``bytes`` (the :meth:`ByteMeter.summary`, with ``up``/``down`` by kind),
    ``pulls``, ``pushes``, ``applied_updates``, ``dropped_updates``, ``gradient_steps``, ``updates_per_second``,
    ``wall_time_s`` (optimisation), ``startup_s``, ``stop_reason``, ``target`` (``{seconds, global_update, loss}``
    of the first recorded loss at or below ``target_loss``, or None), ``rho``/``eta`` (as used), ``config``.

    ``problem`` is the head's instance (its ``loss`` scores the recorded parameters), or None to build it from
    ``cfg``; ``initial``: start from these parameters instead of ``init_params()`` (a resumed run). Raises
    ``ValueError`` for a bad config or problem (naming it), :class:`DPSGDError` when a worker dies, hangs or
    breaks the protocol.
    """
    cfg.validate()
    rho, eta = cfg.effective_rates()
    name = cfg.problem
    if problem is None:
        problem = load_problem(name, cfg.problem_kwargs)
    v0 = check_problem(problem, name, np.random.default_rng(cfg.seed))
    if initial is not None:
        v0 = check_vector(np.asarray(initial, dtype=np.float32), v0.size, name, "the initial parameters")
    server = ParameterServer(
        v0,
        rho=rho,
        momentum=cfg.momentum,
        master_batch=cfg.master_batch,
        workers=cfg.workers,
        global_updates=cfg.global_updates,
        synchronous=cfg.synchronous,
        log_every=cfg.log_every,
        log_every_s=cfg.log_every_s,
        pull_codec=cfg.pull_codec,
        pull_delta=cfg.pull_delta,
        name=name,
        average_decay=cfg.average_decay(),
    )
    meter = ByteMeter()
    # the size travels with the config, so that a worker need not build a starting point only to measure it
    configs = [{**cfg.worker_config(w, eta), "size": int(v0.size)} for w in range(cfg.workers)]
    extra = {"ray_address": cfg.ray_address} if cfg.transport == "ray" else {}
    transport = TRANSPORTS[cfg.transport](
        server, meter, configs, cfg.startup_timeout_s, cfg.worker_timeout_s, **extra,
        crash_loop_tries=cfg.crash_loop_tries, on_env_error=cfg.on_env_error,
    )
    curve: list[tuple[float, int, float]] = [(0.0, 0, float(problem.loss(v0)))]
    yield (*curve[0], v0)
    deferred: list[tuple[float, int, np.ndarray]] = []
    reached: tuple[int, np.ndarray] | None = None
    goal = -math.inf if cfg.target_loss is None else cfg.target_loss
    if curve[0][2] <= goal:
        server.stop("target_loss")  # the workers start, get "stop" at their first pull, and exit
    t_start = time.monotonic()
    try:
        transport.start()
        startup_s = time.monotonic() - t_start
        server.start_clock()
        transport.serve()
        stopped_at = None
        while True:
            stopped = server.wait(0.1)
            for seconds, version, v in server.drain_snapshots():
                if reached is not None:
                    break  # snapshots the server took before it saw the stop: the run's result is already chosen
                if cfg.deferred_eval:
                    deferred.append((seconds, version, v))  # v is never modified in place: no copy
                    continue
                curve.append((seconds, version, float(problem.loss(v))))
                command = yield (*curve[-1], v)
                if curve[-1][2] <= goal:
                    server.stop("target_loss")
                    reached = (version, v)  # the run's result: what met the target, not what came after
                    break  # later snapshots are not worth evaluating
                if command == "stop":
                    server.stop("requested")  # the consumer ends the run (``generator.send("stop")``)
            if server.failure is not None:
                break
            if not stopped and cfg.time_limit_s is not None and server.elapsed() >= cfg.time_limit_s:
                server.stop("time_limit")
                continue
            if stopped:
                stopped_at = stopped_at or time.monotonic()
                if transport.finished() or time.monotonic() - stopped_at > _STOP_GRACE_S:
                    break
    finally:
        transport.close()
    if server.failure is not None:
        kind, message = server.failure
        raise (ValueError if kind == "ValueError" else DPSGDError)(f"DPSGD failed: {message}") from transport.gave_up

    for seconds, version, v in deferred:
        curve.append((seconds, version, float(problem.loss(v))))
        yield (*curve[-1], v)
    made, last = server.result()
    version, params = reached or (made, last)
    if curve[-1][1] == version:  # the last recorded loss is the final parameters' (v is never modified)
        final_loss = curve[-1][2]
    else:
        final_loss = float(problem.loss(params))
        curve.append((server.elapsed(), version, final_loss))
        yield (*curve[-1], params)
    target = next(
        ({"seconds": t, "global_update": u, "loss": loss} for t, u, loss in curve if loss <= goal), None
    )
    wall = server.elapsed()
    return {
        "params": params.copy(),
        "final_loss": final_loss,
        "loss_curve": curve,
        "global_updates": made,
        "params_version": version,
        "staleness": server.staleness_stats(),
        "bytes": meter.summary(),
        "pulls": server.pulls,
        "pushes": server.pushes,
        "applied_updates": server.applied_updates,
        "dropped_updates": server.dropped_updates,
        "gradient_steps": server.gradient_steps,
        "restart_events": transport.restart_events,
        "updates_per_second": made / wall if wall > 0 else 0.0,
        "wall_time_s": wall,
        "startup_s": startup_s,
        "stop_reason": server.stop_reason,
        "target": target,
        "rho": rho,
        "eta": eta,
        "config": asdict(cfg),
    }
