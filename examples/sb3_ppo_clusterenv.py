"""Stable-Baselines3's PPO on ClusterEnv, through frugalrl's SB3 adapter (``pip install 'frugalrl[sb3]'``).

The environments step in worker processes; SB3 sees an ordinary ``VecEnv``, and every byte between the
head and the workers is counted:

    python examples/sb3_ppo_clusterenv.py --total-timesteps 40000
    python examples/sb3_ppo_clusterenv.py --workers 4 --envs-per-worker 2

The hyperparameters are rl-zoo's for CartPole-v1.
"""

from __future__ import annotations

import argparse
import time

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy

from frugalrl.integrations.sb3 import make_sb3_vec_env


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--total-timesteps", type=int, default=40_000)
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--backend", default="local", choices=["local", "serial", "ray"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=10)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    venv = make_sb3_vec_env(args.env_id, num_workers=args.workers, envs_per_worker=args.envs_per_worker,
                            backend=args.backend, seed=args.seed)
    try:
        model = PPO("MlpPolicy", venv, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                    ent_coef=0.0, learning_rate=lambda f: 1e-3 * f, clip_range=lambda f: 0.2 * f,
                    seed=args.seed, device="cpu")
        start = time.time()
        model.learn(args.total_timesteps)
        seconds = time.time() - start
        train = [ep["r"] for ep in model.ep_info_buffer]
        mean, std = evaluate_policy(model, venv, n_eval_episodes=args.eval_episodes, deterministic=True)
        print(f"{model.num_timesteps} steps in {seconds:.1f} s; training return (last {len(train)} episodes) "
              f"{sum(train) / max(1, len(train)):.1f}; evaluation return {mean:.1f} +- {std:.1f}")
        b = venv.bytes
        print(f"bytes on the wire: {b['total'] / 1e6:.2f} MB (observations {b['observations'] / 1e6:.2f}, "
              f"actions {b['actions'] / 1e6:.2f}, rewards {b['rewards'] / 1e6:.2f}, control {b['control'] / 1e6:.2f}); "
              f"worker restarts {venv.stats()['restarts']}")
    finally:
        venv.close()


if __name__ == "__main__":
    main()
