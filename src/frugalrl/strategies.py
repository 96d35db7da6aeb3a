"""The Monitor's strategies: small dataclasses with ``update(indicators, step) -> change | None``.

AcceRL's (Zhang 2022, section 2.4): :class:`PrecisionLadder` (more bits when KL max exceeds ε; Fig. 6),
:class:`AlphaMix` (probability of acting with the small network, linear in KL mean; Fig. 9) and
:class:`SparsitySchedule` (conservative pruning when the reward gap exceeds a threshold; Fig. 7). Ours:
:class:`CompressionGuard`, the default when actors are compressed: it backs the compression off, one step
at a time, when the actors' return is significantly below the learner's sampling return, and says so.
A change is a dict such as ``{"precision": "fp16"}`` or ``{"sparsity": 0.2}`` that
:meth:`frugalrl.compress.chain.CompressorChain.configure` applies to the next build.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from frugalrl.compress.runtime import Precision, check_precision

logger = logging.getLogger("frugalrl.monitor")

Change = dict[str, Any]




class Strategy:
    """Base class: reads indicators, keeps its current setting, returns a change or None.

    ``indicators`` names the indicator keys a strategy reads (recorded with each event).
    """

    indicators: tuple[str, ...] = ()

    def update(self, indicators: dict[str, Any], step: int) -> Change | None:
        """The change to apply at ``step`` (e.g. ``{"precision": "fp16"}``), or None."""
        raise NotImplementedError

    def setting(self) -> Change:
        """The current setting, in the same form as a change."""
        raise NotImplementedError

    def describe(self) -> str:
        """Short name for logs."""
        return type(self).__name__

    def notes(self) -> list[dict[str, Any]]:
        """Warnings the strategy gave (``{step, message}``): what a run's summary lists (none by default)."""
        return []


def _indicator(indicators: dict[str, Any], key: str) -> float | None:
    v = indicators.get(key)
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


@dataclass
class PrecisionLadder(Strategy):
    """Move one rung up the ladder (more bits) when KL max > ``epsilon`` for ``patience`` checks in a row.

    AcceRL Fig. 6: with ``epsilon=14.0`` the actor switches from 8 to 16 bits. The ladder only goes
    up; at the top rung nothing more happens. ``current`` defaults to the bottom rung.
    """

    epsilon: float
    ladder: tuple[Precision, ...] = ("int8", "fp16", "fp32")
    patience: int = 1
    current: Precision | None = None
    streak: int = field(default=0, init=False)
    indicators = ("kl_max",)

    def __post_init__(self) -> None:
        self.ladder = tuple(check_precision(p) for p in self.ladder)
        if not self.ladder:
            raise ValueError("PrecisionLadder needs a non-empty ladder")
        if int(self.patience) < 1:
            raise ValueError(f"PrecisionLadder needs patience >= 1, got {self.patience}")
        if self.current is None:
            self.current = self.ladder[0]
        if self.current not in self.ladder:
            raise ValueError(f"current precision {self.current!r} is not on the ladder {self.ladder}")

    @property
    def at_top(self) -> bool:
        """True when the current rung is the last (most bits)."""
        return self.ladder.index(self.current) == len(self.ladder) - 1

    def update(self, indicators: dict[str, Any], step: int) -> Change | None:
        """``{"precision": next_rung}`` after ``patience`` consecutive checks with KL max > epsilon."""
        kl_max = _indicator(indicators, "kl_max")
        if kl_max is None:
            return None
        self.streak = self.streak + 1 if kl_max > self.epsilon else 0
        if self.streak < self.patience or self.at_top:
            return None
        self.current = self.ladder[self.ladder.index(self.current) + 1]
        self.streak = 0
        return {"precision": self.current}

    def setting(self) -> Change:
        """``{"precision": current}``."""
        return {"precision": self.current}

    def describe(self) -> str:
        """``precision_ladder(eps=..., ladder, patience)``."""
        return f"precision_ladder(eps={self.epsilon:g}, {'>'.join(self.ladder)}, patience={self.patience})"


@dataclass
class AlphaMix(Strategy):
    """Probability ``alpha`` that an actor uses the small network, linear in KL mean (AcceRL Fig. 9).

    ``alpha = 1`` for ``kl_mean <= kl_low``, ``0`` for ``kl_mean >= kl_high``, linear in between. A
    change is emitted only when the target moved by more than ``tolerance`` from the current alpha,
    or reaches 0 or 1 exactly (so the ends are always reached).
    """

    kl_low: float
    kl_high: float
    tolerance: float = 0.05
    alpha: float = 1.0
    indicators = ("kl_mean",)

    def __post_init__(self) -> None:
        if not self.kl_high > self.kl_low:
            raise ValueError(f"AlphaMix needs kl_high > kl_low, got {self.kl_low} and {self.kl_high}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")

    def target(self, kl_mean: float) -> float:
        """The alpha that ``kl_mean`` calls for."""
        frac = (self.kl_high - kl_mean) / (self.kl_high - self.kl_low)
        return float(min(1.0, max(0.0, frac)))

    def update(self, indicators: dict[str, Any], step: int) -> Change | None:
        """``{"alpha": new}`` when the target alpha moved enough from the current one."""
        kl_mean = _indicator(indicators, "kl_mean")
        if kl_mean is None:
            return None
        new = self.target(kl_mean)
        moved = abs(new - self.alpha)
        if moved > self.tolerance or (new in (0.0, 1.0) and moved > 0):
            self.alpha = new
            return {"alpha": new}
        return None

    def setting(self) -> Change:
        """``{"alpha": alpha}``."""
        return {"alpha": self.alpha}

    def describe(self) -> str:
        """``alpha_mix(kl_low..kl_high)``."""
        return f"alpha_mix(kl {self.kl_low:g}..{self.kl_high:g})"


@dataclass
class SparsitySchedule(Strategy):
    """Pruning sparsity from a step schedule, capped at ``conservative`` once the reward gap is too big.

    The scheduled sparsity is ``initial`` until the first ``(step, sparsity)`` entry of ``schedule``
    whose step has been reached, then that entry's sparsity, and so on. When the reward gap exceeds
    ``gap_threshold`` the sparsity becomes ``min(scheduled, conservative)`` (AcceRL Fig. 7: 0.5 -> 0.2
    when the gap > 10). With ``latch=True`` (default) the conservative cap stays once triggered;
    otherwise it is lifted when the gap falls back to the threshold or below.
    """

    initial: float = 0.5
    conservative: float = 0.2
    gap_threshold: float = 10.0
    schedule: Sequence[tuple[int, float]] = ()
    latch: bool = True
    current: float = field(init=False)
    triggered: bool = field(default=False, init=False)
    indicators = ("reward_gap",)

    def __post_init__(self) -> None:
        self.schedule = tuple(sorted((int(s), float(v)) for s, v in self.schedule))
        for v in (self.initial, self.conservative, *(v for _, v in self.schedule)):
            if not 0.0 <= v < 1.0:
                raise ValueError(f"sparsity must be in [0, 1), got {v}")
        self.current = float(self.initial)

    def scheduled(self, step: int) -> float:
        """The sparsity the step schedule gives at ``step`` (ignoring the reward gap)."""
        value = float(self.initial)
        for s, v in self.schedule:
            if step >= s:
                value = v
        return value

    def update(self, indicators: dict[str, Any], step: int) -> Change | None:
        """``{"sparsity": new}`` when the schedule or the reward gap changes the sparsity."""
        gap = _indicator(indicators, "reward_gap")
        if gap is not None:
            if gap > self.gap_threshold:
                self.triggered = True
            elif not self.latch:
                self.triggered = False
        target = self.scheduled(step)
        if self.triggered:
            target = min(target, float(self.conservative))
        if target == self.current:
            return None
        self.current = target
        return {"sparsity": target}

    def setting(self) -> Change:
        """``{"sparsity": current}``."""
        return {"sparsity": self.current}

    def describe(self) -> str:
        """``sparsity(initial->conservative if gap > threshold)``."""
        return f"sparsity({self.initial:g}->{self.conservative:g} if gap > {self.gap_threshold:g})"


@dataclass
class CompressionGuard(Strategy):
    """Backs the compression off, one step at a time, when the compressed actors score significantly below the
    learner's sampling policy, and says so (the default strategy of a compressed IMPALA run).

    A check counts against the compression when the reward gap (the learner's stochastic evaluation minus the
    actors' recent training episodes: both sample their actions) is at least ``z`` standard errors
    (``reward_gap_z``) and at least ``min_relative`` of the return's scale ``max(1, |reference|, |actors|)``,
    and the compression's own error (``compression_kl``: KL between the actor and the snapshot it was built
    from, when known) is at least ``min_kl``: actors that lag a fast-learning learner show a gap too, but the
    compression is not what to back off then (docs/accerl.md#the-parts).
    After ``patience`` such checks in a row it takes one step back: pruning sparsity down to ``conservative``
    (when the chain prunes harder), then precision one rung up (``int8 → fp16 → fp32``). Each step is a warning
    on the ``frugalrl.monitor`` logger and an entry of :meth:`notes`; when nothing is left to back off, one
    last note says that the gap is not the compression's (stale actors, or a learner the actors cannot follow).
    Checks without a fresh gap (no evaluation since the last one) leave the count as it is.
    """

    z: float = 3.0
    patience: int = 2
    min_relative: float = 0.1
    min_kl: float = 0.01
    precision: Precision | None = None
    sparsity: float | None = None
    conservative: float = 0.2
    ladder: tuple[Precision, ...] = ("int8", "fp16", "fp32")
    streak: int = field(default=0, init=False)
    exhausted: bool = field(default=False, init=False)
    _notes: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False)
    indicators = ("reward_gap", "reward_gap_z", "reference_return", "reward_mean", "compression_kl")

    def __post_init__(self) -> None:
        if int(self.patience) < 1 or not self.z >= 0 or not self.min_relative >= 0:
            raise ValueError(f"CompressionGuard needs patience >= 1, z >= 0 and min_relative >= 0, got {self}")
        if self.precision is not None:
            self.precision = check_precision(self.precision)

    def update(self, indicators: dict[str, Any], step: int) -> Change | None:
        """One step back after ``patience`` failing checks in a row (see the class docstring)."""
        gap, z = _indicator(indicators, "reward_gap"), _indicator(indicators, "reward_gap_z")
        ref, actors = _indicator(indicators, "reference_return"), _indicator(indicators, "reward_mean")
        if gap is None or z is None or ref is None or actors is None:
            return None
        scale = max(1.0, abs(ref), abs(actors))
        error = _indicator(indicators, "compression_kl")
        lossy = error is None or error >= self.min_kl
        self.streak = self.streak + 1 if z >= self.z and gap >= self.min_relative * scale and lossy else 0
        if self.streak < self.patience or self.exhausted:
            return None
        self.streak = 0
        change = self._back_off()
        what = (f"the compressed actors score {actors:.1f} where the learner sampling its actions scores {ref:.1f} "
                f"(gap {gap:.1f}, {z:.1f} standard errors, {self.patience} checks in a row)")
        if change is None:
            self.exhausted = True
            message = f"{what}; no compression left to back off: the actors lag the learner for another reason"
        else:
            message = f"{what}: backing the compression off to {change}"
        logger.warning("step %d: %s", step, message)
        self._notes.append({"step": int(step), "message": message})
        return change

    def _back_off(self) -> Change | None:
        if self.sparsity is not None and self.sparsity > self.conservative:
            self.sparsity = float(self.conservative)
            return {"sparsity": self.sparsity}
        if self.precision in self.ladder and self.ladder.index(self.precision) < len(self.ladder) - 1:
            self.precision = self.ladder[self.ladder.index(self.precision) + 1]
            return {"precision": self.precision}
        return None

    def setting(self) -> Change:
        """The current sparsity and precision (those the chain has)."""
        return {k: v for k, v in (("sparsity", self.sparsity), ("precision", self.precision)) if v is not None}

    def notes(self) -> list[dict[str, Any]]:
        """``{step, message}`` of every warning this guard gave."""
        return list(self._notes)

    def describe(self) -> str:
        """``guard(z=…, patience=…)``."""
        return f"guard(z={self.z:g}, patience={self.patience})"
