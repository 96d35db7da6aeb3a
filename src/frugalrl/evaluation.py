"""Evaluate an agent on fresh environments in this process (no workers, no bytes), and judge the result.

:func:`evaluate` plays episodes; :func:`policy_evaluator` makes the :data:`Evaluator` a training run calls
on its cadence (deterministic, or sampling actions as the workers do); :func:`evaluation_disagreement`
says when an evaluation contradicts the training curve, :func:`evaluation_regression` when a run ends clearly
below its best evaluation, and :func:`regression_recheck` whether fresh episodes confirm that.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from frugalrl import dists
from frugalrl.envs.spec import EnvSpec
from frugalrl.experience import env_action, env_actions
from frugalrl.nets import ActorCritic

if TYPE_CHECKING:
    from frugalrl.config import RunConfig

log = logging.getLogger("frugalrl")

EVAL_SEED = 10_000
"""Evaluation episodes of a run with seed s use env seeds ``EVAL_SEED + s, ...`` (never a training seed)."""
FRESH_SEED = 20_000
"""``frugalrl eval``'s first env seed by default: episodes that no run's evaluations play."""
MAX_STEPS = 10_000
"""An evaluation episode that has not ended after this many steps is cut and its return so far counted (the
default of ``RunConfig.eval_max_steps``): an env without a time limit of its own can otherwise play one episode of
a policy that never reaches an end for as long as the machine lasts."""
POLL_STEPS = 256
"""An evaluation's ``poll`` is called after each episode and every this many steps within one."""
RECHECK_SEED = 30_000
"""A run with seed s that seems to end below its best evaluation scores both policies again on env seeds
``RECHECK_SEED + s, ...``: episodes that none of its evaluations played (nor ``frugalrl eval``'s, ``FRESH_SEED``)."""


@dataclass
class Evaluation:
    """One evaluation: mean and standard deviation of the return over ``episodes`` episodes."""

    mean: float
    std: float
    episodes: int
    deterministic: bool = True
    returns: list[float] | None = None
    """Each episode's return, in the order of the episodes' env seeds (when the evaluator kept them)."""
    cut: int = 0
    """Episodes cut at the evaluator's step cap before they ended: their returns are partial."""


Evaluator = Callable[[], Evaluation]
Poll = Callable[[int], None]
"""Called by :func:`play` with the number of episodes finished so far, after each episode and every
:data:`POLL_STEPS` steps: to show progress, or to stop at once by raising :class:`EvaluationInterrupted`."""


class EvaluationInterrupted(Exception):
    """A stop signal came while an evaluation was playing. Its episodes are dropped: a scheduler's grace period
    after SIGTERM (30 s by default on SLURM) is too short to finish a slow env's evaluation, and the run's
    progress must reach the disk first."""


class EvaluationEnvError(RuntimeError):
    """The evaluation's env raised in ``reset()`` or ``step()``: with ``on_env_error="raise"`` at once, with
    ``"restart"`` once the same episode failed in ``tries`` new envs in a row (:func:`play`)."""

    run_dir: str | None = None
    """The run directory whose checkpoint and summary were written before this was raised (the driver's)."""
    trained: bool = False
    """Whether the run had made every update of its budget: a resume would only evaluate again."""


def evaluation_disagreement(deterministic: Evaluation | None, stochastic: Evaluation | None,
                            train_return: float | None, tolerance: float = 0.5) -> dict[str, Any] | None:
    """What is wrong when the final evaluations contradict the training return, else None.

    The training return is the mean of the recent training episodes (the run passes those of its last fifth),
    played by the workers' (sampling, possibly stale or compressed) policy. The learner's stochastic evaluation
    plays the same kind of policy, so it should land near it; the deterministic one (the mode) may differ, but a
    mode far below both says the policy only works while sampling. A gap counts when it exceeds ``tolerance`` × the largest of the three
    magnitudes and twice the evaluations' standard deviations (at least 1).
    """
    if train_return is None or deterministic is None:
        return None
    values = [deterministic.mean, train_return] + ([] if stochastic is None else [stochastic.mean])
    spreads = [2 * deterministic.std] + ([] if stochastic is None else [2 * stochastic.std])
    # the returns' size, or twice their spread where they lie near zero (a LunarLander policy hovering at 0 ± 30)
    scale = max(1.0, *(abs(v) for v in values + spreads if math.isfinite(v)))
    problems = []
    if stochastic is not None and abs(stochastic.mean - train_return) > tolerance * scale:
        problems.append(f"the learner sampling actions scores {stochastic.mean:.1f} where the training episodes "
                        f"scored {train_return:.1f} (stale or lossy actors?)")
    if deterministic.mean < train_return - tolerance * scale:
        problems.append(f"the deterministic evaluation ({deterministic.mean:.1f}) is far below the training return "
                        f"({train_return:.1f}): the policy's mode does not do what its samples do")
    if not problems:
        return None
    return {"deterministic": deterministic.mean, "stochastic": None if stochastic is None else stochastic.mean,
            "train_return": train_return, "message": "evaluation contradicts training: " + "; ".join(problems)}


MIN_DROP = 0.05
"""A drop in return smaller than this is never a regression: the reports print returns to one decimal, and a policy
stuck at a return of about 0 with no spread (MountainCarContinuous's standing still) otherwise "fell" from -0.00001
to -0.00002 by more than 10% of it and more than twice a standard error of 0."""


def evaluation_regression(history: list[dict[str, Any]], tolerance: float = 0.1) -> dict[str, Any] | None:
    """What is wrong when the last evaluation of ``history`` (the final one) is clearly below the best earlier one:
    the run peaked, then got worse (an RL run's collapse, which a curve shows and a final number hides). Else None.

    Entries are :class:`~frugalrl.training.RunRecorder`'s ``eval_history`` rows: ``step``, ``mean``, ``std`` and ``episodes`` (1 if
    absent). "Clearly" is by more than ``tolerance`` × the best's magnitude, more than twice the standard error
    of the difference of the two means and more than :data:`MIN_DROP`; an entry without a spread of its own (one
    episode, or none recorded: HSA2C's server-side checks report only a mean) borrows the final's.
    Since the best is the luckiest of many noisy evaluations, the second condition keeps noise from passing for a
    collapse; with one-episode checks only a large drop counts.
    """
    if len(history) < 2:
        return None
    final, earlier = history[-1], history[:-1]
    best = max(earlier, key=lambda e: e["mean"])
    n_final, n_best = max(1, int(final.get("episodes", 1))), max(1, int(best.get("episodes", 1)))
    s_final = float(final.get("std") or 0.0)
    s_best = float(best.get("std") or 0.0)
    if n_best == 1 or not s_best > 0:
        s_best = s_final
    error = math.sqrt(s_best**2 / n_best + s_final**2 / n_final)
    drop = float(best["mean"]) - float(final["mean"])
    margin = max(tolerance * abs(float(best["mean"])), 2.0 * error, MIN_DROP)
    if drop <= margin:
        return None
    message = (f"the run got worse after its best evaluation: the final one scores {final['mean']:.1f} over "
               f"{n_final} episodes, {drop:.1f} below {best['mean']:.1f} at step {best['step']} (more than "
               f"{tolerance:.0%} of it and than twice the standard error of the difference, 2 × {error:.1f})")
    return {"best": float(best["mean"]), "best_step": int(best["step"]), "final": float(final["mean"]),
            "drop": drop, "margin": margin, "message": message}


def regression_recheck(best: Evaluation, final: Evaluation, tolerance: float = 0.1) -> dict[str, Any]:
    """Whether fresh episodes confirm a regression that :func:`evaluation_regression` flagged: ``best`` and ``final``
    are the best-evaluated and the final policies scored on the same new episodes (env seeds), so the best is no
    longer the luckiest of many evaluations. Confirmed when the best still scores more than ``tolerance`` × its
    magnitude above the final and more than twice the standard error of the paired differences. A run that seemed to
    end below its best evaluation (``RunRecorder.finish``) scores both on the episodes from ``RECHECK_SEED`` + its seed,
    and warns only if they confirm it."""
    if best.returns is None or final.returns is None or len(best.returns) != len(final.returns):
        raise ValueError("regression_recheck needs both policies' returns on the same episodes")
    diff = np.asarray(best.returns, dtype=np.float64) - np.asarray(final.returns, dtype=np.float64)
    error = float(diff.std(ddof=1) / math.sqrt(diff.size)) if diff.size > 1 else 0.0
    drop = float(diff.mean())
    margin = max(tolerance * abs(best.mean), 2.0 * error, MIN_DROP)
    message = (f"on {diff.size} fresh episodes the best evaluation's policy scores {best.mean:.1f} and the final "
               f"one {final.mean:.1f}")
    return {"episodes": int(diff.size), "best": best.mean, "final": final.mean, "drop": drop, "error": error,
            "margin": margin, "confirmed": drop > margin, "message": message}


def evaluate(
    agent: ActorCritic,
    env_spec: EnvSpec,
    episodes: int = 10,
    seed: int = 10_000,
    deterministic: bool = True,
    max_steps: int = MAX_STEPS,
) -> tuple[float, float, list[float]]:
    """Mean and standard deviation of the undiscounted return over ``episodes`` episodes (see :func:`play`)."""
    returns, _ = play(agent, env_spec, episodes, seed, deterministic, max_steps)
    return float(np.mean(returns)), float(np.std(returns)), returns


def play(agent: ActorCritic, env_spec: EnvSpec, episodes: int, seed: int, deterministic: bool = True,
         max_steps: int = MAX_STEPS, poll: Poll | None = None, seen: Callable[[gym.Env], None] | None = None,
         on_env_error: str | None = None, tries: int = 8) -> tuple[list[float], int]:
    """The undiscounted return of each of ``episodes`` episodes, and how many were cut at ``max_steps`` steps.

    Episodes run on one environment seeded ``seed, seed + 1, ...``; ``deterministic`` picks the
    distribution's mode, else actions are sampled. ``poll`` (see :data:`Poll`) may stop it; ``seen`` is called with
    the env after each reset and step (:mod:`frugalrl.video` renders it). An env that raises is an
    :class:`EvaluationEnvError`; with ``on_env_error="restart"`` its episode is played again in a new env first
    (sampled actions then differ from the first try's), in at most ``tries`` new envs in a row, as the crash-loop
    rule replaces a worker; ``"raise"`` says that ``restart`` exists, None (a caller without it) does not.
    """
    env: gym.Env | None = env_spec.make()  # a first env that cannot be built is the caller's error, as it is
    generator = torch.Generator().manual_seed(seed)
    returns: list[float] = []
    cut = failed = 0
    try:
        ep = 0
        while ep < episodes:
            try:
                if env is None:
                    env = _made(env_spec)
                total, done = _episode(agent, env, seed + ep, deterministic, generator, max_steps,
                                       None if poll is None else functools.partial(poll, ep), seen)
            except _EnvRaised as e:
                failed += 1
                error = f"the evaluation env ({env_spec.describe()}) raised {type(e.error).__name__}: {e.error}"
                if on_env_error != "restart" or failed > tries:
                    again = (f" ({failed} times in a row)" if on_env_error == "restart" else
                             "; on_env_error='restart' (--on-env-error restart) plays its episode again in a new env"
                             if on_env_error == "raise" else "")
                    raise EvaluationEnvError(f"{error}{again}") from e.error
                log.warning("frugalrl: %s; playing episode %d again in a new env", error, ep)
                if env is not None:
                    _close_quietly(env)
                env = None
                continue
            failed = 0
            returns.append(total)
            cut += not done
            ep += 1
            if poll is not None:
                poll(ep)
    finally:
        if env is not None:
            _close_quietly(env)
    return returns, cut


class _EnvRaised(Exception):
    """What :func:`_episode` raises when its env's ``reset()`` or ``step()`` did (the agent's errors pass as they are)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _made(env_spec: EnvSpec) -> gym.Env:
    """A new env for :func:`play` after one raised (its constructor's error, e.g. a simulator that cannot start
    again, is the env's)."""
    try:
        return env_spec.make()
    except Exception as e:  # noqa: BLE001 - the env's own error: play() decides
        raise _EnvRaised(e) from e


def _episode(agent: ActorCritic, env: gym.Env, seed: int, deterministic: bool, generator: torch.Generator,
             max_steps: int, poll: Callable[[], None] | None, seen: Callable[[gym.Env], None] | None
             ) -> tuple[float, bool]:
    """One episode of ``agent`` in ``env`` from env seed ``seed``: its return, and whether it ended (not cut)."""
    to_env = env_actions(env.action_space, batched=False)
    try:
        obs, _ = env.reset(seed=seed)
    except Exception as e:  # noqa: BLE001 - the env's own error: play() decides
        raise _EnvRaised(e) from e
    if seen is not None:
        seen(env)
    total, done, steps = 0.0, False, 0
    while not done and steps < max_steps:
        with torch.no_grad():
            params = agent.dist_params(torch.as_tensor(np.asarray(obs))[None])
            u = (dists.mode(agent.dist_kind, params) if deterministic
                 else dists.sample(agent.dist_kind, params, generator))
            # a squashed policy (the split model's tanh-Gaussian) maps its sample to the env's action
            squash = getattr(agent, "env_action", None)
            action = env_action(env.action_space, to_env((u if squash is None else squash(u))[0].numpy()))
        try:
            obs, r, term, trunc, _ = env.step(action)
        except Exception as e:  # noqa: BLE001 - the env's own error: play() decides
            raise _EnvRaised(e) from e
        if seen is not None:
            seen(env)
        total += float(r)
        done = term or trunc
        steps += 1
        if poll is not None and steps % POLL_STEPS == 0:
            poll()
    return total, done


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception as e:  # noqa: BLE001 - a broken env's close may fail too: nothing is left to save
        log.warning("frugalrl: closing the evaluation env failed: %s", e)


def progress_lines(episodes: int, every_s: float = 5.0) -> Poll:
    """A :data:`Poll` that prints the episodes done on stderr, at most every ``every_s`` seconds (a slow env's
    evaluation by ``frugalrl eval``, whose stdout is its JSON)."""
    last = [time.monotonic()]

    def poll(done: int) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            print(f"frugalrl eval: {done} of {episodes} episodes done", file=sys.stderr, flush=True)
    return poll


def random_states(env: gym.Env, n: int, seed: int, close: bool = True) -> np.ndarray:
    """``n`` states a uniformly random policy visits in ``env`` (reset at episode ends), stacked.

    Calibration, distillation and KL checks need realistic states before any policy is trained.
    """
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    out: list[np.ndarray] = []
    while len(out) < n:
        out.append(np.asarray(obs))
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            obs, _ = env.reset()
    if close:
        env.close()
    return np.stack(out)


@dataclass
class PolicyEvaluator:
    """An :data:`Evaluator` that plays ``episodes`` episodes of ``agent`` (at most ``max_steps`` steps each) on fresh
    envs in this process, from env seed ``seed`` (another ``seed`` for one call: other episodes)."""

    agent: ActorCritic
    env_spec: Any
    episodes: int
    seed: int
    deterministic: bool = True
    max_steps: int = MAX_STEPS
    on_env_error: str | None = None
    """An env that raises: 'raise' or None (:class:`EvaluationEnvError`) or 'restart' (its episode again, in a new
    env; see :func:`play`)."""
    tries: int = 8
    """'restart': new envs in a row for one episode before :class:`EvaluationEnvError`."""

    def __call__(self, seed: int | None = None, poll: Poll | None = None,
                 seen: Callable[[gym.Env], None] | None = None) -> Evaluation:
        returns, cut = play(self.agent, self.env_spec, self.episodes, self.seed if seed is None else seed,
                            self.deterministic, self.max_steps, poll, seen, self.on_env_error, self.tries)
        return Evaluation(float(np.mean(returns)), float(np.std(returns)), self.episodes, self.deterministic, returns,
                          cut)

    def compare(self, other: dict[str, Any], seed: int, poll: Poll | None = None) -> tuple[Evaluation, Evaluation]:
        """The agent with the weights ``other`` (a state dict) and as it is, on the same episodes from env seed
        ``seed``; the agent keeps its own weights."""
        own = {k: v.clone() for k, v in self.agent.state_dict().items()}
        mine = self(seed=seed, poll=poll)
        self.agent.load_state_dict(other)
        try:
            theirs = self(seed=seed, poll=poll)
        finally:
            self.agent.load_state_dict(own)
        return theirs, mine


def policy_evaluator(agent: ActorCritic, env_spec: Any, cfg: RunConfig, deterministic: bool = True
                     ) -> PolicyEvaluator:
    """The run's :class:`PolicyEvaluator`: ``cfg.eval_episodes`` episodes of ``agent`` from env seed
    ``EVAL_SEED + cfg.seed``, each cut at ``cfg.eval_max_steps`` steps; an env that raises as the run's workers'
    (``on_env_error`` and ``crash_loop_tries`` where the run has workers)."""
    return PolicyEvaluator(agent, env_spec, cfg.eval_episodes, EVAL_SEED + cfg.seed, deterministic,
                           cfg.eval_max_steps, getattr(cfg, "on_env_error", None), getattr(cfg, "crash_loop_tries", 8))
