"""Return and advantage estimators as pure functions: GAE, V-trace, importance weights, Retrace.

GAE (Schulman et al. 2016) is the on-policy estimator; V-trace (IMPALA, Espeholt et al. 2018, eq. 1), clipped
importance ratios and Retrace(λ) (Munos et al. 2016) correct data that a behaviour policy μ collected for a target
policy π (AcceRL's correctors, :mod:`frugalrl.correct`, apply them to a batch).

All functions take ``(T, N)`` tensors: step ``t`` of env ``n``. ``next_values[t]`` is the value of the state
reached after step ``t`` (the final observation when the episode ended there), so that truncated episodes are
bootstrapped and terminated ones are not. ``terminations[t]`` stops bootstrapping at ``t``; ``dones[t] =
terminated or truncated`` cuts traces and returns at ``t``. Log-probabilities are ``log π(a_t | s_t)`` of the
action actually taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

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
    final_values = value_fn(final_obs) if final_idx.shape[0] > 0 else values.new_zeros(0)
    return values, next_values_of(values, value_fn(next_obs), final_idx, final_values)


def next_values_of(values: torch.Tensor, last_value: torch.Tensor, final_idx: torch.Tensor,
                   final_values: torch.Tensor) -> torch.Tensor:
    """``V(s'_t)`` from values already computed: ``values[t + 1]``, ``last_value`` after the last step, and
    ``final_values`` (the values of final observations) at the ``final_idx`` rows ``[t, n]`` where an episode
    ended. Steps whose episode terminated need no entry: :func:`gae` does not bootstrap them."""
    next_values = torch.empty_like(values)
    next_values[:-1] = values[1:]
    next_values[-1] = last_value
    if final_idx.shape[0] > 0:
        next_values[final_idx[:, 0], final_idx[:, 1]] = final_values
    return next_values


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


def vtrace_from_weights(
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
    return vtrace_from_weights(rhos, cs, rewards, values, next_values, terminations, dones, gamma)


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
    return vtrace_from_weights(
        torch.ones_like(ratios), lam * ratios, rewards, values, next_values, terminations, dones, gamma
    )
