"""What an actor head outputs for each action space frugalrl's agents act in, without torch: the space's description
(:func:`action_desc`, which also decides which spaces the agents act in), its distribution kind
(:data:`frugalrl.dists.DistKind`), the head's width, the shape of its distribution parameters, and those parameters
from the head's output in numpy (the workers' arithmetic; :func:`frugalrl.nets.head_params` is PyTorch's)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

PAD_LOGIT = -1e9
"""The logit of a multi-categorical row's padding (:data:`frugalrl.dists.PAD_LOGIT` is this)."""


def action_desc(space: gym.Space) -> dict[str, Any]:
    """JSON description of a Discrete, Box, MultiDiscrete or MultiBinary action space (what a policy head needs)."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise TypeError(f"unsupported action space {space}; frugalrl's agents take MultiDiscrete spaces of one "
                            "dimension")
        return {"type": "multidiscrete", "nvec": [int(n) for n in space.nvec]}
    if isinstance(space, gym.spaces.MultiBinary):
        if len(space.shape) != 1:
            raise TypeError(f"unsupported action space {space}; frugalrl's agents take MultiBinary spaces of one "
                            "dimension")
        return {"type": "multibinary", "n": int(space.shape[0])}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "box",
            "shape": list(space.shape),
            "low": np.asarray(space.low, dtype=np.float64).reshape(-1).tolist(),
            "high": np.asarray(space.high, dtype=np.float64).reshape(-1).tolist(),
        }
    raise TypeError(f"unsupported action space {space}; frugalrl's agents act in Discrete, Box, MultiDiscrete and "
                    "MultiBinary action spaces")


def action_head(action: Mapping[str, Any]) -> tuple[str, int]:
    """The distribution kind (:data:`frugalrl.dists.DistKind`) an actor head parameterises for an action
    description (:func:`action_desc`) and its width: logits (every sub-action's of a MultiDiscrete
    space in a row), or a Gaussian's means (its log-stds are a parameter of their own). ``ValueError`` otherwise."""
    kind = action.get("type")
    if kind == "discrete":
        return "categorical", int(action["n"])
    if kind == "box":
        return "gaussian", int(np.prod(action["shape"]))
    if kind == "multidiscrete":
        return "multi_categorical", int(sum(action["nvec"]))
    if kind == "multibinary":
        return "bernoulli", int(action["n"])
    raise ValueError(f"unsupported action description {dict(action)!r}")


def params_shape(action: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape of one observation's distribution parameters for an action description (:mod:`frugalrl.dists`)."""
    kind, width = action_head(action)
    if kind == "gaussian":
        return (2 * width,)
    if kind == "multi_categorical":
        return (len(action["nvec"]), max(action["nvec"]))
    return (width,)


def head_params(kind: str, action: Mapping[str, Any], out: np.ndarray, log_std: np.ndarray | None) -> np.ndarray:
    """Distribution parameters from an actor head's output, as :func:`frugalrl.nets.head_params` gives them."""
    if kind == "multi_categorical":
        idx, real = _row_index(tuple(int(n) for n in action["nvec"]))
        return np.where(real, out[..., idx], np.asarray(PAD_LOGIT, dtype=out.dtype))
    return with_log_std(out, log_std)


@functools.cache
def _row_index(nvec: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For ``nvec``'s padded rows ``(k, max(nvec))``: the head output's index of each cell, and which cells are real
    (made once per space: :func:`head_params` runs on every step of a worker)."""
    m = max(nvec)
    starts = np.cumsum([0, *nvec[:-1]])
    col = np.arange(m)
    real = col[None, :] < np.asarray(nvec)[:, None]
    return np.where(real, starts[:, None] + col[None, :], 0), real


def with_log_std(out: np.ndarray, log_std: np.ndarray | None) -> np.ndarray:
    """A head's output with a state-independent Gaussian's log-std after each row (as ``dist_params``); as it is
    for another head (``log_std`` None)."""
    return out if log_std is None else np.concatenate([out, np.broadcast_to(log_std, out.shape)], axis=-1)
