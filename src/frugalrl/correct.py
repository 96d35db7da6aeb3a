"""Return and advantage estimators as plain functions, and AcceRL's Corrector chain.

GAE (Schulman et al. 2016) is the on-policy estimator. For data collected by a *behaviour* policy
(e.g. a compressed actor) and learned by a *target* policy (the learner's full network), AcceRL
(Zhang 2022, section 2.3, eq. 2-4, Code 2) corrects the bias with a chain of responsibility of
correctors:

* :func:`vtrace` / :class:`VTraceCorrector`: V-trace value targets and policy-gradient advantages
  (IMPALA, Espeholt et al. 2018, eq. 1), truncated importance weights ``ρ̄`` and ``c̄``;
* :func:`importance_weights` / :class:`ISCorrector`: clipped importance ratios ``π/μ`` multiplying
  the policy-gradient term (eq. 3);
* :func:`retrace` / :class:`RetraceCorrector`: Retrace(λ)-style traces (Munos et al. 2016) applied
  to state-value targets (the optional item, see :func:`retrace`).

``CorrectorChain().add(VTraceCorrector(1.0, 1.0)).add(ISCorrector(1.0))`` composes them in order
and :func:`parse_correctors` builds a chain from the CLI's ``--correct`` spelling.

All functions take ``(T, N)`` tensors: step ``t`` of env ``n``. ``next_values[t]`` is the value of
the state reached after step ``t`` (the final observation when the episode ended there), so that
truncated episodes are bootstrapped and terminated ones are not. ``terminations[t]`` stops
bootstrapping at ``t``; ``dones[t] = terminated or truncated`` cuts traces and returns at ``t``.
Log-probabilities are ``log π(a_t | s_t)`` of the action actually taken.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016).

    ``δ_t = r_t + γ V(s'_t) (1 − term_t) − V(s_t)`` and ``A_t = δ_t + γ λ (1 − done_t) A_{t+1}``, where
    ``done = terminated or truncated``. Returns ``(advantages, returns = advantages + values)``.
    """
    T = rewards.shape[0]
    not_term = 1.0 - terminations.to(rewards.dtype)
    not_done = 1.0 - dones.to(rewards.dtype)
    deltas = rewards + gamma * next_values * not_term - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(T)):
        last = deltas[t] + gamma * lam * not_done[t] * last
        advantages[t] = last
    return advantages, advantages + values


def bootstrap_values(
    value_fn: Callable[[torch.Tensor], torch.Tensor],
    obs: torch.Tensor,
    next_obs: torch.Tensor,
    final_idx: torch.Tensor,
    final_obs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``values[t, n] = V(obs[t, n])`` and ``next_values[t, n] = V(s'_{t, n})`` for a rollout.

    ``s'`` is ``obs[t + 1]``, ``next_obs`` after the last step, or the final observation where an
    episode ended (``final_idx`` rows ``[t, n]``).
    """
    T, N = obs.shape[:2]
    values = value_fn(obs.reshape(T * N, *obs.shape[2:])).reshape(T, N)
    next_values = torch.empty_like(values)
    next_values[:-1] = values[1:]
    next_values[-1] = value_fn(next_obs)
    if final_idx.shape[0] > 0:
        next_values[final_idx[:, 0], final_idx[:, 1]] = value_fn(final_obs)
    return values, next_values


# --------------------------------------------------------------------------------------------------
# Off-policy corrections (AcceRL section 2.3)
# --------------------------------------------------------------------------------------------------


def importance_weights(
    target_logp: torch.Tensor, behaviour_logp: torch.Tensor, clip: float | None = 1.0
) -> torch.Tensor:
    """Importance ratios ``π(a|s) / μ(a|s) = exp(target_logp − behaviour_logp)``, clipped above at ``clip``.

    ``clip=None`` leaves them unclipped. Computed without gradient (the weights are constants).
    """
    with torch.no_grad():
        w = torch.exp(target_logp.detach() - behaviour_logp.detach())
        return w if clip is None else w.clamp(max=clip)


class VTraceReturns(NamedTuple):
    """Output of :func:`vtrace` / :func:`retrace`, all ``(T, N)``.

    ``vs``: value targets; ``pg_advantages``: ``ρ_t (r_t + γ_t v_{t+1} − V(s_t))``; ``rhos``: the
    (clipped) weights on the TD errors; ``cs``: the (clipped) trace coefficients.
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor
    rhos: torch.Tensor
    cs: torch.Tensor


def _check_shapes(**tensors: torch.Tensor) -> torch.Size:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) < 1 or any(s != first for s in shapes.values()):
        raise ValueError(f"all inputs must share one (T, N) shape, got {shapes}")
    return torch.Size(first)


def _vtrace_from_weights(
    rhos: torch.Tensor,
    cs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
) -> VTraceReturns:
    """The V-trace recursion given already-clipped ``rhos`` and ``cs`` (see :func:`vtrace`)."""
    with torch.no_grad():
        rewards, values, next_values = rewards.detach(), values.detach(), next_values.detach()
        dtype = rewards.dtype
        rhos, cs = rhos.to(dtype), cs.to(dtype)
        T = rewards.shape[0]
        discounts = gamma * (1.0 - terminations.to(dtype))
        not_done = 1.0 - dones.to(dtype)
        deltas = rhos * (rewards + discounts * next_values - values)
        acc = torch.zeros_like(rewards)
        last = torch.zeros_like(rewards[0])
        for t in reversed(range(T)):
            last = deltas[t] + gamma * not_done[t] * cs[t] * last
            acc[t] = last
        vs = values + acc
        # v_{t+1} for the policy-gradient target: the corrected value when the episode continues in
        # the fragment, otherwise the (bootstrap) value of the state reached after step t.
        vs_next = next_values.clone()
        if T > 1:
            cont = not_done[:-1].bool()
            vs_next[:-1] = torch.where(cont, vs[1:], next_values[:-1])
        pg_advantages = rhos * (rewards + discounts * vs_next - values)
        return VTraceReturns(vs=vs, pg_advantages=pg_advantages, rhos=rhos, cs=cs)


def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    rho_bar: float | None = 1.0,
    c_bar: float | None = 1.0,
    lam: float = 1.0,
) -> VTraceReturns:
    """V-trace targets (IMPALA, Espeholt et al. 2018, eq. 1; AcceRL eq. 2 and 4).

    With ``ratio_t = exp(target_logp_t − behaviour_logp_t)``, ``ρ_t = min(ρ̄, ratio_t)``,
    ``c_t = λ min(c̄, ratio_t)`` (``None`` = no clipping; λ as in the IMPALA paper's remark 2, which on
    policy makes ``vs`` the λ-returns of GAE), ``γ_t = γ (1 − term_t)``:

    * ``δ_t = ρ_t (r_t + γ_t V(s'_t) − V(s_t))`` with ``V(s'_t) = next_values[t]``;
    * ``v_t = V(s_t) + a_t``, ``a_t = δ_t + γ (1 − done_t) c_t a_{t+1}`` (``a_T = 0``), i.e.
      ``v_s = V(s_s) + Σ_t γ^{t−s} (Π_{i<t} c_i) δ_t`` summed up to the episode's or fragment's end;
    * ``pg_advantages_t = ρ_t (r_t + γ_t v⁺_t − V(s_t))``, where ``v⁺_t = v_{t+1}`` if the episode
      continues after ``t`` inside the fragment and ``next_values[t]`` otherwise.

    On-policy (equal log-probs, ``ρ̄, c̄ ≥ 1``) ``vs`` are the n-step bootstrapped returns to the end
    of the fragment or episode. Computed under ``torch.no_grad`` (the outputs are targets).
    """
    _check_shapes(
        behaviour_logp=behaviour_logp,
        target_logp=target_logp,
        rewards=rewards,
        values=values,
        next_values=next_values,
        terminations=terminations,
        dones=dones,
    )
    ratios = importance_weights(target_logp, behaviour_logp, clip=None)
    rhos = ratios if rho_bar is None else ratios.clamp(max=rho_bar)
    cs = lam * (ratios if c_bar is None else ratios.clamp(max=c_bar))
    return _vtrace_from_weights(rhos, cs, rewards, values, next_values, terminations, dones, gamma)


def retrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float = 1.0,
) -> VTraceReturns:
    """Retrace(λ)-style targets for *state* values (Munos et al. 2016), the optional corrector.

    Retrace is defined for action values; there is no standard Q-free form. Here it is the V-trace
    recursion of :func:`vtrace` with traces ``c_t = λ min(1, ratio_t)`` and
    ``ρ_t = 1`` (the TD errors are not reweighted): the value targets follow the behaviour data,
    with the traces shrunk wherever the target policy is less likely than the behaviour one.
    ``pg_advantages`` are then ``r_t + γ_t v⁺_t − V(s_t)`` (combine with :class:`ISCorrector`).
    """
    _check_shapes(
        behaviour_logp=behaviour_logp,
        target_logp=target_logp,
        rewards=rewards,
        values=values,
        next_values=next_values,
        terminations=terminations,
        dones=dones,
    )
    ratios = importance_weights(target_logp, behaviour_logp, clip=1.0)
    return _vtrace_from_weights(
        torch.ones_like(ratios), lam * ratios, rewards, values, next_values, terminations, dones, gamma
    )


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
    return _vtrace_from_weights(
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
