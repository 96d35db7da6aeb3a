"""The split model of pipeline PPO: stage 0's encoder (:class:`PixelEncoder` for frames, :class:`VectorEncoder` for
any other Box, flattened), stage 1's :class:`Heads` on the cut features, and :class:`SplitPolicy`, both halves in
one module to act with outside the pipeline (``frugalrl eval``). Built from :mod:`frugalrl.nets`' layers.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from frugalrl.dists import DistKind
from frugalrl.nets import (
    ActorCritic,
    PolicySpec,
    as_chw,
    chw_shape,
    conv_layers,
    image_layout,
    layer_init,
    mlp_layers,
)
from frugalrl.normalize import ObsNormalizer


class PixelEncoder(nn.Module):
    """Stage 0's CNN of the split model: uint8 frames (C, H, W) → flat features (4096 on 4×96×96): the three
    Nature-CNN convolutions without the fully connected layer, as the pipeline paper cuts the network.
    ``channels_last``: the frames (and ``obs_shape``) are (H, W, C), as Gymnasium renders them."""

    def __init__(self, obs_shape: list[int] | tuple[int, ...], channels: list[int] | tuple[int, ...] = (32, 64, 64),
                 channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = channels_last
        layers, self.feature_dim = conv_layers(chw_shape(obs_shape, channels_last), channels)
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Features of a batch of frames."""
        x = obs.float() * (1.0 / 255.0)
        return self.net(as_chw(x, self.channels_last))


class VectorEncoder(nn.Module):
    """Stage 0's MLP of the split model (tanh layers, as CleanRL's PPO trunk) on observations of ``obs_shape``,
    flattened: vectors, and grids or frames too small for the CNN (MinAtar's 10×10 boolean planes)."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: list[int] | tuple[int, ...], obs_norm: bool = False) -> None:
        super().__init__()
        self.obs_ndim = len(obs_shape)
        obs_dim = int(np.prod(obs_shape))
        layers, self.feature_dim = mlp_layers(obs_dim, hidden)
        self.net = nn.Sequential(*layers)
        self.obs_norm = ObsNormalizer((obs_dim,)) if obs_norm else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Features of a batch of observations (flattened, then normalised with ``obs_norm``)."""
        obs = obs.flatten(start_dim=obs.dim() - self.obs_ndim)
        return self.net(obs.float() if self.obs_norm is None else self.obs_norm(obs))


def make_encoder(obs_space: gym.Space, hidden: list[int] | tuple[int, ...],
                 obs_norm: bool = False) -> PixelEncoder | VectorEncoder:
    """The encoder for ``obs_space``: the CNN for uint8 frames ((C, H, W) or (H, W, C): :func:`image_layout`), an MLP
    on any other Box, flattened (with an :class:`~frugalrl.normalize.ObsNormalizer` in front if ``obs_norm``; frames
    are scaled, not normalised)."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"the split model needs a Box observation space, got {obs_space}")
    layout = image_layout(obs_space)
    if layout in ("frames", "frames_last"):
        return PixelEncoder(tuple(obs_space.shape), channels_last=layout == "frames_last")
    return VectorEncoder(tuple(obs_space.shape), list(hidden), obs_norm)


class Heads(nn.Module):
    """Stage 1 of the split model: actor and critic MLPs on the cut features (feature_dim → hidden → out, ReLU).

    Discrete actions: a categorical over logits. Box actions: a Gaussian over an unbounded ``u`` with a
    state-independent log-std; the env action is ``tanh(u)`` rescaled to the box (:meth:`env_action`).
    Log-probabilities are those of ``u`` (the tanh Jacobian cancels in PPO's ratio). Not an
    :class:`ActorCritic`: it acts on features, not observations, and has no spec of its own.
    """

    dist_kind: DistKind
    scale: torch.Tensor
    """Box actions: half the box's width (a buffer)."""
    offset: torch.Tensor
    """Box actions: the box's centre (a buffer)."""

    def __init__(self, feature_dim: int, action: dict[str, Any], hidden: int = 512) -> None:
        super().__init__()
        self.action = action
        self.dist_kind = "categorical" if action["type"] == "discrete" else "gaussian"
        out = int(action["n"]) if action["type"] == "discrete" else int(np.prod(action["shape"]))
        self.actor = nn.Sequential(*mlp_layers(feature_dim, [hidden], nn.ReLU)[0],
                                   layer_init(nn.Linear(hidden, out), std=0.01))
        self.critic = nn.Sequential(*mlp_layers(feature_dim, [hidden], nn.ReLU)[0],
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


class SplitPolicy(ActorCritic):
    """Both halves of the split model in one module, to act with outside the pipeline (``frugalrl eval``).

    ``dist_params``/``value`` are those of the heads on the encoder's features; :meth:`env_action` maps a
    sampled or modal ``u`` to the env's action (tanh squashing for Box actions).
    """

    def __init__(self, obs_space: dict[str, Any], action: dict[str, Any], encoder_hidden: list[int],
                 head_hidden: int, obs_norm: bool = False) -> None:
        super().__init__()
        dtype = np.dtype(obs_space["dtype"])  # the bounds only need to be valid: the encoder goes by shape and dtype
        low, high = (0, 1) if dtype.kind == "b" else (
            (np.iinfo(dtype).min, np.iinfo(dtype).max) if dtype.kind in "ui" else (-np.inf, np.inf))
        space = gym.spaces.Box(low, high, tuple(obs_space["shape"]), dtype=dtype)
        self.encoder = make_encoder(space, encoder_hidden, obs_norm)
        self.heads = Heads(self.encoder.feature_dim, action, head_hidden)
        self.dist_kind = self.heads.dist_kind
        self.spec = PolicySpec("frugalrl.pipeline.model:SplitPolicy", {"obs_space": obs_space, "action": action,
                                                             "encoder_hidden": list(encoder_hidden),
                                                             "head_hidden": int(head_hidden), "obs_norm": obs_norm})

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        """The heads' distribution parameters on the encoder's features."""
        return self.heads.dist_params(self.encoder(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values."""
        return self.heads.value(self.encoder(obs))

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        """The env's action for ``u`` (see :meth:`Heads.env_action`)."""
        return self.heads.env_action(u)


def space_desc(space: gym.Space) -> dict[str, Any]:
    """Shape and dtype of an observation space: what :func:`make_encoder` chooses the encoder by."""
    return {"shape": list(space.shape or ()), "dtype": np.dtype(space.dtype).str}
