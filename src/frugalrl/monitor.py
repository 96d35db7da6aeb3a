"""AcceRL's Monitor: indicators on the compressed actor, and strategies that change the compression.

Actors run a compressed copy of the learner's policy. The Monitor (AcceRL, Zhang 2022, section 2.4) watches how far
that copy has drifted and adjusts the compression (the maths: docs/accerl.md):

- indicators, plain functions of real policies and states: :func:`kl_indicators` (mean, max and variance of the
  per-state KL(learner ‖ actor) on recent states, and the actor's entropy there; eq. 5 of the paper) and
  :class:`RewardGap` (the learner's *stochastic* evaluation since the last check minus the actors' recent
  episode returns, and that gap in standard errors: the actors sample too, so like is compared with like);
- strategies, small dataclasses with ``update(indicators, step) -> change | None`` in :mod:`frugalrl.strategies`:
  the paper's :class:`PrecisionLadder` (Fig. 6), :class:`AlphaMix` (Fig. 9) and :class:`SparsitySchedule`
  (Fig. 7), and :class:`CompressionGuard` (ours, the default of a compressed run), which backs the compression off
  when the actors score significantly below the learner's sampling policy.

:class:`Monitor` computes the indicators, runs the strategies, records history and events and logs every change.
:class:`MixPolicy` is the alpha-mix actor agent of Fig. 9.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from frugalrl import dists
from frugalrl.compress.runtime import PRECISIONS, check_precision
from frugalrl.nets import ActorCritic, PolicySpec, as_agent, build_policy
from frugalrl.strategies import (
    AlphaMix,
    Change,
    CompressionGuard,
    PrecisionLadder,
    SparsitySchedule,
    Strategy,
)

logger = logging.getLogger("frugalrl.monitor")


# --------------------------------------------------------------------------------------------------
# Indicators
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KLIndicators:
    """KL(learner ‖ actor) statistics over a batch of states, and the actor's mean entropy there.

    ``kl_var`` is the population variance (no Bessel correction; 0 for a single state).
    """

    kl_mean: float
    kl_max: float
    kl_var: float
    entropy: float
    n_states: int

    def to_dict(self) -> dict[str, float]:
        """The four indicators as a plain dict (``n_states`` left out)."""
        d = asdict(self)
        d.pop("n_states")
        return d


def _as_obs(observations: torch.Tensor | np.ndarray | Sequence[Any]) -> torch.Tensor:
    obs = (
        torch.as_tensor(np.asarray(observations))
        if not isinstance(observations, torch.Tensor)
        else observations
    )
    if obs.ndim == 0 or obs.shape[0] == 0:
        raise ValueError(f"need a non-empty batch of observations, got shape {tuple(obs.shape)}")
    return obs


def per_state_kl(
    learner: ActorCritic, actor: ActorCritic, observations: torch.Tensor | np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-state KL(learner ‖ actor) and the actor's per-state entropy, both shape ``(batch,)``."""
    if learner.dist_kind != actor.dist_kind:
        raise ValueError(
            f"learner is {learner.dist_kind!r} but actor is {actor.dist_kind!r}; KL is undefined"
        )
    obs = _as_obs(observations)
    with torch.inference_mode():
        p = learner.dist_params(obs).float()
        q = actor.dist_params(obs).float()
        return dists.kl(learner.dist_kind, p, q), dists.entropy(actor.dist_kind, q)


def compute_kl_indicators(
    learner: ActorCritic, actor: ActorCritic, observations: torch.Tensor | np.ndarray
) -> KLIndicators:
    """:class:`KLIndicators` of ``actor`` against ``learner`` on ``observations``."""
    kl, ent = per_state_kl(learner, actor, observations)
    kl64, ent64 = kl.double(), ent.double()
    return KLIndicators(
        kl_mean=float(kl64.mean()),
        kl_max=float(kl64.max()),
        kl_var=float(kl64.var(correction=0)),
        entropy=float(ent64.mean()),
        n_states=int(kl.shape[0]),
    )


def kl_indicators(
    learner: ActorCritic, actor: ActorCritic, observations: torch.Tensor | np.ndarray
) -> dict[str, float]:
    """``{"kl_mean", "kl_max", "kl_var", "entropy"}`` of ``actor`` against ``learner`` on recent states."""
    return compute_kl_indicators(learner, actor, observations).to_dict()


@dataclass
class RewardGap:
    """Reference return minus a moving average of the compressed actors' recent episode returns.

    ``window`` episodes are averaged; :meth:`gap` is None until ``min_episodes`` (default: ``window``)
    episodes have been added, or while no reference return is known. A positive gap means the
    compressed actors score worse than the reference (e.g. the evaluated uncompressed learner policy).
    """

    window: int = 10
    min_episodes: int | None = None
    returns: deque[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if int(self.window) < 1:
            raise ValueError(f"RewardGap needs window >= 1, got {self.window}")
        if self.min_episodes is None:
            self.min_episodes = int(self.window)
        if not 1 <= int(self.min_episodes) <= int(self.window):
            raise ValueError(f"RewardGap needs 1 <= min_episodes <= window, got {self.min_episodes}")
        self.returns = deque(maxlen=int(self.window))

    def add(self, episode_returns: Iterable[float]) -> None:
        """Record finished episodes' returns (oldest first)."""
        for r in episode_returns:
            self.returns.append(float(r))

    @property
    def moving_average(self) -> float | None:
        """Mean of the last ``window`` returns, or None before ``min_episodes`` episodes."""
        if len(self.returns) < int(self.min_episodes or self.window):
            return None
        return float(np.mean(self.returns))

    def gap(self, reference_return: float | None) -> float | None:
        """``reference_return - moving_average``, or None if either is unknown."""
        avg = self.moving_average
        if avg is None or reference_return is None:
            return None
        return float(reference_return) - avg

    def z_score(self, reference_return: float | None, reference_std: float | None,
                reference_episodes: int | None) -> float | None:
        """The gap in standard errors of the difference of the two means (reference: ``reference_episodes``
        episodes of standard deviation ``reference_std``); None when a part is unknown. A floor of 1e-3 on the
        standard error keeps two constant returns (CartPole's 500 ± 0) finite."""
        gap = self.gap(reference_return)
        if gap is None or reference_std is None or not reference_episodes:
            return None
        se = math.sqrt(float(reference_std) ** 2 / int(reference_episodes)
                       + float(np.var(self.returns)) / len(self.returns))
        return gap / max(se, 1e-3)


# --------------------------------------------------------------------------------------------------
# Monitor
# --------------------------------------------------------------------------------------------------


class Monitor:
    """Computes the indicators every ``every`` steps, runs the strategies and records what changed.

    ``history`` holds one dict per check (``step`` and every indicator), the last :attr:`HISTORY` of them (a
    days-long run checks millions of times; ``metrics.jsonl`` keeps every one); ``events`` one dict per
    strategy change (``step``, ``strategy``, ``change`` and the triggering ``indicators``). Each change
    is also logged at INFO level on the ``"frugalrl.monitor"`` logger. Episode returns passed to
    :meth:`observe` are always recorded, also on steps where no check runs.
    """

    HISTORY = 1000

    def __init__(self, strategies: Sequence[Strategy], every: int = 1, reward_window: int = 10):
        if int(every) < 1:
            raise ValueError(f"Monitor needs every >= 1, got {every}")
        self.strategies = list(strategies)
        self.every = int(every)
        self.reward_gap = RewardGap(window=reward_window)
        self.history: deque[dict[str, Any]] = deque(maxlen=self.HISTORY)
        self.events: list[dict[str, Any]] = []
        self._last_step: int | None = None

    def settings(self) -> Change:
        """Current settings of all strategies, merged."""
        out: Change = {}
        for s in self.strategies:
            out.update(s.setting())
        return out

    def indicators(
        self,
        learner: ActorCritic,
        actor: ActorCritic,
        observations: torch.Tensor | np.ndarray,
        reference_return: float | None = None,
        reference_std: float | None = None,
        reference_episodes: int | None = None,
        compression_kl: float | None = None,
    ) -> dict[str, Any]:
        """All indicators now: the KL ones, ``reward_mean``, ``reference_return``, ``reward_gap``,
        ``reward_gap_z`` (the gap in standard errors, when the reference's spread is given) and
        ``compression_kl`` (KL between the actor and the snapshot it was compressed from, when given)."""
        ind: dict[str, Any] = kl_indicators(learner, actor, observations)
        ind["reward_mean"] = self.reward_gap.moving_average
        ind["reference_return"] = None if reference_return is None else float(reference_return)
        ind["reward_gap"] = self.reward_gap.gap(reference_return)
        ind["reward_gap_z"] = self.reward_gap.z_score(reference_return, reference_std, reference_episodes)
        ind["compression_kl"] = compression_kl
        return ind

    def observe(
        self,
        step: int,
        learner: ActorCritic,
        actor: ActorCritic,
        observations: torch.Tensor | np.ndarray,
        episode_returns: Iterable[float] = (),
        reference_return: float | None = None,
        reference_std: float | None = None,
        reference_episodes: int | None = None,
        compression_kl: float | None = None,
    ) -> Change:
        """Record returns; if a check is due, compute indicators, run strategies, return merged changes.

        A check is due on the first call and whenever ``step`` is ``every`` or more past the last
        check. Returns ``{}`` when nothing changed or no check was due. When two strategies change
        the same key, the later one in ``strategies`` wins. ``reference_*``: the return the actors' should
        match (a frugalrl run passes its learner's latest stochastic evaluation, made since the last check,
        and None otherwise: like is compared with like, at the same moment). ``compression_kl``: the error the
        compression itself adds (KL between the actor and its snapshot), which tells a compression that hurts
        from actors that only lag a fast-learning learner.
        """
        self.reward_gap.add(episode_returns)
        step = int(step)
        if self._last_step is not None and step - self._last_step < self.every:
            return {}
        self._last_step = step
        ind = self.indicators(learner, actor, observations, reference_return, reference_std, reference_episodes,
                              compression_kl)
        self.history.append({"step": step, **ind})
        merged: Change = {}
        for strategy in self.strategies:
            change = strategy.update(ind, step)
            if not change:
                continue
            trigger = {k: ind.get(k) for k in strategy.indicators}
            self.events.append(
                {"step": step, "strategy": strategy.describe(), "change": dict(change), "indicators": trigger}
            )
            logger.info("step %d: %s changed %s (indicators %s)", step, strategy.describe(), change, trigger)
            merged.update(change)
        return merged

    def notes(self) -> list[dict[str, Any]]:
        """Every strategy's warnings (``{step, message}``), in step order."""
        return sorted((n for s in self.strategies for n in s.notes()), key=lambda n: n["step"])

    def latest(self) -> dict[str, Any]:
        """The indicators of the last check (``{}`` before the first)."""
        return dict(self.history[-1]) if self.history else {}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready record: strategies, current settings, history and events."""
        return {
            "every": self.every,
            "strategies": [s.describe() for s in self.strategies],
            "settings": self.settings(),
            "history": [dict(h) for h in self.history],
            "events": [dict(e) for e in self.events],
            "notes": self.notes(),
        }


# --------------------------------------------------------------------------------------------------
# Alpha-mix actor agent
# --------------------------------------------------------------------------------------------------


def _agent(agent: dict[str, Any] | PolicySpec | nn.Module) -> ActorCritic:
    if isinstance(agent, nn.Module):
        return as_agent(agent)
    return build_policy(agent)


class MixPolicy(ActorCritic):
    """Actor agent that acts with ``small`` with probability ``alpha`` and with ``large`` otherwise.

    AcceRL Fig. 9: each :meth:`dist_params` call draws once (own seedable ``torch.Generator``) and
    returns the chosen network's parameters for the whole batch; :attr:`last_choice` says which.
    :meth:`value` always uses ``large``. ``alpha`` is a buffer, so it travels in the state dict;
    :meth:`set_alpha` changes it in place. ``small`` and ``large`` may be modules or their specs.
    """

    alpha: torch.Tensor
    """Probability of acting with ``small``: a 0-d float32 buffer."""

    def __init__(
        self,
        small: dict[str, Any] | PolicySpec | nn.Module,
        large: dict[str, Any] | PolicySpec | nn.Module,
        alpha: float = 1.0,
        seed: int = 0,
    ):
        super().__init__()
        self.small = _agent(small)
        self.large = _agent(large)
        if self.small.dist_kind != self.large.dist_kind:
            raise ValueError(
                f"MixPolicy needs networks of one distribution kind, got small={self.small.dist_kind!r} "
                f"and large={self.large.dist_kind!r}"
            )
        self.dist_kind = self.large.dist_kind
        self._check_alpha(alpha)
        self.register_buffer("alpha", torch.tensor(float(alpha), dtype=torch.float32))
        self.generator = torch.Generator()
        self.seed = int(seed)
        self.generator.manual_seed(self.seed)
        self.last_choice: str | None = None

    @staticmethod
    def _check_alpha(alpha: float) -> None:
        if not 0.0 <= float(alpha) <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")

    @property
    def spec(self) -> PolicySpec:
        """Rebuilds this mix (with the current alpha) from the two networks' specs."""
        return PolicySpec(
            "frugalrl.monitor:MixPolicy",
            {
                "small": self.small.spec.to_json(),
                "large": self.large.spec.to_json(),
                "alpha": float(self.alpha),
            },
        )

    @spec.setter
    def spec(self, value: PolicySpec) -> None:
        raise AttributeError("MixPolicy.spec is derived from its two networks and alpha; it cannot be set")

    def reseed(self, seed: int) -> None:
        """Restart the network-choice random stream from ``seed``."""
        self.seed = int(seed)
        self.generator.manual_seed(self.seed)

    def set_alpha(self, alpha: float) -> None:
        """Set the probability of using ``small``, in place (the buffer's version is bumped)."""
        self._check_alpha(alpha)
        with torch.no_grad():
            self.alpha.fill_(float(alpha))

    def choose(self) -> ActorCritic:
        """Draw which network acts next: ``small`` with probability ``alpha``."""
        use_small = bool(torch.rand((), generator=self.generator) < self.alpha.float())
        self.last_choice = "small" if use_small else "large"
        return self.small if use_small else self.large

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Distribution parameters of the network drawn for this call."""
        return self.choose().dist_params(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State value from ``large``."""
        return self.large.value(obs)


__all__ = [
    "AlphaMix",
    "CompressionGuard",
    "KLIndicators",
    "MixPolicy",
    "Monitor",
    "PrecisionLadder",
    "RewardGap",
    "SparsitySchedule",
    "Strategy",
    "compute_kl_indicators",
    "kl_indicators",
    "per_state_kl",
]


def parse_monitor(text: str, precision: str | None = None, sparsity: float | None = None,
                  compressing: bool = True) -> Monitor:
    """Build a Monitor from the CLI syntax (``--monitor``); ``''`` or ``none`` gives one with no strategy.

    Words, comma-separated: ``auto`` (a :class:`CompressionGuard` when ``compressing``, else nothing),
    ``guard[:Z[:PATIENCE]]`` (:class:`CompressionGuard`), ``ladder:EPS[:PATIENCE]`` (:class:`PrecisionLadder`),
    ``alpha:LOW:HIGH`` (:class:`AlphaMix`), ``sparsity:INITIAL:CONSERVATIVE:GAP`` (:class:`SparsitySchedule`).
    ``precision`` and ``sparsity`` are the chain's starting settings (the ladder and the guard start there).
    """
    strategies: list[Strategy] = []
    current = check_precision(precision) if precision in PRECISIONS else None
    for word in [w.strip() for w in (text or "").split(",") if w.strip()]:
        name, *args = word.split(":")
        try:
            nums = [float(a) for a in args]
            if name == "none" or (name == "auto" and not compressing):
                continue
            if name in ("auto", "guard"):
                if name == "auto" and nums or len(nums) > 2:
                    raise ValueError("auto takes no values; guard takes at most Z and PATIENCE, e.g. guard:3:2")
                z, patience = (nums + [3.0, 2.0][len(nums):])[:2]
                strategies.append(CompressionGuard(z=z, patience=int(patience), precision=current, sparsity=sparsity,
                                                   conservative=min(0.2, sparsity) if sparsity else 0.2))
            elif name == "ladder":
                if not nums:
                    raise ValueError("ladder needs a KL threshold, e.g. ladder:0.05")
                strategies.append(PrecisionLadder(nums[0], patience=int(nums[1]) if len(nums) > 1 else 1,
                                                  current=current))
            elif name == "alpha":
                if len(nums) != 2:
                    raise ValueError("alpha needs two KL values, e.g. alpha:0.01:0.1")
                strategies.append(AlphaMix(nums[0], nums[1]))
            elif name == "sparsity":
                defaults = [sparsity if sparsity is not None else 0.5, 0.2, 10.0]
                initial, conservative, gap = (nums + defaults[len(nums):])[:3]
                strategies.append(SparsitySchedule(initial, conservative, gap))
            else:
                raise ValueError(f"unknown strategy {name!r}")
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"bad --monitor strategy {word!r}: {e}; expected auto, guard[:Z[:PATIENCE]], ladder:EPS[:PATIENCE], "
                "alpha:LOW:HIGH or sparsity:INITIAL:CONSERVATIVE:GAP"
            ) from e
    return Monitor(strategies)
