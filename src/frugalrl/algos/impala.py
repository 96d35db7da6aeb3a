"""IMPALA-style actor-critic with V-trace whose actors run a compressed policy (AcceRL, Zhang 2022).

Read top to bottom: :class:`IMPALAConfig` (shared by the CLI and the Python API), :class:`ActorBuilder`
(turns the learner's policy into the actors' policy with the Compressor chain, optionally in a
background thread, and applies the Monitor's strategy changes), :func:`impala_loss` (the corrected
actor-critic loss of paper eq. 4), :func:`train` (the loop).

The loop, and where each AcceRL module sits::

    ClusterEnv workers ──rollout(actor, T)──► learner: Corrector chain (V-trace, IS) ─► Adam step
          ▲  weights only when the sync rule says so (AAPS: KL(old actor ‖ new actor) > δ)
          └── actor = CompressorChain.build(teacher snapshot, recent states)   every `recompress_every`
                      Monitor(KL mean/max/var, entropy, reward gap) ──► strategy changes to the chain

- Actors act on the workers (every backend: serial, local processes, Ray) with the compressed policy:
  an ONNX Runtime graph (int8, fp16, fp32) or a smaller torch network (pruned and distilled).
- The data is off-policy twice over: the actors' policy is compressed and it lags the learner (it is
  rebuilt only every ``recompress_every`` updates, and with ``overlap`` the next rollout runs while
  the learner trains on the previous one, as IMPALA's actors do). V-trace corrects both, with the
  behaviour log-probabilities the workers actually sampled with.
- Without ``--compress`` the actors run an exact copy of the learner (the IMPALA baseline).
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from frugalrl import dists
from frugalrl.compress.chain import CompressorChain, parse_chain
from frugalrl.config import ClusterConfig, NetConfig, OptimConfig, RunConfig, check_fields
from frugalrl.correct import CorrectionBatch, CorrectorChain, bootstrap_values, parse_correctors
from frugalrl.envs.cluster import ClusterEnv
from frugalrl.monitor import parse_monitor
from frugalrl.nets import ActorCritic, make_agent
from frugalrl.rollout import Rollout
from frugalrl.training import Training, cluster_traffic, policy_evaluator

log = logging.getLogger("frugalrl.impala")


@dataclass(kw_only=True)
class IMPALAConfig(NetConfig, OptimConfig, ClusterConfig, RunConfig):
    """Every knob of an IMPALA/AcceRL run. Field names are the CLI flags (``--recompress-every`` ...)."""

    env: str = "CartPole-v1"
    """Gymnasium id or 'module:function' env factory (Atari: frugalrl.envs.atari:make_atari with
    --env-kwargs '{"env_id": "ALE/Pong-v5"}')."""
    learning_rate: float = 6e-4
    num_steps: int = 20
    """Unroll length: steps per env per rollout fragment."""
    compress: str = ""
    """Compressor chain, e.g. 'prune:0.5,distill,int8,onnx' ('' or 'none': actors run the learner's policy)."""
    correct: str = "vtrace"
    """Corrector chain, e.g. 'vtrace', 'vtrace:1.0:1.0,is', 'none'."""
    monitor: str = ""
    """Monitor strategies, e.g. 'ladder:0.05' (int8→fp16→fp32 when KL max > ε), 'alpha:0.01:0.1'
    (α-mix of small and original network), 'sparsity:0.5:0.2:10' (conservative sparsity when the
    reward gap > 10). Comma-separated; '' for none."""
    recompress_every: int = 10
    """Rebuild the actors' compressed policy from a fresh teacher snapshot every this many updates."""
    async_compress: bool = True
    """Build the compressed policy in a background thread while training goes on (the paper's
    asynchronous compressor); False builds it in the loop."""
    calib_size: int = 2048
    """Recent states kept for calibration, distillation and the Monitor's indicators."""
    distill_steps: int = 300
    """Steps of each distillation (when the chain has 'distill')."""
    overlap: bool = True
    """Run the next rollout while the learner trains on the previous one (IMPALA's decoupling)."""
    net: Literal["auto", "mlp", "cnn"] = "auto"
    """'auto' (Nature-CNN for uint8 frames, MLP otherwise), 'mlp' or 'cnn'."""
    norm_adv: bool = False
    """Normalise the corrected advantages per batch (helps with large reward scales, e.g. LunarLander)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field (including a bad --compress/--correct)."""
        super().validate()
        check_fields(self, positive_ints=("num_steps", "recompress_every", "calib_size"), nonneg=("distill_steps",))
        parse_chain(self.compress)
        parse_correctors(self.correct)
        parse_monitor(self.monitor)

    @property
    def batch_size(self) -> int:
        """Transitions per update."""
        return self.workers * self.envs_per_worker * self.num_steps

    @property
    def num_updates(self) -> int:
        """Updates in the run (at least one)."""
        return max(1, self.total_timesteps // self.batch_size)


def make_envs(cfg: IMPALAConfig, replayable: bool = False) -> ClusterEnv:
    """The ClusterEnv a config asks for (actors always act on the workers)."""
    return ClusterEnv.from_config(cfg, replayable)


def build_learner(cfg: IMPALAConfig, envs: ClusterEnv) -> ActorCritic:
    """The learner's actor-critic for the env's spaces."""
    from frugalrl.nets import MLPActorCritic, NatureCNNActorCritic, action_desc

    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if cfg.net == "cnn":
        return NatureCNNActorCritic(obs_space.shape, action_desc(act_space))
    if cfg.net == "mlp":
        return MLPActorCritic(int(np.prod(obs_space.shape)), action_desc(act_space), tuple(cfg.hidden),
                              **cfg.mlp_options())
    return make_agent(obs_space, act_space, tuple(cfg.hidden), **cfg.mlp_options())


class ActorBuilder:
    """Makes the actors' policy from the learner's: a snapshot, or the Compressor chain's output.

    ``request(agent, observations)`` takes a teacher snapshot and starts a build (in a background
    thread when ``async_build``); ``poll()`` returns the newest finished actor, or None. Strategy
    changes from the Monitor (``apply``) take effect at the next build.
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

    @property
    def compressing(self) -> bool:
        """True when actors run a compressed policy."""
        return self.chain is not None and bool(self.chain.stages)

    def request(self, agent: ActorCritic, observations: torch.Tensor) -> None:
        """Start building an actor from a snapshot of ``agent`` (skipped while a build is running)."""
        if self._pending is not None:
            if not self._pending.done():
                return
            self._ready = self._pending.result()  # finished since the last poll: keep it, poll() hands it out
            self._pending = None
        teacher = copy.deepcopy(agent).eval()
        if self._pool is None:
            self._ready = self._build(teacher, observations)
        else:
            self._pending = self._pool.submit(self._build, teacher, observations.clone())

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
        self.builds += 1
        self.build_seconds += time.perf_counter() - t0
        return actor


def impala_loss(
    agent: ActorCritic, batch: Rollout, correctors: CorrectorChain, cfg: IMPALAConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The corrected actor-critic loss (paper eq. 4) on one rollout; returns (loss, statistics).

    ``-ρ_t log π(a_t|x_t) (r_t + γ v_{t+1} − V(x_t))`` (V-trace policy gradient; the Corrector chain
    supplies the advantage, targets ``v_t`` and any extra importance weights) ``+ vf_coef · ½ (v_t − V(x_t))²
    − ent_coef · H(π(·|x_t))``.
    """
    obs = torch.as_tensor(batch.obs)
    T, N = batch.num_steps, batch.num_envs
    flat_obs = obs.reshape(T * N, *obs.shape[2:])
    actions = torch.as_tensor(batch.actions).reshape(T * N, *batch.actions.shape[2:])
    params = agent.dist_params(flat_obs)
    values = agent.value(flat_obs).reshape(T, N)
    target_logp = dists.log_prob(agent.dist_kind, params, actions).reshape(T, N)
    entropy = dists.entropy(agent.dist_kind, params)
    with torch.no_grad():
        _, next_values = bootstrap_values(
            agent.value, obs, torch.as_tensor(batch.next_obs),
            torch.as_tensor(batch.final_idx, dtype=torch.long), torch.as_tensor(batch.final_obs),
        )
        terminations = torch.as_tensor(batch.terminations)
        cb = CorrectionBatch(
            behaviour_logp=batch.behaviour_log_prob().float(),
            target_logp=target_logp.detach(),
            rewards=torch.as_tensor(batch.rewards).float(),
            values=values.detach(),
            next_values=next_values,
            terminations=terminations,
            dones=terminations | torch.as_tensor(batch.truncations),
            gamma=cfg.gamma,
        )
        cb = correctors.correct(cb)
    # The chain's contract: every output a corrector left unset is filled, and pg_weights defaults to ones.
    advantages, pg_weights, value_targets = cb.pg_advantages, cb.pg_weights, cb.value_targets
    assert advantages is not None and pg_weights is not None and value_targets is not None
    if cfg.norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = -(pg_weights * advantages * target_logp).mean()
    v_loss = 0.5 * ((value_targets - values) ** 2).mean()
    ent = entropy.mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent
    with torch.no_grad():
        ratio = (target_logp - cb.behaviour_logp).exp()
    stats = {
        "losses/policy": pg_loss.item(),
        "losses/value": v_loss.item(),
        "losses/entropy": ent.item(),
        "corrector/ratio_mean": ratio.mean().item(),
        "corrector/ratio_max": ratio.max().item(),
        "corrector/pg_weight_mean": pg_weights.float().mean().item(),
    }
    return loss, stats


def train(cfg: IMPALAConfig, envs: ClusterEnv | None = None, resume: str | Path | None = None) -> dict[str, Any]:
    """Train as ``cfg`` says; return the run summary (also in ``run_dir/<name>/summary.json``).

    Pass ``envs`` to use a ClusterEnv you built yourself (it is not closed here). ``resume`` continues a
    run directory from its checkpoint: the learner, its optimizer and the envs continue exactly; the
    actors start again from a copy of the learner and the Monitor's history restarts.
    """
    tag = cfg.compress.replace(":", "").replace(",", "-") or "nocompress"
    run = Training("impala", cfg, tag=tag, resume=resume)
    own_envs = envs is None
    envs = make_envs(cfg, replayable=run.checkpointing) if envs is None else envs
    try:
        return _train_loop(cfg, envs, run)
    finally:
        if own_envs:
            envs.close()


def _train_loop(cfg: IMPALAConfig, envs: ClusterEnv, run: Training) -> dict[str, Any]:
    agent = build_learner(cfg, envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5, foreach=True)
    correctors = parse_correctors(cfg.correct)
    chain = parse_chain(cfg.compress, distill_steps=cfg.distill_steps)
    monitor = parse_monitor(cfg.monitor, precision=_chain_setting(chain, "precision"),
                            sparsity=_chain_setting(chain, "sparsity"))
    builder = ActorBuilder(chain, cfg.async_compress, cfg.seed)
    num_updates = cfg.num_updates
    run.attach(agent=agent, optimizer=optimizer, envs=envs)
    run.begin(policy_evaluator(agent, envs.env_spec, cfg), num_updates * cfg.batch_size, num_updates,
              evaluate_stochastic=policy_evaluator(agent, envs.env_spec, cfg, deterministic=False))
    if not run.resumed:
        envs.reset(seed=cfg.seed)
    recent_obs = torch.as_tensor(envs.observations)

    # The first rollouts use an exact copy of the learner; the first compressed actor is built after the
    # first update, from the states of a real rollout (calibration and distillation need them).
    actor: ActorCritic = copy.deepcopy(agent).eval()
    if not builder.compressing and not cfg.overlap:
        actor = agent  # nothing runs while the learner trains: the actors can use it directly
    pool = concurrent.futures.ThreadPoolExecutor(1) if cfg.overlap else None
    pending = pool.submit(envs.rollout, actor, cfg.num_steps) if pool else None

    returns_since_check: list[float] = []
    best_eval: float | None = None
    actor_swaps = 0
    wait_seconds = learn_seconds = 0.0  # the learner waiting for a rollout / computing an update
    first_update = run.updates + 1
    try:
        while run.updates < num_updates and not run.stopped:
            update = run.updates + 1
            lr = optimizer.param_groups[0]["lr"] = cfg.lr_at(update, num_updates)
            t_wait = time.perf_counter()
            batch = pending.result() if pending is not None else envs.rollout(actor, cfg.num_steps)
            wait_seconds += time.perf_counter() - t_wait
            # A finished compression replaces the actor between rollouts (never during one).
            new_actor = builder.poll()
            if new_actor is not None:
                actor = new_actor
                actor_swaps += 1
            elif not builder.compressing and actor is not agent:
                actor.load_state_dict(agent.state_dict())  # the baseline's actors follow the learner
            # No rollout is in flight when a checkpoint is written (the envs are then at rest).
            pending = None
            if pool is not None and not run.checkpoint_due():
                pending = pool.submit(envs.rollout, actor, cfg.num_steps)

            returns_since_check += list(batch.episode_returns)
            recent_obs = _keep_recent(recent_obs, batch, cfg.calib_size, update)

            t_learn = time.perf_counter()
            loss, stats = impala_loss(agent, batch, correctors, cfg)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
            optimizer.step()
            learn_seconds += time.perf_counter() - t_learn

            row: dict[str, Any] = {**stats, "charts/lr": lr, "compress/builds": builder.builds}
            if builder.compressing and (update == first_update or update % cfg.recompress_every == 0):
                changes = monitor.observe(run.env_steps + batch.num_steps * batch.num_envs, agent, actor, recent_obs,
                                          returns_since_check, best_eval)
                returns_since_check = []
                if changes:
                    builder.apply(changes)
                row.update({f"monitor/{k}": v for k, v in monitor.latest().items() if isinstance(v, int | float)})
                builder.request(agent, recent_obs)
            if batch.restarted_workers:
                row["faults/restarted_workers"] = len(batch.restarted_workers)
            run.update(batch.num_steps * batch.num_envs, row, episode_returns=batch.episode_returns,
                       episode_lengths=batch.episode_lengths, policy_lag=batch.policy_lag(), cluster=envs)
            if run.eval_history:
                best_eval = max(e["mean"] for e in run.eval_history)
    finally:
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - the loop's own error (if any) is the one to raise
                pass
        if pool is not None:
            pool.shutdown(wait=True)
        builder.close()

    details = {
        "compress": chain.describe(),
        "correct": correctors.describe(),
        "sync_rule": envs.sync_rule.describe(),
        "backend": cfg.backend,
        "workers": cfg.workers,
        "envs_per_worker": cfg.envs_per_worker,
        "learner_wait_seconds": round(wait_seconds, 3),
        "learner_update_seconds": round(learn_seconds, 3),
        "compress_builds": builder.builds,
        "compress_seconds": round(builder.build_seconds, 3),
        "actor_swaps": actor_swaps,
        "compress_reports": builder.first_reports,
        "monitor": monitor.to_json(),
        "restart_events": envs.stats()["restart_events"],
    }
    return run.finish(details, traffic=cluster_traffic(envs))


def _chain_setting(chain: CompressorChain, name: str) -> Any:
    """The first stage's ``precision`` or ``sparsity`` (None when no stage has it)."""
    return next((getattr(s, name) for s in chain.stages if hasattr(s, name)), None)


def _keep_recent(recent: torch.Tensor, batch: Rollout, size: int, update: int) -> torch.Tensor:
    """The newest ``size`` states: this batch's (subsampled to at most half) ahead of the older ones."""
    obs = torch.as_tensor(batch.obs).reshape(-1, *batch.obs.shape[2:])
    g = torch.Generator().manual_seed(update)
    take = obs[torch.randperm(obs.shape[0], generator=g)[: max(1, size // 2)]]
    return torch.cat([take, recent])[:size]
