"""A small MLP actor's forward pass and sampling in numpy, for worker-side inference.

A worker acts on a handful of observations per step (its own envs). There, PyTorch's per-call overhead dominates:
a 64×64 MLP's ``dist_params`` plus ``sample`` on 8 observations costs about ten times what the same arithmetic
costs in numpy. :class:`NumpyActor` takes the actor of an :class:`~frugalrl.nets.MLPActorCritic` (Linear layers
with tanh or ReLU, an optional :class:`~frugalrl.normalize.ObsNormalizer` in front, a categorical or state-independent
Gaussian head) and computes the same distribution parameters in float32 (equal to PyTorch's up to the rounding of
a different summation order), then samples with uniforms or normals drawn from the worker's own
``torch.Generator``, so that a checkpointed worker resumes its random stream exactly as before. Other agents (CNNs,
gSDE, user modules) keep PyTorch (:meth:`NumpyActor.of` returns None for them).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np
import torch
from torch import nn


@functools.cache
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """numpy's BLAS on one thread while inside (the previous limits come back after; the BLAS libraries are those
    loaded at the first call, numpy's among them). For the head's batches of states (the recomputed behaviour): a
    multi-threaded BLAS call there leaves its threads spinning on the cores that the worker processes step their
    envs on, as worker processes run theirs on one thread."""
    return _blas_controller().limit(limits=1, user_api="blas")


class NumpyActor:
    """The actor of an MLP agent as numpy arrays (a copy: rebuild it after the agent's weights change)."""

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray, str | None]], kind: str,
                 log_std: np.ndarray | None, norm: tuple[np.ndarray, np.ndarray, float] | None) -> None:
        self.layers = layers  # (weight (in, out), bias, activation after it or None)
        self.kind = kind
        self.log_std = log_std
        self.norm = norm  # (mean, 1 / sqrt(var + 1e-8), clip), float64 as ObsNormalizer computes

    @classmethod
    def of(cls, agent: Any) -> NumpyActor | None:
        """The numpy actor of ``agent``, or None if it is not a plain MLP agent this module reproduces."""
        from frugalrl.nets import MLPActorCritic

        if type(agent) is not MLPActorCritic or agent.sde or not isinstance(agent.actor, nn.Sequential):
            return None
        layers: list[tuple[np.ndarray, np.ndarray, str | None]] = []
        for module in agent.actor:
            if isinstance(module, nn.Linear) and module.bias is not None:
                layers.append((module.weight.detach().numpy().T.astype(np.float32, order="C"),
                               module.bias.detach().numpy().astype(np.float32), None))
            elif isinstance(module, nn.Tanh | nn.ReLU) and layers and layers[-1][2] is None:
                w, b, _ = layers[-1]
                layers[-1] = (w, b, "tanh" if isinstance(module, nn.Tanh) else "relu")
            else:
                return None
        norm = None
        if agent.obs_norm is not None:
            n = agent.obs_norm
            norm = (n.mean.detach().numpy().astype(np.float64),
                    1.0 / np.sqrt(n.var.detach().numpy().astype(np.float64) + 1e-8), float(n.clip))
        log_std = None if agent.dist_kind != "gaussian" else agent.log_std.detach().numpy().astype(np.float32)
        return cls(layers, agent.dist_kind, log_std, norm)

    def params(self, obs: np.ndarray) -> np.ndarray:
        """The distribution parameters of ``dist_params`` (logits; or mean, then log-std), float32."""
        x = obs.reshape(obs.shape[0], -1)
        if self.norm is not None:
            mean, inv_std, clip = self.norm
            x = np.clip((x.astype(np.float64) - mean) * inv_std, -clip, clip)
        x = x.astype(np.float32, copy=False)
        for w, b, act in self.layers:
            x = x @ w
            x += b
            if act == "tanh":
                np.tanh(x, out=x)
            elif act == "relu":
                np.maximum(x, 0.0, out=x)
        if self.log_std is not None:
            x = np.concatenate([x, np.broadcast_to(self.log_std, x.shape)], axis=-1)
        return x

    def sample(self, params: np.ndarray, generator: torch.Generator) -> np.ndarray:
        """One action per row (categorical: int64 indices, by inverting the CDF at a uniform; Gaussian: float32)."""
        if self.kind == "categorical":
            z = np.exp(params - params.max(axis=-1, keepdims=True), dtype=np.float64)
            cdf = np.cumsum(z, axis=-1)
            u = torch.rand(params.shape[0], 1, generator=generator, dtype=torch.float64).numpy() * cdf[:, -1:]
            return np.minimum((cdf <= u).sum(axis=-1), params.shape[-1] - 1).astype(np.int64)
        d = params.shape[-1] // 2
        noise = torch.randn(params.shape[0], d, generator=generator).numpy()
        return (params[:, :d] + noise * np.exp(params[:, d:])).astype(np.float32)
