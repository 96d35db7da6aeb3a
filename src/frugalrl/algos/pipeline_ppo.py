"""Split-model PPO: stage 0 (env + encoder) and stage 1 (actor-critic heads) in two processes.

The agent of Ahmed & Ishigaki's pipeline-parallel PPO is cut in two and the halves live in two ranks
of a ``torch.distributed`` process group (gloo on CPU):

- **stage 0** (rank 0) steps the environments and runs the encoder (the paper's CNN: Conv(4→32, 8, s4),
  Conv(32→64, 4, s2), Conv(64→64, 3, s1), ReLU after each, 4096 features on 4×96×96 frames; an MLP for
  vector observations);
- **stage 1** (rank 1) runs the heads (4096→512→action, 4096→512→1; a tanh-squashed Gaussian for Box
  actions, a categorical for Discrete ones) and computes the PPO loss.

What crosses the cut, through :class:`~frugalrl.wire.torchdist.DistChannel` (every byte counted):

rollout, every step      features 0→1 (``activations``), actions 1→0, rewards and done flags 0→1
rollout, end             features of the last observation 0→1 (to bootstrap the value)
update, every minibatch  features 0→1 with the encoder's graph kept on stage 0, then the gradient of
                         the loss with respect to them 1→0 (``gradients``), which stage 0 backpropagates
                         through the encoder
update, end              a vector of loss statistics 1→0 (``control``)

The cut gradient goes through a codec: dense (fp32 / bf16 / fp16), or :class:`~frugalrl.wire.sparsify.
TopPercentile`, the paper's accumulate-and-send-the-top-(1−p) rule with error feedback (eq. 3–6), dense
during a warm start. Both stages draw the minibatch order from the same seeded generator, so indices
never travel. Every message has a size the estimator :mod:`frugalrl.pipeline_bytes` predicts.

Read top to bottom: :class:`PipelinePPOConfig`, the two networks (:func:`make_encoder`, :class:`Heads`),
the two stage loops (:func:`run_stage0`, :func:`run_stage1`), and :func:`train`, which spawns both
stages on this machine or runs the one stage ``torchrun`` (or ``--rank``) gives this process.

Differences from the paper, and why: gradient clipping (max norm 0.5) is applied per stage, since a
global norm would need one more exchange per minibatch; a finished episode (terminated *or* truncated)
is not bootstrapped, as in CleanRL's PPO; the top-(1−p) set is taken with ``topk`` so that exactly
``numel − ⌊p·numel⌋`` entries are sent (identical to |G| ≥ quantile(|G|, p) without ties, and it keeps
message sizes predictable).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from frugalrl import dists
from frugalrl.algos.common import check_fields, progress_bar, slug
from frugalrl.correct import gae
from frugalrl.envs.spec import to_env_spec
from frugalrl.nets import action_desc, layer_init
from frugalrl.wire import cut
from frugalrl.wire.meter import DOWN, UP, ByteMeter
from frugalrl.wire.sparsify import DenseCut, TopPercentile
from frugalrl.wire.torchdist import DistChannel

STAT_NAMES = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance",
              "grad_density", "cut_residual_norm")
"""The loss statistics stage 1 sends to stage 0 after each update (one fp32 vector)."""


@dataclass
class PipelinePPOConfig:
    """Every knob of a split-model PPO run. Field names are the CLI flags (``--cut-percentile`` ...)."""

    env: str = "frugalrl.envs.carracing:make_car_racing"
    """Gymnasium id or 'module:function' env factory; observations (C, H, W) uint8 frames or flat vectors."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env (JSON on the CLI)."""
    seed: int = 1
    total_timesteps: int = 409_600
    """Env steps in all (the paper: 100 iterations of 4096)."""
    num_envs: int = 8
    """Environments stepped by stage 0 (a SyncVectorEnv)."""
    num_steps: int = 512
    """Steps per env per iteration (num_envs * num_steps = the paper's 4096)."""
    num_minibatches: int = 32
    update_epochs: int = 10
    learning_rate: float = 3e-4
    """Adam step size of both stages (the paper uses 5e-5 for the encoder)."""
    anneal_lr: bool = False
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    """Gradient clipping, applied to each stage's parameters separately."""
    norm_adv: bool = True
    head_hidden: int = 512
    """Width of the hidden layer of each head (the paper: 512)."""
    encoder_hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Encoder MLP widths for flat observations (the last one is the cut width)."""
    activations: str = "bf16"
    """Codec of the features sent 0→1: 'fp32', 'bf16' or 'fp16' (the paper sends them dense)."""
    activations_sparse: bool = False
    """Send only the non-zero features (the CNN's last ReLU makes many exactly zero) with 'auto' index
    coding: lossless with respect to ``activations``, smaller when the features are sparse enough."""
    cut: str = "topk"
    """Cut-gradient codec: 'dense' or 'topk' (accumulate, send the entries above the p-th percentile)."""
    cut_percentile: float = 0.9
    """p of the top-percentile rule: the fraction of entries *not* sent each minibatch."""
    cut_index: str = "auto"
    """Index encoding of sparse gradients: 'coo16' (the paper's int16 coordinates), 'bitmask', 'gap' or 'auto'."""
    cut_values: str = "bf16"
    """Value dtype of sparse gradients: 'bf16', 'fp16' or 'fp32'."""
    cut_dense_dtype: str = "fp32"
    """Dtype of dense gradients ('dense' codec, and the warm start of 'topk')."""
    cut_accumulate: str = "position"
    """'position': one accumulator of the minibatch's shape (the paper); 'sample': each sample's residual
    is replayed when that sample recurs in a later epoch (reset every iteration); 'none': no error feedback,
    the unsent entries are dropped."""
    warmup_timesteps: int = 30_000
    """'topk' sends dense gradients while the env steps collected so far are at most this (the paper: 30,000)."""
    backend: str = "gloo"
    """torch.distributed backend."""
    master_addr: str = "127.0.0.1"
    """Address of rank 0's rendezvous (loopback unless the stages run on two machines)."""
    master_port: int = 0
    """Rendezvous port; 0 picks a free one when both stages are spawned here."""
    rank: int | None = None
    """Run only this stage (0 or 1), for two machines; None: spawn both here, or take RANK from torchrun."""
    timeout: float = 600.0
    """Seconds a stage waits for the other before failing."""
    torch_threads: int = 1
    eval_episodes: int = 0
    """Deterministic evaluation episodes at the end (through the pipeline); 0 reports recent training returns."""
    run_dir: str = "runs"
    run_name: str | None = None
    progress: bool = True
    tensorboard: bool = True
    plots: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""
        check_fields(
            self,
            positive_ints=("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                           "head_hidden", "torch_threads"),
            positive=("learning_rate", "timeout"),
            nonneg=("clip_coef", "ent_coef", "vf_coef", "max_grad_norm", "warmup_timesteps", "eval_episodes",
                    "master_port"),
            unit=("gamma", "gae_lambda"),
        )
        if self.activations not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"activations must be 'fp32', 'bf16' or 'fp16', got {self.activations!r}")
        if self.cut not in ("dense", "topk"):
            raise ValueError(f"cut must be 'dense' or 'topk', got {self.cut!r}")
        if not 0 < self.cut_percentile < 1:
            raise ValueError(f"cut_percentile must be in (0, 1), got {self.cut_percentile!r}")
        if self.cut_index not in (*cut.INDEX_ENCODINGS, "auto"):
            raise ValueError(f"cut_index must be one of {(*cut.INDEX_ENCODINGS, 'auto')}, got {self.cut_index!r}")
        if self.cut_values not in cut.VALUE_DTYPES:
            raise ValueError(f"cut_values must be one of {cut.VALUE_DTYPES}, got {self.cut_values!r}")
        if self.cut_dense_dtype not in cut.VALUE_DTYPES:
            raise ValueError(f"cut_dense_dtype must be one of {cut.VALUE_DTYPES}, got {self.cut_dense_dtype!r}")
        if self.cut_accumulate not in ("position", "sample", "none"):
            raise ValueError(f"cut_accumulate must be 'position', 'sample' or 'none', got {self.cut_accumulate!r}")
        if self.rank not in (None, 0, 1):
            raise ValueError(f"rank must be 0, 1 or None, got {self.rank!r}")
        if not self.encoder_hidden or any(h < 1 for h in self.encoder_hidden):
            raise ValueError(f"encoder_hidden must list positive widths, got {self.encoder_hidden!r}")
        batch = self.num_envs * self.num_steps
        if batch % self.num_minibatches:
            raise ValueError(f"num_envs * num_steps ({batch}) must be divisible by num_minibatches "
                             f"({self.num_minibatches})")
        if self.total_timesteps < batch:
            raise ValueError(f"total_timesteps ({self.total_timesteps}) is less than one iteration ({batch} steps)")

    @property
    def batch_size(self) -> int:
        """Env steps per iteration."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        """Samples per minibatch."""
        return self.batch_size // self.num_minibatches

    @property
    def iterations(self) -> int:
        """Iterations of the run (whole ones only)."""
        return self.total_timesteps // self.batch_size

    def digest(self) -> str:
        """Hash of everything both stages must agree on (all fields but where and how to connect)."""
        local = {"rank", "master_addr", "master_port", "timeout", "progress", "tensorboard", "plots", "run_dir",
                 "run_name", "torch_threads"}
        shared = {k: v for k, v in dataclasses.asdict(self).items() if k not in local}
        return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------- networks


CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""The seed's encoder: (channels, kernel, stride) of each convolution, ReLU after each."""


class PixelEncoder(nn.Module):
    """Stage 0's CNN: uint8 frames (C, H, W) → flat features (4096 on 4×96×96), orthogonal init."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width, h, w = obs_shape
        for channels, kernel, stride in CONVS:
            layers += [layer_init(nn.Conv2d(width, channels, kernel, stride)), nn.ReLU()]
            width, h, w = channels, (h - kernel) // stride + 1, (w - kernel) // stride + 1
        if h <= 0 or w <= 0:
            raise ValueError(f"observations {obs_shape} are too small for the encoder's three convolutions")
        self.net = nn.Sequential(*layers, nn.Flatten())
        self.feature_dim = width * h * w

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Features of a batch of frames."""
        return self.net(obs.float() * (1.0 / 255.0))


class VectorEncoder(nn.Module):
    """Stage 0's MLP for flat observations (tanh layers, as CleanRL's PPO trunk)."""

    def __init__(self, obs_dim: int, hidden: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden:
            layers += [layer_init(nn.Linear(width, h)), nn.Tanh()]
            width = h
        self.net = nn.Sequential(*layers)
        self.feature_dim = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Features of a batch of observations."""
        return self.net(obs.float())


def make_encoder(obs_space: gym.Space, hidden: list[int]) -> PixelEncoder | VectorEncoder:
    """The encoder for ``obs_space``: the CNN for uint8 (C, H, W) frames, an MLP for flat Box vectors."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"pipeline PPO needs a Box observation space, got {obs_space}")
    if len(obs_space.shape) == 3 and obs_space.dtype == np.uint8:
        return PixelEncoder(tuple(obs_space.shape))
    if len(obs_space.shape) == 1:
        return VectorEncoder(int(obs_space.shape[0]), list(hidden))
    raise ValueError(f"pipeline PPO needs uint8 (C, H, W) frames or flat vectors, got shape {obs_space.shape} "
                     f"dtype {obs_space.dtype} (stack frames channel-first, e.g. FrameStackObservation)")


class Heads(nn.Module):
    """Stage 1: actor and critic MLPs on the cut features (feature_dim → hidden → out), orthogonal init.

    Discrete actions: a categorical over logits. Box actions: a Gaussian over an unbounded ``u`` with a
    state-independent log-std; the env action is ``tanh(u)`` rescaled to the box. Log-probabilities are
    those of ``u`` (the tanh Jacobian cancels in PPO's ratio).
    """

    def __init__(self, feature_dim: int, action: dict[str, Any], hidden: int = 512) -> None:
        super().__init__()
        self.action = action
        self.dist_kind = "categorical" if action["type"] == "discrete" else "gaussian"
        out = int(action["n"]) if action["type"] == "discrete" else math.prod(action["shape"])
        self.actor = nn.Sequential(layer_init(nn.Linear(feature_dim, hidden)), nn.ReLU(),
                                   layer_init(nn.Linear(hidden, out), std=0.01))
        self.critic = nn.Sequential(layer_init(nn.Linear(feature_dim, hidden)), nn.ReLU(),
                                    layer_init(nn.Linear(hidden, 1), std=1.0))
        if self.dist_kind == "gaussian":
            self.log_std = nn.Parameter(torch.zeros(out))
            low = torch.as_tensor(action["low"], dtype=torch.float32)
            high = torch.as_tensor(action["high"], dtype=torch.float32)
            self.register_buffer("scale", (high - low) / 2)
            self.register_buffer("offset", (high + low) / 2)

    def dist_params(self, features: torch.Tensor) -> torch.Tensor:
        """Logits, or the Gaussian's mean and log-std concatenated (see :mod:`frugalrl.dists`)."""
        out = self.actor(features)
        if self.dist_kind == "categorical":
            return out
        return torch.cat([out, self.log_std.expand_as(out)], dim=-1)

    def value(self, features: torch.Tensor) -> torch.Tensor:
        """State values, shape ``(batch,)``."""
        return self.critic(features).squeeze(-1)

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        """What the env receives for a sampled ``u``: the index, or tanh(u) rescaled to the box."""
        if self.dist_kind == "categorical":
            return u.float()
        return torch.tanh(u) * self.scale + self.offset


# ----------------------------------------------------------------------------------------------- stages


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


def handshake(cfg: PipelinePPOConfig, feature_dim: int, act_space: gym.Space) -> dict[str, Any]:
    """The JSON stage 0 sends first: what stage 1 needs to build its heads, and the config digest."""
    return {"digest": cfg.digest(), "feature_dim": int(feature_dim), "action": action_desc(act_space)}


def predict_bytes(cfg: PipelinePPOConfig) -> dict[str, Any]:
    """The bytes a training run with ``cfg`` will put on the wire (see :func:`frugalrl.pipeline_bytes.predict_run`).

    Builds one env to learn the cut width and the action size. Evaluation traffic is not included
    (the summary reports it apart, as ``eval_bytes``).
    """
    from frugalrl.pipeline_bytes import predict_run

    obs_space, act_space = check_spaces(cfg)
    feature_dim = make_encoder(obs_space, cfg.encoder_hidden).feature_dim
    hello = json.dumps(handshake(cfg, feature_dim, act_space), sort_keys=True).encode()
    reply = json.dumps({"digest": cfg.digest()}, sort_keys=True).encode()
    desc = action_desc(act_space)
    action_dim = 1 if desc["type"] == "discrete" else math.prod(desc["shape"])
    return predict_run(cfg, feature_dim, action_dim, (len(hello), len(reply)), stats_len=len(STAT_NAMES))


def _is_dense_update(cfg: PipelinePPOConfig, steps_so_far: int) -> bool:
    """Whether an update sends dense cut gradients (the 'dense' codec, or the warm start of 'topk')."""
    return cfg.cut == "dense" or steps_so_far <= cfg.warmup_timesteps


def _encode_features(cfg: PipelinePPOConfig, f: torch.Tensor) -> bytes:
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


def run_stage0(cfg: PipelinePPOConfig, chan: DistChannel, run: Any | None) -> dict[str, Any]:
    """Stage 0: environments and encoder. Returns the run summary (and writes the run directory)."""
    envs = make_vector_env(cfg, cfg.seed)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    encoder = make_encoder(obs_space, cfg.encoder_hidden)
    chan.send_json(handshake(cfg, encoder.feature_dim, act_space))
    reply = chan.recv_json()
    if reply.get("digest") != cfg.digest():
        raise ValueError("the two stages were started with different configs (digest mismatch); "
                         "give both the same flags")
    optimizer = torch.optim.Adam(encoder.parameters(), lr=cfg.learning_rate, eps=1e-5)
    order_gen = torch.Generator().manual_seed(cfg.seed + 1)
    T, N = cfg.num_steps, cfg.num_envs
    obs_buf = torch.from_numpy(np.zeros((T, N, *obs_space.shape), dtype=obs_space.dtype))
    check_finite = np.issubdtype(obs_space.dtype, np.floating)  # integer frames cannot hold NaN
    next_obs, _ = envs.reset(seed=cfg.seed)
    episode_returns: list[float] = []
    running = np.zeros(N)
    curve: list[tuple[int, float, float]] = []  # (step, seconds, mean return of episodes that ended)
    bar = progress_bar(cfg.progress, cfg.iterations * cfg.batch_size, "pipeline-ppo")
    start = time.perf_counter()
    global_step = 0
    timings = {"rollout": 0.0, "update": 0.0}
    iter_seconds: list[float] = []
    for iteration in range(1, cfg.iterations + 1):
        t_iter = time.perf_counter()
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = cfg.learning_rate * (1 - (iteration - 1) / cfg.iterations)
        ended: list[float] = []
        for t in range(T):
            obs_t = torch.as_tensor(next_obs)
            if check_finite and not torch.isfinite(obs_t).all():
                raise ValueError(f"environment returned a non-finite observation at step {global_step}")
            obs_buf[t] = obs_t
            with torch.no_grad():
                chan.send(_encode_features(cfg, encoder(obs_t)), "activations")
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
            global_step += N
        with torch.no_grad():
            chan.send(_encode_features(cfg, encoder(torch.as_tensor(next_obs))), "activations")
        t_update = time.perf_counter()
        timings["rollout"] += t_update - t_iter
        episode_returns += ended

        b_obs = obs_buf.reshape(T * N, *obs_space.shape)
        mb_size = cfg.minibatch_size
        for _epoch in range(cfg.update_epochs):
            order = torch.randperm(T * N, generator=order_gen)
            for s in range(0, T * N, mb_size):
                mb = order[s : s + mb_size]
                features = encoder(b_obs[mb])
                chan.send(_encode_features(cfg, features), "activations")
                grad = cut.decode_cut(chan.recv("gradients"))
                optimizer.zero_grad()
                features.backward(grad)
                nn.utils.clip_grad_norm_(encoder.parameters(), cfg.max_grad_norm)
                optimizer.step()
        stats = dict(zip(STAT_NAMES, cut.decode_cut(chan.recv("control")).tolist(), strict=True))
        now = time.perf_counter()
        timings["update"] += now - t_update
        iter_seconds.append(now - t_iter)
        recent = float(np.mean(episode_returns[-10:])) if episode_returns else float("nan")
        if ended:
            curve.append((global_step, now - start, float(np.mean(ended))))
        if run is not None:
            run.log(global_step, {
                "charts/episodic_return": float(np.mean(ended)) if ended else float("nan"),
                "charts/recent_return": recent,
                "charts/steps_per_second": global_step / (now - start),
                "charts/iteration_seconds": now - t_iter,
                "charts/comm_wait_seconds": chan.wait_seconds,
                **{f"losses/{k}": v for k, v in stats.items()},
                **{f"bytes/{k}": v for k, v in chan.meter.by_kind().items()},
                "bytes/total": chan.meter.total(),
            })
        if bar is not None:
            bar.update(T * N)
            bar.set_postfix(ret=f"{recent:.1f}", MB=f"{chan.meter.total() / 1e6:.1f}")
    if bar is not None:
        bar.close()
    train_bytes = _bytes_summary(chan.meter)
    if run is not None:
        torch.save({"encoder": encoder.state_dict(), "obs_shape": list(obs_space.shape), "step": global_step},
                   run.dir / "checkpoints" / "encoder.pt")
    eval_mean, eval_std, eval_source = _final_return(cfg, encoder, chan, episode_returns)
    envs.close()
    wall = time.perf_counter() - start
    return {
        "algo": "pipeline_ppo",
        "env_id": cfg.env,
        "seed": cfg.seed,
        "env_steps": global_step,
        "iterations": cfg.iterations,
        "wall_seconds": wall,
        "steps_per_second": global_step / wall,
        "eval_return_mean": eval_mean,
        "eval_return_std": eval_std,
        "return_source": eval_source,
        "episodes": len(episode_returns),
        "episode_returns": episode_returns,
        "return_curve": curve,
        "iteration_seconds": iter_seconds,
        "rollout_seconds": timings["rollout"],
        "update_seconds": timings["update"],
        "comm_wait_seconds_stage0": chan.wait_seconds,
        "messages": chan.messages,
        "bytes": train_bytes["bytes"],
        "bytes_by_direction": train_bytes["by_direction"],
        "eval_bytes": chan.meter.total() - train_bytes["bytes"]["total"],
        "feature_dim": encoder.feature_dim,
        "cut": {"codec": cfg.cut, "percentile": cfg.cut_percentile, "index": cfg.cut_index,
                "values": cfg.cut_values, "dense_dtype": cfg.cut_dense_dtype, "accumulate": cfg.cut_accumulate,
                "warmup_timesteps": cfg.warmup_timesteps, "activations": cfg.activations},
        "last_stats": stats,
    }


def _bytes_summary(meter: ByteMeter) -> dict[str, Any]:
    s = meter.summary()
    return {"bytes": {**meter.by_kind(), "total": s["total"]}, "by_direction": {UP: s[UP], DOWN: s[DOWN]}}


def _final_return(cfg: PipelinePPOConfig, encoder: nn.Module, chan: DistChannel,
                  episode_returns: list[float]) -> tuple[float, float, str]:
    """Deterministic evaluation through the pipeline, or the mean of the last 10 training episodes."""
    chan.send_json({"eval_episodes": cfg.eval_episodes})
    if cfg.eval_episodes == 0:
        recent = episode_returns[-10:]
        if not recent:
            return float("nan"), float("nan"), "no episode finished"
        return float(np.mean(recent)), float(np.std(recent)), f"last {len(recent)} training episodes"
    env = to_env_spec(cfg.env, cfg.env_kwargs).make()
    returns = []
    try:
        for ep in range(cfg.eval_episodes):
            obs, _ = env.reset(seed=20_000 + ep)
            total, done = 0.0, False
            while not done:
                with torch.no_grad():
                    chan.send(_encode_features(cfg, encoder(torch.as_tensor(obs)[None])), "activations")
                action = cut.decode_cut(chan.recv("actions")).numpy()[0]
                if isinstance(env.action_space, gym.spaces.Discrete):
                    action = int(action)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
                chan.send_json({"done": bool(done)})
            returns.append(total)
    finally:
        env.close()
    return float(np.mean(returns)), float(np.std(returns)), f"{cfg.eval_episodes} deterministic episodes"


def run_stage1(cfg: PipelinePPOConfig, chan: DistChannel) -> None:
    """Stage 1: the heads and the PPO loss; serves stage 0 until the run ends."""
    hello = chan.recv_json()
    if hello.get("digest") != cfg.digest():
        chan.send_json({"digest": cfg.digest()})
        raise ValueError("the two stages were started with different configs (digest mismatch); "
                         "give both the same flags")
    chan.send_json({"digest": cfg.digest()})
    heads = Heads(int(hello["feature_dim"]), hello["action"], cfg.head_hidden)
    optimizer = torch.optim.Adam(heads.parameters(), lr=cfg.learning_rate, eps=1e-5)
    sample_gen = torch.Generator().manual_seed(cfg.seed + 2)
    order_gen = torch.Generator().manual_seed(cfg.seed + 1)
    sparsifier = TopPercentile(cfg.cut_percentile, index=cfg.cut_index, values=cfg.cut_values,
                               warmup_dtype=cfg.cut_dense_dtype)
    dense_codec = DenseCut(cfg.cut_dense_dtype)
    T, N = cfg.num_steps, cfg.num_envs
    n_act = 1 if heads.dist_kind == "categorical" else math.prod(hello["action"]["shape"])
    u_buf = torch.zeros((T, N) if heads.dist_kind == "categorical" else (T, N, n_act))
    logp_buf = torch.zeros(T, N)
    value_buf = torch.zeros(T, N)
    reward_buf = torch.zeros(T, N)
    term_buf = torch.zeros(T, N)
    done_buf = torch.zeros(T, N)
    steps_so_far = 0
    for iteration in range(1, cfg.iterations + 1):
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = cfg.learning_rate * (1 - (iteration - 1) / cfg.iterations)
        for t in range(T):
            features = cut.decode_cut(chan.recv("activations"))
            with torch.no_grad():
                params = heads.dist_params(features)
                u = dists.sample(heads.dist_kind, params, generator=sample_gen)
                logp_buf[t] = dists.log_prob(heads.dist_kind, params, u)
                value_buf[t] = heads.value(features)
            u_buf[t] = u
            chan.send(cut.encode_dense(heads.env_action(u).reshape(N, -1), "fp32"), "actions")
            rtd = cut.decode_cut(chan.recv("rewards"))
            reward_buf[t], term_buf[t], done_buf[t] = rtd[:, 0], rtd[:, 1], rtd[:, 2]
        steps_so_far += T * N
        with torch.no_grad():
            last_value = heads.value(cut.decode_cut(chan.recv("activations")))
            next_values = torch.cat([value_buf[1:], last_value[None]])
            # A finished env's next observation is its reset one: no bootstrap across the boundary.
            advantages, returns = gae(reward_buf, value_buf, next_values * (1 - done_buf), term_buf, done_buf,
                                      cfg.gamma, cfg.gae_lambda)
        b_u = u_buf.reshape(T * N, *u_buf.shape[2:])
        b_logp, b_adv = logp_buf.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), value_buf.reshape(-1)
        dense = _is_dense_update(cfg, steps_so_far)
        if cfg.cut_accumulate == "sample":
            sparsifier.reset()
        clipfracs, densities = [], []
        mb_size = cfg.minibatch_size
        for _epoch in range(cfg.update_epochs):
            order = torch.randperm(T * N, generator=order_gen)
            for s in range(0, T * N, mb_size):
                mb = order[s : s + mb_size]
                features = cut.decode_cut(chan.recv("activations")).requires_grad_(True)
                params = heads.dist_params(features)
                new_logp = dists.log_prob(heads.dist_kind, params, b_u[mb])
                entropy = dists.entropy(heads.dist_kind, params).mean()
                new_value = heads.value(features)
                logratio = new_logp - b_logp[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > cfg.clip_coef).float().mean().item())
                adv = b_adv[mb]
                if cfg.norm_adv:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                if cfg.clip_vloss:
                    v_clipped = b_values[mb] + (new_value - b_values[mb]).clamp(-cfg.clip_coef, cfg.clip_coef)
                    v_loss = 0.5 * torch.max((new_value - b_returns[mb]) ** 2, (v_clipped - b_returns[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((new_value - b_returns[mb]) ** 2).mean()
                loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(heads.parameters(), cfg.max_grad_norm)
                optimizer.step()
                grad = features.grad
                if cfg.cut == "dense":
                    msg = dense_codec.encode(grad)
                else:
                    if cfg.cut_accumulate == "none":
                        sparsifier.reset()
                    keys = mb if cfg.cut_accumulate == "sample" else None
                    msg = sparsifier.encode(grad, keys=keys, dense=dense)
                    densities.append(1.0 if sparsifier.last_dense else sparsifier.last_nnz / grad.numel())
                chan.send(msg, "gradients")
        y_true, y_pred = b_returns.numpy(), b_values.numpy()
        var_y = float(np.var(y_true))
        stats = [pg_loss.item(), v_loss.item(), entropy.item(), approx_kl.item(), float(np.mean(clipfracs)),
                 float("nan") if var_y == 0 else 1 - float(np.var(y_true - y_pred)) / var_y,
                 float(np.mean(densities)) if densities else 1.0,
                 float(sparsifier.residual().norm()) if cfg.cut == "topk" and sparsifier.steps else 0.0]
        chan.send(cut.encode_dense(np.asarray(stats, dtype=np.float32), "fp32"), "control")
    # Each stage keeps its own half: the heads stay on stage 1's machine (nothing extra on the wire).
    ckpt_dir = Path(cfg.run_dir) / (cfg.run_name or "pipeline-ppo-stage1") / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.save({"heads": heads.state_dict(), "feature_dim": int(hello["feature_dim"]), "action": hello["action"],
                "head_hidden": cfg.head_hidden}, ckpt_dir / "heads.pt")
    _serve_eval(heads, chan)


def _serve_eval(heads: Heads, chan: DistChannel) -> None:
    """Stage 1's side of the final evaluation: deterministic actions until stage 0 says it is done."""
    episodes = int(chan.recv_json()["eval_episodes"])
    for _ in range(episodes):
        done = False
        while not done:
            features = cut.decode_cut(chan.recv("activations"))
            with torch.no_grad():
                action = heads.env_action(dists.mode(heads.dist_kind, heads.dist_params(features)))
            chan.send(cut.encode_dense(action.reshape(1, -1), "fp32"), "actions")
            done = bool(chan.recv_json()["done"])


# ------------------------------------------------------------------------------------------------ launch


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def _is_loopback(addr: str) -> bool:
    return addr in ("localhost", "::1") or addr.startswith("127.")


def run_stage(cfg: PipelinePPOConfig, rank: int) -> dict[str, Any]:
    """Join the process group as ``rank`` and run that stage; rank 0 returns the run summary.

    Rendezvous at ``cfg.master_addr:cfg.master_port`` (``MASTER_ADDR``/``MASTER_PORT`` from ``torchrun``
    take precedence when set). On loopback, gloo is told to use the ``lo`` interface.
    """
    from frugalrl.runs import Run

    addr = os.environ.get("MASTER_ADDR", cfg.master_addr)
    port = int(os.environ.get("MASTER_PORT", cfg.master_port))
    if port == 0:
        raise ValueError("master_port must be given (non-zero) when a stage is started on its own")
    if _is_loopback(addr):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed + rank)
    dist.init_process_group(cfg.backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=cfg.timeout))
    try:
        chan = DistChannel(rank, 1 - rank)
        if rank == 1:
            run_stage1(cfg, chan)
            return {}
        name = cfg.run_name or f"pipeline-ppo-{slug(cfg.env.split(':')[-1])}-{cfg.cut}-s{cfg.seed}"
        run = Run(cfg.run_dir, name, cfg, tensorboard=cfg.tensorboard)
        summary = run_stage0(cfg, chan, run)
        summary["run_dir"] = str(run.dir)
        return run.finish(summary, plots=cfg.plots)
    finally:
        dist.destroy_process_group()


def train(cfg: PipelinePPOConfig) -> dict[str, Any]:
    """Train split-model PPO as ``cfg`` says; return stage 0's run summary.

    With ``cfg.rank`` set, or under ``torchrun`` (``RANK`` in the environment), only that stage runs in
    this process (stage 1 returns ``{}``). Otherwise both stages are started here as two fresh Python
    processes (``python -m frugalrl.algos.pipeline_ppo``) joined over loopback; if either fails, the other
    is stopped and its error is raised here. Stage 1's output goes to ``<run dir>/stage1.log``.
    """
    cfg.validate()
    rank = cfg.rank if cfg.rank is not None else (int(os.environ["RANK"]) if "RANK" in os.environ else None)
    if rank is not None:
        if rank == 0:
            check_spaces(cfg)
        return run_stage(cfg, rank)
    check_spaces(cfg)
    name = cfg.run_name or f"pipeline-ppo-{slug(cfg.env.split(':')[-1])}-{cfg.cut}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    cfg = dataclasses.replace(cfg, run_name=name)
    run_dir = Path(cfg.run_dir) / name
    run_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        port = cfg.master_port or _free_port(cfg.master_addr)
        try:
            _launch_both(dataclasses.replace(cfg, master_port=port), run_dir)
            break
        except RuntimeError as e:
            # A free port can be taken between our probe and gloo's bind: try another one.
            if cfg.master_port or "EADDRINUSE" not in str(e) or attempt == 2:
                raise
    return json.loads((run_dir / "summary.json").read_text())


def _launch_both(cfg: PipelinePPOConfig, run_dir: Path) -> None:
    """Start both stages as subprocesses and wait; stop the other and raise if one fails."""
    for rank in (0, 1):
        (run_dir / f"stage{rank}.error").unlink(missing_ok=True)
    cfg_path = run_dir / "stage_config.json"
    cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
    procs = []
    try:
        for r in (0, 1):
            log = None if r == 0 else open(run_dir / "stage1.log", "w")  # noqa: SIM115 - closed below
            cmd = [sys.executable, "-m", "frugalrl.algos.pipeline_ppo", str(cfg_path), str(r)]
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=log), log))
        while True:
            codes = [p.poll() for p, _ in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                raise _stage_error(run_dir, failed[0], codes[failed[0]])
            if all(c == 0 for c in codes):
                return
            time.sleep(0.1)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            if log is not None:
                log.close()


def _stage_error(run_dir: Path, rank: int, code: int) -> Exception:
    """The error a failed stage recorded (a ``ValueError`` stays one, so the CLI reports it cleanly)."""
    path = run_dir / f"stage{rank}.error"
    message = path.read_text().strip() if path.exists() else f"exited with code {code} (see {run_dir}/stage1.log)"
    if message.startswith("ValueError: "):
        return ValueError(f"pipeline stage {rank}: {message.removeprefix('ValueError: ')}")
    return RuntimeError(f"pipeline stage {rank} failed: {message}")


def _stage_main(argv: list[str]) -> int:
    """``python -m frugalrl.algos.pipeline_ppo CONFIG_JSON RANK``: one stage, as :func:`train` starts it."""
    cfg_path, rank = Path(argv[0]), int(argv[1])
    cfg = PipelinePPOConfig(**json.loads(cfg_path.read_text()))
    try:
        run_stage(cfg, rank)
    except BaseException as e:
        (cfg_path.parent / f"stage{rank}.error").write_text(f"{type(e).__name__}: {e}\n")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(_stage_main(sys.argv[1:]))
