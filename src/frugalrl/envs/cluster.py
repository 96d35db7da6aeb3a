"""ClusterEnv: a Gymnasium vector env whose environments (and, in DETACH mode, policy) run on workers.

Three ways to use it:

1. As a drop-in ``gymnasium.vector.VectorEnv``: ``reset()``, ``step(actions)``, ``close()``; the
   head chooses the actions (head-side inference), workers only step their environments.
2. ``step(agent)``: one step with worker-side inference (the paper's DETACH mode). The agent's
   weights are sent to the workers that the sync rule picks; actions and behaviour-distribution
   parameters come back in ``infos``.
3. ``rollout(agent, num_steps)``: every worker runs ``num_steps`` steps of its envs with its cached
   policy and returns one batch (a :class:`~frugalrl.rollout.Rollout`).

Env ``j`` always sits at index ``j`` (worker ``j // envs_per_worker``), whatever order the
replies arrive in. Weights move only when the sync rule says so (see :mod:`frugalrl.sync`).
A worker that dies is replaced and its envs reset; the learner is told through
``infos["worker_restarted"]`` (step) or ``Rollout.restarted_workers`` (rollout, which is
re-collected from the fresh worker so that no partial fragment is ever mixed in).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import weakref
from collections.abc import Callable, Collection
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from frugalrl.envs.asynccalls import AsyncCalls
from frugalrl.envs.backends import BACKENDS, make_backend, note_torch_threads
from frugalrl.envs.backends import inline_workers as inline_workers_of
from frugalrl.envs.backends.base import WorkerConfig
from frugalrl.envs.batching import (
    assemble_rollout,
    check_actions,
    merge_infos,
    reset_requests,
    rollout_bound,
)
from frugalrl.envs.calls import EnvCalls
from frugalrl.envs.checkpoint import Checkpoints
from frugalrl.envs.evidence import Behaviours
from frugalrl.envs.pool import AsyncSteps
from frugalrl.envs.restarts import CrashLoopRule, Replacements, checked_env_error_rule
from frugalrl.envs.spaces import Batches, check_inference, check_worker_spaces, probe
from frugalrl.envs.spec import EnvSpec, to_env_spec
from frugalrl.envs.syncing import WeightSyncs
from frugalrl.envs.worker import WorkerError, compact_int_dtype
from frugalrl.experience import space_shape
from frugalrl.nets import ActorCritic, as_agent
from frugalrl.npactor import one_blas_thread
from frugalrl.rollout import Rollout
from frugalrl.sync import EveryUpdate, SyncRule
from frugalrl.sync_state import PolicySync
from frugalrl.wire.codecs import FLOAT_CODECS
from frugalrl.wire.message import Message
from frugalrl.wire.meter import ByteMeter
from frugalrl.wire.uplink import UplinkOptions

log = logging.getLogger("frugalrl")

def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


_EXPERIENCE_REPLIES = ("step", "rollout")
"""Replies that mean a worker did useful work (a reset or a weights message does not)."""


class ClusterEnv(AsyncCalls, Checkpoints, Replacements, EnvCalls, AsyncSteps, Behaviours, WeightSyncs,  # type: ignore[misc]
                 gym.vector.VectorEnv):
    """A distributed Gymnasium vector env with worker-side inference and adaptive policy sync.

    Args:
        env: a Gymnasium id (``"CartPole-v1"``), a ``"module:function"`` factory path, a callable
            returning a ``gymnasium.Env``, or an :class:`~frugalrl.envs.spec.EnvSpec`.
        num_workers: worker processes (or in-process workers for ``backend="serial"``).
        inline_workers: ``backend="local"``: workers run in this process while the others step theirs (no isolation
            or timeout for them). None: as many as keep the worker processes fewer than the cores.
        envs_per_worker: environments stepped by each worker.
        backend: ``"local"`` (processes), ``"serial"`` (in-process reference), ``"ray"`` (Ray actors on a Ray
            cluster; ``pip install 'frugalrl[ray]'``) or ``"replay"`` (a load generator, :mod:`~.backends.replay`).
        sync: the weight-sync rule for worker-side inference (default :class:`EveryUpdate`).
        seed: base seed; env ``j`` is reset with ``seed + j``.
        env_kwargs, env_wrappers: keyword arguments for ``gym.make`` or the factory; wrappers around each env.
        autoreset_mode: ``"NextStep"`` (Gymnasium's default), ``"SameStep"`` or ``"Disabled"`` for :meth:`step`.
        observation_mode: AsyncVectorEnv's: ``"same"``, ``"different"`` or ``(batched, single)`` spaces.
        weights_codec: how weights travel: ``fp32``, ``bf16``, ``fp16`` or ``int8``.
        weights_delta: a worker that holds an older copy is sent only what changed, when that is smaller (exact;
            :mod:`frugalrl.wire.delta`).
        uplink: how experience travels back: a compressor name (``"auto"``, ``"lz4"``, ``"zstd"``, ``"none"``;
            lossless) or :class:`~frugalrl.wire.uplink.UplinkOptions` (also lossy observations, what the
            behaviour stream holds, the link rate ``auto`` assumes); see :mod:`frugalrl.wire.uplink`.
        worker_timeout: seconds without a reply after which a worker is declared dead.
        check_finite: raise on NaN/inf observations or rewards.
        worker_memory_mb: a worker process over this resident memory (MB) is replaced before a rollout or step
            (local backend, checked every 10 s at most; inline workers move to processes); None: never.
        crash_loop_tries: how many times in a row a worker that dies before completing a request is replaced
            (after 0, 0.25, 0.5, ... up to 4 s) before :class:`~frugalrl.envs.restarts.WorkersFailed`; one that
            dies after useful work is always replaced (:mod:`frugalrl.envs.restarts`).
        on_env_error: an env that raises: ``"raise"`` (as AsyncVectorEnv) or ``"restart"`` (as a dead worker).
        kl_states: states per worker kept for the AAPS KL estimate.
        ray_address: ``backend="ray"`` only: the Ray cluster to join (``"auto"`` or ``"host:port"``);
            None starts a private single-machine Ray (shut down on close). A Ray already initialised in
            this process is always used as is.
        ray_num_cpus: ``backend="ray"`` only: CPUs each worker actor reserves (0 lets actors share CPUs).
        replayable: workers record what :meth:`state_dict` needs to rebuild their envs exactly (checkpoints).
        episode_statistics: ``step()``'s infos carry ``episode`` / ``_episode`` as Gymnasium's
            ``RecordEpisodeStatistics`` would (measured on the workers); False gives SyncVectorEnv's exact info
            layout, e.g. to put ``gymnasium.wrappers.vector.RecordEpisodeStatistics`` on top.
    """

    def __init__(
        self,
        env: str | Callable[..., gym.Env] | EnvSpec,
        num_workers: int = 2,
        envs_per_worker: int = 1,
        backend: str = "local",
        inline_workers: int | None = None,
        sync: SyncRule | None = None,
        seed: int | None = None,
        *,
        env_kwargs: dict[str, Any] | None = None,
        env_wrappers: list[Any] | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        weights_codec: str = "fp32",
        weights_delta: bool = True,
        uplink: str | UplinkOptions = "auto",
        worker_timeout: float = 300.0,
        check_finite: bool = True,
        meter: ByteMeter | None = None,
        crash_loop_tries: int = 8,
        on_env_error: Literal["raise", "restart"] = "raise",
        worker_memory_mb: float | None = 2048.0,
        kl_states: int = 256,
        ray_address: str | None = None,
        ray_num_cpus: float = 1.0,
        replayable: bool = False,
        episode_statistics: bool = True,
        observation_mode: Any = "same",
    ) -> None:
        self.closed = True  # until started, so that close() in __del__ is safe
        self.num_workers = _positive_int("num_workers", num_workers)
        self.envs_per_worker = _positive_int("envs_per_worker", envs_per_worker)
        self.kl_states = _positive_int("kl_states", kl_states)
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
        if weights_codec not in FLOAT_CODECS:
            raise ValueError(f"unknown weights_codec {weights_codec!r}; expected one of {FLOAT_CODECS}")
        uplink_options = UplinkOptions.from_json(uplink)
        if not worker_timeout > 0:
            raise ValueError(f"worker_timeout must be > 0 seconds, got {worker_timeout!r}")
        if sync is not None and not isinstance(sync, SyncRule):
            raise TypeError(f"sync must be a SyncRule (EveryUpdate(), Interval(n), AAPS(delta)), got {sync!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        try:
            mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ValueError(f"autoreset_mode must be 'NextStep', 'SameStep' or 'Disabled', got {autoreset_mode!r}") from None

        self.env_spec = to_env_spec(env, env_kwargs, env_wrappers)
        if self.env_spec.fns is not None:  # one function per env, as AsyncVectorEnv takes them
            n = len(self.env_spec.fns)
            if n % self.num_workers or envs_per_worker not in (1, n // self.num_workers):
                raise ValueError(f"{n} env functions cannot be split evenly into {self.num_workers} workers of "
                                 f"{envs_per_worker} envs; pass num_workers dividing {n}")
            self.envs_per_worker = n // self.num_workers
        self.num_envs = self.num_workers * self.envs_per_worker
        probed = probe(self.env_spec, self.num_envs, observation_mode)
        self.spec = probed.spec
        # Any space of Gymnasium's own for step(actions); Box observations and Box or Discrete actions for
        # worker-side inference, rollouts and checkpoints (:mod:`frugalrl.envs.spaces`).
        self.single_observation_space: gym.spaces.Box = probed.single_observation_space  # type: ignore[assignment]
        self.single_action_space: gym.spaces.Discrete | gym.spaces.Box = probed.single_action_space  # type: ignore[assignment]
        self._obs_batches = Batches(self.single_observation_space, self.num_envs, self.envs_per_worker)
        self._act_batches = Batches(self.single_action_space, self.num_envs, self.envs_per_worker)
        if replayable:
            check_inference(self.single_observation_space, self.single_action_space, "replayable=True (checkpoints)")

        self._action_wire_dtype = (
            compact_int_dtype(self.single_action_space)
            if isinstance(self.single_action_space, gym.spaces.Discrete)
            else None
        )
        self.observation_space = probed.observation_space
        self.action_space = probed.action_space
        self.autoreset_mode = mode
        self.metadata = {**probed.metadata, "autoreset_mode": mode}
        self.render_mode = probed.render_mode
        self.meter = meter if meter is not None else ByteMeter()
        self.policies = PolicySync(self.num_workers, sync if sync is not None else EveryUpdate(), weights_codec,
                                   self.kl_states, weights_delta)
        if seed is None:
            entropy = np.random.SeedSequence().entropy  # drawn from the OS: an int when none is given
            assert isinstance(entropy, int)
            seed = entropy % (2**31)
        self.seed = int(seed)
        self.weights_codec = weights_codec
        self.uplink = uplink_options
        self._codecs_seen: dict[str, dict[str, int]] = {}
        self.restart_rule = CrashLoopRule(self.num_workers, max_tries=int(crash_loop_tries))
        self.on_env_error = checked_env_error_rule(on_env_error)
        if worker_memory_mb is not None and not worker_memory_mb > 0:
            raise ValueError(f"worker_memory_mb must be > 0 or None, got {worker_memory_mb!r}")
        self.worker_memory_mb = worker_memory_mb
        self.recycle_events: list[dict[str, Any]] = []
        self._memory_checked = 0.0  # time.monotonic() of the last check
        self._head_rss_base: float | None = None  # this process's memory at the first check (inline workers)
        self.backend_name = backend
        self.replayable = bool(replayable)
        self.episode_statistics = bool(episode_statistics)
        # How an info key whose dtype differs between envs is batched: "first", the first env's dtype for all, as
        # SyncVectorEnv casts them; "widest", one that holds every env's value (SB3VecEnv: per-env infos).
        self.info_dtypes: Literal["first", "widest"] = "first"

        k = self.envs_per_worker
        configs = [
            WorkerConfig(w, self.env_spec, k, w * k, mode.value, check_finite, self.seed, self.replayable,
                         uplink_options)
            for w in range(self.num_workers)
        ]
        self.inline_workers = inline_workers_of(backend, self.num_workers, inline_workers)
        note_torch_threads(backend, self.num_workers, self.inline_workers)
        self.backend = make_backend(backend, configs, self.meter, float(worker_timeout), inline=self.inline_workers,
                                    ray_address=ray_address, ray_num_cpus=ray_num_cpus)
        died = self.backend.start()
        self.closed = False
        _register_close(self)

        self.restart_events: list[dict[str, Any]] = []
        self._deferred: set[int] = set()  # workers whose envs reset at their next step
        self._in_flight: set[int] = set()  # workers with a send() / async_reset() not yet recv()'d
        for w, reason in died.items():  # died or hung while starting: replaced like any other
            self._restart(w, reason)
        self._obs: np.ndarray | None = None
        if self.env_spec.fns is not None:  # the functions may build different envs: AsyncVectorEnv's check
            try:
                check_worker_spaces(self, observation_mode)
            except BaseException:
                self.close()
                raise

    @property
    def observations(self) -> np.ndarray | None:
        """The current observation of every env (a copy; None before the first reset)."""
        return None if self._obs is None else self._obs_batches.copy(self._obs)

    @classmethod
    def from_config(cls, cfg: Any, replayable: bool = False) -> ClusterEnv:
        """The ClusterEnv a run config describes (its :class:`~frugalrl.config.RunConfig` env and seed, its
        :class:`~frugalrl.config.ClusterConfig` workers, backend, sync rule, codec and uplink)."""
        return cls(cfg.env, num_workers=cfg.workers, envs_per_worker=cfg.envs_per_worker, backend=cfg.backend,
                   inline_workers=cfg.inline_workers,
                   sync=cfg.sync_rule(), seed=cfg.seed, env_kwargs=cfg.env_kwargs, env_wrappers=cfg.env_wrappers,
                   weights_codec=cfg.weights_codec, weights_delta=cfg.weights_delta, uplink=cfg.uplink_options(),
                   ray_address=cfg.ray_address, replayable=replayable, worker_memory_mb=cfg.worker_memory_mb,
                   crash_loop_tries=cfg.crash_loop_tries, on_env_error=cfg.on_env_error)

    # ------------------------------------------------------------------ the sync state, read-only
    @property
    def sync_rule(self) -> SyncRule:
        """The weight-sync rule."""
        return self.policies.rule

    @property
    def learner_version(self) -> int:
        """Version of the learner's weights (bumped whenever the agent changed since the last sync)."""
        return self.policies.learner_version

    @property
    def worker_versions(self) -> list[int | None]:
        """Version each worker holds (None: no weights yet)."""
        return self.policies.worker_versions

    @property
    def sync_counts(self) -> np.ndarray:
        """Weight syncs sent to each worker."""
        return self.policies.sync_counts

    @property
    def last_kl(self) -> list[float | None]:
        """The last AAPS KL estimate of each worker (None: never estimated)."""
        return self.policies.last_kl

    # ------------------------------------------------------------------ Gymnasium API
    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Reset every env (env ``j`` with ``seed + j`` if a seed is given, or ``seed[j]`` for a list), or those
        ``options["reset_mask"]`` picks."""
        self._idle("reset")
        return self._reset_prepare(seed, options)()

    def _reset_prepare(self, seed: Any, options: dict[str, Any] | None) -> Callable[[], tuple[Any, dict]]:
        """Check reset's arguments; returns what sends the requests and reads the replies."""
        requests = reset_requests(self.num_envs, self.envs_per_worker, seed, options)
        if self._obs is None:  # a first reset with a mask still hears from every worker
            requests = {w: requests.get(w, Message("reset", {"seed": None, "mask": [False] * self.envs_per_worker}))
                        for w in range(self.num_workers)}

        def recover(w: int, reason: str) -> Message:
            self._restart(w, reason)
            return requests[w]

        def run() -> tuple[Any, dict]:
            replies = self._request(requests, on_failure=recover)
            self._obs = self._obs_batches.update(self._obs, replies)
            return self._obs_batches.copy(self._obs), merge_infos(replies, self.num_envs, self.envs_per_worker,
                                                                  widen=self.info_dtypes == "widest")

        return run

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every env with ``actions`` (head-side inference), or with an agent's own actions.

        ``step(agent)`` (an ``nn.Module`` with ``dist_params``) runs inference on the workers with their
        cached copy of the agent (DETACH); ``infos`` then holds ``actions``, ``dist_params`` and
        ``policy_version`` for the step.
        """
        self._idle("step")
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        if isinstance(actions, torch.nn.Module):
            return self._step_agent(as_agent(actions))
        return self._step_prepare(actions)()

    def _step_prepare(self, actions: Any) -> Callable[[], tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]]:
        """Check step's actions; returns what sends them and reads the replies."""
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        if not self._act_batches.simple:  # leaf by leaf (frugalrl.envs.spaces)
            requests = self._act_batches.split(actions, "actions", "actions")
        else:
            # Discrete actions in the smallest integer type that holds them (uint8 for most spaces)
            actions = check_actions(self.single_action_space, self.num_envs, actions, self._action_wire_dtype)
            k = self.envs_per_worker
            requests = {w: Message("step", {}, {"actions": actions[w * k : (w + 1) * k]}) for w in range(self.num_workers)}
        cut = self._recycle_large_workers()  # mostly [] at once: checked every memory_check_s
        if cut:
            cut = self._cut_before_step(cut)
            requests = {w: msg for w, msg in requests.items() if w not in cut}
        return lambda: self._finish_step(self._request_step(requests, cut, None, ()))

    def rollout(self, agent: torch.nn.Module, num_steps: int) -> Rollout:
        """Every worker runs ``num_steps`` steps of its envs with its cached policy; returns one batch.

        Weights are first sent to the workers the sync rule picks. Steps use same-step autoreset.
        """
        self._check_open()
        self._check_inference()
        num_steps = _positive_int("num_steps", num_steps)
        agent = as_agent(agent)
        first_event = len(self.restart_events)
        if self._obs is None:
            self.reset(seed=self.seed)
        for w in self._recycle_large_workers():
            self._reset_worker(w, seed=None)
        chosen = self._sync_choice(agent)
        self.backend.reserve(
            rollout_bound(self.single_observation_space, self.single_action_space, self.envs_per_worker, num_steps), 0
        )
        msg = Message("rollout", {"num_steps": num_steps})
        recompute = Message("rollout", {"num_steps": num_steps, "behaviour": "none"})  # the head has the words

        def recover(w: int, reason: str) -> Message:
            self._restart(w, reason)
            self._reset_worker(w, seed=None)
            self._send_weights(agent, [w])
            return msg

        # A worker that syncs gets the weights in its rollout request (one round trip, not two); the head then
        # holds the words it acts with, so its behaviour can be recomputed.
        recomputable = self.uplink.behaviour == "recompute"
        syncing = set(chosen)
        requests = {w: recompute if recomputable and (w in syncing or self.policies.can_recompute(w, agent)) else msg
                    for w in range(self.num_workers)}
        replies = self._request_with_weights(agent, requests, chosen, recover)
        # Every worker replaced during this call (in its sync too: its envs were reset) is reported.
        restarted = [e["worker"] for e in self.restart_events[first_event:]]
        # The recomputed behaviour's matmuls, off the workers' cores (the limit costs tens of µs: only when used).
        with one_blas_thread() if recomputable else contextlib.nullcontext():
            for w in range(self.num_workers):
                self._take_behaviour(w, replies[w], agent)
                self._note_codecs(replies[w])
        batch = assemble_rollout([replies[w] for w in range(self.num_workers)], self._action_dtype(), agent.dist_kind,
                                 restarted, self.learner_version)
        self._obs = batch.next_obs.copy()
        return batch

    def close_extras(self, **kwargs: Any) -> None:
        """Stop every worker (no orphan processes), after a pending asynchronous call."""
        self._settle()
        self.backend.close()

    def render(self) -> tuple[Any, ...]:
        """Every env's ``render()`` (frames travel back as arrays), as AsyncVectorEnv's."""
        return self.call("render")

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, Any]:
        """Bytes by kind, weight syncs (total and per worker), restarts, versions, the uplink options and the
        codecs each experience stream arrived with (messages per codec)."""
        return {
            "bytes": self.meter.summary(),
            "uplink": {**self.uplink.to_json(), "codecs": self._codecs_seen},
            **self.policies.stats(),
            "restarts": len(self.restart_events),
            "restart_events": list(self.restart_events),
            "recycle_events": list(self.recycle_events),
            "backend": self.backend_name,
        }

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        self._idle("a method")

    def _check_inference(self) -> None:
        check_inference(self.single_observation_space, self.single_action_space)

    def _request(
        self, requests: dict[int, Message], on_failure: Callable[[int, str], Message | None]
    ) -> dict[int, Message]:
        """Send requests; a failed worker is handed to ``on_failure``, which may return a request to retry."""
        self._check_idle(requests)
        replies: dict[int, Message] = {}
        while requests:
            results = self.backend.request(requests)
            retry: dict[int, Message] = {}
            for w, result in results.items():
                reason = self._failure(result)
                if reason is not None:
                    again = on_failure(w, reason)
                    if again is not None:
                        retry[w] = again
                else:
                    replies[w] = self._accept(w, result)  # type: ignore[arg-type]  # a failure has a reason
            requests = retry
        return replies

    def _accept(self, w: int, reply: Message) -> Message:
        """Worker ``w``'s reply; an ``error`` reply raises, experience counts as useful work (not a crash loop)."""
        if reply.op == "error":
            hint = "; on_env_error='restart' (--on-env-error restart) replaces its worker instead" if reply.meta.get(
                "env") else ""
            raise WorkerError(f"worker {w}: {reply.meta.get('error')}{hint}")
        if reply.op in _EXPERIENCE_REPLIES:
            if w in self._deferred:  # its first step after a deferred reset only reset its envs
                self._deferred.discard(w)
            else:
                self.restart_rule.succeeded(w)
        return reply

    def _reset_worker(self, w: int, seed: int | None, defer: bool = False) -> Message:
        if defer:
            self._deferred.add(w)
        def fail(w_: int, reason: str) -> Message:
            self._restart(w_, reason)
            return msg

        msg = Message("reset", {"seed": seed, "defer": defer})
        return self._request({w: msg}, on_failure=fail)[w]

    def _cut_before_step(self, replaced: Collection[int]) -> list[int]:
        """Workers ``replaced`` before this step (while syncing, or recycled over ``worker_memory_mb``) lost their
        episodes and skip the step, reported like a worker that fails during it: truncated, their envs reset on
        the next step (with same-step autoreset, at once); returns them in order."""
        cut = sorted(replaced)
        if self.autoreset_mode != AutoresetMode.SAME_STEP:
            for w in cut:
                self._reset_worker(w, seed=None, defer=True)
        return cut

    def _request_step(self, requests: dict[int, Message], cut: Collection[int], agent: ActorCritic | None,
                      chosen: Collection[int]) -> tuple[dict[int, Message], list[int]]:
        """Send a step's requests (those of workers ``chosen`` carrying ``agent``'s weights); the replies, and the
        workers replaced during it or ``cut`` before it."""
        restarted: list[int] = list(cut)

        def recover(w: int, reason: str) -> None:
            restarted.append(w)
            self._restart(w, reason)
            # NEXT_STEP (and DISABLED): report the cut episode as truncated now; the envs reset on the next step.
            self._reset_worker(w, seed=None, defer=self.autoreset_mode != AutoresetMode.SAME_STEP)
            return None

        replies = self._request_with_weights(agent, requests, chosen, recover)
        return replies, sorted(set(restarted))

    def _finish_step(
        self, result: tuple[dict[int, Message], list[int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        replies, restarted = result
        n, k = self.num_envs, self.envs_per_worker
        assert self._obs is not None
        obs = self._obs_batches.update(self._obs, replies)
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=bool)
        truncs = np.zeros(n, dtype=bool)
        for w, reply in replies.items():
            sl = slice(w * k, (w + 1) * k)
            rewards[sl] = reply.arrays["rewards"]
            terms[sl] = reply.arrays["terminations"]
            truncs[sl] = reply.arrays["truncations"]
            self._note_codecs(reply)
        infos = merge_infos(replies, self.num_envs, self.envs_per_worker,
                            lambda m: self._obs_batches.values(m, "final_obs"),
                            same_step=self.autoreset_mode == AutoresetMode.SAME_STEP,
                            widen=self.info_dtypes == "widest")
        if not self.episode_statistics:  # SyncVectorEnv's exact layout (a RecordEpisodeStatistics may go on top)
            infos.pop("episode", None)
            infos.pop("_episode", None)
        if restarted:
            mask = np.zeros(n, dtype=bool)
            for w in restarted:
                sl = slice(w * k, (w + 1) * k)
                mask[sl] = True
                truncs[sl] = True
                if self.autoreset_mode == AutoresetMode.SAME_STEP:
                    fresh = self._reset_worker(w, seed=None)
                    infos.setdefault("final_obs", np.full(n, None, dtype=object))
                    infos.setdefault("_final_obs", np.zeros(n, dtype=bool))
                    for i in range(k):
                        infos["final_obs"][w * k + i] = self._obs_batches.item(self._obs, w * k + i)
                        infos["_final_obs"][w * k + i] = True
                    obs = self._obs_batches.update(obs, {w: fresh})
            infos["worker_restarted"] = mask
            infos["_worker_restarted"] = mask.copy()
        self._obs = obs
        return self._obs_batches.copy(obs), rewards, terms, truncs, infos

    def _step_agent(self, agent: ActorCritic) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        self._check_inference()
        first_event = len(self.restart_events)
        recycled = self._recycle_large_workers()
        chosen = self._sync_choice(agent)  # their weights ride in their act_step requests
        cut = self._cut_before_step({e["worker"] for e in self.restart_events[first_event:]} | set(recycled))
        msg = Message("act_step")
        states = self._obs
        assert states is not None, "step() checked that reset() was called"
        replies, restarted = self._request_step({w: msg for w in range(self.num_workers) if w not in cut}, cut,
                                                agent, chosen)
        # A replaced worker needs weights again before its next act_step.
        for w in restarted:
            if self.worker_versions[w] != self.learner_version:
                self._send_weights(agent, [w])
        n, k = self.num_envs, self.envs_per_worker
        params_shape = next(iter(replies.values())).arrays["dist_params"].shape[1:] if replies else (0,)
        actions = np.zeros((n, *space_shape(self.single_action_space)), dtype=self._action_dtype())
        params = np.zeros((n, *params_shape), dtype=np.float32)
        versions = np.full(n, -1, dtype=np.int64)
        for w, reply in replies.items():
            sl = slice(w * k, (w + 1) * k)
            actions[sl] = reply.arrays["actions"].reshape(actions[sl].shape)  # a Box's flat samples in its shape
            params[sl] = reply.arrays["dist_params"]
            versions[sl] = reply.meta["version"]
            self._remember(w, states[sl], reply.arrays["dist_params"], append=True)
        out = self._finish_step((replies, restarted))
        infos = out[4]
        infos["actions"], infos["dist_params"], infos["policy_version"] = actions, params, versions
        return out

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return (
            f"ClusterEnv({self.env_spec.describe()}, num_workers={self.num_workers}, "
            f"envs_per_worker={self.envs_per_worker}, backend={self.backend_name!r}, sync={self.sync_rule.describe()})"
        )


_open_envs: weakref.WeakSet[ClusterEnv] = weakref.WeakSet()


def _register_close(env: ClusterEnv) -> None:
    _open_envs.add(env)


@atexit.register
def _close_all() -> None:
    for env in list(_open_envs):
        try:
            env.close()
        except Exception:  # noqa: BLE001
            pass
