"""Stable-Baselines3 on ClusterEnv: a ``VecEnv`` whose environments run on frugalrl's workers.

::

    from stable_baselines3 import PPO
    from frugalrl.integrations.sb3 import make_sb3_vec_env

    venv = make_sb3_vec_env("CartPole-v1", num_workers=2, envs_per_worker=4, seed=0)
    model = PPO("MlpPolicy", venv, seed=0).learn(50_000)
    print(venv.bytes["total"], "bytes on the wire")
    venv.close()

SB3 drives the envs from the head: each ``step`` sends the actions to the workers and brings back observations,
rewards and done flags, counted by ClusterEnv's byte meter. :func:`make_sb3_vec_env` takes SB3's ``make_vec_env``
arguments; :class:`ClusterSubprocVecEnv` takes ``SubprocVecEnv``'s (also as ``make_vec_env(...,
vec_env_cls=ClusterSubprocVecEnv)``). SB3 expects a finished env's step to return the *next* episode's first
observation, the last one in ``infos[i]["terminal_observation"]``: Gymnasium's ``SAME_STEP`` autoreset, which
ClusterEnv's workers do natively, so :class:`SB3VecEnv` needs a ClusterEnv built with ``autoreset_mode="SameStep"``.
Envs built by those two functions are wrapped in :class:`~frugalrl.integrations.sb3_envs.SB3Side` in the workers
(per-env seeds and options, nested infos such as Monitor's, composite action spaces). The deliberate differences
from SB3's own vector envs are listed in ``docs/getting-started.md`` (From Stable-Baselines3).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array

try:
    from stable_baselines3.common.monitor import Monitor, ResultsWriter
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
from frugalrl.envs.spec import FLATTENED, EnvSpec, to_env_spec
from frugalrl.experience import space_shape
from frugalrl.integrations.sb3_envs import (
    NATIVE_ACTIONS,
    PER_ENV,
    ActionCodec,
    RankEnv,
    SideFn,
    nested_info,
    raw_env,
)

__all__ = ["ClusterSubprocVecEnv", "SB3VecEnv", "make_sb3_vec_env"]

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
    return nested_info(out)


@dataclass(frozen=True)
class _Probe:
    """What the head learns from one env built by the user's recipe (then closed)."""

    observation_space: gym.Space
    action_space: gym.Space
    render_mode: str | None
    metadata: dict[str, Any]
    env_id: str | None
    wrappers: tuple[type, ...]

    @classmethod
    def of(cls, recipe: Callable[[], gym.Env]) -> _Probe:
        env = recipe()
        try:
            wrappers: list[type] = []
            layer: gym.Env = env
            while isinstance(layer, gym.Wrapper):
                wrappers.append(type(layer))
                layer = layer.env
            return cls(env.observation_space, env.action_space, env.render_mode, dict(env.metadata),
                       env.spec.id if env.spec is not None else None, tuple(wrappers))
        finally:
            env.close()


class SB3VecEnv(VecEnv):
    """A Stable-Baselines3 ``VecEnv`` over a :class:`~frugalrl.ClusterEnv` (see the module docs).

    The adapter owns the ClusterEnv: :meth:`close` stops its workers. Env ``j`` of SB3 is env ``j``
    of the ClusterEnv (worker ``j // envs_per_worker``). SB3 sees the envs' own spaces: observations that
    ClusterEnv flattens (Discrete, MultiDiscrete, MultiBinary, Dict, Tuple) are unflattened on the head.

    Args:
        cluster: a ClusterEnv built with ``autoreset_mode="SameStep"``.
        record_episodes: the adapter puts Monitor's ``episode`` statistics (measured on what SB3 sees) in the
            infos of finished episodes and counts as ``Monitor`` in :meth:`env_is_wrapped`; False leaves the
            envs' own infos (a ``Monitor`` in them, as :func:`make_sb3_vec_env` builds).

    Raises:
        ValueError: ``cluster`` uses another autoreset mode.
        TypeError: ``cluster`` is not a ClusterEnv.

    Attributes:
        cluster: the ClusterEnv; its byte meter, sync state and restarts stay readable there.
    """

    def __init__(self, cluster: ClusterEnv, *, record_episodes: bool = True) -> None:
        if not isinstance(cluster, ClusterEnv):
            raise TypeError(f"SB3VecEnv wraps a frugalrl.ClusterEnv, got {type(cluster).__name__}")
        if cluster.autoreset_mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                "SB3VecEnv needs a ClusterEnv built with autoreset_mode='SameStep' (SB3 expects the reset "
                f"observation in the step that ends an episode); this one uses {cluster.autoreset_mode.value!r}. "
                "make_sb3_vec_env(...) builds a suitable one."
            )
        self.cluster = cluster
        cluster.info_dtypes = "widest"  # each env's info as it gave it, not cast to the first env's dtype
        self.record_episodes = bool(record_episodes)
        n = cluster.num_envs
        spec, fns = cluster.env_spec, cluster.env_spec.fns
        self._side = fns is not None and all(isinstance(f, SideFn) for f in fns)
        self._recipes: list[Callable[[], gym.Env]]
        if self._side:
            assert fns is not None
            self._recipes = [f.recipe for f in fns]  # type: ignore[attr-defined]
            self._probe_keys: list[Any] = [f.probe_key for f in fns]  # type: ignore[attr-defined]
        else:
            self._recipes = [functools.partial(raw_env, spec, j) for j in range(n)]
            self._probe_keys = [fns[j % len(fns)] if fns is not None else "spec" for j in range(n)]
        self._probes: dict[Any, _Probe] = {}
        first = self._probe(0)
        obs_space, act_space = first.observation_space, first.action_space
        self._flat_obs = isinstance(obs_space, FLATTENED) and obs_space != cluster.single_observation_space
        self._codec = ActionCodec(act_space) if self._side and not isinstance(act_space, NATIVE_ACTIONS) else None
        self._monitor: list[ResultsWriter] | None = None
        super().__init__(n, obs_space, act_space)
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
        resets env ``j`` with ``seed + j`` and gives every env the same options; other seeds and options reach
        the envs through their :class:`~frugalrl.integrations.sb3_envs.SB3Side` wrapper (envs built by
        :func:`make_sb3_vec_env` or :class:`ClusterSubprocVecEnv`).

        Raises:
            ValueError: seeds or options that this ClusterEnv cannot apply (see above).
        """
        seeds, options = list(self._seeds), [dict(o) if o else None for o in self._options]
        first = seeds[0]
        consecutive = all(s is None for s in seeds) or (
            first is not None and all(s is not None and int(s) == int(first) + j for j, s in enumerate(seeds)))
        if consecutive and all(o == options[0] for o in options):
            seed = None if first is None else int(first)
            obs, infos = self.cluster.reset(seed=seed, options=options[0])
        elif self._side:
            per_env = {"seeds": [None if s is None else int(s) for s in seeds], "options": options}
            obs, infos = self.cluster.reset(seed=None, options={PER_ENV: per_env})
        elif not consecutive:
            raise ValueError(f"ClusterEnv seeds env j with seed + j; the seeds {seeds} are not of that form (use "
                             "seed(s), or build the env with make_sb3_vec_env / ClusterSubprocVecEnv)")
        else:
            raise ValueError("ClusterEnv resets every env with the same options; set_options() gave different ones "
                             "(make_sb3_vec_env / ClusterSubprocVecEnv take per-env options)")
        self.reset_infos = [_env_info(infos, i, _VECTOR_KEYS) for i in range(self.num_envs)]
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._actions = None
        self._reset_seeds()
        self._reset_options()
        return self._sb3_obs(obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Keep the actions for :meth:`step_wait` (ClusterEnv steps synchronously: the work happens there).

        ``actions`` has one action per env; for a Discrete space any shape with ``num_envs`` elements is
        accepted (SB3 sometimes passes ``(n, 1)``). Composite actions may be a list of per-env actions.
        """
        if self._codec is not None:
            self._actions = self._codec.encode(actions, self.num_envs)
            return
        arr = np.asarray(actions)
        shape = (self.num_envs, *space_shape(self.cluster.single_action_space))
        if arr.shape != shape and arr.size == int(np.prod(shape)):
            arr = arr.reshape(shape)
        self._actions = arr

    def step_wait(self) -> VecEnvStepReturn:
        """Step every env with the actions of :meth:`step_async`.

        Returns:
            ``(obs, rewards, dones, infos)`` as SB3's ``SubprocVecEnv`` gives them: ``obs`` (the reset observation
            for finished envs), float32 ``rewards``, ``dones`` (``terminated or truncated``) and one ``info`` per
            env, its env's own (numeric) infos and ``TimeLimit.truncated`` (``truncated and not terminated``). A
            finished env's info adds ``terminal_observation``, ``episode = {"r", "l", "t"}`` (the adapter's with
            ``record_episodes``, else the env's Monitor's) and ``frugalrl/bytes_total`` (every byte counted so far);
            the new episodes' reset infos go to :attr:`reset_infos`. A worker that died is replaced inside
            ClusterEnv: its envs' episodes end in this step as truncated, with ``frugalrl/worker_restarted = True``
            (and the adapter's ``episode`` where Monitor's was lost with the worker).

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
        now = round(time.time() - self._t_start, 6)
        total: int | None = None
        infos: list[dict[str, Any]] = []
        for i in range(n):
            if dones[i]:
                info = _env_info(final_info, i)
                self.reset_infos[i] = _env_info(vinfos, i, _VECTOR_KEYS)
                if final_obs is None or final_obs[i] is None:  # pragma: no cover - ClusterEnv's SameStep contract
                    raise RuntimeError(f"ClusterEnv ended env {i}'s episode without its final observation")
                last = final_obs[i]  # an array, or a dict / tuple for ClusterEnv's native composite spaces
                info["terminal_observation"] = self._sb3_obs(last if isinstance(last, dict | tuple) else
                                                             np.asarray(last), batch=False)
                if self.record_episodes or (not stepped[i] and self._is_wrapped(i, Monitor)):
                    info["episode"] = {"r": round(float(self._returns[i]), 6), "l": int(self._lengths[i]), "t": now}
                if "episode" in info:
                    info["episode"]["t"] = now  # the head's clock, as the Monitor files (one clock for every env)
                    if self._monitor is not None:
                        self._monitor[i].write_row({k: v for k, v in info["episode"].items()
                                                    if k in self._monitor[i].logger.fieldnames})
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
        return self._sb3_obs(obs), rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        """Stop the ClusterEnv's workers and close the Monitor files (safe to call more than once)."""
        if not self._closed:
            self._closed = True
            for writer in self._monitor or []:
                writer.close()
            self.cluster.close()

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seeds for the next :meth:`reset` only: env ``j`` gets ``seed + j`` (a random ``seed`` if None).

        Returns:
            The seed of each env.
        """
        return super().seed(seed)

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """An attribute of the envs: the spaces (SB3's), ``spec``, ``render_mode`` and ``metadata`` from the head, any
        other from the workers (a JSON value or a NumPy array; see :mod:`frugalrl.envs.calls`)."""
        targets = self._indices(indices)
        if attr_name in ("observation_space", "action_space", "render_mode", "metadata"):
            return [getattr(self._probe(j), attr_name) for j in targets]
        return list(self.cluster.get_attr(attr_name, envs=targets))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set an attribute of the envs in the workers (one JSON value for all of ``indices``)."""
        targets = self._indices(indices)
        self.cluster.set_attr(attr_name, [value] * len(targets), envs=targets)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call a method of the envs in the workers, with JSON arguments; its results come back as data."""
        return list(self.cluster.call(method_name, *method_args, envs=self._indices(indices), **method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether the envs are wrapped with ``wrapper_class``.

        Answered from head-side copies of the envs, built by the workers' recipes (once per distinct recipe);
        with ``record_episodes``, SB3's ``Monitor`` (or a base class of it) counts as present.
        """
        return [self._is_wrapped(j, wrapper_class) for j in self._indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` image from the workers when the render mode is ``rgb_array`` (else None)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return list(self.cluster.call("render"))

    # ------------------------------------------------------------------ internals
    def _indices(self, indices: VecEnvIndices) -> list[int]:
        """SB3's indices as ClusterEnv's (negative ones counted from the end, as DummyVecEnv's list indexing)."""
        n = self.num_envs
        out = []
        for j in self._get_indices(indices):
            if not -n <= int(j) < n:
                raise IndexError(f"env index {j} out of range for {n} envs")
            out.append(int(j) % n)
        return out

    def _probe(self, j: int) -> _Probe:
        key = self._probe_keys[j]
        if key not in self._probes:
            self._probes[key] = _Probe.of(self._recipes[j])
        return self._probes[key]

    def _is_wrapped(self, j: int, wrapper_class: type) -> bool:
        if self.record_episodes and issubclass(Monitor, wrapper_class):
            return True
        return any(issubclass(w, wrapper_class) for w in self._probe(j).wrappers)

    def _sb3_obs(self, obs: Any, batch: bool = True) -> Any:
        """ClusterEnv's (flattened) observations in the envs' own space."""
        if not self._flat_obs:
            return obs
        space = self.observation_space
        if not batch:
            return gym.spaces.unflatten(space, obs)
        rows = [gym.spaces.unflatten(space, row) for row in obs]
        out = create_empty_array(space, len(rows), fn=np.zeros)
        assert out is not None
        return concatenate(space, rows, out)

    def _open_monitor_files(self, directory: str, ranks: Iterable[int], monitor_kwargs: dict[str, Any]) -> None:
        """SB3's Monitor files ``directory/<rank>.monitor.csv``, written here on the head (one per env)."""
        extra = tuple(monitor_kwargs.get("reset_keywords", ())) + tuple(monitor_kwargs.get("info_keywords", ()))
        override = bool(monitor_kwargs.get("override_existing", True))
        os.makedirs(directory, exist_ok=True)
        header: dict[str, float | str] = {"t_start": self._t_start, "env_id": str(self._probe(0).env_id)}
        self._monitor = [ResultsWriter(os.path.join(directory, str(rank)), header=header, extra_keys=extra,
                                       override_existing=override) for rank in ranks]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cluster!r})"


def _side_cluster(recipes: Sequence[Callable[[], gym.Env]], num_workers: int, **cluster_kwargs: Any) -> ClusterEnv:
    """A same-step ClusterEnv of ``SB3Side(recipe())`` envs (one recipe per env)."""
    mode = cluster_kwargs.pop("autoreset_mode", AutoresetMode.SAME_STEP)
    fns = [SideFn(recipe, j) for j, recipe in enumerate(recipes)]
    return ClusterEnv(EnvSpec(fns=tuple(fns)), num_workers=num_workers, autoreset_mode=mode, **cluster_kwargs)


class ClusterSubprocVecEnv(SB3VecEnv):
    """SB3's ``SubprocVecEnv`` signature over a ClusterEnv: by default one local worker process per env function.

    A drop-in for ``SubprocVecEnv`` (``make_vec_env(..., vec_env_cls=ClusterSubprocVecEnv)`` too): the env
    functions travel to the workers by cloudpickle, as SubprocVecEnv's do; the envs' own infos come back as they
    are (``record_episodes=False``). Workers are always fresh interpreters, so ``start_method`` is only checked.

    Args:
        env_fns: one function per env, each returning a new ``gymnasium.Env``.
        start_method: a ``multiprocessing`` start method name (checked: an unknown one raises ValueError).
        num_workers: worker processes (dividing ``len(env_fns)``); default one per env function.
        **kwargs: :class:`SB3VecEnv`'s ``record_episodes`` and :class:`~frugalrl.ClusterEnv`'s arguments
            (``backend``, ``uplink``, ``worker_timeout``, ...).
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], start_method: str | None = None, *,
                 num_workers: int | None = None, record_episodes: bool = False, **kwargs: Any) -> None:
        if start_method is not None:
            multiprocessing.get_context(start_method)  # SubprocVecEnv's ValueError for an unknown method
        fns = list(env_fns)
        cluster = _side_cluster(fns, num_workers or len(fns), **kwargs)
        try:
            super().__init__(cluster, record_episodes=record_episodes)
        except BaseException:
            cluster.close()
            raise


def make_sb3_vec_env(
    env: str | Callable[..., gym.Env] | EnvSpec,
    num_workers: int = 2,
    envs_per_worker: int = 1,
    backend: str = "local",
    seed: int | None = None,
    *,
    n_envs: int | None = None,
    start_index: int = 0,
    monitor_dir: str | None = None,
    wrapper_class: Callable[..., gym.Env] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    vec_env_kwargs: dict[str, Any] | None = None,
    monitor_kwargs: dict[str, Any] | None = None,
    wrapper_kwargs: dict[str, Any] | None = None,
    **cluster_kwargs: Any,
) -> SB3VecEnv:
    """SB3's ``make_vec_env`` on a ClusterEnv: each env built as SB3 builds it, stepped by frugalrl's workers.

    Env ``i`` (rank ``start_index + i``) is the env (a Gymnasium id gets ``render_mode="rgb_array"`` unless
    ``env_kwargs`` names one), its action space seeded with ``seed + rank``, ``Monitor(env, **monitor_kwargs)``, then
    ``wrapper_class(env, **wrapper_kwargs)``, all in the workers; the first reset uses ``seed + i``.

    Args:
        env: a Gymnasium id, a ``"module:function"`` factory path, a callable returning an env (called with
            ``env_kwargs``), or an :class:`~frugalrl.EnvSpec`.
        num_workers: worker processes.
        envs_per_worker: environments per worker (SB3 sees ``num_workers * envs_per_worker`` envs).
        backend: ``"local"`` (processes), ``"serial"`` (in-process) or ``"ray"``.
        seed: SB3's ``seed`` (also the ClusterEnv's base seed); ``PPO(..., seed=s)`` reseeds anyway.
        n_envs: SB3's env count: ``envs_per_worker`` becomes ``n_envs // num_workers`` (which must divide it).
        start_index, monitor_dir, wrapper_class, env_kwargs, vec_env_kwargs, monitor_kwargs, wrapper_kwargs: as
            SB3's ``make_vec_env``; ``vec_env_kwargs`` go to :class:`~frugalrl.ClusterEnv`. The Monitor files
            ``monitor_dir/<rank>.monitor.csv`` are written by the head (also with the ``ray`` backend).
        **cluster_kwargs: other :class:`~frugalrl.ClusterEnv` arguments (``uplink``, ``worker_timeout``, ...);
            ``autoreset_mode`` must be ``"SameStep"`` if given.

    Returns:
        The adapter; ``close()`` it to stop the workers.
    """
    if n_envs is not None:
        if n_envs < 1 or n_envs % num_workers or envs_per_worker not in (1, n_envs // num_workers):
            raise ValueError(f"n_envs={n_envs} cannot be split into {num_workers} workers of equal size"
                             + (f" x {envs_per_worker} envs" if envs_per_worker != 1 else ""))
        envs_per_worker = n_envs // num_workers
    if num_workers < 1 or envs_per_worker < 1:
        raise ValueError(f"num_workers and envs_per_worker must be >= 1, got {num_workers} and {envs_per_worker}")
    spec = to_env_spec(env, env_kwargs)
    ranks = range(start_index, start_index + num_workers * envs_per_worker)
    recipes = [RankEnv(spec, rank, seed, dict(monitor_kwargs or {}), wrapper_class, dict(wrapper_kwargs or {}))
               for rank in ranks]
    kwargs = {**(vec_env_kwargs or {}), **cluster_kwargs}
    cluster = _side_cluster(recipes, num_workers, backend=backend, seed=seed, **kwargs)
    try:
        venv = SB3VecEnv(cluster, record_episodes=False)
        if monitor_dir is not None:
            venv._open_monitor_files(monitor_dir, ranks, dict(monitor_kwargs or {}))
    except BaseException:
        cluster.close()
        raise
    if seed is not None:
        venv.seed(seed)
    return venv
