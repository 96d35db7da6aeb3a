"""The config of a split-model PPO run (both stages are started with the same one)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

from frugalrl.config import NormConfig, OptimConfig, RunConfig, check_fields
from frugalrl.losses import PPOLossConfig

STAT_NAMES = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance",
              "grad_density", "cut_residual_norm")
"""The loss statistics stage 1 sends to stage 0 after each update (one fp32 vector)."""

CutIndex = Literal["coo16", "bitmask", "gap", "auto"]
CutDtype = Literal["bf16", "fp16", "fp32"]


@dataclass(kw_only=True)
class PipelinePPOConfig(NormConfig, PPOLossConfig, OptimConfig, RunConfig):
    """Every knob of a split-model PPO run. Field names are the CLI flags (``--cut-percentile`` ...).

    The defaults are for any env (PPO's 4 epochs of 4 minibatches, lr annealed, no value clipping): every
    minibatch costs a round trip between the stages, so an iteration has 16, not the paper's 320. The
    paper's CarRacing settings are the preset of the default env (``presets/pipeline_ppo.json``).
    """

    env: str = "frugalrl.envs.carracing:make_car_racing"
    """Gymnasium id or 'module:function' env factory; observations uint8 frames (a CNN) or any other Box (an MLP on
    it, flattened). The default env has a preset (presets/pipeline_ppo.json): the paper's CarRacing settings."""
    total_timesteps: int = 409_600
    """Env steps in all."""
    learning_rate: float = 1e-3
    """Adam step size of both stages, annealed to 0 by default. Higher than PPO's: an iteration has few,
    large minibatches (each one is a round trip between the stages)."""
    anneal_lr: bool = True
    ent_coef: float = 0.0
    clip_vloss: bool = False
    vf_coef: float = 1.0
    """Weight of the value loss (0.5 × squared error): 1.0 is SB3's plain mean squared error at its 0.5."""
    max_grad_norm: float = 0.5
    """Gradient clipping, applied to each stage's parameters separately."""
    num_minibatches: int = 4
    """Minibatches per epoch: each is a round trip between the stages (features 0→1, their gradient back)."""
    update_epochs: int = 4
    num_envs: int = 32
    """Environments stepped by stage 0 (one process, same-step autoreset). Many: each rollout step is a round
    trip between the stages for all of them at once."""
    num_steps: int = 32
    """Steps per env per iteration."""
    head_hidden: int = 64
    """Width of the hidden layer of each head (the paper: 512, which the CarRacing preset sets)."""
    encoder_hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Encoder MLP widths for flat observations (the last one is the cut width)."""
    activations: CutDtype = "bf16"
    """Codec of the features sent 0→1: 'fp32', 'bf16' or 'fp16' (the paper sends them dense)."""
    activations_sparse: bool = False
    """Send only the non-zero features (the CNN's last ReLU makes many exactly zero) with 'auto' index
    coding: lossless with respect to ``activations``, smaller when the features are sparse enough."""
    cut: Literal["dense", "topk"] = "topk"
    """Cut-gradient codec: 'dense' or 'topk' (accumulate, send the entries above the p-th percentile)."""
    cut_percentile: float = 0.9
    """p of the top-percentile rule: the fraction of entries *not* sent each minibatch."""
    cut_index: CutIndex = "auto"
    """Index encoding of sparse gradients: 'coo16' (the paper's int16 coordinates), 'bitmask', 'gap' or 'auto'."""
    cut_values: CutDtype = "bf16"
    """Value dtype of sparse gradients: 'bf16', 'fp16' or 'fp32'."""
    cut_dense_dtype: CutDtype = "fp32"
    """Dtype of dense gradients ('dense' codec, and the warm start of 'topk')."""
    cut_accumulate: Literal["position", "sample", "none"] = "position"
    """'position': one accumulator of the minibatch's shape (the paper); 'sample': each sample's residual
    is replayed when that sample recurs in a later epoch (reset every iteration); 'none': no error feedback,
    the unsent entries are dropped. 'position' is the default: the paper's, and as good as 'sample'
    (why: docs/benchmarks.md#pipeline-suite)."""
    warmup_timesteps: int = 30_000
    """'topk' sends dense gradients while the env steps collected so far are at most this (the paper: 30,000)."""
    dist_backend: Literal["gloo", "nccl"] = "gloo"
    """torch.distributed backend of the two stages."""
    master_addr: str = "127.0.0.1"
    """Address of rank 0's rendezvous (loopback unless the stages run on two machines)."""
    master_port: int = 0
    """Rendezvous port; 0 picks a free one when both stages are spawned here."""
    rank: int | None = None
    """Run only this stage (0 or 1), for two machines; None: spawn both here, or take RANK from torchrun."""
    timeout: float = 600.0
    """Seconds a stage waits for the other before failing."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""
        super().validate()
        check_fields(self, positive_ints=("num_envs", "num_steps", "head_hidden"), positive=("timeout",),
                     nonneg=("warmup_timesteps", "master_port"))
        if not 0 < self.cut_percentile < 1:
            raise ValueError(f"cut_percentile must be in (0, 1), got {self.cut_percentile!r}")
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
        if self.target_kl is not None:
            raise ValueError("target_kl is not supported by pipeline PPO: both stages run every minibatch of "
                             "every epoch (stage 0 cannot see the KL)")

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
        """Hash of everything both stages must agree on (all fields but where and how to connect, and output)."""
        local = {"rank", "master_addr", "master_port", "timeout", "progress", "tensorboard", "log_every_s", "plots",
                 "run_dir", "run_name", "torch_threads"}
        shared = {k: v for k, v in dataclasses.asdict(self).items() if k not in local}
        return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:32]
