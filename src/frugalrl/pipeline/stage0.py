"""Stage 0 of split-model PPO: the environments and the encoder; it owns the run (directory, summary).

Per iteration: a rollout of ``num_steps`` steps of ``num_envs`` envs (features 0→1, actions 1→0), then its
rewards and done flags 0→1 in one message, then the last observation's features and those of truncated
episodes' final observations, to bootstrap, then ``update_epochs × num_minibatches`` minibatches (features 0→1 with the encoder's graph kept,
the cut gradient 1→0 backpropagated through the encoder), then stage 1's loss statistics, then whether the run
goes on. Evaluations (every ``eval_every`` iterations and after the last) go through the pipeline too; they and
the go-on flags are counted on a meter of their own: the run's ``bytes`` are the training traffic that
:mod:`frugalrl.pipeline.bytes` predicts. :class:`Stage0` is the algorithm :func:`frugalrl.driver.drive` runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from frugalrl.driver import Algorithm, Setup, Step, Update
from frugalrl.envs.spec import to_env_spec
from frugalrl.evaluation import Evaluation
from frugalrl.experience import EnvGroup, Fragment, collect_fragment
from frugalrl.nets import action_desc
from frugalrl.pipeline.config import STAT_NAMES, PipelinePPOConfig
from frugalrl.pipeline.model import PixelEncoder, VectorEncoder, make_encoder
from frugalrl.wire import cut
from frugalrl.wire.meter import ByteMeter
from frugalrl.wire.torchdist import TorchDistChannel

EVAL_SEED = 20_000
"""Env seeds of the pipeline's evaluation episodes: ``EVAL_SEED, EVAL_SEED + 1, ...``."""


def make_env_group(cfg: PipelinePPOConfig, seed: int) -> EnvGroup:
    """Stage 0's environments, reset with ``seed`` (same-step autoreset: a finished env's next observation is its
    reset one)."""
    spec = to_env_spec(cfg.env, cfg.env_kwargs, cfg.env_wrappers)
    name = spec.describe()
    group = EnvGroup([spec.make() for _ in range(cfg.num_envs)], where=lambda i: f"env {i} ({name})")
    group.reset_all(seed)
    return group


def check_spaces(cfg: PipelinePPOConfig) -> tuple[gym.Space, gym.Space]:
    """Build one env and check its spaces; a clear ``ValueError`` when the pipeline cannot handle them."""
    env = to_env_spec(cfg.env, cfg.env_kwargs, cfg.env_wrappers).make()
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    make_encoder(obs_space, cfg.encoder_hidden)
    desc = action_desc(act_space)
    if desc["type"] not in ("discrete", "box"):
        raise ValueError(f"pipeline PPO's split model acts in Discrete and Box action spaces, not {act_space} "
                         "(frugalrl train ppo, impala and hsa2c act in MultiDiscrete and MultiBinary ones)")
    if isinstance(act_space, gym.spaces.Discrete) and act_space.start != 0:
        raise ValueError(f"pipeline PPO needs Discrete actions from 0, got {act_space} (frugalrl train ppo, impala "
                         "and hsa2c shift them by the space's start)")
    if desc["type"] == "box" and len(desc["shape"]) != 1:
        raise ValueError(f"pipeline PPO needs flat Box actions, got shape {desc['shape']}")
    if desc["type"] == "box" and not np.all(np.isfinite(desc["low"] + desc["high"])):
        raise ValueError("pipeline PPO squashes Box actions with tanh and needs finite bounds, "
                         f"got low={desc['low']} high={desc['high']}")
    return obs_space, act_space


def handshake(cfg: PipelinePPOConfig, feature_dim: int, act_space: gym.Space, start_iteration: int = 0) -> dict[str, Any]:
    """The JSON stage 0 sends first: what stage 1 needs to build its heads, where the run starts (a resumed
    run's iteration), and the config digest."""
    return {"digest": cfg.digest(), "feature_dim": int(feature_dim), "action": action_desc(act_space),
            "start_iteration": int(start_iteration)}


def is_dense_update(cfg: PipelinePPOConfig, steps_so_far: int) -> bool:
    """Whether an update sends dense cut gradients (the 'dense' codec, or the warm start of 'topk')."""
    return cfg.cut == "dense" or steps_so_far <= cfg.warmup_timesteps


def encode_features(cfg: PipelinePPOConfig, f: torch.Tensor) -> bytes:
    """Features as a cut message: dense, or (``activations_sparse``) their non-zero entries."""
    f = f.detach()
    if not cfg.activations_sparse:
        return cut.encode_dense(f, cfg.activations)
    flat = f.reshape(-1).numpy()
    nz = np.flatnonzero(flat)
    sparse = cut.encode_sparse(nz, flat[nz], tuple(f.shape), index="auto", values_dtype=cfg.activations)
    # Dense features (a tanh encoder, say) are cheaper dense: never send more than the dense message.
    if len(sparse) >= cut.dense_nbytes(tuple(f.shape), cfg.activations):
        return cut.encode_dense(f, cfg.activations)
    return sparse


class TruncationLog:
    """Truncation bootstraps sent per iteration (a checkpoint part, so a resumed run's bytes stay predictable)."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def state_dict(self) -> dict[str, list[int]]:
        return {"counts": list(self.counts)}

    def load_state_dict(self, state: dict[str, list[int]]) -> None:
        self.counts = [int(c) for c in state["counts"]]

    @staticmethod
    def state_when_missing(counters: dict[str, Any]) -> dict[str, list[int]]:
        """A checkpoint from before this part: its iterations sent no bootstraps."""
        return {"counts": [0] * int(counters["updates"])}


def send_rewards(chan: TorchDistChannel, fragment: Fragment) -> None:
    """After a rollout, in one message: every step's reward, termination and done flag, ``(T, N, 3)`` fp32
    (stage 1 needs them only for the returns; one message per step would cost a header and a round of
    latency each)."""
    done = np.logical_or(fragment.terminations, fragment.truncations)
    rtd = np.stack([fragment.rewards, fragment.terminations, done], axis=-1).astype(np.float32)
    chan.send(cut.encode_dense(rtd, "fp32"), "rewards")


def send_bootstrap(cfg: PipelinePPOConfig, encoder: nn.Module, chan: TorchDistChannel, next_obs: np.ndarray,
                   finals: np.ndarray) -> None:
    """After a rollout: the features of the last observation, then those of the final observations of the
    truncated steps (row-major (t, env) order) when there are any; stage 1 counts them from the done flags,
    so nothing is sent for none."""
    with torch.no_grad():
        chan.send(encode_features(cfg, encoder(torch.as_tensor(next_obs))), "activations")
        if len(finals):
            chan.send(encode_features(cfg, encoder(torch.as_tensor(finals))), "activations")


class Stage0(Algorithm):
    """Stage 0 as the driver's algorithm: the envs, the encoder, one iteration per update; its half of every
    exchange with stage 1 (``chan``, opened by :meth:`setup`)."""

    name = "pipeline-ppo"

    def __init__(self, cfg: PipelinePPOConfig, connect: Callable[[], TorchDistChannel]) -> None:
        super().__init__(cfg)
        self.cfg: PipelinePPOConfig = cfg
        self.connect = connect
        self.envs: EnvGroup | None = None
        self.eval_meter = ByteMeter()  # evaluation and run-control traffic, kept apart from training's

    def tag(self) -> str:
        return self.cfg.cut

    def setup(self) -> Setup:
        cfg = self.cfg
        self.chan = self.connect()
        envs = self.envs = make_env_group(cfg, cfg.seed)
        self.obs_space, self.act_space = envs.observation_space, envs.action_space
        assert isinstance(self.obs_space, gym.spaces.Box)  # make_encoder accepts Box spaces only
        self.norm_obs, self.norm_reward = cfg.normalization(isinstance(self.act_space, gym.spaces.Box))
        self.encoder = make_encoder(self.obs_space, cfg.encoder_hidden, obs_norm=self.norm_obs)
        self.optimizer = torch.optim.Adam(self.encoder.parameters(), lr=cfg.learning_rate, eps=1e-5, foreach=True)
        self.order_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.truncations = TruncationLog()
        parts = {"encoder": self.encoder, "optimizer": self.optimizer, "order_gen": self.order_gen,
                 "meter": self.chan.meter, "truncations": self.truncations}
        return Setup(parts, total_updates=cfg.iterations, steps_per_update=cfg.batch_size, evaluate=self._evaluate,
                     resize_on_resume=False)  # stage 1 counts the same iterations

    @contextlib.contextmanager
    def _control_traffic(self) -> Iterator[None]:
        """Evaluation and run-control messages go on a meter of their own: the run's ``bytes`` stay the training
        traffic that :mod:`frugalrl.pipeline.bytes` predicts."""
        train_meter, self.chan.meter = self.chan.meter, self.eval_meter
        try:
            yield
        finally:
            self.chan.meter = train_meter

    def _evaluate(self) -> Evaluation:
        with self._control_traffic():
            return _evaluate(self.cfg, self.encoder, self.chan)

    def start(self) -> None:
        cfg, run, chan = self.cfg, self.run, self.chan
        chan.send_json(handshake(cfg, self.encoder.feature_dim, self.act_space, run.updates))
        if chan.recv_json().get("digest") != cfg.digest():
            raise ValueError("the two stages were started with different configs (digest mismatch); "
                             "give both the same flags")
        assert self.envs is not None
        self.envs.reset_all(cfg.seed if not run.resumed else cfg.seed + 1_000_003 * len(run.resumes))
        self.curve: list[tuple[int, float, float]] = []  # (step, seconds, mean return of episodes that ended)
        self.timings = {"rollout": 0.0, "update": 0.0}
        self.iteration_seconds: list[float] = []
        self.stats: dict[str, float] = {}

    def update(self, step: Step) -> Update:
        cfg, chan = self.cfg, self.chan
        T, N = cfg.num_steps, cfg.num_envs
        t_iter = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"] = cfg.lr_at(step.index, step.total)
        fragment = self._rollout()
        send_rewards(chan, fragment)
        finals = fragment.truncated_final_obs()
        send_bootstrap(cfg, self.encoder, chan, fragment.next_obs, finals)
        self.truncations.counts.append(len(finals))
        ended = fragment.episode_returns
        t_update = time.perf_counter()
        self.timings["rollout"] += t_update - t_iter
        self._learn(torch.from_numpy(fragment.obs))
        now = time.perf_counter()
        self.timings["update"] += now - t_update
        self.iteration_seconds.append(now - t_iter)
        if ended:
            self.curve.append((self.run.env_steps + T * N, self.run.seconds(), float(np.mean(ended))))
        row = {"charts/lr": lr, "charts/iteration_seconds": now - t_iter, "charts/comm_wait_seconds": chan.wait_seconds,
               **{f"losses/{k}": v for k, v in self.stats.items()},
               **{f"bytes/{k}": v for k, v in chan.meter.by_kind().items()}, "bytes/total": chan.meter.total()}
        return Update(T * N, row, episode_returns=ended, postfix={"MB": f"{chan.meter.total() / 1e6:.1f}"})

    def _rollout(self) -> Fragment:
        """``num_steps`` steps of every env, stage 1 choosing the actions from the features sent to it."""
        cfg, chan, envs = self.cfg, self.chan, self.envs
        assert envs is not None
        N = cfg.num_envs
        discrete = isinstance(self.act_space, gym.spaces.Discrete)

        def policy(obs: np.ndarray) -> tuple[np.ndarray, None]:
            with torch.no_grad():
                chan.send(encode_features(cfg, self.encoder(torch.as_tensor(obs))), "activations")
            action = cut.decode_cut(chan.recv("actions")).numpy()
            return (action.reshape(N).astype(np.int64) if discrete else action), None

        return collect_fragment(envs, policy, cfg.num_steps)

    def _learn(self, obs: torch.Tensor) -> None:
        """The encoder's side of the update on the rollout's observations ``obs`` (T, N, ...): features of every
        minibatch out, cut gradients back in."""
        cfg, chan, encoder = self.cfg, self.chan, self.encoder
        b_obs = obs.reshape(cfg.batch_size, *tuple(self.obs_space.shape or ()))
        mb_size = cfg.minibatch_size
        for _epoch in range(cfg.update_epochs):
            order = torch.randperm(cfg.batch_size, generator=self.order_gen)
            for s in range(0, cfg.batch_size, mb_size):
                features = encoder(b_obs[order[s : s + mb_size]])
                chan.send(encode_features(cfg, features), "activations")
                grad = cut.decode_cut(chan.recv("gradients"))
                self.optimizer.zero_grad()
                features.backward(grad)
                nn.utils.clip_grad_norm_(encoder.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
        self.stats = dict(zip(STAT_NAMES, cut.decode_cut(chan.recv("control")).tolist(), strict=True))
        obs_norm = getattr(encoder, "obs_norm", None)
        if obs_norm is not None:  # after the update: a rollout and its update see the same statistics
            obs_norm.update(b_obs)

    def after_update(self, stopping: bool, saved: bool) -> None:
        """Tell stage 1 whether the run goes on (it stops with us: a target, a callback) and whether we just wrote a
        checkpoint (it then saves its half, at the same iteration)."""
        with self._control_traffic():
            self.chan.send_json({"stop": stopping, "checkpoint": saved})

    def details(self) -> dict[str, Any]:
        cfg, chan = self.cfg, self.chan
        return {
            "feature_dim": self.encoder.feature_dim,
            "norm_obs": self.norm_obs and getattr(self.encoder, "obs_norm", None) is not None,
            "norm_reward": self.norm_reward,
            "iterations": cfg.iterations,
            "return_curve": self.curve,
            "iteration_seconds": self.iteration_seconds,
            "rollout_seconds": self.timings["rollout"],
            "update_seconds": self.timings["update"],
            "comm_wait_seconds_stage0": chan.wait_seconds,
            "messages": chan.messages,
            "eval_bytes": self.eval_meter.total(),
            "truncation_bootstraps": self.truncations.counts,
            "cut": {"codec": cfg.cut, "percentile": cfg.cut_percentile, "index": cfg.cut_index,
                    "values": cfg.cut_values, "dense_dtype": cfg.cut_dense_dtype, "accumulate": cfg.cut_accumulate,
                    "warmup_timesteps": cfg.warmup_timesteps, "activations": cfg.activations},
            "last_stats": self.stats,
        }

    def traffic(self) -> dict[str, Any]:
        return {"bytes": self.chan.meter.summary()}

    def close(self) -> None:
        if self.envs is not None:
            self.envs.close()


def _evaluate(cfg: PipelinePPOConfig, encoder: PixelEncoder | VectorEncoder, chan: TorchDistChannel) -> Evaluation:
    """``eval_episodes`` episodes through the pipeline, stage 1 taking the mode of its heads' distribution.

    The episodes run side by side: one message of the running episodes' features per step, one of their actions
    back, and a message of no rows once every episode has ended or was cut at ``cfg.eval_max_steps`` steps (a round
    trip per step, not per episode step).
    """
    spec = to_env_spec(cfg.env, cfg.env_kwargs, cfg.env_wrappers)
    envs = [spec.make() for _ in range(cfg.eval_episodes)]
    try:
        obs = [env.reset(seed=EVAL_SEED + ep)[0] for ep, env in enumerate(envs)]
        returns = [0.0] * len(envs)
        discrete = isinstance(envs[0].action_space, gym.spaces.Discrete) if envs else False
        running = list(range(len(envs)))
        steps = 0
        while running and steps < cfg.eval_max_steps:
            steps += 1
            with torch.no_grad():
                features = encoder(torch.as_tensor(np.stack([obs[i] for i in running])))
            chan.send(encode_features(cfg, features), "activations")
            actions = cut.decode_cut(chan.recv("actions")).numpy()
            still = []
            for i, action in zip(running, actions, strict=True):
                obs[i], reward, terminated, truncated, _ = envs[i].step(int(action[0]) if discrete else action)
                returns[i] += float(reward)
                if not (terminated or truncated):
                    still.append(i)
            running = still
        chan.send(cut.encode_dense(np.zeros((0, encoder.feature_dim), np.float32), cfg.activations), "activations")
    finally:
        for env in envs:
            env.close()
    return Evaluation(float(np.mean(returns)), float(np.std(returns)), cfg.eval_episodes, deterministic=True,
                      returns=returns, cut=len(running))
