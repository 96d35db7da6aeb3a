"""Stage 1 of split-model PPO: the actor-critic heads and the PPO loss; it serves stage 0 until the run ends.

It runs the same iterations as stage 0 (both hold the same config, checked by digest): it samples the
actions of every rollout step, computes GAE once the rollout is complete (bootstrapping a truncated episode
from the value of its final observation, a terminated one from nothing), and for every minibatch takes
the features, steps its heads with :func:`frugalrl.losses.ppo_loss` and sends back the gradient of the loss
with respect to the features through the cut codec (dense, or :class:`~frugalrl.wire.sparsify.TopPercentile`
with error feedback). Both stages draw the minibatch order from the same seeded generator, so indices never
travel. It keeps its own half: ``checkpoints/heads.pt`` in the run directory on its machine, written whenever
stage 0's driver writes its checkpoint (it says so after every iteration) and at the end.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from frugalrl import dists
from frugalrl.losses import explained_variance, ppo_loss
from frugalrl.normalize import ReturnScaler
from frugalrl.pipeline.config import PipelinePPOConfig
from frugalrl.pipeline.model import Heads
from frugalrl.pipeline.stage0 import is_dense_update
from frugalrl.returns import gae, next_values_of
from frugalrl.runs import read_torch_file, write_atomic
from frugalrl.wire import cut, sparsify
from frugalrl.wire.torchdist import TorchDistChannel

HEADS_CHECKPOINT = "heads.pt"
"""Stage 1's half of a checkpoint, in ``<run>/checkpoints/``."""


def stage1_dir(cfg: PipelinePPOConfig) -> Path:
    """Where stage 1 keeps its half of the run (the same run directory when both stages share a machine)."""
    return Path(cfg.run_dir) / (cfg.run_name or "pipeline-ppo-stage1")


def truncated_steps(terminations: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
    """``(T, N)`` mask of the steps that ended an episode by truncation alone; stage 0 sends their final
    observations' features in this mask's row-major ``(t, env)`` order."""
    return (dones > 0) & (terminations == 0)


def rollout_targets(rewards: torch.Tensor, values: torch.Tensor, last_value: torch.Tensor,
                    final_values: torch.Tensor, terminations: torch.Tensor, dones: torch.Tensor, gamma: float,
                    lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE ``(advantages, returns)`` of a rollout: each step bootstraps from the next step's value, ``last_value``
    after the rollout, or at a truncation the value of its final observation (``final_values``, one per
    :func:`truncated_steps` entry); a termination from nothing."""
    final_idx = truncated_steps(terminations, dones).nonzero()  # row-major (t, env): stage 0's order
    next_values = next_values_of(values, last_value, final_idx, final_values)
    return gae(rewards, values, next_values, terminations, dones, gamma, lam)


def recv_bootstrap(heads: Heads, chan: TorchDistChannel, terminations: torch.Tensor,
                   dones: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's side of :func:`frugalrl.pipeline.stage0.send_bootstrap`: the value of the last observation and
    those of the truncated steps' final observations (no message when there are none)."""
    last_value = heads.value(cut.decode_cut(chan.recv("activations")))
    if not truncated_steps(terminations, dones).any():
        return last_value, torch.zeros(0)
    return last_value, heads.value(cut.decode_cut(chan.recv("activations")))


def run_stage1(cfg: PipelinePPOConfig, chan: TorchDistChannel) -> None:
    """Stage 1: the heads and the PPO loss; serves stage 0 until the run ends (or stage 0 stops at its target)."""
    hello = chan.recv_json()
    if hello.get("digest") != cfg.digest():
        chan.send_json({"digest": cfg.digest()})
        raise ValueError("the two stages were started with different configs (digest mismatch); "
                         "give both the same flags")
    chan.send_json({"digest": cfg.digest()})
    heads = Heads(int(hello["feature_dim"]), hello["action"], cfg.head_hidden)
    optimizer = torch.optim.Adam(heads.parameters(), lr=cfg.learning_rate, eps=1e-5, foreach=True)
    sample_gen = torch.Generator().manual_seed(cfg.seed + 2)
    order_gen = torch.Generator().manual_seed(cfg.seed + 1)
    sparsifier = sparsify.TopPercentile(cfg.cut_percentile, index=cfg.cut_index, values=cfg.cut_values,
                                        warmup_dtype=cfg.cut_dense_dtype)
    dense_codec = sparsify.DenseCut(cfg.cut_dense_dtype)
    norm_reward = cfg.normalization(hello["action"]["type"] == "box")[1]
    scaler = ReturnScaler(cfg.gamma, cfg.num_envs) if norm_reward else None
    parts: dict[str, Any] = {"heads": heads, "optimizer": optimizer}
    if scaler is not None:
        parts["reward_scaler"] = scaler
    gens = {"sample_gen": sample_gen, "order_gen": order_gen}
    start = int(hello.get("start_iteration", 0))
    if start:
        _load(cfg, start, parts, gens)
        if scaler is not None:
            scaler.episodes_restarted()  # stage 0's envs start new episodes on a resume
    T, N = cfg.num_steps, cfg.num_envs
    n_act = 1 if heads.dist_kind == "categorical" else math.prod(hello["action"]["shape"])
    u_buf = torch.zeros((T, N) if heads.dist_kind == "categorical" else (T, N, n_act))
    logp_buf, value_buf = torch.zeros(T, N), torch.zeros(T, N)
    for iteration in range(start + 1, cfg.iterations + 1):
        optimizer.param_groups[0]["lr"] = cfg.lr_at(iteration, cfg.iterations)
        for t in range(T):
            features = cut.decode_cut(chan.recv("activations"))
            with torch.no_grad():
                params = heads.dist_params(features)
                u = dists.sample(heads.dist_kind, params, generator=sample_gen)
                chan.send(cut.encode_dense(heads.env_action(u).reshape(N, -1), "fp32"), "actions")
                # while stage 0 steps its envs: what only the update needs
                logp_buf[t] = dists.log_prob(heads.dist_kind, params, u)
                value_buf[t] = heads.value(features)
            u_buf[t] = u
        rtd = cut.decode_cut(chan.recv("rewards")).reshape(T, N, 3)  # stage0.send_rewards
        reward_buf, term_buf, done_buf = (rtd[..., i].contiguous() for i in range(3))
        with torch.no_grad():
            last_value, final_values = recv_bootstrap(heads, chan, term_buf, done_buf)
            rewards = reward_buf
            if scaler is not None:
                rewards = torch.from_numpy(scaler.scale(reward_buf.numpy(), done_buf.numpy() > 0))
            advantages, returns = rollout_targets(rewards, value_buf, last_value, final_values, term_buf, done_buf,
                                                  cfg.gamma, cfg.gae_lambda)
        b_u = u_buf.reshape(T * N, *u_buf.shape[2:])
        b_logp, b_adv = logp_buf.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), value_buf.reshape(-1)
        dense = is_dense_update(cfg, iteration * T * N)
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
                out = ppo_loss(
                    cfg, cfg.ent_coef, cfg.vf_coef,
                    new_logp=dists.log_prob(heads.dist_kind, params, b_u[mb]), old_logp=b_logp[mb],
                    advantages=b_adv[mb], entropy=dists.entropy(heads.dist_kind, params),
                    new_value=heads.value(features), old_value=b_values[mb], returns=b_returns[mb],
                    clip_coef=cfg.clip_at(iteration, cfg.iterations),
                )
                clipfracs.append(out.clipfrac)
                optimizer.zero_grad()
                out.loss.backward()
                grad = features.grad
                assert grad is not None
                if cfg.cut == "dense":
                    msg = dense_codec.encode(grad)
                else:
                    if cfg.cut_accumulate == "none":
                        sparsifier.reset()
                    keys = mb if cfg.cut_accumulate == "sample" else None
                    msg = sparsifier.encode(grad, keys=keys, dense=dense)
                    densities.append(1.0 if sparsifier.last_dense else sparsifier.last_nnz / grad.numel())
                chan.send(msg, "gradients")
                # the heads' step runs while stage 0 backpropagates the cut gradient
                nn.utils.clip_grad_norm_(heads.parameters(), cfg.max_grad_norm)
                optimizer.step()
        stats = [out.policy.item(), out.value.item(), out.entropy.item(), out.approx_kl.item(),
                 float(np.mean(clipfracs)), explained_variance(b_values, b_returns),
                 float(np.mean(densities)) if densities else 1.0,
                 float(sparsifier.residual().norm()) if cfg.cut == "topk" and sparsifier.steps else 0.0]
        chan.send(cut.encode_dense(np.asarray(stats, dtype=np.float32), "fp32"), "control")
        if cfg.evaluates_after(iteration, cfg.iterations):
            _serve_eval(heads, chan)
        control = chan.recv_json()  # stage 0's driver ends the run (its target, a callback) and checkpoints it
        stop = bool(control["stop"])
        if control.get("checkpoint") and not stop:
            _save(cfg, iteration, hello, parts, gens)
        if stop:
            iteration_done = iteration
            break
    else:
        iteration_done = cfg.iterations
    # Each stage keeps its own half: the heads stay on stage 1's machine (nothing extra on the wire).
    _save(cfg, iteration_done, hello, parts, gens)


def _serve_eval(heads: Heads, chan: TorchDistChannel) -> None:
    """Stage 1's side of an evaluation (:func:`frugalrl.pipeline.stage0._evaluate`): the mode of the heads'
    distribution for every row of features, until a message of no rows."""
    while True:
        features = cut.decode_cut(chan.recv("activations"))
        if features.shape[0] == 0:
            return
        with torch.no_grad():
            action = heads.env_action(dists.mode(heads.dist_kind, heads.dist_params(features)))
        chan.send(cut.encode_dense(action.reshape(features.shape[0], -1), "fp32"), "actions")


def _save(cfg: PipelinePPOConfig, iteration: int, hello: dict[str, Any], parts: dict[str, Any],
          gens: dict[str, torch.Generator]) -> None:
    payload = {"iteration": iteration, "feature_dim": int(hello["feature_dim"]), "action": hello["action"],
               "head_hidden": cfg.head_hidden, **{k: v.state_dict() for k, v in parts.items()},
               **{k: g.get_state() for k, g in gens.items()}}
    path = stage1_dir(cfg) / "checkpoints"
    path.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(payload, buf)
    write_atomic(path / HEADS_CHECKPOINT, buf.getvalue())


def _load(cfg: PipelinePPOConfig, iteration: int, parts: dict[str, Any], gens: dict[str, torch.Generator]) -> None:
    path = stage1_dir(cfg) / "checkpoints" / HEADS_CHECKPOINT
    if not path.exists():
        raise ValueError(f"stage 0 resumes at iteration {iteration} but stage 1 has no checkpoint at {path}")
    payload = read_torch_file(path)
    if payload["iteration"] != iteration:
        raise ValueError(f"stage 0 resumes at iteration {iteration} but stage 1's checkpoint ({path}) is at "
                         f"iteration {payload['iteration']}")
    for name, part in parts.items():
        part.load_state_dict(payload[name])
    for name, gen in gens.items():
        gen.set_state(payload[name])
