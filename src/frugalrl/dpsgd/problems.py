"""Optimisation problems for DPSGD: the interface, how a problem is loaded, and two convex examples.

A *problem* is user code that every process (the server and each Hogwild process of each worker)
builds for itself from an importable factory ``"module:function"`` and JSON keyword arguments. It
must provide:

- ``init_params() -> np.ndarray``: the starting point, a flat float32 vector;
- ``stochastic_grad(params, rng) -> np.ndarray``: a stochastic gradient at ``params`` (same shape,
  float32; it may be mostly zeros), drawing its sample(s) from the ``np.random.Generator`` ``rng``;
- ``loss(params) -> float``: the full objective, for monitoring and evaluation (server side only);
- optionally ``set_rate(eta)``: called by each Hogwild process before a round's steps with their rate ``η``,
  for a problem whose vector also holds state that no gradient moves (HSA2C's observation statistics return
  their change divided by ``η``, so that the step ``u − η g`` makes it);
- optionally ``set_version(t)``: called with ``set_rate``, with the global update ``t`` the round's parameters were
  pulled at, on the whole run's clock (a resumed run's segment adds the updates of the earlier ones,
  ``DPSGDConfig.clock_offset``): the clock the rate schedules run on; HSA2C anneals its entropy bonus by it.

Both examples build a seeded synthetic dataset, so every process that calls the factory with the
same arguments holds the same data, and both know their optimum:

- :class:`LeastSquares`: ``f(x) = 1/(2n) ||A x - b||²``, optimum in closed form;
- :class:`LogisticRegression`: L2-regularised logistic loss, optimum found by Newton's method.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Problem(Protocol):
    """What DPSGD needs from an optimisation problem."""

    def init_params(self) -> np.ndarray:
        """The starting parameters: a flat float32 vector."""
        ...

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A stochastic gradient at ``params`` (same shape, float32), sampling with ``rng``."""
        ...

    def loss(self, params: np.ndarray) -> float:
        """The full objective at ``params``."""
        ...


def load_problem(spec: str, kwargs: dict[str, Any] | None = None) -> Problem:
    """Import the factory ``spec`` (``"module:function"``) and call it with ``kwargs``.

    Raises ``ValueError`` naming ``spec`` if the module does not import, the function is missing, the
    call fails, or the object it returns lacks one of the three methods.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"DPSGDConfig.problem must be a 'module:function' string, got {spec!r}")
    module_name, qualname = spec.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix: say which
        raise ValueError(
            f"problem {spec!r}: module {module_name!r} cannot be imported: {type(e).__name__}: {e}"
        ) from e
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"problem {spec!r}: {module_name!r} has no attribute {qualname!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"problem {spec!r} is not callable")
    try:
        problem = obj(**(kwargs or {}))
    except Exception as e:  # noqa: BLE001 - reported with the factory's name
        raise ValueError(
            f"problem {spec!r} could not be built with {kwargs!r}: {type(e).__name__}: {e}"
        ) from e
    for method in ("init_params", "stochastic_grad", "loss"):
        if not callable(getattr(problem, method, None)):
            raise ValueError(
                f"problem {spec!r} returned {type(problem).__name__}, which has no {method}() method"
            )
    return problem


def check_vector(x: Any, size: int | None, name: str, what: str) -> np.ndarray:
    """``x`` as a flat, finite float32 vector (of ``size`` elements if given), else ``ValueError`` naming the problem."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"problem {name!r}: {what} returned dtype {arr.dtype}, expected float32")
    if arr.ndim != 1 or (size is not None and arr.shape[0] != size) or arr.shape[0] == 0:
        expected = f"({size},)" if size is not None else "a non-empty flat vector"
        raise ValueError(f"problem {name!r}: {what} returned shape {arr.shape}, expected {expected}")
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(
            f"problem {name!r}: {what} returned {bad} non-finite value(s) (NaN or inf); "
            "if this happens after a while, the run diverged: lower eta or rho"
        )
    return arr


def check_problem(problem: Problem, name: str, rng: np.random.Generator) -> np.ndarray:
    """Call each method once; return the initial parameters (raises ``ValueError`` naming the problem)."""
    params = check_vector(problem.init_params(), None, name, "init_params()")
    check_vector(problem.stochastic_grad(params.copy(), rng), params.size, name, "stochastic_grad()")
    loss = problem.loss(params.copy())
    try:
        loss = float(loss)
    except (TypeError, ValueError) as e:
        raise ValueError(f"problem {name!r}: loss() returned {loss!r}, expected a float") from e
    if not math.isfinite(loss):
        raise ValueError(f"problem {name!r}: loss() at init_params() is {loss}")
    return params


# --------------------------------------------------------------------------------------- examples
class LeastSquares:
    """Linear least squares ``f(x) = 1/(2n) ||A x - b||²`` on a seeded Gaussian design.

    Rows of ``A`` are standard normal, ``b = A x_true + noise * ε``. Each stochastic gradient uses a
    minibatch of ``batch_size`` rows drawn with replacement. The optimum is the least-squares
    solution (closed form), available as :attr:`optimum` and :attr:`optimal_loss`.
    """

    def __init__(
        self, n: int = 1000, dim: int = 20, noise: float = 0.1, batch_size: int = 1, seed: int = 0
    ) -> None:
        rng = np.random.default_rng(seed)
        a = rng.standard_normal((n, dim))
        x_true = rng.standard_normal(dim)
        b = a @ x_true + noise * rng.standard_normal(n)
        self.a = a.astype(np.float32)
        self.b = b.astype(np.float32)
        self.batch_size = int(batch_size)
        self.x_true = x_true.astype(np.float32)
        a64, b64 = self.a.astype(np.float64), self.b.astype(np.float64)
        self.optimum = np.linalg.lstsq(a64, b64, rcond=None)[0]
        self.optimal_loss = self.loss(self.optimum)

    def init_params(self) -> np.ndarray:
        """Zeros."""
        return np.zeros(self.a.shape[1], dtype=np.float32)

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``A_I^T (A_I x - b_I) / |I|`` for a random minibatch ``I``."""
        idx = rng.integers(self.a.shape[0], size=self.batch_size)
        rows = self.a[idx]
        residual = rows @ params - self.b[idx]
        return (rows.T @ residual) / np.float32(self.batch_size)

    def loss(self, params: np.ndarray) -> float:
        """``1/(2n) ||A x - b||²`` (computed in float64)."""
        residual = self.a.astype(np.float64) @ np.asarray(params, dtype=np.float64) - self.b
        return float(0.5 * np.mean(residual**2))


class LogisticRegression:
    """L2-regularised logistic regression ``f(x) = mean log(1 + exp(-y a·x)) + l2/2 ||x||²``.

    Features are standard normal, labels ``y ∈ {-1, +1}`` are drawn from a logistic model with a
    random true weight vector. With ``l2 > 0`` the problem is strongly convex; its optimum is found
    at construction by Newton's method (float64) and kept as :attr:`optimum` / :attr:`optimal_loss`.
    """

    def __init__(
        self, n: int = 1000, dim: int = 20, l2: float = 1e-2, batch_size: int = 1, seed: int = 0
    ) -> None:
        rng = np.random.default_rng(seed)
        a = rng.standard_normal((n, dim)) / math.sqrt(dim)
        x_true = 3.0 * rng.standard_normal(dim)
        prob = 1.0 / (1.0 + np.exp(-(a @ x_true)))
        y = np.where(rng.random(n) < prob, 1.0, -1.0)
        self.a = a.astype(np.float32)
        self.y = y.astype(np.float32)
        self.l2 = float(l2)
        self.batch_size = int(batch_size)
        self.optimum = self._newton()
        self.optimal_loss = self.loss(self.optimum)

    def _newton(self, iters: int = 50) -> np.ndarray:
        a, y = self.a.astype(np.float64), self.y.astype(np.float64)
        n, dim = a.shape
        x = np.zeros(dim)
        for _ in range(iters):
            margin = y * (a @ x)
            s = 1.0 / (1.0 + np.exp(margin))  # σ(-y a·x)
            grad = -(a.T @ (y * s)) / n + self.l2 * x
            hess = (a.T * (s * (1.0 - s))) @ a / n + self.l2 * np.eye(dim)
            step = np.linalg.solve(hess, grad)
            x -= step
            if np.linalg.norm(step) < 1e-12:
                break
        return x

    def init_params(self) -> np.ndarray:
        """Zeros."""
        return np.zeros(self.a.shape[1], dtype=np.float32)

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Minibatch gradient of the logistic loss plus the L2 term."""
        idx = rng.integers(self.a.shape[0], size=self.batch_size)
        rows, y = self.a[idx], self.y[idx]
        s = 0.5 * (1.0 - np.tanh(0.5 * y * (rows @ params)))  # σ(-y a·x), overflow-free
        grad = -(rows.T @ (y * s)) / np.float32(self.batch_size) + np.float32(self.l2) * params
        return grad.astype(np.float32, copy=False)

    def loss(self, params: np.ndarray) -> float:
        """Mean logistic loss plus ``l2/2 ||x||²`` (computed in float64)."""
        x = np.asarray(params, dtype=np.float64)
        margin = self.y.astype(np.float64) * (self.a.astype(np.float64) @ x)
        return float(np.mean(np.logaddexp(0.0, -margin)) + 0.5 * self.l2 * x @ x)


def least_squares(**kwargs: Any) -> LeastSquares:
    """Factory for :class:`LeastSquares` (``"frugalrl.dpsgd.problems:least_squares"``)."""
    return LeastSquares(**kwargs)


def logistic_regression(**kwargs: Any) -> LogisticRegression:
    """Factory for :class:`LogisticRegression` (``"frugalrl.dpsgd.problems:logistic_regression"``)."""
    return LogisticRegression(**kwargs)
