"""Experience collection: the one place where environments are stepped into fragments.

:class:`EnvGroup` steps ``k`` single Gymnasium envs as one batch: same-step or next-step autoreset, the final
observation of every finished episode (what a truncated episode is bootstrapped from), episode returns, lengths and
durations, NaN/inf checks that name the env, and, when asked, the records from which a fresh process rebuilds each env
(checkpoints). :class:`VectorGroup` shows any Gymnasium vector env through the same interface. :func:`collect_fragment`
runs a policy for ``T`` steps on either and returns a :class:`Fragment`.

ClusterEnv's workers, HSA2C's A2C problem, pipeline stage 0 and :func:`frugalrl.rollout.collect_rollout` all collect
through them, so a fix to autoreset, bootstrapping or episode statistics is made once. Evaluation plays whole greedy
episodes on one env with their own seeds and keeps its short loop (:mod:`frugalrl.evaluation`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from frugalrl.infos import add_info, flat_infos
from frugalrl.runs import jsonable

Autoreset = Literal["NextStep", "SameStep", "Disabled"]
NEXT_STEP: Autoreset = "NextStep"
SAME_STEP: Autoreset = "SameStep"
DISABLED: Autoreset = "Disabled"  # finished envs wait for the learner's reset (``reset_mask``); Gymnasium's mode


class NonFiniteExperience(ValueError):
    """An environment returned a NaN or infinite observation or reward."""


class EnvAPIError(TypeError):
    """An environment's ``reset()`` or ``step()`` returned what Gymnasium's API does not (the old Gym API's
    ``obs`` or four values, a reward that is not a number)."""


_NOTHING = object()
"""What :meth:`EnvGroup.step` holds before an env's step returned."""


def mark_env_error(e: BaseException, index: int) -> None:
    """Note on ``e`` that env ``index`` of an :class:`EnvGroup` raised it in its ``reset()`` or ``step()`` (-1: the
    error names the env, as for a NaN it returned), so that a ClusterEnv may replace the worker rather than stop
    (``on_env_error``); an :class:`EnvAPIError` or a Gymnasium wrapper's complaint about what the env returned
    (the env's API, which a new worker would break again) and interrupts are not marked."""
    if isinstance(e, Exception) and not isinstance(e, EnvAPIError) and raised_by_env(e) is None and \
            not _gymnasium_api_check(e):
        e.raised_by_env = index  # type: ignore[attr-defined]  # every exception has a __dict__


def _gymnasium_api_check(e: BaseException) -> bool:
    """Whether ``e`` is Gymnasium's own check of an env's API failing: an assertion of its env checker, or its
    wrappers unpacking what the env returned (an old Gym env's four values under TimeLimit)."""
    if not isinstance(e, AssertionError | ValueError | TypeError):
        return False
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = "" if tb is None else tb.tb_frame.f_code.co_filename.replace("\\", "/")
    return "/gymnasium/wrappers/" in where or "/gymnasium/utils/" in where or where.endswith("/gymnasium/core.py")


def _raised_in_callee(e: BaseException) -> bool:
    """Whether ``e`` reached the frame that caught it from a function outside this module (the env's code, a
    wrapper's), not from that frame's own statements or this module's helpers."""
    tb = e.__traceback__
    return tb is not None and tb.tb_next is not None and tb.tb_next.tb_frame.f_code.co_filename != __file__


def raised_by_env(e: BaseException) -> int | None:
    """The env (its index in the group; -1: the error names it) that raised ``e`` (:func:`mark_env_error`), or
    None."""
    return getattr(e, "raised_by_env", None)


def _api_error(where: str, call: str, expected: str, got: Any) -> EnvAPIError:
    shape = f"{len(got)} values" if isinstance(got, tuple | list) else f"one {type(got).__name__}"
    return EnvAPIError(f"{where}: {call} returned {shape}, Gymnasium's API returns {expected} (an env of the old Gym "
                       "API: gymnasium.wrappers / shimmy convert it; gymnasium.utils.env_checker.check_env(env) checks)")


@dataclass(slots=True)
class Stepped:
    """One step of every env of a group."""

    rewards: np.ndarray  # (k,) float64; 0 for an env that only reset
    terminations: np.ndarray  # (k,) bool
    truncations: np.ndarray  # (k,) bool
    reset_only: list[int]  # envs that only reset at this step (next-step autoreset): their action was ignored
    ended: list[int]  # envs whose episode ended at this step, ascending
    final_obs: list[np.ndarray]  # their last observations, in the same order
    episode_returns: list[float]
    episode_lengths: list[int]
    episode_seconds: list[float]
    infos: dict[str, Any] = field(default_factory=dict)  # batched as Gymnasium does (with ``infos=True``)
    final_infos: dict[str, Any] = field(default_factory=dict)  # the ended steps' infos (same-step autoreset)
    # key path -> the dtype of the first env's value, for arrays of ``infos`` / ``final_infos`` widened to hold a
    # later env's value exactly (:func:`add_info`); whoever batches all the workers' envs casts to it
    info_dtypes: dict[tuple[Any, ...], np.dtype] = field(default_factory=dict)
    final_info_dtypes: dict[tuple[Any, ...], np.dtype] = field(default_factory=dict)


class EnvGroup:
    """``k`` single envs stepped together; :attr:`obs` holds each env's current observation.

    ``where(i)`` names env ``i`` in errors. With ``replayable`` the group records how each episode began (its seed,
    options, or the env's RNG state) and the actions since, in :attr:`began` and :attr:`actions`.
    """

    def __init__(self, envs: Sequence[gym.Env], autoreset: Autoreset = SAME_STEP, check_finite: bool = True,
                 replayable: bool = False, where: Callable[[int], str] | None = None) -> None:
        if autoreset not in (NEXT_STEP, SAME_STEP, DISABLED):
            raise ValueError(f"autoreset must be {NEXT_STEP!r}, {SAME_STEP!r} or {DISABLED!r}, got {autoreset!r}")
        self.envs = list(envs)
        k = len(self.envs)
        self.autoreset = autoreset
        self.check_finite = check_finite
        self.where = where or (lambda i: f"env {i}")
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        space = self.observation_space
        # Box and Discrete observations are one block; those of other spaces (a dict, a tuple...) one object each.
        self.obs: Any = (np.zeros((k, *space_shape(space)), dtype=space.dtype) if isinstance(space, SIMPLE_SPACES)
                         else [None] * k)
        self.needs_reset = np.ones(k, dtype=bool)
        self.left_out_infos: set[str] = set()  # info keys whose values were not data (add_info)
        self.ep_return = np.zeros(k, dtype=np.float64)
        self.ep_length = np.zeros(k, dtype=np.int64)
        self.ep_start = np.full(k, time.perf_counter())
        self.began: list[dict[str, Any]] = [{} for _ in range(k)]
        self.actions: list[list[Any]] | None = [[] for _ in range(k)] if replayable else None
        self._float_obs = isinstance(self.obs, np.ndarray) and self.obs.dtype.kind == "f"  # checked as one block

    def __len__(self) -> int:
        return len(self.envs)

    def close(self) -> None:
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------------ resets
    def reset(self, i: int, seed: int | None = None, options: dict | None = None) -> dict[str, Any]:
        """Start a new episode in env ``i``; returns its info."""
        if self.actions is not None:
            self.began[i] = {"seed": seed, "options": options, **start_state(self.envs[i], seeded=seed is not None)}
            self.actions[i] = []
        try:
            result = self.envs[i].reset(seed=seed, options=options)
            if not (isinstance(result, tuple | list) and len(result) == 2):
                raise _api_error(self.where(i), "reset()", "(obs, info)", result)
            obs, info = result
            self.check(i, obs)
        except BaseException as e:
            mark_env_error(e, -1 if isinstance(e, NonFiniteExperience) else i)
            raise
        self.obs[i] = obs
        self.needs_reset[i] = False
        self.ep_return[i] = 0.0
        self.ep_length[i] = 0
        self.ep_start[i] = time.perf_counter()
        return info

    def reset_all(self, seed: int | None = None, options: dict | None = None, seeds: Sequence[int | None] | None = None,
                  mask: Sequence[bool] | None = None) -> dict[str, Any]:
        """Reset every env (env ``i`` with ``seed + i``, as Gymnasium's vector envs do, or with ``seeds[i]``), or only
        those ``mask`` picks; returns the batched infos."""
        infos: dict[str, Any] = {}
        for i in range(len(self.envs)):
            if mask is not None and not mask[i]:
                continue
            env_seed = seeds[i] if seeds is not None else None if seed is None else int(seed) + i
            self.left_out_infos.update(add_info(infos, self.reset(i, env_seed, options), i, len(self.envs)))
        return infos

    def reset_pending(self) -> None:
        """Reset the envs that wait for it (next-step autoreset, or a deferred reset after a restart)."""
        for i in np.flatnonzero(self.needs_reset):
            self.reset(int(i))

    # ------------------------------------------------------------------ checks
    def check(self, i: int, obs: Any, reward: Any = None) -> None:
        """Raise :class:`NonFiniteExperience` naming env ``i`` if ``reward`` or ``obs`` is NaN or infinite."""
        if not self.check_finite:
            return
        if reward is not None and not np.isfinite(reward):
            raise NonFiniteExperience(f"non-finite reward {reward} from {self.where(i)}")
        if _non_finite(obs):
            raise NonFiniteExperience(f"non-finite observation (NaN or inf) from {self.where(i)}")

    def _check_each(self, stepped: list[tuple[int, Any, Any]]) -> None:
        for i, obs, reward in stepped:
            self.check(i, obs, reward)

    def _suspect(self, rewards: np.ndarray | None, final_obs: list[np.ndarray]) -> bool:
        """A cheap test over the whole step: False when every reward and observation is surely finite (True only
        means "run the exact per-env checks", which decide: a cast to the space's dtype can overflow to inf)."""
        if rewards is None or not self._float_obs or not np.isfinite(self.obs).all():
            return True
        return bool(final_obs) and not all(np.isfinite(o).all() for o in final_obs)

    # ------------------------------------------------------------------ stepping
    def step(self, actions: Sequence[Any] | np.ndarray, infos: bool = False, autoreset: Autoreset | None = None
             ) -> Stepped:
        """Step every env with its action (as given: a policy's go through :func:`env_actions` first), with the
        group's autoreset mode unless ``autoreset`` says otherwise.

        The loop over envs only steps and records; the NaN/inf check runs once over the step and, when it fires or
        anything raises, the exact per-env checks run in env order, so the error names the env that checking each
        env right after its step would. Finished envs are reset after the row is complete (same-step autoreset) or
        at their next step (next-step autoreset, where :attr:`obs` keeps their final observation meanwhile).
        """
        envs, k, logs = self.envs, len(self.envs), self.actions
        needs = self.needs_reset.tolist()
        obs_block = self.obs
        r_list: list[Any] = [0.0] * k
        te_list: list[Any] = [False] * k
        tr_list: list[Any] = [False] * k
        stepped: list[tuple[int, Any, Any]] = []
        reset_only: list[int] = []
        ended: list[int] = []
        finals: list[Any] = []
        step_infos: dict[int, dict[str, Any]] = {}
        batched: dict[str, Any] = {}
        result: Any = _NOTHING
        try:
            for i in range(k):
                if needs[i]:
                    info = self.reset(i)
                    reset_only.append(i)
                    if infos and info:
                        step_infos[i] = info
                    continue
                # result first, then unpacked: an env whose step raises leaves the last env's (a valid one) there
                result = obs, r, te, tr, info = envs[i].step(actions[i])
                if logs is not None:
                    logs[i].append(actions[i])
                stepped.append((i, obs, r))
                r_list[i], te_list[i], tr_list[i] = r, te, tr
                obs_block[i] = obs
                if te or tr:
                    ended.append(i)
                    finals.append(obs)
                if infos and info:
                    step_infos[i] = info
            rewards = _float_row(r_list)
            final_obs = [np.asarray(o) if isinstance(obs_block, np.ndarray) else o for o in finals]
            if self.check_finite and self._suspect(rewards, final_obs):
                self._check_each(stepped)
                rewards = None
        except Exception as e:  # an interrupt passes as it is
            if isinstance(e, ValueError | TypeError) and result is not _NOTHING and not (
                    isinstance(result, tuple | list) and len(result) == 5):
                raise _api_error(self.where(i), "step()", "(obs, reward, terminated, truncated, info)", result) from e
            if self.check_finite:
                try:
                    self._check_each(stepped)
                except NonFiniteExperience as checked:
                    mark_env_error(checked, -1)
                    raise
            if _raised_in_callee(e):  # env i's step (a reset marked its own); not this group's own code
                mark_env_error(e, i)
            raise
        if rewards is None:  # not plain finite numbers: assign one by one, exactly as numpy does
            rewards = np.zeros(k, dtype=np.float64)
            for i, _, r in stepped:
                try:
                    if np.ndim(r):
                        raise ValueError("not a scalar")
                    rewards[i] = r
                except (TypeError, ValueError) as e:
                    raise EnvAPIError(f"{self.where(i)}: step() returned the reward {r!r}, not a number (Gymnasium's "
                                      "API returns a float)") from e
        self.ep_return += rewards
        if reset_only:
            acted = np.ones(k, dtype=bool)
            acted[reset_only] = False
            self.ep_length += acted
        else:
            self.ep_length += 1
        out = Stepped(rewards, np.array(te_list, dtype=bool), np.array(tr_list, dtype=bool), reset_only, ended,
                      final_obs, [], [], [], batched)
        if not ended and not step_infos:
            return out
        now = time.perf_counter()
        out.episode_returns = [float(self.ep_return[i]) for i in ended]
        out.episode_lengths = [int(self.ep_length[i]) for i in ended]
        out.episode_seconds = [round(now - float(self.ep_start[i]), 6) for i in ended]
        same_step = (autoreset or self.autoreset) == SAME_STEP
        finished = set(ended)
        if step_infos and not (same_step and finished):  # every info goes into the step's batch
            flat = flat_infos(step_infos, k)
            if flat is not None:
                batched.update(flat)
                step_infos = {}
        # Infos are batched in env order, as Gymnasium's _add_info: the first env with a key sets its array's dtype
        # (an int from one env's reset info truncates a later env's float, as in SyncVectorEnv).
        for i in sorted(finished.union(step_infos)) if same_step else step_infos:
            if i in step_infos:  # its step's info (its final info where it ended), or its reset info
                final = same_step and i in finished
                self.left_out_infos.update(add_info(out.final_infos if final else batched, step_infos[i], i, k,
                                                    out.final_info_dtypes if final else out.info_dtypes))
            if same_step and i in finished:
                info = self.reset(i)
                if infos and info:
                    self.left_out_infos.update(add_info(batched, info, i, k, out.info_dtypes))
        if (autoreset or self.autoreset) == NEXT_STEP:
            self.needs_reset[ended] = True
        return out


class VectorGroup:
    """A Gymnasium vector env (ClusterEnv included) seen as an :class:`EnvGroup`: the same :meth:`step` result,
    episode statistics kept here, final observations from ``info["final_obs"]`` (same-step) or the step's own
    observation (next-step autoreset, whose reset steps come back in ``reset_only``)."""

    def __init__(self, envs: gym.vector.VectorEnv, seed: int | None = None) -> None:
        mode = envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self.autoreset: Autoreset = SAME_STEP if getattr(mode, "value", mode) == SAME_STEP else NEXT_STEP
        self.vec = envs
        self.action_space = envs.single_action_space
        self.obs, _ = envs.reset(seed=seed)
        k = envs.num_envs
        self.resetting = np.zeros(k, dtype=bool)
        self.ep_return = np.zeros(k)
        self.ep_length = np.zeros(k, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.vec.num_envs)

    def step(self, actions: np.ndarray) -> Stepped:
        reset_only = np.flatnonzero(self.resetting).tolist()
        acted = ~self.resetting
        next_obs, r, te, tr, infos = self.vec.step(actions)
        done = np.logical_or(te, tr)
        ended = np.flatnonzero(done).tolist()
        finals = infos["final_obs"] if self.autoreset == SAME_STEP and ended else next_obs
        self.ep_return += np.where(acted, r, 0.0)
        self.ep_length += acted
        out = Stepped(np.asarray(r, dtype=np.float64), np.asarray(te, bool), np.asarray(tr, bool), reset_only, ended,
                      [np.asarray(finals[i]) for i in ended], [float(self.ep_return[i]) for i in ended],
                      [int(self.ep_length[i]) for i in ended], [0.0] * len(ended))
        self.ep_return[done], self.ep_length[done] = 0.0, 0
        self.resetting = done if self.autoreset == NEXT_STEP else np.zeros_like(done)
        self.obs = next_obs
        return out


@dataclass
class Fragment:
    """``T`` steps of ``k`` envs (same layout as :class:`frugalrl.rollout.Rollout`)."""

    obs: np.ndarray  # (T, k, *obs_shape) the observation each action was chosen on
    actions: np.ndarray  # (T, k, *act_shape) as chosen (before clipping)
    params: np.ndarray | None  # (T, k, P) float32 the behaviour distribution's parameters (None: not given)
    rewards: np.ndarray  # (T, k) float32
    terminations: np.ndarray  # (T, k) bool
    truncations: np.ndarray  # (T, k) bool
    next_obs: np.ndarray  # (k, *obs_shape) after the last step
    final_idx: np.ndarray  # (K, 2) int32 [t, env] of every finished episode
    final_obs: np.ndarray  # (K, *obs_shape) its last observation
    valid: np.ndarray | None  # (T, k) False where an env only reset (next-step autoreset); None: all valid
    episode_returns: list[float]
    episode_lengths: list[int]

    def truncated_final_obs(self) -> np.ndarray:
        """The final observations of the episodes that were truncated, not terminated, in (t, env) order."""
        keep = ~self.terminations[self.final_idx[:, 0], self.final_idx[:, 1]]
        return self.final_obs[keep]


Policy = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]]
"""Observations (k, ...) -> actions (k, ...) and the behaviour distribution's parameters (k, P), or None."""


def collect_fragment(group: EnvGroup | VectorGroup, policy: Policy, num_steps: int,
                     on_step: Callable[[int, Stepped], None] | None = None,
                     float64_as: np.dtype | None = None) -> Fragment:
    """Run ``policy`` for ``num_steps`` steps of every env of ``group`` (clipping Box actions to the space) and
    return the fragment; ``on_step(t, stepped)`` sees each step as it happens. An :class:`EnvGroup` is stepped with
    same-step autoreset whatever its mode: a fragment has no steps that only reset. ``float64_as``: float64
    observations are cast to this dtype before the policy sees them, and kept so (the uplink's ``fp32``)."""
    if num_steps <= 0:
        raise ValueError(f"num_steps must be positive, got {num_steps}")
    if isinstance(group, EnvGroup):
        group.reset_pending()
    k = len(group)
    first = np.asarray(group.obs)
    obs_dtype = float64_as if float64_as is not None and first.dtype == np.float64 else first.dtype
    obs_buf = np.empty((num_steps, *first.shape), dtype=obs_dtype)
    act_buf: np.ndarray | None = None
    par_buf: np.ndarray | None = None
    rewards = np.zeros((num_steps, k), dtype=np.float32)
    terms = np.zeros((num_steps, k), dtype=bool)
    truncs = np.zeros((num_steps, k), dtype=bool)
    valid = np.ones((num_steps, k), dtype=bool)
    final_idx: list[tuple[int, int]] = []
    final_obs: list[np.ndarray] = []
    ep_r: list[float] = []
    ep_l: list[int] = []
    space = group.action_space
    # a Box whose shape is not flat ((2, 3), ()): its flat Gaussian's samples are kept in its shape
    box_shape = space.shape if isinstance(space, gym.spaces.Box) and len(space.shape) != 1 else None
    to_env = env_actions(space)
    step = functools.partial(group.step, autoreset=SAME_STEP) if isinstance(group, EnvGroup) else group.step
    for t in range(num_steps):
        obs_buf[t] = group.obs
        actions, params = policy(obs_buf[t])
        if box_shape is not None:
            actions = actions.reshape(len(actions), *box_shape)
        if act_buf is None:  # the first step: the buffers take the policy's shapes and dtypes
            act_buf = np.empty((num_steps, *actions.shape), dtype=actions.dtype)
            par_buf = None if params is None else np.empty((num_steps, *params.shape), dtype=np.float32)
        act_buf[t] = actions
        if par_buf is not None:
            par_buf[t] = params
        stepped = step(to_env(actions))
        rewards[t], terms[t], truncs[t] = stepped.rewards, stepped.terminations, stepped.truncations
        if stepped.reset_only:
            valid[t, stepped.reset_only] = False
        if stepped.ended:
            final_idx += [(t, i) for i in stepped.ended]
            final_obs += stepped.final_obs
            ep_r += stepped.episode_returns
            ep_l += stepped.episode_lengths
        if on_step is not None:
            on_step(t, stepped)
    assert act_buf is not None
    next_obs = np.array(group.obs, dtype=obs_dtype, copy=True)
    return Fragment(
        obs=obs_buf, actions=act_buf, params=par_buf, rewards=rewards, terminations=terms, truncations=truncs,
        next_obs=next_obs, final_idx=np.array(final_idx, dtype=np.int32).reshape(-1, 2),
        final_obs=np.stack(final_obs).astype(obs_dtype, copy=False) if final_obs else
        np.zeros((0, *next_obs.shape[1:]), obs_dtype),
        valid=None if valid.all() else valid, episode_returns=ep_r, episode_lengths=ep_l,
    )


# ---------------------------------------------------------------------------------------------- helpers
def start_state(env: gym.Env, seeded: bool) -> dict[str, Any]:
    """What the episode ``env`` begins now starts from besides its reset's arguments, JSON-able: unless ``seeded``,
    the state of its ``np_random`` (``rng``); and where the env or a wrapper of it carries state from one episode
    into the next (generators of its own, the last action, running statistics), that state, by the layer's depth in
    the wrapper chain (``env_state``, :func:`_reset_state_hooks`; JSON-able once :func:`jsonable_began` has made
    numpy arrays lists). A checkpoint replays the episode from them (:func:`restore_start_state`)."""
    out: dict[str, Any] = {} if seeded else {"rng": jsonable(env.unwrapped.np_random.bit_generator.state)}
    states = {str(depth): hooks[0]() for depth, layer in enumerate(_layers(env))  # made JSON when a snapshot is
              if (hooks := _reset_state_hooks(layer)) is not None}                # taken (:func:`jsonable_began`)
    if states:
        out["env_state"] = states
    return out


def jsonable_began(began: dict[str, Any]) -> dict[str, Any]:
    """An episode's :func:`start_state` record as it travels in a snapshot: its env states made JSON (numpy arrays
    as lists), the rest as recorded."""
    return {**began, "env_state": jsonable(began["env_state"])} if began.get("env_state") else began


def restore_start_state(env: gym.Env, began: dict[str, Any]) -> None:
    """Put ``env`` back in the state :func:`start_state` recorded in ``began``, before its reset."""
    if began.get("rng") is not None:
        env.unwrapped.np_random.bit_generator.state = began["rng"]
    layers = _layers(env)
    for depth, state in (began.get("env_state") or {}).items():
        hooks = _reset_state_hooks(layers[int(depth)]) if int(depth) < len(layers) else None
        if hooks is not None:
            hooks[1](state)


def _layers(env: gym.Env) -> list[gym.Env]:
    """``env`` and every env it wraps, outermost first."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _reset_state_hooks(layer: gym.Env) -> tuple[Callable[[], Any], Callable[[Any], None]] | None:
    """How to read and set the state one layer of an env (the env or a wrapper) carries into its next episode: its
    own ``get_reset_state()`` and ``set_reset_state(state)`` (MinAtar's games; an env or wrapper of yours can define
    them), ALE's emulator state for Atari, the running statistics of Gymnasium's ``NormalizeObservation`` and
    ``NormalizeReward``; None for a layer that carries nothing."""
    if callable(getattr(layer, "get_reset_state", None)) and callable(getattr(layer, "set_reset_state", None)):
        return layer.get_reset_state, layer.set_reset_state  # type: ignore[attr-defined]
    if type(layer).__module__.startswith("ale_py"):
        from frugalrl.envs.atari import ale_reset_state, set_ale_reset_state

        return functools.partial(ale_reset_state, layer), functools.partial(set_ale_reset_state, layer)
    if isinstance(layer, gym.wrappers.NormalizeObservation):
        return functools.partial(_moments, layer, "obs_rms"), functools.partial(_set_moments, layer, "obs_rms")
    if isinstance(layer, gym.wrappers.NormalizeReward):
        return functools.partial(_moments, layer, "return_rms"), functools.partial(_set_moments, layer, "return_rms")
    return None


def _moments(layer: gym.Env, name: str) -> dict[str, Any]:
    rms = getattr(layer, name)
    out = {"mean": np.array(rms.mean), "var": np.array(rms.var), "count": float(rms.count)}
    if hasattr(layer, "discounted_reward"):  # NormalizeReward's accumulator, kept across episodes
        out["discounted"] = np.array(layer.discounted_reward)
    return out


def _set_moments(layer: gym.Env, name: str, state: dict[str, Any]) -> None:
    rms = getattr(layer, name)
    rms.mean = np.asarray(state["mean"], dtype=np.asarray(rms.mean).dtype)
    rms.var = np.asarray(state["var"], dtype=np.asarray(rms.var).dtype)
    rms.count = state["count"]
    if "discounted" in state:
        layer.discounted_reward = np.asarray(state["discounted"], dtype=np.float64)  # type: ignore[attr-defined]


def env_actions(space: gym.Space, batched: bool = True) -> Callable[[np.ndarray], np.ndarray]:
    """What turns a policy's actions (a batch, or one: ``batched=False``) into the env's, decided once per space (it
    runs on every step). Box: reshaped to the space's shape (a policy's Gaussian is flat: ``(d,)`` for
    ``Box((1, d))``, ``(1,)`` for ``Box(())``) and clipped to its bounds; Discrete and MultiDiscrete: shifted by the
    space's ``start`` (a policy picks from 0); others unchanged."""
    if isinstance(space, gym.spaces.Box):
        low, high, shape = space.low, space.high, space.shape

        def to_box(actions: np.ndarray) -> np.ndarray:
            want = (len(actions), *shape) if batched else shape
            return np.clip(actions if actions.shape == want else actions.reshape(want), low, high)

        return to_box
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete) and np.any(space.start != 0):
        start = space.start
        return lambda actions: actions + start
    return lambda actions: actions


def env_action(space: gym.Space, action: Any) -> Any:
    """One env's action as its space takes it: a Discrete space's as an int, a Box space's as it is (a policy's goes
    through :func:`env_actions` first), others' (MultiDiscrete, MultiBinary) as an array of the space's dtype."""
    if isinstance(space, gym.spaces.Discrete):
        return int(action)
    if isinstance(space, gym.spaces.Box):
        return action
    return np.asarray(action, space.dtype)


def space_shape(space: gym.Space) -> tuple[int, ...]:
    """``space.shape``, which every space a group steps (Box, Discrete) has; ``TypeError`` if it is None."""
    if space.shape is None:
        raise TypeError(f"the space {space} has no shape; frugalrl supports Box and Discrete spaces")
    return space.shape


SIMPLE_SPACES = (gym.spaces.Box, gym.spaces.Discrete)
"""Spaces whose values a group keeps as one block (and a policy acts on): Box, Discrete."""


def _non_finite(obs: Any) -> bool:
    """Whether an observation (of any space: arrays, numbers, tuples, dicts, graphs) holds a NaN or inf."""
    if isinstance(obs, np.ndarray | np.floating | float):
        arr = np.asarray(obs)
        return arr.dtype.kind == "f" and not bool(np.isfinite(arr).all())
    if isinstance(obs, dict):
        return any(_non_finite(v) for v in obs.values())
    if isinstance(obs, tuple | list):
        return any(_non_finite(v) for v in obs)
    if isinstance(obs, gym.spaces.GraphInstance):
        return _non_finite(obs.nodes) or _non_finite(obs.edges)
    return False


def _float_row(values: list[Any]) -> np.ndarray | None:
    """``values`` as a float64 array if they are all finite numbers, else None (the caller then goes
    element by element, so that odd rewards fail or convert exactly as single assignments do)."""
    try:
        row = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return row if row.ndim == 1 and np.isfinite(row).all() else None
