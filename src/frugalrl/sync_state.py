"""The head's record of the policy each worker holds: what a sync rule (:mod:`frugalrl.sync`) decides on.

:class:`PolicySync` keeps, for a ClusterEnv's workers, the learner's version, the version each worker
holds, the syncs sent to each, and AAPS's evidence: each worker's recent states with the behaviour
distribution it acted with there, or (what the workers send by default, ``uplink_behaviour="logprob"``) the
actions it took there and their log-probabilities. From full parameters the KL is exact,
``mean_s KL(μ(·|s) ‖ π(·|s))``; from taken actions it is Schulman's unbiased, non-negative estimator
``mean (r − 1 − log r)``, ``r = π(a|s) / μ(a|s)``, ``a ~ μ`` (J. Schulman, "Approximating KL divergence", 2020). It turns an agent into the weights message (encoded once per
version) and knows the policy the workers run after decoding it (which differs from the learner's
with a lossy codec), so that AAPS compares the learner with what a worker really holds.

It holds no transport: :class:`~frugalrl.envs.cluster.ClusterEnv` sends the message to the workers that
:meth:`PolicySync.select` returns and reports them back with :meth:`PolicySync.sent`.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from frugalrl import dists
from frugalrl.nets import ActorCritic
from frugalrl.sync import SyncContext, SyncRule
from frugalrl.wire.message import (
    Message,
    decode_message,
    decode_state_dict,
    encode_message,
    encode_state_dict,
)


@dataclass(frozen=True)
class Evidence:
    """A worker's recent states and how it acted there: its distribution parameters (``actions`` None; AAPS's KL
    is then exact), or the ``actions`` it took and their log-probabilities (the sampled estimate)."""

    states: torch.Tensor
    behaviour: torch.Tensor
    actions: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        """The tensors in checkpoint order: states, behaviour, then the actions if any."""
        return [self.states, self.behaviour, *([] if self.actions is None else [self.actions])]

    def map(self, f: Callable[[torch.Tensor], torch.Tensor]) -> Evidence:
        """``f`` applied to every tensor (one selection of rows for all)."""
        return Evidence(*(f(t) for t in self.tensors()))


class PolicySync:
    """Versions, sync counts and AAPS's recent states of ``num_workers`` workers."""

    def __init__(self, num_workers: int, rule: SyncRule, weights_codec: str, kl_states: int) -> None:
        self.rule = rule
        self.weights_codec = weights_codec
        self.kl_states = kl_states
        self.learner_version = 0
        self.worker_versions: list[int | None] = [None] * num_workers
        self.sync_counts = np.zeros(num_workers, dtype=np.int64)
        self.last_kl: list[float | None] = [None] * num_workers
        self.recent: list[Evidence | None] = [None] * num_workers
        self._fingerprint: tuple[int, ...] | None = None
        self._tracked: weakref.ref[ActorCritic] | None = None
        self._message: Message | None = None
        self._held: ActorCritic | None = None

    # ------------------------------------------------------------------ versions
    def is_new_agent(self, agent: ActorCritic) -> bool:
        """Whether ``agent`` is not the one tracked so far (the caller then checks it fits the env)."""
        tracked = self._tracked() if self._tracked is not None else None
        return tracked is not agent

    def track(self, agent: ActorCritic) -> None:
        """Bump the learner's version if ``agent`` changed since the last call (or is another agent).

        Every in-place change of a tensor bumps its ``_version`` (an optimizer step, ``load_state_dict``...);
        the agent itself is compared by a weak reference, not ``id()``: a new agent can reuse a freed id.
        """
        fingerprint = tuple(t._version for t in itertools.chain(agent.parameters(), agent.buffers()))
        if self.is_new_agent(agent) or fingerprint != self._fingerprint:
            self._fingerprint = fingerprint
            self._tracked = weakref.ref(agent)
            self.learner_version += 1
            self._message = None
            self._held = None

    def stale(self) -> list[int]:
        """Workers that do not hold the learner's version."""
        return [w for w, v in enumerate(self.worker_versions) if v != self.learner_version]

    def select(self, agent: ActorCritic) -> list[int]:
        """The workers the rule sends the (tracked) agent's weights to now."""
        ctx = SyncContext(self.learner_version, list(self.worker_versions), self._kl_estimator(agent))
        return self.rule.select(ctx)

    def message(self, agent: ActorCritic) -> Message:
        """The weights message of the learner's version (encoded once per version)."""
        if self._message is None:
            msg = encode_state_dict(agent.state_dict(), self.weights_codec, getattr(agent, "exact_tensors", ()))
            msg.meta = {"version": self.learner_version, "spec": agent.spec.to_json()}
            self._message = msg
        return self._message

    def sent(self, agent: ActorCritic, workers: list[int]) -> None:
        """Record that ``workers`` now hold the learner's version.

        AAPS compares the learner with the policy a worker *holds*: after a sync, the behaviour recorded
        on its recent states is that of the weights just sent (as decoded by the worker).
        """
        for w in workers:
            self.worker_versions[w] = self.learner_version
            self.sync_counts[w] += 1
        if any(self.recent[w] is not None for w in workers):
            held = self._held_policy(agent)
            for w in workers:
                recent = self.recent[w]
                if recent is not None:
                    with torch.no_grad():
                        params = held.dist_params(recent.states).float()
                        if recent.actions is not None:
                            params = dists.log_prob(held.dist_kind, params, recent.actions).float()
                        self.recent[w] = replace(recent, behaviour=params)

    def forget(self, w: int) -> None:
        """Worker ``w`` was replaced: it holds nothing and has no recent states."""
        self.worker_versions[w] = None
        self.recent[w] = None

    # ------------------------------------------------------------------ AAPS evidence
    def remember(self, w: int, states: torch.Tensor, behaviour: torch.Tensor, actions: torch.Tensor | None = None,
                 append: bool = False) -> None:
        """Keep up to ``kl_states`` of worker ``w``'s recent states and its behaviour there: the distribution
        parameters (``actions`` None), or the log-probabilities of the ``actions`` it took."""
        n = states.shape[0]
        new = Evidence(states, behaviour.reshape(n, -1) if actions is None else behaviour.reshape(n), actions)
        recent = self.recent[w]
        if append and recent is not None and (recent.actions is None) == (actions is None):
            new = Evidence(*(torch.cat([old, t])[-self.kl_states :]
                             for old, t in zip(recent.tensors(), new.tensors(), strict=True)))
        elif n > self.kl_states:
            idx = torch.linspace(0, n - 1, self.kl_states).long()
            new = new.map(lambda t: t[idx])
        self.recent[w] = new

    def _kl_estimator(self, agent: ActorCritic) -> Callable[[int], float | None]:
        def kl(w: int) -> float | None:
            recent = self.recent[w]
            if recent is None:
                return None
            with torch.no_grad():
                learner = agent.dist_params(recent.states).float()
                if recent.actions is None:  # full behaviour parameters: the exact KL on each state
                    value = float(dists.kl(agent.dist_kind, recent.behaviour, learner).mean())
                else:  # taken actions a ~ μ: E[r − 1 − log r], r = π(a|s) / μ(a|s)
                    log_pi = dists.log_prob(agent.dist_kind, learner, recent.actions).float()
                    log_r = (log_pi - recent.behaviour).clamp(-30, 30)
                    value = float((torch.expm1(log_r) - log_r).mean())
            self.last_kl[w] = value
            return value

        return kl

    def _held_policy(self, agent: ActorCritic) -> ActorCritic:
        """The policy the workers run after receiving the current weights message."""
        if self.weights_codec == "fp32":
            return agent
        if self._held is None:
            decoded, _ = decode_message(encode_message(self.message(agent))[0])
            self._held = copy.deepcopy(agent)
            self._held.load_state_dict(decode_state_dict(decoded))
        return self._held

    # ------------------------------------------------------------------ reporting, checkpoints
    def stats(self) -> dict[str, Any]:
        """Syncs (total and per worker), versions, the last KL of each worker and the rule."""
        return {
            "weight_syncs": {"total": int(self.sync_counts.sum()), "per_worker": self.sync_counts.tolist()},
            "learner_version": self.learner_version,
            "worker_versions": list(self.worker_versions),
            "last_kl": list(self.last_kl),
            "sync_rule": self.rule.describe(),
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything but the tracked agent (a resumed run tracks its own, and bumps the version once,
        as the uninterrupted run does at its next sync after an update)."""
        return {
            "learner_version": self.learner_version,
            "worker_versions": list(self.worker_versions),
            "sync_counts": torch.from_numpy(self.sync_counts.copy()),
            "last_kl": list(self.last_kl),
            "recent": [None if r is None else [t.clone() for t in r.tensors()] for r in self.recent],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.learner_version = int(state["learner_version"])
        self.worker_versions = list(state["worker_versions"])
        self.sync_counts = state["sync_counts"].numpy().copy()
        self.last_kl = list(state["last_kl"])
        self.recent = [None if r is None else Evidence(*r) for r in state["recent"]]
        self._fingerprint = self._tracked = self._message = self._held = None


class StallWatch:
    """Notices a run whose training return stopped improving while its workers act with an old policy.

    A sync rule that sends no weights (AAPS whose KL stays under δ, a long interval) leaves the workers on
    the policy they hold: the learner may still improve on their data, but the episodes they play (the
    training return) do not. After every update the watch takes the batch's mean policy lag (learner
    updates between the data's policy and the learner) and the mean training return; it reports once per
    stall, when over the last ``window`` updates the lag stayed at ``min_lag`` or more and the training
    return did not rise above what it was ``window`` updates earlier.
    """

    def __init__(self, window: int = 10, min_lag: float = 10.0) -> None:
        self.window = int(window)
        self.min_lag = float(min_lag)
        self.lags: list[float] = []
        self.returns: list[float | None] = []
        self.stalled = False
        self.events: list[dict[str, Any]] = []

    def observe(self, step: int, lag: float, train_return: float | None, rule: str) -> str | None:
        """Record one update; return a message the first time a stall shows (None otherwise)."""
        self.lags.append(float(lag))
        self.returns.append(train_return)
        w = self.window
        if len(self.lags) < 2 * w:
            return None
        lagging = min(self.lags[-w:]) >= self.min_lag
        if not lagging:
            self.stalled = False
            return None
        now = [r for r in self.returns[-w:] if r is not None]
        before = [r for r in self.returns[-2 * w : -w] if r is not None]
        improving = bool(now) and (not before or np.mean(now) > np.mean(before) + 0.01 * abs(np.mean(before)))
        if improving or self.stalled:
            return None
        self.stalled = True
        message = (f"training has not improved for {w} updates while the workers act with a policy "
                   f"{np.mean(self.lags[-w:]):.0f} updates old: the sync rule {rule} is not sending weights "
                   "(set a max policy lag, a smaller KL threshold, or sync every update)")
        self.events.append({"step": int(step), "lag": round(float(np.mean(self.lags[-w:])), 2),
                            "train_return": None if not now else round(float(np.mean(now)), 3), "message": message})
        return message
