"""The head's record of the policy each worker holds: what a sync rule (:mod:`frugalrl.sync`) decides on.

:class:`PolicySync` keeps, for a ClusterEnv's workers, the learner's version, the version each worker
holds, the syncs sent to each, and AAPS's evidence: each worker's recent states with the behaviour
distribution it acted with there, or (the default) the actions it took there and their log-probabilities. From
full parameters the KL is exact, ``mean_s KL(μ(·|s) ‖ π(·|s))``; from taken actions it is Schulman's unbiased, non-negative estimator
``mean (r − 1 − log r)``, ``r = π(a|s) / μ(a|s)``, ``a ~ μ`` (J. Schulman, "Approximating KL divergence", 2020). It turns an agent into the weights message (encoded once per
version) and knows the policy the workers run after decoding it (which differs from the learner's
with a lossy codec), so that AAPS compares the learner with what a worker really holds.

It also keeps the copy each worker acknowledged (its version, the words of :mod:`frugalrl.wire.delta`) and the
policy spec it holds: a worker that holds an older copy is sent a delta against it when that is smaller (``delta``),
and the spec only when it does not hold it. From those words it recomputes the log-probabilities of the actions a
worker took (:meth:`PolicySync.behaviour_logp`, ``uplink_behaviour="recompute"``), which the worker then need not
send. It holds no transport: :meth:`PolicySync.push` sends through the
callable :class:`~frugalrl.envs.cluster.ClusterEnv` gives it, to the workers :meth:`PolicySync.select` returns.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from frugalrl import dists
from frugalrl.nets import ActorCritic, PolicySpec, acting_state, load_acting_state
from frugalrl.onnxactor import worker_actor
from frugalrl.sync import SyncContext, SyncRule
from frugalrl.wire.delta import Words, from_words, full_message, to_words, weights_update
from frugalrl.wire.message import Message

log = logging.getLogger("frugalrl")


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
    """Versions, sync counts, the copy each of ``num_workers`` workers holds and AAPS's recent states."""

    def __init__(self, num_workers: int, rule: SyncRule, weights_codec: str, kl_states: int,
                 delta: bool = True) -> None:
        self.rule = rule
        self.weights_codec = weights_codec
        self.kl_states = kl_states
        self.delta = bool(delta)
        self.learner_version = 0
        self.worker_versions: list[int | None] = [None] * num_workers
        self.sync_counts = np.zeros(num_workers, dtype=np.int64)
        self.last_kl: list[float | None] = [None] * num_workers
        self.recent: list[Evidence | None] = [None] * num_workers
        self._fingerprint: tuple[int, ...] | None = None
        self._tracked: weakref.ref[ActorCritic] | None = None
        self.delta_syncs = 0  # syncs sent as a delta (the others are full copies)
        self.earlier_syncs = 0  # syncs sent to the workers of an earlier segment on another number of workers
        # What each worker acknowledged holding: the version of its words (a delta's base) and the spec.
        self._bases: list[int | None] = [None] * num_workers
        self._specs: list[dict[str, Any] | None] = [None] * num_workers
        self._words: dict[int, Words] = {}  # the learner's version's words and those of the bases
        self._spec: dict[str, Any] | None = None
        self._messages: dict[tuple[str, int | bool], Message] = {}  # the learner's version's, by base or spec
        self._held: ActorCritic | None = None
        self._older: dict[int, ActorCritic] = {}  # the policies of older versions that workers hold, decoded
        self._actors: dict[int, Any] = {}  # by version: the actor workers run without torch, if any
        # What a worker restored from a checkpoint acts with (version, spec, acting state), until its next sync.
        self._restored: list[tuple[int, str, dict[str, np.ndarray]] | None] = [None] * num_workers
        self._spec_memo: tuple[PolicySpec, dict[str, Any], str] | None = None  # see _spec_forms

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
            self._messages = {}
            self._held = None

    def stale(self) -> list[int]:
        """Workers that do not hold the learner's version."""
        return [w for w, v in enumerate(self.worker_versions) if v != self.learner_version]

    def select(self, agent: ActorCritic) -> list[int]:
        """The workers the rule sends the (tracked) agent's weights to now."""
        ctx = SyncContext(self.learner_version, list(self.worker_versions), self._kl_estimator(agent))
        return self.rule.select(ctx)

    def words(self, agent: ActorCritic) -> Words:
        """The learner's version's code words (:func:`frugalrl.wire.delta.to_words`, made once per version)."""
        v = self.learner_version
        if v not in self._words:
            state = {k: t.detach().cpu().numpy() for k, t in acting_state(agent).items()}
            self._words[v] = to_words(state, self.weights_codec, getattr(agent, "exact_tensors", ()))
            self._spec = self._spec_forms(agent.spec)[0]
        return self._words[v]

    def message(self, agent: ActorCritic, w: int | None = None) -> Message:
        """The weights message for worker ``w`` (None: one that holds nothing): the spec only if it does not hold
        it; a delta against the copy it holds if that is smaller (:func:`~frugalrl.wire.delta.weights_update`)."""
        words = self.words(agent)
        base = None if w is None else self._bases[w]
        spec = None if w is not None and self._specs[w] == self._spec else self._spec
        meta: dict[str, Any] = {"version": self.learner_version, "codec": self.weights_codec}
        if spec is None and self.delta and base is not None and base in self._words:
            key: tuple[str, int | bool] = ("delta", base)
            if key not in self._messages:
                self._messages[key] = weights_update(words, self._words[base], meta, base)
        else:
            key = ("full", spec is not None)
            if key not in self._messages:
                self._messages[key] = full_message(words, meta if spec is None else {**meta, "spec": spec})
        return self._messages[key]

    def push(self, agent: ActorCritic, workers: list[int],
             request: Callable[[dict[int, Message]], dict[int, Message]]) -> None:
        """Send the learner's version to ``workers`` through ``request`` (requests by worker to replies; it
        replaces a worker that fails and asks :meth:`message` again). A worker that refuses a delta (it does not
        hold its base: a reply lost, a worker replaced unseen) is sent a full copy."""
        requests = {w: self.message(agent, w) for w in workers}
        refused = self.refusals(request(requests))
        if refused:
            request({w: self.message(agent, w) for w in refused})
        self.acknowledged(agent, requests)

    def refusals(self, replies: dict[int, Message]) -> list[int]:
        """The workers whose reply refused a weights delta (each then holds nothing the head can name: its next
        message is a full copy), said once each."""
        refused = [w for w, reply in replies.items() if reply.op == "refused"]
        for w in refused:
            log.warning("frugalrl: worker %d refused a weights delta (%s); sending a full copy", w,
                        replies[w].meta.get("error"))
            self._bases[w] = None
        return refused

    def acknowledged(self, agent: ActorCritic, requests: dict[int, Message]) -> None:
        """The weights ``requests`` reached their workers (a refused delta followed by a full copy): they hold the
        learner's version now."""
        # A delta reached each worker that still has a base (not refused, not replaced on the way).
        self.delta_syncs += sum("base" in msg.meta and self._bases[w] is not None for w, msg in requests.items())
        self.sent(agent, list(requests))

    def sent(self, agent: ActorCritic, workers: list[int]) -> None:
        """Record that ``workers`` now hold the learner's version (its words and spec).

        AAPS compares the learner with the policy a worker *holds*: after a sync, the behaviour recorded
        on its recent states is that of the weights just sent (as decoded by the worker).
        """
        self.words(agent)
        for w in workers:
            self.worker_versions[w] = self.learner_version
            self.sync_counts[w] += 1
            self._bases[w], self._specs[w], self._restored[w] = self.learner_version, self._spec, None
        kept = {*self._bases, self.learner_version, *(r[0] for r in self._restored if r is not None)}
        self._words = {v: words for v, words in self._words.items() if v in kept}
        self._older = {v: policy for v, policy in self._older.items() if v in kept}
        self._actors = {v: actor for v, actor in self._actors.items() if v in kept}
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
        """Worker ``w`` was replaced: it holds nothing (its next weights are a full copy with the spec) and has
        no recent states."""
        self.worker_versions[w] = None
        self.recent[w] = None
        self._bases[w] = self._specs[w] = self._restored[w] = None

    def restored(self, w: int, version: int, spec: dict[str, Any] | None, state: dict[str, np.ndarray]) -> None:
        """Worker ``w`` was restored from a checkpoint, acting with ``state`` (its acting state, as it decoded it) of
        ``version``: the head recomputes its behaviour from that until its next sync."""
        self._restored[w] = None if spec is None else (int(version), _canonical(spec), state)

    # ------------------------------------------------------------------ AAPS evidence
    def remember(self, w: int, states: torch.Tensor, behaviour: torch.Tensor, actions: torch.Tensor | None = None,
                 append: bool = False) -> None:
        """Keep up to ``kl_states`` of worker ``w``'s recent states and its behaviour there: the distribution
        parameters (``actions`` None; ``(n, *params shape)``), or the log-probabilities of the ``actions`` it took."""
        n = states.shape[0]
        new = Evidence(states, behaviour if actions is None else behaviour.reshape(n), actions)
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
            self._held = self._decoded(agent, self.words(agent))
        return self._held

    # ------------------------------------------------------------------ the behaviour, recomputed
    def can_recompute(self, w: int, agent: ActorCritic) -> bool:
        """Whether the head knows the policy worker ``w`` acts with, of ``agent``'s spec: the words it holds, or
        the state it was restored with (not so after a resume without the workers' snapshots, or when the spec
        changed, until its next sync), so that it can recompute what the worker did instead of being sent it."""
        return self._source(w, agent) is not None

    def _source(self, w: int, agent: ActorCritic) -> tuple[int, Words | dict[str, np.ndarray]] | None:
        """``(version, words or acting state)`` of the policy worker ``w`` acts with, or None if unknown."""
        base, restored = self._bases[w], self._restored[w]
        if base is None and restored is None:
            return None
        spec_json, spec_text = self._spec_forms(agent.spec)
        if base is not None and base in self._words and self._specs[w] == spec_json:
            return base, self._words[base]
        if restored is not None and restored[1] == spec_text:
            return restored[0], restored[2]
        return None

    def _spec_forms(self, spec: PolicySpec) -> tuple[dict[str, Any], str]:
        """``spec``'s JSON form and canonical text, kept while it equals the last one asked for: every worker asks
        at every rollout, and comparing two specs costs a fraction of building the form again."""
        memo = self._spec_memo
        if memo is None or memo[0] != spec:
            form = spec.to_json()
            # A copy, so that kwargs changed in place later do not change the memo's key with them.
            memo = self._spec_memo = (copy.deepcopy(spec), form, _canonical(form))
        return memo[1], memo[2]

    def behaviour_logp(self, w: int, version: int, agent: ActorCritic, states: torch.Tensor,
                       actions: torch.Tensor) -> np.ndarray:
        """log μ(a | s) of worker ``w``'s ``actions`` in ``states`` under the copy it acts with (``version``, decoded
        from its words as the worker decoded them, or restored): what the worker would have sent, up to float
        rounding (the worker evaluates its policy in numpy or on fewer states at a time)."""
        source = self._source(w, agent)
        if source is None or source[0] != version:
            raise RuntimeError(f"worker {w} acted with version {version}, which the head does not hold "
                               f"({None if source is None else source[0]}): its behaviour cannot be recomputed")
        if version == self.learner_version and self._bases[w] == version:
            policy = self._held_policy(agent)
        else:
            if version not in self._older:
                held_words = self._bases[w] == version  # else the acting state of a restored worker
                self._older[version] = (self._decoded(agent, source[1]) if held_words
                                        else self._decoded(agent, None, source[1]))
            policy = self._older[version]
        if version not in self._actors:  # the workers' own actor where they use one (and faster here)
            self._actors[version] = worker_actor(policy)
        actor = self._actors[version]
        with torch.no_grad():
            if actor is not None:
                params = torch.from_numpy(actor.params(states.numpy()))
            else:
                params = policy.dist_params(states).float()
            return dists.log_prob(policy.dist_kind, params, actions).float().numpy()

    def _decoded(self, agent: ActorCritic, words: Words | None, state: dict[str, np.ndarray] | None = None
                 ) -> ActorCritic:
        """A copy of ``agent`` acting with ``words`` (decoded as a worker decodes them), or with ``state``."""
        if words is not None:
            like = {k: (tuple(t.shape), t.detach().cpu().numpy().dtype) for k, t in acting_state(agent).items()}
            state = from_words(words, like, self.weights_codec)
        assert state is not None
        held = copy.deepcopy(agent)
        load_acting_state(held, {k: torch.from_numpy(np.array(a)) for k, a in state.items()})
        return held

    # ------------------------------------------------------------------ reporting, checkpoints
    def stats(self) -> dict[str, Any]:
        """Syncs (total, per worker, as deltas; ``full_bytes``: the weights of one full copy; ``lag_bound``: the
        rule's bound on a worker's lag in updates), versions, the last KL of each worker and the rule."""
        held = next(iter(self._words.values()), None)  # every version's words have the same layout
        return {
            "weight_syncs": {"total": self.earlier_syncs + int(self.sync_counts.sum()),
                             "per_worker": self.sync_counts.tolist(),
                             "delta": self.delta_syncs,
                             "full_bytes": 0 if held is None else int(sum(a.nbytes for a in held.values())),
                             "lag_bound": self.rule.lag_bound},
            "learner_version": self.learner_version,
            "worker_versions": list(self.worker_versions),
            "last_kl": list(self.last_kl),
            "sync_rule": self.rule.describe(),
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything but the tracked agent (a resumed run tracks its own, and bumps the version once,
        as the uninterrupted run does at its next sync after an update) and the copies the workers hold (a
        resumed run assumes none: its first sync to each worker is a full copy with the spec)."""
        return {
            "learner_version": self.learner_version,
            "worker_versions": list(self.worker_versions),
            "sync_counts": torch.from_numpy(self.sync_counts.copy()),
            "delta_syncs": self.delta_syncs,
            "earlier_syncs": self.earlier_syncs,
            "last_kl": list(self.last_kl),
            "recent": [None if r is None else [t.clone() for t in r.tensors()] for r in self.recent],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`. Saved for another number of workers (a run resumed on more or fewer),
        the learner's version and the sync totals go on, and every worker starts as a new one."""
        n = len(self.worker_versions)
        self.learner_version = int(state["learner_version"])
        self.delta_syncs = int(state.get("delta_syncs", 0))
        self.earlier_syncs = int(state.get("earlier_syncs", 0))
        if len(state["worker_versions"]) == n:
            self.worker_versions = list(state["worker_versions"])
            self.sync_counts = state["sync_counts"].numpy().copy()
            self.last_kl = list(state["last_kl"])
            self.recent = [None if r is None else Evidence(*r) for r in state["recent"]]
        else:
            self.earlier_syncs += int(state["sync_counts"].sum())
            self.worker_versions, self.last_kl, self.recent = [None] * n, [None] * n, [None] * n
            self.sync_counts = np.zeros(n, dtype=np.int64)
        self._fingerprint = self._tracked = self._held = self._spec = None
        self._older, self._actors = {}, {}
        self._restored = [None] * n
        self._bases, self._specs, self._words, self._messages = [None] * n, [None] * n, {}, {}


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
        # The last 2 × window updates (all that a stall is judged on: a days-long run's updates are millions).
        self.lags: deque[float] = deque(maxlen=2 * self.window)
        self.returns: deque[float | None] = deque(maxlen=2 * self.window)
        self.updates = 0
        self.stalled = False
        self.events: list[dict[str, Any]] = []
        self.rule = ""  # the sync rule, as the last update named it

    def observe(self, step: int, lag: float, train_return: float | None, rule: str) -> str | None:
        """Record one update; return a message the first time a stall shows (None otherwise)."""
        self.rule = rule
        self.lags.append(float(lag))
        self.returns.append(train_return)
        self.updates += 1
        w = self.window
        if len(self.lags) < 2 * w:
            return None
        lags, returns = list(self.lags), list(self.returns)
        lagging = min(lags[-w:]) >= self.min_lag
        if not lagging:
            self.stalled = False
            return None
        now = [r for r in returns[-w:] if r is not None]
        before = [r for r in returns[:w] if r is not None]
        improving = bool(now) and (not before or np.mean(now) > np.mean(before) + 0.01 * abs(np.mean(before)))
        if improving or self.stalled:
            return None
        self.stalled = True
        message = (f"training has not improved for {w} updates while the workers act with a policy "
                   f"{np.mean(lags[-w:]):.0f} updates old: the sync rule {rule} is not sending weights "
                   "(set a max policy lag, a smaller KL threshold, or sync every update)")
        self.events.append({"step": int(step), "lag": round(float(np.mean(lags[-w:])), 2),
                            "train_return": None if not now else round(float(np.mean(now)), 3), "message": message})
        return message

    def at_end(self, step: int) -> str | None:
        """At the end of a run that reported no stall: a message if its last batch came from policies at least half
        the run (and 3 updates) old. A run of a few large updates is too short for the window above, and there
        AAPS's KL can stay under δ to the end with its lag guard out of reach: the workers keep their first policy
        while the learner moves on."""
        n = self.updates
        if n < 3 or self.events or self.lags[-1] < max(3.0, n / 2):
            return None
        message = (f"the workers ended this {n}-update run acting with a policy {self.lags[-1]:.0f} updates old: the "
                   f"sync rule {self.rule} sent few weights for a run this short (sync every update, or set a max "
                   f"policy lag below {n})")
        self.events.append({"step": int(step), "lag": round(self.lags[-1], 2), "train_return": None,
                            "message": message})
        return message


def _canonical(spec: dict[str, Any]) -> str:
    """A policy spec as one string: the head's own and one that came back through JSON compare equal."""
    return json.dumps(spec, sort_keys=True)
