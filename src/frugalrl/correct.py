"""AcceRL's Corrector chain (Zhang 2022, section 2.3, eq. 2-4, Code 2): correctors of off-policy data.

For data collected by a *behaviour* policy (e.g. a compressed actor) and learned by a *target* policy (the
learner's full network), a chain of responsibility of correctors fixes the bias, each built on an estimator of
:mod:`frugalrl.returns`:

* :class:`VTraceCorrector`: V-trace value targets and policy-gradient advantages, truncated weights ``ρ̄``, ``c̄``;
* :class:`ISCorrector`: clipped importance ratios ``π/μ`` multiplying the policy-gradient term (eq. 3);
* :class:`RetraceCorrector`: Retrace(λ)-style traces applied to state-value targets.

``CorrectorChain().add(VTraceCorrector(1.0, 1.0)).add(ISCorrector(1.0))`` composes them in order and
:func:`parse_correctors` builds a chain from the CLI's ``--correct`` spelling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from frugalrl.returns import VTraceReturns, importance_weights, retrace, vtrace, vtrace_from_weights


@dataclasses.dataclass
class CorrectionBatch:
    """The data a :class:`Corrector` reads and writes, all tensors ``(T, N)``.

    Inputs: ``behaviour_logp`` (actor's policy μ), ``target_logp`` (learner's policy π), ``rewards``,
    ``values``, ``next_values``, ``terminations``, ``dones``, ``gamma``. Outputs: ``value_targets``
    and ``pg_advantages`` (``None`` until a corrector, or :class:`CorrectorChain`'s uncorrected
    default, fills them) and ``pg_weights``, the per-sample weight multiplying the policy-gradient
    term (ones by default). The learner's losses are then
    ``−pg_weights · pg_advantages · log π(a|s)`` and ``(value_targets − V(s))²`` (eq. 4).
    """

    behaviour_logp: torch.Tensor
    target_logp: torch.Tensor
    rewards: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor
    terminations: torch.Tensor
    dones: torch.Tensor
    gamma: float
    value_targets: torch.Tensor | None = None
    pg_advantages: torch.Tensor | None = None
    pg_weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        """Default ``pg_weights`` to ones."""
        if self.pg_weights is None:
            self.pg_weights = torch.ones_like(self.rewards)

    def replace(self, **changes: Any) -> CorrectionBatch:
        """A copy with ``changes`` applied (correctors never mutate their input)."""
        return dataclasses.replace(self, **changes)


class Corrector:
    """Base class of the chain of responsibility: ``correct(batch)`` returns a corrected copy."""

    def correct(self, batch: CorrectionBatch) -> CorrectionBatch:
        """Return ``batch`` with this corrector's outputs filled in (identity here)."""
        return batch

    def describe(self) -> str:
        """A short human-readable spelling, e.g. ``vtrace(rho_bar=1.0, c_bar=1.0)``."""
        return type(self).__name__

    def __repr__(self) -> str:
        return self.describe()


class VTraceCorrector(Corrector):
    """Sets ``value_targets = vs`` and ``pg_advantages`` from :func:`vtrace` (AcceRL eq. 2, 4)."""

    def __init__(self, rho_bar: float | None = 1.0, c_bar: float | None = 1.0, lam: float = 1.0) -> None:
        """``rho_bar`` and ``c_bar`` truncate the importance weights (``None`` = no truncation); ``lam``
        multiplies the traces."""
        self.rho_bar = rho_bar
        self.c_bar = c_bar
        self.lam = lam

    def correct(self, batch: CorrectionBatch) -> CorrectionBatch:
        """Fill ``value_targets`` and ``pg_advantages`` with V-trace's."""
        out = vtrace(*_trace_inputs(batch), rho_bar=self.rho_bar, c_bar=self.c_bar, lam=self.lam)
        return batch.replace(value_targets=out.vs, pg_advantages=out.pg_advantages)

    def describe(self) -> str:
        """``vtrace(rho_bar=…, c_bar=…[, lam=…])``."""
        lam = "" if self.lam == 1.0 else f", lam={self.lam}"
        return f"vtrace(rho_bar={self.rho_bar}, c_bar={self.c_bar}{lam})"


_TraceInputs = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float
]


def _trace_inputs(batch: CorrectionBatch) -> _TraceInputs:
    """The positional inputs of :func:`vtrace` / :func:`retrace`, taken from a batch."""
    return (batch.behaviour_logp, batch.target_logp, batch.rewards, batch.values, batch.next_values,
            batch.terminations, batch.dones, batch.gamma)


class ISCorrector(Corrector):
    """Multiplies ``pg_weights`` by the clipped importance ratios ``min(clip, π/μ)`` (AcceRL eq. 3).

    Meant for advantages computed without V-trace's ``ρ`` (e.g. the chain's uncorrected default or
    :class:`RetraceCorrector`); after :class:`VTraceCorrector` it weights the gradient a second time,
    as AcceRL's Code 2 does.
    """

    def __init__(self, clip: float | None = 1.0) -> None:
        """``clip`` bounds the ratios above (``None`` = no clipping)."""
        self.clip = clip

    def correct(self, batch: CorrectionBatch) -> CorrectionBatch:
        """Scale ``pg_weights`` by the clipped importance weights."""
        w = importance_weights(batch.target_logp, batch.behaviour_logp, self.clip)
        assert batch.pg_weights is not None  # CorrectionBatch.__post_init__ fills it
        return batch.replace(pg_weights=batch.pg_weights * w.to(batch.pg_weights.dtype))

    def describe(self) -> str:
        """``is(clip=…)``."""
        return f"is(clip={self.clip})"


class RetraceCorrector(Corrector):
    """Sets ``value_targets`` and ``pg_advantages`` from :func:`retrace` (state-value Retrace(λ))."""

    def __init__(self, lam: float = 1.0) -> None:
        """``lam`` is Retrace's λ, multiplying the traces ``min(1, π/μ)``."""
        self.lam = lam

    def correct(self, batch: CorrectionBatch) -> CorrectionBatch:
        """Fill ``value_targets`` and ``pg_advantages`` with Retrace(λ)'s."""
        out = retrace(*_trace_inputs(batch), lam=self.lam)
        return batch.replace(value_targets=out.vs, pg_advantages=out.pg_advantages)

    def describe(self) -> str:
        """``retrace(lam=…)``."""
        return f"retrace(lam={self.lam})"


def uncorrected_targets(batch: CorrectionBatch) -> VTraceReturns:
    """The on-policy targets, ignoring the importance ratios (``ρ = c = 1``).

    ``vs`` are the n-step bootstrapped returns to the end of the fragment or episode, and
    ``pg_advantages = r_t + γ_t v⁺_t − V(s_t)`` (equal to ``vs − values`` on consistent data).
    """
    ones = torch.ones_like(batch.rewards)
    return vtrace_from_weights(
        ones,
        ones,
        batch.rewards,
        batch.values,
        batch.next_values,
        batch.terminations,
        batch.dones,
        batch.gamma,
    )


class CorrectorChain(Corrector):
    """AcceRL's chain of responsibility: correctors applied in the order they were added (Code 2).

    ``CorrectorChain().add(VTraceCorrector(1.0, 1.0)).add(ISCorrector(1.0))``. After the chain ran,
    any output still unset (``value_targets`` / ``pg_advantages``) is filled with
    :func:`uncorrected_targets`; so the empty chain yields the uncorrected on-policy targets, and a
    later corrector writing the same output overrides an earlier one.
    """

    def __init__(self, correctors: list[Corrector] | None = None) -> None:
        """Start from ``correctors`` (empty by default)."""
        self.correctors: list[Corrector] = list(correctors or [])

    def add(self, corrector: Corrector) -> CorrectorChain:
        """Append ``corrector`` and return ``self`` (for one-line composition)."""
        if not isinstance(corrector, Corrector):
            raise TypeError(f"expected a Corrector, got {type(corrector).__name__}")
        self.correctors.append(corrector)
        return self

    def correct(self, batch: CorrectionBatch) -> CorrectionBatch:
        """Apply each corrector in order, then fill unset outputs with the uncorrected targets."""
        for corrector in self.correctors:
            batch = corrector.correct(batch)
        if batch.value_targets is None or batch.pg_advantages is None:
            default = uncorrected_targets(batch)
            batch = batch.replace(
                value_targets=default.vs if batch.value_targets is None else batch.value_targets,
                pg_advantages=default.pg_advantages if batch.pg_advantages is None else batch.pg_advantages,
            )
        return batch

    def describe(self) -> str:
        """The correctors' spellings joined by `` -> `` (``none`` when empty)."""
        return " -> ".join(c.describe() for c in self.correctors) or "none"

    def __len__(self) -> int:
        return len(self.correctors)

    def __iter__(self) -> Iterator[Corrector]:
        return iter(self.correctors)


CORRECTOR_WORDS = ("vtrace", "vtrace:RHO:C", "vtrace:RHO:C:LAM", "is", "is:CLIP", "retrace:LAM", "none")


def _parse_clip(text: str) -> float | None:
    if text.lower() in ("none", "inf"):
        return None
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0, got {value}")
    return value


def parse_correctors(spec: str) -> CorrectorChain:
    """Build a :class:`CorrectorChain` from the CLI's ``--correct`` value, e.g. ``"vtrace,is"``.

    Comma-separated words, applied in order: ``vtrace`` (``ρ̄ = c̄ = 1``), ``vtrace:RHO:C[:LAM]``,
    ``is`` (clip 1), ``is:CLIP``, ``retrace:LAM`` (``retrace`` alone: λ = 1) and ``none`` (no-op;
    an empty spec means ``none`` too). Clip values may be ``inf``/``none`` for no clipping. Raises
    ``ValueError`` naming the bad word and the valid ones.
    """
    chain = CorrectorChain()
    if not spec.strip():
        return chain
    for raw in spec.split(","):
        word = raw.strip()
        name, *args = word.split(":")
        name = name.lower()
        try:
            if name == "none" and not args:
                continue
            if name == "vtrace" and len(args) in (0, 2, 3):
                rho, c = (_parse_clip(a) for a in args[:2]) if args else (1.0, 1.0)
                lam = float(args[2]) if len(args) == 3 else 1.0
                if not 0.0 <= lam <= 1.0:
                    raise ValueError(f"lambda must be in [0, 1], got {lam}")
                chain.add(VTraceCorrector(rho, c, lam))
            elif name == "is" and len(args) <= 1:
                chain.add(ISCorrector(_parse_clip(args[0]) if args else 1.0))
            elif name == "retrace" and len(args) <= 1:
                lam = float(args[0]) if args else 1.0
                if not 0.0 <= lam <= 1.0:
                    raise ValueError(f"lambda must be in [0, 1], got {lam}")
                chain.add(RetraceCorrector(lam))
            else:
                raise ValueError("unknown corrector")
        except ValueError as e:
            raise ValueError(
                f"bad corrector {word!r} in --correct {spec!r} ({e}); valid words: {', '.join(CORRECTOR_WORDS)}"
            ) from None
    return chain
