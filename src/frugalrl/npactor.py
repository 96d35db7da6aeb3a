"""A small MLP actor's forward pass, sampling and log-probabilities in numpy, for worker-side inference.

A worker acts on a handful of observations per step (its own envs). There, PyTorch's per-call overhead dominates:
a 64×64 MLP's ``dist_params`` plus ``sample`` on 8 observations costs about ten times what the same arithmetic
costs in numpy. :class:`NumpyActor` is the actor of an :class:`~frugalrl.nets.MLPActorCritic` (Linear layers with
tanh or ReLU, an optional :class:`~frugalrl.normalize.ObsNormalizer` in front, a categorical, multi-categorical,
Bernoulli, state-independent Gaussian or gSDE head), built from the policy spec and the weights as they arrive (:meth:`NumpyActor.from_state`),
so that a worker acting with it never imports PyTorch (a smaller process that acts sooner after a start,
docs/benchmarks.md#worker-footprint). It computes the same distribution parameters in float32 (equal to PyTorch's
up to the rounding of a different summation order) and samples with a NumPy generator, whose state a checkpointed
worker saves and restores. :func:`sample` and :func:`log_prob` serve the actors on ONNX Runtime too
(:mod:`frugalrl.onnxactor`: AcceRL's exported graphs, CNN agents); other agents (AcceRL's alpha mix, user
modules) keep PyTorch.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from frugalrl.action_heads import action_head, head_params

MLP_FACTORY = "frugalrl.nets:MLPActorCritic"
_OBS_CLIP = 10.0  # ObsNormalizer's default clip, the one MLPActorCritic's normaliser has
SDE_EPS = 1e-6  # added to the variance of a gSDE step's noise (nets.SDE_EPS)


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


def runs_in_numpy(spec: Mapping[str, Any]) -> bool:
    """Whether a policy spec (:class:`~frugalrl.nets.PolicySpec` as JSON) builds an agent :class:`NumpyActor` runs:
    an :class:`~frugalrl.nets.MLPActorCritic`, gSDE's included (a worker builds exactly the spec's class, so the
    spec decides; the class's spec names every option and accepts only tanh or ReLU layers)."""
    return spec.get("factory") == MLP_FACTORY


def acting_like(spec: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The keys, shapes and dtypes of :func:`frugalrl.nets.acting_state` of the agent ``spec`` builds (one that
    :func:`runs_in_numpy`), without building it: what a weights message is decoded against."""
    kw = spec["kwargs"]
    action, f32, f64 = kw["action"], np.dtype(np.float32), np.dtype(np.float64)
    out = action_head(action)[1]
    like: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    if kw["obs_norm"]:
        like.update({"obs_norm.mean": ((int(kw["obs_dim"]),), f64), "obs_norm.var": ((int(kw["obs_dim"]),), f64),
                     "obs_norm.count": ((), f64)})
    widths = [int(kw["obs_dim"]), *(int(h) for h in kw["hidden"]), out]
    for i, (n_in, n_out) in enumerate(itertools.pairwise(widths)):
        like[f"actor.{2 * i}.weight"] = ((n_out, n_in), f32)
        like[f"actor.{2 * i}.bias"] = ((n_out,), f32)
    if action["type"] == "box":  # gSDE's: one log-σ per feature of the last hidden layer and action dimension
        like["log_std"] = ((widths[-2], out) if kw.get("sde", False) else (out,), f32)
    return like


class SampledActor:
    """What every actor a worker runs without torch shares (this one, :mod:`frugalrl.onnxactor`'s): a distribution
    ``kind``, sampled and scored by this module's functions; a subclass gives the parameters (``params``)."""

    kind: str

    def sample(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One action per row (:func:`sample`)."""
        return sample(self.kind, params, rng)

    def log_prob(self, params: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log π(a | params) of each row's action (:func:`log_prob`)."""
        return log_prob(self.kind, params, actions)


class NumpyActor(SampledActor):
    """The actor of an MLP agent as numpy arrays (a copy: rebuild it after the agent's weights change)."""

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray, str | None]], action: Mapping[str, Any],
                 log_std: np.ndarray | None, norm: tuple[np.ndarray, np.ndarray, float] | None) -> None:
        self.layers = layers  # (weight (in, out), bias, activation after it or None)
        self.action = dict(action)  # its action description (frugalrl.action_heads.action_desc)
        self.kind = action_head(self.action)[0]
        self.log_std = log_std
        self.norm = norm  # (mean, 1 / sqrt(var + 1e-8), clip), float64 as ObsNormalizer computes

    acting_like = staticmethod(acting_like)

    @classmethod
    def from_state(cls, spec: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> NumpyActor:
        """The actor of the agent ``spec`` builds (one that :func:`runs_in_numpy`), holding ``state`` (its
        :func:`~frugalrl.nets.acting_state` as arrays, copied: the actor does not change with them)."""
        kw = spec["kwargs"]
        n = len(kw["hidden"])
        layers = [(np.array(state[f"actor.{2 * i}.weight"].T, dtype=np.float32, order="C"),
                   np.array(state[f"actor.{2 * i}.bias"], dtype=np.float32), kw["activation"] if i < n else None)
                  for i in range(n + 1)]
        norm = None
        if kw["obs_norm"]:
            var = np.array(state["obs_norm.var"], dtype=np.float64)
            norm = (np.array(state["obs_norm.mean"], dtype=np.float64), 1.0 / np.sqrt(var + 1e-8),
                    _OBS_CLIP)
        gaussian = kw["action"]["type"] == "box"
        log_std = np.array(state["log_std"], dtype=np.float32) if gaussian else None
        return cls(layers, kw["action"], log_std, norm)

    @classmethod
    def of(cls, agent: Any) -> NumpyActor | None:
        """The numpy actor of ``agent`` (a module), or None if it is not a plain MLP agent this module reproduces."""
        from frugalrl.nets import MLPActorCritic, acting_state

        if type(agent) is not MLPActorCritic or not runs_in_numpy(agent.spec.to_json()):
            return None
        return cls.from_state(agent.spec.to_json(), {k: t.detach().numpy() for k, t in acting_state(agent).items()})

    def params(self, obs: np.ndarray) -> np.ndarray:
        """The distribution parameters of ``dist_params`` (logits; or mean, then log-std: with gSDE, of one step's
        noise, the variance :meth:`~frugalrl.nets.MLPActorCritic.dist_params` gives), float32."""
        x = obs.reshape(obs.shape[0], -1)
        if self.norm is not None:
            mean, inv_std, clip = self.norm
            x = np.clip((x.astype(np.float64) - mean) * inv_std, -clip, clip)
        x = x.astype(np.float32, copy=False)
        for w, b, act in self.layers:
            features = x  # the last hidden layer's, once the loop ends
            x = x @ w
            x += b
            if act == "tanh":
                np.tanh(x, out=x)
            elif act == "relu":
                np.maximum(x, 0.0, out=x)
        if self.log_std is not None and self.log_std.ndim == 2:  # gSDE: one step's noise φ(s) ε has this variance
            variance = np.square(features) @ np.exp(2 * self.log_std)
            return np.concatenate([x, 0.5 * np.log(variance + np.float32(SDE_EPS))], axis=-1)
        return head_params(self.kind, self.action, x, self.log_std)


def sample(kind: str, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row of distribution parameters (categorical, and each sub-action of a multi-categorical: int64
    indices, by inverting the CDF at a uniform; Bernoulli: int8 bits; Gaussian, mean then log-std: float32)."""
    if kind in ("categorical", "multi_categorical"):
        z = np.exp(params - params.max(axis=-1, keepdims=True), dtype=np.float64)
        cdf = np.cumsum(z, axis=-1)
        u = rng.random((*params.shape[:-1], 1)) * cdf[..., -1:]
        return np.minimum((cdf <= u).sum(axis=-1), params.shape[-1] - 1).astype(np.int64)
    if kind == "bernoulli":
        return (rng.random(params.shape) < 0.5 * (1.0 + np.tanh(0.5 * params.astype(np.float64)))).astype(np.int8)
    d = params.shape[-1] // 2
    noise = rng.standard_normal((params.shape[0], d), dtype=np.float32)
    return (params[:, :d] + noise * np.exp(params[:, d:])).astype(np.float32)


def log_prob(kind: str, params: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """log π(a | params) of each row's action, float32 (:func:`frugalrl.dists.log_prob`'s formula; summed over the
    action dimensions for the Gaussian)."""
    params = np.asarray(params, dtype=np.float32)
    if kind == "categorical":
        shifted = params - params.max(axis=-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        idx = np.asarray(actions, dtype=np.int64)[..., None]
        return np.take_along_axis(logp, idx, axis=-1)[..., 0]
    if kind == "multi_categorical":
        return log_prob("categorical", params, actions).sum(-1, dtype=np.float32)
    if kind == "bernoulli":  # log σ(x) = -log(1 + e^-x), for either sign of x
        bits = np.asarray(actions, dtype=np.float32).reshape(params.shape)
        return (-bits * np.logaddexp(0, -params) - (1 - bits) * np.logaddexp(0, params)).sum(-1, dtype=np.float32)
    d = params.shape[-1] // 2
    mean, log_std = params[..., :d], params[..., d:]
    z = (np.asarray(actions, dtype=np.float32).reshape(mean.shape) - mean) / np.exp(log_std)
    return (-0.5 * z * z - log_std - np.float32(0.5 * math.log(2 * math.pi))).sum(-1, dtype=np.float32)
