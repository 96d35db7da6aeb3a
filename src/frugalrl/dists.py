"""Action distributions as plain functions of their parameters, with closed-form KL.

A policy's output is a parameter tensor ``params``, of shape ``(..., P)`` but for the multi-categorical's rows:

- ``"categorical"``: ``P = n`` logits;
- ``"gaussian"``: ``P = 2 * d``, the mean then the log standard deviation (diagonal);
- ``"multi_categorical"`` (MultiDiscrete actions): ``(..., k, m)``, a row of logits for each of the ``k``
  sub-actions, padded to the largest ``m`` with :data:`PAD_LOGIT` (probability 0);
- ``"bernoulli"`` (MultiBinary actions): ``P = n`` logits, one independent bit each.

These parameters are what travels with each transition as the *behaviour distribution*, so
that the learner can compute log-probabilities, importance ratios and KL divergences without
the worker's weights.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from frugalrl import action_heads

DistKind = Literal["categorical", "gaussian", "multi_categorical", "bernoulli"]
"""The action distributions: ``categorical`` (Discrete actions), ``gaussian`` (Box actions), ``multi_categorical``
(MultiDiscrete actions) and ``bernoulli`` (MultiBinary actions)."""
KINDS: tuple[DistKind, ...] = get_args(DistKind)
PAD_LOGIT = action_heads.PAD_LOGIT
"""The logit of a multi-categorical row's padding: finite, so that its probability is exactly 0 without NaNs."""


def _split(params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = params.shape[-1] // 2
    return params[..., :d], params[..., d:]


def sample(kind: DistKind, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one action per row of ``params`` (categorical: int64 indices; multi-categorical: int64 ``(..., k)``;
    Bernoulli: int8 bits; gaussian: float32)."""
    if kind == "categorical":
        probs = torch.softmax(params, dim=-1)
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(
            params.shape[:-1]
        )
    if kind == "gaussian":
        mean, log_std = _split(params)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        return mean + noise * log_std.exp()
    if kind == "multi_categorical":  # a categorical draw per sub-action row
        return sample("categorical", params, generator)
    if kind == "bernoulli":
        return (torch.rand(params.shape, generator=generator, dtype=params.dtype) < torch.sigmoid(params)).to(torch.int8)
    raise ValueError(f"unknown distribution kind {kind!r}; expected one of {KINDS}")


def mode(kind: DistKind, params: torch.Tensor) -> torch.Tensor:
    """The most likely action (for deterministic evaluation)."""
    if kind in ("categorical", "multi_categorical"):
        return params.argmax(dim=-1)
    if kind == "bernoulli":
        return (params > 0).to(torch.int8)
    return _split(params)[0]


def log_prob(kind: DistKind, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log π(a | params), summed over action dimensions (the Gaussian's, the sub-actions, the bits)."""
    if kind == "categorical":
        logp = F.log_softmax(params, dim=-1)
        return logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    if kind == "multi_categorical":
        return log_prob("categorical", params, actions).sum(-1)
    if kind == "bernoulli":
        bits = actions.to(params.dtype)
        return (bits * F.logsigmoid(params) + (1 - bits) * F.logsigmoid(-params)).sum(-1)
    mean, log_std = _split(params)
    z = (actions.reshape(mean.shape) - mean) / log_std.exp()  # a Box of several dimensions: its actions, flat
    return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def entropy(kind: DistKind, params: torch.Tensor) -> torch.Tensor:
    """Entropy of each distribution."""
    if kind == "categorical":
        logp = F.log_softmax(params, dim=-1)
        return -(logp.exp() * logp).sum(-1)
    if kind == "multi_categorical":
        return entropy("categorical", params).sum(-1)
    if kind == "bernoulli":
        p = torch.sigmoid(params)
        return -(p * F.logsigmoid(params) + (1 - p) * F.logsigmoid(-params)).sum(-1)
    return _gaussian_entropy(_split(params)[1])


def _gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


def entropy_bonus(kind: DistKind, params: torch.Tensor, max_log_std: torch.Tensor | None = None) -> torch.Tensor:
    """The entropy an entropy bonus rewards: :func:`entropy`, with a Gaussian's log-std counted at most
    ``max_log_std`` (per action dimension; the agent's :attr:`~frugalrl.nets.ActorCritic.max_entropy_log_std`).

    Box actions are clipped to the box, so a Gaussian wider than half the box gains no exploration, only
    actions piled on the bounds; yet its entropy keeps growing with ``log σ``. With an adaptive optimiser
    (RMSProp, Adam) the bonus's constant gradient on ``log σ`` is a fixed-size step, which nothing opposes once
    the clipped actions stop depending on ``σ``, until the mean stops learning (docs/benchmarks.md#hsa2c-pendulum).
    Capped, the bonus stops at half the box and the policy gradient alone decides beyond.
    """
    if kind != "gaussian" or max_log_std is None:
        return entropy(kind, params)
    log_std = _split(params)[1]
    return _gaussian_entropy(torch.minimum(log_std, max_log_std.to(log_std)))


def kl(kind: DistKind, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Closed-form KL(p ‖ q) per row, for parameters of the same kind and shape."""
    if p.shape != q.shape:
        raise ValueError(f"KL between parameters of different shapes {tuple(p.shape)} and {tuple(q.shape)}")
    if kind == "categorical":
        logp = F.log_softmax(p, dim=-1)
        logq = F.log_softmax(q, dim=-1)
        return (logp.exp() * (logp - logq)).sum(-1)
    if kind == "multi_categorical":
        return kl("categorical", p, q).sum(-1)
    if kind == "bernoulli":
        pp = torch.sigmoid(p)
        return (pp * (F.logsigmoid(p) - F.logsigmoid(q)) + (1 - pp) * (F.logsigmoid(-p) - F.logsigmoid(-q))).sum(-1)
    if kind == "gaussian":
        mp, lsp = _split(p)
        mq, lsq = _split(q)
        var_p, var_q = (2 * lsp).exp(), (2 * lsq).exp()
        return (lsq - lsp + (var_p + (mp - mq).pow(2)) / (2 * var_q) - 0.5).sum(-1)
    raise ValueError(f"unknown distribution kind {kind!r}; expected one of {KINDS}")


def kl_monte_carlo(
    kind: DistKind, p: torch.Tensor, q: torch.Tensor, n: int = 10_000, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Monte-Carlo estimate of KL(p ‖ q): mean of log p(a) - log q(a) over ``n`` samples a ~ p."""
    expanded = p.unsqueeze(0).expand(n, *p.shape)
    a = sample(kind, expanded, generator)
    return (log_prob(kind, expanded, a) - log_prob(kind, q.unsqueeze(0).expand(n, *q.shape), a)).mean(0)
