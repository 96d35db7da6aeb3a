"""DPSGD: Distributed Parallel SGD with lock-free (Hogwild) workers (the DPSGD paper, Alg. 1 and 2).

A parameter server keeps the global parameters ``v`` and applies ``v ← v + ρ Σ_m w_m`` once it has
``M`` update vectors; each worker process pulls ``v``, lets ``p`` lock-free processes take ``B``
SGD steps each on a shared copy ``u``, and pushes ``u - v``. See :func:`run_dpsgd`.

The modules: ``config`` (:class:`DPSGDOptions`, :class:`DPSGDConfig`), ``run`` (:func:`run_dpsgd`, the
registry of transports), ``transport`` (:class:`Transport`, :class:`LocalTransport`, :class:`DPSGDError`),
``ray_transport`` (Ray actors), ``server``, ``worker`` (Hogwild processes on shared memory), ``rates``,
``problems``, ``lda`` (DPSVI) and ``corpora``.

The public names below are imported on first use (PEP 562), and nothing here imports torch: a worker
process, which imports ``frugalrl.dpsgd.worker``, starts in a fraction of a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from frugalrl.lazy import lazy_names

if TYPE_CHECKING:  # the names as the type checker sees them; at run time they come from __getattr__
    from frugalrl.dpsgd.config import DPSGDConfig, DPSGDOptions
    from frugalrl.dpsgd.problems import LeastSquares, LogisticRegression, Problem, load_problem
    from frugalrl.dpsgd.rates import decayed_rate, scale_learning_rate
    from frugalrl.dpsgd.run import TRANSPORTS, run_dpsgd
    from frugalrl.dpsgd.server import ParameterServer, apply_update
    from frugalrl.dpsgd.transport import DPSGDError, LocalTransport, Transport
    from frugalrl.dpsgd.worker import DPSGDWorker, SharedVector, hogwild_steps, make_rng

_PUBLIC = {
    "TRANSPORTS": "frugalrl.dpsgd.run",
    "DPSGDConfig": "frugalrl.dpsgd.config",
    "DPSGDError": "frugalrl.dpsgd.transport",
    "DPSGDOptions": "frugalrl.dpsgd.config",
    "DPSGDWorker": "frugalrl.dpsgd.worker",
    "LeastSquares": "frugalrl.dpsgd.problems",
    "LocalTransport": "frugalrl.dpsgd.transport",
    "LogisticRegression": "frugalrl.dpsgd.problems",
    "ParameterServer": "frugalrl.dpsgd.server",
    "Problem": "frugalrl.dpsgd.problems",
    "SharedVector": "frugalrl.dpsgd.worker",
    "Transport": "frugalrl.dpsgd.transport",
    "apply_update": "frugalrl.dpsgd.server",
    "decayed_rate": "frugalrl.dpsgd.rates",
    "hogwild_steps": "frugalrl.dpsgd.worker",
    "load_problem": "frugalrl.dpsgd.problems",
    "make_rng": "frugalrl.dpsgd.worker",
    "run_dpsgd": "frugalrl.dpsgd.run",
    "scale_learning_rate": "frugalrl.dpsgd.rates",
}

__all__ = [
    "DPSGDConfig",
    "DPSGDError",
    "DPSGDOptions",
    "DPSGDWorker",
    "LeastSquares",
    "LocalTransport",
    "LogisticRegression",
    "ParameterServer",
    "Problem",
    "SharedVector",
    "TRANSPORTS",
    "Transport",
    "apply_update",
    "decayed_rate",
    "hogwild_steps",
    "load_problem",
    "make_rng",
    "run_dpsgd",
    "scale_learning_rate",
]


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
