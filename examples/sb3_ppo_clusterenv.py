"""Stable-Baselines3's PPO on ClusterEnv, rl-zoo style, through frugalrl's SB3 adapter (``pip install 'frugalrl[sb3]'``).

The environments step in worker processes; SB3 sees an ordinary ``VecEnv``, and every byte between the head and
the workers is counted. Hyperparameters come as rl-zoo's ``ppo.yml`` has them (``n_envs``, ``normalize``,
``frame_stack``, ``env_wrapper``, ``lin_`` schedules, PPO's own keys); ``--hyperparams`` overrides any of them::

    python examples/sb3_ppo_clusterenv.py --env-id CartPole-v1
    python examples/sb3_ppo_clusterenv.py --env-id Pendulum-v1 --workers 4
    python examples/sb3_ppo_clusterenv.py --hyperparams '{"normalize": true, "frame_stack": 2,
        "env_wrapper": [{"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 200}}]}'

Env wrappers go around each env in the workers, outside SB3's ``Monitor`` (as ``make_vec_env`` puts them); the
Monitor files are written to ``--log-folder`` (a temporary folder if none).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import load_results
from stable_baselines3.common.vec_env import VecEnv, VecFrameStack, VecNormalize

from frugalrl.integrations.sb3 import make_sb3_vec_env
from frugalrl.nets import import_string

#: rl-zoo's ppo.yml entries for these envs (hyperparams/ppo.yml of DLR-RM/rl-baselines3-zoo).
HYPERPARAMS: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(n_envs=8, n_timesteps=100_000, policy="MlpPolicy", n_steps=32, batch_size=256,
                        gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate="lin_0.001",
                        clip_range="lin_0.2"),
    "Pendulum-v1": dict(normalize=True, n_envs=4, n_timesteps=100_000, policy="MlpPolicy", n_steps=1024,
                        gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3, clip_range=0.2,
                        use_sde=True, sde_sample_freq=4),
    "LunarLander-v3": dict(n_envs=16, n_timesteps=1_000_000, policy="MlpPolicy", n_steps=1024, batch_size=64,
                           gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01),
}
ENV_KEYS = ("n_envs", "n_timesteps", "policy", "normalize", "frame_stack", "env_wrapper")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="CartPole-v1", choices=sorted(HYPERPARAMS))
    p.add_argument("--hyperparams", type=json.loads, default={}, help="a JSON object overriding the preset's keys")
    p.add_argument("--total-timesteps", type=int, default=None, help="default: the preset's n_timesteps")
    p.add_argument("--n-envs", type=int, default=None, help="default: the preset's n_envs")
    p.add_argument("--workers", type=int, default=2, help="worker processes (dividing n_envs)")
    p.add_argument("--backend", default="local", choices=["local", "serial", "ray"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--log-folder", default=None, help="where the Monitor files go (default: a temporary folder)")
    return p.parse_args()


def schedule(value: Any) -> Any:
    """rl-zoo's ``"lin_<x>"``: a learning rate or clip range decaying linearly from x to 0."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress: progress * start
    return value


def wrap_all(env: gym.Env, wrappers: list[tuple[str, dict[str, Any]]]) -> gym.Env:
    """rl-zoo's ``env_wrapper`` list: each ``"module:Class"`` with its keyword arguments, innermost first."""
    for name, kwargs in wrappers:
        env = import_string(name)(env, **kwargs)
    return env


def make_env(args: argparse.Namespace, hp: dict[str, Any], monitor_dir: str) -> VecEnv:
    wrappers = [(w, {}) if isinstance(w, str) else next(iter(w.items())) for w in hp.get("env_wrapper") or []]
    venv: VecEnv = make_sb3_vec_env(
        args.env_id, num_workers=args.workers, n_envs=args.n_envs or hp["n_envs"], backend=args.backend,
        seed=args.seed, monitor_dir=monitor_dir, wrapper_class=wrap_all if wrappers else None,
        wrapper_kwargs={"wrappers": wrappers} if wrappers else None)
    if hp.get("frame_stack"):
        venv = VecFrameStack(venv, n_stack=int(hp["frame_stack"]))
    if hp.get("normalize"):
        venv = VecNormalize(venv, **(hp["normalize"] if isinstance(hp["normalize"], dict) else {}))
    return venv


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    hp = {**HYPERPARAMS[args.env_id], **args.hyperparams}
    with tempfile.TemporaryDirectory() as tmp:
        monitor_dir = args.log_folder or tmp
        venv = make_env(args, hp, monitor_dir)
        try:
            algo = {k: schedule(v) for k, v in hp.items() if k not in ENV_KEYS}
            model = PPO(hp["policy"], venv, seed=args.seed, device="cpu", **algo)
            start = time.time()
            model.learn(args.total_timesteps or int(hp["n_timesteps"]))
            seconds = time.time() - start
            if isinstance(venv, VecNormalize):
                venv.training = False
            mean, std = evaluate_policy(model, venv, n_eval_episodes=args.eval_episodes, deterministic=True)
            adapter = venv.unwrapped
            b = adapter.bytes  # type: ignore[attr-defined]
        finally:
            venv.close()
        episodes = load_results(monitor_dir)
        print(f"{args.env_id}: {model.num_timesteps} steps in {seconds:.1f} s; {len(episodes)} training episodes in "
              f"the Monitor files (mean return {episodes.r.mean():.1f}); evaluation return {mean:.1f} +- {std:.1f}")
        print(f"bytes on the wire: {b['total'] / 1e6:.2f} MB (observations {b['observations'] / 1e6:.2f}, "
              f"actions {b['actions'] / 1e6:.2f}, rewards {b['rewards'] / 1e6:.2f}, control {b['control'] / 1e6:.2f})")


if __name__ == "__main__":
    main()
