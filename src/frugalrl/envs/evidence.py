"""What ClusterEnv keeps of how its workers acted: AAPS's evidence, and the behaviour the head recomputes.

A rollout reply carries the behaviour policy as distribution parameters (``uplink_behaviour="params"``), as the
taken actions' log-probabilities (``logprob``), or not at all (``recompute``, the default, for a worker whose words
the head keeps): then :meth:`frugalrl.sync_state.PolicySync.behaviour_logp` evaluates the copy that worker holds on
the observations and actions it sent, and the reply gets the ``behaviour_logp`` it would have carried. Either way
the worker's recent states and its behaviour there go to AAPS's KL estimate
(docs/clusterenv.md#the-experience-uplink).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from frugalrl.experience import space_shape
from frugalrl.wire.message import Message
from frugalrl.wire.uplink import UPLINK_STREAMS

if TYPE_CHECKING:
    from frugalrl.nets import ActorCritic
    from frugalrl.sync_state import PolicySync


class Behaviours:
    """ClusterEnv's part that reads the behaviour of its workers' replies (a mixin: ClusterEnv's attributes)."""

    policies: PolicySync
    single_observation_space: gym.Space
    single_action_space: gym.Space
    _codecs_seen: dict[str, dict[str, int]]

    def _take_behaviour(self, w: int, reply: Message, agent: ActorCritic) -> None:
        """Keep worker ``w``'s rollout evidence for AAPS; where the reply carries no behaviour, recompute its
        log-probabilities from the words the worker holds (the reply's version) and add them to it."""
        arrays = reply.arrays
        if "dist_params" in arrays:  # uplink_behaviour "params"
            self._remember(w, arrays["obs"], arrays["dist_params"])
            return
        if "behaviour_logp" not in arrays:
            states, actions = self._states_actions(arrays["obs"], arrays["actions"])
            logp = self.policies.behaviour_logp(w, int(reply.meta["version"]), agent, states, actions)
            arrays["behaviour_logp"] = logp.reshape(arrays["rewards"].shape)
        self._remember(w, arrays["obs"], arrays["behaviour_logp"], arrays["actions"])

    def _action_dtype(self) -> np.dtype:
        if isinstance(self.single_action_space, gym.spaces.Box):
            return np.dtype(np.float32)
        return np.dtype(np.int64)  # Discrete, MultiDiscrete, MultiBinary

    def _remember(self, w: int, states: np.ndarray, behaviour: np.ndarray, actions: np.ndarray | None = None,
                  append: bool = False) -> None:
        """Keep worker ``w``'s recent states and its behaviour there (parameters, or the log-probabilities of
        ``actions``) for AAPS."""
        s, a = self._states_actions(states, actions)
        b = torch.as_tensor(np.asarray(behaviour, dtype=np.float32))
        steps = np.ndim(states) - len(self.single_observation_space.shape or ())  # (T, k) or (k,) leading dims
        b = b.reshape(s.shape[0]) if actions is not None else b.reshape(s.shape[0], *b.shape[steps:])
        self.policies.remember(w, s, b, a, append)

    def _states_actions(self, states: np.ndarray, actions: np.ndarray | None) -> tuple[torch.Tensor, Any]:
        """Steps of a worker as the learner's tensors: states (n, *obs shape), actions (n, *action shape)."""
        s = torch.as_tensor(np.asarray(states)).reshape(-1, *(self.single_observation_space.shape or ()))
        if actions is None:
            return s, None
        a = torch.as_tensor(np.asarray(actions).astype(self._action_dtype(), copy=False))
        return s, a.reshape(s.shape[0], *space_shape(self.single_action_space))

    def _note_codecs(self, reply: Message) -> None:
        """Count the codec each experience stream arrived with (the summary's ``uplink.codecs``)."""
        for name, codec in reply.codecs.items():
            if codec == "raw" or name not in UPLINK_STREAMS:
                continue
            seen = self._codecs_seen.setdefault(name, {})
            seen[codec] = seen.get(codec, 0) + 1
