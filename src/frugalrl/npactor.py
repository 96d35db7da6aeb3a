"""A small actor's forward pass, sampling and log-probabilities in numpy, for worker-side inference.

A worker acts on a handful of observations per step (its own envs). There, PyTorch's per-call overhead dominates:
a 64×64 MLP's ``dist_params`` plus ``sample`` on 8 observations costs about ten times what the same arithmetic
costs in numpy. :class:`NumpyActor` is the actor of an :class:`~frugalrl.nets.MLPActorCritic` (Linear layers with
tanh or ReLU, an optional :class:`~frugalrl.normalize.ObsNormalizer` in front, a categorical or state-independent
Gaussian head), or of a :class:`~frugalrl.nets.NatureCNNActorCritic` on small grids (MinAtar's 10×10 cells: the
convolutions as one matrix product over the patches), built from the policy spec and the weights as they arrive
(:meth:`NumpyActor.from_state`), so that a worker acting with it never imports PyTorch (a smaller process that acts
sooner after a start, docs/benchmarks.md#worker-footprint). It computes the same distribution parameters in float32
(equal to PyTorch's up to the rounding of a different summation order) and samples with a NumPy generator, whose
state a checkpointed worker saves and restores. :func:`sample` and :func:`log_prob` serve AcceRL's exported graphs
too (:mod:`frugalrl.onnxactor`); other agents (CNNs on frames, gSDE, user modules) keep PyTorch
(:func:`runs_in_numpy` is False for their specs).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

MLP_FACTORY = "frugalrl.nets:MLPActorCritic"
CNN_FACTORY = "frugalrl.nets:NatureCNNActorCritic"
NATURE_CONVS = ((8, 4), (4, 2), (3, 1))  # NatureCNNActorCritic's (kernel, stride) when its spec names none
CONV_MAX_SIDE = 32
"""The largest frame side (height or width) a CNN agent's convolutions run in numpy on a worker. On 84×84 Atari
frames PyTorch's convolutions (oneDNN) take about half numpy's time for the same batch, more than the process they
save is worth to a rollout; on grids (MinAtar's 10×10) numpy is the faster one."""
_OBS_CLIP = 10.0  # ObsNormalizer's default clip, the one MLPActorCritic's normaliser has


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
    an :class:`~frugalrl.nets.MLPActorCritic` without gSDE, or a :class:`~frugalrl.nets.NatureCNNActorCritic` on
    frames of at most :data:`CONV_MAX_SIDE` a side (a worker builds exactly the spec's class, so the spec decides;
    the classes' specs name every option)."""
    kw = spec.get("kwargs", {})
    if spec.get("factory") == MLP_FACTORY:
        return not kw.get("sde", False)
    if spec.get("factory") == CNN_FACTORY:
        return max(_frame_shape(kw)[1:]) <= CONV_MAX_SIDE
    return False


def _frame_shape(kw: Mapping[str, Any]) -> tuple[int, int, int]:
    """(C, H, W) of a CNN spec's observations."""
    shape = [int(x) for x in kw["obs_shape"]]
    c, h, w = (shape[2], shape[0], shape[1]) if kw.get("channels_last", False) else shape
    return c, h, w


def _cnn_layout(kw: Mapping[str, Any]) -> tuple[list[tuple[int, int, int, int]], tuple[int, int, int]]:
    """(in channels, out channels, kernel, stride) of each convolution of a CNN spec, and the (C, H, W) they
    leave (no padding, as :func:`frugalrl.nets.conv_layers`)."""
    c, h, w = _frame_shape(kw)
    layout = []
    for out, (kernel, stride) in zip(kw["channels"], kw.get("convs", NATURE_CONVS), strict=False):
        layout.append((c, int(out), int(kernel), int(stride)))
        c, h, w = int(out), (h - int(kernel)) // int(stride) + 1, (w - int(kernel)) // int(stride) + 1
    return layout, (c, h, w)


def acting_like(spec: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The keys, shapes and dtypes of :func:`frugalrl.nets.acting_state` of the agent ``spec`` builds (one that
    :func:`runs_in_numpy`), without building it: what a weights message is decoded against."""
    kw = spec["kwargs"]
    action, f32, f64 = kw["action"], np.dtype(np.float32), np.dtype(np.float64)
    out = int(action["n"]) if action["type"] == "discrete" else int(np.prod(action["shape"]))
    like: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    if spec["factory"] == CNN_FACTORY:
        layout, (c, h, w) = _cnn_layout(kw)
        for i, (c_in, c_out, k, _) in enumerate(layout):
            like[f"trunk.{2 * i}.weight"] = ((c_out, c_in, k, k), f32)
            like[f"trunk.{2 * i}.bias"] = ((c_out,), f32)
        fc, hidden = f"trunk.{2 * len(layout) + 1}", int(kw["hidden"])  # after the ReLUs and the Flatten
        like.update({f"{fc}.weight": ((hidden, c * h * w), f32), f"{fc}.bias": ((hidden,), f32),
                     "actor.weight": ((out, hidden), f32), "actor.bias": ((out,), f32)})
    else:
        if kw["obs_norm"]:
            like.update({"obs_norm.mean": ((int(kw["obs_dim"]),), f64),
                         "obs_norm.var": ((int(kw["obs_dim"]),), f64), "obs_norm.count": ((), f64)})
        widths = [int(kw["obs_dim"]), *(int(h) for h in kw["hidden"]), out]
        for i, (n_in, n_out) in enumerate(itertools.pairwise(widths)):
            like[f"actor.{2 * i}.weight"] = ((n_out, n_in), f32)
            like[f"actor.{2 * i}.bias"] = ((n_out,), f32)
    if action["type"] == "box":
        like["log_std"] = ((out,), f32)
    return like


class Convolutions:
    """A CNN agent's convolutions (ReLU after each, no padding) on frames as numpy arrays: each one matrix product
    of every patch of the (N, H, W, C) input with the kernels. Their output is flattened in PyTorch's (C, H, W)
    order by the caller's first weight (:meth:`flat_weight`), so no transpose runs per call."""

    def __init__(self, kernels: list[tuple[np.ndarray, np.ndarray, int, int]], scale: float,
                 channels_last: bool) -> None:
        self.kernels = kernels  # (weight (k·k·C_in, C_out) in (kh, kw, c) order, bias, kernel, stride)
        self.scale = np.float32(scale)
        self.channels_last = channels_last

    @classmethod
    def from_state(cls, kw: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> Convolutions:
        kernels = []
        for i, (_, c_out, k, s) in enumerate(_cnn_layout(kw)[0]):
            weight = np.asarray(state[f"trunk.{2 * i}.weight"], dtype=np.float32)  # (C_out, C_in, kh, kw)
            kernels.append((np.ascontiguousarray(weight.transpose(2, 3, 1, 0).reshape(-1, c_out)),
                            np.array(state[f"trunk.{2 * i}.bias"], dtype=np.float32), k, s))
        return cls(kernels, float(kw.get("scale", 1.0 / 255.0)), bool(kw.get("channels_last", False)))

    @staticmethod
    def flat_weight(weight: np.ndarray, chw: tuple[int, int, int]) -> np.ndarray:
        """The fully connected layer's (out, C·H·W) weight as (H·W·C, out): it reads the (H, W, C) output."""
        c, h, w = chw
        return np.ascontiguousarray(weight.reshape(-1, c, h, w).transpose(2, 3, 1, 0).reshape(c * h * w, -1),
                                    dtype=np.float32)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = obs.astype(np.float32)
        if self.scale != 1.0:
            x *= self.scale
        if not self.channels_last:
            x = x.transpose(0, 2, 3, 1)
        n = x.shape[0]
        for weight, bias, k, s in self.kernels:
            # (N, H', W', C, kh, kw) windows -> (N, Ho, Wo, kh, kw, C) patches, one row each
            patches = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))[:, ::s, ::s]
            ho, wo = patches.shape[1], patches.shape[2]
            x = patches.transpose(0, 1, 2, 4, 5, 3).reshape(n * ho * wo, -1) @ weight
            x += bias
            np.maximum(x, 0.0, out=x)
            x = x.reshape(n, ho, wo, -1)
        return x.reshape(n, -1)


class NumpyActor:
    """The actor of an MLP agent, or a CNN agent on small grids, as numpy arrays (a copy: rebuild it after the
    agent's weights change)."""

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray, str | None]], kind: str,
                 log_std: np.ndarray | None, norm: tuple[np.ndarray, np.ndarray, float] | None,
                 convolutions: Convolutions | None = None) -> None:
        self.layers = layers  # (weight (in, out), bias, activation after it or None)
        self.kind = kind
        self.log_std = log_std
        self.norm = norm  # (mean, 1 / sqrt(var + 1e-8), clip), float64 as ObsNormalizer computes
        self.convolutions = convolutions  # before the layers (a CNN agent's), or None

    acting_like = staticmethod(acting_like)

    @classmethod
    def from_state(cls, spec: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> NumpyActor:
        """The actor of the agent ``spec`` builds (one that :func:`runs_in_numpy`), holding ``state`` (its
        :func:`~frugalrl.nets.acting_state` as arrays, copied: the actor does not change with them)."""
        kw = spec["kwargs"]
        gaussian = kw["action"]["type"] == "box"
        log_std = np.array(state["log_std"], dtype=np.float32) if gaussian else None
        kind = "gaussian" if gaussian else "categorical"
        if spec["factory"] == CNN_FACTORY:
            chw = _cnn_layout(kw)[1]
            fc = f"trunk.{2 * len(kw['channels']) + 1}"
            layers = [(Convolutions.flat_weight(np.asarray(state[f"{fc}.weight"]), chw),
                       np.array(state[f"{fc}.bias"], dtype=np.float32), "relu"),
                      (np.array(state["actor.weight"].T, dtype=np.float32, order="C"),
                       np.array(state["actor.bias"], dtype=np.float32), None)]
            return cls(layers, kind, log_std, None, Convolutions.from_state(kw, state))
        n = len(kw["hidden"])
        layers = [(np.array(state[f"actor.{2 * i}.weight"].T, dtype=np.float32, order="C"),
                   np.array(state[f"actor.{2 * i}.bias"], dtype=np.float32), kw["activation"] if i < n else None)
                  for i in range(n + 1)]
        norm = None
        if kw["obs_norm"]:
            var = np.array(state["obs_norm.var"], dtype=np.float64)
            norm = (np.array(state["obs_norm.mean"], dtype=np.float64), 1.0 / np.sqrt(var + 1e-8),
                    _OBS_CLIP)
        return cls(layers, kind, log_std, norm)

    @classmethod
    def of(cls, agent: Any) -> NumpyActor | None:
        """The numpy actor of ``agent`` (a module), or None if it is not an agent this module reproduces."""
        from frugalrl.nets import MLPActorCritic, NatureCNNActorCritic, acting_state

        if type(agent) not in (MLPActorCritic, NatureCNNActorCritic) or not runs_in_numpy(agent.spec.to_json()):
            return None
        return cls.from_state(agent.spec.to_json(), {k: t.detach().numpy() for k, t in acting_state(agent).items()})

    def params(self, obs: np.ndarray) -> np.ndarray:
        """The distribution parameters of ``dist_params`` (logits; or mean, then log-std), float32."""
        x = obs.reshape(obs.shape[0], -1) if self.convolutions is None else self.convolutions(obs)
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

    def sample(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One action per row (:func:`sample`)."""
        return sample(self.kind, params, rng)

    def log_prob(self, params: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log π(a | params) of each row's action (:func:`log_prob`)."""
        return log_prob(self.kind, params, actions)


def sample(kind: str, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row of distribution parameters (categorical: int64 indices, by inverting the CDF at a uniform;
    Gaussian, mean then log-std: float32)."""
    if kind == "categorical":
        z = np.exp(params - params.max(axis=-1, keepdims=True), dtype=np.float64)
        cdf = np.cumsum(z, axis=-1)
        u = rng.random((params.shape[0], 1)) * cdf[:, -1:]
        return np.minimum((cdf <= u).sum(axis=-1), params.shape[-1] - 1).astype(np.int64)
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
    d = params.shape[-1] // 2
    mean, log_std = params[..., :d], params[..., d:]
    z = (np.asarray(actions, dtype=np.float32).reshape(mean.shape) - mean) / np.exp(log_std)
    return (-0.5 * z * z - log_std - np.float32(0.5 * math.log(2 * math.pi))).sum(-1, dtype=np.float32)
