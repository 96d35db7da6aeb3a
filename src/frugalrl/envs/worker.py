"""EnvWorker: the worker side of ClusterEnv (DETACH), independent of any transport.

A worker owns ``k`` environments and, once it has received weights, a cached copy of the policy. It answers:

========== ============================================== ===========================================
op         request                                        reply
========== ============================================== ===========================================
reset      meta ``seed``, ``options``, ``defer``          ``obs`` (+ infos)
step       ``actions`` (k, ...)                            ``obs``, ``rewards``, ``terminations``,
                                                          ``truncations`` (+ ``info/*``, ``ep_*``)
act_step   —  (worker-side inference, one step)            the step reply + ``actions``, ``dist_params``
rollout    meta ``num_steps``                              a fragment of T steps (see :meth:`rollout`)
weights    ``w/*`` arrays, meta ``version``, ``spec``      ``ok``
snapshot   —                                               what :meth:`EnvWorker.restore` needs
restore    a ``snapshot`` reply + ``obs`` expected         ``restored``: meta ``exact`` per env
ping       —                                               ``ok``
========== ============================================== ===========================================

Snapshots (checkpoints, ``--resume``): with ``replayable`` a worker records how each env's episode began and the
actions since, and a fresh worker rebuilds the env by replaying them; an env whose replay does not reproduce the
observation the head holds starts a new episode instead (docs/clusterenv.md#checkpoints-and-resume). ``reset``,
``step`` and ``rollout`` replies carry their experience streams with the codecs of the worker's uplink options
(:class:`frugalrl.wire.uplink.UplinkCodecs`). Errors (a NaN observation, an env that raises) come back as an
``error`` message that the head turns into an exception naming the worker and environment.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from frugalrl import dists
from frugalrl.envs.spec import EnvSpec
from frugalrl.nets import ActorCritic, PolicySpec, build_policy
from frugalrl.runs import jsonable
from frugalrl.wire.message import Message, decode_state_dict
from frugalrl.wire.uplink import UplinkCodecs, UplinkOptions

NEXT_STEP = "NextStep"
SAME_STEP = "SameStep"
#: Replies that carry experience: their streams travel with the worker's uplink codecs.
_EXPERIENCE_OPS = ("reset", "step", "rollout")


class WorkerError(RuntimeError):
    """An error raised inside a worker, reported back to the head."""


def _seed_for(seed: int, index: int) -> int:
    return (int(seed) * 1_000_003 + int(index) * 7919 + 12345) % (2**63 - 1)


class EnvWorker:
    """Steps ``num_envs`` environments and runs the cached policy on them."""

    def __init__(
        self,
        index: int,
        env_spec: EnvSpec,
        num_envs: int,
        first_env: int = 0,
        autoreset_mode: str = NEXT_STEP,
        check_finite: bool = True,
        seed: int = 0,
        replayable: bool = False,
        uplink: str | dict[str, Any] | UplinkOptions = "none",
    ) -> None:
        self.uplink = UplinkCodecs(UplinkOptions.from_json(uplink))
        self.index = index
        self.first_env = first_env
        self.autoreset_mode = autoreset_mode
        self.check_finite = check_finite
        self.envs = [env_spec.make() for _ in range(num_envs)]
        self.env_name = env_spec.describe()
        first = self.envs[0]
        self.obs_space = first.observation_space
        self.act_space = first.action_space
        self.obs = np.zeros((num_envs, *space_shape(self.obs_space)), dtype=self.obs_space.dtype)
        self.needs_reset = np.ones(num_envs, dtype=bool)
        self.ep_return = np.zeros(num_envs, dtype=np.float64)
        self.ep_length = np.zeros(num_envs, dtype=np.int64)
        self.ep_start = np.full(num_envs, time.perf_counter())
        self.policy: ActorCritic | None = None
        self.policy_spec: dict[str, Any] | None = None
        self.version = -1
        self.generator = torch.Generator().manual_seed(_seed_for(seed, index))
        self._box = isinstance(self.act_space, gym.spaces.Box)
        # Discrete actions travel in the smallest integer type that holds them (uint8 for most envs).
        self._action_wire_dtype = None if self._box else compact_int_dtype(self.act_space)
        # Observations of a float dtype can be checked for NaN/inf once per step, as one block.
        self._float_obs = self.obs.dtype.kind == "f"
        # Replay records (see the module docstring): how each env's episode began, its actions since.
        self.replayable = replayable
        self._began: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        self._actions: list[list[Any]] | None = [[] for _ in range(num_envs)] if replayable else None

    # ------------------------------------------------------------------ dispatch
    def handle(self, msg: Message) -> Message:
        """Answer one request; every exception becomes an ``error`` reply."""
        try:
            handler = getattr(self, f"_op_{msg.op}", None)
            if handler is None:
                raise WorkerError(f"unknown operation {msg.op!r}")
            reply: Message = handler(msg)
            if reply.op in _EXPERIENCE_OPS:
                reply.codecs.update(self.uplink.codecs(reply.arrays))
            return reply
        except Exception as e:  # noqa: BLE001 - reported to the head, which raises
            return Message("error", {"error": f"{type(e).__name__}: {e}", "worker": self.index})

    def close(self) -> None:
        """Close every environment."""
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------------ helpers
    def _where(self, i: int) -> str:
        return f"worker {self.index}, env {self.first_env + i} ({self.env_name})"

    def _check(self, i: int, obs: Any, reward: float | None = None) -> None:
        if not self.check_finite:
            return
        if reward is not None and not np.isfinite(reward):
            raise WorkerError(f"non-finite reward {reward} from {self._where(i)}")
        arr = np.asarray(obs)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise WorkerError(f"non-finite observation (NaN or inf) from {self._where(i)}")

    def _check_all(self, stepped: list[tuple[int, Any, Any]]) -> None:
        """The exact per-env checks, in env order: raises for the first env :meth:`_check` rejects."""
        for i, obs, reward in stepped:
            self._check(i, obs, reward)

    def _suspect(self, rewards: np.ndarray | None, extra_obs: list[Any] | None = None) -> bool:
        """A cheap test over the whole step: False when every reward and observation is surely finite.

        ``self.obs`` holds every env's latest observation (cast to the space's dtype); a True answer
        only means "run the exact checks", which are the ones that decide (a cast can overflow to inf).
        """
        if rewards is None or not self._float_obs or not np.isfinite(self.obs).all():
            return True
        if not extra_obs:
            return False
        return not all(np.isfinite(np.asarray(o)).all() for o in extra_obs)

    def _reset_env(self, i: int, seed: int | None = None, options: dict | None = None) -> dict[str, Any]:
        if self._actions is not None:
            self._began[i] = {"seed": seed, "options": options, "rng": None if seed is not None else _rng_state(self.envs[i])}
            self._actions[i] = []
        obs, info = self.envs[i].reset(seed=seed, options=options)
        self._check(i, obs)
        self.obs[i] = obs
        self.needs_reset[i] = False
        self.ep_return[i] = 0.0
        self.ep_length[i] = 0
        self.ep_start[i] = time.perf_counter()
        return info

    def _apply_pending_resets(self) -> None:
        for i in np.flatnonzero(self.needs_reset):
            self._reset_env(int(i))

    def _env_action(self, action: np.ndarray) -> np.ndarray:
        if isinstance(self.act_space, gym.spaces.Box):
            return np.clip(action, self.act_space.low, self.act_space.high)
        return action

    def _infer(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.policy is None:
            raise WorkerError(f"worker {self.index} has no policy yet: weights must be sent before acting")
        # inference_mode skips autograd's bookkeeping (version counters, views): same numbers, less time.
        with torch.inference_mode():
            params = self.policy.dist_params(torch.from_numpy(obs))
            sampled = dists.sample(self.policy.dist_kind, params, self.generator)
        action = sampled.numpy()
        if not self._box:
            action = action.astype(np.int64, copy=False)  # a categorical sample already is int64
        return action, params.float().numpy()

    def _wire_actions(self, actions: np.ndarray) -> np.ndarray:
        return actions if self._action_wire_dtype is None else actions.astype(self._action_wire_dtype)

    def _step_envs(self, actions: np.ndarray, clip: bool) -> Message:
        """One step of every env with NEXT_STEP / SAME_STEP autoreset, as a Gymnasium vector env.

        The hot loop only steps and records; NaN/inf checks run once for the whole step (see
        :meth:`_suspect`) and, when they fire or anything raises, the exact per-env checks run in env
        order first, so the error names the same env as checking each env right after its step would.
        ``clip`` clips Box actions to the bounds (sampled actions); actions the head chose reach the
        env unchanged, as in Gymnasium.
        """
        envs = self.envs
        k = len(envs)
        same_step = self.autoreset_mode != NEXT_STEP
        needs = self.needs_reset.tolist()
        env_actions = self._env_action(actions) if clip else actions
        logs = self._actions
        obs_block = self.obs
        ep_return, ep_length = self.ep_return, self.ep_length
        r_list: list[Any] = [0.0] * k
        te_list: list[Any] = [False] * k
        tr_list: list[Any] = [False] * k
        stepped: list[tuple[int, Any, Any]] = []
        ended: dict[int, tuple[float, float, int]] = {}  # env -> (seconds, return, length)
        infos: dict[str, np.ndarray] = {}
        final_obs: dict[int, np.ndarray] = {}
        final_infos: dict[str, np.ndarray] = {}
        try:
            for i in range(k):
                if needs[i]:
                    info = self._reset_env(i)
                else:
                    obs, r, te, tr, info = envs[i].step(env_actions[i])
                    if logs is not None:
                        logs[i].append(env_actions[i])
                    stepped.append((i, obs, r))
                    r_list[i], te_list[i], tr_list[i] = r, te, tr
                    ep_return[i] += r
                    ep_length[i] += 1
                    if te or tr:
                        seconds = round(time.perf_counter() - self.ep_start[i], 6)
                        ended[i] = (seconds, ep_return[i], ep_length[i])
                        if same_step:
                            final_obs[i] = np.asarray(obs)
                            if info:
                                _add_info(final_infos, info, i, k)
                            info = self._reset_env(i)
                        else:
                            self.needs_reset[i] = True
                            obs_block[i] = obs
                    else:
                        obs_block[i] = obs
                if info:
                    _add_info(infos, info, i, k)
            rewards = _float_row(r_list)
            if self.check_finite and self._suspect(rewards, list(final_obs.values())):
                self._check_all(stepped)
                rewards = None
        except BaseException:
            if self.check_finite:
                self._check_all(stepped)
            raise
        if rewards is None:  # not plain finite numbers: assign one by one, exactly as numpy does
            rewards = np.zeros(k, dtype=np.float64)
            for i, _, r in stepped:
                rewards[i] = r
        arrays: dict[str, np.ndarray] = {
            "obs": obs_block.copy(),
            "rewards": rewards,
            "terminations": np.array(te_list, dtype=bool),
            "truncations": np.array(tr_list, dtype=bool),
        }
        if ended:
            ep_mask = np.zeros(k, dtype=bool)
            ep_r = np.zeros(k, dtype=np.float64)
            ep_l = np.zeros(k, dtype=np.int64)
            ep_t = np.zeros(k, dtype=np.float64)
            for i, (seconds, ret, length) in ended.items():
                ep_mask[i], ep_t[i], ep_r[i], ep_l[i] = True, seconds, ret, length
            arrays.update(ep_mask=ep_mask, ep_r=ep_r, ep_l=ep_l, ep_t=ep_t)
        if final_obs:
            idx = np.array(sorted(final_obs), dtype=np.int32)
            arrays["final_idx"] = idx
            arrays["final_obs"] = np.stack([final_obs[int(i)] for i in idx])
            arrays.update({f"finfo/{key}": v for key, v in final_infos.items()})
        arrays.update({f"info/{key}": v for key, v in infos.items()})
        return Message("step", {"version": self.version}, arrays)

    # ------------------------------------------------------------------ operations
    def _op_ping(self, msg: Message) -> Message:
        return Message("ok", {"worker": self.index})

    def _op_reset(self, msg: Message) -> Message:
        seed = msg.meta.get("seed")
        options = msg.meta.get("options")
        if seed is not None:
            self.generator.manual_seed(_seed_for(seed, self.index))
        if msg.meta.get("defer"):
            # Used after a restart: envs reset on the next step, as after a truncation.
            self.needs_reset[:] = True
            return Message("ok", {"worker": self.index})
        infos: dict[str, np.ndarray] = {}
        for i in range(len(self.envs)):
            env_seed = None if seed is None else int(seed) + self.first_env + i
            info = self._reset_env(i, seed=env_seed, options=options)
            _add_info(infos, info, i, len(self.envs))
        arrays = {"obs": self.obs.copy(), **{f"info/{key}": v for key, v in infos.items()}}
        return Message("reset", {"worker": self.index}, arrays)

    def _op_step(self, msg: Message) -> Message:
        actions = msg.arrays["actions"]
        if not self._box:
            actions = actions.astype(np.int64)  # compact on the wire; envs get plain integers
        return self._step_envs(actions, clip=False)

    def _op_act_step(self, msg: Message) -> Message:
        actions, params = self._infer(self.obs)
        reply = self._step_envs(actions, clip=True)
        # Envs that were autoresetting (NEXT_STEP) ignored their action; it is still reported.
        reply.arrays.update(actions=self._wire_actions(actions), dist_params=params)
        return reply

    def _op_weights(self, msg: Message) -> Message:
        spec = msg.meta.get("spec")
        if self.policy is None or (spec is not None and spec != self.policy_spec):
            if spec is None:
                raise WorkerError("first weights message must carry the policy spec")
            self.policy = build_policy(PolicySpec(**spec))
            self.policy.eval()
            self.policy_spec = spec
        state = decode_state_dict(msg)
        self.policy.load_state_dict(state)
        self.version = int(msg.meta["version"])
        return Message("ok", {"worker": self.index, "version": self.version})

    def _op_snapshot(self, msg: Message) -> Message:
        """Everything a fresh worker needs to continue exactly where this one is (see :meth:`_op_restore`)."""
        if self._actions is None:
            raise WorkerError(f"worker {self.index} was not started replayable: its envs cannot be snapshot")
        arrays: dict[str, np.ndarray] = {
            "ep_return": self.ep_return.copy(),
            "ep_length": self.ep_length.copy(),
            "needs_reset": self.needs_reset.copy(),
            "generator": self.generator.get_state().numpy(),
        }
        act_shape = space_shape(self.act_space)
        act_dtype = self.act_space.dtype if self._box else np.int64
        for i, actions in enumerate(self._actions):
            arrays[f"actions/{i}"] = (
                np.stack([np.asarray(a, dtype=act_dtype) for a in actions]) if actions
                else np.zeros((0, *act_shape), dtype=act_dtype)
            )
        if self.policy is not None:
            arrays.update({f"w/{k}": v.detach().numpy().copy() for k, v in self.policy.state_dict().items()})
        meta = {"began": list(self._began), "version": self.version, "spec": self.policy_spec}
        return Message("snapshot", meta, arrays, kinds={name: "checkpoint" for name in arrays})

    def _op_restore(self, msg: Message) -> Message:
        """Rebuild the state of a :meth:`_op_snapshot` reply: reset each env as its episode began, replay its
        actions, and compare the observation with ``obs`` (what the head holds)."""
        if self._actions is None:
            raise WorkerError(f"worker {self.index} was not started replayable: it cannot restore a snapshot")
        a, meta = msg.arrays, msg.meta
        expected = a["obs"]
        exact: list[bool] = []
        for i, env in enumerate(self.envs):
            began = meta["began"][i]
            if not began:  # never reset: nothing to rebuild
                exact.append(True)
                continue
            if began.get("rng") is not None:
                _set_rng_state(env, began["rng"])
            self._reset_env(i, seed=began.get("seed"), options=began.get("options"))
            self._began[i] = began
            for action in a[f"actions/{i}"]:
                obs, *_ = env.step(action if self._box else int(action))
                self.obs[i] = obs
                self._actions[i].append(action if self._box else int(action))
            ok = bool(np.array_equal(self.obs[i], expected[i]))
            if not ok:  # not replayable: a new episode (its start drawn from the restored generator)
                self._reset_env(i)
            exact.append(ok)
        self.ep_return[:] = a["ep_return"]
        self.ep_length[:] = a["ep_length"]
        self.needs_reset[:] = a["needs_reset"]
        for i, ok in enumerate(exact):
            if not ok:
                self.ep_return[i], self.ep_length[i], self.needs_reset[i] = 0.0, 0, False
        self.ep_start[:] = time.perf_counter()
        self.generator.set_state(torch.from_numpy(a["generator"].copy()))
        if meta.get("spec") is not None:
            self.policy = build_policy(PolicySpec(**meta["spec"]))
            self.policy.eval()
            self.policy_spec = meta["spec"]
            self.policy.load_state_dict(decode_state_dict(msg))
        self.version = int(meta["version"])
        return Message("restored", {"worker": self.index, "exact": exact}, {"obs": self.obs.copy()})

    def _op_rollout(self, msg: Message) -> Message:
        """Run ``num_steps`` steps of every env with the cached policy (same-step autoreset).

        Reply arrays (T steps, k envs): ``obs`` (T,k,...), ``actions`` (T,k,...), ``rewards`` (T,k) f32,
        ``terminations`` / ``truncations`` (T,k) bool, the behaviour: ``behaviour_logp`` (T,k) f32, the
        log-probability of each taken action (uplink_behaviour ``logprob``), or ``dist_params`` (T,k,P) f32
        (``params``), ``next_obs`` (k,...),
        ``final_idx`` (K,2) int32 [step, env] and ``final_obs`` (K,...) for every finished episode, and the
        finished episodes' ``ep_r``, ``ep_l``, ``ep_env``.

        The loop over envs only steps and records; rewards, episode returns and lengths are written
        one row per step, NaN/inf checks run once per step (exactly per env, in env order, when they
        fire or when anything raises) and finished envs are reset after the row is complete.
        """
        T = int(msg.meta["num_steps"])
        if T <= 0:
            raise WorkerError(f"num_steps must be positive, got {T}")
        envs = self.envs
        k = len(envs)
        self._apply_pending_resets()
        version = self.version
        check = self.check_finite
        obs_now = self.obs
        obs_buf = np.empty((T, *obs_now.shape), dtype=obs_now.dtype)
        act_buf: np.ndarray | None = None
        params_buf: np.ndarray | None = None
        rewards = np.zeros((T, k), dtype=np.float32)
        terms = np.zeros((T, k), dtype=bool)
        truncs = np.zeros((T, k), dtype=bool)
        ep_return, ep_length = self.ep_return, self.ep_length
        final_idx: list[tuple[int, int]] = []
        final_obs: list[np.ndarray] = []
        ep_r: list[float] = []
        ep_l: list[int] = []
        ep_env: list[int] = []
        steps = [env.step for env in envs]
        logs = self._actions
        for t in range(T):
            obs_buf[t] = obs_now
            actions, params = self._infer(obs_now)
            if act_buf is None or params_buf is None:  # the first step (both are made together)
                act_buf = np.empty((T, *actions.shape), dtype=actions.dtype)
                params_buf = np.empty((T, *params.shape), dtype=np.float32)
            act_buf[t] = actions
            params_buf[t] = params
            env_actions = self._env_action(actions)
            stepped: list[tuple[int, Any, Any]] = []
            te_list: list[Any] = []
            tr_list: list[Any] = []
            ended: list[int] = []
            try:
                for i in range(k):
                    obs, r, te, tr, _ = steps[i](env_actions[i])
                    if logs is not None:
                        logs[i].append(env_actions[i])
                    stepped.append((i, obs, r))
                    te_list.append(te)
                    tr_list.append(tr)
                    if te or tr:
                        ended.append(i)
                    obs_now[i] = obs
                r_row = _float_row([s[2] for s in stepped])
                if check and self._suspect(r_row):
                    self._check_all(stepped)
                    r_row = None
            except BaseException:
                if check:
                    self._check_all(stepped)
                raise
            if r_row is None:  # not plain finite numbers: assign one by one, exactly as numpy does
                for i, _, r in stepped:
                    rewards[t, i] = r
                    ep_return[i] += r
            else:
                rewards[t] = r_row
                ep_return += r_row
            terms[t] = te_list
            truncs[t] = tr_list
            ep_length += 1
            for i in ended:
                final_idx.append((t, i))
                final_obs.append(np.asarray(stepped[i][1]))
                ep_r.append(float(ep_return[i]))
                ep_l.append(int(ep_length[i]))
                ep_env.append(self.first_env + i)
                self._reset_env(i)
        assert act_buf is not None and params_buf is not None and self.policy is not None
        if self.uplink.options.behaviour == "logprob":  # all the learner and AAPS need: log μ(a_t | s_t)
            with torch.inference_mode():
                logp = dists.log_prob(self.policy.dist_kind, torch.from_numpy(params_buf), torch.from_numpy(act_buf))
            behaviour = {"behaviour_logp": logp.float().numpy()}
        else:
            behaviour = {"dist_params": params_buf}
        arrays: dict[str, np.ndarray] = {
            "obs": obs_buf,
            "actions": self._wire_actions(act_buf),
            "rewards": rewards,
            "terminations": terms,
            "truncations": truncs,
            **behaviour,
            "next_obs": obs_now.copy(),
            "final_idx": np.array(final_idx, dtype=np.int32).reshape(-1, 2),
            "final_obs": (
                np.stack(final_obs) if final_obs else np.zeros((0, *obs_now.shape[1:]), obs_now.dtype)
            ),
            "ep_r": np.array(ep_r, dtype=np.float64),
            "ep_l": np.array(ep_l, dtype=np.int64),
            "ep_env": np.array(ep_env, dtype=np.int32),
        }
        return Message("rollout", {"version": version, "worker": self.index}, arrays)


def _rng_state(env: gym.Env) -> dict[str, Any]:
    """The state of ``env``'s ``np_random`` generator, as JSON (big integers stay Python ints)."""
    return jsonable(env.unwrapped.np_random.bit_generator.state)


def _set_rng_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Put ``env``'s ``np_random`` generator in ``state`` (from :func:`_rng_state`)."""
    env.unwrapped.np_random.bit_generator.state = state


def space_shape(space: gym.Space) -> tuple[int, ...]:
    """``space.shape``, which every space a worker steps (Box, Discrete) has; ``TypeError`` if it is None."""
    if space.shape is None:
        raise TypeError(f"the space {space} has no shape; ClusterEnv supports Box and Discrete spaces")
    return space.shape


def compact_int_dtype(space: gym.Space) -> np.dtype:
    """The smallest integer dtype holding every action of a Discrete space (``TypeError`` for another space)."""
    if not isinstance(space, gym.spaces.Discrete):
        raise TypeError(f"ClusterEnv supports Discrete and Box action spaces, got {space}")
    lo, hi = int(space.start), int(space.start + space.n - 1)
    for dtype in (np.uint8, np.int8, np.uint16, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def _float_row(values: list[Any]) -> np.ndarray | None:
    """``values`` as a float64 array if they are all finite numbers, else None (the caller then goes
    element by element, so that odd rewards fail or convert exactly as single assignments do)."""
    try:
        row = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return row if row.ndim == 1 and np.isfinite(row).all() else None


def _add_info(infos: dict[str, np.ndarray], info: dict[str, Any], i: int, k: int) -> None:
    """Batch one env's numeric infos into ``infos`` as Gymnasium does (value array + ``_key`` mask)."""
    for key, value in info.items():
        if isinstance(value, bool | int | float | np.number | np.ndarray) and not isinstance(value, str):
            arr = np.asarray(value)
            if arr.dtype == object:
                continue
            if key not in infos:
                infos[key] = np.zeros((k, *arr.shape), dtype=arr.dtype)
                infos[f"_{key}"] = np.zeros(k, dtype=bool)
            if infos[key].shape[1:] != arr.shape:
                continue
            infos[key][i] = arr
            infos[f"_{key}"][i] = True
