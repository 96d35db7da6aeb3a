"""The worker side of the SB3 adapter: env functions and the wrapper around each env (:mod:`frugalrl.integrations.sb3`).

The adapter builds its ClusterEnv from one :class:`SideFn` per env (sent to the workers by cloudpickle, as any env
function). Each builds the user's env (:class:`RankEnv` is SB3's ``make_vec_env`` recipe: the env, ``Monitor``,
``wrapper_class``) and puts :class:`SB3Side` around it, which gives the head what plain ClusterEnv messages cannot
carry:

* per-env reset seeds and options (SB3's ``seed`` / ``set_options`` lists), sent to every env in one options dict
  under :data:`PER_ENV`, each env taking its own entry;
* nested infos such as ``Monitor``'s ``info["episode"]``, as flat keys that :func:`nested_info` turns back into
  dicts on the head (so that they never meet ClusterEnv's own ``episode`` statistics in its vector infos);
* actions of spaces ClusterEnv does not take (MultiDiscrete, MultiBinary, Dict, Tuple), as one flat Box
  (:class:`ActionCodec`), decoded here before the env sees them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from frugalrl.envs.spec import EnvSpec
from frugalrl.lazy import import_string, import_without_package

PER_ENV = "frugalrl.sb3/per_env"
"""The reset options key under which the head sends every env's own ``seeds`` and ``options`` lists."""
NESTED = "frugalrl.sb3/nested:"
"""Prefix of a flattened nested info key; a JSON list of the key path follows."""
NATIVE_ACTIONS = (spaces.Discrete, spaces.Box)
"""Action spaces ClusterEnv takes as they are."""


def flat_info(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with each nested dict's numeric leaves as top-level :data:`NESTED` keys (for the wire)."""
    if not any(isinstance(v, Mapping) for v in info.values()):
        return info
    out: dict[str, Any] = {}

    def put(path: list[str], value: Any) -> None:
        if isinstance(value, Mapping):
            for key, sub in value.items():
                put([*path, str(key)], sub)
        elif len(path) > 1:
            out[NESTED + json.dumps(path)] = value
        else:
            out[path[0]] = value

    for key, value in info.items():
        put([key], value)
    return out


def nested_info(info: dict[str, Any]) -> dict[str, Any]:
    """The head's inverse of :func:`flat_info` (nested dicts rebuilt from :data:`NESTED` keys)."""
    if not any(key.startswith(NESTED) for key in info):
        return info
    out: dict[str, Any] = {}
    for key, value in info.items():
        if not key.startswith(NESTED):
            out[key] = value
            continue
        *parents, leaf = json.loads(key[len(NESTED):])
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _leaves(space: gym.Space) -> list[gym.Space]:
    if isinstance(space, spaces.Dict | spaces.Tuple):
        subs = space.spaces.values() if isinstance(space, spaces.Dict) else space.spaces
        return [leaf for sub in subs for leaf in _leaves(sub)]
    if not isinstance(space, spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary | spaces.Box):
        raise TypeError(f"the SB3 adapter cannot send actions of {space} (Box, Discrete, MultiDiscrete, "
                        "MultiBinary and Dict / Tuple of them can)")
    return [space]


class ActionCodec:
    """Actions of ``space`` (a Dict, Tuple, MultiDiscrete or MultiBinary) as one flat Box: each part's values in
    order, a Discrete part one number; int64 when every part is integer, float64 otherwise (exact either way)."""

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        lows, highs = [], []
        for leaf in _leaves(space):
            if isinstance(leaf, spaces.Discrete):
                lo, hi = np.array([leaf.start]), np.array([leaf.start + leaf.n - 1])
            elif isinstance(leaf, spaces.MultiDiscrete):
                lo, hi = np.ravel(leaf.start), np.ravel(leaf.start + leaf.nvec - 1)
            elif isinstance(leaf, spaces.MultiBinary):
                lo, hi = np.zeros(leaf.shape).ravel(), np.ones(leaf.shape).ravel()
            else:
                assert isinstance(leaf, spaces.Box)
                lo, hi = np.ravel(leaf.low), np.ravel(leaf.high)
            lows.append(lo.astype(np.float64))
            highs.append(hi.astype(np.float64))
        floating = any(isinstance(leaf, spaces.Box) and leaf.dtype.kind == "f" for leaf in _leaves(space))
        dtype = np.dtype(np.float64 if floating else np.int64)
        self.box = spaces.Box(np.concatenate(lows).astype(dtype), np.concatenate(highs).astype(dtype),
                              dtype=dtype)  # type: ignore[arg-type]

    def encode(self, actions: Any, n: int) -> np.ndarray:
        """The ``(n, d)`` Box actions for ``n`` envs' actions (an array, a list of per-env actions or a dict of
        batched parts)."""
        if isinstance(self.space, spaces.MultiDiscrete | spaces.MultiBinary):
            return np.asarray(actions).reshape(n, -1).astype(self.box.dtype)
        return np.stack([self._encode(self.space, _item(self.space, actions, i)) for i in range(n)])

    def _encode(self, space: gym.Space, x: Any) -> np.ndarray:
        if isinstance(space, spaces.Dict):
            return np.concatenate([self._encode(s, x[k]) for k, s in space.spaces.items()])
        if isinstance(space, spaces.Tuple):
            return np.concatenate([self._encode(s, x[i]) for i, s in enumerate(space.spaces)])
        return np.ravel(np.asarray(x)).astype(self.box.dtype)

    def decode(self, vec: np.ndarray) -> Any:
        """One env's action of ``space`` from its Box action."""
        value, _ = _decode(self.space, np.asarray(vec), 0)
        return value


def _item(space: gym.Space, actions: Any, i: int) -> Any:
    if isinstance(space, spaces.Dict) and isinstance(actions, Mapping):
        return {k: _item(s, actions[k], i) for k, s in space.spaces.items()}
    return actions[i]


def _decode(space: gym.Space, vec: np.ndarray, at: int) -> tuple[Any, int]:
    if isinstance(space, spaces.Dict):
        out = {}
        for key, sub in space.spaces.items():
            out[key], at = _decode(sub, vec, at)
        return out, at
    if isinstance(space, spaces.Tuple):
        parts = []
        for sub in space.spaces:
            part, at = _decode(sub, vec, at)
            parts.append(part)
        return tuple(parts), at
    if isinstance(space, spaces.Discrete):
        return np.int64(vec[at]), at + 1
    shape = tuple(space.shape or ())
    size = int(np.prod(shape))
    return vec[at : at + size].reshape(shape).astype(space.dtype), at + size


class SB3Side(gym.Wrapper):
    """The outermost wrapper of each env: per-env reset seeds and options, nested infos flattened, actions of spaces
    ClusterEnv does not take decoded from a Box (see the module docs). ``index`` is the env's place in the vector
    env."""

    def __init__(self, env: gym.Env, index: int) -> None:
        super().__init__(env)
        self._index = index
        self._codec = None if isinstance(env.action_space, NATIVE_ACTIONS) else ActionCodec(env.action_space)
        if self._codec is not None:
            self.action_space = self._codec.box

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if options is not None and PER_ENV in options:
            seed = options[PER_ENV]["seeds"][self._index]
            options = options[PER_ENV]["options"][self._index] or None
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, flat_info(info)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self._codec is not None:
            action = self._codec.decode(action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, flat_info(info)


class SideFn:
    """Env function ``index`` of the adapter's ClusterEnv: ``SB3Side(recipe(), index)``. ``recipe`` alone builds the
    user's env (the head builds it to answer ``env_is_wrapped``, once per distinct ``probe_key``)."""

    def __init__(self, recipe: Callable[[], gym.Env], index: int) -> None:
        self.recipe, self.index = recipe, index
        self.probe_key: Any = getattr(recipe, "probe_key", recipe)
        self.__qualname__ = getattr(recipe, "__qualname__", "env_fn")

    def __call__(self) -> gym.Env:
        return SB3Side(self.recipe(), self.index)


class RankEnv:
    """SB3's ``make_vec_env`` recipe for the env of rank ``rank``: the env (a Gymnasium id gets
    ``render_mode="rgb_array"`` unless ``env_kwargs`` names one), its action space seeded with ``seed + rank``,
    ``Monitor(env, **monitor_kwargs)`` (its files, if any, are written by the head), then ``wrapper_class``."""

    def __init__(self, spec: EnvSpec, rank: int, seed: int | None, monitor_kwargs: dict[str, Any],
                 wrapper_class: Callable[..., gym.Env] | None, wrapper_kwargs: dict[str, Any]) -> None:
        self.spec, self.rank, self.seed = spec, rank, seed
        self.monitor_kwargs, self.wrapper_class, self.wrapper_kwargs = monitor_kwargs, wrapper_class, wrapper_kwargs
        self.probe_key = (id(spec), id(wrapper_class))  # every rank is wrapped alike
        self.__qualname__ = spec.describe()

    def __call__(self) -> gym.Env:
        Monitor = sb3_monitor()  # noqa: N806 - SB3's class

        if self.spec.id is not None:
            try:
                env = gym.make(self.spec.id, **{"render_mode": "rgb_array", **self.spec.kwargs})
            except TypeError:  # an env without render_mode
                env = gym.make(self.spec.id, **self.spec.kwargs)
            env = self.spec.wrap(env)
        else:
            env = raw_env(self.spec, self.rank)
        if self.seed is not None:
            env.action_space.seed(self.seed + self.rank)
        env = Monitor(env, filename=None, **self.monitor_kwargs)
        if self.wrapper_class is not None:
            env = self.wrapper_class(env, **self.wrapper_kwargs)
        return env


MONITOR_MODULE = "stable_baselines3.common.monitor"


def sb3_monitor() -> Any:
    """SB3's ``Monitor`` class, without importing Stable-Baselines3 where it is not imported yet (its package's
    ``__init__`` imports torch; the module of ``Monitor`` needs only the standard library and Gymnasium:
    :func:`~frugalrl.lazy.import_without_package`)."""
    return import_without_package(MONITOR_MODULE).Monitor


def raw_env(spec: EnvSpec, index: int = 0) -> gym.Env:
    """Env ``index`` of ``spec`` as the user's recipe builds it, its wrappers included (:meth:`EnvSpec.make` without
    flattening)."""
    if spec.fns is not None:
        return spec.fns[index % len(spec.fns)]()
    if spec.id is not None:
        return spec.wrap(gym.make(spec.id, **spec.kwargs))
    fn = import_string(spec.factory) if isinstance(spec.factory, str) else spec.factory
    assert fn is not None, "an EnvSpec names an id, a factory or env functions"
    return spec.wrap(fn(**spec.kwargs))
