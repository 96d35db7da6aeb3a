"""How ClusterEnv sends the learner's weights: to the workers its sync rule picks, on their own
(:meth:`WeightSyncs.send_weights`) or inside the requests that need them (:meth:`WeightSyncs._request_with_weights`:
a rollout's or a ``step(agent)``'s, so that a sync costs no round trip of its own on a link with latency;
:func:`frugalrl.wire.message.carrying`).

Either way each worker gets a full copy or a delta against the copy it holds (:class:`frugalrl.sync_state.PolicySync`);
one that refuses a delta (it does not hold its base) is sent a full copy, and only then its request.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import gymnasium as gym

from frugalrl.envs.batching import check_agent_fits
from frugalrl.nets import ActorCritic, as_agent
from frugalrl.wire.message import Message, carrying

if TYPE_CHECKING:
    import torch

    from frugalrl.sync_state import PolicySync


class WeightSyncs:
    """ClusterEnv's part that sends weights (a mixin: ClusterEnv's attributes and methods)."""

    policies: PolicySync
    single_observation_space: gym.Space
    single_action_space: gym.Space

    if TYPE_CHECKING:  # ClusterEnv's methods, declared for the type checker only
        def _check_open(self) -> None: ...
        def _restart(self, w: int, reason: str) -> None: ...
        def _reset_worker(self, w: int, seed: int | None, defer: bool = False) -> Message: ...
        def _request(self, requests: dict[int, Message],
                     on_failure: Callable[[int, str], Message | None]) -> dict[int, Message]: ...

    def send_weights(self, agent: torch.nn.Module, force: bool = False) -> list[int]:
        """Send the agent's weights to the workers the sync rule picks (all of them if ``force``)."""
        self._check_open()
        agent = as_agent(agent)
        chosen = self._sync_choice(agent, force)
        if chosen:
            self._send_weights(agent, chosen)
        return chosen

    def _sync_choice(self, agent: ActorCritic, force: bool = False) -> list[int]:
        """The workers the sync rule picks for the agent's weights now (every stale one if ``force``)."""
        if self.policies.is_new_agent(agent):
            check_agent_fits(agent, self.single_observation_space, self.single_action_space)
        self.policies.track(agent)
        return self.policies.stale() if force else self.policies.select(agent)

    def _send_weights(self, agent: ActorCritic, workers: list[int]) -> None:
        def recover(w: int, reason: str) -> Message:
            self._restart(w, reason)
            self._reset_worker(w, seed=None)
            return self.policies.message(agent, w)  # a full copy: the new worker holds nothing

        self.policies.push(agent, workers, lambda requests: self._request(requests, on_failure=recover))

    def _request_with_weights(self, agent: ActorCritic | None, requests: dict[int, Message], chosen: Collection[int],
                              on_failure: Callable[[int, str], Message | None]) -> dict[int, Message]:
        """Replies to ``requests``, the workers ``chosen`` getting the agent's weights inside theirs (one chosen but
        sent no request is not synced); a worker that fails is ``on_failure``'s and stays unsynced (it holds
        nothing: a rollout's recovery syncs it, a step's next request does)."""
        if agent is None or not chosen:  # nothing to carry (every plain step): the requests as they are
            return self._request(requests, on_failure=on_failure)
        weights = {w: self.policies.message(agent, w) for w in chosen if w in requests}
        combined: dict[tuple[int, int], Message] = {}  # one object per distinct pair: Ray sends it once per node
        sent = {}
        for w, msg in requests.items():
            if w in weights:
                key = (id(msg), id(weights[w]))
                if key not in combined:
                    combined[key] = carrying(msg, weights[w])
                sent[w] = combined[key]
            else:
                sent[w] = msg
        failed: set[int] = set()

        def recover(w: int, reason: str) -> Message | None:
            failed.add(w)
            return on_failure(w, reason)

        try:
            replies = self._request(sent, on_failure=recover)
        except BaseException:
            # An error reply (or an interrupt) cannot say whether a worker loaded its weights before its request
            # failed: the head takes it to hold nothing, so its next sync is a full copy with the spec.
            for w in weights:
                if w not in failed:
                    self.policies.forget(w)
            raise
        refused = self.policies.refusals({w: replies[w] for w in weights if w not in failed})
        reached = {w: m for w, m in weights.items() if w not in failed and w not in refused}
        if reached:
            self.policies.acknowledged(agent, reached)
        if refused:  # these did not act on the request: a full copy first, then the request
            self._send_weights(agent, refused)
            replies.update(self._request({w: requests[w] for w in refused}, on_failure=on_failure))
        return replies
