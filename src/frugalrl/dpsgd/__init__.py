"""DPSGD: Distributed Parallel SGD with lock-free (Hogwild) workers (seed paper 002, Alg. 1 and 2).

A parameter server keeps the global parameters ``v`` and applies ``v ← v + ρ Σ_m w_m`` once it has
``M`` update vectors; each worker process pulls ``v``, lets ``p`` lock-free processes take ``B``
SGD steps each on a shared copy ``u``, and pushes ``u - v``. See :func:`run_dpsgd`.

Nothing here imports torch: worker processes start in a fraction of a second.
"""

from frugalrl.dpsgd.optimizer import TRANSPORTS, DPSGDConfig, DPSGDError, LocalTransport, Transport, run_dpsgd
from frugalrl.dpsgd.problems import LeastSquares, LogisticRegression, Problem, load_problem
from frugalrl.dpsgd.rates import decayed_rate, scale_learning_rate
from frugalrl.dpsgd.server import ParameterServer, apply_update
from frugalrl.dpsgd.worker import DPSGDWorker, SharedVector, hogwild_steps, make_rng

__all__ = [
    "TRANSPORTS",
    "DPSGDConfig",
    "DPSGDError",
    "DPSGDWorker",
    "LeastSquares",
    "LocalTransport",
    "LogisticRegression",
    "ParameterServer",
    "Problem",
    "SharedVector",
    "Transport",
    "apply_update",
    "decayed_rate",
    "hogwild_steps",
    "load_problem",
    "make_rng",
    "run_dpsgd",
    "scale_learning_rate",
]
