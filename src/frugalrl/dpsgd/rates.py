"""Learning-rate rescaling of DPSGD (the DPSGD paper, Corollary 1 and eq. 13).

When the amount of parallelism changes, from ``p`` Hogwild processes, ``B`` local steps and a master batch of
``M`` updates to ``p'``, ``B'`` and ``M'``, the paper keeps the convergence bound by scaling both the
global rate ``ρ`` and the local rate ``η`` with the fourth root of the ratio::

    ρ' = ρ (p B M / (p' B' M'))^(1/4)                                                     (13)
"""

from __future__ import annotations

import math

Parallelism = tuple[int, int, int]
"""``(p, B, M)``: Hogwild processes per worker, local steps per process, master batch."""


def _check_parallelism(value: Parallelism, name: str) -> tuple[int, int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise ValueError(f"{name} must be a tuple (p, B, M) of three positive integers, got {value!r}")
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a tuple (p, B, M) of three positive integers, got {value!r}")
    return int(value[0]), int(value[1]), int(value[2])


def scale_learning_rate(rate: float, ref: Parallelism, new: Parallelism) -> float:
    """Eq. (13): ``rate * (p*B*M / (p2*B2*M2)) ** 0.25`` for ``ref=(p, B, M)`` and ``new=(p2, B2, M2)``.

    >>> scale_learning_rate(0.1, (1, 1, 1), (1, 1, 16))
    0.05
    """
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
        raise ValueError(f"rate must be a finite number, got {rate!r}")
    p, b, m = _check_parallelism(ref, "ref")
    p2, b2, m2 = _check_parallelism(new, "new")
    return float(rate) * (p * b * m / (p2 * b2 * m2)) ** 0.25


def decayed_rate(
    eta: float, t: int, decay: float, offset: float, horizon: int | None = None, anneal: float = 1.0
) -> float:
    """``η_t = η (1 + t/τ)^(−κ)`` for ``decay`` κ and ``offset`` τ; κ = 0 keeps ``η``; with a ``horizon`` T,
    times ``clip((T − t) / (anneal · T), 0, 1)``: linear annealing to 0 at global update T over its last
    ``anneal`` fraction (1: from the start).

    SVI's Robbins-Monro schedule ``(τ0 + t)^(−κ)`` (Hoffman et al. 2013), scaled so that ``η_0 = η``; the
    linear one is A3C's and A2C's (Mnih et al. 2016; rl-zoo's ``lin_`` rates). DPSGD workers use ``t`` =
    the global update they pulled, so every process follows one clock.

    >>> decayed_rate(0.3, 90, 0.5, 10.0)
    0.09486832980505137
    >>> decayed_rate(0.3, 25, 0.0, 10.0, horizon=100)
    0.22499999999999998
    >>> decayed_rate(0.3, 25, 0.0, 10.0, horizon=100, anneal=0.2), decayed_rate(0.3, 90, 0.0, 10.0, 100, 0.2)
    (0.3, 0.15)
    """
    rate = float(eta) if decay == 0 else float(eta) * (1.0 + t / offset) ** (-decay)
    if horizon is not None and anneal > 0:
        rate *= min(1.0, max(0.0, (horizon - t) / (anneal * horizon)))
    return rate
