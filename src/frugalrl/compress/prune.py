"""Structured pruning (AcceRL, Zhang 2022): delete whole neurons and feature maps.

Unstructured (weight-level) sparsity only pays off on hardware with sparse kernels; AcceRL instead
deletes entire rows and columns of the parameter matrices, so the result is a *smaller dense network*
that is faster on ordinary CPUs and GPUs. Here the pruned network is an instance of the same class as
the original, built through its :class:`~frugalrl.nets.PolicySpec` with reduced widths, so that a
worker can rebuild it from ``spec`` and then receive only its (smaller) weights.

Units are ranked by the L1 norm of their incoming weights (the filter norm for a convolution, as in
Li et al., "Pruning Filters for Efficient ConvNets"), and ``max(1, round((1 - sparsity) * n))`` of
each hidden layer of ``n`` units are kept. The pruned network computes exactly what the original
computes when the removed units' outputs are forced to zero; distillation (:mod:`frugalrl.compress.distill`)
then repairs the rest, which is why AcceRL always follows pruning with distillation.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import TypeVar

import torch
from torch import nn

from frugalrl.compress.base import Artifact, CompressContext, Compressor
from frugalrl.nets import (
    ActorCritic,
    MLPActorCritic,
    NatureCNNActorCritic,
    PolicySpec,
    build_policy,
    copy_obs_norm,
)

SUPPORTED = (MLPActorCritic, NatureCNNActorCritic)


def check_sparsity(sparsity: float) -> float:
    """Return ``sparsity`` as a float; raise ``ValueError`` naming it unless ``0 <= sparsity < 1``."""
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)):
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    s = float(sparsity)
    if not math.isfinite(s) or not 0.0 <= s < 1.0:
        raise ValueError(
            f"sparsity must be in [0, 1) (the fraction of units removed from each hidden layer), got {sparsity!r}"
        )
    return s


def n_kept(n: int, sparsity: float) -> int:
    """How many of ``n`` units a layer keeps: ``max(1, round((1 - sparsity) * n))``."""
    return max(1, round((1.0 - sparsity) * n))


_Agent = TypeVar("_Agent", MLPActorCritic, NatureCNNActorCritic)


def _build_like(agent: _Agent, spec: PolicySpec) -> _Agent:
    """The module ``spec`` builds, checked to be of ``agent``'s class."""
    built = build_policy(spec)
    if not isinstance(built, type(agent)):
        raise TypeError(f"{spec.factory} built a {type(built).__name__}, expected a {type(agent).__name__}")
    return built


def _check_supported(agent: nn.Module) -> None:
    if not isinstance(agent, SUPPORTED):
        names = ", ".join(c.__name__ for c in SUPPORTED)
        raise TypeError(
            f"structured pruning supports {names} (frugalrl.nets) agents only, got {type(agent).__name__}; "
            "distill into a smaller network of your own class instead"
        )


def _top_units(weight: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (ascending) of the ``k`` output units whose incoming weights have the largest L1 norm."""
    norms = weight.detach().abs().reshape(weight.shape[0], -1).sum(dim=1)
    order = torch.argsort(norms, descending=True, stable=True)
    return order[:k].sort().values


def _linear_layers(seq: nn.Sequential) -> list[tuple[str, nn.Linear]]:
    return [(str(i), m) for i, m in enumerate(seq) if isinstance(m, nn.Linear)]


def kept_units(agent: ActorCritic, sparsity: float) -> dict[str, torch.Tensor]:
    """The units :func:`prune_agent` keeps, by layer: ``{"actor.0": indices, "trunk.3": indices, ...}``.

    Keys are the module paths (as in ``named_modules``) of the layers whose *outputs* are pruned:
    every hidden ``Linear`` of an :class:`MLPActorCritic`'s actor and critic, and every ``Conv2d`` plus
    the fully connected hidden layer of a :class:`NatureCNNActorCritic`'s trunk. Output layers (logits,
    value) are never pruned. Indices are sorted ascending, so kept units keep their relative order.
    """
    s = check_sparsity(sparsity)
    _check_supported(agent)
    kept: dict[str, torch.Tensor] = {}
    if isinstance(agent, MLPActorCritic):
        for part in ("actor", "critic"):
            for name, layer in _linear_layers(getattr(agent, part))[:-1]:
                kept[f"{part}.{name}"] = _top_units(layer.weight, n_kept(layer.out_features, s))
    elif isinstance(agent, NatureCNNActorCritic):
        for i, m in enumerate(agent.trunk):
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                kept[f"trunk.{i}"] = _top_units(m.weight, n_kept(m.weight.shape[0], s))
    return kept


@torch.no_grad()
def _copy(dst: nn.Module, src: nn.Module, rows: torch.Tensor | None, cols: torch.Tensor | None) -> None:
    """dst.weight = src.weight[rows][:, cols]; dst.bias = src.bias[rows] (``None``: keep all).

    ``src`` and ``dst`` are layers of one class, ``nn.Linear`` or ``nn.Conv2d``, with a bias.
    """
    if not isinstance(src, (nn.Linear, nn.Conv2d)) or type(dst) is not type(src):
        raise TypeError(f"cannot copy a pruned {type(src).__name__} into a {type(dst).__name__}")
    assert isinstance(dst, (nn.Linear, nn.Conv2d)) and src.bias is not None and dst.bias is not None
    w = src.weight
    if rows is not None:
        w = w.index_select(0, rows)
    if cols is not None:
        w = w.index_select(1, cols)
    dst.weight.copy_(w)
    b = src.bias if rows is None else src.bias.index_select(0, rows)
    dst.bias.copy_(b)


def _prune_mlp(agent: MLPActorCritic, s: float, kept: dict[str, torch.Tensor]) -> MLPActorCritic:
    hidden = [n_kept(h, s) for h in agent.hidden]
    pruned = _build_like(agent, replace(agent.spec, kwargs={**agent.spec.kwargs, "hidden": hidden}))
    for part in ("actor", "critic"):
        src_layers = _linear_layers(getattr(agent, part))
        dst_layers = _linear_layers(getattr(pruned, part))
        cols = None
        for j, ((name, src), (_, dst)) in enumerate(zip(src_layers, dst_layers, strict=True)):
            rows = kept[f"{part}.{name}"] if j < len(src_layers) - 1 else None
            _copy(dst, src, rows, cols)
            cols = rows
    copy_obs_norm(agent, pruned)
    return pruned


def _prune_cnn(agent: NatureCNNActorCritic, s: float, kept: dict[str, torch.Tensor]) -> NatureCNNActorCritic:
    channels = [n_kept(c, s) for c in agent.channels]
    kwargs = {**agent.spec.kwargs, "channels": channels, "hidden": n_kept(agent.hidden, s)}
    pruned = _build_like(agent, replace(agent.spec, kwargs=kwargs))
    cols: torch.Tensor | None = None
    for i, (src, dst) in enumerate(zip(agent.trunk, pruned.trunk, strict=True)):
        if isinstance(src, nn.Conv2d):
            rows = kept[f"trunk.{i}"]
            _copy(dst, src, rows, cols)
            cols = rows
        elif isinstance(src, nn.Linear):
            # The flatten is channel-major: channel c owns columns [c*h*w, (c+1)*h*w).
            assert cols is not None
            hw = src.in_features // agent.channels[-1]
            flat_cols = (cols.unsqueeze(1) * hw + torch.arange(hw, device=cols.device)).reshape(-1)
            rows = kept[f"trunk.{i}"]
            _copy(dst, src, rows, flat_cols)
            cols = rows
    _copy(pruned.actor, agent.actor, None, cols)
    _copy(pruned.critic, agent.critic, None, cols)
    return pruned


def prune_agent(agent: ActorCritic, sparsity: float) -> ActorCritic:
    """A smaller dense copy of ``agent`` with ``sparsity`` of every hidden layer's units removed.

    Supports :class:`~frugalrl.nets.MLPActorCritic` (the actor and critic share the ``hidden`` widths,
    so both keep the same number of units per layer, each choosing its own; ``log_std`` is kept) and
    :class:`~frugalrl.nets.NatureCNNActorCritic` (every convolution's output channels and the fully
    connected width). The result is built from ``agent.spec`` with the reduced widths (so its ``spec``
    rebuilds it anywhere), holds the kept weights, is in eval mode, and lives on ``agent``'s device.
    ``agent`` itself is not modified. Raises ``ValueError`` for a sparsity outside ``[0, 1)`` and
    ``TypeError`` for any other module class.
    """
    s = check_sparsity(sparsity)
    _check_supported(agent)
    kept = kept_units(agent, s)
    src = copy.deepcopy(agent).float().cpu()
    kept = {k: v.cpu() for k, v in kept.items()}
    pruned: ActorCritic
    if isinstance(src, MLPActorCritic):
        pruned = _prune_mlp(src, s, kept)
    elif isinstance(src, NatureCNNActorCritic):
        pruned = _prune_cnn(src, s, kept)
    else:  # pragma: no cover - _check_supported rejected every other class
        raise TypeError(f"cannot prune a {type(src).__name__}")
    if src.dist_kind == "gaussian":  # the state-independent log-std is no layer's: kept as it is
        with torch.no_grad():
            pruned.log_std.copy_(src.log_std)
    try:
        device = next(agent.parameters()).device
    except StopIteration:  # pragma: no cover - both supported classes have parameters
        device = torch.device("cpu")
    pruned.requires_grad_(any(p.requires_grad for p in agent.parameters()))
    return pruned.to(device).eval()


class Prune(Compressor):
    """Chain stage: structured pruning of ``art.module`` (see :func:`prune_agent`).

    ``Prune(0.5)`` halves every hidden width, which removes about three quarters of the inner layers'
    weights. The result keeps the teacher's behaviour only approximately; follow it with ``Distill()``.
    """

    def __init__(self, sparsity: float = 0.5):
        self.sparsity = check_sparsity(sparsity)

    def apply(self, art: Artifact, ctx: CompressContext) -> Artifact:
        """Return an fp32 artifact holding the pruned copy of ``art.module`` (no ONNX graph yet)."""
        return Artifact(module=prune_agent(art.module, self.sparsity))

    def describe(self) -> str:
        """``prune:S``, e.g. ``prune:0.5``."""
        return f"prune:{self.sparsity:g}"


__all__ = ["Prune", "check_sparsity", "kept_units", "n_kept", "prune_agent"]
