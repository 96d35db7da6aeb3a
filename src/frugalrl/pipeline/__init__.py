"""Split-model PPO (Ahmed & Ishigaki's pipeline-parallel PPO): stage 0 (env + encoder) and stage 1 (actor-critic
heads) in two ranks of a ``torch.distributed`` process group (gloo on CPU), exchanging sparse, accumulated
cut gradients.

- **stage 0** (rank 0, :mod:`frugalrl.pipeline.stage0`) steps the environments and runs the encoder (the
  paper's CNN: Conv(4→32, 8, s4), Conv(32→64, 4, s2), Conv(64→64, 3, s1), ReLU after each, 4096 features on
  4×96×96 frames; an MLP for vector observations); it owns the run (:class:`~frugalrl.training.Training`);
- **stage 1** (rank 1, :mod:`frugalrl.pipeline.stage1`) runs the heads (4096→512→action, 4096→512→1; a
  tanh-squashed Gaussian for Box actions, a categorical for Discrete ones) and the PPO loss
  (:func:`frugalrl.losses.ppo_loss`, the same as PPO's). Encoder and heads are :mod:`frugalrl.nets`'s.

What crosses the cut, through :class:`~frugalrl.wire.torchdist.DistChannel` (every byte counted)::

    rollout, every step      features 0→1 (``activations``), actions 1→0, rewards and done flags 0→1
    rollout, end             features of the last observation 0→1 (to bootstrap the value)
    update, every minibatch  features 0→1 with the encoder's graph kept on stage 0, then the gradient of
                             the loss with respect to them 1→0 (``gradients``), which stage 0 backpropagates
                             through the encoder
    update, end              a vector of loss statistics 1→0 (``control``)

The cut gradient goes through a codec: dense (fp32 / bf16 / fp16), or :class:`~frugalrl.wire.sparsify.
TopPercentile`, the paper's accumulate-and-send-the-top-(1−p) rule with error feedback (eq. 3–6), dense
during a warm start. Every message has a size :mod:`frugalrl.pipeline.bytes` predicts.

Differences from the paper, and why: gradient clipping (max norm 0.5) is applied per stage, since a global
norm would need one more exchange per minibatch; a finished episode (terminated *or* truncated) is not
bootstrapped, as in CleanRL's PPO; the top-(1−p) set is taken with ``topk`` so that exactly
``numel − ⌊p·numel⌋`` entries are sent (identical to |G| ≥ quantile(|G|, p) without ties, and it keeps
message sizes predictable).

Layout: :mod:`~frugalrl.pipeline.config` (:class:`PipelinePPOConfig`), :mod:`~frugalrl.pipeline.stage0`,
:mod:`~frugalrl.pipeline.stage1`, :mod:`~frugalrl.pipeline.launcher` (:func:`train`),
:mod:`~frugalrl.pipeline.bytes` (the byte estimator and Table I).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from frugalrl.pipeline.config import STAT_NAMES, PipelinePPOConfig
from frugalrl.pipeline.launcher import train

__all__ = ["PipelinePPOConfig", "load_policy", "predict_bytes", "train"]


def predict_bytes(cfg: PipelinePPOConfig) -> dict[str, Any]:
    """The bytes a training run with ``cfg`` will put on the wire (see :func:`frugalrl.pipeline.bytes.predict_run`).

    Builds one env to learn the cut width and the action size. Evaluation traffic is not included
    (the summary reports it apart, as ``details.eval_bytes``).
    """
    from frugalrl.nets import action_desc, make_encoder
    from frugalrl.pipeline.bytes import predict_run
    from frugalrl.pipeline.stage0 import check_spaces, handshake

    obs_space, act_space = check_spaces(cfg)
    feature_dim = make_encoder(obs_space, cfg.encoder_hidden).feature_dim
    hello = json.dumps(handshake(cfg, feature_dim, act_space), sort_keys=True).encode()
    reply = json.dumps({"digest": cfg.digest()}, sort_keys=True).encode()
    desc = action_desc(act_space)
    action_dim = 1 if desc["type"] == "discrete" else math.prod(desc["shape"])
    return predict_run(cfg, feature_dim, action_dim, (len(hello), len(reply)), stats_len=len(STAT_NAMES))


def load_policy(run_dir: str | Path) -> tuple[Any, dict[str, Any]]:
    """Both halves of a pipeline run as one :class:`~frugalrl.nets.SplitPolicy` (stage 0's encoder from
    ``latest.pt``, stage 1's heads from ``heads.pt``), and stage 0's counters."""
    import torch

    from frugalrl.config import config_from_dict
    from frugalrl.nets import SplitPolicy, space_desc
    from frugalrl.pipeline.stage0 import check_spaces
    from frugalrl.pipeline.stage1 import HEADS_CHECKPOINT
    from frugalrl.runs import read_checkpoint, read_config

    cfg = config_from_dict(PipelinePPOConfig, read_config(run_dir), where=f"{run_dir}/config.json")
    payload = read_checkpoint(run_dir)
    heads_path = Path(run_dir) / "checkpoints" / HEADS_CHECKPOINT
    if not heads_path.exists():
        raise FileNotFoundError(f"no {HEADS_CHECKPOINT} in {run_dir}/checkpoints: stage 1 ran on another machine? "
                                "copy its checkpoints/heads.pt here")
    heads = torch.load(heads_path, map_location="cpu", weights_only=True)
    obs_space, _ = check_spaces(cfg)
    obs_norm = "obs_norm.mean" in payload["parts"]["encoder"]
    policy = SplitPolicy(space_desc(obs_space), heads["action"], list(cfg.encoder_hidden), int(heads["head_hidden"]),
                         obs_norm)
    policy.encoder.load_state_dict(payload["parts"]["encoder"])
    policy.heads.load_state_dict(heads["heads"])
    policy.eval()
    return policy, payload["counters"]
