"""HSA2C: highly scalable advantage actor-critic, i.e. A2C optimised by DPSGD (the DPSGD paper, Alg. 8 and 9).

A2C is cast as a DPSGD *problem* (:class:`A2CProblem`) and handed to :func:`frugalrl.dpsgd.run_dpsgd`:

- the **master** (Alg. 8) is DPSGD's parameter server: it keeps the global actor-critic weights ``θ``
  (actor and critic in one flat float32 vector) and applies ``θ ← θ + ρ Σ_m w_m`` once it holds ``M``
  update vectors;
- each **worker** (Alg. 9) pulls ``θ`` into shared memory ``u``; its ``p`` lock-free Hogwild processes
  each own ``m`` environments, and take ``B`` local steps ``u ← u − η ĝ``. One step reads ``û``, rolls
  ``k`` steps in each of its ``m`` environments (their state persists from call to call), forms
  k-step bootstrapped returns, and backpropagates the A2C loss (policy gradient with advantage,
  value loss, entropy bonus) into the gradient ``ĝ`` (clipped in norm). After ``B`` steps the worker
  pushes ``u − θ`` and pulls again.

The synchronous distributed A2C of Adamski et al. (DDRL A3C, the paper's ``B = 1`` baseline) is the
same code with ``synchronous=True, local_steps=1, master_batch=workers``
(:meth:`HSA2CConfig.as_synchronous_baseline`, DPSGD's own).

Choices and differences from the paper, and why:

- *The A2C update is Stable-Baselines3's*: with one worker, one process, ``B = 1`` and a plain master step, the
  weights after each update equal SB3's A2C's on the same trajectory to float32 rounding
  (``tests/test_a2c_sb3_replay.py`` replays SB3's actions, discrete and Box, across terminations and time limits).
  One convention differs: the value loss is ``vf_coef · ½ MSE`` (CleanRL's), SB3's ``vf_coef · MSE``.
- *Rollouts*: every local step rolls a fixed ``k`` steps in each of its ``m`` envs across episode
  boundaries (standard A2C), instead of Alg. 9's "until terminal or ``t_max``"; each gradient thus
  costs exactly ``k × m`` env steps, which is how env steps are counted. The mini-batch of Alg. 9
  (lines 20-24) is the ``m`` envs of one gradient. A truncated episode (time limit) is bootstrapped
  with the value of its last observation; a terminated one is not.
- *Local optimiser*: DPSGD takes plain steps ``u ← u − η ĝ``. With ``grad_scaling="rmsprop"``
  (the default) ``ĝ`` is the clipped gradient divided by a per-process running RMS of past
  gradients (A3C's RMSProp, unshared: each Hogwild process keeps its own statistics, which persist
  across rounds), so ``η`` is an RMSProp step size (``1e-3`` on CartPole with ``m = 8``: steadier
  than ``3e-3``); ``grad_scaling="none"`` gives plain SGD (``η`` about ``0.02``-``0.03`` on CartPole
  with clipping: it learns, but its greedy return oscillates more).
  The paper's master uses SGD with momentum 0.5; HSA2C's default is Alg. 1's plain step (``momentum`` 0, ``rho`` 1),
  which reached 200 on LunarLander sooner (``--momentum 0.5 --rho 0.5`` gives the paper's master). ``η`` is constant
  for the run's first half and falls linearly to 0 over the second (``eta_anneal`` 0.5): with a constant rate the
  policy kept drifting after it had learned (``--eta-anneal 0`` gives the paper's constant η).
- *Observation normalisation* (``norm_obs``, on by default for vector observations): the agent normalises its
  input by a running mean and variance (:class:`~frugalrl.normalize.ObsNormalizer`, as rl-zoo's ``VecNormalize``)
  whose statistics are part of DPSGD's vector, after the weights. No gradient moves them: each local step merges its
  rollout's observations into them and returns the change divided by ``η`` (:meth:`A2CProblem.set_rate`), so the
  step ``u − η g`` makes the merge, the master adds the pushes like any update, and pulls, Polyak averages,
  checkpoints and evaluations all carry them. Without it MountainCar-v0's velocity (±0.07) is invisible to the
  network and HSA2C never reached the flag in 1M steps (SB3's A2C with rl-zoo's ``normalize`` does).
- *Entropy bonus with Box actions*: the bonus counts a Gaussian's log-std at most up to half the action box
  (:func:`frugalrl.dists.entropy_bonus`): uncapped, RMSProp turned its constant push on ``log σ`` into fixed steps, and
  on Pendulum-v1 ``log σ`` ran to 5-10 (bang-bang sampling; with ``norm_obs`` the mean stopped learning on 1 seed of 3).
  ``ent_anneal`` lets the entropy coefficient fall linearly to 0 over the run's last fraction, on the global clock the workers
  pulled (:meth:`A2CProblem.set_version`); off by default (measurements in docs/benchmarks.md, "HSA2C on tasks
  nobody tuned it for").
- *State-dependent exploration with Box actions* (``sde``, on by default for them): the exploration noise is
  ``φ(s) ε``, the actor's last hidden features times a matrix drawn every ``sde_sample_freq`` (16) env steps from
  learned per-entry σ (SB3's gSDE, Raffin et al. 2022), instead of fresh independent noise each step; the one-step
  Gaussian it implies is what :meth:`~frugalrl.nets.MLPActorCritic.dist_params` returns, so the loss is unchanged.
  Its σ starts at e⁻² half-widths of the action box per feature (:data:`~frugalrl.nets.SDE_LOG_STD_INIT`). With it
  LunarLanderContinuous-v3, Walker2d-v5 and HalfCheetah-v5 end 1M steps far above independent noise (figures in
  docs/benchmarks.md, "HSA2C on tasks nobody tuned it for").
- *Server-side loss*: :meth:`A2CProblem.loss` (called by the server every ``eval_every`` global
  updates) is the negative mean return of ``log_eval_episodes`` greedy episodes on a separate
  evaluation env with fixed seeds, in the calling process. Training returns seen by workers never
  reach the server (DPSGD's wire carries only parameters and updates), so they are not reported.
- *Stopping*: on ``global_updates`` (or the global updates that ``total_timesteps`` env steps take,
  whichever is fewer), ``time_limit_s``, or the first logged greedy return at or above
  ``target_return`` (DPSGD's ``target_loss``) that ``eval_episodes`` episodes confirm (a 1- or 3-episode
  check alone stopped CartPole runs whose 10-episode return was 325); the run ends with those weights, so
  its final evaluation (the same episodes) agrees with the check. The summary reports when (seconds,
  global update, env steps) it was reached. Time to target counts from the end of worker startup, as in the paper's
  figures; with ``deferred_eval`` the returns are computed after the run and do not stop it.
- *Run*: :class:`~frugalrl.training.Training` owns the run directory, the summary and the checkpoints
  (the global weights, written on the ``checkpoint_every`` cadence as the server's losses are recorded).
  A resumed run starts DPSGD again from the checkpoint's weights for the remaining global updates, on the whole
  run's clock (``eta_anneal``, ``ent_anneal`` and the average's window go on where the first segment stopped); the
  Hogwild processes' RMSProp statistics, the master's momentum and env states start anew.
- *Polyak averaging*: by default (``average`` 0.05) the server also keeps an exponential average of ``θ`` over
  about the last 5% of the run's global updates; evaluations, the target check, checkpoints and the final
  weights are the average's, while workers keep pulling ``θ``. A constant-rate A2C keeps oscillating after it has
  learned (on LunarLander its 10-episode greedy return swung between ~90 and ~290 from one check to the next);
  the average holds still (Polyak & Juditsky 1992; Nikishin et al. 2018 showed weight averaging steadies A2C).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from frugalrl import dists
from frugalrl.algos.hsa2c_config import PROBLEM, HSA2CConfig
from frugalrl.config import NormConfig
from frugalrl.correct import gae
from frugalrl.dpsgd.rates import decayed_rate
from frugalrl.dpsgd.run import run_dpsgd
from frugalrl.envs.spec import EnvSpec, to_env_spec
from frugalrl.evaluation import EVAL_SEED, Evaluation, evaluate, policy_evaluator
from frugalrl.nets import MLPActorCritic, Net, make_agent
from frugalrl.normalize import ObsNormalizer, ReturnScaler, RunningMeanStd
from frugalrl.training import Training

__all__ = ["PROBLEM", "A2CProblem", "HSA2CConfig", "make_a2c_problem", "train"]  # the config lives in hsa2c_config


# ------------------------------------------------------------------------------------ the problem
class A2CProblem:
    """A2C as a DPSGD :class:`~frugalrl.dpsgd.Problem`: parameters are a flat actor-critic vector.

    Every process that builds it (with the same arguments) starts from the same weights (the network
    is initialised under ``torch.manual_seed(seed)``). Its ``m = envs`` environments are created and
    seeded lazily, at the first :meth:`stochastic_grad`, from that call's ``rng`` (a per-Hogwild-process
    stream), so that processes explore differently and reproducibly.
    """

    def __init__(
        self,
        env: str,
        env_kwargs: dict[str, Any] | None = None,
        envs: int = 8,
        k: int = 5,
        gae_lambda: float = 1.0,
        gamma: float = 0.99,
        ent_coef: float = 0.01,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        hidden: list[int] | tuple[int, ...] = (64, 64),
        net: Net = "auto",
        mlp_options: dict[str, Any] | None = None,
        grad_scaling: str = "rmsprop",
        rms_alpha: float = 0.99,
        rms_eps: float = 1e-5,
        seed: int = 0,
        log_eval_episodes: int = 1,
        eval_max_steps: int = 1000,
        target_return: float | None = None,
        confirm_episodes: int = 10,
        norm_reward: bool | None = False,
        norm_obs: bool | None = False,
        ent_anneal: float = 0.0,
        horizon: int | None = None,
        sde: bool | None = False,
        sde_sample_freq: int = 16,
    ) -> None:
        if grad_scaling not in ("rmsprop", "none"):
            raise ValueError(f"grad_scaling must be 'rmsprop' or 'none', got {grad_scaling!r}")
        self.env_spec: EnvSpec = to_env_spec(env, env_kwargs)
        self.m = int(envs)
        self.k = int(k)
        self.gamma = float(gamma)
        if not 0.0 <= float(gae_lambda) <= 1.0:
            raise ValueError(f"gae_lambda must be in [0, 1], got {gae_lambda!r}")
        self.gae_lambda = float(gae_lambda)
        self.ent_coef = float(ent_coef)
        if not 0.0 <= float(ent_anneal) <= 1.0:
            raise ValueError(f"ent_anneal must be a fraction in [0, 1], got {ent_anneal!r}")
        if ent_anneal and horizon is None:
            raise ValueError("ent_anneal needs a horizon (the run's global updates) to anneal the entropy bonus over")
        self.ent_anneal = float(ent_anneal)
        self.horizon = horizon
        self.ent_now = self.ent_coef
        """The entropy coefficient of the steps that follow (:meth:`set_version`)."""
        self.vf_coef = float(vf_coef)
        self.max_grad_norm = float(max_grad_norm)
        self.grad_scaling = grad_scaling
        self.rms_alpha = float(rms_alpha)
        self.rms_eps = float(rms_eps)
        self.seed = int(seed)
        self.log_eval_episodes = int(log_eval_episodes)
        self.eval_max_steps = int(eval_max_steps)
        self.target_return = None if target_return is None else float(target_return)
        self.confirm_episodes = int(confirm_episodes)
        probe = self.env_spec.make()
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()
        self.box = isinstance(self.action_space, gym.spaces.Box)
        norm_obs, norm_reward = NormConfig(norm_obs=norm_obs, norm_reward=norm_reward).normalization(self.box)
        if int(sde_sample_freq) < 1:
            raise ValueError(f"sde_sample_freq must be an integer >= 1, got {sde_sample_freq!r}")
        self.sde_sample_freq = int(sde_sample_freq)
        self.sde_eps: torch.Tensor | None = None
        """The held standard-normal exploration matrices of ``sde``, one per env (redrawn every
        ``sde_sample_freq`` env steps)."""
        self.sde_age = 0
        self.scaler = ReturnScaler(self.gamma, self.m) if norm_reward else None
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            self.agent = make_agent(self.observation_space, self.action_space, tuple(int(h) for h in hidden), net,
                                    **{**(mlp_options or {}), "obs_norm": bool(norm_obs),
                                       **({"sde": True} if (self.box if sde is None else sde) else {})})
        self.sde = bool(getattr(self.agent, "sde", False))  # the agent refuses it for Discrete actions
        self.params = list(self.agent.parameters())
        self.n_params = int(sum(p.numel() for p in self.params))
        self.obs_norm: ObsNormalizer | None = getattr(self.agent, "obs_norm", None)  # None for the CNNs
        self.size = self.n_params + (0 if self.obs_norm is None else 2 * self.obs_norm.mean.numel() + 1)
        self._merge = None if self.obs_norm is None else RunningMeanStd(tuple(self.obs_norm.mean.shape))
        """Where :meth:`_stats_step` merges a rollout into the pulled statistics (one, reused)."""
        self._init = self.flat()
        self.rate = 1.0
        """The local rate of the steps that follow (:meth:`set_rate`)."""
        self.envs: list[gym.Env] | None = None
        self.obs: list[np.ndarray] = []
        self.ep_return: list[float] = []
        self.episode_returns: list[float] = []
        """Undiscounted returns of the training episodes this process finished (for reporting)."""
        self.env_steps = 0
        self.gradients = 0
        self.generator: torch.Generator | None = None
        self.square_avg: np.ndarray | None = None

    # -- the Problem interface
    def init_params(self) -> np.ndarray:
        """The seeded initial weights, flattened (float32)."""
        return self._init.copy()

    def flat(self) -> np.ndarray:
        """The agent's weights as DPSGD's flat float32 vector: its parameters, then (with ``norm_obs``) the
        observation statistics ``mean``, ``var`` and ``count``."""
        parts = [torch.nn.utils.parameters_to_vector(self.params).detach()]
        if self.obs_norm is not None:
            parts += [self.obs_norm.mean.float(), self.obs_norm.var.float(), self.obs_norm.count.reshape(1).float()]
        return torch.cat(parts).numpy().astype(np.float32)

    def load(self, params: np.ndarray) -> None:
        """Copy the flat vector ``params`` into the network (and its observation statistics)."""
        flat = torch.from_numpy(np.ascontiguousarray(params, dtype=np.float32))
        n = self.n_params
        torch.nn.utils.vector_to_parameters(flat[:n], self.params)
        if self.obs_norm is not None:
            _load_stats(self.obs_norm, flat[n:])

    def set_rate(self, eta: float) -> None:
        """The local rate ``η`` of the steps that follow (DPSGD's workers call it each round): the observation
        statistics are not moved by a gradient, so :meth:`stochastic_grad` returns their change divided by ``η``
        (1 until this is called)."""
        self.rate = float(eta)

    def set_version(self, version: int) -> None:
        """The global update the steps that follow pulled (DPSGD's workers call it each round): with
        ``ent_anneal`` the entropy coefficient falls linearly to 0 over the run's last ``ent_anneal`` fraction of
        ``horizon`` global updates, on the whole run's clock (a resumed run's included)."""
        self.ent_now = decayed_rate(self.ent_coef, version, 0.0, 1.0,
                                    self.horizon if self.ent_anneal else None, self.ent_anneal)

    def _sde_step(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The distribution's parameters and the actions with the held state-dependent noise
        (:meth:`~frugalrl.nets.MLPActorCritic.sde_act`), the matrices redrawn every ``sde_sample_freq`` env steps."""
        agent = cast(MLPActorCritic, self.agent)  # sde is an MLP option
        if self.sde_eps is None or self.sde_age >= self.sde_sample_freq:
            self.sde_eps = torch.randn((self.m, *agent.log_std.shape), generator=self.generator)
            self.sde_age = 0
        self.sde_age += 1
        return agent.sde_act(obs, self.sde_eps)

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Roll ``k`` steps in each env with ``params``; return the (clipped, scaled) A2C gradient."""
        if self.envs is None:
            self._start_envs(rng)
        assert self.envs is not None  # built by _start_envs
        self.load(params)
        obs_buf, act_buf, rew_buf, boot_buf, done_buf = [], [], [], [], []
        with torch.no_grad():
            for _ in range(self.k):
                obs = torch.as_tensor(np.stack(self.obs), dtype=torch.float32)
                if self.sde:
                    dparams, actions = self._sde_step(obs)
                else:
                    dparams = self.agent.dist_params(obs)
                    actions = dists.sample(self.agent.dist_kind, dparams, self.generator)
                rewards = np.zeros(self.m, dtype=np.float32)
                boot = np.zeros(self.m, dtype=np.float32)  # γ V(last observation) of a truncated episode
                dones = np.zeros(self.m, dtype=np.float32)
                truncated: list[tuple[int, np.ndarray]] = []
                acts = actions.numpy()
                if isinstance(self.action_space, gym.spaces.Box):
                    acts = np.clip(acts, self.action_space.low, self.action_space.high)
                for i, env in enumerate(self.envs):
                    a = acts[i] if self.box else int(acts[i])
                    nxt, r, term, trunc, _ = env.step(a)
                    rewards[i] = float(r)
                    self.ep_return[i] += float(r)
                    if term or trunc:
                        dones[i] = 1.0
                        if trunc and not term:
                            truncated.append((i, np.asarray(nxt)))
                        self.episode_returns.append(self.ep_return[i])
                        self.ep_return[i] = 0.0
                        nxt, _ = env.reset()
                    self.obs[i] = np.asarray(nxt)
                if truncated:  # time limit: bootstrap from the last observation of the episode
                    last = torch.as_tensor(np.stack([o for _, o in truncated]), dtype=torch.float32)
                    last_values = self.agent.value(last).numpy()
                    for (i, _), v in zip(truncated, last_values, strict=True):
                        boot[i] = self.gamma * float(v)
                obs_buf.append(obs)
                act_buf.append(actions)
                rew_buf.append(rewards)
                boot_buf.append(boot)
                done_buf.append(dones)
            raw, ended = np.stack(rew_buf), np.stack(done_buf)
            scaled = raw if self.scaler is None else self.scaler.scale(raw, ended > 0)
            last_value = self.agent.value(torch.as_tensor(np.stack(self.obs), dtype=torch.float32))
        self.env_steps += self.k * self.m
        self.gradients += 1

        obs_all = torch.cat(obs_buf)
        act_all = torch.cat(act_buf)
        dparams = self.agent.dist_params(obs_all)
        values = self.agent.value(obs_all)
        # advantages by GAE over the k steps, bootstrapped from V(s_{t+k}) unless the episode ended (λ = 1: the
        # k-step returns of Alg. 9, lines 14-16); an episode's end folds γ V(its last observation) of a time limit
        # into the reward (``boot``). In the units of the scaled rewards when the rewards are scaled (the value
        # function learns those).
        v = values.detach().reshape(self.k, self.m)
        end = torch.as_tensor(ended)
        advantages, ret = gae(torch.as_tensor(scaled + np.stack(boot_buf)), v, torch.cat([v[1:], last_value[None]]),
                              end, end, self.gamma, self.gae_lambda)
        advantages, ret_all = advantages.reshape(-1), ret.reshape(-1)
        logp = dists.log_prob(self.agent.dist_kind, dparams, act_all)
        policy_loss = -(logp * advantages).mean()
        value_loss = 0.5 * (ret_all - values).pow(2).mean()
        entropy = dists.entropy_bonus(self.agent.dist_kind, dparams, self.agent.max_entropy_log_std).mean()
        loss = policy_loss + self.vf_coef * value_loss - self.ent_now * entropy
        for p in self.params:
            p.grad = None
        loss.backward()
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        # a fresh float32 tensor: its numpy view is ours to scale in place
        grad = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
        ).numpy()
        if self.grad_scaling == "rmsprop":
            if self.square_avg is None:
                self.square_avg = np.zeros_like(grad)
            self.square_avg *= np.float32(self.rms_alpha)
            self.square_avg += np.float32(1.0 - self.rms_alpha) * grad * grad
            denom = np.sqrt(self.square_avg)
            denom += np.float32(self.rms_eps)
            grad /= denom
        if self.obs_norm is not None:  # the statistics' own step: merge this rollout's observations, as u − η g
            grad = np.concatenate([grad, self._stats_step(params[self.n_params :], obs_all)])
        return grad

    def _stats_step(self, old: np.ndarray, obs: torch.Tensor) -> np.ndarray:
        """``(old − new) / η`` for the statistics ``old`` (mean, var, count) merged with the observations
        ``obs``: a local step ``u ← u − η g`` moves them to ``new``, as Chan et al.'s merge would."""
        if self.rate == 0:
            return np.zeros_like(old)  # an annealed-out rate: nothing moves, the statistics neither
        stats = self._merge
        assert stats is not None
        _load_stats(stats, torch.from_numpy(old))
        stats.update(obs.reshape(obs.shape[0], -1))
        new = torch.cat([stats.mean, stats.var, stats.count.reshape(1)]).numpy()
        return ((old.astype(np.float64) - new) / self.rate).astype(np.float32)

    def loss(self, params: np.ndarray) -> float:
        """Negative mean return of ``log_eval_episodes`` greedy episodes (fixed seeds) at ``params``.

        A few episodes are a noisy estimate: when they reach ``target_return``, the estimate is confirmed on
        ``confirm_episodes`` episodes (the first ones the same, the seeds those of the run's final evaluation)
        and that mean is the loss, so that a target stop rests on as many episodes as the final evaluation
        and agrees with it (the run stops with these parameters).
        """
        self.load(params)
        first = self.log_eval_episodes
        mean = self.evaluate(first)
        more = self.confirm_episodes - first
        if self.target_return is not None and mean >= self.target_return and more > 0:
            rest = self.evaluate(more, seed=EVAL_SEED + self.seed + first)  # the episodes after the first ones
            mean = (first * mean + more * rest) / self.confirm_episodes
        return -mean

    # -- helpers
    def _start_envs(self, rng: np.random.Generator) -> None:
        seeds = rng.integers(0, 2**31 - 1, size=self.m + 1)
        self.generator = torch.Generator().manual_seed(int(seeds[-1]))
        self.envs = [self.env_spec.make() for _ in range(self.m)]
        self.obs = []
        for i, env in enumerate(self.envs):
            env.action_space.seed(int(seeds[i]))
            obs, _ = env.reset(seed=int(seeds[i]))
            self.obs.append(np.asarray(obs))
        self.ep_return = [0.0] * self.m

    def evaluate(self, episodes: int, seed: int | None = None) -> float:
        """Mean undiscounted return of ``episodes`` greedy episodes with the loaded weights (env seeds from
        ``EVAL_SEED + seed``, those of the run's final evaluation, unless ``seed`` says otherwise)."""
        if episodes < 1:
            return 0.0
        first = EVAL_SEED + self.seed if seed is None else seed
        return evaluate(self.agent, self.env_spec, episodes, seed=first, max_steps=self.eval_max_steps)[0]


def _load_stats(stats: RunningMeanStd, flat: torch.Tensor) -> None:
    """Copy a flat ``mean, var, count`` slice of DPSGD's vector into ``stats`` (a variance that a summed update
    overshot below 0 is clamped to 0, a count to its starting 1e-4)."""
    d = stats.mean.numel()
    stats.mean.copy_(flat[:d])
    stats.var.copy_(flat[d : 2 * d].clamp(min=0.0))
    stats.count.copy_(flat[2 * d].clamp(min=1e-4))


def make_a2c_problem(**kwargs: Any) -> A2CProblem:
    """Factory of :class:`A2CProblem` (``"frugalrl.algos.hsa2c:make_a2c_problem"``)."""
    return A2CProblem(**kwargs)


# ------------------------------------------------------------------------------------ training
def train(cfg: HSA2CConfig, resume: str | Path | None = None) -> dict[str, Any]:
    """Train HSA2C as ``cfg`` says (DPSGD on :class:`A2CProblem`); write the run directory; return the summary.

    ``env_steps`` are gradients × k × m (exact); the steps of the ``eval_history`` are global updates ×
    :attr:`HSA2CConfig.env_steps_per_update` (each entry also names its ``global_update``). ``details``:
    ``gradients``, ``global_updates`` (made), ``weights_from_update`` (the final weights': the one that met the
    target after a target stop), ``startup_seconds``, ``bytes_per_update``, ``pushes``,
    ``applied_updates``, ``dropped_updates``, ``staleness``, ``dpsgd_stop_reason``, the parallelism and the
    rates as used. ``train_seconds`` are DPSGD's optimisation seconds (worker startup excluded).
    Raises ``ValueError`` for a bad config, :class:`~frugalrl.dpsgd.DPSGDError` if a worker fails.
    """
    run = Training("hsa2c", cfg, tag=f"B{cfg.local_steps}", resume=resume)
    env_spec = to_env_spec(cfg.env, cfg.env_kwargs)  # fails here, with the env's name, if unknown
    problem = A2CProblem(**cfg.problem_kwargs())  # scores the recorded weights, then the final ones
    agent = problem.agent

    run.attach(agent=agent)
    budget = cfg.budget_updates
    per_update = cfg.env_steps_per_update
    run.begin(policy_evaluator(agent, env_spec, cfg, max_steps=cfg.eval_max_steps), (budget or 0) * per_update,
              evaluate_stochastic=policy_evaluator(agent, env_spec, cfg, False, cfg.eval_max_steps))
    done = run.updates  # global updates of earlier segments (a resumed run)
    steps0, seconds0 = run.env_steps, run.seconds()
    last_saved = done

    def on_record(seconds: float, version: int, loss: float, params: np.ndarray) -> None:
        nonlocal last_saved
        update, step = done + version, steps0 + version * per_update  # steps: an estimate, see train()
        if version == 0 and done:
            return  # a resumed run's starting point was recorded by the segment before
        problem.load(params)  # the agent holds the recorded weights: checkpoints/best.pt and latest.pt save them
        run.record_eval(Evaluation(-loss, 0.0, cfg.log_eval_episodes), step, seconds0 + seconds,
                        global_update=update)
        run.log({"eval/return_mean": -loss, "global_update": update}, step=step, seconds=seconds0 + seconds)
        run.progress_to(step)
        every = cfg.checkpoint_every
        if every and not cfg.deferred_eval and update // every > last_saved // every:
            run.set_totals(step, update)
            run.save()
            last_saved = update

    initial = problem.flat() if done else None
    out = run_dpsgd(cfg.dpsgd_config(done), problem, initial=initial, on_record=on_record)

    problem.load(out["params"])
    gradients = int(out["gradient_steps"])
    version = done + int(out["global_updates"])
    run.set_totals(steps0 + gradients * cfg.env_steps_per_gradient, version, seconds=seconds0 + float(out["wall_time_s"]))
    run.stop_reason = _STOP_REASONS.get(out["stop_reason"], out["stop_reason"])
    nbytes = out["bytes"]
    details = {
        "gradients": gradients,
        "global_updates": version,
        "weights_from_update": done + int(out["params_version"]),
        "startup_seconds": round(float(out["startup_s"]), 3),
        "bytes_per_update": nbytes.get("total", 0) / max(int(out["global_updates"]), 1),
        "pushes": int(out["pushes"]),
        "applied_updates": int(out["applied_updates"]),
        "dropped_updates": int(out["dropped_updates"]),
        "staleness": out["staleness"],
        "dpsgd_stop_reason": out["stop_reason"],
        "synchronous": cfg.synchronous,
        "workers": cfg.workers,
        "processes": cfg.processes,
        "local_steps": cfg.local_steps,
        "master_batch": cfg.master_batch,
        "rho": out["rho"],
        "eta": out["eta"],
    }
    traffic = {"bytes": nbytes, "weight_syncs": {"total": int(out["pulls"]), "per_worker": []}}
    return run.finish(details, traffic=traffic, always_evaluate=True)


_STOP_REASONS = {"global_updates": "budget", "target_loss": "target_return"}
"""DPSGD's stop reasons in the run summary's words."""
