"""Stable-Baselines3 on ClusterEnv: a ``VecEnv`` whose environments run on frugalrl's workers.

::

    from stable_baselines3 import PPO
    from frugalrl.integrations.sb3 import make_sb3_vec_env

    venv = make_sb3_vec_env("CartPole-v1", num_workers=2, envs_per_worker=4, seed=0)
    model = PPO("MlpPolicy", venv, seed=0).learn(50_000)
    print(venv.bytes["total"], "bytes on the wire")
    venv.close()

SB3 drives the envs from the head (head-side inference): each ``step`` sends the actions to the
workers and brings back observations, rewards and done flags, counted by ClusterEnv's byte meter.
Worker-side inference and weight sync (``ClusterEnv.step(agent)`` / ``rollout``) are frugalrl's own
algorithms' business; SB3 never uses them.

**Autoreset.** SB3 expects a finished env's step to return the *first observation of its next episode*, with the
last one in ``infos[i]["terminal_observation"]``: Gymnasium's ``SAME_STEP`` autoreset, which ClusterEnv's workers do
natively (they reset a finished env inside the step that ended it and send back both observations). So
:class:`SB3VecEnv` needs a ClusterEnv built with ``autoreset_mode="SameStep"`` (:func:`make_sb3_vec_env` builds
one); under ``NextStep`` the adapter would have to step every env once more or hold results back by one step.
What SB3 gets from each step, dead workers included, is :meth:`SB3VecEnv.step_wait`'s. The envs' attributes live
in worker processes, so only those ClusterEnv knows on the head can be read (:meth:`SB3VecEnv.get_attr`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

try:
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnv,
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"frugalrl.integrations.sb3 needs Stable-Baselines3: pip install 'frugalrl[sb3]' ({e})"
    ) from e

from frugalrl.envs.cluster import ClusterEnv
from frugalrl.envs.spec import EnvSpec, to_env_spec
from frugalrl.experience import space_shape

__all__ = ["SB3VecEnv", "make_sb3_vec_env"]

#: Keys of ClusterEnv's vector infos that the adapter turns into SB3's per-env keys (not copied as they are).
_VECTOR_KEYS = frozenset({"episode", "final_obs", "final_info", "worker_restarted"})


def _env_info(infos: dict[str, Any], i: int, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Env ``i``'s entries of Gymnasium vector ``infos`` (value arrays with ``_key`` masks, nested dicts)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or key in skip:
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        if isinstance(value, dict):
            sub = _env_info(value, i)
            if sub:
                out[key] = sub
            continue
        item = value[i]
        if isinstance(item, np.ndarray):
            out[key] = item.item() if item.ndim == 0 else item.copy()
        elif isinstance(item, np.generic):
            out[key] = item.item()
        else:
            out[key] = item
    return out


class SB3VecEnv(VecEnv):
    """A Stable-Baselines3 ``VecEnv`` over a :class:`~frugalrl.ClusterEnv` (see the module docs).

    The adapter owns the ClusterEnv: :meth:`close` stops its workers. Env ``j`` of SB3 is env ``j``
    of the ClusterEnv (worker ``j // envs_per_worker``).

    Args:
        cluster: a ClusterEnv built with ``autoreset_mode="SameStep"``.

    Raises:
        ValueError: ``cluster`` uses another autoreset mode.
        TypeError: ``cluster`` is not a ClusterEnv.

    Attributes:
        cluster: the ClusterEnv; its byte meter, sync state and restarts stay readable there.
    """

    def __init__(self, cluster: ClusterEnv) -> None:
        if not isinstance(cluster, ClusterEnv):
            raise TypeError(f"SB3VecEnv wraps a frugalrl.ClusterEnv, got {type(cluster).__name__}")
        if cluster.autoreset_mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                "SB3VecEnv needs a ClusterEnv built with autoreset_mode='SameStep' (SB3 expects the reset "
                f"observation in the step that ends an episode); this one uses {cluster.autoreset_mode.value!r}. "
                "make_sb3_vec_env(...) builds a suitable one."
            )
        self.cluster = cluster
        self._probe: tuple[dict[str, Any], tuple[type, ...]] | None = None
        super().__init__(cluster.num_envs, cluster.single_observation_space, cluster.single_action_space)
        n = self.num_envs
        self._actions: np.ndarray | None = None
        self._returns = np.zeros(n, dtype=np.float64)
        self._lengths = np.zeros(n, dtype=np.int64)
        self._t_start = time.time()
        self._closed = False

    # ------------------------------------------------------------------ the byte meter
    @property
    def bytes(self) -> dict[str, Any]:
        """ClusterEnv's byte meter summary: bytes by kind, ``total``, ``up`` / ``down``, ``per_worker``."""
        return self.cluster.meter.summary()

    def stats(self) -> dict[str, Any]:
        """ClusterEnv's statistics (:meth:`frugalrl.ClusterEnv.stats`): bytes, syncs, restarts, backend."""
        return self.cluster.stats()

    # ------------------------------------------------------------------ VecEnv API
    def reset(self) -> VecEnvObs:
        """Reset every env; returns the observations only (the infos go to :attr:`reset_infos`).

        Uses the seeds of :meth:`seed` and the options of :meth:`set_options` once, as SB3 does. ClusterEnv
        resets env ``j`` with ``seed + j`` and gives every env the same options, so the seeds must be
        consecutive (as :meth:`seed` makes them) and the options equal.

        Raises:
            ValueError: seeds or options that ClusterEnv cannot apply (see above).
        """
        seeds, options = self._seeds, self._options
        if all(s is None for s in seeds):
            seed = None
        else:
            first = seeds[0]
            if first is None or any(s is None or int(s) != int(first) + j for j, s in enumerate(seeds)):
                raise ValueError(
                    f"ClusterEnv seeds env j with seed + j; the seeds {seeds} are not of that form (use seed(s))"
                )
            seed = int(first)
        if any(o != options[0] for o in options):
            raise ValueError("ClusterEnv resets every env with the same options; set_options() gave different ones")
        obs, infos = self.cluster.reset(seed=seed, options=dict(options[0]) if options[0] else None)
        self.reset_infos = [_env_info(infos, i, _VECTOR_KEYS) for i in range(self.num_envs)]
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._actions = None
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Keep the actions for :meth:`step_wait` (ClusterEnv steps synchronously: the work happens there).

        ``actions`` has one action per env; for a Discrete space any shape with ``num_envs`` elements is
        accepted (SB3 sometimes passes ``(n, 1)``).
        """
        arr = np.asarray(actions)
        shape = (self.num_envs, *space_shape(self.cluster.single_action_space))
        if arr.shape != shape and arr.size == int(np.prod(shape)):
            arr = arr.reshape(shape)
        self._actions = arr

    def step_wait(self) -> VecEnvStepReturn:
        """Step every env with the actions of :meth:`step_async`.

        Returns:
            ``(obs, rewards, dones, infos)`` as SB3's ``DummyVecEnv`` of ``Monitor``-wrapped envs gives them:
            ``obs`` (the reset observation for finished envs), float32 ``rewards``, ``dones`` (``terminated or
            truncated``) and one ``info`` per env, its env's own (numeric) infos. A finished env's info adds
            ``terminal_observation``, ``TimeLimit.truncated`` (``truncated and not terminated``), ``episode =
            {"r": return, "l": length, "t": seconds since the adapter started}`` (what SB3's logger reads) and
            ``frugalrl/bytes_total`` (every byte counted so far); the new episodes' reset infos go to
            :attr:`reset_infos`. A worker that died is replaced inside ClusterEnv: its envs' episodes end in
            this step as truncated, with ``frugalrl/worker_restarted = True``.

        Raises:
            RuntimeError: no :meth:`step_async` since the last step (or reset), or the ClusterEnv failed.
            ValueError: actions that do not fit the action space.
        """
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async(actions) first")
        actions, self._actions = self._actions, None
        obs, rewards, terms, truncs, vinfos = self.cluster.step(actions)
        n = self.num_envs
        dones = np.logical_or(terms, truncs)
        restarted = vinfos.get("worker_restarted")
        stepped = np.ones(n, dtype=bool) if restarted is None else ~np.asarray(restarted, dtype=bool)
        self._returns += rewards
        self._lengths += stepped
        final_obs = vinfos.get("final_obs")
        final_info = vinfos.get("final_info") or {}
        total: int | None = None
        infos: list[dict[str, Any]] = []
        for i in range(n):
            if dones[i]:
                info = _env_info(final_info, i)
                self.reset_infos[i] = _env_info(vinfos, i, _VECTOR_KEYS)
                if final_obs is None or final_obs[i] is None:  # pragma: no cover - ClusterEnv's SameStep contract
                    raise RuntimeError(f"ClusterEnv ended env {i}'s episode without its final observation")
                info["terminal_observation"] = np.asarray(final_obs[i])
                info["episode"] = {
                    "r": round(float(self._returns[i]), 6),
                    "l": int(self._lengths[i]),
                    "t": round(time.time() - self._t_start, 6),
                }
                if total is None:
                    total = self.cluster.meter.total()
                info["frugalrl/bytes_total"] = total
                self._returns[i] = 0.0
                self._lengths[i] = 0
            else:
                info = _env_info(vinfos, i, _VECTOR_KEYS)
            info["TimeLimit.truncated"] = bool(truncs[i] and not terms[i])
            if not stepped[i]:
                info["frugalrl/worker_restarted"] = True
            infos.append(info)
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        """Stop the ClusterEnv's workers (safe to call more than once)."""
        if not self._closed:
            self._closed = True
            self.cluster.close()

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seeds for the next :meth:`reset` only: env ``j`` gets ``seed + j`` (a random ``seed`` if None).

        Returns:
            The seed of each env.
        """
        return super().seed(seed)

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """An attribute of the envs: the spaces, ``spec``, ``render_mode`` and ``metadata`` from the head, any other
        from the workers (a JSON value or a NumPy array; see :mod:`frugalrl.envs.calls`)."""
        if attr_name == "metadata":
            return [dict(self._probe_env()[0]) for _ in self._get_indices(indices)]
        return list(self.cluster.get_attr(attr_name, envs=list(self._get_indices(indices))))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set an attribute of the envs in the workers (one JSON value for all of ``indices``)."""
        targets = list(self._get_indices(indices))
        self.cluster.set_attr(attr_name, [value] * len(targets), envs=targets)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call a method of the envs in the workers, with JSON arguments; its results come back as data."""
        return list(self.cluster.call(method_name, *method_args, envs=list(self._get_indices(indices)),
                                      **method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether the envs are wrapped with ``wrapper_class``.

        Answered from one head-side copy of the env built by the same factory as the workers' envs; SB3's
        ``Monitor`` (or a base class of it) counts as present, since the adapter records its statistics.
        """
        wrappers = self._probe_env()[1]
        wrapped = issubclass(Monitor, wrapper_class) or any(issubclass(w, wrapper_class) for w in wrappers)
        return [wrapped for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """No images: ClusterEnv does not render (its ``render_mode`` is None), as ``DummyVecEnv`` answers then."""
        warnings.warn(
            f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
            stacklevel=2,
        )
        return [None for _ in range(self.num_envs)]

    # ------------------------------------------------------------------ internals
    def _probe_env(self) -> tuple[dict[str, Any], tuple[type, ...]]:
        """(metadata, wrapper types) of one env built on the head by the workers' factory (built once)."""
        if self._probe is None:
            env = self.cluster.env_spec.make()
            try:
                wrappers: list[type] = []
                layer: gym.Env = env
                while isinstance(layer, gym.Wrapper):
                    wrappers.append(type(layer))
                    layer = layer.env
                self._probe = (dict(env.metadata), tuple(wrappers))
            finally:
                env.close()
        return self._probe

    def __repr__(self) -> str:
        return f"SB3VecEnv({self.cluster!r})"


class _Wrapped:
    """An env function (picklable, for the workers): the spec's env inside ``wrapper_class(env, **wrapper_kwargs)``,
    as SB3's ``make_vec_env`` wraps each env."""

    def __init__(self, spec: EnvSpec, wrapper_class: Callable[..., gym.Env], wrapper_kwargs: dict[str, Any]) -> None:
        self.spec, self.wrapper_class, self.wrapper_kwargs = spec, wrapper_class, wrapper_kwargs
        self.__qualname__ = f"{getattr(wrapper_class, '__name__', 'wrapper')}({spec.describe()})"

    def __call__(self) -> gym.Env:
        return self.wrapper_class(self.spec.make(), **self.wrapper_kwargs)


def make_sb3_vec_env(
    env: str | Callable[..., gym.Env] | EnvSpec,
    num_workers: int = 2,
    envs_per_worker: int = 1,
    backend: str = "local",
    seed: int | None = None,
    *,
    env_kwargs: dict[str, Any] | None = None,
    wrapper_class: Callable[..., gym.Env] | None = None,
    wrapper_kwargs: dict[str, Any] | None = None,
    vec_env_kwargs: dict[str, Any] | None = None,
    **cluster_kwargs: Any,
) -> SB3VecEnv:
    """Build a ClusterEnv with same-step autoreset and wrap it for Stable-Baselines3.

    Args:
        env: a Gymnasium id, a ``"module:function"`` factory path, a callable returning an env, or an
            :class:`~frugalrl.EnvSpec` (as for :class:`~frugalrl.ClusterEnv`).
        num_workers: worker processes.
        envs_per_worker: environments per worker (SB3 sees ``num_workers * envs_per_worker`` envs).
        backend: ``"local"`` (processes), ``"serial"`` (in-process) or ``"ray"``.
        seed: if given, the ClusterEnv's base seed and the seed of the first :meth:`SB3VecEnv.reset`
            (env ``j`` starts with ``seed + j``); SB3's ``model = PPO(..., seed=s)`` reseeds it anyway.
        env_kwargs, wrapper_class, wrapper_kwargs, vec_env_kwargs: as SB3's ``make_vec_env``: the env's keyword
            arguments, a wrapper put around each env (in the workers) with its keyword arguments, and keyword
            arguments of the vector env (here :class:`~frugalrl.ClusterEnv`'s). SB3's ``Monitor`` statistics are
            recorded by the adapter itself, so there is no ``monitor_dir``.
        **cluster_kwargs: other :class:`~frugalrl.ClusterEnv` arguments (``uplink``, ``worker_timeout``, ...);
            ``autoreset_mode`` must be ``"SameStep"`` if given.

    Returns:
        The adapter; ``close()`` it to stop the workers.
    """
    cluster_kwargs = {**(vec_env_kwargs or {}), **cluster_kwargs}
    mode = cluster_kwargs.pop("autoreset_mode", AutoresetMode.SAME_STEP)
    if wrapper_class is not None:
        wrapped = _Wrapped(to_env_spec(env, env_kwargs), wrapper_class, dict(wrapper_kwargs or {}))
        env, env_kwargs = [wrapped] * (num_workers * envs_per_worker), None  # type: ignore[assignment]
    cluster = ClusterEnv(env, num_workers=num_workers, envs_per_worker=envs_per_worker, backend=backend,
                         seed=seed, autoreset_mode=mode, env_kwargs=env_kwargs, **cluster_kwargs)
    try:
        venv = SB3VecEnv(cluster)
    except BaseException:
        cluster.close()
        raise
    if seed is not None:
        venv.seed(seed)
    return venv
