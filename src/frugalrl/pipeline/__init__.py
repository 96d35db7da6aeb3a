"""Split-model PPO (Ahmed & Ishigaki's pipeline-parallel PPO): stage 0 (env + encoder) and stage 1 (actor-critic
heads) in two ranks of a ``torch.distributed`` process group (gloo on CPU), exchanging sparse, accumulated
cut gradients.

Stage 0 (rank 0, :mod:`frugalrl.pipeline.stage0`) steps the environments, runs the encoder and owns the run;
stage 1 (rank 1, :mod:`frugalrl.pipeline.stage1`) runs the heads and the PPO loss (:func:`frugalrl.losses.ppo_loss`,
PPO's own). Features cross the cut forward, their gradient backward, through
:class:`~frugalrl.wire.torchdist.TorchDistChannel` (every byte counted); the cut gradient goes through a codec: dense,
or :class:`~frugalrl.wire.sparsify.TopPercentile` (the paper's accumulate-and-send-the-top-(1−p) rule with error
feedback). Every message has a size :mod:`frugalrl.pipeline.bytes` predicts. What crosses when, and where this
departs from the paper: docs/pipeline.md.

Layout: :mod:`~frugalrl.pipeline.config` (:class:`PipelinePPOConfig`), :mod:`~frugalrl.pipeline.stage0`,
:mod:`~frugalrl.pipeline.stage1`, :mod:`~frugalrl.pipeline.launcher` (:func:`train`),
:mod:`~frugalrl.pipeline.model` (the split model), :mod:`~frugalrl.pipeline.bytes` (the byte estimator and
Table I).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from frugalrl.pipeline.config import STAT_NAMES, PipelinePPOConfig
from frugalrl.pipeline.launcher import train

__all__ = ["PipelinePPOConfig", "load_policy", "predict_bytes", "train"]


def predict_bytes(cfg: PipelinePPOConfig, truncations: Sequence[int] = ()) -> dict[str, Any]:
    """The bytes a training run with ``cfg`` will put on the wire (see :func:`frugalrl.pipeline.bytes.predict_run`);
    ``truncations``: the truncated steps of each rollout (a run's ``details.truncation_bootstraps``), whose final
    observations' features also cross the cut.

    Builds one env to learn the cut width and the action size. Evaluation and run-control traffic is not
    included (the summary reports it apart, as ``details.eval_bytes``).
    """
    from frugalrl.nets import action_desc
    from frugalrl.pipeline.bytes import predict_run
    from frugalrl.pipeline.model import make_encoder
    from frugalrl.pipeline.stage0 import check_spaces, handshake

    obs_space, act_space = check_spaces(cfg)
    feature_dim = make_encoder(obs_space, cfg.encoder_hidden).feature_dim
    hello = json.dumps(handshake(cfg, feature_dim, act_space), sort_keys=True).encode()
    reply = json.dumps({"digest": cfg.digest()}, sort_keys=True).encode()
    desc = action_desc(act_space)
    action_dim = 1 if desc["type"] == "discrete" else math.prod(desc["shape"])
    return predict_run(cfg, feature_dim, action_dim, (len(hello), len(reply)), len(STAT_NAMES), truncations)


def load_policy(run_dir: str | Path) -> tuple[Any, dict[str, Any]]:
    """Both halves of a pipeline run as one :class:`~frugalrl.pipeline.model.SplitPolicy` (stage 0's encoder from
    ``latest.pt``, stage 1's heads from ``heads.pt``), and stage 0's counters."""
    from frugalrl.config import config_from_dict
    from frugalrl.pipeline.model import SplitPolicy, space_desc
    from frugalrl.pipeline.stage0 import check_spaces
    from frugalrl.pipeline.stage1 import HEADS_CHECKPOINT
    from frugalrl.runs import read_checkpoint, read_config, read_torch_file

    cfg = config_from_dict(PipelinePPOConfig, read_config(run_dir), where=f"{run_dir}/config.json")
    payload = read_checkpoint(run_dir)
    heads_path = Path(run_dir) / "checkpoints" / HEADS_CHECKPOINT
    if not heads_path.exists():
        raise FileNotFoundError(f"no {HEADS_CHECKPOINT} in {run_dir}/checkpoints: stage 1 ran on another machine? "
                                "copy its checkpoints/heads.pt here")
    heads = read_torch_file(heads_path)
    obs_space, _ = check_spaces(cfg)
    obs_norm = "obs_norm.mean" in payload["parts"]["encoder"]
    policy = SplitPolicy(space_desc(obs_space), heads["action"], list(cfg.encoder_hidden), int(heads["head_hidden"]),
                         obs_norm)
    policy.encoder.load_state_dict(payload["parts"]["encoder"])
    policy.heads.load_state_dict(heads["heads"])
    policy.eval()
    return policy, payload["counters"]
