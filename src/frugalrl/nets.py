"""Actor-critic networks that can be rebuilt on a worker from a JSON spec.

Agents cross the wire as weights, not code: a worker builds its policy once from a
:class:`PolicySpec` (an importable ``"module:function"`` and JSON keyword arguments) and from
then on only receives tensors. An agent is a ``torch.nn.Module`` with

- ``spec``: a :class:`PolicySpec` that rebuilds an identical module,
- ``dist_kind``: ``"categorical"``, ``"gaussian"``, ``"multi_categorical"`` or ``"bernoulli"``
  (:data:`frugalrl.dists.DistKind`),
- ``dist_params(obs) -> Tensor`` and ``value(obs) -> Tensor``.

:class:`ActorCritic` declares these, and every agent class of frugalrl derives from it, so that
type checkers know what an agent has. At run time the check is duck-typed (:func:`check_agent`):
a user's module with those attributes works without deriving from :class:`ActorCritic`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar, cast, get_args

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from frugalrl import action_heads, dists
from frugalrl.action_heads import action_desc
from frugalrl.config import Net
from frugalrl.dists import DistKind
from frugalrl.lazy import import_string
from frugalrl.normalize import ObsNormalizer


@dataclass(frozen=True)
class PolicySpec:
    """How to build a policy anywhere: ``import_string(factory)(**kwargs)``."""

    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


class ActorCritic(nn.Module):
    """What an agent is: a module with ``spec``, ``dist_kind``, ``dist_params(obs)`` and ``value(obs)``.

    Subclasses set ``spec`` and ``dist_kind`` in ``__init__`` (or define them as properties) and
    implement both methods. Deriving from this class is how frugalrl's own agents say what they are;
    a user's module need not (see :func:`check_agent`), it is then an ``ActorCritic`` by duck typing.
    """

    spec: PolicySpec
    """Rebuilds an identical module anywhere (:func:`build_policy`)."""
    dist_kind: DistKind
    """The action distribution :meth:`dist_params` parameterises (see :mod:`frugalrl.dists`)."""
    exact_tensors: tuple[str, ...] = ()
    """State-dict keys that must travel losslessly whatever the weights codec (running statistics)."""
    value_only: tuple[str, ...] = ()
    """Prefixes of the state-dict keys that only :meth:`value` reads: workers act without them, so weights
    messages leave them out (:func:`acting_state`). Empty: every key travels."""
    max_entropy_log_std: torch.Tensor | None = None
    """Gaussian heads whose actions are clipped to a box: the log of half the box's width per action dimension,
    the most log-std an entropy bonus rewards (:func:`frugalrl.dists.entropy_bonus`); None: no cap."""

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Parameters of the action distribution for each state, shape ``(batch, P)``."""
        raise NotImplementedError

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State value, shape ``(batch,)``."""
        raise NotImplementedError


def acting_state(agent: nn.Module) -> dict[str, torch.Tensor]:
    """The part of ``agent``'s state dict a worker needs to act: all but the keys under its ``value_only``
    prefixes (a separate critic is half of an MLP agent's weights, and no worker ever evaluates it)."""
    drop = tuple(getattr(agent, "value_only", ()))
    return {k: t for k, t in agent.state_dict().items() if not (drop and k.startswith(drop))}


def load_acting_state(agent: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load what :func:`acting_state` gave into ``agent``; a key of it missing or one too many raises
    (``value_only`` keys stay as they are: nothing that acts reads them)."""
    missing, unexpected = agent.load_state_dict(state, strict=False)
    drop = tuple(getattr(agent, "value_only", ()))
    missing = [k for k in missing if not (drop and k.startswith(drop))]
    if missing or unexpected:
        raise KeyError(f"acting state does not fit the policy: missing {missing}, unexpected {list(unexpected)}")


_MOVED = {"frugalrl.nets:SplitPolicy": "frugalrl.pipeline.model:SplitPolicy"}
"""Factories that moved, under the names specs written before the move still carry."""


def build_policy(spec: PolicySpec | dict[str, Any]) -> ActorCritic:
    """Build the module a spec describes (``TypeError`` unless it passes :func:`check_agent`)."""
    if isinstance(spec, dict):
        spec = PolicySpec(**spec)
    module = import_string(_MOVED.get(spec.factory, spec.factory))(**spec.kwargs)
    return as_agent(module)


def as_agent(module: Any) -> ActorCritic:
    """``module`` typed as an :class:`ActorCritic` once :func:`check_agent` accepted it (duck typing)."""
    check_agent(module)
    return cast(ActorCritic, module)


def check_agent(agent: Any) -> None:
    """Raise ``TypeError`` naming what is missing if ``agent`` cannot act on a worker."""
    missing = [a for a in ("spec", "dist_kind", "dist_params") if not hasattr(agent, a)]
    if missing or not isinstance(agent, nn.Module):
        raise TypeError(
            f"{type(agent).__name__} cannot be used as a worker-side agent: it must be a torch.nn.Module "
            f"with 'spec' (a frugalrl.nets.PolicySpec), 'dist_kind' and 'dist_params(obs)'; missing {missing}"
        )


def box_log_half_width(action: dict[str, Any]) -> torch.Tensor:
    """``log((high − low) / 2)`` per dimension of a Box :func:`action_desc` (``inf`` where a bound is infinite)."""
    low = np.asarray(action["low"], dtype=np.float64)
    high = np.asarray(action["high"], dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        half = (high - low) / 2
    half = np.where(np.isfinite(half) & (half > 0), half, np.inf)
    return torch.as_tensor(np.log(half), dtype=torch.float32)


def action_head(action: dict[str, Any]) -> tuple[DistKind, int]:
    """The distribution an actor head parameterises for an :func:`action_desc` and its width
    (:func:`frugalrl.action_heads.action_head`, which workers use without torch)."""
    kind, width = action_heads.action_head(action)
    return cast(DistKind, kind), width


def logit_rows(out: torch.Tensor, nvec: list[int]) -> torch.Tensor:
    """A MultiDiscrete head's ``(..., sum(nvec))`` logits as ``(..., k, max(nvec))`` rows, each padded with
    :data:`frugalrl.dists.PAD_LOGIT` (the ``multi_categorical`` parameters)."""
    m = max(nvec)
    pieces = out.split(list(nvec), dim=-1)
    return torch.stack([nn.functional.pad(p, (0, m - n), value=dists.PAD_LOGIT) for p, n in zip(pieces, nvec,
                                                                                                 strict=True)], dim=-2)


def head_params(kind: DistKind, action: dict[str, Any], out: torch.Tensor,
                log_std: torch.Tensor | None) -> torch.Tensor:
    """Distribution parameters from an actor head's output ``out``: the Gaussian's means with the log-stds, a
    MultiDiscrete head's logits in rows (:func:`logit_rows`), else the logits as they are."""
    if kind == "gaussian":
        assert log_std is not None
        return torch.cat([out, log_std.expand_as(out)], dim=-1)
    if kind == "multi_categorical":
        return logit_rows(out, action["nvec"])
    return out


_Layer = TypeVar("_Layer", nn.Linear, nn.Conv2d)


def layer_init(layer: _Layer, std: float = float(np.sqrt(2)), bias: float = 0.0) -> _Layer:
    """Orthogonal weights and constant bias, as in CleanRL."""
    nn.init.orthogonal_(layer.weight, std)
    if layer.bias is not None:
        nn.init.constant_(layer.bias, bias)
    return layer


# (kernel, stride) of the Nature-CNN's convolutions, in order; a network may use the first 1-3.
NATURE_CONVS = ((8, 4), (4, 2), (3, 1))
# The network of the MinAtar paper (Young & Tian 2019) for its 10×10 grids: one 3×3 convolution of 16 channels,
# stride 1, then a fully connected layer of 128 units.
GRID_CONVS = ((3, 1),)
GRID_CHANNELS = (16,)
GRID_HIDDEN = 128
GRID_MAX = 32
"""The largest side of an (H, W, C) observation that ``make_agent`` treats as a grid (MinAtar's is 10)."""


# ------------------------------------------------------------------ building blocks (every network here)
def mlp_layers(in_dim: int, hidden: list[int] | tuple[int, ...], activation: type[nn.Module] = nn.Tanh,
               ortho_init: bool = True) -> tuple[list[nn.Module], int]:
    """``Linear`` + ``activation`` layers of widths ``hidden`` (orthogonally initialised unless not
    ``ortho_init``), and the output width."""
    layers: list[nn.Module] = []
    width = int(in_dim)
    for h in hidden:
        linear = nn.Linear(width, int(h))
        layers += [layer_init(linear) if ortho_init else linear, activation()]
        width = int(h)
    return layers, width


def chw_shape(obs_shape: list[int] | tuple[int, ...], channels_last: bool) -> list[int]:
    """A frame's shape as the convolutions read it, (C, H, W), from ``obs_shape`` ((H, W, C) if ``channels_last``)."""
    return [*obs_shape[2:], *obs_shape[:2]] if channels_last else list(obs_shape)


def as_chw(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A batch of frames as (N, C, H, W) for the convolutions (a view; (N, H, W, C) if ``channels_last``)."""
    return x.permute(0, 3, 1, 2) if channels_last else x


def conv_layers(obs_shape: list[int] | tuple[int, ...], channels: list[int] | tuple[int, ...],
                convs: list[list[int]] | tuple[tuple[int, int], ...] = NATURE_CONVS) -> tuple[list[nn.Module], int]:
    """Convolutions of ``channels`` output channels with the ``(kernel, stride)`` of ``convs`` (the Nature-CNN's
    first ``len(channels)`` by default; ReLU after each, no padding) on (C, H, W) inputs, flattened, and the number
    of features they give."""
    if len(convs) < len(channels):
        raise ValueError(f"{len(channels)} convolution widths need as many (kernel, stride) pairs, got {list(convs)}")
    layers: list[nn.Module] = []
    width = int(obs_shape[0])
    h, w = (int(s) for s in obs_shape[1:])
    for c, (kernel, stride) in zip(channels, convs, strict=False):
        layers += [layer_init(nn.Conv2d(width, int(c), int(kernel), int(stride))), nn.ReLU()]
        width = int(c)
        h, w = (h - int(kernel)) // int(stride) + 1, (w - int(kernel)) // int(stride) + 1
    if h <= 0 or w <= 0:
        raise ValueError(f"observations {list(obs_shape)} are too small for the convolutions {list(convs)}")
    return [*layers, nn.Flatten()], width * h * w


def copy_obs_norm(src: nn.Module, dst: nn.Module) -> None:
    """Give ``dst`` the observation statistics of ``src`` (a network rebuilt from ``src``'s spec, pruned or
    distilled, must normalise its inputs as ``src`` does)."""
    a, b = getattr(src, "obs_norm", None), getattr(dst, "obs_norm", None)
    if a is not None and b is not None:
        b.load_state_dict(a.state_dict())


Activation = Literal["tanh", "relu"]
ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


SDE_LOG_STD_INIT = -2.0
"""``log_std_init`` of :class:`MLPActorCritic`'s ``sde`` noise matrix when none is given (rl-zoo's gSDE value), in
half-widths of the action box: the matrix starts at ``log_std_init + log((high − low) / 2)``, so one step's σ is about
``e⁻² ‖φ(s)‖`` half-boxes, near 0.5 for the 64 tanh features at the start. A larger start saturates the actor's
features, and the same value in absolute units is too small for wide boxes (why: docs/benchmarks.md#hsa2c-sde-start)."""
SDE_BOX_LOG_LIMIT = math.log(1e3)
"""The most the box moves :data:`SDE_LOG_STD_INIT` either way: a half-width past 1000 (float32's maximum often stands
for an unbounded action) starts as 1000 would (e^86 would overflow the variance), an unbounded one as 1."""
SDE_EPS = 1e-6
"""Added to the variance of :class:`MLPActorCritic`'s ``sde`` noise (SB3's ε): a state whose features are all 0
still has a finite log-probability."""


class MLPActorCritic(ActorCritic):
    """Separate actor and critic MLPs (CleanRL's PPO agent) for flat observations; workers get the actor alone.

    Categorical head for Discrete actions; state-independent log-std Gaussian for Box actions.
    ``activation`` of the hidden layers, ``log_std_init`` (the Gaussian's initial log-std) and ``ortho_init``
    (orthogonal weights, as CleanRL and SB3 by default; False: PyTorch's default initialisation) are the
    options rl-zoo's hyperparameter files set; ``obs_norm`` puts an :class:`ObsNormalizer` in front.

    ``sde`` (Box actions): SB3's gSDE (Raffin et al. 2022). The noise ``φ(s) ε``, the actor's last hidden features
    times a matrix of ``N(0, σ_ij²)`` entries (learned ``log σ``, starting at :data:`SDE_LOG_STD_INIT` half-widths of
    the box), is held for several steps, so exploration is a smooth function of the state; :meth:`sde_act` acts
    with it. One step's action is Gaussian with variance ``Σ_i φ_i(s)² σ_ij²``, which :meth:`dist_params` returns
    (``φ`` detached, as SB3's ``learn_features=False``), so losses and KLs are those of any Gaussian head.
    """

    value_only = ("critic.",)

    def __init__(
        self,
        obs_dim: int,
        action: dict[str, Any],
        hidden: list[int] | tuple[int, ...] = (64, 64),
        activation: Activation = "tanh",
        log_std_init: float | None = None,
        ortho_init: bool = True,
        obs_norm: bool = False,
        sde: bool = False,
    ):
        super().__init__()
        self.obs_dim = int(obs_dim)
        self.action = dict(action)
        self.hidden = [int(h) for h in hidden]
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        if log_std_init is None:
            log_std_init = SDE_LOG_STD_INIT if sde else 0.0
        self.spec = PolicySpec(
            "frugalrl.nets:MLPActorCritic",
            {"obs_dim": self.obs_dim, "action": self.action, "hidden": self.hidden, "activation": activation,
             "log_std_init": float(log_std_init), "ortho_init": bool(ortho_init), "obs_norm": bool(obs_norm),
             **({"sde": True} if sde else {})},
        )
        self.obs_norm = ObsNormalizer((self.obs_dim,)) if obs_norm else None
        if self.obs_norm is not None:
            self.exact_tensors = ("obs_norm.mean", "obs_norm.var", "obs_norm.count")
        self.dist_kind, out = action_head(action)
        if self.dist_kind == "gaussian":
            self.max_entropy_log_std = log_half = box_log_half_width(action)
        if sde and self.dist_kind != "gaussian":
            raise ValueError("sde (state-dependent exploration) needs Box actions")
        self.sde = bool(sde)

        def mlp(last: int, last_std: float) -> nn.Sequential:
            layers, width = mlp_layers(self.obs_dim, self.hidden, ACTIVATIONS[activation], ortho_init)
            head = nn.Linear(width, last)
            return nn.Sequential(*layers, layer_init(head, std=last_std) if ortho_init else head)

        self.critic = mlp(1, 1.0)
        self.actor = mlp(out, 0.01)
        if self.dist_kind == "gaussian":
            shape = (self.hidden[-1], out) if self.sde else (out,)
            log_std = torch.full(shape, float(log_std_init))
            if self.sde:  # in units of each dimension's half box: Pendulum's ±2 torque explores twice as far as ±1
                log_std += log_half.nan_to_num(posinf=0.0).clamp(-SDE_BOX_LOG_LIMIT, SDE_BOX_LOG_LIMIT)
            self.log_std = nn.Parameter(log_std)

    def _inputs(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(obs.shape[0], -1)
        return x.float() if self.obs_norm is None else self.obs_norm(x)

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits, or mean and log-std concatenated (with ``sde``, the log-std of one step's noise ``φ(s) ε``)."""
        if not self.sde:
            return head_params(self.dist_kind, self.action, self.actor(self._inputs(obs)),
                               self.log_std if self.dist_kind == "gaussian" else None)
        return self._sde_params(self.actor[:-1](self._inputs(obs)))

    def _sde_params(self, features: torch.Tensor) -> torch.Tensor:
        """Mean and one step's log-std of ``sde`` from the actor's last hidden features."""
        variance = features.detach().pow(2) @ (2 * self.log_std).exp()
        return torch.cat([self.actor[-1](features), 0.5 * (variance + SDE_EPS).log()], dim=-1)

    def sde_act(self, obs: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`dist_params` and the ``sde`` actions ``mean + φ(s) (ε ⊙ σ)`` for held standard-normal matrices
        ``eps`` (one (features × actions) matrix per state, shape ``(batch, features, actions)``), scaled by the
        current ``σ``; the features are computed once for both."""
        features = self.actor[:-1](self._inputs(obs))
        params = self._sde_params(features)
        noise = torch.einsum("bf,bfa->ba", features, eps * self.log_std.exp())
        return params, dists.mode("gaussian", params) + noise

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State value, shape ``(batch,)``."""
        return self.critic(self._inputs(obs)).squeeze(-1)


class NatureCNNActorCritic(ActorCritic):
    """Nature-CNN trunk (Mnih et al. 2015) with an actor head and a value head.

    The actor is categorical for Discrete actions and, for Box actions (e.g. CarRacing's steering and pedals), a
    Gaussian with a state-independent log-std (``log_std_init``), as :class:`MLPActorCritic`'s.

    ``channels`` are the output channels of the first ``len(channels)`` convolutions (8x8 s4, 4x4 s2,
    3x3 s1, each followed by ReLU); ``hidden`` is the width of the fully connected layer. The default is
    the original network on 4x84x84 frames; smaller ``channels``/``hidden`` give the compressed networks
    of AcceRL's Table 6 (for example ``(16, 32)``, 256). Observations are uint8 frames scaled by ``scale``
    (1/255). ``convs`` replaces the Nature-CNN's (kernel, stride) pairs, and ``channels_last`` takes (H, W, C)
    observations (``obs_shape`` is then (H, W, C) too): :func:`grid_cnn` builds the MinAtar paper's network for
    small grids from them. Pruning, distillation, int8 and ONNX export treat every geometry alike.
    """

    value_only = ("critic.",)

    def __init__(
        self,
        obs_shape: list[int] | tuple[int, ...],
        action: dict[str, Any],
        channels: list[int] | tuple[int, ...] = (32, 64, 64),
        hidden: int = 512,
        convs: list[list[int]] | tuple[tuple[int, int], ...] | None = None,
        channels_last: bool = False,
        scale: float = 1.0 / 255.0,
        log_std_init: float = 0.0,
    ):
        super().__init__()
        self.obs_shape = [int(x) for x in obs_shape]
        self.action = dict(action)
        self.channels = [int(c) for c in channels]
        self.hidden = int(hidden)
        self.convs = [[int(k), int(s)] for k, s in (NATURE_CONVS if convs is None else convs)]
        self.channels_last = bool(channels_last)
        self.scale = float(scale)
        if len(self.obs_shape) != 3:
            raise ValueError(f"NatureCNNActorCritic needs (C, H, W) observations, got shape {self.obs_shape}")
        if not 1 <= len(self.channels) <= len(self.convs):
            raise ValueError(f"channels must list 1 to {len(self.convs)} convolution widths, got {self.channels}")
        kwargs: dict[str, Any] = {"obs_shape": self.obs_shape, "action": self.action, "channels": self.channels,
                                  "hidden": self.hidden}
        if convs is not None or channels_last or self.scale != 1.0 / 255.0:  # the Nature-CNN's spec stays as it was
            kwargs.update(convs=self.convs, channels_last=self.channels_last, scale=self.scale)
        self.dist_kind, out = action_head(action)
        if self.dist_kind == "gaussian":
            self.max_entropy_log_std = box_log_half_width(action)
            if log_std_init != 0.0:
                kwargs["log_std_init"] = float(log_std_init)
        self.spec = PolicySpec("frugalrl.nets:NatureCNNActorCritic", kwargs)
        conv, n_features = conv_layers(chw_shape(self.obs_shape, self.channels_last), self.channels, self.convs)
        self.trunk = nn.Sequential(*conv, layer_init(nn.Linear(n_features, self.hidden)), nn.ReLU())
        self.actor = layer_init(nn.Linear(self.hidden, out), std=0.01)
        self.critic = layer_init(nn.Linear(self.hidden, 1), std=1.0)
        if self.dist_kind == "gaussian":
            self.log_std = nn.Parameter(torch.full((out,), float(log_std_init)))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Trunk output, shape ``(batch, hidden)``."""
        x = obs.float() * self.scale
        return self.trunk(as_chw(x, self.channels_last))

    def _actor_params(self, x: torch.Tensor) -> torch.Tensor:
        return head_params(self.dist_kind, self.action, self.actor(x),
                           self.log_std if self.dist_kind == "gaussian" else None)

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Action logits, or mean and log-std concatenated."""
        return self._actor_params(self.features(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State value, shape ``(batch,)``."""
        return self.critic(self.features(obs)).squeeze(-1)

    def dist_params_and_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both heads from one trunk pass."""
        x = self.features(obs)
        return self._actor_params(x), self.critic(x).squeeze(-1)


def grid_cnn(obs_shape: list[int] | tuple[int, ...], action: dict[str, Any]) -> NatureCNNActorCritic:
    """The MinAtar paper's network (Young & Tian 2019) on (H, W, C) grids: a 3×3 convolution of 16 channels, then
    128 units (:data:`GRID_CONVS`, :data:`GRID_CHANNELS`, :data:`GRID_HIDDEN`); the grid's cells are 0/1."""
    return NatureCNNActorCritic(obs_shape, action, GRID_CHANNELS, GRID_HIDDEN, GRID_CONVS, channels_last=True,
                                scale=1.0)


ImageLayout = Literal["frames", "frames_last", "grid"]


def image_layout(space: gym.Space) -> ImageLayout | None:
    """How a 3-D Box observation is an image, for the Nature-CNN: ``"frames"`` (uint8 (C, H, W), e.g. stacked Atari
    frames) or ``"frames_last"`` (uint8 (H, W, C), e.g. CarRacing's or a raw Atari screen, as Gymnasium renders
    them); for :func:`grid_cnn`, ``"grid"`` (an (H, W, C) grid of at most :data:`GRID_MAX` cells a side, e.g.
    MinAtar's); None (not an image). A frame is at least 36 pixels a side, the least the Nature-CNN takes."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
        return None
    a, b, c = space.shape
    if space.dtype == np.uint8 and a < min(b, c) and min(b, c) >= 36:
        return "frames"
    if space.dtype == np.uint8 and c < min(a, b) and min(a, b) >= 36:
        return "frames_last"
    if c < min(a, b) and GRID_CONVS[0][0] <= min(a, b) and max(a, b) <= GRID_MAX:
        return "grid"
    return None


def make_agent(
    observation_space: gym.Space, action_space: gym.Space, hidden: tuple[int, ...] = (64, 64), net: Net = "auto",
    **mlp_options: Any,
) -> ActorCritic:
    """A default actor-critic for the given single-env spaces.

    ``net="auto"``: the Nature-CNN for uint8 frames ((C, H, W), or (H, W, C) as Gymnasium renders them), the MinAtar
    paper's CNN (:func:`grid_cnn`) for small
    (H, W, C) grids, an MLP otherwise; ``"cnn"`` insists on a CNN (an error for a non-image space), ``"mlp"`` on an
    MLP (on the flattened observation). ``mlp_options``: :class:`MLPActorCritic`'s ``activation``,
    ``log_std_init``, ``ortho_init``, ``obs_norm``.
    """
    if not isinstance(observation_space, gym.spaces.Box):
        raise TypeError(f"frugalrl's agents need a Box observation space, got {observation_space} (envs that frugalrl "
                        "builds flatten Discrete, MultiDiscrete, MultiBinary, Tuple and Dict ones: "
                        "frugalrl.envs.spec.flat_observations(env) does it to an env of your own)")
    if net not in get_args(Net):
        raise ValueError(f"net must be 'auto', 'mlp' or 'cnn', got {net!r}")
    layout = image_layout(observation_space) if net != "mlp" else None
    if net == "cnn" and layout is None:
        raise ValueError(f"net='cnn' needs uint8 frames of at least 36x36 or a small (H, W, C) grid, got shape "
                         f"{observation_space.shape} dtype {observation_space.dtype}")
    if layout in ("frames", "frames_last"):
        return NatureCNNActorCritic(observation_space.shape, action_desc(action_space),
                                    channels_last=layout == "frames_last")
    if layout == "grid":
        return grid_cnn(observation_space.shape, action_desc(action_space))
    return MLPActorCritic(int(np.prod(observation_space.shape)), action_desc(action_space), hidden, **mlp_options)
