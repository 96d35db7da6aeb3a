"""Environment specs: how a worker builds its environments, and the checks made before it does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym
import numpy as np

from frugalrl.lazy import import_string


@dataclass(frozen=True)
class EnvSpec:
    """A recipe for the environments of a vector env.

    Exactly one of ``id`` (a registered Gymnasium id, ``"module:EnvId"`` included), ``factory`` (``"module:function"``
    or a module-level callable; ``kwargs`` go to it or to ``gym.make``) or ``fns`` (one thunk per env, as
    Gymnasium's ``AsyncVectorEnv`` takes them: closures and lambdas included, with the user's wrappers) is set.
    ``wrappers`` (with an id or a factory) wrap each env in order, as rl-zoo's ``env_wrapper``: pairs of an import
    path ``"module:Class"`` and its keyword arguments (:func:`parse_wrappers`).
    """

    id: str | None = None
    factory: str | Callable[..., gym.Env] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    fns: tuple[Callable[[], gym.Env], ...] | None = None
    wrappers: tuple[tuple[str, dict[str, Any]], ...] = ()

    def make(self, index: int = 0) -> gym.Env:
        """Build env ``index`` (from an id or a factory: wrapped in ``wrappers``, then observations that are not a
        Box flattened, :func:`flat_observations`)."""
        if self.id is not None:
            return flat_observations(self.wrap(gym.make(self.id, **self.kwargs)))
        if self.fns is not None:  # AsyncVectorEnv's way: the env as the function builds it, its spaces untouched
            fn = self.fns[index % len(self.fns)]
            try:
                env = fn()
            except gym.error.UnregisteredEnv:
                if not import_env_packages():
                    raise
                env = fn()
            if not isinstance(env, gym.Env):
                raise TypeError(f"env_fns[{index % len(self.fns)}] returned {type(env).__name__}, not a gymnasium.Env")
            return env
        elif self.factory is None:
            raise ValueError("EnvSpec has neither an id nor a factory; set exactly one of them")
        else:
            fn = import_string(self.factory) if isinstance(self.factory, str) else self.factory
            env, what = fn(**self.kwargs), f"env factory {self.factory!r}"
        if not isinstance(env, gym.Env):
            raise TypeError(f"{what} returned {type(env).__name__}, not a gymnasium.Env")
        return flat_observations(self.wrap(env))

    def wrap(self, env: gym.Env) -> gym.Env:
        """``env`` in this spec's ``wrappers``, in order."""
        for path, kwargs in self.wrappers:
            env = import_string(path)(env, **kwargs)
            if not isinstance(env, gym.Env):
                raise TypeError(f"env wrapper {path!r} returned {type(env).__name__}, not a gymnasium.Env")
        return env

    def describe(self) -> str:
        """A short human-readable name."""
        if self.id is not None:
            return self.id
        if self.fns is not None:
            return f"env_fns ({getattr(self.fns[0], '__qualname__', 'thunk')})"
        return self.factory if isinstance(self.factory, str) else getattr(self.factory, "__qualname__", "factory")


FLATTENED = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Tuple, gym.spaces.Dict)
"""Observation spaces :func:`flat_observations` turns into one flat Box."""


class _Flatten(gym.wrappers.FlattenObservation):
    """Gymnasium's ``FlattenObservation``, with one clear line for an observation that its space cannot hold (a
    character outside a Text space's charset fails deep in Gymnasium as ``KeyError: ' '``)."""

    def observation(self, observation: Any) -> Any:
        try:
            return super().observation(observation)
        except (KeyError, ValueError, IndexError, TypeError) as e:
            raise ValueError(f"an observation does not fit the env's observation space {self.env.observation_space} "
                             f"({type(e).__name__}: {e}); gymnasium.utils.env_checker.check_env(env) finds where"
                             ) from e


def flat_observations(env: gym.Env) -> gym.Env:
    """``env`` with Discrete, MultiDiscrete, MultiBinary, Tuple and Dict observations as one flat Box, as
    Stable-Baselines3's preprocessing sees them: each discrete part one-hot, the parts concatenated (Gymnasium's
    ``FlattenObservation``), in uint8 when every entry is an integer in [0, 255] (one-hots: a byte each on the wire,
    not int64's eight), float32 otherwise. Box observations, and spaces Gymnasium cannot flatten, pass unchanged (the
    agent then names the space it cannot take). FrozenLake, Taxi, CliffWalking and Blackjack train this way."""
    if not isinstance(env.observation_space, FLATTENED):
        return env
    try:
        flat = _Flatten(env)
    except NotImplementedError:  # e.g. a Graph part
        return env
    space = flat.observation_space
    assert isinstance(space, gym.spaces.Box)
    small = np.issubdtype(space.dtype, np.integer) and space.low.min() >= 0 and space.high.max() <= 255
    return gym.wrappers.DtypeObservation(flat, np.uint8 if small else np.float32)


NAMESPACE_MODULES = {"ALE": "ale_py", "MinAtar": "frugalrl.envs.minatar"}
"""Gymnasium id namespaces whose envs a package registers when imported (Gymnasium 1.x no longer imports it):
``ALE/Pong-v5`` is read as ``ale_py:ALE/Pong-v5`` when ale-py is installed."""
PLAIN_ID_MODULES = ("ale_py", "minigrid")
"""Packages that register ids outside a namespace when imported, tried in turn for an unknown id: ale-py's
``PongNoFrameskip-v4`` (the ids of SB3's, rl-zoo's and CleanRL's Atari scripts), minigrid's
``MiniGrid-Empty-5x5-v0`` and ``BabyAI-GoToLocal-v0``."""


PACKAGE_HINTS = {"MiniGrid-": "minigrid", "BabyAI-": "minigrid"}
"""Id prefixes of env packages that frugalrl does not install, named in the error for such an id."""


def import_env_packages() -> bool:
    """Import the installed packages of :data:`NAMESPACE_MODULES` and :data:`PLAIN_ID_MODULES` that are not yet
    imported; whether any was. A worker process is spawned, not forked: an env function that calls
    ``gym.make("BreakoutNoFrameskip-v4")`` finds ale-py's ids unregistered there even where the user's script
    imported ale-py (what ``AsyncVectorEnv``'s forked workers inherit)."""
    import importlib
    import sys

    imported = False
    for module in dict.fromkeys([*PLAIN_ID_MODULES, *NAMESPACE_MODULES.values()]):
        if module in sys.modules:
            continue
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        imported = True
    return imported


def parse_wrappers(wrappers: Sequence[str | dict[str, Any]] | None) -> tuple[tuple[str, dict[str, Any]], ...]:
    """rl-zoo's ``env_wrapper`` forms as ``(import path, keyword arguments)`` pairs, each imported to check it:
    ``"module:Class"`` (or ``"module.Class"``) and ``{"module:Class": {keyword arguments}}``. ``ValueError`` names
    the first entry that is neither or does not import."""
    out = []
    for entry in wrappers or ():
        path, kwargs = (entry, {}) if isinstance(entry, str) else (
            next(iter(entry.items())) if isinstance(entry, dict) and len(entry) == 1 else (None, None))
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(path, str) or not isinstance(kwargs, dict):
            raise ValueError(f"an env wrapper is 'module:Class' or {{'module:Class': {{keyword arguments}}}}, got "
                             f"{entry!r}")
        if ":" not in path and "." in path:  # rl-zoo writes 'module.Class'
            path = ":".join(path.rsplit(".", 1))
        try:
            wrapper = import_string(path)
        except ValueError as e:
            raise ValueError(f"env wrapper {path!r}: {e}") from e
        if not callable(wrapper):
            raise ValueError(f"env wrapper {path!r} is not a class or function")
        out.append((path, dict(kwargs)))
    return tuple(out)


def to_env_spec(env: str | Callable[..., gym.Env] | EnvSpec, env_kwargs: dict[str, Any] | None = None,
                env_wrappers: Sequence[str | dict[str, Any]] | None = None) -> EnvSpec:
    """Normalise what a user passed as ``env`` (with its kwargs and wrappers) and check it names something that
    exists.

    A string with a ``:`` is Gymnasium's ``"module:EnvId"`` when importing the module registers that id, else an
    import path to a factory; any other string is a Gymnasium id (one of :data:`NAMESPACE_MODULES`' namespaces
    imports its package first).
    Raises ``ValueError`` for an unknown id, a factory or wrapper that cannot be imported.
    """
    spec = _to_env_spec(env, env_kwargs)
    wrappers = parse_wrappers(env_wrappers)
    if not wrappers:
        return spec
    if spec.fns is not None:
        raise ValueError("env_wrappers cannot be used with a list of env functions: wrap the envs in the functions")
    return replace(spec, wrappers=spec.wrappers + wrappers)


def _to_env_spec(env: str | Callable[..., gym.Env] | EnvSpec, env_kwargs: dict[str, Any] | None) -> EnvSpec:
    kwargs = dict(env_kwargs or {})
    if isinstance(env, EnvSpec):
        if kwargs and env.fns is not None:
            raise ValueError("env_kwargs cannot be used with a list of env functions: pass them in the functions")
        return env if not kwargs else replace(env, kwargs={**env.kwargs, **kwargs})
    if isinstance(env, str):
        if ":" in env and not _is_registered(env) and _registers(env):  # Gymnasium's "module:EnvId"
            return EnvSpec(id=env, kwargs=kwargs)
        if ":" in env and not _is_registered(env):
            import_string(env)  # raises a clear ValueError if it does not import
            return EnvSpec(factory=env, kwargs=kwargs)
        module = NAMESPACE_MODULES.get(env.partition("/")[0]) if "/" in env else None
        if module is not None and _registers(f"{module}:{env}"):  # e.g. ALE/Pong-v5, in worker processes too
            return EnvSpec(id=f"{module}:{env}", kwargs=kwargs)
        if not _is_registered(env):
            plain = None if "/" in env else next((m for m in PLAIN_ID_MODULES if _registers(f"{m}:{env}")), None)
            if plain is None:
                package = next((p for prefix, p in PACKAGE_HINTS.items() if env.startswith(prefix)), None)
                hint = f" (its envs come with a package: pip install {package})" if package else ""
                raise ValueError(f"unknown Gymnasium environment id {env!r}: {_registry_hint(env)}{hint}")
        else:
            plain = _plain_id_module(env)
        # e.g. PongNoFrameskip-v4 as ale_py:PongNoFrameskip-v4: a worker process imports ale-py too
        return EnvSpec(id=env if plain is None else f"{plain}:{env}", kwargs=kwargs)
    if callable(env):
        return EnvSpec(factory=env, kwargs=kwargs)
    if isinstance(env, list | tuple) and env and all(callable(fn) for fn in env):
        if kwargs:
            raise ValueError("env_kwargs cannot be used with a list of env functions: pass them in the functions")
        return EnvSpec(fns=tuple(env))
    raise TypeError("env must be a Gymnasium id, a 'module:function' path, a callable or a list of env functions "
                    f"(as AsyncVectorEnv takes), got {type(env).__name__}")


def _registers(env: str) -> bool:
    """Whether ``"module:EnvId"`` names an id that importing ``module`` registers (``gym.make`` then imports it in
    every worker too)."""
    import importlib

    module, _, env_id = env.partition(":")
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return _is_registered(env_id)


def _plain_id_module(env_id: str) -> str | None:
    """The :data:`PLAIN_ID_MODULES` package whose import registered ``env_id`` (a registered id), else None."""
    entry = gym.spec(env_id).entry_point
    package = entry.partition(":")[0].partition(".")[0] if isinstance(entry, str) else None
    return package if package in PLAIN_ID_MODULES else None


def _is_registered(env_id: str) -> bool:
    try:
        gym.spec(env_id)
        return True
    except gym.error.Error:
        return False


def _registry_hint(env_id: str) -> str:
    try:
        gym.spec(env_id)
    except gym.error.Error as e:
        return str(e)
    return ""
