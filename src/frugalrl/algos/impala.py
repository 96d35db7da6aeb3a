"""IMPALA-style actor-critic with V-trace whose actors run a compressed policy (AcceRL, Zhang 2022).

Read top to bottom: :class:`IMPALAConfig` (the CLI flags and the Python API), :class:`ActorBuilder` (turns
the learner's policy into the actors' with the Compressor chain, in a background thread by default, and
applies the Monitor's strategy changes), :func:`impala_update` (the corrected actor-critic update) and
:class:`IMPALA` (its parts and one update; the loop is :func:`frugalrl.driver.drive`'s)::

    ClusterEnv workers ──rollout(actor, T)──► learner: Corrector chain (V-trace, IS) ─► Adam steps
          ▲  weights only when the sync rule says so (AAPS: KL(old actor ‖ new actor) > δ)
          └── actor = CompressorChain.build(teacher snapshot, recent states) once the learner drifted
                      Monitor(KL mean/max/var, entropy, reward gap) ──► strategy changes to the chain

The data is off-policy twice over (a compressed actor that lags the learner; with ``overlap`` the next
rollout runs while the learner trains) and V-trace corrects both. The learner runs APPO's form of the paper's
eq. 4: V-trace targets once per batch, then epochs of clipped-surrogate minibatch steps; with one epoch of one
minibatch, no normalisation and an infinite clip range it is exactly eq. 4 (why: docs/accerl.md).
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from frugalrl import dists
from frugalrl.compress.chain import CompressorChain, parse_chain
from frugalrl.config import (
    ClusterConfig,
    NetConfig,
    NormConfig,
    OptimConfig,
    RunConfig,
    ValueNormConfig,
    check_fields,
)
from frugalrl.correct import CorrectionBatch, CorrectorChain, parse_correctors
from frugalrl.driver import Algorithm, Callback, Setup, Step, Update, cluster_traffic, drive
from frugalrl.envs.cluster import ClusterEnv
from frugalrl.evaluation import policy_evaluator
from frugalrl.losses import SurrogateBatch, SurrogateConfig, surrogate_epochs
from frugalrl.monitor import parse_monitor
from frugalrl.nets import ActorCritic, make_agent
from frugalrl.normalize import ReturnScaler, ValueNormalizer
from frugalrl.returns import bootstrap_values
from frugalrl.rollout import Rollout, RolloutsAhead

log = logging.getLogger("frugalrl.impala")


@dataclass(kw_only=True)
class IMPALAConfig(NormConfig, ValueNormConfig, NetConfig, SurrogateConfig, OptimConfig, ClusterConfig, RunConfig):
    """Every knob of an IMPALA/AcceRL run. Field names are the CLI flags (``--recompress-every`` ...)."""

    env: str = "CartPole-v1"
    """Gymnasium id or 'module:function' env factory (Atari: frugalrl.envs.atari:make_atari with
    --env-kwargs '{"env_id": "ALE/Pong-v5"}')."""
    learning_rate: float = 5e-4
    envs_per_worker: int = 8
    num_steps: int = 32
    update_epochs: int = 4
    num_minibatches: int = 8
    norm_reward: bool | None = True
    """Divide rewards by the running standard deviation of the discounted return (learner side). On by default
    for IMPALA whatever the actions: the critic's loss and V-trace's targets then have one scale on every env
    (LunarLander's ±100 crash rewards otherwise swamp the policy gradient under the shared gradient clip);
    None: as norm_obs resolves."""
    compress: str = ""
    """Compressor chain, e.g. 'prune:0.5,distill,int8,onnx' ('' or 'none': actors run the learner's policy).
    Its int8 is the actors' own network quantised for ONNX Runtime, unlike --weights-codec int8 (a wire code)."""
    correct: str = "vtrace"
    """Corrector chain, e.g. 'vtrace', 'vtrace:1.0:1.0,is', 'vtrace:1:1:0.95' (trace λ), 'none'."""
    monitor: str = "auto"
    """Monitor strategies: 'auto' (with compressed actors, a guard that backs the compression off and warns
    when the actors score significantly below the learner's sampling policy at an evaluation; see
    frugalrl.strategies.CompressionGuard), 'guard:Z:PATIENCE', 'ladder:0.05' (int8→fp16→fp32 when KL max > ε),
    'alpha:0.01:0.1' (α-mix of small and original network), 'sparsity:0.5:0.2:10' (conservative sparsity when
    the reward gap > 10). Comma-separated; '' or 'none' for none."""
    recompress_every: int = 10
    """Rebuild the actors' compressed policy from a fresh teacher snapshot at least every this many updates
    (and the Monitor's check runs at this cadence)."""
    recompress_kl: float | None = 0.02
    """Also rebuild it as soon as the learner has drifted from the snapshot the actors' policy was built from:
    KL(snapshot ‖ learner) on 128 recent states above this (None: only every recompress_every updates): a fixed
    cadence leaves the actors behind a fast learner (why: docs/benchmarks.md#accerl-ablation)."""
    async_compress: bool = True
    """Build the compressed policy in a background thread while training goes on (the paper's
    asynchronous compressor); False builds it in the loop."""
    calib_size: int = 2048
    """Recent states kept for calibration, distillation and the Monitor's indicators."""
    distill_steps: int = 300
    """At most this many steps of each distillation (when the chain has 'distill')."""
    distill_kl_tol: float | None = 1e-3
    """Stop a distillation once the student's KL to the teacher (mean of its last 25 minibatches) is below this
    (None: always distill_steps). Each rebuild starts from the previous student (same architecture), which
    follows the learner in a few dozen steps: distilling the freshly pruned teacher for 300 steps took 0.8-1.2 s
    a build on CartPole, about ten learner updates, and the actors fell that far behind."""
    distill_beta: float = 0.001
    """Entropy bonus of the distillation (AcceRL's β against overfitting the few states it sees); IMPALA
    distils on 2048 recent states, and the paper's 0.01 keeps a sharp policy's student about 1e-2 more
    random than its teacher."""
    overlap: bool = True
    """Run the next rollout while the learner trains on the previous one (IMPALA's decoupling)."""
    eval_every: int = 100
    """Evaluate every this many updates (0: only at the end). IMPALA evaluates on a cadence by default: the
    Monitor compares the actors' return with the learner's stochastic evaluations."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field (including a bad --compress/--correct)."""
        super().validate()
        check_fields(self, positive_ints=("recompress_every", "calib_size"),
                     nonneg=("distill_steps", "distill_beta"), positive=("recompress_kl", "distill_kl_tol"))
        parse_chain(self.compress)
        parse_correctors(self.correct)
        parse_monitor(self.monitor)


def make_envs(cfg: IMPALAConfig, replayable: bool = False) -> ClusterEnv:
    """The ClusterEnv a config asks for (actors always act on the workers)."""
    return ClusterEnv.from_config(cfg, replayable)


def build_learner(cfg: IMPALAConfig, envs: ClusterEnv, obs_norm: bool = False) -> ActorCritic:
    """The learner's actor-critic for the env's spaces (``cfg.net``; ``obs_norm``: an MLP normalises its
    observations)."""
    return make_agent(envs.single_observation_space, envs.single_action_space, **cfg.agent_options(),
                      obs_norm=obs_norm)


class ActorBuilder:
    """Makes the actors' policy from the learner's: a snapshot, or the Compressor chain's output.

    ``request(agent, observations)`` takes a teacher snapshot and starts a build (in a background
    thread when ``async_build``); ``poll()`` returns the newest finished actor, or None. Strategy
    changes from the Monitor (``apply``) take effect at the next build. ``drift(agent, observations)``
    says how far the learner has moved from the newest snapshot (what triggers a rebuild).
    """

    def __init__(self, chain: CompressorChain | None, async_build: bool, seed: int) -> None:
        self.chain = chain
        self.async_build = async_build and chain is not None and bool(chain.stages)
        self.seed = seed
        self.alpha: float | None = None
        self.builds = 0
        self.build_seconds = 0.0
        self.first_reports: list[dict[str, Any]] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(1) if self.async_build else None
        self._pending: concurrent.futures.Future | None = None
        self._ready: ActorCritic | None = None
        self.teacher: ActorCritic | None = None
        """The snapshot the newest actor (finished or being built) is built from."""
        self.requested_update = 0
        """The learner update of the newest snapshot."""
        self.compression_kl: float | None = None
        """Mean KL(snapshot ‖ actor) of the newest build on 128 of its calibration states: the error the
        compression itself adds, apart from the actors' lag behind the learner (None before a compressed build)."""

    @property
    def compressing(self) -> bool:
        """True when actors run a compressed policy."""
        return self.chain is not None and bool(self.chain.stages)

    def request(self, agent: ActorCritic, observations: torch.Tensor, update: int = 0) -> bool:
        """Start building an actor from a snapshot of ``agent`` taken at learner update ``update``; False (and
        nothing started) while a build is running."""
        if self._pending is not None:
            if not self._pending.done():
                return False
            self._ready = self._pending.result()  # finished since the last poll: keep it, poll() hands it out
            self._pending = None
        teacher = self.teacher = copy.deepcopy(agent).eval()
        self.requested_update = update
        if self._pool is None:
            self._ready = self._build(teacher, observations)
        else:
            self._pending = self._pool.submit(self._build, teacher, observations.clone())
        return True

    @torch.no_grad()
    def drift(self, agent: ActorCritic, observations: torch.Tensor) -> float:
        """Mean KL(snapshot ‖ ``agent``) on ``observations``: how far the learner has moved since the newest
        snapshot (infinite before the first)."""
        if self.teacher is None:
            return float("inf")
        return float(dists.kl(agent.dist_kind, self.teacher.dist_params(observations),
                              agent.dist_params(observations)).mean())

    def poll(self, wait: bool = False) -> ActorCritic | None:
        """The newest finished actor (once), or None; ``wait`` blocks for a running build."""
        if self._pending is not None and (wait or self._pending.done()):
            self._ready = self._pending.result()
            self._pending = None
        actor, self._ready = self._ready, None
        return actor

    def apply(self, changes: dict[str, Any]) -> None:
        """Apply Monitor strategy changes (precision, sparsity, alpha) to the next builds."""
        if self.chain is not None:
            self.chain.configure(precision=changes.get("precision"), sparsity=changes.get("sparsity"))
        if "alpha" in changes:
            self.alpha = float(changes["alpha"])

    def close(self) -> None:
        """Stop the background thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _build(self, teacher: ActorCritic, observations: torch.Tensor) -> ActorCritic:
        t0 = time.perf_counter()
        if not self.compressing:
            actor = teacher
        else:
            assert self.chain is not None
            self.chain.measure = self.builds == 0  # measure latency and KL once, on the first build
            actor = self.chain.build(teacher, observations, seed=self.seed + self.builds)
            if self.builds == 0:
                self.first_reports = [r.to_json() for r in self.chain.reports]
            if self.alpha is not None and self.alpha < 1.0:
                from frugalrl.monitor import MixPolicy

                actor = MixPolicy(actor, teacher, alpha=self.alpha, seed=self.seed + self.builds)
            with torch.no_grad():
                probe = observations[:128]
                self.compression_kl = float(dists.kl(teacher.dist_kind, teacher.dist_params(probe),
                                                     actor.dist_params(probe)).mean())
        self.builds += 1
        self.build_seconds += time.perf_counter() - t0
        return actor


def impala_update(
    agent: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: Rollout,
    correctors: CorrectorChain,
    cfg: IMPALAConfig,
    generator: torch.Generator,
    reward_scaler: ReturnScaler | None = None,
    clip_coef: float | None = None,
    value_norm: ValueNormalizer | None = None,
) -> dict[str, float]:
    """One learner update on a rollout of the actors' policy μ; returns loss and correction statistics.

    1. The agent's observation statistics (if it normalises) take in the batch; ``reward_scaler`` (if given)
       scales the rewards; ``value_norm`` (if given) maps the critic's standardised outputs to returns, and
       V-trace's targets back to its units once its statistics have taken them in (as :func:`ppo_update`).
    2. With the learner's policy π_old and critic as they are now, the Corrector chain turns the batch into
       value targets ``v_s``, advantages ``ρ_s (r_s + γ v_{s+1} − V(x_s))`` and per-sample weights (V-trace:
       ρ = min(ρ̄, π_old/μ); ``is`` multiplies the weights by min(c, π_old/μ)).
    3. :func:`~frugalrl.losses.surrogate_epochs`: ``update_epochs`` × ``num_minibatches`` steps of
       ``−w · min(r A, clip(r) A) + vf_coef · ½ (v_s − V(x))² − ent_coef · H(π)`` with ``r = π/π_old``.
    """
    obs = torch.as_tensor(batch.obs)
    T, N = batch.num_steps, batch.num_envs
    obs_norm = getattr(agent, "obs_norm", None)
    if obs_norm is not None:
        obs_norm.update(obs)
    rewards = batch.rewards
    if reward_scaler is not None:
        rewards = reward_scaler.scale(rewards, batch.terminations | batch.truncations)
    flat_obs = obs.reshape(T * N, *obs.shape[2:])
    actions = torch.as_tensor(batch.actions).reshape(T * N, *batch.actions.shape[2:])
    value_fn = agent.value if value_norm is None else (lambda o: value_norm.denormalize(agent.value(o)))
    with torch.no_grad():
        old_logp = dists.log_prob(agent.dist_kind, agent.dist_params(flat_obs), actions).reshape(T, N)
        values, next_values = bootstrap_values(
            value_fn, obs, torch.as_tensor(batch.next_obs),
            torch.as_tensor(batch.final_idx, dtype=torch.long), torch.as_tensor(batch.final_obs),
        )
        terminations = torch.as_tensor(batch.terminations)
        cb = correctors.correct(CorrectionBatch(
            behaviour_logp=batch.behaviour_log_prob().float(),
            target_logp=old_logp,
            rewards=torch.as_tensor(rewards).float(),
            values=values,
            next_values=next_values,
            terminations=terminations,
            dones=terminations | torch.as_tensor(batch.truncations),
            gamma=cfg.gamma,
        ))
        ratio = (old_logp - cb.behaviour_logp).exp()
    # The chain's contract: every output a corrector left unset is filled, and pg_weights defaults to ones.
    advantages, pg_weights, value_targets = cb.pg_advantages, cb.pg_weights, cb.value_targets
    assert advantages is not None and pg_weights is not None and value_targets is not None
    if value_norm is not None:  # the critic's targets and old values in its standardised units
        value_norm.update(value_targets)
        value_targets, values = value_norm.normalize(value_targets), value_norm.normalize(values)
    samples = SurrogateBatch(obs=flat_obs, actions=actions, old_logp=old_logp.reshape(-1),
                             advantages=advantages.reshape(-1), returns=value_targets.reshape(-1),
                             values=values.reshape(-1), weights=pg_weights.reshape(-1).float())
    stats = surrogate_epochs(agent, optimizer, samples, cfg, cfg.ent_coef, cfg.vf_coef, cfg.max_grad_norm,
                             generator, clip_coef)
    stats.update({"corrector/ratio_mean": ratio.mean().item(), "corrector/ratio_max": ratio.max().item(),
                  "corrector/pg_weight_mean": pg_weights.float().mean().item()})
    return stats


class IMPALA(Algorithm):
    """IMPALA's parts and one update; a resumed run continues the learner, its optimizer and the envs
    exactly, while the actors start again from a copy of the learner and the Monitor's history restarts."""

    name = "impala"

    def __init__(self, cfg: IMPALAConfig, envs: ClusterEnv | None = None) -> None:
        super().__init__(cfg)
        self.cfg: IMPALAConfig = cfg
        self.given_envs = envs
        self.own_envs = envs is None
        self.envs: ClusterEnv | None = None
        self.rollouts_ahead: RolloutsAhead[Rollout] | None = None
        self.builder: ActorBuilder | None = None

    def tag(self) -> str:
        return self.cfg.compress.replace(":", "").replace(",", "-") or "nocompress"

    def setup(self) -> Setup:
        cfg = self.cfg
        envs = self.envs = self.given_envs or make_envs(cfg, replayable=self.run.checkpointing)
        self.norm_obs, self.norm_reward = cfg.normalization(isinstance(envs.single_action_space, gym.spaces.Box))
        agent = self.agent = build_learner(cfg, envs, obs_norm=self.norm_obs)
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5, foreach=True)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.scaler = ReturnScaler(cfg.gamma, envs.num_envs) if self.norm_reward else None
        self.value_norm = ValueNormalizer() if cfg.norm_value else None
        self.correctors = parse_correctors(cfg.correct)
        chain = self.chain = parse_chain(cfg.compress, distill_steps=cfg.distill_steps, distill={
            "kl_tol": cfg.distill_kl_tol, "beta": cfg.distill_beta, "warm_start": True})
        self.monitor = parse_monitor(cfg.monitor, precision=_chain_setting(chain, "precision"),
                                     sparsity=_chain_setting(chain, "sparsity"), compressing=bool(chain.stages))
        self.builder = ActorBuilder(chain, cfg.async_compress, cfg.seed)
        return Setup(
            parts={"agent": agent, "optimizer": self.optimizer, "generator": self.generator,
                   "reward_scaler": self.scaler, "value_norm": self.value_norm, "envs": envs},
            total_updates=cfg.num_updates, steps_per_update=cfg.batch_size,
            evaluate=policy_evaluator(agent, envs.env_spec, cfg),
            evaluate_stochastic=policy_evaluator(agent, envs.env_spec, cfg, deterministic=False),
            cluster=envs,
        )

    def start(self) -> None:
        cfg, envs, builder = self.cfg, self.envs, self.builder
        assert envs is not None and builder is not None
        if not self.run.resumed:
            envs.reset(seed=cfg.seed)
        self.recent_obs = torch.as_tensor(envs.observations)
        # The first rollouts use an exact copy of the learner; the first compressed actor is built after the
        # first update, from the states of a real rollout (calibration and distillation need them).
        self.actor: ActorCritic = copy.deepcopy(self.agent).eval()
        if not builder.compressing and not cfg.overlap:
            self.actor = self.agent  # nothing runs while the learner trains: the actors can use it directly
        self.rollouts, self.rollout_seconds = 0, 0.0  # on the rollout thread where it overlaps the update
        self.rollouts_ahead = RolloutsAhead(self._rollout, cfg.overlap)
        self.rollouts_ahead.start(self.actor)
        self.returns_since_check: list[float] = []
        self.evals_seen = len(self.run.eval_history)
        self.actor_swaps = 0
        self.wait_seconds = self.learn_seconds = 0.0  # the learner waiting for a rollout / computing an update
        self.first_update = self.run.updates + self.run.schedule_offset + 1  # the Step.index of its first update

    def update(self, step: Step) -> Update:
        cfg, envs, builder, agent = self.cfg, self.envs, self.builder, self.agent
        assert envs is not None and builder is not None and self.rollouts_ahead is not None
        update = step.index
        lr = self.optimizer.param_groups[0]["lr"] = cfg.lr_at(update, step.total)
        t_wait = time.perf_counter()
        batch = self.rollouts_ahead.take(self.actor)
        self.wait_seconds += time.perf_counter() - t_wait
        # A finished compression replaces the actor between rollouts (never during one).
        new_actor = builder.poll()
        if new_actor is not None:
            self.actor = new_actor
            self.actor_swaps += 1
        elif not builder.compressing and self.actor is not agent:
            self.actor.load_state_dict(agent.state_dict())  # the baseline's actors follow the learner
        if not step.checkpoint_after:  # a checkpoint holds the envs at rest
            self.rollouts_ahead.start(self.actor)

        self.returns_since_check += list(batch.episode_returns)
        self.recent_obs = _keep_recent(self.recent_obs, batch, cfg.calib_size, update)
        t_learn = time.perf_counter()
        stats = impala_update(agent, self.optimizer, batch, self.correctors, cfg, self.generator, self.scaler,
                              cfg.clip_at(update, step.total), self.value_norm)
        self.learn_seconds += time.perf_counter() - t_learn
        row: dict[str, Any] = {**stats, "charts/lr": lr, "compress/builds": builder.builds}
        if builder.compressing:
            self._refresh_actors(update, batch, row)
        if batch.restarted_workers:
            row["faults/restarted_workers"] = len(batch.restarted_workers)
        return Update(batch.num_steps * batch.num_envs, row, episode_returns=batch.episode_returns,
                      episode_lengths=batch.episode_lengths, policy_lag=batch.policy_lag())

    def _rollout(self, actor: ActorCritic) -> Rollout:
        """One rollout by ``actor``, timed (``frugalrl scale-model`` reads the time per iteration)."""
        assert self.envs is not None
        t0 = time.perf_counter()
        batch = self.envs.rollout(actor, self.cfg.num_steps)
        self.rollout_seconds += time.perf_counter() - t0
        self.rollouts += 1  # with overlap, one may be prefetched that no update uses (a checkpoint's comes after)
        return batch

    def _refresh_actors(self, update: int, batch: Rollout, row: dict[str, Any]) -> None:
        """Request a rebuild of the compressed actors once the learner drifted (or on the Monitor's cadence,
        after its check): compressed actors then stay about as fresh as AAPS keeps a copy."""
        cfg, builder, agent, run = self.cfg, self.builder, self.agent, self.run
        assert builder is not None
        if update != self.first_update and update % cfg.recompress_every != 0:
            stale = update - builder.requested_update >= cfg.recompress_every
            if cfg.recompress_kl is not None and not stale:
                row["compress/drift"] = drift = builder.drift(agent, self.recent_obs[:128])
                stale = drift > cfg.recompress_kl
            if stale:
                builder.request(agent, self.recent_obs, update)
            return
        # The reward gap compares like with like: the actors' recent episodes (sampled) against the learner's
        # stochastic evaluation, when one was made since the last check.
        fresh = run.eval_history[-1] if len(run.eval_history) > self.evals_seen else {}
        self.evals_seen = len(run.eval_history)
        changes = self.monitor.observe(
            run.env_steps + batch.num_steps * batch.num_envs, agent, self.actor, self.recent_obs,
            self.returns_since_check, fresh.get("stochastic_mean"), fresh.get("stochastic_std"),
            cfg.eval_episodes if "stochastic_mean" in fresh else None, compression_kl=builder.compression_kl)
        self.returns_since_check = []
        if changes:
            builder.apply(changes)
        row.update({f"monitor/{k}": v for k, v in self.monitor.latest().items() if isinstance(v, int | float)})
        builder.request(agent, self.recent_obs, update)

    def end(self) -> None:
        """Wait for the rollout in flight and the compressor thread."""
        if self.rollouts_ahead is not None:
            self.rollouts_ahead.close()
            self.rollouts_ahead = None
        if self.builder is not None:
            self.builder.close()

    def details(self) -> dict[str, Any]:
        cfg, envs, builder = self.cfg, self.envs, self.builder
        assert envs is not None and builder is not None
        return {
            "norm_obs": self.norm_obs,
            "norm_reward": self.norm_reward,
            "norm_value": cfg.norm_value,
            "compress": self.chain.describe(),
            "correct": self.correctors.describe(),
            "sync_rule": envs.sync_rule.describe(),
            "backend": cfg.backend,
            "workers": cfg.workers,
            "envs_per_worker": cfg.envs_per_worker,
            "num_steps": cfg.num_steps,
            "overlap": cfg.overlap,
            "rollouts": self.rollouts,
            "rollout_seconds": round(self.rollout_seconds, 3),
            "learner_wait_seconds": round(self.wait_seconds, 3),
            "learner_update_seconds": round(self.learn_seconds, 3),
            "compress_builds": builder.builds,
            "compress_seconds": round(builder.build_seconds, 3),
            "actor_swaps": self.actor_swaps,
            "compress_reports": builder.first_reports,
            "monitor": self.monitor.to_json(),
            "warnings": [f"step {n['step']}: {n['message']}" for n in self.monitor.notes()],
            "restart_events": envs.stats()["restart_events"],
            "recycle_events": envs.stats()["recycle_events"],
        }

    def traffic(self) -> dict[str, Any]:
        return cluster_traffic(self.envs)

    def close(self) -> None:
        self.end()
        if self.given_envs is None and self.envs is not None:
            self.envs.close()


def train(cfg: IMPALAConfig, envs: ClusterEnv | None = None, resume: str | Path | None = None,
          callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train as ``cfg`` says; return the run summary (also in ``run_dir/<name>/summary.json``).

    Pass ``envs`` to use a ClusterEnv you built yourself (it is not closed here). ``resume`` continues a run
    directory from its checkpoint; ``callbacks`` see every update and evaluation.
    """
    return drive(IMPALA(cfg, envs), resume=resume, callbacks=callbacks)


def _chain_setting(chain: CompressorChain, name: str) -> Any:
    """The first stage's ``precision`` or ``sparsity`` (None when no stage has it)."""
    return next((getattr(s, name) for s in chain.stages if hasattr(s, name)), None)


def _keep_recent(recent: torch.Tensor, batch: Rollout, size: int, update: int) -> torch.Tensor:
    """The newest ``size`` states: this batch's (subsampled to at most half) ahead of the older ones."""
    obs = torch.as_tensor(batch.obs).reshape(-1, *batch.obs.shape[2:])
    g = torch.Generator().manual_seed(update)
    take = obs[torch.randperm(obs.shape[0], generator=g)[: max(1, size // 2)]]
    return torch.cat([take, recent])[:size]
