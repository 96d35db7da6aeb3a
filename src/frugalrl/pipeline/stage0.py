"""Stage 0 of split-model PPO: the environments and the encoder; it owns the run (directory, summary).

Per iteration: a rollout of ``num_steps`` steps of ``num_envs`` envs (features 0→1, actions 1→0, rewards and
done flags 0→1, then the last observation's features to bootstrap), then ``update_epochs × num_minibatches``
minibatches (features 0→1 with the encoder's graph kept, the cut gradient 1→0 backpropagated through the
encoder), then stage 1's loss statistics. Evaluations (every ``eval_every`` iterations and after the last)
go through the pipeline too, on a meter of their own: the run's ``bytes`` are the training traffic that
:mod:`frugalrl.pipeline.bytes` predicts.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from frugalrl.envs.spec import to_env_spec
from frugalrl.evaluation import Evaluation
from frugalrl.nets import action_desc, make_encoder
from frugalrl.pipeline.config import STAT_NAMES, PipelinePPOConfig
from frugalrl.training import Training
from frugalrl.wire import cut
from frugalrl.wire.meter import ByteMeter
from frugalrl.wire.torchdist import DistChannel

EVAL_SEED = 20_000
"""Env seeds of the pipeline's evaluation episodes: ``EVAL_SEED, EVAL_SEED + 1, ...``."""


def make_vector_env(cfg: PipelinePPOConfig, seed: int) -> gym.vector.SyncVectorEnv:
    """Stage 0's environments (same-step autoreset: a finished env's next observation is its reset one)."""
    spec = to_env_spec(cfg.env, cfg.env_kwargs)
    envs = gym.vector.SyncVectorEnv([spec.make for _ in range(cfg.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=seed)
    return envs


def check_spaces(cfg: PipelinePPOConfig) -> tuple[gym.Space, gym.Space]:
    """Build one env and check its spaces; a clear ``ValueError`` when the pipeline cannot handle them."""
    env = to_env_spec(cfg.env, cfg.env_kwargs).make()
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    make_encoder(obs_space, cfg.encoder_hidden)
    desc = action_desc(act_space)
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


def run_stage0(cfg: PipelinePPOConfig, chan: DistChannel, run: Training) -> dict[str, Any]:
    """Stage 0's loop; returns the run summary (and writes the run directory)."""
    envs = make_vector_env(cfg, cfg.seed)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    norm_obs, norm_reward = cfg.normalization(isinstance(act_space, gym.spaces.Box))
    encoder = make_encoder(obs_space, cfg.encoder_hidden, obs_norm=norm_obs)
    assert isinstance(obs_space, gym.spaces.Box)  # make_encoder accepts Box spaces only
    optimizer = torch.optim.Adam(encoder.parameters(), lr=cfg.learning_rate, eps=1e-5, foreach=True)
    order_gen = torch.Generator().manual_seed(cfg.seed + 1)
    eval_meter = ByteMeter()

    @contextlib.contextmanager
    def evaluation_traffic() -> Iterator[None]:
        train_meter, chan.meter = chan.meter, eval_meter  # evaluation traffic is kept apart
        try:
            yield
        finally:
            chan.meter = train_meter

    def evaluate() -> Evaluation:
        with evaluation_traffic():
            return _evaluate(cfg, encoder, chan)

    run.attach(encoder=encoder, optimizer=optimizer, order_gen=order_gen, meter=chan.meter)
    run.begin(evaluate, cfg.iterations * cfg.batch_size, cfg.iterations)
    chan.send_json(handshake(cfg, encoder.feature_dim, act_space, run.updates))
    reply = chan.recv_json()
    if reply.get("digest") != cfg.digest():
        raise ValueError("the two stages were started with different configs (digest mismatch); "
                         "give both the same flags")
    T, N = cfg.num_steps, cfg.num_envs
    obs_buf = torch.from_numpy(np.zeros((T, N, *obs_space.shape), dtype=obs_space.dtype))
    check_finite = np.issubdtype(obs_space.dtype, np.floating)  # integer frames cannot hold NaN
    next_obs, _ = envs.reset(seed=cfg.seed if not run.resumed else cfg.seed + 1_000_003 * len(run.resumes))
    running = np.zeros(N)
    curve: list[tuple[int, float, float]] = []  # (step, seconds, mean return of episodes that ended)
    timings = {"rollout": 0.0, "update": 0.0}
    iteration_seconds: list[float] = []
    stats: dict[str, float] = {}
    while run.updates < cfg.iterations and not run.stopped:
        iteration = run.updates + 1
        t_iter = time.perf_counter()
        lr = optimizer.param_groups[0]["lr"] = cfg.lr_at(iteration, cfg.iterations)
        ended: list[float] = []
        for t in range(T):
            obs_t = torch.as_tensor(next_obs)
            if check_finite and not torch.isfinite(obs_t).all():
                raise ValueError(f"environment returned a non-finite observation at step {run.env_steps + t * N}")
            obs_buf[t] = obs_t
            with torch.no_grad():
                chan.send(encode_features(cfg, encoder(obs_t)), "activations")
            action = cut.decode_cut(chan.recv("actions")).numpy()
            if isinstance(act_space, gym.spaces.Discrete):
                action = action.reshape(N).astype(np.int64)
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            done = np.logical_or(terminated, truncated)
            chan.send(cut.encode_dense(np.stack([reward, terminated, done], axis=1).astype(np.float32), "fp32"),
                      "rewards")
            running += reward
            for i in np.flatnonzero(done):
                ended.append(float(running[i]))
                running[i] = 0.0
        with torch.no_grad():
            chan.send(encode_features(cfg, encoder(torch.as_tensor(next_obs))), "activations")
        t_update = time.perf_counter()
        timings["rollout"] += t_update - t_iter

        b_obs = obs_buf.reshape(T * N, *obs_space.shape)
        mb_size = cfg.minibatch_size
        for _epoch in range(cfg.update_epochs):
            order = torch.randperm(T * N, generator=order_gen)
            for s in range(0, T * N, mb_size):
                features = encoder(b_obs[order[s : s + mb_size]])
                chan.send(encode_features(cfg, features), "activations")
                grad = cut.decode_cut(chan.recv("gradients"))
                optimizer.zero_grad()
                features.backward(grad)
                nn.utils.clip_grad_norm_(encoder.parameters(), cfg.max_grad_norm)
                optimizer.step()
        stats = dict(zip(STAT_NAMES, cut.decode_cut(chan.recv("control")).tolist(), strict=True))
        obs_norm = getattr(encoder, "obs_norm", None)
        if obs_norm is not None:  # after the update: a rollout and its update see the same statistics
            obs_norm.update(b_obs)
        now = time.perf_counter()
        timings["update"] += now - t_update
        iteration_seconds.append(now - t_iter)
        if ended:
            curve.append((run.env_steps + T * N, run.seconds(), float(np.mean(ended))))
        row = {"charts/lr": lr, "charts/iteration_seconds": now - t_iter, "charts/comm_wait_seconds": chan.wait_seconds,
               **{f"losses/{k}": v for k, v in stats.items()},
               **{f"bytes/{k}": v for k, v in chan.meter.by_kind().items()}, "bytes/total": chan.meter.total()}
        run.update(T * N, row, episode_returns=ended, postfix={"MB": f"{chan.meter.total() / 1e6:.1f}"})
        if cfg.evaluates_after(iteration):
            with evaluation_traffic():
                chan.send_json({"stop": run.stopped})  # stage 1 stops with us at the target
    envs.close()
    details = {
        "feature_dim": encoder.feature_dim,
        "norm_obs": norm_obs and getattr(encoder, "obs_norm", None) is not None,
        "norm_reward": norm_reward,
        "iterations": cfg.iterations,
        "return_curve": curve,
        "iteration_seconds": iteration_seconds,
        "rollout_seconds": timings["rollout"],
        "update_seconds": timings["update"],
        "comm_wait_seconds_stage0": chan.wait_seconds,
        "messages": chan.messages,
        "eval_bytes": eval_meter.total(),
        "cut": {"codec": cfg.cut, "percentile": cfg.cut_percentile, "index": cfg.cut_index,
                "values": cfg.cut_values, "dense_dtype": cfg.cut_dense_dtype, "accumulate": cfg.cut_accumulate,
                "warmup_timesteps": cfg.warmup_timesteps, "activations": cfg.activations},
        "last_stats": stats,
    }
    return run.finish(details, traffic={"bytes": chan.meter.summary()})


def _evaluate(cfg: PipelinePPOConfig, encoder: nn.Module, chan: DistChannel) -> Evaluation:
    """``eval_episodes`` episodes through the pipeline, stage 1 taking the mode of its heads' distribution."""
    env = to_env_spec(cfg.env, cfg.env_kwargs).make()
    returns = []
    try:
        for ep in range(cfg.eval_episodes):
            obs, _ = env.reset(seed=EVAL_SEED + ep)
            total, done = 0.0, False
            while not done:
                with torch.no_grad():
                    chan.send(encode_features(cfg, encoder(torch.as_tensor(obs)[None])), "activations")
                action = cut.decode_cut(chan.recv("actions")).numpy()[0]
                if isinstance(env.action_space, gym.spaces.Discrete):
                    action = int(action.reshape(-1)[0])
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
                chan.send_json({"done": bool(done)})
            returns.append(total)
    finally:
        env.close()
    return Evaluation(float(np.mean(returns)), float(np.std(returns)), cfg.eval_episodes, deterministic=True)
