"""CleanRL's PPO (discrete actions), with ClusterEnv as a drop-in for gym.vector.SyncVectorEnv.

The only change from CleanRL's ppo.py is the line that builds the envs:

    - envs = gym.vector.SyncVectorEnv([make_env(args.env_id) for _ in range(args.num_envs)])
    + envs = frugalrl.ClusterEnv(args.env_id, num_workers=args.workers, envs_per_worker=args.num_envs // args.workers,
    +                            seed=args.seed)

Everything else (the Agent, GAE, the update) is CleanRL's, with Gymnasium 1.x NEXT_STEP autoreset
handled as CleanRL does. Run:

    python examples/ppo_clusterenv.py --env-id CartPole-v1 --total-timesteps 100000
    python examples/ppo_clusterenv.py --sync-vector-env     # the same script on SyncVectorEnv

For worker-side inference and adaptive weight sync, see ``frugalrl train ppo`` (frugalrl/algos/ppo.py),
which uses ``envs.rollout(agent, num_steps)`` instead of ``envs.step(actions)``.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

import frugalrl


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=100_000)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--sync-vector-env", action="store_true", help="use gym.vector.SyncVectorEnv instead")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch threads in this process (0: torch's default; one leaves the workers their cores)")
    p.add_argument("--inline-workers", type=int, default=None,
                   help="ClusterEnv workers stepped in this process (default: ClusterEnv's own choice)")
    return p.parse_args()


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        n_obs = int(np.array(envs.single_observation_space.shape).prod())
        self.critic = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def main() -> None:
    args = parse_args()
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    np.random.seed(args.seed)  # the minibatch shuffles (CleanRL seeds it too)
    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    if args.sync_vector_env:
        envs = gym.vector.SyncVectorEnv([lambda: gym.make(args.env_id) for _ in range(args.num_envs)])
    else:
        envs = frugalrl.ClusterEnv(args.env_id, num_workers=args.workers,
                                   envs_per_worker=args.num_envs // args.workers, seed=args.seed,
                                   inline_workers=args.inline_workers)
    agent = Agent(envs)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
    logprobs = torch.zeros((args.num_steps, args.num_envs))
    rewards = torch.zeros((args.num_steps, args.num_envs))
    dones = torch.zeros((args.num_steps, args.num_envs))
    values = torch.zeros((args.num_steps, args.num_envs))

    global_step, start = 0, time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs, next_done = torch.Tensor(next_obs), torch.zeros(args.num_envs)
    returns, ep_ret = [], np.zeros(args.num_envs)
    for iteration in range(1, num_iterations + 1):
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            next_obs, reward, terminations, truncations, _ = envs.step(action.numpy())
            ep_ret += reward
            for i in np.flatnonzero(np.logical_or(terminations, truncations)):
                returns.append(ep_ret[i])
                ep_ret[i] = 0.0
            next_done = torch.Tensor(np.logical_or(terminations, truncations).astype(np.float32))
            rewards[step] = torch.tensor(reward, dtype=torch.float32).view(-1)
            next_obs = torch.Tensor(next_obs)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                nextnonterminal = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            b_returns = (advantages + values).reshape(-1)

        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_inds = np.arange(batch_size)
        for _ in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start_i in range(0, batch_size, minibatch_size):
                mb = b_inds[start_i : start_i + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = b_advantages[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        if iteration % 10 == 0 or iteration == num_iterations:
            recent = np.mean(returns[-20:]) if returns else float("nan")
            print(f"step {global_step:>8}  return(last 20) {recent:7.1f}  sps {global_step / (time.time() - start):6.0f}")

    if isinstance(envs, frugalrl.ClusterEnv):
        stats = envs.stats()["bytes"]
        print(f"bytes on the wire: {stats['total'] / 1e6:.2f} MB "
              f"(observations {stats['observations'] / 1e6:.2f}, actions {stats['actions'] / 1e6:.2f}, "
              f"control {stats['control'] / 1e6:.2f})")
    envs.close()


if __name__ == "__main__":
    main()
