"""HSA2C's A2C core against Stable-Baselines3's A2C, update by update.

SB3's A2C trains for a few dozen updates while a callback records its actions and its weights after each update.
:class:`~frugalrl.algos.hsa2c.A2CProblem` then starts from SB3's initial weights, in envs seeded as SB3's
``make_vec_env`` seeds them, and replays the same actions (only the sampler is replaced: everything else,
rollouts, k-step returns, time-limit bootstrapping, the loss, clipping and RMSProp, is the default path; with
``gae_lambda`` below 1 the advantages are GAE's, as SB3's with the same λ). Taking
``u ← u − η g`` with SB3's rate after each of its gradients must give SB3's weights after each update.

The one convention that differs is the value loss: SB3's is ``vf_coef · MSE``, frugalrl's ``vf_coef · ½ MSE``
(CleanRL's), so frugalrl's ``vf_coef = 1`` is SB3's default 0.5.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from stable_baselines3 import A2C  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

from frugalrl import dists  # noqa: E402
from frugalrl.algos.hsa2c import A2CProblem, HSA2CConfig  # noqa: E402
from frugalrl.envs.spec import to_env_spec  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SEED, ENVS, K, GAMMA, ENT, LR = 3, 8, 5, 0.995, 1e-5, 8.3e-4  # rl-zoo's LunarLander A2C, a linear rate
SB3_NAMES = {"actor.0": "mlp_extractor.policy_net.0", "actor.2": "mlp_extractor.policy_net.2", "actor.4": "action_net",
             "critic.0": "mlp_extractor.value_net.0", "critic.2": "mlp_extractor.value_net.2",
             "critic.4": "value_net", "log_std": "log_std"}
"""frugalrl's MLPActorCritic parameter (module path) → SB3's MlpPolicy parameter."""


class Recorder(BaseCallback):
    """SB3's sampled actions, step by step, and its weights at the start of each rollout (after each update)."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: list[np.ndarray] = []
        self.weights: list[dict[str, torch.Tensor]] = []
        self.truncations = 0

    def _on_rollout_start(self) -> None:
        self.weights.append({n: p.detach().clone() for n, p in self.model.policy.named_parameters()})

    def _on_step(self) -> bool:
        self.actions.append(np.array(self.locals["actions"]).copy())
        self.truncations += sum(bool(info.get("TimeLimit.truncated")) for info in self.locals["infos"])
        return True


def sb3_name(ours: str) -> str:
    module, _, kind = ours.rpartition(".")
    return SB3_NAMES[ours] if not module else f"{SB3_NAMES[module]}.{kind}"


def flat(agent: torch.nn.Module, weights: dict[str, torch.Tensor]) -> np.ndarray:
    """SB3's ``weights`` as a flat vector in the order of ``agent``'s parameters."""
    return torch.cat([weights[sb3_name(n)].reshape(-1) for n, _ in agent.named_parameters()]).numpy()


@pytest.mark.parametrize(
    ("env", "env_kwargs", "updates", "truncated", "lam"),
    [
        ("LunarLander-v3", {}, 60, False, 1.0),  # discrete actions; episodes end by crashing (terminated)
        ("CartPole-v1", {"max_episode_steps": 30}, 40, True, 1.0),  # and by the time limit too (bootstrapped)
        ("Pendulum-v1", {"max_episode_steps": 30}, 20, True, 1.0),  # Box actions (Gaussian, clipped in the env only)
        ("CartPole-v1", {"max_episode_steps": 30}, 40, True, 0.9),  # GAE's advantages (gae_lambda)
        ("Pendulum-v1", {"max_episode_steps": 30}, 20, True, 0.9),
    ],
)
def test_a2c_problem_replays_sb3_a2c_update_by_update(
    env: str, env_kwargs: dict[str, Any], updates: int, truncated: bool, lam: float
) -> None:
    spec = to_env_spec(env, env_kwargs)
    total = updates * ENVS * K
    model = A2C("MlpPolicy", make_vec_env(spec.make, n_envs=ENVS, seed=SEED), seed=SEED, device="cpu", n_steps=K,
                gamma=GAMMA, gae_lambda=lam, ent_coef=ENT, learning_rate=lambda progress: progress * LR)
    rec = Recorder()
    model.learn(total_timesteps=total, callback=rec)
    rec.weights.append({n: p.detach().clone() for n, p in model.policy.named_parameters()})
    assert len(rec.weights) == updates + 1 and len(rec.actions) == updates * K

    problem = A2CProblem(HSA2CConfig(env=env, env_kwargs=env_kwargs, envs_per_process=ENVS, num_steps=K, gamma=GAMMA,
                                     gae_lambda=lam, ent_coef=ENT, vf_coef=1.0, max_grad_norm=0.5, norm_obs=False,
                                     norm_reward=False, sde=False))
    agent = problem.agent
    u = flat(agent, rec.weights[0])
    problem._start_envs(np.random.default_rng(0))
    assert problem.group is not None
    for i in range(ENVS):  # make_vec_env's seeds
        problem.group.reset(i, seed=SEED + i)
    actions = iter(rec.actions)

    def replayed(kind: str, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.as_tensor(next(actions), dtype=torch.int64 if kind == "categorical" else torch.float32)

    start = u.copy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dists, "sample", replayed)
        for i in range(updates):
            rate = LR * (1.0 - (i + 1) * ENVS * K / total)  # SB3's progress after the rollout
            u -= np.float32(rate) * problem.stochastic_grad(u.copy(), np.random.default_rng(0))
            sb3 = flat(agent, rec.weights[i + 1])
            drift = np.linalg.norm(sb3 - start)
            assert drift > 0
            # float32 rounding only: a different return, loss term or optimiser step would be of the drift's order
            assert np.linalg.norm(u - sb3) <= 1e-5 * drift + 1e-6, f"update {i + 1}: {np.linalg.norm(u - sb3)}"
    assert problem.episodes  # the replay crossed episode ends
    assert (rec.truncations > 0) == truncated
