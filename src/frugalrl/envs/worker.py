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
weights    ``w/*`` or a delta ``wd/*``, meta ``version``,  ``ok``; ``refused`` for a delta against
           ``codec`` (``spec``, ``base``, ``crc``)         weights it does not hold
snapshot   —                                               what :meth:`EnvWorker.restore` needs
restore    a ``snapshot`` reply + ``obs`` expected         ``restored``: meta ``exact`` per env
call       meta ``name``, ``mode``, ``envs``, arguments    ``called``: meta ``results`` (+ arrays)
ping       —                                               ``ok``
========== ============================================== ===========================================

Snapshots (checkpoints): a ``replayable`` worker records how each episode began and the actions since, so that a
fresh one rebuilds its envs by replay (docs/clusterenv.md#checkpoints-and-resume). Experience replies carry their
streams with the worker's uplink codecs (:class:`frugalrl.wire.uplink.UplinkCodecs`). Errors (a NaN observation, an
env that raises) come back as an ``error`` message that the head turns into an exception naming the worker and env.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from frugalrl.envs.calls import call_envs
from frugalrl.envs.spaces import agents_act_in, batch, from_message, is_simple, item, same_spaces, to_message
from frugalrl.envs.spec import EnvSpec
from frugalrl.experience import (
    DISABLED,
    NEXT_STEP,
    SAME_STEP,
    EnvGroup,
    collect_fragment,
    env_action,
    env_actions,
    jsonable_began,
    raised_by_env,
    restore_start_state,
    space_shape,
)
from frugalrl.infos import info_arrays, info_name, info_parent
from frugalrl.npactor import NumpyActor, runs_in_numpy
from frugalrl.onnxactor import OnnxActor, OnnxCnnActor, cnn_on_onnxruntime, runs_on_onnxruntime
from frugalrl.runs import jsonable
from frugalrl.wire.delta import DeltaError, HeldWeights, from_words
from frugalrl.wire.message import Message, state_arrays, uncarried
from frugalrl.wire.uplink import UplinkCodecs, UplinkOptions

if TYPE_CHECKING:
    import torch

    from frugalrl.nets import ActorCritic

#: Set in a worker process (not in the head, whose inline workers share its torch): its torch runs on one thread.
ONE_TORCH_THREAD = False


@functools.cache
def _torch() -> Any:
    """torch, imported when a worker first gets a policy that needs it (AcceRL's alpha mix, a user's module; its
    threads set once). A worker that only steps envs (the head chooses the actions) or acts with an MLP or CNN agent
    (:mod:`frugalrl.npactor`, :mod:`frugalrl.onnxactor`) never does: its process starts sooner and holds much less
    memory."""
    import torch

    if ONE_TORCH_THREAD:
        torch.set_num_threads(1)
    return torch

#: Replies that carry experience: their streams travel with the worker's uplink codecs.
_EXPERIENCE_OPS = ("reset", "step", "rollout")


class WorkerError(RuntimeError):
    """An error raised inside a worker, reported back to the head; the head raises it again, naming the worker (an
    env's own exception arrives as its type and message, never as a pickle)."""

    run_dir: str | None = None
    """The run directory whose checkpoint and summary were written before this reached the caller (the driver's)."""


def _seed_for(seed: int, index: int) -> int:
    return (int(seed) * 1_000_003 + int(index) * 7919 + 12345) % (2**63 - 1)


class EnvWorker:
    """Steps ``num_envs`` environments (an :class:`~frugalrl.experience.EnvGroup`) and runs the cached policy."""

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
        self.env_name = env_spec.describe()
        self.group = EnvGroup([env_spec.make(first_env + i) for i in range(num_envs)],
                              autoreset_mode if autoreset_mode in (SAME_STEP, DISABLED) else NEXT_STEP,
                              check_finite, replayable,
                              where=lambda i: f"worker {self.index}, env {self.first_env + i} ({self.env_name})")
        self.obs_space = self.group.observation_space
        self.act_space = self.group.action_space
        # The policy held: an agent that runs without torch, in numpy or on ONNX Runtime (``actor``, from the
        # weights ``acting``), any other agent as a torch module (``policy``); one of the two once weights have
        # come, the other None.
        self.actor: NumpyActor | OnnxActor | OnnxCnnActor | None = None
        self.acting: dict[str, np.ndarray] | None = None
        self.policy: ActorCritic | None = None
        self.policy_spec: dict[str, Any] | None = None
        self.held = HeldWeights()  # the code words of the weights it holds: what a delta applies to
        self._named_left_out: set[str] = set()  # info keys already named to the head as not data
        self.version = -1
        self._generator_seed = _seed_for(seed, index)
        self.rng = np.random.default_rng(self._generator_seed)  # what a torch-free actor samples with
        self._generator: torch.Generator | None = None  # a torch policy's: made on first use (:attr:`generator`)
        self._box = isinstance(self.act_space, gym.spaces.Box)
        self._to_env = env_actions(self.act_space)  # its policy's actions as its envs take them
        # Discrete and MultiDiscrete actions travel in the smallest integer type that holds them (uint8 for most envs).
        self._action_wire_dtype = (compact_int_dtype(self.act_space) if isinstance(
            self.act_space, gym.spaces.Discrete | gym.spaces.MultiDiscrete) else None)
        # Other spaces (Dict, Tuple, MultiDiscrete...) travel leaf by leaf for head-side inference; the agents act in
        # MultiDiscrete and MultiBinary ones too.
        self._tree_obs, self._tree_act = not is_simple(self.obs_space), not is_simple(self.act_space)
        self._agents_act = not self._tree_obs and agents_act_in(self.act_space)

    # ------------------------------------------------------------------ dispatch
    def handle(self, msg: Message) -> Message:
        """Answer one request; every exception becomes an ``error`` reply."""
        try:
            handler = getattr(self, f"_op_{msg.op}", None)
            if handler is None:
                raise WorkerError(f"unknown operation {msg.op!r}")
            msg, inside = uncarried(msg)
            if inside is not None:  # weights sent with the request that needs them: loaded first
                if inside.op != "weights":
                    raise WorkerError(f"a request may carry weights only, not {inside.op!r}")
                loaded = self._op_weights(inside)
                if loaded.op == "refused":
                    return loaded
            reply: Message = handler(msg)
            if reply.op in _EXPERIENCE_OPS:
                reply.codecs.update(self.uplink.codecs(reply.arrays))
            return reply
        except Exception as e:  # noqa: BLE001 - reported to the head, which raises (or replaces this worker)
            meta: dict[str, Any] = {"error": f"{type(e).__name__}: {e}", "worker": self.index}
            env = raised_by_env(e)
            if env is not None:  # the env's own failure, not the protocol's: on_env_error decides
                meta["env"] = True
                if env >= 0:  # the error does not name it
                    meta["error"] = f"env {self.first_env + env} ({self.env_name}) raised {meta['error']}"
            return Message("error", meta)

    def close(self) -> None:
        """Close every environment."""
        self.group.close()

    @property
    def generator(self) -> torch.Generator:
        """The generator a torch policy samples actions with, made on first use as the last seeded reset left it."""
        if self._generator is None:
            self._generator = _torch().Generator().manual_seed(self._generator_seed)
        return self._generator

    def held_state(self) -> dict[str, np.ndarray]:
        """The acting weights this worker holds, as arrays (:func:`frugalrl.nets.acting_state`'s keys)."""
        if self.acting is not None:
            return self.acting
        if self.policy is None:
            return {}
        from frugalrl.nets import acting_state

        return {k: v.detach().numpy() for k, v in acting_state(self.policy).items()}

    def _hold(self, spec: dict[str, Any], state: dict[str, np.ndarray] | None) -> None:
        """Hold the policy ``spec`` builds, with the acting weights ``state`` (its initial ones if None)."""
        torch_free = _torch_free_actor(spec)
        if torch_free is not None:
            if state is None:
                raise WorkerError("a policy run without torch must come with its weights")
            self.actor, self.acting, self.policy = torch_free.from_state(spec, state), state, None
        else:
            from frugalrl.nets import PolicySpec, build_policy, load_acting_state

            if self.policy is None or spec != self.policy_spec:
                self.policy = build_policy(PolicySpec(**spec))
                self.policy.eval()
            if state is not None:
                load_acting_state(self.policy, {k: _torch().from_numpy(a) for k, a in state.items()})
            self.actor = self.acting = None
        self.policy_spec = spec

    # ------------------------------------------------------------------ helpers
    def _policy(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Actions sampled from the cached policy and its distribution's parameters (float32); an MLP or CNN agent
        runs without torch (:func:`_torch_free_actor`)."""
        if self.actor is not None:  # every step of a rollout: numpy (and ONNX Runtime) only
            np_params = self.actor.params(obs)
            return self.actor.sample(np_params, self.rng), np_params
        if self.policy is None:
            raise WorkerError(f"worker {self.index} has no policy yet: weights must be sent before acting")
        torch = _torch()
        from frugalrl import dists

        # inference_mode skips autograd's bookkeeping (version counters, views): same numbers, less time.
        with torch.inference_mode():
            params = self.policy.dist_params(torch.from_numpy(obs))
            sampled = dists.sample(self.policy.dist_kind, params, self.generator)
        action = sampled.numpy()
        if not self._box:
            action = action.astype(self.act_space.dtype, copy=False)  # a categorical sample already is int64
        return action, params.float().numpy()

    def _wire_actions(self, actions: np.ndarray) -> np.ndarray:
        return actions if self._action_wire_dtype is None else actions.astype(self._action_wire_dtype)

    def _step_reply(self, actions: np.ndarray | list[Any]) -> Message:
        """One step of every env, as a Gymnasium vector env replies (infos batched; for the envs that ended, in env
        order, their episode statistics in ``ep_*`` and with same-step autoreset their final observations and
        infos)."""
        group = self.group
        s = group.step(actions, infos=True)
        arrays: dict[str, np.ndarray] = {
            **({} if self._tree_obs else {"obs": group.obs.copy()}),
            "rewards": float32_if_exact(s.rewards),  # the head reads float64, as SyncVectorEnv gives
            "terminations": s.terminations,
            "truncations": s.truncations,
        }
        if s.ended:
            # the statistics of the envs that ended only, in env order (the head finds which in the flags)
            arrays.update(**episode_stats(s.episode_returns, s.episode_lengths),
                          ep_t=np.array(s.episode_seconds, dtype=np.float64))
            if group.autoreset == SAME_STEP and not self._tree_obs:
                arrays["final_obs"] = np.stack(s.final_obs)
        reply = Message("step", {"version": self.version}, arrays)
        if s.ended and group.autoreset == SAME_STEP:
            self._put_infos(reply, "finfo", s.final_infos, s.final_info_dtypes)
        self._put_infos(reply, "info", s.infos, s.info_dtypes)
        if self._tree_obs:
            self._put_obs(reply, "obs", list(group.obs))
            if s.ended and group.autoreset == SAME_STEP:
                self._put_obs(reply, "final_obs", s.final_obs)
        return reply

    def _put_infos(self, msg: Message, prefix: str, infos: dict[str, Any],
                   first_dtypes: dict[tuple[Any, ...], np.dtype] | None = None) -> None:
        """Batched infos into ``msg`` (:func:`info_name` names each array, nested ones by their path): numbers as
        ``prefix/name`` arrays, data (strings, lists...) in the header as ``meta[prefix]`` (name -> env index ->
        value), the first env's dtype of an array widened for a later env's value as ``meta[prefix + "_dtype"]``;
        keys left out as not data are named once, in ``meta["infos_left_out"]``, for the head to say so."""
        data: dict[str, dict[str, Any]] = {}
        for path, arr in info_arrays(infos) if infos else ():
            name = info_name(path)
            if arr.dtype == object:
                mask = info_parent(infos, path)[f"_{path[-1]}"]
                data[name] = {str(i): arr[i] for i in np.flatnonzero(mask)}
            else:
                msg.arrays[f"{prefix}/{name}"] = arr
        if data:
            msg.meta[prefix] = data
        if first_dtypes:
            msg.meta[f"{prefix}_dtype"] = {info_name(path): dtype.str for path, dtype in first_dtypes.items()}
        if len(self.group.left_out_infos) > len(self._named_left_out):  # the named ones are some of them
            new = self.group.left_out_infos - self._named_left_out
            msg.meta["infos_left_out"] = sorted(new)
            self._named_left_out |= new

    def _put_obs(self, msg: Message, prefix: str, values: list[Any]) -> None:
        """Observations of a space other than Box and Discrete, leaf by leaf (:mod:`frugalrl.envs.spaces`)."""
        to_message(msg, self.obs_space, batch(self.obs_space, values), prefix, "observations")

    def _check_inference(self) -> None:
        if not self._agents_act:
            raise WorkerError(f"worker-side inference needs Box observations and an action space the agents act in, "
                              f"not {self.obs_space} and {self.act_space}: choose the actions on the head, "
                              "step(actions)")

    # ------------------------------------------------------------------ operations
    def _op_ping(self, msg: Message) -> Message:
        return Message("ok", {"worker": self.index})

    def _op_reset(self, msg: Message) -> Message:
        seed = msg.meta.get("seed")
        if seed is not None:
            self._generator_seed = _seed_for(seed, self.index)
            self.rng = np.random.default_rng(self._generator_seed)
            if self._generator is not None:
                self._generator.manual_seed(self._generator_seed)
        if msg.meta.get("defer"):
            # Used after a restart: envs reset on the next step, as after a truncation.
            self.group.needs_reset[:] = True
            return Message("ok", {"worker": self.index})
        infos = self.group.reset_all(None if seed is None else int(seed) + self.first_env, msg.meta.get("options"),
                                     msg.meta.get("seeds"), msg.meta.get("mask"))
        reply = Message("reset", {"worker": self.index})
        self._put_infos(reply, "info", infos)
        if self._tree_obs:
            self._put_obs(reply, "obs", list(self.group.obs))
        else:
            reply.arrays["obs"] = self.group.obs.copy()
        return reply

    def _op_step(self, msg: Message) -> Message:
        if self._tree_act:
            tree = from_message(msg, self.act_space, "actions")
            return self._step_reply([item(self.act_space, tree, i) for i in range(len(self.group))])
        actions = msg.arrays["actions"]
        if not self._box:
            actions = actions.astype(self.act_space.dtype)  # compact on the wire; envs get the space's integers
        return self._step_reply(actions)  # actions the head chose reach the envs unclipped, as in Gymnasium

    def _op_act_step(self, msg: Message) -> Message:
        self._check_inference()
        actions, params = self._policy(self.group.obs)
        reply = self._step_reply(self._to_env(actions))
        # Envs that were autoresetting (NEXT_STEP) ignored their action; it is still reported.
        reply.arrays.update(actions=self._wire_actions(actions), dist_params=params)
        return reply

    def _op_call(self, msg: Message) -> Message:
        """Gymnasium's ``call`` / ``get_attr`` / ``set_attr`` on some of the envs (:mod:`frugalrl.envs.calls`)."""
        entries, arrays = call_envs(self.group.envs, msg.meta)
        return Message("called", {"worker": self.index, "results": entries}, arrays,
                       kinds={name: "control" for name in arrays})

    def _op_spaces(self, msg: Message) -> Message:
        """Whether every env has the head's spaces (:func:`frugalrl.envs.spaces.check_worker_spaces`)."""
        return Message("ok", {"worker": self.index, **same_spaces(self.group.envs, msg.meta)})

    def _op_weights(self, msg: Message) -> Message:
        """Load a full copy or a delta (:mod:`frugalrl.wire.delta`); a delta against another copy than the one
        held is refused, never applied, and the head sends a full copy."""
        spec = msg.meta.get("spec")
        if self.policy_spec is None or (spec is not None and spec != self.policy_spec):
            if spec is None:
                raise WorkerError("first weights message must carry the policy spec")
            if _torch_free_actor(spec) is None:
                self._hold(spec, None)  # the module, to decode its weights against
            self.policy_spec = spec
            self.held.clear()
        try:
            words = self.held.resolve(msg)
        except DeltaError as e:
            return Message("refused", {"worker": self.index, "error": str(e)})
        torch_free = _torch_free_actor(self.policy_spec)
        if torch_free is not None:
            like = torch_free.acting_like(self.policy_spec)
        else:
            from frugalrl.nets import acting_state

            assert self.policy is not None
            like = {k: (tuple(t.shape), t.numpy().dtype) for k, t in acting_state(self.policy).items()}
        self._hold(self.policy_spec, from_words(words, like, msg.meta["codec"]))
        self.version = int(msg.meta["version"])
        self.held.keep(self.version, words)
        return Message("ok", {"worker": self.index, "version": self.version})

    def _op_snapshot(self, msg: Message) -> Message:
        """Everything a fresh worker needs to continue exactly where this one is (see :meth:`_op_restore`)."""
        group = self.group
        if group.actions is None:
            raise WorkerError(f"worker {self.index} was not started replayable: its envs cannot be snapshot")
        arrays: dict[str, np.ndarray] = {
            "ep_return": group.ep_return.copy(),
            "ep_length": group.ep_length.copy(),
            "needs_reset": group.needs_reset.copy(),
        }
        if self._generator is not None:  # a torch policy's
            arrays["generator"] = self._generator.get_state().numpy()
        act_shape = space_shape(self.act_space)
        act_dtype = self.act_space.dtype if self._box else np.int64
        for i, actions in enumerate(group.actions):
            arrays[f"actions/{i}"] = (
                np.stack([np.asarray(a, dtype=act_dtype) for a in actions]) if actions
                else np.zeros((0, *act_shape), dtype=act_dtype)
            )
        arrays.update({f"w/{k}": v.copy() for k, v in self.held_state().items()})
        meta = {"began": [jsonable_began(b) for b in group.began], "version": self.version, "spec": self.policy_spec,
                "rng": jsonable(self.rng.bit_generator.state)}  # as the envs' generators in ``began``
        return Message("snapshot", meta, arrays, kinds={name: "checkpoint" for name in arrays})

    def _op_restore(self, msg: Message) -> Message:
        """Rebuild the state of a :meth:`_op_snapshot` reply: reset each env as its episode began, replay its
        actions, and compare the observation with ``obs`` (what the head holds)."""
        group = self.group
        if group.actions is None:
            raise WorkerError(f"worker {self.index} was not started replayable: it cannot restore a snapshot")
        a, meta = msg.arrays, msg.meta
        expected = a["obs"]
        exact: list[bool] = []
        for i, env in enumerate(group.envs):
            began = meta["began"][i]
            if not began:  # never reset: nothing to rebuild
                exact.append(True)
                continue
            restore_start_state(env, began)
            group.reset(i, seed=began.get("seed"), options=began.get("options"))
            group.began[i] = began
            for recorded in a[f"actions/{i}"]:
                action = env_action(self.act_space, recorded)
                obs, *_ = env.step(action)
                group.obs[i] = obs
                group.actions[i].append(action)
            ok = bool(np.array_equal(group.obs[i], expected[i]))
            if not ok:  # not replayable: a new episode (its start drawn from the restored generator)
                group.reset(i)
            exact.append(ok)
        group.ep_return[:] = a["ep_return"]
        group.ep_length[:] = a["ep_length"]
        group.needs_reset[:] = a["needs_reset"]
        for i, ok in enumerate(exact):
            if not ok:
                group.ep_return[i], group.ep_length[i], group.needs_reset[i] = 0.0, 0, False
        group.ep_start[:] = time.perf_counter()
        if meta.get("rng") is not None:
            self.rng.bit_generator.state = meta["rng"]
        if "generator" in a:  # a torch policy's (or a snapshot from before numpy actors, whose stream it was)
            self.generator.set_state(_torch().from_numpy(a["generator"].copy()))
        self.held.clear()  # the head assumes a restored worker holds no words: its next weights are a full copy
        if meta.get("spec") is not None:
            self._hold(meta["spec"], {k: v.copy() for k, v in state_arrays(msg).items()})
        self.version = int(meta["version"])
        return Message("restored", {"worker": self.index, "exact": exact}, {"obs": group.obs.copy()})

    def _op_rollout(self, msg: Message) -> Message:
        """Run ``num_steps`` steps of every env with the cached policy (same-step autoreset).

        Reply arrays (T steps, k envs): ``obs`` (T,k,...), ``actions`` (T,k,...), ``rewards`` (T,k) f32,
        ``terminations`` / ``truncations`` (T,k) bool, the behaviour: ``behaviour_logp`` (T,k) f32, the
        log-probability of each taken action (uplink_behaviour ``logprob``, and ``recompute`` unless the request
        says ``behaviour: none``: then nothing), or ``dist_params`` (T,k,P) f32 (``params``), ``next_obs`` (k,...),
        and for the K finished episodes, in step then env order (where ``terminations | truncations``: the head
        derives their [step, env] from the flags), ``final_obs`` (K,...) and :func:`episode_stats`.
        """
        self._check_inference()
        version = self.version
        # it checks num_steps; float64 observations become the float32 words the policy and the learner see
        f = collect_fragment(self.group, self._policy, int(msg.meta["num_steps"]),
                             float64_as=self.uplink.options.obs_dtype)
        assert f.params is not None
        if self.uplink.options.behaviour == "params":
            behaviour = {"dist_params": f.params}
        elif msg.meta.get("behaviour") == "none":  # the head recomputes it from the words this worker holds
            behaviour = {}
        elif self.actor is not None:  # all the learner and AAPS need: log μ(a_t | s_t)
            behaviour = {"behaviour_logp": self.actor.log_prob(f.params, f.actions)}
        else:
            assert self.policy is not None
            torch = _torch()
            from frugalrl import dists

            with torch.inference_mode():
                logp = dists.log_prob(self.policy.dist_kind, torch.from_numpy(f.params), torch.from_numpy(f.actions))
            behaviour = {"behaviour_logp": logp.float().numpy()}
        arrays: dict[str, np.ndarray] = {
            "obs": f.obs,
            "actions": self._wire_actions(f.actions),
            "rewards": f.rewards,
            "terminations": f.terminations,
            "truncations": f.truncations,
            **behaviour,
            "next_obs": f.next_obs,
            "final_obs": f.final_obs,
            **episode_stats(f.episode_returns, f.episode_lengths),
        }
        return Message("rollout", {"version": version, "worker": self.index}, arrays)


def _torch_free_actor(spec: dict[str, Any]) -> type[NumpyActor] | type[OnnxActor] | type[OnnxCnnActor] | None:
    """The class a worker runs the policy of ``spec`` with, without torch (an MLP agent in numpy; a CNN agent as a
    graph built from its weights, or an exported graph, on ONNX Runtime); None: the policy is a torch module."""
    if runs_in_numpy(spec):
        return NumpyActor
    if cnn_on_onnxruntime(spec):
        return OnnxCnnActor
    return OnnxActor if runs_on_onnxruntime(spec) else None


def episode_stats(returns: list[float], lengths: list[int]) -> dict[str, np.ndarray]:
    """Finished episodes' returns (``ep_r``) and lengths (``ep_l``) as they travel: returns in float32 where each is
    exactly one (CartPole's, Atari's), else float64; lengths in the smallest unsigned dtype that holds them. The head
    reads them as float64 and int64, the same values."""
    lengths_ = np.array(lengths, dtype=np.int64)
    return {"ep_r": float32_if_exact(np.array(returns, dtype=np.float64)),
            "ep_l": lengths_.astype(np.min_scalar_type(int(lengths_.max(initial=0))))}


def float32_if_exact(values: np.ndarray) -> np.ndarray:
    """``values`` as float32 where every one is exactly a float32 (CartPole's 1.0, Atari's integers): half the
    bytes, the same numbers; else as they are."""
    narrow = values.astype(np.float32)
    return narrow if (narrow == values).all() else values


def compact_int_dtype(space: gym.Space) -> np.dtype:
    """The smallest integer dtype holding every action of a Discrete or MultiDiscrete space and every index a
    policy picks in it (0 to n − 1: a space with a ``start`` is shifted on the worker; ``TypeError`` for another
    space)."""
    if isinstance(space, gym.spaces.MultiDiscrete):
        lo, hi = int(np.min(space.start)), int(np.max(space.start + space.nvec - 1))
        lo, hi = min(lo, 0), max(hi, int(np.max(space.nvec)) - 1)
    elif isinstance(space, gym.spaces.Discrete):
        lo, hi = min(int(space.start), 0), max(int(space.start), 0) + int(space.n) - 1
    else:
        raise TypeError(f"integer actions need a Discrete or MultiDiscrete action space, got {space}")
    for dtype in (np.uint8, np.int8, np.uint16, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


