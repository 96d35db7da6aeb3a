"""IMPALA-style actor-critic with V-trace whose actors run a compressed policy (AcceRL, seed paper 004).

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from frugalrl import dists
from frugalrl.algos.common import check_fields, cluster_summary, make_cluster_env, progress_bar, slug
from frugalrl.compress.chain import CompressorChain, parse_chain
from frugalrl.correct import CorrectionBatch, CorrectorChain, bootstrap_values, parse_correctors
from frugalrl.envs.cluster import ClusterEnv
from frugalrl.evaluation import evaluate
from frugalrl.monitor import parse_monitor
from frugalrl.nets import make_agent
from frugalrl.rollout import Rollout
from frugalrl.sync import make_sync_rule

log = logging.getLogger("frugalrl.impala")


@dataclass
class IMPALAConfig:
    """Every knob of an IMPALA/AcceRL run. Field names are the CLI flags (``--recompress-every`` ...)."""

    env: str = "CartPole-v1"
    """Gymnasium id or 'module:function' env factory (Atari: frugalrl.envs.atari:make_atari with
    --env-kwargs '{"env_id": "ALE/Pong-v5"}')."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env (JSON on the CLI)."""
    seed: int = 1
    total_timesteps: int = 500_000
    backend: str = "local"
    """'local' (processes), 'serial' (in-process) or 'ray' (Ray actors)."""
    ray_address: str | None = None
    workers: int = 2
    envs_per_worker: int = 4
    num_steps: int = 20
    """Unroll length: steps per env per rollout fragment."""
    sync: str = "every"
    """Weight-sync rule for the actors' policy: 'every', 'interval' or 'aaps'."""
    kl_threshold: float = 0.05
    """δ of AAPS."""
    sync_interval: int = 1
    weights_codec: str = "fp32"
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
    net: str = "auto"
    """'auto' (Nature-CNN for uint8 frames, MLP otherwise), 'mlp' or 'cnn'."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """MLP hidden widths."""
    learning_rate: float = 6e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = False
    """Normalise the corrected advantages per batch (helps with large reward scales, e.g. LunarLander)."""
    eval_episodes: int = 10
    eval_every: int = 0
    """Evaluate the learner's policy every this many updates (0: only at the end)."""
    target_return: float | None = None
    """Stop early once an evaluation reaches this mean return."""
    torch_threads: int = 1
    run_dir: str = "runs"
    run_name: str | None = None
    checkpoint_every: int = 0
    progress: bool = True
    tensorboard: bool = True
    plots: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field (including a bad --compress/--correct)."""
        check_fields(
            self,
            positive_ints=("total_timesteps", "workers", "envs_per_worker", "num_steps", "torch_threads",
                           "sync_interval", "recompress_every", "calib_size"),
            positive=("learning_rate", "kl_threshold"),
            nonneg=("ent_coef", "vf_coef", "max_grad_norm", "eval_episodes", "eval_every", "checkpoint_every",
                    "distill_steps"),
            unit=("gamma",),
        )
        if self.backend not in ("local", "serial", "ray"):
            raise ValueError(f"backend must be 'local', 'serial' or 'ray', got {self.backend!r}")
        if self.net not in ("auto", "mlp", "cnn"):
            raise ValueError(f"net must be 'auto', 'mlp' or 'cnn', got {self.net!r}")
        make_sync_rule(self.sync, self.kl_threshold, self.sync_interval)
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


def make_envs(cfg: IMPALAConfig) -> ClusterEnv:
    """The ClusterEnv a config asks for (actors always act on the workers)."""
    return make_cluster_env(cfg)


def build_learner(cfg: IMPALAConfig, envs: ClusterEnv) -> nn.Module:
    """The learner's actor-critic for the env's spaces."""
    from frugalrl.nets import MLPActorCritic, NatureCNNActorCritic, action_desc

    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if cfg.net == "cnn":
        return NatureCNNActorCritic(obs_space.shape, action_desc(act_space))
    if cfg.net == "mlp":
        return MLPActorCritic(int(np.prod(obs_space.shape)), action_desc(act_space), tuple(cfg.hidden))
    return make_agent(obs_space, act_space, tuple(cfg.hidden))


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
        self._ready: nn.Module | None = None

    @property
    def compressing(self) -> bool:
        """True when actors run a compressed policy."""
        return self.chain is not None and bool(self.chain.stages)

    def request(self, agent: nn.Module, observations: torch.Tensor) -> None:
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

    def poll(self, wait: bool = False) -> nn.Module | None:
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

    def _build(self, teacher: nn.Module, observations: torch.Tensor) -> nn.Module:
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
    agent: nn.Module, batch: Rollout, correctors: CorrectorChain, cfg: IMPALAConfig
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
    advantages = cb.pg_advantages
    if cfg.norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = -(cb.pg_weights * advantages * target_logp).mean()
    v_loss = 0.5 * ((cb.value_targets - values) ** 2).mean()
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
        "corrector/pg_weight_mean": cb.pg_weights.float().mean().item(),
    }
    return loss, stats


def train(cfg: IMPALAConfig, envs: ClusterEnv | None = None) -> dict[str, Any]:
    """Train as ``cfg`` says; return the run summary (also in ``run_dir/<name>/summary.json``).

    Pass ``envs`` to use a ClusterEnv you built yourself (it is not closed here).
    """
    from frugalrl.runs import Run

    cfg.validate()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.set_num_threads(cfg.torch_threads)
    own_envs = envs is None
    envs = make_envs(cfg) if envs is None else envs
    tag = slug(cfg.compress.replace(":", "").replace(",", "-")) or "nocompress"
    name = cfg.run_name or f"impala-{slug(cfg.env_kwargs.get('env_id', cfg.env))}-{tag}-s{cfg.seed}-" \
                           f"{time.strftime('%Y%m%d-%H%M%S')}"
    run = Run(cfg.run_dir, name, cfg, tensorboard=cfg.tensorboard)
    try:
        return _train_loop(cfg, envs, run)
    finally:
        if own_envs:
            envs.close()


def _train_loop(cfg: IMPALAConfig, envs: ClusterEnv, run) -> dict[str, Any]:
    agent = build_learner(cfg, envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)
    correctors = parse_correctors(cfg.correct)
    chain = parse_chain(cfg.compress, distill_steps=cfg.distill_steps)
    monitor = parse_monitor(cfg.monitor, precision=_chain_setting(chain, "precision"),
                            sparsity=_chain_setting(chain, "sparsity"))
    builder = ActorBuilder(chain, cfg.async_compress, cfg.seed)
    num_updates = cfg.num_updates
    obs0, _ = envs.reset(seed=cfg.seed)
    recent_obs = torch.as_tensor(obs0)

    # The first rollouts use an exact copy of the learner; the first compressed actor is built after the
    # first update, from the states of a real rollout (calibration and distillation need them).
    actor: nn.Module = copy.deepcopy(agent).eval()
    if not builder.compressing and not cfg.overlap:
        actor = agent  # nothing runs while the learner trains: the actors can use it directly
    pool = concurrent.futures.ThreadPoolExecutor(1) if cfg.overlap else None
    pending = pool.submit(envs.rollout, actor, cfg.num_steps) if pool else None

    recent_returns: list[float] = []
    returns_since_check: list[float] = []
    episodes = env_steps = 0
    evals: list[tuple[int, float, float, float]] = []  # (step, mean, std, wall seconds)
    best_eval: float | None = None
    actor_swaps = 0
    start = time.monotonic()
    eval_seconds = 0.0  # evaluation is not training: eval_history and train_seconds leave it out
    wait_seconds = learn_seconds = 0.0  # the learner waiting for a rollout / computing an update
    bar = progress_bar(cfg.progress, num_updates * cfg.batch_size, f"impala {cfg.env}")
    eval_mean = eval_std = float("nan")
    stopped_early = False
    update = 0
    try:
        for update in range(1, num_updates + 1):
            if cfg.anneal_lr:
                optimizer.param_groups[0]["lr"] = (1.0 - (update - 1.0) / num_updates) * cfg.learning_rate
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
            if pool is not None:
                pending = pool.submit(envs.rollout, actor, cfg.num_steps)

            env_steps += batch.num_steps * batch.num_envs
            episodes += len(batch.episode_returns)
            recent_returns = (recent_returns + list(batch.episode_returns))[-100:]
            returns_since_check += list(batch.episode_returns)
            recent_obs = _keep_recent(recent_obs, batch, cfg.calib_size, update)

            t_learn = time.perf_counter()
            loss, stats = impala_loss(agent, batch, correctors, cfg)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
            optimizer.step()
            learn_seconds += time.perf_counter() - t_learn

            row: dict[str, Any] = dict(stats)
            if builder.compressing and (update == 1 or update % cfg.recompress_every == 0):
                changes = monitor.observe(env_steps, agent, actor, recent_obs, returns_since_check, best_eval)
                returns_since_check = []
                if changes:
                    builder.apply(changes)
                row.update({f"monitor/{k}": v for k, v in monitor.latest().items() if isinstance(v, (int, float))})
                builder.request(agent, recent_obs)
            sps = env_steps / max(1e-9, time.monotonic() - start - eval_seconds)
            st = envs.stats()
            row.update({
                "charts/sps": sps,
                "charts/lr": optimizer.param_groups[0]["lr"],
                "charts/policy_lag": float(batch.policy_lag().mean()),
                "syncs/total": st["weight_syncs"]["total"],
                "bytes/total": st["bytes"]["total"],
                "bytes/weights": st["bytes"]["weights"],
                "compress/builds": builder.builds,
            })
            if batch.episode_returns:
                row["train/episode_return"] = float(np.mean(batch.episode_returns))
                row["train/episode_length"] = float(np.mean(batch.episode_lengths))
            if cfg.eval_every and cfg.eval_episodes and update % cfg.eval_every == 0 and update != num_updates:
                t_eval = time.monotonic()
                eval_mean, eval_std, _ = evaluate(agent, envs.env_spec, cfg.eval_episodes, seed=10_000 + cfg.seed)
                eval_seconds += time.monotonic() - t_eval
                evals.append((env_steps, eval_mean, eval_std, time.monotonic() - start - eval_seconds))
                best_eval = eval_mean if best_eval is None else max(best_eval, eval_mean)
                row["eval/return_mean"], row["eval/return_std"] = eval_mean, eval_std
            run.log(env_steps, row)
            if cfg.checkpoint_every and update % cfg.checkpoint_every == 0:
                run.save_checkpoint(agent, env_steps)
            if bar is not None:
                post = {"ret": f"{np.mean(recent_returns):.1f}" if recent_returns else "-", "sps": f"{sps:.0f}",
                        "syncs": row["syncs/total"]}
                if evals:
                    post["eval"] = f"{evals[-1][1]:.1f}"
                bar.set_postfix(post, refresh=False)
                bar.update(batch.num_steps * batch.num_envs)
            if cfg.target_return is not None and evals and evals[-1][1] >= cfg.target_return:
                stopped_early = True
                break
    finally:
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - the loop's own error (if any) is the one to raise
                pass
        if pool is not None:
            pool.shutdown(wait=True)
        builder.close()
        if bar is not None:
            bar.close()

    train_seconds = time.monotonic() - start - eval_seconds
    if cfg.eval_episodes > 0 and not (stopped_early and evals):
        eval_mean, eval_std, _ = evaluate(agent, envs.env_spec, cfg.eval_episodes, seed=10_000 + cfg.seed)
        evals.append((env_steps, eval_mean, eval_std, train_seconds))
        run.log(env_steps, {"eval/return_mean": eval_mean, "eval/return_std": eval_std})
    elif evals:
        eval_mean, eval_std = evals[-1][1], evals[-1][2]
    wall = time.monotonic() - start
    run.save_checkpoint(agent, env_steps)
    summary: dict[str, Any] = {
        "algo": "impala",
        "env_id": cfg.env_kwargs.get("env_id", cfg.env),
        "seed": cfg.seed,
        "compress": chain.describe(),
        "correct": correctors.describe(),
        "env_steps": env_steps,
        "updates": update,
        "wall_seconds": round(wall, 3),
        "train_seconds": round(train_seconds, 3),
        "steps_per_second": round(env_steps / max(train_seconds, 1e-9), 1),
        "eval_return_mean": eval_mean,
        "eval_return_std": eval_std,
        "eval_history": [{"step": s, "mean": m, "std": sd, "seconds": round(t, 3)} for s, m, sd, t in evals],
        "train_return_mean_last100": float(np.mean(recent_returns)) if recent_returns else None,
        "episodes": episodes,
        "stopped_early": stopped_early,
        "learner_wait_seconds": round(wait_seconds, 3),
        "learner_update_seconds": round(learn_seconds, 3),
        "compress_builds": builder.builds,
        "compress_seconds": round(builder.build_seconds, 3),
        "actor_swaps": actor_swaps,
        "compress_reports": builder.first_reports,
        "monitor": monitor.to_json(),
        **cluster_summary(envs),
        "backend": cfg.backend,
        "run_dir": str(run.dir),
    }
    return run.finish(summary, plots=cfg.plots)


def _chain_setting(chain: CompressorChain, name: str) -> Any:
    """The first stage's ``precision`` or ``sparsity`` (None when no stage has it)."""
    return next((getattr(s, name) for s in chain.stages if hasattr(s, name)), None)


def _keep_recent(recent: torch.Tensor, batch: Rollout, size: int, update: int) -> torch.Tensor:
    """The newest ``size`` states: this batch's (subsampled to at most half) ahead of the older ones."""
    obs = torch.as_tensor(batch.obs).reshape(-1, *batch.obs.shape[2:])
    g = torch.Generator().manual_seed(update)
    take = obs[torch.randperm(obs.shape[0], generator=g)[: max(1, size // 2)]]
    return torch.cat([take, recent])[:size]
