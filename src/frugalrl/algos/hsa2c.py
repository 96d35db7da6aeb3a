"""HSA2C: highly scalable advantage actor-critic, i.e. A2C optimised by DPSGD (the DPSGD paper, Alg. 8 and 9).

A2C is cast as a DPSGD *problem* (:class:`A2CProblem`) and handed to :func:`frugalrl.dpsgd.run.dpsgd_records`: the
**master** (Alg. 8) is DPSGD's parameter server, holding the actor-critic weights ``θ`` as one flat float32 vector;
each **worker** (Alg. 9) pulls ``θ`` into shared memory, where ``p`` Hogwild processes, each owning ``m`` envs, take
``B`` local steps ``u ← u − η ĝ`` on A2C gradients of ``k``-step rollouts, and then pushes ``u − θ``. The
synchronous DDRL A3C baseline is the same code (:meth:`HSA2CConfig.as_synchronous_baseline`).

Where it departs from the paper (the maths: docs/dpsgd.md; why each default: docs/benchmarks.md#hsa2c-defaults):

- the A2C update is SB3's (``tests/test_a2c_sb3_replay.py``) but for the value loss, CleanRL's ``vf_coef · ½ MSE``;
- a rollout is ``k = num_steps`` steps per env across episode boundaries (a fragment of
  :mod:`frugalrl.experience`), so a gradient costs ``k × m`` env steps; truncated episodes are bootstrapped;
- ``ĝ`` is divided by a per-process running RMS (A3C's unshared RMSProp, ``grad_scaling``), the master takes
  Alg. 1's plain step, and ``η`` cools down over the run's second half (``eta_anneal``);
- the observation normaliser's statistics ride in DPSGD's vector after the weights: a local step returns their
  change divided by ``η`` (:meth:`A2CProblem.set_rate`), so pushes, pulls, averages and checkpoints carry them;
- with Box actions the entropy bonus counts ``log σ`` only up to half the action box
  (:func:`frugalrl.dists.entropy_bonus`) and exploration is state-dependent (gSDE, ``sde``);
- the server's loss is minus the greedy return on a separate evaluation env (:meth:`A2CProblem.loss`) of its
  Polyak average of ``θ`` (``average``), which checkpoints and the final weights also are; a target hit is
  confirmed on ``eval_episodes`` episodes before the run stops with those weights;
- :class:`HSA2C` runs through :func:`frugalrl.driver.drive`, the server's records as its updates; a resumed run goes
  on on the whole run's clock, while RMSProp statistics, master momentum and env states start anew.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from frugalrl import dists
from frugalrl.algos.hsa2c_config import PROBLEM, HSA2CConfig
from frugalrl.config import config_from_dict
from frugalrl.dpsgd.rates import decayed_rate
from frugalrl.dpsgd.run import dpsgd_records
from frugalrl.dpsgd.transport import DPSGDError
from frugalrl.driver import Algorithm, Callback, Setup, Step, Update, drive
from frugalrl.envs.restarts import WorkersFailed
from frugalrl.envs.spec import EnvSpec, to_env_spec
from frugalrl.envs.worker import WorkerError
from frugalrl.evaluation import EVAL_SEED, Evaluation, evaluate, policy_evaluator
from frugalrl.experience import EnvGroup, collect_fragment
from frugalrl.nets import MLPActorCritic, make_agent
from frugalrl.normalize import ObsNormalizer, ReturnScaler, RunningMeanStd
from frugalrl.returns import gae, next_values_of

__all__ = ["PROBLEM", "A2CProblem", "HSA2CConfig", "make_a2c_problem", "train"]  # the config lives in hsa2c_config


# ------------------------------------------------------------------------------------ the problem
class A2CProblem:
    """A2C as a DPSGD :class:`~frugalrl.dpsgd.Problem`: parameters are a flat actor-critic vector.

    Every process builds it from the run's config and starts from the same weights (the network is initialised
    under ``torch.manual_seed(seed)``). Its ``m = envs_per_process`` environments are created and seeded lazily, at
    the first :meth:`stochastic_grad`, from that call's ``rng`` (a per-Hogwild-process stream), so that processes
    explore differently and reproducibly.
    """

    def __init__(self, cfg: HSA2CConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.env_spec: EnvSpec = to_env_spec(cfg.env, cfg.env_kwargs, cfg.env_wrappers)
        self.m = cfg.envs_per_process
        self.num_steps = cfg.num_steps
        self.gamma = float(cfg.gamma)
        self.gae_lambda = float(cfg.gae_lambda)
        self.ent_coef = float(cfg.ent_coef)
        self.ent_anneal = float(cfg.ent_anneal)
        self.horizon = cfg.budget_updates
        self.ent_now = self.ent_coef
        """The entropy coefficient of the steps that follow (:meth:`set_version`)."""
        self.seed = int(cfg.seed)
        probe = self.env_spec.make()
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()
        self.box = isinstance(self.action_space, gym.spaces.Box)
        norm_obs, norm_reward = cfg.normalization(self.box)
        self.sde_sample_freq = cfg.sde_sample_freq
        self.sde_eps: torch.Tensor | None = None
        """The held standard-normal exploration matrices of ``sde``, one per env (redrawn every
        ``sde_sample_freq`` env steps)."""
        self.sde_age = 0
        self.scaler = ReturnScaler(self.gamma, self.m) if norm_reward else None
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            self.agent = make_agent(self.observation_space, self.action_space, tuple(int(h) for h in cfg.hidden),
                                    cfg.net, **{**cfg.mlp_options(), "obs_norm": bool(norm_obs),
                                                **({"sde": True} if (self.box if cfg.sde is None else cfg.sde) else {})})
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
        self.group: EnvGroup | None = None
        self.episodes = 0
        """Training episodes this process finished (a count: a list of their returns would grow for as long as the
        run lasts)."""
        self.env_steps = 0
        self.gradients = 0
        self.generator: torch.Generator | None = None
        self.square_avg: np.ndarray | None = None
        self.joined_at: int | None = None
        """The global update (whole run's clock) of this process's first round: above 0, it joined a run in
        progress (a replacement, or a resumed run), and its RMSProp average starts from its first squared gradient
        instead of zero (:meth:`stochastic_grad`)."""

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
        if self.joined_at is None:
            self.joined_at = int(version)
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

    def _act(self, obs: np.ndarray) -> tuple[np.ndarray, None]:
        """Actions for the observations ``obs`` (sampled, or with gSDE's held noise)."""
        x = torch.as_tensor(obs, dtype=torch.float32)
        if self.sde:
            return self._sde_step(x)[1].numpy(), None
        return dists.sample(self.agent.dist_kind, self.agent.dist_params(x), self.generator).numpy(), None

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Roll ``num_steps`` steps in each env with ``params``; return the (clipped, scaled) A2C gradient."""
        if self.group is None:
            self._start_envs(rng)
        assert self.group is not None  # built by _start_envs
        self.load(params)
        with torch.no_grad():
            f = collect_fragment(self.group, self._act, self.num_steps)
        self.episodes += len(f.episode_returns)
        ended = np.logical_or(f.terminations, f.truncations)
        scaled = f.rewards if self.scaler is None else self.scaler.scale(f.rewards, ended)
        self.env_steps += self.num_steps * self.m
        self.gradients += 1

        obs_all = torch.as_tensor(f.obs, dtype=torch.float32).reshape(self.num_steps * self.m, *f.obs.shape[2:])
        act_all = torch.as_tensor(f.actions).reshape(self.num_steps * self.m, *f.actions.shape[2:])
        dparams = self.agent.dist_params(obs_all)
        values = self.agent.value(obs_all)
        # advantages by GAE over the k steps (λ = 1: the k-step returns of Alg. 9, lines 14-16), bootstrapped from
        # V(s_{t+k}), from V(last observation) where an episode was truncated, not where it terminated; in the units
        # of the scaled rewards when the rewards are scaled (the value function learns those).
        v = values.detach().reshape(self.num_steps, self.m)
        with torch.no_grad():
            last_value = self.agent.value(torch.as_tensor(f.next_obs, dtype=torch.float32))
            final_idx = torch.from_numpy(f.final_idx).long()
            final_values = (self.agent.value(torch.as_tensor(f.final_obs, dtype=torch.float32)) if len(f.final_obs)
                            else v.new_zeros(0))
        next_values = next_values_of(v, last_value, final_idx, final_values)
        advantages, ret = gae(torch.as_tensor(scaled), v, next_values, torch.as_tensor(f.terminations),
                              torch.as_tensor(ended), self.gamma, self.gae_lambda)
        advantages, ret_all = advantages.reshape(-1), ret.reshape(-1)
        logp = dists.log_prob(self.agent.dist_kind, dparams, act_all)
        policy_loss = -(logp * advantages).mean()
        value_loss = 0.5 * (ret_all - values).pow(2).mean()
        entropy = dists.entropy_bonus(self.agent.dist_kind, dparams, self.agent.max_entropy_log_std).mean()
        loss = policy_loss + self.cfg.vf_coef * value_loss - self.ent_now * entropy
        for p in self.params:
            p.grad = None
        loss.backward()
        if self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        # a fresh float32 tensor: its numpy view is ours to scale in place
        grad = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
        ).numpy()
        if self.cfg.grad_scaling == "rmsprop":
            if self.square_avg is None:
                # From zero (PyTorch's RMSprop, A2C's), the first steps are up to 1 / sqrt(1 - alpha) = 10 times
                # the later ones: harmless on the run's random start, not on a trained policy a late joiner steps.
                self.square_avg = grad * grad if self.joined_at else np.zeros_like(grad)
            self.square_avg *= np.float32(self.cfg.rms_alpha)
            self.square_avg += np.float32(1.0 - self.cfg.rms_alpha) * grad * grad
            denom = np.sqrt(self.square_avg)
            denom += np.float32(self.cfg.rms_eps)
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
        first = self.cfg.log_eval_episodes
        mean = self.evaluate(first)
        more = self.cfg.eval_episodes - first
        if self.cfg.target_return is not None and mean >= self.cfg.target_return and more > 0:
            rest = self.evaluate(more, seed=EVAL_SEED + self.seed + first)  # the episodes after the first ones
            mean = (first * mean + more * rest) / self.cfg.eval_episodes
        return -mean

    # -- helpers
    def _start_envs(self, rng: np.random.Generator) -> None:
        seeds = rng.integers(0, 2**31 - 1, size=self.m + 1)
        self.generator = torch.Generator().manual_seed(int(seeds[-1]))
        name = self.env_spec.describe()
        self.group = EnvGroup([self.env_spec.make() for _ in range(self.m)], where=lambda i: f"env {i} ({name})")
        for i, env in enumerate(self.group.envs):
            env.action_space.seed(int(seeds[i]))
            self.group.reset(i, seed=int(seeds[i]))

    def evaluate(self, episodes: int, seed: int | None = None) -> float:
        """Mean undiscounted return of ``episodes`` greedy episodes with the loaded weights (env seeds from
        ``EVAL_SEED + seed``, those of the run's final evaluation, unless ``seed`` says otherwise)."""
        if episodes < 1:
            return 0.0
        first = EVAL_SEED + self.seed if seed is None else seed
        return evaluate(self.agent, self.env_spec, episodes, seed=first, max_steps=self.cfg.eval_max_steps)[0]


def _load_stats(stats: RunningMeanStd, flat: torch.Tensor) -> None:
    """Copy a flat ``mean, var, count`` slice of DPSGD's vector into ``stats`` (a variance that a summed update
    overshot below 0 is clamped to 0, a count to its starting 1e-4)."""
    d = stats.mean.numel()
    stats.mean.copy_(flat[:d])
    stats.var.copy_(flat[d : 2 * d].clamp(min=0.0))
    stats.count.copy_(flat[2 * d].clamp(min=1e-4))


def make_a2c_problem(config: dict[str, Any]) -> A2CProblem:
    """Factory of :class:`A2CProblem` from the run's config as JSON (``"frugalrl.algos.hsa2c:make_a2c_problem"``)."""
    return A2CProblem(config_from_dict(HSA2CConfig, config))


# ------------------------------------------------------------------------------------ training
class HSA2C(Algorithm):
    """HSA2C's parts; its updates are the records of the DPSGD server, which runs on its own (asynchronously).

    ``env_steps`` are gradients × k × m (exact, counted at the end); the steps of the ``eval_history`` are global
    updates × :attr:`HSA2CConfig.env_steps_per_update` (each entry also names its ``global_update``).
    ``train_seconds`` are DPSGD's optimisation seconds (worker start-up excluded: ``startup_seconds``).
    """

    name = "hsa2c"

    def __init__(self, cfg: HSA2CConfig) -> None:
        super().__init__(cfg)
        self.cfg: HSA2CConfig = cfg
        self.records: Generator[tuple[float, int, float, np.ndarray], str | None, dict[str, Any]] | None = None
        self.out: dict[str, Any] | None = None

    def tag(self) -> str:
        return f"B{self.cfg.local_steps}"

    def setup(self) -> Setup:
        cfg = self.cfg
        # fails here, with the env's name, if unknown
        env_spec = to_env_spec(cfg.env, cfg.env_kwargs, cfg.env_wrappers)
        self.problem = A2CProblem(cfg)  # scores the recorded weights, then the final ones
        agent = self.problem.agent
        return Setup(
            {"agent": agent}, total_updates=cfg.budget_updates, steps_per_update=cfg.env_steps_per_update,
            exact_steps=False,
            evaluate=policy_evaluator(agent, env_spec, cfg),
            evaluate_stochastic=policy_evaluator(agent, env_spec, cfg, False),
            final_evaluation="always",
        )

    def start(self) -> None:
        run = self.run
        self.done, self.steps0, self.seconds0 = run.updates, run.env_steps, run.seconds()  # earlier segments'
        budget = self.cfg.budget_updates
        if budget is not None and self.done >= budget:  # a resume of a run that made its budget: no worker starts
            return
        initial = self.problem.flat() if self.done else None
        self.records = dpsgd_records(self.cfg.dpsgd_config(self.done), self.problem, initial=initial)

    def update(self, step: Step) -> Update:
        """The server's next recorded loss, as an update report with its evaluation (the agent then holds the
        recorded weights, which ``best.pt`` and the checkpoints save)."""
        assert self.records is not None
        try:
            seconds, version, loss, params = next(self.records)
            if version == 0 and self.done:  # a resumed run's starting point was recorded by the segment before
                seconds, version, loss, params = next(self.records)
        except StopIteration as end:
            self.out = end.value
            return Update(0, updates=0, stop_reason=self._stop_reason())
        except DPSGDError as e:  # a worker's env raised, or a worker died: the run stops with the recorded weights
            raise _worker_failure(e) from e
        update = self.done + version
        self.problem.load(params)
        return Update((update - self.run.updates) * self.cfg.env_steps_per_update, {"global_update": update},
                      updates=update - self.run.updates, seconds=self.seconds0 + seconds,
                      evaluation=Evaluation(-loss, 0.0, self.cfg.log_eval_episodes),
                      evaluation_info={"global_update": update})

    def _stop_reason(self) -> str:
        assert self.out is not None
        return _STOP_REASONS.get(self.out["stop_reason"], self.out["stop_reason"])

    def end(self) -> Update:
        """Let the server finish (asking it to stop when the run ended before it did), load its final weights and
        report the exact totals: gradients × k × m env steps, its global updates and its clock."""
        if self.records is None:  # nothing left to train (start())
            return Update(0, updates=0, stop_reason="budget")
        if self.out is None:
            command: str | None = "stop" if self.run.stopped else None
            try:
                while True:
                    self.records.send(command)
                    command = None
            except StopIteration as end:
                self.out = end.value
            except DPSGDError as e:  # as in update()
                raise _worker_failure(e) from e
        out = self.out
        self.problem.load(out["params"])
        steps = self.steps0 + int(out["gradient_steps"]) * self.cfg.env_steps_per_gradient
        updates = self.done + int(out["global_updates"])
        reason = None if out["stop_reason"] == "requested" else self._stop_reason()  # requested: the run's own
        return Update(steps - self.run.env_steps, updates=updates - self.run.updates,
                      seconds=self.seconds0 + float(out["wall_time_s"]), stop_reason=reason)

    def details(self) -> dict[str, Any]:
        cfg, out = self.cfg, self.out
        if out is None:  # a worker failed, and the server's counts went with it, or nothing ran
            return {"workers": cfg.workers, "processes": cfg.processes}
        return {
            "gradients": int(out["gradient_steps"]),
            "global_updates": self.done + int(out["global_updates"]),
            "weights_from_update": self.done + int(out["params_version"]),
            "startup_seconds": round(float(out["startup_s"]), 3),
            "bytes_per_update": out["bytes"].get("total", 0) / max(int(out["global_updates"]), 1),
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
            "restart_events": out["restart_events"],
        }

    def traffic(self) -> dict[str, Any]:
        if self.out is None:  # a worker failed, or nothing ran (details())
            return {}
        return {"bytes": self.out["bytes"], "weight_syncs": {"total": int(self.out["pulls"]), "per_worker": []},
                "restarts": len(self.out["restart_events"])}

    def close(self) -> None:
        if self.records is not None:
            self.records.close()  # stops the workers if the run ended early (an error)


def train(cfg: HSA2CConfig, resume: str | Path | None = None, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train HSA2C as ``cfg`` says (DPSGD on :class:`A2CProblem`); write the run directory; return the summary
    (``details``: DPSGD's counts, staleness, the rates as used; see :class:`HSA2C`). Raises ``ValueError`` for a bad
    config, :class:`~frugalrl.envs.worker.WorkerError` (after the checkpoint) if a worker fails."""
    return drive(HSA2C(cfg), resume=resume, callbacks=callbacks)


_STOP_REASONS = {"global_updates": "budget", "target_loss": "target_return"}
"""DPSGD's stop reasons in the run summary's words."""


def _worker_failure(e: DPSGDError) -> WorkerError | WorkersFailed:
    """What the driver is told of a failed DPSGD run: the crash-loop rule's verdict where it gave up on a worker
    (the run stops as "workers_failed", as PPO's and IMPALA's do), else the worker's error."""
    gave_up = e.__cause__
    return WorkersFailed(gave_up.worker, gave_up.errors) if isinstance(gave_up, WorkersFailed) else WorkerError(str(e))
